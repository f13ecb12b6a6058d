//! One broker node whose store is a simulated disk that loses every write not yet synced
//! when the node is killed (`SimDisk`). A publisher sets retained messages on a few topics
//! at QoS 1, one at a time, while the node is killed at a random moment and restarted,
//! several times. After each restart a reader's subscription finds, for every topic, the
//! last retained message the publisher saw acknowledged or the one it had in flight when
//! the node died: never an older one, never a lost one.
//!
//! The same for a persistent session: a subscriber (sometimes connected through the kill,
//! sometimes away) must get every QoS 1/2 message the publisher saw acknowledged, each
//! QoS 2 one once, after the restarts.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use madsim::rand::{thread_rng, Rng};
use madsim::runtime::Handle;
use madsim::time::{sleep, timeout};
use starling_broker::StoreLocation as Location;
use starling_codec::{Packet, Properties, Protocol, PubAck, Publish, QoS, ReasonCode};
use starling_sim::mqtt::{pid, ClientNodes, ConnectOpts, MqttClient};
use starling_sim::{check, run, RunConfig};
use starling_store::SimDisk;

const BROKER: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 1883);
const TOPICS: u64 = 5;
const ROUNDS: usize = 4;

/// Commits wait up to `interval` ms for company: the time between a write and its sync, in
/// which a kill loses what was not yet acknowledged (and, were acknowledgements early,
/// what was).
fn config(interval: u32) -> String {
    format!(
        "[[listeners]]\nkind = \"tcp\"\nbind = \"0.0.0.0:1883\"\nallow_anonymous = true\n\
         [storage]\nenabled = true\ncommit_interval_ms = {interval}\n"
    )
}

/// Per topic: the seq of the last publish acknowledged, and of the one in flight.
#[derive(Default, Clone, Copy, Debug)]
struct TopicState {
    acked: Option<u64>,
    in_flight: Option<u64>,
}

type Oracle = Arc<Mutex<BTreeMap<u64, TopicState>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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

/// Publishes retained messages until its connection dies, recording each in flight and
/// each acknowledged.
async fn publisher(oracle: Oracle, mut seq: u64) {
    let (mut c, _) = match MqttClient::connect(BROKER, &opts("writer")).await {
        Ok(c) => c,
        // The node may already be down again.
        Err(_) => return,
    };
    loop {
        let topic = thread_rng().gen_range(0..TOPICS);
        seq += 1;
        lock(&oracle).entry(topic).or_default().in_flight = Some(seq);
        let p = Packet::Publish(Publish {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: true,
            topic: format!("t/{topic}"),
            packet_id: Some(pid((seq % 60_000 + 1) as u32)),
            properties: Properties::default(),
            payload: Bytes::from(seq.to_string()),
        });
        if c.send(&p).await.is_err() {
            return;
        }
        match c.recv().await {
            Ok(Packet::Puback(PubAck { reason_code, .. })) => {
                check!(
                    reason_code == ReasonCode::Success,
                    "retained publish refused: {reason_code:?}"
                );
                let mut o = lock(&oracle);
                let t = o.entry(topic).or_default();
                t.acked = Some(seq);
                t.in_flight = None;
            }
            Ok(other) => check!(false, "expected PUBACK, got {other:?}"),
            Err(_) => return,
        }
    }
}

/// The retained message of every topic, as a new subscriber finds it.
async fn read_retained() -> BTreeMap<u64, u64> {
    let (mut c, _) = MqttClient::connect(BROKER, &opts("reader"))
        .await
        .expect("reader connects");
    c.subscribe(1, "t/#", QoS::AtLeastOnce)
        .await
        .expect("subscribe sent");
    let mut found = BTreeMap::new();
    // The SUBACK, then the retained messages; a quiet stretch ends them.
    while let Ok(Ok(p)) = timeout(Duration::from_millis(500), c.recv()).await {
        if let Packet::Publish(p) = p {
            let topic: u64 = p.topic["t/".len()..].parse().expect("t/N");
            let seq: u64 = std::str::from_utf8(&p.payload)
                .expect("utf-8")
                .parse()
                .expect("a seq");
            check!(
                found.insert(topic, seq).is_none(),
                "two retained messages for t/{topic}"
            );
            if let Some(id) = p.packet_id {
                let _ = c.send(&Packet::Puback(PubAck::new(id))).await;
            }
        }
    }
    c.disconnect().await;
    found
}

