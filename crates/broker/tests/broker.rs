//! Behaviour of the broker over real loopback sockets, one test per behaviour, each with its
//! own broker on an ephemeral port.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use starling_broker::MetricsSnapshot;
use starling_codec::{
    Packet, Properties, Protocol, Publish, QoS, ReasonCode, RetainHandling, SubscriptionOptions,
};

const ALL: [Protocol; 3] = [Protocol::V3_1, Protocol::V3_1_1, Protocol::V5];

fn granted(qos: QoS) -> ReasonCode {
    match qos {
        QoS::AtMostOnce => ReasonCode::GRANTED_QOS_0,
        QoS::AtLeastOnce => ReasonCode::GrantedQoS1,
        QoS::ExactlyOnce => ReasonCode::GrantedQoS2,
    }
}

#[test]
fn qos_0_1_2_round_trip_for_every_protocol_version() {
    common::on_actix(async {
        let (_b, addr) = broker("").await;
        for protocol in ALL {
            for qos in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce] {
                let topic = format!("rt/{protocol:?}/{qos:?}");
                let mut sub =
                    Client::connect(addr, protocol, &format!("s{protocol:?}{qos:?}"), true).await;
                let ack = sub.subscribe(1, &topic, qos).await;
                assert_eq!(ack.reason_codes, vec![granted(qos)]);
                let mut publ =
                    Client::connect(addr, protocol, &format!("p{protocol:?}{qos:?}"), true).await;
                publ.publish(&topic, b"hello", qos, false).await;
                let got = sub.recv_publish().await;
                assert_eq!(
                    (got.topic.as_str(), &got.payload[..], got.qos),
                    (topic.as_str(), &b"hello"[..], qos)
                );
                assert!(!got.retain);
                publ.disconnect().await;
                sub.disconnect().await;
            }
        }
    })
}

#[test]
fn retained_message_stored_delivered_on_subscribe_and_cleared_by_empty_payload() {
    common::on_actix(async {
        let (_b, addr) = broker("").await;
        let mut p = Client::connect(addr, Protocol::V5, "pub", true).await;
        p.publish("r/a", b"kept", QoS::AtLeastOnce, true).await;
        let mut s = Client::connect(addr, Protocol::V3_1_1, "sub", true).await;
        s.subscribe(1, "r/#", QoS::AtLeastOnce).await;
        let got = s.recv_publish().await;
        assert_eq!(
            (got.topic.as_str(), &got.payload[..], got.retain),
            ("r/a", &b"kept"[..], true)
        );
        // Retain handling 2 (v5): no retained message on subscribe.
        let mut s5 = Client::connect(addr, Protocol::V5, "sub5", true).await;
        let opts = SubscriptionOptions {
            qos: QoS::AtLeastOnce,
            retain_handling: RetainHandling::DoNotSend,
            ..Default::default()
        };
        s5.subscribe_with(1, "r/#", opts).await;
        s5.expect_no_publish(Duration::from_millis(300)).await;
        // An empty retained payload clears it (and is delivered to current subscribers).
        p.publish("r/a", b"", QoS::AtLeastOnce, true).await;
        let cleared = s.recv_publish().await;
        assert!(cleared.payload.is_empty());
        let mut late = Client::connect(addr, Protocol::V3_1_1, "late", true).await;
        late.subscribe(1, "r/#", QoS::AtLeastOnce).await;
        late.expect_no_publish(Duration::from_millis(300)).await;
    })
}

#[test]
fn will_published_on_ungraceful_disconnect_and_not_on_graceful() {
    common::on_actix(async {
        let (_b, addr) = broker("").await;
        let mut watcher = Client::connect(addr, Protocol::V3_1_1, "watcher", true).await;
        watcher.subscribe(1, "wills/#", QoS::AtLeastOnce).await;

        let mut c = connect_packet(Protocol::V3_1_1, "graceful", true);
        c.will = Some(will("wills/graceful", "gone"));
        let (graceful, _) = Client::open(addr, c).await;
        graceful.disconnect().await;
        watcher.expect_no_publish(Duration::from_millis(300)).await;

        let mut c = connect_packet(Protocol::V5, "crash", true);
        c.will = Some(will("wills/crash", "gone"));
        let (crash, _) = Client::open(addr, c).await;
        crash.kill();
        let got = watcher.recv_publish().await;
        assert_eq!(
            (got.topic.as_str(), &got.payload[..]),
            ("wills/crash", &b"gone"[..])
        );
    })
}

