//! The client actor: one per client identifier. It owns the [`Session`] for the session's
//! whole life and, while a connection is attached, that connection's socket (read through
//! [`Actor::poll_input`] as batches of decoded packets, written in batches), all in one task:
//! an idle connection is one task, one mailbox and no buffers.
//!
//! One actor per client rather than a connection actor plus a session actor: an idle
//! connection then costs one task and one mailbox, and a takeover is a message to the actor
//! that owns the client id (the registry guarantees there is one), which closes the old
//! socket (v5: DISCONNECT 0x8E) and adopts the new one.

use std::sync::Arc;

use bytes::BytesMut;
use starling_codec::{encode, Disconnect, Packet, Properties, QoS, ReasonCode, PACKET_SIZE_MAX};
use starling_config::{BackpressureHolders, MqttConfig, StuckPolicy};
use starling_hooks::{Chain, DisconnectReason, EventKind, What};
use starling_rt::{time, Ctx, TrySendError, WeakAddr};
use starling_session::{DetachReason, DropReason, Effect, Message, Session};
use tracing::{debug, Instrument};

use crate::conn::{linger, write_out, Conn, WRITE_BATCH_MAX};
use crate::gate::AuthGate;
use crate::metrics::{add, dec};
use crate::msg::{AckTo, ClientMsg, NewConn, Publisher, RegistryMsg, RouterMsg, Stored, OWN_WRITE};
use crate::settings::Shared;
use crate::shards::Shards;
use acks::Acks;
use flow::ClientFlow;
use persist::Persist;

mod acks;
mod admin;
mod attach;
mod flow;
mod hooks;
mod input;
mod persist;
mod subscribe;

use input::passes_hold;

/// Packets decoded per input item: a turn's work budget, and the unit of write batching.
const INPUT_BATCH_MAX: usize = 64;
/// A write of QoS 0 deliveries smaller than this at the end of a burst waits for one yield
/// first, at most [`COALESCE_MAX`] times in a row (see `Client::after_turn`).
const COALESCE_BELOW: usize = 16 * 1024;
const COALESCE_MAX: u8 = 4;
/// Packets held back at most while the client's publishes are (see [`crate::flow`]): past
/// this nothing more is read, acknowledgements included, until it is released.
const HELD_MAX: usize = 256;
/// Held packets released per input item once the hold is lifted: small, so that publishers
/// let go together (every one that fed a subscriber is woken when it drains) add little to
/// its queue before the router holds them again, rather than a full batch each.
const HELD_RELEASE: usize = 16;
/// An effect's part that has to wait (see [`Client::run_effects`]).
enum Wait {
    /// A publish whose shard's mailbox was full, or that is sent without trying (will).
    Route(Arc<Message>, Option<Publisher>, Option<Box<AckTo>>),
    /// The session ended: every shard forgets it.
    Ended(Vec<String>),
    Subscribe(
        starling_codec::PacketId,
        Vec<starling_session::SubscribeRequest>,
    ),
    Unsubscribe(starling_codec::PacketId, Vec<String>),
    Close(Option<ReasonCode>),
}

pub(crate) struct Client {
    shared: Arc<Shared>,
    shards: Shards,
    registry: WeakAddr<RegistryMsg>,
    session: Session,
    gate: AuthGate,
    conn: Option<Conn>,
    first: Option<Box<NewConn>>,
    /// Acknowledgements waiting for the store (see `acks`); boxed, made at the first.
    acks: Option<Box<Acks>>,
    /// The session's own writes to the store (see `persist`): made when a session that
    /// outlives its connection first writes.
    persist: Option<Box<Persist>>,
    /// Its back-pressure state (see [`crate::flow`]), made at the first subscription or
    /// QoS 1/2 publish: whom it is held back by, and what it reports to the shards.
    flow: Option<Box<ClientFlow>>,
    /// Attach messages handled, for the registry's retire handshake.
    attaches: u32,
    retiring: bool,
    /// Waiting for a later authorization verdict (see `hooks`): input is held back, in
    /// order, as while held back by a subscriber.
    waiting: bool,
    /// The current wait, to tell a stale verdict.
    wait_seq: u32,
    /// Why the connection is closing, for the disconnected event, once known.
    closing: Option<DisconnectReason>,
}

