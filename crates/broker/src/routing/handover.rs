//! A shard's part in moving sessions between nodes (the rules are `moving`'s): the index
//! of the routes each publish is routed under, the relay a session that left keeps here,
//! the copies relayed to one that came, and forwarded batches kept back until this shard
//! can judge them.

use std::collections::VecDeque;
use std::sync::Arc;

use starling_router::{parse_subscription, DeliveryKind, Extension, PublishContext};
use starling_rt::{time, Ctx, TimerId};
use starling_session::{Instant, Message, SubscribeRequest};
use tracing::{debug, warn};

use super::moving::{LinkKey, Moves, Release, Verdict, Via};
use super::{RouterActor, Slot, Source, SubOpts};
use crate::destination::SharedTo;
use crate::flow::Qos0Tally;
use crate::metrics::add;
use crate::msg::{AckTo, ForwardedPart, LinkFrom, Publisher, RouterMsg};

/// How often the judgements of moves are looked at for their end.
const CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The shard's state for moves.
#[derive(Default)]
pub(super) struct ShardMoves {
    /// The log index of the routes this shard applied last (`RouterMsg::RoutesAt`).
    routes_at: u64,
    /// While a forwarded batch is routed: the index it was routed under on its node.
    forwarded_at: Option<u64>,
    /// While a forwarded batch is routed: the link it came on.
    forwarded_from: Option<LinkFrom>,
    /// A release for order came since the kept batches were last looked at.
    released: bool,
    moves: Moves,
    /// Forwarded batches this shard cannot judge yet, and everything after them from the
    /// same node, in order, each with when it came: routed under routes this shard has not
    /// applied yet while a move's cut is unknown here (`Moves::waits_for`), or holding a
    /// copy relayed to a session that has not arrived yet. Bounded by the senders'
    /// windows: their batches are not acknowledged yet.
    kept: VecDeque<(Box<ForwardedPart>, Instant)>,
    /// This node's own publishes kept back for order (a session that moved here waits
    /// for its old node's release of this shard's link), in order, with their publishers'
    /// answers; bounded by [`LOCAL_KEPT_MAX`].
    kept_local: VecDeque<LocalPublish>,
    /// Requests for a release that wait until this node's own hold on that link and topic
    /// is over (the session moved on from here before the node it came from released
    /// them): answered then, behind what this node relayed of them. Bounded by
    /// [`ASKS_WAITING_MAX`].
    asks_waiting: VecDeque<AskWaiting>,
    timer: Option<TimerId>,
}

/// A request for a release that waits: the session's client id, the node and claim's epoch
/// that asked, the link and topic.
type AskWaiting = (Arc<str>, (u64, u64), LinkKey, Arc<str>);

/// Requests for a release a shard keeps waiting at most: past it, one is answered at once
/// (the order of its topic may go; nothing is lost).
const ASKS_WAITING_MAX: usize = 4096;

/// A publish of this node's, as a shard takes it, and when it kept it back.
type LocalPublish = (Arc<Message>, Option<Publisher>, Option<Box<AckTo>>, Instant);

/// This node's publishes a shard keeps back for order at most: past it, a publish is
/// routed at once (its order across a move may go; nothing is lost). The publishers'
/// windows bound QoS 1/2; this bounds a QoS 0 flood.
const LOCAL_KEPT_MAX: usize = 10_000;

/// How long a copy relayed for a session's claim waits for that session to arrive here
/// (the relay and the session travel apart): a little more than a claiming CONNECT waits
/// for its session (`registry::HANDOVER_WAIT`). Then it goes to whatever session of that
/// client id is here, or nowhere.
const RELAY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The mark of a copy relayed to a moving session: a shared group whose name starts with
/// U+0000 (which no MQTT string holds), then the epoch of the claim the session moved
/// by; the client id in the filter's place.
fn relay_mark(client_id: &Arc<str>, epoch: u64) -> SharedTo {
    SharedTo {
        group: Arc::from(format!("\u{0}{epoch}")),
        filter: client_id.clone(),
    }
}

/// The claim's epoch of a relayed copy's mark; `None`: a shared group's.
pub(super) fn relay_epoch(mark: &SharedTo) -> Option<u64> {
    mark.group
        .strip_prefix('\u{0}')
        .map(|e| e.parse().unwrap_or(0))
}

