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
//!   with its part of each batch a barrier (`RouterMsg::Forwarded`'s `done`) and acknowledges the batch only once every
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

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use starling_rt::{ActorId, Ctx};
use starling_session::Message;
use starling_store::{LinkCursor, Op};

use super::RouterActor;
use crate::destination::{remote_key, Destination, RemoteNode};
use crate::metrics::add;
use crate::msg::{
    ClientMsg, LinkFrom, LinkWrite, Owed, Publisher, SharedTo, StoreOp, Waiter, WaiterTo,
};

/// The store writes of the deliveries of one node's forwarded publishes, numbered in
/// routing order: those not yet committed, and those whose commit failed and that no
/// barrier has reported yet. A batch is acknowledged to its node only when every write of
/// it is durable (docs/clustering.md): otherwise a crash right after the acknowledgement
/// would lose what the publisher was told is safe.
#[derive(Default)]
pub(crate) struct LinkWrites {
    next: u64,
    outstanding: BTreeSet<u64>,
    failed: BTreeSet<u64>,
    /// The store is closed or lost: barriers are dropped unanswered from then on.
    gone: bool,
}

impl LinkWrites {
    /// The number of a new write, outstanding until `link_stored` settles it.
    pub(crate) fn take_seq(&mut self) -> u64 {
        let seq = self.next;
        self.next += 1;
        self.outstanding.insert(seq);
        seq
    }
}

/// A barrier waiting: for `node`'s link to be let go and for its writes numbered below
/// `upto` to be settled.
pub(crate) struct LinkWaiter {
    node: u64,
    upto: u64,
    done: Option<tokio::sync::oneshot::Sender<bool>>,
}

impl LinkWaiter {
    fn answer(&mut self, durable: bool) {
        if let Some(done) = self.done.take() {
            let _ = done.send(durable);
        }
    }
}

/// How far this shard routed a link's batches: batch `seq` of the sending shard's
/// incarnation `inc`, of which `taken` messages (they reach this shard in the batch's
/// order). Stored with the writes it made (`Op::PutLinkCursor`, in the same commit), it
/// says after a restart which messages of a batch sent again were delivered durably
/// already: without it, a batch whose writes were committed here but whose acknowledgement
/// was lost (with a replaced connection, or the crash) would be taken again, and a QoS 2
/// message delivered twice (seed 11 of the kills test, before the cursor).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Taken {
    inc: u64,
    seq: u64,
    taken: u32,
}

/// The link a cursor op is for.
fn cursor_of(op: &StoreOp) -> Option<(u64, u16)> {
    match op {
        StoreOp::Op(op) => match &**op {
            Op::PutLinkCursor(c) => Some((c.node, c.shard)),
            _ => None,
        },
        _ => None,
    }
}

impl From<&LinkCursor> for Taken {
    fn from(c: &LinkCursor) -> Self {
        Taken {
            inc: c.inc,
            seq: c.seq,
            taken: c.taken,
        }
    }
}

impl Taken {
    /// Whether message `taken` of batch `seq` (same incarnation) is at or before it.
    fn covers(&self, inc: u64, seq: u64, taken: u32) -> bool {
        self.inc == inc && (seq, taken) <= (self.seq, self.taken)
    }
}

/// The id a node's window holds publishers under in Hold and Release (the publisher matches
/// a Release to its Hold by shard and this id). Actor ids count up from 1; these count down
/// from the top, so the two never meet.
pub(super) fn window_id(node: u64) -> ActorId {
    ActorId(u64::MAX - node)
}