#[test]
fn persistent_session_queues_while_offline_and_delivers_after_reconnect() {
    common::on_actix(async {
        let (_b, addr) = broker("").await;
        for protocol in [Protocol::V3_1_1, Protocol::V5] {
            let id = format!("persistent{protocol:?}");
            let mut c = connect_packet(protocol, &id, false);
            c.properties.session_expiry_interval = Some(60);
            let (mut s, ack) = Client::open(addr, c.clone()).await;
            assert!(!ack.session_present);
            s.subscribe(1, "q/+", QoS::ExactlyOnce).await;
            s.disconnect().await;

            let mut p = Client::connect(addr, protocol, &format!("qp{protocol:?}"), true).await;
            // One topic: order is promised per topic (MQTT 4.6); two topics may live on
            // two shards, and the first PUBACK does not wait for the delivery.
            p.publish("q/1", b"one", QoS::AtLeastOnce, false).await;
            p.publish("q/1", b"two", QoS::ExactlyOnce, false).await;

            let (mut s, ack) = Client::open(addr, c).await;
            assert!(ack.session_present, "the session survived the disconnect");
            let a = s.recv_publish().await;
            let b = s.recv_publish().await;
            assert_eq!((&a.payload[..], &b.payload[..]), (&b"one"[..], &b"two"[..]));
            assert_eq!(b.qos, QoS::ExactlyOnce);
        }
    })
}

/// A client that asked to resume, was told there was no session and lost that CONNACK (or
/// gave up waiting for it) must not be told at its next CONNECT that a session is there:
/// it would take its old subscriptions for standing, and get nothing. Once it has sent
/// anything, the session is there as MQTT says.
#[test]
fn a_client_that_never_spoke_after_hearing_of_no_session_is_told_so_again() {
    common::on_actix(async {
        let (_b, addr) = broker("").await;
        for protocol in [Protocol::V3_1_1, Protocol::V5] {
            let mut c = connect_packet(protocol, &format!("unheard{protocol:?}"), false);
            c.properties.session_expiry_interval = Some(60);
            let (s, ack) = Client::open(addr, c.clone()).await;
            assert!(!ack.session_present);
            s.kill();
            let (s, ack) = Client::open(addr, c.clone()).await;
            assert!(!ack.session_present, "{protocol:?}: told again");
            // Taken over while still connected, without a word: the same.
            let (mut s2, ack) = Client::open(addr, c.clone()).await;
            assert!(!ack.session_present, "{protocol:?}: nor at a takeover");
            drop(s);
            s2.send(Packet::Pingreq).await;
            assert!(matches!(s2.recv().await, Some(Packet::Pingresp)));
            s2.kill();
            let (s3, ack) = Client::open(addr, c).await;
            assert!(ack.session_present, "{protocol:?}: heard from, it is there");
            s3.disconnect().await;
        }
    })
}

#[test]
fn takeover_closes_the_first_connection_with_0x8e_and_resumes_the_session() {
    common::on_actix(async {
        let (_b, addr) = broker("").await;
        let mut c = connect_packet(Protocol::V5, "twin", false);
        c.properties.session_expiry_interval = Some(60);
        let (mut first, _) = Client::open(addr, c.clone()).await;
        first.subscribe(1, "take/over", QoS::AtLeastOnce).await;
        let (mut second, ack) = Client::open(addr, c).await;
        assert!(ack.session_present);
        match first.recv().await {
            Some(Packet::Disconnect(d)) => assert_eq!(d.reason_code, ReasonCode::SessionTakenOver),
            other => panic!("expected DISCONNECT 0x8E, got {other:?}"),
        }
        assert!(
            first.recv().await.is_none(),
            "the first connection is closed"
        );
        let mut p = Client::connect(addr, Protocol::V3_1_1, "takepub", true).await;
        p.publish("take/over", b"x", QoS::AtLeastOnce, false).await;
        assert_eq!(&second.recv_publish().await.payload[..], b"x");
    })
}

