//! The hook chain seen from outside (issue 11, item 6): providers passed in by an embedder
//! with `Broker::start_with`, authorizers that answer later (in order, with a deadline and
//! its verdict), an authenticator that answers later, and the lifecycle events of a simple
//! session. Loopback sockets on the production backend, bounded in time.

mod common;

use std::num::NonZeroU16;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{connect_packet, pid, Client};
use starling_broker::hooks::{
    Action, Answer, AuthnAnswer, AuthnProvider, AuthzProvider, AuthzRequest, ConnectRequest,
    DisconnectReason, Event, EventKind, EventMask, EventProvider, Hooks, Identity, Verdict, What,
};
use starling_broker::Broker;
use starling_codec::{Packet, Properties, Protocol, PubAck, Publish, QoS, ReasonCode};
use starling_config::{Config, ListenerKind};
use tokio::sync::mpsc;

async fn broker_with_hooks(extra: &str, hooks: Hooks) -> (Broker, std::net::SocketAddr) {
    let text = format!(
        "[[listeners]]\nkind = \"tcp\"\nbind = \"127.0.0.1:0\"\n{extra}\n{}",
        common::no_store(extra)
    );
    let (config, _) = Config::from_str(&text).expect("test config");
    let b = Broker::start_with(config, hooks)
        .await
        .expect("broker starts");
    let addr = b.local_addr(ListenerKind::Tcp).expect("tcp listener");
    (b, addr)
}

fn publish_packet(topic: &str, id: u16, payload: &str) -> Packet {
    Packet::Publish(Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: false,
        topic: topic.to_owned(),
        packet_id: Some(pid(id)),
        properties: Properties::default(),
        payload: Bytes::from(payload.to_owned()),
    })
}

/// Answers publishes later, after a delay that shrinks with the topic's last level (so that
/// verdicts asked together would come back in reverse), denying topics under `deny/`;
/// answers everything else at once, allowing.
struct SlowPublishes;

impl AuthzProvider for SlowPublishes {
    fn authorize(&self, req: &AuthzRequest<'_>) -> Verdict<Answer> {
        let Action::Publish { .. } = req.action else {
            return Verdict::Now(Answer::Allow);
        };
        let n: u64 = req
            .topic
            .rsplit('/')
            .next()
            .and_then(|l| l.parse().ok())
            .unwrap_or(0);
        let deny = req.topic.starts_with("deny/");
        Verdict::later(async move {
            starling_rt::time::sleep(Duration::from_millis(5 * (12 - n.min(12)))).await;
            if deny {
                Answer::Deny
            } else {
                Answer::Allow
            }
        })
    }
}

#[test]
fn later_publish_verdicts_keep_the_publishers_order_of_acks_and_deliveries() {
    common::on_actix(async {
        let (_b, addr) = broker_with_hooks("", Hooks::new().authorize_with(SlowPublishes)).await;
        let mut sub = Client::connect(addr, Protocol::V5, "sub", true).await;
        let suback = sub.subscribe(1, "t/#", QoS::AtLeastOnce).await;
        assert_eq!(suback.reason_codes, vec![ReasonCode::GrantedQoS1]);
        let mut publisher = Client::connect(addr, Protocol::V5, "pub", true).await;
        // Twelve PUBLISHes at once, each on a topic of its own (so each needs a verdict),
        // every third one denied; then a PINGREQ, which waits behind nothing.
        for i in 1..=12u16 {
            let topic = if i % 3 == 0 {
                format!("deny/{i}")
            } else {
                format!("t/{i}")
            };
            publisher
                .send(publish_packet(&topic, i, &i.to_string()))
                .await;
        }
        let mut acks = Vec::new();
        while acks.len() < 12 {
            match publisher.recv().await {
                Some(Packet::Puback(a)) => acks.push((a.packet_id.get(), a.reason_code)),
                other => panic!("expected PUBACK, got {other:?}"),
            }
        }
        let expected: Vec<_> = (1..=12u16)
            .map(|i| {
                let code = if i % 3 == 0 {
                    ReasonCode::NotAuthorized
                } else {
                    ReasonCode::Success
                };
                (i, code)
            })
            .collect();
        assert_eq!(acks, expected, "PUBACKs in the publisher's order");
        let mut got = Vec::new();
        while got.len() < 8 {
            let p = sub.recv_publish().await;
            got.push(p.topic);
        }
        let want: Vec<_> = (1..=12u16)
            .filter(|i| i % 3 != 0)
            .map(|i| format!("t/{i}"))
            .collect();
        assert_eq!(got, want, "deliveries in the publisher's order");
        sub.expect_no_publish(Duration::from_millis(200)).await;
    });
}

