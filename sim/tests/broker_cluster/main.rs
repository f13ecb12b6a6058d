//! MQTT clients against a cluster of three real broker nodes (`starling_broker::Broker` with
//! `cluster.enabled`, raft and forwarded publishes over the production QUIC endpoint with
//! mutual TLS) while a nemesis partitions a random node or the leader, cuts links both ways
//! or one way, and delays packets, then heals.
//!
//! Setup: certificates from one cluster CA written as `starling cert cluster` writes them
//! (`starling_raft::certs::issue_node`) into the directory `cluster.certs_dir` names; each
//! node's raft log in its own `node.data_dir` (real files on tmpfs: the sim's file system is
//! the host's, and a fresh directory per run keeps runs identical); the message store on
//! a simulated disk for half the seeds (the default configuration) and off for the other
//! half (sessions in memory); no node is killed but in the kills test (below). Clients run on machines of their own: a
//! persistent MQTT 5 subscriber (session expiry 3600, `t/#` at QoS 2) on node 2 and one on
//! node 3, a QoS 1 and a QoS 2 publisher on node 1 publishing on three topics, and a
//! "mover" whose client id connects on node 2 and node 3 in turn.
//!
//! Checked:
//! 1. every publish acknowledged as a success (PUBACK 0x00, or PUBREC 0x00 then PUBCOMP)
//!    reaches every subscriber whose SUBACK came before it was sent, at least once for QoS 1
//!    and exactly once for QoS 2 (no QoS 2 message, acknowledged or not, arrives twice); a
//!    subscriber cut off may catch up after the heal, within a deadline;
//! 2. per publisher and topic, at each subscriber, messages arrive in publish order: each
//!    message's first arrival comes after the first arrival of every message the publisher
//!    sent before it on that topic (repeats, DUP or not, are ignored when judging order:
//!    they are QoS 1 redeliveries, which MQTT 4.6 allows);
//! 3. the mover never has two live sessions: when its new connection gets its CONNACK, the
//!    node it came from has no session for it any more (asked through that node's admin
//!    handle), the new session is the old one (session present), and the old connection
//!    ends with DISCONNECT 0x8E or is closed, never before the move began. A move during
//!    which a partition was in force, or within `SETTLE` after one, is excused the first
//!    two (the old node may not hear of the claim until the heal, and a handed-over session
//!    sent on a link still down is lost: both documented in docs/clustering.md), but its
//!    old connection must still end by the end of the run; and after the heal, within
//!    30 s, at most one node holds its session, connected or not;
//! 4. after the heal, every node names the same leader, which says it leads, within a
//!    deadline;
//! 5. (membership test) nodes added and removed while the faults go on: afterwards the
//!    members agree on the membership, all voters, and the node that left has stopped;
//! 6. (retained test) every granted retained read sees the last retained write
//!    acknowledged before it asked, or a later one (`retained.rs`);
//! 7. after the others, every member's replicated routes are exactly the filters its
//!    members' clients subscribe to, by node;
//! 8. (shared-group test) every publish to a group with a member on each of two nodes that
//!    was acknowledged with success reached a member (`shared.rs`);
//! 9. the mover (subscribed to `t/#` at QoS 1) got every publish confirmed after its first
//!    SUBACK, across its moves, but those sent within `SETTLE` of a partition or a kill and
//!    those between a move that lost its session and the SUBACK of the subscription the
//!    mover makes again then;
//! 10. the mover got each publisher's messages on a topic in publish order across its
//!     moves (first arrivals; those sent near a partition or kill, as for 9, not judged).
//!
//! A calm run (no faults, the mover moving every 100-400 ms, a third publisher on one of
//! the mover's nodes) checks 9 and 10 with nothing excused, and again without the
//! handover's relay and without its order hold, asserting that checks 9 and 10 catch
//! them.
//!
//! Messages name nodes by raft id (node1 ..= node3); the harness's fault schedule counts
//! machines from 0 (its `node0` is raft id 1).
//!
//! A second test runs the same scenario and checks on five nodes (a subscriber on each of
//! nodes 2 to 5, the mover between nodes 2 and 3), with two more kinds of fault: an
//! overloaded node, paused for 50-400 ms out of every 60-500 ms while the fault lasts, and
//! a two-node minority cut off from the other three (the leader in it half the time), whose
//! two nodes still reach each other but cannot commit.
//!
//! Another kills nodes (any of them, the leader among them) and restarts them: each node's
//! store is a simulated disk that loses its unsynced writes, and its torn last write at
//! times, on the kill (`SimDisk`, as in `broker_store`); the raft log is on real files,
//! which a kill between two of the simulation's steps leaves whole. Checks 1 to 4 hold
//! with the kills counted as partitions: a publish acknowledged to its publisher was
//! durable on every node it was forwarded to, and the subscribers' and publishers' sessions
//! come back from the store with what they held. It runs again with every commit of the
//! stores put off by 200 ms, which widens the moment between a forward and the commits
//! on its node.
//!
//! Another runs subscribers that are always behind (queues of 20, 10 ms per delivery) with
//! back-pressure on, so that links between the nodes are held all the time, and asserts
//! that some were; and again with queues of two and stall rules of 600 s, where copies
//! relayed to a session that goes back and forth between two nodes must not make those
//! nodes wait for each other's acknowledgements.
//!
//! A third test runs a deliberately lossy configuration (a subscriber queue of two with
//! back-pressure off, slow subscribers) and asserts that check 1 catches it; another reads
//! retained messages from each node's replica (`cluster.retained_reads = "local"`) and
//! asserts that check 6 catches it; another serves reconnects from each node's memory of
//! its claims (`cluster.reconnect_reads = "local"`) and asserts that check 3 catches it;
//! another answers publishers before the other nodes took their forwards
//! (`cluster.forward_confirm = false`) and asserts that check 1 catches it.
//!
//! Run: `cd sim && cargo test --features sim --test broker_cluster` (docs/simulation.md,
//! "The broker cluster suite", says how to replay a seed).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use madsim::rand::{thread_rng, Rng};
use madsim::time::{sleep, timeout, Instant};
use starling_broker::hooks::Hooks;
use starling_broker::{Admin, Broker, ClusterStatus, StoreLocation};
use starling_codec::{
    Packet, Properties, Protocol, PubAck, Publish, QoS, ReasonCode, RetainHandling, Subscribe,
    SubscribeFilter, SubscriptionOptions,
};
use starling_sim::cluster::{node_ip, peers_toml};
use starling_sim::mqtt::{pid, ClientNodes, ConnectOpts, MqttClient};
use starling_sim::nemesis::Record;
use starling_sim::runner::run_seed;
use starling_sim::{check, elapsed, run, Cluster, Fault, Knobs, Nemesis, RunConfig};

