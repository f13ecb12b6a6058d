//! The session state machine: inputs from the client and the broker in,
//! effects out.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use starling_codec::{
    Disconnect, LastWill, Packet, PacketId, Properties, Protocol, PubAck, QoS, ReasonCode,
    PACKET_SIZE_MAX,
};

use crate::{
    DropReason, Effect, Instant, Message, SessionError, SessionLimits, StoreChange,
    SubscribeRequest, Subscriptions,
};

mod inbound;
mod lifecycle;
mod operator;
mod outbound;
mod snapshot;
pub use snapshot::WallClock;

/// Authorization, asked by the session for each PUBLISH and SUBSCRIBE filter
/// (the broker's ACL for this client).
pub trait Gate {
    /// May the client publish to `topic`? A refusal answers PUBACK/PUBREC
    /// 0x87 in MQTT 5 and drops the message silently (but acknowledged) in 3.x.
    fn allow_publish(&mut self, topic: &str, qos: QoS, retain: bool) -> bool;
    /// May the client subscribe to `filter` (raw, extensions included) at
    /// `qos` (already capped at the broker's maximum)? A refusal answers
    /// SUBACK 0x87 (0x80 in 3.x).
    fn allow_subscribe(&mut self, filter: &str, qos: QoS) -> bool;
}

/// A [`Gate`] that allows everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct AllowAll;

impl Gate for AllowAll {
    fn allow_publish(&mut self, _: &str, _: QoS, _: bool) -> bool {
        true
    }
    fn allow_subscribe(&mut self, _: &str, _: QoS) -> bool {
        true
    }
}

/// Why the broker detaches a connection. A DISCONNECT from the client is not
/// one of them: it goes through [`Session::handle_packet`], which detaches.
/// Each of these leaves the will in place (MQTT 5 §3.1.2.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DetachReason {
    /// The network connection broke or the client closed it without DISCONNECT.
    ConnectionLost,
    /// The connection's decoder failed with this reason code (malformed
    /// packet 0x81, packet too large 0x95, ...).
    ProtocolError(ReasonCode),
    /// Another connection took the client identifier over (0x8E).
    TakenOver,
    /// The broker is shutting down (0x8B).
    ServerShutdown,
    /// An administrator closed the connection (0x98).
    Administrative,
    /// The node is leaving its cluster: the client is to reconnect to another node, where
    /// its session follows it (0x9C Use another server).
    Moved,
}

impl DetachReason {
    fn reason_code(self) -> Option<ReasonCode> {
        match self {
            DetachReason::ConnectionLost => None,
            DetachReason::ProtocolError(code) => Some(code),
            DetachReason::TakenOver => Some(ReasonCode::SessionTakenOver),
            DetachReason::ServerShutdown => Some(ReasonCode::ServerShuttingDown),
            DetachReason::Administrative => Some(ReasonCode::AdministrativeAction),
            DetachReason::Moved => Some(ReasonCode::UseAnotherServer),
        }
    }
}

/// What [`Session::attach`] negotiated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attached {
    /// Session Present of the CONNACK.
    pub session_present: bool,
    /// The keep alive in force, seconds, 0 = off.
    pub keep_alive_secs: u16,
}

