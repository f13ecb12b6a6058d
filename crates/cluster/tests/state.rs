//! Properties of the replicated cluster state: the fencing epochs, snapshot and restore, the
//! change stream a node's replicas are built from, and the route book's convergence.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use starling_cluster::{
    decode, encode, Change, ClusterSm, ClusterState, Command, Member, NodeId, Output, Owner,
    Replica, RetainedMsg, RouteBook,
};
use starling_raft::StateMachine;

fn member(n: NodeId) -> Member {
    Member {
        mqtt: format!("127.0.0.1:{}", 1882 + n),
        cluster: format!("127.0.0.1:{}", 7000 + n),
        http: None,
    }
}

fn msg(tag: u8) -> RetainedMsg {
    RetainedMsg {
        payload: vec![tag],
        qos: tag % 3,
        properties: vec![],
        expires_at: None,
    }
}

const FILTERS: [&str; 5] = ["a", "a/+", "#", "b/c", "$SYS/#"];

/// A command over small domains, so that sequences collide often. Releases carry an epoch
/// that may be current or stale.
fn command() -> impl Strategy<Value = Command> {
    let node = 1u64..4;
    let client = (0u8..4).prop_map(|c| format!("c{c}"));
    prop_oneof![
        node.clone().prop_map(|n| Command::Join {
            node: n,
            member: member(n)
        }),
        node.clone().prop_map(|n| Command::Leave { node: n }),
        (client.clone(), node.clone()).prop_map(|(c, n)| Command::Claim {
            client_id: c,
            node: n
        }),
        (client, node.clone(), 0u64..12).prop_map(|(c, n, e)| Command::Release {
            client_id: c,
            owner: Owner { node: n, epoch: e },
        }),
        (
            node.clone(),
            proptest::collection::vec(0usize..5, 0..3),
            proptest::collection::vec(0usize..5, 0..3)
        )
            .prop_map(|(n, a, r)| Command::Routes {
                node: n,
                add: a.into_iter().map(|i| FILTERS[i].to_owned()).collect(),
                remove: r.into_iter().map(|i| FILTERS[i].to_owned()).collect(),
            }),
        (node, proptest::collection::vec(0usize..5, 0..4)).prop_map(|(n, f)| {
            Command::ResetRoutes {
                node: n,
                filters: f.into_iter().map(|i| FILTERS[i].to_owned()).collect(),
            }
        }),
        (0usize..3, proptest::option::of(0u8..4)).prop_map(|(t, m)| Command::Retain {
            topic: ["x", "x/y", "z"][t].to_owned(),
            message: m.map(msg),
        }),
        (0usize..2, 0u8..4, 1u64..4, proptest::option::of(1u32..3)).prop_map(|(f, c, n, l)| {
            Command::Hold {
                filter: FILTERS[f].to_owned(),
                client_id: format!("c{c}"),
                node: n,
                limit: l,
            }
        }),
        (0usize..2, 0u8..4, 1u64..4, any::<bool>()).prop_map(|(f, c, n, e)| Command::Unhold {
            filter: FILTERS[f].to_owned(),
            client_id: format!("c{c}"),
            node: n,
            exclusive: e,
        }),
        (1u64..4).prop_map(|n| Command::DropHolds { node: n }),
        (0u8..4, 1u64..4, 0u64..12).prop_map(|(c, n, e)| Command::Moved {
            client_id: format!("c{c}"),
            node: n,
            epoch: e,
        }),
    ]
}

fn commands() -> impl Strategy<Value = Vec<Command>> {
    proptest::collection::vec(
        prop_oneof![
            9 => command(),
            1 => proptest::collection::vec(command(), 0..4).prop_map(Command::Batch),
        ],
        0..60,
    )
}

/// What a node's replicas hold, rebuilt only from the change stream.
#[derive(Default, Debug, PartialEq, Eq)]
struct Mirror {
    members: BTreeMap<NodeId, Member>,
    /// Nodes whose record a change removed (and none brought back since).
    departed: BTreeSet<NodeId>,
    owners: BTreeMap<String, Owner>,
    routes: BTreeMap<String, Vec<NodeId>>,
    retained: BTreeMap<String, RetainedMsg>,
}

impl Mirror {
    fn take(&mut self, changes: Vec<Change>) {
        for c in changes {
            match c {
                Change::Member { node, member } => {
                    if member.is_some() {
                        self.departed.remove(&node);
                    } else {
                        self.departed.insert(node);
                    }
                    set(&mut self.members, node, member)
                }
                Change::Owner { client_id, owner } => set(&mut self.owners, client_id, owner),
                Change::Route { filter, nodes } => set(
                    &mut self.routes,
                    filter,
                    Some(nodes).filter(|n| !n.is_empty()),
                ),
                Change::Retained { topic, message } => set(&mut self.retained, topic, message),
                // A cut changes no state: nothing to mirror.
                Change::Moved { .. } => {}
            }
        }
    }