const MQTT_PORT: u16 = 1883;
const CLUSTER_PORT: u16 = 7001;
/// Topics `t/0 ..` every publisher spreads its messages over.
const TOPICS: u64 = 3;
/// Publishes a publisher keeps unacknowledged at most.
const WINDOW: usize = 8;
/// Publishes per publisher at most, whatever the chaos phase's length.
const PUBLISH_MAX: u64 = 400;
/// Publishes per publisher at least: one whose window waited out the whole chaos phase (a
/// node cut off from its first publish on is given up on only after the forward timeout,
/// 15 s) goes on after the heal up to this many.
const PUBLISH_MIN: u64 = 50;
/// Index of the publishers' node; the subscribers are on every other node.
const PUBLISHER_NODE: usize = 0;
/// The publishers: one per QoS level, on `PUBLISHER_NODE`; and a third, QoS 1, on the
/// first of the mover's nodes in the variants with `mover_node_publisher`.
const PUBLISHER_QOS: [QoS; 3] = [QoS::AtLeastOnce, QoS::ExactlyOnce, QoS::AtLeastOnce];
/// The mover's client id.
const MOVER: &str = "mover";
/// Seeds of the default run: each costs about a quarter of a second of wall time (three
/// brokers and six QUIC connections for 40 to 70 simulated seconds; 200 seeds took 42-50 s
/// on this 2-core machine), several times a single-broker seed.
const SEEDS: u64 = 200;
/// Seeds of the five-node run (each costs about twice a three-node one).
const SEEDS_5: u64 = 100;
/// Seeds of the shared-group run.
const SEEDS_SHARED: u64 = 100;
/// Seeds of the retained run, and those its `local` companion may take to be caught.
const SEEDS_RETAINED: u64 = 100;
const LOCAL_SEEDS: u64 = 10;
/// Seeds the local-reconnects companion may take to be caught: the race it needs (a node
/// behind on a newer claim while the mover comes back to it) is rare, and which seed has it
/// moves with every change to the broker's schedules (seed 91 on `2e034df`, beyond the 80
/// allowed before; seed 299 once a moved session's judgement was stored before the
/// session, beyond the 200 allowed before). The search stops at the first catch, so the
/// bound costs only a run that is not caught.
const RECONNECT_SEEDS: u64 = 400;
/// Seeds of the run with kills.
const SEEDS_KILLS: u64 = 100;
/// Seeds of the takeover-at-restart scenario (no nemesis: each seed varies the timing).
const SEEDS_TAKEOVER: u64 = 20;
/// Seeds of the late-handover scenario (no nemesis: each seed varies the timing).
const SEEDS_LATE: u64 = 20;
/// Seeds of the late-relay scenario (no nemesis: each seed varies the timing).
const SEEDS_LATE_RELAY: u64 = 10;
/// Seeds the late-relay companion without the wait may take to be caught.
const LATE_RELAY_SEEDS: u64 = 3;
/// Seeds of the slow-link handover scenario (no nemesis: each seed varies the timing).
const SEEDS_SLOW: u64 = 20;
/// Seeds of the leave-with-a-parked-outbox scenario (three nodes, no nemesis, about 30 s
/// simulated each).
const SEEDS_LEAVE_OWED: u64 = 10;
/// Seeds of the order test with the new node restarted during its hold.
const SEEDS_ORDER_RESTART: u64 = 20;
/// Seeds of the run with kills and slow commits.
const SEEDS_SLOW_COMMIT: u64 = 50;
/// Seeds of the run with kills and the outbox parking after 1.2 s.
const SEEDS_PARKED: u64 = 100;
/// Seeds of the membership run.
const SEEDS_MEMBERSHIP: u64 = 100;
/// Seeds of the membership run with kills.
const SEEDS_MEMBERSHIP_KILLS: u64 = 50;
/// Seeds the unconfirmed-forwards companion may take to be caught.
const UNCONFIRMED_SEEDS: u64 = 10;
/// Seeds of the run with subscribers always behind.
const SEEDS_HELD: u64 = 100;
/// Seeds of the run with subscribers always behind and queues of two.
const SEEDS_HELD_TINY: u64 = 100;
/// Seeds the lossy companion may take to be caught (it is caught by the first, so far).
const LOSSY_SEEDS: u64 = 5;
/// Seeds of the calm run with frequent moves.
const SEEDS_MOVES: u64 = 50;
/// Seeds the handover-without-relay companion may take to be caught.
const NO_RELAY_SEEDS: u64 = 10;

/// Messages parked in the outbox and parked batches replayed after a restart, over the
/// seeds run in this process (as the nodes' last runs counted them).
static OUTBOX_PARKED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static OUTBOX_REPLAYED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// Links held by a backlogged subscriber, over the seeds run in this process (as above).
static LINK_HOLDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn mqtt_addr(node: usize) -> SocketAddr {
    SocketAddr::new(node_ip(node), MQTT_PORT)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// This suite's knobs beyond the harness's (`Knobs`: chaos length, latency, mean time
/// between faults), drawn from the seed and printed.
#[derive(Debug)]
struct ClusterKnobs {
    /// Router shards per node: forwarded batches go per shard and node.
    shards: u32,
    /// Time between two publishes of one publisher (when its window has room): about the
    /// chaos phase over `PUBLISH_MAX`, so that publishing goes on through most of it.
    pace: Duration,
    /// Weight of "isolate the leader" among the fault kinds (the others weigh 1).
    leader_weight: u32,
    /// Each node keeps sessions and retained messages in its store (the default
    /// configuration), on a simulated disk that is never crashed here; else none.
    store: bool,
    /// `cluster.snapshot_entries` on every node, on half the seeds: a raft log compacted
    /// every few dozen entries, so that nodes restart on snapshots and a node cut off is
    /// sent one (the default, 10,000, is never reached in a run).
    snapshot_entries: Option<u32>,
}

/// Per node: where it keeps its raft log, and the admin handle of its running broker.
struct Setup {
    variant: Variant,
    base: PathBuf,
    shards: u32,
    store: bool,
    snapshot_entries: Option<u32>,
    admins: Mutex<BTreeMap<usize, Admin>>,
    /// The nodes (indices) in the cluster now: the first `variant.nodes`, then those the
    /// operator added and not removed.
    members: Mutex<BTreeSet<usize>>,
    /// The nodes (indices) that left their cluster and stopped.
    left: Mutex<BTreeSet<usize>>,
    /// Each node's store, when `store`: a simulated disk that outlives the node's kills.
    disks: Mutex<BTreeMap<usize, starling_store::SimDisk>>,
    /// More lines of `[cluster]` for one node, from its next start on (a scenario that
    /// picks its nodes by role restarts one with them).
    node_cluster: Mutex<BTreeMap<usize, &'static str>>,
}

impl Setup {
    fn admin(&self, node: usize) -> Option<Admin> {
        lock(&self.admins).get(&node).cloned()
    }

    /// `node`'s disk, made at its first start.
    fn disk(&self, node: usize) -> starling_store::SimDisk {
        lock(&self.disks).entry(node).or_default().clone()
    }

    /// The disk of a node just killed: what it had not synced is lost, the last write
    /// sometimes torn.
    fn crash_disk(&self, node: usize) {
        let mut disks = lock(&self.disks);
        if let Some(d) = disks.get_mut(&node) {
            *d = starling_sim::disk::crash(d);
        }
    }
}

/// The directory of one run: tmpfs when there is one (the raft log fsyncs), removed and
/// made again at every start so that a seed replays on the same (empty) files.
fn run_dir(variant: &Variant) -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    let root = if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    };
    root.join(format!(
        "starling-sim-broker-cluster-{}-{}",
        std::process::id(),
        variant.name
    ))
}

fn node_config(setup: &Setup, node: usize) -> String {
    let id = node + 1;
    let base = setup.base.display();
    // A node that joins later names only itself: it learns the others from the leader.
    let (bootstrap, listed) = if node < setup.variant.nodes {
        (true, 0..setup.variant.nodes)
    } else {
        (false, node..node + 1)
    };
    let peers = peers_toml(listed, CLUSTER_PORT);
    format!(
        "[node]\nid = {id}\nname = \"node{id}\"\ndata_dir = \"{base}/node{id}\"\n\
         [[listeners]]\nkind = \"tcp\"\nbind = \"0.0.0.0:{MQTT_PORT}\"\n\
         [mqtt]\n{mqtt}\
         [router]\nshards = {shards}\n\
         [storage]\nenabled = {store}\n{storage}\
         [cluster]\nenabled = true\ncerts_dir = \"{base}/certs\"\nbootstrap = {bootstrap}\n{snapshots}{cluster}{own}\
         [cluster.peers]\n{peers}",
        mqtt = setup.variant.mqtt,
        cluster = setup.variant.cluster,
        own = lock(&setup.node_cluster).get(&node).copied().unwrap_or_default(),
        shards = setup.shards,
        store = setup.store,
        storage = setup.variant.storage,
        snapshots = setup
            .snapshot_entries
            .map(|n| format!("snapshot_entries = {n}\n"))
            .unwrap_or_default(),
    )
}

