//! The session core's [`Gate`], backed by the hook chain (`starling-hooks`), with what each
//! client remembers of its verdicts.
//!
//! The session asks its gate synchronously, inside [`starling_session::Session::handle_packet`].
//! A chain whose authorizers all answer at once is asked right there. When some authorizer
//! may answer later, the client actor looks ahead first ([`AuthGate::next_wait`]): a
//! PUBLISH or SUBSCRIBE whose verdict is neither remembered nor ready is not fed until the
//! verdict comes (or its deadline passes), and the gate then answers the session from what
//! was decided.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use foldhash::fast::FixedState;

use starling_codec::{Packet, QoS};
use starling_config::TimeoutVerdict;
use starling_hooks::{Action, AuthzRequest, Chain, ClientRef, Later, Verdict};
use starling_router::{delayed_target, parse_subscription, DELAYED_PREFIX};
use starling_session::{Gate, Message, Session};
use tracing::debug;

use crate::metrics::add;
use crate::msg::AuthzKind;
use crate::settings::Shared;

/// A verdict the client waits for: what it is about, and the future that gives it.
pub(crate) struct Asked {
    pub kind: AuthzKind,
    pub topic: Arc<str>,
    pub verdict: Later<bool>,
}

/// One client's view of the hook chain's authorizers.
pub(crate) struct AuthGate {
    shared: Arc<Shared>,
    chain: Arc<Chain>,
    /// `Arc<str>`, not `String`: 8 bytes less in every connection's state.
    username: Option<Arc<str>>,
    client_id: Arc<str>,
    addr: IpAddr,
    /// Whether some topic could be denied to this client at delivery (see
    /// [`AuthGate::may_read`]): when not, its deliveries are not checked at all.
    checks_reads: bool,
    /// Verdicts so far, per topic: made at a topic's first check and then looked up (an
    /// ACL is read in order, so a check costs every rule before the deciding one; a remote
    /// authorizer costs a round trip). Made at the first check that needs it: an idle
    /// connection carries none.
    decided: Option<Box<Decided>>,
}

impl AuthGate {
    pub(crate) fn new(
        shared: Arc<Shared>,
        chain: Arc<Chain>,
        username: Option<String>,
        client_id: Arc<str>,
        addr: IpAddr,
    ) -> Self {
        let checks_reads = chain.may_deny_reads(&ClientRef {
            username: username.as_deref(),
            client_id: &client_id,
            addr,
        });
        Self {
            shared,
            chain,
            username: username.map(Arc::from),
            client_id,
            addr,
            checks_reads,
            decided: None,
        }
    }

    /// The connection's user (the TLS certificate's CN where that is the username).
    /// The connection's address.
    pub(crate) fn ip(&self) -> IpAddr {
        self.addr
    }

    pub(crate) fn username(&self) -> Option<&Arc<str>> {
        self.username.as_ref()
    }

    /// The hook chain.
    pub(crate) fn chain(&self) -> &Arc<Chain> {
        &self.chain
    }

    fn timeout_verdict(&self) -> bool {
        self.shared.config.auth.timeout_verdict == TimeoutVerdict::Allow
    }

    /// The verdict on `topic` for `kind`: remembered, decided for the packet being fed, or
    /// asked of the chain now (a ready answer is remembered at once).
    fn decide(&mut self, kind: AuthzKind, topic: &str, action: Action) -> Verdict<bool> {
        if !self.chain.has_authorizers() {
            // Nothing to ask: the default decides, and there is nothing to remember.
            return Verdict::Now(self.chain.default_allows());
        }
        if let Some(d) = &self.decided {
            if let Some(&(_, _, ok)) = d.once.iter().find(|(k, t, _)| *k == kind && **t == *topic) {
                return Verdict::Now(ok);
            }
            if let Some(&ok) = d.map(kind).get(topic) {
                return Verdict::Now(ok);
            }
        }
        let req = AuthzRequest {
            client: ClientRef {
                client_id: &self.client_id,
                username: self.username.as_deref(),
                addr: self.addr,
            },
            action,
            topic,
        };
        match self.chain.authorize(&req) {
            Verdict::Now(ok) => {
                self.remember(kind, Arc::from(topic), ok);
                Verdict::Now(ok)
            }
            later => later,
        }
    }

    fn remember(&mut self, kind: AuthzKind, topic: Arc<str>, ok: bool) {
        let map = self.decided.get_or_insert_with(Box::default).map_mut(kind);
        if map.len() >= DECIDED_MAX {
            map.clear();
        }
        map.insert(topic, ok);
    }

