//! One broker node; many clients on other nodes disconnect and reconnect at random, some
//! gracefully and some by dropping the connection. Checked: every acknowledged QoS 1
//! publish reaches every persistent subscriber at least once, every acknowledged QoS 2
//! publish exactly once, each publisher's last acknowledged retained value is what a late
//! subscriber finds, and a will is published if and only if its client went away without a
//! DISCONNECT.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use madsim::rand::{thread_rng, Rng};
use madsim::time::{sleep, timeout, Instant};
use starling_codec::{
    LastWill, Packet, Properties, Protocol, PubAck, Publish, QoS, ReasonCode, RetainHandling,
    Subscribe, SubscribeFilter, SubscriptionOptions,
};
use starling_sim::mqtt::{broker_node, pid, ClientNodes, ConnectOpts, MqttClient};
use starling_sim::{check, run, Knobs, RunConfig};

const BROKER: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 1883);
const SUBSCRIBERS: usize = 3;
const PUBLISHERS: usize = 2;
const WILLERS: usize = 2;
/// Publishes each publisher keeps unacknowledged at most.
const WINDOW: usize = 8;

#[derive(Default)]
struct Oracle {
    /// (publisher, seq) → qos, for every publish handed to the network at least once.
    sent: BTreeMap<(usize, u64), QoS>,
    /// acknowledged by the broker (PUBACK / PUBCOMP)
    acked: BTreeSet<(usize, u64)>,
    /// subscriber → (publisher, seq) → receipts
    received: BTreeMap<usize, BTreeMap<(usize, u64), u32>>,
    /// publisher → highest acknowledged retained seq
    retained_acked: BTreeMap<usize, u64>,
    retained_sent: BTreeMap<usize, u64>,
    /// wills expected (abrupt ends) and seen
    wills_expected: BTreeSet<String>,
    wills_not_expected: BTreeSet<String>,
    wills_seen: BTreeSet<String>,
    subscribed: usize,
    stop: bool,
}

type Shared = Arc<Mutex<Oracle>>;

fn lock(o: &Shared) -> std::sync::MutexGuard<'_, Oracle> {
    o.lock().unwrap_or_else(|e| e.into_inner())
}

fn parse(payload: &[u8]) -> (usize, u64) {
    let s = std::str::from_utf8(payload).expect("utf-8 payload");
    let (a, b) = s.split_once(':').expect("pub:seq");
    (a.parse().unwrap(), b.parse().unwrap())
}

fn protocol_for(i: usize) -> Protocol {
    // Mix the versions: persistence and QoS 2 must hold for 3.1.1 clients too.
    if i.is_multiple_of(2) {
        Protocol::V5
    } else {
        Protocol::V3_1_1
    }
}

async fn connect(o: &ConnectOpts, expect_session: bool) -> MqttClient {
    loop {
        let r = timeout(Duration::from_secs(2), MqttClient::connect(BROKER, o)).await;
        if std::env::var("SIM_DEBUG").is_ok() {
            if let Ok(Err(e)) = &r {
                eprintln!("[{}] {e}", o.client_id);
            }
        }
        if let Ok(Ok((c, ack))) = r {
            // Sessions never expire in this test, so a resumed session must be present.
            check!(
                !expect_session || ack.session_present,
                "{}: reconnect with clean_start=false found no session",
                o.client_id
            );
            return c;
        }
        if std::env::var("SIM_DEBUG").is_ok() {
            eprintln!(
                "[{}] connect failed at {:?}",
                o.client_id,
                starling_sim::elapsed()
            );
        }
        sleep(Duration::from_millis(100)).await;
    }
}

fn ack(p: PubAck) -> PubAck {
    PubAck {
        reason_code: ReasonCode::Success,
        properties: Properties::default(),
        ..p
    }
}

fn pub_ack(id: std::num::NonZeroU16) -> PubAck {
    PubAck {
        packet_id: id,
        reason_code: ReasonCode::Success,
        properties: Properties::default(),
    }
}

/// Random time connected, then a graceful or abrupt end; repeat until the oracle says stop.
fn session_length() -> Duration {
    Duration::from_millis(thread_rng().gen_range(100..3000))
}

