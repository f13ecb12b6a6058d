//! Loopback tests of the MQTT listeners: every kind accepts real clients over real sockets,
//! bad clients end only their own connection, and certificates reload under load.
#![cfg(not(madsim))]
// Tests drive the listeners from plain tokio tasks, as the broker's runtime will.
#![allow(clippy::disallowed_methods)]

use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use futures_util::{SinkExt, StreamExt};
use starling_net::{
    tls_connect, ws_connect, CertAuthority, ClientTls, ConnInfo, CounterSnapshot, HandshakeLimits,
    Identity, ListenerCounters, ListenerKind, ListenerSettings, MqttListener, NetError,
    ProxyProtocol, QuicBiStream, QuicConfig, QuicEndpoint, ServerTls, TlsReloader, Transport,
    WsConfig, ALPN_MQTT,
};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    sync::mpsc,
};
use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest, http::HeaderValue, Message};

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().expect("valid literal")
}

/// Bounds every wait so a broken handshake fails the test instead of hanging it.
async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within 20 s"))
}

/// A running listener that echoes every connection and reports each accepted one's
/// `ConnInfo`.
struct Echo {
    addr: SocketAddr,
    counters: Arc<ListenerCounters>,
    reloader: Option<TlsReloader>,
    infos: mpsc::UnboundedReceiver<ConnInfo>,
}

