//! Follower overload, after the rmqtt-raft report (issue 4): followers busy with client work
//! answered heartbeats late, and a leader with check_quorum kept stepping down and being
//! re-elected. Here both followers get waves of slow reads (5 ms each, 400 per wave: a 2 s
//! backlog every 3 s, twice the 1 s election timeout) while a client proposes on the leader.
//!
//! - With raft traffic on the urgent lane (the default), the leader must survive 60
//!   simulated seconds with 0 leader changes and proposals keep committing.
//! - The companion puts raft messages on the normal lane, behind the reads: the leader is
//!   deposed again and again. That proves the scenario really stalls followers, so the
//!   first test could fail.
//!
//! Run: `cd sim && cargo test --features sim --test raft_overload`.

#[path = "raft_support.rs"]
mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use madsim::runtime::Handle;
use starling_raft::{Consistency, RequestId};
use starling_rt::time;

use starling_sim::{check, run, RunConfig};
use support::{Cluster, NodeOpts, SimNet};

const IDS: [u64; 3] = [1, 2, 3];
const WAVE: usize = 400;
const WAVE_EVERY: Duration = Duration::from_secs(3);
const QUERY_COST: Duration = Duration::from_millis(5);
const RUN: Duration = Duration::from_secs(60);

struct Outcome {
    leader_changes: u64,
    committed: u64,
    proposed: u64,
}

async fn overload(raft_priority: bool) -> Outcome {
    let seed = Handle::current().seed();
    let cluster = Cluster::start(
        &IDS,
        NodeOpts {
            voters: IDS.to_vec(),
            tweak: Arc::new(move |c| {
                // The report's setting: defaults (100 ms tick, election after 10 ticks) with
                // check_quorum and pre_vote on.
                c.check_quorum = true;
                c.pre_vote = true;
                c.raft_priority = raft_priority;
            }),
            query_cost: QUERY_COST,
            net: SimNet::Datagram,
        },
    );
    // A leader, then a calm second so that the election's own changes are not counted.
    let mut leader = None;
    for _ in 0..200 {
        time::sleep(Duration::from_millis(50)).await;
        leader = cluster.leader();
        if leader.is_some() {
            break;
        }
    }
    check!(leader.is_some(), "no first leader");
    let leader = leader.unwrap_or_default();
    time::sleep(Duration::from_secs(1)).await;
    let changes_at = |c: &Cluster| -> u64 {
        IDS.iter()
            .filter_map(|id| c.handle(*id))
            .map(|h| h.metrics().leader_changes.load(Ordering::Relaxed))
            .sum()
    };
    let before = changes_at(&cluster);
    let end = time::now() + RUN;

    let clients = Handle::current()
        .create_node()
        .name("clients")
        .ip("10.0.2.1".parse().unwrap())
        .build();
    // Waves of slow reads on both followers.
    for f in IDS.into_iter().filter(|&i| i != leader) {
        let h = cluster.handle(f).unwrap();
        clients.spawn(async move {
            while time::now() < end {
                for _ in 0..WAVE {
                    let h = h.clone();
                    starling_rt::spawn(async move {
                        let _ = h.read(b"k".to_vec(), Consistency::Stale).await;
                    });
                }
                time::sleep(WAVE_EVERY).await;
            }
        });
    }
    // A steady writer through the first leader (forwarded if leadership moved).
    let committed = Arc::new(AtomicU64::new(0));
    let proposed = Arc::new(AtomicU64::new(0));
    let writer = {
        let (h, committed, proposed) = (
            cluster.handle(leader).unwrap(),
            committed.clone(),
            proposed.clone(),
        );
        clients.spawn(async move {
            let mut seq = 0;
            while time::now() < end {
                seq += 1;
                proposed.fetch_add(1, Ordering::Relaxed);
                let id = RequestId { client_id: 7, seq };
                if time::timeout(
                    Duration::from_secs(1),
                    h.propose(id, format!("k=v{seq}").into_bytes()),
                )
                .await
                .is_some_and(|r| r.is_ok())
                {
                    committed.fetch_add(1, Ordering::Relaxed);
                }
                time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    writer.await.unwrap();
    let out = Outcome {
        leader_changes: changes_at(&cluster) - before,
        committed: committed.load(Ordering::Relaxed),
        proposed: proposed.load(Ordering::Relaxed),
    };
    println!(
        "seed {seed} raft_priority={raft_priority}: {} leader changes, {}/{} proposals committed in {RUN:?}",
        out.leader_changes, out.committed, out.proposed
    );
    for id in IDS {
        if let Some(h) = cluster.handle(id) {
            h.stop();
        }
    }
    out
}

#[test]
fn raft_overload_flooded_followers_keep_the_leader() {
    run(
        RunConfig::new(
            "raft_overload",
            "raft_overload_flooded_followers_keep_the_leader",
        )
        .seeds(SEEDS),
        keeps_the_leader,
    );
}

#[test]
fn raft_overload_without_priority_shows_the_step_down_loop() {
    run(
        RunConfig::new(
            "raft_overload",
            "raft_overload_without_priority_shows_the_step_down_loop",
        )
        .seeds(SEEDS),
        shows_the_step_down_loop,
    );
}

const SEEDS: u64 = 200;

async fn keeps_the_leader() {
    let out = overload(true).await;
    check!(
        out.leader_changes == 0,
        "the leader was deposed {} times",
        out.leader_changes
    );
    check!(
        out.committed * 10 >= out.proposed * 9,
        "proposals stalled: {}/{}",
        out.committed,
        out.proposed
    );
}

async fn shows_the_step_down_loop() {
    let out = overload(false).await;
    check!(
        out.leader_changes >= 2,
        "expected the leader to be deposed repeatedly, saw {} changes",
        out.leader_changes
    );
}
