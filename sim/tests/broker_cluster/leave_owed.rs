//! A node that leaves gives the others what it owes them first.
//!
//! [`Owes::Outbox`]: node L cannot reach node X, so the QoS 1 publishes L routes to a
//! persistent session on X are parked in L's outbox (and acknowledged to their publisher,
//! whose session ends with its connection). L is then asked to leave, with nothing else
//! to drain, and the cut heals 3 s later. L must wait for X to take the parked batches
//! before it leaves: before, it left at once, and they were lost with it.
//!
//! [`Owes::Relay`]: node C cannot reach node L, so the QoS 1 publishes C routes to a
//! persistent session on L are parked in C's outbox. L is asked to leave; the session's
//! client, sent away, reconnects to the third node, and the session moves there. The
//! copies C parked were routed before the move's cut: they are L's to relay. The cut
//! heals 5 s after the move. L must wait until C is through with the cut (it has sent
//! them, and L relayed them): before, L left once its session had moved, C dropped what
//! it had parked for L when L's `Leave` applied, and the session never got them.

#[allow(unused_imports)]
use super::*;
use starling_broker::LeftBehind;

/// Three nodes with stores, no nemesis: the scenario cuts one node off from another
/// itself. Batches are parked after about a second without an acknowledgement.
pub(crate) const LEAVE_OWED: Variant = Variant {
    name: "leave-owed",
    faults: false,
    cluster: "forward_timeout_ms = 200\n",
    ..SOUND
};

/// The same, for the relay's run.
pub(crate) const LEAVE_OWED_RELAY: Variant = Variant {
    name: "leave-owed-relay",
    ..LEAVE_OWED
};

/// What the leaving node owes when it is asked to leave.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owes {
    /// Batches parked in its outbox for a node it cannot reach.
    Outbox,
    /// The relay of a session that moves away as it leaves, for copies another node
    /// parked for it.
    Relay,
}

const SUBSCRIBER: &str = "owed-subscriber";
const PUBLISHER: &str = "owed-publisher";
const FILTER: &str = "owed/#";
/// Publishes parked for the subscriber.
const PARKED: u64 = 5;
/// The leave's drain time: long enough for the heal and the batches sent again after it.
const DRAIN: Duration = Duration::from_secs(20);

pub(crate) async fn scenario(owes: Owes) {
    let variant = match owes {
        Owes::Outbox => LEAVE_OWED,
        Owes::Relay => LEAVE_OWED_RELAY,
    };
    let (setup, cluster, base) = start(variant, 1, true);
    // The cut is between the followers, so that raft goes on between the leader and each.
    // L leaves; the subscriber's session is on X (Outbox) or on L, moving to X (Relay);
    // the publisher is on L (Outbox) or on C, the other follower (Relay).
    let (b, l, f) = leader_and_followers(&setup).await;
    let (sub_at, publish_at, x) = match owes {
        Owes::Outbox => (f, l, f),
        Owes::Relay => (l, f, b),
    };
    let mut clients = ClientNodes::default();

    leave_subscribed(&mut clients, sub_at, SUBSCRIBER, FILTER).await;
    wait_routed(&setup, publish_at, FILTER, &[sub_at]).await;
    let p_admin = setup.admin(publish_at).expect("the publisher's node runs");

    // The publisher's node cannot reach the subscriber's: the publishes are parked, and
    // acknowledged. The publisher's session ends with its connection, so that it is
    // nothing L has to drain.
    cluster.clog_one_way(publish_at, sub_at);
    let publisher = clients.node(PUBLISHER).spawn(async move {
        let mut o = opts(PUBLISHER);
        o.session_expiry = 0;
        let forever = Instant::now() + Duration::from_secs(60);
        let (mut c, _) = connect_by(mqtt_addr(publish_at), &o, forever)
            .await
            .expect("the publisher connects");
        publish_numbered(&mut c, "owed/x", PARKED, |seq| {
            Bytes::from(format!("0:{seq}"))
        })
        .await;
        c.disconnect().await;
    });
    publisher.await.expect("the publisher");
    let parked = p_admin.metrics().cluster_outbox_parked;
    check!(
        parked >= PARKED,
        "node{} parked {parked} messages, not the {PARKED} it could not deliver",
        publish_at + 1
    );

    println!("[sim] L asked to leave at {:?}", elapsed());
    let l_admin = setup.admin(l).expect("L runs");
    let leaving = madsim::task::spawn(async move { l_admin.cluster_leave(DRAIN).await });
    // The subscriber takes what comes for it on X (Relay: its session moves there).
    let quiet = DRAIN + Duration::from_secs(20);
    let taking = spawn_resume_and_take(
        &mut clients,
        SUBSCRIBER,
        x,
        SUBSCRIBER,
        PARKED as usize,
        quiet,
    );
    match owes {
        Owes::Outbox => sleep(Duration::from_secs(3)).await,
        Owes::Relay => {
            // 5 s after the session moved to X (asked of each node's actors).
            let (l_admin, x_admin) = (
                setup.admin(l).expect("L runs"),
                setup.admin(x).expect("X runs"),
            );
            let by = Instant::now() + Duration::from_secs(30);
            while l_admin.client(SUBSCRIBER).await.is_some()
                || x_admin.client(SUBSCRIBER).await.is_none()
            {
                check!(
                    Instant::now() < by,
                    "the subscriber's session did not move from L to X within 30 s"
                );
                sleep(ms(10)).await;
            }
            sleep(Duration::from_secs(5)).await;
        }
    }
    println!("[sim] the cut heals at {:?}", elapsed());
    cluster.heal_network();
    let left = timeout(DRAIN + Duration::from_secs(40), leaving)
        .await
        .expect("L's leave answers")
        .expect("L's leave task");
    match left {
        Ok(behind) => {
            println!("[sim] L left at {:?}: {behind:?}", elapsed());
            check!(
                behind == LeftBehind::default(),
                "L left behind {behind:?}, though every node was reachable again within its \
                 drain time"
            );
        }
        Err(e) => check!(false, "L's leave failed: {e}"),
    }

    let (present, mut got) = taking.await.expect("the subscriber's connection");
    got.sort_unstable();
    got.dedup();
    check!(
        present && got == (1..=PARKED).collect::<Vec<_>>(),
        "the subscriber on node{} got {got:?} of the {PARKED} messages parked for it, L \
         having left (session present {present})",
        x + 1
    );
    let _ = std::fs::remove_dir_all(&base);
}
