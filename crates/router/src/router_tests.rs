//! The trie's unit tests.

use super::*;

type R = Router<u32, &'static str>;

fn router() -> R {
    Router::new(RouterConfig::default())
}

fn with_strategy(shared_strategy: SharedStrategy) -> R {
    Router::new(RouterConfig {
        shared_strategy,
        ..RouterConfig::default()
    })
}

fn subscribers(r: &mut R, topic: &str) -> Vec<u32> {
    let mut s: Vec<u32> = r
        .matches(topic, &PublishContext::default())
        .into_iter()
        .map(|d| d.subscriber)
        .collect();
    s.sort_unstable();
    s
}

fn shared_pick(r: &mut R, topic: &str, ctx: &PublishContext) -> u32 {
    let d = r.matches(topic, ctx);
    assert_eq!(d.len(), 1, "one shared group, one delivery");
    d[0].subscriber
}

#[test]
fn plus_does_not_match_dollar_topics_at_first_level() {
    let mut r = router();
    r.subscribe(1, "+/x", "").unwrap();
    r.subscribe(2, "+", "").unwrap();
    assert_eq!(subscribers(&mut r, "$SYS/x"), Vec::<u32>::new());
    assert_eq!(subscribers(&mut r, "$SYS"), Vec::<u32>::new());
    assert_eq!(subscribers(&mut r, "SYS/x"), vec![1]);
}

#[test]
fn hash_does_not_match_dollar_topics_at_first_level() {
    let mut r = router();
    r.subscribe(1, "#", "").unwrap();
    r.subscribe(2, "$share/g/#", "").unwrap();
    assert_eq!(subscribers(&mut r, "$SYS/broker/load"), Vec::<u32>::new());
    assert_eq!(subscribers(&mut r, "a"), vec![1, 2]);
}

#[test]
fn dollar_filters_match_dollar_topics() {
    let mut r = router();
    r.subscribe(1, "$SYS/#", "").unwrap();
    r.subscribe(2, "$SYS/+", "").unwrap();
    assert_eq!(subscribers(&mut r, "$SYS/x"), vec![1, 2]);
    assert_eq!(subscribers(&mut r, "$SYS"), vec![1]);
}

#[test]
fn wildcards_below_first_level_match_dollar_levels() {
    let mut r = router();
    r.subscribe(1, "a/+", "").unwrap();
    r.subscribe(2, "a/#", "").unwrap();
    assert_eq!(subscribers(&mut r, "a/$x"), vec![1, 2]);
}

#[test]
fn hash_matches_parent_level() {
    let mut r = router();
    r.subscribe(1, "a/#", "").unwrap();
    r.subscribe(2, "a/b/#", "").unwrap();
    assert_eq!(subscribers(&mut r, "a"), vec![1]);
    assert_eq!(subscribers(&mut r, "a/b"), vec![1, 2]);
    assert_eq!(subscribers(&mut r, "a/b/c/d"), vec![1, 2]);
    assert_eq!(subscribers(&mut r, "b"), Vec::<u32>::new());
}

#[test]
fn plus_matches_empty_level_but_not_missing_level() {
    let mut r = router();
    r.subscribe(1, "a/+", "").unwrap();
    r.subscribe(2, "+/+", "").unwrap();
    r.subscribe(3, "/#", "").unwrap();
    assert_eq!(subscribers(&mut r, "a/"), vec![1, 2]);
    assert_eq!(subscribers(&mut r, "a"), Vec::<u32>::new());
    assert_eq!(subscribers(&mut r, "/"), vec![2, 3]);
    assert_eq!(subscribers(&mut r, "/x/y"), vec![3]);
}

