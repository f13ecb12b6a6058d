//! A fuzzing run over TCP, bounded: hostile byte streams (garbage, truncated and mutated
//! packets, valid CONNECTs followed by mutated packet sequences) against one broker on
//! loopback. Between cases a well-behaved client must still connect, subscribe, publish
//! and receive. Deterministic: the cases come from a fixed seed, printed on failure.

mod common;

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use common::{broker, connect_packet, pid, Client};
use rand::{Rng, RngCore, SeedableRng};
use starling_codec::{
    encode, Packet, Properties, Protocol, PubAck, Publish, QoS, Subscribe, SubscribeFilter,
    SubscriptionOptions, Unsubscribe,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Cases per run and how often a normal client checks the broker in between.
const CASES: usize = 1000;
const CHECK_EVERY: usize = 50;
const SEED: u64 = 0x5747_4152_4c49_4e47;

fn valid_packets(rng: &mut impl Rng, protocol: Protocol) -> Vec<Packet> {
    let qos = |r: &mut dyn RngCore| match r.next_u32() % 3 {
        0 => QoS::AtMostOnce,
        1 => QoS::AtLeastOnce,
        _ => QoS::ExactlyOnce,
    };
    let mut out = Vec::new();
    for i in 0..rng.gen_range(1..8u16) {
        let id = pid(i + 1);
        let q = qos(rng);
        out.push(match rng.gen_range(0..9) {
            0 | 1 => Packet::Publish(Publish {
                dup: false,
                qos: q,
                retain: rng.gen_bool(0.2),
                topic: ["a/b", "fuzz/x", "$SYS/x", "fuzz/+/bad", "$delayed/1/fuzz/d"]
                    [rng.gen_range(0..5)]
                .to_owned(),
                packet_id: (q != QoS::AtMostOnce).then_some(id),
                properties: Properties::default(),
                payload: Bytes::from(vec![b'p'; rng.gen_range(0..200)]),
            }),
            2 => Packet::Subscribe(Subscribe {
                packet_id: id,
                filters: vec![SubscribeFilter {
                    filter: ["#", "fuzz/#", "+/+", "$share/g/fuzz/#", "$SYS/#"]
                        [rng.gen_range(0..5)]
                    .to_owned(),
                    options: SubscriptionOptions {
                        qos: q,
                        ..Default::default()
                    },
                }],
                properties: Properties::default(),
            }),
            3 => Packet::Unsubscribe(Unsubscribe {
                packet_id: id,
                filters: vec!["fuzz/#".to_owned()],
                properties: Properties::default(),
            }),
            4 => Packet::Puback(PubAck::new(id)),
            5 => Packet::Pubrec(PubAck::new(id)),
            6 => Packet::Pubrel(PubAck::new(id)),
            7 => Packet::Pubcomp(PubAck::new(id)),
            _ => Packet::Pingreq,
        });
    }
    let _ = protocol;
    out
}

fn mutate(rng: &mut impl Rng, bytes: &mut Vec<u8>) {
    if bytes.is_empty() {
        return;
    }
    for _ in 0..rng.gen_range(0..4) {
        let i = rng.gen_range(0..bytes.len());
        match rng.gen_range(0..4) {
            0 => bytes[i] = rng.gen(),
            1 => bytes[i] ^= 1 << rng.gen_range(0..8),
            2 => bytes.truncate(i),
            _ => bytes.insert(i, rng.gen()),
        }
        if bytes.is_empty() {
            return;
        }
    }
}

/// One hostile session: what it sends, in pieces.
fn case(rng: &mut impl Rng, n: usize) -> Vec<u8> {
    let protocol = [Protocol::V3_1, Protocol::V3_1_1, Protocol::V5][rng.gen_range(0..3)];
    let mut out = BytesMut::new();
    match rng.gen_range(0..4) {
        // Garbage from the first byte.
        0 => {
            let mut b = vec![0u8; rng.gen_range(1..300)];
            rng.fill_bytes(&mut b);
            return b;
        }
        // A mutated CONNECT.
        1 => {
            let c = connect_packet(protocol, &format!("fuzz-{n}"), rng.gen_bool(0.5));
            encode(&Packet::Connect(Box::new(c)), protocol, u32::MAX, &mut out).unwrap();
            let mut b = out.to_vec();
            mutate(rng, &mut b);
            return b;
        }
        // A CONNECT claiming far more than it sends, then silence.
        2 => return vec![0x10, 0xff, 0xff, 0x7f, 0x00, 0x04, b'M', b'Q'],
        // A valid CONNECT, then packets of which some are mutated.
        _ => {}
    }
    let c = connect_packet(protocol, &format!("fuzz-{n}"), rng.gen_bool(0.5));
    encode(&Packet::Connect(Box::new(c)), protocol, u32::MAX, &mut out).unwrap();
    let mut b = out.to_vec();
    for p in valid_packets(rng, protocol) {
        let mut one = BytesMut::new();
        if encode(&p, protocol, u32::MAX, &mut one).is_err() {
            continue;
        }
        let mut one = one.to_vec();
        if rng.gen_bool(0.3) {
            mutate(rng, &mut one);
        }
        b.extend_from_slice(&one);
    }
    b
}

async fn healthy(addr: std::net::SocketAddr, round: usize) {
    let id = format!("healthy-{round}");
    let mut sub = Client::connect(addr, Protocol::V5, &id, true).await;
    sub.subscribe(1, &format!("health/{round}"), QoS::AtLeastOnce)
        .await;
    let mut publ = Client::connect(addr, Protocol::V3_1_1, &format!("{id}-pub"), true).await;
    publ.publish(&format!("health/{round}"), b"ok", QoS::AtLeastOnce, false)
        .await;
    assert_eq!(
        &sub.recv_publish().await.payload[..],
        b"ok",
        "round {round}"
    );
    sub.disconnect().await;
    publ.disconnect().await;
}

#[test]
fn the_broker_survives_hostile_byte_streams_and_keeps_serving() {
    common::on_actix(async {
        let (b, addr) = broker("handshake_timeout_secs = 1\n").await;
        let mut rng = rand::rngs::StdRng::seed_from_u64(SEED);
        let mut open = Vec::new();
        for n in 0..CASES {
            let bytes = case(&mut rng, n);
            let mut s = TcpStream::connect(addr).await.expect("broker accepts");
            // Written in pieces, as a slow or fragmenting peer would.
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                let k = rng.gen_range(1..=rest.len());
                if s.write_all(&rest[..k]).await.is_err() {
                    break;
                }
                rest = &rest[k..];
            }
            if rng.gen_bool(0.1) {
                // Some stay open, silent: the handshake timeout must reap them.
                open.push(s);
            } else {
                let mut scratch = [0u8; 1024];
                let _ = tokio::time::timeout(Duration::from_millis(20), s.read(&mut scratch)).await;
            }
            if n % CHECK_EVERY == CHECK_EVERY - 1 {
                tokio::time::timeout(Duration::from_secs(10), healthy(addr, n))
                    .await
                    .unwrap_or_else(|_| {
                        panic!("seed {SEED:#x}: broker stopped serving after case {n}")
                    });
            }
        }
        healthy(addr, CASES).await;
        // Nothing leaked: once every hostile socket is closed, no connection stays counted.
        drop(open);
        let started = starling_rt::time::now();
        while b.metrics().clients_connected > 0 {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "connections left over: {:?}",
                b.metrics()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let m = b.metrics();
        assert!(m.connections_refused > 0, "{m:?}");
    })
}