/// One client's MQTT session, sans-IO.
///
/// # Driving it
/// ```text
/// let mut s = Session::new(client_id, limits);       // after check_connect
/// s.attach(now, &connect)?;                          // CONNACK (+ resends) queued
/// loop {
///     s.handle_packet(now, packet, &mut gate)?;      // each decoded packet
///     s.deliver(now, &msg, &options);                // each routed message
///     s.subscribed(now, id, results);                // router's answers
///     s.handle_timeout(now);                         // when poll_timeout() passes
///     while let Some(e) = s.poll_effect() { ... }    // after every call
///     let wake = s.poll_timeout();
/// }
/// s.detach(now, DetachReason::ConnectionLost);       // the socket went away
/// // later: attach again (resume), or handle_timeout ends it (SessionEnded)
/// ```
/// The session lives across connections: keep it while it is detached (its
/// queue fills, its will and expiry timers run) until it emits
/// [`Effect::SessionEnded`].
#[derive(Debug)]
pub struct Session {
    client_id: Arc<str>,
    /// Shared by every session of a broker: one pointer each, not a copy.
    limits: Arc<SessionLimits>,
    phase: Phase,
    /// Session Expiry Interval in force, seconds; `u32::MAX`: never.
    expiry_secs: u32,
    /// The will of the last connection, until published or discarded.
    /// Boxed: most sessions have none, and a will is ~0.4 KB.
    will: Option<Box<Will>>,
    /// Outbound QoS 1/2 messages awaiting acknowledgement.
    inflight: BTreeMap<PacketId, Inflight>,
    /// Outbound messages waiting for the window or for a connection.
    queue: VecDeque<Pending>,
    /// QoS 0 messages in `queue`: a full queue looks for one to evict only if there is one
    /// (a scan of a full queue per arriving message was the largest cost of an overload).
    queued_qos0: u32,
    next_packet_id: u16,
    next_seq: u64,
    /// State most sessions never or only briefly have; `None` while all of it is empty, so
    /// an idle session does not carry its empty collections.
    rare: Option<Box<Rare>>,
    /// Filters granted by the router, with their options.
    subscriptions: Subscriptions,
    effects: VecDeque<Effect>,
    /// Reused buffer for PUBLISH headers.
    scratch: BytesMut,
    /// The last CONNECT asked to resume a session (Clean Start 0) and was answered that
    /// there was none, and no packet from the client has come since: the client may never
    /// have seen that CONNACK (its connection lost with it, a client that gave up waiting
    /// for it). Its next CONNECT is answered Session Present 0 again, and a handover
    /// carries no state: the session holds nothing the client gave it (no subscription, so
    /// no message either), and Session Present 1 would tell the client that the
    /// subscriptions it made before are still there.
    unheard: bool,
}

#[derive(Debug)]
enum Phase {
    /// Never attached: no state.
    New,
    Attached(Box<Conn>),
    /// State kept for a later connection; `expires_at: None` never expires.
    Detached {
        expires_at: Option<Instant>,
    },
    /// The state ended; attaching starts afresh.
    Ended,
}

/// What belongs to one network connection.
#[derive(Debug)]
struct Conn {
    protocol: Protocol,
    keep_alive: Option<Duration>,
    last_rx: Instant,
    /// `min(client's Receive Maximum, inflight_max)`, at least 1.
    window: usize,
    /// The client's Maximum Packet Size.
    packet_size_max: u32,
    /// The client's Topic Alias Maximum (outbound aliases).
    alias_out_max: u16,
    /// Topic aliases are per connection (MQTT 5 §3.3.2.3.4).
    aliases_out: BTreeMap<Arc<str>, u16>,
    aliases_in: BTreeMap<u16, Arc<str>>,
}

#[derive(Debug, Clone)]
struct Will {
    will: LastWill,
    delay: Duration,
}

/// A message on its way to this client, with the per-subscription choices made.
#[derive(Debug, Clone)]
struct Pending {
    msg: Arc<Message>,
    qos: QoS,
    retain: bool,
    sub_ids: Vec<u32>,
    /// Its store key, when the broker stored it (see [`DeliveryOptions::stored`]).
    stored: Option<u64>,
    /// Sent because of a SUBSCRIBE, not routed from a publish (in the padding after
    /// `retain`: no larger).
    from_retained: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// QoS 1 PUBLISH sent.
    Qos1,
    /// QoS 2 PUBLISH sent.
    Qos2Published,
    /// QoS 2 PUBREL sent.
    Qos2Released,
}

impl Stage {
    fn phase(self) -> crate::state::InflightPhase {
        use crate::state::InflightPhase::*;
        match self {
            Stage::Qos1 => AwaitingPuback,
            Stage::Qos2Published => AwaitingPubrec,
            Stage::Qos2Released => AwaitingPubcomp,
        }
    }
}

#[derive(Debug)]
struct Inflight {
    /// Send order, for resending in the original order (MQTT 5 §4.6).
    seq: u64,
    out: Pending,
    stage: Stage,
    sent_at: Instant,
}

#[derive(Debug, Default)]
struct Rare {
    /// When the pending will is due (detached, will delay running).
    will_at: Option<Instant>,
    /// Inbound QoS 2 packet identifiers routed and awaiting PUBREL.
    inbound_qos2: BTreeSet<PacketId>,
    pending_subscribes: BTreeMap<PacketId, PendingSubscribe>,
    pending_unsubscribes: BTreeMap<PacketId, Vec<String>>,
}

