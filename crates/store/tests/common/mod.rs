//! Values, op strategies and the in-memory model the store is checked against.
#![allow(dead_code)] // each test file uses a different part

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use proptest::prelude::*;
use starling_codec::{PacketId, Properties, QoS, ReasonCode, RetainHandling, SubscriptionOptions};
use starling_session::state::SESSION_STATE_VERSION;
use starling_session::state::{
    DeliveryState, ExpiryState, InflightPhase, MessageState, PendingFilter, PendingSubscribeState,
    PendingUnsubscribeState, SubscriptionState, WillState,
};
use starling_store::{
    Delayed, DeliveryStage, LinkCursor, Op, OutboxBatch, Recovered, RecoveredSession, SessionMeta,
    SessionParts, StoredDelivery,
};

pub fn wall(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(1_800_000_000_000 + ms)
}

pub fn pid(n: u16) -> PacketId {
    PacketId::new(n).expect("test packet ids are not 0")
}

pub fn message(topic: &str, payload: &[u8]) -> MessageState {
    MessageState {
        topic: topic.into(),
        payload: Bytes::copy_from_slice(payload),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: Properties::default(),
        expiry: None,
        publisher: Some("pub".into()),
    }
}

pub fn delivery(topic: &str, payload: &[u8]) -> DeliveryState {
    DeliveryState {
        message: message(topic, payload),
        qos: QoS::AtLeastOnce,
        retain: false,
        subscription_ids: vec![7],
    }
}

pub fn queued(topic: &str, payload: &[u8]) -> StoredDelivery {
    StoredDelivery {
        stage: DeliveryStage::Queued,
        delivery: delivery(topic, payload),
    }
}

pub fn meta(subscriptions: &[&str]) -> SessionMeta {
    SessionMeta {
        state_version: SESSION_STATE_VERSION,
        next_packet_id: pid(1),
        expiry_interval_secs: 3600,
        expires_at: Some(wall(3_600_000)),
        will: None,
        subscriptions: subscriptions
            .iter()
            .map(|f| SubscriptionState {
                filter: (*f).into(),
                options: SubscriptionOptions {
                    qos: QoS::ExactlyOnce,
                    ..SubscriptionOptions::default()
                },
                subscription_id: Some(7),
            })
            .collect(),
        pending_subscribes: Vec::new(),
        pending_unsubscribes: Vec::new(),
        owner: None,
        connected: false,
        unheard: false,
    }
}

/// What the store should hold: plain maps, applied op by op.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Model {
    sessions: BTreeMap<String, ModelSession>,
    retained: BTreeMap<String, MessageState>,
    delayed: BTreeMap<(u64, u64), (String, MessageState)>,
    next_delayed_id: u64,
    links: BTreeMap<(u64, u16, u16), LinkCursor>,
    outbox: BTreeMap<(u64, u64, u64), OutboxBatch>,
    moves: BTreeMap<(u16, String), Vec<u8>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ModelSession {
    meta: SessionMeta,
    deliveries: BTreeMap<u64, StoredDelivery>,
    inbound: BTreeSet<PacketId>,
}

fn ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .expect("test times are after the epoch")
        .as_millis() as u64
}

