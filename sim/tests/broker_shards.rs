//! One broker node whose router is split over a seed-chosen number of topic shards (1..=6).
//! Checked against what a single router would do: every subscriber gets each matching
//! publish once (overlapping filters merged), in each publisher's order on each topic; a
//! shared group gets each publish once between its members; `$limit/2/` grants exactly two
//! of four concurrent subscribers and `$exclusive/` one of three, although the wildcard
//! filters live on every shard; a subscription to a wildcard filter finds the retained
//! messages of every shard, and an empty retained publish removes one.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use madsim::rand::{thread_rng, Rng};
use madsim::time::{sleep, Instant};
use starling_codec::{
    Packet, Properties, Protocol, PubAck, Publish, QoS, ReasonCode, Subscribe, SubscribeFilter,
    SubscriptionOptions,
};
use starling_sim::mqtt::{broker_node, pid, ClientNodes, ConnectOpts, MqttClient};
use starling_sim::{check, run, RunConfig};

const BROKER: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 1883);
const PUBLISHERS: usize = 3;
/// Publishes per publisher, spread over `TOPICS` topics.
const N: u64 = 40;
const TOPICS: u64 = 8;
/// Retained topics published before anyone subscribes.
const RETAINED: usize = 10;

/// What one subscriber received: (topic, payload) in arrival order, and its SUBACK codes.
#[derive(Default, Clone)]
struct Inbox {
    got: Vec<(String, String, bool)>,
    suback: Option<Vec<ReasonCode>>,
}

#[derive(Default)]
struct Oracle {
    inbox: BTreeMap<String, Inbox>,
    published: usize,
    retained_done: bool,
}

type Shared = Arc<Mutex<Oracle>>;

fn lock(o: &Shared) -> std::sync::MutexGuard<'_, Oracle> {
    o.lock().unwrap_or_else(|e| e.into_inner())
}

fn opts(id: &str) -> ConnectOpts {
    ConnectOpts {
        client_id: id.to_owned(),
        protocol: Protocol::V5,
        clean_start: true,
        session_expiry: 0,
        will: None,
    }
}

fn publish(topic: String, payload: String, id: u32, retain: bool) -> Packet {
    Packet::Publish(Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain,
        topic,
        packet_id: Some(pid(id)),
        properties: Properties::default(),
        payload: Bytes::from(payload),
    })
}

/// Subscribes `name` to `filters` (one SUBSCRIBE) and records what arrives.
async fn subscriber(name: String, filters: Vec<(String, QoS)>, oracle: Shared) {
    let (mut c, _) = MqttClient::connect(BROKER, &opts(&name))
        .await
        .expect("subscriber connects");
    lock(&oracle).inbox.entry(name.clone()).or_default();
    c.send(&Packet::Subscribe(Subscribe {
        packet_id: pid(1),
        filters: filters
            .into_iter()
            .map(|(filter, qos)| SubscribeFilter {
                filter,
                options: SubscriptionOptions {
                    qos,
                    ..Default::default()
                },
            })
            .collect(),
        properties: Properties::default(),
    }))
    .await
    .expect("subscribe sent");
    loop {
        match c.recv().await.expect("subscriber connection holds") {
            Packet::Suback(s) => {
                lock(&oracle).inbox.get_mut(&name).unwrap().suback = Some(s.reason_codes)
            }
            Packet::Publish(p) => {
                let payload = String::from_utf8(p.payload.to_vec()).expect("utf-8");
                lock(&oracle).inbox.get_mut(&name).unwrap().got.push((
                    p.topic.clone(),
                    payload,
                    p.retain,
                ));
                if let Some(id) = p.packet_id {
                    c.send(&Packet::Puback(PubAck::new(id)))
                        .await
                        .expect("puback sent");
                }
            }
            other => panic!("{name} got {other:?}"),
        }
    }
}

