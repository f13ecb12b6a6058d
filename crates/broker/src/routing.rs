//! A router shard: one actor per shard (`router.shards`), owning the subscriptions that can
//! match its topics, its topics' retained messages and the `$delayed/` timers of publishes
//! to them (see [`starling_router::ShardMap`] and [`crate::shards`]); it fans each publish
//! out to the subscribers' [`Destination`]s.
//!
//! Deliveries are batched: a publish appends to each subscriber's pending list here, and
//! once the shard's mailbox is drained (or every [`FLUSH_EVERY_PUBLISHES`]) each pending
//! list goes to its client actor as one message, so a burst costs one mailbox operation
//! and one actor turn per subscriber, not per delivery. Another node's list waits past
//! that stride until it fills a frame or for [`REMOTE_STRIDES`] strides: its batch and the
//! acknowledgement it brings back cost the same at any size.
//!
//! It never waits on a client: batches are `try_send`s into bounded mailboxes. A full
//! mailbox leaves the batch pending here and it is retried on the next flush (or after
//! [`RETRY_BLOCKED`]); the pending list is bounded by the session queue length
//! (`max_mqueue_len`) and, when full, applies the session's drop policy and counts the drop
//! (a slow subscriber costs itself, not the others). So a QoS 1/2 message is not lost to a
//! momentarily busy client actor: it reaches the session's own queue, whose policy decides.
//! Publishers do wait on the shard (`send`), which is the back-pressure that reaches a
//! fast publisher's socket. And a QoS 1/2 publish that reaches a subscriber whose queue is
//! backed up marks its publisher to be held back until that subscriber drains (see
//! [`crate::flow`]), so a flood slows to the subscriber's pace instead of being dropped.

use std::collections::HashMap;

use foldhash::fast::FixedState;
use std::sync::Arc;
use std::time::Duration;

use rand::RngCore;
use starling_codec::ReasonCode;
use starling_config::StuckPolicy;
use starling_router::{
    Delivery as Routed, DeliveryKind, Merge, PublishContext, RetainedIndex, Router, ShardMap,
    DELAYED_PREFIX,
};
use starling_rt::{rng, time, Actor, ActorId, Addr, Ctx, TimerId, WeakAddr};
use starling_session::{DeliveryOptions, Message};
use starling_store::Op;

use crate::destination::Destination;
use crate::flow::{Qos0Tally, StallRules};
use crate::metrics::add;
use crate::msg::{
    AckTo, ClientMsg, DelayedKey, HeldDelivery, LinkWrite, Publisher, Restore, RouterMsg, StoreMsg,
    StoreOp, Stored, SubscribeMsg, Waiter, WaiterTo, BATCH_MAX,
};
use crate::settings::Shared;

mod admin;
mod control;
mod deliver;
mod departed;
use admin::ShardCounts;
mod handover;
mod link;
mod moving;
#[cfg(test)]
mod park_tests;
mod recent;
mod remote;
mod slots;
mod stored;
mod subscribe;
#[cfg(test)]
mod testkit;
#[cfg(test)]
mod window_tests;
use slots::{Destinations, Slot};

/// A subscription's options as the shard stores them: what a delivery through it carries,
/// merged with the subscriber's other matching subscriptions by the router core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SubOpts(DeliveryOptions);

impl Merge for SubOpts {
    fn merge(&mut self, other: Self) {
        self.0.merge(other.0);
    }
}

/// Publishes routed before the pending batches are handed out even though more publishes
/// wait in the mailbox: bounds the delay a steady stream of publishes adds to a delivery.
const FLUSH_EVERY_PUBLISHES: usize = 64;
/// Strides (of [`FLUSH_EVERY_PUBLISHES`]) a partial batch for another node may wait while
/// the mailbox does not drain: 4 strides fill a frame (256) when all goes to one node.
const REMOTE_STRIDES: u8 = 4;
/// When a client's mailbox was full and no publish comes to trigger a flush.
const RETRY_BLOCKED: Duration = Duration::from_millis(2);

