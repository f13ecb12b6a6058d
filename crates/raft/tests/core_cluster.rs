//! The sans-IO core on three in-memory replicas: effects are moved between nodes by hand and
//! time advances by ticks, so every test is deterministic and instant.

use std::collections::{BTreeMap, BTreeSet};

use rand::SeedableRng;
use starling_raft::{
    Config, Crash, DiskLog, Effect, MemDisk, Membership, Node, RequestError, RequestId, Role,
    StateMachine,
};

/// A register per key: commands are `key=value`, queries are `key`.
#[derive(Default, Clone)]
struct Kv {
    map: BTreeMap<String, String>,
    applied: u64,
}

impl StateMachine for Kv {
    fn apply(&mut self, index: u64, command: &[u8]) -> Vec<u8> {
        assert!(index > self.applied, "apply goes forward");
        self.applied = index;
        let s = String::from_utf8_lossy(command);
        let (k, v) = s.split_once('=').unwrap_or((&s, ""));
        self.map
            .insert(k.to_string(), v.to_string())
            .unwrap_or_default()
            .into_bytes()
    }
    async fn query(&self, q: &[u8]) -> Vec<u8> {
        self.map
            .get(&*String::from_utf8_lossy(q))
            .cloned()
            .unwrap_or_default()
            .into_bytes()
    }
    fn snapshot(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (k, v) in &self.map {
            out.extend_from_slice(format!("{k}={v}\n").as_bytes());
        }
        out
    }
    fn restore(&mut self, s: &[u8]) -> Result<(), String> {
        self.map.clear();
        for line in String::from_utf8_lossy(s).lines() {
            let (k, v) = line.split_once('=').ok_or("bad line")?;
            self.map.insert(k.into(), v.into());
        }
        Ok(())
    }
}

type N = Node<DiskLog<MemDisk>, Kv>;

struct Cluster {
    nodes: BTreeMap<u64, Option<N>>,
    disks: BTreeMap<u64, MemDisk>,
    down: BTreeSet<u64>,
    applied: Vec<(u64, RequestId, Result<Vec<u8>, RequestError>)>,
    reads: Vec<(u64, u64)>,
    changes: Vec<u64>,
    seed: u64,
    snapshot_threshold: u64,
}

fn config(id: u64, voters: &[u64], snapshot_threshold: u64) -> starling_raft::ValidConfig {
    let mut c = Config::new(id);
    c.initial_voters = voters.to_vec();
    c.snapshot_threshold = snapshot_threshold;
    c.log.segment_bytes_max = 512;
    c.validate().unwrap()
}

impl Cluster {
    fn new(ids: &[u64], snapshot_threshold: u64) -> Self {
        let mut c = Cluster {
            nodes: BTreeMap::new(),
            disks: BTreeMap::new(),
            down: BTreeSet::new(),
            applied: vec![],
            reads: vec![],
            changes: vec![],
            seed: 1,
            snapshot_threshold,
        };
        for &id in ids {
            c.disks.insert(id, MemDisk::new());
            c.start(id, ids);
        }
        c
    }

    fn start(&mut self, id: u64, voters: &[u64]) {
        let disk = self.disks.entry(id).or_default().clone();
        let log = DiskLog::open(disk, Default::default()).unwrap();
        self.seed += 1;
        let rng = starling_rt::rng::Rng::seed_from_u64(self.seed);
        let n = Node::new(
            config(id, voters, self.snapshot_threshold),
            log,
            Kv::default(),
            rng,
        )
        .unwrap();
        self.nodes.insert(id, Some(n));
    }

    fn crash(&mut self, id: u64, torn_seed: u64) {
        self.nodes.insert(id, None);
        self.disks[&id].crash(Crash::Torn { seed: torn_seed });
    }

    fn node(&mut self, id: u64) -> &mut N {
        self.nodes.get_mut(&id).unwrap().as_mut().unwrap()
    }

