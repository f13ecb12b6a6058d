//! `$exclusive/` and `$limit/N/` counted cluster-wide: the home shard of such a
//! subscription's filter installs it and asks here; the holds and releases waiting are
//! proposed as one batch at a time, in order, and each hold is answered with the log's
//! grant. The first batch of a process drops the holds this node's clients had before it
//! restarted (its restored sessions hold again as they subscribe).

use std::sync::Arc;

use starling_cluster::{Command, Output};
use starling_rt::Ctx;

use super::ClusterActor;
use crate::msg::Proposal;

/// Holds and releases per proposal at most: one entry of the log stays small.
const HOLD_BATCH_MAX: usize = 1024;

/// A hold (with whom to answer), a release, or the drop of this node's earlier holds.
pub(super) enum HoldOp {
    Hold {
        filter: String,
        client_id: Arc<str>,
        limit: Option<u32>,
        done: tokio::sync::oneshot::Sender<Option<bool>>,
    },
    Unhold {
        filter: String,
        client_id: Arc<str>,
        exclusive: bool,
    },
    DropMine,
}

impl ClusterActor {
    /// Proposes the holds and releases waiting, in order, if no batch is in flight (after
    /// this node's Join: a hold by a node that is not a member is refused).
    pub(super) fn propose_holds(&mut self, ctx: &mut Ctx<Self>) {
        if self.hold_in_flight.is_some()
            || self.hold_queue.is_empty()
            || self.raft.is_none()
            || !self.joined
        {
            return;
        }
        let n = self.hold_queue.len().min(HOLD_BATCH_MAX);
        let ops: Vec<HoldOp> = self.hold_queue.drain(..n).collect();
        let node = self.node;
        let commands = ops
            .iter()
            .map(|op| match op {
                HoldOp::Hold {
                    filter,
                    client_id,
                    limit,
                    ..
                } => Command::Hold {
                    filter: filter.clone(),
                    client_id: client_id.to_string(),
                    node,
                    limit: *limit,
                },
                HoldOp::Unhold {
                    filter,
                    client_id,
                    exclusive,
                } => Command::Unhold {
                    filter: filter.clone(),
                    client_id: client_id.to_string(),
                    node,
                    exclusive: *exclusive,
                },
                HoldOp::DropMine => Command::DropHolds { node },
            })
            .collect();
        self.hold_in_flight = Some(ops);
        self.propose(Proposal::Holds, Command::Batch(commands), ctx);
    }

    /// The batch in flight was applied (one output per op) or failed: holds are answered
    /// (`None` when not counted: their SUBSCRIBE is refused), releases and the drop are
    /// proposed again, ahead of what came since.
    pub(super) fn holds_done(&mut self, result: Result<Output, String>) {
        let Some(ops) = self.hold_in_flight.take() else {
            return;
        };
        let outputs = match result {
            Ok(Output::Batch(o)) => Some(o),
            other => {
                tracing::debug!(node_id = self.node, outcome = ?other, "hold batch not applied");
                None
            }
        };
        let mut again = Vec::new();
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                HoldOp::Hold { done, .. } => {
                    let verdict = match outputs.as_ref().and_then(|o| o.get(i)) {
                        Some(Output::Held(granted)) => Some(*granted),
                        _ => None,
                    };
                    let _ = done.send(verdict);
                }
                op if outputs.is_none() => again.push(op),
                _ => {}
            }
        }
        again.append(&mut self.hold_queue);
        self.hold_queue = again;
    }
}
