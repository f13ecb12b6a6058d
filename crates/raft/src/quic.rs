//! Raft over QUIC with mutual TLS: [`QuicNet`] binds a node's endpoint, [`QuicTransport`]
//! (the driver's [`Transport`]) queues outgoing messages per peer, and [`QuicNet::serve`]
//! delivers incoming ones to the driver.
//!
//! - **Identity.** Every node holds a certificate from the cluster CA whose common name is
//!   [`node_name`]`(id)` (`node-<id>`), also its DNS subject name. A dialer checks the
//!   server's name through TLS; an acceptor reads the client certificate's common name, and
//!   a frame whose `from` is not that node is dropped. Only authenticated peers' bytes reach
//!   raft-rs's protobuf decoder (protobuf 2.28, CVE-2025-53605).
//! - **Connections.** Each node dials one connection to each peer and sends on it; it
//!   receives on the connections its peers dialed. A dial that fails or a connection that
//!   ends is retried with exponential backoff and jitter (`reconnect_min` to
//!   `reconnect_max`).
//! - **Streams.** Raft messages travel on a stream of their own; snapshots (`MsgSnapshot`,
//!   up to megabytes) on a second one, so a heartbeat never queues behind bulk data; the
//!   application's own frames ([`DataLinks`], the cluster's forwarded publishes) on a
//!   third. A stream opens with one byte naming its kind.
//! - **Frames.** `[u32 big-endian length][protobuf eraftpb::Message]`, at most
//!   `frame_bytes_max`. A larger outgoing message is dropped and counted; a larger incoming
//!   length ends the connection (the peer is broken).
//! - **Queues.** [`Transport::send`] never waits: each peer has a bounded queue per stream
//!   (`queue_max` messages); when it is full the message is dropped and counted. raft
//!   retransmits whatever is lost.
//! - **Peers.** The peers to dial start as [`QuicNet::transport`]'s list and change while
//!   the node runs through [`PeerControl`] (a member joins or leaves the cluster). Any node
//!   whose certificate the cluster CA signed may connect in, listed or not, and one not
//!   listed is dialed back at the address it connected from (each endpoint dials from the
//!   socket it accepts on): a node being added hears from the leader before it has learnt
//!   anyone's address, and must answer it. A peer removed is not learnt again that way.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use raft::eraftpb::{Message, MessageType};
use rand::Rng as _;
use starling_net::{
    CertificateDer, ClientTls, Identity, NetError, QuicConfig, QuicConnection, QuicEndpoint,
    QuicRecv, QuicSend, ServerTls, ALPN_RAFT,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::driver::RaftHandle;
use crate::transport::{decode_message, encode_message, Transport};

/// The certificate common name (and DNS subject name) of raft node `id`.
pub fn node_name(id: u64) -> String {
    format!("node-{id}")
}

/// The raft id in a certificate common name made by [`node_name`].
pub fn parse_node_name(cn: &str) -> Option<u64> {
    cn.strip_prefix("node-")?.parse().ok().filter(|id| *id != 0)
}

/// A node's TLS material: its certificate and key, and the cluster CA it trusts.
#[derive(Clone, Debug)]
pub struct NodeTls {
    pub identity: Identity,
    pub ca: CertificateDer<'static>,
}

/// Settings of the QUIC transport of one node.
#[derive(Clone, Debug)]
pub struct QuicOptions {
    /// This node's raft id (its certificate must be named [`node_name`]`(id)`).
    pub id: u64,
    /// The UDP address to bind.
    pub bind: SocketAddr,
    /// Messages waiting per peer and stream; beyond it they are dropped. Default 1024: about
    /// four `max_inflight_msgs` windows of appends plus heartbeats.
    pub queue_max: usize,
    /// Largest frame in bytes, either way. Default 16 MiB: a snapshot of the state machine
    /// travels as one message, so this caps the snapshot size too.
    pub frame_bytes_max: usize,
    /// First retry delay after a failed dial or a lost connection. Default 50 ms.
    pub reconnect_min: Duration,
    /// Retry delays double up to this. Default 2 s.
    pub reconnect_max: Duration,
    /// A dial that has not completed its handshake by then is abandoned. Default 2 s.
    pub connect_timeout: Duration,
    /// QUIC knobs. The defaults here use a 3 s idle timeout and a 500 ms keep-alive: a dead
    /// or restarted peer is noticed (and redialed) within a few election timeouts.
    pub quic: QuicConfig,
}

impl QuicOptions {
    /// Defaults for node `id` bound on `bind`; the QUIC rng seed is drawn from the runtime
    /// (deterministic under the simulator).
    pub fn new(id: u64, bind: SocketAddr) -> Self {
        let mut seed = [0u8; 32];
        starling_rt::rng::rng().fill(&mut seed);
        let mut quic = QuicConfig::new(seed);
        quic.idle_timeout = Duration::from_secs(3);
        quic.keep_alive_interval = Some(Duration::from_millis(500));
        quic.concurrent_streams_max = 8;
        QuicOptions {
            id,
            bind,
            queue_max: 1024,
            frame_bytes_max: 16 << 20,
            reconnect_min: Duration::from_millis(50),
            reconnect_max: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            quic,
        }
    }
}

/// Counters of the QUIC transport, for metrics and tests.
#[derive(Debug, Default)]
pub struct QuicMetrics {
    /// Messages dropped because a peer's queue was full.
    pub dropped_queue_full: AtomicU64,
    /// Outgoing messages dropped for exceeding `frame_bytes_max`.
    pub dropped_oversize: AtomicU64,
    /// Messages to an id that is not a configured peer.
    pub dropped_unknown_peer: AtomicU64,
    /// Connections established by dialing.
    pub connects: AtomicU64,
    /// Failed dials and lost outbound connections.
    pub disconnects: AtomicU64,
    /// Inbound connections refused (unknown certificate name) and frames refused (wrong
    /// sender, bad length, undecodable).
    pub refused: AtomicU64,
    /// Messages received and handed to the driver.
    pub delivered: AtomicU64,
    /// Data frames sent, and received and handed to the application.
    pub data_sent: AtomicU64,
    pub data_received: AtomicU64,
    /// Data frames dropped because their link went down before they were written.
    pub data_dropped_link_down: AtomicU64,
}

/// The kind byte a stream opens with.
const STREAM_RAFT: u8 = 0;
const STREAM_BULK: u8 = 1;
const STREAM_DATA: u8 = 2;

/// Why [`DataLinks::try_send`] did not queue a frame.
#[derive(Debug, PartialEq, Eq)]
pub enum DataSendError {
    /// The peer's data queue is full (it is slow, or its link is down); try later.
    Full(Vec<u8>),
    /// Not a configured peer, or the node is stopping.
    Closed,
}

/// The application's frames to peers, on a stream of their own beside raft's, in order per
/// peer. Cheap to clone. Frames queued while a peer's link is down are dropped when the
/// link is redialed (counted in `data_dropped_link_down`): what needs more than that must
/// be acknowledged by the application.
#[derive(Clone, Default)]
pub struct DataLinks {
    peers: PeerTable,
    metrics: Arc<QuicMetrics>,
}

impl DataLinks {
    /// Queues `frame` (at most `frame_bytes_max`) for `peer` without waiting.
    ///
    /// # Errors
    /// [`DataSendError::Full`] with the frame when the peer's queue is full;
    /// [`DataSendError::Closed`] for an unknown peer or a stopped node.
    pub fn try_send(&self, peer: u64, frame: Vec<u8>) -> Result<(), DataSendError> {
        let peers = read(&self.peers);
        let Some(q) = peers.queues.get(&peer) else {
            return Err(DataSendError::Closed);
        };
        match q.data_tx.try_send(frame) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(f)) => Err(DataSendError::Full(f)),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(DataSendError::Closed),
        }
    }

    /// The peers frames can go to now.
    pub fn peers(&self) -> Vec<u64> {
        read(&self.peers).queues.keys().copied().collect()
    }

    pub fn metrics(&self) -> &QuicMetrics {
        &self.metrics
    }
}

