//! The node-side route book: how many local subscriptions each filter has, against what the
//! replicated routes say about this node, and the one batch of changes that closes the gap.
//!
//! Aggregation is what makes a SUBSCRIBE cheap in a cluster: only a filter's first local
//! subscriber and its last unsubscribe change the replicated routes; every subscription in
//! between costs no raft commit. One batch is in flight at a time; whatever changed meanwhile
//! goes in the next one, so a filter subscribed and unsubscribed while a batch commits ends
//! up right without ever being proposed twice in one state.

use std::collections::{BTreeMap, BTreeSet};

use crate::command::{Command, NodeId};

/// Local subscription counts and the replicated view of this node's routes.
#[derive(Debug, Default)]
pub struct RouteBook {
    node: NodeId,
    /// filter → local subscriptions (no zero counts).
    local: BTreeMap<String, u64>,
    /// Filters the replicated routes list this node for.
    replicated: BTreeSet<String>,
    /// A batch was handed out and its outcome is not known yet.
    in_flight: bool,
    /// The replicated view cannot be trusted (a batch failed, or the node just started):
    /// the next batch states the whole set.
    reset: bool,
}

impl RouteBook {
    pub fn new(node: NodeId) -> Self {
        RouteBook {
            node,
            reset: true,
            ..RouteBook::default()
        }
    }

    /// A local subscription to `filter` was made.
    pub fn subscribed(&mut self, filter: &str) {
        *self.local.entry(filter.to_owned()).or_default() += 1;
    }

    /// A local subscription to `filter` ended.
    pub fn unsubscribed(&mut self, filter: &str) {
        if let Some(n) = self.local.get_mut(filter) {
            *n -= 1;
            if *n == 0 {
                self.local.remove(filter);
            }
        } else {
            debug_assert!(false, "unsubscribed {filter} without a subscription");
        }
    }

    /// The replicated routes changed for `filter`: `nodes` hold it now.
    pub fn replicated(&mut self, filter: &str, nodes: &[NodeId]) {
        if nodes.contains(&self.node) {
            self.replicated.insert(filter.to_owned());
        } else {
            self.replicated.remove(filter);
        }
    }

    /// The replicated state was replaced: forget the view (changes follow for what is there).
    pub fn replicated_reset(&mut self) {
        self.replicated.clear();
    }

    /// The command that brings the replicated routes to the local counts, if they differ
    /// and no batch is in flight. The caller proposes it and reports with [`RouteBook::done`].
    pub fn take_batch(&mut self) -> Option<Command> {
        if self.in_flight {
            return None;
        }
        if self.reset {
            self.in_flight = true;
            return Some(Command::ResetRoutes {
                node: self.node,
                filters: self.local.keys().cloned().collect(),
            });
        }
        let add: Vec<String> = self
            .local
            .keys()
            .filter(|f| !self.replicated.contains(*f))
            .cloned()
            .collect();
        let remove: Vec<String> = self
            .replicated
            .iter()
            .filter(|f| !self.local.contains_key(*f))
            .cloned()
            .collect();
        if add.is_empty() && remove.is_empty() {
            return None;
        }
        self.in_flight = true;
        Some(Command::Routes {
            node: self.node,
            add,
            remove,
        })
    }

    /// The batch from [`RouteBook::take_batch`] committed (`true`) or its outcome is unknown
    /// (`false`: the next batch restates the whole set, which is right either way).
    pub fn done(&mut self, committed: bool) {
        debug_assert!(self.in_flight, "done without a batch");
        self.in_flight = false;
        self.reset = !committed;
    }

    /// Whether the replicated routes list this node for exactly its subscribed filters.
    pub fn converged(&self) -> bool {
        !self.in_flight
            && !self.reset
            && self.local.len() == self.replicated.len()
            && self.local.keys().all(|f| self.replicated.contains(f))
    }

    /// Whether the replicated routes list this node for `filter`.
    pub fn routed(&self, filter: &str) -> bool {
        self.replicated.contains(filter)
    }

    /// Filters with at least one local subscription.
    pub fn local_filters(&self) -> impl Iterator<Item = &str> {
        self.local.keys().map(String::as_str)
    }
}