impl Model {
    /// Applies `op` as the store does without a byte cap; false when the store must refuse
    /// it (a delivery or inbound id of a client with no session).
    pub fn apply(&mut self, op: &Op) -> bool {
        match op {
            Op::PutSession { client_id, meta } => {
                let s = self
                    .sessions
                    .entry(client_id.clone())
                    .or_insert_with(|| ModelSession {
                        meta: meta.clone(),
                        deliveries: BTreeMap::new(),
                        inbound: BTreeSet::new(),
                    });
                s.meta = meta.clone();
            }
            Op::DropSession { client_id } => {
                self.sessions.remove(client_id);
            }
            Op::PutDelivery {
                client_id,
                seq,
                record,
            } => match self.sessions.get_mut(client_id) {
                Some(s) => {
                    s.deliveries.insert(*seq, record.clone());
                }
                None => return false,
            },
            Op::StageDelivery {
                client_id,
                seq,
                stage,
            } => {
                if let Some(d) = self
                    .sessions
                    .get_mut(client_id)
                    .and_then(|s| s.deliveries.get_mut(seq))
                {
                    d.stage = *stage;
                }
            }
            Op::DropDelivery { client_id, seq } => {
                if let Some(s) = self.sessions.get_mut(client_id) {
                    s.deliveries.remove(seq);
                }
            }
            Op::PutInbound {
                client_id,
                packet_id,
            } => match self.sessions.get_mut(client_id) {
                Some(s) => {
                    s.inbound.insert(*packet_id);
                }
                None => return false,
            },
            Op::DropInbound {
                client_id,
                packet_id,
            } => {
                if let Some(s) = self.sessions.get_mut(client_id) {
                    s.inbound.remove(packet_id);
                }
            }
            Op::PutRetained { topic, message } => {
                self.retained.insert(topic.clone(), message.clone());
            }
            Op::DropRetained { topic } => {
                self.retained.remove(topic);
            }
            Op::PutDelayed {
                id,
                due,
                target,
                message,
            } => {
                self.delayed
                    .insert((ms(*due), *id), (target.clone(), message.clone()));
                self.next_delayed_id = self.next_delayed_id.max(id + 1);
            }
            Op::DropDelayed { id, due } => {
                self.delayed.remove(&(ms(*due), *id));
            }
            Op::PutLinkCursor(c) => {
                self.links.insert((c.node, c.shard, c.to_shard), *c);
            }
            Op::PutOutbox(b) => {
                self.outbox.insert((b.node, b.inc, b.seq), b.clone());
            }
            Op::DropOutbox { node, inc, seq } => {
                self.outbox.remove(&(*node, *inc, *seq));
            }
            Op::PutMove {
                shard,
                client_id,
                record,
            } => {
                self.moves
                    .insert((*shard, client_id.clone()), record.clone());
            }
            Op::DropMove { shard, client_id } => {
                self.moves.remove(&(*shard, client_id.clone()));
            }
        }
        true
    }

    /// What opening a store holding this model must return.
    pub fn recovered(&self) -> Recovered {
        let sessions = self
            .sessions
            .iter()
            .map(|(client_id, s)| {
                let (mut inflight, mut inflight_seqs) = (Vec::new(), Vec::new());
                let (mut queue, mut queue_seqs) = (Vec::new(), Vec::new());
                for (&seq, d) in &s.deliveries {
                    match d.stage {
                        DeliveryStage::Queued => {
                            queue.push(d.delivery.clone());
                            queue_seqs.push(seq);
                        }
                        DeliveryStage::Inflight { packet_id, phase } => {
                            inflight.push(starling_session::state::InflightState {
                                packet_id,
                                phase,
                                delivery: d.delivery.clone(),
                            });
                            inflight_seqs.push(seq);
                        }
                    }
                }
                let (owner, connected) = (s.meta.owner.clone(), s.meta.connected);
                let parts = SessionParts {
                    client_id: client_id.clone(),
                    meta: s.meta.clone(),
                    inflight,
                    queue,
                    inbound_qos2: s.inbound.iter().copied().collect(),
                };
                RecoveredSession {
                    state: parts.join(),
                    inflight_seqs,
                    queue_seqs,
                    owner,
                    connected,
                }
            })
            .collect();
        Recovered {
            sessions,
            retained: self
                .retained
                .iter()
                .map(|(t, m)| (t.clone(), m.clone()))
                .collect(),
            delayed: self
                .delayed
                .iter()
                .map(|(&(due, id), (target, message))| Delayed {
                    id,
                    due: SystemTime::UNIX_EPOCH + Duration::from_millis(due),
                    target: target.clone(),
                    message: message.clone(),
                })
                .collect(),
            next_delayed_id: self.next_delayed_id,
            links: self.links.values().copied().collect(),
            outbox: {
                let mut o: Vec<OutboxBatch> = self.outbox.values().cloned().collect();
                o.sort_by_key(|b| (b.parked_ms, b.seq, b.node, b.inc));
                o
            },
            moves: self
                .moves
                .iter()
                .map(|((shard, c), r)| (*shard, c.clone(), r.clone()))
                .collect(),
        }
    }
}

