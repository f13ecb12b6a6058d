//! MQTT listeners of every kind (tcp, tls, ws, wss, quic) behind one accept API that yields
//! a byte stream and what is known about the client.
//!
//! Accepting is split in two so one slow or hostile client cannot hold up the others:
//! [`MqttListener::accept`] waits for a place under the listener's handshake limit, then only
//! takes the connection off the socket; [`PendingConnection::handshake`], run in the connection's own
//! task, does everything that waits on the peer (PROXY header, TLS, WebSocket upgrade, QUIC
//! handshake and first stream) under the handshake timeout.
//!
//! ```no_run
//! # async fn run() -> Result<(), starling_net::NetError> {
//! use starling_net::{ListenerSettings, MqttListener, Transport};
//!
//! let listener = MqttListener::bind(
//!     "0.0.0.0:1883".parse().unwrap(),
//!     Transport::Tcp,
//!     ListenerSettings::default(),
//! )
//! .await?;
//! loop {
//!     let pending = listener.accept().await?;
//!     tokio::spawn(async move {
//!         // Failures are counted by the listener (and logged at debug).
//!         let Ok((stream, info)) = pending.handshake().await else { return };
//!         // serve MQTT on `stream` (AsyncRead + AsyncWrite); `info.peer` is the client.
//!         # let _ = (stream, info);
//!     });
//! }
//! # }
//! ```

use std::{
    fmt, io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    task::{Context, Poll},
    time::{Duration, SystemTime},
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    sync::{OwnedSemaphorePermit, Semaphore},
};

use crate::{
    capped::{CapRelease, Capped},
    proxy::{self, ProxyProtocol},
    tls_stream::{self, ServerTlsStream, TlsAcceptor},
    ws::{self, WsConfig, WsStream},
    NetError, QuicBiStream, QuicConfig, QuicEndpoint, QuicIncoming, ServerTls, Stream, ALPN_MQTT,
};

/// The kinds of MQTT listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ListenerKind {
    /// Plain TCP (default port 1883).
    Tcp,
    /// TLS over TCP (8883).
    Tls,
    /// WebSocket (8080, path `/mqtt`).
    Ws,
    /// WebSocket over TLS (8443).
    Wss,
    /// MQTT over QUIC (UDP 14567).
    Quic,
}

impl fmt::Display for ListenerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ListenerKind::Tcp => "tcp",
            ListenerKind::Tls => "tls",
            ListenerKind::Ws => "ws",
            ListenerKind::Wss => "wss",
            ListenerKind::Quic => "quic",
        })
    }
}

/// What a listener speaks, with the settings of its layers.
#[derive(Debug, Clone)]
pub enum Transport {
    /// Plain TCP.
    Tcp,
    /// TLS 1.2/1.3 over TCP.
    Tls(ServerTls),
    /// WebSocket over TCP.
    Ws(WsConfig),
    /// WebSocket over TLS 1.2/1.3.
    Wss(ServerTls, WsConfig),
    /// MQTT over QUIC: TLS 1.3, ALPN `mqtt` (set here whatever `ServerTls` says), the first
    /// bidirectional stream the client opens carries the session. `QuicConfig` holds the
    /// idle timeout; connection migration stays on (quinn's default).
    Quic(ServerTls, QuicConfig),
}

impl Transport {
    /// The listener kind this transport makes.
    pub fn kind(&self) -> ListenerKind {
        match self {
            Transport::Tcp => ListenerKind::Tcp,
            Transport::Tls(_) => ListenerKind::Tls,
            Transport::Ws(_) => ListenerKind::Ws,
            Transport::Wss(..) => ListenerKind::Wss,
            Transport::Quic(..) => ListenerKind::Quic,
        }
    }
}

/// Bounds on handshakes, per listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandshakeLimits {
    /// Connections allowed between accept and the end of their handshake at once; while that
    /// many run, [`MqttListener::accept`] waits and further connections wait in the kernel's
    /// accept queue (QUIC: quinn's). At least 1.
    pub handshakes_in_flight_max: usize,
    /// A handshake not finished in this time ends its connection (counted in `timed_out`).
    /// Covers the PROXY header, TLS, the WebSocket upgrade and, for QUIC, the first stream.
    pub handshake_timeout: Duration,
}

