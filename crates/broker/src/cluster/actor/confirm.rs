//! Reconnects to a client id this node claimed: the claim is confirmed by a linearizable
//! read of the log's owners, not a commit. Without it, a node cut off from the majority, or
//! one that has not yet applied another node's newer claim, would serve the reconnect from
//! its own memory of the claim, and one client id would have two live sessions.
//!
//! The confirmations waiting share one read, one read at a time.
//!
//! The same read tells the registry, after a restart, which of the sessions it restored
//! another node has claimed since (`read_owners`), and the shards which nodes they hold
//! parked batches for left meanwhile (`check_departed`).

use std::sync::Arc;

use std::time::Duration;

use starling_cluster::{decode, encode, Answer, Owner, Query};
use starling_raft::Consistency;
use starling_rt::{time, Ctx, Reply};

use super::ClusterActor;
use crate::msg::{ClaimError, ClusterMsg, RouterMsg};

/// The members' read after a start: each try's bound, the pause between two, and how many
/// (as the registry's check of its restored sessions).
const MEMBERS_READ_WAIT: Duration = Duration::from_secs(5);
const MEMBERS_READS: u32 = 24;

/// Confirmations per read at most: the query and its answer stay small.
const CONFIRM_BATCH_MAX: usize = 1024;

/// A reconnect's confirmation: the client id and the epoch of this node's claim.
pub(super) struct Confirm {
    pub(super) client_id: Arc<str>,
    pub(super) epoch: u64,
    pub(super) reply: Reply<Result<(), ClaimError>>,
}

impl ClusterActor {
    /// Starts a read for the confirmations waiting, if none is in flight.
    pub(super) fn start_confirm(&mut self, ctx: &mut Ctx<Self>) {
        if self.confirm_in_flight.is_some() || self.confirm_queue.is_empty() {
            return;
        }
        let Some(raft) = self.raft.clone() else {
            return;
        };
        // Callers that stopped waiting (their CONNECT timed out) need no answer.
        self.confirm_queue.retain(|c| !c.reply.is_closed());
        let n = self.confirm_queue.len().min(CONFIRM_BATCH_MAX);
        if n == 0 {
            return;
        }
        let batch: Vec<Confirm> = self.confirm_queue.drain(..n).collect();
        let query = encode(&Query::Owners(
            batch.iter().map(|c| c.client_id.to_string()).collect(),
        ));
        self.confirm_in_flight = Some(batch);
        ctx.spawn_then(
            async move {
                raft.read(query, Consistency::Linearizable)
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|bytes| decode::<Answer>(&bytes).map_err(|e| e.to_string()))
            },
            ClusterMsg::ConfirmDone,
        );
    }

    /// The read for the confirmations in flight answered (or failed: no quorum in time).
    pub(super) fn confirm_done(&mut self, answer: Result<Answer, String>, ctx: &mut Ctx<Self>) {
        let Some(batch) = self.confirm_in_flight.take() else {
            return;
        };
        let owners = match answer {
            Ok(Answer::Owners(o)) if o.len() == batch.len() => Ok(o),
            Ok(other) => Err(format!("unexpected answer {other:?}")),
            Err(e) => Err(e),
        };
        for (i, c) in batch.into_iter().enumerate() {
            let verdict = match &owners {
                Ok(o) => verdict(
                    self.node,
                    c.epoch,
                    o[i],
                    self.owners.get(&*c.client_id).copied(),
                ),
                Err(e) => Err(ClaimError::Unavailable(e.clone())),
            };
            let _ = c.reply.send(verdict);
        }
        self.start_confirm(ctx);
    }
}

/// Whether node `me`'s claim with `epoch` stands, by the log's owner `now` (read at a point
/// after the reconnect came) and this node's applied view of it, `view`.
fn verdict(me: u64, epoch: u64, now: Option<Owner>, view: Option<Owner>) -> Result<(), ClaimError> {
    match now {
        Some(o) if o.node == me && o.epoch >= epoch => Ok(()),
        // Superseded only once this node has applied the newer owner too: its take-over of
        // the session here has then gone to the registry ahead of this answer. A view behind
        // the log (changes dropped for a full mailbox, a reset on its way) disagrees, and
        // the client is asked to come back.
        other if view == other => Err(ClaimError::Superseded {
            node: other.map_or(0, |o| o.node),
        }),
        _ => Err(ClaimError::Unavailable(
            "this node has not applied the client id's new owner yet".into(),
        )),
    }
}

