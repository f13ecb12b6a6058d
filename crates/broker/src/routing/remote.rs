//! A shard's part in the cluster: other nodes as destinations of the filters the replicated
//! routes list them for, publishes they forward, and the route transitions this shard
//! reports for the filters it is home to.
//!
//! Each publish matched here goes once to each node whose subscribers it matches (the
//! router's merge makes one delivery per subscriber key, and a node has one key); that
//! node matches it again against its own subscribers. A forwarded publish is delivered to
//! local subscribers only, so nothing travels twice.

use starling_router::parse_subscription;
use starling_session::DeliveryOptions;
use tracing::debug;

use super::{RouterActor, SubOpts};
use crate::destination::{remote_key, Destination, Pending, RemoteNode};
use crate::metrics::add;
use crate::msg::{ClusterMsg, Delivery, ShardCluster};
use crate::settings::Shared;

impl RouterActor {
    pub(super) fn wire_cluster(&mut self, c: ShardCluster) {
        self.cluster = Some(c);
    }

    /// The replicated routes changed for `node` and `filter`.
    pub(super) fn remote_route(&mut self, filter: &str, node: u64, present: bool) {
        let Some(c) = &self.cluster else { return };
        if node == c.node {
            return;
        }
        let key = remote_key(node);
        if present {
            // What a node needs to serve every subscriber of its own: the message as
            // published (it applies each subscription's QoS, No Local and RAP itself).
            let opts = SubOpts(DeliveryOptions {
                qos: starling_codec::QoS::ExactlyOnce,
                retain_as_published: true,
                ..DeliveryOptions::default()
            });
            if let Err(e) = self.router.subscribe(key.clone(), filter, opts) {
                debug!(node, filter, error = %e, "remote route refused");
                return;
            }
            let links = c.links.clone();
            self.destinations.entry(key).or_insert_with(|| {
                Destination::Remote(RemoteNode {
                    node,
                    links,
                    pending: Pending::default(),
                })
            });
        } else {
            let _ = self.router.unsubscribe(&key, filter);
        }
    }

    /// A local subscription this shard is home to started (`up`) or ended: the first and
    /// the last of a topic filter are reported to the cluster actor.
    pub(super) fn count_route(&mut self, raw: &str, up: bool) {
        if self.cluster.is_none() {
            return;
        }
        let plain = parse_subscription(raw, &self.shared.topic_limits)
            .map(|s| s.filter)
            .unwrap_or(raw);
        let n = self.route_counts.entry(plain.to_owned()).or_default();
        let transition = if up {
            *n += 1;
            *n == 1
        } else {
            debug_assert!(*n > 0, "a route counted down below zero");
            *n = n.saturating_sub(1);
            *n == 0
        };
        if !up && *n == 0 {
            self.route_counts.remove(plain);
        }
        if transition {
            self.route_outbox.push_back((plain.to_owned(), up));
        }
    }

    /// Reports what `count_route` found, in order; what finds no room waits for the next
    /// turn (the retry timer is armed by the caller).
    pub(super) fn send_route_outbox(&mut self) -> bool {
        let Some(c) = &self.cluster else {
            return true;
        };
        while let Some((filter, present)) = self.route_outbox.pop_front() {
            match c.actor.try_send(ClusterMsg::Route { filter, present }) {
                Ok(()) => {}
                Err(starling_rt::TrySendError::Full(ClusterMsg::Route { filter, present })) => {
                    self.route_outbox.push_front((filter, present));
                    return false;
                }
                Err(_) => {
                    self.route_outbox.clear();
                    return true;
                }
            }
        }
        true
    }
}

/// One delivery to another node: its pending list, under the node-wide queue bound. True
/// when the list was empty (the node becomes dirty).
pub(super) fn offer_remote(
    node: &mut RemoteNode,
    d: Delivery,
    bound: usize,
    shared: &Shared,
) -> bool {
    let was_empty = node.pending.is_empty();
    if !node.pending.push(d, bound, shared.limits.mqueue_policy) {
        add(&shared.metrics.dropped_mailbox_full, 1);
        return false;
    }
    was_empty
}
