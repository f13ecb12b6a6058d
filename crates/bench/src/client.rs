//! A lean MQTT client for load: one task per connection that connects,
//! optionally subscribes, publishes at a pace within an in-flight window,
//! acknowledges what it receives, and stamps and checks every payload.
//!
//! Reads and writes share one task and one `select!`: acknowledgements are
//! encoded straight into the output buffer, and every write sends all that
//! accumulated since the last one, so under load one syscall carries many
//! packets.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU16;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use starling_codec::{
    decode, encode, encode_publish_header, Connect, Disconnect, Packet, PacketId, PacketType,
    Properties, Protocol, PubAck, PublishHeader, QoS, Subscribe, SubscribeFilter,
    SubscriptionOptions, PACKET_SIZE_MAX,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch};

use crate::error::ClientError;
use crate::payload::{Clock, SeqTracker, Stamp};

/// Stop producing PUBLISH packets once this much output waits to be written:
/// large enough to fill a socket send in one syscall, small enough that a
/// slow broker pushes back on the publisher quickly.
const OUT_HIGH_WATER: usize = 64 * 1024;
/// Bytes reserved in the read buffer before each read.
const READ_CHUNK: usize = 64 * 1024;
/// Latency samples buffered per client before they go to the collector.
const LATENCY_BATCH: usize = 1024;
/// How long a client may take to send its DISCONNECT when told to stop.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// How to reach the broker. Only TCP is wired now; TLS, WebSocket and QUIC
/// come from `starling-net`'s connectors and reuse [`drive`] unchanged, as it
/// only needs a read half and a write half.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// Plain TCP.
    Tcp,
}

/// Where a run is in its life; clients watch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// Clients connect and subscribe; nobody publishes.
    Connecting,
    /// Publishers publish.
    Run,
    /// Publishers stop and wait for their acknowledgements; subscribers read on.
    Drain,
    /// Everyone disconnects.
    Stop,
}

/// One connection's part in a run.
#[derive(Debug, Clone)]
pub struct ClientSpec {
    /// Client identifier.
    pub client_id: String,
    /// Broker address.
    pub target: SocketAddr,
    /// Source address to bind before connecting, if any.
    pub source: Option<IpAddr>,
    /// Transport.
    pub transport: Transport,
    /// MQTT version.
    pub protocol: Protocol,
    /// Keep alive in seconds; a PINGREQ goes out after half of it without writing.
    pub keep_alive_secs: u16,
    /// Bound on TCP connect + CONNECT/CONNACK + SUBSCRIBE/SUBACK.
    pub connect_timeout: Duration,
    /// Subscription made before the run starts.
    pub subscribe: Option<SubSpec>,
    /// Publishing done during [`Phase::Run`].
    pub publish: Option<PubSpec>,
}

/// A subscription.
#[derive(Debug, Clone)]
pub struct SubSpec {
    /// The topic filter.
    pub filter: String,
    /// Maximum QoS.
    pub qos: QoS,
}

/// A publisher's stream of messages.
#[derive(Debug, Clone)]
pub struct PubSpec {
    /// Index written into every stamp, so subscribers tell streams apart.
    pub publisher: u32,
    /// Topic name.
    pub topic: String,
    /// QoS.
    pub qos: QoS,
    /// Payload size in bytes, at least [`crate::payload::STAMP_LEN`].
    pub payload_size: usize,
    /// Messages to send at most.
    pub count: u64,
    /// Messages per second, or as fast as the window allows.
    pub rate: Option<f64>,
    /// Fraction of one interval by which this publisher's schedule is
    /// shifted, so that publishers at a fixed rate do not all fire at once.
    pub phase_offset: f64,
    /// Messages sent and not yet acknowledged, at most (QoS 1 and 2).
    pub inflight: u16,
}

