//! RMQTT's state counts follow what the broker holds: connections in their handshake (and
//! among them those being authenticated), the handshakes of the last second, messages queued in sessions, outbound messages in flight, inbound QoS 2 messages
//! awaiting PUBREL; each falls back when what it counts goes, and its `.max` keeps the
//! high mark.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{broker, connect_packet, pid, Client};
use starling_broker::hooks::{AuthnAnswer, AuthnProvider, ConnectRequest, Hooks, Verdict};
use starling_broker::{Broker, BrokerStats};
use starling_codec::{Packet, Properties, Protocol, PubAck, Publish, QoS, ReasonCode};
use starling_config::{Config, ListenerKind};
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;

/// The stats once `pick` of them is `want` (the gauges move at the end of an actor's
/// burst, a little after the packets a test sees); panics with the last read if it never
/// is.
async fn expect<T: PartialEq + std::fmt::Debug>(
    b: &Broker,
    pick: impl Fn(&BrokerStats) -> T,
    want: T,
) -> BrokerStats {
    let mut s = b.admin().stats().await;
    for _ in 0..500 {
        if pick(&s) == want {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        s = b.admin().stats().await;
    }
    assert_eq!(pick(&s), want, "{s:?}");
    s
}

fn qos_publish(topic: &str, qos: QoS, id: u16) -> Packet {
    Packet::Publish(Publish {
        dup: false,
        qos,
        retain: false,
        topic: topic.into(),
        packet_id: Some(pid(id)),
        properties: Properties::default(),
        payload: Bytes::from_static(b"m"),
    })
}

#[test]
fn queues_inflights_and_handshakes_are_counted_and_fall_back() {
    common::on_actix(async {
        let (b, addr) = broker("[mqtt]\nsys_interval_secs = 86400\n").await;

        // A connection that has sent no CONNECT is in its handshake until it closes.
        let mut idle = tokio::net::TcpStream::connect(addr).await.unwrap();
        expect(&b, |s| s.handshakings.count, 1).await;
        idle.shutdown().await.unwrap();
        drop(idle);
        let s = expect(&b, |s| s.handshakings.count, 0).await;
        assert!(s.handshakings.max >= 1, "{s:?}");

        // A persistent subscriber with a window of 2 that acknowledges nothing: of 5
        // QoS 1 messages, 2 are in flight and 3 queued.
        let mut c = connect_packet(Protocol::V5, "slow", false);
        c.properties.session_expiry_interval = Some(3600);
        c.properties.receive_maximum = Some(2);
        let (mut sub, _) = Client::open(addr, c).await;
        sub.subscribe(1, "t/#", QoS::AtLeastOnce).await;
        let mut publisher = Client::connect(addr, Protocol::V5, "pub", true).await;
        for _ in 0..5 {
            publisher
                .publish("t/a", b"m", QoS::AtLeastOnce, false)
                .await;
        }
        let s = expect(
            &b,
            |s| (s.out_inflights.count, s.message_queues.count),
            (2, 3),
        )
        .await;
        // One node: its routes are its topic filters.
        assert_eq!(s.routes, s.topics, "{s:?}");
        assert_eq!(s.topics.count, 1, "{s:?}");

        // A QoS 2 message whose PUBREL has not come is an inbound one in flight; the
        // PUBREL retires it (and the message, routed at PUBLISH, is queued already).
        publisher
            .send(qos_publish("t/b", QoS::ExactlyOnce, 9))
            .await;
        match publisher.recv().await {
            Some(Packet::Pubrec(r)) => assert_eq!(r.packet_id, pid(9)),
            other => panic!("expected PUBREC, got {other:?}"),
        }
        expect(
            &b,
            |s| (s.in_inflights.count, s.message_queues.count),
            (1, 4),
        )
        .await;
        publisher.send(Packet::Pubrel(PubAck::new(pid(9)))).await;
        match publisher.recv().await {
            Some(Packet::Pubcomp(r)) => assert_eq!(r.packet_id, pid(9)),
            other => panic!("expected PUBCOMP, got {other:?}"),
        }
        let s = expect(&b, |s| s.in_inflights.count, 0).await;
        assert_eq!(s.in_inflights.max, 1, "{s:?}");

        // Acknowledging a delivery moves the window on: one of the queued goes out.
        let first = match sub.recv().await {
            Some(Packet::Publish(p)) => p,
            other => panic!("expected PUBLISH, got {other:?}"),
        };
        sub.send(Packet::Puback(PubAck::new(first.packet_id.unwrap())))
            .await;
        expect(
            &b,
            |s| (s.out_inflights.count, s.message_queues.count),
            (2, 3),
        )
        .await;

        // Offline, the session keeps what it holds.
        sub.kill();
        let s = expect(&b, |s| s.connections.count, 1).await;
        assert_eq!(
            (s.out_inflights.count, s.message_queues.count),
            (2, 3),
            "{s:?}"
        );

        // A clean start ends the session: nothing is held any more, the marks stay.
        let again = Client::connect(addr, Protocol::V5, "slow", true).await;
        let s = expect(
            &b,
            |s| (s.out_inflights.count, s.message_queues.count),
            (0, 0),
        )
        .await;
        assert_eq!((s.out_inflights.max, s.message_queues.max), (2, 4), "{s:?}");
        assert_eq!(s.forwards.count, 0, "one node forwards nothing: {s:?}");
        again.disconnect().await;
        publisher.disconnect().await;
    })
}

/// Holds the CONNECT of user "held" until the test lets it through (then leaves it to the
/// listener, which allows anonymous and unknown users here); ignores everyone else.
struct HoldUntil(watch::Receiver<bool>);

impl AuthnProvider for HoldUntil {
    fn authenticate(&self, req: &ConnectRequest<'_>) -> Verdict<AuthnAnswer> {
        if req.username != Some("held") {
            return Verdict::Now(AuthnAnswer::Ignore);
        }
        let mut open = self.0.clone();
        Verdict::later(async move {
            let _ = open.wait_for(|v| *v).await;
            AuthnAnswer::Ignore
        })
    }
}

#[test]
fn a_connect_being_authenticated_is_active_and_connacks_have_a_rate() {
    common::on_actix(async {
        let text = "[[listeners]]\nkind = \"tcp\"\nbind = \"127.0.0.1:0\"\n\
                    [mqtt]\nsys_interval_secs = 86400\n[storage]\nenabled = false\n";
        let (config, _) = Config::from_str(text).expect("test config");
        let (open, gate) = watch::channel(false);
        let b = Broker::start_with(config, Hooks::new().authenticate_with(HoldUntil(gate)))
            .await
            .expect("broker starts");
        let addr = b.local_addr(ListenerKind::Tcp).expect("tcp listener");

        // A connection that has not sent its CONNECT is handshaking but not active.
        let idle = tokio::net::TcpStream::connect(addr).await.unwrap();
        let s = expect(&b, |s| s.handshakings.count, 1).await;
        assert_eq!(s.handshakings_active.count, 0, "{s:?}");
        drop(idle);
        expect(&b, |s| s.handshakings.count, 0).await;

        // A CONNECT that its authenticator holds is both, until its verdict.
        let mut held = connect_packet(Protocol::V5, "held", true);
        held.username = Some("held".into());
        let connecting = Client::open(addr, held);
        let watching = async {
            let s = expect(
                &b,
                |s| (s.handshakings.count, s.handshakings_active.count),
                (1, 1),
            )
            .await;
            assert_eq!(s.handshakings_rate.max, 0, "no CONNACK yet: {s:?}");
            open.send(true).unwrap();
        };
        let ((c, ack), ()) = futures::join!(connecting, watching);
        assert_eq!(ack.reason_code, ReasonCode::Success);
        let s = expect(&b, |s| s.handshakings_active.count, 0).await;
        assert_eq!(s.handshakings_active.max, 1, "{s:?}");

        // Five more CONNACKs: the rate of a whole second counts them (the six may straddle
        // a second's end, so the busiest second has at least three), then falls to 0.
        let mut clients = vec![c];
        for i in 0..5 {
            clients.push(Client::connect(addr, Protocol::V5, &format!("r{i}"), true).await);
        }
        let s = expect(&b, |s| s.handshakings_rate.max >= 3, true).await;
        assert!(s.handshakings_rate.max <= 6, "{s:?}");
        let s = expect(&b, |s| s.handshakings_rate.count, 0).await;
        assert!(s.handshakings_rate.max >= 3, "the mark stays: {s:?}");
        for c in clients {
            c.disconnect().await;
        }
    })
}
