//! Topic name and filter validation, subscription-extension parsing, and a reference matcher.

use crate::RouterError;

/// Caps on topic names and filters, chosen by the broker's validated config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicLimits {
    /// Maximum length of a topic name or of a whole filter string (extension prefix
    /// included), in bytes.
    pub topic_len_max: usize,
    /// Maximum number of `/`-separated levels of a topic name or of the filter part of a
    /// subscription. It also bounds the trie's depth, and so the recursion depth of matching.
    pub topic_levels_max: usize,
}

impl Default for TopicLimits {
    /// 65 535 bytes is the largest UTF-8 string an MQTT packet can carry (MQTT 5 §1.5.4);
    /// 128 levels is far deeper than real topic trees while keeping matching's recursion shallow.
    fn default() -> Self {
        Self {
            topic_len_max: 65_535,
            topic_levels_max: 128,
        }
    }
}

/// A subscription extension, parsed from the prefix of a raw filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extension<'a> {
    /// An ordinary subscription: every matching publish is delivered.
    Plain,
    /// `$share/{group}/{filter}` (MQTT 5 §4.8.2), or `$queue/{filter}` as an alias for the
    /// group `$queue`: each matching publish goes to one member of the group.
    Shared { group: &'a str },
    /// `$exclusive/{filter}`: one subscriber at a time holds the filter.
    Exclusive,
    /// `$limit/{max}/{filter}`: at most `max` distinct subscribers hold the filter.
    Limit { max: u32 },
}

/// A raw subscription filter split into its extension and its topic filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubscriptionFilter<'a> {
    pub extension: Extension<'a>,
    /// The topic filter proper, validated, without the extension prefix.
    pub filter: &'a str,
}

/// The group name `$queue/{filter}` maps to.
pub const QUEUE_GROUP: &str = "$queue";

/// Checks shared by names and filters: non-empty, within the length cap, no U+0000.
fn check_string(s: &str, limits: &TopicLimits) -> Result<(), RouterError> {
    if s.is_empty() {
        return Err(RouterError::TopicEmpty);
    }
    if s.len() > limits.topic_len_max {
        return Err(RouterError::TopicTooLong {
            len: s.len(),
            max: limits.topic_len_max,
        });
    }
    if s.contains('\0') {
        return Err(RouterError::TopicNullChar);
    }
    Ok(())
}

fn check_levels(s: &str, limits: &TopicLimits) -> Result<(), RouterError> {
    let levels = s.bytes().filter(|&b| b == b'/').count() + 1;
    if levels > limits.topic_levels_max {
        return Err(RouterError::TopicTooManyLevels {
            levels,
            max: limits.topic_levels_max,
        });
    }
    Ok(())
}

/// Validates a topic name a client publishes to (MQTT 5 §4.7): non-empty, within the caps,
/// no U+0000, no wildcard characters. Empty levels (`a//b`, `/a`) are valid.
pub fn validate_topic_name(topic: &str, limits: &TopicLimits) -> Result<(), RouterError> {
    check_string(topic, limits)?;
    check_levels(topic, limits)?;
    if let Some(level) = topic.split('/').position(|l| l.contains(['+', '#'])) {
        return Err(RouterError::WildcardInTopicName { level });
    }
    Ok(())
}

/// Validates a plain topic filter (no extension prefix is interpreted): non-empty, within the
/// caps, no U+0000, `+` alone in its level, `#` alone in the last level (MQTT 5 §4.7.1).
pub fn validate_topic_filter(filter: &str, limits: &TopicLimits) -> Result<(), RouterError> {
    check_string(filter, limits)?;
    check_levels(filter, limits)?;
    check_wildcards(filter)
}

fn check_wildcards(filter: &str) -> Result<(), RouterError> {
    let mut levels = filter.split('/').enumerate().peekable();
    while let Some((level, text)) = levels.next() {
        if text.contains('+') && text != "+" {
            return Err(RouterError::PlusNotAlone { level });
        }
        if text.contains('#') {
            if text != "#" {
                return Err(RouterError::HashNotAlone { level });
            }
            if levels.peek().is_some() {
                return Err(RouterError::HashNotLast { level });
            }
        }
    }
    Ok(())
}

