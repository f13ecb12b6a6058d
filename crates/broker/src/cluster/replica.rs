//! What the raft log changed, passed from the raft driver's turn to the cluster actor.

use starling_cluster::{Change, ClusterState, Output, Replica};
use starling_rt::Addr;

use crate::msg::ClusterMsg;

/// The cluster actor's end of the state machine. It never waits (it runs on the driver's
/// turn): a change that finds the actor's mailbox full is not lost but superseded, since
/// the next entry sends the whole state instead.
pub(crate) struct NodeReplica {
    actor: Addr<ClusterMsg>,
    /// Changes were dropped: the next call sends the whole state.
    behind: bool,
    /// The log's commit index at start: entries up to it are applied again, not new.
    replay_until: u64,
}

impl NodeReplica {
    pub(crate) fn new(actor: Addr<ClusterMsg>, replay_until: u64) -> Self {
        NodeReplica {
            actor,
            behind: false,
            replay_until,
        }
    }

    fn send_all(&mut self, state: &ClusterState, snapshot: bool) {
        self.behind = self
            .actor
            .try_send(ClusterMsg::Reset {
                index: state.summary().applied,
                all: state.as_changes(),
                snapshot,
            })
            .is_err();
    }
}

impl Replica for NodeReplica {
    fn changed(&mut self, index: u64, changes: Vec<Change>, _: &Output, state: &ClusterState) {
        if self.behind {
            self.send_all(state, false);
        } else if !changes.is_empty() {
            let replayed = index <= self.replay_until;
            let msg = ClusterMsg::Changed {
                index,
                changes,
                replayed,
            };
            self.behind = self.actor.try_send(msg).is_err();
        }
    }

    fn reset(&mut self, state: &ClusterState) {
        self.send_all(state, true);
    }
}
