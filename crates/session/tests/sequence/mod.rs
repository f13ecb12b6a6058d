//! Drives one [`Session`] through a sequence of inputs read from arbitrary bytes, and
//! checks after every step what must hold whatever the client does: no panic, the window
//! and the queue within their caps, nothing sent before the CONNACK or after the close,
//! every packet within the client's Maximum Packet Size, no DISCONNECT for MQTT 3.x, no
//! PUBREL in answer to a failing PUBREC, no Message Expiry Interval the publisher never set.
//!
//! Shared by the proptest in `tests/packet_sequences.rs` (runs in CI) and the cargo-fuzz
//! target in `fuzz/` (coverage-guided, nightly): one interpreter, two sources of bytes.
//! Each step is chosen by a byte; its arguments are the bytes that follow. Besides
//! well-formed packets built from a few bytes (so that acknowledgements name real packet
//! ids), raw byte runs go through the codec as the broker's decoder would.
//!
//! `tests/restore_sequences.rs` drives two of these side by side to compare a session that
//! is saved and restored along the way with one that is not.

use std::num::NonZeroU16;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use starling_codec::{
    decode, encode, Connect, Disconnect, LastWill, Packet, PacketId, Properties, Protocol, PubAck,
    Publish, QoS, ReasonCode, RetainHandling, Subscribe, SubscribeFilter, SubscriptionOptions,
    Unsubscribe, PACKET_SIZE_MAX,
};
use starling_session::{
    DeliveryOptions, DetachReason, Effect, Expiry, Gate, Instant, Message, QueueFullPolicy,
    Session, SessionError, SessionLimits, StoreChange,
};

/// Topics and filters small enough to collide often.
const TOPICS: [&str; 6] = [
    "a",
    "a/b",
    "deny/x",
    "a/b/c/d",
    "$SYS/x",
    "aaaaaaaaaaaaaaaaa",
];
const FILTERS: [&str; 6] = ["a", "a/#", "+/b", "$share/g/a", "deny/#", "#"];

/// Refuses topics and filters under `deny/`, as an ACL would.
struct DenyGate;

impl Gate for DenyGate {
    fn allow_publish(&mut self, topic: &str, _: QoS, _: bool) -> bool {
        !topic.starts_with("deny/")
    }
    fn allow_subscribe(&mut self, filter: &str, _: QoS) -> bool {
        !filter.starts_with("deny/")
    }
}

/// The input bytes, read front to back; `None` once they run out.
pub struct Input<'a>(pub &'a [u8]);

