//! A node that left the cluster: what a shard still holds for it can never be delivered.

use starling_store::Op;
use tracing::info;

use super::RouterActor;
use crate::destination::{remote_key, Destination, Park};
use crate::metrics::add;
use crate::msg::Stored;

impl RouterActor {
    /// `node`'s `Leave` was applied while this node ran: its link goes. Publishers still
    /// waiting for it hear that their messages are not confirmed; batches parked for it,
    /// and those an earlier run parked, were acknowledged to their publishers as safe:
    /// their rows go and their messages count as lost (`cluster.outbox.lost`), instead of
    /// being sent every second for ever to a node that is not coming back (its clients
    /// were sent to other nodes as it left, their sessions with them).
    pub(super) fn node_left(&mut self, node: u64) {
        let key = remote_key(node);
        let Some(Destination::Remote(r)) = self.destinations.remove(&key) else {
            return;
        };
        self.remote_nodes.retain(|n| *n != node);
        self.dirty.retain(|k| *k != key);
        let mut unconfirmed: Vec<u64> = r.pending.iter().filter_map(|(_, k, _, _)| *k).collect();
        unconfirmed.extend(r.lost.iter().copied());
        let mut lost = 0u64;
        let mut rows = Vec::new();
        for u in &r.unacked {
            match u.park {
                Park::No => unconfirmed.extend(u.keys.iter().copied()),
                // Its row may still be written: the drop goes after it, in order.
                Park::Writing => {
                    unconfirmed.extend(u.keys.iter().copied());
                    rows.push((r.inc, u.seq));
                }
                Park::Parked => {
                    lost += u.messages.len() as u64;
                    rows.push((r.inc, u.seq));
                }
                // Kept in memory without a store (`RemoteNode::give_up_late`): what is
                // left of its keys are copies forwarded on, acknowledged upstream.
                Park::Unbacked => {
                    if !u.keys.is_empty() {
                        lost += u.messages.len() as u64;
                    }
                    unconfirmed.extend(u.keys.iter().copied());
                }
            }
        }
        for rep in &r.replay {
            if !rep.dropping {
                lost += u64::from(rep.batch.messages);
            }
            rows.push((rep.batch.inc, rep.batch.seq));
        }
        rows.extend(r.replay_gone.iter().copied());
        if lost > 0 || !unconfirmed.is_empty() {
            info!(
                node,
                lost,
                unconfirmed = unconfirmed.len(),
                "a node left the cluster: what was on its way there is given up"
            );
        }
        add(&self.shared.metrics.cluster_outbox_lost, lost);
        for (inc, seq) in rows {
            self.to_store.push(Op::DropOutbox { node, inc, seq }.into());
        }
        let holding = r.holding;
        self.release(holding, super::link::window_id(node));
        for k in unconfirmed {
            self.forward_settled(k, Some(Stored::Unconfirmed));
        }
    }
}