/// The mark of a release for order (`moving`'s "Order across the cut"): a shared group
/// whose name starts with U+0001, then the claim's epoch and the released link; the client
/// id in the filter's place. It travels as an empty QoS 0 copy on the released topic, so
/// it reaches the new node's shard for that topic behind the relayed copies. A node
/// without it takes it for an unknown shared group, and drops it.
fn release_mark(client_id: &Arc<str>, epoch: u64, (node, shard, inc): LinkKey) -> SharedTo {
    SharedTo {
        group: Arc::from(format!("\u{1}{epoch}/{node}/{shard}/{inc}")),
        filter: client_id.clone(),
    }
}

/// What a release's mark says: the claim's epoch and the link. `None`: another mark.
pub(super) fn released_link(mark: &SharedTo) -> Option<(u64, LinkKey)> {
    let mut f = mark.group.strip_prefix('\u{1}')?.split('/');
    let mut next = || f.next().and_then(|v| v.parse::<u64>().ok());
    let (epoch, node, shard, inc) = (next()?, next()?, next()?, next()?);
    Some((epoch, (node, u16::try_from(shard).ok()?, inc)))
}

impl RouterActor {
    /// The log index of the routes the publish being routed was routed under: its node's,
    /// for one forwarded.
    pub(super) fn routed_at(&self) -> u64 {
        self.moving.forwarded_at.unwrap_or(self.moving.routes_at)
    }

    /// A part of a batch another node forwarded: routed now, or kept until this shard can
    /// judge it.
    pub(super) fn forwarded_part(&mut self, part: Box<ForwardedPart>, ctx: &mut Ctx<Self>) {
        let node = part.from.node;
        let behind = self.moving.kept.iter().any(|(p, _)| p.from.node == node);
        // Just come: it has not waited for the sessions of its relayed copies (no clock read
        // on this path, one per forwarded batch and shard).
        if behind || !self.can_judge(&part, false, None) {
            self.moving.kept.push_back((part, time::now()));
            self.arm_moves_check(ctx);
            return;
        }
        self.route_part(*part, ctx);
        if self.moving.released {
            self.route_kept(ctx);
        }
    }

    /// Whether a part can be routed now: the routes it was routed under are applied here
    /// (or no cut is awaited), the sessions its relayed copies are for have arrived (or
    /// it `waited` long enough for them), and no session that moved here holds a copy of
    /// it back for order (`moving`'s "Order across the cut").
    fn can_judge(&mut self, part: &ForwardedPart, waited: bool, now: Option<Instant>) -> bool {
        let routes_at = self.moving.routes_at;
        if self.moving.moves.waits_for(part.routed_at, routes_at) {
            return false;
        }
        let m = &self.moving;
        let arrived = waited
            || part.messages.iter().all(|(_, g)| {
                match g.as_ref().and_then(|g| Some((relay_epoch(g)?, &g.filter))) {
                    Some((epoch, client_id)) => m.moves.knows(client_id, epoch),
                    None => true,
                }
            });
        if !arrived || (!waited && self.for_arriving(part)) {
            return false;
        }
        !(self.moving.moves.may_hold() && self.holds_for_order(part, now))
    }

    /// Whether a direct copy of the part is for a session that came here and has not
    /// installed its subscriptions yet (one routed in an earlier stay of it here, that came
    /// late or was held for order): delivered now, it would go to the destination the
    /// session that left had here (its relay's), not to the one arriving.
    fn for_arriving(&mut self, part: &ForwardedPart) -> bool {
        self.moving.moves.any_arriving()
            && self.any_direct_copy(part, |moves, client_id, _| moves.arriving(client_id))
    }

    /// Whether a session that moved here holds one of the part's direct copies back until
    /// its old node releases the part's link and topic.
    fn holds_for_order(&mut self, part: &ForwardedPart, now: Option<Instant>) -> bool {
        let now = now.unwrap_or_else(time::now);
        let link = (part.from.node, part.from.shard, part.from.inc);
        self.any_direct_copy(part, |moves, client_id, topic| {
            moves.holds(client_id, link, part.routed_at, topic, now)
        })
    }