/// A broker node's main: the broker, kept running, its admin handle published.
async fn node_main(setup: Arc<Setup>, node: usize) {
    let text = node_config(&setup, node);
    let config = starling_config::Config::from_str(&text)
        .expect("valid node config")
        .0;
    let broker = if setup.store {
        let disk = setup.disk(node);
        Broker::start_with_store(config, Hooks::new(), StoreLocation::Backend(Box::new(disk))).await
    } else {
        Broker::start(config).await
    };
    let broker = broker.expect("broker node starts");
    lock(&setup.admins).insert(node, broker.admin());
    // As the daemon does: a node that left its cluster stops.
    broker.left().await;
    lock(&setup.left).insert(node);
    broker.shutdown().await;
    // The node lives as long as this future.
    std::future::pending::<()>().await;
}

/// Certificates and raft logs in a fresh directory (so that every run of a seed starts on
/// the same, empty, files), and the variant's nodes started on them.
fn start(variant: Variant, shards: u32, store: bool) -> (Arc<Setup>, Cluster, PathBuf) {
    start_with(variant, shards, store, None)
}

/// As [`start`], with `cluster.snapshot_entries` set when `Some`.
fn start_with(
    variant: Variant,
    shards: u32,
    store: bool,
    snapshot_entries: Option<u32>,
) -> (Arc<Setup>, Cluster, PathBuf) {
    let base = run_dir(&variant);
    let _ = std::fs::remove_dir_all(&base);
    let certs = base.join("certs");
    let nodes = variant.nodes;
    for id in 1..=(nodes + variant.joiners) as u64 {
        starling_raft::certs::issue_node(&certs, id, &[]).expect("node certificate");
    }
    let setup = Arc::new(Setup {
        variant,
        base: base.clone(),
        shards,
        store,
        snapshot_entries,
        admins: Mutex::new(BTreeMap::new()),
        members: Mutex::new((0..nodes).collect()),
        left: Mutex::new(BTreeSet::new()),
        disks: Mutex::new(BTreeMap::new()),
        node_cluster: Mutex::new(BTreeMap::new()),
    });
    let s = setup.clone();
    let cluster = Cluster::build(nodes + variant.joiners, move |i| node_main(s.clone(), i));
    (setup, cluster, base)
}

mod clients;
mod late;
mod late_relay;
mod leave_owed;
mod membership;
mod oracle;
mod order_restart;
mod retained;
mod shared;
mod slow;
mod takeover;
mod variants;
mod view;

use clients::*;
use oracle::*;
use variants::*;
use view::*;

// ---------------------------------------------------------------------------------------
// The scenario.

