//! MQTT over WebSocket: the server upgrade (path and `mqtt` subprotocol checks,
//! `X-Forwarded-For`), a byte-stream adapter over the WebSocket, and a client connector.
//!
//! MQTT packets and WebSocket frames do not line up (MQTT 5 §6.0: "a single WebSocket data
//! frame can contain multiple or partial MQTT Control Packets"), so the adapter turns the
//! frame stream into a plain byte stream in both directions.

use std::{
    io,
    net::{IpAddr, SocketAddr},
    pin::Pin,
    task::{ready, Context, Poll},
};

use bytes::{Buf, Bytes};
use futures_util::{Sink, Stream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_tungstenite::{
    tungstenite::{
        self,
        client::IntoClientRequest,
        handshake::server::{ErrorResponse, Request, Response},
        http::{header, HeaderValue, StatusCode},
        protocol::WebSocketConfig,
        Message,
    },
    WebSocketStream,
};

use crate::NetError;

/// The path a WebSocket listener serves unless configured otherwise.
pub const WS_PATH_DEFAULT: &str = "/mqtt";

/// Subprotocols we answer, in preference order: `mqtt` (MQTT 3.1.1 and 5.0, §6.0) and the
/// older `mqttv3.1` that MQTT 3.1 clients offer.
const SUBPROTOCOLS: [&str; 2] = ["mqtt", "mqttv3.1"];

/// Our outgoing frames carry at most this many bytes; larger writes span several frames.
/// Bounds the adapter's write buffer; peers reassemble the byte stream anyway.
const WRITE_FRAME_MAX: usize = 64 * 1024;

/// tungstenite's read buffer, allocated up front for every connection: small, because
/// most MQTT connections are idle most of the time (see FACTS on idle-connection memory).
const READ_BUFFER_SIZE: usize = 4 * 1024;

/// Settings of a WebSocket (or WebSocket over TLS) listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WsConfig {
    /// The only request path upgraded (others get HTTP 404). Default `/mqtt`.
    pub path: String,
    /// Take the client's address from the `X-Forwarded-For` header. Enable only behind a
    /// proxy that sets it: a client can forge the header. The last entry is used (the one
    /// the proxy in front of us appended); its port is unknown and reported as 0.
    pub trust_x_forwarded_for: bool,
    /// Largest incoming WebSocket message (and frame) accepted, in bytes; a larger one ends
    /// the connection. Set it at least to the listener's MQTT `packet_size_max`, since some
    /// clients send each packet as one message.
    pub message_size_max: usize,
    /// Bytes read from the connection (HTTP upgrade and WebSocket frames included) before
    /// [`crate::AnyStream::cap_release`] is called: the WebSocket layer buffers a whole
    /// message before yielding it, so this, not the MQTT reader above it, bounds what an
    /// unauthenticated client makes the broker hold. Past it, reads wait.
    pub preauth_bytes_max: usize,
}

impl Default for WsConfig {
    fn default() -> Self {
        Self {
            path: WS_PATH_DEFAULT.to_owned(),
            trust_x_forwarded_for: false,
            // MQTT's own default maximum packet size in most brokers is around 1 MiB; leave
            // room for one such packet plus framing.
            message_size_max: 2 * 1024 * 1024,
            // A CONNECT of 16 KiB, its frame header and an HTTP upgrade request of 8 KiB.
            preauth_bytes_max: 24 * 1024 + 16,
        }
    }
}

impl WsConfig {
    fn tungstenite(&self) -> WebSocketConfig {
        WebSocketConfig::default()
            .read_buffer_size(READ_BUFFER_SIZE)
            // Our adapter already gathers writes until flush; tungstenite should not hold
            // them back again.
            .write_buffer_size(0)
            .max_message_size(Some(self.message_size_max))
            .max_frame_size(Some(self.message_size_max))
    }
}

/// Why our policy refused a WebSocket upgrade.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WsRefusal {
    /// The request path is not the listener's (answered with HTTP 404).
    #[error("path {path:?} is not served")]
    Path {
        /// The path requested.
        path: String,
    },
    /// The client offered no `mqtt` subprotocol (answered with HTTP 400).
    #[error("no mqtt subprotocol offered")]
    NoMqttSubprotocol,
}