    /// Whether `f` says yes for some direct (not relayed, not shared) copy of the part and
    /// a session here it is for: the moves, its client id and the copy's topic.
    fn any_direct_copy(
        &mut self,
        part: &ForwardedPart,
        mut f: impl FnMut(&Moves, &str, &str) -> bool,
    ) -> bool {
        part.messages
            .iter()
            .filter(|(_, g)| g.is_none())
            .any(|(msg, _)| {
                let mut yes = false;
                self.for_each_plain(&msg.topic, |me, slot, _| {
                    yes = yes || f(&me.moving.moves, me.destinations.key(slot), &msg.topic);
                });
                yes
            })
    }

    /// Routes `topic` to every subscription here (online or not, no shared member picked)
    /// and hands `f` each plain (not shared) delivery: which sessions here a copy on that
    /// topic is for, as the moves judge them.
    fn for_each_plain(&mut self, topic: &str, mut f: impl FnMut(&mut Self, Slot, SubOpts)) {
        let pctx = PublishContext {
            random: 0,
            publisher_hash: 0,
        };
        let mut merged = std::mem::take(&mut self.merged);
        self.router.route_merged(
            topic,
            &pctx,
            |_| true,
            &mut self.scratch,
            &mut merged,
            |a, b| a == b,
        );
        for d in merged.drain(..) {
            if !matches!(d.kind, DeliveryKind::Shared { .. }) {
                f(self, d.subscriber, d.options);
            }
        }
        self.merged = merged;
    }

    /// A release for order came for `client_id`'s move: from its old node, what it relayed
    /// of the link `link` on `topic` came before this; from its new node, a request for
    /// the release of that node's own link, answered behind what this node relayed of it.
    pub(super) fn order_released(
        &mut self,
        client_id: &Arc<str>,
        (epoch, link): (u64, LinkKey),
        topic: Arc<str>,
    ) {
        match self
            .moving
            .moves
            .release(client_id, epoch, link, topic.clone())
        {
            Release::Taken => self.moving.released = true,
            Release::Asked(to, epoch) => {
                // The session came here, and moved on, before the node it came from
                // released this link and topic: that node's relays of the link's earlier
                // copies still come through here. The answer goes behind them.
                let now = time::now();
                let waits = self.moving.asks_waiting.len() < ASKS_WAITING_MAX
                    && (self.moving.asks_waiting.iter().any(|w| w.3 == topic)
                        || self
                            .moving
                            .moves
                            .holds(client_id, link, u64::MAX, &topic, now));
                if waits {
                    let ask = (client_id.clone(), (to, epoch), link, topic);
                    self.moving.asks_waiting.push_back(ask);
                } else {
                    self.send_release(client_id, (to, epoch), link, topic);
                }
            }
            Release::Unknown => {}
        }
    }

    /// Sends node `to` a release (or a request for one) of `link` on `topic` for the move
    /// of `client_id` by claim `epoch`.
    fn send_release(
        &mut self,
        client_id: &Arc<str>,
        (to, epoch): (u64, u64),
        link: LinkKey,
        topic: Arc<str>,
    ) {
        let Some(key) = self.node_destination(to) else {
            return;
        };
        let release = Arc::new(Message {
            topic,
            payload: bytes::Bytes::new(),
            qos: starling_codec::QoS::AtMostOnce,
            retain: false,
            properties: Default::default(),
            expires_at: None,
            publisher: None,
            shared_headers: Default::default(),
            received_at: None,
        });
        let mark = release_mark(client_id, epoch, link);
        self.offer_node(&key, &release, Some(mark), None);
    }

    /// A publish of this node's: routed now, or kept back while a session that moved here
    /// waits for its old node's release of this shard's link on its topic (the copies of
    /// this node's earlier publishes went there, and are relayed back).
    pub(super) fn publish_local(
        &mut self,
        m: Arc<Message>,
        from: Option<Publisher>,
        ack: Option<Box<AckTo>>,
        ctx: &mut Ctx<Self>,
    ) {
        let may = self.moving.moves.may_hold()
            || !self.moving.kept_local.is_empty()
            || self.moving.moves.any_arriving();
        let now = may.then(time::now);
        if let Some(now) = now.filter(|&now| self.holds_local(&m, now, true, now)) {
            self.moving.kept_local.push_back((m, from, ack, now));
            self.arm_moves_check(ctx);
            return;
        }
        self.publish_acked(m, from, ack, ctx);
    }