async fn scenario(variant: Variant) {
    let knobs = Knobs::current();
    let mut rng = starling_rt::rng::rng();
    let ck = ClusterKnobs {
        shards: rng.gen_range(1..=3),
        pace: knobs.chaos.mul_f64(rng.gen_range(0.6..1.0)) / PUBLISH_MAX as u32,
        leader_weight: rng.gen_range(1..4),
        // A kill loses what is in memory: the store is what the variant is about.
        store: variant.kills || rng.gen_bool(0.5),
        // Drawn last: the knobs before it stay what they were for each seed.
        snapshot_entries: rng.gen_bool(0.5).then(|| rng.gen_range(10..=60)),
    };
    println!("[sim] cluster knobs: {ck:?} variant={}", variant.name);
    madsim::net::NetSim::current().update_config(|c| {
        c.send_latency = knobs.latency.0..knobs.latency.1.max(knobs.latency.0 + ms(1))
    });

    let (setup, cluster, base) = start_with(variant, ck.shards, ck.store, ck.snapshot_entries);
    let nodes = variant.nodes;

    // Check 4 before anything else: a leader the nodes agree on.
    let first = wait_leader(&setup, Duration::from_secs(30)).await;
    check!(first.is_some(), "no leader 30 s after start");

    let oracle: Shared = Arc::default();
    let faults: Faults = Arc::default();
    let mut clients = ClientNodes::default();
    let subscriber_nodes: Vec<usize> = (0..nodes).filter(|&n| n != PUBLISHER_NODE).collect();
    for (k, &node) in subscriber_nodes.iter().enumerate() {
        clients
            .node(format!("sub{k}"))
            .spawn(subscriber(k, node, variant, oracle.clone()));
    }
    let started = Instant::now();
    while lock(&oracle).subacked.len() < subscriber_nodes.len() {
        check!(
            started.elapsed() < Duration::from_secs(30),
            "subscriptions not acknowledged within 30 s"
        );
        sleep(ms(50)).await;
    }
    clients.node("mover").spawn(mover(
        setup.clone(),
        faults.clone(),
        oracle.clone(),
        if variant.mover_ring {
            vec![subscriber_nodes[0], subscriber_nodes[1], PUBLISHER_NODE]
        } else {
            vec![subscriber_nodes[0], subscriber_nodes[1]]
        },
    ));
    // Every node has applied the routes by now (they are milliseconds behind the commit
    // the SUBACK waited for).
    sleep(Duration::from_secs(1)).await;
    let publishers = if variant.mover_node_publisher { 3 } else { 2 };
    for k in 0..publishers {
        let node = match k {
            2 => subscriber_nodes[0],
            _ => PUBLISHER_NODE,
        };
        clients
            .node(format!("pub{k}"))
            .spawn(publisher(k, node, ck.pace, oracle.clone()));
    }

    if variant.shared {
        for (k, &node) in subscriber_nodes.iter().take(2).enumerate() {
            clients
                .node(format!("shared{k}"))
                .spawn(shared::member(k, node, oracle.clone()));
        }
        let started = Instant::now();
        while lock(&oracle).shared.subacked.len() < 2 {
            check!(
                started.elapsed() < Duration::from_secs(30),
                "the shared group's subscriptions not acknowledged within 30 s"
            );
            sleep(ms(50)).await;
        }
        sleep(Duration::from_secs(1)).await;
        clients.node("shared-publisher").spawn(shared::publisher(
            PUBLISHER_NODE,
            ck.pace * 4,
            oracle.clone(),
        ));
    }
    if variant.retained {
        clients
            .node("retained-writer")
            .spawn(retained::writer(PUBLISHER_NODE, oracle.clone()));
        for (k, &node) in subscriber_nodes.iter().enumerate() {
            clients
                .node(format!("retained-reader{k}"))
                .spawn(retained::reader(k, node, oracle.clone()));
        }
    }
    if variant.joiners > 0 {
        let late = clients.node("sub-late");
        clients.node("operator").spawn(membership::operator(
            setup.clone(),
            oracle.clone(),
            late,
            subscriber_nodes.len(),
            knobs.chaos,
        ));
    }

    let mut nemesis = Nemesis::new(knobs.clone());
    chaos(&cluster, &setup, &knobs, &ck, &faults, &mut nemesis).await;
    let healed_at = Instant::now();
    {
        let mut g = lock(&oracle);
        g.stop = true;
        g.healed = true;
    }
    let schedule = nemesis.schedule();

    // Check 4: a leader again.
    let leader = wait_leader(&setup, knobs.heal_deadline).await;
    check!(
        leader.is_some(),
        "no leader {:?} after the heal: {:?}\nfaults:\n{schedule}",
        knobs.heal_deadline,
        statuses(&setup).await
    );

    // The publishers settle what they have in flight: a destination that does not
    // acknowledge is given up on after the forward timeout (15 s by default).
    let settle_by = healed_at + Duration::from_secs(45);
    loop {
        let done = lock(&oracle).publishers_done;
        if done == publishers {
            break;
        }
        check!(
            Instant::now() < settle_by,
            "{done} of {publishers} publishers settled 45 s after the heal\nfaults:\n{schedule}"
        );
        sleep(ms(200)).await;
    }

    // Checks 1 and 2: subscribers cut off catch up by the deadline.
    let deliver_by = Instant::now() + Duration::from_secs(30);
    loop {
        let verdict = {
            let g = lock(&oracle);
            judge(&g, false).map(|()| missing(&g).len())
        };
        match verdict {
            Err(e) => check!(false, "{e}\nfaults:\n{schedule}"),
            Ok(0) => break,
            Ok(n) => {
                if Instant::now() >= deliver_by {
                    let (e, summary) = {
                        let g = lock(&oracle);
                        (
                            judge(&g, true).err().unwrap_or_default(),
                            missing_summary(&g),
                        )
                    };
                    let nodes = diagnose(&setup).await;
                    check!(
                        false,
                        "30 s after the publishers settled, {n} missing: {e}\n{summary}nodes:\n{nodes}faults:\n{schedule}"
                    );
                }
            }
        }
        sleep(ms(200)).await;
    }

    // Check 3, after the heal: at most one node holds the mover's session, connected or
    // not (a node killed while it handed the session over finds its claim in its own log
    // at the restart, and must not restore the session beside the new owner's).
    let one_by = Instant::now() + Duration::from_secs(30);
    loop {
        let mut holders = Vec::new();
        for node in 0..setup.variant.nodes + setup.variant.joiners {
            if let Some(a) = setup.admin(node) {
                if a.client(MOVER).await.is_some() {
                    holders.push(node + 1);
                }
            }
        }
        if holders.len() <= 1 {
            break;
        }
        if Instant::now() >= one_by {
            let nodes = diagnose(&setup).await;
            check!(
                false,
                "30 s after the deliveries, nodes {holders:?} all hold the mover's session\nnodes:\n{nodes}faults:\n{schedule}"
            );
        }
        sleep(ms(200)).await;
    }

    // Check 8: every acknowledged publish to the shared group reached a member.
    if variant.shared {
        let by = Instant::now() + Duration::from_secs(60);
        loop {
            let (done, lost, acked, sent, twice) = {
                let g = lock(&oracle);
                let twice = g.shared.got.values().filter(|m| m.len() > 1).count();
                (
                    g.shared.publisher_done,
                    shared::lost(&g.shared),
                    g.shared.acked.len(),
                    g.shared.sent,
                    twice,
                )
            };
            if done && lost.is_empty() {
                println!(
                    "[sim] shared group: {sent} sent, {acked} acknowledged, none lost, {twice} delivered to both members"
                );
                break;
            }
            check!(
                Instant::now() < by,
                "shared group, 60 s after the heal: publisher done {done}, {} of {acked} acknowledged publishes reached no member, first {:?}\nfaults:\n{schedule}",
                lost.len(),
                lost.first()
            );
            sleep(ms(200)).await;
        }
    }

    // Check 6: every granted retained read saw the last write acknowledged before it asked.
    if variant.retained {
        let g = lock(&oracle);
        let stale = retained::stale(&g.retained);
        check!(
            stale.is_empty(),
            "{} of {} retained reads stale, first: {}\nfaults:\n{schedule}",
            stale.len(),
            g.retained.reads.len(),
            stale
                .first()
                .map(|(r, must)| format!(
                    "reader{} on node{} asked at {:?} and saw {:?}; {must} was acknowledged before",
                    r.reader,
                    r.node + 1,
                    r.asked,
                    r.seen
                ))
                .unwrap_or_default()
        );
        check!(
            // A write whose PUBACK waits out a forward's timeout (15 s) for a reader's node
            // cut off can take a short run's whole chaos phase: some writes, not many.
            g.retained.reads.len() >= 5
                && g.retained.acked.len() + (g.retained.failed + g.retained.unanswered) as usize
                    >= 1,
            "too few retained reads ({}) or writes ({}, {} failed, {} unanswered) to mean anything\nfaults:\n{schedule}",
            g.retained.reads.len(),
            g.retained.acked.len(),
            g.retained.failed,
            g.retained.unanswered,
        );
        println!(
            "[sim] retained: {} writes acknowledged ({} failed, {} unanswered), {} reads, {} refused",
            g.retained.acked.len(),
            g.retained.failed,
            g.retained.unanswered,
            g.retained.reads.len(),
            g.retained.refused
        );
    }

    // Check 5: the operator's joins and leave are done, and the members agree on who they
    // are.
    if variant.joiners > 0 {
        let agreed_by = Instant::now() + Duration::from_secs(120);
        loop {
            let done = lock(&oracle).membership_done;
            let agreed = if done {
                membership::agreed_members(&setup).await
            } else {
                Err("the operator is not done".to_owned())
            };
            match agreed {
                Ok(()) => break,
                Err(e) => check!(
                    Instant::now() < agreed_by,
                    "membership 120 s after the heal: {e}\nfaults:\n{schedule}"
                ),
            }
            sleep(ms(200)).await;
        }
    }

    // Check 3: the mover's last move (after the heal) is done, and every connection it
    // left behind has ended.
    let moved_by = Instant::now() + Duration::from_secs(30);
    loop {
        let (done, open) = {
            let g = lock(&oracle);
            let open: Vec<usize> = g
                .superseded_by
                .keys()
                .filter(|c| !g.ended.contains_key(c))
                .copied()
                .collect();
            (g.mover_done, open)
        };
        if done && open.is_empty() {
            break;
        }
        check!(
            Instant::now() < moved_by,
            "the mover: done {done}, connections still open after their session moved: {open:?}\nfaults:\n{schedule}"
        );
        sleep(ms(200)).await;
    }

    // Check 7: the routes converge on the truth (each member's subscriptions) by a
    // deadline after the heal. A moved session's relay keeps its old node in the routes
    // of its filters for 30 s after the cut at least: the mover going round the
    // publishers' node, where nothing else subscribes, may have left it just now.
    let grace = if variant.mover_ring { 30 } else { 0 };
    let routes_by = Instant::now() + Duration::from_secs(30 + grace);
    loop {
        match routes_agree(&setup).await {
            Ok(()) => break,
            Err(e) => check!(
                Instant::now() < routes_by,
                "routes {}s after the checks above: {e}\nfaults:\n{schedule}",
                30 + grace
            ),
        }
        sleep(ms(500)).await;
    }

    // A quiet second: a late duplicate would show now.
    sleep(Duration::from_secs(1)).await;
    let (verdict, sent, settled, confirmed) = {
        let g = lock(&oracle);
        let confirmed = g.settled.values().filter(|ok| **ok).count();
        (judge(&g, true), g.sent.len(), g.settled.len(), confirmed)
    };
    if let Err(e) = verdict {
        check!(false, "{e}\nfaults:\n{schedule}");
    }
    // Check 9: the mover got, across its moves, every confirmed publish sent while no
    // partition or kill was near.
    let faults: Vec<(Duration, Duration)> = nemesis
        .history
        .iter()
        .filter(|r| is_partition(&r.fault))
        .map(|r| (r.at, r.at + r.lasted))
        .collect();
    let (missed, got, moves) = {
        let g = lock(&oracle);
        let missed: Vec<_> = oracle::mover_missing(&g, &faults)
            .into_iter()
            .map(|k| (k, g.sent[&k].at))
            .collect();
        let moves: String = g
            .moves
            .iter()
            .map(|m| {
                format!(
                    "  node{}->node{} from {:?}, CONNACK at {:?}, session present {}\n",
                    m.from + 1,
                    m.to + 1,
                    m.started,
                    m.connack,
                    m.session_present
                )
            })
            .collect();
        (missed, g.mover_got.len(), moves)
    };
    if !missed.is_empty() {
        let nodes = diagnose(&setup).await;
        check!(
            false,
            "check 9: the mover missed {} confirmed publishes ((publisher, seq), sent at), first {:?}; it got {got}\nmoves:\n{moves}nodes:\n{nodes}faults:\n{schedule}",
            missed.len(),
            &missed[..missed.len().min(5)]
        );
    }
    // Check 10: the mover got each publisher's messages on a topic in order across its
    // moves (first arrivals; none sent near a partition or kill judged).
    let reordered = oracle::mover_reordered(&lock(&oracle), &faults);
    if let Some(r) = reordered {
        let nodes = diagnose(&setup).await;
        check!(
            false,
            "check 10: the mover got a publish out of order: {r}\nnodes:\n{nodes}faults:\n{schedule}"
        );
    }
    if confirmed < 20 {
        let nodes = diagnose(&setup).await;
        check!(
            false,
            "too little traffic to mean anything: {sent} sent, {settled} settled, {confirmed} confirmed\nnodes:\n{nodes}faults:\n{schedule}"
        );
    }
    let overloads = nemesis
        .history
        .iter()
        .filter(|r| matches!(r.fault, Fault::Overload { .. }))
        .count();
    let splits = nemesis
        .history
        .iter()
        .filter(|r| matches!(r.fault, Fault::Split(_)))
        .count();
    let kills = nemesis
        .history
        .iter()
        .filter(|r| matches!(r.fault, Fault::Kill(_)))
        .count();
    let g = lock(&oracle);
    let clean = g.moves.iter().filter(|m| m.clean).count();
    let present = g.moves.iter().filter(|m| m.session_present).count();
    let move_ms: Vec<u128> = g
        .moves
        .iter()
        .filter(|m| m.clean)
        .map(|m| (m.connack - m.started).as_millis())
        .collect();
    println!(
        "[sim] seed {}: {} sent, {confirmed} confirmed, {} unconfirmed; {} moves ({clean} clean, {present} with their session, clean CONNACK after {:?} ms; last {:?}); subscriber reconnects {}; {} faults ({overloads} overloads, {splits} two-node minorities, {kills} kills)",
        knobs.seed,
        g.sent.len(),
        g.settled.len() - confirmed,
        g.moves.len(),
        move_ms,
        g.moves.last().map(|m| (m.from + 1, m.to + 1)),
        g.subscriber_reconnects,
        nemesis.history.len(),
    );
    drop(g);
    let (mut parked, mut replayed, mut holds) = (0, 0, 0);
    for node in 0..setup.variant.nodes + setup.variant.joiners {
        if let Some(m) = setup.admin(node).map(|a| a.metrics()) {
            parked += m.cluster_outbox_parked;
            replayed += m.cluster_outbox_replayed;
            holds += m.cluster_link_holds;
        }
    }
    LINK_HOLDS.fetch_add(holds, std::sync::atomic::Ordering::Relaxed);
    OUTBOX_PARKED.fetch_add(parked, std::sync::atomic::Ordering::Relaxed);
    OUTBOX_REPLAYED.fetch_add(replayed, std::sync::atomic::Ordering::Relaxed);
    if parked + replayed > 0 {
        println!(
            "[sim] seed {}: outbox: {parked} messages parked, {replayed} batches replayed (the nodes' current runs)",
            knobs.seed
        );
    }
    let _ = std::fs::remove_dir_all(&base);
}