impl Client {
    pub(crate) fn new(
        shared: Arc<Shared>,
        shards: Shards,
        chain: Arc<Chain>,
        registry: WeakAddr<RegistryMsg>,
        client_id: Arc<str>,
        first: Box<NewConn>,
    ) -> Self {
        let gate = AuthGate::new(
            shared.clone(),
            chain,
            first.username.clone(),
            client_id.clone(),
            first.peer.ip(),
        );
        let session = Session::new(client_id, shared.limits.clone());
        let mut c = Self::with(shared, shards, registry, session, gate);
        c.first = Some(first);
        c
    }

    fn with(
        shared: Arc<Shared>,
        shards: Shards,
        registry: WeakAddr<RegistryMsg>,
        session: Session,
        gate: AuthGate,
    ) -> Self {
        Self {
            session,
            shared,
            shards,
            registry,
            gate,
            conn: None,
            first: None,
            acks: None,
            persist: None,
            flow: None,
            attaches: 0,
            retiring: false,
            waiting: false,
            wait_seq: 0,
            closing: None,
        }
    }

    /// Whether its identity may hold publishers back (`mqtt.backpressure_holders`).
    fn may_hold(&self) -> bool {
        may_hold(&self.shared.config.mqtt, self.gate.username().map(|u| &**u))
    }

    /// The moment of a packet fed now: when the bytes of the connection's last read
    /// reached the host, if the transport said ([`crate::conn::arrival`]), else now.
    fn packet_time(&self) -> time::Instant {
        let now = time::now();
        self.conn
            .as_ref()
            .and_then(|c| c.io.received_at())
            .and_then(|stamp| crate::conn::arrival(stamp, now, time::wall()))
            .unwrap_or(now)
    }

    /// Whether its publishes are held back now: by a subscriber (see [`crate::flow`]) or
    /// while it waits for a verdict (see `hooks`).
    fn is_held(&self) -> bool {
        self.waiting || self.flow.as_ref().is_some_and(|f| f.holds.is_held())
    }

    fn client_id(&self) -> Arc<str> {
        self.session.client_id().clone()
    }

    /// The identity the session belongs to: the first connection's username.
    pub(crate) fn owner(&self) -> Option<Arc<str>> {
        self.first
            .as_ref()
            .and_then(|c| c.username.as_deref())
            .map(Arc::from)
    }

    async fn presence(&mut self, online: bool) {
        let may_hold = self.may_hold();
        let Some(r) = self.flow.as_ref().and_then(|f| f.reporter.as_ref()) else {
            // Never subscribed: no shard knows it.
            return;
        };
        let known = r.known().to_vec();
        let persistent = self.stores_deliveries();
        self.shards
            .presence(self.client_id(), online, may_hold, persistent, &known)
            .await;
    }

    /// Applies every pending effect of the session, in order.
    async fn run_effects(&mut self, ctx: &mut Ctx<Self>) {
        // Effects that need no wait are applied in `apply_effects`; one that does leaves it
        // as a small `Wait`, so that no effect (a `Packet` is ~400 bytes) is held across an
        // await: every turn's future, allocated per turn, is sized by what it holds there.
        while let Some(wait) = self.apply_effects(ctx) {
            Box::pin(self.wait_effect(wait, ctx)).await;
        }
    }

