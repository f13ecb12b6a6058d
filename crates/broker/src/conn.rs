//! A client connection's byte stream and buffers: reading into a buffer only while there is
//! something to read, batched writes with a timeout only when the socket pushes back, and
//! a graceful close. The client actor owns one [`Conn`] while attached.

use std::future::Future;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::BytesMut;
use futures::FutureExt;
use smallvec::SmallVec;
use starling_codec::{Packet, Protocol};
use starling_net::ListenerKind;
use starling_rt::time;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;

/// A byte stream a client connection can run on: TCP, TLS, WebSocket, QUIC or a test pipe.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// When the bytes of the last read reached this host, if the transport knows (the
    /// kernel's receive timestamp; see [`starling_net::AnyStream::received_at`]).
    fn received_at(&self) -> Option<SystemTime> {
        None
    }
}

impl Io for starling_net::AnyStream {
    fn received_at(&self) -> Option<SystemTime> {
        starling_net::AnyStream::received_at(self)
    }
}

/// Smallest read buffer. An idle connection holds none: a read that finds the buffer
/// released goes through a stack scratch of [`READ_SCRATCH`] bytes first.
pub(crate) const READ_BUF_INITIAL: usize = 256;
/// Stack space for the first read after an idle period.
const READ_SCRATCH: usize = 4096;
/// Pending output past this is written at once rather than at the end of the burst.
pub(crate) const WRITE_BATCH_MAX: usize = 64 * 1024;
/// Timed deliveries (see [`Timed`]) pending on one connection past which the output is
/// written at once: bounds their list (24 B each) the way `WRITE_BATCH_MAX` bounds the
/// bytes. While the output waits for the store, writes past it go untimed.
pub(crate) const TIMED_MAX: usize = 1024;
/// A write that makes no progress for this long means the peer is gone or stuck.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// The attached connection: the socket, read by `Client::poll_input` between turns and
/// written at the end of a burst, both from the actor's own task (no split, no lock).
pub(crate) struct Conn {
    pub(crate) io: Box<dyn Io>,
    /// Read, not yet decoded. Released (capacity 0) whenever a read finds nothing to do with
    /// an empty buffer, so an idle connection holds none.
    pub(crate) input: BytesMut,
    /// EOF, a read error or a decode error was met: nothing more is read.
    pub(crate) input_ended: bool,
    /// EOF was met and `ClientMsg::InputEnd` is still owed (after the held packets).
    pub(crate) end_owed: bool,
    /// Decoded while the client's publishes are held back (see the `flow` module): packets
    /// that must not pass a held PUBLISH, in order. Boxed: most connections never hold. A
    /// deque: released a chunk at a time from the front, a `Vec` moved all the rest of its
    /// packets (hundreds of bytes each) down for every chunk.
    #[allow(clippy::box_collection)] // 8 bytes on every connection instead of 32
    pub(crate) held: Option<Box<std::collections::VecDeque<Packet>>>,
    /// A chunk of held packets was released and more remain: the next look for input
    /// yields first, so that the router runs (and may hold the client again) in between.
    pub(crate) releasing: bool,
    /// The peer closed (or the socket failed): nothing is left to linger for.
    pub(crate) eof: bool,
    pub(crate) out: BytesMut,
    pub(crate) protocol: Protocol,
    /// For an operator's view (`ClientInfo`): when it was accepted (Unix seconds; u32
    /// lasts until 2106 and fits where a u64 would grow every connection), the peer's port
    /// (its address is the gate's), and whether it asked for a clean start.
    pub(crate) connected_at: u32,
    pub(crate) peer_port: u16,
    pub(crate) clean_start: bool,
    pub(crate) _permit: Option<OwnedSemaphorePermit>,
    /// The output's writes whose latency is recorded once they reach the socket. Boxed and
    /// made at the first, dropped at the end of the burst: an idle connection holds none.
    pub(crate) timed: Option<Box<Timed>>,
    /// The node is leaving its cluster: the member the client is pointed to by its
    /// DISCONNECT 0x9C (Server Reference). An `Arc<String>`, thin: 8 bytes on every
    /// connection rather than 16.
    #[allow(clippy::rc_buffer)]
    pub(crate) moved_to: Option<std::sync::Arc<String>>,
    /// The output holds more than QoS 0 deliveries (an acknowledgement, a CONNACK, a QoS 1
    /// delivery...): it is not put off (see `Client::after_turn`). Cleared by a write.
    pub(crate) urgent: bool,
    /// Small writes of deliveries put off in a row at the end of a burst.
    pub(crate) deferred: u8,
}

