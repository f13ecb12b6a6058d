//! Applying a batch of ops inside one write transaction, with the byte cap.

use redb::{Key, ReadableTable, StorageError, Table, WriteTransaction};

use crate::error::{At, Place, StoreError};
use crate::op::{Limits, LinkCursor, Op, Refusal, Usage};
use crate::record::{self, DelayedRecord};
use crate::tables::{
    self, DELAYED, DELIVERIES, INBOUND, LINKS, META, MOVES, OUTBOX, RETAINED, SESSIONS,
};

/// How a put treats a key that is already there.
#[derive(Clone, Copy)]
enum Overwrite {
    /// Always applies, growth included: it updates data already admitted (a session's
    /// meta, a delivery's stage), and refusing it would leave the stored state behind the
    /// live one (a QoS 2 delivery stored as unsent while the client holds its PUBREL).
    Always,
    /// Applies when it does not grow, or when its growth fits.
    IfFits,
}

enum Put {
    New,
    Replaced,
}

/// The tables of one write transaction, and the usage as the batch changes it. The caller
/// keeps the new usage only once the transaction commits.
pub(crate) struct Batch<'t> {
    at: &'t Place,
    limits: Limits,
    pub(crate) usage: Usage,
    next_delayed_id: u64,
    next_delayed_id_changed: bool,
    buf: Vec<u8>,
    sessions: Table<'t, &'static str, &'static [u8]>,
    deliveries: Table<'t, (&'static str, u64), &'static [u8]>,
    inbound: Table<'t, (&'static str, u16), ()>,
    retained: Table<'t, &'static str, &'static [u8]>,
    delayed: Table<'t, (u64, u64), &'static [u8]>,
    links: Table<'t, tables::LinkKey, tables::LinkValue>,
    outbox: Table<'t, tables::OutboxKey, &'static [u8]>,
    moves: Table<'t, (u16, &'static str), &'static [u8]>,
    meta: Table<'t, &'static str, u64>,
}

