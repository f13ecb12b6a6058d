//! Refusing a connection with a CONNACK: written, then the socket closed gracefully.

use std::time::Duration;

use bytes::BytesMut;
use starling_codec::{encode, Connack, Packet, Protocol, ReasonCode};
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
    refuse_with(io, protocol, refusal(code), u32::MAX, written).await;
}

/// As [`refuse`], with a CONNACK of the caller's (properties such as a Server Reference):
/// sent if it fits `client_max` (the CONNECT's Maximum Packet Size), else the plain
/// refusal with its reason code.
pub(crate) async fn refuse_with<S>(
    io: &mut S,
    protocol: Protocol,
    connack: Connack,
    client_max: u32,
    written: impl FnOnce(),
) where
    S: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    let code = connack.reason_code;
    let mut out = BytesMut::new();
    if encode(&Packet::Connack(connack), protocol, client_max, &mut out).is_err() {
        out.clear();
        let plain = Packet::Connack(refusal(code));
        if encode(&plain, protocol, u32::MAX, &mut out).is_err() {
            return;
        }
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
