//! Topic shards: which shard owns a topic, and which shards a subscription must reach.
//!
//! A node's routing is split over N shards, each with its own trie, retained index and
//! `$delayed/` timers. A topic belongs to one shard, by a seeded hash of its name, so every
//! publish to it is routed by that shard alone: per-publisher order on a topic holds because
//! the publisher's messages to it travel one mailbox, and one copy per subscriber holds
//! because the one shard sees every subscription that can match. A filter without
//! wildcards names one topic and lives on that topic's shard only; a filter with wildcards
//! may match topics of any shard and lives on all of them.
//!
//! What must be counted once (an `$exclusive/` holder, the `N` places of `$limit/N/`) is
//! decided by the filter's home shard, the one its topic filter hashes to; the others then
//! install what the home admitted ([`crate::Router::subscribe_admitted`]).

use std::hash::BuildHasher;

use crate::topic::{parse_subscription, TopicLimits};
use crate::{delayed_target, FixedState};

/// Which shards a subscription reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// A filter without wildcards (or a malformed one, refused there): the one shard that
    /// owns the topic it names.
    One(usize),
    /// A filter with wildcards: every shard. `home` decides admission (`$exclusive/`,
    /// `$limit/N/`), answers for retained handling, and is asked first.
    All { home: usize },
}

impl Reach {
    /// The shard that decides: the only one, or the home.
    pub fn home(self) -> usize {
        match self {
            Reach::One(s) | Reach::All { home: s } => s,
        }
    }

    /// Whether `shard` holds this subscription.
    pub fn includes(self, shard: usize) -> bool {
        match self {
            Reach::One(s) => s == shard,
            Reach::All { .. } => true,
        }
    }
}

/// The map from topics to shards, fixed for a node's life.
#[derive(Debug, Clone)]
pub struct ShardMap {
    count: usize,
    seed: u64,
    hasher: FixedState,
}

impl ShardMap {
    /// `count` shards (at least one); `seed` keys the hash, so that a peer cannot aim topics
    /// it chooses at one shard without knowing it (hardening, as for the trie's seed).
    pub fn new(count: usize, seed: u64) -> Self {
        assert!(count >= 1, "at least one shard");
        Self {
            count,
            seed,
            hasher: FixedState::with_seed(seed),
        }
    }

    /// The seed it was made with: the same seed and count map every topic alike.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    pub fn count(&self) -> usize {
        self.count
    }

    /// The shard that owns the topic name `topic`.
    pub fn of_topic(&self, topic: &str) -> usize {
        if self.count == 1 {
            return 0;
        }
        // The remainder of a u64 by a usize count fits a usize.
        (self.hasher.hash_one(topic) % self.count as u64) as usize
    }

    /// The shard a PUBLISH goes to: its topic's, or for `$delayed/{secs}/{topic}` the
    /// target's, which keeps the timer and publishes it when due without another hop. A
    /// delayed topic without a target goes to the shard of its whole name, which refuses it.
    pub fn of_publish(&self, topic: &str) -> usize {
        self.of_topic(delayed_target(topic).unwrap_or(topic))
    }

    /// The shards the raw subscription filter `raw` (extension prefix included) reaches.
    pub fn reach(&self, raw: &str, limits: &TopicLimits) -> Reach {
        match parse_subscription(raw, limits) {
            Ok(p) if p.filter.contains(['+', '#']) => Reach::All {
                home: self.of_topic(p.filter),
            },
            Ok(p) => Reach::One(self.of_topic(p.filter)),
            // Refused by whichever shard gets it; the raw string picks one deterministically.
            Err(_) => Reach::One(self.of_topic(raw)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter_matches;
    use proptest::prelude::*;

    fn limits() -> TopicLimits {
        TopicLimits::default()
    }

    #[test]
    fn one_shard_owns_everything() {
        let m = ShardMap::new(1, 7);
        assert_eq!(m.of_topic("a/b"), 0);
        assert_eq!(m.reach("a/#", &limits()), Reach::All { home: 0 });
        assert_eq!(m.reach("a/b", &limits()), Reach::One(0));
    }

    #[test]
    fn extension_prefixes_route_by_their_topic_filter() {
        let m = ShardMap::new(8, 3);
        let own = m.of_topic("dev/1/state");
        assert_eq!(m.reach("$share/g/dev/1/state", &limits()), Reach::One(own));
        assert_eq!(m.reach("$queue/dev/1/state", &limits()), Reach::One(own));
        assert_eq!(
            m.reach("$exclusive/dev/1/state", &limits()),
            Reach::One(own)
        );
        assert_eq!(m.reach("$limit/2/dev/1/state", &limits()), Reach::One(own));
        let home = m.of_topic("dev/+/state");
        assert_eq!(
            m.reach("$exclusive/dev/+/state", &limits()),
            Reach::All { home }
        );
    }

    #[test]
    fn delayed_publish_goes_to_the_target_shard() {
        let m = ShardMap::new(16, 11);
        assert_eq!(m.of_publish("$delayed/10/a/b"), m.of_topic("a/b"));
        assert_eq!(m.of_publish("a/b"), m.of_topic("a/b"));
        // No target: the whole name picks the shard that refuses it.
        assert_eq!(m.of_publish("$delayed/10"), m.of_topic("$delayed/10"));
    }

    #[test]
    fn topics_spread_over_the_shards() {
        let m = ShardMap::new(4, 99);
        let mut per = [0usize; 4];
        for i in 0..4000 {
            per[m.of_topic(&format!("sensor/{i}/t"))] += 1;
        }
        // A hash that spreads evenly gives about 1000 each.
        assert!(per.iter().all(|&n| (800..1200).contains(&n)), "{per:?}");
    }

    fn level() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("a".to_owned()),
            Just("b".to_owned()),
            Just("$x".to_owned()),
            "[a-c]{1,2}",
        ]
    }

    fn topic() -> impl Strategy<Value = String> {
        prop::collection::vec(level(), 1..4).prop_map(|l| l.join("/"))
    }

    fn filter() -> impl Strategy<Value = String> {
        prop::collection::vec(
            prop_oneof![level(), Just("+".to_owned()), Just("#".to_owned())],
            1..4,
        )
        .prop_map(|l| {
            // `#` only last: cut after the first one.
            let end = l.iter().position(|s| s == "#").map_or(l.len(), |i| i + 1);
            l[..end].join("/")
        })
    }

    proptest! {
        /// The sharding rule: every topic a filter matches is owned by a shard the filter
        /// reaches, whatever the shard count and seed.
        #[test]
        fn a_filter_reaches_the_shard_of_every_topic_it_matches(
            count in 1usize..9, seed in any::<u64>(), f in filter(), t in topic(),
        ) {
            let m = ShardMap::new(count, seed);
            if filter_matches(&f, &t) {
                prop_assert!(m.reach(&f, &limits()).includes(m.of_topic(&t)));
                let shared = format!("$share/g/{f}");
                prop_assert!(m.reach(&shared, &limits()).includes(m.of_topic(&t)));
            }
            prop_assert!(m.reach(&f, &limits()).home() < count);
        }
    }
}
