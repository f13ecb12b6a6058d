//! What an operator asks of one client actor: its description, a kick, and
//! subscriptions made or dropped on its behalf.

use std::net::SocketAddr;

use starling_codec::{QoS, ReasonCode, SubscriptionOptions};
use starling_hooks::DisconnectReason;
use starling_rt::{time, Ctx};
use starling_session::DetachReason;

use super::Client;
use crate::metrics::add;
use crate::msg::{ClientInfo, ClientSubscriptions, HandOff, NotConnected};

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
        self.discard(
            DetachReason::Administrative,
            ReasonCode::AdministrativeAction,
            ctx,
        )
        .await
    }

    /// Discards the session, telling a connected client why (`code`, `why`'s).
    pub(super) async fn discard(
        &mut self,
        why: DetachReason,
        code: ReasonCode,
        ctx: &mut Ctx<Self>,
    ) -> ClientInfo {
        let before = self.info();
        if !self.session.is_ended() {
            if self.session.is_attached() {
                self.closing = Some(DisconnectReason::Server(code));
            }
            self.session.end_because(time::now(), why);
            self.run_effects(ctx).await;
        }
        before
    }

    /// Another node took the client id over: the session's state for it (see
    /// [`starling_session::Session::hand_over`]), closing the connection with 0x8E.
    pub(super) async fn hand_over(&mut self, ctx: &mut Ctx<Self>) -> Option<Box<HandOff>> {
        if self.session.is_ended() {
            return None;
        }
        if self.session.is_attached() {
            self.closing = Some(DisconnectReason::Server(ReasonCode::SessionTakenOver));
        }
        let state = self.session.hand_over(time::now(), time::wall());
        self.run_effects(ctx).await;
        state.map(|state| {
            Box::new(HandOff {
                state,
                owner: self.owner().map(|o| o.to_string()),
                from: 0,
            })
        })
    }

    /// Subscribes the connected client to `filters` as its own SUBSCRIBE would (the
    /// session's checks, its gate, the shards, retained messages after), with no SUBACK:
    /// per filter, the QoS granted or the code that refused it.
    pub(super) async fn operator_subscribe(
        &mut self,
        filters: Vec<String>,
        qos: QoS,
        ctx: &mut Ctx<Self>,
    ) -> Result<Vec<Result<QoS, ReasonCode>>, NotConnected> {
        if !self.session.is_attached() {
            return Err(NotConnected);
        }
        add(
            &self.shared.metrics.rmqtt.client_subscribe,
            filters.len() as u64,
        );
        // A verdict that comes later is waited for here, under its deadline: the client's
        // own SUBSCRIBE waits apart because its later packets must keep their order behind
        // it, while an operator's request has nothing behind it and is rare.
        for f in &filters {
            if let Some(asked) = self.gate.subscribe_wait(f, qos) {
                let verdict = time::timeout(self.verdict_timeout(), asked.verdict).await;
                self.gate.verdict(asked.kind, asked.topic, verdict);
            }
        }
        let options = SubscriptionOptions {
            qos,
            ..SubscriptionOptions::default()
        };
        let checked = self
            .session
            .operator_subscribe(filters, options, &mut self.gate);
        self.gate.fed();
        let routed: Vec<_> = checked.iter().filter_map(|r| r.clone().ok()).collect();
        let mut granted = Vec::new().into_iter();
        if !routed.is_empty() {
            let r = self.route_subscribe(routed.clone(), None, ctx).await;
            self.session.operator_subscribed(routed, &r.results);
            self.meta_changed(true);
            let now = time::now();
            for (m, o) in r.retained {
                self.deliver(now, &m, &o, ctx);
            }
            self.run_effects(ctx).await;
            granted = r.results.into_iter();
        }
        let answers: Vec<_> = checked
            .into_iter()
            .map(|c| match c {
                Ok(req) => match granted.next() {
                    Some(Ok(q)) => Ok(q.min(req.options.qos)),
                    Some(Err(code)) => Err(code),
                    None => Err(ReasonCode::UnspecifiedError),
                },
                Err(code) => Err(code),
            })
            .collect();
        let refused = answers.iter().filter_map(|a| a.as_ref().err().copied());
        self.shared.metrics.rmqtt.subscribe_refusals(refused);
        Ok(answers)
    }

    /// Unsubscribes the connected client from `filters`, with no UNSUBACK: the router's
    /// code for each.
    pub(super) async fn operator_unsubscribe(
        &mut self,
        filters: Vec<String>,
    ) -> Result<Vec<ReasonCode>, NotConnected> {
        if !self.session.is_attached() {
            return Err(NotConnected);
        }
        add(
            &self.shared.metrics.rmqtt.client_unsubscribe,
            filters.len() as u64,
        );
        let codes = self.route_unsubscribe(filters.clone()).await;
        self.session.operator_unsubscribed(&filters, &codes);
        self.meta_changed(true);
        Ok(codes)
    }
}
