//! Leader stability under follower overload with broker load, not a synthetic one (issue 13,
//! Build 5; the rmqtt report: followers busy with client requests answered heartbeats late,
//! and a leader with check_quorum kept stepping down).
//!
//! Three real broker nodes (`Broker` with `cluster.enabled`: raft and forwarding over the
//! production QUIC endpoint, check_quorum and pre_vote on, the default 1 s election
//! timeout). Each node has a simulated CPU (`starling_rt::cpu`): two worker threads, as on
//! this project's 2-core machines, on which every actor turn waits its place and takes
//! simulated time (`CLIENT_TURN` for a client, `TURN` for the others). Both followers are
//! then flooded for 60 simulated seconds by MQTT clients: a publish flood from clients
//! connected before it, and a connection storm of new client ids (each CONNECT a claim
//! that raft must commit), about twice what their workers can run, so that a worker's run
//! queue grows past 4 s. A client on the leader's node connects as new client ids all
//! along: each claim needs a quorum, so a flooded follower's raft driver must answer.
//!
//! - With `cluster.raft_priority` on (the default: the raft driver on a thread of its own,
//!   its peers' messages on the urgent lane) the leader must stay: 0 leader changes on every
//!   node, and the claims keep committing (one a second at least).
//! - The companion turns it off (the driver on a worker, behind the clients ready there):
//!   the leader must change at least 4 times. That proves the flood really stalls the
//!   followers, so the first test could fail.
//!
//! Run: `cd sim && cargo test --features sim --test broker_overload`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use madsim::rand::{thread_rng, Rng};
use madsim::time::{sleep, timeout, Instant};
use starling_broker::{Admin, Broker, ClusterStatus};
use starling_codec::{Packet, Properties, Protocol, Publish, QoS};
use starling_rt::cpu::{self, CpuModel};
use starling_sim::cluster::{node_ip, peers_toml};
use starling_sim::mqtt::{pid, ClientNodes, ConnectOpts, MqttClient};
use starling_sim::{check, run, Cluster, RunConfig};

const NODES: usize = 3;
const MQTT_PORT: u16 = 1883;
const CLUSTER_PORT: u16 = 7001;
/// Worker threads of each node's simulated CPU.
const WORKERS: usize = 2;
/// What a client's turn costs: one that reads a socket buffer of publishes and routes them
/// (a flooding client's turn, about a thousand small publishes at a few microseconds each).
const CLIENT_TURN: Duration = Duration::from_millis(20);
/// What a turn of any other actor costs: the registry, the cluster actor, a shard, the raft
/// driver (a message from a peer, a batch applied).
const TURN: Duration = Duration::from_micros(100);
/// The flood.
const RUN: Duration = Duration::from_secs(60);
/// Client machines per flooded follower; flooding clients and storming clients on each.
const MACHINES: usize = 4;
const FLOODERS: usize = 100;
const STORMERS: usize = 25;
/// Time between two publishes of a flooder.
const PACE: Duration = Duration::from_millis(200);
/// Time the flooders have to connect before the flood.
const CONNECT_PHASE: Duration = Duration::from_secs(10);
/// How long a client waits for its CONNACK.
const CONNECT_WAIT: Duration = Duration::from_secs(10);
/// Seeds of each test (a seed costs about three seconds of wall time).
const SEEDS: u64 = 100;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Setup {
    base: PathBuf,
    raft_priority: bool,
    admins: Mutex<Vec<Option<Admin>>>,
}

fn node_config(setup: &Setup, node: usize) -> String {
    let id = node + 1;
    let base = setup.base.display();
    let peers = peers_toml(0..NODES, CLUSTER_PORT);
    format!(
        "[node]\nid = {id}\nname = \"node{id}\"\ndata_dir = \"{base}/node{id}\"\n\
         [[listeners]]\nkind = \"tcp\"\nbind = \"0.0.0.0:{MQTT_PORT}\"\n\
         [storage]\nenabled = false\n\
         [cluster]\nenabled = true\ncerts_dir = \"{base}/certs\"\nraft_priority = {}\n\
         [cluster.peers]\n{peers}",
        setup.raft_priority
    )
}

async fn node_main(setup: Arc<Setup>, node: usize) {
    cpu::install(CpuModel {
        workers: WORKERS,
        cost: Arc::new(|name| if name == "client" { CLIENT_TURN } else { TURN }),
    });
    let text = node_config(&setup, node);
    let config = starling_config::Config::from_str(&text)
        .expect("valid node config")
        .0;
    let broker = Broker::start(config).await.expect("broker node starts");
    lock(&setup.admins)[node] = Some(broker.admin());
    std::future::pending::<()>().await;
}

