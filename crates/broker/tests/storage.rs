//! The durable store under a running broker: retained and delayed messages written as they
//! change and read back by the next broker on the same `data_dir`; a damaged store stops
//! the start with an error naming the file.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{broker_with, on_actix, temp_dir, Client};
use starling_broker::{Broker, BrokerError};
use starling_codec::{Protocol, QoS, ReasonCode};
use starling_config::Config;

fn config(dir: &Path) -> Config {
    let text = format!(
        "[node]\ndata_dir = {dir:?}\n\
         [[listeners]]\nkind = \"tcp\"\nbind = \"127.0.0.1:0\"\n\
         [storage]\nenabled = true\n"
    );
    Config::from_str(&text).expect("test config").0
}

#[test]
fn retained_and_delayed_messages_come_back_after_a_restart() {
    on_actix(async {
        let dir = temp_dir("store-restart");
        let (b, addr) = broker_with(config(&dir)).await;
        let mut c = Client::connect(addr, Protocol::V5, "writer", true).await;
        c.publish("r/kept", b"kept", QoS::AtLeastOnce, true).await;
        c.publish("r/gone", b"soon gone", QoS::AtLeastOnce, true)
            .await;
        // An empty retained publish deletes: the store must forget it too.
        c.publish("r/gone", b"", QoS::AtLeastOnce, true).await;
        c.publish("r/replaced", b"first", QoS::AtMostOnce, true)
            .await;
        c.publish("r/replaced", b"second", QoS::ExactlyOnce, true)
            .await;
        c.publish("$delayed/2/d/later", b"later", QoS::AtLeastOnce, false)
            .await;
        c.disconnect().await;
        b.flush_store().await;
        b.shutdown().await;

        let (b, addr) = broker_with(config(&dir)).await;
        let mut s = Client::connect(addr, Protocol::V5, "reader", true).await;
        s.subscribe(1, "r/#", QoS::AtLeastOnce).await;
        let mut got = Vec::new();
        for _ in 0..2 {
            let p = s.recv_publish().await;
            assert!(p.retain, "a retained message on subscribe has RETAIN set");
            got.push((p.topic.clone(), p.payload.to_vec()));
        }
        got.sort();
        assert_eq!(
            got,
            vec![
                ("r/kept".to_owned(), b"kept".to_vec()),
                ("r/replaced".to_owned(), b"second".to_vec()),
            ]
        );
        s.expect_no_publish(Duration::from_millis(300)).await;

        // The delayed publish, stored before the restart, still comes (once).
        s.subscribe(2, "d/later", QoS::AtLeastOnce).await;
        let p = s.recv_publish().await;
        assert_eq!(p.topic, "d/later");
        assert_eq!(&p.payload[..], b"later");
        s.expect_no_publish(Duration::from_millis(300)).await;
        s.disconnect().await;
        b.shutdown().await;

        // Published, so gone from the store: a due one would fire at once after a restart.
        let (b, addr) = broker_with(config(&dir)).await;
        let mut s = Client::connect(addr, Protocol::V5, "reader", true).await;
        s.subscribe(1, "d/#", QoS::AtLeastOnce).await;
        s.expect_no_publish(Duration::from_millis(500)).await;
        s.disconnect().await;
        b.shutdown().await;
    });
}

#[test]
fn sys_values_are_not_stored() {
    on_actix(async {
        let dir = temp_dir("store-sys");
        let mut c = config(&dir);
        c.mqtt.sys_interval_secs = 1;
        let (b, _) = broker_with(c.clone()).await;
        tokio::time::sleep(Duration::from_millis(1200)).await;
        b.flush_store().await;
        b.shutdown().await;
        let report = starling_store::check(&starling_broker::store_path(&c)).expect("a good store");
        assert_eq!(report.usage.retained, 0, "$SYS values were stored");
    });
}

