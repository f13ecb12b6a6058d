//! Random operation sequences against a model client: deliveries,
//! acknowledgements in any order, dropped connections that lose packets in
//! transit, reconnects, time jumps, and the client's own QoS 2 publishes with
//! retries.
//!
//! Goal: at-least-once for QoS 1, exactly-once for QoS 2 (both directions) with
//! a persistent session, every drop reported, order kept, and the window and
//! the queue never above their caps.

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU16;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use starling_codec::{
    decode, Connect, Packet, PacketId, Properties, Protocol, PubAck, Publish, QoS,
};
use starling_session::{
    AllowAll, DeliveryOptions, DetachReason, Effect, Instant, Message, QueueFullPolicy, Session,
    SessionLimits,
};

#[derive(Debug, Clone)]
enum Op {
    /// The router delivers a new message at this QoS.
    Deliver(u8),
    /// The client sends the i-th acknowledgement it owes (any order).
    Ack(usize),
    /// The connection breaks; packets in transit are lost.
    Drop,
    /// The client reconnects (Clean Start 0) if it is not connected.
    Reconnect,
    /// Time passes.
    Jump(u16),
    /// The client starts a QoS 2 publish of its own.
    InPublish,
    /// The client handles what the server sent for its publishes.
    InStep,
    /// The client retries its unfinished publishes (as after a reconnect).
    InResend,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..3).prop_map(Op::Deliver),
        4 => any::<usize>().prop_map(Op::Ack),
        1 => Just(Op::Drop),
        2 => Just(Op::Reconnect),
        1 => (0u16..40).prop_map(Op::Jump),
        2 => Just(Op::InPublish),
        2 => Just(Op::InStep),
        1 => Just(Op::InResend),
    ]
}

#[derive(Debug, Clone)]
struct Setup {
    protocol: Protocol,
    inflight_max: u16,
    client_receive_max: u16,
    mqueue_len_max: usize,
    policy: QueueFullPolicy,
    queue_qos0_offline: bool,
    receive_max: u16,
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        prop_oneof![Just(Protocol::V3_1_1), Just(Protocol::V5)],
        1u16..5,
        1u16..5,
        0usize..6,
        prop_oneof![
            Just(QueueFullPolicy::DropNew),
            Just(QueueFullPolicy::DropOldestQos0),
            Just(QueueFullPolicy::DropOldest)
        ],
        any::<bool>(),
        1u16..4,
    )
        .prop_map(
            |(protocol, inflight_max, client_receive_max, mqueue_len_max, policy, q0, rm)| Setup {
                protocol,
                inflight_max,
                client_receive_max,
                mqueue_len_max,
                policy,
                queue_qos0_offline: q0,
                receive_max: rm,
            },
        )
}

/// The client side, as a correct MQTT client behaves.
struct World {
    setup: Setup,
    s: Session,
    now: Instant,
    connected: bool,
    /// Acknowledgements the client owes the server (lost if the connection drops).
    owed: Vec<Packet>,
    /// Server→client QoS 2 ids received and not yet released (kept across
    /// reconnects: part of the client's session state).
    qos2_held: BTreeSet<u16>,
    /// Message numbers handed to the application, every time.
    app: Vec<(u32, QoS)>,
    delivered: BTreeMap<u32, QoS>,
    dropped: [usize; 3],
    next_msg: u32,
    // Client→server QoS 2 flows: id → (message number, PUBREC seen).
    flows: BTreeMap<u16, (u32, bool)>,
    inbox: Vec<Packet>,
    next_in: u32,
    routed: Vec<u32>,
}

fn pid(n: u16) -> PacketId {
    NonZeroU16::new(n).expect("ids start at 1")
}

impl World {
    fn new(setup: Setup) -> Self {
        let limits = SessionLimits {
            inflight_max: setup.inflight_max,
            mqueue_len_max: setup.mqueue_len_max,
            mqueue_policy: setup.policy,
            queue_qos0_offline: setup.queue_qos0_offline,
            receive_max: setup.receive_max,
            retry_interval: Some(Duration::from_secs(10)),
            session_expiry_secs_max: u32::MAX,
            ..SessionLimits::default()
        };
        let mut w = Self {
            setup,
            s: Session::new(Arc::from("c"), limits),
            now: base_instant(),
            connected: false,
            owed: Vec::new(),
            qos2_held: BTreeSet::new(),
            app: Vec::new(),
            delivered: BTreeMap::new(),
            dropped: [0; 3],
            next_msg: 0,
            flows: BTreeMap::new(),
            inbox: Vec::new(),
            next_in: 0,
            routed: Vec::new(),
        };
        w.reconnect();
        w
    }