    /// Answers the session from a verdict that must be ready: remembered or decided
    /// already (the actor looked ahead), or from a chain whose authorizers answer at once.
    /// A later answer here comes from a provider that said it would not give one: it gets
    /// the timeout verdict.
    fn decide_now(&mut self, kind: AuthzKind, topic: &str, action: Action) -> bool {
        match self.decide(kind, topic, action) {
            Verdict::Now(ok) => ok,
            Verdict::Later(_) => {
                debug!(
                    topic,
                    "authorizer answered later where it said it would not"
                );
                add(&self.shared.metrics.verdict_timeouts, 1);
                self.timeout_verdict()
            }
        }
    }

    /// Before `packet` is fed to `session`: the first verdict it needs that is neither
    /// remembered nor ready, if some authorizer may answer later. The caller holds the
    /// packet (and what follows it) back until [`AuthGate::verdict`] is given for it, then
    /// asks again.
    pub(crate) fn next_wait(&mut self, session: &Session, packet: &Packet) -> Option<Asked> {
        if !self.chain.may_wait() {
            return None;
        }
        match packet {
            Packet::Publish(p) => {
                let topic = session.publish_topic(p)?;
                let target = delayed_target(topic);
                if is_reserved(target.unwrap_or(topic)) {
                    // Refused by the broker whatever the providers say.
                    return None;
                }
                let action = Action::Publish {
                    qos: p.qos,
                    retain: p.retain,
                };
                [Some(topic), target]
                    .into_iter()
                    .flatten()
                    .find_map(|t| self.ask(AuthzKind::Publish, t, action))
            }
            Packet::Subscribe(s) => s
                .filters
                .iter()
                .find_map(|f| self.subscribe_wait(&f.filter, f.options.qos)),
            _ => None,
        }
    }

    /// The verdict a subscription to `filter` at `qos` needs, if it is neither remembered
    /// nor ready (as [`AuthGate::next_wait`], for an operator's subscription).
    pub(crate) fn subscribe_wait(&mut self, filter: &str, qos: QoS) -> Option<Asked> {
        if !self.chain.may_wait() {
            return None;
        }
        let plain = plain_filter(&self.shared, filter);
        self.ask(AuthzKind::Subscribe, plain, Action::Subscribe { qos })
    }

    fn ask(&mut self, kind: AuthzKind, topic: &str, action: Action) -> Option<Asked> {
        match self.decide(kind, topic, action) {
            Verdict::Now(_) => None,
            Verdict::Later(verdict) => Some(Asked {
                kind,
                topic: Arc::from(topic),
                verdict,
            }),
        }
    }

    /// The verdict on an [`Asked`]: `None` when it missed its deadline, which gets
    /// `auth.timeout_verdict` for the packet waiting on it only (a timeout is not
    /// remembered).
    pub(crate) fn verdict(&mut self, kind: AuthzKind, topic: Arc<str>, verdict: Option<bool>) {
        match verdict {
            Some(ok) => self.remember(kind, topic.clone(), ok),
            None => {
                add(&self.shared.metrics.verdict_timeouts, 1);
                if kind != AuthzKind::Read {
                    let ok = self.timeout_verdict();
                    self.decided.get_or_insert_with(Box::default).once.push((
                        kind,
                        topic.clone(),
                        ok,
                    ));
                }
            }
        }
        if kind == AuthzKind::Read {
            if let Some(d) = &mut self.decided {
                d.reads_asked.remove(&topic);
            }
        }
    }

    /// The packet that waited has been fed: its one-time verdicts are spent.
    pub(crate) fn fed(&mut self) {
        if let Some(d) = &mut self.decided {
            d.once.clear();
        }
    }

    /// Whether a will may be published: as a PUBLISH by this client; later verdicts are
    /// combined into one future (the caller awaits it under the deadline, apart from the
    /// actor, since the session may be ending).
    pub(crate) fn will(&mut self, m: &Message) -> Verdict<bool> {
        let target = delayed_target(&m.topic);
        if is_reserved(target.unwrap_or(&m.topic)) {
            add(&self.shared.metrics.reserved_topic_refused, 1);
            return Verdict::Now(false);
        }
        let action = Action::Publish {
            qos: m.qos,
            retain: m.retain,
        };
        let topic = m.topic.clone();
        let mut later = Vec::new();
        for t in [Some(&*topic), target].into_iter().flatten() {
            match self.decide(AuthzKind::Publish, t, action) {
                Verdict::Now(false) => return Verdict::Now(false),
                Verdict::Now(true) => {}
                Verdict::Later(v) => later.push(v),
            }
        }
        if later.is_empty() {
            return Verdict::Now(true);
        }
        Verdict::later(async move {
            for v in later {
                if !v.await {
                    return false;
                }
            }
            true
        })
    }