// Strategies over small domains, so that random ops hit the same keys: overwrites, drops
// of what is there, deliveries of sessions that exist and of those that do not.

fn client() -> impl Strategy<Value = String> {
    prop_oneof![Just("a"), Just("b"), Just("c/long-client-id")].prop_map(String::from)
}

fn topic() -> impl Strategy<Value = String> {
    prop_oneof![Just("t/1"), Just("t/2"), Just("sensors/x/temp")].prop_map(String::from)
}

fn qos() -> impl Strategy<Value = QoS> {
    prop_oneof![
        Just(QoS::AtMostOnce),
        Just(QoS::AtLeastOnce),
        Just(QoS::ExactlyOnce)
    ]
}

fn time() -> impl Strategy<Value = SystemTime> {
    (0u64..5_000).prop_map(wall)
}

fn message_state() -> impl Strategy<Value = MessageState> {
    (
        topic(),
        proptest::collection::vec(any::<u8>(), 0..48),
        qos(),
        any::<bool>(),
        proptest::option::of("[a-z/]{0,8}"),
        proptest::option::of((time(), any::<bool>())),
        proptest::option::of(client()),
    )
        .prop_map(
            |(topic, payload, qos, retain, content_type, expiry, publisher)| MessageState {
                topic,
                payload: payload.into(),
                qos,
                retain,
                properties: Properties {
                    content_type,
                    user_properties: vec![("k".into(), "v".into())],
                    ..Properties::default()
                },
                expiry: expiry.map(|(at, announced)| ExpiryState { at, announced }),
                publisher,
            },
        )
}

fn delivery_state() -> impl Strategy<Value = DeliveryState> {
    (
        message_state(),
        qos(),
        any::<bool>(),
        proptest::collection::vec(1u32..1000, 0..3),
    )
        .prop_map(|(message, qos, retain, subscription_ids)| DeliveryState {
            message,
            qos,
            retain,
            subscription_ids,
        })
}

fn delivery_stage() -> impl Strategy<Value = DeliveryStage> {
    let phase = prop_oneof![
        Just(InflightPhase::AwaitingPuback),
        Just(InflightPhase::AwaitingPubrec),
        Just(InflightPhase::AwaitingPubcomp)
    ];
    prop_oneof![
        Just(DeliveryStage::Queued),
        (1u16..10, phase).prop_map(|(p, phase)| DeliveryStage::Inflight {
            packet_id: pid(p),
            phase
        }),
    ]
}

fn stored_delivery() -> impl Strategy<Value = StoredDelivery> {
    (delivery_stage(), delivery_state())
        .prop_map(|(stage, delivery)| StoredDelivery { stage, delivery })
}

fn subscription() -> impl Strategy<Value = SubscriptionState> {
    (
        prop_oneof![Just("t/#"), Just("$share/g/t/+"), Just("sensors/+/temp")],
        qos(),
        any::<bool>(),
        proptest::option::of(1u32..10_000),
    )
        .prop_map(
            |(filter, qos, no_local, subscription_id)| SubscriptionState {
                filter: filter.into(),
                options: SubscriptionOptions {
                    qos,
                    no_local,
                    retain_as_published: !no_local,
                    retain_handling: RetainHandling::SendIfNewSubscription,
                },
                subscription_id,
            },
        )
}