/// The broker node, started (and restarted) on `disk`; its commits wait a seed-chosen 1-20 ms.
fn broker_on(h: &Handle, disk: Arc<Mutex<SimDisk>>) -> madsim::runtime::NodeHandle {
    let text = config(thread_rng().gen_range(1..=20));
    h.create_node()
        .name("broker")
        .ip(BROKER.ip())
        .init(move || {
            let disk = lock(&disk).clone();
            let text = text.clone();
            async move {
                let config = starling_config::Config::from_str(&text)
                    .expect("valid config")
                    .0;
                let broker = starling_broker::Broker::start_with_store(
                    config,
                    starling_broker::hooks::Hooks::new(),
                    Location::Backend(Box::new(disk)),
                )
                .await;
                let _broker = broker.expect("broker starts on its store");
                std::future::pending::<()>().await;
            }
        })
        .build()
}

/// Kills the node, crashes its disk and restarts it on what the disk kept.
async fn kill_and_restart(h: &Handle, node: &madsim::runtime::NodeHandle, disk: &Mutex<SimDisk>) {
    h.kill(node.id());
    crash(disk);
    sleep(Duration::from_millis(50)).await;
    h.restart(node.id());
    sleep(Duration::from_millis(300)).await;
}

/// The disk of a killed node: unsynced writes lost, the last one sometimes torn.
fn crash(disk: &Mutex<SimDisk>) {
    let crashed = starling_sim::disk::crash(&lock(disk));
    *lock(disk) = crashed;
}

async fn scenario() {
    starling_sim::runner::spawn_tripwire_watcher();
    let disk = Arc::new(Mutex::new(SimDisk::new()));
    let h = Handle::current();
    let node = broker_on(&h, disk.clone());
    sleep(Duration::from_millis(200)).await;
    let oracle: Oracle = Arc::default();
    let mut clients = ClientNodes::default();
    for round in 0..ROUNDS {
        let o = oracle.clone();
        let writer = clients.node(format!("writer-{round}"));
        writer.spawn(publisher(o, round as u64 * 1_000_000));
        // Killed at a random moment of the writes, commits in progress included.
        sleep(Duration::from_millis(thread_rng().gen_range(5..400))).await;
        kill_and_restart(&h, &node, &disk).await;

        let found = clients
            .node(format!("reader-{round}"))
            .spawn(read_retained())
            .await
            .expect("the reader ran");
        let mut o = lock(&oracle);
        for (topic, state) in o.iter_mut() {
            let got = found.get(topic).copied();
            let ok = got == state.acked || (got.is_some() && got == state.in_flight);
            check!(
                ok,
                "round {round}: t/{topic} holds {got:?}, acknowledged {:?}, in flight {:?}",
                state.acked,
                state.in_flight
            );
            // What the store holds now is what the next round builds on.
            state.acked = got;
            state.in_flight = None;
        }
        for topic in found.keys() {
            check!(o.contains_key(topic), "t/{topic} never published");
        }
    }
}

#[test]
fn retained_state_survives_kills_with_unsynced_writes_lost() {
    run(
        RunConfig {
            default_seeds: 100,
            time_limit: Duration::from_secs(60),
            ..RunConfig::new(
                "broker_store",
                "retained_state_survives_kills_with_unsynced_writes_lost",
            )
        },
        scenario,
    );
}

// --- persistent sessions -----------------------------------------------------------------

/// What the subscriber's application saw, and the QoS 2 packet ids it holds awaiting PUBREL
/// (its side of the session, kept across its connections as MQTT asks of a client).
#[derive(Default)]
struct Received {
    seen: BTreeMap<u64, u32>,
    awaiting: std::collections::BTreeSet<u16>,
}

/// What the publisher saw acknowledged, by seq, with the QoS it was sent at.
type Acked = Arc<Mutex<BTreeMap<u64, QoS>>>;

fn persistent(id: &str) -> ConnectOpts {
    ConnectOpts {
        client_id: id.to_owned(),
        protocol: Protocol::V5,
        clean_start: false,
        session_expiry: 3600,
        will: None,
    }
}

/// Publishes QoS 1 and QoS 2 messages to `s/data`, one at a time, until its connection
/// dies; a seq counts as acknowledged at its PUBACK or PUBREC.
async fn session_publisher(acked: Acked, mut seq: u64) {
    let Ok((mut c, _)) = MqttClient::connect(BROKER, &opts("writer")).await else {
        return;
    };
    loop {
        seq += 1;
        let qos = if seq.is_multiple_of(2) {
            QoS::AtLeastOnce
        } else {
            QoS::ExactlyOnce
        };
        let id = pid((seq % 60_000) as u32);
        let p = Packet::Publish(Publish {
            dup: false,
            qos,
            retain: false,
            topic: "s/data".into(),
            packet_id: Some(id),
            properties: Properties::default(),
            payload: Bytes::from(seq.to_string()),
        });
        if c.send(&p).await.is_err() {
            return;
        }
        match c.recv().await {
            Ok(Packet::Puback(a) | Packet::Pubrec(a)) => {
                check!(a.reason_code == ReasonCode::Success, "refused: {a:?}");
                lock(&acked).insert(seq, qos);
            }
            Ok(other) => check!(false, "expected PUBACK/PUBREC, got {other:?}"),
            Err(_) => return,
        }
        if qos == QoS::ExactlyOnce {
            if c.send(&Packet::Pubrel(PubAck::new(id))).await.is_err() {
                return;
            }
            match c.recv().await {
                Ok(Packet::Pubcomp(_)) => {}
                Ok(other) => check!(false, "expected PUBCOMP, got {other:?}"),
                Err(_) => return,
            }
        }
    }
}

