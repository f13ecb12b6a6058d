//! One broker node with a small queue bound; several QoS 1 publishers flood one slow
//! subscriber that acknowledges at its own (random) pace. With back-pressure on (the
//! default) the publishers are held back instead of the subscriber's queue dropping what
//! does not fit. Checked: every publisher gets every publish acknowledged, and the
//! subscriber receives every message exactly once, in each publisher's order, although
//! the publishers together send many times the queue bound; and, read from `$SYS`, that
//! publishers were held back and that no message was dropped anywhere.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use madsim::rand::{thread_rng, Rng};
use madsim::time::{sleep, Instant};
use starling_codec::{Packet, Properties, Protocol, PubAck, Publish, QoS};
use starling_sim::mqtt::{broker_node, pid, ClientNodes, ConnectOpts, MqttClient};
use starling_sim::{check, run, RunConfig};

const BROKER: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 1883);
const PUBLISHERS: usize = 6;
/// Publishes per publisher: together ten times the queue bound below.
const N: u64 = 100;
/// Unacknowledged publishes each publisher keeps in flight.
const WINDOW: u64 = 24;
const CONFIG: &str = "[mqtt]\nmax_mqueue_len = 60\nmax_inflight = 4\nsys_interval_secs = 1\n";

#[derive(Default)]
struct Oracle {
    /// publisher → sequence numbers received, in arrival order
    received: BTreeMap<usize, Vec<u64>>,
    /// publishers whose every publish was acknowledged
    done: usize,
    subscribed: bool,
}

type Shared = Arc<Mutex<Oracle>>;

fn lock(o: &Shared) -> std::sync::MutexGuard<'_, Oracle> {
    o.lock().unwrap_or_else(|e| e.into_inner())
}

fn opts(id: String) -> ConnectOpts {
    ConnectOpts {
        client_id: id,
        protocol: Protocol::V3_1_1,
        clean_start: true,
        session_expiry: 0,
        will: None,
    }
}

async fn subscriber(oracle: Shared) {
    let (mut c, _) = MqttClient::connect(BROKER, &opts("slow".into()))
        .await
        .expect("subscriber connects");
    c.subscribe(1, "bp/#", QoS::AtLeastOnce)
        .await
        .expect("subscribe sent");
    loop {
        match c.recv().await.expect("subscriber connection holds") {
            Packet::Suback(_) => lock(&oracle).subscribed = true,
            Packet::Publish(p) => {
                let s = std::str::from_utf8(&p.payload).expect("utf-8");
                let (k, seq) = s.split_once(':').expect("k:seq");
                lock(&oracle)
                    .received
                    .entry(k.parse().unwrap())
                    .or_default()
                    .push(seq.parse().unwrap());
                // Slow: each acknowledgement takes its time.
                let pause = thread_rng().gen_range(0..3000u64);
                sleep(Duration::from_micros(pause)).await;
                let id = p.packet_id.expect("QoS 1");
                c.send(&Packet::Puback(PubAck::new(id)))
                    .await
                    .expect("puback sent");
            }
            other => panic!("subscriber got {other:?}"),
        }
    }
}

async fn publisher(k: usize, oracle: Shared) {
    let (mut c, _) = MqttClient::connect(BROKER, &opts(format!("pub{k}")))
        .await
        .expect("publisher connects");
    let (mut next, mut acked) = (0u64, 0u64);
    while acked < N {
        while next < N && next - acked < WINDOW {
            c.send(&Packet::Publish(Publish {
                dup: false,
                qos: QoS::AtLeastOnce,
                retain: false,
                topic: format!("bp/{k}"),
                packet_id: Some(pid(next as u32 % 60_000 + 1)),
                properties: Properties::default(),
                payload: Bytes::from(format!("{k}:{next}")),
            }))
            .await
            .expect("publish sent");
            next += 1;
        }
        match c.recv().await.expect("publisher connection holds") {
            Packet::Puback(_) => acked += 1,
            other => panic!("publisher got {other:?}"),
        }
    }
    lock(&oracle).done += 1;
}

