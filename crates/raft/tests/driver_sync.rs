//! The log's fsync runs outside the driver's turn: with the leader's sync held at a gate,
//! the driver still answers, steps its followers' acknowledgements and takes proposals, and
//! acknowledges none of them before its own sync is done; the proposals that queued up
//! meanwhile go into one raft proposal and are made durable by one more sync.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use starling_raft::{
    start, Config, Consistency, Disk, DiskLog, LocalNet, MemDisk, Node, RaftHandle, RequestId,
    StateMachine, Status, SyncWait,
};
use starling_rt::time;

/// Holds every sync started through `sync_later` while closed. A test fixture standing in
/// for a slow device, shared by the test and the disk's storage thread.
#[derive(Clone, Default)]
struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    fn set_closed(&self, closed: bool) {
        *self.0 .0.lock().unwrap() = closed;
        self.0 .1.notify_all();
    }

    fn pass(&self) {
        let mut closed = self.0 .0.lock().unwrap();
        while *closed {
            closed = self.0 .1.wait(closed).unwrap();
        }
    }
}

struct GatedDisk {
    inner: MemDisk,
    gate: Gate,
}

impl Disk for GatedDisk {
    fn list(&self) -> io::Result<Vec<String>> {
        self.inner.list()
    }
    fn read(&self, name: &str) -> io::Result<Vec<u8>> {
        self.inner.read(name)
    }
    fn create(&mut self, name: &str) -> io::Result<()> {
        self.inner.create(name)
    }
    fn append(&mut self, name: &str, data: &[u8]) -> io::Result<()> {
        self.inner.append(name, data)
    }
    fn sync(&mut self, name: &str) -> io::Result<()> {
        self.inner.sync(name)
    }
    fn sync_later(&mut self, name: &str) -> io::Result<Option<SyncWait>> {
        let wait = self.inner.sync_later(name)?;
        let gate = self.gate.clone();
        Ok(wait.map(|wait| -> SyncWait {
            Box::new(move || {
                gate.pass();
                wait()
            })
        }))
    }
    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        self.inner.truncate(name, len)
    }
    fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn remove(&mut self, name: &str) -> io::Result<()> {
        self.inner.remove(name)
    }
}

/// A register per key; the query "slow" takes 50 ms of the driver's turn.
#[derive(Default)]
struct Kv(BTreeMap<Vec<u8>, Vec<u8>>);

impl StateMachine for Kv {
    fn apply(&mut self, _index: u64, command: &[u8]) -> Vec<u8> {
        self.0.insert(command.to_vec(), command.to_vec());
        Vec::new()
    }
    async fn query(&self, q: &[u8]) -> Vec<u8> {
        if q == b"slow" {
            time::sleep(Duration::from_millis(50)).await;
        }
        self.0.get(q).cloned().unwrap_or_default()
    }
    fn snapshot(&self) -> Vec<u8> {
        Vec::new()
    }
    fn restore(&mut self, _s: &[u8]) -> Result<(), String> {
        Ok(())
    }
}

fn boot(net: &LocalNet, id: u64, gate: Gate) -> RaftHandle {
    let mut c = Config::new(id);
    c.initial_voters = vec![1, 2, 3];
    c.tick_interval = Duration::from_millis(20);
    c.request_timeout = Duration::from_secs(10);
    let disk = GatedDisk {
        inner: MemDisk::new(),
        gate,
    };
    let log = DiskLog::open(disk, c.log.clone()).unwrap();
    let node = Node::new(
        c.validate().unwrap(),
        log,
        Kv::default(),
        starling_rt::rng::rng(),
    )
    .unwrap();
    let h = start(node, net.transport());
    net.register(id, h.clone());
    h
}

fn propose(h: &RaftHandle, client_id: u64) -> tokio::task::JoinHandle<Vec<u8>> {
    let h = h.clone();
    starling_rt::spawn(async move {
        let id = RequestId { client_id, seq: 1 };
        h.propose(id, client_id.to_le_bytes().to_vec())
            .await
            .expect("proposal applied")
    })
}