async fn statuses(setup: &Setup) -> Vec<Option<ClusterStatus>> {
    let admins = lock(&setup.admins).clone();
    let mut out = Vec::new();
    for a in admins {
        let s = match a {
            // Long: a flooded node's cluster actor answers behind its worker's run queue.
            Some(a) => match timeout(Duration::from_secs(30), a.cluster_status()).await {
                Ok(Ok(s)) => s,
                _ => None,
            },
            None => None,
        };
        out.push(s);
    }
    out
}

/// The leader (index) every node names, if they agree.
async fn agreed_leader(setup: &Setup) -> Option<usize> {
    let all = statuses(setup).await;
    let leaders: Vec<Option<u64>> = all.iter().map(|s| s.as_ref()?.leader).collect();
    match leaders.first() {
        Some(Some(l)) if leaders.iter().all(|x| *x == Some(*l)) => Some(*l as usize - 1),
        _ => None,
    }
}

/// One flooding client: connected for the whole run, it publishes at QoS 1, one publish at
/// a time, the next `PACE` after the last one's PUBACK: its actor has a turn waiting on its
/// worker most of the time, and what it sends never piles up unread (the simulated TCP
/// has no flow control to stop it).
async fn flooder(node: usize, name: String, start: Instant, end: Instant) {
    let addr = SocketAddr::new(node_ip(node), MQTT_PORT);
    sleep(Duration::from_millis(thread_rng().gen_range(0..5000))).await;
    let opts = ConnectOpts {
        client_id: name.clone(),
        protocol: Protocol::V5,
        clean_start: true,
        session_expiry: 0,
        will: None,
    };
    while Instant::now() < end {
        let Ok(Ok((mut c, _))) = timeout(CONNECT_WAIT, MqttClient::connect(addr, &opts)).await
        else {
            sleep(Duration::from_millis(500)).await;
            continue;
        };
        // Connected before the flood starts: under it, a CONNECT waits behind it too.
        madsim::time::sleep_until(start).await;
        let mut id = 0u32;
        while Instant::now() < end {
            id += 1;
            let p = Packet::Publish(Publish {
                dup: false,
                qos: QoS::AtLeastOnce,
                retain: false,
                topic: format!("load/{name}"),
                packet_id: Some(pid(id)),
                properties: Properties::default(),
                payload: Bytes::from_static(b"0123456789abcdef0123456789abcdef"),
            });
            if c.send(&p).await.is_err() {
                break;
            }
            let acked = timeout(Duration::from_secs(60), async {
                while let Ok(p) = c.recv().await {
                    if matches!(p, Packet::Puback(_)) {
                        return true;
                    }
                }
                false
            })
            .await;
            if acked != Ok(true) {
                break;
            }
            sleep(PACE).await;
        }
    }
}

/// One client of the connection storm: connects as a new client id (a claim the log must
/// commit), stays a moment, leaves, and again, until `end`. Counts its CONNACKs.
async fn stormer(
    node: usize,
    name: String,
    start: Instant,
    end: Instant,
    connected: Arc<AtomicU64>,
    pause: Duration,
) {
    let addr = SocketAddr::new(node_ip(node), MQTT_PORT);
    let mut round = 0u64;
    madsim::time::sleep_until(start).await;
    sleep(Duration::from_millis(thread_rng().gen_range(0..1000))).await;
    while Instant::now() < end {
        round += 1;
        let opts = ConnectOpts {
            client_id: format!("{name}-{round}"),
            protocol: Protocol::V5,
            clean_start: true,
            session_expiry: 0,
            will: None,
        };
        match timeout(CONNECT_WAIT, MqttClient::connect(addr, &opts)).await {
            Ok(Ok((c, _))) => {
                connected.fetch_add(1, Ordering::Relaxed);
                sleep(pause).await;
                c.disconnect().await;
            }
            _ => sleep(pause).await,
        }
    }
}

struct Outcome {
    leader_changes: u64,
    /// CONNACKs of the storm on the followers.
    stormed: u64,
    /// CONNACKs of new client ids on the leader's node.
    claimed: u64,
    committed: u64,
}