fn session_meta() -> impl Strategy<Value = SessionMeta> {
    let will = (
        topic(),
        qos(),
        proptest::option::of(0u32..100),
        proptest::option::of(time()),
    )
        .prop_map(|(topic, qos, delay, due_at)| WillState {
            topic,
            payload: Bytes::from_static(b"gone"),
            qos,
            retain: true,
            properties: Properties {
                will_delay_interval: delay,
                ..Properties::default()
            },
            due_at,
        });
    let pending = (1u16..100, subscription()).prop_map(|(p, s)| PendingSubscribeState {
        packet_id: pid(p),
        filters: vec![
            PendingFilter::Forwarded(s),
            PendingFilter::Decided(ReasonCode::NotAuthorized),
        ],
    });
    let unsub = (1u16..100).prop_map(|p| PendingUnsubscribeState {
        packet_id: pid(p),
        filters: vec!["t/#".into()],
    });
    (
        1u16..=u16::MAX,
        any::<u32>(),
        proptest::option::of(time()),
        proptest::option::of(will),
        proptest::collection::vec(subscription(), 0..3),
        proptest::collection::vec(pending, 0..2),
        proptest::collection::vec(unsub, 0..2),
        any::<bool>(),
    )
        .prop_map(
            |(
                next,
                expiry,
                expires_at,
                will,
                subscriptions,
                pending_subscribes,
                pending_unsubscribes,
                unheard,
            )| {
                SessionMeta {
                    state_version: SESSION_STATE_VERSION,
                    next_packet_id: pid(next),
                    expiry_interval_secs: expiry,
                    expires_at,
                    will,
                    subscriptions,
                    pending_subscribes,
                    pending_unsubscribes,
                    owner: None,
                    connected: false,
                    unheard,
                }
            },
        )
}

pub fn op() -> impl Strategy<Value = Op> {
    let seq = 0u64..6;
    prop_oneof![
        3 => (client(), session_meta()).prop_map(|(client_id, meta)| Op::PutSession { client_id, meta }),
        1 => client().prop_map(|client_id| Op::DropSession { client_id }),
        6 => (client(), seq.clone(), stored_delivery())
            .prop_map(|(client_id, seq, record)| Op::PutDelivery { client_id, seq, record }),
        3 => (client(), seq.clone(), delivery_stage())
            .prop_map(|(client_id, seq, stage)| Op::StageDelivery { client_id, seq, stage }),
        3 => (client(), seq).prop_map(|(client_id, seq)| Op::DropDelivery { client_id, seq }),
        2 => (client(), 1u16..5)
            .prop_map(|(client_id, p)| Op::PutInbound { client_id, packet_id: pid(p) }),
        1 => (client(), 1u16..5)
            .prop_map(|(client_id, p)| Op::DropInbound { client_id, packet_id: pid(p) }),
        2 => (topic(), message_state()).prop_map(|(topic, message)| Op::PutRetained { topic, message }),
        1 => topic().prop_map(|topic| Op::DropRetained { topic }),
        2 => (0u64..4, 0u64..3, topic(), message_state()).prop_map(|(id, due, target, message)| {
            Op::PutDelayed { id, due: wall(due), target, message }
        }),
        1 => (0u64..4, 0u64..3).prop_map(|(id, due)| Op::DropDelayed { id, due: wall(due) }),
        1 => (1u64..3, 0u16..2, 0u16..2, 1u64..3, 0u64..100, 1u32..9).prop_map(|(node, shard, to_shard, inc, seq, taken)| {
            Op::PutLinkCursor(LinkCursor { node, shard, to_shard, inc, seq, taken, map_seed: 5, shards: 2 })
        }),
        1 => (1u64..3, 1u64..3, 0u64..4, 0u64..3, proptest::collection::vec(any::<u8>(), 0..40)).prop_map(|(node, inc, seq, parked_ms, frame)| {
            Op::PutOutbox(OutboxBatch { node, shard: 1, inc, seq, parked_ms, messages: 1, map_seed: 3, shards: 2, frame })
        }),
        1 => (1u64..3, 1u64..3, 0u64..4).prop_map(|(node, inc, seq)| Op::DropOutbox { node, inc, seq }),
        1 => (0u16..2, client(), proptest::collection::vec(any::<u8>(), 0..20))
            .prop_map(|(shard, client_id, record)| Op::PutMove { shard, client_id, record }),
        1 => (0u16..2, client()).prop_map(|(shard, client_id)| Op::DropMove { shard, client_id }),
    ]
}

/// Ops cut into batches of 1 to 8.
pub fn batches(max_batches: usize) -> impl Strategy<Value = Vec<Vec<Op>>> {
    proptest::collection::vec(proptest::collection::vec(op(), 1..8), 1..max_batches)
}