    /// Applies effects until one has to wait (or none is left).
    fn apply_effects(&mut self, ctx: &Ctx<Self>) -> Option<Wait> {
        while let Some(effect) = self.session.poll_effect() {
            match effect {
                Effect::Send(p) => {
                    if let Packet::Suback(a) = &p {
                        let codes = a.reason_codes.iter().copied();
                        self.shared.metrics.rmqtt.subscribe_refusals(codes);
                    }
                    // A PUBREC with no publish routed for it answers a resend.
                    let resend = is_resend_answer(&p)
                        && self.waits_for_routing()
                        && !self.acks.as_ref().is_some_and(|a| a.is_awaiting());
                    let p = match self.acks.as_mut() {
                        _ if resend => match self.resent(p) {
                            Some(p) => p,
                            None => continue,
                        },
                        Some(a) => match a.pass(p) {
                            Some(p) => p,
                            None => continue,
                        },
                        None => p,
                    };
                    if let Packet::Pubcomp(a) = &p {
                        if let Some(acks) = self.acks.as_mut() {
                            acks.released(a.packet_id);
                        }
                    }
                    self.encode(&p);
                }
                Effect::SendPublish(op) => {
                    if let Some(c) = &mut self.conn {
                        // A QoS 1/2 delivery is not put off: the subscriber's acknowledgement
                        // opens its window, and the round trip bounds it (fan-in QoS 1).
                        c.urgent |= op.qos != QoS::AtMostOnce;
                        c.out.extend_from_slice(&op.header);
                        c.out.extend_from_slice(&op.msg.payload);
                        add(&self.shared.metrics.messages_sent, 1);
                        if let Some(since) = op.latency_from {
                            c.time_delivery(since);
                        }
                    }
                    self.emit(EventKind::MessageDelivered, || What::MessageDelivered {
                        topic: op.msg.topic.clone(),
                        qos: op.qos,
                        packet_id: op.packet_id,
                    });
                }
                Effect::Publish(m) => {
                    add(&self.shared.metrics.messages_received, 1);
                    self.emit(EventKind::MessagePublish, || What::MessagePublish {
                        topic: m.topic.clone(),
                        qos: m.qos,
                        retain: m.retain,
                        payload: m.payload.clone(),
                    });
                    // A shard holds a publisher that feeds a backlogged subscriber back
                    // (see `crate::flow`); a QoS 0 one only if most of its deliveries
                    // would wait (`mqtt.backpressure_qos0`).
                    let mqtt = &self.shared.config.mqtt;
                    let from = (mqtt.backpressure
                        && (m.qos != QoS::AtMostOnce || mqtt.backpressure_qos0))
                        .then(|| {
                            let f = self.flow_mut(ctx);
                            Publisher {
                                epoch: f.holds.epoch(),
                                ..f.me.clone()
                            }
                        });
                    // A full router mailbox is waited on: it holds this client's reads back,
                    // which is the back-pressure a fast publisher meets.
                    // Its acknowledgement waits for what it changes in the store (with a
                    // store, every QoS 1/2 publish may reach a persistent session) and, in
                    // a cluster, for the nodes it is forwarded to, store or not.
                    let inbound = self.inbound_for_publish();
                    let waits = self.waits_for_routing();
                    let ack = (m.qos != QoS::AtMostOnce && waits).then(|| {
                        let tag = self.acks.get_or_insert_with(Box::default).request();
                        Box::new(AckTo {
                            addr: ctx.weak_addr(),
                            tag,
                            inbound,
                        })
                    });
                    let shard = self.shards.for_publish(&m.topic);
                    if let Err(TrySendError::Full(RouterMsg::Publish(m, from, ack))) =
                        shard.try_send(RouterMsg::Publish(m, from, ack))
                    {
                        return Some(Wait::Route(m, from, ack));
                    }
                }
                Effect::Subscribe { packet_id, filters } => {
                    return Some(Wait::Subscribe(packet_id, filters))
                }
                Effect::Unsubscribe { packet_id, filters } => {
                    return Some(Wait::Unsubscribe(packet_id, filters))
                }
                Effect::Will(m) => {
                    if let Some(m) = self.will(m) {
                        return Some(Wait::Route(m, None, None));
                    }
                }
                Effect::Close(code) => {
                    if let Some(code) = code {
                        self.closing.get_or_insert(DisconnectReason::Server(code));
                    }
                    return Some(Wait::Close(code));
                }
                Effect::SessionEnded { subscriptions } => {
                    self.session_dropped();
                    add(&self.shared.metrics.rmqtt.session_terminated, 1);
                    self.emit(EventKind::SessionTerminated, || What::SessionTerminated);
                    return Some(Wait::Ended(subscriptions));
                }
                Effect::Store(change) => self.store_change(change),
                Effect::Dropped { reason, qos } => {
                    self.dropped_event(reason, qos);
                    let m = &self.shared.metrics;
                    // The two reasons the session refuses a client's PUBLISH for (a
                    // reserved topic is refused as not authorized).
                    if matches!(
                        reason,
                        DropReason::NotAuthorized | DropReason::PayloadFormatInvalid
                    ) {
                        add(&m.rmqtt.client_publish_error, 1);
                    }
                    add(
                        match reason {
                            DropReason::QueueFull => &m.dropped_queue_full,
                            DropReason::Expired => &m.dropped_expired,
                            _ => &m.dropped_other,
                        },
                        1,
                    );
                }
            }
        }
        None
    }

