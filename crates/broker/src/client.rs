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
use std::task::{Context, Poll};

use bytes::BytesMut;
use starling_codec::{
    decode, encode, Connect, Disconnect, Packet, Properties, QoS, ReasonCode, PACKET_SIZE_MAX,
};
use starling_config::{BackpressureHolders, MqttConfig, StuckPolicy};
use starling_rt::{time, Actor, Ctx, TimerId, TrySendError, WeakAddr};
use starling_session::{
    DeliveryOptions, DetachReason, DropReason, Effect, Instant, Message, Session,
};
use tracing::{debug, Instrument};

use crate::conn::{linger, write_out, Conn, WRITE_BATCH_MAX};
use crate::flow::{Holds, Reporter, StallRules};
use crate::gate::AclGate;
use crate::metrics::{add, dec};
use crate::msg::{sys_message, ClientMsg, NewConn, Publisher, RegistryMsg, RouterMsg};
use crate::settings::Shared;
use crate::shards::Shards;

/// Packets decoded per input item: a turn's work budget, and the unit of write batching.
const INPUT_BATCH_MAX: usize = 64;
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
    Route(Arc<Message>, Option<Publisher>),
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
    gate: AclGate,
    conn: Option<Conn>,
    first: Option<Box<NewConn>>,
    timer: Option<(Instant, TimerId)>,
    /// Its back-pressure state (see [`crate::flow`]), made at the first subscription or
    /// QoS 1/2 publish: whom it is held back by, and what it reports to the shards.
    flow: Option<Box<ClientFlow>>,
    /// Attach messages handled, for the registry's retire handshake.
    attaches: u32,
    retiring: bool,
}

/// A client's side of back-pressure: nothing in it is shared.
struct ClientFlow {
    /// This client as a publisher that may be held back.
    me: Publisher,
    holds: Holds,
    /// As a subscriber, once it has subscribed.
    reporter: Option<Reporter>,
}

impl Client {
    pub(crate) fn new(
        shared: Arc<Shared>,
        shards: Shards,
        registry: WeakAddr<RegistryMsg>,
        client_id: Arc<str>,
        first: Box<NewConn>,
    ) -> Self {
        let gate = AclGate::new(
            shared.clone(),
            first.username.clone(),
            client_id.clone(),
            first.peer.ip(),
        );
        Self {
            session: Session::new(client_id, shared.limits.clone()),
            shared,
            shards,
            registry,
            gate,
            conn: None,
            first: Some(first),
            timer: None,
            flow: None,
            attaches: 0,
            retiring: false,
        }
    }

    /// The client's back-pressure state, made at its first need.
    fn flow_mut(&mut self, ctx: &Ctx<Self>) -> &mut ClientFlow {
        self.flow.get_or_insert_with(|| {
            Box::new(ClientFlow {
                me: Publisher {
                    id: ctx.id(),
                    addr: ctx.weak_addr(),
                },
                holds: Holds::default(),
                reporter: None,
            })
        })
    }

    /// Whether its identity may hold publishers back (`mqtt.backpressure_holders`).
    fn may_hold(&self) -> bool {
        may_hold(&self.shared.config.mqtt, self.gate.username())
    }

    /// Whether its publishes are held back now.
    fn is_held(&self) -> bool {
        self.flow.as_ref().is_some_and(|f| f.holds.is_held())
    }