pub(crate) struct RouterActor {
    shared: Arc<Shared>,
    /// This shard's number and the map of all shards.
    index: usize,
    map: ShardMap,
    router: Router<Slot, SubOpts>,
    retained: RetainedIndex<Arc<Message>>,
    /// By key (foldhash, seeded from the runtime) and by the slot the router's
    /// subscriptions name: a delivery finds its destination by index.
    destinations: Destinations,
    delayed: usize,
    /// This shard's part of `mqtt.delayed_publish_max`.
    delayed_max: usize,
    /// Subscriptions this shard is home to: summed over shards, each counted once.
    owned: usize,
    /// Of `owned`, the `$share/` (and `$queue/`) subscriptions.
    owned_shared: usize,
    /// The counts last added to the node's gauges (see `report_counts`).
    reported: ShardCounts,
    rng: starling_rt::rng::Rng,
    /// This shard's incarnation on the links to other nodes (see `RemoteNode::inc`).
    link_inc: u64,
    /// The last publishes taken in on this node, for a SUBSCRIBE that raced them.
    recent: recent::Recent,
    /// Reused per publish: the matches, then one entry per subscriber after merging.
    scratch: Vec<Routed<Slot, SubOpts>>,
    merged: Vec<Routed<Slot, SubOpts>>,
    /// Subscribers with a non-empty pending batch, each once.
    dirty: Vec<Arc<str>>,
    /// Publishes routed since the last flush.
    routed: usize,
    /// Armed while some client's batch waits for room in its mailbox.
    retry: Option<TimerId>,
    /// Bound of one client's pending list (the session queue length, at least a batch).
    pending_max: usize,
    /// Back-pressure thresholds and stall rules (see [`crate::flow`]).
    rules: StallRules,
    /// The window of messages in flight to one other node (`RemoteNode::in_flight`), this
    /// shard's share of [`forward_window`]: from `high` on the node's QoS 1/2 publishers
    /// are held, down to `low` they go again. A node's link carries every one of its
    /// subscribers' messages; one subscriber's backlog bound (`rules.high`), its window
    /// before, held 50 cross-node pairs stop-and-go (docs/benchmarks.md).
    window: Window,
    /// Flushes at the stride since other nodes' partial batches last went (`flush_some`).
    strides: u8,
    /// Bound of one other node's waiting list: twice the window's high mark, room for what
    /// held publishers sent before the hold reached them.
    remote_pending_max: usize,
    /// Control messages (hold, release, watch) that found no room, oldest first, retried
    /// with the blocked batches: a shard never waits on a client.
    outbox: Vec<(WeakAddr<ClientMsg>, ClientMsg)>,
    /// Publishers this shard sent a Hold, with the release epoch it was for: one Hold per
    /// publisher and epoch, however many of its subscribers are backlogged.
    sent_holds: HashMap<ActorId, u32, FixedState>,
    /// The durable store, when `storage.enabled`: retained and delayed messages are written
    /// there as they change.
    store: Option<Addr<StoreMsg>>,
    /// Written to the store at the end of the turn (the store may push back), with the
    /// publishers waiting for their part of it.
    to_store: Vec<StoreOp>,
    store_waiters: Vec<Waiter>,
    /// The retained puts among `to_store` (op index, message).
    store_retained: Vec<(usize, Arc<Message>)>,
    /// This shard's next delayed-message id: shards draw from disjoint sequences
    /// (`index`, `index + shards`, ...) above the store's mark.
    delayed_next: u64,
    /// Deliveries to persistent sessions held for the commit of `to_store` (see
    /// [`HeldDelivery`]).
    store_deliveries: Vec<HeldDelivery>,
    /// Whether a QoS 1 delivery to an online persistent session may go before its record
    /// is durable: the storage actor says so while the store has room (`StoreRoom`).
    store_early: bool,
    /// Publishers whose publishes of this burst wrote nothing to the store, with their tags:
    /// told at the burst's end (see `send_routed_acks`).
    routed_acks: Vec<(WeakAddr<ClientMsg>, Vec<u32>)>,
    /// Publishers whose forwarded publishes were settled this turn (tag, outcome), told at
    /// its end (see `remote::send_settled_acks`).
    settled_acks: Vec<(WeakAddr<ClientMsg>, remote::Settled)>,
    /// This shard's next delivery key, drawn like `delayed_next`: increasing per shard, so
    /// that a session's stored deliveries of one topic come back in routing order.
    seq_next: u64,
    /// Its part in the cluster, when `cluster.enabled` (see `remote`).
    cluster: Option<crate::msg::ShardCluster>,
    /// Local subscriptions per topic filter this shard is home to (cluster only).
    route_counts: HashMap<String, u32, FixedState>,
    /// Route transitions not yet taken by the cluster actor, oldest first.
    route_outbox: std::collections::VecDeque<crate::msg::ClusterMsg>,
    /// Publishes whose acknowledgement waits for other nodes (see `remote`), by key.
    fwd_acks: HashMap<u64, remote::FwdAck, FixedState>,
    fwd_next: u64,
    /// The first key of a copy forwarded on (`remote::park_forwarded_on`) while the
    /// forwarded part being routed is: what waits for the other nodes from it on is parked
    /// once the part is routed, in the same commit as the link's cursor.
    park_from: Option<u64>,
    /// While a publish whose publisher waits is routed: its key and the nodes it went to.
    fwd_current: Option<remote::FwdRoute>,
    /// Keys of forwarded publishes whose publisher's QoS 2 packet identifier is not yet
    /// durable here, oldest first: nothing from the first of them on leaves for another
    /// node until it is (see `remote::FwdGate`).
    fwd_gates: remote::FwdGate,
    /// Messages this shard may park for one other node (its share of
    /// `cluster.outbox_max_messages`); without a store nothing is parked, and it bounds
    /// what is kept in memory instead (`RemoteNode::give_up_late`).
    outbox_share: usize,
    /// Batches an earlier run parked, until the cluster is wired (then each node's
    /// destination sends them again).
    replays: Vec<starling_store::OutboxBatch>,
    /// Armed while forwarded batches wait for their nodes.
    fwd_timer: Option<TimerId>,
    /// The nodes this shard forwards to (each has a `Destination::Remote`).
    remote_nodes: Vec<u64>,
    /// Links of other nodes held back, by the subscriber holding each (see `link`), and
    /// the barriers waiting for a link to be let go.
    held_links: Vec<(u64, Arc<str>)>,
    link_waiters: Vec<link::LinkWaiter>,
    /// Per node, its forwarded publishes' store writes not yet durable.
    link_writes: HashMap<u64, link::LinkWrites, FixedState>,
    /// Per link into this shard (sending node, its shard): the batch being routed, and how
    /// many of its messages so far; and how far the writes were stored before this node
    /// restarted (see `link::Taken`).
    link_taken: HashMap<(u64, u16), link::Taken, FixedState>,
    link_stored: HashMap<(u64, u16), link::Taken, FixedState>,
    /// Per link, where its cursor sits in `to_store` (if it still does): one cursor per
    /// link per commit is enough, moved forward in place.
    link_cursor_op: HashMap<(u64, u16), usize, FixedState>,
    /// Sessions moving between nodes, and the routes' index publishes are routed under
    /// (see `handover`).
    moving: handover::ShardMoves,
}

