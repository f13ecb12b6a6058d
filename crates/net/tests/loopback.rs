//! Production loopback tests of the transport seam: real sockets on 127.0.0.1.
#![cfg(not(madsim))]
// Tests drive the seam from plain tokio tasks, like the runtime crate will.
#![allow(clippy::disallowed_methods)]

use std::{net::SocketAddr, time::Duration};

use starling_net::{
    CertAuthority, ClientTls, NetError, QuicConfig, QuicConnection, QuicEndpoint, ServerTls,
    ALPN_RAFT,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LOCALHOST: &str = "127.0.0.1:0";

fn any_port() -> SocketAddr {
    LOCALHOST.parse().expect("valid literal")
}

/// Bounds every wait so a broken handshake fails the test instead of hanging it.
async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within 20 s"))
}

#[tokio::test]
async fn tcp_echo_round_trips_bytes_over_loopback() {
    let listener = starling_net::listen(any_port()).await.unwrap();
    let addr = listener.local_addr();
    let server = tokio::spawn(async move {
        let (mut stream, peer) = listener.accept().await.unwrap();
        assert_eq!(stream.peer_addr(), peer);
        let mut buf = vec![0u8; 4096];
        loop {
            let n = stream.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            stream.write_all(&buf[..n]).await.unwrap();
            stream.flush().await.unwrap();
        }
    });

    let mut client = starling_net::connect(addr).await.unwrap();
    let message: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    client.write_all(&message).await.unwrap();
    client.flush().await.unwrap();
    client.shutdown().await.unwrap();
    let mut echoed = Vec::new();
    within("tcp echo", client.read_to_end(&mut echoed))
        .await
        .unwrap();
    assert_eq!(echoed, message);
    server.await.unwrap();
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn an_accepted_connection_knows_when_its_bytes_reached_the_host_not_when_they_were_read() {
    let listener = starling_net::listen(any_port()).await.unwrap();
    let addr = listener.local_addr();
    let mut client = starling_net::connect(addr).await.unwrap();
    let (mut stream, _) = listener.accept().await.unwrap();
    assert_eq!(stream.received_at(), None, "nothing read yet");
    // The kernel turns its receive stamping on from a work queue when the first socket
    // asks for it: until then segments come unstamped (and the broker uses its own clock).
    tokio::time::sleep(Duration::from_millis(50)).await;
    let sent = std::time::SystemTime::now();
    client.write_all(b"first").await.unwrap();
    client.flush().await.unwrap();
    // The bytes wait in the kernel while the reader is busy elsewhere.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut buf = [0u8; 16];
    let n = within("read", stream.read(&mut buf)).await.unwrap();
    assert_eq!(&buf[..n], b"first");
    let read = std::time::SystemTime::now();
    let at = stream
        .received_at()
        .expect("the kernel stamps an accepted connection");
    let after_send = at
        .duration_since(sent)
        .expect("stamped after the write began");
    assert!(
        read.duration_since(at).unwrap() >= Duration::from_millis(90),
        "stamped {after_send:?} after the write, not when read"
    );
    // A later read carries its own bytes' time.
    client.write_all(b"second").await.unwrap();
    client.flush().await.unwrap();
    let n = within("read", stream.read(&mut buf)).await.unwrap();
    assert_eq!(&buf[..n], b"second");
    assert!(stream.received_at().unwrap() > at);
    // The dialling side is not stamped: its reads cost what they did.
    stream.write_all(b"back").await.unwrap();
    stream.flush().await.unwrap();
    let n = within("read", client.read(&mut buf)).await.unwrap();
    assert_eq!(&buf[..n], b"back");
    assert_eq!(client.received_at(), None);
}

#[tokio::test]
async fn tcp_connect_to_a_closed_port_names_the_address() {
    // Bind then drop to find a port that nobody listens on.
    let addr = starling_net::listen(any_port()).await.unwrap().local_addr();
    let err = starling_net::connect(addr).await.unwrap_err();
    assert!(
        matches!(err, NetError::Connect { addr: a, .. } if a == addr),
        "{err}"
    );
}

struct Cluster {
    ca: CertAuthority,
    server: QuicEndpoint,
}

fn config(seed: u8) -> QuicConfig {
    QuicConfig::new([seed; 32])
}

/// A mutual-TLS server endpoint named `node-1` that echoes every bidirectional stream of every
/// connection it accepts, and counts failed handshakes on `refused`.
async fn echo_server() -> (Cluster, tokio::sync::mpsc::UnboundedReceiver<NetError>) {
    let ca = CertAuthority::generate("starling test CA").unwrap();
    let node = ca.issue("node-1", &["node-1", "127.0.0.1"]).unwrap();
    let tls = ServerTls::new(node.identity())
        .require_client_cert(vec![ca.cert_der()])
        .alpn(&[ALPN_RAFT]);
    let server = QuicEndpoint::server(any_port(), &tls, &config(1))
        .await
        .unwrap();
    let (refused_tx, refused) = tokio::sync::mpsc::unbounded_channel();
    let acceptor = server.clone();
    tokio::spawn(async move {
        while let Some(incoming) = acceptor.accept().await {
            let refused_tx = refused_tx.clone();
            tokio::spawn(async move {
                match incoming.handshake().await {
                    Ok(conn) => echo_streams(conn).await,
                    Err(e) => {
                        let _ = refused_tx.send(e);
                    }
                }
            });
        }
    });
    (Cluster { ca, server }, refused)
}

async fn echo_streams(conn: QuicConnection) {
    assert!(
        conn.peer_certificates().is_some(),
        "mutual TLS gives a peer chain"
    );
    while let Ok((mut send, mut recv)) = conn.accept_bi().await {
        tokio::spawn(async move {
            let mut data = Vec::new();
            recv.read_to_end(&mut data).await.unwrap();
            send.write_all(&data).await.unwrap();
            send.finish().unwrap();
        });
    }
}

#[tokio::test]
async fn quic_mutual_tls_echoes_concurrent_streams() {
    let (cluster, _refused) = echo_server().await;
    let client_node = cluster.ca.issue("node-2", &["node-2"]).unwrap();
    let tls = ClientTls::new(vec![cluster.ca.cert_der()])
        .identity(client_node.identity())
        .alpn(&[ALPN_RAFT]);
    let client = QuicEndpoint::client(any_port(), &tls, &config(2))
        .await
        .unwrap();

    let conn = within(
        "handshake",
        client.connect(cluster.server.local_addr(), "node-1"),
    )
    .await
    .unwrap();
    assert_eq!(conn.alpn_protocol().as_deref(), Some(ALPN_RAFT));
    assert_eq!(conn.remote_address(), cluster.server.local_addr());
    assert_eq!(conn.peer_certificates().map(|c| c.len()), Some(1));

    let streams = (0..16u8).map(|i| {
        let conn = conn.clone();
        async move {
            let (mut send, mut recv) = conn.open_bi().await.unwrap();
            let message = vec![i; 64 * 1024];
            send.write_all(&message).await.unwrap();
            send.finish().unwrap();
            let mut echoed = Vec::new();
            recv.read_to_end(&mut echoed).await.unwrap();
            assert_eq!(echoed, message, "stream {i}");
        }
    });
    within("16 echoed streams", futures_join_all(streams)).await;

    conn.close(0, b"done");
    client.wait_idle().await;
}

/// Runs futures concurrently on this task (no extra dependency for `join_all`).
async fn futures_join_all<F: std::future::Future<Output = ()> + Send + 'static>(
    futures: impl Iterator<Item = F>,
) {
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    for handle in handles {
        handle.await.unwrap();
    }
}

