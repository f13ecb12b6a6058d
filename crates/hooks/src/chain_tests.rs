use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::executor::block_on;
use starling_codec::{Protocol, QoS, ReasonCode};

use crate::*;

/// Answers `answer` for topics starting with `prefix`, ignores the rest, and counts calls.
struct Prefix {
    prefix: &'static str,
    answer: Answer,
    later: bool,
    calls: Arc<AtomicUsize>,
}

impl Prefix {
    fn new(prefix: &'static str, answer: Answer) -> (Self, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let p = Prefix {
            prefix,
            answer,
            later: false,
            calls: calls.clone(),
        };
        (p, calls)
    }

    fn later(mut self) -> Self {
        self.later = true;
        self
    }
}

impl AuthzProvider for Prefix {
    fn authorize(&self, req: &AuthzRequest<'_>) -> Verdict<Answer> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let a = if req.topic.starts_with(self.prefix) {
            self.answer
        } else {
            Answer::Ignore
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

fn publish(topic: &str) -> AuthzRequest<'_> {
    AuthzRequest {
        client: ClientRef {
            client_id: "c",
            username: Some("u"),
            addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
        },
        action: Action::Publish {
            qos: QoS::AtLeastOnce,
            retain: false,
        },
        topic,
    }
}

fn now(v: Verdict<bool>) -> bool {
    match v {
        Verdict::Now(b) => b,
        Verdict::Later(_) => panic!("expected a ready verdict"),
    }
}

#[test]
fn first_provider_that_does_not_ignore_decides_in_order() {
    let (a, a_calls) = Prefix::new("a/", Answer::Deny);
    let (b, b_calls) = Prefix::new("a/", Answer::Allow);
    let chain = Hooks::new().authorize_with(a).authorize_with(b).build(true);
    assert!(!now(chain.authorize(&publish("a/x"))));
    assert_eq!(a_calls.load(Ordering::Relaxed), 1);
    // The first decided: the second is never asked.
    assert_eq!(b_calls.load(Ordering::Relaxed), 0);
}

#[test]
fn ignore_passes_to_the_next_and_all_ignoring_gets_the_default() {
    let (a, _) = Prefix::new("a/", Answer::Deny);
    let (b, b_calls) = Prefix::new("b/", Answer::Deny);
    for default in [true, false] {
        let chain = Hooks::new()
            .authorize_with(Prefix::new("a/", Answer::Deny).0)
            .authorize_with(Prefix::new("b/", Answer::Deny).0)
            .build(default);
        assert!(!now(chain.authorize(&publish("b/x"))));
        assert_eq!(now(chain.authorize(&publish("c/x"))), default);
        assert!(!chain.may_wait());
    }
    let chain = Hooks::new().authorize_with(a).authorize_with(b).build(true);
    assert!(!now(chain.authorize(&publish("b/1"))));
    assert_eq!(b_calls.load(Ordering::Relaxed), 1);
}

#[test]
fn no_authorizer_means_the_default_at_once() {
    let chain = Hooks::new().build(false);
    assert!(!chain.has_authorizers());
    assert!(!now(chain.authorize(&publish("x"))));
    assert!(chain.may_deny_reads(&publish("x").client));
    assert!(!Hooks::new()
        .build(true)
        .may_deny_reads(&publish("x").client));
}

#[test]
fn a_later_answer_that_ignores_goes_on_with_the_rest_of_the_chain() {
    let (slow, _) = Prefix::new("a/", Answer::Allow);
    let (next, next_calls) = Prefix::new("b/", Answer::Deny);
    let chain = Hooks::new()
        .authorize_with(slow.later())
        .authorize_with(next)
        .build(true);
    assert!(chain.may_wait());
    let Verdict::Later(v) = chain.authorize(&publish("b/x")) else {
        panic!("a later provider first makes a later verdict");
    };
    assert_eq!(
        next_calls.load(Ordering::Relaxed),
        0,
        "asked only after the first"
    );
    assert!(!block_on(v));
    assert_eq!(next_calls.load(Ordering::Relaxed), 1);
    assert!(block_on(chain.authorize(&publish("a/x")).resolve()));
    assert!(block_on(chain.authorize(&publish("c/x")).resolve()));
}

/// Decides `.0`'s CONNECTs: `Some(answer)` at once, `None` later (allowing).
struct Users(&'static str, Option<AuthnAnswer>);

impl AuthnProvider for Users {
    fn authenticate(&self, req: &ConnectRequest<'_>) -> Verdict<AuthnAnswer> {
        if req.username != Some(self.0) {
            return Verdict::Now(AuthnAnswer::Ignore);
        }
        match &self.1 {
            Some(a) => Verdict::Now(a.clone()),
            None => {
                let user = self.0.to_owned();
                Verdict::later(async move { AuthnAnswer::Allow(Identity::new(Some(user))) })
            }
        }
    }
}

fn connect<'a>(user: Option<&'a str>, password: Option<&'a Bytes>) -> ConnectRequest<'a> {
    ConnectRequest {
        client_id: "c",
        username: user,
        password,
        peer: SocketAddr::from(([127, 0, 0, 1], 1)),
        protocol: Protocol::V5,
        tls_client_cn: None,
    }
}

#[test]
fn authentication_walks_the_chain_then_the_listener_policy() {
    let deny = Refusal {
        code: ReasonCode::BadUserNameOrPassword,
        why: "test",
    };
    let chain = Hooks::new()
        .authenticate_with(Users("bob", Some(AuthnAnswer::Deny(deny))))
        .authenticate_with(Users("alice", None))
        .build(true);
    let open = AuthnPolicy {
        allow_anonymous: true,
    };
    let closed = AuthnPolicy {
        allow_anonymous: false,
    };
    let pw = Bytes::from_static(b"pw");
    let run = |req: &ConnectRequest<'_>, p| block_on(chain.authenticate(req, p).resolve());
    assert_eq!(run(&connect(Some("bob"), Some(&pw)), open), Err(deny));
    assert_eq!(
        run(&connect(Some("alice"), None), closed),
        Ok(Identity::new(Some("alice".into())))
    );
    // Nobody decides: the listener's anonymous policy, the username an unverified label.
    assert_eq!(
        run(&connect(Some("carol"), None), open),
        Ok(Identity::new(Some("carol".into())))
    );
    assert_eq!(
        run(&connect(None, None), closed).unwrap_err().code,
        ReasonCode::NotAuthorized
    );
    assert_eq!(
        run(&connect(None, Some(&pw)), open).unwrap_err().code,
        ReasonCode::BadUserNameOrPassword
    );
}

struct Log(EventMask, Arc<Mutex<Vec<EventKind>>>);

impl EventProvider for Log {
    fn wants(&self) -> EventMask {
        self.0
    }
    fn on_event(&self, e: &Event) {
        self.1.lock().unwrap().push(e.kind());
    }
}

#[test]
fn events_reach_only_the_providers_that_want_their_kind() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let all = Arc::new(Mutex::new(Vec::new()));
    let chain = Hooks::new()
        .observe_with(Log(
            EventMask::NONE.with(EventKind::SessionCreated),
            seen.clone(),
        ))
        .observe_with(Log(EventMask::ALL, all.clone()))
        .build(true);
    assert!(!Hooks::new().build(true).wants(EventKind::MessagePublish));
    assert!(chain.wants(EventKind::MessagePublish));
    let who = Subject {
        node: Arc::from("n"),
        client_id: Arc::from("c"),
        username: None,
    };
    for what in [What::SessionCreated, What::SessionTerminated] {
        chain.emit(&Event {
            who: who.clone(),
            what,
        });
    }
    assert_eq!(*seen.lock().unwrap(), vec![EventKind::SessionCreated]);
    assert_eq!(
        *all.lock().unwrap(),
        vec![EventKind::SessionCreated, EventKind::SessionTerminated]
    );
}

/// Says who it is.
struct Named;

impl AuthnProvider for Named {
    fn authenticate(&self, _req: &ConnectRequest<'_>) -> Verdict<AuthnAnswer> {
        Verdict::Now(AuthnAnswer::Ignore)
    }

    fn about(&self) -> About {
        About::named("named")
            .descr("says who it is")
            .setting("answers", "ignore")
    }
}

#[test]
fn the_chain_lists_its_providers_in_order_with_what_they_say_of_themselves() {
    let (prefix, _) = Prefix::new("a/", Answer::Allow);
    let chain = Hooks::new()
        .authorize_with(prefix)
        .authenticate_with(Named)
        .build(true);
    let listed = chain.providers();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0].0, HookKind::Authenticate);
    assert_eq!(
        listed[0].1,
        About {
            name: "named".into(),
            descr: "says who it is".into(),
            version: None,
            settings: vec![("answers".into(), "ignore".into())],
        }
    );
    // One that says nothing of itself is its type's name, without its module path.
    assert_eq!(listed[1], (HookKind::Authorize, About::named("Prefix")));
}
