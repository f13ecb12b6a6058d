//! Reading a whole store back: every record decoded, every delivery and inbound packet
//! identifier matched to its session, usage recounted.

use std::collections::BTreeMap;
use std::time::SystemTime;

use redb::{Database, ReadTransaction, ReadableDatabase, ReadableTable};
use starling_codec::PacketId;
use starling_session::state::{InflightState, MessageState};
use starling_session::SessionState;

use crate::error::{At, DecodeProblem, Place, RecordKey, StoreError};
use crate::op::Usage;
use crate::record::{
    self, DelayedRecord, DeliveryStage, SessionMeta, SessionParts, StoredDelivery,
};
use crate::tables::{
    self, names, DELAYED, DELIVERIES, INBOUND, LINKS, META, MOVES, OUTBOX, RETAINED, SESSIONS,
};

/// What a store held when it was opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovered {
    /// In client id order.
    pub sessions: Vec<RecoveredSession>,
    /// In topic order.
    pub retained: Vec<(String, MessageState)>,
    /// In due order, then id order.
    pub delayed: Vec<Delayed>,
    /// One past the highest delayed id ever stored, dropped ones included: ids the broker
    /// draws from here on are new.
    pub next_delayed_id: u64,
    /// How far each forwarding link into each receiving shard is stored, in key order.
    pub links: Vec<crate::op::LinkCursor>,
    /// Batches parked for other nodes, in the order they were parked.
    pub outbox: Vec<crate::op::OutboxBatch>,
    /// The shards' records of moving sessions (`Op::PutMove`): (shard, client id,
    /// record), in key order.
    pub moves: Vec<(u16, String, Vec<u8>)>,
}

/// A stored session, reassembled, with the seqs its deliveries are stored under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveredSession {
    /// Its in-flight deliveries in seq order (the order they were first sent, as the broker
    /// assigns seqs in order), its queue in seq order, its inbound packet identifiers in
    /// ascending order.
    pub state: SessionState,
    /// The seq of each of `state`'s in-flight deliveries, in the same order.
    pub inflight_seqs: Vec<u64>,
    /// The seq of each of `state`'s queued deliveries, in the same order.
    pub queue_seqs: Vec<u64>,
    /// [`SessionMeta::owner`].
    pub owner: Option<String>,
    /// [`SessionMeta::connected`].
    pub connected: bool,
}

/// A delayed message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delayed {
    pub id: u64,
    /// To the millisecond.
    pub due: SystemTime,
    /// The topic it is published to when due.
    pub target: String,
    pub message: MessageState,
}

/// A store read back whole.
pub(crate) struct Scan {
    pub(crate) recovered: Recovered,
    pub(crate) usage: Usage,
    pub(crate) format_version: u64,
}

/// The format version the meta table holds, if any.
pub(crate) fn format_version(txn: &ReadTransaction, at: &Place) -> Result<Option<u64>, StoreError> {
    let tables: Vec<String> = txn
        .list_tables()
        .at(at)?
        .map(|t| redb::TableHandle::name(&t).to_owned())
        .collect();
    if !tables.iter().any(|t| t == names::META) {
        return if tables.is_empty() {
            Ok(None)
        } else {
            Err(StoreError::NotAStore {
                at: at.clone(),
                tables,
            })
        };
    }
    let meta = txn.open_table(META).at(at)?;
    let found = meta.get(tables::FORMAT_VERSION_KEY).at(at)?;
    match found.map(|v| v.value()) {
        Some(
            v @ (tables::FORMAT_VERSION
            | tables::FORMAT_VERSION_1
            | tables::FORMAT_VERSION_2
            | tables::FORMAT_VERSION_3),
        ) => Ok(Some(v)),
        Some(found) => Err(StoreError::UnknownFormat {
            at: at.clone(),
            found,
            supported: tables::FORMAT_VERSION,
        }),
        None => Err(StoreError::NotAStore {
            at: at.clone(),
            tables,
        }),
    }
}

struct Assembly {
    meta: SessionMeta,
    inflight: Vec<(u64, InflightState)>,
    queue: Vec<(u64, starling_session::state::DeliveryState)>,
    inbound: Vec<PacketId>,
}