/// The client's view of a refused handshake: either `connect` fails, or (TLS 1.3 lets the
/// client finish before the server checks its certificate) the connection closes right after.
async fn client_sees_refusal(client: &QuicEndpoint, server: SocketAddr) -> NetError {
    match within("handshake", client.connect(server, "node-1")).await {
        Err(e) => e,
        Ok(conn) => within("close after refusal", conn.closed()).await,
    }
}

#[tokio::test]
async fn quic_client_with_cert_from_another_ca_is_refused() {
    let (cluster, mut refused) = echo_server().await;
    let rogue_ca = CertAuthority::generate("rogue CA").unwrap();
    let rogue = rogue_ca.issue("node-9", &["node-9"]).unwrap();
    // The rogue client trusts the real CA, so only the server's check can stop it.
    let tls = ClientTls::new(vec![cluster.ca.cert_der()])
        .identity(rogue.identity())
        .alpn(&[ALPN_RAFT]);
    let client = QuicEndpoint::client(any_port(), &tls, &config(3))
        .await
        .unwrap();

    let client_err = client_sees_refusal(&client, cluster.server.local_addr()).await;
    assert!(
        matches!(client_err, NetError::QuicConnection(_)),
        "{client_err}"
    );
    let server_err = within("server refusal", refused.recv()).await.unwrap();
    assert!(
        matches!(server_err, NetError::QuicConnection(_)),
        "{server_err}"
    );
}

