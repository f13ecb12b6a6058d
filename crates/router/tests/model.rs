//! The trie and the retained index agree with naive linear-scan models over random operation
//! sequences, `$SYS` topics, `#`, `+` and shared/exclusive/limit filters included.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use starling_router::{
    filter_matches, Delivery, DeliveryKind, PublishContext, RetainedConfig, RetainedIndex, Router,
    RouterConfig, RouterError, SharedStrategy,
};

/// The reference matcher: recursion over collected levels, as MQTT 5 §4.7 states the rules.
fn naive_matches(filter: &str, topic: &str) -> bool {
    fn rec(filter: &[&str], topic: &[&str]) -> bool {
        match (filter.split_first(), topic.split_first()) {
            (Some((&"#", _)), _) => true,
            (Some((&"+", f)), Some((_, t))) => rec(f, t),
            (Some((fl, f)), Some((tl, t))) => fl == tl && rec(f, t),
            (None, None) => true,
            _ => false,
        }
    }
    let f: Vec<&str> = filter.split('/').collect();
    let t: Vec<&str> = topic.split('/').collect();
    if t[0].starts_with('$') && (f[0] == "+" || f[0] == "#") {
        return false;
    }
    rec(&f, &t)
}

fn topic() -> impl Strategy<Value = String> {
    let first = prop::sample::select(vec!["a", "b", "", "$SYS", "$x"]);
    let rest = prop::collection::vec(prop::sample::select(vec!["a", "b", "", "c"]), 0..4);
    (first, rest).prop_map(|(f, r)| {
        let topic = std::iter::once(f).chain(r).collect::<Vec<_>>().join("/");
        // One empty level is the empty string, not a topic name.
        if topic.is_empty() {
            "/".to_string()
        } else {
            topic
        }
    })
}

fn filter() -> impl Strategy<Value = String> {
    let levels = prop::collection::vec(prop::sample::select(vec!["a", "b", "", "+", "$SYS"]), 0..4);
    (levels, any::<bool>()).prop_map(|(mut levels, hash)| {
        // One empty level is the empty string, not a filter.
        if hash || levels.concat().is_empty() && levels.len() < 2 {
            levels.push("#");
        }
        levels.join("/")
    })
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Plain,
    Shared(String),
    Exclusive,
    Limit,
}

#[derive(Debug, Clone)]
enum Ext {
    Plain,
    Share(&'static str),
    Queue,
    Exclusive,
    Limit(u32),
}

impl Ext {
    fn render(&self, filter: &str) -> String {
        match self {
            Ext::Plain => filter.to_string(),
            Ext::Share(g) => format!("$share/{g}/{filter}"),
            Ext::Queue => format!("$queue/{filter}"),
            Ext::Exclusive => format!("$exclusive/{filter}"),
            Ext::Limit(n) => format!("$limit/{n}/{filter}"),
        }
    }

    fn kind(&self) -> Kind {
        match self {
            Ext::Plain => Kind::Plain,
            Ext::Share(g) => Kind::Shared(g.to_string()),
            Ext::Queue => Kind::Shared("$queue".to_string()),
            Ext::Exclusive => Kind::Exclusive,
            Ext::Limit(_) => Kind::Limit,
        }
    }
}

fn ext() -> impl Strategy<Value = Ext> {
    prop_oneof![
        4 => Just(Ext::Plain),
        2 => prop::sample::select(vec!["g", "h"]).prop_map(Ext::Share),
        1 => Just(Ext::Queue),
        1 => Just(Ext::Exclusive),
        1 => (1u32..4).prop_map(Ext::Limit),
    ]
}

#[derive(Debug, Clone)]
enum Op {
    Subscribe {
        sub: u8,
        ext: Ext,
        filter: String,
        options: u32,
    },
    Unsubscribe {
        sub: u8,
        ext: Ext,
        filter: String,
    },
    Publish {
        topic: String,
        random: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..6, ext(), filter(), any::<u32>())
            .prop_map(|(sub, ext, filter, options)| Op::Subscribe { sub, ext, filter, options }),
        2 => (0u8..6, ext(), filter()).prop_map(|(sub, ext, filter)| Op::Unsubscribe { sub, ext, filter }),
        3 => (topic(), any::<u64>()).prop_map(|(topic, random)| Op::Publish { topic, random }),
    ]
}

fn strategy() -> impl Strategy<Value = SharedStrategy> {
    prop::sample::select(vec![
        SharedStrategy::RoundRobin,
        SharedStrategy::Random,
        SharedStrategy::Sticky,
        SharedStrategy::PublisherHash,
    ])
}

type Key = (u8, Kind, String);

