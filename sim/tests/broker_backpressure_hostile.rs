//! One broker node; a hostile client subscribes to `#` at QoS 1 and reads nothing, except
//! that every 12 s it drains everything and acknowledges it (which used to re-arm the
//! back-pressure and stall every QoS 1 publisher for `backpressure_max_secs`, again and
//! again). Unrelated QoS 1 publishers keep publishing one message at a time and time each
//! PUBACK. Checked: no PUBACK waits longer than the stall time (2 s) plus slack, and the
//! long waits (over 1 s) happen at most as often as the stall budget allows.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use madsim::time::{sleep, timeout, Instant};
use starling_codec::{Packet, Properties, Protocol, PubAck, Publish, QoS};
use starling_sim::mqtt::{broker_node, pid, ClientNodes, ConnectOpts, MqttClient};
use starling_sim::{check, run, RunConfig};

const BROKER: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 1883);
const PUBLISHERS: usize = 3;
/// How long the publishers publish.
const RUN: Duration = Duration::from_secs(50);
/// How often the hostile subscriber drains.
const DRAIN_EVERY: Duration = Duration::from_secs(12);
/// The stall time (`backpressure_stall_secs`, default) and what a PUBACK may wait at most.
const STALL: Duration = Duration::from_secs(2);
const WAIT_MAX: Duration = Duration::from_millis(3500);
/// A wait this long counts as one stall of the broker.
const LONG_WAIT: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Oracle {
    /// publisher → (PUBACKs, waits of LONG_WAIT or more, longest wait)
    waits: BTreeMap<usize, (u64, u32, Duration)>,
    done: usize,
    subscribed: bool,
    /// The broker closed the hostile subscriber's connection.
    kicked: bool,
}

type Shared = Arc<Mutex<Oracle>>;

fn lock(o: &Shared) -> std::sync::MutexGuard<'_, Oracle> {
    o.lock().unwrap_or_else(|e| e.into_inner())
}

fn opts(id: &str) -> ConnectOpts {
    ConnectOpts {
        client_id: id.into(),
        protocol: Protocol::V3_1_1,
        clean_start: true,
        session_expiry: 0,
        will: None,
    }
}

async fn hostile(oracle: Shared) {
    let (mut c, _) = MqttClient::connect(BROKER, &opts("hostile"))
        .await
        .expect("hostile connects");
    c.subscribe(1, "#", QoS::AtLeastOnce)
        .await
        .expect("subscribe sent");
    match c.recv().await.expect("suback") {
        Packet::Suback(_) => lock(&oracle).subscribed = true,
        other => panic!("hostile got {other:?}"),
    }
    loop {
        sleep(DRAIN_EVERY).await;
        // Drain what is there, acknowledging it, then go quiet again.
        loop {
            match timeout(Duration::from_millis(50), c.recv()).await {
                Ok(Ok(Packet::Publish(Publish {
                    packet_id: Some(id),
                    ..
                }))) => {
                    if c.send(&Packet::Puback(PubAck::new(id))).await.is_err() {
                        lock(&oracle).kicked = true;
                        return;
                    }
                }
                Ok(Ok(_)) => {}
                // Closed by the broker (3.1.1 has no DISCONNECT to send).
                Ok(Err(_)) => {
                    lock(&oracle).kicked = true;
                    return;
                }
                Err(_) => break,
            }
        }
    }
}

async fn publisher(k: usize, oracle: Shared) {
    let (mut c, _) = MqttClient::connect(BROKER, &opts(&format!("pub{k}")))
        .await
        .expect("publisher connects");
    let end = Instant::now() + RUN;
    let mut n = 0u32;
    while Instant::now() < end {
        let sent = Instant::now();
        c.send(&Packet::Publish(Publish {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: false,
            topic: format!("unrelated/{k}"),
            packet_id: Some(pid(n)),
            properties: Properties::default(),
            payload: Bytes::from(vec![b'x'; 64]),
        }))
        .await
        .expect("publish sent");
        match c.recv().await.expect("publisher connection holds") {
            Packet::Puback(_) => {}
            other => panic!("publisher got {other:?}"),
        }
        let waited = sent.elapsed();
        {
            let mut g = lock(&oracle);
            let e = g.waits.entry(k).or_default();
            e.0 += 1;
            if waited >= LONG_WAIT {
                e.1 += 1;
            }
            e.2 = e.2.max(waited);
        }
        n += 1;
        sleep(Duration::from_millis(5)).await;
    }
    lock(&oracle).done += 1;
}