impl Echo {
    async fn start(transport: Transport, settings: ListenerSettings) -> Self {
        let listener = MqttListener::bind(any_port(), transport, settings)
            .await
            .unwrap();
        let (tx, infos) = mpsc::unbounded_channel();
        let echo = Echo {
            addr: listener.local_addr(),
            counters: listener.counters(),
            reloader: listener.tls_reloader(),
            infos,
        };
        tokio::spawn(async move {
            loop {
                let Ok(pending) = listener.accept().await else {
                    return;
                };
                let tx = tx.clone();
                tokio::spawn(async move {
                    let Ok((mut stream, info)) = pending.handshake().await else {
                        return;
                    };
                    // An echo authenticates no one: nothing to hold back.
                    if let Some(cap) = stream.cap_release() {
                        cap.release();
                    }
                    assert_eq!(stream.kind(), info.kind);
                    let _ = tx.send(info);
                    let mut buf = vec![0u8; 8192];
                    loop {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                stream.write_all(&buf[..n]).await.unwrap();
                                stream.flush().await.unwrap();
                            }
                        }
                    }
                    let _ = stream.shutdown().await;
                });
            }
        });
        echo
    }

    async fn info(&mut self) -> ConnInfo {
        within("connection info", self.infos.recv())
            .await
            .expect("listener task alive")
    }

    /// Waits until the counters satisfy `done` (they move in the connection's task).
    async fn counters_until(&self, done: impl Fn(&CounterSnapshot) -> bool) -> CounterSnapshot {
        within("counters", async {
            loop {
                let now = self.counters.snapshot();
                if done(&now) {
                    return now;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
    }
}

/// Writes `message`, then reads the echo back, on one byte stream.
async fn round_trip<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, message: &[u8]) {
    stream.write_all(message).await.unwrap();
    stream.flush().await.unwrap();
    let mut echoed = vec![0u8; message.len()];
    within("echo", stream.read_exact(&mut echoed))
        .await
        .unwrap();
    assert_eq!(echoed, message);
}

fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

struct Pki {
    ca: CertAuthority,
    server: Identity,
}

fn pki(name: &str) -> Pki {
    let ca = CertAuthority::generate(name).unwrap();
    let server = ca.issue("broker", &["localhost"]).unwrap().identity();
    Pki { ca, server }
}

async fn tls_client(
    addr: SocketAddr,
    client: &ClientTls,
) -> Result<starling_net::ClientTlsStream<starling_net::Stream>, NetError> {
    let tcp = starling_net::connect(addr).await?;
    tls_connect(tcp, client, "localhost", addr).await
}

#[tokio::test]
async fn tls_echo_without_client_certificate() {
    let pki = pki("ca");
    let mut echo = Echo::start(
        Transport::Tls(ServerTls::new(pki.server.clone())),
        ListenerSettings::default(),
    )
    .await;
    let mut client = tls_client(echo.addr, &ClientTls::new(vec![pki.ca.cert_der()]))
        .await
        .unwrap();
    round_trip(&mut client, &payload(100_000)).await;
    let info = echo.info().await;
    assert_eq!(info.kind, ListenerKind::Tls);
    assert_eq!(info.tls_client_cn, None);
    assert_eq!(info.peer, info.transport_peer);
    assert_eq!(info.local, echo.addr);
}

#[tokio::test]
async fn tls_client_certificate_common_name_is_exposed() {
    let pki = pki("ca");
    let mut echo = Echo::start(
        Transport::Tls(
            ServerTls::new(pki.server.clone()).require_client_cert(vec![pki.ca.cert_der()]),
        ),
        ListenerSettings::default(),
    )
    .await;
    let device = pki.ca.issue("device-7", &["device-7"]).unwrap().identity();
    let tls = ClientTls::new(vec![pki.ca.cert_der()]).identity(device);
    let mut client = tls_client(echo.addr, &tls).await.unwrap();
    round_trip(&mut client, b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c").await;
    assert_eq!(echo.info().await.tls_client_cn.as_deref(), Some("device-7"));
}

#[tokio::test]
async fn tls_client_certificate_from_another_ca_is_refused_and_others_are_still_served() {
    let pki = pki("ca");
    let echo = Echo::start(
        Transport::Tls(
            ServerTls::new(pki.server.clone()).require_client_cert(vec![pki.ca.cert_der()]),
        ),
        ListenerSettings::default(),
    )
    .await;
    let rogue_ca = CertAuthority::generate("rogue").unwrap();
    let rogue = rogue_ca
        .issue("device-7", &["device-7"])
        .unwrap()
        .identity();
    let bad = ClientTls::new(vec![pki.ca.cert_der()]).identity(rogue);
    // In TLS 1.3 the client may finish its side before the server checks the certificate:
    // the refusal then shows on the first read.
    if let Ok(mut client) = tls_client(echo.addr, &bad).await {
        let _ = client.write_all(b"hello").await;
        let _ = client.flush().await;
        let mut buf = [0u8; 5];
        let read = within("refused read", client.read(&mut buf)).await;
        assert!(!matches!(read, Ok(n) if n > 0), "rogue client got data");
    }
    // No client certificate at all is refused too.
    let anonymous = ClientTls::new(vec![pki.ca.cert_der()]);
    if let Ok(mut client) = tls_client(echo.addr, &anonymous).await {
        let mut buf = [0u8; 1];
        let read = within("refused read", client.read(&mut buf)).await;
        assert!(!matches!(read, Ok(n) if n > 0), "anonymous client got data");
    }
    echo.counters_until(|c| c.handshake_failed == 2).await;

    let good = pki.ca.issue("device-8", &["device-8"]).unwrap().identity();
    let tls = ClientTls::new(vec![pki.ca.cert_der()]).identity(good);
    let mut client = tls_client(echo.addr, &tls).await.unwrap();
    round_trip(&mut client, b"still serving").await;
    let c = echo.counters_until(|c| c.accepted == 1).await;
    assert_eq!((c.handshake_failed, c.timed_out), (2, 0));
}

#[tokio::test]
async fn tls_reload_switches_certificate_for_new_connections_and_keeps_old_ones() {
    let old = pki("old-ca");
    let new = pki("new-ca");
    let echo = Echo::start(
        Transport::Tls(ServerTls::new(old.server.clone())),
        ListenerSettings::default(),
    )
    .await;
    let trusts_old = ClientTls::new(vec![old.ca.cert_der()]);
    let trusts_new = ClientTls::new(vec![new.ca.cert_der()]);
    let mut before = tls_client(echo.addr, &trusts_old).await.unwrap();
    round_trip(&mut before, b"before reload").await;

    echo.reloader
        .as_ref()
        .expect("a TLS listener has a reloader")
        .reload(&ServerTls::new(new.server.clone()))
        .unwrap();

    let err = tls_client(echo.addr, &trusts_old).await.unwrap_err();
    assert!(matches!(err, NetError::TlsHandshake { .. }), "{err}");
    let mut after = tls_client(echo.addr, &trusts_new).await.unwrap();
    round_trip(&mut after, b"after reload").await;
    round_trip(&mut before, b"old connection still works").await;
}

#[tokio::test]
async fn tls_garbage_ends_only_that_connection() {
    let pki = pki("ca");
    let echo = Echo::start(
        Transport::Tls(ServerTls::new(pki.server.clone())),
        ListenerSettings::default(),
    )
    .await;
    let mut garbage = starling_net::connect(echo.addr).await.unwrap();
    garbage
        .write_all(b"\x10\x0c\x00\x04MQTT plain text on a TLS port")
        .await
        .unwrap();
    garbage.flush().await.unwrap();
    let mut rest = Vec::new();
    // The server answers with an alert or just closes: either way the stream ends.
    let _ = within("garbage connection closed", garbage.read_to_end(&mut rest)).await;
    echo.counters_until(|c| c.handshake_failed == 1).await;

    let mut client = tls_client(echo.addr, &ClientTls::new(vec![pki.ca.cert_der()]))
        .await
        .unwrap();
    round_trip(&mut client, b"fine").await;
}

#[tokio::test]
async fn handshake_timeout_and_in_flight_limit_bound_slow_clients() {
    let pki = pki("ca");
    let echo = Echo::start(
        Transport::Tls(ServerTls::new(pki.server.clone())),
        ListenerSettings {
            limits: HandshakeLimits {
                handshakes_in_flight_max: 1,
                handshake_timeout: Duration::from_millis(500),
            },
            proxy_protocol: None,
        },
    )
    .await;
    // A client that connects and says nothing holds the only handshake slot...
    let mut silent = starling_net::connect(echo.addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // ...so the next one waits in the accept queue (not refused)...
    let started = tokio::time::Instant::now();
    let addr = echo.addr;
    let ca = pki.ca.cert_der();
    let waiting = tokio::spawn(async move { tls_client(addr, &ClientTls::new(vec![ca])).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "a handshake ran past the limit");
    assert_eq!(echo.counters.snapshot().accepted, 0);
    // ...until the silent one times out; then it is served.
    let mut rest = Vec::new();
    let _ = within("silent connection closed", silent.read_to_end(&mut rest)).await;
    let mut client = within("waiting client served", waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
    let c = echo
        .counters_until(|c| c.timed_out == 1 && c.accepted == 1)
        .await;
    assert_eq!(c.handshake_failed, 0);
    round_trip(&mut client, b"served after the slow ones").await;
}

/// A raw WebSocket client (frames under the test's control) offering `subprotocol`.
async fn raw_ws(
    addr: SocketAddr,
    path: &str,
    subprotocol: Option<&str>,
    forwarded_for: Option<&str>,
) -> Result<tokio_tungstenite::WebSocketStream<starling_net::Stream>, tungstenite::Error> {
    let mut request = format!("ws://localhost{path}").into_client_request()?;
    if let Some(p) = subprotocol {
        request
            .headers_mut()
            .insert("sec-websocket-protocol", HeaderValue::from_str(p).unwrap());
    }
    if let Some(f) = forwarded_for {
        request
            .headers_mut()
            .insert("x-forwarded-for", HeaderValue::from_str(f).unwrap());
    }
    let tcp = starling_net::connect(addr).await.unwrap();
    let (ws, _) = tokio_tungstenite::client_async(request, tcp).await?;
    Ok(ws)
}

#[tokio::test]
async fn ws_echoes_packets_split_across_frames_and_packed_into_one() {
    let mut echo = Echo::start(
        Transport::Ws(WsConfig::default()),
        ListenerSettings::default(),
    )
    .await;
    let mut ws = raw_ws(echo.addr, "/mqtt", Some("mqtt"), None)
        .await
        .unwrap();
    // Three small MQTT packets (PINGREQ-like and a PUBLISH), cut at arbitrary places.
    let stream: Vec<u8> = [
        &b"\x30\x0a\x00\x03a/bhello"[..],
        b"\xc0\x00",
        b"\x30\x0a\x00\x03c/dworld",
    ]
    .concat();
    for frame in [&stream[..3], &stream[3..16], &stream[16..]] {
        ws.send(Message::Binary(frame.to_vec().into()))
            .await
            .unwrap();
    }
    ws.send(Message::Ping(b"are you there".to_vec().into()))
        .await
        .unwrap();
    let mut echoed = Vec::new();
    let mut ponged = false;
    while echoed.len() < stream.len() || !ponged {
        match within("ws echo", ws.next()).await.unwrap().unwrap() {
            Message::Binary(b) => echoed.extend_from_slice(&b),
            Message::Pong(p) => {
                assert_eq!(&p[..], b"are you there");
                ponged = true;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(echoed, stream);
    let info = echo.info().await;
    assert_eq!(info.kind, ListenerKind::Ws);
    // A close frame reads as EOF on the server, which shuts down with a close of its own.
    ws.close(None).await.unwrap();
    while let Some(Ok(m)) = within("ws close", ws.next()).await {
        assert!(matches!(m, Message::Close(_)), "{m:?}");
    }
}

#[tokio::test]
async fn ws_upgrade_without_mqtt_subprotocol_or_on_another_path_is_refused() {
    let echo = Echo::start(
        Transport::Ws(WsConfig::default()),
        ListenerSettings::default(),
    )
    .await;
    let status = |e: tungstenite::Error| match e {
        tungstenite::Error::Http(response) => response.status().as_u16(),
        other => panic!("expected an HTTP refusal, got {other}"),
    };
    let err = raw_ws(echo.addr, "/mqtt", None, None).await.unwrap_err();
    assert_eq!(status(err), 400);
    let err = raw_ws(echo.addr, "/mqtt", Some("chat"), None)
        .await
        .unwrap_err();
    assert_eq!(status(err), 400);
    let err = raw_ws(echo.addr, "/other", Some("mqtt"), None)
        .await
        .unwrap_err();
    assert_eq!(status(err), 404);
    echo.counters_until(|c| c.handshake_failed == 3).await;

    let tcp = starling_net::connect(echo.addr).await.unwrap();
    let mut ws = ws_connect(tcp, "ws://localhost/mqtt", &["mqtt"], echo.addr)
        .await
        .unwrap();
    round_trip(&mut ws, &payload(200_000)).await;
}

#[tokio::test]
async fn ws_client_address_comes_from_x_forwarded_for_when_trusted() {
    let config = WsConfig {
        trust_x_forwarded_for: true,
        ..WsConfig::default()
    };
    let mut echo = Echo::start(Transport::Ws(config), ListenerSettings::default()).await;
    let mut ws = raw_ws(
        echo.addr,
        "/mqtt",
        Some("mqtt"),
        Some("10.9.9.9, 192.0.2.33"),
    )
    .await
    .unwrap();
    ws.send(Message::Binary(b"x".to_vec().into()))
        .await
        .unwrap();
    let info = echo.info().await;
    assert_eq!(info.peer, SocketAddr::new(IpAddr::from([192, 0, 2, 33]), 0));
    assert_eq!(info.transport_peer.ip(), IpAddr::from([127, 0, 0, 1]));
}

#[tokio::test]
async fn wss_echo_with_client_certificate() {
    let pki = pki("ca");
    let mut echo = Echo::start(
        Transport::Wss(
            ServerTls::new(pki.server.clone()).optional_client_cert(vec![pki.ca.cert_der()]),
            WsConfig::default(),
        ),
        ListenerSettings::default(),
    )
    .await;
    let device = pki
        .ca
        .issue("browser-1", &["browser-1"])
        .unwrap()
        .identity();
    let tls = tls_client(
        echo.addr,
        &ClientTls::new(vec![pki.ca.cert_der()]).identity(device),
    )
    .await
    .unwrap();
    let mut ws = ws_connect(tls, "wss://localhost/mqtt", &["mqtt"], echo.addr)
        .await
        .unwrap();
    round_trip(&mut ws, &payload(150_000)).await;
    let info = echo.info().await;
    assert_eq!(info.kind, ListenerKind::Wss);
    assert_eq!(info.tls_client_cn.as_deref(), Some("browser-1"));

    // With an optional client certificate, a client without one is served as well.
    let tls = tls_client(echo.addr, &ClientTls::new(vec![pki.ca.cert_der()]))
        .await
        .unwrap();
    let mut ws = ws_connect(tls, "wss://localhost/mqtt", &["mqtt"], echo.addr)
        .await
        .unwrap();
    round_trip(&mut ws, b"anonymous").await;
    assert_eq!(echo.info().await.tls_client_cn, None);
}

fn quic_config(seed: u8) -> QuicConfig {
    QuicConfig {
        idle_timeout: Duration::from_secs(10),
        keep_alive_interval: None,
        ..QuicConfig::new([seed; 32])
    }
}

#[tokio::test]
async fn quic_first_stream_carries_an_echoed_byte_stream() {
    let pki = pki("ca");
    let mut echo = Echo::start(
        Transport::Quic(ServerTls::new(pki.server.clone()), quic_config(1)),
        ListenerSettings::default(),
    )
    .await;
    let client_tls = ClientTls::new(vec![pki.ca.cert_der()]).alpn(&[ALPN_MQTT]);
    let endpoint = QuicEndpoint::client(any_port(), &client_tls, &quic_config(2))
        .await
        .unwrap();
    let mut stream = QuicBiStream::connect(&endpoint, echo.addr, "localhost")
        .await
        .unwrap();
    let message = payload(300_000);
    round_trip(&mut stream, &message).await;
    stream.shutdown().await.unwrap();
    let mut rest = Vec::new();
    within("quic eof", stream.read_to_end(&mut rest))
        .await
        .unwrap();
    assert!(rest.is_empty());
    let info = echo.info().await;
    assert_eq!(info.kind, ListenerKind::Quic);
    assert_eq!(info.peer, endpoint.local_addr());
}

#[tokio::test]
async fn quic_garbage_datagrams_and_a_wrong_alpn_end_only_those_attempts() {
    let pki = pki("ca");
    let echo = Echo::start(
        Transport::Quic(ServerTls::new(pki.server.clone()), quic_config(3)),
        ListenerSettings::default(),
    )
    .await;
    let udp = tokio::net::UdpSocket::bind(any_port()).await.unwrap();
    for len in [1usize, 20, 1200, 1500] {
        let junk: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
        udp.send_to(&junk, echo.addr).await.unwrap();
    }
    // A QUIC client offering another protocol fails its handshake.
    let wrong = ClientTls::new(vec![pki.ca.cert_der()]).alpn(&[b"h3"]);
    let endpoint = QuicEndpoint::client(any_port(), &wrong, &quic_config(4))
        .await
        .unwrap();
    let err = endpoint.connect(echo.addr, "localhost").await.unwrap_err();
    assert!(matches!(err, NetError::QuicConnection(_)), "{err}");

    let good = ClientTls::new(vec![pki.ca.cert_der()]).alpn(&[ALPN_MQTT]);
    let endpoint = QuicEndpoint::client(any_port(), &good, &quic_config(5))
        .await
        .unwrap();
    let mut stream = QuicBiStream::connect(&endpoint, echo.addr, "localhost")
        .await
        .unwrap();
    round_trip(&mut stream, b"still serving").await;
    echo.counters_until(|c| c.accepted == 1).await;
}

#[tokio::test]
async fn quic_reload_switches_certificate_for_new_connections() {
    let old = pki("old-ca");
    let new = pki("new-ca");
    let echo = Echo::start(
        Transport::Quic(ServerTls::new(old.server.clone()), quic_config(6)),
        ListenerSettings::default(),
    )
    .await;
    let trusts_old = ClientTls::new(vec![old.ca.cert_der()]).alpn(&[ALPN_MQTT]);
    let old_client = QuicEndpoint::client(any_port(), &trusts_old, &quic_config(7))
        .await
        .unwrap();
    let mut before = QuicBiStream::connect(&old_client, echo.addr, "localhost")
        .await
        .unwrap();
    round_trip(&mut before, b"before").await;
    echo.reloader
        .as_ref()
        .unwrap()
        .reload(&ServerTls::new(new.server.clone()))
        .unwrap();
    assert!(old_client.connect(echo.addr, "localhost").await.is_err());
    let trusts_new = ClientTls::new(vec![new.ca.cert_der()]).alpn(&[ALPN_MQTT]);
    let new_client = QuicEndpoint::client(any_port(), &trusts_new, &quic_config(8))
        .await
        .unwrap();
    let mut after = QuicBiStream::connect(&new_client, echo.addr, "localhost")
        .await
        .unwrap();
    round_trip(&mut after, b"after").await;
    round_trip(&mut before, b"old still works").await;
}

#[tokio::test]
async fn proxy_v1_and_v2_headers_give_the_real_client_address_on_tcp() {
    let mut echo = Echo::start(
        Transport::Tcp,
        ListenerSettings {
            proxy_protocol: Some(ProxyProtocol::default()),
            ..ListenerSettings::default()
        },
    )
    .await;
    let mut v1 = starling_net::connect(echo.addr).await.unwrap();
    // The header and the first MQTT bytes in one write: the reader must not eat the latter.
    v1.write_all(b"PROXY TCP4 203.0.113.5 10.0.0.1 51000 1883\r\n\x10\x02")
        .await
        .unwrap();
    v1.flush().await.unwrap();
    let mut echoed = [0u8; 2];
    within("v1 echo", v1.read_exact(&mut echoed)).await.unwrap();
    assert_eq!(&echoed, b"\x10\x02");
    let info = echo.info().await;
    assert_eq!(info.peer, "203.0.113.5:51000".parse().unwrap());
    assert_eq!(info.transport_peer.ip(), IpAddr::from([127, 0, 0, 1]));

    let mut v2 = starling_net::connect(echo.addr).await.unwrap();
    let mut header = b"\r\n\r\n\0\r\nQUIT\n\x21\x21\x00\x24".to_vec();
    header.extend_from_slice(
        &"2001:db8::77"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets(),
    );
    header.extend_from_slice(
        &"2001:db8::1"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets(),
    );
    header.extend_from_slice(&4242u16.to_be_bytes());
    header.extend_from_slice(&1883u16.to_be_bytes());
    v2.write_all(&header).await.unwrap();
    round_trip(&mut v2, b"\xc0\x00").await;
    assert_eq!(
        echo.info().await.peer,
        "[2001:db8::77]:4242".parse().unwrap()
    );

    // A connection without a header is ended; the listener goes on.
    let mut bare = starling_net::connect(echo.addr).await.unwrap();
    bare.write_all(b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c")
        .await
        .unwrap();
    bare.flush().await.unwrap();
    let mut rest = Vec::new();
    let _ = within("bare connection closed", bare.read_to_end(&mut rest)).await;
    assert!(rest.is_empty());
    echo.counters_until(|c| c.handshake_failed == 1 && c.accepted == 2)
        .await;
}

#[tokio::test]
async fn proxy_header_then_tls_on_a_tls_listener() {
    let pki = pki("ca");
    let mut echo = Echo::start(
        Transport::Tls(ServerTls::new(pki.server.clone())),
        ListenerSettings {
            proxy_protocol: Some(ProxyProtocol::default()),
            ..ListenerSettings::default()
        },
    )
    .await;
    let mut tcp = starling_net::connect(echo.addr).await.unwrap();
    tcp.write_all(b"PROXY TCP4 198.51.100.20 10.0.0.1 40000 8883\r\n")
        .await
        .unwrap();
    tcp.flush().await.unwrap();
    let mut tls = tls_connect(
        tcp,
        &ClientTls::new(vec![pki.ca.cert_der()]),
        "localhost",
        echo.addr,
    )
    .await
    .unwrap();
    round_trip(&mut tls, b"behind a proxy").await;
    assert_eq!(
        echo.info().await.peer,
        "198.51.100.20:40000".parse().unwrap()
    );
}

#[tokio::test]
async fn proxy_protocol_on_quic_is_a_config_error() {
    let pki = pki("ca");
    let err = MqttListener::bind(
        any_port(),
        Transport::Quic(ServerTls::new(pki.server), quic_config(9)),
        ListenerSettings {
            proxy_protocol: Some(ProxyProtocol::default()),
            ..ListenerSettings::default()
        },
    )
    .await
    .unwrap_err();
    assert!(matches!(err, NetError::ListenerConfig { .. }), "{err}");
}

#[tokio::test]
async fn ws_text_frame_ends_the_connection() {
    let echo = Echo::start(
        Transport::Ws(WsConfig::default()),
        ListenerSettings::default(),
    )
    .await;
    let mut ws = raw_ws(echo.addr, "/mqtt", Some("mqtt"), None)
        .await
        .unwrap();
    // MQTT 5 §6.0: packets travel in binary frames; anything else closes the connection.
    ws.send(Message::Text("\u{10}\u{0}".into())).await.unwrap();
    match within("server ends the connection", ws.next()).await {
        None | Some(Err(_)) | Some(Ok(Message::Close(_))) => {}
        Some(Ok(other)) => panic!("echoed a text frame: {other:?}"),
    }
    echo.counters_until(|c| c.accepted == 1).await;
}

#[tokio::test]
async fn ws_reads_before_the_cap_is_released_stop_at_preauth_bytes_max() {
    // An unauthenticated WebSocket client sends one message far larger than the cap: the
    // listener's stream buffers at most the cap (the message never completes) until the
    // cap is released, then the message arrives whole.
    let config = WsConfig {
        preauth_bytes_max: 8 * 1024,
        ..WsConfig::default()
    };
    let listener = MqttListener::bind(
        any_port(),
        Transport::Ws(config),
        ListenerSettings::default(),
    )
    .await
    .unwrap();
    let addr = listener.local_addr();
    let server = tokio::spawn(async move {
        let pending = listener.accept().await.unwrap();
        let (mut stream, _) = pending.handshake().await.unwrap();
        let cap = stream.cap_release().expect("a WebSocket stream is capped");
        let mut first = [0u8; 1];
        let early =
            tokio::time::timeout(Duration::from_millis(300), stream.read_exact(&mut first)).await;
        assert!(
            early.is_err(),
            "nothing past the cap is read before release"
        );
        cap.release();
        let mut all = vec![0u8; 100_000];
        within("the released read", stream.read_exact(&mut all))
            .await
            .unwrap();
        all
    });
    let tcp = starling_net::connect(addr).await.unwrap();
    let mut ws = ws_connect(tcp, "ws://localhost/mqtt", &["mqtt"], addr)
        .await
        .unwrap();
    let sent = payload(100_000);
    ws.write_all(&sent).await.unwrap();
    ws.flush().await.unwrap();
    assert_eq!(within("the server", server).await.unwrap(), sent);
}

#[tokio::test]
async fn quic_data_before_the_cap_is_released_stops_at_the_preauth_receive_window() {
    // A QUIC client that has not authenticated cannot make the endpoint buffer more than
    // the pre-authentication receive window: its writes block on flow control until the
    // window is raised, then everything arrives.
    let pki = pki("ca");
    let mut config = quic_config(6);
    config.preauth_receive_window = Some(8 * 1024);
    let listener = MqttListener::bind(
        any_port(),
        Transport::Quic(ServerTls::new(pki.server.clone()), config),
        ListenerSettings::default(),
    )
    .await
    .unwrap();
    let addr = listener.local_addr();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let pending = listener.accept().await.unwrap();
        let (mut stream, _) = pending.handshake().await.unwrap();
        let cap = stream.cap_release().expect("a QUIC stream is capped");
        go_rx.await.unwrap();
        cap.release();
        let mut all = vec![0u8; 200_000];
        within("the released read", stream.read_exact(&mut all))
            .await
            .unwrap();
        all
    });
    let client_tls = ClientTls::new(vec![pki.ca.cert_der()]).alpn(&[ALPN_MQTT]);
    let endpoint = QuicEndpoint::client(any_port(), &client_tls, &quic_config(7))
        .await
        .unwrap();
    let mut stream = QuicBiStream::connect(&endpoint, addr, "localhost")
        .await
        .unwrap();
    let sent = payload(200_000);
    let to_send = sent.clone();
    let mut writer = tokio::spawn(async move {
        stream.write_all(&to_send).await?;
        stream.flush().await?;
        std::io::Result::Ok(stream)
    });
    let early = tokio::time::timeout(Duration::from_millis(500), &mut writer).await;
    assert!(
        early.is_err(),
        "the write is held by flow control before release"
    );
    go_tx.send(()).unwrap();
    // The rest of the write goes once the window is raised.
    let _stream = within("the write", writer).await.unwrap().unwrap();
    assert_eq!(within("the server", server).await.unwrap(), sent);
}
