//! QUIC endpoints, connections and bidirectional streams over quinn.
//!
//! Production builds run quinn on its tokio runtime over a real UDP socket. Under
//! `--cfg madsim` the same types run on the simulator through the `sim` module's runtime and
//! socket shims, so callers are identical in both builds.

use std::{
    future::Future,
    io,
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use quinn::crypto::rustls::{HandshakeData, QuicClientConfig, QuicServerConfig};
use rustls_pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::{ClientTls, NetError, ServerTls, TlsVersions};

/// Transport knobs shared by every connection of an endpoint.
///
/// Validated when an endpoint is built; every value is a real limit (there is no "0 means
/// unlimited").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuicConfig {
    /// A connection that hears nothing from its peer for this long is closed with
    /// [`NetError::is_timed_out`]. Must be non-zero. The effective value is the smaller of
    /// the two peers' values.
    pub idle_timeout: Duration,
    /// Send a keep-alive after this much outbound silence, so an idle but healthy connection
    /// does not time out. Must be shorter than `idle_timeout`. `None` sends none.
    pub keep_alive_interval: Option<Duration>,
    /// How many bidirectional streams the peer may have open towards us at once. Must be at
    /// least 1.
    pub concurrent_streams_max: u32,
    /// Seeds quinn's endpoint RNG (`EndpointConfig::rng_seed`). In simulation, derive it from
    /// the simulation seed and the node id; in production, from the runtime's RNG.
    pub rng_seed: [u8; 32],
    /// Stream bytes a connection may have received and not yet read, in all, until
    /// [`crate::CapRelease::release`] raises it: what a peer that has not authenticated at
    /// the application level (an MQTT client before its CONNECT is accepted) can make the
    /// endpoint buffer. `None`: quinn's default from the start (cluster links, whose peers
    /// the TLS handshake authenticates).
    pub preauth_receive_window: Option<u32>,
}

impl QuicConfig {
    /// Defaults for cluster links: 30 s idle timeout, 5 s keep-alive, 256 streams.
    pub fn new(rng_seed: [u8; 32]) -> Self {
        Self {
            // Long enough to ride out a GC-free but busy peer and a short partition; short
            // enough that a dead peer is noticed well within a raft election window.
            idle_timeout: Duration::from_secs(30),
            keep_alive_interval: Some(Duration::from_secs(5)),
            concurrent_streams_max: 256,
            rng_seed,
            preauth_receive_window: None,
        }
    }

    fn transport(&self) -> Result<Arc<quinn::TransportConfig>, NetError> {
        if self.idle_timeout.is_zero() {
            return Err(NetError::QuicConfig {
                knob: "idle_timeout",
                reason: "must be non-zero",
            });
        }
        let idle =
            quinn::IdleTimeout::try_from(self.idle_timeout).map_err(|_| NetError::QuicConfig {
                knob: "idle_timeout",
                reason: "too large for QUIC (2^62 ms)",
            })?;
        if let Some(interval) = self.keep_alive_interval {
            if interval.is_zero() || interval >= self.idle_timeout {
                return Err(NetError::QuicConfig {
                    knob: "keep_alive_interval",
                    reason: "must be non-zero and shorter than idle_timeout",
                });
            }
        }
        if self.concurrent_streams_max == 0 {
            return Err(NetError::QuicConfig {
                knob: "concurrent_streams_max",
                reason: "must be at least 1",
            });
        }
        let mut transport = quinn::TransportConfig::default();
        transport
            .max_idle_timeout(Some(idle))
            .keep_alive_interval(self.keep_alive_interval)
            .max_concurrent_bidi_streams(quinn::VarInt::from_u32(self.concurrent_streams_max))
            // This API exposes bidirectional streams only; refuse unidirectional ones.
            .max_concurrent_uni_streams(quinn::VarInt::from_u32(0));
        if let Some(window) = self.preauth_receive_window {
            transport.receive_window(quinn::VarInt::from_u32(window));
        }
        Ok(Arc::new(transport))
    }
}

/// A QUIC endpoint: one UDP socket that accepts connections (with [`ServerTls`]), dials them
/// (with [`ClientTls`]), or both (a cluster node).
#[derive(Debug, Clone)]
pub struct QuicEndpoint {
    inner: quinn::Endpoint,
    local_addr: SocketAddr,
}

impl QuicEndpoint {
    /// An endpoint that only accepts connections.
    ///
    /// # Errors
    /// As [`QuicEndpoint::new`].
    pub async fn server(
        bind: SocketAddr,
        tls: &ServerTls,
        config: &QuicConfig,
    ) -> Result<Self, NetError> {
        Self::new(bind, Some(tls), None, config).await
    }