#[test]
fn a_damaged_store_stops_the_start_and_names_the_file() {
    on_actix(async {
        let dir = temp_dir("store-damaged");
        let c = config(&dir);
        let path = starling_broker::store_path(&c);
        std::fs::write(&path, vec![0x5a; 64 * 1024]).expect("write garbage");
        let err = match Broker::start(c).await {
            Ok(_) => panic!("a broker started on a damaged store"),
            Err(e) => e,
        };
        assert!(matches!(err, BrokerError::Store { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("store.redb"), "{text}");
        // The file is left as it was, for the operator to look at.
        assert_eq!(std::fs::read(&path).expect("read").len(), 64 * 1024);
    });
}

fn config_with(dir: &Path, storage: &str) -> Config {
    let text = format!(
        "[node]\ndata_dir = {dir:?}\n\
         [[listeners]]\nkind = \"tcp\"\nbind = \"127.0.0.1:0\"\n\
         [storage]\nenabled = true\n{storage}"
    );
    Config::from_str(&text).expect("test config").0
}

#[test]
fn a_retained_or_delayed_publish_is_acknowledged_once_its_commit_is_done() {
    on_actix(async {
        let dir = temp_dir("store-ack-order");
        // Commits wait a second for company: what waits for one shows.
        let (b, addr) = broker_with(config_with(&dir, "commit_interval_ms = 1000\n")).await;
        let mut c = Client::connect(addr, Protocol::V5, "acker", true).await;
        let t = starling_rt::time::now();
        c.publish("plain", b"x", QoS::AtLeastOnce, false).await;
        let plain = starling_rt::time::now() - t;
        assert!(plain < Duration::from_millis(900), "took {plain:?}");

        let t = starling_rt::time::now();
        c.publish("r/slow", b"x", QoS::AtLeastOnce, true).await;
        let retained = starling_rt::time::now() - t;
        assert!(
            retained >= Duration::from_millis(900),
            "acknowledged before its commit: {retained:?}"
        );
        c.publish("$delayed/60/later", b"x", QoS::ExactlyOnce, false)
            .await;
        assert!(
            (starling_rt::time::now() - t) >= Duration::from_millis(1800),
            "delayed acknowledged early"
        );
        c.disconnect().await;
        b.shutdown().await;
    });
}

#[test]
fn a_full_store_refuses_a_retained_message_with_quota_exceeded_and_keeps_the_rest() {
    on_actix(async {
        let dir = temp_dir("store-full");
        let (b, addr) = broker_with(config_with(&dir, "max_bytes = 1048576\n")).await;
        let mut c = Client::connect(addr, Protocol::V5, "filler", true).await;
        let big = vec![7u8; 300 * 1024];
        let mut codes = Vec::new();
        for i in 0..5 {
            let code = c
                .publish_code(&format!("big/{i}"), &big, QoS::AtLeastOnce, true)
                .await;
            codes.push(code);
        }
        assert_eq!(
            codes,
            [
                ReasonCode::Success,
                ReasonCode::Success,
                ReasonCode::Success,
                ReasonCode::QuotaExceeded,
                ReasonCode::QuotaExceeded,
            ]
        );
        // A delete is never refused, and frees room.
        c.publish("big/0", b"", QoS::AtLeastOnce, true).await;
        let code = c.publish_code("big/9", &big, QoS::AtLeastOnce, true).await;
        assert_eq!(code, ReasonCode::Success);
        c.disconnect().await;
        // What a subscriber finds is what the store holds: the refused ones are gone from
        // memory too.
        let mut s = Client::connect(addr, Protocol::V5, "finder", true).await;
        s.subscribe(1, "big/#", QoS::AtMostOnce).await;
        let mut topics = Vec::new();
        for _ in 0..3 {
            topics.push(s.recv_publish().await.topic);
        }
        topics.sort();
        assert_eq!(topics, ["big/1", "big/2", "big/9"]);
        s.expect_no_publish(Duration::from_millis(300)).await;
        s.disconnect().await;
        b.shutdown().await;
        let report = starling_store::check(&dir.join("store.redb")).expect("a good store");
        assert_eq!(report.usage.retained, 3, "big/1, big/2 and big/9");
    });
}