    /// The part of an effect that waits: on the router, or on the socket at close.
    async fn wait_effect(&mut self, wait: Wait, ctx: &mut Ctx<Self>) {
        match wait {
            Wait::Route(m, from, ack) => {
                let shard = self.shards.for_publish(&m.topic);
                let _ = shard.send(RouterMsg::Publish(m, from, ack)).await;
            }
            Wait::Ended(filters) => {
                let known = self
                    .flow
                    .as_ref()
                    .and_then(|f| f.reporter.as_ref())
                    .map_or_else(Vec::new, |r| r.known().to_vec());
                if !filters.is_empty() || known.contains(&true) {
                    self.shards
                        .session_ended(self.client_id(), ctx.id(), filters, &known)
                        .await;
                }
            }
            Wait::Subscribe(packet_id, filters) => {
                // This turn fed the SUBSCRIBE: it came with the last read.
                let since = self.packet_time();
                let r = self.route_subscribe(filters, Some(since), ctx).await;
                // SUBACK first, then the retained messages (MQTT 5 §3.8.4); the subscriptions
                // stored before either reaches the client. Then what raced the SUBSCRIBE,
                // before anything routed to it after (still in the mailbox).
                let now = time::now();
                self.session.subscribed(now, packet_id, r.results);
                self.meta_changed(true);
                for (m, o) in r.retained.iter().chain(&r.caught) {
                    self.deliver(now, m, o, ctx);
                }
            }
            Wait::Unsubscribe(packet_id, filters) => {
                let codes = self.route_unsubscribe(filters).await;
                self.session.unsubscribed(time::now(), packet_id, codes);
                self.meta_changed(true);
            }
            Wait::Close(code) => self.close_conn(code, ctx).await,
        }
    }

    fn encode(&mut self, p: &Packet) {
        let max = self.session.client_packet_size_max();
        if let Some(c) = &mut self.conn {
            c.urgent = true;
            if let Err(e) = encode(p, c.protocol, max, &mut c.out) {
                debug!(error = %e, packet = ?p.packet_type(), "packet not encodable, not sent");
            }
        }
    }

    /// Writes the pending output; on failure the session loses its connection.
    async fn flush(&mut self, ctx: &mut Ctx<Self>) {
        let Some(len) = self.conn.as_ref().map(|c| c.out.len()) else {
            return;
        };
        let n = self.sendable(len);
        let Some(c) = &mut self.conn else { return };
        if n == 0 {
            return;
        }
        c.urgent = false;
        c.deferred = 0;
        // What waits for the store stays (see `persist`); the rest goes.
        let rest = (n < c.out.len()).then(|| c.out.split_off(n));
        let ok = write_out(c).await;
        if let Some(rest) = rest {
            c.out = rest;
        }
        if ok {
            c.output_written(n, &self.shared.metrics);
        }
        self.output_sent(n);
        if ok {
            add(&self.shared.metrics.bytes_sent, n as u64);
            return;
        }
        debug!("write failed; connection lost");
        self.closing.get_or_insert(DisconnectReason::ConnectionLost);
        // Nothing more can be written: drop the socket before the session's Close.
        Box::pin(self.drop_conn(ctx)).await;
        self.session
            .detach(time::now(), DetachReason::ConnectionLost);
        Box::pin(self.run_effects(ctx)).await;
    }

    /// The node is leaving: an MQTT 5 client's DISCONNECT 0x9C will name `reference` as
    /// the server to use (MQTT 5 §3.14.2.2.5), if it fits the client's Maximum Packet Size.
    fn point_to(&mut self, reference: Option<Arc<String>>) {
        let max = self.session.client_packet_size_max();
        let Some(c) = self.conn.as_mut().filter(|c| c.protocol.is_v5()) else {
            return;
        };
        let Some(r) = reference else { return };
        let d = Packet::Disconnect(Disconnect {
            reason_code: ReasonCode::UseAnotherServer,
            properties: Properties {
                server_reference: Some(r.to_string()),
                ..Properties::default()
            },
        });
        let mut scratch = bytes::BytesMut::new();
        if encode(&d, c.protocol, max, &mut scratch).is_ok() {
            c.moved_to = Some(r);
        }
    }

