//! Two clients' packets, read on two threads of the production backend: a PUBLISH sent
//! right after another client's SUBSCRIBE (before its SUBACK) still reaches the new
//! subscription, as paho's `test_request_response` and `test_subscribe_options` expect of a
//! broker, and nothing reaches it twice.

mod common;

use std::time::Duration;

use common::*;
use starling_codec::{
    Packet, Properties, Protocol, QoS, Subscribe, SubscribeFilter, SubscriptionOptions,
};

const ROUNDS: usize = 20;

fn subscribe(id: u16, filter: &str, no_local: bool) -> Packet {
    Packet::Subscribe(Subscribe {
        packet_id: pid(id),
        filters: vec![SubscribeFilter {
            filter: filter.to_owned(),
            options: SubscriptionOptions {
                qos: QoS::AtLeastOnce,
                no_local,
                ..Default::default()
            },
        }],
        properties: Properties::default(),
    })
}

/// One round of paho's steps: `b` SUBSCRIBEs and `a` PUBLISHes at once, without waiting
/// for `b`'s SUBACK. Whether `b` got the publish, checking it got it once.
async fn raced(a: &mut Client, b: &mut Client, filter: &str, topic: &str) -> bool {
    raced_with(a, b, filter, topic, false).await
}

async fn raced_with(
    a: &mut Client,
    b: &mut Client,
    filter: &str,
    topic: &str,
    retain: bool,
) -> bool {
    b.send(subscribe(1, filter, true)).await;
    // Sent at once; the PUBACK is waited for after.
    a.publish(topic, b"request", QoS::AtLeastOnce, retain).await;
    match b.recv().await {
        Some(Packet::Suback(_)) => {}
        other => panic!("expected SUBACK, got {other:?}"),
    }
    let got = match tokio::time::timeout(Duration::from_secs(1), b.recv_publish()).await {
        Ok(p) => {
            assert_eq!(p.topic, topic);
            true
        }
        Err(_) => false,
    };
    b.expect_no_publish(Duration::from_millis(100)).await;
    got
}

#[test]
fn a_publish_sent_right_after_another_clients_subscribe_reaches_it() {
    on_actix(async {
        let (_b, addr) = broker("").await;
        // The kernel turns its receive stamps on from a work queue once the first socket
        // asks (this listener's first accepted connection): wait for it, so that every
        // round is judged by them.
        let _first = Client::connect(addr, Protocol::V5, "warm", true).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut missed = 0;
        for i in 0..ROUNDS {
            let topic = format!("race/{i}");
            // Two actors in a row land on the two arbiters: their packets are read on two
            // threads.
            let mut a = Client::connect(addr, Protocol::V5, &format!("ra{i}"), true).await;
            let mut b = Client::connect(addr, Protocol::V5, &format!("rb{i}"), true).await;
            a.send(subscribe(1, &topic, true)).await;
            assert!(matches!(a.recv().await, Some(Packet::Suback(_))));
            missed += usize::from(!raced(&mut a, &mut b, &topic, &topic).await);
            a.expect_no_publish(Duration::from_millis(10)).await;
        }
        // Without the shard's recent publishes about half the rounds miss (9 of 20).
        // With them, but each packet timed when its client's thread took it in, a thread
        // kept off its core for longer than the slack by a loaded machine still cost some
        // (2 of 20 once in a full run, 3 and 4 in 2 of 12 runs under two busy loops).
        // Timed by the kernel's receive stamp, which thread gets to its bytes first no
        // longer matters: none is missed. (The ring's rules are unit-tested in
        // `routing/recent.rs`; elsewhere than Linux the packets are timed as before.)
        println!("{missed} of {ROUNDS} raced publishes missed");
        let allowed = if cfg!(target_os = "linux") { 0 } else { 3 };
        assert!(
            missed <= allowed,
            "{missed} of {ROUNDS} raced publishes missed"
        );
    });
}

#[test]
fn a_publish_an_earlier_subscription_delivered_is_not_caught_up_again() {
    on_actix(async {
        let (_b, addr) = broker("").await;
        let mut missed = 0;
        for i in 0..ROUNDS {
            let topic = format!("both/{i}");
            let mut a = Client::connect(addr, Protocol::V5, &format!("ba{i}"), true).await;
            let mut b = Client::connect(addr, Protocol::V5, &format!("bb{i}"), true).await;
            // `b` already holds a filter the publish matches: that one delivers it, and
            // the new one must not add a second copy (`raced` checks there is one).
            b.send(subscribe(3, "both/#", false)).await;
            assert!(matches!(b.recv().await, Some(Packet::Suback(_))));
            missed += usize::from(!raced(&mut a, &mut b, "both/+", &topic).await);
        }
        assert_eq!(missed, 0, "the earlier subscription delivers every one");
    });
}

#[test]
fn a_retained_publish_that_raced_a_subscribe_arrives_once() {
    on_actix(async {
        let (_b, addr) = broker("").await;
        let mut missed = 0;
        for i in 0..ROUNDS {
            let topic = format!("kept/{i}");
            let mut a = Client::connect(addr, Protocol::V5, &format!("ka{i}"), true).await;
            let mut b = Client::connect(addr, Protocol::V5, &format!("kb{i}"), true).await;
            // Caught up and read from the retained store both: it must come once
            // (`raced_with` checks there is no second copy).
            missed += usize::from(!raced_with(&mut a, &mut b, &topic, &topic, true).await);
        }
        // The retained store has it whenever the race is lost: none is missed.
        assert_eq!(missed, 0, "{missed} of {ROUNDS} retained publishes missed");
    });
}