async fn flood_into_slow_subscriber() {
    let oracle: Shared = Arc::default();
    starling_sim::runner::spawn_tripwire_watcher();
    // The publishers' topics spread over 1..=3 router shards, each holding its own.
    let shards = thread_rng().gen_range(1..=3u32);
    eprintln!("[knobs] shards={shards}");
    let config: &'static str =
        Box::leak(format!("{CONFIG}[router]\nshards = {shards}\n").into_boxed_str());
    let _broker = broker_node(BROKER, config).await;
    let mut nodes = ClientNodes::default();
    let mut node = |name: String| nodes.node(name);
    node("sub".into()).spawn(subscriber(oracle.clone()));
    let started = Instant::now();
    while !lock(&oracle).subscribed {
        check!(started.elapsed() < Duration::from_secs(10), "no SUBACK");
        sleep(Duration::from_millis(20)).await;
    }
    for k in 0..PUBLISHERS {
        node(format!("pub{k}")).spawn(publisher(k, oracle.clone()));
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (done, got) = {
            let g = lock(&oracle);
            (g.done, g.received.values().map(Vec::len).sum::<usize>())
        };
        if done == PUBLISHERS && got == PUBLISHERS * N as usize {
            break;
        }
        check!(
            Instant::now() < deadline,
            "{done} of {PUBLISHERS} publishers done, {got} of {} messages received",
            PUBLISHERS * N as usize
        );
        sleep(Duration::from_millis(100)).await;
    }
    {
        let g = lock(&oracle);
        let want: Vec<u64> = (0..N).collect();
        for k in 0..PUBLISHERS {
            check!(
                g.received.get(&k) == Some(&want),
                "publisher {k}: received out of order, twice or not at all"
            );
        }
    }
    // The broker's own counters, as `$SYS` publishes them (retained, every second).
    sleep(Duration::from_millis(1500)).await;
    let (holds, dropped) = sys_counters(&mut nodes).await;
    check!(holds > 0, "no publisher was ever held back");
    check!(dropped == 0, "{dropped} messages dropped");
    eprintln!(
        "[scenario] all delivered at {:?}, {holds} holds",
        starling_sim::elapsed()
    );
}

/// `$SYS/brokers/+/backpressure/holds` and `.../messages/dropped`, read by a new client.
async fn sys_counters(nodes: &mut ClientNodes) -> (u64, u64) {
    let (tx, rx) = std::sync::mpsc::channel();
    nodes.node("observer").spawn(async move {
        let (mut c, _) = MqttClient::connect(BROKER, &opts("observer".into()))
            .await
            .expect("observer connects");
        c.subscribe(1, "$SYS/brokers/+/backpressure/holds", QoS::AtMostOnce)
            .await
            .expect("subscribe sent");
        c.subscribe(2, "$SYS/brokers/+/messages/dropped", QoS::AtMostOnce)
            .await
            .expect("subscribe sent");
        let (mut holds, mut dropped) = (None, None);
        while holds.is_none() || dropped.is_none() {
            if let Packet::Publish(p) = c.recv().await.expect("observer connection holds") {
                let v: u64 = std::str::from_utf8(&p.payload).unwrap().parse().unwrap();
                if p.topic.ends_with("/holds") {
                    holds = Some(v);
                } else {
                    dropped = Some(v);
                }
            }
        }
        let _ = tx.send((holds.unwrap(), dropped.unwrap()));
    });
    let started = Instant::now();
    loop {
        if let Ok(v) = rx.try_recv() {
            return v;
        }
        check!(
            started.elapsed() < Duration::from_secs(10),
            "no $SYS counters"
        );
        sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn qos1_flood_into_a_slow_subscriber_is_held_back_not_dropped() {
    run(
        RunConfig::new(
            "broker_backpressure",
            "qos1_flood_into_a_slow_subscriber_is_held_back_not_dropped",
        )
        .seeds(20),
        flood_into_slow_subscriber,
    );
}
