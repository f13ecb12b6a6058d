//! A large session handed over on a slow link: the roamer's session on node A holds 6 MiB
//! of queued messages, and every packet takes 40 ms (this simulated link then carries
//! about 1 MB/s). The session takes 5-9 s to come whole, longer than the claiming node's
//! 3 s wait, but a part of it (256 KiB) comes well within each 3 s. The CONNECT on node B
//! must wait while the parts keep coming and resume the session with every message.
//! Before, B waited 3 s from its claim and answered session present 0 (shown on seed 1
//! with the parts' news to the registry cut off).

#[allow(unused_imports)]
use super::*;

/// Three nodes, no store, no nemesis: the scenario slows the network itself.
pub(crate) const SLOW: Variant = Variant {
    name: "slow",
    faults: false,
    ..SOUND
};

const ROAMER: &str = "slow-roamer";
/// Messages queued for the roamer on node A, and their size: 6 MiB in all.
const QUEUED: u64 = 96;
const PAYLOAD: usize = 64 << 10;
/// Every packet's latency while the session moves, in ms: one for all, since QUIC takes
/// packets overtaking each other for losses and slows down far more than a link would.
const LATENCY: u64 = 40;

pub(crate) async fn scenario() {
    let (setup, _cluster, base) = start(SLOW, 1, false);
    let leader = wait_leader(&setup, Duration::from_secs(30)).await;
    check!(leader.is_some(), "no leader 30 s after start");
    let (a, b) = (0, 1);
    let mut clients = ClientNodes::default();

    leave_subscribed(&mut clients, a, ROAMER, "slow/#").await;
    publish_acked(
        &mut clients,
        a,
        ("slow-publisher", "slow/x"),
        QUEUED,
        |seq| {
            let mut payload = format!("0:{seq}:").into_bytes();
            payload.resize(PAYLOAD, b'.');
            Bytes::from(payload)
        },
    )
    .await;

    madsim::net::NetSim::current()
        .update_config(|c| c.send_latency = ms(LATENCY)..ms(LATENCY) + Duration::from_nanos(1));
    let moved = clients.node("roamer-moves").spawn(async move {
        let mut o = opts(ROAMER);
        o.clean_start = false;
        let asked = Instant::now();
        // One CONNECT, waited for as long as the broker may take: a client that gave up
        // and connected again would be served the same way, but later.
        let (mut c, connack) = timeout(
            Duration::from_secs(90),
            MqttClient::connect(mqtt_addr(b), &o),
        )
        .await
        .expect("B answers the roamer's CONNECT")
        .expect("the roamer connects to B");
        let answered = asked.elapsed();
        let mut got = Vec::new();
        while connack.session_present && got.len() < QUEUED as usize {
            match timeout(Duration::from_secs(30), c.recv()).await {
                Ok(Ok(Packet::Publish(p))) => {
                    puback(&mut c, &p).await;
                    got.push(seq_of(&p.payload));
                }
                Ok(Ok(_)) => {}
                _ => break,
            }
        }
        c.disconnect().await;
        (connack.session_present, answered, got)
    });
    let (present, answered, got) = moved.await.expect("the roamer's move");
    let b_admin = setup.admin(b).expect("B runs");
    let timeouts = b_admin.metrics().cluster_handover_timeouts;
    println!("[sim] CONNACK after {answered:?}; B's handover timeouts: {timeouts}");
    check!(
        present && timeouts == 0,
        "B did not wait for the session that kept coming ({timeouts} handover timeouts, session present {present}, CONNACK after {answered:?})"
    );
    // The session came later than a wait of 3 s from the claim would have taken it.
    check!(
        answered > Duration::from_millis(3500),
        "the session came within {answered:?}: the link was not slow enough to test the wait"
    );
    check!(
        got == (1..=QUEUED).collect::<Vec<_>>(),
        "the roamer got {} of the {QUEUED} messages queued for it on A",
        got.len()
    );
    let _ = std::fs::remove_dir_all(&base);
}

/// The sequence number of a queued message ("0:seq:" and padding).
fn seq_of(payload: &[u8]) -> u64 {
    let head = String::from_utf8_lossy(&payload[..payload.len().min(24)]).into_owned();
    head.split(':')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}
