//! Messages to and from the storage actor (the `storage` module), and what waits on its
//! commits.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use starling_rt::{ActorId, Reply, WeakAddr};
use starling_session::state::DeliveryState;
use starling_session::Message;
use starling_store::{DeliveryStage, Op, StoredDelivery};

use super::*;

// --- to the storage actor -------------------------------------------------------------

pub(crate) enum StoreMsg {
    /// Ops to commit with the next batch; each of `then` is told when its ops are durable.
    /// `retained` names, for each retained message put, the op and the message: if the
    /// store refuses it, `shard` is told to take it back out of memory.
    Write {
        ops: Vec<StoreOp>,
        then: Vec<Waiter>,
        retained: Vec<(usize, Arc<Message>)>,
        /// Deliveries held until their ops are durable (see [`HeldDelivery`]), handed back
        /// to `shard` after the commit.
        deliveries: Vec<HeldDelivery>,
        shard: Option<WeakAddr<RouterMsg>>,
    },
    /// The router's shards, told now and whenever the store's room changes whether a QoS 1
    /// delivery to an online persistent session may go before its commit
    /// (`RouterMsg::StoreRoom`).
    Shards(Vec<WeakAddr<RouterMsg>>),
    /// The commit interval passed.
    CommitNow,
    Committed(Box<CommitDone>),
    /// Answered once everything written before is committed (shutdown, tests).
    Flush(Reply<()>),
    /// Commits what is pending, then closes the store (its file is free once answered).
    Close(Reply<()>),
}

/// One write as its writer hands it to the storage actor. A delivery record and its
/// retirement stay cheap (shared message, shared client id) until a commit starts: most of
/// a connected subscriber's are retired before, and then neither is ever encoded.
#[derive(Debug, Clone)]
pub(crate) enum StoreOp {
    /// Boxed: an `Op` is over 500 bytes, a delivery record here a tenth of that.
    Op(Box<Op>),
    /// Records a delivery under `seq` as queued (`Op::PutDelivery`), at the QoS and RETAIN
    /// flag the session sends it with.
    Delivery {
        client_id: Arc<str>,
        seq: u64,
        message: Arc<Message>,
        qos: starling_codec::QoS,
        retain: bool,
        subscription_ids: Vec<u32>,
    },
    /// Drops a delivery's record (`Op::DropDelivery`).
    Retire { client_id: Arc<str>, seq: u64 },
}

impl From<Op> for StoreOp {
    fn from(op: Op) -> Self {
        StoreOp::Op(Box::new(op))
    }
}

impl StoreOp {
    /// The record of `message` delivered with `opts`, as the session will take it.
    pub(crate) fn delivery(
        client_id: Arc<str>,
        seq: u64,
        message: &Arc<Message>,
        opts: &starling_session::DeliveryOptions,
    ) -> Self {
        StoreOp::Delivery {
            client_id,
            seq,
            qos: message.qos.min(opts.qos),
            retain: opts.from_retained || (opts.retain_as_published && message.retain),
            subscription_ids: opts.subscription_ids.to_vec(),
            message: message.clone(),
        }
    }

    /// The delivery record this writes or drops: (client id, seq, whether a put).
    pub(crate) fn delivery_key(&self) -> Option<(&str, u64, bool)> {
        match self {
            StoreOp::Delivery { client_id, seq, .. } => Some((client_id, *seq, true)),
            StoreOp::Op(op) => match &**op {
                Op::PutDelivery { client_id, seq, .. } => Some((client_id, *seq, true)),
                Op::DropDelivery { client_id, seq } => Some((client_id, *seq, false)),
                _ => None,
            },
            StoreOp::Retire { client_id, seq } => Some((client_id, *seq, false)),
        }
    }

    /// The store's op, a message's expiry made wall-clock with `now` and `wall`.
    pub(crate) fn into_op(self, now: Instant, wall: SystemTime) -> Op {
        match self {
            StoreOp::Op(op) => *op,
            StoreOp::Delivery {
                client_id,
                seq,
                message,
                qos,
                retain,
                subscription_ids,
            } => Op::PutDelivery {
                client_id: client_id.to_string(),
                seq,
                record: StoredDelivery {
                    stage: DeliveryStage::Queued,
                    delivery: DeliveryState {
                        message: message.to_state(now, wall),
                        qos,
                        retain,
                        subscription_ids,
                    },
                },
            },
            StoreOp::Retire { client_id, seq } => Op::DropDelivery {
                client_id: client_id.to_string(),
                seq,
            },
        }
    }
}