/// Never answers.
struct Silent;

impl AuthzProvider for Silent {
    fn authorize(&self, _: &AuthzRequest<'_>) -> Verdict<Answer> {
        Verdict::later(std::future::pending())
    }
}

#[test]
fn a_verdict_that_never_comes_gets_the_timeout_verdict_and_pings_pass_meanwhile() {
    common::on_actix(async {
        let (b, addr) = broker_with_hooks(
            "[auth]\nverdict_timeout_ms = 300\n",
            Hooks::new().authorize_with(Silent),
        )
        .await;
        let mut c = Client::connect(addr, Protocol::V5, "stuck", true).await;
        let started = starling_rt::time::now();
        c.send(publish_packet("a/b", 1, "x")).await;
        c.send(Packet::Pingreq).await;
        // PINGREQ passes the PUBLISH waiting for its verdict.
        assert_eq!(c.recv().await, Some(Packet::Pingresp));
        match c.recv().await {
            Some(Packet::Puback(a)) => {
                assert_eq!(a.reason_code, ReasonCode::NotAuthorized, "{a:?}")
            }
            other => panic!("expected PUBACK, got {other:?}"),
        }
        assert!(starling_rt::time::now() - started >= Duration::from_millis(300));
        let suback = c.subscribe(2, "a/#", QoS::AtLeastOnce).await;
        assert_eq!(suback.reason_codes, vec![ReasonCode::NotAuthorized]);
        assert!(b.metrics().verdict_timeouts >= 2);
    });
}

#[test]
fn timeout_verdict_allow_lets_the_waiting_packets_through() {
    common::on_actix(async {
        let extra = "[auth]\nverdict_timeout_ms = 100\ntimeout_verdict = \"allow\"\n";
        let (_b, addr) = broker_with_hooks(extra, Hooks::new().authorize_with(Silent)).await;
        let mut c = Client::connect(addr, Protocol::V5, "lenient", true).await;
        let suback = c.subscribe(1, "a/#", QoS::AtLeastOnce).await;
        assert_eq!(suback.reason_codes, vec![ReasonCode::GrantedQoS1]);
        c.publish("a/b", b"x", QoS::AtLeastOnce, false).await;
    });
}

/// Knows one user, and takes its time to say so; ignores everyone else.
struct SlowUsers;

impl AuthnProvider for SlowUsers {
    fn authenticate(&self, req: &ConnectRequest<'_>) -> Verdict<AuthnAnswer> {
        if req.username != Some("plugin") {
            return Verdict::Now(AuthnAnswer::Ignore);
        }
        let ok = req.password.is_some_and(|p| &p[..] == b"secret");
        Verdict::later(async move {
            starling_rt::time::sleep(Duration::from_millis(50)).await;
            if ok {
                AuthnAnswer::Allow(Identity::new(Some("plugin".into())))
            } else {
                AuthnAnswer::Ignore
            }
        })
    }
}

#[test]
fn an_embedders_authenticator_decides_later_and_what_it_ignores_falls_to_the_listener() {
    common::on_actix(async {
        let text =
            "[[listeners]]\nkind = \"tcp\"\nbind = \"127.0.0.1:0\"\nallow_anonymous = false\n\
             [storage]\nenabled = false\n";
        let (config, _) = Config::from_str(text).expect("test config");
        let b = Broker::start_with(config, Hooks::new().authenticate_with(SlowUsers))
            .await
            .expect("broker starts");
        let addr = b.local_addr(ListenerKind::Tcp).expect("tcp listener");
        let login = |password: &'static str| {
            let mut c = connect_packet(Protocol::V5, "", true);
            c.username = Some("plugin".into());
            c.password = Some(Bytes::from_static(password.as_bytes()));
            c
        };
        let (_c, ack) = Client::open(addr, login("secret")).await;
        assert_eq!(ack.reason_code, ReasonCode::Success);
        let (_c, ack) = Client::open(addr, login("wrong")).await;
        assert_eq!(ack.reason_code, ReasonCode::NotAuthorized);
        let (_c, ack) = Client::open(addr, connect_packet(Protocol::V5, "anon", true)).await;
        assert_eq!(ack.reason_code, ReasonCode::NotAuthorized);
    });
}

