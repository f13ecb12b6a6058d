//! The redb tables, and the logical size of their rows (what `Limits::max_bytes` counts).

use redb::TableDefinition;

/// Row `FORMAT_VERSION_KEY`: the store layout; row `NEXT_DELAYED_ID_KEY`: one past the
/// highest delayed id ever stored. Native `u64` values: this table says how to read the
/// others, so it uses no encoding of its own.
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new(names::META);
/// client id → `SessionMeta`.
pub(crate) const SESSIONS: TableDefinition<&str, &[u8]> = TableDefinition::new(names::SESSIONS);
/// (client id, seq) → `StoredDelivery`. Keys sort by client, then seq, so that a session's
/// deliveries are one range, in the order the broker assigned them.
pub(crate) const DELIVERIES: TableDefinition<(&str, u64), &[u8]> =
    TableDefinition::new(names::DELIVERIES);
/// (client id, packet id) → (): the client's QoS 2 PUBLISHes awaiting PUBREL.
pub(crate) const INBOUND: TableDefinition<(&str, u16), ()> = TableDefinition::new(names::INBOUND);
/// topic → `MessageState`.
pub(crate) const RETAINED: TableDefinition<&str, &[u8]> = TableDefinition::new(names::RETAINED);
/// (due, ms since the Unix epoch; id) → `DelayedRecord`: due order is key order.
pub(crate) const DELAYED: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new(names::DELAYED);

/// (sending node, its shard, the receiving shard) → (the sending shard's incarnation, the
/// last of its forwarded batches whose writes in the receiving shard are stored, how many
/// of that batch's messages the shard routed, the shard map's seed and shard count): a
/// batch sent again after a restart is not delivered twice (`LinkCursor`).
pub(crate) const LINKS: TableDefinition<LinkKey, LinkValue> = TableDefinition::new(names::LINKS);

/// (node, the sending shard's incarnation, batch) → the batch's sending shard, when it was
/// parked (ms since the Unix epoch), its message count, the shard map it was parked under
/// and its encoded frame (`OutboxBatch::encode`): forwarded
/// publishes parked for a node that did not acknowledge them in time, sent again after a
/// restart (`OutboxBatch`).
pub(crate) const OUTBOX: TableDefinition<OutboxKey, &[u8]> = TableDefinition::new(names::OUTBOX);

/// (receiving shard, client id) → the broker's record of one session's moves as that
/// shard judges them (`Op::PutMove`): the relay of a session that left this node, the cut
/// of one that came, kept across a restart.
pub(crate) const MOVES: TableDefinition<(u16, &str), &[u8]> = TableDefinition::new(names::MOVES);

pub(crate) type OutboxKey = (u64, u64, u64);
pub(crate) type LinkKey = (u64, u16, u16);
pub(crate) type LinkValue = (u64, u64, u32, u64, u16);

/// The tables' names, as errors give them.
pub(crate) mod names {
    pub const META: &str = "meta";
    pub const SESSIONS: &str = "sessions";
    pub const DELIVERIES: &str = "deliveries";
    pub const INBOUND: &str = "inbound_qos2";
    pub const RETAINED: &str = "retained";
    pub const DELAYED: &str = "delayed";
    pub const LINKS: &str = "forward_links";
    pub const OUTBOX: &str = "outbox";
    pub const MOVES: &str = "moves";
}

pub(crate) const FORMAT_VERSION_KEY: &str = "format_version";
pub(crate) const NEXT_DELAYED_ID_KEY: &str = "next_delayed_id";

/// The layout of the tables above; a store of any other version is refused at open, but
/// for [`FORMAT_VERSION_1`], [`FORMAT_VERSION_2`] and [`FORMAT_VERSION_3`], which are
/// brought up to it (their tables are a subset).
pub const FORMAT_VERSION: u64 = 4;
/// Version 1 had no `forward_links` table.
pub(crate) const FORMAT_VERSION_1: u64 = 1;
/// Version 2 had no `outbox` table.
pub(crate) const FORMAT_VERSION_2: u64 = 2;
/// Version 3 had no `moves` table.
pub(crate) const FORMAT_VERSION_3: u64 = 3;

// Logical sizes: the key's own bytes plus the encoded value, without redb's overhead.
// They are what the broker can reason about; the file is larger (pages, copy-on-write).
pub(crate) fn session_size(client_id: &str, value_len: usize) -> u64 {
    (client_id.len() + value_len) as u64
}

pub(crate) fn delivery_size(client_id: &str, value_len: usize) -> u64 {
    (client_id.len() + 8 + value_len) as u64
}

pub(crate) fn inbound_size(client_id: &str) -> u64 {
    (client_id.len() + 2) as u64
}

pub(crate) fn retained_size(topic: &str, value_len: usize) -> u64 {
    (topic.len() + value_len) as u64
}

pub(crate) fn delayed_size(value_len: usize) -> u64 {
    (16 + value_len) as u64
}

pub(crate) fn outbox_size(value_len: usize) -> u64 {
    (24 + value_len) as u64
}
