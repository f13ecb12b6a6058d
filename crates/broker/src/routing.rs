//! The router actor: owns the subscription trie, the retained store and the `$delayed/`
//! timers; fans each publish out to the subscribers' client actors.
//!
//! Deliveries are batched: a publish appends to each subscriber's pending list here, and
//! once the router's mailbox is drained (or every [`FLUSH_EVERY_PUBLISHES`]) each pending
//! list goes to its client actor as one message, so a burst costs one mailbox operation
//! and one actor turn per subscriber, not per delivery.
//!
//! It never waits on a client: batches are `try_send`s into bounded mailboxes. A full
//! mailbox leaves the batch pending here and it is retried on the next flush (or after
//! [`RETRY_BLOCKED`]); the pending list is bounded by the session queue length
//! (`max_mqueue_len`) and, when full, applies the session's drop policy and counts the drop
//! (a slow subscriber costs itself, not the others). So a QoS 1/2 message is not lost to a
//! momentarily busy client actor: it reaches the session's own queue, whose policy decides.
//! Publishers do wait on the router (`send`), which is the back-pressure that reaches a
//! fast publisher's socket. And a QoS 1/2 publish that reaches a subscriber whose queue is
//! backed up marks its publisher to be held back until that subscriber drains (see
//! [`crate::flow`]), so a flood slows to the subscriber's pace instead of being dropped.

use std::collections::HashMap;

use foldhash::fast::FixedState;
use std::sync::Arc;
use std::time::Duration;

use rand::RngCore;
use starling_codec::{QoS, ReasonCode, SubscriptionOptions};
use starling_router::{
    parse_delayed, parse_subscription, Delayed, DeliveryKind, PublishContext, RetainedIndex,
    Router, RouterError, DELAYED_PREFIX,
};
use starling_rt::{rng, Actor, Ctx, TimerId, TrySendError, WeakAddr};
use starling_session::{DeliveryOptions, Message, QueueFullPolicy, SubscribeRequest};
use tracing::debug;

use crate::flow::Flow;
use crate::metrics::add;
use crate::msg::{ClientMsg, Delivery, RouterMsg, RouterStats, SubscribeResult};
use crate::settings::Shared;

/// Subscription options as the router stores them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SubOpts {
    options: SubscriptionOptions,
    subscription_id: Option<u32>,
}

/// Publishes routed before the pending batches are handed out even though more publishes
/// wait in the mailbox: bounds the delay a steady stream of publishes adds to a delivery.
const FLUSH_EVERY_PUBLISHES: usize = 64;
/// Deliveries per batch message: with the client mailbox's capacity this bounds what one
/// client's mailbox holds.
pub(crate) const BATCH_MAX: usize = 64;
/// When a client's mailbox was full and no publish comes to trigger a flush.
const RETRY_BLOCKED: Duration = Duration::from_millis(2);

pub(crate) struct RouterActor {
    shared: Arc<Shared>,
    router: Router<Arc<str>, SubOpts>,
    retained: RetainedIndex<Arc<Message>>,
    /// Looked up once per delivery: foldhash, seeded from the runtime (SipHash was ~240
    /// instructions of each delivery).
    clients: HashMap<Arc<str>, Client, FixedState>,
    delayed: usize,
    rng: starling_rt::rng::Rng,
    /// Reused per publish.
    out: Vec<starling_router::Delivery<Arc<str>, SubOpts>>,
    /// Reused per publish: one entry per subscriber after merging overlaps.
    merged: Vec<(Arc<str>, DeliveryOptions)>,
    /// Clients with a non-empty pending batch, each once.
    dirty: Vec<Arc<str>>,
    /// Publishes routed since the last flush.
    routed: usize,
    /// Armed while some client's batch waits for room in its mailbox.
    retry: Option<TimerId>,
    /// Bound of one client's pending list (the session queue length, at least a batch).
    pending_max: usize,
}

struct Client {
    addr: WeakAddr<ClientMsg>,
    online: bool,
    /// Deliveries routed to this client and not yet handed to its actor, oldest first.
    pending: Vec<Delivery>,
    /// QoS 0 deliveries in `pending`: a full list is searched for one to evict only if there
    /// is one.
    pending_qos0: usize,
    /// Set by the client after each turn: whether its session refuses more (its deliveries
    /// are then dropped here rather than handed over to be dropped there) and whether it
    /// holds back its publishers.
    flow: Arc<Flow>,
}