/// Runs the server side of the WebSocket upgrade on `io`.
///
/// Returns the stream and, when `config.trust_x_forwarded_for` is set and the header holds an
/// address, the client's IP address.
// The callback's error type is tungstenite's (an HTTP response), not ours to shrink.
#[allow(clippy::result_large_err)]
pub(crate) async fn ws_accept<S>(
    io: S,
    config: &WsConfig,
    peer: SocketAddr,
) -> Result<(WsStream<S>, Option<IpAddr>), NetError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut refusal = None;
    let mut forwarded = None;
    let callback = |request: &Request, mut response: Response| {
        if request.uri().path() != config.path {
            let reason = WsRefusal::Path {
                path: request.uri().path().to_owned(),
            };
            let answer = error_response(StatusCode::NOT_FOUND, &reason);
            refusal = Some(reason);
            return Err(answer);
        }
        let Some(protocol) = pick_subprotocol(request) else {
            let reason = WsRefusal::NoMqttSubprotocol;
            let answer = error_response(StatusCode::BAD_REQUEST, &reason);
            refusal = Some(reason);
            return Err(answer);
        };
        response.headers_mut().insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static(protocol),
        );
        if config.trust_x_forwarded_for {
            forwarded = last_forwarded_for(request);
        }
        Ok(response)
    };
    let result =
        tokio_tungstenite::accept_hdr_async_with_config(io, callback, Some(config.tungstenite()))
            .await;
    match (result, refusal) {
        (Ok(ws), _) => Ok((WsStream::new(ws), forwarded)),
        (Err(_), Some(reason)) => Err(NetError::WsRefused { peer, reason }),
        (Err(source), None) => Err(NetError::WsHandshake {
            peer,
            source: Box::new(source),
        }),
    }
}

fn error_response(status: StatusCode, reason: &WsRefusal) -> ErrorResponse {
    let mut answer = ErrorResponse::new(Some(reason.to_string()));
    *answer.status_mut() = status;
    answer
}

/// The first of our subprotocols, in our preference order, that the client offers. The
/// header may repeat and each value is a comma-separated list (RFC 6455 §4.1).
fn pick_subprotocol(request: &Request) -> Option<&'static str> {
    let offered: Vec<&str> = request
        .headers()
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    SUBPROTOCOLS.into_iter().find(|ours| offered.contains(ours))
}

/// The last address in the last `X-Forwarded-For` header: the hop our proxy appended.
fn last_forwarded_for(request: &Request) -> Option<IpAddr> {
    let value = request
        .headers()
        .get_all("x-forwarded-for")
        .iter()
        .next_back()?
        .to_str()
        .ok()?;
    let entry = value.rsplit(',').next()?.trim();
    // Entries are bare addresses, but some proxies add a port ("1.2.3.4:5", "[::1]:5").
    entry
        .parse::<IpAddr>()
        .ok()
        .or_else(|| entry.parse::<SocketAddr>().ok().map(|a| a.ip()))
}

/// Opens a WebSocket over `io` as a client: requests `uri` (e.g. `ws://localhost/mqtt`; the
/// scheme and host only fill the HTTP request) offering `subprotocols`. For clients and tests.
///
/// # Errors
/// [`NetError::WsHandshake`] naming `peer` when the server refuses or the handshake fails.
pub async fn ws_connect<S>(
    io: S,
    uri: &str,
    subprotocols: &[&str],
    peer: SocketAddr,
) -> Result<WsStream<S>, NetError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let handshake_err = |source| NetError::WsHandshake {
        peer,
        source: Box::new(source),
    };
    let mut request = uri.into_client_request().map_err(handshake_err)?;
    if !subprotocols.is_empty() {
        let value = HeaderValue::from_str(&subprotocols.join(", "))
            .map_err(|e| handshake_err(tungstenite::Error::HttpFormat(e.into())))?;
        request
            .headers_mut()
            .insert(header::SEC_WEBSOCKET_PROTOCOL, value);
    }
    let config = WsConfig::default().tungstenite();
    let (ws, _response) = tokio_tungstenite::client_async_with_config(request, io, Some(config))
        .await
        .map_err(handshake_err)?;
    Ok(WsStream::new(ws))
}

/// A byte stream over a WebSocket ([`AsyncRead`] + [`AsyncWrite`]).
///
/// - Reading returns the payloads of successive binary messages as one byte stream. Ping and
///   pong are handled inside (a ping is answered on the next read or write), a close frame
///   or a closed connection reads as EOF, a text message is an `InvalidData` error (MQTT 5
///   §6.0: packets travel in binary frames only; the connection must be closed).
/// - Writing gathers bytes until `flush` (or 64 KiB) and sends them as one binary message, so
///   several MQTT packets written together travel in one frame. Call `flush`.
/// - `shutdown` sends a close frame.
#[derive(Debug)]
pub struct WsStream<S> {
    ws: WebSocketStream<S>,
    /// The unread rest of the current incoming binary message.
    read: Bytes,
    read_eof: bool,
    /// Bytes written but not yet handed to the WebSocket; empty Vecs do not allocate.
    write: Vec<u8>,
}