impl RouterActor {
    /// `gone` left the cluster, as this node's log has it and the members read through the
    /// leader after its start confirm: batches an earlier run parked for them can never be
    /// delivered. Their `Leave`, replayed from this node's own log, dropped nothing (that
    /// node might have joined again since), so their rows go now, counted lost. Only the
    /// restored rows: the node's destination and routes stay, so that a node that joins
    /// again between the read and this message loses nothing routed to it.
    pub(super) fn departed_while_down(&mut self, gone: &[u64]) {
        let mut lost = 0u64;
        let mut rows = Vec::new();
        for node in self.remote_nodes.iter().filter(|n| gone.contains(n)) {
            let Some(Destination::Remote(r)) = self.destinations.get_mut(&remote_key(*node)) else {
                continue;
            };
            if r.replay.is_empty() && r.replay_gone.is_empty() {
                continue;
            }
            let mut messages = 0u64;
            for rep in r.replay.drain(..) {
                if !rep.dropping {
                    messages += u64::from(rep.batch.messages);
                }
                rows.push((*node, rep.batch.inc, rep.batch.seq));
            }
            rows.extend(r.replay_gone.drain(..).map(|(inc, seq)| (*node, inc, seq)));
            info!(
                node,
                lost = messages,
                "a node that left the cluster: what an earlier run parked for it is given up"
            );
            lost += messages;
        }
        add(&self.shared.metrics.cluster_outbox_lost, lost);
        for (node, inc, seq) in rows {
            self.to_store.push(Op::DropOutbox { node, inc, seq }.into());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use starling_store::{Op, OutboxBatch};

    use crate::destination::{remote_key, Destination, Park, RemoteNode, Replay, Unacked};
    use crate::msg::StoreOp;
    use crate::routing::testkit::{message, shard};
    use crate::routing::RouterActor;

    fn unacked(seq: u64, n: usize, park: Park) -> Unacked {
        let now = starling_rt::time::now();
        Unacked {
            seq,
            sent_at: now,
            last_sent: now,
            keys: Vec::new(),
            messages: vec![(message(), None); n],
            routed_at: 0,
            park,
            held: false,
        }
    }

    /// A batch an earlier run (incarnation 5) parked for `node`.
    fn replay(node: u64, seq: u64, messages: u32) -> Replay {
        Replay {
            batch: OutboxBatch {
                node,
                shard: 0,
                inc: 5,
                seq,
                parked_ms: 0,
                messages,
                map_seed: 0,
                shards: 1,
                frame: Vec::new(),
            },
            sent: None,
            dropping: false,
        }
    }

    /// The rows the shard drops, as (node, incarnation, batch).
    fn drops(shard: &RouterActor) -> Vec<(u64, u64, u64)> {
        shard
            .to_store
            .iter()
            .filter_map(|op| match op {
                StoreOp::Op(o) => match &**o {
                    Op::DropOutbox { node, inc, seq } => Some((*node, *inc, *seq)),
                    _ => None,
                },
                _ => None,
            })
            .collect()
    }

    /// Rows parked for a node that left go, counted lost; its link's state goes with them;
    /// a batch in the window (its publishers not yet told) and one the store refused have
    /// no row to drop.
    #[test]
    fn a_node_that_left_takes_its_parked_batches_with_it() {
        let (shared, mut shard) = shard();
        let mut r = RemoteNode::new(7, starling_raft::DataLinks::default(), 9);
        r.replay.push_back(replay(7, 4, 3));
        r.unacked.push_back(unacked(1, 2, Park::Parked));
        r.unacked.push_back(unacked(2, 4, Park::Unbacked));
        r.unacked.push_back(unacked(3, 1, Park::Writing));
        r.unacked.push_back(unacked(4, 6, Park::No));
        shard
            .destinations
            .insert(remote_key(7), Destination::Remote(r));
        shard.remote_nodes.push(7);

        shard.node_left(8);
        assert!(
            shard.to_store.is_empty(),
            "another node's leave changes nothing"
        );
        shard.node_left(7);

        assert!(!shard.destinations.contains_key(&remote_key(7)));
        assert!(shard.remote_nodes.is_empty());
        assert_eq!(drops(&shard), vec![(7, 9, 1), (7, 9, 3), (7, 5, 4)]);
        // Told safe: the parked batch's 2 and the replay's 3.
        assert_eq!(
            shared.metrics.cluster_outbox_lost.load(Ordering::Relaxed),
            5
        );
    }

    /// After a restart, a node whose `Leave` was replayed and that the members read through
    /// the leader do not include: its restored rows go; another node's stay.
    #[test]
    fn rows_restored_for_a_departed_node_go_once_the_members_are_read() {
        let (shared, mut shard) = shard();
        for node in [7, 8] {
            let mut r = RemoteNode::new(node, starling_raft::DataLinks::default(), 9);
            r.replay.push_back(replay(node, 1, 2));
            shard
                .destinations
                .insert(remote_key(node), Destination::Remote(r));
            shard.remote_nodes.push(node);
        }

        shard.departed_while_down(&[7]);

        let replays = |shard: &RouterActor, node| match shard.destinations.get(&remote_key(node)) {
            Some(Destination::Remote(r)) => r.replay.len(),
            _ => panic!("node {node}'s destination stays"),
        };
        assert_eq!(replays(&shard, 7), 0, "the departed node's rows go");
        assert_eq!(replays(&shard, 8), 1, "a member's rows stay");
        assert_eq!(drops(&shard), vec![(7, 5, 1)]);
        assert_eq!(
            shared.metrics.cluster_outbox_lost.load(Ordering::Relaxed),
            2
        );
        shard.departed_while_down(&[7]);
        assert_eq!(shard.to_store.len(), 1, "read again: nothing more goes");
    }
}