/// The persistent subscriber, connected until the node dies or `quiet` passes without a
/// packet: takes each message once (a QoS 2 PUBLISH whose id it holds is a resend).
async fn session_subscriber(got: Arc<Mutex<Received>>, first: bool, quiet: Duration) {
    let Ok((mut c, connack)) = MqttClient::connect(BROKER, &persistent("keeper")).await else {
        return;
    };
    if first {
        c.subscribe(1, "s/#", QoS::ExactlyOnce)
            .await
            .expect("subscribe sent");
    } else {
        check!(
            connack.session_present,
            "the session is gone after a restart"
        );
    }
    loop {
        let p = match timeout(quiet, c.recv()).await {
            Ok(Ok(p)) => p,
            Ok(Err(_)) => return,
            Err(_) => {
                c.disconnect().await;
                return;
            }
        };
        let reply = match p {
            Packet::Publish(p) => {
                let seq: u64 = std::str::from_utf8(&p.payload)
                    .expect("utf-8")
                    .parse()
                    .expect("a seq");
                let id = p.packet_id.expect("QoS 1/2");
                let mut g = lock(&got);
                let resent = p.qos == QoS::ExactlyOnce && !g.awaiting.insert(id.get());
                if !resent {
                    *g.seen.entry(seq).or_insert(0) += 1;
                }
                if p.qos == QoS::ExactlyOnce {
                    Packet::Pubrec(PubAck::new(id))
                } else {
                    Packet::Puback(PubAck::new(id))
                }
            }
            Packet::Pubrel(r) => {
                lock(&got).awaiting.remove(&r.packet_id.get());
                Packet::Pubcomp(PubAck::new(r.packet_id))
            }
            _ => continue,
        };
        if c.send(&reply).await.is_err() {
            return;
        }
    }
}

async fn session_scenario() {
    starling_sim::runner::spawn_tripwire_watcher();
    let disk = Arc::new(Mutex::new(SimDisk::new()));
    let h = Handle::current();
    let node = broker_on(&h, disk.clone());
    sleep(Duration::from_millis(200)).await;
    let acked: Acked = Arc::default();
    let got: Arc<Mutex<Received>> = Arc::default();
    let mut clients = ClientNodes::default();
    let sub = clients.node("keeper-0");
    sub.spawn(session_subscriber(
        got.clone(),
        true,
        Duration::from_millis(100),
    ))
    .await
    .expect("the subscriber ran");
    for round in 0..ROUNDS {
        // Sometimes the subscriber is there while the publishes go (its flows cross the
        // kill), sometimes away (its queue must come back from the store).
        if thread_rng().gen_bool(0.5) {
            clients
                .node(format!("keeper-{}", round + 1))
                .spawn(session_subscriber(
                    got.clone(),
                    false,
                    Duration::from_secs(3600),
                ));
        }
        let writer = clients.node(format!("writer-{round}"));
        writer.spawn(session_publisher(acked.clone(), round as u64 * 1_000_000));
        sleep(Duration::from_millis(thread_rng().gen_range(5..400))).await;
        kill_and_restart(&h, &node, &disk).await;
    }
    // Drain: everything acknowledged must come, each QoS 2 message once.
    clients
        .node("keeper-last")
        .spawn(session_subscriber(
            got.clone(),
            false,
            Duration::from_secs(2),
        ))
        .await
        .expect("the subscriber ran");
    let g = lock(&got);
    for (seq, qos) in lock(&acked).iter() {
        let n = g.seen.get(seq).copied().unwrap_or(0);
        check!(n > 0, "acknowledged {seq} ({qos:?}) never arrived");
        check!(
            *qos != QoS::ExactlyOnce || n == 1,
            "QoS 2 message {seq} arrived {n} times"
        );
    }
}

#[test]
fn persistent_sessions_survive_kills_with_unsynced_writes_lost() {
    run(
        RunConfig {
            default_seeds: 100,
            time_limit: Duration::from_secs(60),
            ..RunConfig::new(
                "broker_store",
                "persistent_sessions_survive_kills_with_unsynced_writes_lost",
            )
        },
        session_scenario,
    );
}
