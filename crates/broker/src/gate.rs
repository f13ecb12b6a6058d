//! The session core's [`Gate`], backed by the ACL.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use foldhash::fast::FixedState;

use starling_auth::{Action, ClientInfo, Decision, Scope};
use starling_codec::QoS;
use starling_router::parse_subscription;
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
    /// Present when some topic could be denied to this client at delivery (see
    /// [`AclGate::may_read`]); most clients carry none and pay nothing per delivery.
    reads: Option<Box<ReadCache>>,
}

impl AclGate {
    pub(crate) fn new(
        shared: Arc<Shared>,
        username: Option<String>,
        client_id: Arc<str>,
        addr: IpAddr,
    ) -> Self {
        let reads = shared
            .acl
            .may_deny_reads(&ClientInfo {
                username: username.as_deref(),
                client_id: &client_id,
                addr,
            })
            .then(Box::default);
        Self {
            shared,
            username: username.map(Arc::from),
            client_id,
            addr,
            reads,
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

    fn check(&self, action: Action, topic: &str) -> bool {
        let info = ClientInfo {
            username: self.username.as_deref(),
            client_id: &self.client_id,
            addr: self.addr,
        };
        self.shared.acl.check(&info, action, topic) == Decision::Allow
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
        self.check(Action::Publish, topic) && target.is_none_or(|t| self.check(Action::Publish, t))
    }

    fn allow_subscribe(&mut self, filter: &str, _qos: QoS) -> bool {
        // The ACL speaks of topic filters: strip `$share/{g}/`, `$exclusive/`, `$limit/{n}/`.
        let plain = parse_subscription(filter, &self.shared.topic_limits)
            .map(|s| s.filter)
            .unwrap_or(filter);
        // Granted when the rules let it read at least part of what it matches; what they
        // deny is withheld at delivery (`may_read`).
        let info = ClientInfo {
            username: self.username.as_deref(),
            client_id: &self.client_id,
            addr: self.addr,
        };
        self.shared.acl.subscribe_scope(&info, plain) != Scope::Nothing
    }
}

/// Whether a topic is the broker's to publish on, never a client's: MQTT 5 §4.7.2 reserves
/// topics starting with `$` for the server's own use (`$SYS` bare or with levels, and any
/// other `$` namespace the broker may give a meaning to). `$delayed/` is the one `$` topic
/// clients publish to: the broker's delayed-publish service. `$share/`, `$exclusive/` and
/// `$limit/` are subscription prefixes, not topics, so a publish to them is refused too.
fn is_reserved(topic: &str) -> bool {
    topic.starts_with('$') && !topic.starts_with("$delayed/")
}

/// The topic a `$delayed/{secs}/{topic}` publish is finally published to; `None` for any
/// other topic, or a `$delayed/` one without a `{topic}` part (the router refuses those).
fn delayed_target(topic: &str) -> Option<&str> {
    let rest = topic.strip_prefix("$delayed/")?;
    rest.split_once('/').map(|(_, target)| target)
}

/// Topics this client may or may not read, as decided at their first delivery. Bounded:
/// a client reading many distinct topics starts over rather than growing.
#[derive(Default)]
struct ReadCache {
    decided: HashMap<Arc<str>, bool, FixedState>,
}

/// Distinct topics remembered per client.
const READ_CACHE_MAX: usize = 1024;

impl AclGate {
    /// Whether a message on `topic` may be delivered to this client: the ACL's read check
    /// for the concrete topic (a subscription may match topics its rules deny, see
    /// [`starling_auth::Acl::subscribe_scope`]), remembered per topic.
    pub(crate) fn may_read(&mut self, topic: &Arc<str>) -> bool {
        let Some(cache) = self.reads.as_deref_mut() else {
            return true;
        };
        if let Some(&ok) = cache.decided.get(topic) {
            return ok;
        }
        let info = ClientInfo {
            username: self.username.as_deref(),
            client_id: &self.client_id,
            addr: self.addr,
        };
        let ok = self.shared.acl.check_read(&info, topic) == Decision::Allow;
        if cache.decided.len() >= READ_CACHE_MAX {
            cache.decided.clear();
        }
        cache.decided.insert(topic.clone(), ok);
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