    /// An endpoint that only dials.
    ///
    /// # Errors
    /// As [`QuicEndpoint::new`].
    pub async fn client(
        bind: SocketAddr,
        tls: &ClientTls,
        config: &QuicConfig,
    ) -> Result<Self, NetError> {
        Self::new(bind, None, Some(tls), config).await
    }

    /// Binds a UDP socket on `bind` (port 0 picks one) and builds an endpoint that accepts
    /// when `server` is set and can dial when `client` is set. QUIC always uses TLS 1.3.
    ///
    /// Must be called inside the tokio runtime (production) or on a simulated node (madsim).
    ///
    /// # Errors
    /// [`NetError::QuicConfig`] for an invalid knob, TLS errors from building the rustls
    /// configurations, [`NetError::Bind`] if the socket cannot be bound.
    pub async fn new(
        bind: SocketAddr,
        server: Option<&ServerTls>,
        client: Option<&ClientTls>,
        config: &QuicConfig,
    ) -> Result<Self, NetError> {
        let transport = config.transport()?;
        let mut endpoint_config = quinn::EndpointConfig::default();
        endpoint_config.rng_seed(Some(config.rng_seed));
        let server_config = match server {
            None => None,
            Some(tls) => Some(server_config(tls, transport.clone())?),
        };
        let mut inner = bind_endpoint(bind, endpoint_config, server_config).await?;
        if let Some(tls) = client {
            let crypto = QuicClientConfig::try_from(tls.rustls_config(TlsVersions::Tls13)?)?;
            let mut client_config = quinn::ClientConfig::new(Arc::new(crypto));
            client_config.transport_config(transport);
            inner.set_default_client_config(client_config);
        }
        let local_addr = inner
            .local_addr()
            .map_err(|source| NetError::Bind { addr: bind, source })?;
        Ok(Self { inner, local_addr })
    }

    /// The bound address (with the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Replaces the server TLS configuration (and transport knobs) for connections accepted
    /// from now on, e.g. after a certificate rotation; established connections are untouched.
    /// Also turns a client-only endpoint into one that accepts.
    ///
    /// # Errors
    /// As [`QuicEndpoint::new`]; on error the previous configuration stays in force.
    pub fn set_server_tls(&self, tls: &ServerTls, config: &QuicConfig) -> Result<(), NetError> {
        let server_config = server_config(tls, config.transport()?)?;
        self.inner.set_server_config(Some(server_config));
        Ok(())
    }

    /// Dials `addr` and completes the handshake; `server_name` must match a name in the
    /// server's certificate (a DNS name such as `node-1`, or an IP address).
    ///
    /// # Errors
    /// [`NetError::QuicConnect`] if the attempt cannot start (no [`ClientTls`] on this
    /// endpoint, invalid name); [`NetError::QuicConnection`] if the handshake fails or times
    /// out.
    pub async fn connect(
        &self,
        addr: SocketAddr,
        server_name: &str,
    ) -> Result<QuicConnection, NetError> {
        let connecting = self
            .inner
            .connect(addr, server_name)
            .map_err(|source| NetError::QuicConnect { addr, source })?;
        let inner = connecting.await?;
        Ok(QuicConnection { inner })
    }

    /// Waits for the next inbound connection attempt; `None` once the endpoint is closed.
    ///
    /// The returned [`QuicIncoming`] still has to complete its handshake: do that in its own
    /// task so one slow peer does not hold up the others.
    pub async fn accept(&self) -> Option<QuicIncoming> {
        self.inner
            .accept()
            .await
            .map(|inner| QuicIncoming { inner })
    }

    /// Closes every connection at once (code 0) and stops accepting.
    pub fn close(&self) {
        self.inner
            .close(quinn::VarInt::from_u32(0), b"endpoint closed");
    }

    /// Waits until every connection has finished closing, so close frames reach the peers.
    pub async fn wait_idle(&self) {
        self.inner.wait_idle().await;
    }
}

fn server_config(
    tls: &ServerTls,
    transport: Arc<quinn::TransportConfig>,
) -> Result<quinn::ServerConfig, NetError> {
    let crypto = QuicServerConfig::try_from(tls.rustls_config(TlsVersions::Tls13)?)?;
    let mut server_config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    server_config.transport_config(transport);
    Ok(server_config)
}

#[cfg(not(madsim))]
async fn bind_endpoint(
    addr: SocketAddr,
    endpoint_config: quinn::EndpointConfig,
    server_config: Option<quinn::ServerConfig>,
) -> Result<quinn::Endpoint, NetError> {
    let bind_err = |source| NetError::Bind { addr, source };
    let socket = std::net::UdpSocket::bind(addr).map_err(bind_err)?;
    quinn::Endpoint::new(
        endpoint_config,
        server_config,
        socket,
        Arc::new(quinn::TokioRuntime),
    )
    .map_err(bind_err)
}