#[test]
fn subscribe_replaces_same_subscriber_and_filter() {
    let mut r = router();
    assert_eq!(r.subscribe(1, "a/b", "qos0"), Ok(None));
    assert_eq!(r.subscribe(1, "a/b", "qos1"), Ok(Some("qos0")));
    assert_eq!(r.subscription_count(), 1);
    let d = r.matches("a/b", &PublishContext::default());
    assert_eq!(
        d,
        vec![Delivery {
            subscriber: 1,
            options: "qos1",
            kind: DeliveryKind::Plain
        }]
    );
}

#[test]
fn extensions_on_one_filter_are_distinct_subscriptions() {
    let mut r = router();
    r.subscribe(1, "a", "plain").unwrap();
    r.subscribe(1, "$share/g/a", "shared").unwrap();
    r.subscribe(1, "$exclusive/a", "excl").unwrap();
    r.subscribe(1, "$limit/2/a", "lim").unwrap();
    assert_eq!(r.subscription_count(), 4);
    assert_eq!(r.filter_count(), 1);
    let mut kinds: Vec<&str> = r
        .matches("a", &PublishContext::default())
        .into_iter()
        .map(|d| d.options)
        .collect();
    kinds.sort_unstable();
    assert_eq!(kinds, vec!["excl", "lim", "plain", "shared"]);
    assert_eq!(r.unsubscribe(&1, "$share/g/a"), Ok(Some("shared")));
    assert_eq!(r.get(&1, "a"), Ok(Some(&"plain")));
    assert_eq!(r.get(&1, "$share/g/a"), Ok(None));
}

#[test]
fn unsubscribe_prunes_empty_nodes() {
    let mut r = router();
    let filters = [
        "a/b/c",
        "a/+/c",
        "a/#",
        "#",
        "+",
        "/#",
        "$share/g/a/b",
        "$exclusive/x/y/z",
    ];
    for round in 0..3 {
        for (i, f) in filters.iter().enumerate() {
            r.subscribe(i as u32 + round, f, "").unwrap();
        }
        assert_eq!(r.filter_count(), filters.len());
        assert!(r.node_count() > 0);
        for (i, f) in filters.iter().enumerate() {
            assert_eq!(r.unsubscribe(&(i as u32 + round), f), Ok(Some("")));
        }
        assert_eq!(
            (r.subscription_count(), r.filter_count(), r.node_count()),
            (0, 0, 0)
        );
        assert!(r.root.is_empty());
    }
}

#[test]
fn unsubscribe_of_unknown_subscription_returns_none() {
    let mut r = router();
    r.subscribe(1, "a/b", "").unwrap();
    assert_eq!(r.unsubscribe(&2, "a/b"), Ok(None));
    assert_eq!(r.unsubscribe(&1, "a/c"), Ok(None));
    assert_eq!(r.unsubscribe(&1, "a/b/c"), Ok(None));
    assert_eq!(r.unsubscribe(&1, "$share/g/a/b"), Ok(None));
    assert_eq!(
        r.unsubscribe(&1, "a/#/b"),
        Err(RouterError::HashNotLast { level: 1 })
    );
    assert_eq!(r.subscription_count(), 1);
}

#[test]
fn exclusive_refuses_second_subscriber() {
    let mut r = router();
    assert_eq!(r.subscribe(1, "$exclusive/a/+", "first"), Ok(None));
    assert_eq!(
        r.subscribe(2, "$exclusive/a/+", "second"),
        Err(RouterError::ExclusiveHeld)
    );
    assert_eq!(r.subscription_count(), 1);
    assert_eq!(
        r.matches("a/b", &PublishContext::default()),
        vec![Delivery {
            subscriber: 1,
            options: "first",
            kind: DeliveryKind::Exclusive
        }]
    );
}

#[test]
fn exclusive_holder_may_resubscribe() {
    let mut r = router();
    r.subscribe(1, "$exclusive/a", "old").unwrap();
    assert_eq!(r.subscribe(1, "$exclusive/a", "new"), Ok(Some("old")));
}

