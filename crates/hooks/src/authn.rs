//! CONNECT authentication.

use std::net::SocketAddr;

use bytes::Bytes;
use starling_codec::{Protocol, ReasonCode};

use crate::about::{type_about, About};
use crate::verdict::Verdict;

/// What a CONNECT presents, for authentication. Borrowed: a provider that answers later
/// copies what it needs into its future.
#[derive(Debug, Clone, Copy)]
pub struct ConnectRequest<'a> {
    /// The client identifier as sent (empty when the broker is to assign one).
    pub client_id: &'a str,
    /// The User Name field.
    pub username: Option<&'a str>,
    /// The Password field (a `Bytes`, so that a later verdict can keep it without a copy).
    pub password: Option<&'a Bytes>,
    /// The client's address (after PROXY protocol or `X-Forwarded-For` where configured).
    pub peer: SocketAddr,
    /// The protocol version of the CONNECT.
    pub protocol: Protocol,
    /// The Common Name of the verified TLS client certificate, if there is one.
    pub tls_client_cn: Option<&'a str>,
}

/// Who a connection is, once authenticated: what authorization and the session binding
/// see.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Identity {
    /// The username the session belongs to and the ACL speaks of; `None` is anonymous.
    pub username: Option<String>,
}

impl Identity {
    /// The identity of `username` (`None`: anonymous).
    pub fn new(username: Option<String>) -> Self {
        Self { username }
    }
}

/// Why a CONNECT is refused: the CONNACK reason code (MQTT 5 §3.2.2.2; the broker maps it
/// to the nearest 3.x return code) and a few words for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// 0x86 Bad User Name or Password, 0x87 Not authorized, 0x88 Server unavailable, ...
    pub code: ReasonCode,
    /// For the log line (`reason` field); a peer never sees it.
    pub why: &'static str,
}

/// An authentication provider's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthnAnswer {
    /// Authenticated, as this identity: the chain stops here.
    Allow(Identity),
    /// Refused: the chain stops here.
    Deny(Refusal),
    /// Not this provider's to decide: the next one is asked.
    Ignore,
}

/// Decides CONNECTs. Called in the CONNECT handshake's own task; a verdict that is not
/// ready is awaited there, within the listener's `handshake_timeout_secs` (a CONNECT whose
/// verdict misses it is refused with 0x88 Server unavailable).
///
/// `authenticate` itself must not block: costly work (a password hash, a request to a
/// service) belongs in the [`Verdict::Later`] future, run where it cannot hold up other
/// connections (the built-in password file verifies on a pool of threads of its own).
pub trait AuthnProvider: Send + Sync + 'static {
    /// Decides `req`.
    fn authenticate(&self, req: &ConnectRequest<'_>) -> Verdict<AuthnAnswer>;

    /// How it presents itself to an operator (`GET /api/v1/plugins`); by default, its
    /// type's name.
    fn about(&self) -> About {
        type_about::<Self>()
    }
}