    /// Whether a message on `topic` may be delivered to this client (a subscription may
    /// match topics it may not read), remembered per topic. A read answered later is not
    /// waited for (deliveries are not held back): this delivery gets the timeout verdict,
    /// and the returned [`Asked`] (once per topic while it runs) is for the caller to run
    /// and give back, to decide the next deliveries on the topic.
    pub(crate) fn may_read(&mut self, topic: &Arc<str>) -> (bool, Option<Asked>) {
        if !self.checks_reads {
            return (true, None);
        }
        match self.decide(AuthzKind::Read, topic, Action::Read) {
            Verdict::Now(ok) => (ok, None),
            Verdict::Later(verdict) => {
                let ok = self.timeout_verdict();
                let d = self.decided.get_or_insert_with(Box::default);
                if !d.reads_asked.insert(topic.clone()) {
                    return (ok, None);
                }
                let asked = Asked {
                    kind: AuthzKind::Read,
                    topic: topic.clone(),
                    verdict,
                };
                (ok, Some(asked))
            }
        }
    }
}

/// The ACL speaks of topic filters: `$share/{g}/`, `$exclusive/`, `$limit/{n}/` are
/// stripped before a subscribe is authorized.
fn plain_filter<'a>(shared: &Shared, filter: &'a str) -> &'a str {
    parse_subscription(filter, &shared.topic_limits)
        .map(|s| s.filter)
        .unwrap_or(filter)
}

impl Gate for AuthGate {
    fn allow_publish(&mut self, topic: &str, qos: QoS, retain: bool) -> bool {
        // A `$delayed/{secs}/{topic}` publish reaches its subscribers later on `{topic}`,
        // which nothing checks again: authorization and the reserved namespace hold for
        // both.
        let target = delayed_target(topic);
        if is_reserved(target.unwrap_or(topic)) {
            add(&self.shared.metrics.reserved_topic_refused, 1);
            return false;
        }
        let action = Action::Publish { qos, retain };
        let ok = self.decide_now(AuthzKind::Publish, topic, action)
            && target.is_none_or(|t| self.decide_now(AuthzKind::Publish, t, action));
        // Only the denial is counted: the checks are those allowed (each routed, counted
        // there) plus these (`client.publish.check.acl`, metrics/rmqtt.rs).
        if !ok {
            add(&self.shared.metrics.rmqtt.client_publish_auth_error, 1);
        }
        ok
    }

    fn allow_subscribe(&mut self, filter: &str, qos: QoS) -> bool {
        add(&self.shared.metrics.rmqtt.client_subscribe_check_acl, 1);
        let plain = plain_filter(&self.shared, filter);
        self.decide_now(AuthzKind::Subscribe, plain, Action::Subscribe { qos })
    }
}

/// Whether a topic is the broker's to publish on, never a client's: MQTT 5 §4.7.2 reserves
/// topics starting with `$` for the server's own use (`$SYS` bare or with levels, and any
/// other `$` namespace the broker may give a meaning to). `$delayed/` is the one `$` topic
/// clients publish to: the broker's delayed-publish service. `$share/`, `$exclusive/` and
/// `$limit/` are subscription prefixes, not topics, so a publish to them is refused too.
pub(crate) fn is_reserved(topic: &str) -> bool {
    topic.starts_with('$') && !topic.starts_with(DELAYED_PREFIX)
}

type TopicMap = HashMap<Arc<str>, bool, FixedState>;

/// Per topic, what this client may do there, as decided at the topic's first check.
/// Bounded: a client using many distinct topics starts over rather than growing.
#[derive(Default)]
struct Decided {
    publish: TopicMap,
    subscribe: TopicMap,
    read: TopicMap,
    /// Timeout verdicts for the packet waiting to be fed, spent when it is.
    once: Vec<(AuthzKind, Arc<str>, bool)>,
    /// Topics whose read verdict is being asked.
    reads_asked: HashSet<Arc<str>, FixedState>,
}

impl Decided {
    fn map(&self, kind: AuthzKind) -> &TopicMap {
        match kind {
            AuthzKind::Publish => &self.publish,
            AuthzKind::Subscribe => &self.subscribe,
            AuthzKind::Read => &self.read,
        }
    }

    fn map_mut(&mut self, kind: AuthzKind) -> &mut TopicMap {
        match kind {
            AuthzKind::Publish => &mut self.publish,
            AuthzKind::Subscribe => &mut self.subscribe,
            AuthzKind::Read => &mut self.read,
        }
    }
}

/// Distinct topics remembered per client and action.
const DECIDED_MAX: usize = 1024;

#[cfg(test)]
#[path = "gate_tests.rs"]
mod tests;