#[test]
fn keepalive_timeout_closes_a_silent_client() {
    common::on_actix(async {
        let (_b, addr) = broker("").await;
        let mut c = connect_packet(Protocol::V5, "sleepy", true);
        c.keep_alive = 1;
        let (mut s, _) = Client::open(addr, c).await;
        // 1.5 × keep alive without a packet (MQTT 5 §3.1.2.10).
        match s.recv_within(Duration::from_secs(4)).await {
            Ok(Some(Packet::Disconnect(d))) => {
                assert_eq!(d.reason_code, ReasonCode::KeepAliveTimeout)
            }
            other => panic!("expected DISCONNECT 0x8D, got {other:?}"),
        }
    })
}

#[test]
fn malformed_packet_closes_with_disconnect_0x81() {
    common::on_actix(async {
        let (_b, addr) = broker("").await;
        let mut s = Client::connect(addr, Protocol::V5, "garbage", true).await;
        // PUBLISH with QoS 3 (reserved): malformed.
        s.send_raw(&[0x36, 0x03, 0x00, 0x01, b'a']).await;
        match s.recv().await {
            Some(Packet::Disconnect(d)) => assert_eq!(d.reason_code, ReasonCode::MalformedPacket),
            other => panic!("expected DISCONNECT 0x81, got {other:?}"),
        }
        assert!(s.recv().await.is_none());
        // 3.1.1: closed without a DISCONNECT.
        let mut s = Client::connect(addr, Protocol::V3_1_1, "garbage3", true).await;
        s.send_raw(&[0x36, 0x03, 0x00, 0x01, b'a']).await;
        assert!(s.recv().await.is_none());
    })
}

#[test]
fn oversize_packet_closes_with_disconnect_0x95() {
    common::on_actix(async {
        let (_b, addr) = broker("[mqtt]\nmax_packet_size = 1024\n").await;
        let mut s = Client::connect(addr, Protocol::V5, "big", true).await;
        s.send(Packet::Publish(Publish {
            dup: false,
            qos: QoS::AtMostOnce,
            retain: false,
            topic: "big".into(),
            packet_id: None,
            properties: Properties::default(),
            payload: Bytes::from(vec![0u8; 4096]),
        }))
        .await;
        match s.recv().await {
            Some(Packet::Disconnect(d)) => assert_eq!(d.reason_code, ReasonCode::PacketTooLarge),
            other => panic!("expected DISCONNECT 0x95, got {other:?}"),
        }
    })
}

#[test]
fn shared_subscription_delivers_round_robin() {
    common::on_actix(async {
        let (_b, addr) = broker("").await;
        let mut a = Client::connect(addr, Protocol::V5, "sa", true).await;
        let mut b = Client::connect(addr, Protocol::V5, "sb", true).await;
        a.subscribe(1, "$share/g/jobs", QoS::AtLeastOnce).await;
        b.subscribe(1, "$share/g/jobs", QoS::AtLeastOnce).await;
        let mut p = Client::connect(addr, Protocol::V5, "sp", true).await;
        for i in 0..4u8 {
            p.publish("jobs", &[i], QoS::AtLeastOnce, false).await;
        }
        let mut got_a = vec![
            a.recv_publish().await.payload[0],
            a.recv_publish().await.payload[0],
        ];
        let mut got_b = vec![
            b.recv_publish().await.payload[0],
            b.recv_publish().await.payload[0],
        ];
        got_a.sort_unstable();
        got_b.sort_unstable();
        assert!(
            got_a == vec![0, 2] && got_b == vec![1, 3]
                || got_a == vec![1, 3] && got_b == vec![0, 2],
            "{got_a:?} {got_b:?}"
        );
        a.expect_no_publish(Duration::from_millis(200)).await;
    })
}

#[test]
fn exclusive_subscription_refuses_a_second_subscriber() {
    common::on_actix(async {
        let (_b, addr) = broker("").await;
        let mut a = Client::connect(addr, Protocol::V5, "ea", true).await;
        let mut b = Client::connect(addr, Protocol::V5, "eb", true).await;
        assert_eq!(
            a.subscribe(1, "$exclusive/x", QoS::AtLeastOnce)
                .await
                .reason_codes,
            vec![ReasonCode::GrantedQoS1]
        );
        assert!(b
            .subscribe(1, "$exclusive/x", QoS::AtLeastOnce)
            .await
            .reason_codes[0]
            .is_error());
        let mut p = Client::connect(addr, Protocol::V5, "ep", true).await;
        p.publish("x", b"only-a", QoS::AtLeastOnce, false).await;
        assert_eq!(&a.recv_publish().await.payload[..], b"only-a");
        // Released when the holder leaves.
        a.disconnect().await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            b.subscribe(2, "$exclusive/x", QoS::AtLeastOnce)
                .await
                .reason_codes,
            vec![ReasonCode::GrantedQoS1]
        );
    })
}