async fn sound() {
    scenario(SOUND).await
}

async fn sound5() {
    scenario(SOUND5).await
}

async fn lossy() {
    scenario(LOSSY).await
}

async fn held() {
    scenario(HELD).await
}

async fn held_tiny() {
    scenario(HELD_TINY).await
}

async fn with_kills() {
    scenario(KILLS).await
}

async fn with_kills_and_slow_commits() {
    scenario(KILLS_SLOW_COMMIT).await
}

async fn with_kills_and_parking() {
    scenario(KILLS_PARKED).await
}

async fn with_joiners() {
    scenario(MEMBERSHIP).await
}

async fn with_joiners_and_kills() {
    scenario(MEMBERSHIP_KILLS).await
}

async fn with_shared_group() {
    scenario(SHARED_GROUP).await
}

async fn with_retained() {
    scenario(RETAINED).await
}

async fn with_local_retained() {
    scenario(RETAINED_LOCAL).await
}

async fn with_unconfirmed_forwards() {
    scenario(FORWARD_UNCONFIRMED).await
}

async fn with_local_reconnects() {
    scenario(RECONNECT_LOCAL).await
}

async fn with_moves() {
    scenario(MOVES).await
}

async fn with_pingpong_moves() {
    scenario(variants::MOVES_PINGPONG).await
}

async fn with_chained_moves() {
    scenario(variants::MOVES_CHAINED).await
}

async fn without_handover_relay() {
    scenario(NO_RELAY).await
}

async fn without_handover_order() {
    scenario(NO_ORDER).await
}

async fn leave_owing_its_outbox() {
    leave_owed::scenario(leave_owed::Owes::Outbox).await
}

async fn leave_owing_a_relay() {
    leave_owed::scenario(leave_owed::Owes::Relay).await
}

async fn with_late_relay() {
    late_relay::scenario(late_relay::LATE_RELAY, late_relay::OldNode::Up).await
}

async fn with_late_relay_unwaited() {
    late_relay::scenario(late_relay::LATE_RELAY_NO_WAIT, late_relay::OldNode::Up).await
}

async fn with_late_relay_killed() {
    late_relay::scenario(
        late_relay::LATE_RELAY_KILLED,
        late_relay::OldNode::KilledRelaying,
    )
    .await
}

async fn with_late_relay_killed_beside_stayer() {
    late_relay::scenario(
        late_relay::LATE_RELAY_KILLED_STAYER,
        late_relay::OldNode::KilledRelayingBesideStayer,
    )
    .await
}

async fn with_late_relay_killed_beside_stayer_without_outbox() {
    late_relay::scenario(
        late_relay::LATE_RELAY_KILLED_STAYER_NO_OUTBOX,
        late_relay::OldNode::KilledRelayingBesideStayerWithoutOutbox,
    )
    .await
}

async fn with_order_restart() {
    order_restart::scenario().await
}

async fn with_late_relay_new_node_kill() {
    late_relay::scenario(
        late_relay::LATE_RELAY_NEW_NODE_KILL,
        late_relay::OldNode::NewNodeKilledAtHandover,
    )
    .await
}

async fn with_late_relay_handover_kill() {
    late_relay::scenario(
        late_relay::LATE_RELAY_HANDOVER_KILL,
        late_relay::OldNode::KilledAtHandover,
    )
    .await
}

