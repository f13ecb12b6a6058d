//! RMQTT's metric names count what happened: after a known sequence of connects, refused
//! logins, subscribes, publishes, a will and disconnects, every counter reads exactly what
//! the sequence implies (as differences from before it, so that the `$SYS` actor's first
//! publications do not count).

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{broker, connect_packet, temp_dir, will, Client};
use starling_broker::{AdminPublish, Broker, MetricsSnapshot, RmqttSnapshot};
use starling_codec::{Properties, Protocol, QoS, ReasonCode};
use tokio::io::AsyncReadExt;

/// A broker with alice in a password file, anonymous clients refused, an ACL that denies
/// `secret/#` to subscribers and `forbidden/#` to publishers, one subscription per client,
/// a 1 s CONNECT deadline, and `$SYS` published once (at start) within the test.
async fn broker_for_metrics() -> (Broker, std::net::SocketAddr) {
    let dir = temp_dir("rmqtt-metrics");
    let passwd = dir.join("passwd");
    starling_auth::add_or_update(&passwd, "alice", b"alice-pw").unwrap();
    let acl = dir.join("acl.toml");
    std::fs::write(
        &acl,
        "[[rules]]\npermission = \"deny\"\naction = \"subscribe\"\ntopics = [\"secret/#\"]\n\
         [[rules]]\npermission = \"deny\"\naction = \"publish\"\ntopics = [\"forbidden/#\"]\n",
    )
    .unwrap();
    broker(&format!(
        "allow_anonymous = false\nhandshake_timeout_secs = 1\n\
         [mqtt]\nsubscriptions_max = 1\nsys_interval_secs = 86400\n\
         [auth]\npassword_file = {:?}\nacl_file = {:?}\n",
        passwd.display().to_string(),
        acl.display().to_string()
    ))
    .await
}

async fn login(
    addr: std::net::SocketAddr,
    id: &str,
    password: Option<&str>,
    clean: bool,
) -> (Client, starling_codec::Connack) {
    let mut c = connect_packet(Protocol::V5, id, clean);
    if let Some(pw) = password {
        c.username = Some("alice".to_owned());
        c.password = Some(Bytes::from(pw.to_owned()));
    }
    if !clean {
        c.properties.session_expiry_interval = Some(3600);
    }
    Client::open(addr, c).await
}