impl ClusterActor {
    /// Reads the owners of `client_ids` through the leader (off this actor's turn) and
    /// answers with them, in order.
    pub(super) fn read_owners(
        &self,
        client_ids: Vec<Arc<str>>,
        reply: Reply<Result<Vec<Option<Owner>>, String>>,
    ) {
        let Some(raft) = self.raft.clone() else {
            let _ = reply.send(Err("raft is not up".into()));
            return;
        };
        let n = client_ids.len();
        let query = encode(&Query::Owners(
            client_ids.iter().map(|c| c.to_string()).collect(),
        ));
        starling_rt::spawn(async move {
            let answer = raft
                .read(query, Consistency::Linearizable)
                .await
                .map_err(|e| e.to_string())
                .and_then(|bytes| decode::<Answer>(&bytes).map_err(|e| e.to_string()));
            let owners = match answer {
                Ok(Answer::Owners(o)) if o.len() == n => Ok(o),
                Ok(other) => Err(format!("unexpected answer {other:?}")),
                Err(e) => Err(e),
            };
            let _ = reply.send(owners);
        });
    }
}

impl ClusterActor {
    /// Batches an earlier run parked were restored: the members are read through the
    /// leader (off this actor's turn; tried again without a quorum, for a while), and
    /// `members_read` gives up those parked for nodes that left. A `Leave` replayed from
    /// this node's log drops nothing, since that node may have joined again after it; a
    /// linearizable read sees the log as it is now.
    pub(super) fn check_departed(&self, ctx: &mut Ctx<Self>) {
        let Some(raft) = self.raft.clone() else {
            return;
        };
        let query = encode(&Query::Members);
        let read = async move {
            for _ in 0..MEMBERS_READS {
                let read = raft.read(query.clone(), Consistency::Linearizable);
                if let Some(Ok(bytes)) = time::timeout(MEMBERS_READ_WAIT, read).await {
                    if let Ok(Answer::Members(members)) = decode::<Answer>(&bytes) {
                        return Some(members.into_iter().map(|(n, _)| n).collect());
                    }
                }
                time::sleep(MEMBERS_READ_WAIT).await;
            }
            None
        };
        ctx.spawn_then(read, ClusterMsg::MembersRead);
    }

    /// The members as read through the leader: nodes whose `Leave` this node applied (its
    /// log replayed at the start included) and that are not among them left for good, and
    /// the shards give up what they restored for them. A node without a member record yet
    /// (a first member before its `Join` is applied) never counts as gone.
    pub(super) async fn members_read(&self, read: Option<Vec<u64>>) {
        let Some(members) = read else {
            tracing::warn!("the members could not be read after the start: parked batches kept");
            return;
        };
        let gone: Vec<u64> = self
            .departed
            .keys()
            .copied()
            .filter(|n| *n != self.node && !members.contains(n))
            .collect();
        if gone.is_empty() {
            return;
        }
        for shard in self.shards.all() {
            let _ = shard.send(RouterMsg::Departed(gone.clone())).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(node: u64, epoch: u64) -> Option<Owner> {
        Some(Owner { node, epoch })
    }

    #[test]
    fn a_claim_stands_only_while_the_log_names_this_node() {
        // Still this node's, under the claim or a later one of its own.
        assert_eq!(verdict(3, 12, owner(3, 12), owner(3, 12)), Ok(()));
        assert_eq!(verdict(3, 12, owner(3, 14), owner(3, 12)), Ok(()));
        // Node 2 claimed it since (bug 5 of the broker cluster sim, seed 37): never served
        // from the old claim, whatever this node's view says.
        assert_eq!(
            verdict(3, 12, owner(2, 13), owner(2, 13)),
            Err(ClaimError::Superseded { node: 2 })
        );
        assert!(matches!(
            verdict(3, 12, owner(2, 13), owner(3, 12)),
            Err(ClaimError::Unavailable(_))
        ));
        // Released (the session ended): claimed again.
        assert_eq!(
            verdict(3, 12, None, None),
            Err(ClaimError::Superseded { node: 0 })
        );
        // An older epoch of this node's than the claim's: not the claim that was made.
        assert!(verdict(3, 12, owner(3, 11), owner(3, 11)).is_err());
    }
}