async fn with_late_relay_restarted() {
    late_relay::scenario(
        late_relay::LATE_RELAY_RESTART,
        late_relay::OldNode::Restarted,
    )
    .await
}

/// Checks 1 to 4 of the module's list on the default seeds and the corpus (sim/seeds.txt):
/// the seeds of the five broker bugs this suite found (docs/simulation.md, "The broker
/// cluster suite") replay first.
#[test]
fn acknowledged_publishes_reach_persistent_subscribers_on_other_nodes_under_partitions() {
    run(
        RunConfig::new(
            "broker_cluster",
            "acknowledged_publishes_reach_persistent_subscribers_on_other_nodes_under_partitions",
        )
        .seeds(SEEDS),
        sound,
    );
}

/// The same checks with five nodes, a node overloaded among the faults, on
/// [`SEEDS_5`] seeds.
#[test]
fn five_nodes_keep_every_promise_under_partitions_and_overload() {
    run(
        RunConfig::new(
            "broker_cluster",
            "five_nodes_keep_every_promise_under_partitions_and_overload",
        )
        .seeds(SEEDS_5),
        sound5,
    );
}

/// Checks 1 to 4 and 7 while nodes are killed (the publishers' node, the subscribers'
/// nodes, the leader) and restarted on what their simulated disks kept, with partitions
/// between, on [`SEEDS_KILLS`] seeds: a publish acknowledged was durable on every node it
/// was forwarded to, sessions come back from the store with their packet ids, and a
/// restarted node states its routes only once its sessions are restored.
#[test]
fn acknowledged_publishes_survive_node_kills_with_unsynced_writes_lost() {
    run(
        RunConfig::new(
            "broker_cluster",
            "acknowledged_publishes_survive_node_kills_with_unsynced_writes_lost",
        )
        .seeds(SEEDS_KILLS),
        with_kills,
    );
}

/// The same with every commit put off by 200 ms, on [`SEEDS_SLOW_COMMIT`] seeds: a QoS 2
/// publish of a persistent publisher leaves for the other nodes only once its packet
/// identifier is durable on its own node, so a kill in between does not have its resend
/// routed twice (before that rule, 16 of these seeds delivered a QoS 2 message twice; two
/// of them are in the corpus).
#[test]
fn qos2_forwards_wait_for_their_packet_ids_to_be_durable_under_kills() {
    run(
        RunConfig::new(
            "broker_cluster",
            "qos2_forwards_wait_for_their_packet_ids_to_be_durable_under_kills",
        )
        .seeds(SEEDS_SLOW_COMMIT),
        with_kills_and_slow_commits,
    );
}

/// The kills with forwarded batches parked after 1.2 s without an acknowledgement, on
/// [`SEEDS_PARKED`] seeds: every publish acknowledged because its batch sat durably in the
/// outbox reaches its subscribers after the heal, in order, QoS 2 once, the publishers'
/// node killed and restarted meanwhile or not (its parked batches sent again). Asserts too
/// that batches were parked and replayed, so that the checks judged the outbox.
#[test]
fn parked_forwards_reach_their_subscribers_through_partitions_and_kills() {
    let before = (
        OUTBOX_PARKED.load(std::sync::atomic::Ordering::Relaxed),
        OUTBOX_REPLAYED.load(std::sync::atomic::Ordering::Relaxed),
    );
    run(
        RunConfig::new(
            "broker_cluster",
            "parked_forwards_reach_their_subscribers_through_partitions_and_kills",
        )
        .seeds(SEEDS_PARKED),
        with_kills_and_parking,
    );
    let parked = OUTBOX_PARKED.load(std::sync::atomic::Ordering::Relaxed) - before.0;
    let replayed = OUTBOX_REPLAYED.load(std::sync::atomic::Ordering::Relaxed) - before.1;
    println!("[sim] outbox over the seeds: {parked} messages parked, {replayed} batches replayed");
    // Over the default seeds; one seed replayed alone (`MADSIM_TEST_SEED`) may do neither.
    if std::env::var_os("MADSIM_TEST_SEED").is_none() {
        assert!(parked > 0, "no batch was parked: the outbox went untested");
        assert!(replayed > 0, "no parked batch was replayed after a restart");
    }
}

/// A node killed right after it handed a session over (the claim applied and in its raft
/// log, the session's end not yet in its store) does not keep the stored session beside
/// the new owner's after its restart (`takeover.rs`), on [`SEEDS_TAKEOVER`] seeds.
#[test]
fn a_session_taken_over_is_not_restored_by_the_node_killed_as_it_handed_it_over() {
    run(
        RunConfig::new(
            "broker_cluster",
            "a_session_taken_over_is_not_restored_by_the_node_killed_as_it_handed_it_over",
        )
        .seeds(SEEDS_TAKEOVER),
        takeover::scenario,
    );
}

/// A session handed over after its CONNECT went on afresh takes the fresh session's place
/// when that one never held more than its name: the client's next CONNECT finds its
/// subscription and the messages queued for it (`late.rs`), on [`SEEDS_LATE`] seeds.
#[test]
fn a_session_handed_over_late_takes_the_place_of_the_fresh_one_its_client_never_heard_of() {
    run(
        RunConfig::new(
            "broker_cluster",
            "a_session_handed_over_late_takes_the_place_of_the_fresh_one_its_client_never_heard_of",
        )
        .seeds(SEEDS_LATE),
        late::scenario,
    );
}

/// A copy parked for a moving session's old node, and sent there only well past the 30 s
/// the relay used to last, is still relayed to the session, once (`late_relay.rs`), on
/// [`SEEDS_LATE_RELAY`] seeds.
#[test]
fn a_copy_parked_for_a_moved_sessions_old_node_is_relayed_once_however_late_it_comes() {
    run(
        RunConfig::new(
            "broker_cluster",
            "a_copy_parked_for_a_moved_sessions_old_node_is_relayed_once_however_late_it_comes",
        )
        .seeds(SEEDS_LATE_RELAY),
        with_late_relay,
    );
}

/// The same with the session's old node killed and restarted after the move, before the
/// parked copies reach it: its relay comes back from its store (`late_relay.rs`), on
/// [`SEEDS_LATE_RELAY`] seeds.
#[test]
fn a_copy_parked_for_a_moved_sessions_old_node_is_relayed_after_that_node_restarts() {
    run(
        RunConfig::new(
            "broker_cluster",
            "a_copy_parked_for_a_moved_sessions_old_node_is_relayed_after_that_node_restarts",
        )
        .seeds(SEEDS_LATE_RELAY),
        with_late_relay_restarted,
    );
}

/// The same with the old node killed 0.5 s after it took the parked copies, its relay to
/// the session's new node cut off: it acknowledges a copy it relays only once the new node
/// took it (or it parked it), so the copies come again after its restart
/// (`late_relay.rs`), on [`SEEDS_LATE_RELAY`] seeds.
#[test]
fn a_copy_its_old_node_took_and_had_not_relayed_when_killed_is_relayed_after_its_restart() {
    run(
        RunConfig::new(
            "broker_cluster",
            "a_copy_its_old_node_took_and_had_not_relayed_when_killed_is_relayed_after_its_restart",
        )
        .seeds(SEEDS_LATE_RELAY),
        with_late_relay_killed,
    );
}