/// What a commit on the worker gives back.
pub(crate) struct CommitDone {
    pub store: Option<starling_store::Store>,
    /// The store's answer, or why there is none (the worker died).
    pub result: Result<starling_store::Committed, String>,
    pub ops: usize,
    /// The batch index of each op the store was given, when holes were taken out
    /// (empty: none were, the indices are the batch's).
    pub live: Vec<usize>,
    pub waiting: Vec<Waiter>,
    /// The retained puts of the commit (op index, message, shard), for refusals.
    pub retained: Vec<(usize, Arc<Message>, WeakAddr<RouterMsg>)>,
    /// The deliveries held for the commit, with their shard.
    pub deliveries: Vec<(HeldDelivery, WeakAddr<RouterMsg>)>,
    pub took: std::time::Duration,
}

/// A delivery to a persistent session that waits for the commit of its record (op index
/// `op`), or, with `op: None`, only behind such deliveries to the same subscriber (order).
/// A refused record drops it.
pub(crate) struct HeldDelivery {
    pub op: Option<usize>,
    pub subscriber: Arc<str>,
    /// The subscriber's actor when it was routed: a later session of the same client id
    /// (the old one ended) does not get it.
    pub actor: ActorId,
    pub delivery: Delivery,
}

/// The tag of a client's write of its own session (see [`ClientMsg::Stored`]); the tags
/// of publish acknowledgements skip it.
pub(crate) const OWN_WRITE: u32 = 0;

/// A publisher waiting for the ops `ops` (indices into its `Write`) to be durable.
pub(crate) struct Waiter {
    pub to: WaiterTo,
    pub ops: std::ops::Range<usize>,
}

/// Whom a commit's outcome goes to.
pub(crate) enum WaiterTo {
    /// The publisher itself.
    Client(AckTo),
    /// The shard that wrote it, under this key: the publish was also forwarded to other
    /// nodes, and its acknowledgement waits for them as well (see `routing::remote`).
    Shard(WeakAddr<RouterMsg>, u64),
    /// The shard that wrote the deliveries of a publish the node given forwarded, under
    /// that node's write number: the node's acknowledgement waits for it (`routing::link`).
    Link(WeakAddr<RouterMsg>, u64, u64),
    /// The shard that parked batch `seq` for node `node` in the outbox: its publishers are
    /// answered once it is durable (`routing::remote`).
    Parked(WeakAddr<RouterMsg>, u64, u64),
    /// The shard whose replayed batch (node, incarnation, batch) was acknowledged: its
    /// row's drop must be committed before anything of the shard's own incarnation goes to
    /// that node, or a crash could bring the batch back behind newer ones.
    Unparked(WeakAddr<RouterMsg>, u64, u64, u64),
    /// Whoever waits on this channel: a handed-over session's first write, which its
    /// client actor awaits before it subscribes (`client::persist`).
    Done(starling_rt::Reply<Stored>),
}

/// Whom the store tells: a publisher's client actor, with the tag it gave.
pub(crate) struct AckTo {
    pub addr: WeakAddr<ClientMsg>,
    pub tag: u32,
    /// A persistent publisher's QoS 2 packet identifier, stored with the routing (in the
    /// same commit), so that its resend after a crash is not routed twice.
    pub inbound: Option<(Arc<str>, starling_codec::PacketId)>,
}

/// What became of a publish's writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stored {
    /// Committed (synced, with `fsync = "always"`).
    Durable,
    /// The store refused it: full.
    Refused,
    /// The commit failed: not durable (the message was routed all the same).
    Failed,
    /// A node of the cluster it was forwarded to did not confirm it in time: it may not
    /// have arrived there (MQTT 5: PUBACK 0x80, so the publisher may send it again).
    Unconfirmed,
}

/// A stored delayed message's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DelayedKey {
    pub id: u64,
    pub due: std::time::SystemTime,
}

/// What the store held for one shard, at start.
pub(crate) struct Restore {
    pub retained: Vec<Arc<Message>>,
    pub delayed: Vec<(DelayedKey, Arc<Message>)>,
    pub done: Reply<()>,
}
