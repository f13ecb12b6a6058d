//! One broker node whose store is a simulated disk that loses every write not yet synced
//! when the node is killed (`SimDisk`). A publisher sets retained messages on a few topics
//! at QoS 1, one at a time, while the node is killed at a random moment and restarted,
//! several times. After each restart a reader's subscription finds, for every topic, the
//! last retained message the publisher saw acknowledged or the one it had in flight when
//! the node died: never an older one, never a lost one.

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
use starling_store::{SimDisk, TornWrite};

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

async fn scenario() {
    starling_sim::runner::spawn_tripwire_watcher();
    let disk = Arc::new(Mutex::new(SimDisk::new()));
    let node_disk = disk.clone();
    let text = config(thread_rng().gen_range(1..=20));
    let h = Handle::current();
    let node = h
        .create_node()
        .name("broker")
        .ip(BROKER.ip())
        .init(move || {
            let disk = lock(&node_disk).clone();
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
        .build();
    sleep(Duration::from_millis(200)).await;
    let oracle: Oracle = Arc::default();
    let mut clients = ClientNodes::default();
    for round in 0..ROUNDS {
        let o = oracle.clone();
        let writer = clients.node(format!("writer-{round}"));
        writer.spawn(publisher(o, round as u64 * 1_000_000));
        // Killed at a random moment of the writes, commits in progress included.
        sleep(Duration::from_millis(thread_rng().gen_range(5..400))).await;
        h.kill(node.id());
        let torn = match thread_rng().gen_range(0..3) {
            0 => TornWrite::None,
            1 => TornWrite::Last {
                bytes: thread_rng().gen_range(0..4096),
            },
            _ => TornWrite::InOrder {
                writes: thread_rng().gen_range(0..4),
                bytes: thread_rng().gen_range(0..4096),
            },
        };
        let crashed = lock(&disk).crash(torn);
        *lock(&disk) = crashed;
        sleep(Duration::from_millis(50)).await;
        h.restart(node.id());
        sleep(Duration::from_millis(300)).await;

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
