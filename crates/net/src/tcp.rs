//! TCP byte streams, identical for callers in the production and the simulated build.

use std::{
    io,
    net::SocketAddr,
    pin::Pin,
    task::{Context, Poll},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::NetError;

/// A bound TCP listener.
///
/// Under `--cfg madsim` this is the simulator's TCP listener on the current simulated node.
#[derive(Debug)]
pub struct Listener {
    inner: tokio::net::TcpListener,
    local_addr: SocketAddr,
}

/// An established TCP connection: an ordered, reliable byte stream.
///
/// Implements tokio's [`AsyncRead`] and [`AsyncWrite`]. Callers must call `flush()` (for
/// example `AsyncWriteExt::flush`) after each batch of writes: the simulated TCP stream sends
/// nothing until it is flushed, and code that forgets works in production and stalls in
/// simulation.
#[derive(Debug)]
pub struct Stream {
    inner: tokio::net::TcpStream,
    peer_addr: SocketAddr,
}

/// Binds a TCP listener on `addr` (port 0 picks a free port; see [`Listener::local_addr`]).
///
/// # Errors
/// [`NetError::Bind`] when the address is in use or not local.
pub async fn listen(addr: SocketAddr) -> Result<Listener, NetError> {
    let inner = bind(addr)
        .await
        .map_err(|source| NetError::Bind { addr, source })?;
    let local_addr = inner
        .local_addr()
        .map_err(|source| NetError::Bind { addr, source })?;
    Ok(Listener { inner, local_addr })
}

/// Connections the kernel may hold completed but not yet accepted (capped by
/// `net.core.somaxconn`). Larger than the usual 1024: a broker that accepts under a bound on
/// connections being set up leaves a reconnect storm waiting here.
const LISTEN_BACKLOG: u32 = 8192;

#[cfg(not(madsim))]
async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As `TcpListener::bind` does: a restarted broker can bind while old connections linger
    // in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

#[cfg(madsim)]
async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let _ = LISTEN_BACKLOG;
    tokio::net::TcpListener::bind(addr).await
}

/// Opens a TCP connection to `addr`, with `TCP_NODELAY` set.
///
/// # Errors
/// [`NetError::Connect`] when the peer refuses or is unreachable (in simulation also while the
/// link is clogged).
pub async fn connect(addr: SocketAddr) -> Result<Stream, NetError> {
    let inner = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|source| NetError::Connect { addr, source })?;
    Stream::new(inner, addr).map_err(|source| NetError::Connect { addr, source })
}

impl Listener {
    /// Waits for the next inbound connection and returns it with the peer's address.
    ///
    /// # Errors
    /// [`NetError::Accept`] on a failed accept. Per-connection failures (for example the
    /// process running out of file descriptors) are transient: keep accepting.
    pub async fn accept(&self) -> Result<(Stream, SocketAddr), NetError> {
        let addr = self.local_addr;
        let (inner, peer) = self
            .inner
            .accept()
            .await
            .map_err(|source| NetError::Accept { addr, source })?;
        let stream =
            Stream::new(inner, peer).map_err(|source| NetError::Accept { addr, source })?;
        Ok((stream, peer))
    }

    /// The address the listener is bound to (with the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

impl Stream {
    fn new(inner: tokio::net::TcpStream, peer_addr: SocketAddr) -> io::Result<Self> {
        // MQTT and raft traffic is many small request/response frames: Nagle's algorithm would
        // add up to one round trip of delay to each. (A no-op in the simulator.)
        inner.set_nodelay(true)?;
        Ok(Self { inner, peer_addr })
    }

    /// The remote address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer_addr
    }

    /// The local address of this connection.
    ///
    /// # Errors
    /// [`NetError::Socket`] if the socket was already torn down.
    pub fn local_addr(&self) -> Result<SocketAddr, NetError> {
        self.inner.local_addr().map_err(NetError::Socket)
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
