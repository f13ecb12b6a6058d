//! MQTT filter matching for ACL patterns: a filter against a topic name, and a filter
//! against another filter (subset), both with the `$`-topic rule.

/// Checks MQTT filter syntax (MQTT 5 §4.7.1): non-empty, `+` and `#` occupy whole levels,
/// `#` only last. Returns the reason on failure.
pub fn validate_filter(filter: &str) -> Result<(), &'static str> {
    if filter.is_empty() {
        return Err("empty");
    }
    if filter.contains('\0') {
        return Err("contains U+0000");
    }
    let mut levels = filter.split('/').peekable();
    while let Some(level) = levels.next() {
        if level.contains('#') && (level != "#" || levels.peek().is_some()) {
            return Err("`#` must be a whole level and the last one");
        }
        if level.contains('+') && level != "+" {
            return Err("`+` must be a whole level");
        }
    }
    Ok(())
}

/// Whether `filter` matches the topic name `topic` (MQTT 5 §4.7).
///
/// A wildcard at the first level does not match a topic whose first level starts with `$`
/// (MQTT 5 §4.7.2), so `#` does not cover `$SYS/...`. Both arguments are assumed
/// syntactically valid; an invalid filter matches what its levels literally say.
pub fn filter_matches_topic(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let mut f = filter.split('/');
    let mut t = topic.split('/');
    loop {
        match (f.next(), t.next()) {
            // `#` also matches the parent level: `a/#` matches `a` (MQTT 5 §4.7.1.2).
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(fl), Some(tl)) if fl == tl => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// Whether every topic that `requested` matches is also matched by `pattern`: the check an
/// ACL makes for SUBSCRIBE, so a rule over `a/#` permits subscribing to `a/+/c` but a rule
/// over `a/+` does not permit `a/#`.
///
/// Examples: `a/+/c` ⊆ `a/#`, `a/b` ⊆ `a/+`, `#` ⊆ `#` (and `+/#`, which matches the same
/// topics), `$SYS/x` ⊄ `#` (the `$` rule), `a/#` ⊄ `a/+` (`a/#` also matches `a` and `a/b/c`).
pub fn filter_is_subset(requested: &str, pattern: &str) -> bool {
    let r: Vec<&str> = requested.split('/').collect();
    let p: Vec<&str> = pattern.split('/').collect();
    // `$` rule: a literal first level starting with `$` is not covered by a first-level
    // wildcard; a requested first-level wildcard never matches `$` topics, so it needs no
    // such care.
    if r[0].starts_with('$') && (p[0] == "+" || p[0] == "#") {
        return false;
    }
    // At the top level `#` and `+/#` match the same topics: every topic has a first level,
    // so the "parent" that `#` also matches does not exist there.
    if r == ["#"] && p == ["+", "#"] {
        return true;
    }
    subset_levels(&r, &p)
}

fn subset_levels(r: &[&str], p: &[&str]) -> bool {
    match (r.split_first(), p.split_first()) {
        // `#` in the pattern covers whatever remains, including nothing (the parent level).
        (_, Some((&"#", _))) => true,
        (None, None) => true,
        // The requested filter matches topics that the pattern does not (or vice versa).
        (None, Some(_)) | (Some(_), None) => false,
        // A requested `#` matches the parent level and every depth; only `#` covers that.
        (Some((&"#", _)), Some(_)) => false,
        (Some((_, r_rest)), Some((&"+", p_rest))) => subset_levels(r_rest, p_rest),
        // A requested `+` matches any level; a literal pattern level does not.
        (Some((&"+", _)), Some(_)) => false,
        (Some((rl, r_rest)), Some((pl, p_rest))) => rl == pl && subset_levels(r_rest, p_rest),
    }
}

/// Whether some topic name is matched by both filters: a subscription to `a` can receive
/// what a rule over `b` speaks of. `a/+` and `+/b` overlap (on `a/b`), `a/#` and `a` do
/// (`#` matches the parent level), `#` and `$SYS/x` do not (the `$` rule, MQTT 5 §4.7.2).
pub fn filters_overlap(a: &str, b: &str) -> bool {
    let a_dollar = a.starts_with('$');
    let b_dollar = b.starts_with('$');
    // A topic starting with `$` is matched only by filters whose first level is literal.
    if (a_dollar && (b.starts_with('+') || b.starts_with('#')))
        || (b_dollar && (a.starts_with('+') || a.starts_with('#')))
    {
        return false;
    }
    let mut x = a.split('/');
    let mut y = b.split('/');
    loop {
        match (x.next(), y.next()) {
            (Some("#"), _) | (_, Some("#")) => return true,
            (None, None) => return true,
            // One ended where the other goes on: only a closing `#` matches the parent.
            (None, Some(rest)) | (Some(rest), None) => {
                return rest == "#";
            }
            (Some("+"), Some(_)) | (Some(_), Some("+")) => {}
            (Some(l), Some(r)) if l == r => {}
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_syntax_rules() {
        assert!(validate_filter("a/+/b/#").is_ok());
        assert!(validate_filter("#").is_ok());
        assert!(validate_filter("").is_err());
        assert!(validate_filter("a/#/b").is_err());
        assert!(validate_filter("a/b#").is_err());
        assert!(validate_filter("a+/b").is_err());
    }

    #[test]
    fn overlapping_filters_share_a_topic() {
        assert!(filters_overlap("#", "private/alice/#"));
        assert!(filters_overlap("private/+/x", "private/alice/#"));
        assert!(filters_overlap("a/+", "+/b"));
        assert!(filters_overlap("a/#", "a"));
        assert!(filters_overlap("a", "a/#"));
        assert!(filters_overlap("secret/#", "secret/nosub"));
        assert!(!filters_overlap("a/+", "a"));
        assert!(!filters_overlap("a/b", "a/c"));
        assert!(!filters_overlap("a/b/c", "a/+"));
        assert!(!filters_overlap("#", "$SYS/x"));
        assert!(!filters_overlap("+/x", "$SYS/x"));
        assert!(filters_overlap("$SYS/#", "$SYS/x"));
    }

    #[test]
    fn hash_matches_parent_level() {
        assert!(filter_matches_topic("a/#", "a"));
        assert!(filter_matches_topic("a/#", "a/b/c"));
        assert!(!filter_matches_topic("a/+", "a"));
        assert!(filter_matches_topic("+/+", "/x"));
    }

    #[test]
    fn wildcards_at_first_level_skip_dollar_topics() {
        assert!(!filter_matches_topic("#", "$SYS/uptime"));
        assert!(!filter_matches_topic("+/uptime", "$SYS/uptime"));
        assert!(filter_matches_topic("$SYS/#", "$SYS/uptime"));
        assert!(filter_matches_topic("a/+", "a/$b"));
    }

    #[test]
    fn subset_examples_from_the_contract() {
        assert!(filter_is_subset("a/+/c", "a/#"));
        assert!(filter_is_subset("a/b", "a/+"));
        assert!(filter_is_subset("#", "#"));
        assert!(filter_is_subset("#", "+/#"));
        assert!(!filter_is_subset("#", "a/#"));
        assert!(!filter_is_subset("#", "+"));
        assert!(!filter_is_subset("a/#", "a/+"));
        assert!(filter_is_subset("a/#", "a/#"));
        assert!(filter_is_subset("a", "a/#"));
        assert!(!filter_is_subset("a/+", "a/b"));
        assert!(!filter_is_subset("$SYS/x", "#"));
        assert!(filter_is_subset("$SYS/x", "$SYS/#"));
    }
}
