//! PUBLISH, SUBSCRIBE and delivery authorization.

use std::net::IpAddr;
use std::sync::Arc;

use starling_codec::QoS;

use crate::about::{type_about, About};
use crate::verdict::Verdict;

/// The client an operation comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientRef<'a> {
    /// The client identifier (possibly assigned by the broker).
    pub client_id: &'a str,
    /// The authenticated username; `None` for an anonymous client.
    pub username: Option<&'a str>,
    /// The client's address.
    pub addr: IpAddr,
}

/// What is asked of a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// PUBLISH to a topic name (also a will's topic, and the target of a `$delayed/` one).
    Publish {
        /// The PUBLISH's QoS.
        qos: QoS,
        /// Its RETAIN flag.
        retain: bool,
    },
    /// SUBSCRIBE to a topic filter, without its `$share/{group}/`, `$exclusive/` or
    /// `$limit/{n}/` prefix.
    Subscribe {
        /// The requested QoS (already capped at the broker's maximum).
        qos: QoS,
    },
    /// Deliver a message on this topic name to the client (a subscription may match topics
    /// it may not read). Asked only of clients for which some provider says it
    /// [`may deny reads`](AuthzProvider::may_deny_reads). A read answered later is not
    /// waited for (deliveries are not held back): the delivery that asked gets
    /// `auth.timeout_verdict`, and the verdict, once it comes, decides the later deliveries
    /// on that topic. Answer reads at once where you can.
    Read,
}

/// One authorization question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthzRequest<'a> {
    /// Who asks.
    pub client: ClientRef<'a>,
    /// For what.
    pub action: Action,
    /// The topic name (publish, read) or filter (subscribe).
    pub topic: &'a str,
}

impl AuthzRequest<'_> {
    /// An owned copy, for the rest of a chain walk that waits on a later verdict.
    pub fn to_owned(&self) -> OwnedAuthzRequest {
        OwnedAuthzRequest {
            client_id: Arc::from(self.client.client_id),
            username: self.client.username.map(Arc::from),
            addr: self.client.addr,
            action: self.action,
            topic: Arc::from(self.topic),
        }
    }
}

/// An [`AuthzRequest`] that owns its strings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedAuthzRequest {
    /// See [`ClientRef::client_id`].
    pub client_id: Arc<str>,
    /// See [`ClientRef::username`].
    pub username: Option<Arc<str>>,
    /// See [`ClientRef::addr`].
    pub addr: IpAddr,
    /// See [`AuthzRequest::action`].
    pub action: Action,
    /// See [`AuthzRequest::topic`].
    pub topic: Arc<str>,
}

impl OwnedAuthzRequest {
    /// The borrowed form.
    pub fn as_request(&self) -> AuthzRequest<'_> {
        AuthzRequest {
            client: ClientRef {
                client_id: &self.client_id,
                username: self.username.as_deref(),
                addr: self.addr,
            },
            action: self.action,
            topic: &self.topic,
        }
    }
}

/// An authorization provider's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Permitted: the chain stops here.
    Allow,
    /// Refused (MQTT 5 PUBACK/SUBACK 0x87 Not authorized): the chain stops here.
    Deny,
    /// Not this provider's to decide: the next one is asked, and after the last the
    /// chain's default (`auth.acl_default`).
    Ignore,
}

/// Decides publishes, subscribes and deliveries of one client. Called on the client's own
/// actor; `authorize` must not block (a remote check goes in a [`Verdict::Later`] future).
///
/// The broker remembers each decision per client, per action kind and topic, for the
/// connection's life (up to 1,024 topics per kind, then it starts over): a provider is
/// asked about a topic once per connection, so one that decides by QoS or RETAIN should
/// say the same for every QoS. A later verdict that misses `auth.verdict_timeout_ms` gets
/// `auth.timeout_verdict` and is not remembered.
pub trait AuthzProvider: Send + Sync + 'static {
    /// Decides `req`.
    fn authorize(&self, req: &AuthzRequest<'_>) -> Verdict<Answer>;

    /// How it presents itself to an operator (`GET /api/v1/plugins`); by default, its
    /// type's name.
    fn about(&self) -> About {
        type_about::<Self>()
    }

    /// Whether this provider could deny `client` a delivery; when no provider could (and
    /// the default allows), that client's deliveries are not checked at all. The default
    /// `true` is always correct.
    fn may_deny_reads(&self, _client: &ClientRef<'_>) -> bool {
        true
    }

    /// Whether `authorize` may answer [`Verdict::Later`]. When no provider of a chain may,
    /// the broker feeds packets to the session without looking ahead for verdicts (the
    /// decision is made inside the session's call, as a plain function). The default
    /// `true` is always correct; a provider that says `false` and then answers later gets
    /// the timeout verdict for that question.
    fn answers_later(&self) -> bool {
        true
    }
}