async fn hostile_subscriber_scenario(config: &'static str, long_waits_max: u32, kicked: bool) {
    let oracle: Shared = Arc::default();
    starling_sim::runner::spawn_tripwire_watcher();
    let _broker = broker_node(BROKER, config).await;
    let mut nodes = ClientNodes::default();
    let mut node = |name: String| nodes.node(name);
    node("hostile".into()).spawn(hostile(oracle.clone()));
    let started = Instant::now();
    while !lock(&oracle).subscribed {
        check!(started.elapsed() < Duration::from_secs(10), "no SUBACK");
        sleep(Duration::from_millis(20)).await;
    }
    for k in 0..PUBLISHERS {
        node(format!("pub{k}")).spawn(publisher(k, oracle.clone()));
    }
    let deadline = Instant::now() + RUN + Duration::from_secs(30);
    while lock(&oracle).done < PUBLISHERS {
        check!(
            Instant::now() < deadline,
            "publishers did not finish: {:?}",
            lock(&oracle).waits
        );
        sleep(Duration::from_millis(100)).await;
    }
    let g = lock(&oracle);
    check!(
        g.kicked == kicked,
        "hostile subscriber disconnected: {}, expected {kicked}",
        g.kicked
    );
    for (k, (acks, long, longest)) in &g.waits {
        eprintln!("[scenario] publisher {k}: {acks} PUBACKs, {long} waits over {LONG_WAIT:?}, longest {longest:?}");
        check!(*acks > 100, "publisher {k} got only {acks} PUBACKs");
        check!(
            *longest <= WAIT_MAX,
            "publisher {k} waited {longest:?} for a PUBACK (stall time {STALL:?})"
        );
        check!(
            *long <= long_waits_max,
            "publisher {k} was stalled {long} times in {RUN:?}"
        );
    }
}

#[test]
fn a_hostile_subscriber_cannot_stall_unrelated_publishers_again_and_again() {
    run(
        RunConfig::new(
            "broker_backpressure_hostile",
            "a_hostile_subscriber_cannot_stall_unrelated_publishers_again_and_again",
        )
        .seeds(5),
        // Two stalls per 60 s window (backpressure_stalls_max), one more for slack.
        || hostile_subscriber_scenario("[mqtt]\nmax_mqueue_len = 60\nmax_inflight = 4\n", 3, false),
    );
}

#[test]
fn an_anonymous_subscriber_holds_no_one_back_when_only_authenticated_ones_may() {
    run(
        RunConfig::new(
            "broker_backpressure_hostile",
            "an_anonymous_subscriber_holds_no_one_back_when_only_authenticated_ones_may",
        )
        .seeds(5),
        || {
            hostile_subscriber_scenario(
                "[mqtt]\nmax_mqueue_len = 60\nmax_inflight = 4\nbackpressure_holders = \"authenticated\"\n",
                0,
                false,
            )
        },
    );
}

#[test]
fn a_stalled_subscriber_is_disconnected_when_the_policy_says_so() {
    run(
        RunConfig::new(
            "broker_backpressure_hostile",
            "a_stalled_subscriber_is_disconnected_when_the_policy_says_so",
        )
        .seeds(5),
        // One stall, then it is gone: no second one.
        || {
            hostile_subscriber_scenario(
                "[mqtt]\nmax_mqueue_len = 60\nmax_inflight = 4\nbackpressure_stuck_policy = \"disconnect\"\n",
                1,
                true,
            )
        },
    );
}