#[test]
fn limit_subscription_admits_at_most_n_subscribers() {
    common::on_actix(async {
        let (_b, addr) = broker("").await;
        let mut clients = Vec::new();
        for i in 0..3 {
            let mut c = Client::connect(addr, Protocol::V5, &format!("l{i}"), true).await;
            let ack = c.subscribe(1, "$limit/2/lim", QoS::AtMostOnce).await;
            clients.push((c, ack.reason_codes[0]));
        }
        let codes: Vec<_> = clients.iter().map(|(_, c)| *c).collect();
        assert_eq!(
            codes[..2],
            [ReasonCode::GRANTED_QOS_0, ReasonCode::GRANTED_QOS_0]
        );
        assert!(codes[2].is_error());
        let mut p = Client::connect(addr, Protocol::V5, "lp", true).await;
        p.publish("lim", b"m", QoS::AtMostOnce, false).await;
        for (c, _) in clients.iter_mut().take(2) {
            assert_eq!(&c.recv_publish().await.payload[..], b"m");
        }
    })
}

#[test]
fn delayed_publish_arrives_after_its_delay() {
    common::on_actix(async {
        let (_b, addr) = broker("").await;
        let mut s = Client::connect(addr, Protocol::V5, "ds", true).await;
        s.subscribe(1, "later", QoS::AtLeastOnce).await;
        let mut p = Client::connect(addr, Protocol::V5, "dp", true).await;
        let t0 = starling_rt::time::now();
        p.publish("$delayed/1/later", b"tick", QoS::AtLeastOnce, false)
            .await;
        s.expect_no_publish(Duration::from_millis(600)).await;
        let got = s.recv_publish().await;
        assert_eq!(
            (got.topic.as_str(), &got.payload[..]),
            ("later", &b"tick"[..])
        );
        assert!(
            t0.elapsed() >= Duration::from_millis(900),
            "arrived after {:?}",
            t0.elapsed()
        );
    })
}

#[test]
fn acl_denied_subscribe_gets_0x87_in_v5_and_0x80_in_v311() {
    common::on_actix(async {
        let dir = temp_dir("acl");
        let acl = dir.join("acl.toml");
        std::fs::write(
            &acl,
            "[[rules]]\npermission = \"deny\"\naction = \"subscribe\"\ntopics = [\"secret/#\"]\n",
        )
        .unwrap();
        let (_b, addr) = broker(&format!(
            "[auth]\nacl_file = {:?}\n",
            acl.display().to_string()
        ))
        .await;
        let mut v5 = Client::connect(addr, Protocol::V5, "acl5", true).await;
        assert_eq!(
            v5.subscribe(1, "secret/x", QoS::AtLeastOnce)
                .await
                .reason_codes,
            vec![ReasonCode::NotAuthorized]
        );
        let mut v3 = Client::connect(addr, Protocol::V3_1_1, "acl3", true).await;
        let codes = v3
            .subscribe(1, "secret/x", QoS::AtLeastOnce)
            .await
            .reason_codes;
        // 3.1.1 has one failure code, 0x80, which decodes as UnspecifiedError.
        assert_eq!(codes, vec![ReasonCode::UnspecifiedError]);
        assert_eq!(
            v3.subscribe(2, "public/x", QoS::AtLeastOnce)
                .await
                .reason_codes,
            vec![ReasonCode::GrantedQoS1]
        );
    })
}