#[test]
fn exclusive_released_by_unsubscribe() {
    let mut r = router();
    r.subscribe(1, "$exclusive/a", "").unwrap();
    assert_eq!(
        r.unsubscribe(&2, "$exclusive/a"),
        Ok(None),
        "only the holder releases"
    );
    assert_eq!(
        r.subscribe(2, "$exclusive/a", ""),
        Err(RouterError::ExclusiveHeld)
    );
    assert_eq!(r.unsubscribe(&1, "$exclusive/a"), Ok(Some("")));
    assert_eq!(r.subscribe(2, "$exclusive/a", ""), Ok(None));
}

#[test]
fn refused_subscribe_leaves_trie_unchanged() {
    let mut r = router();
    r.subscribe(1, "$exclusive/a/b/c", "").unwrap();
    let nodes = r.node_count();
    assert!(r.subscribe(2, "$exclusive/a/b/c", "").is_err());
    assert!(r.subscribe(2, "a/#/c", "").is_err());
    assert_eq!(
        (r.node_count(), r.filter_count(), r.subscription_count()),
        (nodes, 1, 1)
    );
}

#[test]
fn limit_refuses_subscriber_past_n() {
    let mut r = router();
    assert_eq!(r.subscribe(1, "$limit/2/a", ""), Ok(None));
    assert_eq!(r.subscribe(2, "$limit/2/a", ""), Ok(None));
    assert_eq!(
        r.subscribe(3, "$limit/2/a", ""),
        Err(RouterError::LimitReached { current: 2, max: 2 })
    );
    // A member re-subscribing is a replacement, not a new place.
    assert_eq!(r.subscribe(2, "$limit/2/a", "again"), Ok(Some("")));
    // A larger N admits against the same count.
    assert_eq!(r.subscribe(3, "$limit/3/a", ""), Ok(None));
    assert_eq!(subscribers(&mut r, "a"), vec![1, 2, 3]);
}

#[test]
fn limit_place_freed_by_unsubscribe() {
    let mut r = router();
    r.subscribe(1, "$limit/1/a", "").unwrap();
    assert!(r.subscribe(2, "$limit/1/a", "").is_err());
    assert_eq!(
        r.unsubscribe(&1, "$limit/7/a"),
        Ok(Some("")),
        "N is not part of the identity"
    );
    assert_eq!(r.subscribe(2, "$limit/1/a", ""), Ok(None));
}

#[test]
fn shared_round_robin_rotates_members() {
    let mut r = with_strategy(SharedStrategy::RoundRobin);
    for s in [1, 2, 3] {
        r.subscribe(s, "$share/g/a/+", "").unwrap();
    }
    let ctx = PublishContext::default();
    let picks: Vec<u32> = (0..6).map(|_| shared_pick(&mut r, "a/b", &ctx)).collect();
    assert_eq!(picks, vec![1, 2, 3, 1, 2, 3]);
}

#[test]
fn shared_delivers_one_member_per_group() {
    let mut r = router();
    for s in [1, 2, 3] {
        r.subscribe(s, "$share/g1/a", "").unwrap();
    }
    for s in [4, 5] {
        r.subscribe(s, "$share/g2/a", "").unwrap();
        // Same group name, other filter: another shared subscription (MQTT 5 §4.8.2).
        r.subscribe(s, "$share/g2/+", "").unwrap();
    }
    r.subscribe(6, "a", "").unwrap();
    for _ in 0..5 {
        let d = r.matches("a", &PublishContext::default());
        let count = |pred: &dyn Fn(u32) -> bool| d.iter().filter(|d| pred(d.subscriber)).count();
        assert_eq!(d.len(), 4);
        assert_eq!(count(&|s| (1..=3).contains(&s)), 1);
        assert_eq!(count(&|s| (4..=5).contains(&s)), 2);
        assert_eq!(count(&|s| s == 6), 1);
    }
}

