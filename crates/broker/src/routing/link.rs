//! Back-pressure across nodes: the link between two nodes is held back like a publisher.
//!
//! Without it a node acknowledged a forwarded batch as soon as its shards took it, and had
//! no publisher of its own to hold when its subscribers fell behind: a QoS 1 flood from
//! another node went through at the publisher's pace and was dropped at the subscribers'
//! full queues (93% of a cross-node fan-out, in `bench-cluster`). Now:
//!
//! - **Receiving node.** A forwarded QoS 1/2 delivery that reaches a backlogged subscriber
//!   (the same [`crate::flow::Backlog`] judgement as for a local publisher) holds the
//!   sending node's link: the delivery is kept past the queue bound, as held back, and the
//!   shard notes the link. The node's inbound side sends every shard a
//!   `RouterMsg::LinkBarrier` after each batch and acknowledges the batch only once every
//!   shard answered it, and a shard answers once no subscriber of it holds that link. The
//!   subscriber's stall rules bound how long that is.
//! - **Sending node.** A shard keeps, per destination node, what it forwarded and has no
//!   acknowledgement for yet, plus what waits to be sent. Past the window (the session
//!   queue's high mark) a QoS 1/2 publish sent there holds its publisher with the usual
//!   Hold; acknowledgements (or the forward timeout) bring it down, and at the low mark the
//!   publishers are released.
//!
//! So what a node may send another before it stops its publishers is one window per shard,
//! and the receiving side keeps that much past each subscriber's high mark: the hard queue
//! bound leaves room for it.

use std::sync::Arc;
use std::time::Duration;

use starling_rt::ActorId;

use super::remote::FORWARD_TIMEOUT;
use super::RouterActor;
use crate::destination::{remote_key, Destination, RemoteNode};
use crate::metrics::add;
use crate::msg::{ClientMsg, Publisher};

/// The id a node's window holds publishers under in Hold and Release (the publisher matches
/// a Release to its Hold by shard and this id). Actor ids count up from 1; these count down
/// from the top, so the two never meet.
pub(super) fn window_id(node: u64) -> ActorId {
    ActorId(u64::MAX - node)
}

impl RouterActor {
    /// A forwarded QoS 1/2 delivery from `node` found `subscriber` backlogged: the link is
    /// held until it is not.
    pub(super) fn hold_link(&mut self, node: u64, subscriber: &Arc<str>) {
        if self
            .held_links
            .iter()
            .any(|(n, s)| *n == node && Arc::ptr_eq(s, subscriber))
        {
            return;
        }
        if !self.held_links.iter().any(|(n, _)| *n == node) {
            add(&self.shared.metrics.cluster_link_holds, 1);
            tracing::debug!(node, client_id = %subscriber, "holding back a node's link");
        }
        self.held_links.push((node, subscriber.clone()));
    }

    /// A barrier for `node`'s link: answered now, or once no subscriber holds the link.
    pub(super) fn link_barrier(&mut self, node: u64, done: tokio::sync::oneshot::Sender<()>) {
        if self.held_links.iter().any(|(n, _)| *n == node) {
            self.link_waiters.push((node, done));
        } else {
            let _ = done.send(());
        }
    }

    /// Drops the holds of subscribers that are no longer backlogged (drained, stalled,
    /// offline or gone) and answers the barriers of links no one holds any more. Runs at
    /// the end of a burst while any link is held: whatever changes a backlog is a message.
    pub(super) fn check_links(&mut self) {
        let destinations = &self.destinations;
        self.held_links.retain(|(_, s)| {
            matches!(destinations.get(s), Some(Destination::Local(c)) if c.backlog.backlogged())
        });
        let held = &self.held_links;
        let mut i = 0;
        while i < self.link_waiters.len() {
            let node = self.link_waiters[i].0;
            if held.iter().any(|(n, _)| *n == node) {
                i += 1;
            } else {
                let (_, done) = self.link_waiters.swap_remove(i);
                let _ = done.send(());
            }
        }
    }

    /// A QoS 1/2 publish from `from` was offered to `node`: past the window, the publisher
    /// is held until the node's acknowledgements bring it down.
    pub(super) fn hold_for_window(&mut self, node: u64, from: &Publisher) {
        let high = self.rules.high;
        let Some(Destination::Remote(r)) = self.destinations.get_mut(&remote_key(node)) else {
            return;
        };
        if r.in_flight() < high {
            return;
        }
        if r.holding
            .iter()
            .any(|h| h.0 == from.id && h.2 == from.epoch)
        {
            return;
        }
        let send = self.sent_holds.get(&from.id) != Some(&from.epoch);
        match r.holding.iter_mut().find(|h| h.0 == from.id) {
            Some(h) => *h = (from.id, from.addr.clone(), from.epoch, send),
            None => r
                .holding
                .push((from.id, from.addr.clone(), from.epoch, send)),
        }
        if !send {
            return;
        }
        self.sent_holds.insert(from.id, from.epoch);
        add(&self.shared.metrics.backpressure_holds, 1);
        let shard = self.index as u16;
        self.control(
            &from.addr,
            ClientMsg::Hold {
                shard,
                subscriber: window_id(node),
            },
        );
    }

    /// `node`'s window shrank: at the low mark its publishers go.
    pub(super) fn window_moved(&mut self, node: u64) {
        let low = self.rules.low;
        let Some(Destination::Remote(r)) = self.destinations.get_mut(&remote_key(node)) else {
            return;
        };
        if r.holding.is_empty() || r.in_flight() > low {
            return;
        }
        let released = std::mem::take(&mut r.holding);
        self.release(released, window_id(node));
    }
}

impl RouterActor {
    /// How long a forwarded batch may wait for its acknowledgement: a subscriber there
    /// holds the link for at most `backpressure_max_secs` before it counts as stalled, and
    /// a batch held that long is slow, not lost.
    pub(super) fn forward_timeout(&self) -> Duration {
        self.rules.max + FORWARD_TIMEOUT
    }

    /// Messages in every node's window: forwarded and not acknowledged, or waiting to be
    /// sent.
    pub(super) fn forwards(&self) -> usize {
        self.remote_nodes
            .iter()
            .map(|n| match self.destinations.get(&remote_key(*n)) {
                Some(Destination::Remote(r)) => r.in_flight(),
                _ => 0,
            })
            .sum()
    }

    /// Whether a batch sent to some node waits for its acknowledgement.
    pub(super) fn windows_open(&self) -> bool {
        self.remote_nodes.iter().any(|n| {
            matches!(self.destinations.get(&remote_key(*n)), Some(Destination::Remote(r)) if !r.unacked.is_empty())
        })
    }
}

impl RemoteNode {
    /// Messages forwarded and not acknowledged, and messages waiting to be sent.
    pub(crate) fn in_flight(&self) -> usize {
        self.pending.len() + self.unacked_messages
    }
}
