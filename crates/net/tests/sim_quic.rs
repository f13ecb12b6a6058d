//! QUIC over the madsim shim: two simulated nodes, mutual TLS, echoed streams, partitions.
//!
//! Compiled only in the simulator build. From the repository root:
//! `RUSTFLAGS="--cfg madsim" cargo test -p starling-net --test sim_quic`
//! (add `MADSIM_TEST_NUM=20` for 20 seeds, `MADSIM_TEST_CHECK_DETERMINISM=1` to replay a seed
//! twice and compare).
#![cfg(madsim)]

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use madsim::{
    net::NetSim,
    runtime::{Handle, NodeHandle},
};
use starling_net::{
    CertAuthority, ClientTls, QuicConfig, QuicConnection, QuicEndpoint, ServerTls, ALPN_RAFT,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SERVER_IP: [u8; 4] = [10, 0, 0, 1];
const CLIENT_IP: [u8; 4] = [10, 0, 0, 2];
const SERVER_PORT: u16 = 4433;

/// Idle timeout shared by both ends in these scenarios.
const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

fn quic_config(seed: u8) -> QuicConfig {
    let mut config = QuicConfig::new([seed; 32]);
    config.idle_timeout = IDLE_TIMEOUT;
    config.keep_alive_interval = Some(Duration::from_secs(1));
    config
}

struct TwoNodes {
    server: NodeHandle,
    client: NodeHandle,
    /// The client's endpoint, kept so its driver outlives the test body.
    _client_endpoint: QuicEndpoint,
    /// The client's established connection to the server.
    conn: QuicConnection,
}

/// Starts a mutual-TLS echo server on one node and connects to it from another.
async fn two_nodes() -> TwoNodes {
    let handle = Handle::current();
    let ca = CertAuthority::generate("sim CA").unwrap();
    let server_id = ca.issue("node-1", &["node-1"]).unwrap().identity();
    let client_id = ca.issue("node-2", &["node-2"]).unwrap().identity();
    let server_tls = ServerTls::new(server_id)
        .require_client_cert(vec![ca.cert_der()])
        .alpn(&[ALPN_RAFT]);
    let client_tls = ClientTls::new(vec![ca.cert_der()])
        .identity(client_id)
        .alpn(&[ALPN_RAFT]);
    let server_addr = SocketAddr::new(IpAddr::from(SERVER_IP), SERVER_PORT);

    let server = handle
        .create_node()
        .name("server")
        .ip(IpAddr::from(SERVER_IP))
        .build();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    drop(server.spawn(async move {
        let endpoint = QuicEndpoint::server(server_addr, &server_tls, &quic_config(1))
            .await
            .unwrap();
        ready_tx.send(()).unwrap();
        while let Some(incoming) = endpoint.accept().await {
            drop(madsim::task::spawn(async move {
                if let Ok(conn) = incoming.handshake().await {
                    echo_streams(conn).await;
                }
            }));
        }
    }));
    ready_rx.await.unwrap();

    let client = handle
        .create_node()
        .name("client")
        .ip(IpAddr::from(CLIENT_IP))
        .build();
    let (client_endpoint, conn) = client
        .spawn(async move {
            let any_port = SocketAddr::new(IpAddr::from(CLIENT_IP), 0);
            let endpoint = QuicEndpoint::client(any_port, &client_tls, &quic_config(2))
                .await
                .unwrap();
            let conn = endpoint.connect(server_addr, "node-1").await.unwrap();
            (endpoint, conn)
        })
        .await
        .unwrap();
    assert_eq!(conn.alpn_protocol().as_deref(), Some(ALPN_RAFT));
    TwoNodes {
        server,
        client,
        _client_endpoint: client_endpoint,
        conn,
    }
}

async fn echo_streams(conn: QuicConnection) {
    while let Ok((mut send, mut recv)) = conn.accept_bi().await {
        drop(madsim::task::spawn(async move {
            let mut data = Vec::new();
            if recv.read_to_end(&mut data).await.is_ok() {
                let _ = send.write_all(&data).await;
                let _ = send.finish();
            }
        }));
    }
}

/// Sends `message` on a new stream and returns what comes back.
async fn echo(conn: &QuicConnection, message: Vec<u8>) -> Vec<u8> {
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(&message).await.unwrap();
    send.finish().unwrap();
    let mut echoed = Vec::new();
    recv.read_to_end(&mut echoed).await.unwrap();
    echoed
}

/// Runs `future` on the client node (streams belong to that node's tasks).
async fn on_client<T: Send + 'static>(
    nodes: &TwoNodes,
    future: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    nodes.client.spawn(future).await.unwrap()
}

/// Goal: a mutual-TLS handshake between two simulated nodes, then five concurrent streams
/// each echoed intact.
#[madsim::test]
async fn sim_quic_handshake_and_concurrent_echoed_streams() {
    let nodes = two_nodes().await;
    let conn = nodes.conn.clone();
    on_client(&nodes, async move {
        let streams: Vec<_> = (0..5u8)
            .map(|i| {
                let conn = conn.clone();
                madsim::task::spawn(async move {
                    let message = vec![i; 16 * 1024 + usize::from(i)];
                    assert_eq!(echo(&conn, message.clone()).await, message, "stream {i}");
                })
            })
            .collect();
        for stream in streams {
            stream.await.unwrap();
        }
    })
    .await;
    assert!(nodes.conn.close_reason().is_none());
}

/// Goal: a partition shorter than the idle timeout is survived. Setup: connected nodes with a
/// 10 s idle timeout. Fault: the server is clogged for 5 s. Expectation: the same connection
/// echoes a stream afterwards.
#[madsim::test]
async fn sim_quic_connection_survives_a_five_second_clog() {
    let nodes = two_nodes().await;
    let conn = nodes.conn.clone();
    on_client(&nodes, async move { echo(&conn, b"before".to_vec()).await }).await;

    let net = NetSim::current();
    net.clog_node(nodes.server.id());
    madsim::time::sleep(Duration::from_secs(5)).await;
    net.unclog_node(nodes.server.id());

    let conn = nodes.conn.clone();
    let echoed = madsim::time::timeout(
        IDLE_TIMEOUT,
        on_client(&nodes, async move { echo(&conn, b"after".to_vec()).await }),
    )
    .await
    .expect("echo after the clog finishes before the idle timeout");
    assert_eq!(echoed, b"after");
    assert!(nodes.conn.close_reason().is_none());
}

/// Goal: a partition longer than the idle timeout ends the connection. Setup: connected nodes
/// with a 10 s idle timeout. Fault: the server is clogged for 20 s. Expectation: the client's
/// connection closes with a timeout while the link is still clogged.
#[madsim::test]
async fn sim_quic_connection_times_out_under_a_long_clog() {
    let nodes = two_nodes().await;
    let conn = nodes.conn.clone();
    on_client(&nodes, async move { echo(&conn, b"before".to_vec()).await }).await;

    let net = NetSim::current();
    net.clog_node(nodes.server.id());
    let clock = madsim::time::TimeHandle::current();
    let clogged_at = clock.now_instant();
    let error = madsim::time::timeout(Duration::from_secs(20), nodes.conn.closed())
        .await
        .expect("connection closes within the 20 s clog");
    assert!(error.is_timed_out(), "{error}");
    let elapsed = clock.now_instant() - clogged_at;
    assert!(elapsed >= IDLE_TIMEOUT, "closed after {elapsed:?}");
    net.unclog_node(nodes.server.id());
}