    fn of(state: &ClusterState) -> Mirror {
        let mut m = Mirror::default();
        m.take(state.as_changes());
        m
    }
}

fn set<K: Ord, V>(map: &mut BTreeMap<K, V>, k: K, v: Option<V>) {
    match v {
        Some(v) => map.insert(k, v),
        None => map.remove(&k),
    };
}

proptest! {
    /// Every claim's epoch is larger than any handed out before, and a release takes effect
    /// only with the current owner and epoch: a fenced node's late release changes nothing.
    #[test]
    fn epochs_fence(cmds in commands()) {
        let mut s = ClusterState::new();
        let mut last_epoch = 0;
        let mut changes = Vec::new();
        // Batches flattened: a batch applies its commands in order, as separate entries would.
        let flat = cmds.into_iter().flat_map(|c| match c {
            Command::Batch(b) => b,
            c => vec![c],
        });
        for (i, c) in flat.enumerate() {
            let before = match &c {
                Command::Release { client_id, .. } | Command::Claim { client_id, .. } => s.owner(client_id),
                _ => None,
            };
            let out = s.apply(i as u64 + 1, c.clone(), &mut changes);
            match (c, out) {
                (Command::Claim { client_id, node }, Output::Claimed { owner, previous }) => {
                    prop_assert!(owner.epoch > last_epoch);
                    last_epoch = owner.epoch;
                    prop_assert_eq!(owner.node, node);
                    prop_assert_eq!(previous, before);
                    prop_assert_eq!(s.owner(&client_id), Some(owner));
                }
                (Command::Claim { node, .. }, out) => {
                    prop_assert!(matches!(out, Output::Refused(_)));
                    prop_assert!(!s.members().contains_key(&node));
                }
                (Command::Release { client_id, owner }, Output::Released(r)) => {
                    prop_assert_eq!(r, before == Some(owner));
                    if r {
                        prop_assert_eq!(s.owner(&client_id), None);
                    } else {
                        prop_assert_eq!(s.owner(&client_id), before);
                    }
                }
                _ => {}
            }
        }
    }

    /// The change stream is complete: replicas built from it alone hold exactly the state.
    #[test]
    fn changes_rebuild_the_state(cmds in commands()) {
        let mut s = ClusterState::new();
        let mut mirror = Mirror::default();
        for (i, c) in cmds.into_iter().enumerate() {
            let mut changes = Vec::new();
            s.apply(i as u64 + 1, c, &mut changes);
            mirror.take(changes);
            prop_assert_eq!(&mirror, &Mirror::of(&s));
        }
    }

    /// Snapshot, restore, continue: the same state and outputs as never having stopped.
    #[test]
    fn snapshot_restore_continue(cmds in commands(), cut in 0usize..60) {
        let cut = cut.min(cmds.len());
        let mut a = ClusterSm::new(());
        for (i, c) in cmds[..cut].iter().enumerate() {
            a.apply(i as u64 + 1, &encode(c));
        }
        let mut b = ClusterSm::new(());
        b.restore(&a.snapshot()).unwrap();
        prop_assert_eq!(a.state(), b.state());
        for (i, c) in cmds[cut..].iter().enumerate() {
            let index = (cut + i) as u64 + 1;
            prop_assert_eq!(a.apply(index, &encode(c)), b.apply(index, &encode(c)));
        }
        prop_assert_eq!(a.snapshot(), b.snapshot());
    }

    /// Bytes that are not a command are refused, the same way on every replica, and change
    /// nothing.
    #[test]
    fn garbage_is_refused(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        let mut sm = ClusterSm::new(());
        let before = sm.snapshot();
        let out = sm.apply(1, &bytes);
        if decode::<Command>(&bytes).is_err() {
            prop_assert!(matches!(decode::<Output>(&out).unwrap(), Output::Refused(_)));
            prop_assert_eq!(sm.snapshot(), before);
        }
    }

    /// Whatever the interleaving of local subscriptions with batches that commit or fail,
    /// the book converges once batches stop failing, and the replicated routes then list
    /// this node for exactly its subscribed filters.
    #[test]
    fn route_book_converges(ops in proptest::collection::vec((0u8..4, 0usize..5), 0..80)) {
        let me = 2;
        let mut s = ClusterState::new();
        let mut index = 0;
        let mut apply = |s: &mut ClusterState, c: Command, book: &mut RouteBook| {
            index += 1;
            let mut changes = Vec::new();
            s.apply(index, c, &mut changes);
            for ch in changes {
                if let Change::Route { filter, nodes } = ch {
                    book.replicated(&filter, &nodes);
                }
            }
        };
        let mut book = RouteBook::new(me);
        apply(&mut s, Command::Join { node: me, member: member(me) }, &mut book);
        let mut local: BTreeMap<&str, u32> = BTreeMap::new();
        let mut in_flight = None;
        for (op, f) in ops {
            let filter = FILTERS[f];
            match op {
                0 => { book.subscribed(filter); *local.entry(filter).or_default() += 1; }
                1 => if local.get(filter).copied().unwrap_or(0) > 0 {
                    book.unsubscribed(filter);
                    *local.get_mut(filter).unwrap() -= 1;
                },
                2 => if in_flight.is_none() { in_flight = book.take_batch(); },
                _ => if let Some(c) = in_flight.take() {
                    // A batch whose outcome is unknown may or may not have committed.
                    let committed = f % 3 != 0;
                    if committed || f % 2 == 0 { apply(&mut s, c, &mut book); }
                    book.done(committed);
                },
            }
        }
        if let Some(c) = in_flight.take() {
            apply(&mut s, c, &mut book);
            book.done(true);
        }
        while let Some(c) = book.take_batch() {
            apply(&mut s, c, &mut book);
            book.done(true);
        }
        prop_assert!(book.converged());
        let want: BTreeSet<&str> = local.iter().filter(|(_, n)| **n > 0).map(|(f, _)| *f).collect();
        let have: BTreeSet<&str> = s.routes().filter(|(_, n)| n.contains(&me)).map(|(f, _)| f).collect();
        prop_assert_eq!(want, have);
    }
}