    /// Whether a publish of this node's, kept back since `came`, waits: one before it on its
    /// topic waits; a session it is for came here and has not installed its subscriptions
    /// yet (at most [`RELAY_WAIT`]: delivered now, it would go to the destination the
    /// session that left had here, and be lost); or a session that moved here holds its
    /// copy back for order (asking its old node for the release, once per topic, when
    /// `ask`).
    fn holds_local(&mut self, m: &Arc<Message>, came: Instant, ask: bool, now: Instant) -> bool {
        let kept = &self.moving.kept_local;
        if kept.len() >= LOCAL_KEPT_MAX {
            return false;
        }
        if kept.iter().any(|(k, ..)| k.topic == m.topic) {
            return true;
        }
        let arriving =
            self.moving.moves.any_arriving() && now.saturating_duration_since(came) < RELAY_WAIT;
        let order = self.moving.moves.may_hold();
        if !arriving && !order {
            return false;
        }
        let Some(me) = self.cluster.as_ref().map(|c| c.node) else {
            return false;
        };
        let link = (me, self.index as u16, self.link_inc);
        let at = self.routed_at();
        let mut held = false;
        self.for_each_plain(&m.topic, |me, slot, _| {
            let client_id = me.destinations.key(slot).clone();
            if arriving && me.moving.moves.arriving(&client_id) {
                held = true;
            }
            if !order || !me.moving.moves.holds(&client_id, link, at, &m.topic, now) {
                return;
            }
            held = true;
            if let Some((epoch, old)) = ask
                .then(|| me.moving.moves.ask(&client_id, &m.topic))
                .flatten()
            {
                me.send_release(&client_id, (old, epoch), link, m.topic.clone());
            }
        });
        held
    }

    fn route_part(&mut self, part: ForwardedPart, ctx: &mut Ctx<Self>) {
        let ForwardedPart {
            from,
            routed_at,
            messages,
            done,
        } = part;
        self.moving.forwarded_at = Some(routed_at);
        self.moving.forwarded_from = Some(from);
        for (m, group) in messages {
            self.forwarded(m, group.as_ref(), from, ctx);
        }
        if let Some(key) = self.park_from.take() {
            self.park_forwarded_on(key, &ctx.weak_addr());
        }
        self.moving.forwarded_at = None;
        self.moving.forwarded_from = None;
        self.link_barrier(from.node, done);
    }

    /// Routes the batches kept back that this shard can judge now, in each node's order.
    pub(super) fn route_kept(&mut self, ctx: &mut Ctx<Self>) {
        if self.moving.kept.is_empty() && self.moving.kept_local.is_empty() {
            self.answer_asks(time::now());
            return;
        }
        let now = time::now();
        self.route_kept_local(now, ctx);
        loop {
            // A release routed in this pass may free a batch looked at before it.
            self.moving.released = false;
            let mut waiting = VecDeque::new();
            let mut blocked: Vec<u64> = Vec::new();
            for (part, came) in std::mem::take(&mut self.moving.kept) {
                let node = part.from.node;
                let waited = now.saturating_duration_since(came) >= RELAY_WAIT;
                if blocked.contains(&node) || !self.can_judge(&part, waited, Some(now)) {
                    if !blocked.contains(&node) {
                        blocked.push(node);
                    }
                    waiting.push_back((part, came));
                } else {
                    self.route_part(*part, ctx);
                }
            }
            // Routing may not keep anything back itself: nothing was added meanwhile.
            debug_assert!(self.moving.kept.is_empty());
            self.moving.kept = waiting;
            let released = self.moving.released;
            self.route_kept_local(now, ctx);
            if !released || self.moving.kept.is_empty() {
                break;
            }
        }
        self.moving.released = false;
        self.answer_asks(now);
    }