impl<'t> Batch<'t> {
    pub(crate) fn open(
        txn: &'t WriteTransaction,
        at: &'t Place,
        limits: Limits,
        usage: Usage,
        next_delayed_id: u64,
    ) -> Result<Batch<'t>, StoreError> {
        Ok(Batch {
            at,
            limits,
            usage,
            next_delayed_id,
            next_delayed_id_changed: false,
            buf: Vec::new(),
            sessions: txn.open_table(SESSIONS).at(at)?,
            deliveries: txn.open_table(DELIVERIES).at(at)?,
            inbound: txn.open_table(INBOUND).at(at)?,
            retained: txn.open_table(RETAINED).at(at)?,
            delayed: txn.open_table(DELAYED).at(at)?,
            links: txn.open_table(LINKS).at(at)?,
            outbox: txn.open_table(OUTBOX).at(at)?,
            moves: txn.open_table(MOVES).at(at)?,
            meta: txn.open_table(META).at(at)?,
        })
    }

    /// Writes what the batch changed in the meta table; returns the next delayed id.
    pub(crate) fn finish(mut self) -> Result<u64, StoreError> {
        if self.next_delayed_id_changed {
            self.meta
                .insert(tables::NEXT_DELAYED_ID_KEY, self.next_delayed_id)
                .at(self.at)?;
        }
        Ok(self.next_delayed_id)
    }

    /// Applies one op; `Ok(Some(_))` when it was refused (and changed nothing).
    pub(crate) fn apply(&mut self, op: &Op) -> Result<Option<Refusal>, StoreError> {
        self.apply_inner(op).at(self.at)
    }

    fn apply_inner(&mut self, op: &Op) -> Result<Option<Refusal>, StorageError> {
        let max = self.limits.max_bytes;
        match op {
            Op::PutSession { client_id, meta } => {
                if let Err(e) = record::encode(meta, &mut self.buf) {
                    return Ok(Some(Refusal::Unencodable(e)));
                }
                let size = |len| tables::session_size(client_id, len);
                let key = client_id.as_str();
                let bytes = &mut self.usage.bytes;
                let put = put_row(
                    &mut self.sessions,
                    &key,
                    &self.buf,
                    size,
                    Overwrite::Always,
                    bytes,
                    max,
                )?;
                Ok(self.count(put, |u| &mut u.sessions))
            }
            Op::DropSession { client_id } => {
                self.drop_session(client_id)?;
                Ok(None)
            }
            Op::PutDelivery {
                client_id,
                seq,
                record,
            } => {
                if self.sessions.get(client_id.as_str())?.is_none() {
                    return Ok(Some(Refusal::NoSession));
                }
                if let Err(e) = record::encode(record, &mut self.buf) {
                    return Ok(Some(Refusal::Unencodable(e)));
                }
                let size = |len| tables::delivery_size(client_id, len);
                let key = (client_id.as_str(), *seq);
                let bytes = &mut self.usage.bytes;
                let put = put_row(
                    &mut self.deliveries,
                    &key,
                    &self.buf,
                    size,
                    Overwrite::Always,
                    bytes,
                    max,
                )?;
                Ok(self.count(put, |u| &mut u.deliveries))
            }
            Op::StageDelivery {
                client_id,
                seq,
                stage,
            } => {
                let key = (client_id.as_str(), *seq);
                let Some(old) = self.deliveries.get(key)?.map(|v| v.value().to_vec()) else {
                    return Ok(None);
                };
                // A record this store wrote decodes; one that does not is left as it is
                // for `check` and the next open to report, rather than failing the batch.
                let Ok(mut record) = record::decode::<crate::record::StoredDelivery>(&old) else {
                    return Ok(None);
                };
                record.stage = *stage;
                if let Err(e) = record::encode(&record, &mut self.buf) {
                    return Ok(Some(Refusal::Unencodable(e)));
                }
                let size = |len| tables::delivery_size(client_id, len);
                let bytes = &mut self.usage.bytes;
                // An update of admitted data: always applied (see `Overwrite::Always`).
                let put = put_row(
                    &mut self.deliveries,
                    &key,
                    &self.buf,
                    size,
                    Overwrite::Always,
                    bytes,
                    max,
                )?;
                Ok(put.err())
            }
            Op::DropDelivery { client_id, seq } => {
                let key = (client_id.as_str(), *seq);
                let removed = self.deliveries.remove(key)?.map(|v| v.value().len());
                if let Some(len) = removed {
                    self.forget(tables::delivery_size(client_id, len), |u| &mut u.deliveries);
                }
                Ok(None)
            }
            Op::PutInbound {
                client_id,
                packet_id,
            } => {
                if self.sessions.get(client_id.as_str())?.is_none() {
                    return Ok(Some(Refusal::NoSession));
                }
                // Always applied, like a delivery's stage: a refused one would let a resent
                // PUBLISH be routed twice after a restart (MQTT 5 §4.3.3). The session's
                // Receive Maximum bounds how many there are.
                let key = (client_id.as_str(), packet_id.get());
                if self.inbound.insert(key, ())?.is_none() {
                    self.usage.bytes += tables::inbound_size(client_id);
                    self.usage.inbound += 1;
                }
                Ok(None)
            }
            Op::DropInbound {
                client_id,
                packet_id,
            } => {
                let key = (client_id.as_str(), packet_id.get());
                if self.inbound.remove(key)?.is_some() {
                    self.forget(tables::inbound_size(client_id), |u| &mut u.inbound);
                }
                Ok(None)
            }
            Op::PutRetained { topic, message } => {
                if let Err(e) = record::encode(message, &mut self.buf) {
                    return Ok(Some(Refusal::Unencodable(e)));
                }
                let size = |len| tables::retained_size(topic, len);
                let key = topic.as_str();
                let bytes = &mut self.usage.bytes;
                let put = put_row(
                    &mut self.retained,
                    &key,
                    &self.buf,
                    size,
                    Overwrite::IfFits,
                    bytes,
                    max,
                )?;
                Ok(self.count(put, |u| &mut u.retained))
            }
            Op::DropRetained { topic } => {
                let removed = self
                    .retained
                    .remove(topic.as_str())?
                    .map(|v| v.value().len());
                if let Some(len) = removed {
                    self.forget(tables::retained_size(topic, len), |u| &mut u.retained);
                }
                Ok(None)
            }
            Op::PutDelayed {
                id,
                due,
                target,
                message,
            } => {
                let value = DelayedRecord {
                    target: target.clone(),
                    message: message.clone(),
                };
                if let Err(e) = record::encode(&value, &mut self.buf) {
                    return Ok(Some(Refusal::Unencodable(e)));
                }
                let key = (record::wall_ms(*due), *id);
                let bytes = &mut self.usage.bytes;
                let put = put_row(
                    &mut self.delayed,
                    &key,
                    &self.buf,
                    tables::delayed_size,
                    Overwrite::IfFits,
                    bytes,
                    max,
                )?;
                let refused = self.count(put, |u| &mut u.delayed);
                if refused.is_none() && *id >= self.next_delayed_id {
                    self.next_delayed_id = id.saturating_add(1);
                    self.next_delayed_id_changed = true;
                }
                Ok(refused)
            }
            Op::DropDelayed { id, due } => {
                let key = (record::wall_ms(*due), *id);
                let removed = self.delayed.remove(key)?.map(|v| v.value().len());
                if let Some(len) = removed {
                    self.forget(tables::delayed_size(len), |u| &mut u.delayed);
                }
                Ok(None)
            }
            Op::PutLinkCursor(c) => {
                let LinkCursor {
                    node,
                    shard,
                    to_shard,
                    ..
                } = *c;
                let value = (c.inc, c.seq, c.taken, c.map_seed, c.shards);
                self.links.insert((node, shard, to_shard), value)?;
                Ok(None)
            }
            Op::PutOutbox(b) => {
                b.encode(&mut self.buf);
                let bytes = &mut self.usage.bytes;
                let put = put_row(
                    &mut self.outbox,
                    &(b.node, b.inc, b.seq),
                    &self.buf,
                    tables::outbox_size,
                    Overwrite::IfFits,
                    bytes,
                    max,
                )?;
                Ok(self.count(put, |u| &mut u.outbox))
            }
            Op::PutMove {
                shard,
                client_id,
                record,
            } => {
                self.moves
                    .insert((*shard, client_id.as_str()), record.as_slice())?;
                Ok(None)
            }
            Op::DropMove { shard, client_id } => {
                self.moves.remove((*shard, client_id.as_str()))?;
                Ok(None)
            }
            Op::DropOutbox { node, inc, seq } => {
                let removed = self.outbox.remove((*node, *inc, *seq))?;
                if let Some(len) = removed.map(|v| v.value().len()) {
                    self.forget(tables::outbox_size(len), |u| &mut u.outbox);
                }
                Ok(None)
            }
        }
    }

    fn drop_session(&mut self, client_id: &str) -> Result<(), StorageError> {
        let removed = self.sessions.remove(client_id)?.map(|v| v.value().len());
        if let Some(len) = removed {
            self.forget(tables::session_size(client_id, len), |u| &mut u.sessions);
        }
        let (mut n, mut bytes) = (0u64, 0u64);
        self.deliveries
            .retain_in((client_id, 0)..=(client_id, u64::MAX), |(c, _), v| {
                n += 1;
                bytes += tables::delivery_size(c, v.len());
                false
            })?;
        self.usage.deliveries = sub(self.usage.deliveries, n);
        self.usage.bytes = sub(self.usage.bytes, bytes);
        let (mut n, mut bytes) = (0u64, 0u64);
        self.inbound
            .retain_in((client_id, 0)..=(client_id, u16::MAX), |(c, _), ()| {
                n += 1;
                bytes += tables::inbound_size(c);
                false
            })?;
        self.usage.inbound = sub(self.usage.inbound, n);
        self.usage.bytes = sub(self.usage.bytes, bytes);
        Ok(())
    }

    /// Counts a put in `field`, or passes its refusal on.
    fn count(
        &mut self,
        put: Result<Put, Refusal>,
        field: impl Fn(&mut Usage) -> &mut u64,
    ) -> Option<Refusal> {
        match put {
            Ok(Put::New) => {
                *field(&mut self.usage) += 1;
                None
            }
            Ok(Put::Replaced) => None,
            Err(refusal) => Some(refusal),
        }
    }

    fn forget(&mut self, size: u64, field: impl Fn(&mut Usage) -> &mut u64) {
        self.usage.bytes = sub(self.usage.bytes, size);
        let count = field(&mut self.usage);
        *count = sub(*count, 1);
    }
}