/// What the model expects a subscribe to return.
fn model_subscribe(
    model: &BTreeMap<Key, u32>,
    sub: u8,
    ext: &Ext,
    filter: &str,
) -> Result<Option<u32>, RouterError> {
    let key = (sub, ext.kind(), filter.to_string());
    if let Some(&old) = model.get(&key) {
        return Ok(Some(old));
    }
    let others = |kind: Kind| {
        model
            .keys()
            .filter(|(s, k, f)| *s != sub && *k == kind && f == filter)
            .count()
    };
    match ext {
        Ext::Exclusive if others(Kind::Exclusive) > 0 => Err(RouterError::ExclusiveHeld),
        Ext::Limit(max) if others(Kind::Limit) >= *max as usize => Err(RouterError::LimitReached {
            current: others(Kind::Limit),
            max: *max,
        }),
        _ => Ok(None),
    }
}

fn check_route(model: &BTreeMap<Key, u32>, topic: &str, deliveries: &[Delivery<u8, u32>]) {
    // Non-shared: exactly the matching subscriptions, once each.
    let mut got: Vec<(u8, Kind, u32)> = Vec::new();
    let mut got_shared: BTreeMap<(String, String), Vec<(u8, u32)>> = BTreeMap::new();
    for d in deliveries {
        match &d.kind {
            DeliveryKind::Plain => got.push((d.subscriber, Kind::Plain, d.options)),
            DeliveryKind::Exclusive => got.push((d.subscriber, Kind::Exclusive, d.options)),
            DeliveryKind::Limited => got.push((d.subscriber, Kind::Limit, d.options)),
            DeliveryKind::Shared {
                group,
                filter,
                accepted,
            } => {
                assert!(accepted, "route accepted every member");
                got_shared
                    .entry((group.to_string(), filter.to_string()))
                    .or_default()
                    .push((d.subscriber, d.options));
            }
        }
    }
    got.sort();
    let mut want: Vec<(u8, Kind, u32)> = Vec::new();
    let mut want_shared: BTreeMap<(String, String), BTreeSet<(u8, u32)>> = BTreeMap::new();
    for ((sub, kind, filter), &options) in model {
        if !naive_matches(filter, topic) {
            continue;
        }
        match kind {
            Kind::Shared(g) => {
                want_shared
                    .entry((g.clone(), filter.clone()))
                    .or_default()
                    .insert((*sub, options));
            }
            k => want.push((*sub, k.clone(), options)),
        }
    }
    want.sort();
    assert_eq!(got, want, "non-shared deliveries for {topic}");
    assert_eq!(
        got_shared.keys().collect::<Vec<_>>(),
        want_shared.keys().collect::<Vec<_>>(),
        "shared groups for {topic}"
    );
    for (group, picks) in &got_shared {
        assert_eq!(picks.len(), 1, "one member of {group:?}");
        assert!(
            want_shared[group].contains(&picks[0]),
            "{:?} is a member of {group:?}",
            picks[0]
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn reference_matcher_agrees_with_naive(filter in filter(), topic in topic()) {
        prop_assert_eq!(filter_matches(&filter, &topic), naive_matches(&filter, &topic));
    }

    #[test]
    fn trie_agrees_with_naive_scan(
        ops in prop::collection::vec(op(), 1..80),
        shared_strategy in strategy(),
        hash_seed in any::<u64>(),
    ) {
        let config = RouterConfig { shared_strategy, hash_seed, ..RouterConfig::default() };
        let mut router: Router<u8, u32> = Router::new(config);
        let mut model: BTreeMap<Key, u32> = BTreeMap::new();
        let mut out = Vec::new();
        for op in ops {
            match op {
                Op::Subscribe { sub, ext, filter, options } => {
                    let want = model_subscribe(&model, sub, &ext, &filter);
                    let got = router.subscribe(sub, &ext.render(&filter), options);
                    prop_assert_eq!(&got, &want);
                    if got.is_ok() {
                        model.insert((sub, ext.kind(), filter), options);
                    }
                }
                Op::Unsubscribe { sub, ext, filter } => {
                    let want = model.remove(&(sub, ext.kind(), filter.clone()));
                    prop_assert_eq!(router.unsubscribe(&sub, &ext.render(&filter)), Ok(want));
                }
                Op::Publish { topic, random } => {
                    let ctx = PublishContext { random, publisher_hash: router.publisher_hash(&topic) };
                    out.clear();
                    router.route(&topic, &ctx, |_| true, &mut out);
                    check_route(&model, &topic, &out);
                }
            }
            let filters: BTreeSet<&String> = model.keys().map(|(_, _, f)| f).collect();
            prop_assert_eq!(router.subscription_count(), model.len());
            prop_assert_eq!(router.filter_count(), filters.len());
            let wild = filters.iter().filter(|f| f.contains(['+', '#'])).count();
            prop_assert_eq!(router.wildcard_filter_count(), wild);
        }
        // Churn leaves nothing behind.
        for (sub, kind, filter) in model.keys() {
            let raw = match kind {
                Kind::Plain => filter.clone(),
                Kind::Shared(g) => format!("$share/{g}/{filter}"),
                Kind::Exclusive => format!("$exclusive/{filter}"),
                Kind::Limit => format!("$limit/1/{filter}"),
            };
            prop_assert!(router.unsubscribe(sub, &raw).unwrap().is_some());
        }
        prop_assert_eq!(
            (router.subscription_count(), router.filter_count(), router.node_count()),
            (0, 0, 0)
        );
        prop_assert_eq!(router.wildcard_filter_count(), 0);
    }

    #[test]
    fn shared_members_refused_by_caller_are_skipped(
        members in prop::collection::btree_set(0u8..8, 1..6),
        offline in prop::collection::btree_set(0u8..8, 0..8),
        shared_strategy in strategy(),
        random in any::<u64>(),
    ) {
        let config = RouterConfig { shared_strategy, ..RouterConfig::default() };
        let mut router: Router<u8, ()> = Router::new(config);
        for &m in &members {
            router.subscribe(m, "$share/g/t/#", ()).unwrap();
        }
        let mut out = Vec::new();
        let ctx = PublishContext { random, publisher_hash: random };
        router.route("t/x", &ctx, |s| !offline.contains(s), &mut out);
        prop_assert_eq!(out.len(), 1);
        let any_online = members.iter().any(|m| !offline.contains(m));
        let DeliveryKind::Shared { accepted, .. } = &out[0].kind else { panic!("shared") };
        prop_assert_eq!(*accepted, any_online);
        prop_assert!(members.contains(&out[0].subscriber));
        if any_online {
            prop_assert!(!offline.contains(&out[0].subscriber));
        }
    }
}

#[derive(Debug, Clone)]
enum RetainOp {
    Retain {
        topic: String,
        size: usize,
        value: u32,
    },
    Remove {
        topic: String,
    },
    Match {
        filter: String,
    },
}

fn retain_op() -> impl Strategy<Value = RetainOp> {
    prop_oneof![
        4 => (topic(), 0usize..20, any::<u32>())
            .prop_map(|(topic, size, value)| RetainOp::Retain { topic, size, value }),
        2 => topic().prop_map(|topic| RetainOp::Remove { topic }),
        3 => filter().prop_map(|filter| RetainOp::Match { filter }),
        1 => topic().prop_map(|filter| RetainOp::Match { filter }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn retained_index_agrees_with_naive_scan(
        ops in prop::collection::vec(retain_op(), 1..80),
        hash_seed in any::<u64>(),
    ) {
        let config = RetainedConfig {
            retained_max: 12,
            retained_bytes_max: 100,
            hash_seed,
            ..RetainedConfig::default()
        };
        let mut index: RetainedIndex<u32> = RetainedIndex::new(config);
        let mut model: BTreeMap<String, (u32, usize)> = BTreeMap::new();
        for op in ops {
            match op {
                RetainOp::Retain { topic, size, value } => {
                    let old = model.get(&topic).copied();
                    let bytes = model.values().map(|(_, s)| s).sum::<usize>() - old.map_or(0, |o| o.1) + size;
                    let want = if old.is_none() && model.len() >= 12 {
                        Err(RouterError::RetainedFull { max: 12 })
                    } else if bytes > 100 {
                        Err(RouterError::RetainedBytesFull { bytes, max: 100 })
                    } else {
                        model.insert(topic.clone(), (value, size));
                        Ok(old.map(|o| o.0))
                    };
                    prop_assert_eq!(index.retain(&topic, value, size), want);
                }
                RetainOp::Remove { topic } => {
                    prop_assert_eq!(index.remove(&topic), model.remove(&topic).map(|o| o.0));
                }
                RetainOp::Match { filter } => {
                    let mut got: Vec<(String, u32)> =
                        index.matching(&filter).unwrap().map(|(t, v)| (t.to_string(), *v)).collect();
                    got.sort();
                    let want: Vec<(String, u32)> = model
                        .iter()
                        .filter(|(t, _)| naive_matches(&filter, t))
                        .map(|(t, (v, _))| (t.clone(), *v))
                        .collect();
                    prop_assert_eq!(got, want);
                }
            }
            prop_assert_eq!(index.len(), model.len());
            prop_assert_eq!(index.bytes(), model.values().map(|(_, s)| s).sum::<usize>());
        }
        for topic in model.keys() {
            prop_assert!(index.remove(topic).is_some());
        }
        prop_assert_eq!((index.len(), index.bytes(), index.node_count()), (0, 0, 0));
    }
}
