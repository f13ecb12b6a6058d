//! What a peer that has not authenticated can make the broker spend: CONNECT bytes held,
//! password verifications, and how CONNECT timeouts are counted. Raw sockets on loopback,
//! against a broker that refuses anonymous clients and checks a password file.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use common::{broker, connect_bytes, connect_packet, temp_dir, WAIT};
use starling_broker::{Broker, MetricsSnapshot};
use starling_codec::{
    decode, Connack, Connect, LastWill, Packet, Properties, Protocol, QoS, ReasonCode,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// A broker with `alice:right` in its password file, anonymous clients refused, and
/// `listener` lines added to its tcp listener and `auth` lines to `[auth]`.
async fn locked_broker(name: &str, listener: &str, auth: &str) -> (Broker, SocketAddr) {
    let file = temp_dir(name).join("passwd");
    starling_auth::add_or_update(&file, "alice", b"right").expect("password file");
    broker(&format!(
        "allow_anonymous = false\n{listener}\n[auth]\npassword_file = {:?}\n{auth}\n",
        file.display().to_string()
    ))
    .await
}

fn login(protocol: Protocol, id: &str, password: &'static [u8]) -> Connect {
    let mut c = connect_packet(protocol, id, true);
    c.username = Some("alice".into());
    c.password = Some(Bytes::from_static(password));
    c
}

/// A CONNECT whose will payload makes it about `size` bytes.
fn sized_connect(protocol: Protocol, id: &str, size: usize) -> BytesMut {
    let mut c = connect_packet(protocol, id, true);
    c.username = Some("alice".into());
    c.password = Some(Bytes::from_static(b"right"));
    c.will = Some(LastWill {
        topic: "wills/x".to_owned(),
        payload: Bytes::from(vec![b'w'; size.saturating_sub(64)]),
        qos: QoS::AtMostOnce,
        retain: false,
        properties: Properties::default(),
    });
    connect_bytes(c)
}

/// MQTT's variable byte integer.
fn var_int(mut n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let mut b = (n % 128) as u8;
        n /= 128;
        if n > 0 {
            b |= 0x80;
        }
        out.push(b);
        if n == 0 {
            return out;
        }
    }
}

/// The start of a CONNECT declaring `remaining` bytes after its fixed header: fixed
/// header, protocol name and level, then `body` filler bytes.
fn oversized_head(protocol: Protocol, remaining: usize, body: usize) -> Vec<u8> {
    let mut out = vec![0x10];
    out.extend(var_int(remaining));
    let level = if protocol == Protocol::V5 { 5 } else { 4 };
    out.extend([0, 4, b'M', b'Q', b'T', b'T', level, 0xC2, 0, 60]);
    out.extend(std::iter::repeat_n(0u8, body));
    out
}