    /// Writes the last bytes (a DISCONNECT with `code` for v5), then closes the socket.
    async fn close_conn(&mut self, code: Option<ReasonCode>, ctx: &mut Ctx<Self>) {
        // Acknowledgements still waiting belonged to this connection: its client sends
        // those PUBLISHes again (MQTT 4.4) on the next.
        if let Some(a) = self.acks.as_mut() {
            a.connection_closed();
            if a.is_empty() {
                self.acks = None;
            }
        }
        let Some(len) = self.conn.as_ref().map(|c| c.out.len()) else {
            return;
        };
        let sendable = self.sendable(len);
        let Some(c) = &mut self.conn else { return };
        // What waits behind a write that is not durable yet is dropped: the client gets it
        // again on its next connection (MQTT 4.4).
        c.out.truncate(sendable);
        if let Some(code) = code.filter(|_| c.protocol.is_v5()) {
            let mut properties = Properties::default();
            if code == ReasonCode::UseAnotherServer {
                properties.server_reference = c.moved_to.take().map(|r| r.to_string());
            }
            let d = Packet::Disconnect(Disconnect {
                reason_code: code,
                properties,
            });
            let _ = encode(&d, c.protocol, PACKET_SIZE_MAX, &mut c.out);
        }
        let n = c.out.len();
        if write_out(c).await {
            add(&self.shared.metrics.bytes_sent, n as u64);
            c.output_written(sendable, &self.shared.metrics);
        }
        self.drop_conn(ctx).await;
    }

    async fn drop_conn(&mut self, _ctx: &mut Ctx<Self>) {
        let Some(c) = self.conn.take() else { return };
        // Offsets into the output of the next connection start from nothing.
        self.output_sent(usize::MAX);
        // The socket is closed once the peer has read what we wrote (see [`linger`]).
        if !c.eof {
            starling_rt::spawn(linger(c.io).instrument(tracing::Span::current()));
        }
        dec(&self.shared.metrics.clients_connected);
        add(&self.shared.metrics.rmqtt.client_disconnected, 1);
        self.presence(false).await;
        let reason = self
            .closing
            .take()
            .unwrap_or(DisconnectReason::ConnectionLost);
        self.waiting = false;
        self.emit(EventKind::ClientDisconnected, || What::ClientDisconnected {
            reason,
        });
    }

    /// After a turn: arm the session's timer, schedule the write, retire an ended session.
    async fn after_turn(&mut self, ctx: &mut Ctx<Self>) {
        // Boxed, and only when there is something to write: its future is a kilobyte, and
        // inline it made every turn's that large (allocated and copied per turn).
        if self.store_pending() {
            Box::pin(self.write_store(ctx)).await;
        }
        if let Some(c) = &self.conn {
            // Deferred while more messages wait: they are encoded before the write, so a
            // burst goes out in one write (each later turn comes back here). Not when the
            // window is full: queued deliveries then add nothing to write, and the
            // acknowledgements that open the window wait for what is already encoded.
            let idle = ctx.queued() == 0;
            let window = self.session.window();
            let stalled = window > 0 && self.session.inflight_len() >= window;
            // What waits for the store (see `persist`) is not written yet: the store's
            // answer brings a turn that writes it.
            let sendable = self.sendable(c.out.len());
            let full = sendable >= WRITE_BATCH_MAX || c.timed_full();
            let mut flush = sendable > 0 && (full || idle || stalled);
            if flush
                && !full
                && !stalled
                && !c.urgent
                && sendable < COALESCE_BELOW
                && c.deferred < COALESCE_MAX
            {
                // A small write of QoS 0 deliveries only, at the end of a burst: the shard
                // that feeds this subscriber gets a turn first, and what it routes
                // meanwhile goes out in the same write. One by one, a fan-out's deliveries
                // cost a send per subscriber and burst, and its readers a receive each: the
                // broker then wrote in small pieces and sat idle in between (fan-out QoS 0,
                // docs/benchmarks.md). Acknowledgements and QoS 1/2 deliveries are never
                // put off: a round trip waits for each.
                if let Some(c) = &mut self.conn {
                    c.deferred += 1;
                }
                starling_rt::yield_now().await;
                flush = ctx.queued() == 0;
            }
            if flush {
                self.flush(ctx).await;
            }
            if idle {
                // End of the burst: an idle connection keeps no buffers.
                if let Some(c) = &mut self.conn {
                    if c.out.is_empty() {
                        c.out = BytesMut::new();
                    }
                    c.release_timed();
                }
                self.session.release_buffers();
            }
        }
        self.report_flow(ctx).await;
        if self.conn.is_none() && self.session.is_ended() && !self.retiring {
            self.retiring = true;
            match self.registry.upgrade() {
                Some(r) => {
                    let _ = Box::pin(r.send(RegistryMsg::Retire {
                        client_id: self.client_id(),
                        actor: ctx.id(),
                        attaches: self.attaches,
                    }))
                    .await;
                }
                None => ctx.stop(),
            }
        }
    }