    /// Answers the requests for a release whose link and topic this node holds back no
    /// more, in order: behind what it relayed of them meanwhile.
    fn answer_asks(&mut self, now: Instant) {
        if self.moving.asks_waiting.is_empty() {
            return;
        }
        let mut waiting = std::mem::take(&mut self.moving.asks_waiting);
        let mut still = VecDeque::new();
        while let Some((client_id, to, link, topic)) = waiting.pop_front() {
            let before = still.iter().any(|w: &AskWaiting| w.3 == topic);
            if before
                || self
                    .moving
                    .moves
                    .holds(&client_id, link, u64::MAX, &topic, now)
            {
                still.push_back((client_id, to, link, topic));
            } else {
                self.send_release(&client_id, to, link, topic);
            }
        }
        self.moving.asks_waiting = still;
    }

    /// Routes this node's publishes kept back for order that wait no more, in order.
    fn route_kept_local(&mut self, now: Instant, ctx: &mut Ctx<Self>) {
        if self.moving.kept_local.is_empty() {
            return;
        }
        let mut kept = std::mem::take(&mut self.moving.kept_local);
        let mut waiting = VecDeque::new();
        while let Some((m, from, ack, came)) = kept.pop_front() {
            // `holds_local` looks at `kept_local`: the ones still waiting, before this one.
            self.moving.kept_local = std::mem::take(&mut waiting);
            let held = self.holds_local(&m, came, false, now);
            waiting = std::mem::take(&mut self.moving.kept_local);
            if held {
                waiting.push_back((m, from, ack, came));
            } else {
                self.publish_acked(m, from, ack, ctx);
            }
        }
        self.moving.kept_local = waiting;
    }

    pub(super) fn moving_is_empty(&self) -> bool {
        self.moving.moves.is_empty()
    }

    /// A session subscribes here (to `filters`): one that moved here can take the copies
    /// relayed to it from now on (its subscriptions are installed). Whether it had moved
    /// here.
    pub(super) fn moving_installed(
        &mut self,
        client_id: &str,
        filters: &[SubscribeRequest],
    ) -> bool {
        if self.moving.moves.is_empty() {
            return false;
        }
        let limits = &self.shared.topic_limits;
        self.moving.moves.installed(client_id, || {
            filters
                .iter()
                .filter_map(|r| parse_subscription(&r.filter, limits).ok())
                .filter(|p| !matches!(p.extension, Extension::Shared { .. }))
                .map(|p| p.filter.to_string())
                .collect()
        })
    }

    /// A session subscribes here that did not come by a hand-over, after one of its client
    /// id left and ended here (`Moves::superseded`): the old one's relay goes, but for the
    /// filters the new one subscribes to now.
    pub(super) fn moving_superseded(&mut self, client_id: &Arc<str>, filters: &[SubscribeRequest]) {
        if self.moving.moves.is_empty() {
            return;
        }
        let Some(relay) = self.moving.moves.superseded(client_id) else {
            return;
        };
        debug!(client_id = %client_id, "a new session here ends the relay of the one that left");
        for f in relay
            .iter()
            .filter(|f| !filters.iter().any(|r| &r.filter == *f))
        {
            let _ = self.unsubscribe(client_id, f);
        }
        self.persist_moves();
    }

    /// The log applied the routes up to `index`.
    pub(super) fn routes_applied(&mut self, index: u64, ctx: &mut Ctx<Self>) {
        self.moving.routes_at = self.moving.routes_at.max(index);
        self.route_kept(ctx);
    }

    /// The log applied a move's cut.
    pub(super) fn cut(
        &mut self,
        (client_id, node, epoch): (Arc<str>, u64, u64),
        index: u64,
        ctx: &mut Ctx<Self>,
    ) {
        if let Some(me) = self.cluster.as_ref().map(|c| c.node) {
            let now = time::now();
            self.moving
                .moves
                .cut(&client_id, (node, epoch), index, me, now);
            self.persist_moves();
        }
        self.routes_applied(index, ctx);
    }