/// The same with a second persistent session on the old node subscribed to the same
/// filter: the old node stores its copies with the link's cursor, which covers the copies
/// it relays too, so it writes those to its outbox in the same commit; the relayed copies
/// come after its restart and the other session keeps its own (`late_relay.rs`), on
/// [`SEEDS_LATE_RELAY`] seeds.
#[test]
fn a_copy_relayed_beside_a_stored_one_when_its_old_node_was_killed_is_relayed_after_its_restart() {
    run(
        RunConfig::new(
            "broker_cluster",
            "a_copy_relayed_beside_a_stored_one_when_its_old_node_was_killed_is_relayed_after_its_restart",
        )
        .seeds(SEEDS_LATE_RELAY),
        with_late_relay_killed_beside_stayer,
    );
}

/// The same with the old node's outbox off (`cluster.outbox_max_messages = 0`): it parks
/// the copies it relays all the same, on [`SEEDS_LATE_RELAY`] seeds.
#[test]
fn a_copy_relayed_beside_a_stored_one_by_a_node_without_an_outbox_is_relayed_after_its_restart() {
    run(
        RunConfig::new(
            "broker_cluster",
            "a_copy_relayed_beside_a_stored_one_by_a_node_without_an_outbox_is_relayed_after_its_restart",
        )
        .seeds(SEEDS_LATE_RELAY),
        with_late_relay_killed_beside_stayer_without_outbox,
    );
}

/// The same with the old node killed the moment the session has left it for the new node
/// (the stores' commits 200 ms apart under load): its relay comes back from its store at
/// its restart (`late_relay.rs`), on [`SEEDS_LATE_RELAY`] seeds.
#[test]
fn a_copy_parked_for_a_moved_sessions_old_node_killed_as_the_session_left_is_relayed() {
    run(
        RunConfig::new(
            "broker_cluster",
            "a_copy_parked_for_a_moved_sessions_old_node_killed_as_the_session_left_is_relayed",
        )
        .seeds(SEEDS_LATE_RELAY),
        with_late_relay_handover_kill,
    );
}

/// The same with the new node killed the moment it stored the session handed over to it
/// (the stores' commits 200 ms apart), copies routed to it before the move's cut parked
/// for it too: it stored its judgement of the move first, so after its restart it skips
/// them for the moved session, whose copies the old node relays (`late_relay.rs`), on
/// [`SEEDS_LATE_RELAY`] seeds.
#[test]
fn copies_routed_to_a_moved_sessions_new_node_before_the_cut_are_skipped_after_its_restart() {
    run(
        RunConfig::new(
            "broker_cluster",
            "copies_routed_to_a_moved_sessions_new_node_before_the_cut_are_skipped_after_its_restart",
        )
        .seeds(SEEDS_LATE_RELAY),
        with_late_relay_new_node_kill,
    );
}

/// The late-relay check can fail: with `cluster.handover_relay_wait = false` (the relay
/// ends 30 s after the cut, as before) the parked copies are dropped at the old node, and
/// the check reports them within the first [`LATE_RELAY_SEEDS`] seeds.
#[test]
fn a_relay_that_ends_with_its_grace_is_caught_losing_a_late_copy() {
    caught(
        RunConfig::new(
            "broker_cluster",
            "a_relay_that_ends_with_its_grace_is_caught_losing_a_late_copy",
        ),
        LATE_RELAY_SEEDS,
        with_late_relay_unwaited,
        "messages parked for its session on A",
        "the late-relay check",
    );
}

/// A session that takes longer than the claiming node's wait to come whole, on a slow
/// link, is waited for while its parts keep coming (`slow.rs`), on [`SEEDS_SLOW`] seeds.
#[test]
fn a_large_session_on_a_slow_link_is_waited_for_while_it_keeps_coming() {
    run(
        RunConfig::new(
            "broker_cluster",
            "a_large_session_on_a_slow_link_is_waited_for_while_it_keeps_coming",
        )
        .seeds(SEEDS_SLOW),
        slow::scenario,
    );
}

/// A node asked to leave while messages it parked for a node it cannot reach are in its
/// outbox waits for that node to take them, once the cut heals, before it leaves
/// (`leave_owed.rs`), on [`SEEDS_LEAVE_OWED`] seeds.
#[test]
fn a_node_that_leaves_first_delivers_what_it_parked_for_a_node_it_could_not_reach() {
    run(
        RunConfig::new(
            "broker_cluster",
            "a_node_that_leaves_first_delivers_what_it_parked_for_a_node_it_could_not_reach",
        )
        .seeds(SEEDS_LEAVE_OWED),
        leave_owing_its_outbox,
    );
}

/// A node asked to leave, whose session moves away as it does, waits for the copies
/// another node parked for that session before the move's cut, once the cut between them
/// heals, and relays them before it leaves (`leave_owed.rs`), on [`SEEDS_LEAVE_OWED`]
/// seeds.
#[test]
fn a_node_that_leaves_first_relays_what_was_parked_for_a_session_that_moved_away() {
    run(
        RunConfig::new(
            "broker_cluster",
            "a_node_that_leaves_first_relays_what_was_parked_for_a_session_that_moved_away",
        )
        .seeds(SEEDS_LEAVE_OWED),
        leave_owing_a_relay,
    );
}

/// Checks 1 to 5 while nodes join and leave: a fourth node is added during the faults and
/// gets a subscriber, a fifth is added and leaves again; afterwards the members agree on
/// the membership, all voters, on [`SEEDS_MEMBERSHIP`] seeds.
#[test]
fn nodes_join_and_leave_under_partitions_and_keep_every_promise() {
    run(
        RunConfig::new(
            "broker_cluster",
            "nodes_join_and_leave_under_partitions_and_keep_every_promise",
        )
        .seeds(SEEDS_MEMBERSHIP),
        with_joiners,
    );
}

/// The same with kills among the faults: any node may be killed and restarted on what its
/// disk kept while it joins, leaves, or is the one the operator asks, on
/// [`SEEDS_MEMBERSHIP_KILLS`] seeds.
#[test]
fn nodes_join_and_leave_under_partitions_and_kills_and_keep_every_promise() {
    run(
        RunConfig::new(
            "broker_cluster",
            "nodes_join_and_leave_under_partitions_and_kills_and_keep_every_promise",
        )
        .seeds(SEEDS_MEMBERSHIP_KILLS),
        with_joiners_and_kills,
    );
}

/// Checks 1 to 4 and 8: a shared group with a member on each of two nodes while the
/// faults go on, on [`SEEDS_SHARED`] seeds.
#[test]
fn a_shared_group_across_nodes_loses_no_acknowledged_message_under_partitions() {
    run(
        RunConfig::new(
            "broker_cluster",
            "a_shared_group_across_nodes_loses_no_acknowledged_message_under_partitions",
        )
        .seeds(SEEDS_SHARED),
        with_shared_group,
    );
}

/// Checks 1 to 4 and 6: retained messages set through one node and read through the
/// others while the faults go on, on [`SEEDS_RETAINED`] seeds.
#[test]
fn retained_reads_see_every_acknowledged_write_under_partitions() {
    run(
        RunConfig::new(
            "broker_cluster",
            "retained_reads_see_every_acknowledged_write_under_partitions",
        )
        .seeds(SEEDS_RETAINED),
        with_retained,
    );
}

/// Check 6 can fail: with `cluster.retained_reads = "local"` a node that lags serves old
/// retained messages, and the check reports them within the first [`LOCAL_SEEDS`] seeds.
#[test]
fn local_retained_reads_are_caught_stale() {
    caught(
        RunConfig::new("broker_cluster", "local_retained_reads_are_caught_stale"),
        LOCAL_SEEDS,
        with_local_retained,
        "retained reads stale",
        "check 6",
    );
}

