//! Regression tests for the security defects found by probing the broker as a hostile
//! client would (issue 10): ACL rules that wildcard subscriptions bypassed, and client ids
//! that were not bound to their user. Raw sockets on loopback, bounded in time.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{broker, connect_packet, temp_dir, Client};
use starling_codec::{Packet, Protocol, QoS, ReasonCode};

const QUIET: Duration = Duration::from_millis(300);

/// A broker with alice and bob in a password file, anonymous clients refused, and `acl`.
async fn broker_with_users(
    name: &str,
    acl: &str,
    extra: &str,
) -> (starling_broker::Broker, std::net::SocketAddr) {
    let dir = temp_dir(name);
    let passwd = dir.join("passwd");
    starling_auth::add_or_update(&passwd, "alice", b"alice-pw").unwrap();
    starling_auth::add_or_update(&passwd, "bob", b"bob-pw").unwrap();
    let acl_file = dir.join("acl.toml");
    std::fs::write(&acl_file, acl).unwrap();
    let text = format!(
        "allow_anonymous = false\n[auth]\npassword_file = {:?}\nacl_file = {:?}\n{extra}",
        passwd.display().to_string(),
        acl_file.display().to_string()
    );
    broker(&text).await
}

async fn login(
    addr: std::net::SocketAddr,
    protocol: Protocol,
    user: &str,
    client_id: &str,
    clean: bool,
) -> (Client, starling_codec::Connack) {
    let mut c = connect_packet(protocol, client_id, clean);
    c.username = Some(user.to_owned());
    c.password = Some(Bytes::from(format!("{user}-pw")));
    if protocol == Protocol::V5 && !clean {
        c.properties.session_expiry_interval = Some(3600);
    }
    Client::open(addr, c).await
}

const BOB_DENIED_ALICE: &str = r##"
[[rules]]
permission = "deny"
action = "all"
user = "bob"
topics = ["private/alice/#"]

[[rules]]
permission = "deny"
action = "subscribe"
topics = ["secret/nosub"]
"##;

#[test]
fn wildcard_subscriptions_do_not_receive_what_a_deny_rule_withholds() {
    common::on_actix(async {
        let (b, addr) = broker_with_users("acl-wildcard", BOB_DENIED_ALICE, "").await;
        let (mut alice, ack) = login(addr, Protocol::V5, "alice", "alice-1", true).await;
        assert_eq!(ack.reason_code, ReasonCode::Success);
        // Retained before bob subscribes: a retained message is a delivery like any other.
        alice
            .publish(
                "private/alice/x",
                b"retained secret",
                QoS::AtLeastOnce,
                true,
            )
            .await;
        for protocol in [Protocol::V5, Protocol::V3_1_1] {
            for filter in ["#", "private/+/x", "private/alice/#"] {
                let (mut bob, ack) = login(addr, protocol, "bob", "bob-1", true).await;
                assert_eq!(ack.reason_code, ReasonCode::Success);
                let granted = bob.subscribe(1, filter, QoS::AtLeastOnce).await;
                if filter == "private/alice/#" {
                    // Inside the deny rule: nothing it could deliver is allowed.
                    assert!(granted.reason_codes[0].is_error(), "{filter}: {granted:?}");
                    continue;
                }
                assert_eq!(
                    granted.reason_codes,
                    vec![ReasonCode::GrantedQoS1],
                    "{filter}"
                );
                alice
                    .publish("private/alice/x", b"secret", QoS::AtLeastOnce, false)
                    .await;
                alice
                    .publish("private/bob/x", b"fine", QoS::AtLeastOnce, false)
                    .await;
                let p = bob.recv_publish().await;
                assert_eq!(
                    (p.topic.as_str(), &p.payload[..]),
                    ("private/bob/x", &b"fine"[..]),
                    "{protocol:?} {filter}: bob may read only what is not alice's"
                );
                bob.expect_no_publish(QUIET).await;
                bob.disconnect().await;
            }
        }
        assert!(b.metrics().dropped_acl >= 4, "{:?}", b.metrics());
    })
}