impl RouterActor {
    /// A publish another node forwarded, in its batch's order: routed to this node's
    /// subscribers, unless the store says this shard delivered it before this node
    /// restarted. What it wrote is stored with the link's cursor, and the node's next
    /// barrier waits for the commit.
    pub(super) fn forwarded(
        &mut self,
        m: Arc<Message>,
        group: Option<&SharedTo>,
        from: LinkFrom,
        ctx: &mut Ctx<Self>,
    ) {
        let link = (from.node, from.shard);
        let t = self.link_taken.entry(link).or_insert(Taken {
            inc: from.inc,
            seq: from.seq,
            taken: 0,
        });
        if (t.inc, t.seq) != (from.inc, from.seq) {
            *t = Taken {
                inc: from.inc,
                seq: from.seq,
                taken: 0,
            };
        }
        t.taken += 1;
        let taken = *t;
        if self
            .link_stored
            .get(&link)
            .is_some_and(|s| s.covers(from.inc, from.seq, taken.taken))
        {
            add(&self.shared.metrics.cluster_forward_out_of_order, 1);
            return;
        }
        let before = self.to_store.len();
        // A release for order across a session's move (`handover`).
        let release = group.and_then(|g| Some((g, super::handover::released_link(g)?)));
        // What goes on from here to another node counts towards the batch's answer.
        if self.may_forward_on(&m, group.is_some()) {
            self.fwd_current = Some(super::remote::FwdRoute::new(self.fwd_next));
        }
        match (group, release) {
            (_, Some((g, link))) => self.order_released(&g.filter, link, m.topic.clone()),
            (None, _) => {
                self.relay_restored(&m);
                self.publish(m, None, Some(from.node), ctx)
            }
            // Relayed to a session that moved here (`handover`).
            (Some(g), _) if super::handover::relay_epoch(g).is_some() => {
                let epoch = super::handover::relay_epoch(g).unwrap_or(0);
                self.relayed(m, (&g.filter, epoch), from.node, ctx)
            }
            (Some(group), _) => self.publish_to_group(&m, group, from.node, ctx),
        }
        let mut parks = false;
        if let Some(f) = self.fwd_current.take().filter(super::remote::FwdRoute::any) {
            if f.queued > 0 && self.store.is_some() {
                // Parked with the part (`route_part`): the cursor goes with it, so that a
                // restart neither takes the copy again nor loses it. Also with the outbox
                // off (`outbox_share` 0), which bounds what this node's own publishes park:
                // a later copy of the part stored for a session here stores the cursor
                // that covers this one, whose row is then all that keeps it.
                self.park_from.get_or_insert(f.key);
                parks = true;
            }
            self.forwarded_on(f, from.node, ctx);
        }
        if self.to_store.len() > before || parks {
            let cursor = StoreOp::from(Op::PutLinkCursor(LinkCursor {
                node: from.node,
                shard: from.shard,
                to_shard: self.index as u16,
                inc: taken.inc,
                seq: taken.seq,
                taken: taken.taken,
                map_seed: self.map.seed(),
                shards: self.map.count() as u16,
            }));
            // Ops sent to the store together commit together: the link's cursor already
            // among them moves forward (the index may be stale, from before they were
            // last sent: then it holds another op, or nothing).
            let at = self.link_cursor_op.get(&link).copied();
            match at.and_then(|i| self.to_store.get_mut(i)) {
                Some(op) if cursor_of(op) == Some(link) => *op = cursor,
                _ => {
                    self.link_cursor_op.insert(link, self.to_store.len());
                    self.to_store.push(cursor);
                }
            }
        }
        self.await_link_writes(from.node, before, ctx);
    }

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

    /// A barrier for `node`'s link: answered once no subscriber holds the link and the
    /// store writes of what `node` forwarded before it are settled, whether they are all
    /// durable. Barriers of one node are answered in the order they came.
    pub(super) fn link_barrier(&mut self, node: u64, done: tokio::sync::oneshot::Sender<bool>) {
        let upto = self.link_writes.get(&node).map_or(0, |w| w.next);
        self.link_waiters.push(LinkWaiter {
            node,
            upto,
            done: Some(done),
        });
        self.check_links();
    }

    /// The deliveries routed for a publish `node` forwarded wrote `before..` of this turn's
    /// store ops: the node's next barrier waits for their commit.
    pub(super) fn await_link_writes(
        &mut self,
        node: u64,
        before: usize,
        ctx: &mut starling_rt::Ctx<Self>,
    ) {
        if self.to_store.len() == before {
            return;
        }
        let seq = self.link_writes.entry(node).or_default().take_seq();
        self.store_waiters.push(Waiter {
            to: WaiterTo::Link(ctx.weak_addr(), node, seq),
            ops: before..self.to_store.len(),
        });
    }

