//! Refusing a connection with a CONNACK: written, then the socket closed gracefully.

use std::time::Duration;

use bytes::BytesMut;
use starling_codec::{encode, Packet, Protocol, ReasonCode};
use starling_rt::time;
use starling_session::refusal;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// How long a refused connection may take to read its CONNACK and close.
const REFUSE_WAIT: Duration = Duration::from_secs(5);

/// Sends a CONNACK refusing with `code` (in the client's protocol: 3.x gets the return
/// code the codec maps it to) and closes the connection. `written` runs once the CONNACK
/// is written and flushed, before the close (for the handshake latency).
///
/// Generic over the stream rather than taking the client actor's `Io`, so that this module
/// depends on no actor module.
pub(crate) async fn refuse<S>(
    io: &mut S,
    protocol: Protocol,
    code: ReasonCode,
    written: impl FnOnce(),
) where
    S: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    let mut out = BytesMut::new();
    if encode(
        &Packet::Connack(refusal(code)),
        protocol,
        u32::MAX,
        &mut out,
    )
    .is_err()
    {
        return;
    }
    let _ = time::timeout(REFUSE_WAIT, async {
        io.write_all(&out).await?;
        io.flush().await?;
        written();
        io.shutdown().await?;
        // Read until the peer closes: closing with unread input sends RST, which can
        // destroy the CONNACK before the client reads it.
        let mut scratch = [0u8; 256];
        while io.read(&mut scratch).await? > 0 {}
        std::io::Result::Ok(())
    })
    .await;
}
