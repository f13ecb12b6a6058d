//! What a commit takes and what it answers.

use std::time::SystemTime;

use starling_codec::PacketId;
use starling_session::state::MessageState;

use crate::record::{DeliveryStage, SessionMeta, StoredDelivery};

/// One change to the store. Every op is idempotent: applying it twice leaves what applying
/// it once does, and dropping what is not there does nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Stores or replaces a session's meta record.
    PutSession {
        client_id: String,
        meta: SessionMeta,
    },
    /// Drops a session with its deliveries and inbound packet identifiers.
    DropSession { client_id: String },
    /// Stores a delivery under `seq`, or changes its stage (queued → in flight → awaiting
    /// PUBCOMP). The broker assigns a session's seqs in increasing order and never reuses
    /// one for another message; the session must be stored.
    PutDelivery {
        client_id: String,
        seq: u64,
        record: StoredDelivery,
    },
    /// Changes the stage of a stored delivery, which keeps its message: what a PUBLISH sent
    /// or a PUBREC received changes, without writing the payload again. Nothing when the
    /// delivery is not stored (retired meanwhile, or its session dropped).
    StageDelivery {
        client_id: String,
        seq: u64,
        stage: DeliveryStage,
    },
    /// Drops a delivery (acknowledged, expired, discarded).
    DropDelivery { client_id: String, seq: u64 },
    /// Records that the client's QoS 2 PUBLISH `packet_id` was routed and awaits PUBREL;
    /// the session must be stored.
    PutInbound {
        client_id: String,
        packet_id: PacketId,
    },
    /// Forgets an inbound packet identifier (PUBREL received).
    DropInbound {
        client_id: String,
        packet_id: PacketId,
    },
    /// Stores or replaces the retained message of `topic`.
    PutRetained {
        topic: String,
        message: MessageState,
    },
    /// Drops the retained message of `topic`.
    DropRetained { topic: String },
    /// Holds `message` until `due` (kept to the millisecond), then for `target`. `(due, id)`
    /// is its key.
    PutDelayed {
        id: u64,
        due: SystemTime,
        target: String,
        message: MessageState,
    },
    /// Drops a delayed message (published, or cancelled).
    DropDelayed { id: u64, due: SystemTime },
    /// Records how far a forwarding link's batches are stored in one receiving shard
    /// (replacing the record of an earlier incarnation of the sender). Never refused, and
    /// not counted against the cap: a cluster has one per sending shard and receiving
    /// shard pair.
    PutLinkCursor(LinkCursor),
    /// Parks a batch of forwarded publishes for a node that did not acknowledge it in
    /// time: its publishers are told it is safe once this is durable, and it is sent again
    /// (after a restart too) until the node acknowledges it. Counted against the cap.
    PutOutbox(OutboxBatch),
    /// Drops a parked batch (its node acknowledged it, or left the cluster).
    DropOutbox { node: u64, inc: u64, seq: u64 },
    /// Stores or replaces receiving shard `shard`'s record of the moves of `client_id`'s
    /// session between nodes (the broker's own encoding): never refused, and not counted
    /// against the cap, as the broker bounds them (a few per moving session and shard).
    PutMove {
        shard: u16,
        client_id: String,
        record: Vec<u8>,
    },
    /// Drops shard `shard`'s record of `client_id`'s moves.
    DropMove { shard: u16, client_id: String },
}

/// A batch of forwarded publishes parked for another node: batch `seq` of the sending
/// shard `shard`'s incarnation `inc`, as it was sent (`frame`, the forwarding stream's
/// encoding).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxBatch {
    pub node: u64,
    pub shard: u16,
    pub inc: u64,
    pub seq: u64,
    /// When it was parked, in ms since the Unix epoch: batches go again in this order.
    pub parked_ms: u64,
    pub messages: u32,
    /// The sending node's shard map (seed and shard count) when it was parked: a node that
    /// restarts with the same shard count maps topics to shards as before, so a batch and
    /// the messages published after the restart go out in order from the same shard.
    pub map_seed: u64,
    pub shards: u16,
    pub frame: Vec<u8>,
}