#[test]
fn bad_password_is_refused_with_0x86_in_v5_and_0x04_in_v311() {
    common::on_actix(async {
        let dir = temp_dir("passwd");
        let file = dir.join("passwd");
        starling_auth::add_or_update(&file, "alice", b"right").unwrap();
        let (_b, addr) = broker(&format!(
            "[auth]\npassword_file = {:?}\n",
            file.display().to_string()
        ))
        .await;
        for (protocol, code) in [
            (Protocol::V5, ReasonCode::BadUserNameOrPassword),
            (Protocol::V3_1_1, ReasonCode::BadUserNameOrPassword),
        ] {
            let mut c = connect_packet(protocol, "alice-client", true);
            c.username = Some("alice".into());
            c.password = Some(Bytes::from_static(b"wrong"));
            let (mut cl, ack) = Client::open(addr, c.clone()).await;
            // The codec maps 3.1.1 return code 0x04 back to 0x86.
            assert_eq!(ack.reason_code, code, "{protocol:?}");
            assert!(cl.recv().await.is_none(), "closed after the refusal");
            c.password = Some(Bytes::from_static(b"right"));
            let (_ok, ack) = Client::open(addr, c).await;
            assert_eq!(ack.reason_code, ReasonCode::Success);
        }
    })
}

#[test]
fn sys_topics_are_published_with_stats_and_client_events() {
    common::on_actix(async {
        let (_b, addr) = broker("[node]\nname = \"n1\"\n[mqtt]\nsys_interval_secs = 1\n").await;
        let mut s = Client::connect(addr, Protocol::V5, "sys", true).await;
        s.subscribe(1, "$SYS/brokers/n1/#", QoS::AtMostOnce).await;
        let mut seen = std::collections::BTreeSet::new();
        let _other = Client::connect(addr, Protocol::V3_1_1, "evt", true).await;
        let want = [
            "version",
            "uptime",
            "clients/connected",
            "messages/received",
            "bytes/sent",
            "subscriptions/count",
            "retained/count",
            "clients/evt/connected",
        ];
        let deadline = starling_rt::time::now() + Duration::from_secs(5);
        while !want.iter().all(|w| seen.contains(*w)) && starling_rt::time::now() < deadline {
            let p = s.recv_publish().await;
            seen.insert(p.topic.trim_start_matches("$SYS/brokers/n1/").to_owned());
        }
        for w in want {
            assert!(seen.contains(w), "missing $SYS topic {w}: saw {seen:?}");
        }
        // `#` at the first level does not match `$SYS` (MQTT 5 §4.7.2).
        let mut all = Client::connect(addr, Protocol::V5, "hash", true).await;
        all.subscribe(1, "#", QoS::AtMostOnce).await;
        all.expect_no_publish(Duration::from_millis(1500)).await;
    })
}

#[test]
fn sys_stats_and_metrics_as_json_are_there_from_the_start() {
    common::on_actix(async {
        // A period far longer than the test: what arrives is the snapshot taken at start,
        // retained.
        let (_b, addr) = broker("[node]\nname = \"n1\"\n[mqtt]\nsys_interval_secs = 600\n").await;
        let mut s = Client::connect(addr, Protocol::V5, "sys", true).await;
        s.subscribe(1, "$SYS/brokers/n1/+", QoS::AtMostOnce).await;
        let mut got = std::collections::BTreeMap::new();
        let want = ["$SYS/brokers/n1/stats", "$SYS/brokers/n1/metrics"];
        while !want.iter().all(|w| got.contains_key(*w)) {
            let p = tokio::time::timeout(Duration::from_secs(2), s.recv_publish())
                .await
                .expect("the retained snapshots arrive at once");
            let text = String::from_utf8(p.payload.to_vec()).unwrap();
            got.insert(p.topic.clone(), text);
        }
        let stats = &got["$SYS/brokers/n1/stats"];
        assert!(stats.starts_with('{') && stats.ends_with('}'), "{stats}");
        for key in [
            "connections.count",
            "connections.max",
            "sessions.count",
            "sessions.max",
            "message_storages.count",
            "message_storages.max",
            "subscriptions.count",
            "subscriptions.max",
            "subscriptions_shared.max",
            "retaineds.count",
            "retaineds.max",
            "delayed_publishs.max",
            "topics.max",
            "handshakings.count",
            "routes.count",
            "message_queues.max",
            "out_inflights.count",
            "in_inflights.max",
            "forwards.count",
        ] {
            assert!(
                stats.contains(&format!("\"{key}\":")),
                "{key} missing: {stats}"
            );
        }
        let metrics = &got["$SYS/brokers/n1/metrics"];
        for key in [
            "messages.received",
            "bytes.sent",
            "dropped.queue.full",
            "store.commits",
            "client.connect",
            "client.connack.auth.error",
            "messages.publish.system",
            "messages.nonsubscribed",
        ] {
            assert!(
                metrics.contains(&format!("\"{key}\":")),
                "{key} missing: {metrics}"
            );
        }
        let named = starling_broker::MetricsSnapshot::default().every().len();
        assert_eq!(metrics.matches(':').count(), named, "{metrics}");
    })
}

