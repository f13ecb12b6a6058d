//! Raft under chaos: three replicas of a key-value register while a nemesis partitions them
//! (random node, the leader, one-way links), delays and drops messages, kills and restarts
//! them with power loss (one or two at once, unsynced bytes lost or torn). Safety during chaos: at most one leader per
//! term. After the heal: a leader within a deadline, a proposal through every node
//! completes, replicas converge, logs match, and the whole client history is linearizable.
//!
//! The same scenario runs twice: over datagrams (200 seeds, plus the corpus), and over the
//! production QUIC transport with mutual TLS (fewer seeds: quinn and the handshakes cost
//! real CPU per simulated second).
//!
//! Run: `cd sim && cargo test --features sim --test raft_chaos` (see `docs/simulation.md`
//! for replaying a seed).

#[path = "raft_support.rs"]
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use madsim::net::NetSim;
use madsim::runtime::Handle;
use rand::Rng as _;
use starling_raft::{Consistency, DiskLog, GetEntriesContext, LogStore, RequestId, Storage};
use starling_rt::time;

use starling_sim::{check, run, RunConfig};
use support::{check_linearizable, Cluster, History, NodeOpts, Op, OpKind, SimNet};

const IDS: [u64; 3] = [1, 2, 3];
const KEYS: u64 = 3;
const CLIENTS: u64 = 4;

fn opts(net: SimNet) -> NodeOpts {
    NodeOpts {
        net,
        voters: IDS.to_vec(),
        tweak: Arc::new(|c| {
            c.tick_interval = Duration::from_millis(50);
            c.request_timeout = Duration::from_secs(2);
            // Small, so that compaction and snapshot installs happen within a run.
            c.snapshot_threshold = 40;
            c.log.segment_bytes_max = 2048;
        }),
        query_cost: Duration::ZERO,
    }
}

/// Knobs of this suite beyond the harness's (`starling_sim::Knobs`, printed by the runner:
/// chaos length, latency range, mean time between faults), drawn from the seed and printed.
#[derive(Debug)]
struct RaftKnobs {
    /// Longest hold of one fault.
    fault_ms_max: u64,
    /// Weight of kills (one node, or two) among the fault kinds.
    kill_weight: u32,
    /// Datagram loss during the chaos phase.
    loss: f64,
}

#[test]
fn raft_chaos_partitions_and_power_loss_keep_kv_linearizable() {
    run(
        RunConfig::new(
            "raft_chaos",
            "raft_chaos_partitions_and_power_loss_keep_kv_linearizable",
        )
        .seeds(200),
        chaos_over_datagrams,
    );
}

/// The production transport under the same faults: reconnects after kills and idle
/// timeouts, snapshots on their own stream, frames checked against the certificate's node.
#[test]
fn raft_chaos_over_quic_keeps_kv_linearizable() {
    run(
        RunConfig::new("raft_chaos", "raft_chaos_over_quic_keeps_kv_linearizable")
            .seeds(QUIC_SEEDS),
        chaos_over_quic,
    );
}

/// Seeds of the QUIC variant: each costs several times a datagram seed in wall time.
const QUIC_SEEDS: u64 = 100;

async fn chaos_over_datagrams() {
    chaos(SimNet::Datagram).await
}

async fn chaos_over_quic() {
    chaos(SimNet::quic(&IDS)).await
}