    /// Hands a routed message to the session unless the ACL withholds its topic from this
    /// client (a subscription may match topics its rules deny).
    fn deliver(&mut self, now: Instant, m: &Arc<Message>, o: &DeliveryOptions) {
        if self.gate.may_read(&m.topic) {
            self.session.deliver(now, m, o);
        } else {
            add(&self.shared.metrics.dropped_acl, 1);
        }
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

    async fn attach(&mut self, nc: Box<NewConn>, ctx: &mut Ctx<Self>) {
        self.attaches = self.attaches.wrapping_add(1);
        self.retiring = false;
        if self.session.is_attached() {
            // Takeover (MQTT 5 §3.1.4): the old connection is closed (0x8E), the session
            // moves to the new one.
            debug!(peer = %nc.peer, "session taken over");
            self.session.detach(time::now(), DetachReason::TakenOver);
            self.run_effects(ctx).await;
        }
        // A connection the session no longer knows (it was closed above, or broke while a
        // write failed) must not linger.
        self.close_conn(None, ctx).await;
        let NewConn {
            connect,
            io,
            buf,
            peer,
            username,
            permit,
        } = *nc;
        self.gate = AclGate::new(self.shared.clone(), username, self.client_id(), peer.ip());
        let protocol = connect.protocol;
        self.conn = Some(Conn {
            io,
            input: buf,
            input_ended: false,
            end_owed: false,
            held: None,
            releasing: false,
            eof: false,
            out: BytesMut::new(),
            protocol,
            _permit: permit,
        });
        match self.session.attach(time::now(), &connect) {
            Ok(a) => {
                add(&self.shared.metrics.clients_connected, 1);
                self.presence(true).await;
                self.event("connected", Some((&connect, a.keep_alive_secs)))
                    .await;
            }
            Err(e) => {
                // The session refused the connection before anything was sent (a CONNACK
                // past the client's Maximum Packet Size, MQTT 5 §3.1.2.11.4): close it at
                // once. It never counted as connected, so no presence or event goes out.
                debug!(error = %e, "attach refused; closing");
                if let Some(c) = self.conn.take() {
                    starling_rt::spawn(linger(c.io).instrument(tracing::Span::current()));
                }
                return;
            }
        }
        self.run_effects(ctx).await;
    }

    async fn presence(&mut self, online: bool) {
        let may_hold = self.may_hold();
        let Some(r) = self.flow.as_ref().and_then(|f| f.reporter.as_ref()) else {
            // Never subscribed: no shard knows it.
            return;
        };
        let known = r.known().to_vec();
        self.shards
            .presence(self.client_id(), online, may_hold, &known)
            .await;
    }

    /// `$SYS/brokers/{node}/clients/{client_id}/{connected|disconnected}`.
    async fn event(&mut self, what: &str, connect: Option<(&Connect, u16)>) {
        let id = self.client_id();
        let topic = format!("{}/clients/{}/{}", self.shared.sys_prefix, id, what);
        let mut payload = format!(
            "{{\"clientid\":\"{}\",\"ts\":{}",
            json_escape(&id),
            time::unix_secs()
        );
        if let (Some((c, keep_alive)), Some(_)) = (connect, &self.conn) {
            payload.push_str(&format!(
                ",\"username\":{},\"ipaddress\":\"{}\",\"proto_ver\":{},\"keepalive\":{},\"clean_start\":{}",
                self.gate
                    .username()
                    .map_or("null".to_owned(), |u| format!("\"{}\"", json_escape(u))),
                self.gate.addr(),
                c.protocol.level(),
                keep_alive,
                c.clean_start
            ));
        }
        payload.push('}');
        let msg = sys_message(topic, payload, false);
        let shard = self.shards.for_publish(&msg.topic);
        let _ = shard.send(RouterMsg::Publish(msg, None)).await;
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
                Effect::Send(p) => self.encode(&p),
                Effect::SendPublish(op) => {
                    if let Some(c) = &mut self.conn {
                        c.out.extend_from_slice(&op.header);
                        c.out.extend_from_slice(&op.msg.payload);
                        add(&self.shared.metrics.messages_sent, 1);
                    }
                }
                Effect::Publish(m) => {
                    add(&self.shared.metrics.messages_received, 1);
                    // A shard holds a QoS 1/2 publisher that feeds a backlogged
                    // subscriber back (see `crate::flow`).
                    let from = (m.qos != QoS::AtMostOnce && self.shared.config.mqtt.backpressure)
                        .then(|| self.flow_mut(ctx).me.clone());
                    // A full router mailbox is waited on: it holds this client's reads back,
                    // which is the back-pressure a fast publisher meets.
                    let shard = self.shards.for_publish(&m.topic);
                    if let Err(TrySendError::Full(RouterMsg::Publish(m, from))) =
                        shard.try_send(RouterMsg::Publish(m, from))
                    {
                        return Some(Wait::Route(m, from));
                    }
                }
                Effect::Subscribe { packet_id, filters } => {
                    return Some(Wait::Subscribe(packet_id, filters))
                }
                Effect::Unsubscribe { packet_id, filters } => {
                    return Some(Wait::Unsubscribe(packet_id, filters))
                }
                Effect::Will(m) => {
                    if self.gate_allows_will(&m) {
                        return Some(Wait::Route(m, None));
                    }
                }
                Effect::Close(code) => return Some(Wait::Close(code)),
                Effect::SessionEnded { subscriptions } => return Some(Wait::Ended(subscriptions)),
                Effect::Dropped { reason, .. } => {
                    let m = &self.shared.metrics;
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
            Wait::Route(m, from) => {
                let shard = self.shards.for_publish(&m.topic);
                let _ = shard.send(RouterMsg::Publish(m, from)).await;
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
                let client_id = self.client_id();
                let me = ctx.weak_addr();
                let shards = self.shards.count();
                let rules = StallRules::new(&self.shared.config.mqtt, &self.shared.limits);
                let reach: Vec<_> = filters
                    .iter()
                    .map(|f| self.shards.reach(&f.filter))
                    .collect();
                let f = self.flow_mut(ctx);
                let r = f
                    .reporter
                    .get_or_insert_with(|| Reporter::new(shards, &rules));
                for reach in reach {
                    (0..shards)
                        .filter(|&s| reach.includes(s))
                        .for_each(|s| r.met(s));
                }
                let may_hold = self.may_hold();
                let r = self
                    .shards
                    .subscribe(client_id, me, may_hold, filters)
                    .await;
                let now = time::now();
                // SUBACK first, then the retained messages (MQTT 5 §3.8.4).
                self.session.subscribed(now, packet_id, r.results);
                for (m, o) in r.retained {
                    self.deliver(now, &m, &o);
                }
            }
            Wait::Unsubscribe(packet_id, filters) => {
                let client_id = self.client_id();
                let codes = self.shards.unsubscribe(client_id, filters).await;
                self.session.unsubscribed(time::now(), packet_id, codes);
            }
            Wait::Close(code) => self.close_conn(code, ctx).await,
        }
    }

    fn gate_allows_will(&mut self, m: &Message) -> bool {
        use starling_session::Gate;
        self.gate.allow_publish(&m.topic, m.qos, m.retain)
    }

    fn encode(&mut self, p: &Packet) {
        let max = self.session.client_packet_size_max();
        if let Some(c) = &mut self.conn {
            if let Err(e) = encode(p, c.protocol, max, &mut c.out) {
                debug!(error = %e, packet = ?p.packet_type(), "packet not encodable, not sent");
            }
        }
    }

    /// Writes the pending output; on failure the session loses its connection.
    async fn flush(&mut self, ctx: &mut Ctx<Self>) {
        let Some(c) = &mut self.conn else { return };
        if c.out.is_empty() {
            return;
        }
        let n = c.out.len();
        let ok = write_out(c).await;
        if ok {
            add(&self.shared.metrics.bytes_sent, n as u64);
            return;
        }
        debug!("write failed; connection lost");
        // Nothing more can be written: drop the socket before the session's Close.
        Box::pin(self.drop_conn(ctx)).await;
        self.session
            .detach(time::now(), DetachReason::ConnectionLost);
        Box::pin(self.run_effects(ctx)).await;
    }

    /// Writes the last bytes (a DISCONNECT with `code` for v5), then closes the socket.
    async fn close_conn(&mut self, code: Option<ReasonCode>, ctx: &mut Ctx<Self>) {
        let Some(c) = &mut self.conn else { return };
        if let Some(code) = code.filter(|_| c.protocol.is_v5()) {
            let d = Packet::Disconnect(Disconnect {
                reason_code: code,
                properties: Properties::default(),
            });
            let _ = encode(&d, c.protocol, PACKET_SIZE_MAX, &mut c.out);
        }
        let n = c.out.len();
        if write_out(c).await {
            add(&self.shared.metrics.bytes_sent, n as u64);
        }
        self.drop_conn(ctx).await;
    }

    async fn drop_conn(&mut self, _ctx: &mut Ctx<Self>) {
        let Some(c) = self.conn.take() else { return };
        // The socket is closed once the peer has read what we wrote (see [`linger`]).
        if !c.eof {
            starling_rt::spawn(linger(c.io).instrument(tracing::Span::current()));
        }
        dec(&self.shared.metrics.clients_connected);
        self.presence(false).await;
        self.event("disconnected", None).await;
    }

    /// After a turn: arm the session's timer, schedule the write, retire an ended session.
    /// Tells the shards what they need to know of this subscriber's backlog (see
    /// [`Reporter::due`]); waits for room, as a shard never waits on a client.
    async fn report_flow(&mut self, ctx: &mut Ctx<Self>) {
        let (queued, saturated) = (self.session.queue_len(), self.session.refuses_new());
        let Some(r) = self.flow.as_mut().and_then(|f| f.reporter.as_mut()) else {
            return;
        };
        let due = r.due(queued, saturated);
        for (shard, report) in due {
            let msg = RouterMsg::Flow {
                client_id: self.session.client_id().clone(),
                actor: ctx.id(),
                report,
            };
            // On the urgent lane: behind the publishes in the shard's mailbox it would come
            // too late to tell the shard that this queue fills (they are routed on the
            // stale view). A full urgent lane is waited on in the normal one.
            let shard = self.shards.get(shard);
            if let Err(TrySendError::Full(msg)) = shard.try_send_urgent(msg) {
                let _ = Box::pin(shard.send(msg)).await;
            }
        }
    }

    async fn after_turn(&mut self, ctx: &mut Ctx<Self>) {
        if let Some(c) = &self.conn {
            // Deferred while more messages wait: they are encoded before the write, so a
            // burst goes out in one write (each later turn comes back here). Not when the
            // window is full: queued deliveries then add nothing to write, and the
            // acknowledgements that open the window wait for what is already encoded.
            let idle = ctx.queued() == 0;
            let window = self.session.window();
            let stalled = window > 0 && self.session.inflight_len() >= window;
            if !c.out.is_empty() && (c.out.len() >= WRITE_BATCH_MAX || idle || stalled) {
                self.flush(ctx).await;
            }
            if idle {
                // End of the burst: an idle connection keeps no buffers.
                if let Some(c) = &mut self.conn {
                    if c.out.is_empty() {
                        c.out = BytesMut::new();
                    }
                }
                self.session.release_buffers();
            }
        }
        self.rearm(ctx);
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
        let later = std::mem::replace(&mut **h, held);
        h.extend(later);
        *packets = pass.into_iter();
    }

    fn rearm(&mut self, ctx: &mut Ctx<Self>) {
        let next = self.session.poll_timeout();
        if self.timer.map(|t| t.0) == next {
            return;
        }
        if let Some((_, id)) = self.timer.take() {
            ctx.cancel(id);
        }
        if let Some(at) = next {
            let delay = at.saturating_duration_since(time::now());
            self.timer = Some((at, ctx.after(delay, ClientMsg::Timeout)));
        }
    }

    async fn turn(&mut self, msg: ClientMsg, ctx: &mut Ctx<Self>) {
        match msg {
            ClientMsg::Attach(nc) => Box::pin(self.attach(nc, ctx)).await,
            ClientMsg::Input(packets, error) => {
                if self.conn.is_none() {
                    return;
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
                while self.session.is_attached() {
                    // Held back (a Hold came in since these were read): the rest waits, in
                    // order, and only what passes a hold goes on.
                    if !packets.as_slice().first().is_none_or(passes_hold) && self.is_held() {
                        self.hold(&mut packets);
                        continue;
                    }
                    // No packet is bound across the await below (see `run_effects`).
                    let Some(ok) = packets.next().map(|p| {
                        self.session
                            .handle_packet(time::now(), p, &mut self.gate)
                            .is_ok()
                    }) else {
                        break;
                    };
                    self.run_effects(ctx).await;
                    if !ok {
                        break;
                    }
                }
                if let Some(e) = error {
                    if self.session.is_attached() {
                        debug!(error = %e, "malformed packet; closing");
                        self.session
                            .detach(time::now(), DetachReason::ProtocolError(e.reason_code()));
                        self.run_effects(ctx).await;
                    }
                }
            }
            ClientMsg::InputEnd => {
                if self.conn.is_none() {
                    return;
                }
                self.session
                    .detach(time::now(), DetachReason::ConnectionLost);
                self.run_effects(ctx).await;
                // The session may have had nothing to close (already detached).
                Box::pin(self.drop_conn(ctx)).await;
            }
            ClientMsg::Deliver(shard, mut batch) => {
                let shard = usize::from(shard);
                let now = time::now();
                for (m, o) in &mut batch {
                    if let Some(r) = self.flow.as_mut().and_then(|f| f.reporter.as_mut()) {
                        r.taken(shard, 1);
                        if m.qos != QoS::AtMostOnce
                            && self.shared.config.mqtt.backpressure
                            && r.absorbs(shard, self.session.queue_len())
                        {
                            o.held_back = true;
                        }
                    }
                    self.deliver(now, m, o);
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
                    self.session.detach(
                        time::now(),
                        DetachReason::ProtocolError(ReasonCode::QuotaExceeded),
                    );
                    self.run_effects(ctx).await;
                }
            }
            ClientMsg::Timeout => {
                self.timer = None;
                self.session.handle_timeout(time::now());
                self.run_effects(ctx).await;
            }
            ClientMsg::Shutdown(reply) => {
                self.session
                    .detach(time::now(), DetachReason::ServerShutdown);
                self.run_effects(ctx).await;
                let _ = reply.send(());
                return;
            }
        }
        self.after_turn(ctx).await;
    }
}

impl Actor for Client {
    type Msg = ClientMsg;

    async fn started(&mut self, ctx: &mut Ctx<Self>) {
        if let Some(nc) = self.first.take() {
            let span = tracing::debug_span!("client", client_id = %self.session.client_id());
            async {
                Box::pin(self.attach(nc, ctx)).await;
                self.after_turn(ctx).await;
            }
            .instrument(span)
            .await;
        }
    }

    async fn handle(&mut self, msg: ClientMsg, ctx: &mut Ctx<Self>) {
        let span = tracing::debug_span!("client", client_id = %self.session.client_id());
        self.turn(msg, ctx).instrument(span).await;
    }

    /// Decoded packets of the attached connection, in batches: polled only between turns, so
    /// a busy client stops reading its socket (back-pressure to the peer), and its
    /// acknowledgements never queue behind routed messages in the mailbox.
    ///
    /// While the router holds this client's publishes back (see [`crate::flow`]), the
    /// acknowledgements of its own deliveries and PINGREQ still pass; a PUBLISH and whatever
    /// must stay behind it (PUBREL, SUBSCRIBE, DISCONNECT, ...) wait in `held`, in order,
    /// and past [`HELD_MAX`] of them nothing more is read.
    fn poll_input(&mut self, cx: &mut Context<'_>) -> Poll<ClientMsg> {
        let max = self.shared.limits.packet_size_max;
        let Some(c) = self.conn.as_mut() else {
            return Poll::Pending;
        };
        // Released by a message, which wakes the actor: no waker to keep here.
        let holding = self.flow.as_ref().is_some_and(|f| f.holds.is_held());
        loop {
            if c.input_ended {
                // The peer is gone or broke the protocol: what it sent before goes now.
                if let Some(held) = c.held.take() {
                    return Poll::Ready(ClientMsg::Input(*held, None));
                }
                if std::mem::take(&mut c.end_owed) {
                    return Poll::Ready(ClientMsg::InputEnd);
                }
                return Poll::Pending;
            }
            if !holding && c.held.is_some() && std::mem::take(&mut c.releasing) {
                // Yield between released chunks (woken at once, behind the tasks already
                // ready, the router among them), so that the router may hold the client
                // again before the rest: every publisher of a drained subscriber is let go
                // at the same moment.
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            // Released a chunk at a time: the router may hold the client back again before
            // the rest.
            let mut batch = match c.held.as_mut() {
                Some(held) if !holding && held.len() > HELD_RELEASE => {
                    held.drain(..HELD_RELEASE).collect()
                }
                Some(_) if !holding => *c.held.take().unwrap_or_default(),
                _ => Vec::new(),
            };
            if !holding && c.held.is_some() {
                c.releasing = true;
                // More held packets come before anything read after them.
                return Poll::Ready(ClientMsg::Input(batch, None));
            }
            let mut error = None;
            while batch.len() < INPUT_BATCH_MAX {
                if c.held.as_ref().is_some_and(|h| h.len() >= HELD_MAX) {
                    break;
                }
                match decode(&mut c.input, c.protocol, max) {
                    Ok(Some(p)) if holding && !passes_hold(&p) => {
                        c.held.get_or_insert_with(Box::default).push(p);
                    }
                    Ok(Some(p)) => batch.push(p),
                    Ok(None) => break,
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
            }
            if let Some(e) = error {
                // Nothing after a decode error is read: the connection is closing, and what
                // came before the bad packet is handled first, held or not.
                c.input_ended = true;
                if let Some(held) = c.held.take() {
                    batch.extend(*held);
                }
                return Poll::Ready(ClientMsg::Input(batch, Some(e)));
            }
            if !batch.is_empty() {
                return Poll::Ready(ClientMsg::Input(batch, None));
            }
            if c.held.as_ref().is_some_and(|h| h.len() >= HELD_MAX) {
                // Woken through the flow once released.
                return Poll::Pending;
            }
            match c.poll_fill(cx) {
                Poll::Pending => {
                    if c.input.is_empty() && c.input.capacity() > 0 {
                        c.input = BytesMut::new();
                    }
                    return Poll::Pending;
                }
                Poll::Ready(0) => {
                    c.input_ended = true;
                    c.end_owed = true;
                    c.eof = true;
                }
                Poll::Ready(n) => add(&self.shared.metrics.bytes_received, n as u64),
            }
        }
    }
}

/// Whether a subscriber with this username may hold its publishers back
/// (`mqtt.backpressure_holders`).
fn may_hold(m: &MqttConfig, username: Option<&str>) -> bool {
    match m.backpressure_holders {
        BackpressureHolders::All => true,
        BackpressureHolders::Authenticated => username.is_some(),
    }
}

/// Whether a packet may pass a held-back PUBLISH: it belongs to the other direction (our
/// deliveries' acknowledgements) or to no flow at all (PINGREQ). Letting these through is
/// what keeps two clients that publish to each other from holding each other forever.
fn passes_hold(p: &Packet) -> bool {
    matches!(
        p,
        Packet::Puback(_) | Packet::Pubrec(_) | Packet::Pubcomp(_) | Packet::Pingreq
    )
}

/// Escapes a string for a JSON string literal.
pub(crate) fn json_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out
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
        assert!(client <= 496, "Client is {client} bytes");
        assert!(session <= 224, "Session is {session} bytes");
    }
}