/// The window of messages in flight to one other node, the whole node's
/// (`cluster.forward_window_messages`). Automatic (0): a subscriber's room past its high
/// mark (its hard queue bound less half the queue bound), shared by the other members. A
/// backlogged subscriber holds the link its deliveries came by, but the sending node learns
/// of it only as its window fills: what each other node has in flight to it then is queued
/// there as held back, and this way it fits (docs/clustering.md, "Back-pressure across
/// nodes", says what else shares that room).
///
/// The members are those of `cluster.peers`, or more once the replicated membership has
/// more (`RouterMsg::Members`): a node that joins beyond the peers listed is another
/// sender. Never fewer: the listed peers that have not joined yet (at a cold start) or
/// left may send still.
fn forward_window(shared: &Shared, members: usize) -> u64 {
    match shared.config.cluster.forward_window_messages {
        0 => {
            let limits = &shared.limits;
            let room = limits
                .mqueue_len_hard()
                .saturating_sub(limits.backlog_high());
            let members = members.max(shared.config.cluster.peers.len());
            let others = members.saturating_sub(1).max(1);
            (room / others).max(1) as u64
        }
        w => u64::from(w),
    }
}

/// The window of messages in flight to one other node, in a shard (see `RouterActor::window`).
#[derive(Debug, Clone, Copy)]
struct Window {
    high: usize,
    low: usize,
}

impl Window {
    /// A shard's share of `total` for one node, over `shards` shards; low at half of high.
    fn new(total: u64, shards: usize) -> Window {
        let high = share_of(total, shards).max(1);
        Window {
            high,
            low: high / 2,
        }
    }

    /// The bound of one other node's waiting list under this window: twice its high mark,
    /// at least one client's pending list (`pending_max`).
    fn remote_pending_max(&self, pending_max: usize) -> usize {
        self.high.saturating_mul(2).max(pending_max)
    }
}

impl RouterActor {
    /// The replicated membership has `members` members: the automatic window is shared
    /// among the others from now on (never fewer than `cluster.peers` lists). A smaller
    /// window holds publishers from the next message sent; a larger one lets held ones go
    /// at the next acknowledgement.
    fn members(&mut self, members: usize) {
        let window = Window::new(forward_window(&self.shared, members), self.map.count());
        if window.high == self.window.high {
            return;
        }
        tracing::debug!(members, high = window.high, "forwarding window resized");
        self.window = window;
        self.remote_pending_max = window.remote_pending_max(self.pending_max);
    }
}