/// Hands every event to the test.
struct Recorder(mpsc::UnboundedSender<Event>);

impl EventProvider for Recorder {
    fn wants(&self) -> EventMask {
        EventMask::ALL
    }
    fn on_event(&self, e: &Event) {
        let _ = self.0.send(e.clone());
    }
}

#[test]
fn an_event_provider_sees_a_simple_sessions_lifecycle_in_order() {
    common::on_actix(async {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (_b, addr) = broker_with_hooks(
            "[node]\nname = \"n7\"\n",
            Hooks::new().observe_with(Recorder(tx)),
        )
        .await;
        let mut c = Client::connect(addr, Protocol::V5, "ev", true).await;
        c.subscribe(1, "ev/t", QoS::AtLeastOnce).await;
        c.send(publish_packet("ev/t", 5, "hello")).await;
        // Its own PUBACK and the delivery of its message, which it acknowledges.
        let mut delivered = None;
        let mut acked = false;
        while delivered.is_none() || !acked {
            match c.recv().await {
                Some(Packet::Puback(a)) => {
                    assert_eq!(a.packet_id.get(), 5);
                    acked = true;
                }
                Some(Packet::Publish(p)) => {
                    let id = p.packet_id.expect("QoS 1");
                    c.send(Packet::Puback(PubAck::new(id))).await;
                    delivered = Some(id);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        let delivered: NonZeroU16 = delivered.unwrap();
        c.disconnect().await;

        let mut events = Vec::new();
        let deadline = starling_rt::time::now() + Duration::from_secs(5);
        while !events
            .iter()
            .any(|e: &Event| e.kind() == EventKind::SessionTerminated)
        {
            let left = deadline.saturating_duration_since(starling_rt::time::now());
            match tokio::time::timeout(left, rx.recv()).await {
                Ok(Some(e)) if &*e.who.client_id == "ev" => events.push(e),
                Ok(Some(_)) => {}
                _ => panic!("no session terminated event; saw {events:#?}"),
            }
        }
        let kinds: Vec<_> = events.iter().map(Event::kind).collect();
        use EventKind::*;
        assert_eq!(
            kinds,
            vec![
                ClientConnect,
                ClientConnack,
                SessionCreated,
                ClientConnected,
                SessionSubscribed,
                MessagePublish,
                MessageDelivered,
                MessageAcked,
                ClientDisconnected,
                SessionTerminated,
            ]
        );
        for e in &events {
            assert_eq!(&*e.who.node, "n7");
            assert_eq!(e.who.username, None);
        }
        let at = |k| &events[kinds.iter().position(|x| *x == k).unwrap()].what;
        assert!(matches!(
            at(ClientConnect),
            What::ClientConnect {
                protocol: Protocol::V5,
                ..
            }
        ));
        assert!(matches!(
            at(ClientConnack),
            What::ClientConnack {
                code: ReasonCode::Success,
                ..
            }
        ));
        assert!(matches!(
            at(ClientConnected),
            What::ClientConnected {
                keep_alive: 60,
                clean_start: true,
                protocol: Protocol::V5,
                ..
            }
        ));
        assert!(
            matches!(at(SessionSubscribed), What::SessionSubscribed { filter, qos: QoS::AtLeastOnce } if &**filter == "ev/t")
        );
        assert!(
            matches!(at(MessagePublish), What::MessagePublish { topic, qos: QoS::AtLeastOnce, retain: false, payload } if &**topic == "ev/t" && &payload[..] == b"hello")
        );
        assert!(
            matches!(at(MessageDelivered), What::MessageDelivered { topic, qos: QoS::AtLeastOnce, packet_id: Some(id) } if &**topic == "ev/t" && *id == delivered)
        );
        assert!(
            matches!(at(MessageAcked), What::MessageAcked { topic, qos: QoS::AtLeastOnce, packet_id } if &**topic == "ev/t" && *packet_id == delivered)
        );
        assert_eq!(
            at(ClientDisconnected),
            &What::ClientDisconnected {
                reason: DisconnectReason::Client(ReasonCode::Success)
            }
        );
        let _ = Arc::clone(&events[0].who.client_id);
    });
}