/// Publishes and waits for each acknowledgement in turn, so that the oracle knows the order.
async fn publisher(k: usize, oracle: Shared) {
    let (mut c, _) = MqttClient::connect(BROKER, &opts(&format!("pub{k}")))
        .await
        .expect("publisher connects");
    for seq in 0..N {
        let topic = format!("t/{}/x", (seq + k as u64) % TOPICS);
        c.send(&publish(topic, format!("{k}:{seq}"), seq as u32, false))
            .await
            .expect("publish sent");
        match c.recv().await.expect("publisher connection holds") {
            Packet::Puback(_) => {}
            other => panic!("publisher got {other:?}"),
        }
        if thread_rng().gen_bool(0.3) {
            sleep(Duration::from_micros(thread_rng().gen_range(0..2000))).await;
        }
    }
    lock(&oracle).published += 1;
}

/// Retained messages on `r/0..RETAINED`, then `r/0` removed by an empty payload.
async fn retainer(oracle: Shared) {
    let (mut c, _) = MqttClient::connect(BROKER, &opts("ret"))
        .await
        .expect("retainer connects");
    for i in 0..=RETAINED {
        let (topic, payload) = if i < RETAINED {
            (format!("r/{i}"), format!("kept{i}"))
        } else {
            ("r/0".to_owned(), String::new())
        };
        c.send(&publish(topic, payload, i as u32, true))
            .await
            .expect("publish sent");
        match c.recv().await.expect("retainer connection holds") {
            Packet::Puback(_) => {}
            other => panic!("retainer got {other:?}"),
        }
    }
    lock(&oracle).retained_done = true;
}

