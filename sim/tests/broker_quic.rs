//! MQTT over the simulated QUIC path: one broker node with a `quic` listener (its certificate
//! from an Ed25519 `CertAuthority`, loaded from PEM files as in production), a subscriber and
//! a publisher on two other nodes, each on `QuicBiStream::connect` through quinn and
//! starling-net's madsim shim, with the seed's latency on every packet. Checked: every QoS 1
//! publish acknowledged to the publisher reaches the subscriber at least once, every QoS 2
//! publish exactly once, each topic in order, while the network drops 5% of datagrams.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use madsim::rand::{thread_rng, Rng};
use madsim::runtime::Handle;
use madsim::time::{sleep, timeout, Instant};
use starling_codec::{
    decode, encode, Connect, Packet, Properties, Protocol, PubAck, Publish, QoS, ReasonCode,
    RetainHandling, Subscribe, SubscribeFilter, SubscriptionOptions,
};
use starling_config::{Config, ListenerConfig, ListenerKind, TlsConfig};
use starling_net::{
    CertAuthority, CertificateDer, ClientTls, QuicBiStream, QuicEndpoint, ALPN_MQTT,
};
use starling_sim::mqtt::pid;
use starling_sim::{check, run, Knobs, RunConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BROKER: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 14567);
/// The name in the broker's certificate that clients check.
const BROKER_NAME: &str = "broker";
/// Publishes per QoS level.
const MESSAGES: u64 = 20;
const PACKET_MAX: u32 = 1 << 20;
/// Share of datagrams the simulated network drops.
const LOSS: f64 = 0.05;

#[derive(Default)]
struct Oracle {
    subscribed: bool,
    /// topic → sequence numbers acknowledged to the publisher
    acked: BTreeMap<String, Vec<u64>>,
    /// topic → sequence numbers delivered to the subscriber, in arrival order
    received: BTreeMap<String, Vec<u64>>,
    publisher_done: bool,
}

type Shared = Arc<Mutex<Oracle>>;

fn lock(o: &Shared) -> std::sync::MutexGuard<'_, Oracle> {
    o.lock().unwrap_or_else(|e| e.into_inner())
}

/// A codec client on one QUIC stream. The endpoint is kept beside the stream it dialled.
struct QuicClient {
    _endpoint: QuicEndpoint,
    stream: QuicBiStream,
    buf: BytesMut,
}

impl QuicClient {
    /// Dials the broker until a CONNECT is accepted (the broker node may still be starting).
    async fn connect(client_id: &str, ca: &CertificateDer<'static>) -> QuicClient {
        let tls = ClientTls::new(vec![ca.clone()]).alpn(&[ALPN_MQTT]);
        let mut seed = [0u8; 32];
        thread_rng().fill(&mut seed);
        let endpoint = QuicEndpoint::client(
            SocketAddr::from(([0, 0, 0, 0], 0)),
            &tls,
            &starling_net::QuicConfig::new(seed),
        )
        .await
        .expect("client endpoint");
        loop {
            let attempt = timeout(Duration::from_secs(5), async {
                let stream = QuicBiStream::connect(&endpoint, BROKER, BROKER_NAME)
                    .await
                    .ok()?;
                let mut c = QuicClient {
                    _endpoint: endpoint.clone(),
                    stream,
                    buf: BytesMut::new(),
                };
                c.send(&Packet::Connect(Box::new(Connect {
                    protocol: Protocol::V5,
                    clean_start: true,
                    keep_alive: 0,
                    client_id: client_id.to_owned(),
                    will: None,
                    username: None,
                    password: None,
                    properties: Properties::default(),
                })))
                .await
                .ok()?;
                match c.recv().await.ok()? {
                    Packet::Connack(ack) if ack.reason_code == ReasonCode::Success => Some(c),
                    _ => None,
                }
            })
            .await;
            if let Ok(Some(c)) = attempt {
                return c;
            }
            sleep(Duration::from_millis(200)).await;
        }
    }

    async fn send(&mut self, p: &Packet) -> std::io::Result<()> {
        let mut out = BytesMut::new();
        encode(p, Protocol::V5, PACKET_MAX, &mut out).map_err(std::io::Error::other)?;
        self.stream.write_all(&out).await?;
        self.stream.flush().await
    }

