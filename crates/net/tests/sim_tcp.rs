//! TCP byte streams on the simulator: the same `listen`/`connect` calls as in production.
//!
//! Compiled only in the simulator build:
//! `RUSTFLAGS="--cfg madsim" cargo test -p starling-net --test sim_tcp`.
#![cfg(madsim)]

use std::net::{IpAddr, SocketAddr};

use madsim::runtime::Handle;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Goal: a simulated TCP echo round-trips bytes between two nodes when the writer flushes.
#[madsim::test]
async fn sim_tcp_echo_round_trips_flushed_bytes() {
    let handle = Handle::current();
    let server_ip = IpAddr::from([10, 0, 1, 1]);
    let server_addr = SocketAddr::new(server_ip, 1883);
    let server = handle.create_node().name("server").ip(server_ip).build();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    drop(server.spawn(async move {
        let listener = starling_net::listen(server_addr).await.unwrap();
        ready_tx.send(()).unwrap();
        let (mut stream, _peer) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 1024];
        loop {
            let n = stream.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            stream.write_all(&buf[..n]).await.unwrap();
            // The simulated stream sends nothing until flushed.
            stream.flush().await.unwrap();
        }
    }));
    ready_rx.await.unwrap();

    let client_ip = IpAddr::from([10, 0, 1, 2]);
    let client = handle.create_node().name("client").ip(client_ip).build();
    let echoed = client
        .spawn(async move {
            let mut stream = starling_net::connect(server_addr).await.unwrap();
            assert_eq!(stream.peer_addr(), server_addr);
            stream.write_all(b"hello over simulated tcp").await.unwrap();
            stream.flush().await.unwrap();
            let mut echoed = vec![0u8; 24];
            stream.read_exact(&mut echoed).await.unwrap();
            echoed
        })
        .await
        .unwrap();
    assert_eq!(echoed, b"hello over simulated tcp");
}
