//! The crate's one error enum.

/// Everything the router refuses, each variant naming the event.
///
/// Variants up to [`RouterError::LimitInvalid`] are caused by a malformed topic or filter
/// (a peer's input, mapped to a reason code by the caller); the rest are caps and
/// group rules refusing an otherwise valid request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouterError {
    /// Topic names and filters are at least one character long (MQTT 5 §4.7.3).
    #[error("topic is empty")]
    TopicEmpty,
    /// The topic or filter is longer than the caller's cap, in bytes.
    #[error("topic is {len} bytes long, max {max}")]
    TopicTooLong { len: usize, max: usize },
    /// The topic or filter has more levels than the caller's cap.
    #[error("topic has {levels} levels, max {max}")]
    TopicTooManyLevels { levels: usize, max: usize },
    /// U+0000 is not allowed in a topic (MQTT 5 §4.7.3).
    #[error("topic contains U+0000")]
    TopicNullChar,
    /// A topic name (as opposed to a filter) contains `+` or `#` (MQTT 5 §4.7.1).
    #[error("wildcard in topic name at level {level}")]
    WildcardInTopicName { level: usize },
    /// `+` must occupy a whole level (MQTT 5 §4.7.1.3).
    #[error("`+` does not occupy the whole of level {level}")]
    PlusNotAlone { level: usize },
    /// `#` must occupy a whole level (MQTT 5 §4.7.1.2).
    #[error("`#` does not occupy the whole of level {level}")]
    HashNotAlone { level: usize },
    /// `#` must be the last level (MQTT 5 §4.7.1.2).
    #[error("`#` at level {level} is not the last level")]
    HashNotLast { level: usize },
    /// `$share/` with an empty group name (MQTT 5 §4.8.2).
    #[error("shared subscription group name is empty")]
    ShareGroupEmpty,
    /// A share group name contains `+` or `#` (MQTT 5 §4.8.2).
    #[error("shared subscription group name contains a wildcard")]
    ShareGroupWildcard,
    /// An extension prefix (`$share/g`, `$exclusive`, `$limit/N`, `$queue`) without a filter after it.
    #[error("`{extension}` subscription has no topic filter")]
    ExtensionFilterMissing { extension: &'static str },
    /// `$limit/N/`: N is not a decimal integer in `1..=u32::MAX`.
    #[error("`$limit/N/` count is not an integer of at least 1")]
    LimitInvalid,
    /// `$exclusive/f` is held by another subscriber.
    #[error("exclusive subscription is held by another subscriber")]
    ExclusiveHeld,
    /// `$limit/N/f` already has `current` distinct subscribers, and `current >= max`.
    #[error("limited subscription has {current} subscribers, max {max}")]
    LimitReached { current: usize, max: u32 },
    /// The router holds `max` subscriptions already.
    #[error("router holds {max} subscriptions, the cap")]
    SubscriptionsFull { max: usize },
    /// The retained index holds `max` topics already; only existing topics may be replaced.
    #[error("retained index holds {max} topics, the cap")]
    RetainedFull { max: usize },
    /// Storing this message would take the retained index past its byte cap.
    #[error("retained index would hold {bytes} bytes, max {max}")]
    RetainedBytesFull { bytes: usize, max: usize },
}