/// The CONNACK on `s`, or `None` if the broker closed the connection without one.
async fn connack(s: &mut TcpStream, protocol: Protocol) -> Option<Connack> {
    let mut buf = BytesMut::new();
    tokio::time::timeout(WAIT, async {
        loop {
            match decode(&mut buf, protocol, u32::MAX) {
                Ok(Some(Packet::Connack(c))) => return Some(c),
                Ok(Some(other)) => panic!("expected CONNACK, got {other:?}"),
                Ok(None) => {}
                Err(e) => panic!("malformed packet from the broker: {e}"),
            }
            buf.reserve(1024);
            match s.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    })
    .await
    .expect("the broker answers or closes in time")
}

/// Opens a connection, sends `connect` and returns the CONNACK's code.
async fn try_login(addr: SocketAddr, connect: Connect) -> Option<ReasonCode> {
    try_login_from(None, addr, connect).await
}

async fn try_login_from(
    source: Option<&str>,
    addr: SocketAddr,
    connect: Connect,
) -> Option<ReasonCode> {
    let protocol = connect.protocol;
    let mut s = match source {
        None => TcpStream::connect(addr).await.expect("connect"),
        Some(ip) => {
            let socket = TcpSocket::new_v4().expect("socket");
            socket
                .bind(format!("{ip}:0").parse().expect("source address"))
                .expect("bind source");
            socket.connect(addr).await.expect("connect")
        }
    };
    s.write_all(&connect_bytes(connect)).await.expect("write");
    connack(&mut s, protocol).await.map(|c| c.reason_code)
}

async fn metrics_until(b: &Broker, done: impl Fn(&MetricsSnapshot) -> bool) -> MetricsSnapshot {
    let t0 = starling_rt::time::now();
    loop {
        let m = b.metrics();
        if done(&m) {
            return m;
        }
        assert!(t0.elapsed() < WAIT, "metrics never got there: {m:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[test]
fn an_oversized_connect_is_refused_before_authentication() {
    common::on_actix(async {
        let (b, addr) = locked_broker("oversized", "", "").await;
        // 100 KB is under max_packet_size (1 MiB) but over max_connect_packet_size (16 KiB).
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&oversized_head(Protocol::V5, 100_000, 20_000))
            .await
            .unwrap();
        let ack = connack(&mut s, Protocol::V5).await.expect("a CONNACK");
        assert_eq!(ack.reason_code, ReasonCode::PacketTooLarge);
        // MQTT 3.1.1 has no such code: the connection is closed.
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&oversized_head(Protocol::V3_1_1, 100_000, 20_000))
            .await
            .unwrap();
        assert_eq!(connack(&mut s, Protocol::V3_1_1).await, None);
        let m = metrics_until(&b, |m| m.connect_too_large == 2).await;
        assert_eq!(m.login_failed, 0, "refused before any credential check");
    })
}

#[test]
fn a_connect_with_a_large_will_within_the_limit_is_accepted() {
    common::on_actix(async {
        let (_b, addr) = locked_broker("large-will", "", "").await;
        let bytes = sized_connect(Protocol::V5, "big-will", 12_000);
        assert!(bytes.len() > 11_000 && bytes.len() < 16_384);
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&bytes).await.unwrap();
        let ack = connack(&mut s, Protocol::V5).await.expect("a CONNACK");
        assert_eq!(ack.reason_code, ReasonCode::Success);
    })
}

#[test]
fn stalled_connects_wait_for_the_read_budget_while_small_ones_pass() {
    common::on_actix(async {
        let (b, addr) = locked_broker(
            "budget",
            "max_connect_packet_size = 4096\nconnect_read_budget_bytes = 4096",
            "",
        )
        .await;
        let first = sized_connect(Protocol::V5, "first", 3000);
        let second = sized_connect(Protocol::V5, "second", 3000);
        // The first takes 3 KB of the 4 KB budget and stalls half-way...
        let mut a = TcpStream::connect(addr).await.unwrap();
        a.write_all(&first[..1000]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        // ...so the second waits for the budget before buffering anything past its header.
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(&second[..1000]).await.unwrap();
        metrics_until(&b, |m| m.connect_budget_waits == 1).await;
        // An ordinary CONNECT needs no budget and is not held up.
        let code = try_login(addr, login(Protocol::V5, "small", b"right")).await;
        assert_eq!(code, Some(ReasonCode::Success));
        // Once the first completes, its bytes return to the budget and the second proceeds.
        a.write_all(&first[1000..]).await.unwrap();
        assert_eq!(
            connack(&mut a, Protocol::V5).await.map(|c| c.reason_code),
            Some(ReasonCode::Success)
        );
        c.write_all(&second[1000..]).await.unwrap();
        assert_eq!(
            connack(&mut c, Protocol::V5).await.map(|c| c.reason_code),
            Some(ReasonCode::Success)
        );
    })
}

#[test]
fn connect_read_timeouts_are_counted() {
    common::on_actix(async {
        let (b, addr) = locked_broker("timeouts", "handshake_timeout_secs = 1", "").await;
        // One says nothing, one stalls inside its CONNECT.
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut partial = TcpStream::connect(addr).await.unwrap();
        partial.write_all(&[0x10, 0x20, 0x00]).await.unwrap();
        for s in [&mut silent, &mut partial] {
            let mut rest = Vec::new();
            tokio::time::timeout(WAIT, s.read_to_end(&mut rest))
                .await
                .expect("closed by the handshake timeout")
                .ok();
        }
        let t0 = starling_rt::time::now();
        loop {
            let (_, _, c) = b.listener_counters()[0];
            if c.connect_timed_out == 2 {
                assert_eq!(
                    c.timed_out, 0,
                    "the TCP transport has no handshake of its own"
                );
                break;
            }
            assert!(t0.elapsed() < WAIT, "CONNECT timeouts not counted: {c:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
}

#[test]
fn a_full_verification_queue_refuses_with_server_unavailable() {
    common::on_actix(async {
        let (b, addr) = locked_broker(
            "queue",
            "",
            "verify_threads = 1\nverify_queue = 1\nfailed_logins_max = 1000",
        )
        .await;
        for protocol in [Protocol::V5, Protocol::V3_1_1] {
            // One verification runs and one waits; the rest of a burst finds the queue full.
            let burst: Vec<_> = (0..10)
                .map(|i| {
                    let c = login(protocol, &format!("storm-{i}"), b"wrong");
                    starling_rt::spawn(try_login(addr, c))
                })
                .collect();
            let mut codes = Vec::new();
            for j in burst {
                codes.push(j.await.unwrap());
            }
            let unavailable = codes
                .iter()
                .filter(|c| **c == Some(ReasonCode::ServerUnavailable))
                .count();
            let bad = codes
                .iter()
                .filter(|c| **c == Some(ReasonCode::BadUserNameOrPassword))
                .count();
            assert!(unavailable >= 1, "{protocol:?}: {codes:?}");
            assert!(bad >= 1, "{protocol:?}: {codes:?}");
            assert_eq!(unavailable + bad, codes.len(), "{protocol:?}: {codes:?}");
        }
        let m = b.metrics();
        assert!(m.verify_queue_full >= 2, "{m:?}");
        // Once the storm is over, the right password is verified again.
        let code = try_login(addr, login(Protocol::V5, "after", b"right")).await;
        assert_eq!(code, Some(ReasonCode::Success));
    })
}

#[test]
fn repeated_failed_logins_from_one_address_are_banned() {
    common::on_actix(async {
        let (b, addr) = locked_broker(
            "ban",
            "",
            "failed_logins_max = 3\nfailed_logins_window_secs = 60\nfailed_login_ban_secs = 60",
        )
        .await;
        for i in 0..3 {
            let code = try_login(addr, login(Protocol::V5, &format!("guess-{i}"), b"wrong")).await;
            assert_eq!(code, Some(ReasonCode::BadUserNameOrPassword), "attempt {i}");
        }
        // Banned: even the right password is refused, unverified, with "try later".
        let code = try_login(addr, login(Protocol::V5, "right-but-banned", b"right")).await;
        assert_eq!(code, Some(ReasonCode::ServerUnavailable));
        let code = try_login(addr, login(Protocol::V3_1_1, "v3-banned", b"right")).await;
        assert_eq!(code, Some(ReasonCode::ServerUnavailable));
        let m = b.metrics();
        assert_eq!((m.login_failed, m.login_banned), (3, 2), "{m:?}");
        // Another address is not affected.
        let code = try_login_from(
            Some("127.0.0.2"),
            addr,
            login(Protocol::V5, "elsewhere", b"right"),
        )
        .await;
        assert_eq!(code, Some(ReasonCode::Success));
    })
}

#[test]
fn a_login_from_a_clean_address_is_verified_before_a_storm_from_failing_ones() {
    common::on_actix(async {
        let (_b, addr) = locked_broker(
            "lanes",
            "",
            "verify_threads = 1\nverify_queue = 4\nfailed_logins_max = 1000",
        )
        .await;
        // 127.0.0.1 fails once: its next CONNECTs wait in the second lane.
        let code = try_login(addr, login(Protocol::V5, "first-failure", b"wrong")).await;
        assert_eq!(code, Some(ReasonCode::BadUserNameOrPassword));
        let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
        for i in 0..5 {
            let tx = done_tx.clone();
            starling_rt::spawn(async move {
                let code =
                    try_login(addr, login(Protocol::V5, &format!("storm-{i}"), b"wrong")).await;
                let _ = tx.send(("storm", code));
            });
        }
        // Let the storm reach the pool first (one verification running, the rest queued).
        tokio::time::sleep(Duration::from_millis(20)).await;
        let tx = done_tx.clone();
        starling_rt::spawn(async move {
            let code = try_login_from(
                Some("127.0.0.2"),
                addr,
                login(Protocol::V5, "clean", b"right"),
            )
            .await;
            let _ = tx.send(("clean", code));
        });
        drop(done_tx);
        let mut order = Vec::new();
        while let Some(done) = tokio::time::timeout(WAIT, done_rx.recv())
            .await
            .expect("answered")
        {
            order.push(done);
        }
        let clean = order
            .iter()
            .position(|(who, _)| *who == "clean")
            .expect("the clean login was answered");
        assert_eq!(order[clean].1, Some(ReasonCode::Success), "{order:?}");
        // At most the verification running when it arrived (and, on a slow machine, one the
        // worker took just before) goes ahead of it; the queued storm waits. (Without the
        // second lane all four queued ones would.)
        let verified_before = order[..clean]
            .iter()
            .filter(|(_, c)| *c == Some(ReasonCode::BadUserNameOrPassword))
            .count();
        assert!(
            verified_before <= 2,
            "clean login verified after {verified_before} storm logins: {order:?}"
        );
        let refused = order
            .iter()
            .filter(|(_, c)| *c == Some(ReasonCode::ServerUnavailable))
            .count();
        assert!(
            refused >= 1,
            "the second lane (4 places) overflowed: {order:?}"
        );
    })
}