impl Rare {
    fn is_empty(&self) -> bool {
        self.will_at.is_none()
            && self.inbound_qos2.is_empty()
            && self.pending_subscribes.is_empty()
            && self.pending_unsubscribes.is_empty()
    }
}

static NO_RARE: Rare = Rare {
    will_at: None,
    inbound_qos2: BTreeSet::new(),
    pending_subscribes: BTreeMap::new(),
    pending_unsubscribes: BTreeMap::new(),
};

#[derive(Debug)]
struct PendingSubscribe {
    /// One per filter: `Some` decided by the session, `None` forwarded.
    codes: Vec<Option<ReasonCode>>,
    forwarded: Vec<SubscribeRequest>,
}

impl Session {
    /// A session without state for `client_id` (given, or assigned by the
    /// broker after [`check_connect`](crate::check_connect)). Attach a
    /// connection next.
    pub fn new(client_id: Arc<str>, limits: impl Into<Arc<SessionLimits>>) -> Self {
        Self {
            client_id,
            limits: limits.into(),
            phase: Phase::New,
            expiry_secs: 0,
            will: None,
            inflight: BTreeMap::new(),
            queue: VecDeque::new(),
            queued_qos0: 0,
            next_packet_id: 1,
            next_seq: 0,
            rare: None,
            subscriptions: Subscriptions::new(),
            effects: VecDeque::new(),
            scratch: BytesMut::new(),
            unheard: false,
        }
    }

    fn rare(&self) -> &Rare {
        self.rare.as_deref().unwrap_or(&NO_RARE)
    }

    fn rare_mut(&mut self) -> &mut Rare {
        self.rare.get_or_insert_with(Box::default)
    }

    fn set_will_at(&mut self, at: Option<Instant>) {
        if at.is_some() || self.rare.is_some() {
            self.rare_mut().will_at = at;
        }
    }

    /// The client identifier.
    pub fn client_id(&self) -> &Arc<str> {
        &self.client_id
    }

    /// The protocol of the attached connection, `None` when detached.
    pub fn protocol(&self) -> Option<Protocol> {
        self.conn().map(|c| c.protocol)
    }

    /// The client's Maximum Packet Size, to encode [`Effect::Send`] packets
    /// with. A CONNACK that does not fit fails [`Session::attach`], and an
    /// [`Effect::Close`] never asks for a DISCONNECT that does not fit; any
    /// other packet that does not fit is not sent (MQTT 5 §3.1.2.11.4).
    pub fn client_packet_size_max(&self) -> u32 {
        self.conn().map_or(PACKET_SIZE_MAX, |c| c.packet_size_max)
    }

    /// True while a connection is attached.
    pub fn is_attached(&self) -> bool {
        self.conn().is_some()
    }

    /// True once the session's state ended (or before it ever began); the
    /// broker may drop it unless it attaches again.
    pub fn is_ended(&self) -> bool {
        matches!(self.phase, Phase::New | Phase::Ended)
    }

    /// Outbound QoS 1/2 messages awaiting acknowledgement.
    pub fn inflight_len(&self) -> usize {
        self.inflight.len()
    }

    /// Inbound QoS 2 messages routed and awaiting the client's PUBREL.
    pub fn inbound_qos2_len(&self) -> usize {
        self.rare.as_ref().map_or(0, |r| r.inbound_qos2.len())
    }

    /// The message in flight to the client under `packet_id`, with the QoS it was sent
    /// with: what a PUBACK or PUBCOMP for it acknowledges (a query; nothing changes).
    pub fn inflight_message(&self, packet_id: PacketId) -> Option<(&Arc<Message>, QoS)> {
        self.inflight
            .get(&packet_id)
            .map(|f| (&f.out.msg, f.out.qos))
    }

    /// The topic a PUBLISH from the client is for, a topic alias resolved as
    /// [`Session::handle_packet`] would resolve it now (MQTT 5 §3.3.2.3.4); `None` when
    /// it names an alias this connection has not set (the session will refuse it) or no
    /// connection is attached. Lets the broker decide on the topic before it hands the
    /// packet over.
    pub fn publish_topic<'a>(&'a self, p: &'a starling_codec::Publish) -> Option<&'a str> {
        let Phase::Attached(conn) = &self.phase else {
            return None;
        };
        match p.properties.topic_alias.filter(|_| conn.protocol.is_v5()) {
            Some(alias) if p.topic.is_empty() => conn.aliases_in.get(&alias).map(|t| &**t),
            _ => Some(&p.topic),
        }
    }