    /// A session handed over by node `from` for this node's claim `epoch` subscribes next.
    pub(super) fn moved_in(
        &mut self,
        client_id: Arc<str>,
        (epoch, from): (u64, u64),
        ctx: &mut Ctx<Self>,
    ) {
        let config = &self.shared.config.cluster;
        if self.cluster.is_none() || !config.handover_relay {
            return;
        }
        let order = config.handover_order;
        // Back before its relay here went: the relay's subscriptions are its own again
        // (it subscribes to the same filters).
        self.moving
            .moves
            .came(client_id.clone(), epoch, time::now());
        self.persist_moves();
        if order {
            self.moving.moves.keep_order(&client_id, from);
        }
        self.arm_moves_check(ctx);
        // Copies relayed to it may have come before it did.
        self.route_kept(ctx);
    }

    /// The session of `client_id` is being handed over to `to` (node, claim's epoch):
    /// what is routed to it from now on is relayed there.
    pub(super) fn moved_away(&mut self, client_id: Arc<str>, to: (u64, u64), ctx: &mut Ctx<Self>) {
        if self.cluster.is_none() || !self.shared.config.cluster.handover_relay {
            return;
        }
        let now = time::now();
        self.moving.moves.went(client_id, to.0, to.1, now);
        self.persist_moves();
        self.arm_moves_check(ctx);
    }

    /// The session of `client_id` (its actor `actor`) ended here. Returns the filters to
    /// take down now: all of them; or, for one handed over (`moved_away`), its shared ones
    /// only (a group's member is picked per node, and this node has none left), the others
    /// staying as its relay; what waited here for it is relayed too.
    pub(super) fn session_left(
        &mut self,
        client_id: &Arc<str>,
        filters: Vec<String>,
        actor: starling_rt::ActorId,
    ) -> Vec<String> {
        if !self.moving.moves.relays(client_id) {
            self.moving.moves.ended(client_id);
            self.persist_moves();
            return filters;
        }
        let (shared, relay): (Vec<String>, Vec<String>) =
            filters.into_iter().partition(|f| self.is_shared(f));
        self.moving.moves.relay_filters(client_id, relay);
        self.persist_moves();
        let waiting = match self.destinations.get_mut(client_id) {
            Some(crate::destination::Destination::Local(l)) if l.addr.id() == actor => {
                l.pending.drain_messages()
            }
            _ => Vec::new(),
        };
        for m in waiting {
            self.relay_routed(client_id, &m);
        }
        shared
    }

    /// A delivery routed to the session of `client_id` before its relay here began, and
    /// not handed to it (it waited here, or for its record's commit): relayed, if the
    /// session is being handed over. Whether it was.
    pub(super) fn relay_routed(&mut self, client_id: &Arc<str>, msg: &Arc<Message>) -> bool {
        // Its own, wherever the session is now: judged as a relayed copy.
        match self
            .moving
            .moves
            .verdict(client_id, 0, Via::Held, time::now())
        {
            Some(Verdict::Relay(to, epoch)) => {
                let prior = self.moving.forwarded_at.replace(0);
                self.relay(msg, (client_id, epoch), to, None);
                self.moving.forwarded_at = prior;
                true
            }
            _ => false,
        }
    }

    /// Every other member has nothing it routed here before `at` on its way any more
    /// (the cluster actor's `through`): the moves whose cut is no later end after their
    /// grace. Without `cluster.handover_relay_wait`, they end with it whatever may come.
    pub(super) fn through(&mut self, at: u64, ctx: &mut Ctx<Self>) {
        let wait = self.shared.config.cluster.handover_relay_wait;
        self.moving_through(if wait { at } else { u64::MAX });
        // Judgements restored at the start wait for their end from here.
        self.arm_moves_check(ctx);
    }

    /// Stores what changed in the judgements of moves (`moving::record`): a node that
    /// restarts goes on relaying for the sessions that left it, and judging the cuts of
    /// those that came.
    fn persist_moves(&mut self) {
        let dirty = self.moving.moves.take_dirty();
        if self.store.is_none() {
            return;
        }
        let shard = self.index as u16;
        for (client_id, record) in dirty {
            let client_id = client_id.to_string();
            let op = match record {
                Some(record) => starling_store::Op::PutMove {
                    shard,
                    client_id,
                    record,
                },
                None => starling_store::Op::DropMove { shard, client_id },
            };
            self.to_store.push(op.into());
        }
    }

