//! Property: `filter_is_subset` agrees with a brute-force check over a small topic universe.
//!
//! Filters use levels from {a, b, $s, +, #} up to 3 deep; the universe holds every topic
//! of 1 to 4 levels over {a, b, c, $s}. `c` never appears in a filter, so it witnesses what
//! `+` and `#` match beyond the literals, and depth 4 exceeds every filter, so it witnesses
//! what `#` matches beyond a fixed depth: over this universe the brute force is exact.

use proptest::prelude::*;
use std::str::FromStr;

use starling_auth::{
    filter_is_subset, filter_matches_topic, filters_overlap, validate_filter, Acl, ClientInfo,
    Decision, Scope,
};

const TOPIC_LEVELS: [&str; 4] = ["a", "b", "c", "$s"];

fn universe() -> Vec<String> {
    let mut out: Vec<Vec<&str>> = vec![vec![]];
    let mut all = Vec::new();
    for _ in 0..4 {
        out = out
            .iter()
            .flat_map(|p| {
                TOPIC_LEVELS.iter().map(move |l| {
                    let mut p = p.clone();
                    p.push(l);
                    p
                })
            })
            .collect();
        all.extend(out.iter().map(|p| p.join("/")));
    }
    all
}

fn filter() -> impl Strategy<Value = String> {
    let level = prop_oneof![Just("a"), Just("b"), Just("$s"), Just("+"), Just("#")];
    prop::collection::vec(level, 1..=3)
        .prop_map(|levels| levels.join("/"))
        .prop_filter("valid filter", |f| validate_filter(f).is_ok())
}

fn brute_force_subset(universe: &[String], requested: &str, pattern: &str) -> bool {
    universe
        .iter()
        .filter(|t| filter_matches_topic(requested, t))
        .all(|t| filter_matches_topic(pattern, t))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn subset_agrees_with_brute_force(requested in filter(), pattern in filter()) {
        let universe = universe();
        prop_assert_eq!(
            filter_is_subset(&requested, &pattern),
            brute_force_subset(&universe, &requested, &pattern),
            "requested {} pattern {}", requested, pattern
        );
    }
}

fn every_filter() -> Vec<String> {
    let levels = ["a", "b", "$s", "+", "#"];
    let mut filters = Vec::new();
    for n in 1..=3u32 {
        for i in 0..levels.len().pow(n) {
            let mut idx = i;
            let f: Vec<&str> = (0..n)
                .map(|_| {
                    let l = levels[idx % levels.len()];
                    idx /= levels.len();
                    l
                })
                .collect();
            let f = f.join("/");
            if validate_filter(&f).is_ok() {
                filters.push(f);
            }
        }
    }
    filters
}

#[test]
fn subset_agrees_with_brute_force_on_every_pair() {
    // The filter space is small enough to check exhaustively as well.
    let filters = every_filter();
    let universe = universe();
    for r in &filters {
        for p in &filters {
            assert_eq!(
                filter_is_subset(r, p),
                brute_force_subset(&universe, r, p),
                "requested {r} pattern {p}"
            );
        }
    }
}

#[test]
fn overlap_agrees_with_brute_force_on_every_pair() {
    let filters = every_filter();
    let universe = universe();
    for a in &filters {
        for b in &filters {
            let brute = universe
                .iter()
                .any(|t| filter_matches_topic(a, t) && filter_matches_topic(b, t));
            assert_eq!(filters_overlap(a, b), brute, "{a} and {b}");
        }
    }
}

fn rule_set() -> impl Strategy<Value = (Vec<(bool, String)>, bool)> {
    (
        prop::collection::vec((any::<bool>(), filter()), 0..5),
        any::<bool>(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    /// A subscription's scope never promises more than delivery checks give: `All` only
    /// when every topic it matches may be read, `Nothing` only when none may be.
    #[test]
    fn subscribe_scope_agrees_with_delivery_checks((rules, default_allow) in rule_set(), requested in filter()) {
        let mut text = String::new();
        for (allow, pattern) in &rules {
            let permission = if *allow { "allow" } else { "deny" };
            text.push_str(&format!(
                "[[rules]]\npermission = \"{permission}\"\naction = \"subscribe\"\ntopics = [\"{pattern}\"]\n"
            ));
        }
        let default = if default_allow { Decision::Allow } else { Decision::Deny };
        let acl = Acl::from_str(&text).expect("valid").with_default(default);
        let who = ClientInfo { username: Some("u"), client_id: "c", addr: "192.0.2.1".parse().unwrap() };
        let reads: Vec<Decision> = universe()
            .iter()
            .filter(|t| filter_matches_topic(&requested, t))
            .map(|t| acl.check_read(&who, t))
            .collect();
        let any_allowed = reads.contains(&Decision::Allow);
        let any_denied = reads.contains(&Decision::Deny);
        match acl.subscribe_scope(&who, &requested) {
            Scope::All => prop_assert!(!any_denied, "{} under {:?}", requested, rules),
            Scope::Nothing => prop_assert!(!any_allowed, "{} under {:?}", requested, rules),
            Scope::Partial => {}
        }
        if any_denied {
            prop_assert!(acl.may_deny_reads(&who));
        }
    }
}