    /// Moves what is left of an input batch into the held packets, keeping order: what
    /// passes a hold stays in `packets` (moved to its front), the rest goes before anything
    /// held later.
    fn hold(&mut self, packets: &mut std::vec::IntoIter<Packet>) {
        let Some(c) = &mut self.conn else {
            // No connection to hold them for.
            packets.by_ref().for_each(drop);
            return;
        };
        let (pass, held): (Vec<Packet>, Vec<Packet>) = packets.by_ref().partition(passes_hold);
        let h = c.held.get_or_insert_with(Box::default);
        // Before what was held later, order kept.
        for p in held.into_iter().rev() {
            h.push_front(p);
        }
        *packets = pass.into_iter();
    }

    async fn turn(&mut self, msg: ClientMsg, ctx: &mut Ctx<Self>) {
        let attached = self.session.is_attached();
        let timeout = matches!(msg, ClientMsg::Timeout);
        if !self.handle_msg(msg, ctx).await {
            return;
        }
        if timeout || attached != self.session.is_attached() {
            // Detached (expiry and will delay start), or a timer moved the will or the
            // expiry on: the stored meta follows.
            self.meta_changed(false);
        }
        if attached && !self.session.is_attached() {
            self.stage_qos1();
        }
        self.after_turn(ctx).await;
    }

