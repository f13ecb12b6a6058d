//! A small MQTT test client on the client core, and a broker on an ephemeral port.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::num::NonZeroU16;
use std::path::PathBuf;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use starling_broker::Broker;
use starling_client::{Acks, ClientCore, ClientOptions, Event};
use starling_codec::{
    encode, Connack, Connect, Disconnect, LastWill, Packet, Properties, Protocol, Publish, QoS,
    ReasonCode, Suback, Subscribe, SubscribeFilter, SubscriptionOptions,
};
use starling_config::{Config, ListenerKind};
use starling_rt::time::now;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// Any byte stream a test client can speak MQTT on (TCP, TLS, WebSocket, QUIC).
pub trait ByteStream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> ByteStream for T {}

/// How long a test waits for a packet it expects.
pub const WAIT: Duration = Duration::from_secs(5);

/// A broker on 127.0.0.1:0 with `extra` TOML appended (sections other than listeners).
pub async fn broker(extra: &str) -> (Broker, SocketAddr) {
    let text = format!(
        "[[listeners]]\nkind = \"tcp\"\nbind = \"127.0.0.1:0\"\n{extra}\n{}",
        no_store(extra)
    );
    let (config, _) = Config::from_str(&text).expect("test config");
    broker_with(config).await
}

pub async fn broker_with(config: Config) -> (Broker, SocketAddr) {
    let b = Broker::start(config).await.expect("broker starts");
    let addr = b.local_addr(ListenerKind::Tcp).expect("tcp listener");
    (b, addr)
}

/// `[storage] enabled = false` unless `extra` has a `[storage]` section: tests run in
/// parallel, and a store under the default `data_dir` would be shared (and locked) by all.
pub fn no_store(extra: &str) -> &'static str {
    if extra.contains("[storage]") {
        ""
    } else {
        "[storage]\nenabled = false\n"
    }
}