#[cfg(madsim)]
async fn bind_endpoint(
    addr: SocketAddr,
    endpoint_config: quinn::EndpointConfig,
    server_config: Option<quinn::ServerConfig>,
) -> Result<quinn::Endpoint, NetError> {
    let bind_err = |source| NetError::Bind { addr, source };
    let socket = crate::sim::SimUdpSocket::bind(addr)
        .await
        .map_err(bind_err)?;
    // `Endpoint::new` wants a real socket; the abstract constructor takes our shim instead.
    quinn::Endpoint::new_with_abstract_socket(
        endpoint_config,
        server_config,
        Arc::new(socket),
        Arc::new(crate::sim::SimRuntime),
    )
    .map_err(bind_err)
}

/// An inbound connection attempt that has not finished its handshake.
#[derive(Debug)]
pub struct QuicIncoming {
    inner: quinn::Incoming,
}

impl QuicIncoming {
    /// The address the attempt came from (not yet authenticated).
    pub fn remote_address(&self) -> SocketAddr {
        self.inner.remote_address()
    }

    /// Completes the handshake.
    ///
    /// # Errors
    /// [`NetError::QuicConnection`] when the handshake fails: for example the client presented
    /// no certificate, or one not signed by a required CA.
    pub async fn handshake(self) -> Result<QuicConnection, NetError> {
        let inner = self.inner.await?;
        Ok(QuicConnection { inner })
    }

    /// Refuses the attempt (the client sees `ConnectionRefused`).
    pub fn refuse(self) {
        self.inner.refuse();
    }
}

/// An established QUIC connection. Cheap to clone; all clones are the same connection.
#[derive(Debug, Clone)]
pub struct QuicConnection {
    inner: quinn::Connection,
}

impl QuicConnection {
    /// Opens a bidirectional stream.
    ///
    /// The peer's [`QuicConnection::accept_bi`] sees the stream only once data (or a finish)
    /// has been sent on it. Waits while the peer's `concurrent_streams_max` is reached.
    ///
    /// # Errors
    /// [`NetError::QuicConnection`] if the connection is closed.
    pub async fn open_bi(&self) -> Result<(QuicSend, QuicRecv), NetError> {
        let (send, recv) = self.inner.open_bi().await?;
        Ok((QuicSend { inner: send }, QuicRecv { inner: recv }))
    }

    /// Waits for the peer to open a bidirectional stream.
    ///
    /// # Errors
    /// [`NetError::QuicConnection`] once the connection is closed.
    pub async fn accept_bi(&self) -> Result<(QuicSend, QuicRecv), NetError> {
        let (send, recv) = self.inner.accept_bi().await?;
        Ok((QuicSend { inner: send }, QuicRecv { inner: recv }))
    }

    /// The quinn connection, for lifting its pre-authentication receive window.
    pub(crate) fn quinn(&self) -> &quinn::Connection {
        &self.inner
    }

    /// The peer's current address.
    pub fn remote_address(&self) -> SocketAddr {
        self.inner.remote_address()
    }

    /// The certificate chain the peer presented (leaf first), if any. With mutual TLS this is
    /// the authenticated identity of the remote node.
    pub fn peer_certificates(&self) -> Option<Vec<CertificateDer<'static>>> {
        self.inner
            .peer_identity()?
            .downcast::<Vec<CertificateDer<'static>>>()
            .ok()
            .map(|certs| *certs)
    }

    /// The ALPN protocol agreed in the handshake, if any.
    pub fn alpn_protocol(&self) -> Option<Vec<u8>> {
        self.inner
            .handshake_data()?
            .downcast::<HandshakeData>()
            .ok()?
            .protocol
    }

    /// Closes the connection at once with an application `code` and `reason` for the peer.
    /// Unfinished streams are abandoned.
    pub fn close(&self, code: u32, reason: &[u8]) {
        self.inner.close(quinn::VarInt::from_u32(code), reason);
    }

    /// Waits until the connection is closed and returns why.
    pub async fn closed(&self) -> NetError {
        NetError::QuicConnection(self.inner.closed().await)
    }

    /// Why the connection closed, or `None` while it is open.
    pub fn close_reason(&self) -> Option<NetError> {
        self.inner.close_reason().map(NetError::QuicConnection)
    }

    /// The current smoothed round-trip time estimate.
    pub fn rtt(&self) -> Duration {
        self.inner.rtt()
    }
}

/// The sending half of a QUIC stream ([`AsyncWrite`]).
///
/// `flush` is a no-op (quinn sends as soon as congestion control allows); call
/// [`QuicSend::finish`] (or `shutdown`) to end the stream cleanly.
#[derive(Debug)]
pub struct QuicSend {
    inner: quinn::SendStream,
}