impl OutboxBatch {
    /// Its row's value: shard, parked_ms, messages, map_seed, shards (little endian), then
    /// the frame.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&self.shard.to_le_bytes());
        out.extend_from_slice(&self.parked_ms.to_le_bytes());
        out.extend_from_slice(&self.messages.to_le_bytes());
        out.extend_from_slice(&self.map_seed.to_le_bytes());
        out.extend_from_slice(&self.shards.to_le_bytes());
        out.extend_from_slice(&self.frame);
    }

    /// The batch of row `(node, inc, seq)`; `None` when the value is too short.
    pub(crate) fn decode((node, inc, seq): (u64, u64, u64), v: &[u8]) -> Option<Self> {
        let shard = u16::from_le_bytes(v.get(0..2)?.try_into().ok()?);
        let parked_ms = u64::from_le_bytes(v.get(2..10)?.try_into().ok()?);
        let messages = u32::from_le_bytes(v.get(10..14)?.try_into().ok()?);
        let map_seed = u64::from_le_bytes(v.get(14..22)?.try_into().ok()?);
        let shards = u16::from_le_bytes(v.get(22..24)?.try_into().ok()?);
        Some(OutboxBatch {
            node,
            shard,
            inc,
            seq,
            parked_ms,
            messages,
            map_seed,
            shards,
            frame: v[24..].to_vec(),
        })
    }
}

/// How far a receiving shard's writes for the batches another node's shard forwarded are
/// committed: batches are numbered per incarnation of the sending shard, and a batch's
/// messages reach a receiving shard in the batch's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct LinkCursor {
    pub node: u64,
    pub shard: u16,
    pub to_shard: u16,
    pub inc: u64,
    pub seq: u64,
    /// Of batch `seq`, the messages the receiving shard routed, counted from 1.
    pub taken: u32,
    /// The shard map (its seed and shard count) that sent the messages to `to_shard`: the
    /// cursor means something only under the same map.
    pub map_seed: u64,
    pub shards: u16,
}

/// Whether a commit waits for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fsync {
    /// The commit is on disk when `commit` returns (redb `Durability::Immediate`: its pages
    /// and header, then one `sync_data`).
    Always,
    /// The commit is visible at once but reaches the disk only with a later `Always` commit
    /// or a clean close (redb `Durability::None`): a crash before then loses it. redb frees
    /// the pages such commits replace only at the next `Always` commit, so a long run of
    /// them grows the file.
    Never,
}

/// The caps of a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The logical bytes (keys plus encoded values, see [`Usage::bytes`]) above which ops that
    /// admit new data are refused.
    pub max_bytes: u64,
}

/// What a store holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub sessions: u64,
    pub deliveries: u64,
    pub inbound: u64,
    pub retained: u64,
    pub delayed: u64,
    /// Parked batches of forwarded publishes.
    pub outbox: u64,
    /// Keys plus encoded values: what the broker admits, not the file's size, which adds
    /// redb's pages and copy-on-write slack.
    pub bytes: u64,
}

/// What a commit did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Committed {
    /// The ops that were not applied, in batch order; every other op was.
    pub refused: Vec<Refused>,
}

/// An op a commit did not apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// Its index in the batch.
    pub op: usize,
    pub reason: Refusal,
}

/// Why an op was not applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// It admits new data past [`Limits::max_bytes`].
    #[error("the store is full: {used} of {max} bytes used, the op adds {adds}")]
    Full { used: u64, adds: u64, max: u64 },
    /// A delivery or inbound packet identifier of a client whose session is not stored.
    #[error("no stored session for this client")]
    NoSession,
    /// Its value does not encode (a time before the Unix epoch, properties a PUBLISH
    /// cannot carry, ...).
    #[error("the value does not encode: {0}")]
    Unencodable(postcard::Error),
    /// Its key or value is larger than redb takes.
    #[error("{len} bytes, more than redb stores in one row")]
    TooLarge { len: usize },
}