/// `total` split over `n` shards, rounded up: each shard's part of a node-wide cap.
pub(crate) fn share_of(total: u64, n: usize) -> usize {
    let n = n.max(1) as u64;
    usize::try_from(total.div_ceil(n)).unwrap_or(usize::MAX)
}

/// What a shard starts from that the store kept: where its key sequences start, how far
/// other nodes' links into it were stored, and the batches it parked for other nodes.
pub(crate) struct ShardStart<'a> {
    pub delayed_base: u64,
    pub seq_base: u64,
    pub cursors: &'a [starling_store::LinkCursor],
    pub outbox: Vec<starling_store::OutboxBatch>,
    /// Every shard's stored judgements of moving sessions (shard, client id, record).
    pub moves: &'a [(u16, String, Vec<u8>)],
}

impl RouterActor {
    pub(crate) fn new(
        shared: Arc<Shared>,
        index: usize,
        map: ShardMap,
        store: Option<Addr<StoreMsg>>,
        start: ShardStart<'_>,
    ) -> Self {
        let ShardStart {
            delayed_base,
            seq_base,
            cursors,
            outbox,
            moves,
        } = start;
        assert!(index < map.count());
        let mut rng = rng::rng();
        let n = map.count();
        // Seeds drawn from the runtime: deterministic under simulation, secret otherwise.
        let router = Router::new(shared.router_config(rng.next_u64()));
        let mut retained_config = shared.retained_config(rng.next_u64());
        retained_config.retained_max = share_of(retained_config.retained_max as u64, n);
        retained_config.retained_bytes_max = share_of(retained_config.retained_bytes_max as u64, n);
        let retained = RetainedIndex::new(retained_config);
        let pending_max = shared.limits.mqueue_len_max.max(BATCH_MAX);
        let window = Window::new(
            forward_window(&shared, shared.config.cluster.peers.len()),
            n,
        );
        let remote_pending_max = window.remote_pending_max(pending_max);
        let delayed_max = share_of(u64::from(shared.config.mqtt.delayed_publish_max), n);
        let rules = StallRules::new(&shared.config.mqtt, &shared.limits);
        let route_seed = rng.next_u64();
        let outbox_share = if shared.config.cluster.enabled {
            let max = shared.config.cluster.outbox_max_messages;
            share_of(u64::from(max), map.count())
        } else {
            0
        };
        let link_inc = rng.next_u64();
        let mut shard = Self {
            rules,
            outbox: Vec::new(),
            sent_holds: HashMap::with_hasher(FixedState::with_seed(rng.next_u64())),
            shared,
            index,
            map,
            router,
            retained,
            destinations: Destinations::new(rng.next_u64()),
            delayed: 0,
            delayed_max,
            owned: 0,
            owned_shared: 0,
            reported: ShardCounts::default(),
            rng,
            link_inc,
            recent: recent::Recent::default(),
            scratch: Vec::new(),
            merged: Vec::new(),
            dirty: Vec::new(),
            routed: 0,
            retry: None,
            pending_max,
            window,
            remote_pending_max,
            strides: 0,
            store,
            to_store: Vec::new(),
            store_waiters: Vec::new(),
            store_retained: Vec::new(),
            delayed_next: delayed_base + index as u64,
            store_deliveries: Vec::new(),
            store_early: false,
            routed_acks: Vec::new(),
            settled_acks: Vec::new(),
            seq_next: seq_base + index as u64,
            cluster: None,
            route_counts: HashMap::with_hasher(FixedState::with_seed(route_seed)),
            route_outbox: std::collections::VecDeque::new(),
            fwd_acks: HashMap::with_hasher(FixedState::with_seed(route_seed ^ 1)),
            fwd_next: 1,
            park_from: None,
            fwd_current: None,
            fwd_gates: remote::FwdGate::default(),
            outbox_share,
            replays: outbox,
            fwd_timer: None,
            remote_nodes: Vec::new(),
            held_links: Vec::new(),
            link_waiters: Vec::new(),
            link_writes: HashMap::default(),
            link_taken: HashMap::default(),
            link_cursor_op: HashMap::default(),
            moving: handover::ShardMoves::default(),
            link_stored: cursors
                .iter()
                .filter(|c| usize::from(c.to_shard) == index)
                .map(|c| ((c.node, c.shard), link::Taken::from(c)))
                .collect(),
        };
        if !moves.is_empty() {
            shard.restore_moves(moves);
        }
        shard
    }

