use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use starling_codec::{Connect, Packet, Properties, Protocol, Publish, QoS};
use starling_config::Config;
use starling_hooks::{Answer, AuthzProvider, AuthzRequest, Hooks, Verdict};
use starling_session::{Gate, Session};

use super::{delayed_target, is_reserved, AuthGate};
use crate::msg::AuthzKind;
use crate::settings::Shared;

#[test]
fn every_dollar_topic_but_delayed_is_reserved() {
    for t in ["$SYS", "$SYS/", "$SYS/brokers/x", "$share/g/t", "$foo", "$"] {
        assert!(is_reserved(t), "{t}");
    }
    for t in ["$delayed/5/a", "a/$SYS", "SYS", "sys/$"] {
        assert!(!is_reserved(t), "{t}");
    }
}

#[test]
fn delayed_publish_is_checked_on_its_target_topic() {
    assert_eq!(delayed_target("$delayed/5/$SYS/x"), Some("$SYS/x"));
    assert_eq!(delayed_target("$delayed/5/a/b"), Some("a/b"));
    assert_eq!(delayed_target("$delayed/5"), None);
    assert_eq!(delayed_target("a/b"), None);
}

/// Denies topics under `deny/`, allows the rest; answers later if `later`; counts questions.
struct Counting {
    later: bool,
    asked: Arc<AtomicUsize>,
}

impl AuthzProvider for Counting {
    fn authorize(&self, req: &AuthzRequest<'_>) -> Verdict<Answer> {
        self.asked.fetch_add(1, Ordering::Relaxed);
        let a = if req.topic.starts_with("deny/") {
            Answer::Deny
        } else {
            Answer::Allow
        };
        if self.later {
            Verdict::later(async move { a })
        } else {
            Verdict::Now(a)
        }
    }
    fn answers_later(&self) -> bool {
        self.later
    }
}

fn gate(later: bool) -> (AuthGate, Arc<AtomicUsize>) {
    let shared = Shared::new(Config::default()).expect("default config");
    let asked = Arc::new(AtomicUsize::new(0));
    let chain = Hooks::new()
        .authorize_with(Counting {
            later,
            asked: asked.clone(),
        })
        .build(true);
    let g = AuthGate::new(
        shared,
        chain,
        Some("u".into()),
        Arc::from("c"),
        IpAddr::V4(Ipv4Addr::LOCALHOST),
    );
    (g, asked)
}

fn publish(topic: &str) -> Packet {
    Packet::Publish(Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: false,
        topic: topic.to_owned(),
        packet_id: std::num::NonZeroU16::new(1),
        properties: Properties::default(),
        payload: Bytes::new(),
    })
}

#[allow(clippy::disallowed_methods)] // no clock is read again: the session only needs a start
fn attached_session() -> Session {
    let shared = Shared::new(Config::default()).expect("default config");
    let mut s = Session::new(Arc::from("c"), shared.limits.clone());
    let connect = Connect {
        protocol: Protocol::V5,
        clean_start: true,
        keep_alive: 60,
        client_id: "c".into(),
        will: None,
        username: None,
        password: None,
        properties: Properties::default(),
    };
    s.attach(std::time::Instant::now(), &connect)
        .expect("attach");
    s
}

#[test]
fn ready_verdicts_are_asked_once_per_topic_and_never_waited_for() {
    let (mut g, asked) = gate(false);
    let session = attached_session();
    assert!(g.next_wait(&session, &publish("a")).is_none());
    assert!(g.allow_publish("a", QoS::AtLeastOnce, false));
    assert!(g.allow_publish("a", QoS::AtMostOnce, false));
    assert!(!g.allow_publish("deny/x", QoS::AtLeastOnce, false));
    assert_eq!(asked.load(Ordering::Relaxed), 2, "remembered per topic");
    // Subscribe and read are remembered apart from publish; `$share/g/` is stripped.
    assert!(!g.allow_subscribe("$share/g/deny/#", QoS::AtLeastOnce));
    assert!(!g.allow_subscribe("deny/#", QoS::AtLeastOnce));
    assert_eq!(asked.load(Ordering::Relaxed), 3);
    assert!(!g.may_read(&Arc::from("deny/x")).0);
    assert_eq!(asked.load(Ordering::Relaxed), 4);
}

#[test]
fn a_later_verdict_is_waited_for_then_remembered() {
    let (mut g, asked) = gate(true);
    let session = attached_session();
    let p = publish("deny/x");
    let wait = g.next_wait(&session, &p).expect("asks later");
    assert_eq!((wait.kind, &*wait.topic), (AuthzKind::Publish, "deny/x"));
    let v = futures::executor::block_on(wait.verdict);
    g.verdict(AuthzKind::Publish, Arc::from("deny/x"), Some(v));
    assert!(g.next_wait(&session, &p).is_none(), "remembered");
    assert!(!g.allow_publish("deny/x", QoS::AtLeastOnce, false));
    g.fed();
    assert!(g.next_wait(&session, &p).is_none());
    assert_eq!(asked.load(Ordering::Relaxed), 1);
}

#[test]
fn a_timeout_decides_the_waiting_packet_only() {
    let (mut g, asked) = gate(true);
    let session = attached_session();
    let p = publish("a");
    assert!(g.next_wait(&session, &p).is_some());
    g.verdict(AuthzKind::Publish, Arc::from("a"), None);
    assert!(g.next_wait(&session, &p).is_none());
    // `auth.timeout_verdict` defaults to deny, though the provider would allow.
    assert!(!g.allow_publish("a", QoS::AtLeastOnce, false));
    g.fed();
    assert!(
        g.next_wait(&session, &p).is_some(),
        "a timeout is not remembered"
    );
    assert_eq!(asked.load(Ordering::Relaxed), 2);
}

#[test]
fn a_later_read_is_not_waited_for_and_asked_once_while_it_runs() {
    let (mut g, _) = gate(true);
    let topic: Arc<str> = Arc::from("a");
    let (ok, asked) = g.may_read(&topic);
    assert!(!ok, "the timeout verdict meanwhile");
    assert!(asked.is_some());
    assert!(g.may_read(&topic).1.is_none(), "already asked");
    g.verdict(AuthzKind::Read, topic.clone(), Some(true));
    let (ok, asked) = g.may_read(&topic);
    assert!(ok && asked.is_none());
}