#[test]
fn shared_random_follows_caller_draw() {
    let mut r = with_strategy(SharedStrategy::Random);
    for s in 0..4 {
        r.subscribe(s, "$share/g/a", "").unwrap();
    }
    let mut seen = [false; 4];
    for random in 0..64 {
        let ctx = PublishContext {
            random,
            publisher_hash: 0,
        };
        let first = shared_pick(&mut r, "a", &ctx);
        assert_eq!(
            shared_pick(&mut r, "a", &ctx),
            first,
            "same draw, same member"
        );
        seen[first as usize] = true;
    }
    assert_eq!(seen, [true; 4]);
}

#[test]
fn shared_sticky_keeps_member_until_it_leaves() {
    let mut r = with_strategy(SharedStrategy::Sticky);
    for s in [1, 2, 3] {
        r.subscribe(s, "$share/g/a", "").unwrap();
    }
    let ctx = PublishContext::default();
    let first = shared_pick(&mut r, "a", &ctx);
    for _ in 0..5 {
        assert_eq!(shared_pick(&mut r, "a", &ctx), first);
    }
    r.unsubscribe(&first, "$share/g/a").unwrap();
    let second = shared_pick(&mut r, "a", &ctx);
    assert_ne!(second, first);
    for _ in 0..5 {
        assert_eq!(shared_pick(&mut r, "a", &ctx), second);
    }
}

#[test]
fn shared_publisher_hash_keeps_publisher_on_one_member() {
    let mut r = with_strategy(SharedStrategy::PublisherHash);
    for s in 0..8 {
        r.subscribe(s, "$share/g/a", "").unwrap();
    }
    let mut seen = std::collections::BTreeSet::new();
    for publisher in ["alice", "bob", "carol", "dave", "erin", "frank"] {
        let ctx = PublishContext {
            random: 0,
            publisher_hash: r.publisher_hash(publisher),
        };
        let member = shared_pick(&mut r, "a", &ctx);
        for _ in 0..3 {
            assert_eq!(shared_pick(&mut r, "a", &ctx), member);
        }
        seen.insert(member);
    }
    assert!(seen.len() > 1, "publishers spread over members");
}

#[test]
fn shared_skips_members_the_caller_refuses() {
    let mut r = router();
    for s in [1, 2, 3] {
        r.subscribe(s, "$share/g/a", "").unwrap();
    }
    let online = |s: &u32| *s != 2;
    let mut out = Vec::new();
    for _ in 0..4 {
        r.route("a", &PublishContext::default(), online, &mut out);
    }
    let picks: Vec<u32> = out.iter().map(|d| d.subscriber).collect();
    assert_eq!(picks, vec![1, 3, 1, 3]);
    assert!(out
        .iter()
        .all(|d| matches!(d.kind, DeliveryKind::Shared { accepted: true, .. })));
}

#[test]
fn shared_with_no_accepted_member_delivers_first_choice_flagged() {
    let mut r = router();
    r.subscribe(1, "$share/g/a/#", "").unwrap();
    let mut out = Vec::new();
    r.route("a/b", &PublishContext::default(), |_| false, &mut out);
    assert_eq!(
        out,
        vec![Delivery {
            subscriber: 1,
            options: "",
            kind: DeliveryKind::Shared {
                group: "g".into(),
                filter: "a/#".into(),
                accepted: false
            },
        }]
    );
}

#[test]
fn pick_shared_finds_another_member_after_failed_delivery() {
    let mut r = router();
    for s in [1, 2] {
        r.subscribe(s, "$share/g/a/+", "").unwrap();
    }
    let d = r.matches("a/b", &PublishContext::default()).remove(0);
    let DeliveryKind::Shared { group, filter, .. } = d.kind else {
        panic!("expected a shared delivery, got {:?}", d.kind);
    };
    let failed = d.subscriber;
    let other = r.pick_shared(&group, &filter, &PublishContext::default(), |s| {
        *s != failed
    });
    assert_eq!(other.map(|(s, _)| s), Some(3 - failed));
    assert_eq!(
        r.pick_shared(&group, &filter, &PublishContext::default(), |_| false),
        None
    );
    assert_eq!(
        r.pick_shared("nope", &filter, &PublishContext::default(), |_| true),
        None
    );
}