    fn connect(&self) -> Connect {
        let mut properties = Properties::default();
        if self.setup.protocol.is_v5() {
            properties.session_expiry_interval = Some(u32::MAX);
            properties.receive_maximum = Some(self.setup.client_receive_max);
        }
        Connect {
            protocol: self.setup.protocol,
            clean_start: false,
            keep_alive: 0,
            client_id: "c".into(),
            will: None,
            username: None,
            password: None,
            properties,
        }
    }

    fn reconnect(&mut self) {
        if self.connected {
            return;
        }
        let c = self.connect();
        self.s
            .attach(self.now, &c)
            .expect("detached, so attach works");
        self.connected = true;
        self.effects();
    }

    fn window(&self) -> usize {
        let client = if self.setup.protocol.is_v5() {
            self.setup.client_receive_max
        } else {
            u16::MAX
        };
        usize::from(client.min(self.setup.inflight_max))
    }

    fn send(&mut self, p: Packet) {
        assert!(self.connected);
        self.s
            .handle_packet(self.now, p, &mut AllowAll)
            .expect("a correct client never breaks the protocol");
        self.effects();
    }

    fn effects(&mut self) {
        while let Some(e) = self.s.poll_effect() {
            match e {
                Effect::Send(p) => {
                    assert!(self.connected, "sent while detached: {p:?}");
                    match p {
                        Packet::Connack(_) => {}
                        Packet::Pubrel(a) => {
                            self.qos2_held.remove(&a.packet_id.get());
                            self.owed.push(Packet::Pubcomp(PubAck::new(a.packet_id)));
                        }
                        Packet::Pubrec(_) | Packet::Pubcomp(_) => self.inbox.push(p),
                        other => panic!("unexpected {other:?}"),
                    }
                }
                Effect::SendPublish(out) => {
                    assert!(self.connected, "PUBLISH while detached");
                    let mut buf = BytesMut::from(&out.header[..]);
                    buf.extend_from_slice(&out.msg.payload);
                    let Ok(Some(Packet::Publish(p))) =
                        decode(&mut buf, self.setup.protocol, u32::MAX)
                    else {
                        panic!("undecodable PUBLISH");
                    };
                    self.receive(p);
                }
                Effect::Publish(m) => {
                    self.routed
                        .push(u32::from_be_bytes(m.payload[..4].try_into().unwrap()));
                }
                Effect::Dropped { qos, .. } => self.dropped[qos.as_u8() as usize] += 1,
                Effect::Close(_) => assert!(!self.connected || !self.s.is_attached()),
                // Inbound QoS 2 identifiers for the store; nothing here is stored.
                Effect::Store(
                    starling_session::StoreChange::InboundRouted(_)
                    | starling_session::StoreChange::InboundReleased(_),
                ) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        if self.s.is_attached() {
            assert!(self.s.inflight_len() <= self.window(), "window exceeded");
        }
        assert!(
            self.s.queue_len() <= self.setup.mqueue_len_max,
            "queue cap exceeded"
        );
    }

    fn receive(&mut self, p: Publish) {
        let n = u32::from_be_bytes(p.payload[..4].try_into().unwrap());
        match (p.qos, p.packet_id) {
            (QoS::AtMostOnce, None) => self.app.push((n, p.qos)),
            (QoS::AtLeastOnce, Some(id)) => {
                self.app.push((n, p.qos));
                self.owed.push(Packet::Puback(PubAck::new(id)));
            }
            (QoS::ExactlyOnce, Some(id)) => {
                // MQTT 5 §4.3.3: the receiver hands the message on once per id until PUBREL.
                if self.qos2_held.insert(id.get()) {
                    self.app.push((n, p.qos));
                }
                self.owed.push(Packet::Pubrec(PubAck::new(id)));
            }
            other => panic!("bad qos/id {other:?}"),
        }
    }

    fn client_publish(&mut self, id: u16, n: u32, dup: bool) {
        self.send(Packet::Publish(Publish {
            dup,
            qos: QoS::ExactlyOnce,
            retain: false,
            topic: "in".into(),
            packet_id: Some(pid(id)),
            properties: Properties::default(),
            payload: Bytes::copy_from_slice(&n.to_be_bytes()),
        }));
    }

    fn in_step(&mut self) {
        for p in std::mem::take(&mut self.inbox) {
            match p {
                Packet::Pubrec(a) => {
                    if let Some(f) = self.flows.get_mut(&a.packet_id.get()) {
                        f.1 = true;
                        self.send(Packet::Pubrel(PubAck::new(a.packet_id)));
                    }
                }
                Packet::Pubcomp(a) => {
                    self.flows.remove(&a.packet_id.get());
                }
                _ => unreachable!(),
            }
        }
    }

    fn in_resend(&mut self) {
        let flows: Vec<(u16, (u32, bool))> = self.flows.iter().map(|(k, v)| (*k, *v)).collect();
        for (id, (n, released)) in flows {
            if released {
                self.send(Packet::Pubrel(PubAck::new(pid(id))));
            } else {
                self.client_publish(id, n, true);
            }
        }
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Deliver(q) => {
                let qos = QoS::from_u8(q).unwrap();
                let n = self.next_msg;
                self.next_msg += 1;
                self.delivered.insert(n, qos);
                let msg = Arc::new(Message {
                    topic: Arc::from("t"),
                    payload: Bytes::copy_from_slice(&n.to_be_bytes()),
                    qos,
                    retain: false,
                    properties: Properties::default(),
                    expires_at: None,
                    publisher: None,
                    shared_headers: Default::default(),
                    received_at: None,
                });
                let opts = DeliveryOptions {
                    qos,
                    ..DeliveryOptions::default()
                };
                self.s.deliver(self.now, &msg, &opts);
                self.effects();
            }
            Op::Ack(i) => {
                if self.connected && !self.owed.is_empty() {
                    let p = self.owed.remove(i % self.owed.len());
                    self.send(p);
                }
            }
            Op::Drop => {
                if self.connected {
                    self.s.detach(self.now, DetachReason::ConnectionLost);
                    self.connected = false;
                    self.owed.clear();
                    self.inbox.clear();
                    self.effects();
                }
            }
            Op::Reconnect => self.reconnect(),
            Op::Jump(secs) => {
                self.now += Duration::from_secs(u64::from(secs));
                self.s.handle_timeout(self.now);
                self.effects();
            }
            Op::InPublish => {
                // A correct client keeps within our Receive Maximum.
                if self.connected && self.flows.len() < usize::from(self.setup.receive_max) {
                    let id = (1u16..).find(|i| !self.flows.contains_key(i)).unwrap();
                    let n = self.next_in;
                    self.next_in += 1;
                    self.flows.insert(id, (n, false));
                    self.client_publish(id, n, false);
                }
            }
            Op::InStep => {
                if self.connected {
                    self.in_step();
                }
            }
            Op::InResend => {
                if self.connected {
                    self.in_resend();
                }
            }
        }
    }

    /// Heal: reconnect and let both sides finish every exchange.
    fn settle(&mut self) {
        self.reconnect();
        self.in_resend();
        for _ in 0..1000 {
            if self.owed.is_empty()
                && self.inbox.is_empty()
                && self.flows.is_empty()
                && self.s.inflight_len() == 0
                && self.s.queue_len() == 0
            {
                return;
            }
            while !self.owed.is_empty() {
                let p = self.owed.remove(0);
                self.send(p);
            }
            self.in_step();
        }
        panic!(
            "did not settle: inflight {} queue {} flows {:?}",
            self.s.inflight_len(),
            self.s.queue_len(),
            self.flows
        );
    }

    fn check(&self) {
        let mut first: Vec<u32> = Vec::new();
        let mut seen = BTreeSet::new();
        let mut times: BTreeMap<u32, usize> = BTreeMap::new();
        for &(n, qos) in &self.app {
            assert_eq!(Some(&qos), self.delivered.get(&n), "QoS changed for {n}");
            *times.entry(n).or_default() += 1;
            if seen.insert(n) {
                first.push(n);
            }
        }
        // Order: first receipts follow delivery order (MQTT 5 §4.6).
        assert!(
            first.windows(2).all(|w| w[0] < w[1]),
            "out of order: {first:?}"
        );
        for (n, qos) in &self.delivered {
            let t = times.get(n).copied().unwrap_or(0);
            if *qos != QoS::AtLeastOnce {
                assert!(t <= 1, "message {n} at {qos:?} handed over {t} times");
            }
        }
        // Every message reached the application or was reported dropped.
        for q in 0..3u8 {
            let qos = QoS::from_u8(q).unwrap();
            let delivered = self.delivered.values().filter(|x| **x == qos).count();
            let received = seen.iter().filter(|n| self.delivered[n] == qos).count();
            assert_eq!(
                received + self.dropped[q as usize],
                delivered,
                "{qos:?}: {received} received + {} dropped != {delivered} delivered",
                self.dropped[q as usize]
            );
        }
        // Inbound QoS 2: each client message routed exactly once.
        let mut routed = self.routed.clone();
        routed.sort_unstable();
        assert_eq!(
            routed,
            (0..self.next_in).collect::<Vec<_>>(),
            "inbound exactly once"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn persistent_session_delivers_every_message_as_its_qos_promises(
        setup in setup(),
        ops in prop::collection::vec(op(), 0..120),
    ) {
        let mut w = World::new(setup);
        for op in &ops {
            w.apply(op);
        }
        w.settle();
        w.check();
    }
}

/// Where a test's time starts: any instant will do, the test moves time itself.
#[allow(clippy::disallowed_methods)] // no clock is read again: time only advances by hand
fn base_instant() -> std::time::Instant {
    std::time::Instant::now()
}
