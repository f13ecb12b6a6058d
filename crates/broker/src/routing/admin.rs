//! A shard's answers to an operator's questions.

use std::sync::Arc;

use starling_session::Message;

use super::RouterActor;

impl RouterActor {
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
