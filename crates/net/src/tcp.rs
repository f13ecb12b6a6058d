//! TCP byte streams, identical for callers in the production and the simulated build.

use std::{
    io,
    net::SocketAddr,
    pin::Pin,
    task::{Context, Poll},
    time::SystemTime,
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
    /// The kernel's receive time of the last byte the last read returned, in nanoseconds
    /// since the Unix epoch; [`UNSTAMPED`] while reads are plain (a connection this side
    /// opened, or the kernel refused), [`NOT_YET`] while no read has been stamped. One
    /// word, as every connection holds it.
    #[cfg(all(target_os = "linux", not(madsim)))]
    stamp: u64,
}

/// [`Stream::stamp`]: reads do not go through `recvmsg`.
#[cfg(all(target_os = "linux", not(madsim)))]
const UNSTAMPED: u64 = 0;
/// [`Stream::stamp`]: reads go through `recvmsg`, none stamped yet.
#[cfg(all(target_os = "linux", not(madsim)))]
const NOT_YET: u64 = 1;

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
        let mut stream =
            Stream::new(inner, peer).map_err(|source| NetError::Accept { addr, source })?;
        stream.stamp_reads();
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
        Ok(Self {
            inner,
            peer_addr,
            #[cfg(all(target_os = "linux", not(madsim)))]
            stamp: UNSTAMPED,
        })
    }

    /// Asks the kernel to stamp what this connection receives, where it can: two clients'
    /// packets are read on different threads, and the moment a thread gets to its bytes
    /// says less about which came first than the moment they reached the host (see
    /// [`Stream::received_at`]).
    fn stamp_reads(&mut self) {
        #[cfg(all(target_os = "linux", not(madsim)))]
        {
            use std::os::fd::AsRawFd;
            if stamped::enable(self.inner.as_raw_fd()) {
                self.stamp = NOT_YET;
            }
        }
    }

    /// When the last byte of the last read reached this host, by the kernel's receive
    /// timestamp (wall clock). `None` where the kernel does not stamp (a connection this
    /// side opened, another OS, the simulator) or before the first read.
    pub fn received_at(&self) -> Option<SystemTime> {
        #[cfg(all(target_os = "linux", not(madsim)))]
        if self.stamp > NOT_YET {
            return SystemTime::UNIX_EPOCH.checked_add(std::time::Duration::from_nanos(self.stamp));
        }
        None
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
        #[cfg(all(target_os = "linux", not(madsim)))]
        if self.stamp != UNSTAMPED {
            use std::os::fd::AsRawFd;
            let this = self.get_mut();
            loop {
                match this.inner.poll_read_ready(cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                }
                let fd = this.inner.as_raw_fd();
                // `try_io` clears the readiness on WouldBlock, so the loop then waits.
                match this
                    .inner
                    .try_io(tokio::io::Interest::READABLE, || stamped::recv(fd, buf))
                {
                    Ok(at) => {
                        // An unstamped read (the kernel's stamping still off) must not
                        // leave its bytes the time of earlier ones.
                        this.stamp = at.filter(|&ns| ns > NOT_YET).unwrap_or(NOT_YET);
                        return Poll::Ready(Ok(()));
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

/// Reads that carry the kernel's receive timestamp (`SO_TIMESTAMPNS`): TCP reports, with
/// each `recvmsg`, the time the last segment it read from was received (since Linux 4.13).
/// `libc` directly, hence the one `unsafe` of this crate: the read goes into the
/// uninitialised part of the caller's buffer (zeroing it first cost more than the read,
/// see the broker's `conn::poll_fill`), and the timestamp comes back as a control message.
#[cfg(all(target_os = "linux", not(madsim)))]
#[allow(unsafe_code)]
mod stamped {
    use std::{io, mem::size_of, os::fd::RawFd};

    use tokio::io::ReadBuf;

    /// Room for one `SCM_TIMESTAMPNS` control message (and alignment for its header).
    #[repr(C, align(8))]
    struct Control([u8; 64]);

    /// Turns the timestamps on; `false` if the kernel refused.
    pub(super) fn enable(fd: RawFd) -> bool {
        let on: libc::c_int = 1;
        // SAFETY: `fd` is an open socket owned by the caller; the option's value is the
        // `c_int` that SO_TIMESTAMPNS takes, and its length is given.
        let r = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_TIMESTAMPNS,
                std::ptr::from_ref(&on).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        r == 0
    }

    /// One non-blocking read into `buf`'s unfilled part; the receive time if the kernel
    /// gave one, in nanoseconds since the Unix epoch.
    pub(super) fn recv(fd: RawFd, buf: &mut ReadBuf<'_>) -> io::Result<Option<u64>> {
        // SAFETY: the kernel only writes into this memory, and `assume_init` below covers
        // exactly the bytes it reports written; nothing is de-initialised.
        let unfilled = unsafe { buf.unfilled_mut() };
        let mut iov = libc::iovec {
            iov_base: unfilled.as_mut_ptr().cast(),
            iov_len: unfilled.len(),
        };
        let mut control = Control([0; 64]);
        // SAFETY: an all-zero msghdr is a valid empty one.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.0.as_mut_ptr().cast();
        msg.msg_controllen = control.0.len() as _;
        // SAFETY: `msg` points at live buffers of the lengths it states, for this call.
        let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        // SAFETY: the kernel wrote `n` bytes at the start of the unfilled part.
        unsafe { buf.assume_init(n) };
        buf.advance(n);
        let mut at = None;
        // SAFETY: the CMSG_* walk stays within `msg_controllen` as the kernel set it, over
        // `control`, which outlives the walk; the data is read unaligned.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                    let ts: libc::timespec =
                        std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::timespec>());
                    if let (Ok(s), Ok(ns)) = (u64::try_from(ts.tv_sec), u64::try_from(ts.tv_nsec)) {
                        at = s.checked_mul(1_000_000_000).and_then(|s| s.checked_add(ns));
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        Ok(at)
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
