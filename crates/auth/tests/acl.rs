//! ACL behaviour: rule order, who-matchers, placeholders, subset checks for SUBSCRIBE,
//! `$SYS`, the `eq` form, and errors naming the rule.

use std::net::IpAddr;
use std::str::FromStr;

use starling_auth::{Acl, AclProblem, Action, AuthError, ClientInfo, Decision};

fn client<'a>(username: Option<&'a str>, client_id: &'a str, addr: &str) -> ClientInfo<'a> {
    ClientInfo {
        username,
        client_id,
        addr: addr.parse::<IpAddr>().expect("test address"),
    }
}

fn alice() -> ClientInfo<'static> {
    client(Some("alice"), "alice-phone", "192.0.2.10")
}

fn acl(text: &str) -> Acl {
    Acl::from_str(text).expect("valid ACL")
}

#[test]
fn first_matching_rule_wins_over_later_rules() {
    let acl = acl(r##"
        [[rules]]
        permission = "deny"
        action = "publish"
        topics = ["a/secret"]
        [[rules]]
        permission = "allow"
        action = "all"
        topics = ["a/#"]
    "##)
    .with_default(Decision::Deny);
    assert_eq!(
        acl.check(&alice(), Action::Publish, "a/secret"),
        Decision::Deny
    );
    assert_eq!(
        acl.check(&alice(), Action::Publish, "a/open"),
        Decision::Allow
    );
    // The deny rule is publish-only, so the allow rule decides a subscribe to a/secret.
    assert_eq!(
        acl.check(&alice(), Action::Subscribe, "a/secret"),
        Decision::Allow
    );
}

#[test]
fn no_matching_rule_gives_the_default() {
    let text = r##"
        [[rules]]
        permission = "allow"
        action = "publish"
        topics = ["x"]
    "##;
    assert_eq!(
        acl(text).check(&alice(), Action::Publish, "y"),
        Decision::Allow
    );
    let deny = acl(text).with_default(Decision::Deny);
    assert_eq!(deny.check(&alice(), Action::Publish, "y"), Decision::Deny);
    assert_eq!(deny.default_decision(), Decision::Deny);
    assert_eq!(
        Acl::empty(Decision::Deny).check(&alice(), Action::Subscribe, "#"),
        Decision::Deny
    );
}

#[test]
fn user_clientid_and_all_users_matchers() {
    let acl = acl(r##"
        [[rules]]
        permission = "allow"
        action = "publish"
        topics = ["u"]
        user = "alice"
        [[rules]]
        permission = "allow"
        action = "publish"
        topics = ["c"]
        clientid = "bob-1"
        [[rules]]
        permission = "allow"
        action = "publish"
        topics = ["everyone"]
        user = "$all"
    "##)
    .with_default(Decision::Deny);
    let bob = client(Some("bob"), "bob-1", "192.0.2.11");
    let anon = client(None, "anon", "192.0.2.12");
    assert_eq!(acl.check(&alice(), Action::Publish, "u"), Decision::Allow);
    assert_eq!(acl.check(&bob, Action::Publish, "u"), Decision::Deny);
    assert_eq!(acl.check(&anon, Action::Publish, "u"), Decision::Deny);
    assert_eq!(acl.check(&bob, Action::Publish, "c"), Decision::Allow);
    assert_eq!(acl.check(&alice(), Action::Publish, "c"), Decision::Deny);
    assert_eq!(
        acl.check(&anon, Action::Publish, "everyone"),
        Decision::Allow
    );
    assert_eq!(
        acl.check(&alice(), Action::Publish, "everyone"),
        Decision::Allow
    );
}

#[test]
fn ipaddr_matches_single_addresses_and_cidr_blocks() {
    let acl = acl(r##"
        [[rules]]
        permission = "allow"
        action = "all"
        topics = ["local/#"]
        ipaddr = "127.0.0.1"
        [[rules]]
        permission = "allow"
        action = "all"
        topics = ["lan/#"]
        ipaddr = "10.0.0.0/8"
        [[rules]]
        permission = "allow"
        action = "all"
        topics = ["v6/#"]
        ipaddr = "2001:db8::/32"
    "##)
    .with_default(Decision::Deny);
    let at = |addr| client(Some("alice"), "c", addr);
    assert_eq!(
        acl.check(&at("127.0.0.1"), Action::Publish, "local/x"),
        Decision::Allow
    );
    assert_eq!(
        acl.check(&at("127.0.0.2"), Action::Publish, "local/x"),
        Decision::Deny
    );
    assert_eq!(
        acl.check(&at("10.200.3.4"), Action::Publish, "lan/x"),
        Decision::Allow
    );
    assert_eq!(
        acl.check(&at("11.0.0.1"), Action::Publish, "lan/x"),
        Decision::Deny
    );
    assert_eq!(
        acl.check(&at("2001:db8::7"), Action::Publish, "v6/x"),
        Decision::Allow
    );
    // A v4 client on a dual-stack socket appears v4-mapped; it still matches v4 rules.
    assert_eq!(
        acl.check(&at("::ffff:10.1.2.3"), Action::Publish, "lan/x"),
        Decision::Allow
    );
}

#[test]
fn placeholders_substitute_username_and_client_id() {
    let acl = acl(r##"
        [[rules]]
        permission = "allow"
        action = "all"
        topics = ["users/%u/#", "devices/%c/state"]
    "##)
    .with_default(Decision::Deny);
    assert_eq!(
        acl.check(&alice(), Action::Publish, "users/alice/x"),
        Decision::Allow
    );
    assert_eq!(
        acl.check(&alice(), Action::Publish, "users/bob/x"),
        Decision::Deny
    );
    assert_eq!(
        acl.check(&alice(), Action::Publish, "devices/alice-phone/state"),
        Decision::Allow
    );
    assert_eq!(
        acl.check(&alice(), Action::Subscribe, "users/alice/+/temp"),
        Decision::Allow
    );
}

#[test]
fn username_placeholder_never_matches_anonymous_clients() {
    let acl = acl(r##"
        [[rules]]
        permission = "allow"
        action = "all"
        topics = ["users/%u/#"]
    "##)
    .with_default(Decision::Deny);
    let anon = client(None, "anon", "192.0.2.1");
    assert_eq!(acl.check(&anon, Action::Publish, "users/x"), Decision::Deny);
    assert_eq!(
        acl.check(&anon, Action::Publish, "users//x"),
        Decision::Deny
    );
}

#[test]
fn placeholder_values_with_wildcards_or_slashes_do_not_widen_the_pattern() {
    let acl = acl(r##"
        [[rules]]
        permission = "allow"
        action = "all"
        topics = ["users/%u/#", "eq users/%c"]
    "##)
    .with_default(Decision::Deny);
    let sneaky = client(Some("#"), "+", "192.0.2.1");
    assert_eq!(
        acl.check(&sneaky, Action::Subscribe, "users/#"),
        Decision::Deny
    );
    assert_eq!(
        acl.check(&sneaky, Action::Subscribe, "users/+"),
        Decision::Deny
    );
    let slashy = client(Some("a/b"), "c", "192.0.2.1");
    assert_eq!(
        acl.check(&slashy, Action::Publish, "users/a/b/x"),
        Decision::Deny
    );
}

#[test]
fn subscribe_is_allowed_only_for_filters_inside_the_pattern() {
    let acl = acl(r##"
        [[rules]]
        permission = "allow"
        action = "subscribe"
        topics = ["a/#", "b/+"]
    "##)
    .with_default(Decision::Deny);
    let ok = |f| acl.check(&alice(), Action::Subscribe, f);
    assert_eq!(ok("a/+/c"), Decision::Allow);
    assert_eq!(ok("a/#"), Decision::Allow);
    assert_eq!(ok("a"), Decision::Allow);
    assert_eq!(ok("b/x"), Decision::Allow);
    assert_eq!(ok("b/+"), Decision::Allow);
    assert_eq!(ok("b/#"), Decision::Deny);
    assert_eq!(ok("#"), Decision::Deny);
    assert_eq!(ok("+/c"), Decision::Deny);
}

#[test]
fn deny_rule_catches_filters_inside_it_but_not_overlapping_ones() {
    // A deny rule on `secret/#` catches subscriptions inside it, but `#` (which overlaps
    // without being inside) is not caught by it: the next rule decides, so pair a broad
    // allow with care.
    let acl = acl(r##"
        [[rules]]
        permission = "deny"
        action = "subscribe"
        topics = ["secret/#"]
        [[rules]]
        permission = "allow"
        action = "subscribe"
        topics = ["#"]
    "##);
    assert_eq!(
        acl.check(&alice(), Action::Subscribe, "secret/+"),
        Decision::Deny
    );
    assert_eq!(acl.check(&alice(), Action::Subscribe, "#"), Decision::Allow);
}

#[test]
fn sys_topics_are_not_covered_by_wildcard_rules() {
    let acl = acl(r##"
        [[rules]]
        permission = "allow"
        action = "all"
        topics = ["#"]
        user = "alice"
        [[rules]]
        permission = "allow"
        action = "subscribe"
        topics = ["$SYS/#"]
        user = "admin"
    "##)
    .with_default(Decision::Deny);
    let admin = client(Some("admin"), "ops", "192.0.2.2");
    assert_eq!(acl.check(&alice(), Action::Publish, "x/y"), Decision::Allow);
    assert_eq!(
        acl.check(&alice(), Action::Publish, "$SYS/uptime"),
        Decision::Deny
    );
    assert_eq!(
        acl.check(&alice(), Action::Subscribe, "$SYS/#"),
        Decision::Deny
    );
    assert_eq!(
        acl.check(&admin, Action::Subscribe, "$SYS/#"),
        Decision::Allow
    );
    assert_eq!(
        acl.check(&admin, Action::Subscribe, "$SYS/+/uptime"),
        Decision::Allow
    );
    assert_eq!(acl.check(&admin, Action::Publish, "$SYS/x"), Decision::Deny);
}

#[test]
fn eq_form_matches_the_filter_literally() {
    let acl = acl(r##"
        [[rules]]
        permission = "allow"
        action = "subscribe"
        topics = ["eq sensors/#"]
    "##)
    .with_default(Decision::Deny);
    assert_eq!(
        acl.check(&alice(), Action::Subscribe, "sensors/#"),
        Decision::Allow
    );
    // Inside `sensors/#` as a filter, but not the literal string.
    assert_eq!(
        acl.check(&alice(), Action::Subscribe, "sensors/a"),
        Decision::Deny
    );
    assert_eq!(
        acl.check(&alice(), Action::Subscribe, "sensors/+"),
        Decision::Deny
    );
}

fn rule_error(text: &str) -> (usize, AclProblem, String) {
    match Acl::from_str(text) {
        Err(e @ AuthError::AclRule { .. }) => {
            let msg = e.to_string();
            let AuthError::AclRule { index, problem, .. } = e else {
                unreachable!()
            };
            (index, problem, msg)
        }
        other => panic!("expected a rule error, got {other:?}"),
    }
}

#[test]
fn invalid_topic_pattern_names_the_rule_and_topic() {
    let (index, problem, msg) = rule_error(
        r##"
        [[rules]]
        permission = "allow"
        action = "all"
        topics = ["ok"]
        [[rules]]
        permission = "allow"
        action = "all"
        topics = ["fine", "a/#/b"]
    "##,
    );
    assert_eq!(index, 1);
    assert!(matches!(problem, AclProblem::BadTopic { topic: 1, .. }));
    assert!(msg.starts_with("rules[1]: topics[1]: \"a/#/b\""), "{msg}");
}

#[test]
fn invalid_ipaddr_and_empty_topics_are_rule_errors() {
    let (index, problem, msg) = rule_error(
        r##"
        [[rules]]
        permission = "allow"
        action = "all"
        topics = ["a"]
        ipaddr = "10.0.0.0/33"
    "##,
    );
    assert_eq!(index, 0);
    assert!(matches!(problem, AclProblem::BadIpAddr { .. }));
    assert!(msg.contains("ipaddr"), "{msg}");
    let (_, problem, _) = rule_error(
        r##"
        [[rules]]
        permission = "allow"
        action = "all"
        topics = []
    "##,
    );
    assert_eq!(problem, AclProblem::NoTopics);
}

#[test]
fn bad_permission_or_unknown_field_names_the_rule_key() {
    let err = Acl::from_str(
        r##"
        [[rules]]
        permission = "maybe"
        action = "all"
        topics = ["a"]
    "##,
    )
    .expect_err("bad permission");
    let msg = err.to_string();
    assert!(msg.contains("rules[0].permission"), "{msg}");
    let err = Acl::from_str(
        r##"
        [[rules]]
        permission = "allow"
        action = "all"
        topics = ["a"]
        usr = "x"
    "##,
    )
    .expect_err("unknown field");
    assert!(err.to_string().contains("usr"), "{err}");
}

#[test]
fn load_errors_name_the_file() {
    let dir = std::env::temp_dir().join(format!("starling-acl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("acl.toml");
    std::fs::write(
        &path,
        "[[rules]]\npermission = \"allow\"\naction = \"all\"\ntopics = [\"+x\"]\n",
    )
    .expect("write");
    let err = Acl::load(&path).expect_err("bad topic");
    assert!(err.to_string().contains("acl.toml: rules[0]"), "{err}");
    let missing = Acl::load(dir.join("missing.toml")).expect_err("missing file");
    assert!(matches!(missing, AuthError::Io { .. }));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn rule_only_decisions_leave_what_no_rule_touches_undecided() {
    let acl = acl(r##"
        [[rules]]
        permission = "deny"
        action = "all"
        topics = ["private/#"]
    "##)
    .with_default(Decision::Allow);
    let a = alice();
    assert_eq!(
        acl.rule_decision(&a, Action::Publish, "private/x"),
        Some(Decision::Deny)
    );
    assert_eq!(acl.rule_decision(&a, Action::Publish, "public/x"), None);
    assert_eq!(
        acl.read_rule_decision(&a, "private/x"),
        Some(Decision::Deny)
    );
    assert_eq!(acl.read_rule_decision(&a, "public/x"), None);
    use starling_auth::Scope;
    assert_eq!(acl.subscribe_rule_scope(&a, "public/#"), None);
    assert_eq!(
        acl.subscribe_rule_scope(&a, "private/#"),
        Some(Scope::Nothing)
    );
    // Touched in part: the rest falls to the default, as in `subscribe_scope`.
    assert_eq!(acl.subscribe_rule_scope(&a, "#"), Some(Scope::Partial));
    assert_eq!(acl.subscribe_scope(&a, "#"), Scope::Partial);
    assert_eq!(acl.subscribe_scope(&a, "public/#"), Scope::All);
}
