//! The router split over several topic shards (`[router] shards`), on the production
//! backend over loopback: what lives on every shard (wildcard filters) and what must be
//! counted once across them (`$exclusive/`, `$limit/N/`, `$SYS` counts) behaves as with one.

mod common;

use common::{broker, on_actix, Client};
use starling_codec::{Protocol, QoS, ReasonCode};

const SHARDS: &str = "[router]\nshards = 4\n";

#[test]
fn a_wildcard_subscription_finds_retained_messages_on_every_shard() {
    on_actix(async {
        let (_b, addr) = broker(SHARDS).await;
        let mut p = Client::connect(addr, Protocol::V5, "pub", true).await;
        // Sixteen topics over four shards: all but a vanishing chance touch several.
        for i in 0..16 {
            p.publish(&format!("site/{i}/temp"), b"21", QoS::AtLeastOnce, true)
                .await;
        }
        p.publish("site/0/temp", b"", QoS::AtLeastOnce, true).await;
        let mut s = Client::connect(addr, Protocol::V5, "sub", true).await;
        let ack = s.subscribe(1, "site/+/temp", QoS::AtLeastOnce).await;
        assert_eq!(ack.reason_codes, [ReasonCode::GrantedQoS1]);
        let mut got = Vec::new();
        for _ in 1..16 {
            let m = s.recv_publish().await;
            assert!(m.retain);
            got.push(m.topic);
        }
        got.sort();
        let mut want: Vec<String> = (1..16).map(|i| format!("site/{i}/temp")).collect();
        want.sort();
        assert_eq!(got, want);
        s.expect_no_publish(std::time::Duration::from_millis(300))
            .await;
    });
}

#[test]
fn exclusive_and_limit_are_counted_once_across_shards() {
    on_actix(async {
        let (_b, addr) = broker(SHARDS).await;
        let mut a = Client::connect(addr, Protocol::V5, "a", true).await;
        let mut b = Client::connect(addr, Protocol::V5, "b", true).await;
        let mut c = Client::connect(addr, Protocol::V5, "c", true).await;
        let ok = a.subscribe(1, "$exclusive/cmd/#", QoS::AtLeastOnce).await;
        assert_eq!(ok.reason_codes, [ReasonCode::GrantedQoS1]);
        let no = b.subscribe(1, "$exclusive/cmd/#", QoS::AtLeastOnce).await;
        assert_eq!(no.reason_codes, [ReasonCode::QuotaExceeded]);
        for (cl, want) in [
            (&mut a, ReasonCode::GrantedQoS1),
            (&mut b, ReasonCode::GrantedQoS1),
            (&mut c, ReasonCode::QuotaExceeded),
        ] {
            let ack = cl.subscribe(2, "$limit/2/job/+", QoS::AtLeastOnce).await;
            assert_eq!(ack.reason_codes, [want]);
        }
        // The holder gets publishes routed by any shard; the refused one none.
        let mut p = Client::connect(addr, Protocol::V5, "p", true).await;
        for i in 0..8 {
            p.publish(&format!("cmd/{i}"), b"go", QoS::AtLeastOnce, false)
                .await;
        }
        for _ in 0..8 {
            assert!(a.recv_publish().await.topic.starts_with("cmd/"));
        }
        b.expect_no_publish(std::time::Duration::from_millis(300))
            .await;
        // Once the holder leaves, another may take the filter.
        a.send(starling_codec::Packet::Unsubscribe(
            starling_codec::Unsubscribe {
                packet_id: common::pid(3),
                filters: vec!["$exclusive/cmd/#".into()],
                properties: Default::default(),
            },
        ))
        .await;
        match a.recv().await {
            Some(starling_codec::Packet::Unsuback(u)) => {
                assert_eq!(u.reason_codes, [ReasonCode::Success])
            }
            other => panic!("expected UNSUBACK, got {other:?}"),
        }
        let ok = b.subscribe(4, "$exclusive/cmd/#", QoS::AtLeastOnce).await;
        assert_eq!(ok.reason_codes, [ReasonCode::GrantedQoS1]);
        p.publish("cmd/9", b"go", QoS::AtLeastOnce, false).await;
        assert_eq!(b.recv_publish().await.topic, "cmd/9");
    });
}

#[test]
fn overlapping_filters_on_several_shards_deliver_one_copy() {
    on_actix(async {
        let (_b, addr) = broker(SHARDS).await;
        let mut s = Client::connect(addr, Protocol::V5, "s", true).await;
        s.subscribe(1, "dev/#", QoS::AtMostOnce).await;
        s.subscribe(2, "dev/+/state", QoS::AtLeastOnce).await;
        s.subscribe(3, "dev/7/state", QoS::AtLeastOnce).await;
        let mut p = Client::connect(addr, Protocol::V5, "p", true).await;
        for i in 0..10 {
            p.publish(&format!("dev/{i}/state"), b"on", QoS::AtLeastOnce, false)
                .await;
        }
        let mut got = Vec::new();
        for _ in 0..10 {
            let m = s.recv_publish().await;
            assert_eq!(m.qos, QoS::AtLeastOnce, "the highest QoS of the matches");
            got.push(m.topic);
        }
        got.sort();
        let mut want: Vec<String> = (0..10).map(|i| format!("dev/{i}/state")).collect();
        want.sort();
        assert_eq!(got, want);
        s.expect_no_publish(std::time::Duration::from_millis(300))
            .await;
    });
}