/// Counters every client bumps as it goes, read by the progress line and by
/// the run's phase decisions. Relaxed atomics: they are statistics, and the
/// final figures come from each client's [`ClientOutcome`].
#[derive(Debug, Default)]
pub struct Live {
    /// CONNACKs received.
    pub connected: AtomicU64,
    /// Clients that failed before being ready.
    pub failed: AtomicU64,
    /// Clients connected and subscribed.
    pub ready: AtomicU64,
    /// Errors after being ready.
    pub errors: AtomicU64,
    /// PUBLISH packets encoded.
    pub sent: AtomicU64,
    /// PUBACKs and PUBCOMPs received.
    pub acked: AtomicU64,
    /// PUBLISH packets received.
    pub received: AtomicU64,
    /// Publishers that sent their whole count.
    pub publishers_done: AtomicU64,
    /// Stamp clock offset of the last delivery, ns since start.
    pub last_receive_ns: AtomicU64,
}

/// What every client shares.
#[derive(Debug)]
pub struct Shared {
    /// The stamp clock.
    pub clock: Clock,
    /// Live counters.
    pub live: Live,
    /// Where latency samples (ns) go, in batches.
    pub latency: mpsc::UnboundedSender<Vec<u64>>,
}

/// What one client did, returned when it ends.
#[derive(Debug, Default)]
pub struct ClientOutcome {
    /// CONNECT → CONNACK time, if a CONNACK came.
    pub connack_latency: Option<Duration>,
    /// Whether the client got as far as [`Phase::Run`] readiness.
    pub ready: bool,
    /// When it became ready.
    pub ready_at: Option<Instant>,
    /// The error that ended it, if any.
    pub error: Option<ClientError>,
    /// The publisher index, if it published.
    pub publisher: Option<u32>,
    /// PUBLISH packets sent.
    pub sent: u64,
    /// PUBLISH packets acknowledged (PUBACK, or PUBCOMP for QoS 2).
    pub acked: u64,
    /// PUBLISH packets received.
    pub received: u64,
    /// Received payloads without our stamp.
    pub foreign: u64,
    /// Deliveries per publisher index.
    pub streams: HashMap<u32, SeqTracker>,
}

/// Runs one client to the end of the run: connects, subscribes, reports
/// readiness, then follows `phase` until [`Phase::Stop`]. Never panics on
/// broker input; an error ends the client and is returned in the outcome.
pub async fn run_client(
    spec: ClientSpec,
    shared: Arc<Shared>,
    phase: watch::Receiver<Phase>,
) -> ClientOutcome {
    let mut outcome = ClientOutcome {
        publisher: spec.publish.as_ref().map(|p| p.publisher),
        ..ClientOutcome::default()
    };
    let result = match spec.transport {
        Transport::Tcp => match connect_tcp(spec.target, spec.source).await {
            Ok(mut stream) => {
                let (rd, wr) = stream.split();
                session(&spec, &shared, phase, rd, wr, &mut outcome).await
            }
            Err(e) => Err(e),
        },
    };
    if let Err(e) = result {
        if outcome.ready {
            shared.live.errors.fetch_add(1, Relaxed);
        } else {
            shared.live.failed.fetch_add(1, Relaxed);
        }
        outcome.error = Some(e);
    }
    outcome
}

/// Opens a TCP connection from `source` (if given) with Nagle off: batching
/// is ours to do, and a delayed ACK must never hold a small packet back.
async fn connect_tcp(target: SocketAddr, source: Option<IpAddr>) -> Result<TcpStream, ClientError> {
    let io = |op| move |source| ClientError::Io { op, source };
    let socket = if target.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(io("socket"))?;
    if let Some(ip) = source {
        socket.bind(SocketAddr::new(ip, 0)).map_err(io("bind"))?;
    }
    let stream = socket.connect(target).await.map_err(io("connect"))?;
    stream.set_nodelay(true).map_err(io("nodelay"))?;
    Ok(stream)
}