#[tokio::test]
async fn quic_client_without_cert_is_refused() {
    let (cluster, mut refused) = echo_server().await;
    let tls = ClientTls::new(vec![cluster.ca.cert_der()]).alpn(&[ALPN_RAFT]);
    let client = QuicEndpoint::client(any_port(), &tls, &config(4))
        .await
        .unwrap();
    let client_err = client_sees_refusal(&client, cluster.server.local_addr()).await;
    assert!(
        matches!(client_err, NetError::QuicConnection(_)),
        "{client_err}"
    );
    within("server refusal", refused.recv()).await.unwrap();
}

#[tokio::test]
async fn quic_client_refuses_a_server_name_not_in_the_certificate() {
    let (cluster, _refused) = echo_server().await;
    let node = cluster.ca.issue("node-2", &["node-2"]).unwrap();
    let tls = ClientTls::new(vec![cluster.ca.cert_der()])
        .identity(node.identity())
        .alpn(&[ALPN_RAFT]);
    let client = QuicEndpoint::client(any_port(), &tls, &config(5))
        .await
        .unwrap();
    let err = within(
        "handshake",
        client.connect(cluster.server.local_addr(), "node-7"),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, NetError::QuicConnection(_)), "{err}");
}

#[tokio::test]
async fn quic_config_with_zero_idle_timeout_is_rejected() {
    let ca = CertAuthority::generate("ca").unwrap();
    let tls = ClientTls::new(vec![ca.cert_der()]);
    let mut bad = config(6);
    bad.idle_timeout = Duration::ZERO;
    let err = QuicEndpoint::client(any_port(), &tls, &bad)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            NetError::QuicConfig {
                knob: "idle_timeout",
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn pem_files_written_by_the_ca_load_back_as_an_identity() {
    let dir = std::env::temp_dir().join(format!("starling-net-pem-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = CertAuthority::generate("ca").unwrap();
    let node = ca.issue("node-1", &["node-1"]).unwrap();
    let (cert, key, ca_cert, ca_key) = (
        dir.join("node.crt"),
        dir.join("node.key"),
        dir.join("ca.crt"),
        dir.join("ca.key"),
    );
    std::fs::write(&cert, &node.cert_pem).unwrap();
    std::fs::write(&key, &node.key_pem).unwrap();
    std::fs::write(&ca_cert, ca.cert_pem()).unwrap();
    std::fs::write(&ca_key, ca.key_pem()).unwrap();

    let id = starling_net::Identity::from_pem_files(&cert, &key).unwrap();
    assert_eq!(id.cert_chain(), node.identity().cert_chain());
    let reloaded = CertAuthority::from_pem_files(&ca_cert, &ca_key).unwrap();
    assert_eq!(reloaded.cert_der(), ca.cert_der());

    // A key file where a certificate is expected: the error names the file.
    let err = starling_net::load_certs(&key).unwrap_err();
    assert!(err.to_string().contains("node.key"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
