//! The session core's [`Gate`], backed by the ACL.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use foldhash::fast::FixedState;

use starling_auth::{Action, ClientInfo, Decision, Scope};
use starling_codec::QoS;
use starling_router::{delayed_target, parse_subscription, DELAYED_PREFIX};
use starling_session::Gate;

use crate::metrics::add;
use crate::settings::Shared;

/// One client's view of the ACL.
pub(crate) struct AclGate {
    shared: Arc<Shared>,
    /// `Arc<str>`, not `String`: 8 bytes less in every connection's state.
    username: Option<Arc<str>>,
    client_id: Arc<str>,
    addr: IpAddr,
    /// Whether some topic could be denied to this client at delivery (see
    /// [`AclGate::may_read`]): when not, its deliveries are not checked at all.
    checks_reads: bool,
    /// Decisions made so far, per topic: made at a topic's first check and then looked up
    /// (the rules are read in order, so a check costs every rule before the deciding one).
    /// Made at the first check that needs it: an idle connection carries none.
    decided: Option<Box<Decided>>,
}

impl AclGate {
    pub(crate) fn new(
        shared: Arc<Shared>,
        username: Option<String>,
        client_id: Arc<str>,
        addr: IpAddr,
    ) -> Self {
        let checks_reads = shared.acl.may_deny_reads(&ClientInfo {
            username: username.as_deref(),
            client_id: &client_id,
            addr,
        });
        Self {
            shared,
            username: username.map(Arc::from),
            client_id,
            addr,
            checks_reads,
            decided: None,
        }
    }

    /// The connection's user (the TLS certificate's CN where that is the username).
    pub(crate) fn username(&self) -> Option<&str> {
        self.username.as_deref()
    }

    /// The client's address (after PROXY protocol / X-Forwarded-For).
    pub(crate) fn addr(&self) -> IpAddr {
        self.addr
    }

    fn info(&self) -> ClientInfo<'_> {
        ClientInfo {
            username: self.username.as_deref(),
            client_id: &self.client_id,
            addr: self.addr,
        }
    }

    /// Whether this client may publish to the topic name `topic`, remembered per topic.
    fn may_publish(&mut self, topic: &str) -> bool {
        let acl = &self.shared.acl;
        if acl.is_empty() {
            // No rule to read: the default decides, and there is nothing to remember.
            return acl.default_decision() == Decision::Allow;
        }
        if let Some(&ok) = self.decided.as_ref().and_then(|d| d.publish.get(topic)) {
            return ok;
        }
        let ok = acl.check(&self.info(), Action::Publish, topic) == Decision::Allow;
        remember(
            &mut self.decided.get_or_insert_with(Box::default).publish,
            Arc::from(topic),
            ok,
        );
        ok
    }
}

impl Gate for AclGate {
    fn allow_publish(&mut self, topic: &str, _qos: QoS, _retain: bool) -> bool {
        // A `$delayed/{secs}/{topic}` publish reaches its subscribers later on `{topic}`,
        // which nothing checks again: the ACL and the reserved namespace hold for both.
        let target = delayed_target(topic);
        if is_reserved(target.unwrap_or(topic)) {
            add(&self.shared.metrics.reserved_topic_refused, 1);
            return false;
        }
        self.may_publish(topic) && target.is_none_or(|t| self.may_publish(t))
    }

    fn allow_subscribe(&mut self, filter: &str, _qos: QoS) -> bool {
        // The ACL speaks of topic filters: strip `$share/{g}/`, `$exclusive/`, `$limit/{n}/`.
        let plain = parse_subscription(filter, &self.shared.topic_limits)
            .map(|s| s.filter)
            .unwrap_or(filter);
        // Granted when the rules let it read at least part of what it matches; what they
        // deny is withheld at delivery (`may_read`).
        self.shared.acl.subscribe_scope(&self.info(), plain) != Scope::Nothing
    }
}

/// Whether a topic is the broker's to publish on, never a client's: MQTT 5 §4.7.2 reserves
/// topics starting with `$` for the server's own use (`$SYS` bare or with levels, and any
/// other `$` namespace the broker may give a meaning to). `$delayed/` is the one `$` topic
/// clients publish to: the broker's delayed-publish service. `$share/`, `$exclusive/` and
/// `$limit/` are subscription prefixes, not topics, so a publish to them is refused too.
fn is_reserved(topic: &str) -> bool {
    topic.starts_with('$') && !topic.starts_with(DELAYED_PREFIX)
}

/// Per topic, what this client may do there, as decided at the topic's first check.
/// Bounded: a client using many distinct topics starts over rather than growing.
#[derive(Default)]
struct Decided {
    publish: HashMap<Arc<str>, bool, FixedState>,
    read: HashMap<Arc<str>, bool, FixedState>,
}

/// Distinct topics remembered per client and action.
const DECIDED_MAX: usize = 1024;

fn remember(map: &mut HashMap<Arc<str>, bool, FixedState>, topic: Arc<str>, ok: bool) {
    if map.len() >= DECIDED_MAX {
        map.clear();
    }
    map.insert(topic, ok);
}

impl AclGate {
    /// Whether a message on `topic` may be delivered to this client: the ACL's read check
    /// for the concrete topic (a subscription may match topics its rules deny, see
    /// [`starling_auth::Acl::subscribe_scope`]), remembered per topic.
    pub(crate) fn may_read(&mut self, topic: &Arc<str>) -> bool {
        if !self.checks_reads {
            return true;
        }
        if let Some(&ok) = self.decided.as_ref().and_then(|d| d.read.get(topic)) {
            return ok;
        }
        let ok = self.shared.acl.check_read(&self.info(), topic) == Decision::Allow;
        remember(
            &mut self.decided.get_or_insert_with(Box::default).read,
            topic.clone(),
            ok,
        );
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::{delayed_target, is_reserved};

    #[test]
    fn every_dollar_topic_but_delayed_is_reserved() {
        for t in ["$SYS", "$SYS/", "$SYS/brokers/x", "$share/g/t", "$foo", "$"] {
            assert!(is_reserved(t), "{t}");
        }
        for t in ["$delayed/5/a", "a/$SYS", "SYS", "sys/$"] {
            assert!(!is_reserved(t), "{t}");
        }
    }

    #[test]
    fn delayed_publish_is_checked_on_its_target_topic() {
        assert_eq!(delayed_target("$delayed/5/$SYS/x"), Some("$SYS/x"));
        assert_eq!(delayed_target("$delayed/5/a/b"), Some("a/b"));
        assert_eq!(delayed_target("$delayed/5"), None);
        assert_eq!(delayed_target("a/b"), None);
    }
}