/// The connection after TCP: handshake, subscription, then the main loop.
async fn session<R, W>(
    spec: &ClientSpec,
    shared: &Shared,
    phase: watch::Receiver<Phase>,
    mut rd: R,
    mut wr: W,
    outcome: &mut ClientOutcome,
) -> Result<(), ClientError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut rbuf = BytesMut::with_capacity(READ_CHUNK);
    let mut out = BytesMut::with_capacity(OUT_HIGH_WATER);
    let protocol = spec.protocol;

    let setup = async {
        let connect = Packet::Connect(Box::new(Connect {
            protocol,
            clean_start: true,
            keep_alive: spec.keep_alive_secs,
            client_id: spec.client_id.clone(),
            will: None,
            username: None,
            password: None,
            properties: Properties::default(),
        }));
        put(&connect, protocol, PACKET_SIZE_MAX, &mut out)?;
        let sent_at = Instant::now();
        flush(&mut wr, &mut out).await?;
        let connack = match read_packet(&mut rd, &mut rbuf, protocol, "connect").await? {
            Packet::Connack(c) => c,
            other => {
                return Err(ClientError::Unexpected {
                    packet_type: other.packet_type(),
                    during: "connect",
                })
            }
        };
        outcome.connack_latency = Some(sent_at.elapsed());
        if connack.reason_code.is_error() {
            return Err(ClientError::Refused {
                reason: connack.reason_code,
            });
        }
        shared.live.connected.fetch_add(1, Relaxed);
        if let Some(sub) = &spec.subscribe {
            subscribe(sub, protocol, &mut rd, &mut wr, &mut rbuf, &mut out).await?;
        }
        Ok(connack.properties)
    };
    let props = tokio::time::timeout(spec.connect_timeout, setup)
        .await
        .map_err(|_| ClientError::Timeout {
            what: "CONNACK/SUBACK",
        })??;
    outcome.ready = true;
    outcome.ready_at = Some(Instant::now());
    shared.live.ready.fetch_add(1, Relaxed);

    let limits = Limits {
        // MQTT 5 §3.2.2.3.3/§3.2.2.3.6: the broker's Receive Maximum bounds
        // our unacknowledged QoS 1/2 PUBLISHes; its Maximum Packet Size ours.
        receive_maximum: props.receive_maximum.unwrap_or(u16::MAX),
        max_packet_size: props.maximum_packet_size.unwrap_or(PACKET_SIZE_MAX),
    };
    let mut conn = Conn {
        spec,
        shared,
        limits,
        rbuf,
        out,
        outcome,
        latencies: Vec::new(),
        inflight: 0,
        next_packet_id: 1,
    };
    let result = conn.drive(phase, &mut rd, &mut wr).await;
    conn.flush_latencies();
    result?;
    // MQTT 5 §3.14: a normal DISCONNECT, so the broker drops no will and logs no error.
    let closing = async {
        put(
            &Packet::Disconnect(Disconnect::default()),
            protocol,
            limits.max_packet_size,
            &mut conn.out,
        )?;
        flush(&mut wr, &mut conn.out).await?;
        wr.shutdown().await.map_err(|source| ClientError::Io {
            op: "shutdown",
            source,
        })
    };
    // The run is over; a broker too busy to take a DISCONNECT is not our error.
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, closing).await;
    Ok(())
}

async fn subscribe<R, W>(
    sub: &SubSpec,
    protocol: Protocol,
    rd: &mut R,
    wr: &mut W,
    rbuf: &mut BytesMut,
    out: &mut BytesMut,
) -> Result<(), ClientError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let packet_id = PacketId::MIN;
    let subscribe = Packet::Subscribe(Subscribe {
        packet_id,
        filters: vec![SubscribeFilter {
            filter: sub.filter.clone(),
            options: SubscriptionOptions {
                qos: sub.qos,
                ..SubscriptionOptions::default()
            },
        }],
        properties: Properties::default(),
    });
    put(&subscribe, protocol, PACKET_SIZE_MAX, out)?;
    flush(wr, out).await?;
    match read_packet(rd, rbuf, protocol, "subscribe").await? {
        Packet::Suback(s) if s.packet_id == packet_id => match s.reason_codes.first() {
            Some(code) if !code.is_error() => Ok(()),
            code => Err(ClientError::SubscribeRefused {
                filter: sub.filter.clone(),
                reason: code
                    .copied()
                    .unwrap_or(starling_codec::ReasonCode::UnspecifiedError),
            }),
        },
        other => Err(ClientError::Unexpected {
            packet_type: other.packet_type(),
            during: "subscribe",
        }),
    }
}