impl QuicSend {
    /// Marks the end of the stream: the peer reads EOF after the data already written.
    ///
    /// # Errors
    /// [`NetError::QuicStreamClosed`] if the stream was already finished or reset.
    pub fn finish(&mut self) -> Result<(), NetError> {
        self.inner.finish()?;
        Ok(())
    }

    /// Abandons the stream with an application error `code`; unsent data is discarded.
    pub fn reset(&mut self, code: u32) {
        // Err only if already finished or reset: then there is nothing left to abandon.
        let _ = self.inner.reset(quinn::VarInt::from_u32(code));
    }
}

impl AsyncWrite for QuicSend {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        AsyncWrite::poll_write(Pin::new(&mut self.inner), cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        AsyncWrite::poll_flush(Pin::new(&mut self.inner), cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        AsyncWrite::poll_shutdown(Pin::new(&mut self.inner), cx)
    }
}

/// The receiving half of a QUIC stream ([`AsyncRead`]); reads return 0 at the peer's finish.
#[derive(Debug)]
pub struct QuicRecv {
    inner: quinn::RecvStream,
}

impl QuicRecv {
    /// Tells the peer to stop sending, with an application error `code`.
    pub fn stop(&mut self, code: u32) {
        // Err only if the stream is already stopped or finished: nothing left to stop.
        let _ = self.inner.stop(quinn::VarInt::from_u32(code));
    }
}

impl AsyncRead for QuicRecv {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        AsyncRead::poll_read(Pin::new(&mut self.inner), cx, buf)
    }
}

/// One bidirectional QUIC stream as a single byte stream ([`AsyncRead`] + [`AsyncWrite`]),
/// holding its connection: MQTT over QUIC carries a whole MQTT session on the first stream
/// the client opens.
///
/// `shutdown` finishes the sending side and completes once the peer has acknowledged every
/// byte (or stopped the stream, or the connection ended): dropping the last handle to a
/// connection closes it at once and would cut off bytes still in flight, so shut down before
/// dropping when the last bytes matter (a DISCONNECT, a refusing CONNACK).
pub struct QuicBiStream {
    send: QuicSend,
    recv: QuicRecv,
    connection: QuicConnection,
    /// Set by `poll_shutdown` once the stream is finished: resolves when the peer has it all.
    acked: Option<Pin<Box<StoppedFuture>>>,
}

type StoppedFuture =
    dyn Future<Output = Result<Option<quinn::VarInt>, quinn::StoppedError>> + Send + Sync;

impl std::fmt::Debug for QuicBiStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuicBiStream")
            .field("send", &self.send)
            .field("recv", &self.recv)
            .field("connection", &self.connection)
            .field("shutting_down", &self.acked.is_some())
            .finish()
    }
}

impl QuicBiStream {
    /// Joins the two halves of a stream of `connection`.
    pub fn new(connection: QuicConnection, send: QuicSend, recv: QuicRecv) -> Self {
        Self {
            send,
            recv,
            connection,
            acked: None,
        }
    }

    /// The connection carrying the stream (peer address after migration, certificates, close).
    pub fn connection(&self) -> &QuicConnection {
        &self.connection
    }

    /// Dials `addr` from `endpoint` (which needs client TLS offering [`crate::ALPN_MQTT`])
    /// and opens the stream that carries the MQTT session.
    ///
    /// QUIC tells the server about a stream only with its first bytes: the server's accept
    /// completes once the client has written (its CONNECT packet).
    ///
    /// # Errors
    /// As [`QuicEndpoint::connect`] and [`QuicConnection::open_bi`].
    pub async fn connect(
        endpoint: &QuicEndpoint,
        addr: SocketAddr,
        server_name: &str,
    ) -> Result<Self, NetError> {
        let connection = endpoint.connect(addr, server_name).await?;
        let (send, recv) = connection.open_bi().await?;
        Ok(Self::new(connection, send, recv))
    }
}

impl AsyncRead for QuicBiStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.recv).poll_read(cx, buf)
    }
}

impl AsyncWrite for QuicBiStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.send).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.send).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.acked.is_none() {
            std::task::ready!(Pin::new(&mut this.send).poll_shutdown(cx))?;
        }
        let send = &this.send.inner;
        let acked = this.acked.get_or_insert_with(|| Box::pin(send.stopped()));
        // Stopped by the peer, or the connection gone: either way nothing more will be
        // delivered, and shutdown has nothing left to wait for.
        std::task::ready!(acked.as_mut().poll(cx)).ok();
        Poll::Ready(Ok(()))
    }
}