    /// A publish, and its publisher's acknowledgement once what it changed in the store is
    /// durable (`ack`; at once when it changed nothing there) and, in a cluster, once every
    /// node it was forwarded to took it.
    pub(super) fn publish_acked(
        &mut self,
        msg: Arc<Message>,
        from: Option<Publisher>,
        ack: Option<Box<AckTo>>,
        ctx: &mut Ctx<Self>,
    ) {
        let before = self.to_store.len();
        if let Some((client_id, packet_id)) = ack.as_ref().and_then(|a| a.inbound.clone()) {
            if self.store.is_some() {
                self.to_store.push(
                    Op::PutInbound {
                        client_id: client_id.to_string(),
                        packet_id,
                    }
                    .into(),
                );
            }
        }
        // Forwarded copies of a publish whose publisher waits count towards its answer.
        if ack.is_some() && self.cluster.is_some() && msg.qos != starling_codec::QoS::AtMostOnce {
            self.fwd_current = Some(remote::FwdRoute::new(self.fwd_next));
        }
        self.publish(msg, from, None, ctx);
        let forwarded = self.fwd_current.take().filter(remote::FwdRoute::any);
        let Some(to) = ack else { return };
        let stores = self.to_store.len() > before;
        if let Some(f) = forwarded {
            self.fwd_next += 1;
            if to.inbound.is_some() && stores {
                self.fwd_gates.close(f.key);
            }
            if stores {
                self.store_waiters.push(Waiter {
                    to: WaiterTo::Shard(ctx.weak_addr(), f.key),
                    ops: before..self.to_store.len(),
                });
            }
            self.await_forwards(f, *to, stores, ctx);
        } else if stores {
            self.store_waiters.push(Waiter {
                to: WaiterTo::Client(*to),
                ops: before..self.to_store.len(),
            });
        } else {
            // Answered with the burst's deliveries, one message per publisher.
            let id = to.addr.id();
            match self
                .routed_acks
                .iter_mut()
                .rev()
                .find(|(a, _)| a.id() == id)
            {
                Some((_, tags)) => tags.push(to.tag),
                None => self.routed_acks.push((to.addr, vec![to.tag])),
            }
        }
    }

    /// Answers `done` once the ops this turn pushed from `before` on are committed (at
    /// once when it pushed none).
    fn done_when_stored(&mut self, before: usize, done: starling_rt::Reply<Stored>) {
        if self.to_store.len() > before {
            self.store_waiters.push(Waiter {
                to: WaiterTo::Done(done),
                ops: before..self.to_store.len(),
            });
        } else {
            let _ = done.send(Stored::Durable);
        }
    }

    /// Tells each publisher which of its publishes changed nothing in the store.
    fn send_routed_acks(&mut self) {
        for (addr, tags) in std::mem::take(&mut self.routed_acks) {
            self.control(&addr, ClientMsg::Routed(tags));
        }
    }

    /// Routes a publish published on this node, or (`forwarded_by`) one another node
    /// forwarded: delivered to this node's subscribers only, its retained copy not kept.
    fn publish(
        &mut self,
        msg: Arc<Message>,
        from: Option<Publisher>,
        forwarded_by: Option<u64>,
        ctx: &mut Ctx<Self>,
    ) {
        let local = forwarded_by.is_none();
        if local && msg.topic.starts_with(DELAYED_PREFIX) {
            self.schedule(&msg, ctx);
            return;
        }
        debug_assert_eq!(
            self.map.of_topic(&msg.topic),
            self.index,
            "routed by its shard"
        );
        if local && msg.retain {
            if self.cluster.is_some() && !msg.topic.starts_with('$') {
                // Kept where the cluster's log puts it, on every node (`remote`).
                self.propose_retained(&msg, ctx.weak_addr());
            } else {
                self.store_retained(&msg);
            }
        }
        let pctx = PublishContext {
            random: self.rng.next_u64(),
            publisher_hash: msg
                .publisher
                .as_deref()
                .map_or(0, |p| self.router.publisher_hash(p)),
        };
        let destinations = &self.destinations;
        let mut merged = std::mem::take(&mut self.merged);
        self.router.route_merged(
            &msg.topic,
            &pctx,
            |s| destinations.at(*s).is_some_and(Destination::online),
            &mut self.scratch,
            &mut merged,
            |a, b| a == b,
        );
        if local && merged.is_empty() {
            // No subscriber here nor on another node: the publish's node counts it, once.
            add(&self.shared.metrics.rmqtt.messages_nonsubscribed, 1);
        }
        let mut qos0 = Qos0Tally::default();
        let holders = Arc::strong_count(&msg);
        for d in merged.drain(..) {
            let source = match forwarded_by {
                None => Source::Local(from.as_ref(), Some(&d.kind)),
                // The publish's node picked the members of shared groups cluster-wide:
                // this node's plain subscribers only (see `publish_forwarded`).
                Some(_) if matches!(d.kind, DeliveryKind::Shared { .. }) => continue,
                Some(node) => Source::Forwarded(node),
            };
            if !self.judge_move(&msg, d.subscriber, &d.kind, from.as_ref()) {
                continue;
            }
            self.offer(&msg, d.subscriber, d.options.0, source, &mut qos0, ctx);
        }
        self.routed += 1;
        self.merged = merged;
        if local {
            // A delivery on its way holds the message: counted, not asked of each offer.
            let delivered = Arc::strong_count(&msg) > holders;
            self.recent.note(&msg, delivered);
        }
        if let (Some(from), Some(subscriber)) = (from.as_ref(), qos0.overloaded()) {
            self.hold_for(&subscriber, from);
        }
    }
}