#[test]
fn a_deny_subscribe_rule_holds_against_a_wider_subscription() {
    common::on_actix(async {
        let (_b, addr) = broker_with_users("acl-nosub", BOB_DENIED_ALICE, "").await;
        let (mut alice, _) = login(addr, Protocol::V3_1_1, "alice", "alice-1", true).await;
        let (mut reader, _) = login(addr, Protocol::V5, "alice", "alice-2", true).await;
        assert_eq!(
            reader
                .subscribe(1, "secret/nosub", QoS::AtMostOnce)
                .await
                .reason_codes,
            vec![ReasonCode::NotAuthorized]
        );
        assert_eq!(
            reader
                .subscribe(2, "secret/#", QoS::AtMostOnce)
                .await
                .reason_codes,
            vec![ReasonCode::Success]
        );
        alice
            .publish("secret/nosub", b"no", QoS::AtMostOnce, false)
            .await;
        alice
            .publish("secret/ok", b"yes", QoS::AtMostOnce, false)
            .await;
        let p = reader.recv_publish().await;
        assert_eq!(p.topic, "secret/ok");
        reader.expect_no_publish(QUIET).await;
    })
}

#[test]
fn another_user_cannot_resume_a_persistent_session() {
    common::on_actix(async {
        let (b, addr) = broker_with_users("id-resume", "", "").await;
        for protocol in [Protocol::V5, Protocol::V3_1_1] {
            let (mut alice, ack) = login(addr, protocol, "alice", "alice-phone", false).await;
            assert_eq!(ack.reason_code, ReasonCode::Success);
            alice.subscribe(1, "cmd/alice", QoS::AtLeastOnce).await;
            alice.disconnect().await;
            let (mut other, _) = login(addr, protocol, "alice", "alice-laptop", true).await;
            other
                .publish("cmd/alice", b"queued", QoS::AtLeastOnce, false)
                .await;

            let (mut bob, ack) = login(addr, protocol, "bob", "alice-phone", false).await;
            assert_eq!(
                ack.reason_code,
                ReasonCode::ClientIdentifierNotValid,
                "{protocol:?}: bob must not get alice's session"
            );
            assert!(!ack.session_present);
            assert!(bob.recv().await.is_none(), "closed after the refusal");

            let (mut alice, ack) = login(addr, protocol, "alice", "alice-phone", false).await;
            assert!(
                ack.session_present,
                "{protocol:?}: alice's session is intact"
            );
            assert_eq!(&alice.recv_publish().await.payload[..], b"queued");
            // End the session so that the next protocol starts afresh.
            alice.disconnect().await;
            let (alice, _) = login(addr, protocol, "alice", "alice-phone", true).await;
            alice.disconnect().await;
        }
        assert_eq!(b.metrics().client_id_refused, 2);
    })
}

#[test]
fn another_user_cannot_take_over_an_online_session() {
    common::on_actix(async {
        let (_b, addr) = broker_with_users("id-takeover", "", "").await;
        let (mut alice, _) = login(addr, Protocol::V5, "alice", "alice-phone", true).await;
        alice.subscribe(1, "cmd/alice", QoS::AtLeastOnce).await;
        let (mut bob, ack) = login(addr, Protocol::V5, "bob", "alice-phone", true).await;
        assert_eq!(ack.reason_code, ReasonCode::ClientIdentifierNotValid);
        assert!(bob.recv().await.is_none());
        // alice was not kicked (no DISCONNECT 0x8E) and still gets her messages.
        let (mut other, _) = login(addr, Protocol::V5, "alice", "alice-laptop", true).await;
        other
            .publish("cmd/alice", b"still here", QoS::AtLeastOnce, false)
            .await;
        assert_eq!(&alice.recv_publish().await.payload[..], b"still here");
        // The same user takes over as before.
        let (_again, ack) = login(addr, Protocol::V5, "alice", "alice-phone", true).await;
        assert_eq!(ack.reason_code, ReasonCode::Success);
        match alice.recv().await {
            Some(Packet::Disconnect(d)) => assert_eq!(d.reason_code, ReasonCode::SessionTakenOver),
            other => panic!("expected DISCONNECT 0x8E, got {other:?}"),
        }
    })
}

#[test]
fn stricter_client_id_policies_hold_ids_to_usernames() {
    common::on_actix(async {
        let (_b, addr) =
            broker_with_users("id-policy", "", "client_id_policy = \"username_prefix\"\n").await;
        for (id, ok) in [
            ("bob", true),
            ("bob-phone", true),
            ("bobby", false),
            ("alice-1", false),
        ] {
            let (_c, ack) = login(addr, Protocol::V3_1_1, "bob", id, true).await;
            assert_eq!(
                ack.reason_code == ReasonCode::Success,
                ok,
                "client id {id}: {ack:?}"
            );
        }
    })
}