/// The peer's limits learnt from CONNACK.
#[derive(Debug, Clone, Copy)]
struct Limits {
    receive_maximum: u16,
    max_packet_size: u32,
}

/// A connected client's state during the main loop.
struct Conn<'a> {
    spec: &'a ClientSpec,
    shared: &'a Shared,
    limits: Limits,
    rbuf: BytesMut,
    out: BytesMut,
    outcome: &'a mut ClientOutcome,
    latencies: Vec<u64>,
    /// QoS 1/2 PUBLISHes not yet acknowledged.
    inflight: u32,
    next_packet_id: u16,
}

impl Conn<'_> {
    /// Publishes, reads, acknowledges and pings until [`Phase::Stop`].
    async fn drive<R, W>(
        &mut self,
        mut phase_rx: watch::Receiver<Phase>,
        rd: &mut R,
        wr: &mut W,
    ) -> Result<(), ClientError>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let spec = self.spec;
        let mut phase = *phase_rx.borrow_and_update();
        let mut run_start: Option<Instant> = None;
        let mut publishing_done = spec.publish.is_none();
        let ping_every = (spec.keep_alive_secs > 0)
            .then(|| Duration::from_millis(u64::from(spec.keep_alive_secs) * 500));
        let mut last_write = Instant::now();
        let timer = tokio::time::sleep(Duration::from_secs(3600));
        tokio::pin!(timer);
        let mut armed: Option<Instant> = None;

        while phase != Phase::Stop {
            let mut wait_rate: Option<Instant> = None;
            if let (Some(p), false, Phase::Run) = (&spec.publish, publishing_done, phase) {
                let start = *run_start.get_or_insert_with(Instant::now);
                wait_rate = self.produce(p, start)?;
                if self.outcome.sent == p.count {
                    publishing_done = true;
                    self.shared.live.publishers_done.fetch_add(1, Relaxed);
                }
            }

            // One timer serves the rate schedule and the keep-alive ping.
            let ping_at = ping_every.map(|every| last_write + every);
            let wake = match (wait_rate, ping_at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if wake != armed {
                if let Some(at) = wake {
                    timer.as_mut().reset(at.into());
                }
                armed = wake;
            }

            // Not `biased`: reading (which frees window slots) and writing must
            // both progress when both are ready. This is real tokio, not madsim.
            tokio::select! {
                read = rd.read_buf(&mut self.rbuf) => {
                    match read {
                        Ok(0) => return Err(ClientError::Closed { during: "run" }),
                        Ok(_) => self.handle_input()?,
                        Err(source) => return Err(ClientError::Io { op: "read", source }),
                    }
                    self.rbuf.reserve(READ_CHUNK);
                }
                written = wr.write(&self.out), if !self.out.is_empty() => {
                    let n = written.map_err(|source| ClientError::Io { op: "write", source })?;
                    if n == 0 {
                        return Err(ClientError::Closed { during: "write" });
                    }
                    self.out.advance(n);
                    last_write = Instant::now();
                }
                () = &mut timer, if armed.is_some() => {
                    armed = None;
                    if ping_at.is_some_and(|at| at <= Instant::now()) && self.out.is_empty() {
                        put(&Packet::Pingreq, spec.protocol, self.limits.max_packet_size, &mut self.out)?;
                        // Counts as written for the next ping's schedule.
                        last_write = Instant::now();
                    }
                }
                changed = phase_rx.changed() => {
                    phase = if changed.is_ok() { *phase_rx.borrow_and_update() } else { Phase::Stop };
                    if phase >= Phase::Drain && !publishing_done {
                        publishing_done = true;
                    }
                }
            }
        }
        Ok(())
    }

    /// Encodes as many PUBLISHes as the count, the window, the rate and the
    /// output high-water mark allow. Returns when the next one is due if the
    /// rate is what stopped it.
    fn produce(&mut self, p: &PubSpec, start: Instant) -> Result<Option<Instant>, ClientError> {
        let window = u32::from(p.inflight.min(self.limits.receive_maximum));
        let now = Instant::now();
        let before = self.outcome.sent;
        let properties = Properties::default();
        let mut due = None;
        while self.outcome.sent < p.count
            && self.out.len() < OUT_HIGH_WATER
            && (p.qos == QoS::AtMostOnce || self.inflight < window)
        {
            if let Some(rate) = p.rate {
                let at = start
                    + Duration::from_secs_f64((self.outcome.sent as f64 + p.phase_offset) / rate);
                if at > now {
                    due = Some(at);
                    break;
                }
            }
            let packet_id = (p.qos != QoS::AtMostOnce).then(|| self.take_packet_id());
            let header = PublishHeader {
                dup: false,
                qos: p.qos,
                retain: false,
                topic: &p.topic,
                packet_id,
                properties: &properties,
            };
            encode_publish_header(
                &header,
                p.payload_size,
                self.spec.protocol,
                self.limits.max_packet_size,
                &mut self.out,
            )
            .map_err(|source| ClientError::Encode {
                packet_type: PacketType::Publish,
                source,
            })?;
            Stamp {
                sent_ns: self.shared.clock.now_ns(),
                publisher: p.publisher,
                seq: self.outcome.sent,
            }
            .put(p.payload_size, &mut self.out);
            self.outcome.sent += 1;
            if packet_id.is_some() {
                self.inflight += 1;
            }
        }
        let n = self.outcome.sent - before;
        if n > 0 {
            self.shared.live.sent.fetch_add(n, Relaxed);
        }
        Ok(due)
    }

    /// Packet identifiers cycle through 1..=65535. The window is at most
    /// 65,535 and brokers acknowledge in order, so an identifier comes round
    /// again only long after its acknowledgement.
    fn take_packet_id(&mut self) -> PacketId {
        let id = NonZeroU16::new(self.next_packet_id).expect("next_packet_id skips 0");
        self.next_packet_id = self.next_packet_id.checked_add(1).unwrap_or(1);
        id
    }

    /// Decodes every whole packet in the read buffer and reacts to each.
    fn handle_input(&mut self) -> Result<(), ClientError> {
        let protocol = self.spec.protocol;
        let max = self.limits.max_packet_size;
        let received_before = self.outcome.received;
        let acked_before = self.outcome.acked;
        while let Some(packet) =
            decode(&mut self.rbuf, protocol, PACKET_SIZE_MAX).map_err(ClientError::Decode)?
        {
            match packet {
                Packet::Publish(publish) => {
                    self.outcome.received += 1;
                    match Stamp::read(&publish.payload) {
                        Some(stamp) => {
                            let now = self.shared.clock.now_ns();
                            self.latencies.push(now.saturating_sub(stamp.sent_ns));
                            self.outcome
                                .streams
                                .entry(stamp.publisher)
                                .or_default()
                                .record(stamp.seq);
                        }
                        None => self.outcome.foreign += 1,
                    }
                    // MQTT 5 §4.3.2, §4.3.3: PUBACK for QoS 1, PUBREC for QoS 2.
                    match (publish.qos, publish.packet_id) {
                        (QoS::AtLeastOnce, Some(id)) => {
                            put(
                                &Packet::Puback(PubAck::new(id)),
                                protocol,
                                max,
                                &mut self.out,
                            )?;
                        }
                        (QoS::ExactlyOnce, Some(id)) => {
                            put(
                                &Packet::Pubrec(PubAck::new(id)),
                                protocol,
                                max,
                                &mut self.out,
                            )?;
                        }
                        _ => {}
                    }
                }
                Packet::Pubrel(rel) => {
                    put(
                        &Packet::Pubcomp(PubAck::new(rel.packet_id)),
                        protocol,
                        max,
                        &mut self.out,
                    )?;
                }
                Packet::Puback(_) => {
                    self.release_slot(PacketType::Puback)?;
                    self.outcome.acked += 1;
                }
                Packet::Pubcomp(_) => {
                    self.release_slot(PacketType::Pubcomp)?;
                    self.outcome.acked += 1;
                }
                Packet::Pubrec(rec) => {
                    if rec.reason_code.is_error() {
                        // MQTT 5 §4.3.3: a failed PUBREC ends the exchange; no PUBREL.
                        self.release_slot(PacketType::Pubrec)?;
                    } else {
                        put(
                            &Packet::Pubrel(PubAck::new(rec.packet_id)),
                            protocol,
                            max,
                            &mut self.out,
                        )?;
                    }
                }
                Packet::Pingresp => {}
                Packet::Disconnect(d) => {
                    return Err(ClientError::Disconnected {
                        reason: d.reason_code,
                    })
                }
                other => {
                    return Err(ClientError::Unexpected {
                        packet_type: other.packet_type(),
                        during: "run",
                    })
                }
            }
        }
        let received = self.outcome.received - received_before;
        if received > 0 {
            let live = &self.shared.live;
            live.received.fetch_add(received, Relaxed);
            live.last_receive_ns
                .fetch_max(self.shared.clock.since_start_ns(Instant::now()), Relaxed);
            if self.latencies.len() >= LATENCY_BATCH {
                self.flush_latencies();
            }
        }
        let acked = self.outcome.acked - acked_before;
        if acked > 0 {
            self.shared.live.acked.fetch_add(acked, Relaxed);
        }
        Ok(())
    }

    /// Frees one window slot for an acknowledgement; one with nothing in
    /// flight is a broker bug worth reporting.
    fn release_slot(&mut self, packet_type: PacketType) -> Result<(), ClientError> {
        if self.inflight == 0 {
            return Err(ClientError::Unexpected {
                packet_type,
                during: "run (nothing in flight)",
            });
        }
        self.inflight -= 1;
        Ok(())
    }

    fn flush_latencies(&mut self) {
        if !self.latencies.is_empty() {
            let batch = std::mem::take(&mut self.latencies);
            // The collector lives until every client has ended; if it is
            // gone the run is being torn down and samples no longer matter.
            let _ = self.shared.latency.send(batch);
        }
    }
}