async fn chaos(net: SimNet) {
    let seed = Handle::current().seed();
    let harness = starling_sim::Knobs::current();
    let mut rng = starling_rt::rng::rng();
    let knobs = RaftKnobs {
        fault_ms_max: rng.gen_range(1000..4000),
        kill_weight: rng.gen_range(1..4),
        loss: rng.gen_range(0.0..0.05),
    };
    println!("[sim] raft knobs: {knobs:?}");

    let cluster = Cluster::start(&IDS, opts(net));
    let start = time::now();
    let since = move || (time::now() - start).as_nanos() as u64;
    let chaos_end = start + harness.chaos;

    // Observer: who claims leadership in which term.
    let claims: Arc<Mutex<BTreeMap<u64, BTreeSet<u64>>>> = Arc::default();
    let observing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    {
        let (cluster, claims, observing) = (cluster.clone(), claims.clone(), observing.clone());
        starling_rt::spawn(async move {
            while observing.load(Ordering::Relaxed) {
                let hs = cluster.handles.lock().unwrap().clone();
                for (id, h) in hs {
                    let m = h.metrics();
                    if m.leader.load(Ordering::Relaxed) == id {
                        let term = m.term.load(Ordering::Relaxed);
                        claims.lock().unwrap().entry(term).or_default().insert(id);
                    }
                }
                time::sleep(Duration::from_millis(2)).await;
            }
        });
    }

    // Clients on their own machine: writes (which return the previous value) and
    // linearizable reads, on random nodes.
    let history = History::default();
    let client_node = Handle::current()
        .create_node()
        .name("clients")
        .ip("10.0.2.1".parse().unwrap())
        .build();
    let mut joins = Vec::new();
    for c in 1..=CLIENTS {
        let (cluster, history) = (cluster.clone(), history.clone());
        joins.push(client_node.spawn(async move {
            let mut rng = starling_rt::rng::rng();
            let mut seq = 0;
            while time::now() < chaos_end {
                let key = format!("k{}", rng.gen_range(0..KEYS));
                let node = rng.gen_range(1..=3u64);
                let Some(h) = cluster.handle(node) else {
                    time::sleep(Duration::from_millis(20)).await;
                    continue;
                };
                let call = since();
                if rng.gen_bool(0.5) {
                    seq += 1;
                    let value = format!("c{c}-{seq}");
                    let id = RequestId { client_id: c, seq };
                    let r = h.propose(id, format!("{key}={value}").into_bytes()).await;
                    let (ret, prev) = match r {
                        Ok(p) => (since(), Some(String::from_utf8(p).unwrap())),
                        Err(_) => (u64::MAX, None),
                    };
                    history.push(Op {
                        client: c,
                        key,
                        call,
                        ret,
                        kind: OpKind::Write { value, prev },
                    });
                } else if let Ok(v) = h
                    .read(key.clone().into_bytes(), Consistency::Linearizable)
                    .await
                {
                    history.push(Op {
                        client: c,
                        key,
                        call,
                        ret: since(),
                        kind: OpKind::Read {
                            value: String::from_utf8(v).unwrap(),
                        },
                    });
                }
                time::sleep(Duration::from_millis(rng.gen_range(0..30))).await;
            }
        }));
    }

    // Nemesis.
    let net = NetSim::current();
    let normal_latency = harness.latency.0..harness.latency.1;
    {
        let (loss, latency) = (knobs.loss, normal_latency.clone());
        net.update_config(move |c| {
            c.packet_loss_rate = loss;
            c.send_latency = latency;
        });
    }
    let mut dead: BTreeSet<u64> = BTreeSet::new();
    let mut faults = Vec::new();
    while time::now() < chaos_end {
        let every = harness.fault_every.as_millis() as u64;
        time::sleep(Duration::from_millis(
            rng.gen_range(every / 2..every * 3 / 2),
        ))
        .await;
        let hold = Duration::from_millis(rng.gen_range(200..knobs.fault_ms_max));
        let w = knobs.kill_weight;
        let pick = rng.gen_range(0..(4 + 2 * w));
        let victim = rng.gen_range(1..=3u64);
        match pick {
            0 => {
                faults.push(format!("isolate {victim}"));
                net.clog_node(cluster.node_id(victim));
                time::sleep(hold).await;
                net.unclog_node(cluster.node_id(victim));
            }
            1 => {
                let l = cluster.leader().unwrap_or(victim);
                faults.push(format!("isolate leader {l}"));
                net.clog_node(cluster.node_id(l));
                time::sleep(hold).await;
                net.unclog_node(cluster.node_id(l));
            }
            2 => {
                let other = IDS[(victim as usize) % 3];
                faults.push(format!("one-way {victim}->{other}"));
                net.clog_link(cluster.node_id(victim), cluster.node_id(other));
                time::sleep(hold).await;
                net.unclog_link(cluster.node_id(victim), cluster.node_id(other));
            }
            3 => {
                // A latency spike: messages slower than the election timeout.
                let slow =
                    Duration::from_millis(100)..Duration::from_millis(rng.gen_range(200..1500));
                faults.push(format!("delay {slow:?}"));
                net.update_config(move |c| c.send_latency = slow);
                time::sleep(hold).await;
                let normal = normal_latency.clone();
                net.update_config(move |c| c.send_latency = normal);
            }
            p if p < 4 + w => {
                faults.push(format!("kill {victim}"));
                cluster.kill(victim, rng.gen());
                dead.insert(victim);
                time::sleep(hold).await;
                cluster.restart(victim);
                dead.remove(&victim);
            }
            _ => {
                let other = IDS[(victim as usize) % 3];
                faults.push(format!("kill {victim} and {other}"));
                for id in [victim, other] {
                    cluster.kill(id, rng.gen());
                }
                time::sleep(hold).await;
                for id in [victim, other] {
                    cluster.restart(id);
                }
            }
        }
    }
    println!("[sim] faults: {faults:?}");
    for j in joins {
        j.await.unwrap();
    }

    // Heal: every node up and connected; a leader and progress through every node by the
    // deadline.
    for id in IDS {
        net.unclog_node(cluster.node_id(id));
    }
    net.update_config(|c| {
        c.packet_loss_rate = 0.0;
        c.send_latency = Duration::from_millis(1)..Duration::from_millis(10);
    });
    let heal_deadline = time::now() + Duration::from_secs(15);
    for id in IDS {
        loop {
            if time::now() >= heal_deadline {
                for id in IDS {
                    if let Some(h) = cluster.handle(id) {
                        println!("status {id}: {:?}", h.status().await);
                    }
                }
                check!(
                    false,
                    "node {id} made no progress after the heal; faults: {faults:?}"
                );
            }
            if let Some(h) = cluster.handle(id) {
                let rid = RequestId {
                    client_id: 100 + id,
                    seq: 1,
                };
                if h.propose(rid, format!("heal{id}=ok").into_bytes())
                    .await
                    .is_ok()
                {
                    break;
                }
            }
            time::sleep(Duration::from_millis(100)).await;
        }
    }
    check!(cluster.leader().is_some(), "no leader after the heal");

    // Converge: all applied to the same index.
    loop {
        check!(time::now() < heal_deadline, "replicas did not converge");
        let mut applied = BTreeSet::new();
        let mut commits = BTreeSet::new();
        for id in IDS {
            let s = cluster.handle(id).unwrap().status().await.unwrap();
            applied.insert(s.applied);
            commits.insert(s.commit);
        }
        if applied.len() == 1 && commits.len() == 1 && applied == commits {
            break;
        }
        time::sleep(Duration::from_millis(50)).await;
    }
    // Final linearizable reads join the history; replicas' stale reads agree.
    for k in 0..KEYS {
        let key = format!("k{k}");
        let mut seen = BTreeSet::new();
        for id in IDS {
            let h = cluster.handle(id).unwrap();
            let call = since();
            let v = h
                .read(key.clone().into_bytes(), Consistency::Linearizable)
                .await
                .expect("read after heal");
            history.push(Op {
                client: 999,
                key: key.clone(),
                call,
                ret: since(),
                kind: OpKind::Read {
                    value: String::from_utf8(v.clone()).unwrap(),
                },
            });
            let stale = h
                .read(key.clone().into_bytes(), Consistency::Stale)
                .await
                .unwrap();
            seen.insert(stale);
        }
        check!(seen.len() == 1, "replicas disagree on {key}: {seen:?}");
    }
    observing.store(false, Ordering::Relaxed);

    // At most one leader per term.
    for (term, leaders) in claims.lock().unwrap().iter() {
        check!(leaders.len() <= 1, "term {term} had leaders {leaders:?}");
    }

    // Log matching on copies of the disks: where two logs hold an entry with the same
    // index and term, they hold the same entries up to it.
    let mut logs = BTreeMap::new();
    for id in IDS {
        let log = DiskLog::open(cluster.disks[&id].fork(), Default::default()).unwrap();
        let first = raft_first(&log);
        let last = raft_last(&log);
        let es = if last >= first {
            Storage::entries(&log, first, last + 1, None, GetEntriesContext::empty(false)).unwrap()
        } else {
            vec![]
        };
        let commit = log.hard_state().commit;
        logs.insert(id, (es, commit));
    }
    for a in IDS {
        for b in IDS {
            if a >= b {
                continue;
            }
            let (ea, _) = &logs[&a];
            let (eb, _) = &logs[&b];
            let ia: BTreeMap<u64, _> = ea.iter().map(|e| (e.index, e)).collect();
            let ib: BTreeMap<u64, _> = eb.iter().map(|e| (e.index, e)).collect();
            let top = ia
                .iter()
                .filter(|(i, e)| ib.get(i).map(|f| f.term) == Some(e.term))
                .map(|(i, _)| *i)
                .max();
            if let Some(top) = top {
                for (i, e) in ia.range(..=top) {
                    if let Some(f) = ib.get(i) {
                        check!(
                            (e.term, &e.data) == (f.term, &f.data),
                            "logs of {a} and {b} differ at {i}"
                        );
                    }
                }
            }
        }
    }

    let ops = history.ops();
    let acked = ops
        .iter()
        .filter(|o| o.ret != u64::MAX && matches!(o.kind, OpKind::Write { .. }))
        .count();
    let terms = claims.lock().unwrap().len();
    println!(
        "seed {seed}: {} ops ({acked} acknowledged writes), {terms} terms with a leader",
        ops.len()
    );
    if let Err(e) = check_linearizable(&ops) {
        check!(false, "history not linearizable: {e}; faults: {faults:?}");
    }
    for id in IDS {
        cluster.handle(id).unwrap().stop();
    }
}

fn raft_first<L: LogStore>(l: &L) -> u64 {
    Storage::first_index(l).unwrap()
}

fn raft_last<L: LogStore>(l: &L) -> u64 {
    Storage::last_index(l).unwrap()
}