#[test]
fn slow_subscriber_queue_is_bounded_and_drops_are_counted() {
    common::on_actix(async {
        let (b, addr) =
            broker("[mqtt]\nmax_inflight = 4\nmax_mqueue_len = 10\nbackpressure = false\n").await;
        // A subscriber that never acknowledges: 4 in flight, 10 queued, the rest dropped.
        let mut slow = Client::connect(addr, Protocol::V5, "slow", true).await;
        slow.subscribe(1, "flood", QoS::AtLeastOnce).await;
        let mut p = Client::connect(addr, Protocol::V5, "fast", true).await;
        for i in 0..100u32 {
            p.publish("flood", &i.to_be_bytes(), QoS::AtLeastOnce, false)
                .await;
        }
        let mut inflight = 0;
        while let Ok(Some(Packet::Publish(_))) = slow.recv_within(Duration::from_millis(300)).await
        {
            inflight += 1;
        }
        assert_eq!(inflight, 4, "the window bounds what is in flight");
        let m = b.metrics();
        assert_eq!(
            m.dropped_queue_full + m.dropped_mailbox_full,
            100 - 4 - 10,
            "{m:?}"
        );
    })
}

fn publish_packet(topic: &str, i: u32) -> Packet {
    Packet::Publish(Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: false,
        topic: topic.to_owned(),
        packet_id: Some(pid(i as u16 + 1)),
        properties: Properties::default(),
        payload: Bytes::copy_from_slice(&i.to_be_bytes()),
    })
}