/// Reads everything; the store must have a format version.
pub(crate) fn scan(db: &Database, at: &Place) -> Result<Scan, StoreError> {
    let txn = db.begin_read().at(at)?;
    let Some(format_version) = format_version(&txn, at)? else {
        return Err(StoreError::NotAStore {
            at: at.clone(),
            tables: Vec::new(),
        });
    };
    let decode_err =
        |table: &'static str, key: RecordKey, problem: DecodeProblem| StoreError::Decode {
            at: at.clone(),
            table,
            key,
            problem,
        };
    let mut usage = Usage::default();

    let mut sessions: BTreeMap<String, Assembly> = BTreeMap::new();
    for row in txn.open_table(SESSIONS).at(at)?.iter().at(at)? {
        let (k, v) = row.at(at)?;
        let (id, bytes) = (k.value(), v.value());
        let meta: SessionMeta = record::decode_meta(bytes)
            .map_err(|p| decode_err(names::SESSIONS, RecordKey::Session(id.to_owned()), p))?;
        usage.sessions += 1;
        usage.bytes += tables::session_size(id, bytes.len());
        let assembly = Assembly {
            meta,
            inflight: Vec::new(),
            queue: Vec::new(),
            inbound: Vec::new(),
        };
        sessions.insert(id.to_owned(), assembly);
    }

    for row in txn.open_table(DELIVERIES).at(at)?.iter().at(at)? {
        let (k, v) = row.at(at)?;
        let ((id, seq), bytes) = (k.value(), v.value());
        let key = || RecordKey::Delivery {
            client_id: id.to_owned(),
            seq,
        };
        let stored: StoredDelivery =
            record::decode(bytes).map_err(|p| decode_err(names::DELIVERIES, key(), p))?;
        let Some(session) = sessions.get_mut(id) else {
            return Err(StoreError::Orphan {
                at: at.clone(),
                table: names::DELIVERIES,
                key: key(),
            });
        };
        usage.deliveries += 1;
        usage.bytes += tables::delivery_size(id, bytes.len());
        match stored.stage {
            DeliveryStage::Queued => session.queue.push((seq, stored.delivery)),
            DeliveryStage::Inflight { packet_id, phase } => {
                let inflight = InflightState {
                    packet_id,
                    phase,
                    delivery: stored.delivery,
                };
                session.inflight.push((seq, inflight));
            }
        }
    }

    for row in txn.open_table(INBOUND).at(at)?.iter().at(at)? {
        let (k, _) = row.at(at)?;
        let (id, raw) = k.value();
        let key = || RecordKey::Inbound {
            client_id: id.to_owned(),
            packet_id: raw,
        };
        let packet_id = PacketId::new(raw)
            .ok_or_else(|| decode_err(names::INBOUND, key(), DecodeProblem::ZeroPacketId))?;
        let Some(session) = sessions.get_mut(id) else {
            return Err(StoreError::Orphan {
                at: at.clone(),
                table: names::INBOUND,
                key: key(),
            });
        };
        usage.inbound += 1;
        usage.bytes += tables::inbound_size(id);
        session.inbound.push(packet_id);
    }

    let mut retained = Vec::new();
    for row in txn.open_table(RETAINED).at(at)?.iter().at(at)? {
        let (k, v) = row.at(at)?;
        let (topic, bytes) = (k.value(), v.value());
        let message: MessageState = record::decode(bytes)
            .map_err(|p| decode_err(names::RETAINED, RecordKey::Retained(topic.to_owned()), p))?;
        usage.retained += 1;
        usage.bytes += tables::retained_size(topic, bytes.len());
        retained.push((topic.to_owned(), message));
    }

    let mut delayed = Vec::new();
    for row in txn.open_table(DELAYED).at(at)?.iter().at(at)? {
        let (k, v) = row.at(at)?;
        let ((due_ms, id), bytes) = (k.value(), v.value());
        let rec: DelayedRecord = record::decode(bytes)
            .map_err(|p| decode_err(names::DELAYED, RecordKey::Delayed { due_ms, id }, p))?;
        usage.delayed += 1;
        usage.bytes += tables::delayed_size(bytes.len());
        delayed.push(Delayed {
            id,
            due: record::from_wall_ms(due_ms),
            target: rec.target,
            message: rec.message,
        });
    }

    // A version 1 store (read by `check` without being opened for writing) has none.
    let mut links = Vec::new();
    if format_version != tables::FORMAT_VERSION_1 {
        for row in txn.open_table(LINKS).at(at)?.iter().at(at)? {
            let (k, v) = row.at(at)?;
            let ((node, shard, to_shard), (inc, seq, taken, map_seed, shards)) =
                (k.value(), v.value());
            links.push(crate::op::LinkCursor {
                node,
                shard,
                to_shard,
                inc,
                seq,
                taken,
                map_seed,
                shards,
            });
        }
    }

    // Versions 1 and 2 have none.
    let mut outbox = Vec::new();
    if format_version >= tables::FORMAT_VERSION_3 {
        for row in txn.open_table(OUTBOX).at(at)?.iter().at(at)? {
            let (k, v) = row.at(at)?;
            let (key, v) = (k.value(), v.value());
            let Some(b) = crate::op::OutboxBatch::decode(key, v) else {
                return Err(decode_err(
                    names::OUTBOX,
                    RecordKey::Outbox {
                        node: key.0,
                        inc: key.1,
                        seq: key.2,
                    },
                    DecodeProblem::Truncated,
                ));
            };
            usage.outbox += 1;
            usage.bytes += tables::outbox_size(v.len());
            outbox.push(b);
        }
        outbox.sort_by_key(|b| (b.parked_ms, b.seq, b.node, b.inc));
    }

    // Versions 1 to 3 have none.
    let mut moves = Vec::new();
    if format_version == tables::FORMAT_VERSION {
        for row in txn.open_table(MOVES).at(at)?.iter().at(at)? {
            let (k, v) = row.at(at)?;
            let (shard, client_id) = k.value();
            moves.push((shard, client_id.to_owned(), v.value().to_vec()));
        }
    }

    let meta = txn.open_table(META).at(at)?;
    let stored_next = meta
        .get(tables::NEXT_DELAYED_ID_KEY)
        .at(at)?
        .map_or(0, |v| v.value());
    // Every stored id is below the stored mark: a commit raises the mark with the put.
    let next_delayed_id = delayed
        .iter()
        .map(|d| d.id.saturating_add(1))
        .fold(stored_next, u64::max);

    let sessions = sessions
        .into_iter()
        .map(|(client_id, a)| {
            let (inflight_seqs, inflight) = a.inflight.into_iter().unzip();
            let (queue_seqs, queue) = a.queue.into_iter().unzip();
            let (owner, connected) = (a.meta.owner.clone(), a.meta.connected);
            let parts = SessionParts {
                client_id,
                meta: a.meta,
                inflight,
                queue,
                inbound_qos2: a.inbound,
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
    Ok(Scan {
        recovered: Recovered {
            sessions,
            retained,
            delayed,
            next_delayed_id,
            links,
            outbox,
            moves,
        },
        usage,
        format_version,
    })
}