/// A fresh directory for a test's files.
pub fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("starling-broker-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

pub fn pid(n: u16) -> NonZeroU16 {
    NonZeroU16::new(n).expect("non-zero packet id")
}

pub fn connect_packet(protocol: Protocol, client_id: &str, clean: bool) -> Connect {
    Connect {
        protocol,
        clean_start: clean,
        keep_alive: 60,
        client_id: client_id.to_owned(),
        will: None,
        username: None,
        password: None,
        properties: Properties::default(),
    }
}

/// `connect` as the bytes on the wire, for tests that speak on a bare socket.
pub fn connect_bytes(connect: Connect) -> BytesMut {
    let protocol = connect.protocol;
    let mut bytes = BytesMut::new();
    encode(
        &Packet::Connect(Box::new(connect)),
        protocol,
        u32::MAX,
        &mut bytes,
    )
    .expect("encodable");
    bytes
}

pub fn will(topic: &str, payload: &str) -> LastWill {
    LastWill {
        topic: topic.to_owned(),
        payload: Bytes::from(payload.to_owned()),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: Properties::default(),
    }
}

/// A test client: the MQTT state is a [`ClientCore`] in manual-ack mode, so that a test
/// sees every packet the broker sends and answers (or not) as it means to; `send` and
/// `send_raw` put packets and bytes on the wire past the core, for tests of what a client
/// must not do.
pub struct Client {
    stream: Box<dyn ByteStream>,
    buf: BytesMut,
    out: BytesMut,
    core: ClientCore,
    pub protocol: Protocol,
}

impl Client {
    /// Opens a connection and sends `connect`; returns the client and the CONNACK.
    pub async fn open(addr: SocketAddr, connect: Connect) -> (Client, Connack) {
        let stream = TcpStream::connect(addr).await.expect("tcp connect");
        Client::open_on(Box::new(stream), connect).await
    }

    /// Sends `connect` on an open stream of any transport; returns the client and the
    /// CONNACK.
    pub async fn open_on(stream: Box<dyn ByteStream>, connect: Connect) -> (Client, Connack) {
        let protocol = connect.protocol;
        let mut options = ClientOptions::new(connect);
        options.acks = Acks::Manual;
        let mut c = Client {
            stream,
            buf: BytesMut::new(),
            out: BytesMut::new(),
            core: ClientCore::new(options),
            protocol,
        };
        c.core.connect(now()).expect("CONNECT encodes");
        c.flush().await;
        match c.recv().await {
            Some(Packet::Connack(ack)) => (c, ack),
            other => panic!("expected CONNACK, got {other:?}"),
        }
    }

    /// Connects with defaults (keep alive 60).
    pub async fn connect(addr: SocketAddr, protocol: Protocol, id: &str, clean: bool) -> Client {
        let (c, ack) = Client::open(addr, connect_packet(protocol, id, clean)).await;
        assert!(!ack.reason_code.is_error(), "CONNACK refused: {ack:?}");
        c
    }

    /// Sends `p` as given, past the core's bookkeeping.
    pub async fn send(&mut self, p: Packet) {
        self.core.send_packet(&p).expect("encodable");
        self.flush().await;
    }

    pub async fn send_raw(&mut self, bytes: &[u8]) {
        self.flush().await;
        self.write(bytes).await;
    }

    /// Writes what the core queued.
    async fn flush(&mut self) {
        self.core.poll_transmit(&mut self.out);
        if !self.out.is_empty() {
            let out = std::mem::take(&mut self.out);
            self.write(&out).await;
        }
    }

    async fn write(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("write");
        // WebSocket and QUIC streams send gathered bytes on flush.
        self.stream.flush().await.expect("flush");
    }

    /// The next packet, or `None` when the broker closed the connection. Panics after
    /// [`WAIT`].
    pub async fn recv(&mut self) -> Option<Packet> {
        match self.recv_within(WAIT).await {
            Ok(p) => p,
            Err(()) => panic!("no packet within {WAIT:?}"),
        }
    }

    /// `Err(())` if nothing came within `d`.
    pub async fn recv_within(&mut self, d: Duration) -> Result<Option<Packet>, ()> {
        tokio::time::timeout(d, self.read_packet())
            .await
            .map_err(|_| ())
    }

    async fn read_packet(&mut self) -> Option<Packet> {
        loop {
            // `Published` ends one of the core's own exchanges and mirrors no packet:
            // `publish` waits for those.
            if let Some(p) = self.next_event().await?.into_packet() {
                return Some(p);
            }
        }
    }

    /// The core's next event, reading as needed; `None` when the connection ends.
    async fn next_event(&mut self) -> Option<Event> {
        loop {
            if let Some(e) = self.core.poll_event() {
                return Some(e);
            }
            if let Err(e) = self.core.handle_buf(now(), &mut self.buf) {
                panic!("broker sent a malformed packet: {e}");
            }
            // Only the core's own flows queue anything here (a PUBREL in `publish`).
            self.flush().await;
            if let Some(e) = self.core.poll_event() {
                return Some(e);
            }
            self.buf.reserve(4096);
            match self.stream.read_buf(&mut self.buf).await {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    /// The next PUBLISH, acknowledging QoS 1/2 as a well-behaved client does.
    pub async fn recv_publish(&mut self) -> Publish {
        loop {
            match self.recv().await {
                Some(Packet::Publish(p)) => {
                    if let Some(id) = p.packet_id {
                        self.acknowledge(id, Some(p.qos)).await;
                    }
                    return p;
                }
                Some(Packet::Pubrel(r)) => self.acknowledge(r.packet_id, None).await,
                Some(Packet::Pingresp) => {}
                other => panic!("expected PUBLISH, got {other:?}"),
            }
        }
    }

    /// Nothing but PUBREL/PINGRESP arrives within `d`.
    pub async fn expect_no_publish(&mut self, d: Duration) {
        loop {
            match self.recv_within(d).await {
                Err(()) => return,
                Ok(Some(Packet::Pubrel(r))) => self.acknowledge(r.packet_id, None).await,
                Ok(other) => panic!("expected nothing, got {other:?}"),
            }
        }
    }

    /// PUBACK/PUBREC for a PUBLISH of `qos`, PUBCOMP for a PUBREL (`None`).
    async fn acknowledge(&mut self, id: NonZeroU16, qos: Option<QoS>) {
        self.core
            .acknowledge(now(), id, qos)
            .expect("connected, encodable");
        self.flush().await;
    }

    pub async fn subscribe(&mut self, id: u16, filter: &str, qos: QoS) -> Suback {
        self.subscribe_with(
            id,
            filter,
            SubscriptionOptions {
                qos,
                ..Default::default()
            },
        )
        .await
    }

    /// Subscribes with packet id `id`, which the test picks (and may reuse on purpose),
    /// so the SUBSCRIBE goes past the core.
    pub async fn subscribe_with(
        &mut self,
        id: u16,
        filter: &str,
        options: SubscriptionOptions,
    ) -> Suback {
        self.send(Packet::Subscribe(Subscribe {
            packet_id: pid(id),
            filters: vec![SubscribeFilter {
                filter: filter.to_owned(),
                options,
            }],
            properties: Properties::default(),
        }))
        .await;
        match self.recv().await {
            Some(Packet::Suback(s)) => s,
            // Retained messages come after the SUBACK; anything before is a test bug.
            other => panic!("expected SUBACK, got {other:?}"),
        }
    }

    /// Publishes and completes the QoS flow (the core sends the PUBREL of QoS 2); panics
    /// unless the broker's acknowledgements are the next packets and succeed.
    pub async fn publish(&mut self, topic: &str, payload: &[u8], qos: QoS, retain: bool) {
        let code = self.publish_code(topic, payload, qos, retain).await;
        let what = if qos == QoS::ExactlyOnce {
            "PUBREC/PUBCOMP"
        } else {
            "PUBACK"
        };
        assert!(!code.is_error(), "{what} failed: {code:?}");
    }

    /// Publishes and completes the QoS flow; the reason code of the broker's PUBACK (or
    /// PUBREC/PUBCOMP), `Success` for QoS 0.
    pub async fn publish_code(
        &mut self,
        topic: &str,
        payload: &[u8],
        qos: QoS,
        retain: bool,
    ) -> ReasonCode {
        let payload = Bytes::copy_from_slice(payload);
        let props = Properties::default();
        let id = self
            .core
            .publish(now(), topic, payload, qos, retain, props)
            .expect("connected, within the window, encodable");
        self.flush().await;
        let Some(id) = id else {
            return ReasonCode::Success;
        };
        match tokio::time::timeout(WAIT, self.next_event()).await {
            Ok(Some(Event::Published {
                packet_id,
                reason_code,
            })) if packet_id == id => reason_code,
            Ok(other) => panic!("expected the acknowledgement of {id}, got {other:?}"),
            Err(_) => panic!("no acknowledgement of {id} within {WAIT:?}"),
        }
    }

    pub async fn disconnect(mut self) {
        // Past the core when it has no connection (a refused CONNACK), as before the core.
        if self.core.disconnect(now(), Disconnect::default()).is_err() {
            self.core
                .send_packet(&Packet::Disconnect(Disconnect::default()))
                .expect("encodable");
        }
        self.flush().await;
        let _ = self.stream.shutdown().await;
    }

    /// Drops the socket without DISCONNECT.
    pub fn kill(self) {
        drop(self);
    }
}

/// A real-client test found its client program missing. Outside CI the test is skipped with
/// a note saying what to install; under CI (`CI` set, as `.ci/run` does) it fails, so that a
/// machine without the program cannot pass the test without running it.
pub fn tool_missing(program: &str, install: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("{program} is missing and CI is set: install it ({install})");
    }
    println!("skipped: {program} not found ({install})");
}

/// Runs a test on the production backend: an actix system with two arbiters, the broker's
/// actors spread over them, the test itself on the system's thread.
pub fn on_actix<F: std::future::Future<Output = ()>>(test: F) {
    starling_rt::Runtime::new(2).block_on(test);
}