async fn subscriber(k: usize, oracle: Shared) {
    let mut o = ConnectOpts {
        client_id: format!("sub{k}"),
        protocol: protocol_for(k),
        // 3.1.1 has no session expiry: clean session = 1 would end the session with the
        // connection (§3.1.2.4), so a persistent 3.1.1 client never sets it.
        clean_start: protocol_for(k) == Protocol::V5,
        session_expiry: 3600,
        will: None,
    };
    // QoS 2 packet ids received and not yet released: kept across connections, as MQTT
    // requires of a client (§4.3.3), so a resent PUBLISH is not delivered twice.
    let mut unreleased: BTreeSet<u16> = BTreeSet::new();
    let mut first = true;
    loop {
        let mut c = connect(&o, !first).await;
        if first {
            first = false;
            o.clean_start = false;
            let sub = |f: &str, qos| SubscribeFilter {
                filter: f.into(),
                options: SubscriptionOptions {
                    qos,
                    no_local: false,
                    retain_as_published: false,
                    retain_handling: RetainHandling::DoNotSend,
                },
            };
            c.send(&Packet::Subscribe(Subscribe {
                packet_id: pid(1),
                filters: vec![sub("t/q1", QoS::AtLeastOnce), sub("t/q2", QoS::ExactlyOnce)],
                properties: Properties::default(),
            }))
            .await
            .expect("subscribe");
        }
        let stop_now = lock(&oracle).stop;
        let until = Instant::now()
            + if stop_now {
                Duration::from_secs(3600)
            } else {
                session_length()
            };
        let graceful = thread_rng().gen_bool(0.5);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let Ok(r) = timeout(left, c.recv()).await else {
                break;
            };
            let Ok(p) = r else { break };
            match p {
                Packet::Suback(s) => {
                    check!(
                        s.reason_codes.iter().all(|r| matches!(
                            r,
                            ReasonCode::GrantedQoS1 | ReasonCode::GrantedQoS2
                        )),
                        "sub{k}: subscription refused: {:?}",
                        s.reason_codes
                    );
                    lock(&oracle).subscribed += 1;
                }
                Packet::Publish(p) => {
                    let key = parse(&p.payload);
                    let deliver = match (p.qos, p.packet_id) {
                        (QoS::ExactlyOnce, Some(id)) => unreleased.insert(id.get()),
                        _ => true,
                    };
                    if deliver {
                        let mut g = lock(&oracle);
                        let sent = g.sent.get(&key).copied();
                        check!(sent.is_some(), "sub{k} got {key:?}, never published");
                        let n = g.received.entry(k).or_default().entry(key).or_insert(0);
                        *n += 1;
                        check!(
                            !(sent == Some(QoS::ExactlyOnce) && *n > 1),
                            "sub{k} got QoS 2 publish {key:?} {} times (this time: id {:?} dup {} qos {:?}; unreleased {:?})",
                            *n, p.packet_id, p.dup, p.qos, unreleased
                        );
                    }
                    let reply = match (p.qos, p.packet_id) {
                        (QoS::AtLeastOnce, Some(id)) => Some(Packet::Puback(pub_ack(id))),
                        (QoS::ExactlyOnce, Some(id)) => Some(Packet::Pubrec(pub_ack(id))),
                        _ => None,
                    };
                    if let Some(r) = reply {
                        if c.send(&r).await.is_err() {
                            break;
                        }
                    }
                }
                Packet::Pubrel(r) => {
                    unreleased.remove(&r.packet_id.get());
                    if c.send(&Packet::Pubcomp(ack(r))).await.is_err() {
                        break;
                    }
                }
                _ => {}
            }
        }
        if graceful {
            c.disconnect().await;
        } else {
            drop(c);
        }
        sleep(Duration::from_millis(thread_rng().gen_range(0..1500))).await;
    }
}

#[derive(Clone, Copy)]
enum Stage {
    /// QoS 1 awaiting PUBACK, or QoS 2 awaiting PUBREC
    Published,
    /// QoS 2 awaiting PUBCOMP
    Released,
}