/// Polls the leader's status until both followers acknowledged `index`.
async fn acked_by_followers(lh: &RaftHandle, leader: u64, index: u64) -> Status {
    let mut s = lh.status().await.unwrap();
    for _ in 0..300 {
        let acked = s
            .progress
            .iter()
            .filter(|(id, p)| **id != leader && p.matched >= index)
            .count();
        if acked == 2 {
            break;
        }
        time::sleep(Duration::from_millis(10)).await;
        s = time::timeout(Duration::from_secs(1), lh.status())
            .await
            .expect("the driver answers while its sync is pending")
            .unwrap();
    }
    s
}

#[test]
fn a_pending_sync_leaves_the_driver_serving_and_holds_the_acknowledgement() {
    starling_rt::Runtime::new(2).block_on(async {
        let net = LocalNet::new();
        let gates: Vec<Gate> = (0..3).map(|_| Gate::default()).collect();
        let hs: Vec<RaftHandle> = (1..=3)
            .map(|id| boot(&net, id, gates[id as usize - 1].clone()))
            .collect();
        let mut leader = None;
        for _ in 0..300 {
            time::sleep(Duration::from_millis(10)).await;
            if let Ok(s) = hs[0].status().await {
                if s.leader.is_some() {
                    leader = s.leader;
                    break;
                }
            }
        }
        let leader = leader.expect("a leader within 3 s");
        let lh = hs[(leader - 1) as usize].clone();
        propose(&lh, 1).await.unwrap();
        let before = lh.status().await.unwrap();
        let own = before.progress[&leader].matched;
        let (syncs, batches) = (
            lh.metrics().syncs.load(Ordering::Relaxed),
            lh.metrics().proposal_batches.load(Ordering::Relaxed),
        );

        gates[(leader - 1) as usize].set_closed(true);
        let mut pending = vec![propose(&lh, 100)];
        // Proposed on its own (and its sync started) before the others arrive.
        acked_by_followers(&lh, leader, own + 1).await;
        // While the driver is busy in one turn, twenty proposals queue up behind it.
        let slow = {
            let lh = lh.clone();
            starling_rt::spawn(async move { lh.read(b"slow".to_vec(), Consistency::Stale).await })
        };
        time::sleep(Duration::from_millis(10)).await;
        pending.extend((0..20).map(|c| propose(&lh, 200 + c)));
        slow.await.unwrap().unwrap();

        // The followers acknowledge all 21; the leader steps their answers while its own
        // sync waits, and applies nothing it has not made durable itself.
        let target = own + 21;
        let s = acked_by_followers(&lh, leader, target).await;
        assert_eq!(s.role, starling_raft::Role::Leader);
        for (id, p) in &s.progress {
            if *id != leader {
                assert!(p.matched >= target, "follower {id} acknowledged: {s:?}");
            }
        }
        assert_eq!(
            s.progress[&leader].matched, own,
            "the leader's own entries are not durable"
        );
        assert!(
            s.applied <= own,
            "nothing applied before the leader's sync: {s:?}"
        );
        assert!(
            pending.iter().all(|p| !p.is_finished()),
            "no proposal acknowledged"
        );
        let m = lh.metrics();
        assert_eq!(
            m.syncs.load(Ordering::Relaxed),
            syncs,
            "the sync is still held"
        );
        // One for the first proposal, and the twenty queued ones batched: one raft
        // proposal when they all queued within the busy turn, a few when a loaded machine
        // let the driver take a turn while they were still arriving (seen once in a full
        // parallel `cargo test`), never one each.
        let queued_batches = m.proposal_batches.load(Ordering::Relaxed) - batches - 1;
        assert!(
            (1..=4).contains(&queued_batches),
            "the twenty queued proposals went into {queued_batches} raft proposals"
        );

        gates[(leader - 1) as usize].set_closed(false);
        for p in pending {
            time::timeout(Duration::from_secs(5), p)
                .await
                .expect("answered once the sync is done")
                .unwrap();
        }
        let synced = m.syncs.load(Ordering::Relaxed) - syncs;
        assert!(
            synced <= 2,
            "one sync for the held proposal, one for all that queued behind it: {synced}"
        );
        for h in &hs {
            h.stop();
        }
    });
}