async fn overload(raft_priority: bool) -> Outcome {
    let base = std::env::temp_dir().join(format!(
        "starling-sim-broker-overload-{}-{raft_priority}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&base);
    for id in 1..=NODES as u64 {
        starling_raft::certs::issue_node(&base.join("certs"), id, &[]).expect("certificate");
    }
    let setup = Arc::new(Setup {
        base: base.clone(),
        raft_priority,
        admins: Mutex::new(vec![None; NODES]),
    });
    let s = setup.clone();
    let _cluster = Cluster::build(NODES, move |i| node_main(s.clone(), i));

    // A leader, then a calm second so that the first election's changes are not counted.
    let started = Instant::now();
    let leader = loop {
        if let Some(l) = agreed_leader(&setup).await {
            break l;
        }
        check!(
            started.elapsed() < Duration::from_secs(30),
            "no leader 30 s after start"
        );
        sleep(Duration::from_millis(100)).await;
    };
    let changes = |all: &[Option<ClusterStatus>]| -> u64 {
        all.iter().flatten().map(|s| s.leader_changes).sum()
    };
    let commit = |all: &[Option<ClusterStatus>]| -> u64 {
        all.iter().flatten().map(|s| s.commit).max().unwrap_or(0)
    };

    // The flooders connect first (under the flood a CONNECT waits behind it too), then
    // flood from `start`; the storm starts with them.
    let start = Instant::now() + CONNECT_PHASE;
    let end = start + RUN;
    let stormed = Arc::new(AtomicU64::new(0));
    let claimed = Arc::new(AtomicU64::new(0));
    let mut machines = ClientNodes::default();
    for f in (0..NODES).filter(|&n| n != leader) {
        for m in 0..MACHINES {
            let machine = machines.node(format!("flood-n{}-m{m}", f + 1));
            for k in 0..FLOODERS {
                machine.spawn(flooder(f, format!("n{}-m{m}-f{k}", f + 1), start, end));
            }
            for k in 0..STORMERS {
                let name = format!("n{}-m{m}-s{k}", f + 1);
                let pause = Duration::from_millis(500);
                machine.spawn(stormer(f, name, start, end, stormed.clone(), pause));
            }
        }
    }
    // New client ids on the leader's node, one at a time: each CONNECT is a claim that
    // needs a quorum, so a follower's raft driver must answer for it to commit.
    let pause = Duration::from_millis(100);
    machines.node("claims").spawn(stormer(
        leader,
        "claim".into(),
        start,
        end,
        claimed.clone(),
        pause,
    ));
    // Taken before the flood: a flooded node's status answers late.
    madsim::time::sleep_until(start - Duration::from_millis(500)).await;
    let before = statuses(&setup).await;
    check!(
        before.iter().all(Option::is_some),
        "a node gave no status before the flood: {before:?}"
    );
    madsim::time::sleep_until(end).await;
    // A flooded node's cluster actor (which answers for its status) has a backlog to work
    // off first; leader changes are counted since its start, so a late answer counts all.
    let after = loop {
        let all = statuses(&setup).await;
        if all.iter().all(Option::is_some) {
            break all;
        }
        check!(
            end.elapsed() < Duration::from_secs(120),
            "a node gave no status 120 s after the flood: {all:?}"
        );
    };
    let out = Outcome {
        leader_changes: changes(&after).saturating_sub(changes(&before)),
        stormed: stormed.load(Ordering::Relaxed),
        claimed: claimed.load(Ordering::Relaxed),
        committed: commit(&after).saturating_sub(commit(&before)),
    };
    let turns: Vec<String> = cpu::stats()
        .into_iter()
        .map(|(node, name, s)| {
            format!(
                "{node}/{name}: {} turns, longest wait {:?}",
                s.turns, s.waited_max
            )
        })
        .collect();
    println!(
        "[sim] raft_priority={raft_priority}: {} leader changes, {} storm connections on the followers, {} claims on the leader's node, {} entries committed in {RUN:?} (first leader node{}); {}",
        out.leader_changes,
        out.stormed,
        out.claimed,
        out.committed,
        leader + 1,
        turns.join("; ")
    );
    let _ = std::fs::remove_dir_all(&base);
    out
}

async fn keeps_the_leader() {
    let out = overload(true).await;
    check!(
        out.leader_changes == 0,
        "the leader was deposed: {} leader changes",
        out.leader_changes
    );
    // A claim a second at least: each was committed by a quorum, so a flooded follower's
    // raft driver answered for it.
    check!(
        out.claimed >= RUN.as_secs() && out.committed >= out.claimed,
        "the log stalled: {} claims on the leader's node, {} entries committed",
        out.claimed,
        out.committed
    );
}

async fn shows_the_step_down_loop() {
    let out = overload(false).await;
    check!(
        out.leader_changes >= 4,
        "expected the leader to be deposed again and again, saw {} leader changes",
        out.leader_changes
    );
}

#[test]
fn flooded_followers_keep_the_leader() {
    run(
        RunConfig::new("broker_overload", "flooded_followers_keep_the_leader").seeds(SEEDS),
        keeps_the_leader,
    );
}

#[test]
fn without_raft_priority_flooded_followers_depose_the_leader_again_and_again() {
    run(
        RunConfig::new(
            "broker_overload",
            "without_raft_priority_flooded_followers_depose_the_leader_again_and_again",
        )
        .seeds(SEEDS),
        shows_the_step_down_loop,
    );
}
