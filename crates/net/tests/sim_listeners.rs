//! MQTT listeners on the simulator: the same `MqttListener` code serves TCP with a PROXY
//! header, TLS over simulated TCP, and MQTT over the simulated QUIC path.
//!
//! Compiled only in the simulator build. From the repository root:
//! `RUSTFLAGS="--cfg madsim" cargo test -p starling-net --test sim_listeners`.
#![cfg(madsim)]

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use madsim::runtime::Handle;
use starling_net::{
    tls_connect, CertAuthority, ClientTls, ConnInfo, ListenerKind, ListenerSettings, MqttListener,
    ProxyProtocol, QuicBiStream, QuicConfig, QuicEndpoint, ServerTls, Transport, ALPN_MQTT,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const SERVER_IP: [u8; 4] = [10, 0, 2, 1];
const CLIENT_IP: [u8; 4] = [10, 0, 2, 2];

/// Starts an echoing listener on a new simulated server node; returns its address and a
/// channel of accepted connections' info.
async fn echo_node(
    port: u16,
    transport: Transport,
    settings: ListenerSettings,
) -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<ConnInfo>) {
    let addr = SocketAddr::new(IpAddr::from(SERVER_IP), port);
    let server = Handle::current()
        .create_node()
        .name(format!("server-{port}"))
        .ip(IpAddr::from(SERVER_IP))
        .build();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let (info_tx, info_rx) = tokio::sync::mpsc::unbounded_channel();
    drop(server.spawn(async move {
        let listener = MqttListener::bind(addr, transport, settings).await.unwrap();
        ready_tx.send(()).unwrap();
        while let Ok(pending) = listener.accept().await {
            let info_tx = info_tx.clone();
            drop(madsim::task::spawn(async move {
                let Ok((mut stream, info)) = pending.handshake().await else {
                    return;
                };
                // An echo authenticates no one: nothing to hold back.
                if let Some(cap) = stream.cap_release() {
                    cap.release();
                }
                let _ = info_tx.send(info);
                let mut buf = vec![0u8; 4096];
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
            }));
        }
    }));
    ready_rx.await.unwrap();
    (addr, info_rx)
}

async fn round_trip<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, message: &[u8]) {
    stream.write_all(message).await.unwrap();
    stream.flush().await.unwrap();
    let mut echoed = vec![0u8; message.len()];
    tokio::time::timeout(Duration::from_secs(30), stream.read_exact(&mut echoed))
        .await
        .expect("echo within 30 s")
        .unwrap();
    assert_eq!(echoed, message);
}

fn client_node() -> madsim::runtime::NodeHandle {
    Handle::current()
        .create_node()
        .name("client")
        .ip(IpAddr::from(CLIENT_IP))
        .build()
}

/// Goal: a PROXY v1 header on a simulated TCP connection gives the real client address, and
/// the MQTT bytes after it reach the broker intact.
#[madsim::test]
async fn sim_tcp_listener_reads_a_proxy_header() {
    let settings = ListenerSettings {
        proxy_protocol: Some(ProxyProtocol::default()),
        ..ListenerSettings::default()
    };
    let (addr, mut infos) = echo_node(1883, Transport::Tcp, settings).await;
    client_node()
        .spawn(async move {
            let mut tcp = starling_net::connect(addr).await.unwrap();
            tcp.write_all(b"PROXY TCP4 192.0.2.9 10.0.2.1 50000 1883\r\n")
                .await
                .unwrap();
            round_trip(&mut tcp, b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c").await;
        })
        .await
        .unwrap();
    let info = infos.recv().await.unwrap();
    assert_eq!(info.peer, "192.0.2.9:50000".parse().unwrap());
}

/// Goal: TLS (tokio-rustls) runs over the simulated TCP stream with a client certificate.
#[madsim::test]
async fn sim_tls_listener_echoes_with_a_client_certificate() {
    let ca = CertAuthority::generate("sim CA").unwrap();
    let server = ca.issue("broker", &["broker"]).unwrap().identity();
    let device = ca.issue("device-1", &["device-1"]).unwrap().identity();
    let tls = ServerTls::new(server).require_client_cert(vec![ca.cert_der()]);
    let (addr, mut infos) = echo_node(8883, Transport::Tls(tls), ListenerSettings::default()).await;
    let client_tls = ClientTls::new(vec![ca.cert_der()]).identity(device);
    client_node()
        .spawn(async move {
            let tcp = starling_net::connect(addr).await.unwrap();
            let mut tls = tls_connect(tcp, &client_tls, "broker", addr).await.unwrap();
            round_trip(&mut tls, &[7u8; 20_000]).await;
        })
        .await
        .unwrap();
    let info = infos.recv().await.unwrap();
    assert_eq!(info.kind, ListenerKind::Tls);
    assert_eq!(info.tls_client_cn.as_deref(), Some("device-1"));
}

/// Goal: MQTT over QUIC (first bidirectional stream) runs on the simulated QUIC path.
#[madsim::test]
async fn sim_quic_listener_echoes_on_the_first_stream() {
    let ca = CertAuthority::generate("sim CA").unwrap();
    let server = ca.issue("broker", &["broker"]).unwrap().identity();
    let mut config = QuicConfig::new([1; 32]);
    config.idle_timeout = Duration::from_secs(10);
    let (addr, mut infos) = echo_node(
        14567,
        Transport::Quic(ServerTls::new(server), config),
        ListenerSettings::default(),
    )
    .await;
    let client_tls = ClientTls::new(vec![ca.cert_der()]).alpn(&[ALPN_MQTT]);
    client_node()
        .spawn(async move {
            let bind = SocketAddr::new(IpAddr::from(CLIENT_IP), 0);
            let endpoint = QuicEndpoint::client(bind, &client_tls, &QuicConfig::new([2; 32]))
                .await
                .unwrap();
            let mut stream = QuicBiStream::connect(&endpoint, addr, "broker")
                .await
                .unwrap();
            round_trip(&mut stream, &[9u8; 50_000]).await;
            stream.shutdown().await.unwrap();
        })
        .await
        .unwrap();
    assert_eq!(infos.recv().await.unwrap().kind, ListenerKind::Quic);
}
