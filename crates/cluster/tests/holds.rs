//! `$exclusive/` and `$limit/N/` counted cluster-wide: the replicated holds against a naive
//! model, over random sequences of holds, releases, restarts and departures from three
//! nodes' clients.

use std::collections::BTreeMap;

use proptest::prelude::*;
use starling_cluster::{ClusterState, Command, Member, NodeId, Output};

fn member(n: NodeId) -> Member {
    Member {
        mqtt: format!("127.0.0.1:{}", 1882 + n),
        cluster: format!("127.0.0.1:{}", 7000 + n),
        http: None,
    }
}

/// The naive model: per filter, the exclusive holder and the limited holders, each client
/// with its node.
#[derive(Default)]
struct Model {
    exclusive: BTreeMap<String, (String, NodeId)>,
    limited: BTreeMap<String, BTreeMap<String, NodeId>>,
    members: Vec<NodeId>,
}

impl Model {
    fn apply(&mut self, c: &Command) -> Option<bool> {
        match c {
            Command::Join { node, .. } => {
                if !self.members.contains(node) {
                    self.members.push(*node);
                }
                None
            }
            Command::Leave { node } => {
                self.members.retain(|n| n != node);
                self.drop_node(*node);
                None
            }
            Command::DropHolds { node } => {
                self.drop_node(*node);
                None
            }
            Command::Hold {
                filter,
                client_id,
                node,
                limit,
            } => {
                if !self.members.contains(node) {
                    return None;
                }
                Some(match limit {
                    None => match self.exclusive.get(filter) {
                        Some((c, _)) if c != client_id => false,
                        _ => {
                            self.exclusive
                                .insert(filter.clone(), (client_id.clone(), *node));
                            true
                        }
                    },
                    Some(max) => {
                        let l = self.limited.entry(filter.clone()).or_default();
                        let ok = l.contains_key(client_id) || l.len() < *max as usize;
                        if ok {
                            l.insert(client_id.clone(), *node);
                        }
                        ok
                    }
                })
            }
            Command::Unhold {
                filter,
                client_id,
                node,
                exclusive,
            } => {
                if *exclusive {
                    if self.exclusive.get(filter) == Some(&(client_id.clone(), *node)) {
                        self.exclusive.remove(filter);
                    }
                } else if let Some(l) = self.limited.get_mut(filter) {
                    if l.get(client_id) == Some(node) {
                        l.remove(client_id);
                    }
                }
                None
            }
            _ => None,
        }
    }

    fn drop_node(&mut self, node: NodeId) {
        self.exclusive.retain(|_, (_, n)| *n != node);
        for l in self.limited.values_mut() {
            l.retain(|_, n| *n != node);
        }
    }
}

fn command() -> impl Strategy<Value = Command> {
    let node = 1u64..4;
    let client = (0u8..5).prop_map(|c| format!("c{c}"));
    let filter = (0usize..2).prop_map(|f| ["a/b", "x/+"][f].to_owned());
    prop_oneof![
        1 => node.clone().prop_map(|n| Command::Join { node: n, member: member(n) }),
        1 => node.clone().prop_map(|n| Command::Leave { node: n }),
        1 => node.clone().prop_map(|n| Command::DropHolds { node: n }),
        6 => (filter.clone(), client.clone(), node.clone(), proptest::option::of(1u32..4))
            .prop_map(|(filter, client_id, node, limit)| Command::Hold {
                filter,
                client_id,
                node,
                limit,
            }),
        4 => (filter, client, node, any::<bool>()).prop_map(
            |(filter, client_id, node, exclusive)| Command::Unhold {
                filter,
                client_id,
                node,
                exclusive,
            }
        ),
    ]
}

proptest! {
    /// Each hold is granted exactly when the model grants it, and what the state reports
    /// holding is what the model holds: never two exclusive holders, never more limited
    /// holders than the limit each was granted under.
    #[test]
    fn holds_follow_the_model(
        commands in proptest::collection::vec(command(), 0..80),
    ) {
        let mut s = ClusterState::new();
        let mut model = Model::default();
        let mut changes = Vec::new();
        for (i, c) in commands.into_iter().enumerate() {
            let want = model.apply(&c);
            let out = s.apply(i as u64 + 1, c.clone(), &mut changes);
            match want {
                Some(granted) => prop_assert_eq!(&out, &Output::Held(granted), "{:?}", c),
                None => prop_assert!(!matches!(out, Output::Held(_)), "{:?} gave {:?}", c, out),
            }
            for f in ["a/b", "x/+"] {
                let (ex, lim) = s.holders(f);
                let want_ex = model.exclusive.get(f).map(|(c, n)| (c.as_str(), *n));
                prop_assert_eq!(ex, want_ex);
                let want_lim: Vec<(&str, NodeId)> = model
                    .limited
                    .get(f)
                    .map(|l| l.iter().map(|(c, n)| (c.as_str(), *n)).collect())
                    .unwrap_or_default();
                prop_assert_eq!(lim, want_lim);
            }
        }
    }
}

/// A state whose members are nodes 1, 2 and 3 (entries 1-3), and the changes' buffer.
fn three_members() -> (ClusterState, Vec<starling_cluster::Change>) {
    let mut s = ClusterState::new();
    let mut ch = Vec::new();
    for n in 1..=3 {
        s.apply(
            n,
            Command::Join {
                node: n,
                member: member(n),
            },
            &mut ch,
        );
    }
    (s, ch)
}

#[test]
fn an_exclusive_filter_has_one_holder_cluster_wide_and_moves_with_its_client() {
    let (mut s, mut ch) = three_members();
    let hold = |client: &str, node| Command::Hold {
        filter: "a/b".into(),
        client_id: client.into(),
        node,
        limit: None,
    };
    assert_eq!(s.apply(4, hold("c1", 2), &mut ch), Output::Held(true));
    assert_eq!(s.apply(5, hold("c2", 3), &mut ch), Output::Held(false));
    // c1's session moved to node 3: it holds from there, and node 2's late release of it
    // changes nothing.
    assert_eq!(s.apply(6, hold("c1", 3), &mut ch), Output::Held(true));
    let unhold = |client: &str, node| Command::Unhold {
        filter: "a/b".into(),
        client_id: client.into(),
        node,
        exclusive: true,
    };
    s.apply(7, unhold("c1", 2), &mut ch);
    assert_eq!(s.holders("a/b").0, Some(("c1", 3)));
    assert_eq!(s.apply(8, hold("c2", 1), &mut ch), Output::Held(false));
    // Node 3 restarts: its clients' holds from before are gone.
    s.apply(9, Command::DropHolds { node: 3 }, &mut ch);
    assert_eq!(s.apply(10, hold("c2", 1), &mut ch), Output::Held(true));
}

#[test]
fn a_limited_filter_grants_up_to_its_limit_across_nodes() {
    let (mut s, mut ch) = three_members();
    let hold = |client: &str, node| Command::Hold {
        filter: "x/+".into(),
        client_id: client.into(),
        node,
        limit: Some(2),
    };
    assert_eq!(s.apply(4, hold("a", 1), &mut ch), Output::Held(true));
    assert_eq!(s.apply(5, hold("b", 2), &mut ch), Output::Held(true));
    assert_eq!(s.apply(6, hold("c", 3), &mut ch), Output::Held(false));
    // Holding again is no new holder.
    assert_eq!(s.apply(7, hold("a", 1), &mut ch), Output::Held(true));
    s.apply(8, Command::Leave { node: 2 }, &mut ch);
    assert_eq!(s.apply(9, hold("c", 3), &mut ch), Output::Held(true));
}