impl RouterActor {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        let mut rng = rng::rng();
        // Seeds drawn from the runtime: deterministic under simulation, secret otherwise.
        let router = Router::new(shared.router_config(rng.next_u64()));
        let retained = RetainedIndex::new(shared.retained_config(rng.next_u64()));
        let pending_max = shared.limits.mqueue_len_max.max(BATCH_MAX);
        Self {
            shared,
            router,
            retained,
            clients: HashMap::with_hasher(FixedState::with_seed(rng.next_u64())),
            delayed: 0,
            rng,
            out: Vec::new(),
            merged: Vec::new(),
            dirty: Vec::new(),
            routed: 0,
            retry: None,
            pending_max,
        }
    }

    fn publish(&mut self, msg: Arc<Message>, from: Option<Arc<Flow>>, ctx: &mut Ctx<Self>) {
        if msg.topic.starts_with(DELAYED_PREFIX) {
            self.schedule(&msg, ctx);
            return;
        }
        if msg.retain {
            self.store_retained(&msg);
        }
        let pctx = PublishContext {
            random: self.rng.next_u64(),
            publisher_hash: msg
                .publisher
                .as_deref()
                .map_or(0, |p| self.router.publisher_hash(p)),
        };
        let clients = &self.clients;
        let mut out = std::mem::take(&mut self.out);
        let sources = self.router.route(
            &msg.topic,
            &pctx,
            |s| clients.get(s).is_some_and(|c| c.online),
            &mut out,
        );
        // MQTT 5 §3.3.4: one copy per subscriber for its overlapping subscriptions, at the
        // highest QoS, carrying every Subscription Identifier. Shared deliveries stay apart.
        let mut merged = std::mem::take(&mut self.merged);
        for d in out.drain(..) {
            let opts = DeliveryOptions::subscription(&d.options.options, d.options.subscription_id);
            // One source: every non-shared subscriber is distinct (no look-back needed).
            let plain = sources > 1 && !matches!(d.kind, DeliveryKind::Shared { .. });
            let same = if plain {
                merged
                    .iter_mut()
                    .rev()
                    .take(MERGE_WINDOW)
                    .find(|(s, _)| Arc::ptr_eq(s, &d.subscriber) || *s == d.subscriber)
            } else {
                None
            };
            match same {
                Some((_, o)) => merge(o, opts),
                None => merged.push((d.subscriber, opts)),
            }
        }
        for (subscriber, mut opts) in merged.drain(..) {
            let Some(client) = self.clients.get_mut(&subscriber) else {
                continue;
            };
            if let Some(from) = &from {
                // Held back for a QoS 1/2 delivery to an online subscriber only, and never
                // by itself. What waits here and in its mailbox counts: its own flag shows
                // a flood only after its next turn, too late for what is routed meanwhile.
                let f = &client.flow;
                if !is_qos0(&msg, &opts)
                    && client.online
                    && !Arc::ptr_eq(from, f)
                    && !f.is_stuck()
                    && f.may_hold()
                    && (f.backlogged()
                        || f.waiting() + client.pending.len() >= self.shared.limits.backlog_high())
                {
                    f.set_backlogged();
                    from.hold_for(f);
                    // Read and acknowledged before the hold reached its publisher: kept
                    // past the queue bound (up to the hard bound) rather than dropped.
                    opts.held_back = true;
                }
            }
            if client.flow.saturated() && !opts.held_back {
                // What the session would do with it, without the trip.
                add(&self.shared.metrics.dropped_queue_full, 1);
                continue;
            }
            if client.pending.is_empty() {
                self.dirty.push(subscriber.clone());
            }
            let bound = if opts.held_back {
                self.shared.limits.mqueue_len_hard()
            } else {
                self.pending_max
            };
            if client.pending.len() >= bound
                && !make_room(client, &msg, &opts, self.shared.limits.mqueue_policy)
            {
                add(&self.shared.metrics.dropped_mailbox_full, 1);
                debug!(client_id = %subscriber, topic = %msg.topic, "delivery dropped: client behind");
                continue;
            }
            if is_qos0(&msg, &opts) {
                client.pending_qos0 += 1;
            }
            client.pending.push((msg.clone(), opts));
            debug_assert_eq!(
                client.pending_qos0,
                client.pending.iter().filter(|(m, o)| is_qos0(m, o)).count()
            );
        }
        self.routed += 1;
        self.out = out;
        self.merged = merged;
    }

    /// Hands each pending batch to its client actor; a full mailbox keeps the batch here
    /// for the next flush or the retry timer.
    fn flush(&mut self, ctx: &mut Ctx<Self>) {
        self.routed = 0;
        let mut blocked = 0;
        let mut i = 0;
        while i < self.dirty.len() {
            let Some(client) = self.clients.get_mut(&self.dirty[i]) else {
                self.dirty.swap_remove(i);
                continue;
            };
            let mut kept = false;
            while !client.pending.is_empty() {
                let batch: Vec<Delivery> = if client.pending.len() <= BATCH_MAX {
                    std::mem::take(&mut client.pending)
                } else {
                    client.pending.drain(..BATCH_MAX).collect()
                };
                let batch_qos0 = batch.iter().filter(|(m, o)| is_qos0(m, o)).count();
                let n = batch.len();
                match client.addr.try_send(ClientMsg::Deliver(batch)) {
                    Ok(()) => {
                        client.pending_qos0 -= batch_qos0;
                        client.flow.handed(n);
                    }
                    Err(TrySendError::Full(ClientMsg::Deliver(mut batch))) => {
                        // Back in front, order kept.
                        batch.append(&mut client.pending);
                        client.pending = batch;
                        kept = true;
                        break;
                    }
                    // Gone (its session ended): nothing to deliver to.
                    Err(_) => {
                        client.pending.clear();
                        client.pending_qos0 = 0;
                    }
                }
            }
            if kept {
                blocked += 1;
                i += 1;
            } else {
                self.dirty.swap_remove(i);
            }
        }
        if blocked > 0 && self.retry.is_none() {
            self.retry = Some(ctx.after(RETRY_BLOCKED, RouterMsg::RetryBlocked));
        }
    }

    fn store_retained(&mut self, msg: &Arc<Message>) {
        let size = msg.topic.len() + msg.payload.len();
        let stored = self
            .retained
            .publish(&msg.topic, msg.clone(), msg.payload.is_empty(), size);
        if let Err(e) = stored {
            add(&self.shared.metrics.retained_refused, 1);
            debug!(topic = %msg.topic, error = %e, "retained message refused");
        }
    }

    /// `$delayed/{secs}/{topic}`: publish `topic` after `secs` seconds.
    fn schedule(&mut self, msg: &Arc<Message>, ctx: &mut Ctx<Self>) {
        let m = &self.shared.config.mqtt;
        let parsed = parse_delayed(&msg.topic, &self.shared.topic_limits, m.delayed_max_secs);
        let Ok(Some(Delayed { secs, target })) = parsed else {
            add(&self.shared.metrics.delayed_refused, 1);
            debug!(topic = %msg.topic, ?parsed, "malformed $delayed publish dropped");
            return;
        };
        if self.delayed >= m.delayed_publish_max as usize {
            add(&self.shared.metrics.delayed_refused, 1);
            debug!(topic = %msg.topic, max = m.delayed_publish_max, "$delayed publish dropped: too many pending");
            return;
        }
        let mut due = Message::clone(msg);
        due.topic = Arc::from(target);
        self.delayed += 1;
        ctx.after(
            Duration::from_secs(u64::from(secs)),
            RouterMsg::DelayedDue(Arc::new(due)),
        );
    }

    fn subscribe(
        &mut self,
        client_id: Arc<str>,
        client: WeakAddr<ClientMsg>,
        flow: Arc<Flow>,
        filters: Vec<SubscribeRequest>,
    ) -> SubscribeResult {
        let entry = self.clients.entry(client_id.clone()).or_insert(Client {
            addr: client.clone(),
            online: true,
            pending: Vec::new(),
            pending_qos0: 0,
            flow: flow.clone(),
        });
        entry.addr = client;
        entry.flow = flow;
        let mut res = SubscribeResult::default();
        for req in filters {
            let opts = SubOpts {
                options: req.options,
                subscription_id: req.subscription_id,
            };
            match self.router.subscribe(client_id.clone(), &req.filter, opts) {
                Ok(old) => {
                    res.results.push(Ok(req.options.qos));
                    if req.wants_retained(old.is_none()) {
                        let plain = parse_subscription(&req.filter, &self.shared.topic_limits)
                            .map(|s| s.filter)
                            .unwrap_or(&req.filter);
                        let options = DeliveryOptions::retained(&req.options, req.subscription_id);
                        if let Ok(found) = self.retained.matching(plain) {
                            for (_, m) in found {
                                res.retained.push((m.clone(), options.clone()));
                            }
                        }
                    }
                }
                Err(e) => {
                    debug!(client_id = %client_id, filter = %req.filter, error = %e, "subscribe refused");
                    res.results.push(Err(subscribe_refusal(&e)));
                }
            }
        }
        res
    }
}

