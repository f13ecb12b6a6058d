//! A session handed over after its CONNECT went on afresh (sim seed 4398's way there): the
//! client moves from node A to node B while A is cut off, so B waits its three seconds
//! for the session, answers session present 0, and the client loses that CONNACK with its
//! connection. A applies B's claim when the cut heals and hands the session over, late.
//! The fresh session on B never held more than its name, so the late one takes its place:
//! the client's next CONNECT finds its subscription and the messages queued for it while
//! it was away. (Before, the late session was dropped, and with it those messages.)

#[allow(unused_imports)]
use super::*;

/// Three nodes, no store, no nemesis: the scenario cuts node A off itself.
pub(crate) const LATE: Variant = Variant {
    name: "late",
    faults: false,
    ..SOUND
};

const ROAMER: &str = "late-roamer";
/// Messages queued for the roamer's session on node A while it is away.
const QUEUED: u64 = 5;

pub(crate) async fn scenario() {
    let (setup, cluster, base) = start(LATE, 1, false);
    // The two followers: A is cut off and must not take the log's leadership with it.
    let (_, a, b) = leader_and_followers(&setup).await;
    let mut clients = ClientNodes::default();
    let forever = Instant::now() + Duration::from_secs(60);

    // The roamer's session on A, with a subscription, and messages queued for it there.
    leave_subscribed(&mut clients, a, ROAMER, "late/#").await;
    publish_acked(
        &mut clients,
        a,
        ("late-publisher", "late/x"),
        QUEUED,
        |seq| Bytes::from(format!("0:{seq}")),
    )
    .await;

    // A is cut off; the roamer moves to B, which claims it without A and waits for the
    // session in vain. The CONNACK (session present 0) is lost: the roamer drops the
    // connection unread, as a client does whose CONNECT timed out.
    cluster.isolate(a);
    let moved = clients.node("roamer-moves").spawn(async move {
        let mut o = opts(ROAMER);
        o.clean_start = false;
        let (c, connack) = connect_by(mqtt_addr(b), &o, forever)
            .await
            .expect("the roamer connects to B");
        drop(c);
        connack.session_present
    });
    let present = moved.await.expect("the roamer's move");
    check!(
        !present,
        "B found the session while A was cut off (session present 1)"
    );
    sleep(ms(500)).await;
    cluster.heal_network();

    // A applies the claim and hands the session over; B takes it in the fresh one's place.
    let b_admin = setup.admin(b).expect("B runs");
    let by = Instant::now() + Duration::from_secs(20);
    while b_admin.metrics().cluster_sessions_late == 0 {
        check!(
            Instant::now() < by,
            "B did not take the late session within 20 s of the heal"
        );
        sleep(ms(10)).await;
    }

    // The roamer's next CONNECT finds its session, and the messages queued on A.
    let (present, got) =
        resume_and_take(&mut clients, "roamer-back", b, ROAMER, QUEUED as usize).await;
    check!(
        present,
        "the roamer's session was not there after the late handover (session present 0)"
    );
    check!(
        got == (1..=QUEUED).collect::<Vec<_>>(),
        "the roamer got {got:?} of the {QUEUED} messages queued for it on A"
    );
    let _ = std::fs::remove_dir_all(&base);
}
