//! Actors on 3 nodes stream numbered messages to each other over the transport seam while
//! the nemesis partitions, delays, overloads, kills and restarts nodes. Safety (order, no
//! gap, no false acknowledgement) is checked at every delivery; after the heal every live
//! stream must complete by the deadline.

use std::time::Duration;

use starling_sim::relay::{node_main, Oracle};
use starling_sim::{check, run, Cluster, Knobs, Nemesis, RunConfig};

const MESSAGES: u64 = 600;

async fn relay_under_chaos() {
    let knobs = Knobs::current();
    let oracle = Oracle::shared();
    let o = oracle.clone();
    let nodes = knobs.nodes;
    let cluster = Cluster::build(nodes, move |i| node_main(i, nodes, MESSAGES, o.clone()));
    madsim::time::sleep(Duration::from_millis(500)).await;

    let mut nemesis = Nemesis::new(knobs.clone());
    nemesis.chaos(&cluster).await;

    let deadline = madsim::time::Instant::now() + knobs.heal_deadline + Duration::from_secs(15);
    loop {
        let pending = oracle.lock().unwrap().pending(nodes, MESSAGES);
        if pending.is_empty() {
            break;
        }
        check!(
            madsim::time::Instant::now() < deadline,
            "not converged after the heal; pending (link, acked): {pending:?}\nfaults:\n{}",
            nemesis.schedule()
        );
        madsim::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(oracle.lock().unwrap().deliveries > 0);
}

#[test]
fn relay_ordered_and_complete_under_partitions_and_restarts() {
    run(
        RunConfig::new(
            "rt_relay",
            "relay_ordered_and_complete_under_partitions_and_restarts",
        ),
        relay_under_chaos,
    );
}
