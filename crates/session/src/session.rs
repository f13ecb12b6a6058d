//! The session state machine: inputs from the client and the broker in,
//! effects out.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::mem;
use std::num::NonZeroU16;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use starling_codec::{
    encode_publish_header, Connack, Connect, Disconnect, Error as CodecError, LastWill, Packet,
    PacketId, PayloadFormat, Properties, Protocol, PubAck, Publish, PublishHeader, QoS, ReasonCode,
    Suback, Subscribe, SubscriptionOptions, Unsuback, Unsubscribe, PACKET_SIZE_MAX,
};
use tracing::debug;

use crate::{
    DeliveryOptions, DropReason, Effect, Instant, Message, OutgoingPublish, SessionError,
    SessionLimits, SubscribeRequest,
};

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
}

impl DetachReason {
    fn reason_code(self) -> Option<ReasonCode> {
        match self {
            DetachReason::ConnectionLost => None,
            DetachReason::ProtocolError(code) => Some(code),
            DetachReason::TakenOver => Some(ReasonCode::SessionTakenOver),
            DetachReason::ServerShutdown => Some(ReasonCode::ServerShuttingDown),
            DetachReason::Administrative => Some(ReasonCode::AdministrativeAction),
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
    subscriptions: BTreeMap<String, (SubscriptionOptions, Option<u32>)>,
    effects: VecDeque<Effect>,
    /// Reused buffer for PUBLISH headers.
    scratch: BytesMut,
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
            subscriptions: BTreeMap::new(),
            effects: VecDeque::new(),
            scratch: BytesMut::new(),
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
    pub fn subscriptions(&self) -> &BTreeMap<String, (SubscriptionOptions, Option<u32>)> {
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

    /// A connection whose CONNECT passed [`check_connect`](crate::check_connect)
    /// attaches: a new session, a resumed one, or (Clean Start) a fresh
    /// start that ends the old state first ([`Effect::SessionEnded`]).
    ///
    /// Queues, in order: the CONNACK ([`Effect::Send`]), then on resume the
    /// resends of every unacknowledged PUBLISH with DUP set and every PUBREL
    /// (MQTT 5 §4.4), then queued messages as the window allows. A pending
    /// will of the previous connection is cancelled (MQTT 5 §3.1.2.5).
    ///
    /// Negotiates: window `min(client Receive Maximum, inflight_max)`; the
    /// client's Maximum Packet Size and Topic Alias Maximum; keep alive
    /// (capped for MQTT 5 with Server Keep Alive; 3.x clients cannot be told,
    /// so their own value stands, except 0 when not allowed); session expiry
    /// (capped; 3.x Clean Session 0 gets `session_expiry_secs_max`).
    ///
    /// # Errors
    /// [`SessionError::AlreadyAttached`]: detach the old connection first.
    /// [`SessionError::ConnackTooLarge`]: the CONNACK does not fit the
    /// client's Maximum Packet Size; the session is unchanged (a pending
    /// will keeps waiting) and nothing is queued: close the connection
    /// without sending anything.
    pub fn attach(&mut self, now: Instant, connect: &Connect) -> Result<Attached, SessionError> {
        if self.is_attached() {
            return Err(SessionError::AlreadyAttached);
        }
        let v5 = connect.protocol.is_v5();
        let props = &connect.properties;
        let had_state = matches!(self.phase, Phase::Detached { .. });
        let session_present = had_state && !connect.clean_start;

        let limits = &self.limits;
        let asked_ka = connect.keep_alive;
        let keep_alive_secs = if asked_ka == 0 {
            if limits.keepalive_zero_allowed {
                0
            } else {
                limits.keepalive_secs_max
            }
        } else if v5 {
            // The minimum is applied first so that a misconfigured min > max still
            // respects the maximum (config validation refuses that anyway).
            asked_ka
                .max(limits.keepalive_secs_min)
                .min(limits.keepalive_secs_max)
        } else {
            asked_ka
        };
        let asked_expiry = if v5 {
            props.session_expiry_interval.unwrap_or(0)
        } else if connect.clean_start {
            0
        } else {
            u32::MAX
        };
        let expiry_secs = asked_expiry.min(limits.session_expiry_secs_max);
        let client_receive_max = if v5 {
            props.receive_maximum.unwrap_or(u16::MAX)
        } else {
            u16::MAX
        };
        let window = usize::from(client_receive_max.min(limits.inflight_max).max(1));
        let conn = Conn {
            protocol: connect.protocol,
            keep_alive: (keep_alive_secs > 0)
                .then(|| Duration::from_secs(u64::from(keep_alive_secs))),
            last_rx: now,
            window,
            packet_size_max: if v5 {
                props.maximum_packet_size.unwrap_or(PACKET_SIZE_MAX)
            } else {
                PACKET_SIZE_MAX
            },
            alias_out_max: if v5 {
                props.topic_alias_maximum.unwrap_or(0)
            } else {
                0
            },
            aliases_out: BTreeMap::new(),
            aliases_in: BTreeMap::new(),
        };

        let mut p = Properties::default();
        if v5 {
            if expiry_secs != asked_expiry {
                p.session_expiry_interval = Some(expiry_secs);
            }
            if limits.receive_max != u16::MAX {
                p.receive_maximum = Some(limits.receive_max.max(1));
            }
            if limits.qos_max != QoS::ExactlyOnce {
                p.maximum_qos = Some(limits.qos_max);
            }
            if !limits.retain_available {
                p.retain_available = Some(false);
            }
            if limits.packet_size_max < PACKET_SIZE_MAX {
                p.maximum_packet_size = Some(limits.packet_size_max);
            }
            if connect.client_id.is_empty() {
                p.assigned_client_identifier = Some(self.client_id.to_string());
            }
            if limits.topic_alias_max > 0 {
                p.topic_alias_maximum = Some(limits.topic_alias_max);
            }
            if !limits.wildcard_available {
                p.wildcard_subscription_available = Some(false);
            }
            if !limits.subscription_ids_available {
                p.subscription_identifier_available = Some(false);
            }
            if !limits.shared_available {
                p.shared_subscription_available = Some(false);
            }
            if keep_alive_secs != asked_ka {
                p.server_keep_alive = Some(keep_alive_secs);
            }
            if props.request_response_information == Some(true) {
                p.response_information = limits.response_information.clone();
            }
        }
        let connack = Packet::Connack(Connack {
            session_present,
            reason_code: ReasonCode::Success,
            properties: p,
        });
        // MQTT 5 §3.1.2.11.4: a packet past the client's maximum is not sent.
        // Without its CONNACK the client cannot go on, and nothing else may
        // come first ([MQTT-3.2.0-1]), not even a DISCONNECT ([MQTT-3.14.0-1]):
        // the connection is closed before anything changes. Measured only when
        // the client announced a maximum, so that ordinary connects encode the
        // CONNACK once.
        if v5 && props.maximum_packet_size.is_some() {
            self.scratch.clear();
            if let Err(CodecError::PacketTooLarge { size, max }) = starling_codec::encode(
                &connack,
                conn.protocol,
                conn.packet_size_max,
                &mut self.scratch,
            ) {
                debug!(client_id = %self.client_id, size, max, "CONNACK too large for the client");
                return Err(SessionError::ConnackTooLarge { size, max });
            }
            self.scratch.clear();
        }
        // A new connection for the client identifier deletes a will still
        // waiting for its delay (MQTT 5 §3.1.2.5); so a clean start does not
        // publish it either.
        self.will = None;
        self.set_will_at(None);
        if had_state && connect.clean_start {
            self.end_state(now);
        }
        self.expiry_secs = expiry_secs;
        self.will = connect.will.clone().map(|will| {
            Box::new(Will {
                delay: Duration::from_secs(u64::from(
                    will.properties.will_delay_interval.unwrap_or(0),
                )),
                will,
            })
        });
        self.phase = Phase::Attached(Box::new(conn));
        debug!(
            client_id = %self.client_id,
            session_present,
            keep_alive_secs,
            window,
            expiry_secs = self.expiry_secs,
            "session attached"
        );
        self.effects.push_back(Effect::Send(connack));
        if session_present {
            let mut order: Vec<(u64, PacketId)> =
                self.inflight.iter().map(|(id, f)| (f.seq, *id)).collect();
            order.sort_unstable();
            for (_, id) in order {
                self.resend(now, id);
            }
        }
        self.pump(now);
        self.check_invariants();
        Ok(Attached {
            session_present,
            keep_alive_secs,
        })
    }

    /// A packet from the attached client (anything after its CONNECT).
    ///
    /// Queues acknowledgements ([`Effect::Send`]), accepted messages
    /// ([`Effect::Publish`]), router requests ([`Effect::Subscribe`],
    /// [`Effect::Unsubscribe`]); a DISCONNECT detaches (will discarded for
    /// reason 0x00) and queues [`Effect::Close`]`(None)`.
    ///
    /// # Errors
    /// A protocol violation: the session has then detached as for a broken
    /// connection (will kept) and queued [`Effect::Close`] with the error's
    /// [`SessionError::reason_code`] (MQTT 5). [`SessionError::NotAttached`]
    /// if no connection is attached (nothing queued).
    pub fn handle_packet(
        &mut self,
        now: Instant,
        packet: Packet,
        gate: &mut dyn Gate,
    ) -> Result<(), SessionError> {
        let Phase::Attached(conn) = &mut self.phase else {
            return Err(SessionError::NotAttached);
        };
        // Keep alive counts any control packet (MQTT 5 §3.1.2.10).
        conn.last_rx = now;
        let result = match packet {
            Packet::Connect(_) => Err(SessionError::SecondConnect),
            Packet::Publish(p) => self.on_publish(now, p, gate),
            Packet::Puback(a) => self.on_puback(now, &a),
            Packet::Pubrec(a) => self.on_pubrec(now, &a),
            Packet::Pubrel(a) => {
                self.on_pubrel(&a);
                Ok(())
            }
            Packet::Pubcomp(a) => self.on_pubcomp(now, &a),
            Packet::Subscribe(s) => self.on_subscribe(s, gate),
            Packet::Unsubscribe(u) => {
                self.on_unsubscribe(u);
                Ok(())
            }
            Packet::Pingreq => {
                self.effects.push_back(Effect::Send(Packet::Pingresp));
                Ok(())
            }
            Packet::Disconnect(d) => self.on_disconnect(now, &d),
            other @ (Packet::Connack(_)
            | Packet::Suback(_)
            | Packet::Unsuback(_)
            | Packet::Pingresp
            | Packet::Auth(_)) => Err(SessionError::UnexpectedPacket {
                packet_type: other.packet_type(),
            }),
        };
        if let Err(e) = &result {
            debug!(client_id = %self.client_id, error = %e, "protocol error by client");
            self.detach_with(now, Some(e.reason_code()), true);
        }
        self.check_invariants();
        result
    }

    /// The router's answer to [`Effect::Subscribe`] `packet_id`: per
    /// forwarded filter, in order, the granted QoS or a SUBACK failure code
    /// (exclusive held, limit reached, quota exceeded...). Queues the SUBACK
    /// if attached. Unknown `packet_id`s are ignored.
    pub fn subscribed(
        &mut self,
        _now: Instant,
        packet_id: PacketId,
        results: Vec<Result<QoS, ReasonCode>>,
    ) {
        let Some(pending) = self
            .rare
            .as_mut()
            .and_then(|r| r.pending_subscribes.remove(&packet_id))
        else {
            debug!(client_id = %self.client_id, packet_id, "subscribed: unknown packet id");
            return;
        };
        let mut results = results.into_iter();
        let mut forwarded = pending.forwarded.into_iter();
        let mut reason_codes = Vec::with_capacity(pending.codes.len());
        for code in pending.codes {
            let code = match code {
                Some(code) => code,
                None => {
                    // One forwarded request per undecided filter, by construction.
                    let Some(req) = forwarded.next() else {
                        reason_codes.push(ReasonCode::UnspecifiedError);
                        continue;
                    };
                    match results.next() {
                        Some(Ok(qos)) => {
                            let qos = qos.min(req.options.qos);
                            let mut options = req.options;
                            options.qos = qos;
                            self.subscriptions
                                .insert(req.filter, (options, req.subscription_id));
                            granted(qos)
                        }
                        Some(Err(code)) => code,
                        None => ReasonCode::UnspecifiedError,
                    }
                }
            };
            reason_codes.push(code);
        }
        if self.is_attached() {
            self.effects.push_back(Effect::Send(Packet::Suback(Suback {
                packet_id,
                reason_codes,
                properties: Properties::default(),
            })));
        }
    }

    /// The router's answer to [`Effect::Unsubscribe`] `packet_id`: one
    /// reason code per filter (`Success`, `NoSubscriptionExisted`, or a
    /// failure). Queues the UNSUBACK if attached.
    pub fn unsubscribed(&mut self, _now: Instant, packet_id: PacketId, results: Vec<ReasonCode>) {
        let Some(filters) = self
            .rare
            .as_mut()
            .and_then(|r| r.pending_unsubscribes.remove(&packet_id))
        else {
            debug!(client_id = %self.client_id, packet_id, "unsubscribed: unknown packet id");
            return;
        };
        let mut reason_codes = results;
        reason_codes.resize(filters.len(), ReasonCode::UnspecifiedError);
        for (filter, code) in filters.iter().zip(&reason_codes) {
            if !code.is_error() {
                self.subscriptions.remove(filter);
            }
        }
        if self.is_attached() {
            self.effects
                .push_back(Effect::Send(Packet::Unsuback(Unsuback {
                    packet_id,
                    reason_codes,
                    properties: Properties::default(),
                })));
        }
    }

    /// A message routed to this client through a subscription with
    /// `options` (or a retained message found by a SUBSCRIBE).
    ///
    /// Skips the client's own messages under No Local; sends at
    /// `min(message QoS, subscription QoS)`; RETAIN as published only with
    /// Retain As Published or for retained-on-subscribe; drops expired
    /// messages. Sends now if attached and the window allows
    /// ([`Effect::SendPublish`]), else queues it (bounded, drop policy);
    /// while detached, QoS 0 is queued only if `queue_qos0_offline`. Every
    /// drop is an [`Effect::Dropped`].
    pub fn deliver(&mut self, now: Instant, msg: &Arc<Message>, options: &DeliveryOptions) {
        let qos = msg.qos.min(options.qos);
        if self.is_ended() {
            self.dropped(DropReason::SessionEnded, qos);
            return;
        }
        // MQTT 5 §3.8.3.1: No Local.
        if options.no_local && msg.publisher.as_deref() == Some(&*self.client_id) {
            return;
        }
        // MQTT 5 §3.3.2.3.3: an expired message is not delivered.
        if msg.is_expired(now) {
            self.dropped(DropReason::Expired, qos);
            return;
        }
        // MQTT 5 §3.3.1.3: RETAIN is kept for retained messages sent on
        // subscribe, and on normal delivery only with Retain As Published.
        let retain = options.from_retained || (options.retain_as_published && msg.retain);
        let pending = Pending {
            msg: Arc::clone(msg),
            qos,
            retain,
            sub_ids: options.subscription_ids.clone(),
        };
        match &self.phase {
            Phase::Attached(conn) => {
                let window = conn.window;
                if self.queue.is_empty() {
                    if qos == QoS::AtMostOnce {
                        self.send_qos0(now, pending);
                        return;
                    }
                    if self.inflight.len() < window {
                        self.start_inflight(now, pending);
                        self.check_invariants();
                        return;
                    }
                }
                self.enqueue(pending, options.held_back);
                // An eviction may have put QoS 0 at the front, which needs no slot.
                self.pump(now);
            }
            _ => {
                if qos == QoS::AtMostOnce && !self.limits.queue_qos0_offline {
                    self.dropped(DropReason::Offline, qos);
                    return;
                }
                self.enqueue(pending, options.held_back);
            }
        }
        self.check_invariants();
    }

    /// The connection went away without the client's DISCONNECT (a
    /// DISCONNECT goes through [`Session::handle_packet`] instead). Queues
    /// [`Effect::Close`] (with a reason code for MQTT 5, where one applies),
    /// starts the will delay (or publishes the will, [`Effect::Will`], if it
    /// is 0) and the session expiry; with session expiry 0 the session ends
    /// now ([`Effect::SessionEnded`]). No-op when not attached.
    pub fn detach(&mut self, now: Instant, reason: DetachReason) {
        self.detach_with(now, reason.reason_code(), true);
        self.check_invariants();
    }

    /// Ends the session now, whatever its state (administrative discard):
    /// detaches with 0x98 if attached, publishes a pending will, queues
    /// [`Effect::SessionEnded`].
    pub fn end(&mut self, now: Instant) {
        self.detach_with(now, DetachReason::Administrative.reason_code(), true);
        if matches!(self.phase, Phase::Detached { .. }) {
            self.end_state(now);
            self.phase = Phase::Ended;
        }
    }

    /// Timers: keep alive (detach with 0x8D after 1.5 × keep alive without a
    /// packet, MQTT 5 §3.1.2.10), 3.x retry of unacknowledged messages, will
    /// delay, session expiry. Call when [`Session::poll_timeout`] has passed;
    /// calling early is harmless.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Phase::Attached(conn) = &self.phase {
            let keep_alive_due = conn
                .keep_alive
                .is_some_and(|ka| now >= conn.last_rx + ka * 3 / 2);
            if keep_alive_due {
                debug!(client_id = %self.client_id, "keep alive timeout");
                self.detach_with(now, Some(ReasonCode::KeepAliveTimeout), true);
            } else if let Some(retry) = self.retry_interval(conn) {
                let mut due: Vec<(u64, PacketId)> = self
                    .inflight
                    .iter()
                    .filter(|(_, f)| f.sent_at + retry <= now)
                    .map(|(id, f)| (f.seq, *id))
                    .collect();
                due.sort_unstable();
                for (_, id) in due {
                    self.resend(now, id);
                }
                self.pump(now);
            }
        }
        if let Phase::Detached { expires_at } = self.phase {
            if self.rare().will_at.is_some_and(|at| at <= now) {
                self.publish_will(now);
            }
            if expires_at.is_some_and(|at| at <= now) {
                debug!(client_id = %self.client_id, "session expired");
                self.end_state(now);
                self.phase = Phase::Ended;
            }
        }
        self.check_invariants();
    }

    // ----- inbound -----

    fn on_publish(
        &mut self,
        now: Instant,
        p: Publish,
        gate: &mut dyn Gate,
    ) -> Result<(), SessionError> {
        let Phase::Attached(conn) = &mut self.phase else {
            return Err(SessionError::NotAttached);
        };
        let v5 = conn.protocol.is_v5();
        let limits = &self.limits;
        // MQTT 5 §3.3.4: a client's PUBLISH carries no Subscription Identifier.
        if v5 && !p.properties.subscription_identifiers.is_empty() {
            return Err(SessionError::SubscriptionIdInPublish);
        }
        // MQTT 3.x clients cannot learn our maximum QoS or retain support,
        // so they are served as asked (retain dropped) rather than cut off.
        if v5 && p.qos > limits.qos_max {
            return Err(SessionError::QosNotSupported {
                qos: p.qos,
                max: limits.qos_max,
            });
        }
        if v5 && p.retain && !limits.retain_available {
            return Err(SessionError::RetainNotSupported);
        }
        let retain = p.retain && limits.retain_available;
        // MQTT 5 §3.3.2.3.4: topic aliases, per connection.
        let topic: Arc<str> = match p.properties.topic_alias.filter(|_| v5) {
            Some(alias) => {
                if alias == 0 || alias > limits.topic_alias_max {
                    return Err(SessionError::TopicAliasInvalid {
                        alias,
                        max: limits.topic_alias_max,
                    });
                }
                if p.topic.is_empty() {
                    match conn.aliases_in.get(&alias) {
                        Some(t) => Arc::clone(t),
                        None => return Err(SessionError::TopicAliasUnknown { alias }),
                    }
                } else {
                    let t: Arc<str> = Arc::from(p.topic.as_str());
                    conn.aliases_in.insert(alias, Arc::clone(&t));
                    t
                }
            }
            None if p.topic.is_empty() => return Err(SessionError::TopicAliasUnknown { alias: 0 }),
            None => Arc::from(p.topic.as_str()),
        };
        // The broker's topic caps hold for every PUBLISH, not only for filters and the
        // retained store. A DISCONNECT rather than a failing PUBACK: QoS 0 has no
        // acknowledgement to carry 0x90, and every QoS is treated alike (MQTT 5 §4.13;
        // 3.x closes the connection).
        if let Some(e) = limits.topic_excess(&topic) {
            return Err(e);
        }
        let packet_id = p.packet_id;
        if p.qos == QoS::ExactlyOnce {
            let Some(id) = packet_id else {
                // The codec guarantees a packet id with QoS > 0.
                return Err(SessionError::UnexpectedPacket {
                    packet_type: starling_codec::PacketType::Publish,
                });
            };
            // MQTT 5 §4.3.3: until PUBREL, the same packet id is the same
            // message: acknowledge again, never route twice.
            if self.rare().inbound_qos2.contains(&id) {
                self.effects
                    .push_back(Effect::Send(Packet::Pubrec(PubAck::new(id))));
                return Ok(());
            }
            // MQTT 5 §3.3.4: more unreleased QoS 2 messages than our Receive
            // Maximum. Checked for 3.x too, to bound the state.
            if self.rare().inbound_qos2.len() >= usize::from(limits.receive_max.max(1)) {
                return Err(SessionError::ReceiveMaximumExceeded {
                    max: limits.receive_max,
                });
            }
        }

        let utf8_invalid = v5
            && limits.validate_utf8_payload
            && p.properties.payload_format_indicator == Some(PayloadFormat::Utf8)
            && std::str::from_utf8(&p.payload).is_err();
        let code = if utf8_invalid {
            self.dropped(DropReason::PayloadFormatInvalid, p.qos);
            ReasonCode::PayloadFormatInvalid
        } else if !gate.allow_publish(&topic, p.qos, retain) {
            self.dropped(DropReason::NotAuthorized, p.qos);
            ReasonCode::NotAuthorized
        } else {
            let expires_at = Message::deadline(
                now,
                p.properties.message_expiry_interval,
                self.limits.message_expiry_max,
            );
            let properties = if v5 {
                Message::application_properties(p.properties)
            } else {
                Properties::default()
            };
            let msg = Message {
                topic,
                payload: p.payload,
                qos: p.qos,
                retain,
                properties,
                expires_at,
                publisher: Some(Arc::clone(&self.client_id)),
                shared_headers: Default::default(),
            };
            self.effects.push_back(Effect::Publish(Arc::new(msg)));
            ReasonCode::Success
        };
        // 3.x has no failing acknowledgement: a refused message is
        // acknowledged and dropped.
        let ack_code = if v5 { code } else { ReasonCode::Success };
        match (p.qos, packet_id) {
            (QoS::AtLeastOnce, Some(id)) => {
                self.effects
                    .push_back(Effect::Send(Packet::Puback(ack(id, ack_code))));
            }
            (QoS::ExactlyOnce, Some(id)) => {
                // A failing PUBREC ends the exchange (MQTT 5 §4.3.3): no PUBREL follows.
                if !ack_code.is_error() {
                    self.rare_mut().inbound_qos2.insert(id);
                }
                self.effects
                    .push_back(Effect::Send(Packet::Pubrec(ack(id, ack_code))));
            }
            _ => {}
        }
        Ok(())
    }

    fn on_pubrel(&mut self, a: &PubAck) {
        let code = if self
            .rare
            .as_mut()
            .is_some_and(|r| r.inbound_qos2.remove(&a.packet_id))
        {
            ReasonCode::Success
        } else {
            // MQTT 5 §4.3.3: a PUBREL for an id we do not hold still gets a PUBCOMP.
            self.not_found()
        };
        self.effects
            .push_back(Effect::Send(Packet::Pubcomp(ack(a.packet_id, code))));
    }

    fn on_subscribe(&mut self, s: Subscribe, gate: &mut dyn Gate) -> Result<(), SessionError> {
        let v5 = self.protocol().is_some_and(Protocol::is_v5);
        let limits = &self.limits;
        let subscription_id = s.properties.subscription_identifiers.first().copied();
        if subscription_id.is_some() && !limits.subscription_ids_available {
            return Err(SessionError::SubscriptionIdsNotSupported);
        }
        if self.rare().pending_subscribes.contains_key(&s.packet_id) {
            let code = if v5 {
                ReasonCode::PacketIdentifierInUse
            } else {
                ReasonCode::UnspecifiedError
            };
            self.effects.push_back(Effect::Send(Packet::Suback(Suback {
                packet_id: s.packet_id,
                reason_codes: vec![code; s.filters.len()],
                properties: Properties::default(),
            })));
            return Ok(());
        }
        let mut count = self.subscriptions.len();
        let mut codes = Vec::with_capacity(s.filters.len());
        let mut forwarded = Vec::new();
        for f in s.filters {
            let shared = f.filter.starts_with("$share/");
            // MQTT 5 §3.8.3.1: No Local on a shared subscription is a protocol error.
            if v5 && shared && f.options.no_local {
                return Err(SessionError::NoLocalOnShared { filter: f.filter });
            }
            let exists = self.subscriptions.contains_key(&f.filter);
            let qos = f.options.qos.min(limits.qos_max);
            let code = if shared && !limits.shared_available {
                Some(ReasonCode::SharedSubscriptionsNotSupported)
            } else if !limits.wildcard_available && f.filter.contains(['+', '#']) {
                Some(ReasonCode::WildcardSubscriptionsNotSupported)
            } else if !exists && count >= limits.subscriptions_max {
                Some(ReasonCode::QuotaExceeded)
            } else if !gate.allow_subscribe(&f.filter, qos) {
                Some(ReasonCode::NotAuthorized)
            } else {
                if !exists {
                    count += 1;
                }
                let mut options = f.options;
                options.qos = qos;
                forwarded.push(SubscribeRequest {
                    filter: f.filter,
                    options,
                    subscription_id,
                });
                None
            };
            codes.push(code);
        }
        if forwarded.is_empty() {
            self.effects.push_back(Effect::Send(Packet::Suback(Suback {
                packet_id: s.packet_id,
                reason_codes: codes.into_iter().flatten().collect(),
                properties: Properties::default(),
            })));
        } else {
            self.effects.push_back(Effect::Subscribe {
                packet_id: s.packet_id,
                filters: forwarded.clone(),
            });
            self.rare_mut()
                .pending_subscribes
                .insert(s.packet_id, PendingSubscribe { codes, forwarded });
        }
        Ok(())
    }

    fn on_unsubscribe(&mut self, u: Unsubscribe) {
        if self.rare().pending_unsubscribes.contains_key(&u.packet_id) {
            // 3.x UNSUBACK has no codes; the codec leaves them out.
            self.effects
                .push_back(Effect::Send(Packet::Unsuback(Unsuback {
                    packet_id: u.packet_id,
                    reason_codes: vec![ReasonCode::PacketIdentifierInUse; u.filters.len()],
                    properties: Properties::default(),
                })));
            return;
        }
        self.effects.push_back(Effect::Unsubscribe {
            packet_id: u.packet_id,
            filters: u.filters.clone(),
        });
        self.rare_mut()
            .pending_unsubscribes
            .insert(u.packet_id, u.filters);
    }

    fn on_disconnect(&mut self, now: Instant, d: &Disconnect) -> Result<(), SessionError> {
        if self.protocol().is_some_and(Protocol::is_v5) {
            if let Some(secs) = d.properties.session_expiry_interval {
                // MQTT 5 §3.14.2.2.2: 0 on CONNECT cannot become non-zero.
                if self.expiry_secs == 0 && secs != 0 {
                    return Err(SessionError::SessionExpiryAfterZero);
                }
                self.expiry_secs = secs.min(self.limits.session_expiry_secs_max);
            }
        }
        // MQTT 5 §3.14.4 / 3.1.1 §3.14.4: a normal DISCONNECT discards the
        // will; 0x04 (and any other reason) keeps it.
        let keep_will = d.reason_code != ReasonCode::NORMAL_DISCONNECTION;
        debug!(client_id = %self.client_id, reason = ?d.reason_code, "client disconnected");
        self.detach_with(now, None, keep_will);
        Ok(())
    }

    // ----- outbound -----

    // An acknowledgement naming a packet id we do not hold is a late duplicate (a 3.x
    // retry, a resend after reconnect) and is ignored as MQTT 5 §4.3.2-4.3.3 allow; one
    // naming a delivery in another stage of its flow is a protocol violation (MQTT 3.1.1
    // §4.8: close the connection; MQTT 5 §4.13: DISCONNECT 0x82).

    fn on_puback(&mut self, now: Instant, a: &PubAck) -> Result<(), SessionError> {
        match self.inflight.get(&a.packet_id).map(|f| f.stage) {
            Some(Stage::Qos1) => {
                self.inflight.remove(&a.packet_id);
                self.pump(now);
                Ok(())
            }
            Some(Stage::Qos2Published | Stage::Qos2Released) => Err(unexpected_ack(
                starling_codec::PacketType::Puback,
                a.packet_id,
            )),
            None => {
                debug!(client_id = %self.client_id, packet_id = a.packet_id, "stray PUBACK");
                Ok(())
            }
        }
    }

    fn on_pubrec(&mut self, now: Instant, a: &PubAck) -> Result<(), SessionError> {
        let id = a.packet_id;
        // [MQTT-4.3.3-4]: PUBREL only after a PUBREC below 0x80. A failing PUBREC
        // ends the exchange (MQTT 5 §4.3.3): the message counts as acknowledged,
        // is discarded, and its packet id is free again.
        let failed = a.reason_code.is_error();
        match self.inflight.get_mut(&id).map(|f| (f.stage, f)) {
            Some((Stage::Qos2Published | Stage::Qos2Released, _)) if failed => {
                self.inflight.remove(&id);
                self.pump(now);
            }
            // Released already: a duplicate PUBREC (the client answered a PUBLISH
            // resent by 3.x retry or on reconnect) is answered with the PUBREL again.
            Some((Stage::Qos2Published | Stage::Qos2Released, f)) => {
                f.stage = Stage::Qos2Released;
                f.sent_at = now;
                self.effects
                    .push_back(Effect::Send(Packet::Pubrel(PubAck::new(id))));
            }
            Some((Stage::Qos1, _)) => {
                return Err(unexpected_ack(starling_codec::PacketType::Pubrec, id));
            }
            None if failed => {
                debug!(client_id = %self.client_id, packet_id = id, "stray failing PUBREC");
            }
            None => {
                // MQTT 5 §4.3.3: a PUBREL still goes back, saying 0x92 (3.x: plain).
                let code = self.not_found();
                self.effects
                    .push_back(Effect::Send(Packet::Pubrel(ack(id, code))));
            }
        }
        Ok(())
    }

    fn on_pubcomp(&mut self, now: Instant, a: &PubAck) -> Result<(), SessionError> {
        match self.inflight.get(&a.packet_id).map(|f| f.stage) {
            Some(Stage::Qos2Released) => {
                self.inflight.remove(&a.packet_id);
                self.pump(now);
                Ok(())
            }
            Some(Stage::Qos1 | Stage::Qos2Published) => Err(unexpected_ack(
                starling_codec::PacketType::Pubcomp,
                a.packet_id,
            )),
            None => {
                debug!(client_id = %self.client_id, packet_id = a.packet_id, "stray PUBCOMP");
                Ok(())
            }
        }
    }

    /// Moves queued messages out while the window allows.
    fn pump(&mut self, now: Instant) {
        let Some(window) = self.conn().map(|c| c.window) else {
            return;
        };
        while let Some(front) = self.queue.front() {
            if front.msg.is_expired(now) {
                let qos = front.qos;
                self.queue_pop_front();
                self.dropped(DropReason::Expired, qos);
                continue;
            }
            if front.qos != QoS::AtMostOnce && self.inflight.len() >= window {
                break;
            }
            let Some(p) = self.queue_pop_front() else {
                break;
            };
            if p.qos == QoS::AtMostOnce {
                self.send_qos0(now, p);
            } else {
                self.start_inflight(now, p);
            }
        }
    }

    fn send_qos0(&mut self, now: Instant, p: Pending) {
        match self.encode(now, &p, None, false) {
            Ok(header) => self.emit_publish(header, p, None, false),
            Err(reason) => self.dropped(reason, p.qos),
        }
    }

    fn start_inflight(&mut self, now: Instant, p: Pending) {
        let window = self.window();
        assert!(self.inflight.len() < window, "inflight window full");
        let id = self.next_packet_id();
        match self.encode(now, &p, Some(id), false) {
            Ok(header) => {
                let stage = if p.qos == QoS::AtLeastOnce {
                    Stage::Qos1
                } else {
                    Stage::Qos2Published
                };
                let seq = self.next_seq;
                self.next_seq += 1;
                self.emit_publish(header, p.clone(), Some(id), false);
                self.inflight.insert(
                    id,
                    Inflight {
                        seq,
                        out: p,
                        stage,
                        sent_at: now,
                    },
                );
            }
            Err(reason) => self.dropped(reason, p.qos),
        }
    }

    /// Sends an in-flight message again: the PUBLISH with DUP, or the PUBREL.
    fn resend(&mut self, now: Instant, id: PacketId) {
        let Some(f) = self.inflight.get(&id) else {
            return;
        };
        if f.stage == Stage::Qos2Released {
            self.effects
                .push_back(Effect::Send(Packet::Pubrel(PubAck::new(id))));
        } else {
            let out = f.out.clone();
            let encoded = if out.msg.is_expired(now) {
                Err(DropReason::Expired)
            } else {
                self.encode(now, &out, Some(id), true)
            };
            match encoded {
                Ok(header) => self.emit_publish(header, out, Some(id), true),
                Err(reason) => {
                    self.dropped(reason, out.qos);
                    self.abandon(id);
                    return;
                }
            }
        }
        if let Some(f) = self.inflight.get_mut(&id) {
            f.sent_at = now;
        }
    }

    /// Gives up an in-flight PUBLISH. QoS 1 is forgotten. QoS 2 is released
    /// with a PUBREL instead of forgotten: the client may hold the packet id
    /// from an earlier copy, and would take a new message under the same id
    /// for a duplicate (MQTT 5 §4.3.3).
    fn abandon(&mut self, id: PacketId) {
        let Some(f) = self.inflight.get_mut(&id) else {
            return;
        };
        if f.stage == Stage::Qos1 {
            self.inflight.remove(&id);
        } else {
            f.stage = Stage::Qos2Released;
            self.effects
                .push_back(Effect::Send(Packet::Pubrel(PubAck::new(id))));
        }
    }

    fn enqueue(&mut self, p: Pending, held_back: bool) {
        let cap = if held_back && p.qos != QoS::AtMostOnce {
            self.limits.mqueue_len_hard()
        } else {
            self.limits.mqueue_len_max
        };
        if self.queue.len() >= cap {
            let queue = &self.queue;
            let evict =
                self.limits
                    .mqueue_policy
                    .victim(queue.len(), self.queued_qos0 as usize, || {
                        queue.iter().position(|q| q.qos == QoS::AtMostOnce)
                    });
            match evict.and_then(|i| self.queue.remove(i)) {
                Some(old) => {
                    if old.qos == QoS::AtMostOnce {
                        self.queued_qos0 -= 1;
                    }
                    self.dropped(DropReason::QueueFull, old.qos)
                }
                None => {
                    self.dropped(DropReason::QueueFull, p.qos);
                    return;
                }
            }
        }
        if p.qos == QoS::AtMostOnce {
            self.queued_qos0 += 1;
        }
        self.queue.push_back(p);
    }

    fn queue_pop_front(&mut self) -> Option<Pending> {
        let p = self.queue.pop_front()?;
        if p.qos == QoS::AtMostOnce {
            self.queued_qos0 -= 1;
        }
        Some(p)
    }

    /// Encodes the PUBLISH header for the attached connection: per-delivery
    /// properties, an outbound topic alias, the client's size limit.
    fn encode(
        &mut self,
        now: Instant,
        p: &Pending,
        packet_id: Option<PacketId>,
        dup: bool,
    ) -> Result<Bytes, DropReason> {
        let sub_ids_ok = self.limits.subscription_ids_available;
        let Phase::Attached(conn) = &mut self.phase else {
            return Err(DropReason::SessionEnded);
        };
        let v5 = conn.protocol.is_v5();
        let msg = &p.msg;
        // Outbound aliases, first come first served up to the client's
        // Topic Alias Maximum (MQTT 5 §3.3.2.3.4); later topics go in full.
        let (topic, alias, new_alias) = match conn.aliases_out.get(&msg.topic) {
            Some(&a) if v5 => ("", Some(a), false),
            None if v5 && usize::from(conn.alias_out_max) > conn.aliases_out.len() => {
                // Fits in u16: bounded by alias_out_max.
                let a = u16::try_from(conn.aliases_out.len() + 1).unwrap_or(u16::MAX);
                (&*msg.topic, Some(a), true)
            }
            _ => (&*msg.topic, None, false),
        };
        let expiry = msg.remaining_expiry_secs(now).map(|s| s.max(1));
        let sub_ids = if sub_ids_ok { &p.sub_ids[..] } else { &[] };
        let properties = if v5 && (expiry.is_some() || alias.is_some() || !sub_ids.is_empty()) {
            let mut props = msg.properties.clone();
            props.message_expiry_interval = expiry;
            props.topic_alias = alias;
            props.subscription_identifiers = sub_ids.to_vec();
            Cow::Owned(props)
        } else {
            Cow::Borrowed(&msg.properties)
        };
        // A QoS 0 header with nothing per subscriber is the same bytes for every subscriber on
        // the same protocol family: the first encodes it, the rest share it.
        let shareable = p.qos == QoS::AtMostOnce
            && !dup
            && !p.retain
            && alias.is_none()
            && matches!(properties, Cow::Borrowed(_));
        if shareable {
            if let Some(h) = msg.shared_headers.slot(v5).get() {
                let size = (h.len() + msg.payload.len()) as u64;
                if size > u64::from(conn.packet_size_max) {
                    return Err(DropReason::TooLarge);
                }
                return Ok(h.clone());
            }
        }
        let header = PublishHeader {
            dup,
            qos: p.qos,
            retain: p.retain,
            topic,
            packet_id,
            properties: &properties,
        };
        match encode_publish_header(
            &header,
            msg.payload.len(),
            conn.protocol,
            conn.packet_size_max,
            &mut self.scratch,
        ) {
            Ok(_) => {
                if new_alias {
                    if let Some(a) = alias {
                        conn.aliases_out.insert(Arc::clone(&msg.topic), a);
                    }
                }
                let h = self.scratch.split().freeze();
                if shareable {
                    // A copy of its own size: `h` shares the scratch buffer's allocation,
                    // which the message (perhaps long queued) should not keep alive. Another
                    // session may have set it meanwhile: the same bytes.
                    let _ = msg.shared_headers.slot(v5).set(Bytes::copy_from_slice(&h));
                }
                Ok(h)
            }
            // MQTT 5 §3.1.2.11.4: too large for the client: discard as if sent.
            Err(CodecError::PacketTooLarge { .. }) => Err(DropReason::TooLarge),
            Err(e) => {
                debug!(client_id = %self.client_id, error = %e, "unencodable PUBLISH");
                Err(DropReason::Unencodable)
            }
        }
    }

    fn emit_publish(&mut self, header: Bytes, p: Pending, packet_id: Option<PacketId>, dup: bool) {
        self.effects.push_back(Effect::SendPublish(OutgoingPublish {
            header,
            msg: p.msg,
            packet_id,
            qos: p.qos,
            dup,
            retain: p.retain,
        }));
    }

    fn next_packet_id(&mut self) -> PacketId {
        // Terminates: the caller checked inflight.len() < window <= 65535,
        // so at least one of the 65535 ids is free.
        loop {
            let id = self.next_packet_id;
            self.next_packet_id = id.checked_add(1).unwrap_or(1);
            if let Some(id) = NonZeroU16::new(id) {
                if !self.inflight.contains_key(&id) {
                    return id;
                }
            }
        }
    }

    // ----- lifecycle -----

    fn detach_with(&mut self, now: Instant, close: Option<ReasonCode>, keep_will: bool) {
        let Phase::Attached(conn) = &self.phase else {
            return;
        };
        // MQTT 3.x has no DISCONNECT from the server; MQTT 5 §3.1.2.11.4 sends
        // none that exceeds the client's Maximum Packet Size.
        let close = close.filter(|&code| {
            conn.protocol.is_v5() && disconnect_fits(code, conn.packet_size_max, &mut self.scratch)
        });
        let expires_at = if self.expiry_secs == u32::MAX {
            None
        } else {
            now.checked_add(Duration::from_secs(u64::from(self.expiry_secs)))
        };
        self.phase = Phase::Detached { expires_at };
        self.effects.push_back(Effect::Close(close));
        if !keep_will {
            self.will = None;
        }
        if let Some(w) = &self.will {
            if w.delay.is_zero() {
                self.publish_will(now);
            } else {
                let at = now.checked_add(w.delay);
                self.set_will_at(at);
            }
        }
        debug!(
            client_id = %self.client_id,
            reason = ?close,
            expiry_secs = self.expiry_secs,
            "session detached"
        );
        if self.expiry_secs == 0 {
            self.end_state(now);
            self.phase = Phase::Ended;
        }
    }

    fn publish_will(&mut self, now: Instant) {
        self.set_will_at(None);
        let Some(w) = self.will.take() else {
            return;
        };
        let Will { will, .. } = *w;
        let expires_at = Message::deadline(
            now,
            will.properties.message_expiry_interval,
            self.limits.message_expiry_max,
        );
        let msg = Message {
            topic: Arc::from(will.topic),
            payload: will.payload,
            // A 3.x will above our maximum could not be refused at CONNECT.
            qos: will.qos.min(self.limits.qos_max),
            retain: will.retain && self.limits.retain_available,
            properties: Message::application_properties(will.properties),
            expires_at,
            publisher: Some(Arc::clone(&self.client_id)),
            shared_headers: Default::default(),
        };
        debug!(client_id = %self.client_id, topic = %msg.topic, "will published");
        self.effects.push_back(Effect::Will(Arc::new(msg)));
    }

    /// Ends the state: the will goes out if still pending (MQTT 5 §3.1.2.5:
    /// at the latest when the session ends), everything else is dropped.
    /// The caller sets the phase.
    fn end_state(&mut self, now: Instant) {
        self.publish_will(now);
        let queued = mem::take(&mut self.queue);
        self.queued_qos0 = 0;
        let inflight = mem::take(&mut self.inflight);
        for qos in queued
            .iter()
            .map(|p| p.qos)
            .chain(inflight.values().map(|f| f.out.qos))
        {
            self.dropped(DropReason::SessionEnded, qos);
        }
        let (pending_subscribes, will_at) = match self.rare.take() {
            Some(r) => (r.pending_subscribes, r.will_at),
            None => (BTreeMap::new(), None),
        };
        // Only the will outlives the session's state.
        self.set_will_at(will_at);
        // A subscribe still at the router will land there: remove it too.
        let pending: Vec<String> = pending_subscribes
            .into_values()
            .flat_map(|p| p.forwarded.into_iter().map(|r| r.filter))
            .collect();
        let mut subscriptions: Vec<String> =
            mem::take(&mut self.subscriptions).into_keys().collect();
        for f in pending {
            if !subscriptions.contains(&f) {
                subscriptions.push(f);
            }
        }
        debug!(client_id = %self.client_id, "session ended");
        self.effects
            .push_back(Effect::SessionEnded { subscriptions });
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
