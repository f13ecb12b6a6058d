//! Retained messages through the log: the retained PUBLISHes routed here are proposed in
//! order, a batch at a time, their publishers told the outcome; the changes the log applies
//! go to the topic's shard; and a SUBSCRIBE's read barrier (a raft ReadIndex) is started
//! once the retained changes taken before it are settled.

use std::sync::Arc;

use starling_cluster::{encode, Command, Output, Query, RetainedMsg};
use starling_raft::Consistency;
use starling_rt::{time, Ctx, WeakAddr};

use super::ClusterActor;
use crate::cluster::retained::from_cluster;
use crate::msg::{ClusterMsg, Proposal, RouterMsg, Stored};

/// A SUBSCRIBE's read barrier: answered by a read that started once the retained changes
/// taken before it (`mark`) were settled.
pub(super) struct Barrier {
    pub(super) mark: u64,
    pub(super) done: tokio::sync::oneshot::Sender<()>,
}

/// A retained PUBLISH's change, with the shard (and its key) whose publisher waits.
pub(super) struct RetainOp {
    pub(super) topic: String,
    pub(super) message: Option<RetainedMsg>,
    pub(super) done: Option<(WeakAddr<RouterMsg>, u64)>,
}

/// Retained changes per proposal at most, and their payload bytes: one entry of the log
/// stays small (a single message over the bound goes alone).
const RETAIN_BATCH_MAX: usize = 256;
const RETAIN_BATCH_BYTES: usize = 1 << 20;

impl ClusterActor {
    /// Proposes the retained changes waiting, in order, as one batch, if none is in flight.
    pub(super) fn propose_retained(&mut self, ctx: &mut Ctx<Self>) {
        if self.retain_in_flight.is_some() || self.retain_queue.is_empty() || self.raft.is_none() {
            return;
        }
        let mut n = 0;
        let mut bytes = 0;
        for op in &self.retain_queue {
            let size = op.topic.len() + op.message.as_ref().map_or(0, |m| m.payload.len());
            if n > 0 && (n == RETAIN_BATCH_MAX || bytes + size > RETAIN_BATCH_BYTES) {
                break;
            }
            n += 1;
            bytes += size;
        }
        let ops: Vec<RetainOp> = self.retain_queue.drain(..n).collect();
        let commands = ops
            .iter()
            .map(|op| Command::Retain {
                topic: op.topic.clone(),
                message: op.message.clone(),
            })
            .collect();
        self.retain_in_flight = Some(ops);
        self.propose(Proposal::Retained, Command::Batch(commands), ctx);
    }

    /// The batch of retained changes in flight was applied, or not (the publishers that
    /// wait are told: MQTT 5 PUBACK 0x80, since it may yet be applied).
    pub(super) async fn retained_done(&mut self, result: &Result<Output, String>) {
        let Some(ops) = self.retain_in_flight.take() else {
            return;
        };
        self.retain_settled += ops.len() as u64;
        let failed = match result {
            Ok(Output::Batch(_)) => None,
            other => {
                tracing::debug!(node_id = self.node, outcome = ?other, "retained batch not applied");
                Some(Stored::Unconfirmed)
            }
        };
        for op in ops {
            let Some((shard, key)) = op.done else {
                continue;
            };
            if let Some(shard) = shard.upgrade() {
                let _ = shard.send(RouterMsg::RetainSettled { key, failed }).await;
            }
        }
    }

    /// Starts a read barrier for the SUBSCRIBEs waiting whose retained changes are
    /// settled, if none is in flight.
    pub(super) fn start_barrier(&mut self, ctx: &mut Ctx<Self>) {
        let settled = self.retain_settled;
        if self.barrier_in_flight.is_some() || !self.barrier_queue.iter().any(|b| b.mark <= settled)
        {
            return;
        }
        let Some(raft) = self.raft.clone() else {
            return;
        };
        let (ready, wait): (Vec<Barrier>, Vec<Barrier>) = std::mem::take(&mut self.barrier_queue)
            .into_iter()
            .partition(|b| b.mark <= settled);
        self.barrier_queue = wait;
        self.barrier_in_flight = Some(ready);
        let query = encode(&Query::Summary);
        ctx.spawn_then(
            async move { raft.read(query, Consistency::Linearizable).await },
            |r| ClusterMsg::BarrierDone(r.is_ok()),
        );
    }

    /// A read barrier finished. Its answer is handled here, behind every change the log
    /// sent before it: the shards have them before the waiting SUBSCRIBEs reach them.
    pub(super) fn barrier_done(&mut self, ok: bool, ctx: &mut Ctx<Self>) {
        for b in self.barrier_in_flight.take().into_iter().flatten() {
            if ok {
                let _ = b.done.send(());
            }
        }
        self.start_barrier(ctx);
    }

    /// The replicated retained message of `topic` changed: its shard here is told.
    pub(super) async fn retained_changed(&mut self, topic: String, message: Option<RetainedMsg>) {
        let message = match &message {
            Some(m) => match from_cluster(&topic, m, time::now(), time::wall()) {
                Some(m) => Some(m),
                None => return,
            },
            None => None,
        };
        let shard = self.shards.for_publish(&topic).clone();
        let msg = RouterMsg::ClusterRetained {
            topic: Arc::from(topic),
            message,
        };
        let _ = shard.send(msg).await;
    }
}