    /// Messages queued for the window or for the client's return.
    pub fn queue_len(&self) -> usize {
        self.queue.len()
    }

    /// True when the queue is full and any message arriving now would be refused (dropped
    /// as [`DropReason::QueueFull`]) whatever its QoS: a router may then drop it before
    /// handing it over, instead of making the session's owner do it, message by message.
    pub fn refuses_new(&self) -> bool {
        use crate::QueueFullPolicy::*;
        self.queue.len() >= self.limits.mqueue_len_max
            && match self.limits.mqueue_policy {
                DropNew => true,
                DropOldestQos0 => self.queued_qos0 == 0,
                DropOldest => false,
            }
    }

    /// Whether the queue, with `incoming` messages on their way to it, is backed up enough
    /// that publishers feeding this session should be held back, with hysteresis (see
    /// [`SessionLimits::backlog_high`] and [`SessionLimits::backlog_low`]); `was` is the
    /// previous answer. Always false while detached: an offline session's queue fills and
    /// drops by its policy, nobody waits on it.
    pub fn backlogged(&self, was: bool, incoming: usize) -> bool {
        if !self.is_attached() {
            return false;
        }
        let len = self.queue.len() + incoming;
        if was {
            len > self.limits.backlog_low()
        } else {
            len >= self.limits.backlog_high()
        }
    }

    /// The outbound window of the attached connection (0 when detached).
    pub fn window(&self) -> usize {
        self.conn().map_or(0, |c| c.window)
    }

    /// The subscriptions the router granted: filter → (options, subscription id).
    /// The keep alive in force, seconds: 0 when off or detached.
    pub fn keep_alive_secs(&self) -> u16 {
        match &self.phase {
            Phase::Attached(c) => c
                .keep_alive
                .map_or(0, |ka| u16::try_from(ka.as_secs()).unwrap_or(u16::MAX)),
            _ => 0,
        }
    }

    /// The Session Expiry Interval in force, seconds; `u32::MAX`: never.
    pub fn expiry_secs(&self) -> u32 {
        self.expiry_secs
    }

    /// The limits this session runs under.
    pub fn limits(&self) -> &SessionLimits {
        &self.limits
    }

    pub fn subscriptions(&self) -> &Subscriptions {
        &self.subscriptions
    }

    /// The next effect for the broker, in order. Drain after every call.
    pub fn poll_effect(&mut self) -> Option<Effect> {
        self.effects.pop_front()
    }

    /// Frees the storage of the drained effect queue and of the PUBLISH header scratch. For
    /// the end of a burst: an idle session then holds no buffers (the effect queue alone
    /// keeps ~0.9 KB once a CONNACK went through it), at the price of one allocation in the
    /// next burst.
    pub fn release_buffers(&mut self) {
        if self.effects.is_empty() && self.effects.capacity() > 0 {
            self.effects = VecDeque::new();
        }
        if self.scratch.is_empty() && self.scratch.capacity() > 0 {
            self.scratch = BytesMut::new();
        }
        if self.rare.as_ref().is_some_and(|r| r.is_empty()) {
            self.rare = None;
        }
    }