/// Parses a raw subscription filter as sent in SUBSCRIBE/UNSUBSCRIBE: the extension prefix
/// (`$share/{group}/`, `$queue/`, `$exclusive/`, `$limit/{N}/`) then the topic filter.
///
/// The length cap applies to the whole raw string, the level cap to the filter part.
/// A string that does not start with one of the prefixes followed by `/` is a plain filter
/// (so `$share` alone or `$SYS/#` are plain).
pub fn parse_subscription<'a>(
    raw: &'a str,
    limits: &TopicLimits,
) -> Result<SubscriptionFilter<'a>, RouterError> {
    check_string(raw, limits)?;
    let (extension, filter) = if let Some(rest) = raw.strip_prefix("$share/") {
        // MQTT 5 §4.8.2: the group name is everything up to the next `/`, at least one
        // character, and contains no wildcard.
        let (group, filter) = rest
            .split_once('/')
            .ok_or(RouterError::ExtensionFilterMissing {
                extension: "$share",
            })?;
        if group.is_empty() {
            return Err(RouterError::ShareGroupEmpty);
        }
        if group.contains(['+', '#']) {
            return Err(RouterError::ShareGroupWildcard);
        }
        (Extension::Shared { group }, nonempty(filter, "$share")?)
    } else if let Some(rest) = raw.strip_prefix("$queue/") {
        (
            Extension::Shared { group: QUEUE_GROUP },
            nonempty(rest, "$queue")?,
        )
    } else if let Some(rest) = raw.strip_prefix("$exclusive/") {
        (Extension::Exclusive, nonempty(rest, "$exclusive")?)
    } else if let Some(rest) = raw.strip_prefix("$limit/") {
        let (count, filter) = rest
            .split_once('/')
            .ok_or(RouterError::ExtensionFilterMissing {
                extension: "$limit",
            })?;
        // Digits only: `u32::from_str` would also take a leading `+`.
        if count.is_empty() || !count.bytes().all(|b| b.is_ascii_digit()) {
            return Err(RouterError::LimitInvalid);
        }
        let max: u32 = count.parse().map_err(|_| RouterError::LimitInvalid)?;
        if max == 0 {
            return Err(RouterError::LimitInvalid);
        }
        (Extension::Limit { max }, nonempty(filter, "$limit")?)
    } else {
        (Extension::Plain, raw)
    };
    check_levels(filter, limits)?;
    check_wildcards(filter)?;
    Ok(SubscriptionFilter { extension, filter })
}

fn nonempty<'a>(filter: &'a str, extension: &'static str) -> Result<&'a str, RouterError> {
    if filter.is_empty() {
        Err(RouterError::ExtensionFilterMissing { extension })
    } else {
        Ok(filter)
    }
}

