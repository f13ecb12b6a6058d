//! A node that leaves gives the others what it owes them first: node L cannot reach node
//! X, so the QoS 1 publishes L routes to a persistent session on X are parked in L's
//! outbox (and acknowledged to their publisher, whose session ends with its connection).
//! L is then asked to leave, with nothing else to drain, and the cut heals 3 s later. L
//! must wait for X to take the parked batches before it leaves: before, it left at once,
//! and they were lost with it.

#[allow(unused_imports)]
use super::*;

/// Three nodes with stores, no nemesis: the scenario cuts L off from X itself. Batches
/// are parked after about a second without an acknowledgement.
pub(crate) const LEAVE_OWED: Variant = Variant {
    name: "leave-owed",
    faults: false,
    cluster: "forward_timeout_ms = 200\n",
    ..SOUND
};

const SUBSCRIBER: &str = "owed-subscriber";
const PUBLISHER: &str = "owed-publisher";
const FILTER: &str = "owed/#";
/// Publishes parked at L for the subscriber on X.
const PARKED: u64 = 5;
/// How long after the leave is asked the cut between L and X heals.
const CUT_OFF: Duration = Duration::from_secs(3);
/// The leave's drain time: long enough for the heal and the batches sent again after it.
const DRAIN: Duration = Duration::from_secs(20);

pub(crate) async fn scenario() {
    let (setup, cluster, base) = start(LEAVE_OWED, 1, true);
    let leader = wait_leader(&setup, Duration::from_secs(30)).await;
    check!(leader.is_some(), "no leader 30 s after start");
    // The cut is between the followers, so that raft goes on between the leader and each.
    let b = leader.map_or(0, |l| l as usize - 1);
    let (l, x) = ((b + 1) % 3, (b + 2) % 3);
    let mut clients = ClientNodes::default();

    leave_subscribed(&mut clients, x, SUBSCRIBER, FILTER).await;
    let l_admin = setup.admin(l).expect("L runs");
    let x_id = x as u64 + 1;
    let routed = Instant::now() + Duration::from_secs(20);
    while !l_admin
        .cluster_routes()
        .await
        .iter()
        .any(|(f, nodes)| f == FILTER && nodes.contains(&x_id))
    {
        check!(
            Instant::now() < routed,
            "L did not route {FILTER} to X within 20 s"
        );
        sleep(ms(10)).await;
    }

    // L cannot reach X: its publishes for the subscriber are parked, and acknowledged. The
    // publisher's session ends with its connection, so that L has no session to drain.
    cluster.clog_one_way(l, x);
    let publisher = clients.node(PUBLISHER).spawn(async move {
        let mut o = opts(PUBLISHER);
        o.session_expiry = 0;
        let forever = Instant::now() + Duration::from_secs(60);
        let (mut c, _) = connect_by(mqtt_addr(l), &o, forever)
            .await
            .expect("the publisher connects");
        publish_numbered(&mut c, "owed/x", PARKED, |seq| {
            Bytes::from(format!("0:{seq}"))
        })
        .await;
        c.disconnect().await;
    });
    publisher.await.expect("the publisher");
    let parked = l_admin.metrics().cluster_outbox_parked;
    check!(
        parked >= PARKED,
        "L parked {parked} messages, not the {PARKED} it could not deliver"
    );

    // L leaves; the cut heals while it drains.
    println!("[sim] L asked to leave at {:?}", elapsed());
    let leaving = madsim::task::spawn(async move { l_admin.cluster_leave(DRAIN).await });
    sleep(CUT_OFF).await;
    cluster.heal_network();
    let left = timeout(DRAIN + Duration::from_secs(40), leaving)
        .await
        .expect("L's leave answers")
        .expect("L's leave task");
    match left {
        Ok(behind) => {
            println!("[sim] L left at {:?}: {behind:?}", elapsed());
            check!(
                behind.messages == 0 && behind.relays == 0,
                "L left behind {behind:?}, though X was reachable again within its drain time"
            );
        }
        Err(e) => check!(false, "L's leave failed: {e}"),
    }

    let (present, mut got) =
        resume_and_take(&mut clients, SUBSCRIBER, x, SUBSCRIBER, PARKED as usize).await;
    got.sort_unstable();
    got.dedup();
    check!(
        present && got == (1..=PARKED).collect::<Vec<_>>(),
        "the subscriber on X got {got:?} of the {PARKED} messages parked for it on L, which \
         left (session present {present})"
    );
    let _ = std::fs::remove_dir_all(&base);
}