    /// The commit of `node`'s write `seq` is done.
    pub(super) fn link_stored(&mut self, node: u64, seq: u64, outcome: LinkWrite) {
        let Some(w) = self.link_writes.get_mut(&node) else {
            return;
        };
        w.outstanding.remove(&seq);
        match outcome {
            LinkWrite::Durable => {}
            LinkWrite::NotDurable => {
                add(&self.shared.metrics.cluster_forward_not_durable, 1);
                w.failed.insert(seq);
            }
            LinkWrite::StoreGone => w.gone = true,
        }
    }

    /// Drops the holds of subscribers that are no longer backlogged (drained, stalled,
    /// offline or gone) and answers the barriers that wait for nothing any more. Runs at
    /// the end of a burst while any link is held or any barrier waits: whatever changes a
    /// backlog, or settles a write, is a message.
    pub(super) fn check_links(&mut self) {
        let destinations = &self.destinations;
        self.held_links.retain(|(_, s)| {
            matches!(destinations.get(s), Some(Destination::Local(c)) if c.backlog.backlogged())
        });
        if self.link_waiters.is_empty() {
            return;
        }
        let held = &self.held_links;
        let writes = &mut self.link_writes;
        // In order: a later barrier of a node is never ready before an earlier one (it
        // waits for as much or more), and the earlier one must report a failure first.
        self.link_waiters.retain_mut(|b| {
            let node = b.node;
            if held.iter().any(|(n, _)| *n == node) {
                return true;
            }
            let Some(w) = writes.get_mut(&node) else {
                b.answer(true);
                return false;
            };
            if w.gone {
                // Dropped: the node's inbound side says nothing of the batch (see
                // `LinkWrite::StoreGone`).
                b.done = None;
                return false;
            }
            if w.outstanding.range(..b.upto).next().is_some() {
                return true;
            }
            let durable = w.failed.range(..b.upto).next().is_none();
            w.failed = w.failed.split_off(&b.upto);
            b.answer(durable);
            false
        });
    }

    /// A QoS 1/2 publish from `from` was offered to `node`: past the window, the publisher
    /// is held until the node's acknowledgements bring it down.
    pub(super) fn hold_for_window(&mut self, node: u64, from: &Publisher) {
        let high = self.window.high;
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
        let low = self.window.low;
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
        let base = self.shared.config.cluster.forward_timeout_ms;
        self.rules.max + Duration::from_millis(u64::from(base))
    }

    /// One pass over the links for the burst's report: the messages in every node's
    /// window (forwarded and not acknowledged, or waiting to be sent) and parked for it
    /// (`RemoteNode::outbox_messages`); the batches the links took since the last report
    /// go to the node's counters.
    pub(super) fn link_report(&mut self) -> (usize, usize) {
        let m = &self.shared.metrics;
        let (mut forwards, mut outbox) = (0, 0);
        for n in &self.remote_nodes {
            if let Some(Destination::Remote(r)) = self.destinations.get_mut(&remote_key(*n)) {
                forwards += r.in_flight();
                outbox += r.outbox_messages();
                let sent = std::mem::take(&mut r.sent);
                add(&m.cluster_forward_batches, sent.batches);
                add(&m.cluster_forward_bytes, sent.bytes);
            }
        }
        (forwards, outbox)
    }

    /// What this shard owes the other nodes: every message for one that it has not
    /// acknowledged (waiting, in its window, parked, or parked by an earlier run), and the
    /// relays a copy may still come for.
    pub(super) fn owed(&self) -> Owed {
        let messages = self
            .remote_nodes
            .iter()
            .map(|n| match self.destinations.get(&remote_key(*n)) {
                Some(Destination::Remote(r)) => r.in_flight() + r.outbox_messages(),
                _ => 0,
            })
            .sum();
        Owed {
            messages,
            relays: self.relays_awaited(),
        }
    }

    /// Whether a batch sent to some node waits for its acknowledgement.
    pub(super) fn windows_open(&self) -> bool {
        self.remote_nodes.iter().any(|n| {
            matches!(self.destinations.get(&remote_key(*n)), Some(Destination::Remote(r)) if !r.unacked.is_empty() || !r.replay.is_empty())
        })
    }
}

impl RemoteNode {
    /// Messages forwarded and not acknowledged, and messages waiting to be sent.
    pub(crate) fn in_flight(&self) -> usize {
        self.pending.len() + self.unacked_messages
    }
}
