//! A shard's answers to an operator's questions, and its part of the node's state gauges.

use std::sync::Arc;

use starling_session::Message;

use super::RouterActor;

/// What a shard adds to the node's state gauges (see `RouterActor::report_counts`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ShardCounts {
    subscriptions: usize,
    shared: usize,
    retained: usize,
    delayed: usize,
    topics: usize,
    forwards: usize,
    outbox: usize,
}

/// The signed change from `old` to `new`.
fn delta(old: usize, new: usize) -> i64 {
    // Counts of one shard fit an i64 many times over.
    new as i64 - old as i64
}

impl RouterActor {
    /// Moves the node's gauges by what changed here since the last report: once per burst,
    /// so that a count costs the hot path nothing and no shard asks another.
    pub(super) fn report_counts(&mut self) {
        // A wildcard filter lives on every shard: shard 0 counts it, the others their
        // exact filters only.
        let wild = self.router.wildcard_filter_count();
        let topics = self.router.filter_count() - if self.index == 0 { 0 } else { wild };
        let (forwards, outbox) = self.link_report();
        let now = ShardCounts {
            subscriptions: self.owned,
            shared: self.owned_shared,
            retained: self.retained.len(),
            delayed: self.delayed,
            topics,
            forwards,
            outbox,
        };
        let old = std::mem::replace(&mut self.reported, now);
        if old == now {
            return;
        }
        let m = &self.shared.metrics;
        m.subscriptions
            .shift(delta(old.subscriptions, now.subscriptions));
        m.subscriptions_shared.shift(delta(old.shared, now.shared));
        m.retained.shift(delta(old.retained, now.retained));
        m.delayed.shift(delta(old.delayed, now.delayed));
        m.topics.shift(delta(old.topics, now.topics));
        m.forwards.shift(delta(old.forwards, now.forwards));
        m.outbox.shift(delta(old.outbox, now.outbox));
    }

    /// Up to `limit` retained messages matching `filter`, in topic order; none for a
    /// filter that is not valid.
    pub(super) fn retained_list(&self, filter: &str, limit: usize) -> Vec<Arc<Message>> {
        let Ok(found) = self.retained.matching(filter) else {
            return Vec::new();
        };
        let mut all: Vec<Arc<Message>> = found.map(|(_, m)| m.clone()).collect();
        all.sort_unstable_by(|a, b| a.topic.cmp(&b.topic));
        all.truncate(limit);
        all
    }
}