#[test]
fn queue_is_an_alias_of_share_group_queue() {
    let mut r = router();
    r.subscribe(1, "$queue/a", "").unwrap();
    assert_eq!(r.subscribe(1, "$share/$queue/a", "x"), Ok(Some("")));
    assert_eq!(r.shared_members(crate::QUEUE_GROUP, "a").count(), 1);
}

#[test]
fn subscription_cap_refuses_new_but_allows_replace() {
    let mut r: R = Router::new(RouterConfig {
        subscriptions_max: 2,
        ..RouterConfig::default()
    });
    r.subscribe(1, "a", "").unwrap();
    r.subscribe(2, "a", "").unwrap();
    assert_eq!(
        r.subscribe(3, "a", ""),
        Err(RouterError::SubscriptionsFull { max: 2 })
    );
    assert_eq!(r.subscribe(2, "a", "x"), Ok(Some("")));
    r.unsubscribe(&1, "a").unwrap();
    assert_eq!(r.subscribe(3, "a", ""), Ok(None));
}

#[test]
fn same_operations_and_seed_give_same_delivery_order() {
    let build = || {
        let mut r = router();
        for s in 0..200u32 {
            r.subscribe(s, ["a/+", "#", "a/b", "$share/g/a/b"][s as usize % 4], "")
                .unwrap();
        }
        r
    };
    let (mut a, mut b) = (build(), build());
    for _ in 0..3 {
        assert_eq!(
            a.matches("a/b", &PublishContext::default()),
            b.matches("a/b", &PublishContext::default())
        );
    }
}

#[test]
fn topic_with_too_many_levels_routes_without_panic() {
    let mut r = router();
    r.subscribe(1, "#", "").unwrap();
    let deep = "x/".repeat(10_000);
    assert_eq!(subscribers(&mut r, &deep), vec![1]);
}

#[test]
fn an_admitted_exclusive_takes_the_slot_and_keeps_the_count() {
    let mut r = router();
    r.subscribe(1, "$exclusive/a/#", "one").unwrap();
    assert_eq!(
        r.subscribe(2, "$exclusive/a/#", "two"),
        Err(RouterError::ExclusiveHeld)
    );
    // Admitted elsewhere after 1 left; 1's removal has not arrived here yet.
    assert_eq!(
        r.subscribe_admitted(2, "$exclusive/a/#", "two"),
        Ok((None, Some(1))),
        "1's subscription went"
    );
    assert_eq!(r.subscription_count(), 1);
    // Admitted again for the same subscriber: it replaces its own, evicting no one.
    assert_eq!(
        r.subscribe_admitted(2, "$exclusive/a/#", "two"),
        Ok((Some("two"), None))
    );
    assert_eq!(subscribers(&mut r, "a/x"), vec![2]);
    // 1's late removal leaves 2 in place.
    assert_eq!(r.unsubscribe(&1, "$exclusive/a/#"), Ok(None));
    assert_eq!(subscribers(&mut r, "a/x"), vec![2]);
    assert_eq!(r.unsubscribe(&2, "$exclusive/a/#"), Ok(Some("two")));
    assert_eq!(r.subscription_count(), 0);
}

#[test]
fn an_admitted_limit_is_installed_past_its_count() {
    let mut r = router();
    r.subscribe(1, "$limit/1/a/+", "one").unwrap();
    assert!(r.subscribe(2, "$limit/1/a/+", "two").is_err());
    assert_eq!(
        r.subscribe_admitted(2, "$limit/1/a/+", "two"),
        Ok((None, None))
    );
    assert_eq!(subscribers(&mut r, "a/x"), vec![1, 2]);
}