struct Pending {
    seq: u64,
    qos: QoS,
    topic: String,
    retain: bool,
    stage: Stage,
}

fn publish_packet(k: usize, id: u16, p: &Pending, dup: bool) -> Packet {
    Packet::Publish(Publish {
        dup,
        qos: p.qos,
        retain: p.retain,
        topic: p.topic.clone(),
        packet_id: Some(pid(u32::from(id) - 1)),
        properties: Properties::default(),
        payload: Bytes::from(format!("{k}:{}", p.seq)),
    })
}

async fn publisher(k: usize, oracle: Shared) {
    let mut o = ConnectOpts {
        client_id: format!("pub{k}"),
        protocol: protocol_for(k + 1),
        clean_start: protocol_for(k + 1) == Protocol::V5,
        session_expiry: 3600,
        will: None,
    };
    let mut pending: BTreeMap<u16, Pending> = BTreeMap::new();
    let mut seq = 0u64;
    let mut next_id = 0u32;
    let mut connected_before = false;
    loop {
        let mut c = connect(&o, connected_before).await;
        connected_before = true;
        o.clean_start = false;
        // Resend what is not acknowledged (MQTT 5 §4.4): PUBLISH with DUP, or PUBREL.
        let mut ok = true;
        for (id, p) in &pending {
            let pkt = match p.stage {
                Stage::Published => publish_packet(k, *id, p, true),
                Stage::Released => Packet::Pubrel(pub_ack(pid(u32::from(*id) - 1))),
            };
            if c.send(&pkt).await.is_err() {
                ok = false;
                break;
            }
        }
        let stopping = lock(&oracle).stop;
        let until = Instant::now()
            + if stopping {
                Duration::from_secs(3600)
            } else {
                session_length()
            };
        let graceful = thread_rng().gen_bool(0.5);
        let mut tick = Instant::now();
        loop {
            if !ok {
                break;
            }
            let now = Instant::now();
            if now >= until {
                break;
            }
            if now >= tick {
                tick = now + Duration::from_millis(20);
                if !lock(&oracle).stop && pending.len() < WINDOW {
                    seq += 1;
                    let retain = seq.is_multiple_of(10);
                    let (qos, topic) = if retain {
                        (QoS::AtLeastOnce, format!("r/{k}"))
                    } else if seq.is_multiple_of(2) {
                        (QoS::AtLeastOnce, "t/q1".to_string())
                    } else {
                        (QoS::ExactlyOnce, "t/q2".to_string())
                    };
                    {
                        let mut g = lock(&oracle);
                        g.sent.insert((k, seq), qos);
                        if retain {
                            g.retained_sent.insert(k, seq);
                        }
                    }
                    next_id += 1;
                    let id = pid(next_id).get();
                    let p = Pending {
                        seq,
                        qos,
                        topic,
                        retain,
                        stage: Stage::Published,
                    };
                    let pkt = publish_packet(k, id, &p, false);
                    pending.insert(id, p);
                    if c.send(&pkt).await.is_err() {
                        break;
                    }
                }
            }
            let wait = tick.min(until).saturating_duration_since(Instant::now());
            let Ok(r) = timeout(wait, c.recv()).await else {
                continue;
            };
            let Ok(pkt) = r else { break };
            match pkt {
                Packet::Puback(a) | Packet::Pubcomp(a) => {
                    if let Some(p) = pending.remove(&a.packet_id.get()) {
                        // 0x92 on a PUBCOMP answers a PUBREL resent after the broker had
                        // already completed it (its PUBCOMP was lost with the connection).
                        check!(
                            matches!(
                                a.reason_code,
                                ReasonCode::Success
                                    | ReasonCode::NoMatchingSubscribers
                                    | ReasonCode::PacketIdentifierNotFound
                            ),
                            "pub{k}: publish {} refused: {:?}",
                            p.seq,
                            a.reason_code
                        );
                        let mut g = lock(&oracle);
                        g.acked.insert((k, p.seq));
                        if p.retain {
                            let r = g.retained_acked.entry(k).or_insert(0);
                            *r = (*r).max(p.seq);
                        }
                    }
                }
                Packet::Pubrec(a) => {
                    if let Some(p) = pending.get_mut(&a.packet_id.get()) {
                        p.stage = Stage::Released;
                    }
                    if c.send(&Packet::Pubrel(ack(a))).await.is_err() {
                        break;
                    }
                }
                _ => {}
            }
        }
        if graceful {
            c.disconnect().await;
        } else {
            drop(c);
        }
        sleep(Duration::from_millis(thread_rng().gen_range(0..1500))).await;
    }
}

