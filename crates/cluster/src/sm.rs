//! The cluster state as starling-raft's [`StateMachine`]: commands decoded from the log,
//! applied, and what they changed handed to the node's [`Replica`].

use starling_raft::StateMachine;
use starling_router::filter_matches;

use std::collections::BTreeSet;

use crate::command::{decode, encode, Answer, Command, NodeId, Output, Query};
use crate::state::{Change, ClusterState};

/// The snapshot's version byte once a node has left: then the state as format 1 has it
/// (postcard), then the ids of the nodes that left. A build without it refuses such a
/// snapshot by this byte.
const SNAPSHOT_V2: u8 = 2;

/// Where a node learns what the log changed: its forwarding table, retained index and
/// sessions. Called on the raft driver's turn, so it must not wait; it is told every change
/// in apply order, or, after a snapshot, given the whole state again.
pub trait Replica: Send + 'static {
    /// What the entry at `index` changed (nothing is called for entries that changed
    /// nothing), with the command's output and the state after it (a replica that could
    /// not pass changes on may rebuild from it instead).
    fn changed(&mut self, index: u64, changes: Vec<Change>, output: &Output, state: &ClusterState);

    /// The state was replaced by a snapshot; rebuild from it.
    fn reset(&mut self, state: &ClusterState);
}

/// A replica that keeps nothing (a node that only votes, and tests).
impl Replica for () {
    fn changed(&mut self, _: u64, _: Vec<Change>, _: &Output, _: &ClusterState) {}
    fn reset(&mut self, _: &ClusterState) {}
}

/// The state machine of the cluster's raft group.
pub struct ClusterSm<R: Replica> {
    state: ClusterState,
    replica: R,
}

impl<R: Replica> ClusterSm<R> {
    pub fn new(replica: R) -> Self {
        ClusterSm {
            state: ClusterState::new(),
            replica,
        }
    }

    pub fn state(&self) -> &ClusterState {
        &self.state
    }

    pub fn replica(&self) -> &R {
        &self.replica
    }
}

impl<R: Replica> StateMachine for ClusterSm<R> {
    fn apply(&mut self, index: u64, command: &[u8]) -> Vec<u8> {
        let output = match decode::<Command>(command) {
            Ok(c) => {
                let mut changes = Vec::new();
                let out = self.state.apply(index, c, &mut changes);
                if !changes.is_empty() || matches!(out, Output::Claimed { .. }) {
                    self.replica.changed(index, changes, &out, &self.state);
                }
                out
            }
            // Every replica refuses the same bytes the same way: still deterministic.
            Err(e) => Output::Refused(format!("undecodable command: {e}")),
        };
        encode(&output)
    }

    fn query(&self, query: &[u8]) -> impl std::future::Future<Output = Vec<u8>> + Send {
        // Answered before the future is made: the future then holds no borrow of the
        // replica, which need not be `Sync`.
        let answer = match decode::<Query>(query) {
            Ok(q) => self.state.query(&q, filter_matches),
            Err(e) => Answer::Refused(format!("undecodable query: {e}")),
        };
        std::future::ready(encode(&answer))
    }

    fn snapshot(&self) -> Vec<u8> {
        if self.state.departed.is_empty() {
            // What a build without format 2 can restore, as long as nobody left.
            return encode(&self.state);
        }
        let mut out = vec![SNAPSHOT_V2];
        // postcard fails only on a writer error or an unsupported type; neither here.
        let body = postcard::to_stdvec(&(&self.state, &self.state.departed))
            .expect("the cluster state serializes");
        out.extend(body);
        out
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        let bad = |e: &dyn std::fmt::Display| format!("cluster snapshot: {e}");
        self.state = match snapshot.split_first() {
            Some((&SNAPSHOT_V2, body)) => {
                let (mut state, departed): (ClusterState, BTreeSet<NodeId>) =
                    postcard::from_bytes(body).map_err(|e| bad(&e))?;
                state.departed = departed;
                state
            }
            // Format 1 (an older build's): who left is not in it.
            _ => decode(snapshot).map_err(|e| bad(&e))?,
        };
        self.replica.reset(&self.state);
        Ok(())
    }
}