#[test]
fn a_node_that_left_owns_nothing_and_cannot_claim() {
    let mut s = ClusterState::new();
    let mut ch = Vec::new();
    s.apply(
        1,
        Command::Join {
            node: 1,
            member: member(1),
        },
        &mut ch,
    );
    s.apply(
        2,
        Command::Claim {
            client_id: "c".into(),
            node: 1,
        },
        &mut ch,
    );
    s.apply(
        3,
        Command::Routes {
            node: 1,
            add: vec!["a".into()],
            remove: vec![],
        },
        &mut ch,
    );
    s.apply(4, Command::Leave { node: 1 }, &mut ch);
    assert_eq!(s.owner("c"), None);
    assert_eq!(s.routes().count(), 0);
    let out = s.apply(
        5,
        Command::Claim {
            client_id: "c".into(),
            node: 1,
        },
        &mut ch,
    );
    assert!(matches!(out, Output::Refused(_)), "{out:?}");
}

/// The replica the adapter feeds sees every change, and a snapshot restore resets it.
#[test]
fn the_adapter_feeds_the_replica() {
    #[derive(Default)]
    struct Log(Vec<String>);
    impl Replica for Log {
        fn changed(&mut self, index: u64, changes: Vec<Change>, _: &Output, _: &ClusterState) {
            self.0.push(format!("{index}:{}", changes.len()));
        }
        fn reset(&mut self, s: &ClusterState) {
            self.0.push(format!("reset:{}", s.members().len()));
        }
    }
    let mut sm = ClusterSm::new(Log::default());
    sm.apply(
        1,
        &encode(&Command::Join {
            node: 1,
            member: member(1),
        }),
    );
    sm.apply(
        2,
        &encode(&Command::Join {
            node: 1,
            member: member(1),
        }),
    );
    sm.apply(
        3,
        &encode(&Command::Retain {
            topic: "t".into(),
            message: Some(msg(1)),
        }),
    );
    let snap = sm.snapshot();
    sm.restore(&snap).unwrap();
    assert_eq!(sm.replica().0, ["1:1", "3:1", "reset:1"]);
}

/// A snapshot says who left, so that a node restored from one taken after a `Leave` knows
/// the node departed (and, as leader, takes it out of raft's configuration); joining again
/// clears it. A snapshot of format 1, without it, still restores.
#[test]
fn a_snapshot_names_the_nodes_that_left() {
    let mut a = ClusterSm::new(());
    for (i, c) in [
        Command::Join {
            node: 1,
            member: member(1),
        },
        Command::Join {
            node: 2,
            member: member(2),
        },
        Command::Leave { node: 2 },
    ]
    .iter()
    .enumerate()
    {
        a.apply(i as u64 + 1, &encode(c));
    }
    let mut b = ClusterSm::new(());
    b.restore(&a.snapshot()).unwrap();
    assert_eq!(b.state().departed(), &BTreeSet::from([2]));
    assert!(b.state().as_changes().contains(&Change::Member {
        node: 2,
        member: None
    }));

    let old = encode(a.state());
    let mut c = ClusterSm::new(());
    c.restore(&old).unwrap();
    assert_eq!(c.state().members(), a.state().members());
    assert!(c.state().departed().is_empty());

    a.apply(
        4,
        &encode(&Command::Join {
            node: 2,
            member: member(2),
        }),
    );
    assert!(a.state().departed().is_empty());
    // With nobody departed, format 1: what an older build restores.
    assert_eq!(a.snapshot(), encode(a.state()));
}