/// The snapshot, and its change since `before`, once `done` holds of the change (the
/// broker counts some figures after the packets a test sees: acknowledgements, the last
/// disconnect).
async fn settled(
    b: &Broker,
    before: &RmqttSnapshot,
    done: impl Fn(&RmqttSnapshot) -> bool,
) -> (MetricsSnapshot, RmqttSnapshot) {
    let mut m = b.metrics();
    for _ in 0..500 {
        if done(&m.rmqtt.since(before)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        m = b.metrics();
    }
    let d = m.rmqtt.since(before);
    (m, d)
}

#[test]
fn rmqtt_metrics_count_a_known_sequence_exactly() {
    common::on_actix(async {
        let (b, addr) = broker_for_metrics().await;
        // At start only the `$SYS` actor publishes, and no one subscribes to `$SYS`: every
        // one of its messages matched nothing. Its round at start ends with the listener's
        // counters: once the last of them is retained, the round is all counted as
        // published, and once routed, as matching nothing.
        let last = "$SYS/brokers/+/listeners/+/+/connect_timed_out";
        let mut round_done = false;
        for _ in 0..500 {
            round_done = !b.admin().retained(last, 0, 1).await.unwrap().0.is_empty();
            if round_done {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(round_done, "no {last} retained");
        let mut start = b.metrics();
        for _ in 0..500 {
            let r = &start.rmqtt;
            if r.messages_publish_system > 0
                && r.messages_nonsubscribed == r.messages_publish_system
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            start = b.metrics();
        }
        let r = &start.rmqtt;
        assert!(r.messages_publish_system > 0, "{r:?}");
        assert_eq!(r.messages_nonsubscribed, r.messages_publish_system, "{r:?}");
        assert_eq!(r.messages_publish, r.messages_publish_system, "{r:?}");
        let before = start.rmqtt;

        // A connection that never sends its CONNECT is closed at the deadline.
        let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut scratch = [0u8; 16];
        let closed = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut scratch)).await;
        assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");

        // Refused: anonymous, then a wrong password.
        let (_anon, ack) = login(addr, "anon", None, true).await;
        assert!(ack.reason_code.is_error(), "{ack:?}");
        let (_wrong, ack) = login(addr, "wrong", Some("nope"), true).await;
        assert_eq!(ack.reason_code, ReasonCode::BadUserNameOrPassword);

        // A subscriber with a session that outlives it: one filter denied by the ACL, one
        // granted, one past its quota of one.
        let (mut sub, ack) = login(addr, "sub", Some("alice-pw"), false).await;
        assert!(
            !ack.session_present && !ack.reason_code.is_error(),
            "{ack:?}"
        );
        let denied = sub.subscribe(1, "secret/x", QoS::AtLeastOnce).await;
        assert_eq!(denied.reason_codes, vec![ReasonCode::NotAuthorized]);
        let granted = sub.subscribe(2, "data/#", QoS::AtLeastOnce).await;
        assert_eq!(granted.reason_codes, vec![ReasonCode::GrantedQoS1]);
        let over = sub.subscribe(3, "other/x", QoS::AtLeastOnce).await;
        assert_eq!(over.reason_codes, vec![ReasonCode::QuotaExceeded]);

        // A publisher with a will: 5 publishes of which 2 match nothing, one denied by the
        // ACL, one to a reserved topic.
        let mut c = connect_packet(Protocol::V5, "pub", true);
        c.username = Some("alice".to_owned());
        c.password = Some(Bytes::from_static(b"alice-pw"));
        c.will = Some(will("data/will", "gone"));
        let (mut publisher, ack) = Client::open(addr, c).await;
        assert!(!ack.reason_code.is_error(), "{ack:?}");
        for topic in ["data/1", "nobody/1", "data/2", "nobody/2", "data/3"] {
            publisher
                .publish(topic, b"x", QoS::AtLeastOnce, false)
                .await;
        }
        for topic in ["forbidden/x", "$SYS/x"] {
            let code = publisher
                .publish_code(topic, b"x", QoS::AtLeastOnce, false)
                .await;
            assert_eq!(code, ReasonCode::NotAuthorized, "{topic}");
        }
        // Each topic in order, but three topics may be three shards: in any order.
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(sub.recv_publish().await.topic);
        }
        got.sort();
        assert_eq!(got, ["data/1", "data/2", "data/3"]);
        // One message through the operator's API, QoS 0 (no acknowledgement).
        b.admin()
            .publish(AdminPublish {
                topic: "data/admin".into(),
                payload: Bytes::from_static(b"op"),
                qos: QoS::AtMostOnce,
                retain: false,
                expiry_secs: None,
                properties: Properties::default(),
            })
            .await
            .unwrap();
        assert_eq!(sub.recv_publish().await.topic, "data/admin");
        // The publisher's connection breaks: its will goes out, its session ends.
        publisher.kill();
        assert_eq!(sub.recv_publish().await.topic, "data/will");

        // Two filters unsubscribed, of which one was subscribed.
        for (id, filter) in [(4, "data/#"), (5, "never/x")] {
            sub.send(starling_codec::Packet::Unsubscribe(
                starling_codec::Unsubscribe {
                    packet_id: common::pid(id),
                    filters: vec![filter.to_owned()],
                    properties: Properties::default(),
                },
            ))
            .await;
            assert!(matches!(
                sub.recv().await,
                Some(starling_codec::Packet::Unsuback(_))
            ));
        }
        // The subscriber leaves, comes back to its session, and leaves again.
        sub.disconnect().await;
        let (sub, ack) = login(addr, "sub", Some("alice-pw"), false).await;
        assert!(ack.session_present, "{ack:?}");
        sub.disconnect().await;

        // Six `$SYS` client events: sub, pub and sub again, each connected and disconnected.
        // Each is counted as published when made, and as matching nothing once its shard
        // routed it, a moment later: both are waited for.
        let (m, d) = settled(&b, &before, |d| {
            d.client_disconnected == 3
                && d.messages_acked == 4
                && d.messages_publish_system == 6
                && d.messages_nonsubscribed == 2 + 6
        })
        .await;
        let want = RmqttSnapshot {
            client_connect: 5,
            client_connack: 5,
            client_connack_error: 2,
            client_connack_auth_error: 2,
            client_authenticate: 5,
            client_auth_anonymous: 1,
            client_auth_anonymous_error: 1,
            client_connected: 3,
            client_disconnected: 3,
            client_handshaking_timeout: 1,
            client_subscribe: 3,
            client_subscribe_auth_error: 1,
            client_subscribe_error: 1,
            client_subscribe_check_acl: 2,
            client_unsubscribe: 2,
            client_publish_auth_error: 1,
            client_publish_error: 2,
            session_created: 2,
            session_resumed: 1,
            session_subscribed: 1,
            session_unsubscribed: 1,
            session_terminated: 1,
            messages_publish_admin: 1,
            messages_publish_lastwill: 1,
            messages_publish_system: 6,
            // Three deliveries of client publishes and the will, acknowledged.
            messages_acked: 4,
            // The two to `nobody/`, and the six `$SYS` events.
            messages_nonsubscribed: 2 + 6,
            messages_publish: 5 + 1 + 1 + 6,
            messages_publish_custom: 5,
            messages_delivered: 5,
            // The denied and the reserved publish.
            messages_dropped: 2,
            client_publish_check_acl: 5 + 1,
        };
        assert_eq!(d, want, "counted {m:?}");
        assert_eq!(m.rmqtt.messages_delivered, m.messages_sent);
    })
}