/// How far back a delivery looks for the same subscriber to merge with: the trie yields one
/// subscriber's matches from different levels, not always adjacent; a bounded look-back
/// keeps a publish to many subscribers linear.
const MERGE_WINDOW: usize = 64;

/// Whether a delivery goes out at QoS 0.
fn is_qos0(m: &Message, o: &DeliveryOptions) -> bool {
    m.qos.min(o.qos) == QoS::AtMostOnce
}

/// A client's pending list is full: the session's drop policy picks a victim. True when
/// room was made (an older QoS 0 delivery evicted), false when the new one is to be dropped.
fn make_room(
    client: &mut Client,
    msg: &Message,
    opts: &DeliveryOptions,
    policy: QueueFullPolicy,
) -> bool {
    if client.pending_qos0 == 0 || is_qos0(msg, opts) || policy != QueueFullPolicy::DropOldestQos0 {
        return false;
    }
    match client.pending.iter().position(|(m, o)| is_qos0(m, o)) {
        Some(i) => {
            client.pending.remove(i);
            client.pending_qos0 -= 1;
            true
        }
        None => false,
    }
}

fn merge(into: &mut DeliveryOptions, other: DeliveryOptions) {
    into.qos = into.qos.max(other.qos);
    // Skip own messages only if every matching subscription says so.
    into.no_local &= other.no_local;
    into.retain_as_published |= other.retain_as_published;
    into.subscription_ids.extend(other.subscription_ids);
}

