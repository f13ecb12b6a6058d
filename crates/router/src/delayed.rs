//! Delayed publish: `$delayed/{secs}/{topic}` publishes `{topic}` after `secs` seconds. One
//! parser for everyone who reads such a topic (the ACL check of its target, the scheduler).

use crate::topic::{validate_topic_name, TopicLimits};

/// The prefix of a delayed-publish topic.
pub const DELAYED_PREFIX: &str = "$delayed/";

/// A parsed `$delayed/{secs}/{topic}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delayed<'a> {
    /// Seconds to wait.
    pub secs: u32,
    /// The topic finally published to.
    pub target: &'a str,
}

/// Why a `$delayed/` topic is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DelayedError {
    /// No `/{topic}` after the delay.
    #[error("no target topic after the delay")]
    NoTarget,
    /// The delay is not a number of seconds.
    #[error("the delay is not a number of seconds")]
    BadDelay,
    /// The delay is over the configured maximum.
    #[error("delay of {secs} s over the maximum of {max} s")]
    TooLong {
        /// The delay asked for.
        secs: u32,
        /// The maximum.
        max: u32,
    },
    /// The target is not a valid topic name, or is itself delayed.
    #[error("the target is not a topic name that may be published")]
    BadTarget,
}

/// The target of a `$delayed/{secs}/{topic}` topic without checking it (`None` for other
/// topics or one without a `/{topic}` part): what an ACL check of the target needs.
pub fn delayed_target(topic: &str) -> Option<&str> {
    let rest = topic.strip_prefix(DELAYED_PREFIX)?;
    rest.split_once('/').map(|(_, target)| target)
}

/// Parses and checks a `$delayed/{secs}/{topic}` topic: `Ok(None)` for a topic that is not
/// delayed; the delay must be at most `max_secs` and the target a valid topic name that is
/// not delayed again.
///
/// # Errors
/// [`DelayedError`] naming what is wrong.
pub fn parse_delayed<'a>(
    topic: &'a str,
    limits: &TopicLimits,
    max_secs: u32,
) -> Result<Option<Delayed<'a>>, DelayedError> {
    let Some(rest) = topic.strip_prefix(DELAYED_PREFIX) else {
        return Ok(None);
    };
    let (secs, target) = rest.split_once('/').ok_or(DelayedError::NoTarget)?;
    // Digits only: `u32::from_str` would also take a leading `+`.
    if secs.is_empty() || !secs.bytes().all(|b| b.is_ascii_digit()) {
        return Err(DelayedError::BadDelay);
    }
    let secs: u32 = secs.parse().map_err(|_| DelayedError::BadDelay)?;
    if secs > max_secs {
        return Err(DelayedError::TooLong {
            secs,
            max: max_secs,
        });
    }
    if target.starts_with(DELAYED_PREFIX) || validate_topic_name(target, limits).is_err() {
        return Err(DelayedError::BadTarget);
    }
    Ok(Some(Delayed { secs, target }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(topic: &str) -> Result<Option<Delayed<'_>>, DelayedError> {
        parse_delayed(topic, &TopicLimits::default(), 3600)
    }

    #[test]
    fn a_delayed_topic_gives_its_delay_and_target() {
        assert_eq!(
            parse("$delayed/10/a/b"),
            Ok(Some(Delayed {
                secs: 10,
                target: "a/b"
            }))
        );
        assert_eq!(parse("a/b"), Ok(None), "not delayed");
        assert_eq!(delayed_target("$delayed/10/a/b"), Some("a/b"));
        assert_eq!(delayed_target("a/b"), None);
    }

    #[test]
    fn malformed_delays_and_targets_are_refused_by_name() {
        assert_eq!(parse("$delayed/10"), Err(DelayedError::NoTarget));
        assert_eq!(parse("$delayed/x/a"), Err(DelayedError::BadDelay));
        assert_eq!(parse("$delayed/+5/a"), Err(DelayedError::BadDelay));
        assert_eq!(parse("$delayed//a"), Err(DelayedError::BadDelay));
        assert_eq!(parse("$delayed/99999999999/a"), Err(DelayedError::BadDelay));
        assert_eq!(
            parse("$delayed/3601/a"),
            Err(DelayedError::TooLong {
                secs: 3601,
                max: 3600
            })
        );
        assert_eq!(parse("$delayed/1/a/+"), Err(DelayedError::BadTarget));
        assert_eq!(
            parse("$delayed/1/$delayed/1/a"),
            Err(DelayedError::BadTarget)
        );
        assert_eq!(parse("$delayed/1/"), Err(DelayedError::BadTarget));
    }
}