/// Where a routed publish came from.
#[derive(Clone, Copy)]
enum Source<'a> {
    /// Published on this node, by this publisher when it may be held back; with the shared
    /// group the delivery is for, if it is (a node picked as its member is told).
    Local(Option<&'a Publisher>, Option<&'a DeliveryKind>),
    /// Forwarded by this node: for local subscribers only.
    Forwarded(u64),
}

impl Actor for RouterActor {
    type Msg = RouterMsg;
    /// A few shards, busy: a turn boxed per message cost a large allocation each.
    const TURNS_IN_PLACE: bool = true;

    async fn handle(&mut self, msg: RouterMsg, ctx: &mut Ctx<Self>) {
        match msg {
            RouterMsg::Publish(m, from, ack) => self.publish_local(m, from, ack, ctx),
            RouterMsg::DelayedDue(m, key) => {
                self.delayed = self.delayed.saturating_sub(1);
                if let Some(DelayedKey { id, due }) = key {
                    self.to_store.push(Op::DropDelayed { id, due }.into());
                }
                self.publish(m, None, None, ctx);
            }
            RouterMsg::Forwarded(part) => self.forwarded_part(part, ctx),
            RouterMsg::RoutesAt(index) => self.routes_applied(index, ctx),
            RouterMsg::Moved {
                client_id,
                node,
                epoch,
                index,
            } => self.cut((client_id, node, epoch), index, ctx),
            RouterMsg::MovedIn {
                client_id,
                epoch,
                from,
                done,
            } => {
                let before = self.to_store.len();
                self.moved_in(client_id, (epoch, from), ctx);
                self.done_when_stored(before, done);
            }
            RouterMsg::MovesCheck => self.moves_check(ctx),
            RouterMsg::Through(at) => self.through(at, ctx),
            RouterMsg::AskThrough(round) => self.ask_through(round),
            RouterMsg::Owed(reply) => {
                let _ = reply.send(self.owed());
            }
            RouterMsg::MovedAway {
                client_id,
                to,
                epoch,
                done,
            } => {
                let before = self.to_store.len();
                self.moved_away(client_id, (to, epoch), ctx);
                self.done_when_stored(before, done);
            }
            RouterMsg::LinkStored { node, seq, outcome } => self.link_stored(node, seq, outcome),
            RouterMsg::ForwardAcked { node, inc, seq } => {
                self.forward_acked(node, inc, seq, ctx.weak_addr())
            }
            RouterMsg::ForwardNotDurable { node, inc, seq } => {
                self.forward_not_durable(node, inc, seq, ctx.weak_addr())
            }
            RouterMsg::Unparked { node, inc, seq } => self.unparked(node, inc, seq),
            RouterMsg::ForwardResend { node, inc, from } => self.forward_resend(node, inc, from),
            RouterMsg::ForwardStored { key, outcome } => self.forward_stored(key, outcome),
            RouterMsg::Parked { node, seq, outcome } => self.parked(node, seq, outcome),
            RouterMsg::ForwardCheck => self.forward_check(ctx),
            RouterMsg::SeqFloor { at_least, reply } => {
                // This shard's seqs are `index` modulo the shard count: the first such
                // value at or above `at_least`.
                let step = self.map.count() as u64;
                if self.seq_next < at_least {
                    let behind = (at_least - self.seq_next).div_ceil(step);
                    self.seq_next += behind * step;
                }
                let _ = reply.send(self.seq_next);
            }
            RouterMsg::Restored => {
                if self.cluster.is_some() {
                    self.route_outbox
                        .push_back(crate::msg::ClusterMsg::Restored);
                }
            }
            RouterMsg::RetainSettled { key, failed } => self.forward_settled(key, failed),
            RouterMsg::ClusterRetained { topic, message } => {
                self.cluster_retained(&topic, message);
            }
            RouterMsg::ClusterRetainedReset(all) => self.cluster_retained_reset(all),
            RouterMsg::Barrier(done) => match &self.cluster {
                Some(_) => self
                    .route_outbox
                    .push_back(crate::msg::ClusterMsg::Barrier(done)),
                None => {
                    let _ = done.send(());
                }
            },
            RouterMsg::Cluster(c) => self.wire_cluster(*c),
            RouterMsg::RemoteRoute {
                filter,
                node,
                present,
            } => self.remote_route(&filter, node, present),
            RouterMsg::NodeLeft(node) => self.node_left(node),
            RouterMsg::Members(n) => self.members(n),
            RouterMsg::Departed(nodes) => self.departed_while_down(&nodes),
            RouterMsg::RetainedRefused(m) => {
                if self
                    .retained
                    .get(&m.topic)
                    .is_some_and(|kept| Arc::ptr_eq(kept, &m))
                {
                    self.retained.remove(&m.topic);
                    add(&self.shared.metrics.retained_refused, 1);
                }
            }
            RouterMsg::Restore(r) => {
                let Restore {
                    retained,
                    delayed,
                    done,
                } = *r;
                self.restore(retained, delayed, ctx);
                let _ = done.send(());
            }
            RouterMsg::StoredDeliveries(ds) => self.stored_deliveries(ds),
            RouterMsg::StoreRoom(early) => self.store_early = early,
            RouterMsg::RetryBlocked => {
                self.retry = None;
                if !self.outbox.is_empty() && self.dirty.is_empty() {
                    let _ = self.flush(ctx);
                }
            }
            RouterMsg::Subscribe(sub) => {
                let SubscribeMsg {
                    client_id,
                    client,
                    may_hold,
                    persistent,
                    filters,
                    admission,
                    since,
                    reply,
                } = *sub;
                self.moving_superseded(&client_id, &filters);
                let installed = self.moving_installed(&client_id, &filters);
                let catch_up = since
                    .filter(|&t| self.recent.any_after(t, &client_id))
                    .map(|t| (t, self.catch_ups(&filters)));
                let id = client_id.clone();
                let mut r =
                    self.subscribe(client_id, client, may_hold, persistent, filters, admission);
                if let Some((since, subs)) = catch_up {
                    self.caught_up(&mut r, since, &id, subs);
                }
                let _ = reply.send(r);
                if installed {
                    // Copies relayed to it may have come before its subscriptions.
                    self.route_kept(ctx);
                }
            }
            RouterMsg::Unsubscribe {
                client_id,
                filters,
                reply,
            } => {
                let codes = filters
                    .iter()
                    .map(|f| match self.unsubscribe(&client_id, f) {
                        Ok(true) => ReasonCode::Success,
                        Ok(false) => ReasonCode::NoSubscriptionExisted,
                        Err(_) => ReasonCode::TopicFilterInvalid,
                    })
                    .collect();
                let _ = reply.send(codes);
            }
            RouterMsg::SessionEnded {
                client_id,
                actor,
                filters,
            } => {
                for f in &self.session_left(&client_id, filters, actor) {
                    let _ = self.unsubscribe(&client_id, f);
                }
                if self
                    .destinations
                    .get(&client_id)
                    .is_some_and(|d| d.actor() == actor)
                {
                    if let Some(mut d) = self.destinations.remove(&client_id) {
                        let released = d.end();
                        self.release(released, actor);
                    }
                }
            }
            RouterMsg::Presence {
                client_id,
                online,
                may_hold,
                persistent,
            } => {
                let forgive =
                    self.shared.config.mqtt.backpressure_stuck_policy == StuckPolicy::Disconnect;
                if let Some(Destination::Local(c)) = self.destinations.get_mut(&client_id) {
                    c.online = online;
                    c.persistent = persistent;
                    let o = c.backlog.presence(online, may_hold, forgive);
                    self.apply(&client_id, o, ctx);
                }
            }
            RouterMsg::Flow {
                client_id,
                actor,
                report,
            } => {
                if let Some(Destination::Local(c)) = self.destinations.get_mut(&client_id) {
                    if c.addr.id() == actor {
                        let pending = c.pending.len();
                        let o = c.backlog.report(time::now(), report, pending, &self.rules);
                        self.apply(&client_id, o, ctx);
                    }
                }
            }
            RouterMsg::FlowCheck { client_id, epoch } => {
                if let Some(Destination::Local(c)) = self.destinations.get_mut(&client_id) {
                    let o = c.backlog.check(time::now(), epoch, &self.rules);
                    self.apply(&client_id, o, ctx);
                }
            }
            RouterMsg::Retained {
                filter,
                limit,
                reply,
            } => {
                let _ = reply.send(self.retained_list(&filter, limit));
            }
        }
        // Held deliveries go even without ops of their own: they wait behind earlier ones.
        if !self.to_store.is_empty() || !self.store_deliveries.is_empty() {
            if let Some(store) = &self.store {
                let ops = std::mem::take(&mut self.to_store);
                let then = std::mem::take(&mut self.store_waiters);
                let retained = std::mem::take(&mut self.store_retained);
                let deliveries = std::mem::take(&mut self.store_deliveries);
                let shard = Some(ctx.weak_addr());
                let write = StoreMsg::Write {
                    ops,
                    then,
                    retained,
                    deliveries,
                    shard,
                };
                if let Err(e) = store.send(write).await {
                    // The store is stopping: the waiting publishers hear it is not durable.
                    add(&self.shared.metrics.store_errors, 1);
                    if let StoreMsg::Write {
                        then, deliveries, ..
                    } = e.0
                    {
                        // Not durable, but routed: delivered from memory.
                        let ds = deliveries
                            .into_iter()
                            .map(|h| (h.subscriber, h.actor, h.delivery));
                        self.stored_deliveries(ds.collect());
                        for w in then {
                            match w.to {
                                WaiterTo::Client(to) => {
                                    let msg = ClientMsg::Stored {
                                        tag: to.tag,
                                        outcome: Stored::Failed,
                                    };
                                    self.control(&to.addr, msg);
                                }
                                WaiterTo::Shard(_, key) => self.forward_stored(key, Stored::Failed),
                                WaiterTo::Link(_, node, seq) => {
                                    self.link_stored(node, seq, LinkWrite::StoreGone)
                                }
                                WaiterTo::Parked(_, node, seq) => {
                                    self.parked(node, seq, Stored::Failed)
                                }
                                WaiterTo::Unparked(_, node, inc, seq) => {
                                    self.unparked(node, inc, seq)
                                }
                                WaiterTo::Done(tx) => {
                                    let _ = tx.send(Stored::Failed);
                                }
                            }
                        }
                    }
                }
            }
        }
        if !self.settled_acks.is_empty() {
            self.send_settled_acks();
        }
        // Hand out the batches once the burst is routed (nothing else waits in the mailbox),
        // or at a fixed stride under a steady stream; the publishers' answers with them.
        if !self.route_outbox.is_empty() && !self.send_route_outbox() && self.retry.is_none() {
            self.retry = Some(ctx.after(RETRY_BLOCKED, RouterMsg::RetryBlocked));
        }
        // A control message that found no room outside a flush (an acknowledgement settled
        // by another node's answer) is retried like a blocked batch.
        if !self.outbox.is_empty() && self.retry.is_none() {
            self.retry = Some(ctx.after(RETRY_BLOCKED, RouterMsg::RetryBlocked));
        }
        let drained = ctx.queued() == 0;
        let burst_end = self.routed >= FLUSH_EVERY_PUBLISHES || drained;
        // Other nodes' partial batches wait out at most a few strides of a mailbox that
        // never drains (a steady local flood beside a trickle to another node).
        let whole = drained || self.strides >= REMOTE_STRIDES;
        if burst_end {
            self.report_counts();
            if !self.held_links.is_empty() || !self.link_waiters.is_empty() {
                self.check_links();
            }
        }
        if !self.routed_acks.is_empty() && burst_end {
            self.send_routed_acks();
        }
        if !self.dirty.is_empty() && burst_end {
            self.strides = if whole { 0 } else { self.strides + 1 };
            let blocked = self.flush_some(ctx, whole);
            if blocked > 0 && ctx.queued() > 0 {
                // Subscribers whose mailboxes are full get a turn before more is routed:
                // a shard runs its whole mailbox in one poll, and under a flood what it
                // routed past their room was dropped while they had no turn to drain it.
                starling_rt::yield_now().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::share_of;

    #[test]
    fn a_cap_splits_over_shards_rounding_up() {
        assert_eq!(share_of(100_000, 1), 100_000);
        assert_eq!(share_of(10, 4), 3);
        assert_eq!(share_of(1, 8), 1);
        assert_eq!(share_of(u64::MAX, 1), usize::MAX);
    }
}
