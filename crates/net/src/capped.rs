//! A read cap for the bytes a peer may make a transport layer buffer before it has
//! authenticated: the WebSocket layer buffers a whole message (up to the listener's
//! largest packet) before it yields any of it, so without a cap below it one
//! unauthenticated WebSocket client could make the broker hold a megabyte.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Reads through `inner` at most `cap` bytes until [`CapRelease::release`] is called; past
/// the cap a read waits (the handshake timeout then ends a peer that never authenticates).
#[derive(Debug)]
pub(crate) struct Capped<S> {
    inner: S,
    read: usize,
    cap: usize,
    state: Arc<CapState>,
}

#[derive(Debug, Default)]
struct CapState {
    released: AtomicBool,
    /// The reader waiting at the cap.
    waker: Mutex<Option<Waker>>,
}

/// Lifts a connection's pre-authentication read cap once its peer has authenticated: a
/// [`Capped`] stream's, or a QUIC connection's receive window. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CapRelease(Release);

#[derive(Debug, Clone)]
enum Release {
    Stream(Arc<CapState>),
    Quic(quinn::Connection),
}

impl CapRelease {
    pub(crate) fn quic(connection: quinn::Connection) -> Self {
        Self(Release::Quic(connection))
    }

    /// Lifts the cap for good and wakes a read waiting at it.
    pub fn release(&self) {
        match &self.0 {
            Release::Stream(state) => {
                state.released.store(true, Ordering::Release);
                let waker = state.waker.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some(w) = waker {
                    w.wake();
                }
            }
            // quinn's default: the connection-level window stops limiting, the per-stream
            // window (1.25 MB by default) remains.
            Release::Quic(connection) => connection.set_receive_window(quinn::VarInt::MAX),
        }
    }
}

/// Bytes copied per read while capped: the cap is small and the stretch short-lived.
const CAPPED_CHUNK: usize = 4096;

impl<S> Capped<S> {
    pub(crate) fn new(inner: S, cap: usize) -> Self {
        Self {
            inner,
            read: 0,
            cap,
            state: Arc::default(),
        }
    }

    pub(crate) fn get_ref(&self) -> &S {
        &self.inner
    }

    pub(crate) fn release_handle(&self) -> CapRelease {
        CapRelease(Release::Stream(self.state.clone()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Capped<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.state.released.load(Ordering::Acquire) {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        let left = this.cap.saturating_sub(this.read);
        if left == 0 {
            *this.state.waker.lock().unwrap_or_else(|e| e.into_inner()) = Some(cx.waker().clone());
            // Released in between: no one is left to wake us.
            if !this.state.released.load(Ordering::Acquire) {
                return Poll::Pending;
            }
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        let mut chunk = [0u8; CAPPED_CHUNK];
        let n = left.min(CAPPED_CHUNK).min(buf.remaining());
        let mut limited = ReadBuf::new(&mut chunk[..n]);
        match Pin::new(&mut this.inner).poll_read(cx, &mut limited) {
            Poll::Ready(Ok(())) => {
                let got = limited.filled();
                this.read += got.len();
                buf.put_slice(got);
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Capped<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn reads_stop_at_the_cap_until_released() {
        let (mut peer, ours) = tokio::io::duplex(64 * 1024);
        let mut capped = Capped::new(ours, 100);
        let release = capped.release_handle();
        peer.write_all(&[7u8; 1000]).await.unwrap();
        let mut got = Vec::new();
        let mut chunk = [0u8; 64];
        while got.len() < 100 {
            let n = capped.read(&mut chunk).await.unwrap();
            got.extend_from_slice(&chunk[..n]);
        }
        assert_eq!(got.len(), 100, "never more than the cap");
        let more = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            capped.read(&mut chunk),
        )
        .await;
        assert!(more.is_err(), "a read at the cap waits");
        // Released while a read waits: it is woken and goes on.
        let reader = tokio::spawn(async move {
            let mut rest = vec![0u8; 900];
            capped.read_exact(&mut rest).await.map(|_| rest.len())
        });
        tokio::task::yield_now().await;
        release.release();
        assert_eq!(reader.await.unwrap().unwrap(), 900);
    }
}