impl<S> WsStream<S> {
    fn new(ws: WebSocketStream<S>) -> Self {
        Self {
            ws,
            read: Bytes::new(),
            read_eof: false,
            write: Vec::new(),
        }
    }

    /// The underlying byte stream (e.g. the TLS stream of a `wss` connection).
    pub fn get_ref(&self) -> &S
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        self.ws.get_ref()
    }
}

fn to_io_error(e: tungstenite::Error) -> io::Error {
    match e {
        tungstenite::Error::Io(e) => e,
        tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed => {
            io::Error::new(io::ErrorKind::BrokenPipe, e)
        }
        other => io::Error::new(io::ErrorKind::InvalidData, other),
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> WsStream<S> {
    /// Hands the gathered write bytes to the WebSocket as one binary message.
    fn poll_send_gathered(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.write.is_empty() {
            return Poll::Ready(Ok(()));
        }
        ready!(Pin::new(&mut self.ws).poll_ready(cx)).map_err(to_io_error)?;
        let payload = Bytes::from(std::mem::take(&mut self.write));
        Pin::new(&mut self.ws)
            .start_send(Message::Binary(payload))
            .map_err(to_io_error)?;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for WsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.read.is_empty() {
                let n = this.read.len().min(buf.remaining());
                buf.put_slice(&this.read[..n]);
                this.read.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.read_eof || buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            match ready!(Pin::new(&mut this.ws).poll_next(cx)) {
                Some(Ok(Message::Binary(payload))) => this.read = payload,
                // tungstenite queues the pong itself and sends it with the next read or write.
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
                Some(Ok(Message::Text(_))) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "text WebSocket frame: MQTT travels in binary frames only",
                    )))
                }
                // tungstenite answers the close frame itself.
                Some(Ok(Message::Close(_)))
                | None
                | Some(Err(tungstenite::Error::ConnectionClosed)) => this.read_eof = true,
                Some(Err(e)) => return Poll::Ready(Err(to_io_error(e))),
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.write.len() >= WRITE_FRAME_MAX {
            ready!(this.poll_send_gathered(cx))?;
        }
        let n = buf.len().min(WRITE_FRAME_MAX - this.write.len());
        this.write.extend_from_slice(&buf[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        ready!(this.poll_send_gathered(cx))?;
        Pin::new(&mut this.ws).poll_flush(cx).map_err(to_io_error)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        ready!(this.poll_send_gathered(cx))?;
        Pin::new(&mut this.ws).poll_close(cx).map_err(to_io_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(headers: &[(&str, &str)]) -> Request {
        let mut builder = Request::builder().uri("/mqtt");
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn mqtt_is_picked_from_a_list_of_offered_subprotocols() {
        let r = request(&[("sec-websocket-protocol", "chat, mqtt")]);
        assert_eq!(pick_subprotocol(&r), Some("mqtt"));
        let r = request(&[("sec-websocket-protocol", "mqttv3.1")]);
        assert_eq!(pick_subprotocol(&r), Some("mqttv3.1"));
        let r = request(&[
            ("sec-websocket-protocol", "chat"),
            ("sec-websocket-protocol", "mqtt"),
        ]);
        assert_eq!(pick_subprotocol(&r), Some("mqtt"));
        assert_eq!(pick_subprotocol(&request(&[])), None);
        let r = request(&[("sec-websocket-protocol", "MQTTX")]);
        assert_eq!(pick_subprotocol(&r), None);
    }

    #[test]
    fn forwarded_for_takes_the_hop_our_proxy_appended() {
        let r = request(&[("x-forwarded-for", "6.6.6.6, 192.0.2.44")]);
        assert_eq!(last_forwarded_for(&r), "192.0.2.44".parse().ok());
        let r = request(&[("x-forwarded-for", "[2001:db8::5]:443")]);
        assert_eq!(last_forwarded_for(&r), "2001:db8::5".parse().ok());
        let r = request(&[("x-forwarded-for", "not-an-address")]);
        assert_eq!(last_forwarded_for(&r), None);
    }
}
