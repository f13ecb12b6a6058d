//! A lean MQTT client for load: one task per connection that connects,
//! optionally subscribes, publishes at a pace within an in-flight window,
//! acknowledges what it receives, and stamps and checks every payload.
//!
//! The MQTT protocol state (handshake, window, acknowledgements, keep-alive)
//! is a [`starling_client::ClientCore`]; this module is its tokio shell and
//! the load: pacing, stamping, counting. Reads and writes share one task and
//! one `select!`: PUBLISHes are encoded straight into the output buffer with
//! their stamp written in place, the core's acknowledgements join them, and
//! every write sends all that accumulated since the last one, so under load
//! one syscall carries many packets.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU16;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use starling_client::{ClientCore, ClientOptions, Event};
use starling_codec::{
    decode, Connect, Disconnect, Packet, PacketType, Properties, Protocol, PubAck, Publish, QoS,
    SubscribeFilter, SubscriptionOptions, PACKET_SIZE_MAX,
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

/// The session expiry of a persistent subscriber: long enough for a run, short enough that
/// a broker forgets it soon after.
const PERSISTENT_EXPIRY_SECS: u32 = 300;

/// A subscription.
#[derive(Debug, Clone)]
pub struct SubSpec {
    /// The topic filter.
    pub filter: String,
    /// Maximum QoS.
    pub qos: QoS,
    /// A persistent session (see `--persistent`).
    pub persistent: bool,
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
    let persistent = spec.subscribe.as_ref().is_some_and(|s| s.persistent);
    let mut properties = Properties::default();
    if persistent && spec.protocol == Protocol::V5 {
        properties.session_expiry_interval = Some(PERSISTENT_EXPIRY_SECS);
    }
    let mut options = ClientOptions::new(Connect {
        protocol: spec.protocol,
        clean_start: !persistent,
        keep_alive: spec.keep_alive_secs,
        client_id: spec.client_id.clone(),
        will: None,
        username: None,
        password: None,
        properties,
    });
    if let Some(p) = &spec.publish {
        // The broker's Receive Maximum lowers it further (MQTT 5 §3.2.2.3.3).
        options.inflight_max = NonZeroU16::new(p.inflight).unwrap_or(NonZeroU16::MIN);
    }
    let mut core = ClientCore::new(options);

    let setup = async {
        let sent_at = Instant::now();
        core.connect(sent_at)?;
        flush(&mut wr, &mut core, &mut out).await?;
        let connack = match next_event(&mut rd, &mut rbuf, &mut core, "connect").await? {
            Event::Connected(c) => c,
            other => return Err(unexpected(&other, "connect")),
        };
        outcome.connack_latency = Some(sent_at.elapsed());
        if connack.reason_code.is_error() {
            return Err(ClientError::Refused {
                reason: connack.reason_code,
            });
        }
        shared.live.connected.fetch_add(1, Relaxed);
        if let Some(sub) = &spec.subscribe {
            subscribe(sub, &mut rd, &mut wr, &mut rbuf, &mut core, &mut out).await?;
        }
        Ok(())
    };
    tokio::time::timeout(spec.connect_timeout, setup)
        .await
        .map_err(|_| ClientError::Timeout {
            what: "CONNACK/SUBACK",
        })??;
    outcome.ready = true;
    outcome.ready_at = Some(Instant::now());
    shared.live.ready.fetch_add(1, Relaxed);

    let mut conn = Conn {
        spec,
        shared,
        core,
        rbuf,
        out,
        outcome,
        latencies: Vec::new(),
    };
    // What came with the SUBACK (retained messages) is already decoded.
    let result = match conn.handle_events() {
        Ok(()) => conn.drive(phase, &mut rd, &mut wr).await,
        Err(e) => Err(e),
    };
    conn.flush_latencies();
    result?;
    // MQTT 5 §3.14: a normal DISCONNECT, so the broker drops no will and logs no error.
    let closing = async {
        conn.core
            .disconnect(Instant::now(), Disconnect::default())?;
        flush(&mut wr, &mut conn.core, &mut conn.out).await?;
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
    rd: &mut R,
    wr: &mut W,
    rbuf: &mut BytesMut,
    core: &mut ClientCore,
    out: &mut BytesMut,
) -> Result<(), ClientError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let filter = SubscribeFilter {
        filter: sub.filter.clone(),
        options: SubscriptionOptions {
            qos: sub.qos,
            ..SubscriptionOptions::default()
        },
    };
    core.subscribe(Instant::now(), vec![filter], Properties::default())?;
    flush(wr, core, out).await?;
    match next_event(rd, rbuf, core, "subscribe").await? {
        Event::Subscribed(s) => match s.reason_codes.first() {
            Some(code) if !code.is_error() => Ok(()),
            code => Err(ClientError::SubscribeRefused {
                filter: sub.filter.clone(),
                reason: code
                    .copied()
                    .unwrap_or(starling_codec::ReasonCode::UnspecifiedError),
            }),
        },
        other => Err(unexpected(&other, "subscribe")),
    }
}

/// A connected client's state during the main loop: the protocol state is
/// the core's, the load and its measurements are ours.
struct Conn<'a> {
    spec: &'a ClientSpec,
    shared: &'a Shared,
    core: ClientCore,
    rbuf: BytesMut,
    out: BytesMut,
    outcome: &'a mut ClientOutcome,
    latencies: Vec<u64>,
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
            // Acknowledgements the core queued go out with the next write.
            self.core.poll_transmit(&mut self.out);

            // One timer serves the rate schedule and the core's keep-alive.
            let ping_at = self.core.poll_timeout();
            let wake = match (wait_rate, ping_at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            // Re-armed only to wake earlier: the keep-alive deadline moves with every
            // packet queued, and resetting a tokio timer per packet costs more than
            // waking once early to find nothing due.
            if let Some(at) = wake.filter(|at| armed.is_none_or(|armed| *at < armed)) {
                timer.as_mut().reset(at.into());
                armed = Some(at);
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
                }
                () = &mut timer, if armed.is_some() => {
                    armed = None;
                    self.core.handle_timeout(Instant::now())?;
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
    /// output high-water mark allow, each stamped in place in the output.
    /// Returns when the next one is due if the rate is what stopped it.
    fn produce(&mut self, p: &PubSpec, start: Instant) -> Result<Option<Instant>, ClientError> {
        let now = Instant::now();
        let before = self.outcome.sent;
        let properties = Properties::default();
        let mut due = None;
        while self.outcome.sent < p.count
            && self.out.len() < OUT_HIGH_WATER
            && (p.qos == QoS::AtMostOnce || self.core.can_publish())
        {
            if let Some(rate) = p.rate {
                let at = start
                    + Duration::from_secs_f64((self.outcome.sent as f64 + p.phase_offset) / rate);
                if at > now {
                    due = Some(at);
                    break;
                }
            }
            let stamp = Stamp {
                sent_ns: self.shared.clock.now_ns(),
                publisher: p.publisher,
                seq: self.outcome.sent,
            };
            self.core.publish_with(
                now,
                &p.topic,
                p.qos,
                false,
                &properties,
                p.payload_size,
                &mut self.out,
                |out| stamp.put(p.payload_size, out),
            )?;
            self.outcome.sent += 1;
        }
        let n = self.outcome.sent - before;
        if n > 0 {
            self.shared.live.sent.fetch_add(n, Relaxed);
        }
        Ok(due)
    }

    /// Decodes every whole packet in the read buffer. PUBLISHes are checked
    /// here and acknowledged by the core ([`ClientCore::acknowledge_publish`]),
    /// acknowledgements of ours go to [`ClientCore::handle_ack`], the rest to
    /// [`ClientCore::handle_packet`]. Decoding stays here, and the hot
    /// packets skip the core's event queue, because a `Packet` and an `Event`
    /// are 400 bytes each: moving every message through them cost a third
    /// more CPU per message received or acknowledged.
    fn handle_input(&mut self) -> Result<(), ClientError> {
        let now = Instant::now();
        let received_before = self.outcome.received;
        let acked_before = self.outcome.acked;
        let protocol = self.core.protocol();
        while let Some(packet) =
            decode(&mut self.rbuf, protocol, PACKET_SIZE_MAX).map_err(ClientError::Decode)?
        {
            match packet {
                Packet::Publish(publish) => {
                    if self.core.acknowledge_publish(now, &publish)? {
                        self.record(&publish);
                    }
                }
                Packet::Puback(ack) => self.ack(now, PacketType::Puback, &ack)?,
                Packet::Pubrec(ack) => self.ack(now, PacketType::Pubrec, &ack)?,
                Packet::Pubcomp(ack) => self.ack(now, PacketType::Pubcomp, &ack)?,
                other => self.core.handle_packet(now, other)?,
            }
        }
        self.count_received(received_before);
        self.count_acked(acked_before);
        self.handle_events()
    }

    fn ack(
        &mut self,
        now: Instant,
        packet_type: PacketType,
        ack: &PubAck,
    ) -> Result<(), ClientError> {
        // Some: the exchange ended (PUBACK, PUBCOMP or a failing PUBREC).
        if self.core.handle_ack(now, packet_type, ack)?.is_some() {
            self.outcome.acked += 1;
        }
        Ok(())
    }

    /// Takes the core's events: acknowledgements of our PUBLISHes, and
    /// messages it decoded itself (those that came with the SUBACK).
    fn handle_events(&mut self) -> Result<(), ClientError> {
        let received_before = self.outcome.received;
        let acked_before = self.outcome.acked;
        while let Some(event) = self.core.poll_event() {
            match event {
                Event::Message(publish) => self.record(&publish),
                // The exchange ended (PUBACK, PUBCOMP or a failing PUBREC),
                // so the drain phase stops waiting for it.
                Event::Published { .. } => self.outcome.acked += 1,
                Event::Pong => {}
                Event::Disconnected(d) => {
                    return Err(ClientError::Disconnected {
                        reason: d.reason_code,
                    })
                }
                other => return Err(unexpected(&other, "run")),
            }
        }
        self.count_received(received_before);
        self.count_acked(acked_before);
        Ok(())
    }

    fn count_acked(&mut self, before: u64) {
        let acked = self.outcome.acked - before;
        if acked > 0 {
            self.shared.live.acked.fetch_add(acked, Relaxed);
        }
    }

    /// Checks one delivery's stamp.
    fn record(&mut self, publish: &Publish) {
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
    }

    fn count_received(&mut self, before: u64) {
        let received = self.outcome.received - before;
        if received > 0 {
            let live = &self.shared.live;
            live.received.fetch_add(received, Relaxed);
            live.last_receive_ns
                .fetch_max(self.shared.clock.since_start_ns(Instant::now()), Relaxed);
            if self.latencies.len() >= LATENCY_BATCH {
                self.flush_latencies();
            }
        }
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

/// An event with no place at this point of the exchange.
fn unexpected(event: &Event, during: &'static str) -> ClientError {
    let packet_type = match event {
        Event::Published { .. } | Event::Abandoned(_) => PacketType::Puback,
        other => other
            .clone()
            .into_packet()
            .map_or(PacketType::Puback, |p| p.packet_type()),
    };
    ClientError::Unexpected {
        packet_type,
        during,
    }
}

/// Writes everything the core queued (through `out`, the connection's
/// output buffer) during the handshake.
async fn flush<W: AsyncWrite + Unpin>(
    wr: &mut W,
    core: &mut ClientCore,
    out: &mut BytesMut,
) -> Result<(), ClientError> {
    core.poll_transmit(out);
    wr.write_all(out).await.map_err(|source| ClientError::Io {
        op: "write",
        source,
    })?;
    out.clear();
    Ok(())
}

/// Reads until the core has an event (handshake only; the main loop reads
/// in batches).
async fn next_event<R: AsyncRead + Unpin>(
    rd: &mut R,
    rbuf: &mut BytesMut,
    core: &mut ClientCore,
    during: &'static str,
) -> Result<Event, ClientError> {
    loop {
        core.handle_buf(Instant::now(), rbuf)?;
        if let Some(event) = core.poll_event() {
            return Ok(event);
        }
        rbuf.reserve(READ_CHUNK);
        match rd.read_buf(rbuf).await {
            Ok(0) => return Err(ClientError::Closed { during }),
            Ok(_) => {}
            Err(source) => return Err(ClientError::Io { op: "read", source }),
        }
    }
}