impl Default for HandshakeLimits {
    fn default() -> Self {
        Self {
            // Enough for a reconnect storm of a large fleet on one node: a TLS handshake
            // takes milliseconds of CPU, so 1024 in flight is about a second of work.
            handshakes_in_flight_max: 1024,
            // Mobile links with a few lost round trips finish well within this.
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

/// Per-listener settings common to every kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListenerSettings {
    /// Handshake bounds.
    pub limits: HandshakeLimits,
    /// Expect a PROXY protocol v1/v2 header first on every connection (tcp, tls, ws, wss).
    pub proxy_protocol: Option<ProxyProtocol>,
}

/// Counts of what happened at a listener; read with [`ListenerCounters::snapshot`].
#[derive(Debug, Default)]
pub struct ListenerCounters {
    accepted: AtomicU64,
    handshake_failed: AtomicU64,
    timed_out: AtomicU64,
    connect_timed_out: AtomicU64,
}

/// A copy of a listener's counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CounterSnapshot {
    /// Connections whose handshake completed and that were handed to the caller.
    pub accepted: u64,
    /// Handshakes that failed (bad PROXY header, TLS failure, refused WebSocket upgrade, QUIC
    /// handshake failure, peer gone).
    pub handshake_failed: u64,
    /// Handshakes that exceeded the handshake timeout.
    pub timed_out: u64,
    /// Connections whose transport handshake completed but whose first MQTT packet did not
    /// arrive in time (recorded by the caller with [`ListenerCounters::record_connect_timeout`]).
    pub connect_timed_out: u64,
}

impl ListenerCounters {
    /// The current values. Each is read on its own (relaxed): they are metrics, not a
    /// consistent cut.
    pub fn snapshot(&self) -> CounterSnapshot {
        CounterSnapshot {
            accepted: self.accepted.load(Ordering::Relaxed),
            handshake_failed: self.handshake_failed.load(Ordering::Relaxed),
            timed_out: self.timed_out.load(Ordering::Relaxed),
            connect_timed_out: self.connect_timed_out.load(Ordering::Relaxed),
        }
    }

    /// Counts a connection that timed out after its transport handshake, while the caller
    /// waited for its first packet (the MQTT CONNECT): the transport cannot see that wait.
    pub fn record_connect_timeout(&self) {
        Self::bump(&self.connect_timed_out);
    }

    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// What the listener knows about an accepted client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnInfo {
    /// The client's address: from the PROXY header or `X-Forwarded-For` when configured and
    /// present (port 0 when the header has none), else the socket's peer.
    pub peer: SocketAddr,
    /// The socket's peer: the proxy when there is one, else the client.
    pub transport_peer: SocketAddr,
    /// Our address on this connection (for QUIC, the endpoint's bound address).
    pub local: SocketAddr,
    /// The listener's kind.
    pub kind: ListenerKind,
    /// The common name of the client certificate verified in the TLS (or QUIC) handshake.
    pub tls_client_cn: Option<String>,
}

/// A connection from any kind of listener: an MQTT byte stream ([`AsyncRead`] +
/// [`AsyncWrite`]). Flush after writing (a WebSocket sends gathered bytes as one frame on
/// flush; the simulated TCP sends only on flush).
#[derive(Debug)]
pub struct AnyStream(AnyInner);

// Large layers are boxed so an `AnyStream` stays small whatever its kind.
#[derive(Debug)]
enum AnyInner {
    Tcp(Stream),
    Tls(Box<ServerTlsStream<Stream>>),
    Ws(Box<WsStream<Capped<Stream>>>),
    Wss(Box<WsStream<Capped<ServerTlsStream<Stream>>>>),
    Quic(Box<QuicBiStream>),
}

impl AnyStream {
    /// For a layer that buffers whole messages before yielding any of them (WebSocket),
    /// the handle that lifts its pre-authentication read cap
    /// ([`WsConfig::preauth_bytes_max`]): call it once the client has authenticated.
    /// `None` for the others, whose buffering the MQTT reader bounds itself.
    pub fn cap_release(&self) -> Option<CapRelease> {
        match &self.0 {
            AnyInner::Ws(ws) => Some(ws.get_ref().release_handle()),
            AnyInner::Wss(ws) => Some(ws.get_ref().release_handle()),
            AnyInner::Quic(bi) => Some(CapRelease::quic(bi.connection().quinn().clone())),
            _ => None,
        }
    }

    /// When the bytes of the last read reached this host, by the kernel's receive
    /// timestamp of the TCP connection underneath (for TLS and WebSocket, of what that
    /// layer last read from it, which may run ahead of what it has handed on). `None` over
    /// QUIC, off Linux, in the simulator, and where the kernel did not stamp.
    pub fn received_at(&self) -> Option<SystemTime> {
        match &self.0 {
            AnyInner::Tcp(s) => s.received_at(),
            AnyInner::Tls(s) => s.get_ref().0.received_at(),
            AnyInner::Ws(ws) => ws.get_ref().get_ref().received_at(),
            AnyInner::Wss(ws) => ws.get_ref().get_ref().get_ref().0.received_at(),
            AnyInner::Quic(_) => None,
        }
    }

