//! The providers in order, walked for each question.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use starling_codec::{Protocol, ReasonCode};

use crate::about::{About, HookKind};
use crate::authn::{AuthnAnswer, AuthnProvider, ConnectRequest, Identity, Refusal};
use crate::authz::{Answer, AuthzProvider, AuthzRequest, ClientRef, OwnedAuthzRequest};
use crate::event::{Event, EventKind, EventMask, EventProvider};
use crate::verdict::Verdict;

/// Providers to add to a broker's chain, in order: what an embedder (a test, a plugin)
/// passes to `Broker::start_with`.
#[derive(Default, Clone)]
pub struct Hooks {
    authn: Vec<Arc<dyn AuthnProvider>>,
    authz: Vec<Arc<dyn AuthzProvider>>,
    events: Vec<Arc<dyn EventProvider>>,
}

impl fmt::Debug for Hooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hooks")
            .field("authn", &self.authn.len())
            .field("authz", &self.authz.len())
            .field("events", &self.events.len())
            .finish()
    }
}

impl Hooks {
    /// No providers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an authentication provider after those added before.
    pub fn authenticate_with(mut self, p: impl AuthnProvider) -> Self {
        self.authn.push(Arc::new(p));
        self
    }

    /// Adds an authorization provider after those added before.
    pub fn authorize_with(mut self, p: impl AuthzProvider) -> Self {
        self.authz.push(Arc::new(p));
        self
    }

    /// Adds an event provider.
    pub fn observe_with(mut self, p: impl EventProvider) -> Self {
        self.events.push(Arc::new(p));
        self
    }

    /// These providers, then `more`'s.
    pub fn then(mut self, more: Hooks) -> Self {
        self.authn.extend(more.authn);
        self.authz.extend(more.authz);
        self.events.extend(more.events);
        self
    }

    /// The chain, fixed from now on; `default_allow` decides what every authorizer ignores
    /// (`auth.acl_default`).
    pub fn build(self, default_allow: bool) -> Arc<Chain> {
        let mask = self
            .events
            .iter()
            .fold(EventMask::NONE, |m, p| m.union(p.wants()));
        let may_wait = self.authz.iter().any(|p| p.answers_later());
        Arc::new(Chain {
            authn: self.authn,
            authz: self.authz,
            events: self.events,
            mask,
            default_allow,
            may_wait,
        })
    }
}

/// What decides a CONNECT every authenticator ignores: the listener's policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthnPolicy {
    /// `allow_anonymous` of the listener: such a CONNECT is accepted (a username it carries
    /// is then an unverified label, as in Mosquitto), else refused with 0x87.
    pub allow_anonymous: bool,
}

/// The providers of one broker, fixed at start-up and shared read-only by its actors.
pub struct Chain {
    authn: Vec<Arc<dyn AuthnProvider>>,
    authz: Vec<Arc<dyn AuthzProvider>>,
    events: Vec<Arc<dyn EventProvider>>,
    /// The kinds some event provider wants.
    mask: EventMask,
    default_allow: bool,
    /// Some authorizer may answer later.
    may_wait: bool,
}

impl fmt::Debug for Chain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chain")
            .field("authn", &self.authn.len())
            .field("authz", &self.authz.len())
            .field("events", &self.events.len())
            .field("default_allow", &self.default_allow)
            .field("may_wait", &self.may_wait)
            .finish()
    }
}

impl Chain {
    /// Every provider with the hook it is on, in chain order: the authenticators, the
    /// authorizers, then the event providers.
    pub fn providers(&self) -> Vec<(HookKind, About)> {
        let authn = self
            .authn
            .iter()
            .map(|p| (HookKind::Authenticate, p.about()));
        let authz = self.authz.iter().map(|p| (HookKind::Authorize, p.about()));
        let events = self.events.iter().map(|p| (HookKind::Observe, p.about()));
        authn.chain(authz).chain(events).collect()
    }

    /// Decides a CONNECT: the authenticators in order, the first that does not ignore it
    /// decides; if all ignore it, `policy` does (a password without a user name is refused
    /// with 0x86).
    pub fn authenticate(
        self: &Arc<Self>,
        req: &ConnectRequest<'_>,
        policy: AuthnPolicy,
    ) -> Verdict<Result<Identity, Refusal>> {
        self.authenticate_from(0, req, policy)
    }