/// Reads what arrives within `d`: PUBACK count, and whether a PINGRESP came.
async fn acks_within(c: &mut Client, d: Duration) -> (usize, bool) {
    let (mut acks, mut pong) = (0, false);
    loop {
        match c.recv_within(d).await {
            Ok(Some(Packet::Puback(_))) => acks += 1,
            Ok(Some(Packet::Pingresp)) => pong = true,
            Err(()) => return (acks, pong),
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn backlogged_subscriber_holds_back_its_qos1_publisher_and_loses_nothing() {
    common::on_actix(async {
        let (b, addr) = broker("[mqtt]\nmax_inflight = 4\nmax_mqueue_len = 100\n").await;
        let mut slow = Client::connect(addr, Protocol::V5, "slow", true).await;
        slow.subscribe(1, "flood", QoS::AtLeastOnce).await;
        let mut p = Client::connect(addr, Protocol::V5, "fast", true).await;
        // Chunks of 20, each given time to settle: 4 in flight, then the queue grows to 56
        // after 60 (backlogged from 50); the next chunk is routed and marks the publisher, and
        // from then on its PUBLISH packets are not taken.
        for chunk in 0..6u32 {
            for i in chunk * 20..(chunk + 1) * 20 {
                p.send(publish_packet("flood", i)).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        p.send(Packet::Pingreq).await;
        let (acks, pong) = acks_within(&mut p, Duration::from_millis(500)).await;
        // Some of the chunk that found the subscriber backlogged may pass, as they are read
        // before the router's word reaches the publisher; none after it.
        assert!((54..=80).contains(&acks), "{acks} acknowledged");
        assert!(pong, "a held-back client still answers PINGREQ");
        // The subscriber catches up: every message arrives, in order, and the publisher is let
        // go once the queue is down to a quarter.
        for i in 0..120u32 {
            let m = slow.recv_publish().await;
            assert_eq!(&m.payload[..], &i.to_be_bytes(), "message {i}");
        }
        let (rest, _) = acks_within(&mut p, Duration::from_millis(500)).await;
        assert_eq!(acks + rest, 120);
        let m = b.metrics();
        assert_eq!(m.dropped_queue_full + m.dropped_mailbox_full, 0, "{m:?}");
    })
}

/// Three subscribers that read nothing, and a QoS 0 publisher sending 1 KiB messages for
/// `secs` (or until it is no longer read): the broker's metrics after.
async fn qos0_flood_into_readers_that_stall(extra: &str, secs: u64) -> MetricsSnapshot {
    let (b, addr) = broker(extra).await;
    let mut subs = Vec::new();
    for k in 0..3 {
        let mut s = Client::connect(addr, Protocol::V5, &format!("stalled{k}"), true).await;
        s.subscribe(1, "flood", QoS::AtMostOnce).await;
        subs.push(s);
    }
    let mut p = Client::connect(addr, Protocol::V5, "flooder", true).await;
    let payload = [7u8; 1024];
    // Many times what the sockets, mailboxes and pending lists hold.
    let flood = async {
        for _ in 0..50_000u32 {
            p.publish("flood", &payload, QoS::AtMostOnce, false).await;
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(secs), flood).await;
    b.metrics()
}

#[test]
fn a_qos0_flood_whose_deliveries_find_no_room_holds_its_publisher() {
    common::on_actix(async {
        // Once every delivery of a publish is dropped, its publisher is read no more (the
        // flood does not finish) and only what was read before the hold was dropped.
        // (Stall rules wide enough that the stalled readers keep holding.)
        let m = qos0_flood_into_readers_that_stall(
            "[mqtt]\nmax_mqueue_len = 100\nbackpressure_stall_secs = 60\nbackpressure_max_secs = 60\n",
            3,
        )
        .await;
        assert!(m.backpressure_holds >= 1, "never held: {m:?}");
        let dropped = m.dropped_queue_full + m.dropped_mailbox_full;
        assert!(dropped > 0, "{m:?}");
        assert!(
            m.messages_received < 50_000 / 2 && dropped < 3 * 50_000 / 2,
            "the publisher went on being read after it was held: {m:?}"
        );
    })
}

#[test]
fn without_backpressure_qos0_a_qos0_flood_is_never_held_and_drops() {
    common::on_actix(async {
        let m = qos0_flood_into_readers_that_stall(
            "[mqtt]\nmax_mqueue_len = 100\nbackpressure_qos0 = false\n",
            20,
        )
        .await;
        assert_eq!(m.backpressure_holds, 0, "{m:?}");
        let dropped = m.dropped_queue_full + m.dropped_mailbox_full;
        assert!(
            m.messages_received > 50_000 / 2 && dropped > 50_000,
            "the flood went through and was mostly dropped: {m:?}"
        );
    })
}

/// CPU time this process has used (user + system), from /proc/self/stat.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // The fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    // USER_HZ is 100 on every Linux this runs on.
    Duration::from_millis(ticks * 10)
}

#[test]
fn a_held_publisher_whose_connection_ends_waits_idle_and_its_messages_still_go() {
    common::on_actix(async {
        let (b, addr) = broker("[mqtt]\nmax_inflight = 4\nmax_mqueue_len = 100\n").await;
        let mut slow = Client::connect(addr, Protocol::V5, "slow", true).await;
        slow.subscribe(1, "flood", QoS::AtLeastOnce).await;
        let mut p = Client::connect(addr, Protocol::V5, "fast", true).await;
        for chunk in 0..6u32 {
            for i in chunk * 20..(chunk + 1) * 20 {
                p.send(publish_packet("flood", i)).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Held back now, with PUBLISH packets read and waiting; then its connection ends.
        p.kill();
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Its actor waits for the release rather than handing the held packets round again.
        let before = cpu_time();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let spent = cpu_time() - before;
        assert!(
            spent < Duration::from_millis(500),
            "{spent:?} of CPU in 1 s while held"
        );
        // Once the subscriber drains, what the publisher sent before it went is routed.
        for i in 0..120u32 {
            let m = slow.recv_publish().await;
            assert_eq!(&m.payload[..], &i.to_be_bytes(), "message {i}");
        }
        let m = b.metrics();
        assert_eq!(m.dropped_queue_full + m.dropped_mailbox_full, 0, "{m:?}");
    })
}

#[test]
fn a_subscriber_that_stops_acknowledging_holds_its_publisher_back_only_so_long() {
    common::on_actix(async {
        // 3 s: well past how long the sends take (0.3 s), even on a loaded machine.
        let (b, addr) =
            broker("[mqtt]\nmax_inflight = 4\nmax_mqueue_len = 100\nbackpressure_max_secs = 3\n")
                .await;
        // Subscribed, then never reads or acknowledges again.
        let mut stuck = Client::connect(addr, Protocol::V5, "stuck", true).await;
        stuck.subscribe(1, "flood", QoS::AtLeastOnce).await;
        let mut p = Client::connect(addr, Protocol::V5, "fast", true).await;
        let start = starling_rt::time::now();
        // In chunks with pauses, so that the router keeps up: a burst read before the router
        // has routed any of it all goes through (it is acknowledged, then kept or dropped).
        for chunk in 0..15u32 {
            for i in chunk * 20..(chunk + 1) * 20 {
                p.send(publish_packet("flood", i)).await;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Until the acknowledgements pause: the hold.
        let (early, _) = acks_within(&mut p, Duration::from_millis(300)).await;
        let held_at = start.elapsed();
        assert!(
            early < 300,
            "held back at first ({early} acknowledged in {held_at:?})"
        );
        // Past backpressure_max_secs the subscriber stops holding it: the rest is taken, and
        // what does not fit the subscriber's queue is dropped, as without back-pressure.
        let (late, _) = acks_within(&mut p, Duration::from_secs(5)).await;
        assert_eq!(early + late, 300);
        assert!(
            start.elapsed() >= Duration::from_millis(2500),
            "released after about backpressure_max_secs, not at once ({:?})",
            start.elapsed()
        );
        let m = b.metrics();
        assert!(m.dropped_queue_full + m.dropped_mailbox_full > 0, "{m:?}");
        drop(stuck);
    })
}

#[test]
fn two_clients_flooding_each_other_do_not_hold_each_other_forever() {
    common::on_actix(async {
        let (b, addr) = broker("[mqtt]\nmax_inflight = 2\nmax_mqueue_len = 200\n").await;
        let mut a = Client::connect(addr, Protocol::V3_1_1, "a", true).await;
        let mut z = Client::connect(addr, Protocol::V3_1_1, "z", true).await;
        a.subscribe(1, "to/a", QoS::AtLeastOnce).await;
        z.subscribe(1, "to/z", QoS::AtLeastOnce).await;
        // Each floods the other without reading, so both end up backlogged and held back;
        // then each reads and acknowledges what it gets: the acknowledgements pass the held
        // publishes, so both drain and everything arrives.
        const N: u32 = 300;
        let send_all = |c: &'static str| {
            let topic = format!("to/{c}");
            (0..N).map(move |i| publish_packet(&topic, i))
        };
        for (pa, pz) in send_all("z").zip(send_all("a")) {
            a.send(pa).await;
            z.send(pz).await;
        }
        let drain = |mut c: Client| async move {
            let mut got = Vec::new();
            while got.len() < N as usize {
                let Ok(p) = c.recv_within(WAIT).await else {
                    break;
                };
                match p {
                    Some(Packet::Publish(m)) => {
                        c.send(Packet::Puback(starling_codec::PubAck::new(
                            m.packet_id.unwrap(),
                        )))
                        .await;
                        got.push(u32::from_be_bytes(m.payload[..4].try_into().unwrap()));
                    }
                    Some(Packet::Puback(_)) => {}
                    other => panic!("unexpected {other:?}"),
                }
            }
            got
        };
        let (ga, gz) = tokio::join!(drain(a), drain(z));
        let want: Vec<u32> = (0..N).collect();
        let m = b.metrics();
        assert_eq!(m.dropped_queue_full + m.dropped_mailbox_full, 0, "{m:?}");
        assert_eq!(ga, want);
        assert_eq!(gz, want);
    })
}

#[test]
fn connect_with_unknown_protocol_version_gets_0x84() {
    common::on_actix(async {
        let (_b, addr) = broker("").await;
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // CONNECT "MQTT" level 9.
        s.write_all(&[
            0x10, 0x0c, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x09, 0x02, 0x00, 0x3c, 0x00, 0x00,
        ])
        .await
        .unwrap();
        let mut buf = [0u8; 4];
        tokio::time::timeout(WAIT, s.read_exact(&mut buf))
            .await
            .unwrap()
            .unwrap();
        // 3.x form: return code 0x01 unacceptable protocol version.
        assert_eq!(buf, [0x20, 0x02, 0x00, 0x01]);
    })
}