/// Whether a valid topic filter (without extension prefix) matches a valid topic name.
///
/// Applies MQTT 5 §4.7.2: a filter whose first level is a wildcard does not match a topic
/// whose first level starts with `$`. `a/#` matches `a` (MQTT 5 §4.7.1.2). Does not allocate;
/// meant for one-off checks such as authorization rules. The [`crate::Router`] matches many
/// filters at once.
pub fn filter_matches(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let mut filter_levels = filter.split('/');
    let mut topic_levels = topic.split('/');
    loop {
        match (filter_levels.next(), topic_levels.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(f), Some(t)) if f == t => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// Splits the first level off `rest`: `"a/b/c"` gives `("a", Some("b/c"))`, `"a"` gives
/// `("a", None)`, `"a/"` gives `("a", Some(""))` (one more, empty, level).
#[inline]
pub(crate) fn split_level(rest: &str) -> (&str, Option<&str>) {
    match rest.find('/') {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> TopicLimits {
        TopicLimits {
            topic_len_max: 64,
            topic_levels_max: 4,
        }
    }

    #[test]
    fn topic_name_accepts_empty_levels() {
        assert_eq!(validate_topic_name("/", &limits()), Ok(()));
        assert_eq!(validate_topic_name("a//b", &limits()), Ok(()));
        assert_eq!(validate_topic_name("$SYS/x", &limits()), Ok(()));
    }

    #[test]
    fn topic_name_refuses_wildcards_null_and_empty() {
        assert_eq!(
            validate_topic_name("", &limits()),
            Err(RouterError::TopicEmpty)
        );
        assert_eq!(
            validate_topic_name("a/+", &limits()),
            Err(RouterError::WildcardInTopicName { level: 1 })
        );
        assert_eq!(
            validate_topic_name("a#", &limits()),
            Err(RouterError::WildcardInTopicName { level: 0 })
        );
        assert_eq!(
            validate_topic_name("a\0", &limits()),
            Err(RouterError::TopicNullChar)
        );
    }

    #[test]
    fn topic_refused_past_length_and_level_caps() {
        let long = "x".repeat(65);
        assert_eq!(
            validate_topic_name(&long, &limits()),
            Err(RouterError::TopicTooLong { len: 65, max: 64 })
        );
        assert_eq!(
            validate_topic_filter("a/b/c/d/e", &limits()),
            Err(RouterError::TopicTooManyLevels { levels: 5, max: 4 })
        );
        assert_eq!(validate_topic_filter("a/b/c/d", &limits()), Ok(()));
    }

    #[test]
    fn filter_wildcards_must_stand_alone_and_hash_last() {
        for ok in ["#", "+", "+/+", "a/#", "/#", "+/a/#", "$SYS/#"] {
            assert_eq!(validate_topic_filter(ok, &limits()), Ok(()), "{ok}");
        }
        assert_eq!(
            validate_topic_filter("a+", &limits()),
            Err(RouterError::PlusNotAlone { level: 0 })
        );
        assert_eq!(
            validate_topic_filter("a/b#", &limits()),
            Err(RouterError::HashNotAlone { level: 1 })
        );
        assert_eq!(
            validate_topic_filter("#/a", &limits()),
            Err(RouterError::HashNotLast { level: 0 })
        );
    }

    #[test]
    fn extensions_parse_into_kind_and_filter() {
        let p = |s| parse_subscription(s, &limits());
        assert_eq!(
            p("$share/g/a/+"),
            Ok(SubscriptionFilter {
                extension: Extension::Shared { group: "g" },
                filter: "a/+"
            })
        );
        assert_eq!(
            p("$queue/a"),
            Ok(SubscriptionFilter {
                extension: Extension::Shared { group: "$queue" },
                filter: "a"
            })
        );
        assert_eq!(
            p("$exclusive/#"),
            Ok(SubscriptionFilter {
                extension: Extension::Exclusive,
                filter: "#"
            })
        );
        assert_eq!(
            p("$limit/3/a/b"),
            Ok(SubscriptionFilter {
                extension: Extension::Limit { max: 3 },
                filter: "a/b"
            })
        );
        assert_eq!(
            p("$share"),
            Ok(SubscriptionFilter {
                extension: Extension::Plain,
                filter: "$share"
            })
        );
        assert_eq!(
            p("$SYS/#"),
            Ok(SubscriptionFilter {
                extension: Extension::Plain,
                filter: "$SYS/#"
            })
        );
    }

    #[test]
    fn malformed_extensions_are_refused() {
        let p = |s| parse_subscription(s, &limits());
        assert_eq!(p("$share//a"), Err(RouterError::ShareGroupEmpty));
        assert_eq!(p("$share/g+/a"), Err(RouterError::ShareGroupWildcard));
        assert_eq!(p("$share/g#/a"), Err(RouterError::ShareGroupWildcard));
        assert_eq!(
            p("$share/g"),
            Err(RouterError::ExtensionFilterMissing {
                extension: "$share"
            })
        );
        assert_eq!(
            p("$share/g/"),
            Err(RouterError::ExtensionFilterMissing {
                extension: "$share"
            })
        );
        assert_eq!(
            p("$exclusive/"),
            Err(RouterError::ExtensionFilterMissing {
                extension: "$exclusive"
            })
        );
        assert_eq!(p("$limit/0/a"), Err(RouterError::LimitInvalid));
        assert_eq!(p("$limit/+1/a"), Err(RouterError::LimitInvalid));
        assert_eq!(p("$limit/x/a"), Err(RouterError::LimitInvalid));
        assert_eq!(p("$limit/99999999999/a"), Err(RouterError::LimitInvalid));
        assert_eq!(
            p("$limit/2"),
            Err(RouterError::ExtensionFilterMissing {
                extension: "$limit"
            })
        );
        assert_eq!(
            p("$share/g/a/#/b"),
            Err(RouterError::HashNotLast { level: 1 })
        );
        assert_eq!(
            p("$share/g/a/b/c/d/e"),
            Err(RouterError::TopicTooManyLevels { levels: 5, max: 4 })
        );
    }

    #[test]
    fn reference_matcher_follows_mqtt_rules() {
        assert!(filter_matches("a/#", "a"));
        assert!(filter_matches("a/#", "a/b/c"));
        assert!(filter_matches("a/+", "a/"));
        assert!(!filter_matches("a/+", "a"));
        assert!(filter_matches("+/+", "/"));
        assert!(!filter_matches("#", "$SYS/x"));
        assert!(!filter_matches("+/x", "$SYS/x"));
        assert!(filter_matches("$SYS/#", "$SYS"));
        assert!(filter_matches("a/+/#", "a/$x"));
    }

    #[test]
    fn split_level_keeps_trailing_empty_level() {
        assert_eq!(split_level("a/b/c"), ("a", Some("b/c")));
        assert_eq!(split_level("a"), ("a", None));
        assert_eq!(split_level("a/"), ("a", Some("")));
    }
}
