//! Starling's router: the subscription trie, shared/exclusive/limit groups and the retained-message index.
//!
//! Sans-IO: no runtime, clock or randomness of its own. The broker passes limits and a hash
//! seed in the configs, and one random draw per publish in [`PublishContext`].

mod delayed;
mod error;
mod merge;
mod retained;
mod router;
mod shard;
mod shared;
mod topic;

pub use delayed::{delayed_target, parse_delayed, Delayed, DelayedError, DELAYED_PREFIX};
pub use error::RouterError;
pub use merge::{Merge, MERGE_WINDOW};
pub use retained::{RetainedConfig, RetainedIndex, RetainedMatches};
pub use router::{Delivery, DeliveryKind, Router, RouterConfig};
pub use shard::{Reach, ShardMap};
pub use shared::{PublishContext, SharedStrategy};
pub use topic::{
    filter_matches, parse_subscription, validate_topic_filter, validate_topic_name, Extension,
    SubscriptionFilter, TopicLimits, QUEUE_GROUP,
};

/// Deterministic, seeded hasher for every map in the crate: the std and hashbrown default
/// states are random, which would make iteration order differ between simulator runs.
pub(crate) use foldhash::fast::FixedState;

pub(crate) type Map<K, V> = hashbrown::HashMap<K, V, FixedState>;