    /// Runs every node's ready/apply and delivers messages until quiet.
    fn settle(&mut self) {
        for _ in 0..100 {
            let mut msgs = vec![];
            let mut synced = false;
            for (&id, n) in self.nodes.iter_mut() {
                let Some(n) = n else { continue };
                n.handle_ready().unwrap();
                while n.apply_committed(64).unwrap() > 0 {}
                n.handle_ready().unwrap();
                while let Some(e) = n.poll_effect() {
                    match e {
                        Effect::Send(m) => msgs.push(m),
                        Effect::Applied {
                            id: rid, result, ..
                        } => self.applied.push((id, rid, result)),
                        Effect::ReadReady { token } => self.reads.push((id, token)),
                        Effect::MembershipChanged { token, .. } => self.changes.push(token),
                        Effect::LeaderChanged { .. } => {}
                        // Synced at once: what it releases is handled in the next round.
                        Effect::Sync(job) => {
                            n.on_synced(job.run()).unwrap();
                            synced = true;
                        }
                    }
                }
            }
            if msgs.is_empty() && !synced {
                return;
            }
            for m in msgs {
                if self.down.contains(&m.to) || self.down.contains(&m.from) {
                    continue;
                }
                if let Some(Some(n)) = self.nodes.get_mut(&m.to) {
                    n.step(m);
                }
            }
        }
    }

    fn tick(&mut self, n: usize) {
        for _ in 0..n {
            for node in self.nodes.values_mut().flatten() {
                node.tick();
            }
            self.settle();
        }
    }

    fn leader(&mut self) -> Option<u64> {
        let leaders: Vec<u64> = self
            .nodes
            .values()
            .flatten()
            .filter(|n| n.is_leader() && !self.down.contains(&n.id()))
            .map(|n| n.id())
            .collect();
        leaders.last().copied()
    }

    fn state(&mut self, id: u64) -> BTreeMap<String, String> {
        self.node(id).state_machine().map.clone()
    }
}

fn rid(client_id: u64, seq: u64) -> RequestId {
    RequestId { client_id, seq }
}

#[test]
fn three_nodes_elect_one_leader_and_replicate() {
    let mut c = Cluster::new(&[1, 2, 3], 10_000);
    c.tick(40);
    let l = c.leader().expect("a leader");
    let leaders = c.nodes.values().flatten().filter(|n| n.is_leader()).count();
    assert_eq!(leaders, 1);
    for i in 0..10 {
        c.node(l)
            .propose(rid(9, i + 1), format!("k{i}=v{i}").as_bytes())
            .unwrap();
    }
    c.settle();
    c.tick(3);
    for id in [1, 2, 3] {
        assert_eq!(c.state(id).len(), 10, "node {id}");
    }
    assert!(c.applied.iter().all(|(_, _, r)| r.is_ok()));
}

#[test]
fn proposal_on_a_follower_is_forwarded_and_applied() {
    let mut c = Cluster::new(&[1, 2, 3], 10_000);
    c.tick(40);
    let l = c.leader().unwrap();
    let f = [1, 2, 3].into_iter().find(|&i| i != l).unwrap();
    c.node(f).propose(rid(5, 1), b"a=1").unwrap();
    c.settle();
    c.tick(3);
    assert!(c.applied.iter().any(|(n, r, _)| *n == f && *r == rid(5, 1)));
    assert_eq!(c.state(l)["a"], "1");
}

#[test]
fn retried_proposal_is_applied_once() {
    let mut c = Cluster::new(&[1, 2, 3], 10_000);
    c.tick(40);
    let l = c.leader().unwrap();
    c.node(l).propose(rid(1, 1), b"x=first").unwrap();
    c.node(l).propose(rid(1, 1), b"x=first").unwrap();
    c.node(l).propose(rid(1, 2), b"x=second").unwrap();
    // A late retry of an older request must not overwrite the newer value.
    c.node(l).propose(rid(1, 1), b"x=first").unwrap();
    c.settle();
    c.tick(3);
    assert_eq!(c.state(l)["x"], "second");
    let outcomes: Vec<_> = c
        .applied
        .iter()
        .filter(|(n, _, _)| *n == l)
        .map(|(_, r, res)| (r.seq, res.clone()))
        .collect();
    assert_eq!(outcomes[0], (1, Ok(vec![])));
    assert_eq!(
        outcomes[1],
        (1, Ok(vec![])),
        "duplicate answers like the first"
    );
    assert!(matches!(
        outcomes[3].1,
        Err(RequestError::Superseded { .. })
    ));
}