    /// Takes back the judgements of moves the store kept, every shard's row of a session
    /// together (`moving::record`), and drops the rows of shards this run does not have.
    pub(super) fn restore_moves(&mut self, kept: &[(u16, String, Vec<u8>)]) {
        let now = time::now();
        let mut by_client: std::collections::BTreeMap<&str, Vec<Vec<u8>>> = Default::default();
        for (_, client_id, record) in kept {
            by_client
                .entry(client_id.as_str())
                .or_default()
                .push(record.clone());
        }
        for (client_id, records) in by_client {
            if !self
                .moving
                .moves
                .restore(Arc::from(client_id), &records, now)
            {
                warn!(
                    client_id,
                    "a stored judgement of a move this build cannot read: dropped"
                );
            }
        }
        let count = self.map.count();
        if self.index == 0 {
            for (shard, client_id, _) in kept.iter().filter(|(s, ..)| usize::from(*s) >= count) {
                let client_id = client_id.clone();
                let op = starling_store::Op::DropMove {
                    shard: *shard,
                    client_id,
                };
                self.to_store.push(op.into());
            }
        }
        self.persist_moves();
    }

    /// A copy another node forwarded, routed before the cut of a session that left this
    /// node before it restarted: relayed to where that session went, if its relay's
    /// filters match (they are not in the router: `moving::record`).
    pub(super) fn relay_restored(&mut self, msg: &Arc<Message>) {
        let at = self.routed_at();
        let limits = &self.shared.topic_limits;
        for (client_id, to, epoch) in self.moving.moves.restored_relays(&msg.topic, at, limits) {
            self.relay(msg, (&client_id, epoch), to, None);
        }
    }

    pub(super) fn moving_through(&mut self, at: u64) {
        self.moving.moves.through(at);
    }

    /// What this shard still holds for other nodes, for the cluster actor's round
    /// `round`: the routes' index it routes under, and per node the oldest routes' index
    /// of a copy it holds for it (to be sent, sent and not acknowledged, parked). A batch
    /// kept back here may yet be relayed or passed on under its own older index: it
    /// counts for every node.
    pub(super) fn ask_through(&mut self, round: u64) {
        let Some(c) = self.cluster.as_ref() else {
            return;
        };
        let floor = self
            .moving
            .kept
            .iter()
            .map(|(p, _)| p.routed_at)
            .fold(self.moving.routes_at, u64::min);
        let oldest = self
            .remote_nodes
            .iter()
            .filter_map(|&node| {
                let at = match self.destinations.get(&crate::destination::remote_key(node)) {
                    Some(crate::destination::Destination::Remote(r)) => r.oldest_routed_at()?,
                    _ => return None,
                };
                (at < floor).then_some((node, at))
            })
            .collect();
        let msg = crate::msg::ClusterMsg::ShardThrough {
            shard: self.index,
            round,
            routes_at: floor,
            oldest,
        };
        // A round that misses an answer is asked again at the cluster actor's next tick.
        let _ = c.actor.try_send(msg);
    }

    fn arm_moves_check(&mut self, ctx: &mut Ctx<Self>) {
        let busy = !self.moving.moves.is_empty()
            || !self.moving.kept.is_empty()
            || !self.moving.kept_local.is_empty()
            || !self.moving.asks_waiting.is_empty();
        if self.moving.timer.is_none() && busy {
            self.moving.timer = Some(ctx.after(CHECK_EVERY, RouterMsg::MovesCheck));
        }
    }

    /// Sessions relayed from here that a copy may still come for (`Moves::relays_awaited`).
    pub(super) fn relays_awaited(&self) -> usize {
        self.moving.moves.relays_awaited()
    }

    /// Ends the judgements whose time is up: a relay that goes takes its subscriptions
    /// down (and with them, this node's routes for them).
    pub(super) fn moves_check(&mut self, ctx: &mut Ctx<Self>) {
        self.moving.timer = None;
        let (gone, cut_short) = self.moving.moves.expire(time::now());
        if cut_short > 0 {
            add(
                &self.shared.metrics.cluster_handover_cut_short,
                cut_short as u64,
            );
            warn!(
                cut_short,
                "moves waiting for a member to be through with their cut ended at the bound"
            );
        }
        for (client_id, filters) in gone {
            debug!(client_id = %client_id, "a moved session's relay ends here");
            for f in filters {
                let _ = self.unsubscribe(&client_id, &f);
            }
        }
        self.persist_moves();
        self.route_kept(ctx);
        self.arm_moves_check(ctx);
    }