    fn authenticate_from(
        self: &Arc<Self>,
        start: usize,
        req: &ConnectRequest<'_>,
        policy: AuthnPolicy,
    ) -> Verdict<Result<Identity, Refusal>> {
        for (i, p) in self.authn.iter().enumerate().skip(start) {
            match p.authenticate(req) {
                Verdict::Now(AuthnAnswer::Allow(id)) => return Verdict::Now(Ok(id)),
                Verdict::Now(AuthnAnswer::Deny(r)) => return Verdict::Now(Err(r)),
                Verdict::Now(AuthnAnswer::Ignore) => {}
                Verdict::Later(answer) => {
                    let chain = self.clone();
                    let owned = OwnedConnect::from(req);
                    return Verdict::later(async move {
                        match answer.await {
                            AuthnAnswer::Allow(id) => Ok(id),
                            AuthnAnswer::Deny(r) => Err(r),
                            AuthnAnswer::Ignore => {
                                chain
                                    .authenticate_from(i + 1, &owned.as_request(), policy)
                                    .resolve()
                                    .await
                            }
                        }
                    });
                }
            }
        }
        Verdict::Now(default_authn(req, policy))
    }

    /// Decides an operation: the authorizers in order, the first that does not ignore it
    /// decides; if all ignore it, the default. `true` is allowed.
    pub fn authorize(self: &Arc<Self>, req: &AuthzRequest<'_>) -> Verdict<bool> {
        self.authorize_from(0, req)
    }

    fn authorize_from(self: &Arc<Self>, start: usize, req: &AuthzRequest<'_>) -> Verdict<bool> {
        for (i, p) in self.authz.iter().enumerate().skip(start) {
            match p.authorize(req) {
                Verdict::Now(Answer::Allow) => return Verdict::Now(true),
                Verdict::Now(Answer::Deny) => return Verdict::Now(false),
                Verdict::Now(Answer::Ignore) => {}
                Verdict::Later(answer) => {
                    // Only now is anything owned: a chain of ready answers allocates nothing.
                    let chain = self.clone();
                    let owned: OwnedAuthzRequest = req.to_owned();
                    return Verdict::later(async move {
                        match answer.await {
                            Answer::Allow => true,
                            Answer::Deny => false,
                            Answer::Ignore => {
                                chain
                                    .authorize_from(i + 1, &owned.as_request())
                                    .resolve()
                                    .await
                            }
                        }
                    });
                }
            }
        }
        Verdict::Now(self.default_allow)
    }

    /// Whether any authorizer is registered: without one, every operation gets the default
    /// and there is nothing to ask or remember.
    pub fn has_authorizers(&self) -> bool {
        !self.authz.is_empty()
    }

    /// Whether some authorizer may answer later, so that the client actor looks ahead
    /// before feeding a PUBLISH or SUBSCRIBE to its session.
    pub fn may_wait(&self) -> bool {
        self.may_wait
    }

    /// What an operation every authorizer ignores gets.
    pub fn default_allows(&self) -> bool {
        self.default_allow
    }

    /// Whether `client` could be denied some delivery: the default denies, or some
    /// authorizer says it may.
    pub fn may_deny_reads(&self, client: &ClientRef<'_>) -> bool {
        !self.default_allow || self.authz.iter().any(|p| p.may_deny_reads(client))
    }

    /// Whether some event provider wants `kind`: check before making the event.
    #[inline]
    pub fn wants(&self, kind: EventKind) -> bool {
        self.mask.has(kind)
    }

    /// Passes `event` to every provider that wants its kind, in order.
    pub fn emit(&self, event: &Event) {
        let kind = event.kind();
        for p in &self.events {
            if p.wants().has(kind) {
                p.on_event(event);
            }
        }
    }
}

fn default_authn(req: &ConnectRequest<'_>, policy: AuthnPolicy) -> Result<Identity, Refusal> {
    if req.username.is_none() && req.password.is_some() {
        return Err(Refusal {
            code: ReasonCode::BadUserNameOrPassword,
            why: "password without user name",
        });
    }
    if policy.allow_anonymous {
        Ok(Identity::new(req.username.map(str::to_owned)))
    } else {
        Err(Refusal {
            code: ReasonCode::NotAuthorized,
            why: "not authorized",
        })
    }
}

/// A [`ConnectRequest`] that owns its fields, for the rest of a walk after a later answer.
struct OwnedConnect {
    client_id: String,
    username: Option<String>,
    password: Option<Bytes>,
    peer: SocketAddr,
    protocol: Protocol,
    tls_client_cn: Option<String>,
}

impl From<&ConnectRequest<'_>> for OwnedConnect {
    fn from(r: &ConnectRequest<'_>) -> Self {
        Self {
            client_id: r.client_id.to_owned(),
            username: r.username.map(str::to_owned),
            password: r.password.cloned(),
            peer: r.peer,
            protocol: r.protocol,
            tls_client_cn: r.tls_client_cn.map(str::to_owned),
        }
    }
}

impl OwnedConnect {
    fn as_request(&self) -> ConnectRequest<'_> {
        ConnectRequest {
            client_id: &self.client_id,
            username: self.username.as_deref(),
            password: self.password.as_ref(),
            peer: self.peer,
            protocol: self.protocol,
            tls_client_cn: self.tls_client_cn.as_deref(),
        }
    }
}

#[cfg(test)]
#[path = "chain_tests.rs"]
mod tests;