/// A bound QUIC endpoint of one raft node.
///
/// Call order: [`QuicNet::bind`], [`QuicNet::transport`] with the peers' addresses, start
/// the driver with that transport, then [`QuicNet::serve`] with the driver's handle.
pub struct QuicNet {
    opts: QuicOptions,
    endpoint: QuicEndpoint,
    metrics: Arc<QuicMetrics>,
    /// Every peer's queues, filled by [`QuicNet::transport`], changed by [`PeerControl`].
    peers: PeerTable,
}

impl QuicNet {
    /// Binds the endpoint (accepting and dialing, mutual TLS with the cluster CA).
    ///
    /// # Errors
    /// [`NetError`] if the TLS material or the QUIC knobs are invalid or the socket cannot
    /// be bound.
    pub async fn bind(opts: QuicOptions, tls: &NodeTls) -> Result<QuicNet, NetError> {
        let server = ServerTls::new(tls.identity.clone())
            .require_client_cert(vec![tls.ca.clone()])
            .alpn(&[ALPN_RAFT]);
        let client = ClientTls::new(vec![tls.ca.clone()])
            .identity(tls.identity.clone())
            .alpn(&[ALPN_RAFT]);
        let endpoint =
            QuicEndpoint::new(opts.bind, Some(&server), Some(&client), &opts.quic).await?;
        Ok(QuicNet {
            opts,
            endpoint,
            metrics: Arc::default(),
            peers: PeerTable::default(),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.endpoint.local_addr()
    }

    pub fn metrics(&self) -> Arc<QuicMetrics> {
        self.metrics.clone()
    }

    /// The sending half for the driver, towards `peers` (id and address of each member;
    /// this node's own entry is skipped, messages to ids not listed are dropped). One link
    /// task per peer starts now, dialing in the background. [`QuicNet::peer_control`]
    /// changes the list later.
    pub fn transport(&mut self, peers: BTreeMap<u64, SocketAddr>) -> QuicTransport {
        let control = self.peer_control();
        for (id, addr) in peers {
            control.set(id, addr);
        }
        QuicTransport {
            peers: self.peers.clone(),
            metrics: self.metrics.clone(),
        }
    }

    /// Adds, moves and removes peers while the node runs.
    pub fn peer_control(&self) -> PeerControl {
        PeerControl {
            me: self.opts.id,
            peers: self.peers.clone(),
            endpoint: self.endpoint.clone(),
            opts: self.opts.clone(),
            metrics: self.metrics.clone(),
        }
    }

    /// The sending half of the data streams (towards the peers of the moment).
    pub fn data(&self) -> DataLinks {
        DataLinks {
            peers: self.peers.clone(),
            metrics: self.metrics.clone(),
        }
    }

    /// Accepts peers' connections and delivers their messages to `raft`, in a background
    /// task, until [`QuicNet::close`]. Data streams are left unread.
    pub fn serve(&self, raft: RaftHandle) {
        self.serve_with_data(raft, None);
    }

    /// As [`QuicNet::serve`], handing each data frame with its sender's id to `data`. A
    /// full channel stops that stream being read, so QUIC flow control holds the sender
    /// back.
    pub fn serve_with_data(&self, raft: RaftHandle, data: Option<mpsc::Sender<(u64, Vec<u8>)>>) {
        let endpoint = self.endpoint.clone();
        let ctx = Arc::new(Inbound {
            me: self.opts.id,
            peers: self.peer_control(),
            frame_bytes_max: self.opts.frame_bytes_max,
            metrics: self.metrics.clone(),
            raft,
            data,
        });
        starling_rt::spawn(async move {
            while let Some(incoming) = endpoint.accept().await {
                let ctx = ctx.clone();
                // A handshake per task: one slow peer does not hold up the others.
                starling_rt::spawn(async move {
                    if let Ok(conn) = incoming.handshake().await {
                        ctx.connection(conn).await;
                    }
                });
            }
        });
    }

    /// Closes every connection and stops accepting.
    pub fn close(&self) {
        self.endpoint.close();
    }
}

/// One peer's address and the queues of its link task (which ends once they are dropped).
struct PeerQueues {
    addr: SocketAddr,
    raft_tx: mpsc::Sender<Message>,
    bulk_tx: mpsc::Sender<Message>,
    data_tx: mpsc::Sender<Vec<u8>>,
}

/// The peers of the moment. It is the transport's own routing table, read by whoever
/// sends (the driver's turn, the data links' holders) and written only on a membership
/// change; no actor's state lives in it, only the queues of the link tasks. A lock held
/// for one map lookup is cheaper than telling every holder of a [`DataLinks`] of each
/// change, and a sender never waits on it for longer than that.
type PeerTable = Arc<RwLock<Peers>>;

#[derive(Default)]
struct Peers {
    queues: BTreeMap<u64, PeerQueues>,
    /// Removed by [`PeerControl::remove`]: not learnt again from an inbound connection.
    removed: std::collections::BTreeSet<u64>,
}

fn read(t: &PeerTable) -> std::sync::RwLockReadGuard<'_, Peers> {
    // A panic while holding the lock leaves a map that is still whole (inserts and removes
    // only): read it anyway.
    t.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write(t: &PeerTable) -> std::sync::RwLockWriteGuard<'_, Peers> {
    t.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Changes the peers of a running [`QuicNet`]: cheap to clone.
#[derive(Clone)]
pub struct PeerControl {
    me: u64,
    peers: PeerTable,
    endpoint: QuicEndpoint,
    opts: QuicOptions,
    metrics: Arc<QuicMetrics>,
}

impl PeerControl {
    /// Dials `id` at `addr` from now on: a new peer gets a link task; a known one at
    /// another address gets a new link there (what was queued for the old one is
    /// dropped). This node's own id is ignored. Returns whether anything changed.
    pub fn set(&self, id: u64, addr: SocketAddr) -> bool {
        self.insert(id, addr, false)
    }

    /// Dials `id` at `addr` unless it is dialed already or was removed: a node that
    /// connected in from there without being listed.
    fn learn(&self, id: u64, addr: SocketAddr) -> bool {
        self.insert(id, addr, true)
    }

    fn insert(&self, id: u64, addr: SocketAddr, learnt: bool) -> bool {
        let unchanged = |p: &Peers| {
            (learnt && (p.queues.contains_key(&id) || p.removed.contains(&id)))
                || p.queues.get(&id).is_some_and(|q| q.addr == addr)
        };
        // Asked again on every status tick: a read lock answers the common case.
        if id == self.me || unchanged(&read(&self.peers)) {
            return false;
        }
        let mut peers = write(&self.peers);
        if unchanged(&peers) {
            return false;
        }
        peers.removed.remove(&id);
        let (raft_tx, raft_rx) = mpsc::channel(self.opts.queue_max);
        let (bulk_tx, bulk_rx) = mpsc::channel(self.opts.queue_max);
        let (data_tx, data_rx) = mpsc::channel(self.opts.queue_max);
        let link = Link {
            peer: id,
            addr,
            endpoint: self.endpoint.clone(),
            opts: self.opts.clone(),
            metrics: self.metrics.clone(),
        };
        starling_rt::spawn(link.run(raft_rx, bulk_rx, data_rx));
        // Replacing drops the old queues: the old link task ends.
        peers.queues.insert(
            id,
            PeerQueues {
                addr,
                raft_tx,
                bulk_tx,
                data_tx,
            },
        );
        true
    }

    /// Stops dialing `id` (its link task ends). Returns whether it was a peer.
    pub fn remove(&self, id: u64) -> bool {
        let mut peers = write(&self.peers);
        peers.removed.insert(id);
        peers.queues.remove(&id).is_some()
    }

    /// The peers and their addresses now.
    pub fn list(&self) -> BTreeMap<u64, SocketAddr> {
        read(&self.peers)
            .queues
            .iter()
            .map(|(id, q)| (*id, q.addr))
            .collect()
    }
}

/// The driver's sending half: never waits, drops when a peer's queue is full.
pub struct QuicTransport {
    peers: PeerTable,
    metrics: Arc<QuicMetrics>,
}

impl QuicTransport {
    pub fn metrics(&self) -> Arc<QuicMetrics> {
        self.metrics.clone()
    }
}

impl Transport for QuicTransport {
    fn send(&mut self, msg: Message) {
        let peers = read(&self.peers);
        let Some(q) = peers.queues.get(&msg.to) else {
            self.metrics
                .dropped_unknown_peer
                .fetch_add(1, Ordering::Relaxed);
            return;
        };
        // Encoding (and the frame size check) happens in the link task, off the driver's turn.
        let tx = if msg.get_msg_type() == MessageType::MsgSnapshot {
            &q.bulk_tx
        } else {
            &q.raft_tx
        };
        if tx.try_send(msg).is_err() {
            self.metrics
                .dropped_queue_full
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The outbound side of one peer: dial, open the two streams, write frames; on any error
/// back off and dial again.
struct Link {
    peer: u64,
    addr: SocketAddr,
    endpoint: QuicEndpoint,
    opts: QuicOptions,
    metrics: Arc<QuicMetrics>,
}

impl Link {
    async fn run(
        self,
        mut raft_rx: mpsc::Receiver<Message>,
        mut bulk_rx: mpsc::Receiver<Message>,
        mut data_rx: mpsc::Receiver<Vec<u8>>,
    ) {
        let mut rng = starling_rt::rng::rng();
        let mut backoff = self.opts.reconnect_min;
        let name = node_name(self.peer);
        loop {
            let dial = self.endpoint.connect(self.addr, &name);
            // A failed or timed-out dial falls through to the backoff.
            if let Some(Ok(conn)) =
                starling_rt::time::timeout(self.opts.connect_timeout, dial).await
            {
                self.metrics.connects.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(node_id = self.opts.id, peer = self.peer, "raft link up");
                let up_at = starling_rt::time::now();
                let r = self
                    .pump(&conn, &mut raft_rx, &mut bulk_rx, &mut data_rx)
                    .await;
                conn.close(0, b"link reset");
                // Start over from the shortest delay only after a link that held: a peer
                // that accepts and then drops us at once is retried ever more slowly.
                if up_at.elapsed() >= self.opts.reconnect_max {
                    backoff = self.opts.reconnect_min;
                }
                if r.is_none() {
                    // The driver dropped the transport: the node is stopping.
                    return;
                }
            }
            self.metrics.disconnects.fetch_add(1, Ordering::Relaxed);
            // Messages queued while the link was down are stale; raft resends what matters.
            while raft_rx.try_recv().is_ok() {}
            while bulk_rx.try_recv().is_ok() {}
            while data_rx.try_recv().is_ok() {
                self.metrics
                    .data_dropped_link_down
                    .fetch_add(1, Ordering::Relaxed);
            }
            if matches!(
                raft_rx.try_recv(),
                Err(mpsc::error::TryRecvError::Disconnected)
            ) {
                // No longer a peer (`PeerControl::remove`), or the node is stopping.
                return;
            }
            // Full jitter in [backoff/2, backoff): peers restarting together do not dial in
            // lockstep.
            let half = backoff / 2;
            let wait = half + half.mul_f64(rng.gen_range(0.0..1.0));
            starling_rt::time::sleep(wait).await;
            backoff = (backoff * 2).min(self.opts.reconnect_max);
        }
    }

    /// Writes the queues to their streams until the connection fails (`Some(())`) or the
    /// queues close (`None`).
    async fn pump(
        &self,
        conn: &QuicConnection,
        raft_rx: &mut mpsc::Receiver<Message>,
        bulk_rx: &mut mpsc::Receiver<Message>,
        data_rx: &mut mpsc::Receiver<Vec<u8>>,
    ) -> Option<()> {
        let mut streams = Vec::with_capacity(3);
        for kind in [STREAM_RAFT, STREAM_BULK, STREAM_DATA] {
            let Ok((mut send, _)) = conn.open_bi().await else {
                return Some(());
            };
            if send.write_all(&[kind]).await.is_err() {
                return Some(());
            }
            streams.push(send);
        }
        let data_send = streams.pop().expect("three streams");
        let bulk_send = streams.pop().expect("three streams");
        let raft_send = streams.pop().expect("three streams");
        let max = self.opts.frame_bytes_max;
        let metrics = &self.metrics;
        // Independent loops in one task: a snapshot or a data burst blocked on flow control
        // never holds up the raft stream.
        tokio::select! {
            biased;
            r = write_loop(raft_send, raft_rx, max, 64 << 10, metrics, |m| encode_message(&m), None) => r,
            r = write_loop(bulk_send, bulk_rx, max, 64 << 10, metrics, |m| encode_message(&m), None) => r,
            r = write_loop(data_send, data_rx, max, 256 << 10, metrics, |f| f, Some(&metrics.data_sent)) => r,
            _ = conn.closed() => Some(()),
        }
    }
}

/// Frames what `rx` yields onto `send`, batching what is already queued (up to
/// `batch_bytes`) into one write; `encode` gives each item's frame body, and one larger
/// than `max` is dropped and counted. `sent` counts the frames written. `Some(())` on a
/// write error, `None` when `rx` is closed.
async fn write_loop<T>(
    mut send: QuicSend,
    rx: &mut mpsc::Receiver<T>,
    max: usize,
    batch_bytes: usize,
    metrics: &QuicMetrics,
    encode: impl Fn(T) -> Vec<u8>,
    sent: Option<&AtomicU64>,
) -> Option<()> {
    let mut buf = Vec::new();
    loop {
        let first = rx.recv().await?;
        buf.clear();
        let mut next = Some(first);
        let mut n = 0;
        while let Some(item) = next {
            let body = encode(item);
            if body.len() > max {
                metrics.dropped_oversize.fetch_add(1, Ordering::Relaxed);
            } else {
                buf.extend_from_slice(&(body.len() as u32).to_be_bytes());
                buf.extend_from_slice(&body);
                n += 1;
            }
            next = if buf.len() < batch_bytes {
                rx.try_recv().ok()
            } else {
                None
            };
        }
        if send.write_all(&buf).await.is_err() {
            return Some(());
        }
        if let Some(c) = sent {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// Reads one `[u32 length][body]` frame into `body`: `Ok(false)` when the stream ended,
/// `Err` for a length over `max` (the peer is broken).
async fn read_frame(recv: &mut QuicRecv, max: usize, body: &mut Vec<u8>) -> Result<bool, ()> {
    let mut len = [0u8; 4];
    if recv.read_exact(&mut len).await.is_err() {
        return Ok(false);
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > max {
        return Err(());
    }
    body.resize(len, 0);
    Ok(recv.read_exact(body).await.is_ok())
}

/// What an accepted connection needs to deliver messages.
struct Inbound {
    me: u64,
    peers: PeerControl,
    frame_bytes_max: usize,
    metrics: Arc<QuicMetrics>,
    raft: RaftHandle,
    data: Option<mpsc::Sender<(u64, Vec<u8>)>>,
}

impl Inbound {
    async fn connection(self: Arc<Self>, conn: QuicConnection) {
        let from = conn
            .peer_certificates()
            .and_then(|c| c.first().and_then(starling_net::common_name))
            .and_then(|cn| parse_node_name(&cn));
        // Any node the cluster CA signed for: a node being added hears from the leader
        // before it knows the leader's address (docs/clustering.md, "Membership").
        let Some(from) = from.filter(|id| *id != self.me) else {
            // No node name, or ours.
            self.metrics.refused.fetch_add(1, Ordering::Relaxed);
            conn.close(1, b"unknown node");
            return;
        };
        if self.peers.learn(from, conn.remote_address()) {
            tracing::debug!(node_id = self.me, peer = from, addr = %conn.remote_address(), "peer learnt from its connection");
        }
        while let Ok((_send, recv)) = conn.accept_bi().await {
            let ctx = self.clone();
            let conn = conn.clone();
            starling_rt::spawn(async move {
                if ctx.read_loop(from, recv).await.is_err() {
                    ctx.metrics.refused.fetch_add(1, Ordering::Relaxed);
                    conn.close(2, b"bad frame");
                }
            });
        }
    }

    /// Reads the stream's kind, then its frames until it ends (`Ok`) or a peer error
    /// (`Err`).
    async fn read_loop(&self, from: u64, mut recv: QuicRecv) -> Result<(), ()> {
        let mut kind = [0u8; 1];
        if recv.read_exact(&mut kind).await.is_err() {
            return Ok(());
        }
        match kind[0] {
            STREAM_RAFT | STREAM_BULK => {}
            STREAM_DATA => {
                // A node that takes no data leaves the stream unread: its peers' data
                // queues fill and refuse, while raft goes on.
                let Some(data) = &self.data else {
                    return Ok(());
                };
                return self.data_loop(from, recv, data).await;
            }
            _ => return Err(()),
        }
        let mut body = Vec::new();
        while read_frame(&mut recv, self.frame_bytes_max, &mut body).await? {
            let msg = decode_message(&body, self.frame_bytes_max).map_err(|_| ())?;
            // The certificate says who is talking; a frame claiming otherwise is refused.
            if msg.from != from || msg.to != self.me {
                return Err(());
            }
            self.metrics.delivered.fetch_add(1, Ordering::Relaxed);
            self.raft.deliver(msg);
        }
        Ok(())
    }

    async fn data_loop(
        &self,
        from: u64,
        mut recv: QuicRecv,
        data: &mpsc::Sender<(u64, Vec<u8>)>,
    ) -> Result<(), ()> {
        let mut body = Vec::new();
        while read_frame(&mut recv, self.frame_bytes_max, &mut body).await? {
            self.metrics.data_received.fetch_add(1, Ordering::Relaxed);
            // Waits while the application is behind: this stream is not read meanwhile.
            if data.send((from, std::mem::take(&mut body))).await.is_err() {
                break;
            }
        }
        Ok(())
    }
}