    async fn recv(&mut self) -> std::io::Result<Packet> {
        loop {
            if let Some(p) =
                decode(&mut self.buf, Protocol::V5, PACKET_MAX).map_err(std::io::Error::other)?
            {
                return Ok(p);
            }
            self.buf.reserve(4096);
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
    }
}

fn ack(packet_id: std::num::NonZeroU16) -> PubAck {
    PubAck {
        packet_id,
        reason_code: ReasonCode::Success,
        properties: Properties::default(),
    }
}

async fn subscriber(ca: CertificateDer<'static>, oracle: Shared) {
    let mut c = QuicClient::connect("sub", &ca).await;
    let filter = |f: &str, qos| SubscribeFilter {
        filter: f.to_owned(),
        options: SubscriptionOptions {
            qos,
            no_local: false,
            retain_as_published: false,
            retain_handling: RetainHandling::DoNotSend,
        },
    };
    c.send(&Packet::Subscribe(Subscribe {
        packet_id: pid(1),
        filters: vec![
            filter("q/1", QoS::AtLeastOnce),
            filter("q/2", QoS::ExactlyOnce),
        ],
        properties: Properties::default(),
    }))
    .await
    .expect("subscribe");
    loop {
        let p = c
            .recv()
            .await
            .expect("the subscriber's QUIC stream stays up");
        match p {
            Packet::Suback(s) => {
                check!(
                    s.reason_codes == [ReasonCode::GrantedQoS1, ReasonCode::GrantedQoS2],
                    "SUBACK {:?}",
                    s.reason_codes
                );
                lock(&oracle).subscribed = true;
            }
            Packet::Publish(p) => {
                let seq: u64 = std::str::from_utf8(&p.payload)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .expect("numeric payload");
                lock(&oracle)
                    .received
                    .entry(p.topic.clone())
                    .or_default()
                    .push(seq);
                match (p.qos, p.packet_id) {
                    (QoS::AtLeastOnce, Some(id)) => {
                        c.send(&Packet::Puback(ack(id))).await.expect("puback")
                    }
                    (QoS::ExactlyOnce, Some(id)) => {
                        c.send(&Packet::Pubrec(ack(id))).await.expect("pubrec")
                    }
                    _ => {}
                }
            }
            Packet::Pubrel(r) => c
                .send(&Packet::Pubcomp(ack(r.packet_id)))
                .await
                .expect("pubcomp"),
            other => check!(false, "subscriber got {other:?}"),
        }
    }
}

async fn publisher(ca: CertificateDer<'static>, oracle: Shared) {
    while !lock(&oracle).subscribed {
        sleep(Duration::from_millis(50)).await;
    }
    let mut c = QuicClient::connect("pub", &ca).await;
    let mut id = 0u32;
    for seq in 0..MESSAGES {
        for (topic, qos) in [("q/1", QoS::AtLeastOnce), ("q/2", QoS::ExactlyOnce)] {
            id += 1;
            c.send(&Packet::Publish(Publish {
                dup: false,
                qos,
                retain: false,
                topic: topic.to_owned(),
                packet_id: Some(pid(id)),
                properties: Properties::default(),
                payload: Bytes::from(seq.to_string()),
            }))
            .await
            .expect("publish");
            // One message in flight at a time: each ends with its acknowledgement.
            loop {
                match c.recv().await.expect("the publisher's stream stays up") {
                    Packet::Puback(a) if qos == QoS::AtLeastOnce => {
                        check!(a.packet_id == pid(id), "PUBACK for {:?}", a.packet_id);
                        break;
                    }
                    Packet::Pubrec(a) if qos == QoS::ExactlyOnce => {
                        check!(a.packet_id == pid(id), "PUBREC for {:?}", a.packet_id);
                        c.send(&Packet::Pubrel(ack(a.packet_id)))
                            .await
                            .expect("pubrel");
                    }
                    Packet::Pubcomp(a) if qos == QoS::ExactlyOnce => {
                        check!(a.packet_id == pid(id), "PUBCOMP for {:?}", a.packet_id);
                        break;
                    }
                    other => check!(false, "publisher got {other:?} for {qos:?}"),
                }
            }
            lock(&oracle)
                .acked
                .entry(topic.to_owned())
                .or_default()
                .push(seq);
        }
    }
    lock(&oracle).publisher_done = true;
}

/// The broker's certificate and key as PEM files, as an operator would configure them.
fn write_certificates(ca: &CertAuthority) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("starling-sim-broker-quic-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let issued = ca
        .issue(BROKER_NAME, &[BROKER_NAME])
        .expect("broker certificate");
    let (cert, key) = (dir.join("broker.pem"), dir.join("broker.key"));
    std::fs::write(&cert, &issued.cert_pem).expect("write cert");
    std::fs::write(&key, &issued.key_pem).expect("write key");
    (cert, key)
}

async fn qos_round_trips() {
    let knobs = Knobs::current();
    starling_sim::runner::spawn_tripwire_watcher();
    madsim::net::NetSim::current().update_config(|c| {
        c.send_latency = knobs.latency.0..knobs.latency.1 + Duration::from_millis(1);
        // QUIC's loss recovery, not MQTT's, must make up for lost datagrams.
        c.packet_loss_rate = LOSS;
    });
    let ca = CertAuthority::generate("sim MQTT CA").expect("CA");
    let (cert_file, key_file) = write_certificates(&ca);
    let config = Config {
        listeners: vec![ListenerConfig {
            kind: ListenerKind::Quic,
            bind: BROKER,
            tls: Some(TlsConfig {
                cert_file,
                key_file,
                ca_file: None,
                verify_client: false,
                cn_as_username: false,
            }),
            quic: Some(starling_config::QuicConfig {
                idle_timeout_secs: 30,
            }),
            ..ListenerConfig::default()
        }],
        storage: starling_config::StorageConfig {
            enabled: false,
            ..Default::default()
        },
        ..Config::default()
    };
    let h = Handle::current();
    h.create_node()
        .name("broker")
        .ip(BROKER.ip())
        .init(move || {
            let config = config.clone();
            async move {
                let _broker = starling_broker::Broker::start(config)
                    .await
                    .expect("broker starts");
                // The node lives as long as this future: keep it pending.
                std::future::pending::<()>().await;
            }
        })
        .build();
    let oracle: Shared = Arc::default();
    let ca_der = ca.cert_der();
    h.create_node()
        .name("sub")
        .ip(IpAddr::V4(Ipv4Addr::new(10, 0, 1, 1)))
        .build()
        .spawn(subscriber(ca_der.clone(), oracle.clone()));
    h.create_node()
        .name("pub")
        .ip(IpAddr::V4(Ipv4Addr::new(10, 0, 1, 2)))
        .build()
        .spawn(publisher(ca_der, oracle.clone()));

    let started = Instant::now();
    loop {
        {
            let g = lock(&oracle);
            let all = |t: &str| g.received.get(t).map_or(0, Vec::len) as u64 >= MESSAGES;
            if g.publisher_done && all("q/1") && all("q/2") {
                break;
            }
        }
        check!(
            started.elapsed() < Duration::from_secs(120),
            "round trips not done: acked {:?}, received {:?}",
            lock(&oracle).acked,
            lock(&oracle).received
        );
        sleep(Duration::from_millis(100)).await;
    }
    // Nothing more may arrive (a QoS 2 duplicate, say) once everything is acknowledged.
    sleep(Duration::from_secs(2)).await;
    let g = lock(&oracle);
    let expected: Vec<u64> = (0..MESSAGES).collect();
    for topic in ["q/1", "q/2"] {
        check!(
            g.acked.get(topic) == Some(&expected),
            "{topic}: acknowledged {:?}",
            g.acked.get(topic)
        );
    }
    // QoS 1 may repeat a message (at least once), never lose or reorder one.
    let q1 = g.received.get("q/1").cloned().unwrap_or_default();
    let mut q1_unique = q1.clone();
    q1_unique.dedup();
    check!(q1_unique == expected, "q/1 received {q1:?}");
    check!(
        g.received.get("q/2") == Some(&expected),
        "q/2 received {:?} (exactly once, in order)",
        g.received.get("q/2")
    );
}

#[test]
fn qos1_and_qos2_round_trips_over_quic() {
    run(
        RunConfig::new("broker_quic", "qos1_and_qos2_round_trips_over_quic").seeds(20),
        qos_round_trips,
    );
}