    /// The listener kind the stream came from.
    pub fn kind(&self) -> ListenerKind {
        match &self.0 {
            AnyInner::Tcp(_) => ListenerKind::Tcp,
            AnyInner::Tls(_) => ListenerKind::Tls,
            AnyInner::Ws(_) => ListenerKind::Ws,
            AnyInner::Wss(_) => ListenerKind::Wss,
            AnyInner::Quic(_) => ListenerKind::Quic,
        }
    }
}

macro_rules! each_inner {
    ($self:ident, $s:ident => $e:expr) => {
        match &mut $self.get_mut().0 {
            AnyInner::Tcp($s) => {
                let $s = Pin::new($s);
                $e
            }
            AnyInner::Tls($s) => {
                let $s = Pin::new(&mut **$s);
                $e
            }
            AnyInner::Ws($s) => {
                let $s = Pin::new(&mut **$s);
                $e
            }
            AnyInner::Wss($s) => {
                let $s = Pin::new(&mut **$s);
                $e
            }
            AnyInner::Quic($s) => {
                let $s = Pin::new(&mut **$s);
                $e
            }
        }
    };
}

impl AsyncRead for AnyStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        each_inner!(self, s => s.poll_read(cx, buf))
    }
}

impl AsyncWrite for AnyStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        each_inner!(self, s => s.poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each_inner!(self, s => s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each_inner!(self, s => s.poll_shutdown(cx))
    }
}

/// A handle that replaces a listener's TLS certificate for new handshakes. Cheap to clone;
/// keep one where reload requests arrive (SIGHUP, the HTTP API) while the listener sits in
/// its accept loop.
#[derive(Debug, Clone)]
pub struct TlsReloader(ReloadTarget);

#[derive(Debug, Clone)]
enum ReloadTarget {
    Stream(TlsAcceptor),
    Quic(QuicEndpoint, QuicConfig),
}

impl TlsReloader {
    /// Uses `tls` for handshakes that start from now on; established connections keep
    /// theirs. Load it with [`crate::TlsFiles::load`] to re-read the PEM files.
    ///
    /// # Errors
    /// Configuration errors as [`ServerTls::rustls_config`]; the old certificate then stays.
    pub fn reload(&self, tls: &ServerTls) -> Result<(), NetError> {
        match &self.0 {
            ReloadTarget::Stream(acceptor) => acceptor.reload(tls),
            ReloadTarget::Quic(endpoint, config) => {
                endpoint.set_server_tls(&tls.clone().alpn(&[ALPN_MQTT]), config)
            }
        }
    }
}

#[derive(Debug)]
enum Socket {
    Tcp(crate::Listener),
    Quic(QuicEndpoint),
}

#[derive(Debug)]
enum Layers {
    Tcp,
    Tls(TlsAcceptor),
    Ws(WsConfig),
    Wss(TlsAcceptor, WsConfig),
    Quic,
}

/// What every pending connection of a listener shares.
#[derive(Debug)]
struct Shared {
    kind: ListenerKind,
    local_addr: SocketAddr,
    layers: Layers,
    settings: ListenerSettings,
    counters: Arc<ListenerCounters>,
    handshakes: Arc<Semaphore>,
}

/// A bound MQTT listener of any kind.
#[derive(Debug)]
pub struct MqttListener {
    socket: Socket,
    reloader: Option<TlsReloader>,
    shared: Arc<Shared>,
}

