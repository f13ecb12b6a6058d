//! An operator's subscriptions for a connected client (`Admin::subscribe`, the HTTP API's
//! `POST /mqtt/subscribe`): real ones in its session, under its ACL, with no SUBACK; and the
//! operator's lists of clients, kept while no client comes or goes.

mod common;

use std::time::Duration;

use common::{broker, connect_packet, on_actix, temp_dir, Client};
use starling_broker::hooks::{Action, Answer, AuthzProvider, AuthzRequest, Hooks, Verdict};
use starling_broker::{AdminError, Broker, ClientInfo};
use starling_codec::{Protocol, QoS, ReasonCode};
use starling_config::{Config, ListenerKind};

#[test]
fn an_operators_subscription_is_the_clients_own_under_its_acl() {
    on_actix(async {
        let dir = temp_dir("operator");
        let acl = dir.join("acl.toml");
        std::fs::write(
            &acl,
            "[[rules]]\npermission = \"deny\"\naction = \"subscribe\"\ntopics = [\"secret/#\"]\n",
        )
        .unwrap();
        let (b, addr) = broker(&format!(
            "[auth]\nacl_file = {:?}\n",
            acl.display().to_string()
        ))
        .await;
        let admin = b.admin();
        let mut sub = Client::connect(addr, Protocol::V5, "sub", true).await;
        let mut publisher = Client::connect(addr, Protocol::V3_1_1, "pub", true).await;
        publisher
            .publish("api/kept", b"old", QoS::AtMostOnce, true)
            .await;

        let got = admin
            .subscribe(
                "sub",
                vec!["api/#".into(), "secret/x".into()],
                QoS::AtLeastOnce,
            )
            .await
            .expect("subscribed");
        assert_eq!(
            got,
            vec![Ok(QoS::AtLeastOnce), Err(ReasonCode::NotAuthorized)]
        );
        // No SUBACK (the client sent no SUBSCRIBE): the retained message comes first.
        let p = sub.recv_publish().await;
        assert_eq!(
            (p.topic.as_str(), &p.payload[..]),
            ("api/kept", &b"old"[..])
        );
        publisher
            .publish("api/x", b"new", QoS::AtLeastOnce, false)
            .await;
        let p = sub.recv_publish().await;
        assert_eq!((p.topic.as_str(), p.qos), ("api/x", QoS::AtLeastOnce));
        publisher
            .publish("secret/x", b"no", QoS::AtMostOnce, false)
            .await;
        sub.expect_no_publish(Duration::from_millis(200)).await;

        let listed = admin.client_subscriptions("sub").await.expect("a session");
        let filters: Vec<_> = listed.filters.iter().map(|f| f.0.as_str()).collect();
        assert_eq!(filters, vec!["api/#"]);
        assert_eq!(admin.client("sub").await.unwrap().subscriptions, 1);

        // Refused before any of it is subscribed.
        let bad = admin
            .subscribe("sub", vec!["ok/1".into(), "a/#/b".into()], QoS::AtMostOnce)
            .await;
        assert!(matches!(bad, Err(AdminError::Topic(_))), "{bad:?}");
        assert_eq!(admin.client("sub").await.unwrap().subscriptions, 1);
        assert_eq!(
            admin
                .subscribe("nobody", vec!["a".into()], QoS::AtMostOnce)
                .await,
            Err(AdminError::NoSession("nobody".into()))
        );

        assert_eq!(
            admin.unsubscribe("sub", vec!["api/#".into()]).await,
            Ok(vec![ReasonCode::Success])
        );
        assert_eq!(
            admin.unsubscribe("sub", vec!["api/#".into()]).await,
            Ok(vec![ReasonCode::NoSubscriptionExisted])
        );
        publisher
            .publish("api/x", b"gone", QoS::AtMostOnce, false)
            .await;
        sub.expect_no_publish(Duration::from_millis(200)).await;
        assert_eq!(admin.client("sub").await.unwrap().subscriptions, 0);
    })
}

#[test]
fn a_session_without_its_connection_is_not_subscribed_for() {
    on_actix(async {
        let (b, addr) = broker("").await;
        let admin = b.admin();
        let mut c = connect_packet(Protocol::V5, "away", false);
        c.properties.session_expiry_interval = Some(600);
        let (client, _) = Client::open(addr, c).await;
        client.disconnect().await;
        let deadline = starling_rt::time::now() + Duration::from_secs(5);
        while admin.client("away").await.is_some_and(|c| c.connected) {
            assert!(starling_rt::time::now() < deadline, "still connected");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            admin
                .subscribe("away", vec!["a".into()], QoS::AtMostOnce)
                .await,
            Err(AdminError::NotConnected("away".into()))
        );
        assert_eq!(
            admin.unsubscribe("away", vec!["a".into()]).await,
            Err(AdminError::NotConnected("away".into()))
        );
    })
}