/// Connects with a will, then leaves gracefully or abruptly, again and again.
async fn willer(k: usize, oracle: Shared) {
    for inc in 0u32.. {
        if lock(&oracle).stop {
            return std::future::pending().await;
        }
        let tag = format!("{k}:{inc}");
        let o = ConnectOpts {
            client_id: format!("will{k}"),
            protocol: protocol_for(k),
            clean_start: true,
            session_expiry: 0,
            will: Some(LastWill {
                topic: format!("will/{k}"),
                payload: Bytes::from(tag.clone()),
                qos: QoS::AtLeastOnce,
                retain: false,
                properties: Properties::default(),
            }),
        };
        let c = connect(&o, false).await;
        sleep(session_length()).await;
        if thread_rng().gen_bool(0.5) {
            lock(&oracle).wills_not_expected.insert(tag);
            c.disconnect().await;
        } else {
            lock(&oracle).wills_expected.insert(tag);
            drop(c);
        }
        // Longer than any packet latency: a reconnect that overtakes the DISCONNECT on the
        // wire is a takeover, which publishes the will (MQTT 5 §3.1.4), and that is not
        // what this check is about.
        sleep(Duration::from_millis(thread_rng().gen_range(200..700))).await;
    }
}

/// Never disconnects; records every will.
async fn will_watcher(oracle: Shared) {
    let o = ConnectOpts {
        client_id: "will-watcher".into(),
        protocol: Protocol::V5,
        clean_start: true,
        session_expiry: 0,
        will: None,
    };
    let mut c = connect(&o, false).await;
    c.send(&Packet::Subscribe(Subscribe {
        packet_id: pid(1),
        filters: vec![SubscribeFilter {
            filter: "will/#".into(),
            options: SubscriptionOptions {
                qos: QoS::AtLeastOnce,
                no_local: false,
                retain_as_published: false,
                retain_handling: RetainHandling::DoNotSend,
            },
        }],
        properties: Properties::default(),
    }))
    .await
    .unwrap();
    loop {
        match c
            .recv()
            .await
            .expect("the watcher's connection never drops")
        {
            Packet::Suback(_) => lock(&oracle).subscribed += 1,
            Packet::Publish(p) => {
                let tag = String::from_utf8(p.payload.to_vec()).unwrap();
                {
                    let mut g = lock(&oracle);
                    check!(
                        !g.wills_not_expected.contains(&tag),
                        "will {tag} published after a graceful DISCONNECT"
                    );
                    g.wills_seen.insert(tag);
                }
                if let Some(id) = p.packet_id {
                    let _ = c.send(&Packet::Puback(pub_ack(id))).await;
                }
            }
            _ => {}
        }
    }
}

async fn retained_check(oracle: Shared) {
    let o = ConnectOpts {
        client_id: "late".into(),
        protocol: Protocol::V5,
        clean_start: true,
        session_expiry: 0,
        will: None,
    };
    let mut c = connect(&o, false).await;
    c.send(&Packet::Subscribe(Subscribe {
        packet_id: pid(1),
        filters: vec![SubscribeFilter {
            filter: "r/+".into(),
            options: SubscriptionOptions {
                qos: QoS::AtMostOnce,
                no_local: false,
                retain_as_published: true,
                retain_handling: RetainHandling::SendAtSubscribe,
            },
        }],
        properties: Properties::default(),
    }))
    .await
    .unwrap();
    let mut found: BTreeMap<usize, u64> = BTreeMap::new();
    while let Ok(Ok(p)) = timeout(Duration::from_secs(2), c.recv()).await {
        if let Packet::Publish(p) = p {
            check!(
                p.retain,
                "a retained message sent on subscribe without the retain flag"
            );
            let (k, s) = parse(&p.payload);
            found.insert(k, s);
        }
    }
    let g = lock(&oracle);
    for (k, &acked) in &g.retained_acked {
        let got = found.get(k).copied();
        let sent = g.retained_sent.get(k).copied().unwrap_or(0);
        check!(
            got.is_some_and(|s| s >= acked && s <= sent),
            "retained r/{k}: found {got:?}, last acknowledged {acked}, last sent {sent}"
        );
    }
}