#[test]
fn read_index_is_answered_after_apply_on_leader_and_follower() {
    let mut c = Cluster::new(&[1, 2, 3], 10_000);
    c.tick(40);
    let l = c.leader().unwrap();
    let f = [1, 2, 3].into_iter().find(|&i| i != l).unwrap();
    c.node(l).propose(rid(2, 1), b"r=1").unwrap();
    c.settle();
    c.node(l).read_index(77);
    c.node(f).read_index(78);
    c.settle();
    c.tick(2);
    assert!(c.reads.contains(&(l, 77)));
    assert!(c.reads.contains(&(f, 78)));
    assert_eq!(c.state(f)["r"], "1");
}

#[test]
fn committed_entries_survive_crash_of_every_node_with_torn_tails() {
    let mut c = Cluster::new(&[1, 2, 3], 7);
    c.tick(40);
    let l = c.leader().unwrap();
    for i in 0..30 {
        c.node(l)
            .propose(rid(3, i + 1), format!("k{i}={i}").as_bytes())
            .unwrap();
        c.settle();
    }
    c.tick(3);
    let committed = c.state(l);
    for (seed, id) in [(11, 1), (12, 2), (13, 3)] {
        c.crash(id, seed);
    }
    for id in [1, 2, 3] {
        c.start(id, &[1, 2, 3]);
    }
    c.tick(60);
    let l = c.leader().expect("a leader after restarting all");
    c.node(l).propose(rid(3, 100), b"after=1").unwrap();
    c.settle();
    c.tick(3);
    for id in [1, 2, 3] {
        let s = c.state(id);
        for (k, v) in &committed {
            assert_eq!(s.get(k), Some(v), "node {id} lost {k}");
        }
        assert_eq!(s["after"], "1");
    }
}

#[test]
fn node_outside_initial_membership_never_elects_itself_and_joins_by_snapshot() {
    let mut c = Cluster::new(&[1, 2, 3], 5);
    c.disks.insert(4, MemDisk::new());
    // Node 4 starts with an empty log and is not in the initial membership.
    c.start(4, &[1, 2, 3]);
    c.tick(40);
    assert!(!c.node(4).is_leader());
    assert_eq!(c.node(4).status().role, Role::Follower);
    let l = c.leader().unwrap();
    assert_ne!(l, 4);
    for i in 0..20 {
        c.node(l)
            .propose(rid(4, i + 1), format!("j{i}={i}").as_bytes())
            .unwrap();
        c.settle();
    }
    // Alone (everyone else down), node 4 still never elects itself.
    let mut solo = Cluster::new(&[], 5);
    solo.disks.insert(9, MemDisk::new());
    solo.start(9, &[1, 2, 3]);
    solo.tick(100);
    assert!(!solo.node(9).is_leader());

    c.node(l)
        .change_membership(500, Membership::AddLearner(4))
        .unwrap();
    c.settle();
    c.tick(5);
    assert!(c.changes.contains(&500));
    assert_eq!(
        c.state(4).len(),
        20,
        "learner caught up through the snapshot"
    );
    c.node(l)
        .change_membership(501, Membership::AddVoter(4))
        .unwrap();
    c.settle();
    c.tick(5);
    assert!(c.changes.contains(&501));
    assert!(c.node(l).status().voters.contains(&4));
    let st = c.node(l).status();
    assert_eq!(st.progress.len(), 4);
    assert!(st.progress[&4].matched >= st.commit - 1);
}

#[test]
fn leadership_transfers_on_request() {
    let mut c = Cluster::new(&[1, 2, 3], 10_000);
    c.tick(40);
    let l = c.leader().unwrap();
    let to = [1, 2, 3].into_iter().find(|&i| i != l).unwrap();
    c.node(l).transfer_leader(to);
    c.settle();
    c.tick(3);
    assert_eq!(c.leader(), Some(to));
}

#[test]
fn same_seed_gives_same_election() {
    let run = || {
        let mut c = Cluster::new(&[1, 2, 3], 10_000);
        c.tick(40);
        (c.leader(), c.node(1).term())
    };
    assert_eq!(run(), run());
}