    /// One message; false when the turn ends without the after-turn work.
    ///
    /// Rare messages' work is boxed where it awaits much: this future is allocated and
    /// copied every turn, and its size is its largest branch's.
    async fn handle_msg(&mut self, msg: ClientMsg, ctx: &mut Ctx<Self>) -> bool {
        match msg {
            ClientMsg::Attach(nc) => Box::pin(self.attach(nc, ctx)).await,
            ClientMsg::Input(packets, error) => {
                if self.conn.is_none() {
                    return false;
                }
                let acked = packets.iter().any(|p| {
                    matches!(
                        p,
                        Packet::Puback(_) | Packet::Pubrec(_) | Packet::Pubcomp(_)
                    )
                });
                if let Some(r) = self.flow.as_mut().and_then(|f| f.reporter.as_mut()) {
                    if acked {
                        r.progressed();
                    }
                }
                let mut packets = packets.into_iter();
                let mut acks = 0;
                while self.session.is_attached() {
                    // Held back (a Hold came in since these were read): the rest waits, in
                    // order, and only what passes a hold goes on.
                    if !packets.as_slice().first().is_none_or(passes_hold) && self.is_held() {
                        self.hold(&mut packets);
                        continue;
                    }
                    // A verdict it needs is to come later: it waits, in order, as held.
                    let next = packets.as_slice().first();
                    if let Some(asked) = next.and_then(|p| self.gate.next_wait(&self.session, p)) {
                        self.wait_for(asked, ctx);
                        self.hold(&mut packets);
                        continue;
                    }
                    // No packet is bound across the await below (see `run_effects`).
                    let Some(ok) = packets.next().map(|p| self.feed(p, &mut acks)) else {
                        break;
                    };
                    self.run_effects(ctx).await;
                    if !ok {
                        break;
                    }
                }
                if acks > 0 {
                    add(&self.shared.metrics.rmqtt.messages_acked, u64::from(acks));
                }
                if let Some(e) = error {
                    if self.session.is_attached() {
                        debug!(error = %e, "malformed packet; closing");
                        self.closing = Some(DisconnectReason::Server(e.reason_code()));
                        self.session
                            .detach(time::now(), DetachReason::ProtocolError(e.reason_code()));
                        self.run_effects(ctx).await;
                    }
                }
            }
            ClientMsg::InputEnd => {
                if self.conn.is_none() {
                    return false;
                }
                self.closing.get_or_insert(DisconnectReason::ConnectionLost);
                self.session
                    .detach(time::now(), DetachReason::ConnectionLost);
                self.run_effects(ctx).await;
                // The session may have had nothing to close (already detached).
                Box::pin(self.drop_conn(ctx)).await;
            }
            ClientMsg::Deliver(shard, mut batch) => {
                let shard = usize::from(shard);
                let now = time::now();
                let backpressure = self.shared.config.mqtt.backpressure;
                if let Some(r) = self.flow.as_mut().and_then(|f| f.reporter.as_mut()) {
                    r.taken(shard, batch.len());
                }
                for (m, o) in &mut batch {
                    if backpressure && m.qos != QoS::AtMostOnce {
                        let queued = self.session.queue_len();
                        if let Some(r) = self.flow.as_ref().and_then(|f| f.reporter.as_ref()) {
                            o.held_back |= r.absorbs(shard, queued);
                        }
                    }
                    self.deliver(now, m, o, ctx);
                }
                self.run_effects(ctx).await;
            }
            ClientMsg::Hold { shard, subscriber } => {
                self.flow_mut(ctx).holds.hold(shard, subscriber);
            }
            ClientMsg::Release { shard, subscriber } => {
                if let Some(f) = &mut self.flow {
                    f.holds.release(shard, subscriber);
                }
            }
            ClientMsg::Watch { shard, on } => {
                if let Some(r) = self.flow.as_mut().and_then(|f| f.reporter.as_mut()) {
                    r.watch(usize::from(shard), on);
                }
            }
            ClientMsg::Stalled { shard } => {
                if let Some(r) = self.flow.as_mut().and_then(|f| f.reporter.as_mut()) {
                    r.stalled(usize::from(shard));
                }
                let kick =
                    self.shared.config.mqtt.backpressure_stuck_policy == StuckPolicy::Disconnect;
                if kick && self.session.is_attached() {
                    debug!("stalled while holding publishers back: disconnected");
                    self.closing = Some(DisconnectReason::Server(ReasonCode::QuotaExceeded));
                    self.session.detach(
                        time::now(),
                        DetachReason::ProtocolError(ReasonCode::QuotaExceeded),
                    );
                    self.run_effects(ctx).await;
                }
            }
            ClientMsg::Timeout => {
                // The one timeout that closes a connection is its keep alive (MQTT 5
                // §3.1.2.10); will delay and expiry run while detached.
                let reason = DisconnectReason::Server(ReasonCode::KeepAliveTimeout);
                let attached = self.session.is_attached();
                self.session.handle_timeout(time::now());
                if attached && !self.session.is_attached() {
                    self.closing.get_or_insert(reason);
                }
                self.run_effects(ctx).await;
            }
            ClientMsg::Verdict {
                attach,
                seq,
                kind,
                topic,
                verdict,
            } => {
                if attach == self.attaches {
                    self.on_verdict(seq, kind, topic, verdict);
                }
            }
            ClientMsg::Stored {
                tag: OWN_WRITE,
                outcome,
            } => {
                if outcome != Stored::Durable {
                    debug!(?outcome, "session write not durable");
                }
                self.own_write_durable();
            }
            ClientMsg::Stored { tag, outcome } => {
                if self.stored(&[tag], outcome) {
                    self.run_effects(ctx).await;
                }
            }
            ClientMsg::Routed(tags) => {
                self.stored(&tags, Stored::Durable);
            }
            ClientMsg::Settled(settled) => {
                // Mostly one outcome: a pass per outcome (acknowledgements still go in
                // the order their publishes came).
                let mut abandoned = false;
                for outcome in [
                    Stored::Durable,
                    Stored::Failed,
                    Stored::Refused,
                    Stored::Unconfirmed,
                ] {
                    let tags: Vec<u32> = settled
                        .iter()
                        .filter(|(_, o)| *o == outcome)
                        .map(|(t, _)| *t)
                        .collect();
                    if !tags.is_empty() {
                        abandoned |= self.stored(&tags, outcome);
                    }
                }
                if abandoned {
                    self.run_effects(ctx).await;
                }
            }
            ClientMsg::Shutdown(reply) => {
                self.closing = Some(DisconnectReason::Server(ReasonCode::ServerShuttingDown));
                self.session
                    .detach(time::now(), DetachReason::ServerShutdown);
                self.run_effects(ctx).await;
                // Detached, as the restart finds it.
                self.meta_changed(false);
                self.stage_qos1();
                Box::pin(self.write_store(ctx)).await;
                let _ = reply.send(());
                return false;
            }
            ClientMsg::Move(reference) => {
                self.point_to(reference);
                if self.conn.is_some() {
                    self.closing = Some(DisconnectReason::Server(ReasonCode::UseAnotherServer));
                    self.session.detach(time::now(), DetachReason::Moved);
                    self.run_effects(ctx).await;
                }
            }
            ClientMsg::Info(reply) => {
                let _ = reply.send(self.info());
            }
            ClientMsg::Subscriptions(reply) => {
                let _ = reply.send(self.subscription_list());
            }
            ClientMsg::Kick(reply) => {
                let was = Box::pin(self.kick(ctx)).await;
                let _ = reply.send(was);
            }
            ClientMsg::HandOver { to, reply } => {
                if self.session.is_ended() {
                    let _ = reply.send(None);
                    return true;
                }
                // First every shard relays to the new node instead of delivering here;
                // what they delivered before is in the mailbox, and the state is taken
                // behind it.
                if self.shared.config.cluster.handover_relay {
                    self.shards.moved_away(&self.client_id(), to).await;
                }
                ctx.spawn_then(async {}, move |()| ClientMsg::HandOverNow(reply));
            }
            ClientMsg::HandOverNow(reply) => {
                let h = Box::pin(self.hand_over(ctx)).await;
                let _ = reply.send(h);
            }
            ClientMsg::GiveWay(reply) => {
                let gave = self.conn.is_none() && self.session.give_way(time::now());
                if gave {
                    self.run_effects(ctx).await;
                    // Its record's removal is in the store's queue before the session that
                    // takes its place writes its own.
                    self.meta_changed(false);
                    Box::pin(self.write_store(ctx)).await;
                }
                let _ = reply.send(gave);
            }
            ClientMsg::Subscribe {
                filters,
                qos,
                reply,
            } => {
                let r = Box::pin(self.operator_subscribe(filters, qos, ctx)).await;
                let _ = reply.send(r);
            }
            ClientMsg::Unsubscribe { filters, reply } => {
                let r = Box::pin(self.operator_unsubscribe(filters)).await;
                let _ = reply.send(r);
            }
            ClientMsg::Resubscribe { moved, reply } => {
                // A session handed over here: every shard judges what comes for it by
                // the move's cut (`routing::moving`), and has stored that it does, before
                // the session is stored and subscribes. Were the session stored first, a
                // kill before the judgement's commit would restore it without one, and a
                // copy routed to it here before the cut that came after the restart
                // would be delivered beside the old node's relay of it.
                let subscribed = self.session.subscriptions().iter().next().is_some();
                if let Some(m) = moved.filter(|_| subscribed) {
                    self.shards.moved_in(&self.client_id(), m).await;
                }
                Box::pin(self.adopt()).await;
                let waits = Box::pin(self.resubscribe(ctx)).await;
                let _ = reply.send(waits);
            }
        }
        true
    }
}

