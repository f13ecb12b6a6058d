//! quinn on the madsim simulator: a [`quinn::Runtime`] over the simulated clock and tasks, and
//! a [`quinn::AsyncUdpSocket`] over a simulated `madsim::net::Endpoint`.
//!
//! Compiled only with `--cfg madsim`. Datagrams carry no ECN and are never coalesced (one
//! datagram per send and per receive: no GSO/GRO), which keeps the shim small.

use std::{
    fmt,
    future::Future,
    io::{self, IoSliceMut},
    net::SocketAddr,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Instant,
};

use madsim::net::{Endpoint, Payload};
use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncTimer, AsyncUdpSocket, Runtime, UdpPoller};

/// madsim's endpoints multiplex by tag; QUIC datagrams use tag 0 (as madsim's own UDP does).
const TAG: u64 = 0;

/// Datagrams queued for sending before further ones are dropped. A full queue behaves like a
/// congested NIC: UDP loses the datagram and QUIC's loss recovery resends it. 4096 is far above
/// what quinn's congestion window puts in flight in our tests.
const OUTBOX_DATAGRAMS_MAX: usize = 4096;

/// quinn's runtime on the simulator: timers on virtual time, tasks on the current node.
#[derive(Debug)]
pub(crate) struct SimRuntime;

impl Runtime for SimRuntime {
    fn new_timer(&self, deadline: Instant) -> Pin<Box<dyn AsyncTimer>> {
        Box::pin(SimTimer(madsim::time::sleep_until(deadline)))
    }

    fn spawn(&self, future: Pin<Box<dyn Future<Output = ()> + Send>>) {
        // Spawned on the current simulated node, so quinn's drivers die with it on `kill`.
        drop(madsim::task::spawn(future));
    }

    fn wrap_udp_socket(&self, _socket: std::net::UdpSocket) -> io::Result<Arc<dyn AsyncUdpSocket>> {
        // Real sockets have no place in a simulation; endpoints are built from SimUdpSocket.
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "real UDP sockets are not available under madsim",
        ))
    }

    fn now(&self) -> Instant {
        madsim::time::TimeHandle::current().now_instant()
    }
}

#[derive(Debug)]
struct SimTimer(madsim::time::Sleep);

impl AsyncTimer for SimTimer {
    fn reset(mut self: Pin<&mut Self>, deadline: Instant) {
        Pin::new(&mut self.0).reset(deadline);
    }

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(&mut self.0).poll(cx)
    }
}

type RecvFuture = Pin<Box<dyn Future<Output = io::Result<(Payload, SocketAddr)>> + Send>>;

/// A UDP socket for quinn over a simulated endpoint.
pub(crate) struct SimUdpSocket {
    endpoint: Endpoint,
    local_addr: SocketAddr,
    /// Sends are async in madsim but synchronous in quinn's API: a per-socket task drains
    /// this queue in order (so the shim adds no reordering of its own).
    outbox: tokio::sync::mpsc::Sender<(SocketAddr, Vec<u8>)>,
    /// The pending receive. It must survive between polls: a dropped madsim receive future
    /// can lose the datagram it had already taken from the mailbox.
    recv: Mutex<Option<RecvFuture>>,
}

impl fmt::Debug for SimUdpSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimUdpSocket")
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

impl SimUdpSocket {
    /// Binds a simulated endpoint on the current node and starts its send task.
    pub(crate) async fn bind(addr: SocketAddr) -> io::Result<Self> {
        let endpoint = Endpoint::bind(addr).await?;
        let local_addr = endpoint.local_addr()?;
        let (outbox, mut queue) =
            tokio::sync::mpsc::channel::<(SocketAddr, Vec<u8>)>(OUTBOX_DATAGRAMS_MAX);
        let sender = endpoint.clone();
        // Ends when the socket (the only Sender) is dropped and the queue is drained.
        drop(madsim::task::spawn(async move {
            while let Some((dst, datagram)) = queue.recv().await {
                if let Err(error) = sender.send_to_raw(dst, TAG, Box::new(datagram)).await {
                    // Like a real UDP send error: the datagram is lost, QUIC recovers.
                    tracing::debug!(%dst, %error, "simulated datagram send failed");
                }
            }
        }));
        Ok(Self {
            endpoint,
            local_addr,
            outbox,
            recv: Mutex::new(None),
        })
    }

    fn enqueue(&self, dst: SocketAddr, datagram: &[u8]) -> io::Result<()> {
        use tokio::sync::mpsc::error::TrySendError;
        match self.outbox.try_send((dst, datagram.to_vec())) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => {
                tracing::debug!(%dst, "simulated outbox full, datagram dropped");
                Ok(())
            }
            Err(TrySendError::Closed(_)) => Err(io::ErrorKind::BrokenPipe.into()),
        }
    }
}

impl AsyncUdpSocket for SimUdpSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(AlwaysWritable)
    }

    fn try_send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        // max_transmit_segments is 1, so quinn should not batch; split anyway if it does.
        match transmit.segment_size {
            Some(size) if size < transmit.contents.len() => {
                for segment in transmit.contents.chunks(size) {
                    self.enqueue(transmit.destination, segment)?;
                }
                Ok(())
            }
            _ => self.enqueue(transmit.destination, transmit.contents),
        }
    }

    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        // Only quinn's endpoint driver polls this, so the lock is never contended; a poisoned
        // lock means that driver panicked while holding it, which is already fatal.
        let mut pending = self.recv.lock().expect("recv lock poisoned");
        loop {
            let future = pending.get_or_insert_with(|| {
                let endpoint = self.endpoint.clone();
                Box::pin(async move { endpoint.recv_from_raw(TAG).await })
            });
            let (payload, from) = match future.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(result) => {
                    *pending = None;
                    result?
                }
            };
            // Another simulated component sending non-bytes on tag 0 is not a QUIC peer.
            let Ok(datagram) = payload.downcast::<Vec<u8>>() else {
                continue;
            };
            let (Some(buf), Some(slot)) = (bufs.first_mut(), meta.first_mut()) else {
                return Poll::Ready(Ok(0));
            };
            // A datagram larger than the buffer is truncated, as a real UDP socket does.
            let len = datagram.len().min(buf.len());
            buf[..len].copy_from_slice(&datagram[..len]);
            *slot = RecvMeta {
                addr: from,
                len,
                stride: len,
                ecn: None,
                dst_ip: None,
            };
            return Poll::Ready(Ok(1));
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local_addr)
    }

    fn may_fragment(&self) -> bool {
        // The simulator delivers datagrams whole.
        false
    }
}

/// Sends never block (a full outbox drops), so the socket is always writable.
#[derive(Debug)]
struct AlwaysWritable;

impl UdpPoller for AlwaysWritable {
    fn poll_writable(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