/// The one place a router refusal becomes a SUBACK code.
fn subscribe_refusal(e: &RouterError) -> ReasonCode {
    match e {
        RouterError::ExclusiveHeld
        | RouterError::LimitReached { .. }
        | RouterError::SubscriptionsFull { .. } => ReasonCode::QuotaExceeded,
        RouterError::RetainedFull { .. } | RouterError::RetainedBytesFull { .. } => {
            ReasonCode::ImplementationSpecificError
        }
        _ => ReasonCode::TopicFilterInvalid,
    }
}

impl Actor for RouterActor {
    type Msg = RouterMsg;

    async fn handle(&mut self, msg: RouterMsg, ctx: &mut Ctx<Self>) {
        match msg {
            RouterMsg::Publish(m, from) => self.publish(m, from, ctx),
            RouterMsg::DelayedDue(m) => {
                self.delayed = self.delayed.saturating_sub(1);
                self.publish(m, None, ctx);
            }
            RouterMsg::RetryBlocked => self.retry = None,
            RouterMsg::Subscribe {
                client_id,
                client,
                flow,
                filters,
                reply,
            } => {
                let r = self.subscribe(client_id, client, flow, filters);
                let _ = reply.send(r);
            }
            RouterMsg::Unsubscribe {
                client_id,
                filters,
                reply,
            } => {
                let codes = filters
                    .iter()
                    .map(|f| match self.router.unsubscribe(&client_id, f) {
                        Ok(Some(_)) => ReasonCode::Success,
                        Ok(None) => ReasonCode::NoSubscriptionExisted,
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
                for f in &filters {
                    let _ = self.router.unsubscribe(&client_id, f);
                }
                if self
                    .clients
                    .get(&client_id)
                    .is_some_and(|c| c.addr.id() == actor)
                {
                    self.clients.remove(&client_id);
                }
            }
            RouterMsg::Presence { client_id, online } => {
                if let Some(c) = self.clients.get_mut(&client_id) {
                    c.online = online;
                }
            }
            RouterMsg::Stats(reply) => {
                let _ = reply.send(RouterStats {
                    subscriptions: self.router.subscription_count(),
                    retained: self.retained.len(),
                    delayed: self.delayed,
                });
            }
        }
        // Hand out the batches once the burst is routed (nothing else waits in the mailbox),
        // or at a fixed stride under a steady stream.
        if !self.dirty.is_empty() && (self.routed >= FLUSH_EVERY_PUBLISHES || ctx.queued() == 0) {
            self.flush(ctx);
        }
    }
}