/// Whether `p` may be the session's answer to a QoS 2 PUBLISH sent again under a packet id
/// it awaits a PUBREL for: a PUBREC that does not fail (one that fails answers a refused
/// first PUBLISH: not authorized, payload invalid), when no publish was just routed.
fn is_resend_answer(p: &Packet) -> bool {
    matches!(p, Packet::Pubrec(a) if !a.reason_code.is_error())
}

/// Whether a subscriber with this username may hold its publishers back
/// (`mqtt.backpressure_holders`).
fn may_hold(m: &MqttConfig, username: Option<&str>) -> bool {
    match m.backpressure_holders {
        BackpressureHolders::All => true,
        BackpressureHolders::Authenticated => username.is_some(),
    }
}

#[cfg(all(test, target_pointer_width = "64"))]
mod size_tests {
    /// Every idle connection holds one `Client` (with its `Session` and its socket's buffer
    /// headers) in its actor's cell: a field added here is paid a million times on a large
    /// node. Raise these bounds only knowingly (docs/benchmarks.md has the memory model).
    #[test]
    fn idle_connection_state_stays_small() {
        let client = std::mem::size_of::<super::Client>();
        let session = std::mem::size_of::<starling_session::Session>();
        // 496: +8 for the packets held back while the router holds this client back (flow.rs).
        // 504: +8 for the hook chain its gate asks (gate.rs, starling-hooks).
        // 480: -24, the keep-alive timer handle gone (the session's deadline is the actor's
        // own, `Actor::deadline`).
        // 488: +8 for the acknowledgements that wait for the store (client/acks.rs).
        // 496: +8 for a persistent session's own writes to the store (client/persist.rs).
        // 504: +8 for the connection's accept time, peer port and clean start, the
        // operator's view of it (client/admin.rs, the HTTP API).
        // 512: +8 for the connection's writes timed for the latency histograms (conn.rs
        // `Timed`, boxed and dropped at the end of each burst: an idle connection holds
        // none).
        // 520: +8 for the member a leaving node points the client to (conn.rs `moved_to`,
        // the DISCONNECT 0x9C's Server Reference; a thin `Arc<String>`).
        assert!(client <= 520, "Client is {client} bytes");
        assert!(session <= 224, "Session is {session} bytes");
    }
}