/// Encodes our own packet; a failure is a bug or an absurd broker limit.
fn put(
    packet: &Packet,
    protocol: Protocol,
    max: u32,
    out: &mut BytesMut,
) -> Result<(), ClientError> {
    encode(packet, protocol, max, out)
        .map(|_| ())
        .map_err(|source| ClientError::Encode {
            packet_type: packet.packet_type(),
            source,
        })
}

async fn flush<W: AsyncWrite + Unpin>(wr: &mut W, out: &mut BytesMut) -> Result<(), ClientError> {
    wr.write_all(out).await.map_err(|source| ClientError::Io {
        op: "write",
        source,
    })?;
    out.clear();
    Ok(())
}

/// Reads until one whole packet is decoded (handshake only; the main loop
/// decodes in batches).
async fn read_packet<R: AsyncRead + Unpin>(
    rd: &mut R,
    rbuf: &mut BytesMut,
    protocol: Protocol,
    during: &'static str,
) -> Result<Packet, ClientError> {
    loop {
        if let Some(packet) =
            decode(rbuf, protocol, PACKET_SIZE_MAX).map_err(ClientError::Decode)?
        {
            return Ok(packet);
        }
        rbuf.reserve(READ_CHUNK);
        match rd.read_buf(rbuf).await {
            Ok(0) => return Err(ClientError::Closed { during }),
            Ok(_) => {}
            Err(source) => return Err(ClientError::Io { op: "read", source }),
        }
    }
}