    /// Whether a delivery of `msg` to `subscriber` goes on as any other; if not, it was
    /// relayed to the session's new node, or dropped for another copy.
    pub(super) fn judge_move(
        &mut self,
        msg: &Arc<Message>,
        subscriber: Slot,
        kind: &DeliveryKind,
        from: Option<&Publisher>,
    ) -> bool {
        if self.moving.moves.is_empty() || matches!(kind, DeliveryKind::Shared { .. }) {
            return true;
        }
        let now = time::now();
        let v = self.moving.moves.verdict(
            self.destinations.key(subscriber),
            self.routed_at(),
            Via::Direct,
            now,
        );
        let go_on = match v {
            None => return true,
            Some(Verdict::Deliver) => true,
            Some(Verdict::Skip) => false,
            Some(Verdict::Relay(to, epoch)) => {
                let subscriber = self.destinations.key(subscriber).clone();
                self.relay(msg, (&subscriber, epoch), to, from);
                false
            }
        };
        // Whichever way this copy goes, it may tell a node the session went to from here
        // that this link's earlier copies are all on their way.
        self.release_for_order(msg, subscriber, now);
        go_on
    }

    /// A forwarded copy for a session that moved away from here, routed past that move's
    /// cut (or past the cut of an earlier move away, the session back since): the node it
    /// went to may hold such copies of the same link and topic back until this node
    /// relayed what came before, so it is told (once per move, link and topic), behind
    /// those relays.
    fn release_for_order(&mut self, msg: &Arc<Message>, subscriber: Slot, now: Instant) {
        let Some(from) = self.moving.forwarded_from else {
            return;
        };
        let link = (from.node, from.shard, from.inc);
        let client_id = self.destinations.key(subscriber).clone();
        let at = self.routed_at();
        let marked = self
            .moving
            .moves
            .mark(&client_id, link, at, &msg.topic, now);
        for to in marked {
            self.send_release(&client_id, to, link, msg.topic.clone());
        }
    }

    /// Sends a copy on to the node a session moved to, marked for it.
    fn relay(
        &mut self,
        msg: &Arc<Message>,
        (client_id, epoch): (&Arc<str>, u64),
        to: u64,
        from: Option<&Publisher>,
    ) {
        let Some(key) = self.node_destination(to) else {
            return;
        };
        let held = from.filter(|_| msg.qos != starling_codec::QoS::AtMostOnce);
        self.offer_node(&key, msg, Some(relay_mark(client_id, epoch)), held);
    }

    /// A copy another node relayed to the session of `client_id`: delivered under the
    /// session's own subscriptions here, or sent on if it moved on again.
    pub(super) fn relayed(
        &mut self,
        msg: Arc<Message>,
        (client_id, epoch): (&Arc<str>, u64),
        node: u64,
        ctx: &mut Ctx<Self>,
    ) {
        let slot = self.destinations.slot(client_id);
        let mut mine = None;
        self.for_each_plain(&msg.topic, |_, s, opts| {
            if mine.is_none() && Some(s) == slot {
                mine = Some((s, opts));
            }
        });
        let Some((subscriber, opts)) = mine else {
            // Its session here ended, or took the matching subscription back meanwhile.
            add(&self.shared.metrics.dropped_other, 1);
            debug!(client_id = %client_id, topic = %msg.topic, "a relayed copy found no subscription of its session");
            return;
        };
        match self.moving.moves.verdict(
            client_id,
            self.routed_at(),
            Via::Relayed(epoch),
            time::now(),
        ) {
            None | Some(Verdict::Deliver) => {
                let mut qos0 = Qos0Tally::default();
                let source = Source::Forwarded(node);
                self.offer(&msg, subscriber, opts.0, source, &mut qos0, ctx);
            }
            Some(Verdict::Relay(to, epoch)) => self.relay(&msg, (client_id, epoch), to, None),
            Some(Verdict::Skip) => {}
        }
    }
}