/// Check 3 can fail: with `cluster.reconnect_reads = "local"` (bug 5 put back as a
/// setting) the mover gets two live sessions, and the check reports it within the first
/// [`RECONNECT_SEEDS`] seeds.
#[test]
fn local_reconnects_are_caught_with_two_live_sessions() {
    caught(
        RunConfig::new(
            "broker_cluster",
            "local_reconnects_are_caught_with_two_live_sessions",
        ),
        RECONNECT_SEEDS,
        with_local_reconnects,
        "mover",
        "check 3",
    );
}

/// Check 1 can fail on forwarding: with `cluster.forward_confirm = false` and kills, the
/// batches lost with their sending node were acknowledged to their publishers, and the
/// check reports them missing within the first [`UNCONFIRMED_SEEDS`] seeds.
#[test]
fn unconfirmed_forwards_are_caught_losing_messages() {
    caught(
        RunConfig::new(
            "broker_cluster",
            "unconfirmed_forwards_are_caught_losing_messages",
        ),
        UNCONFIRMED_SEEDS,
        with_unconfirmed_forwards,
        "missing",
        "check 1",
    );
}

/// Checks 1 to 4 with subscribers that are always behind (queues of 20, 10 ms per
/// delivery): links between the nodes are held and let go all the time, under partitions
/// and delays, on [`SEEDS_HELD`] seeds (7,090 holds over them).
#[test]
fn subscribers_always_behind_hold_their_links_and_lose_nothing_under_partitions() {
    let before = LINK_HOLDS.load(std::sync::atomic::Ordering::Relaxed);
    run(
        RunConfig::new(
            "broker_cluster",
            "subscribers_always_behind_hold_their_links_and_lose_nothing_under_partitions",
        )
        .seeds(SEEDS_HELD),
        held,
    );
    let holds = LINK_HOLDS.load(std::sync::atomic::Ordering::Relaxed) - before;
    println!("[sim] link holds over the seeds: {holds}");
    if std::env::var_os("MADSIM_TEST_SEED").is_none() {
        assert!(
            holds > 0,
            "no link was held: back-pressure across nodes went untested"
        );
    }
}

/// Checks 1 to 4 with queues of two and stall rules of 600 s ([`HELD_TINY`]): copies
/// relayed to a session that went back and forth between two nodes must not make each
/// node wait for the other's acknowledgement (seed 49 never settled its publishers).
#[test]
fn copies_relayed_back_and_forth_between_two_nodes_do_not_wait_for_each_other() {
    run(
        RunConfig::new(
            "broker_cluster",
            "copies_relayed_back_and_forth_between_two_nodes_do_not_wait_for_each_other",
        )
        .seeds(SEEDS_HELD_TINY),
        held_tiny,
    );
}

/// The delivery check can fail: brokers that drop acknowledged messages at a subscriber's
/// full queue are caught within the first few seeds.
#[test]
fn a_broker_that_loses_acknowledged_messages_is_caught() {
    caught(
        RunConfig::new(
            "broker_cluster",
            "a_broker_that_loses_acknowledged_messages_is_caught",
        ),
        LOSSY_SEEDS,
        lossy,
        "missing",
        "check 1",
    );
}

/// Check 9 in a calm run: the mover moves every 100-400 ms between nodes 2 and 3 while
/// the publishers go on, and gets every confirmed publish, on [`SEEDS_MOVES`] seeds.
#[test]
fn a_session_moving_between_nodes_gets_every_confirmed_publish() {
    run(
        RunConfig::new(
            "broker_cluster",
            "a_session_moving_between_nodes_gets_every_confirmed_publish",
        )
        .seeds(SEEDS_MOVES),
        with_moves,
    );
}

/// A moved session's new node killed while it holds copies back for order, and started
/// again as the old node's relays and the held copies come once more, in either order:
/// the session gets them in order (`order_restart.rs`), on [`SEEDS_ORDER_RESTART`] seeds.
#[test]
fn a_moved_sessions_order_holds_across_a_restart_of_its_new_node() {
    run(
        RunConfig::new(
            "broker_cluster",
            "a_moved_sessions_order_holds_across_a_restart_of_its_new_node",
        )
        .seeds(SEEDS_ORDER_RESTART),
        with_order_restart,
    );
}

/// The mover going back and forth between two nodes 5-60 ms apart, the publishers going
/// on: a session that comes back to a node while copies that node relayed to it on the
/// other are on their way back gets every confirmed publish, in each publisher's order, on
/// [`SEEDS_MOVES`] seeds. Before a late copy of a node's earlier stay went round the same
/// way (`routing/moving.rs`, `Moves::verdict`), seed 46 failed check 10 (node 3 relayed a
/// publisher's 23 and 24 to node 2, where the session had gone; the session came back to
/// node 3 before they did, and node 3 delivered 25 directly, ahead of them); before an old
/// node released a link for each of its moves away, not only its last (`Moves::mark`),
/// seed 106 did (two nodes each held a copy for the other's release until the hold's 2 s
/// were up).
#[test]
fn a_session_moving_back_while_its_relay_is_on_its_way_back_gets_every_publish_in_order() {
    run(
        RunConfig::new(
            "broker_cluster",
            "a_session_moving_back_while_its_relay_is_on_its_way_back_gets_every_publish_in_order",
        )
        .seeds(SEEDS_MOVES),
        with_pingpong_moves,
    );
}

/// The mover going round three nodes 5-60 ms apart, the publishers going on: a session that
/// moves on while its last move's relay is on its way gets every confirmed publish, once,
/// in each publisher's order, on [`SEEDS_MOVES`] seeds.
#[test]
fn a_session_moving_on_before_its_last_moves_relay_is_done_gets_every_publish_in_order() {
    run(
        RunConfig::new(
            "broker_cluster",
            "a_session_moving_on_before_its_last_moves_relay_is_done_gets_every_publish_in_order",
        )
        .seeds(SEEDS_MOVES),
        with_chained_moves,
    );
}

/// Check 9 can fail: with `cluster.handover_relay = false` (the handover as it was before
/// the relay) publishes routed to the mover's old node in the moment of a move are lost,
/// and the check reports them within the first [`NO_RELAY_SEEDS`] seeds.
#[test]
fn a_handover_without_its_relay_is_caught_losing_messages() {
    caught(
        RunConfig::new(
            "broker_cluster",
            "a_handover_without_its_relay_is_caught_losing_messages",
        ),
        NO_RELAY_SEEDS,
        without_handover_relay,
        "the mover missed",
        "check 9",
    );
}

/// Check 10 can fail: with `cluster.handover_order = false` (a moved session's direct
/// copies delivered at once) a copy relayed through the mover's old node comes after a
/// later one of its publisher, and the check reports it within the first
/// [`NO_RELAY_SEEDS`] seeds.
#[test]
fn a_handover_without_its_order_hold_is_caught_reordering() {
    caught(
        RunConfig::new(
            "broker_cluster",
            "a_handover_without_its_order_hold_is_caught_reordering",
        ),
        NO_RELAY_SEEDS,
        without_handover_order,
        "out of order",
        "check 10",
    );
}

/// Runs a deliberately weakened variant on seeds `1..=seeds` and asserts that one of them
/// fails, with a message that names `needle` (the check `what` that must catch it).
fn caught<F>(cfg: RunConfig, seeds: u64, scenario: fn() -> F, needle: &str, what: &str)
where
    F: std::future::Future<Output = ()> + 'static,
{
    let f = (1..=seeds)
        .find_map(|seed| run_seed(&cfg, seed, scenario).err())
        .unwrap_or_else(|| panic!("the weakened variant passed every seed: {what} cannot fail"));
    assert!(
        f.message.contains(needle),
        "caught, but not by {what}: {}",
        f.message
    );
}
