//! Membership on simulated machines: a fourth node with an empty log, outside the initial
//! membership, never elects itself (even cut off from everyone); it joins as a learner
//! (caught up by snapshot), becomes a voter, and the cluster keeps working after node 1 is
//! removed and powered off. A leadership transfer lands on the chosen node.
//!
//! Run: `cd sim && cargo test --features sim --test raft_membership`.

#[path = "raft_support.rs"]
mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use madsim::net::NetSim;
use madsim::runtime::Handle;
use starling_raft::{Consistency, RaftHandle, RequestId};
use starling_rt::time;

use starling_sim::{check, run, RunConfig};
use support::{Cluster, NodeOpts, SimNet};

async fn leader_of(cluster: &Cluster, ids: &[u64], seed: u64) -> (u64, RaftHandle) {
    for _ in 0..400 {
        if let Some(l) = cluster.leader() {
            if ids.contains(&l) {
                return (l, cluster.handle(l).unwrap());
            }
        }
        time::sleep(Duration::from_millis(50)).await;
    }
    check!(false, "seed {seed}: no leader among {ids:?}");
    unreachable!("check! fails the run")
}

#[test]
fn raft_membership_join_promote_remove_and_transfer() {
    run(
        RunConfig::new(
            "raft_membership",
            "raft_membership_join_promote_remove_and_transfer",
        )
        .seeds(200),
        join_promote_remove_and_transfer,
    );
}

async fn join_promote_remove_and_transfer() {
    let seed = Handle::current().seed();
    let cluster = Cluster::start(
        &[1, 2, 3, 4],
        NodeOpts {
            voters: vec![1, 2, 3],
            tweak: Arc::new(|c| {
                c.tick_interval = Duration::from_millis(50);
                c.snapshot_threshold = 20;
            }),
            query_cost: Duration::ZERO,
            net: SimNet::Datagram,
        },
    );
    let net = NetSim::current();
    // Node 4 alone: cut off, empty log, not a member. It must never lead.
    net.clog_node(cluster.node_id(4));
    let (_, lh) = leader_of(&cluster, &[1, 2, 3], seed).await;
    let mut seq = 0;
    let mut write = |h: RaftHandle, v: String| {
        seq += 1;
        let id = RequestId { client_id: 1, seq };
        async move { h.propose(id, v.into_bytes()).await }
    };
    for i in 0..50 {
        write(lh.clone(), format!("k{i}={i}")).await.unwrap();
    }
    time::sleep(Duration::from_secs(5)).await;
    let m4 = cluster.handle(4).unwrap();
    check!(
        m4.metrics().leader.load(Ordering::Relaxed) == 0,
        "node 4, outside the membership, saw itself lead"
    );
    let term4 = m4.status().await.unwrap().term;
    check!(term4 == 0, "node 4 campaigned (term {term4})");
    net.unclog_node(cluster.node_id(4));

    // Join as learner (the log was compacted: it needs the snapshot), then promote.
    let (_, lh) = leader_of(&cluster, &[1, 2, 3], seed).await;
    let conf = lh.add_learner(4).await.unwrap();
    check!(
        conf.learners == vec![4],
        "learners after add: {:?}",
        conf.learners
    );
    let conf = lh.add_voter(4).await.unwrap();
    check!(
        conf.voters.contains(&4),
        "voters after promote: {:?}",
        conf.voters
    );
    for _ in 0..100 {
        let v = m4.read(b"k49".to_vec(), Consistency::Stale).await.unwrap();
        if v == b"49" {
            break;
        }
        time::sleep(Duration::from_millis(50)).await;
    }
    let v = m4
        .read(b"k49".to_vec(), Consistency::Linearizable)
        .await
        .unwrap();
    check!(
        v == b"49",
        "node 4 reads k49 = {:?}",
        String::from_utf8_lossy(&v)
    );

    // Remove node 1 and power it off; the other three carry on.
    let (_, lh) = leader_of(&cluster, &[1, 2, 3, 4], seed).await;
    let conf = lh.remove_node(1).await.unwrap();
    check!(
        !conf.voters.contains(&1),
        "voters after remove: {:?}",
        conf.voters
    );
    cluster.kill(1, seed);
    let (l, lh) = leader_of(&cluster, &[2, 3, 4], seed).await;
    write(lh.clone(), "after=removal".to_string())
        .await
        .unwrap();

    // Hand leadership to another member.
    let to = [2, 3, 4].into_iter().find(|&i| i != l).unwrap();
    lh.transfer_leader(to).await.unwrap();
    let mut moved = false;
    for _ in 0..100 {
        time::sleep(Duration::from_millis(50)).await;
        if cluster.leader() == Some(to) {
            moved = true;
            break;
        }
    }
    check!(moved, "leadership did not move to {to}");
    let th = cluster.handle(to).unwrap();
    write(th.clone(), "after=transfer".to_string())
        .await
        .unwrap();
    let st = th.status().await.unwrap();
    check!(st.voters == vec![2, 3, 4], "final voters {:?}", st.voters);
    check!(
        st.progress.len() == 3,
        "progress of {} peers",
        st.progress.len()
    );
    for id in [2, 3, 4] {
        cluster.handle(id).unwrap().stop();
    }
}
