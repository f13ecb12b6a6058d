//! How far each node is through with what it routed to the others: a moved session's
//! relay on its old node, and its new node's judgement of the move's cut, last until no
//! copy routed before the cut can still come (`routing::moving`). Time alone cannot say
//! so: a batch parked in a sender's outbox for a node cut off from it may come minutes
//! later.
//!
//! Outgoing: every tick, the actor asks each shard what it still holds for other nodes
//! (`RouterMsg::AskThrough`): the routes' index it routes under now, and per node the
//! oldest index of a copy it holds for it (to be sent, sent and not acknowledged, parked).
//! Once every shard answered a round, each other member is told the least of them for it
//! (`Through` frame): nothing routed to it before that index is still on its way. A node
//! acknowledges a batch only after its shards took it, so a copy that is no longer held
//! here was judged there.
//!
//! Incoming: the least index every other member said, told to the shards
//! (`RouterMsg::Through`). A member that said nothing yet (just joined, down, cut off,
//! or of a build without the frame) counts as 0: moves wait for it, within the shards'
//! bound.

use std::collections::BTreeMap;

use super::ClusterActor;
use crate::msg::RouterMsg;

/// A shard's answer: the routes' index it routes under, and the oldest index of a copy
/// held per node that has any older.
type Answer = (u64, Vec<(u64, u64)>);

/// The actor's state for it.
#[derive(Default)]
pub(super) struct Through {
    /// The round of questions to the shards under way.
    round: u64,
    /// Per shard: its answer to `round`.
    answers: Vec<Option<Answer>>,
    /// Per other node: the index it said last.
    heard: BTreeMap<u64, u64>,
    /// What the shards were told last.
    told: Option<u64>,
}

impl Through {
    /// Per node: the least index any shard still holds a copy for it under.
    fn least(&self, nodes: impl Iterator<Item = u64>) -> Option<Vec<(u64, u64)>> {
        let answers: Vec<&Answer> = self
            .answers
            .iter()
            .map(Option::as_ref)
            .collect::<Option<_>>()?;
        if answers.is_empty() {
            return None;
        }
        Some(
            nodes
                .map(|node| {
                    let at = answers
                        .iter()
                        .map(|(routes_at, oldest)| {
                            oldest
                                .iter()
                                .find(|(n, _)| *n == node)
                                .map_or(*routes_at, |(_, at)| *at)
                        })
                        .min()
                        .unwrap_or(0);
                    (node, at)
                })
                .collect(),
        )
    }
}

impl ClusterActor {
    /// Tells the other members how far this node is through, if every shard answered the
    /// last round, and asks the shards again.
    pub(super) fn through_tick(&mut self) {
        let others = self.members.keys().copied().filter(|n| *n != self.node);
        if let (Some(least), Some(links)) = (self.through.least(others), self.links.as_ref()) {
            for (node, at) in least {
                // Lost with a full or closed link: said again at the next tick.
                let _ = links.try_send(node, crate::forward::encode_through(at));
            }
        }
        let t = &mut self.through;
        t.round += 1;
        t.answers = vec![None; self.shards.count()];
        for shard in self.shards.all() {
            // A shard too busy to take it misses the round: the next tick asks again.
            let _ = shard.try_send(RouterMsg::AskThrough(t.round));
        }
    }

    /// Shard `shard`'s answer to round `round`.
    pub(super) fn shard_through(
        &mut self,
        shard: usize,
        round: u64,
        routes_at: u64,
        oldest: Vec<(u64, u64)>,
    ) {
        let t = &mut self.through;
        if round == t.round {
            if let Some(a) = t.answers.get_mut(shard) {
                *a = Some((routes_at, oldest));
            }
        }
    }

    /// Node `node` said it has nothing routed here before `at` on its way any more.
    pub(super) async fn through_heard(&mut self, node: u64, at: u64) {
        self.through.heard.insert(node, at);
        self.tell_through().await;
    }

    /// Tells the shards the least index the other members said, if it changed (members
    /// come and go as well).
    pub(super) async fn tell_through(&mut self) {
        // Not before the members are known: none would read as nothing to wait for.
        if self.members.is_empty() {
            return;
        }
        let t = &mut self.through;
        t.heard.retain(|n, _| self.members.contains_key(n));
        let least = self
            .members
            .keys()
            .filter(|n| **n != self.node)
            .map(|n| t.heard.get(n).copied().unwrap_or(0))
            .min()
            .unwrap_or(u64::MAX);
        if t.told == Some(least) {
            return;
        }
        t.told = Some(least);
        for shard in self.shards.all() {
            let _ = shard.send(RouterMsg::Through(least)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node is told the least index any shard holds a copy for it under; one shard that
    /// has not answered holds the round back.
    #[test]
    fn a_node_is_through_up_to_the_oldest_copy_any_shard_holds_for_it() {
        let mut t = Through {
            answers: vec![Some((20, vec![(2, 7)])), None],
            ..Through::default()
        };
        assert_eq!(t.least([2, 3].into_iter()), None);
        t.answers[1] = Some((18, vec![(3, 5), (2, 9)]));
        assert_eq!(t.least([2, 3].into_iter()), Some(vec![(2, 7), (3, 5)]));
        t.answers[1] = Some((18, Vec::new()));
        assert_eq!(
            t.least([2, 3, 4].into_iter()),
            Some(vec![(2, 7), (3, 18), (4, 18)])
        );
    }
}