async fn wait_for(oracle: &Shared, what: &str, cond: impl Fn(&Oracle) -> bool) {
    let started = Instant::now();
    while !cond(&lock(oracle)) {
        check!(
            started.elapsed() < Duration::from_secs(60),
            "timed out: {what}"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// The payloads `name` got from publisher `k` on topic `t`, in arrival order.
fn from(inbox: &Inbox, k: usize, topic: &str) -> Vec<u64> {
    inbox
        .got
        .iter()
        .filter(|(t, _, _)| t == topic)
        .filter_map(|(_, p, _)| p.split_once(':'))
        .filter(|(pk, _)| pk.parse::<usize>() == Ok(k))
        .map(|(_, s)| s.parse().unwrap())
        .collect()
}

/// What a single router sends a subscriber to every `t/+/x` topic: per publisher and
/// topic, its sequence numbers in order.
fn expected(k: usize, topic_index: u64) -> Vec<u64> {
    (0..N)
        .filter(|seq| (seq + k as u64) % TOPICS == topic_index)
        .collect()
}

fn granted(codes: &Option<Vec<ReasonCode>>) -> bool {
    codes
        .as_ref()
        .is_some_and(|c| c.iter().all(|r| u8::from(*r) < 0x80))
}

async fn shards_route_as_one_router() {
    let shards = thread_rng().gen_range(1..=6u32);
    eprintln!("[knobs] shards={shards}");
    let config: &'static str = Box::leak(
        format!("[mqtt]\nmax_inflight = 8\n[router]\nshards = {shards}\n").into_boxed_str(),
    );
    let oracle: Shared = Arc::default();
    starling_sim::runner::spawn_tripwire_watcher();
    let _broker = broker_node(BROKER, config).await;
    let mut nodes = ClientNodes::default();

    nodes.node("ret").spawn(retainer(oracle.clone()));
    wait_for(&oracle, "retained published", |o| o.retained_done).await;

    let q1 = QoS::AtLeastOnce;
    let mut subs: Vec<(String, Vec<(String, QoS)>)> = vec![
        (
            "over".into(),
            vec![
                ("t/#".into(), QoS::AtMostOnce),
                ("t/+/x".into(), q1),
                ("t/+/+".into(), q1),
            ],
        ),
        ("plain".into(), vec![("t/3/x".into(), q1)]),
        ("late".into(), vec![("r/#".into(), q1)]),
        ("one".into(), vec![("r/4".into(), q1)]),
    ];
    for g in 0..3 {
        subs.push((format!("g{g}"), vec![("$share/g/t/+/x".into(), q1)]));
    }
    for l in 0..4 {
        subs.push((format!("l{l}"), vec![("$limit/2/t/#".into(), q1)]));
    }
    for e in 0..3 {
        subs.push((format!("e{e}"), vec![("$exclusive/t/+/x".into(), q1)]));
    }
    let count = subs.len();
    for (name, filters) in subs {
        nodes
            .node(name.clone())
            .spawn(subscriber(name, filters, oracle.clone()));
    }
    wait_for(&oracle, "every SUBACK", |o| {
        o.inbox.values().filter(|i| i.suback.is_some()).count() == count
    })
    .await;
    for k in 0..PUBLISHERS {
        nodes
            .node(format!("pub{k}"))
            .spawn(publisher(k, oracle.clone()));
    }
    wait_for(&oracle, "every publish acknowledged", |o| {
        o.published == PUBLISHERS
    })
    .await;
    // Deliveries acknowledged to the publisher may still be on their way to subscribers.
    sleep(Duration::from_secs(2)).await;

    let o = lock(&oracle);
    let inbox = |n: &str| o.inbox.get(n).cloned().unwrap_or_default();
    let total = PUBLISHERS * N as usize;

    // One copy per subscriber, in each publisher's order per topic.
    let over = inbox("over");
    check!(
        over.got.len() == total,
        "overlapping subscriber got {} of {total}",
        over.got.len()
    );
    for k in 0..PUBLISHERS {
        for t in 0..TOPICS {
            let topic = format!("t/{t}/x");
            check!(
                from(&over, k, &topic) == expected(k, t),
                "overlapping subscriber, publisher {k} on {topic}: {:?}",
                from(&over, k, &topic)
            );
        }
    }
    let plain = inbox("plain");
    for k in 0..PUBLISHERS {
        check!(
            from(&plain, k, "t/3/x") == expected(k, 3),
            "plain subscriber, publisher {k}"
        );
    }
    check!(
        plain.got.iter().all(|(t, _, _)| t == "t/3/x"),
        "plain subscriber got other topics"
    );

    // A shared group: each publish to one member.
    let mut group: Vec<String> = (0..3)
        .flat_map(|g| inbox(&format!("g{g}")).got)
        .map(|(_, p, _)| p)
        .collect();
    group.sort();
    let mut want: Vec<String> = (0..PUBLISHERS)
        .flat_map(|k| (0..N).map(move |s| format!("{k}:{s}")))
        .collect();
    want.sort();
    check!(
        group == want,
        "shared group got {} of {total} (or some twice)",
        group.len()
    );

    // `$limit/2/`: two of four; `$exclusive/`: one of three; the holders get everything.
    for (prefix, n, places) in [("l", 4, 2), ("e", 3, 1)] {
        let holders: Vec<Inbox> = (0..n)
            .map(|i| inbox(&format!("{prefix}{i}")))
            .filter(|i| granted(&i.suback))
            .collect();
        check!(
            holders.len() == places,
            "{prefix}: {} granted, want {places}",
            holders.len()
        );
        for h in &holders {
            check!(
                h.got.len() == total,
                "{prefix} holder got {} of {total}",
                h.got.len()
            );
        }
        let refused_got: usize = (0..n)
            .map(|i| inbox(&format!("{prefix}{i}")))
            .filter(|i| !granted(&i.suback))
            .map(|i| i.got.len())
            .sum();
        check!(
            refused_got == 0,
            "{prefix}: refused subscribers got {refused_got}"
        );
    }

    // Retained on subscribe, from whatever shard holds each: r/1..r/9 (r/0 was removed).
    let mut late: Vec<String> = inbox("late")
        .got
        .into_iter()
        .filter(|(_, _, retain)| *retain)
        .map(|(t, _, _)| t)
        .collect();
    late.sort();
    let mut want: Vec<String> = (1..RETAINED).map(|i| format!("r/{i}")).collect();
    want.sort();
    check!(late == want, "retained on r/#: {late:?}");
    let one = inbox("one").got;
    check!(
        one.len() == 1 && one[0].0 == "r/4" && one[0].1 == "kept4",
        "retained on r/4: {one:?}"
    );
    eprintln!("[scenario] checked at {:?}", starling_sim::elapsed());
}

#[test]
fn topic_shards_route_as_one_router_does() {
    run(
        RunConfig::new("broker_shards", "topic_shards_route_as_one_router_does").seeds(20),
        shards_route_as_one_router,
    );
}