async fn clients_reconnecting_at_random() {
    let knobs = Knobs::current();
    let oracle: Shared = Arc::new(Mutex::new(Oracle::default()));
    starling_sim::runner::spawn_tripwire_watcher();
    madsim::net::NetSim::current().update_config(|c| {
        c.send_latency = knobs.latency.0..knobs.latency.1 + Duration::from_millis(1)
    });
    let _broker = broker_node(
        BROKER,
        "[mqtt]\nmax_mqueue_len = 100000\nmax_inflight = 32\n",
    )
    .await;
    let mut nodes = ClientNodes::default();
    let mut node = |name: String| nodes.node(name);
    node("watcher".into()).spawn(will_watcher(oracle.clone()));
    for k in 0..SUBSCRIBERS {
        node(format!("sub{k}")).spawn(subscriber(k, oracle.clone()));
    }
    // Publishing starts once every subscription is in place.
    let started = Instant::now();
    while lock(&oracle).subscribed < SUBSCRIBERS + 1 {
        check!(
            started.elapsed() < Duration::from_secs(30),
            "subscriptions not acknowledged"
        );
        sleep(Duration::from_millis(50)).await;
    }
    for k in 0..PUBLISHERS {
        node(format!("pub{k}")).spawn(publisher(k, oracle.clone()));
    }
    for k in 0..WILLERS {
        node(format!("will{k}")).spawn(willer(k, oracle.clone()));
    }
    sleep(knobs.chaos).await;
    lock(&oracle).stop = true;
    eprintln!("[scenario] chaos over at {:?}", starling_sim::elapsed());

    // Heal: everyone reconnects and stays; every acknowledged publish must arrive.
    let deadline = Instant::now() + knobs.heal_deadline + Duration::from_secs(10);
    loop {
        let missing = {
            let g = lock(&oracle);
            let mut missing = Vec::new();
            for s in 0..SUBSCRIBERS {
                let got = g.received.get(&s);
                for key in &g.acked {
                    if key.1 % 10 == 0 {
                        continue; // retained publishes go to r/{k}, not to the subscribers
                    }
                    if got.and_then(|m| m.get(key)).is_none() {
                        missing.push((s, *key));
                    }
                }
            }
            let wills: Vec<_> = g
                .wills_expected
                .difference(&g.wills_seen)
                .cloned()
                .collect();
            (missing, wills)
        };
        if missing.0.is_empty() && missing.1.is_empty() {
            break;
        }
        check!(
            Instant::now() < deadline,
            "after the heal: {} acknowledged publishes missing at subscribers (first: {:?}); wills missing: {:?}",
            missing.0.len(),
            missing.0.first(),
            missing.1
        );
        sleep(Duration::from_millis(200)).await;
    }
    let acked = lock(&oracle).acked.len();
    check!(acked > 20, "too little traffic to mean anything: {acked}");
    eprintln!("[scenario] converged at {:?}", starling_sim::elapsed());
    // On a node of its own: the supervisor's node has no address on the simulated network.
    node("late".into())
        .spawn(retained_check(oracle.clone()))
        .await
        .expect("retained check");
    eprintln!(
        "[scenario] retained checked at {:?}",
        starling_sim::elapsed()
    );
}

#[test]
fn qos_retained_and_wills_hold_under_random_reconnects() {
    run(
        RunConfig::new(
            "broker_clients",
            "qos_retained_and_wills_hold_under_random_reconnects",
        ),
        clients_reconnecting_at_random,
    );
}