    /// When [`Session::handle_timeout`] must next be called: keep alive
    /// (1.5 × keep alive after the last packet), the 3.x retry of an
    /// unacknowledged message, the will delay, the session expiry.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Attached(conn) => {
                let keep_alive = conn.keep_alive.map(|ka| conn.last_rx + ka * 3 / 2);
                let retry = self
                    .retry_interval(conn)
                    .and_then(|r| self.inflight.values().map(|f| f.sent_at + r).min());
                earliest(keep_alive, retry)
            }
            Phase::Detached { expires_at } => earliest(self.rare().will_at, *expires_at),
            Phase::New | Phase::Ended => None,
        }
    }

    // ----- helpers -----

    fn conn(&self) -> Option<&Conn> {
        match &self.phase {
            Phase::Attached(c) => Some(c),
            _ => None,
        }
    }

    /// Resending while connected: 3.x only; MQTT 5 §4.4 forbids it.
    fn retry_interval(&self, conn: &Conn) -> Option<Duration> {
        if conn.protocol.is_v5() {
            None
        } else {
            self.limits.retry_interval
        }
    }

    fn not_found(&self) -> ReasonCode {
        if self.protocol().is_some_and(Protocol::is_v5) {
            ReasonCode::PacketIdentifierNotFound
        } else {
            ReasonCode::Success
        }
    }

    fn dropped(&mut self, reason: DropReason, qos: QoS) {
        self.effects.push_back(Effect::Dropped { reason, qos });
    }

    /// A stored delivery is done with: its record goes.
    fn retire(&mut self, stored: Option<u64>) {
        if let Some(seq) = stored {
            self.effects
                .push_back(Effect::Store(StoreChange::Retire { seq }));
        }
    }

    /// A stored delivery's flow moved on: its record follows, before what is sent next
    /// when [`StoreChange::must_precede`] says so.
    fn stage(&mut self, stored: Option<u64>, packet_id: PacketId, stage: Stage) {
        if let Some(seq) = stored {
            self.effects.push_back(Effect::Store(StoreChange::Stage {
                seq,
                packet_id,
                phase: stage.phase(),
            }));
        }
    }

    /// Whether the client was last told, on a CONNECT that asked to resume, that there was
    /// no session, and has sent nothing since: such a session holds nothing the client
    /// gave it, and its next CONNECT is told again that there is none (Session Present 0),
    /// rather than that the subscriptions it made before a session was lost are there.
    /// Part of [`Session::snapshot`] (`DetachedState::unheard`), so a handed-over or
    /// restored copy keeps it; the broker's store does not keep it (docs/persistence.md).
    pub fn is_unheard(&self) -> bool {
        self.unheard
            && self.subscriptions.is_empty()
            && self.inflight.is_empty()
            && self.queue.is_empty()
            // Not the will's delay: the next connection deletes the will anyway.
            && self.rare().inbound_qos2.is_empty()
            && self.rare().pending_subscribes.is_empty()
            && self.rare().pending_unsubscribes.is_empty()
    }

    /// Whether the session outlives its connection (a Session Expiry Interval above 0; MQTT
    /// 3.x: clean session 0): what the broker stores.
    pub fn outlives_connection(&self) -> bool {
        !self.is_ended() && self.expiry_secs > 0
    }

    fn check_invariants(&self) {
        // The window can shrink on reconnect (a smaller Receive Maximum)
        // while earlier messages stay in flight, so the hard bound is our cap.
        assert!(self.inflight.len() <= usize::from(self.limits.inflight_max.max(1)));
        assert!(self.queue.len() <= self.limits.mqueue_len_hard());
        debug_assert_eq!(
            self.queued_qos0 as usize,
            self.queue
                .iter()
                .filter(|q| q.qos == QoS::AtMostOnce)
                .count()
        );
        assert!(self.rare().inbound_qos2.len() <= usize::from(self.limits.receive_max.max(1)));
        // Nothing waits in the queue while the window has room: the queue
        // drains whenever a slot frees.
        if let (Some(conn), Some(front)) = (self.conn(), self.queue.front()) {
            assert!(front.qos != QoS::AtMostOnce && self.inflight.len() >= conn.window);
        }
    }
}

/// Whether a DISCONNECT with `code` fits a client's Maximum Packet Size.
pub(crate) fn disconnect_fits(code: ReasonCode, max: u32, scratch: &mut BytesMut) -> bool {
    let d = Packet::Disconnect(Disconnect {
        reason_code: code,
        properties: Properties::default(),
    });
    let start = scratch.len();
    let fits = starling_codec::encode(&d, Protocol::V5, max, scratch).is_ok();
    scratch.truncate(start);
    fits
}

fn unexpected_ack(packet_type: starling_codec::PacketType, packet_id: PacketId) -> SessionError {
    SessionError::UnexpectedAck {
        packet_type,
        packet_id: packet_id.get(),
    }
}

fn ack(packet_id: PacketId, reason_code: ReasonCode) -> PubAck {
    PubAck {
        packet_id,
        reason_code,
        properties: Properties::default(),
    }
}

fn granted(qos: QoS) -> ReasonCode {
    match qos {
        QoS::AtMostOnce => ReasonCode::GRANTED_QOS_0,
        QoS::AtLeastOnce => ReasonCode::GrantedQoS1,
        QoS::ExactlyOnce => ReasonCode::GrantedQoS2,
    }
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
