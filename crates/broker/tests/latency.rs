//! The latency histograms count what happened: after a known sequence of connects (one of
//! them refused) and publishes, the handshake histogram holds exactly one entry per
//! CONNACK written and the delivery histogram exactly one per first PUBLISH of a routed
//! message written to a subscriber, retained messages sent at SUBSCRIBE not among them.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{broker, connect_packet, Client};
use starling_broker::{AdminPublish, Broker, Latencies, BOUNDS_US};
use starling_codec::{Properties, Protocol, QoS};

/// The histograms once `done` holds of them (a CONNACK or a PUBLISH is recorded right
/// after its write returns, which can be after the client has read it).
async fn settled(b: &Broker, done: impl Fn(&Latencies) -> bool) -> Latencies {
    let mut l = b.latencies();
    for _ in 0..500 {
        if done(&l) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        l = b.latencies();
    }
    l
}

#[test]
fn handshakes_and_deliveries_are_each_timed_once() {
    common::on_actix(async {
        let (b, addr) = broker("").await;
        let start = b.latencies();
        assert_eq!((start.handshakes(), start.delivery.count()), (0, 0));

        // One CONNECT refused with its CONNACK (3.1.1, no client id, no clean session:
        // MQTT-3.1.3-8), which is a handshake too.
        let (_refused, ack) = Client::open(addr, connect_packet(Protocol::V3_1_1, "", false)).await;
        assert!(ack.reason_code.is_error(), "{ack:?}");

        // A retained message before anyone subscribes: its sends at SUBSCRIBE are untimed.
        let mut publisher = Client::connect(addr, Protocol::V5, "pub", true).await;
        publisher
            .publish("lat/r", b"kept", QoS::AtLeastOnce, true)
            .await;

        let mut subs = Vec::new();
        for (i, qos) in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce]
            .into_iter()
            .enumerate()
        {
            let mut s = Client::connect(addr, Protocol::V5, &format!("sub{i}"), true).await;
            s.subscribe(1, "lat/#", qos).await;
            assert_eq!(&s.recv_publish().await.payload[..], b"kept");
            subs.push(s);
        }
        let handshakes = 1 + 1 + subs.len() as u64;

        // 2 publishes at each QoS and one through the operator's API, to 3 subscribers.
        let mut messages = 0;
        for qos in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce] {
            for n in 0..2 {
                publisher
                    .publish(&format!("lat/{n}"), b"x", qos, false)
                    .await;
                messages += 1;
            }
        }
        b.admin()
            .publish(AdminPublish {
                topic: "lat/api".into(),
                payload: Bytes::from_static(b"x"),
                qos: QoS::AtLeastOnce,
                retain: false,
                expiry_secs: None,
                properties: Properties::default(),
            })
            .await
            .unwrap();
        messages += 1;
        for s in &mut subs {
            for _ in 0..messages {
                assert_eq!(&s.recv_publish().await.payload[..], b"x");
            }
        }
        let deliveries = messages * subs.len() as u64;

        let l = settled(&b, |l| {
            l.handshakes() >= handshakes && l.delivery.count() >= deliveries
        })
        .await;
        // Nothing late comes in on top.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(b.latencies(), l, "counted after settling");
        assert_eq!(l.handshakes(), handshakes, "{l:?}");
        let (tcp, tcp_h) = l.handshake[0];
        assert_eq!((tcp, tcp_h.count()), ("tcp", handshakes), "{l:?}");
        assert_eq!(l.delivery.count(), deliveries, "{l:?}");
        // On one machine, every one took well under 10 s, and some time.
        for h in [tcp_h, l.delivery] {
            assert_eq!(h.buckets[BOUNDS_US.len()], 0, "{h:?}");
            assert!(h.sum_us > 0, "{h:?}");
            let cumulative: Vec<u64> = h.cumulative().map(|(_, n)| n).collect();
            assert_eq!(cumulative.last(), Some(&h.count()));
        }
        for s in subs {
            s.disconnect().await;
        }
        publisher.disconnect().await;
    });
}
