//! Order across a move when the session's new node restarts while it holds copies back: a
//! session moves from node A to node B; node C cannot reach A, so its publishes 1-5 for the
//! session, routed before the move's cut, are parked at C for A. Once B has the session
//! and C has applied the cut, C publishes 6-10: they go straight to B, which holds them
//! back until A has relayed what C sent it before the cut (A's release of C's link comes
//! behind its relays). B is killed within that hold, C is let reach A, and B starts again
//! 2 s later: A's relays of 1-5 (and its release) and C's 6-10 (never acknowledged, so
//! sent again) then reach B in either order. The session must get 1 to 10 in order: B
//! holds again after its restart (before, the hold was gone with it, and 6-10 went
//! first whenever C's link came back first).

#[allow(unused_imports)]
use super::*;
use std::sync::atomic::{AtomicBool, Ordering};

/// Three nodes with stores, no nemesis: the scenario cuts C off from A itself. Batches
/// are parked after 1.2 s without an acknowledgement.
pub(crate) const ORDER_RESTART: Variant = Variant {
    name: "order-restart",
    ..super::late_relay::LATE_RELAY
};

const ROAMER: &str = "order-roamer";
const FILTER: &str = "order/#";
const TOPIC: &str = "order/x";
/// Publishes before the cut (parked at C for A), and as many after it.
const BEFORE: u64 = 5;

pub(crate) async fn scenario() {
    let (setup, cluster, base) = start(ORDER_RESTART, 1, true);
    // As in `late_relay`: the cut between the followers keeps raft going.
    let (b, a, c) = leader_and_followers(&setup).await;
    let mut clients = ClientNodes::default();
    leave_subscribed(&mut clients, a, ROAMER, FILTER).await;
    wait_routed(&setup, c, FILTER, &[a]).await;
    let c_admin = setup.admin(c).expect("C runs");

    // Routed before the cut: parked at C for A (and acknowledged).
    cluster.clog_one_way(c, a);
    publish_acked(&mut clients, c, ("order-publisher", TOPIC), BEFORE, |seq| {
        Bytes::from(format!("0:{seq}"))
    })
    .await;
    let parked = c_admin.metrics().cluster_outbox_parked;
    check!(
        parked >= BEFORE,
        "C parked {parked} messages, not the {BEFORE} it could not deliver"
    );

    // The session moves to B and waits there for all of them, in order.
    let roamer = clients.node(ROAMER).spawn(take_in_order(b, 2 * BEFORE));
    wait_session_stored(&setup, b).await;
    // Every node applies the cut within milliseconds of B's install (no fault but C's
    // link to A): C routes what follows past it, straight to B (and to A, as the relay).
    sleep(ms(500)).await;
    let go = Arc::new(AtomicBool::new(false));
    let after = pipelined_publisher(&mut clients, c, go.clone());
    go.store(true, Ordering::SeqCst);
    // Within B's 2 s hold (A cannot release C's link: C's copies cannot reach it).
    sleep(ms(700)).await;
    cluster.kill(b);
    setup.crash_disk(b);
    lock(&setup.admins).remove(&b);
    cluster.unclog_one_way(c, a);
    sleep(Duration::from_secs(2)).await;
    cluster.restart(b);

    after.await.expect("the publisher after the cut");
    let (present, got) = roamer.await.expect("the roamer's connection");
    check!(
        present,
        "the roamer's session was not on B after its restart"
    );
    let mut first = Vec::new();
    for seq in got {
        if !first.contains(&seq) {
            first.push(seq);
        }
    }
    check!(
        first == (1..=2 * BEFORE).collect::<Vec<_>>(),
        "the roamer got {first:?} (first arrivals), not 1 to {} in order",
        2 * BEFORE
    );
    let _ = std::fs::remove_dir_all(&base);
}

/// The roamer on `node`, its session kept, taking `n` messages in their order of arrival
/// (connecting again while its node is down): (session present, what came).
async fn take_in_order(node: usize, n: u64) -> (bool, Vec<u64>) {
    let mut o = opts(ROAMER);
    o.clean_start = false;
    let mut got = Vec::new();
    let by = Instant::now() + Duration::from_secs(90);
    let forever = Instant::now() + Duration::from_secs(600);
    while Instant::now() < by {
        let Some((mut c, connack)) = connect_by(mqtt_addr(node), &o, forever).await else {
            break;
        };
        if !connack.session_present {
            c.disconnect().await;
            return (false, got);
        }
        loop {
            let left = by.saturating_duration_since(Instant::now());
            match timeout(left, c.recv()).await {
                Ok(Ok(Packet::Publish(p))) => {
                    puback(&mut c, &p).await;
                    got.push(parse(&p.payload).1);
                    let mut seen = got.clone();
                    seen.sort_unstable();
                    seen.dedup();
                    if seen.len() as u64 == n {
                        c.disconnect().await;
                        return (true, got);
                    }
                }
                Ok(Ok(_)) => {}
                // Its node was killed: connected again once it runs.
                Ok(Err(_)) => break,
                Err(_) => return (true, got),
            }
        }
    }
    (true, got)
}

/// The publisher on `node`, connected first, sending `BEFORE + 1` to `2 * BEFORE` once `go`
/// is set, all at once, then waiting for their acknowledgements.
fn pipelined_publisher(
    clients: &mut ClientNodes,
    node: usize,
    go: Arc<AtomicBool>,
) -> madsim::task::JoinHandle<()> {
    clients.node("order-publisher-2").spawn(async move {
        let forever = Instant::now() + Duration::from_secs(60);
        let (mut c, _) = connect_by(mqtt_addr(node), &opts("order-publisher-2"), forever)
            .await
            .expect("the publisher connects");
        while !go.load(Ordering::SeqCst) {
            sleep(ms(1)).await;
        }
        for seq in BEFORE + 1..=2 * BEFORE {
            let publish = numbered(TOPIC, seq, Bytes::from(format!("0:{seq}")));
            c.send(&publish).await.expect("publish");
        }
        let mut acked = 0;
        while acked < BEFORE {
            match timeout(Duration::from_secs(30), c.recv()).await {
                Ok(Ok(Packet::Puback(_))) => acked += 1,
                Ok(Ok(_)) => {}
                _ => break,
            }
        }
        c.disconnect().await;
    })
}
