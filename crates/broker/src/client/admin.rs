//! What an operator asks of one client actor: its description, and a kick.

use std::net::SocketAddr;

use starling_codec::ReasonCode;
use starling_hooks::DisconnectReason;
use starling_rt::{time, Ctx};

use super::Client;
use crate::msg::{ClientInfo, ClientSubscriptions};

impl Client {
    /// The connection's address, while there is one.
    fn peer(&self) -> Option<SocketAddr> {
        self.conn
            .as_ref()
            .map(|c| SocketAddr::new(self.gate.ip(), c.peer_port))
    }

    pub(super) fn info(&self) -> ClientInfo {
        let s = &self.session;
        let limits = s.limits();
        ClientInfo {
            client_id: s.client_id().to_string(),
            username: self.gate.username().map(|u| u.to_string()),
            peer: self.peer(),
            connected: s.is_attached(),
            connected_at: self.conn.as_ref().map(|c| u64::from(c.connected_at)),
            proto_ver: s.protocol().map(|p| p.level()),
            keepalive: s.keep_alive_secs(),
            clean_start: self.conn.as_ref().is_some_and(|c| c.clean_start),
            expiry_interval: s.expiry_secs(),
            subscriptions: s.subscriptions().len(),
            inflight: s.inflight_len(),
            max_inflight: usize::from(limits.inflight_max),
            mqueue_len: s.queue_len(),
            max_mqueue: limits.mqueue_len_max,
        }
    }

    pub(super) fn subscription_list(&self) -> ClientSubscriptions {
        let s = &self.session;
        ClientSubscriptions {
            client_id: s.client_id().to_string(),
            peer: self.peer(),
            proto_ver: s.protocol().map(|p| p.level()),
            filters: s
                .subscriptions()
                .iter()
                .map(|(f, (o, id))| (f.clone(), *o, *id))
                .collect(),
        }
    }

    /// Discards the session: what the client was, as it was before.
    pub(super) async fn kick(&mut self, ctx: &mut Ctx<Self>) -> ClientInfo {
        let before = self.info();
        if !self.session.is_ended() {
            if self.session.is_attached() {
                self.closing = Some(DisconnectReason::Server(ReasonCode::AdministrativeAction));
            }
            self.session.end(time::now());
            self.run_effects(ctx).await;
        }
        before
    }
}