impl MqttListener {
    /// Binds `addr` (TCP, or UDP for QUIC; port 0 picks one) for `transport`.
    ///
    /// # Errors
    /// [`NetError::ListenerConfig`] for settings that do not fit (PROXY protocol on QUIC,
    /// `handshakes_in_flight_max` of 0), TLS configuration errors, [`NetError::Bind`].
    pub async fn bind(
        addr: SocketAddr,
        transport: Transport,
        settings: ListenerSettings,
    ) -> Result<Self, NetError> {
        let kind = transport.kind();
        let max = settings.limits.handshakes_in_flight_max;
        if max == 0 || max > Semaphore::MAX_PERMITS {
            return Err(NetError::ListenerConfig {
                reason: "handshakes_in_flight_max must be at least 1",
            });
        }
        if settings.limits.handshake_timeout.is_zero() {
            return Err(NetError::ListenerConfig {
                reason: "handshake_timeout must be non-zero",
            });
        }
        if kind == ListenerKind::Quic && settings.proxy_protocol.is_some() {
            return Err(NetError::ListenerConfig {
                reason: "PROXY protocol applies to TCP-based listeners only",
            });
        }
        let (layers, quic) = match transport {
            Transport::Tcp => (Layers::Tcp, None),
            Transport::Tls(tls) => (Layers::Tls(TlsAcceptor::new(&tls)?), None),
            Transport::Ws(ws) => (Layers::Ws(ws), None),
            Transport::Wss(tls, ws) => (Layers::Wss(TlsAcceptor::new(&tls)?, ws), None),
            Transport::Quic(tls, config) => (Layers::Quic, Some((tls, config))),
        };
        let (socket, reloader) = match (quic, &layers) {
            (Some((tls, config)), _) => {
                let endpoint = QuicEndpoint::server(addr, &tls.alpn(&[ALPN_MQTT]), &config).await?;
                let reloader = TlsReloader(ReloadTarget::Quic(endpoint.clone(), config));
                (Socket::Quic(endpoint), Some(reloader))
            }
            (None, Layers::Tls(acceptor) | Layers::Wss(acceptor, _)) => (
                Socket::Tcp(crate::listen(addr).await?),
                Some(TlsReloader(ReloadTarget::Stream(acceptor.clone()))),
            ),
            (None, _) => (Socket::Tcp(crate::listen(addr).await?), None),
        };
        let local_addr = match &socket {
            Socket::Tcp(l) => l.local_addr(),
            Socket::Quic(e) => e.local_addr(),
        };
        Ok(Self {
            socket,
            reloader,
            shared: Arc::new(Shared {
                kind,
                local_addr,
                layers,
                counters: Arc::new(ListenerCounters::default()),
                handshakes: Arc::new(Semaphore::new(max)),
                settings,
            }),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local_addr
    }

    /// The listener's kind.
    pub fn kind(&self) -> ListenerKind {
        self.shared.kind
    }

    /// The listener's counters (shared: keep the `Arc` for metrics).
    pub fn counters(&self) -> Arc<ListenerCounters> {
        self.shared.counters.clone()
    }

    /// A handle to replace the certificate; `None` for listeners without TLS (tcp, ws).
    pub fn tls_reloader(&self) -> Option<TlsReloader> {
        self.reloader.clone()
    }

    /// Waits for a place under `handshakes_in_flight_max`, then for the next connection. Run
    /// the returned connection's [`PendingConnection::handshake`] in its own task; the place
    /// is freed when the handshake ends (or the connection is dropped).
    ///
    /// # Errors
    /// [`NetError::Accept`] on a failed TCP accept (transient, e.g. out of file descriptors:
    /// keep accepting), [`NetError::ListenerClosed`] once a QUIC endpoint is closed.
    pub async fn accept(&self) -> Result<PendingConnection, NetError> {
        // The place first, then the connection: while `handshakes_in_flight_max` handshakes
        // run, new connections wait in the kernel's accept queue (QUIC: quinn's incoming
        // queue) instead of being taken and closed.
        let permit = self
            .shared
            .handshakes
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| NetError::ListenerClosed {
                addr: self.shared.local_addr,
            })?;
        let (raw, peer) = match &self.socket {
            Socket::Tcp(listener) => {
                let (stream, peer) = listener.accept().await?;
                (Raw::Tcp(stream), peer)
            }
            Socket::Quic(endpoint) => {
                let incoming = endpoint.accept().await.ok_or(NetError::ListenerClosed {
                    addr: self.shared.local_addr,
                })?;
                let peer = incoming.remote_address();
                (Raw::Quic(Box::new(incoming)), peer)
            }
        };
        Ok(PendingConnection {
            raw,
            peer,
            _permit: permit,
            shared: self.shared.clone(),
        })
    }
}

#[derive(Debug)]
enum Raw {
    Tcp(Stream),
    // Boxed: quinn's pending handshake is several times the size of a TCP stream.
    Quic(Box<QuicIncoming>),
}

/// A connection taken off a listener whose handshake has not run yet. It holds one of the
/// listener's `handshakes_in_flight_max` slots until the handshake ends or it is dropped.
#[derive(Debug)]
pub struct PendingConnection {
    raw: Raw,
    peer: SocketAddr,
    _permit: OwnedSemaphorePermit,
    shared: Arc<Shared>,
}

impl PendingConnection {
    /// The socket's peer address (before any PROXY header or forwarding header).
    pub fn transport_peer(&self) -> SocketAddr {
        self.peer
    }