/// How old a receive stamp may be and still be believed: bytes wait in the socket while the
/// client is held back, but not this long; an older stamp means the wall clock stepped.
const STAMP_AGE_MAX: Duration = Duration::from_secs(60);

/// The moment, on the runtime's clock, at which a read's bytes reached the host, from the
/// transport's wall-clock `stamp`: `now` less the stamp's age, never after `now`; `None`
/// past [`STAMP_AGE_MAX`]. Worked out per packet rather than kept per read: a field on
/// every connection costs more than a read of the wall clock.
///
/// Two clients' packets are read on different threads, and a thread may get to its bytes
/// later than another thread gets to bytes that came after them: the receive time orders
/// them as they came (a PUBLISH read just after another client's SUBSCRIBE, the race of
/// `routing/recent.rs`), where the moment of the read may not.
pub(crate) fn arrival(
    stamp: SystemTime,
    now: time::Instant,
    wall: SystemTime,
) -> Option<time::Instant> {
    let age = wall.duration_since(stamp).unwrap_or(Duration::ZERO);
    if age > STAMP_AGE_MAX {
        return None;
    }
    Some(now.checked_sub(age).unwrap_or(now))
}

/// Writes in the output buffer whose latency ends when they reach the socket: a CONNACK
/// (the handshake's) and first PUBLISHes of routed messages (the delivery's). Each is the
/// end of its bytes in the output and when its latency started; they are recorded together
/// when the write that carries them is done, with one read of the clock for the batch and
/// the deliveries added to the histogram at once (see `metrics::Local`).
pub(crate) struct Timed {
    /// The CONNACK apart: every connection's first timed write, and an idle one's only.
    connack: Option<(usize, time::Instant, ListenerKind)>,
    /// Deliveries, by the offset just past their bytes, in output order. A few inline:
    /// at a low rate most bursts are one delivery, and the box is then the burst's only
    /// allocation for timing (a callgrind of fan-out at 50 msg/s found a separate list's
    /// allocation and free per burst the largest part of the cost).
    deliveries: SmallVec<[(usize, time::Instant); TIMED_INLINE]>,
}

/// Timed deliveries held in [`Timed`] itself (24 B each) before a list is allocated.
const TIMED_INLINE: usize = 4;

pub(crate) async fn write_out(c: &mut Conn) -> bool {
    // Fast path, no timer: the socket takes the whole batch at once (it nearly always does).
    // Arming and cancelling the write timeout on every write cost more than the write.
    let mut written = 0;
    if let Some(Ok(n)) = c.io.write(&c.out).now_or_never() {
        written = n;
    }
    let ok = if written == c.out.len() && matches!(c.io.flush().now_or_never(), Some(Ok(()))) {
        true
    } else {
        // Boxed: rare, and its timer and write state would otherwise sit in every turn.
        matches!(
            Box::pin(time::timeout(WRITE_TIMEOUT, async {
                c.io.write_all(&c.out[written..]).await?;
                c.io.flush().await
            }))
            .await,
            Some(Ok(()))
        )
    };
    c.out.clear();
    if c.out.capacity() > WRITE_BATCH_MAX {
        c.out = BytesMut::new();
    }
    ok
}

impl Conn {
    fn timed(&mut self) -> &mut Timed {
        self.timed.get_or_insert_with(|| {
            Box::new(Timed {
                connack: None,
                deliveries: SmallVec::new(),
            })
        })
    }

    /// The handshake of a connection of a `kind` listener accepted at `since` ends when
    /// the output written so far (the CONNACK first in it) is.
    pub(crate) fn time_connack(&mut self, since: time::Instant, kind: ListenerKind) {
        let end = self.out.len();
        self.timed().connack = Some((end, since, kind));
    }

    /// The delivery whose PUBLISH was just put in the output started at `since`.
    pub(crate) fn time_delivery(&mut self, since: time::Instant) {
        let end = self.out.len();
        let d = &mut self.timed().deliveries;
        if d.len() < TIMED_MAX {
            debug_assert!(d.last().is_none_or(|&(e, _)| e <= end));
            d.push((end, since));
        }
    }

    /// Whether the timed deliveries reached [`TIMED_MAX`]: the output should go out now.
    pub(crate) fn timed_full(&self) -> bool {
        self.timed
            .as_ref()
            .is_some_and(|t| t.deliveries.len() >= TIMED_MAX)
    }

