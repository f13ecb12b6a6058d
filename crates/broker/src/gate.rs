//! The session core's [`Gate`], backed by the ACL.

use std::net::IpAddr;
use std::sync::Arc;

use starling_auth::{Action, ClientInfo, Decision};
use starling_codec::QoS;
use starling_router::parse_subscription;
use starling_session::Gate;

use crate::settings::Shared;

/// One client's view of the ACL.
pub(crate) struct AclGate {
    shared: Arc<Shared>,
    username: Option<String>,
    client_id: Arc<str>,
    addr: IpAddr,
}

impl AclGate {
    pub(crate) fn new(
        shared: Arc<Shared>,
        username: Option<String>,
        client_id: Arc<str>,
        addr: IpAddr,
    ) -> Self {
        Self {
            shared,
            username,
            client_id,
            addr,
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
        // `$SYS/` is the broker's own namespace: clients may read it, never write it.
        !topic.starts_with("$SYS/") && self.check(Action::Publish, topic)
    }

    fn allow_subscribe(&mut self, filter: &str, _qos: QoS) -> bool {
        // The ACL speaks of topic filters: strip `$share/{g}/`, `$exclusive/`, `$limit/{n}/`.
        let plain = parse_subscription(filter, &self.shared.topic_limits)
            .map(|s| s.filter)
            .unwrap_or(filter);
        self.check(Action::Subscribe, plain)
    }
}