impl Input<'_> {
    pub fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    fn take(&mut self, n: usize) -> &[u8] {
        let (head, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        head
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> Option<T> {
        Some(from[usize::from(self.byte()?) % from.len()])
    }
}

fn qos(b: u8) -> QoS {
    QoS::from_u8(b % 3).expect("0..=2")
}

fn pid(n: u8) -> PacketId {
    NonZeroU16::new(u16::from(n).max(1)).expect("non-zero")
}

/// What the driver knows of the attached connection.
struct Conn {
    protocol: Protocol,
    /// The client's Maximum Packet Size.
    max: u32,
    connack_seen: bool,
}

/// The session under test and the client's view of it.
pub struct Driver {
    pub s: Session,
    pub limits: SessionLimits,
    pub now: Instant,
    /// Every effect drained, in order, when `Some`.
    pub log: Option<Vec<Effect>>,
    conn: Option<Conn>,
    /// Packet ids of the server's QoS 1/2 PUBLISHes and PUBRELs the client saw, newest
    /// last (duplicates kept: what a client may answer).
    outstanding: Vec<(PacketId, QoS)>,
    released: Vec<PacketId>,
    subscribes: Vec<(PacketId, usize)>,
    unsubscribes: Vec<(PacketId, usize)>,
    /// Store keys given to deliveries and not yet retired.
    live_keys: std::collections::BTreeSet<u64>,
    next_key: u64,
}

/// Runs the sequence `data` describes; panics if an invariant breaks.
#[allow(dead_code)] // by packet_sequences and the fuzz target; restore_sequences steps itself
pub fn run(data: &[u8]) {
    let mut input = Input(data);
    let Some(mut d) = Driver::new(&mut input, base_instant()) else {
        return;
    };
    if d.attach(&mut input).is_none() {
        return;
    }
    while let Some(op) = input.byte() {
        if d.step(op, &mut input).is_none() {
            break;
        }
        d.check_state();
    }
}

impl Driver {
    /// A driver whose time starts at `base`, with limits read from the input.
    pub fn new(input: &mut Input, base: Instant) -> Option<Self> {
        let b = input.byte()?;
        let limits = SessionLimits {
            inflight_max: 1 + u16::from(b % 4),
            receive_max: 1 + u16::from((b >> 2) % 3),
            mqueue_len_max: usize::from((b >> 4) % 5),
            mqueue_policy: match input.byte()? % 3 {
                0 => QueueFullPolicy::DropNew,
                1 => QueueFullPolicy::DropOldestQos0,
                _ => QueueFullPolicy::DropOldest,
            },
            queue_qos0_offline: b & 0x80 != 0,
            retry_interval: Some(Duration::from_secs(5)),
            topic_alias_max: 2,
            session_expiry_secs_max: 100,
            message_expiry_max: Some(Duration::from_secs(30)),
            subscriptions_max: 3,
            topic_len_max: 16,
            topic_levels_max: 3,
            ..SessionLimits::default()
        };
        Some(Self {
            s: Session::new(Arc::from("c"), limits.clone()),
            limits,
            now: base,
            log: None,
            conn: None,
            outstanding: Vec::new(),
            released: Vec::new(),
            live_keys: Default::default(),
            next_key: 0,
            subscribes: Vec::new(),
            unsubscribes: Vec::new(),
        })
    }

    /// One input; `None` when the bytes ran out in the middle of it.
    pub fn step(&mut self, op: u8, input: &mut Input) -> Option<()> {
        // Most inputs need a connection: while there is none, half of them connect instead.
        let op = if self.conn.is_none() && op & 0x10 == 0 {
            0
        } else {
            op
        };
        match op % 10 {
            0 => self.attach(input)?,
            1 => {
                let len = usize::from(input.byte()? % 24);
                let raw = input.take(len).to_vec();
                self.raw(&raw);
            }
            2 | 3 => {
                let p = self.packet(input)?;
                self.handle(p);
            }
            4 => self.deliver(input)?,
            5 => {
                let secs = input.byte()?;
                self.now += Duration::from_secs(u64::from(secs));
                self.s.handle_timeout(self.now);
                self.drain();
            }
            6 => self.answer_router(input)?,
            7 => {
                let reason = input.pick(&[
                    DetachReason::ConnectionLost,
                    DetachReason::ProtocolError(ReasonCode::MalformedPacket),
                    DetachReason::TakenOver,
                    DetachReason::ServerShutdown,
                    DetachReason::Administrative,
                ])?;
                self.s.detach(self.now, reason);
                self.drain();
            }
            8 => {
                if input.byte()? == 0 {
                    self.s.end(self.now);
                    self.drain();
                } else {
                    self.s.release_buffers();
                }
            }
            _ => self.ack_in_order(),
        }
        Some(())
    }

    pub fn attach(&mut self, input: &mut Input) -> Option<()> {
        let b = input.byte()?;
        let protocol = [Protocol::V3_1, Protocol::V3_1_1, Protocol::V5][usize::from(b % 3)];
        let v5 = protocol.is_v5();
        let mut properties = Properties::default();
        if v5 {
            let p = input.byte()?;
            properties.session_expiry_interval = Some([0, 10, u32::MAX][usize::from(p % 3)]);
            properties.receive_maximum = (p & 4 != 0).then_some(1 + u16::from(p >> 6));
            properties.maximum_packet_size = (p & 8 != 0).then(|| {
                [2, 4, 5, 12, 16, 24, 40, 1024][usize::from(input.byte().unwrap_or(0) % 8)]
            });
            properties.topic_alias_maximum = (p & 16 != 0).then_some(2);
        }
        let will = (b & 8 != 0).then(|| LastWill {
            topic: TOPICS[usize::from(b >> 5) % TOPICS.len()].to_owned(),
            payload: Bytes::from_static(b"w"),
            qos: qos(b >> 4),
            retain: false,
            properties: Properties {
                will_delay_interval: (v5 && b & 0x80 != 0).then_some(3),
                ..Properties::default()
            },
        });
        let connect = Connect {
            protocol,
            clean_start: b & 4 != 0,
            keep_alive: [0, 2, 60][usize::from(b >> 6) % 3],
            client_id: "c".to_owned(),
            will,
            username: None,
            password: None,
            properties,
        };
        if starling_session::check_connect(&connect, &self.limits).is_err() {
            // The broker refuses it before the session sees it.
            return Some(());
        }
        if self.s.is_attached() {
            // A takeover, as the broker does it.
            self.s.detach(self.now, DetachReason::TakenOver);
            self.drain();
        }
        match self.s.attach(self.now, &connect) {
            Ok(_) => {
                let max = if v5 {
                    connect
                        .properties
                        .maximum_packet_size
                        .unwrap_or(PACKET_SIZE_MAX)
                } else {
                    PACKET_SIZE_MAX
                };
                assert_eq!(self.s.client_packet_size_max(), max);
                self.conn = Some(Conn {
                    protocol,
                    max,
                    connack_seen: false,
                });
                // The client starts its side of the session afresh unless it resumed one.
                self.outstanding.clear();
                self.released.clear();
                self.drain();
                assert!(
                    self.conn.as_ref().is_some_and(|c| c.connack_seen),
                    "attach queued no CONNACK"
                );
            }
            Err(SessionError::ConnackTooLarge { .. }) => {
                assert!(
                    self.s.poll_effect().is_none(),
                    "a refused attach queued effects"
                );
                assert!(!self.s.is_attached());
            }
            Err(e) => panic!("attach failed: {e}"),
        }
        Some(())
    }

    /// Bytes from the client, decoded as the broker's connection does.
    fn raw(&mut self, raw: &[u8]) {
        let Some(protocol) = self.conn.as_ref().map(|c| c.protocol) else {
            return;
        };
        let mut buf = BytesMut::from(raw);
        loop {
            match decode(&mut buf, protocol, self.limits.packet_size_max) {
                Ok(Some(p)) => {
                    if !self.handle(p) {
                        return;
                    }
                }
                Ok(None) => return,
                Err(e) => {
                    self.s
                        .detach(self.now, DetachReason::ProtocolError(e.reason_code()));
                    self.drain();
                    return;
                }
            }
        }
    }

    /// A well-formed packet from a few bytes.
    fn packet(&mut self, input: &mut Input) -> Option<Packet> {
        let kind = input.byte()?;
        let b = input.byte()?;
        let known =
            |list: &[(PacketId, QoS)]| list.get(usize::from(b) % list.len().max(1)).map(|x| x.0);
        let id = known(&self.outstanding).unwrap_or_else(|| pid(b));
        let code = if b & 0x80 != 0 {
            ReasonCode::UnspecifiedError
        } else {
            ReasonCode::Success
        };
        let ack = PubAck {
            packet_id: id,
            reason_code: code,
            properties: Properties::default(),
        };
        Some(match kind % 9 {
            0 | 1 => {
                let flags = input.byte()?;
                let q = qos(flags);
                let mut properties = Properties::default();
                if flags & 4 != 0 {
                    properties.topic_alias = Some(1 + u16::from(flags >> 7));
                }
                if flags & 8 != 0 {
                    properties.message_expiry_interval = Some(u32::from(b));
                }
                let topic = if flags & 0x40 != 0 && properties.topic_alias.is_some() {
                    String::new()
                } else {
                    TOPICS[usize::from(b) % TOPICS.len()].to_owned()
                };
                Packet::Publish(Publish {
                    dup: q != QoS::AtMostOnce && flags & 0x10 != 0,
                    qos: q,
                    retain: flags & 0x20 != 0,
                    topic,
                    packet_id: (q != QoS::AtMostOnce).then(|| pid(b % 8)),
                    properties,
                    payload: Bytes::from_static(b"payload"),
                })
            }
            2 => Packet::Puback(ack),
            3 => Packet::Pubrec(ack),
            4 => Packet::Pubcomp(ack),
            5 => Packet::Pubrel(PubAck::new(pid(b % 8))),
            6 => {
                let n = 1 + usize::from(b % 3);
                let filters = (0..n)
                    .map(|i| SubscribeFilter {
                        filter: FILTERS[(usize::from(kind) + i) % FILTERS.len()].to_owned(),
                        options: SubscriptionOptions {
                            qos: qos(b >> 2),
                            no_local: b & 0x40 != 0 && i == 0,
                            retain_as_published: b & 0x20 != 0,
                            retain_handling: RetainHandling::SendAtSubscribe,
                        },
                    })
                    .collect();
                Packet::Subscribe(Subscribe {
                    packet_id: pid(b % 4),
                    filters,
                    properties: Properties::default(),
                })
            }
            7 => Packet::Unsubscribe(Unsubscribe {
                packet_id: pid(b % 4),
                filters: vec![FILTERS[usize::from(b) % FILTERS.len()].to_owned()],
                properties: Properties::default(),
            }),
            _ => match b % 4 {
                0 => Packet::Pingreq,
                1 => Packet::Disconnect(Disconnect::default()),
                2 => Packet::Disconnect(Disconnect {
                    reason_code: ReasonCode::DisconnectWithWillMessage,
                    properties: Properties {
                        session_expiry_interval: Some(u32::from(b)),
                        ..Properties::default()
                    },
                }),
                _ => Packet::Pingresp,
            },
        })
    }

    /// Hands a packet to the session; false when the connection is gone.
    fn handle(&mut self, p: Packet) -> bool {
        let attached = self.s.is_attached();
        let failing_pubrec = matches!(&p, Packet::Pubrec(a) if a.reason_code.is_error());
        let result = self.s.handle_packet(self.now, p, &mut DenyGate);
        let effects = self.drain();
        match result {
            Ok(()) => {}
            Err(SessionError::NotAttached) => assert!(!attached),
            Err(e) => {
                assert!(attached, "{e} while detached");
                assert!(!self.s.is_attached(), "{e} left the connection attached");
                assert!(
                    effects.iter().any(|e| matches!(e, Effect::Close(_))),
                    "{e} closed nothing"
                );
            }
        }
        if failing_pubrec {
            // [MQTT-4.3.3-4]: PUBREL only after a PUBREC below 0x80.
            assert!(
                !effects
                    .iter()
                    .any(|e| matches!(e, Effect::Send(Packet::Pubrel(_)))),
                "PUBREL for a failing PUBREC: {effects:?}"
            );
        }
        self.s.is_attached()
    }

    fn deliver(&mut self, input: &mut Input) -> Option<()> {
        let b = input.byte()?;
        let o = input.byte()?;
        let expires_at = match o % 4 {
            0 => None,
            1 => Some(Expiry::announced(
                self.now + Duration::from_secs(u64::from(b % 20)),
            )),
            2 => Some(Expiry {
                at: self.now + Duration::from_secs(10),
                announced: false,
            }),
            _ => Some(Expiry::announced(self.now)),
        };
        let msg = Arc::new(Message {
            topic: Arc::from(TOPICS[usize::from(b) % 4]),
            payload: Bytes::from(vec![b'x'; usize::from(b >> 3)]),
            qos: qos(b),
            retain: o & 4 != 0,
            properties: Properties::default(),
            expires_at,
            publisher: Some(Arc::from(if o & 8 != 0 { "c" } else { "other" })),
            shared_headers: Default::default(),
            received_at: None,
        });
        let options = DeliveryOptions {
            qos: qos(o >> 4),
            no_local: o & 0x40 != 0,
            retain_as_published: o & 0x80 != 0,
            subscription_ids: if o & 0x10 != 0 {
                [7].into()
            } else {
                Default::default()
            },
            from_retained: o & 0x20 != 0,
            held_back: b & 0x80 != 0,
            stored: (b & 0x40 != 0)
                .then(|| {
                    self.next_key += 1;
                    self.live_keys.insert(self.next_key);
                    self.next_key
                })
                .into(),
        };
        self.s.deliver(self.now, &msg, &options);
        self.drain();
        Some(())
    }

    /// The router's answer to a pending SUBSCRIBE or UNSUBSCRIBE.
    fn answer_router(&mut self, input: &mut Input) -> Option<()> {
        let b = input.byte()?;
        if b & 1 == 0 {
            if let Some((id, n)) = self.subscribes.pop() {
                let results = (0..n)
                    .map(|i| {
                        if (usize::from(b) >> 1) & (1 << (i % 7)) != 0 {
                            Err(ReasonCode::QuotaExceeded)
                        } else {
                            Ok(qos(b >> 3))
                        }
                    })
                    .collect();
                self.s.subscribed(self.now, id, results);
            }
        } else if let Some((id, n)) = self.unsubscribes.pop() {
            self.s
                .unsubscribed(self.now, id, vec![ReasonCode::Success; n]);
        }
        self.drain();
        Some(())
    }

    /// The client answers the oldest thing it owes, as a correct client does.
    fn ack_in_order(&mut self) {
        let p = if let Some(id) = self.released.first().copied() {
            self.released.remove(0);
            Packet::Pubcomp(PubAck::new(id))
        } else if let Some((id, q)) = self.outstanding.first().copied() {
            self.outstanding.remove(0);
            if q == QoS::AtLeastOnce {
                Packet::Puback(PubAck::new(id))
            } else {
                Packet::Pubrec(PubAck::new(id))
            }
        } else {
            return;
        };
        self.handle(p);
    }

    /// Drains the effects, checking each against the connection's state.
    pub fn drain(&mut self) -> Vec<Effect> {
        let effects: Vec<Effect> = std::iter::from_fn(|| self.s.poll_effect()).collect();
        for e in &effects {
            match e {
                Effect::Send(p) => {
                    let c = self.conn.as_mut().expect("Send without a connection");
                    assert!(
                        c.connack_seen || matches!(p, Packet::Connack(_)),
                        "{p:?} before the CONNACK"
                    );
                    // DISCONNECT goes as Effect::Close, never as a packet to encode.
                    assert!(!matches!(p, Packet::Disconnect(_)));
                    match p {
                        Packet::Connack(_) => {
                            assert!(!c.connack_seen, "second CONNACK");
                            c.connack_seen = true;
                            let mut out = BytesMut::new();
                            encode(p, c.protocol, c.max, &mut out)
                                .expect("the CONNACK fits the client's maximum");
                        }
                        Packet::Pubrel(r) => self.released.push(r.packet_id),
                        _ => {}
                    }
                }
                Effect::SendPublish(out) => {
                    let c = self.conn.as_ref().expect("PUBLISH without a connection");
                    assert!(c.connack_seen, "PUBLISH before the CONNACK");
                    assert!(
                        out.size() <= c.max as usize,
                        "PUBLISH past the client's maximum"
                    );
                    let mut buf = BytesMut::from(&out.header[..]);
                    buf.extend_from_slice(&out.msg.payload);
                    let Ok(Some(Packet::Publish(p))) = decode(&mut buf, c.protocol, u32::MAX)
                    else {
                        panic!("the PUBLISH header does not decode");
                    };
                    assert_eq!(
                        (p.qos, p.packet_id, p.dup),
                        (out.qos, out.packet_id, out.dup)
                    );
                    if p.properties.message_expiry_interval.is_some() {
                        assert!(
                            out.msg.expires_at.is_some_and(|e| e.announced),
                            "an expiry its publisher never set"
                        );
                    }
                    if let Some(id) = out.packet_id {
                        self.outstanding.push((id, out.qos));
                    }
                }
                Effect::Close(code) => {
                    let c = self.conn.take().expect("Close without a connection");
                    if let Some(code) = code {
                        assert!(c.protocol.is_v5(), "DISCONNECT for MQTT 3.x");
                        assert!(c.connack_seen, "DISCONNECT before the CONNACK");
                        let d = Packet::Disconnect(Disconnect {
                            reason_code: *code,
                            properties: Properties::default(),
                        });
                        let mut out = BytesMut::new();
                        encode(&d, c.protocol, c.max, &mut out)
                            .expect("the DISCONNECT fits the client's maximum");
                    }
                }
                Effect::Subscribe { packet_id, filters } => {
                    assert!(!filters.is_empty());
                    self.subscribes.push((*packet_id, filters.len()));
                }
                Effect::Unsubscribe { packet_id, filters } => {
                    self.unsubscribes.push((*packet_id, filters.len()));
                }
                Effect::Publish(m) | Effect::Will(m) => {
                    assert!(self.limits.topic_allowed(&m.topic), "{} routed", m.topic);
                }
                Effect::Store(StoreChange::Retire { seq }) => {
                    assert!(
                        self.live_keys.remove(seq),
                        "key {seq} retired twice or never given"
                    );
                }
                Effect::Store(StoreChange::Stage { seq, .. }) => {
                    assert!(
                        self.live_keys.contains(seq),
                        "key {seq} staged after its retirement"
                    );
                }
                Effect::SessionEnded { .. } => {
                    // The broker drops the stored session whole.
                    self.live_keys.clear();
                }
                Effect::Store(_) | Effect::Dropped { .. } => {}
            }
        }
        if let Some(log) = &mut self.log {
            log.extend(effects.iter().cloned());
        }
        effects
    }

    pub fn check_state(&self) {
        assert!(self.s.inflight_len() <= usize::from(self.limits.inflight_max));
        assert!(self.s.queue_len() <= self.limits.mqueue_len_hard());
        assert_eq!(self.s.is_attached(), self.conn.is_some());
        if let Some(at) = self.s.poll_timeout() {
            // A deadline is never more than the longest timer ahead (keep alive, retry,
            // will delay, session expiry).
            assert!(at <= self.now + Duration::from_secs(1000));
        }
    }
}

/// Where a test's time starts: any instant will do, the test moves time itself.
#[allow(clippy::disallowed_methods)] // no clock is read again: time only advances by hand
pub fn base_instant() -> std::time::Instant {
    std::time::Instant::now()
}