    /// The first `n` bytes of output reached the socket: records the timed writes among
    /// them, and moves the offsets of the rest back.
    pub(crate) fn output_written(&mut self, n: usize, metrics: &crate::metrics::Metrics) {
        let Some(t) = &mut self.timed else { return };
        let done = t.deliveries.partition_point(|&(end, _)| end <= n);
        let connack = t.connack.filter(|&(end, ..)| end <= n);
        if done > 0 || connack.is_some() {
            // One clock read for the whole write.
            let now = time::now();
            if let Some((_, since, kind)) = connack {
                t.connack = None;
                metrics
                    .handshake(kind)
                    .observe(now.saturating_duration_since(since));
                metrics.handshakings_rate.tick(time::unix_secs());
            }
            if done == 1 {
                // The same two atomic adds as a gathered batch of one, without the batch.
                let (_, since) = t.deliveries.remove(0);
                metrics
                    .delivery
                    .observe(now.saturating_duration_since(since));
            } else if done > 1 {
                let mut local = crate::metrics::Local::default();
                for (_, since) in t.deliveries.drain(..done) {
                    local.observe(now.saturating_duration_since(since));
                }
                metrics.delivery.add(&local);
            }
        }
        if let Some((end, ..)) = &mut t.connack {
            *end -= n;
        }
        t.deliveries.iter_mut().for_each(|(end, _)| *end -= n);
    }

    /// The end of a burst: once every timed write is written, the list goes.
    pub(crate) fn release_timed(&mut self) {
        let done = |t: &Timed| t.connack.is_none() && t.deliveries.is_empty();
        if self.timed.as_deref().is_some_and(done) {
            self.timed = None;
        }
    }

    /// Reads once into the input buffer: `Ready(0)` at EOF or on an error.
    pub(crate) fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<usize> {
        if self.input.capacity() == 0 {
            // No buffer while idle: the wait for readability holds none; what arrives is
            // read into the stack and copied into a buffer of its size.
            // Uninitialised: this runs whenever an idle connection's actor looks for input
            // (every turn), and zeroing 4 KB each time was the largest cost of a delivery.
            let mut scratch = [MaybeUninit::<u8>::uninit(); READ_SCRATCH];
            let mut rb = ReadBuf::uninit(&mut scratch);
            return match Pin::new(&mut self.io).poll_read(cx, &mut rb) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Ok(())) if !rb.filled().is_empty() => {
                    let n = rb.filled().len();
                    self.input = BytesMut::with_capacity(n.max(READ_BUF_INITIAL));
                    self.input.extend_from_slice(rb.filled());
                    Poll::Ready(n)
                }
                Poll::Ready(_) => Poll::Ready(0),
            };
        }
        if self.input.capacity() - self.input.len() < READ_BUF_INITIAL / 2 {
            // Doubling: a large packet arrives in O(log n) reads and reallocations; the
            // decoder refuses one past `max` from its header, before this grows.
            self.input.reserve(self.input.len().max(READ_BUF_INITIAL));
        }
        let fut = self.io.read_buf(&mut self.input);
        futures::pin_mut!(fut);
        match fut.poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(n)) => Poll::Ready(n),
            Poll::Ready(Err(_)) => Poll::Ready(0),
        }
    }
}

/// How long a closed connection keeps reading after our FIN.
const LINGER: Duration = Duration::from_secs(2);

/// Closes a connection gracefully: FIN, then read and discard until the peer closes (or
/// [`LINGER`] passes). Closing a socket with unread input makes the kernel send RST, and a
/// RST can destroy our last packets (a DISCONNECT with its reason code) in the peer's
/// receive buffer before the peer reads them.
pub(crate) async fn linger(mut io: Box<dyn Io>) {
    let _ = time::timeout(LINGER, async {
        let _ = io.shutdown().await;
        let mut scratch = [0u8; 512];
        while matches!(io.read(&mut scratch).await, Ok(n) if n > 0) {}
    })
    .await;
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::{arrival, STAMP_AGE_MAX};

    #[test]
    fn a_receive_stamp_is_moved_onto_the_runtime_clock_by_its_age() {
        let now = starling_rt::time::now();
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let ms = Duration::from_millis;
        // 3 ms old on the wall clock: 3 ms before now.
        let at = arrival(wall - ms(3), now, wall).unwrap();
        assert_eq!(now - at, ms(3));
        // Never after now (the wall clock stepped back since).
        assert_eq!(arrival(wall + ms(5), now, wall), Some(now));
        // A stamp older than any wait in the socket: the wall clock stepped forward.
        let old = wall - STAMP_AGE_MAX - ms(1);
        assert_eq!(arrival(old, now, wall), None);
    }
}
