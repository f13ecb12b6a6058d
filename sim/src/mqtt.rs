//! A minimal MQTT client for simulations: a thin async shell over the client core
//! (`starling_client`) and the transport seam: connect, send a packet, receive a packet.
//! Protocol state (acks, resends, QoS 2 receipt) is the scenario's, so that the test owns
//! exactly what it checks: the core runs with manual acknowledgements, hands over every
//! packet the broker sends, and `send` puts packets on the wire past its bookkeeping.

use std::io;
use std::net::SocketAddr;
use std::num::NonZeroU16;

use bytes::BytesMut;
use starling_client::{Acks, ClientCore, ClientOptions};
use starling_codec::{
    Connack, Connect, Disconnect, LastWill, Packet, Properties, Protocol, QoS, ReasonCode,
    Subscribe, SubscribeFilter, SubscriptionOptions,
};
use starling_net::Stream;
use starling_rt::time::now;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Packets larger than this are a test failure, not a real-world limit.
const PACKET_MAX: u32 = 1 << 20;

pub struct MqttClient {
    stream: Stream,
    buf: BytesMut,
    out: BytesMut,
    core: ClientCore,
    pub protocol: Protocol,
}

/// What to put in the CONNECT.
#[derive(Clone, Debug)]
pub struct ConnectOpts {
    pub client_id: String,
    pub protocol: Protocol,
    pub clean_start: bool,
    /// MQTT 5 Session Expiry Interval (3.x: any value means clean session = false).
    pub session_expiry: u32,
    pub will: Option<LastWill>,
}

fn err(msg: impl Into<String>) -> io::Error {
    io::Error::other(msg.into())
}

fn core_err(e: starling_client::Error) -> io::Error {
    err(e.to_string())
}

impl MqttClient {
    /// Connects and waits for the CONNACK; fails unless it is a success.
    pub async fn connect(addr: SocketAddr, o: &ConnectOpts) -> io::Result<(MqttClient, Connack)> {
        let stream = starling_net::connect(addr)
            .await
            .map_err(|e| err(e.to_string()))?;
        let mut properties = Properties::default();
        if o.protocol == Protocol::V5 && o.session_expiry > 0 {
            properties.session_expiry_interval = Some(o.session_expiry);
        }
        let connect = Connect {
            protocol: o.protocol,
            clean_start: o.clean_start,
            keep_alive: 0,
            client_id: o.client_id.clone(),
            will: o.will.clone(),
            username: None,
            password: None,
            properties,
        };
        let mut options = ClientOptions::new(connect);
        options.acks = Acks::Manual;
        options.packet_size_max = PACKET_MAX;
        let mut c = MqttClient {
            stream,
            buf: BytesMut::new(),
            out: BytesMut::new(),
            core: ClientCore::new(options),
            protocol: o.protocol,
        };
        c.core.connect(now()).map_err(core_err)?;
        c.flush().await?;
        match c.recv().await? {
            Packet::Connack(ack) if ack.reason_code == ReasonCode::Success => Ok((c, ack)),
            other => Err(err(format!("connect refused: {other:?}"))),
        }
    }

    /// Sends `p` as given, past the core's bookkeeping.
    pub async fn send(&mut self, p: &Packet) -> io::Result<()> {
        self.core.send_packet(p).map_err(core_err)?;
        self.flush().await
    }

    /// Writes what the core queued.
    async fn flush(&mut self) -> io::Result<()> {
        self.core.poll_transmit(&mut self.out);
        if self.out.is_empty() {
            return Ok(());
        }
        self.stream.write_all(&self.out).await?;
        self.out.clear();
        // Simulated TCP sends only on flush.
        self.stream.flush().await
    }

    /// Sends a SUBSCRIBE of one filter (packet id `id`); the SUBACK is the caller's to read.
    pub async fn subscribe(&mut self, id: u32, filter: &str, qos: QoS) -> io::Result<()> {
        self.send(&Packet::Subscribe(Subscribe {
            packet_id: pid(id),
            filters: vec![SubscribeFilter {
                filter: filter.into(),
                options: SubscriptionOptions {
                    qos,
                    ..Default::default()
                },
            }],
            properties: Properties::default(),
        }))
        .await
    }

    /// The next packet from the broker; an error when the connection ends or the broker
    /// breaks the protocol.
    pub async fn recv(&mut self) -> io::Result<Packet> {
        loop {
            while let Some(event) = self.core.poll_event() {
                // Every event of a manual-ack core that sends nothing of its own is a packet.
                if let Some(p) = event.into_packet() {
                    return Ok(p);
                }
            }
            self.core
                .handle_buf(now(), &mut self.buf)
                .map_err(core_err)?;
            if let Some(p) = self.core.poll_event().and_then(|e| e.into_packet()) {
                return Ok(p);
            }
            self.buf.reserve(4096);
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
            }
        }
    }

    /// A graceful goodbye: DISCONNECT (reason 0, no will) then close.
    pub async fn disconnect(mut self) {
        let goodbye = Disconnect {
            reason_code: ReasonCode::Success,
            properties: Properties::default(),
        };
        if self.core.disconnect(now(), goodbye.clone()).is_err() {
            // No connection in the core's eyes (the broker said DISCONNECT): say it anyway.
            let _ = self.core.send_packet(&Packet::Disconnect(goodbye));
        }
        let _ = self.flush().await;
        let _ = self.stream.shutdown().await;
    }
}

/// Packet id `n` (wrapping within 1..=65535).
pub fn pid(n: u32) -> NonZeroU16 {
    NonZeroU16::new((n % 65535 + 1) as u16).expect("1..=65535")
}

/// Starts a broker node at `addr` with `config` (TOML) on the current simulation, and
/// returns once its listener had time to bind (200 ms of virtual time).
pub async fn broker_node(addr: SocketAddr, config: &'static str) -> madsim::runtime::NodeHandle {
    let config_text = config;
    let node = madsim::runtime::Handle::current()
        .create_node()
        .name("broker")
        .ip(addr.ip())
        .init(move || async move {
            let mut config = starling_config::Config::from_str(config)
                .expect("valid config")
                .0;
            if !text_has_storage(config_text) {
                // The simulator's file system is the host's: no store unless a scenario
                // asks for one.
                config.storage.enabled = false;
            }
            let _broker = starling_broker::Broker::start(config)
                .await
                .expect("broker starts");
            std::future::pending::<()>().await;
        })
        .build();
    madsim::time::sleep(std::time::Duration::from_millis(200)).await;
    node
}

/// Makes the client nodes of a scenario, each with an address of its own in 10.0.1.0/24
/// (the broker's is elsewhere), named as given.
pub struct ClientNodes {
    last: u8,
}

impl Default for ClientNodes {
    fn default() -> Self {
        Self { last: 10 }
    }
}

impl ClientNodes {
    /// A new node named `name` on the current simulation.
    pub fn node(&mut self, name: impl Into<String>) -> madsim::runtime::NodeHandle {
        self.last = self.last.checked_add(1).expect("at most 245 client nodes");
        madsim::runtime::Handle::current()
            .create_node()
            .name(name.into())
            .ip(std::net::IpAddr::V4(std::net::Ipv4Addr::new(
                10, 0, 1, self.last,
            )))
            .build()
    }
}

fn text_has_storage(config: &str) -> bool {
    config.contains("[storage]")
}