/// Usage only counts what the tables hold, so it cannot drop below what leaves them.
fn sub(have: u64, gone: u64) -> u64 {
    have.checked_sub(gone)
        .expect("usage counts every row that a batch removes")
}

/// Puts `value` under `key` unless it must be refused; keeps `bytes` up to date.
fn put_row<'k, K: Key + 'static>(
    table: &mut Table<'_, K, &'static [u8]>,
    key: &K::SelfType<'k>,
    value: &[u8],
    size: impl Fn(usize) -> u64,
    overwrite: Overwrite,
    bytes: &mut u64,
    max: u64,
) -> Result<Result<Put, Refusal>, StorageError> {
    let old = table.get(key)?.map(|v| size(v.value().len()));
    let new = size(value.len());
    let grows = new.saturating_sub(old.unwrap_or(0));
    let checked = match (old, overwrite) {
        (None, _) => true,
        (Some(_), Overwrite::Always) => false,
        (Some(_), Overwrite::IfFits) => grows > 0,
    };
    if checked && bytes.saturating_add(grows) > max {
        return Ok(Err(Refusal::Full {
            used: *bytes,
            adds: grows,
            max,
        }));
    }
    match table.insert(key, value) {
        Ok(_) => {}
        Err(StorageError::ValueTooLarge(len)) => return Ok(Err(Refusal::TooLarge { len })),
        Err(e) => return Err(e),
    }
    *bytes = sub(*bytes, old.unwrap_or(0)) + new;
    Ok(Ok(if old.is_some() {
        Put::Replaced
    } else {
        Put::New
    }))
}