    /// Runs every handshake layer of the listener under its handshake timeout and returns
    /// the MQTT byte stream with what is known about the client. Failures are counted on the
    /// listener and logged at debug; they end this connection only. Peers cause them at will,
    /// so logging them where an operator sees them is the caller's, under a rate limit.
    ///
    /// # Errors
    /// [`NetError::HandshakeTimeout`]; [`NetError::ProxyHeader`] / [`NetError::ProxyIo`];
    /// [`NetError::TlsHandshake`]; [`NetError::WsRefused`] (wrong path, no `mqtt`
    /// subprotocol) / [`NetError::WsHandshake`]; [`NetError::QuicConnection`] (QUIC
    /// handshake failed, or the connection closed before opening a stream).
    pub async fn handshake(self) -> Result<(AnyStream, ConnInfo), NetError> {
        let shared = self.shared.clone();
        let peer = self.peer;
        let timeout = shared.settings.limits.handshake_timeout;
        let result = match tokio::time::timeout(timeout, self.run()).await {
            Ok(result) => result,
            Err(_) => Err(NetError::HandshakeTimeout {
                peer,
                after: timeout,
            }),
        };
        let counters = &shared.counters;
        match &result {
            Ok(_) => ListenerCounters::bump(&counters.accepted),
            Err(e) => {
                if matches!(e, NetError::HandshakeTimeout { .. }) {
                    ListenerCounters::bump(&counters.timed_out);
                } else {
                    ListenerCounters::bump(&counters.handshake_failed);
                }
                tracing::debug!(listener = %shared.kind, %peer, error = %e, "handshake failed");
            }
        }
        result
    }

    async fn run(self) -> Result<(AnyStream, ConnInfo), NetError> {
        let shared = &*self.shared;
        let transport_peer = self.peer;
        let mut info = ConnInfo {
            peer: transport_peer,
            transport_peer,
            local: shared.local_addr,
            kind: shared.kind,
            tls_client_cn: None,
        };
        let mut stream = match self.raw {
            Raw::Quic(incoming) => {
                let connection = incoming.handshake().await?;
                // The client's first bidirectional stream carries the session (as in EMQX
                // and RMQTT); later streams are not accepted by anyone and stay unused.
                let (send, recv) = connection.accept_bi().await?;
                info.tls_client_cn = connection
                    .peer_certificates()
                    .and_then(|certs| certs.first().and_then(tls_stream::common_name));
                info.peer = connection.remote_address();
                let bi = QuicBiStream::new(connection, send, recv);
                return Ok((AnyStream(AnyInner::Quic(Box::new(bi))), info));
            }
            Raw::Tcp(stream) => stream,
        };
        if let Ok(local) = stream.local_addr() {
            info.local = local;
        }
        if let Some(settings) = &shared.settings.proxy_protocol {
            let header = proxy::read_header(&mut stream, settings, transport_peer).await?;
            if let Some(source) = header.source {
                info.peer = source;
            }
        }
        let inner = match &shared.layers {
            Layers::Tcp => AnyInner::Tcp(stream),
            Layers::Tls(acceptor) => {
                let tls = acceptor.accept(stream, info.peer).await?;
                info.tls_client_cn = tls_stream::client_cn(&tls);
                AnyInner::Tls(Box::new(tls))
            }
            Layers::Ws(config) => {
                let capped = Capped::new(stream, config.preauth_bytes_max);
                let (ws, forwarded) = ws::ws_accept(capped, config, info.peer).await?;
                if let Some(ip) = forwarded {
                    info.peer = SocketAddr::new(ip, 0);
                }
                AnyInner::Ws(Box::new(ws))
            }
            Layers::Wss(acceptor, config) => {
                let tls = acceptor.accept(stream, info.peer).await?;
                info.tls_client_cn = tls_stream::client_cn(&tls);
                let capped = Capped::new(tls, config.preauth_bytes_max);
                let (ws, forwarded) = ws::ws_accept(capped, config, info.peer).await?;
                if let Some(ip) = forwarded {
                    info.peer = SocketAddr::new(ip, 0);
                }
                AnyInner::Wss(Box::new(ws))
            }
            // `bind` pairs `Layers::Quic` with a QUIC socket, whose connections returned above.
            Layers::Quic => unreachable!("a QUIC listener yields only QUIC connections"),
        };
        Ok((AnyStream(inner), info))
    }
}