/// Answers subscribes later, denying filters under `deny/`.
struct SlowSubscribes;

impl AuthzProvider for SlowSubscribes {
    fn authorize(&self, req: &AuthzRequest<'_>) -> Verdict<Answer> {
        let Action::Subscribe { .. } = req.action else {
            return Verdict::Now(Answer::Allow);
        };
        let deny = req.topic.starts_with("deny/");
        Verdict::later(async move {
            starling_rt::time::sleep(Duration::from_millis(20)).await;
            if deny {
                Answer::Deny
            } else {
                Answer::Allow
            }
        })
    }
}

#[test]
fn an_operators_subscription_waits_for_a_later_verdict() {
    on_actix(async {
        let text = format!(
            "[[listeners]]\nkind = \"tcp\"\nbind = \"127.0.0.1:0\"\n{}",
            common::no_store("")
        );
        let (config, _) = Config::from_str(&text).expect("test config");
        let hooks = Hooks::new().authorize_with(SlowSubscribes);
        let b = Broker::start_with(config, hooks).await.expect("starts");
        let addr = b.local_addr(ListenerKind::Tcp).expect("tcp listener");
        let admin = b.admin();
        let mut sub = Client::connect(addr, Protocol::V5, "sub", true).await;
        let got = admin
            .subscribe("sub", vec!["ok/#".into(), "deny/x".into()], QoS::AtMostOnce)
            .await
            .expect("subscribed");
        assert_eq!(
            got,
            vec![Ok(QoS::AtMostOnce), Err(ReasonCode::NotAuthorized)]
        );
        admin
            .publish(starling_broker::AdminPublish {
                topic: "ok/1".into(),
                payload: bytes::Bytes::from_static(b"x"),
                qos: QoS::AtMostOnce,
                retain: false,
                expiry_secs: None,
                properties: Default::default(),
            })
            .await
            .expect("published");
        assert_eq!(sub.recv_publish().await.topic, "ok/1");
    })
}

/// The queue length `list` shows for client `id`.
fn queued(list: &[ClientInfo], id: &str) -> Option<usize> {
    list.iter()
        .find(|c| c.client_id == id)
        .map(|c| c.mqueue_len)
}

#[test]
fn a_kept_client_list_is_given_again_until_a_client_comes_or_goes() {
    on_actix(async {
        for (cache_ms, kept) in [(60_000, true), (0, false)] {
            let (b, addr) = broker(&format!("[http]\nlist_cache_ms = {cache_ms}\n")).await;
            let admin = b.admin();
            // A persistent subscriber with a window of 1 that acknowledges nothing: of 4
            // QoS 1 messages, 3 wait in its queue.
            let mut c = connect_packet(Protocol::V5, "slow", false);
            c.properties.session_expiry_interval = Some(3600);
            c.properties.receive_maximum = Some(1);
            let (mut sub, _) = Client::open(addr, c).await;
            sub.subscribe(1, "t/#", QoS::AtLeastOnce).await;
            let mut publisher = Client::connect(addr, Protocol::V5, "pub", true).await;
            assert_eq!(queued(&admin.clients().await, "slow"), Some(0));
            for _ in 0..4 {
                publisher
                    .publish("t/a", b"m", QoS::AtLeastOnce, false)
                    .await;
            }
            for _ in 0..500 {
                if admin.stats().await.message_queues.count == 3 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(admin.stats().await.message_queues.count, 3);
            // Publishes are not among what a kept list waits for: it still shows the
            // empty queue; without keeping, the queue as it is.
            let want = if kept { 0 } else { 3 };
            assert_eq!(
                queued(&admin.clients().await, "slow"),
                Some(want),
                "{cache_ms}"
            );

            // A client that connects makes the next list new.
            let late = Client::connect(addr, Protocol::V5, "late", true).await;
            let list = admin.clients().await;
            assert_eq!(queued(&list, "slow"), Some(3), "{cache_ms}: {list:?}");
            assert_eq!(queued(&list, "late"), Some(0), "{cache_ms}: {list:?}");
            // And one that leaves, too.
            late.disconnect().await;
            let mut gone = false;
            for _ in 0..500 {
                if queued(&admin.clients().await, "late").is_none() {
                    gone = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert!(
                gone,
                "{cache_ms}: a disconnected clean session stays listed"
            );
            publisher.disconnect().await;
            drop(sub);
            b.shutdown().await;
        }
    })
}
