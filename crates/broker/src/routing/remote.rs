//! A shard's part in the cluster: other nodes as destinations of the filters the replicated
//! routes list them for, publishes they forward, and the route transitions this shard
//! reports for the filters it is home to.
//!
//! Each publish matched here goes once to each node whose subscribers it matches (the
//! router's merge makes one delivery per subscriber key, and a node has one key); that
//! node matches it again against its own subscribers. A forwarded publish is delivered to
//! local subscribers only, so nothing travels twice.
//!
//! A QoS 1/2 publish whose publisher waits for its PUBACK/PUBREC is answered once every
//! node it went to acknowledged the batch holding it (and its own writes, if any, are
//! durable): a node acknowledges a batch once its shards took every message of it. A node
//! that does not acknowledge within the forward timeout (`cluster.forward_timeout_ms` past
//! `mqtt.backpressure_max_secs`: its link is down, it died) has the batch parked in the
//! outbox; without one (no store) that settles the wait as unconfirmed (MQTT 5: PUBACK
//! 0x80, so that the publisher may send it again; MQTT 3.x has no way to say it); a message
//! that found the node's queue full is refused (MQTT 5: 0x97).
//!
//! The outbox: a batch parked is written to the store, out of the node's window (its
//! publishers are released), and its publishers are answered once that is durable. It
//! stays where it was in the link's order and is sent again until the node acknowledges
//! it, so batches are never given up in the middle and the link has no gap. Past this
//! shard's share of `cluster.outbox_max_messages`, what is for that node is refused. After
//! a restart, the batches an earlier run parked go first, one at a time, as they were sent
//! (same shard, incarnation and number): the node takes each it did not take before and
//! acknowledges again one it did; the link's own batches wait until all are acknowledged.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use starling_router::{parse_subscription, Extension};
use starling_rt::{time, Ctx, WeakAddr};
use starling_session::{DeliveryOptions, Message, WallClock};
use tracing::{debug, warn};

use super::{RouterActor, Slot, SubOpts};
use crate::destination::{
    remote_key, Destination, Park, RemoteNode, Replay, SharedTo, REPLAY_AGAIN,
};
use crate::forward::LinkPos;
use crate::forward::RESEND_DAMP;
use crate::metrics::add;
use crate::msg::{
    AckTo, ClientMsg, ClusterMsg, LinkWrite, RouterMsg, ShardCluster, Stored, Waiter, WaiterTo,
};
use starling_store::{Op, OutboxBatch};

/// How often waiting batches are checked.
pub(super) const FORWARD_CHECK: Duration = Duration::from_secs(1);
/// How long a node may say nothing about batches it was sent before the oldest goes again.
const PROBE_AFTER: Duration = Duration::from_secs(1);

/// A publish being routed whose publisher waits: the nodes it was offered to.
pub(crate) struct FwdRoute {
    pub key: u64,
    pub(super) queued: u16,
    refused: u16,
}

impl FwdRoute {
    pub(crate) fn new(key: u64) -> Self {
        FwdRoute {
            key,
            queued: 0,
            refused: 0,
        }
    }

    pub(crate) fn count(&mut self, o: Offered) {
        match o {
            Offered::First | Offered::Queued => self.queued += 1,
            Offered::Dropped | Offered::OutboxFull => self.refused += 1,
        }
    }

    pub(crate) fn any(&self) -> bool {
        self.queued + self.refused > 0
    }
}

/// What became of a delivery offered to a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Offered {
    /// Queued, and the queue was empty (the node becomes dirty).
    First,
    Queued,
    /// The node's queue was full of messages that may not be dropped.
    Dropped,
    /// The node's part of the outbox is full (`cluster.outbox_max_messages`).
    OutboxFull,
}

/// Forwarded publishes that may not leave this node yet: each is a persistent publisher's
/// QoS 2 message whose packet identifier is not durable here. Were it forwarded first and
/// this node killed before the commit, the publisher's resend after the restart would find
/// no trace of the first routing and be routed again: delivered twice on the other nodes.
/// Batches to a node go in order, so the first closed key stops everything queued after
/// it, whoever published it (per-publisher order per topic across nodes).
#[derive(Debug, Default)]
pub(crate) struct FwdGate {
    /// Closed keys, increasing (keys are drawn in routing order).
    closed: VecDeque<u64>,
}

impl FwdGate {
    pub(crate) fn close(&mut self, key: u64) {
        debug_assert!(self.closed.back().is_none_or(|&k| k < key), "keys increase");
        self.closed.push_back(key);
    }

    /// Opens `key` (its writes are settled); whether that let anything more go.
    pub(crate) fn open(&mut self, key: u64) -> bool {
        match self.closed.iter().position(|&k| k == key) {
            Some(0) => {
                self.closed.pop_front();
                true
            }
            Some(i) => {
                self.closed.remove(i);
                false
            }
            None => false,
        }
    }

    /// The first key that may not go: it and every message queued after it wait.
    pub(crate) fn first(&self) -> Option<u64> {
        self.closed.front().copied()
    }
}

/// A publisher's publishes settled in one turn: (tag, outcome).
pub(crate) type Settled = Vec<(u32, Stored)>;

/// Whom a settled [`FwdAck`] answers.
pub(crate) enum FwdTo {
    /// The publisher.
    Client(AckTo),
    /// The barrier of a batch node `.0` forwarded here, through its write `.1`: a copy
    /// this shard relayed to a moving session's new node, or passed on for a shared
    /// group, from that batch (`forwarded_on`). The batch is acknowledged to its node
    /// only once the node it went on to took it too, or it was parked here.
    Link(u64, u64),
    /// Nothing waits: copies forwarded on from another node's batch by a node without a
    /// store, whose batch was answered as they were queued (`forwarded_on`). The entry
    /// counts the nodes that still owe an answer for them, and while it does, a batch
    /// holding them is kept in memory past the forward timeout, never given up.
    Kept,
}

/// A publisher's answer waiting for other nodes (and maybe the store).
pub(crate) struct FwdAck {
    to: FwdTo,
    nodes_left: u16,
    store_pending: bool,
    /// The worst outcome so far.
    outcome: Stored,
}

fn worse(a: Stored, b: Stored) -> Stored {
    match (a, b) {
        (Stored::Refused, _) | (_, Stored::Refused) => Stored::Refused,
        (Stored::Unconfirmed, _) | (_, Stored::Unconfirmed) => Stored::Unconfirmed,
        (Stored::Failed, _) | (_, Stored::Failed) => Stored::Failed,
        _ => Stored::Durable,
    }
}

/// The prefix of a shared group's name on a copy a node passed on because the group had
/// no member left there: the next node delivers it or drops it, never passes it on again,
/// so stale routes cannot send it round. A node without this code takes it for an
/// unknown group, and drops it (as before).
const PASSED_ON: char = '\u{2}';

impl RouterActor {
    /// Joins the cluster; what an earlier run parked for other nodes goes to them again.
    pub(super) fn wire_cluster(&mut self, c: ShardCluster) {
        let me = c.node;
        self.cluster = Some(c);
        if !self.shared.config.cluster.handover_relay_wait {
            self.moving_through(u64::MAX);
        }
        for batch in std::mem::take(&mut self.replays) {
            if batch.node == me {
                continue;
            }
            let Some(key) = self.node_destination(batch.node) else {
                continue;
            };
            if let Some(Destination::Remote(r)) = self.destinations.get_mut(&key) {
                r.replay.push_back(Replay {
                    batch,
                    sent: None,
                    dropping: false,
                });
            }
            if !self.dirty.contains(&key) {
                self.dirty.push(key);
            }
        }
    }

    /// The subscriber key of `node`, its destination made if this shard had none (`None`:
    /// no cluster).
    pub(super) fn node_destination(&mut self, node: u64) -> Option<Arc<str>> {
        let links = self.cluster.as_ref()?.links.clone();
        let key = remote_key(node);
        if !self.remote_nodes.contains(&node) {
            self.remote_nodes.push(node);
        }
        let inc = self.link_inc;
        self.destinations.get_or_insert_with(key.clone(), || {
            Destination::Remote(RemoteNode::new(node, links, inc))
        });
        Some(key)
    }

    /// Parks batch `seq` sent to `node`, which did not acknowledge it in time: written to
    /// the store, out of the window; its publishers are answered once that is durable
    /// (`parked`), and it goes again until the node takes it.
    fn park(&mut self, node: u64, seq: u64, me: WeakAddr<RouterMsg>) {
        let Some(Destination::Remote(r)) = self.destinations.get_mut(&remote_key(node)) else {
            return;
        };
        let Some(u) = r.unacked.iter_mut().find(|u| u.seq == seq) else {
            return;
        };
        let n = u.messages.len();
        u.park = Park::Writing;
        r.unacked_messages -= n;
        r.parked_messages += n;
        debug!(
            node,
            seq,
            messages = n,
            "forwarded batch not acknowledged in time: parked"
        );
        self.write_parked(node, seq, me);
    }

    /// Parks at once, before they are sent, the batches for every node that a copy
    /// forwarded on from another node's batch (keys from `from_key` on: relayed to a
    /// moving session, passed on for a shared group) waits in: its outbox row goes in the
    /// same commit as the cursor of the link it came on, which covers it from then on.
    /// Without it, a kill after that commit and before the next node took the copy lost
    /// it: the link's batch sent again after the restart was skipped up to the cursor,
    /// and the copy had been only in memory. The row also gives the copy the batch number
    /// it keeps when it is sent again after a restart, so the next node takes it once.
    pub(super) fn park_forwarded_on(&mut self, from_key: u64, me: &WeakAddr<RouterMsg>) {
        let now = time::now();
        let mut rows = Vec::new();
        for node in &self.remote_nodes {
            let Some(Destination::Remote(r)) = self.destinations.get_mut(&remote_key(*node)) else {
                continue;
            };
            if !r
                .pending
                .iter()
                .rev()
                .any(|p| p.1.is_some_and(|k| k >= from_key))
            {
                continue;
            }
            // All of what waits, in order, the copy last: a batch per routes' index, as a
            // flush cuts them.
            while !r.pending.is_empty() {
                let (routed_at, n) = r.next_batch(usize::MAX);
                let seq = r.next_seq;
                r.next_seq += 1;
                let (keys, messages) = r.take_batch(n);
                r.parked_messages += n;
                r.held_batches += 1;
                r.unacked.push_back(crate::destination::Unacked {
                    seq,
                    sent_at: now,
                    last_sent: now,
                    keys,
                    messages,
                    routed_at,
                    park: Park::Writing,
                    held: true,
                });
                rows.push((*node, seq));
            }
        }
        for (node, seq) in rows {
            debug!(
                node,
                seq, "a batch with a copy forwarded on: parked before it goes"
            );
            self.write_parked(node, seq, me.clone());
        }
    }

    /// Writes batch `seq` for `node` (in `unacked`, marked `Writing`) to the outbox; its
    /// publishers are answered once that is durable (`parked`).
    fn write_parked(&mut self, node: u64, seq: u64, me: WeakAddr<RouterMsg>) {
        let shard = self.index as u16;
        let Some(Destination::Remote(r)) = self.destinations.get(&remote_key(node)) else {
            return;
        };
        let inc = r.inc;
        let Some(u) = r.unacked.iter().find(|u| u.seq == seq) else {
            return;
        };
        let n = u.messages.len();
        let (now, wall) = (time::now(), time::wall());
        let pos = LinkPos {
            inc,
            base: seq,
            top: seq,
        };
        let messages = u.messages.iter().map(|(m, g)| (m, g.as_ref()));
        let clock = WallClock { now, wall };
        let frame =
            crate::forward::encode_publish(shard, pos, (seq, false), u.routed_at, messages, &clock);
        let parked_ms = wall
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let batch = OutboxBatch {
            node,
            shard,
            inc,
            seq,
            parked_ms,
            messages: u32::try_from(n).unwrap_or(u32::MAX),
            map_seed: self.map.seed(),
            shards: self.map.count() as u16,
            frame,
        };
        let i = self.to_store.len();
        self.to_store.push(Op::PutOutbox(batch).into());
        self.store_waiters.push(Waiter {
            to: WaiterTo::Parked(me, node, seq),
            ops: i..i + 1,
        });
    }

    /// The outbox write of batch `seq` for `node` is done: its publishers hear it is safe,
    /// or (not durable) that it is not confirmed.
    pub(super) fn parked(&mut self, node: u64, seq: u64, outcome: Stored) {
        let Some(Destination::Remote(r)) = self.destinations.get_mut(&remote_key(node)) else {
            return;
        };
        let inc = r.inc;
        let Some(u) = r.unacked.iter_mut().find(|u| u.seq == seq) else {
            // Acknowledged meanwhile (its publishers were answered then): the row goes.
            if outcome == Stored::Durable {
                self.to_store.push(Op::DropOutbox { node, inc, seq }.into());
            }
            return;
        };
        if u.park != Park::Writing {
            // Another batch under that number: the node left and came back since, and
            // its link started again.
            return;
        }
        let keys = std::mem::take(&mut u.keys);
        let n = u.messages.len() as u64;
        let held = std::mem::take(&mut u.held);
        let failed = if outcome == Stored::Durable {
            u.park = Park::Parked;
            add(&self.shared.metrics.cluster_outbox_parked, n);
            None
        } else {
            u.park = Park::Unbacked;
            if !held {
                // A held batch was parked as it was made, never late: its failed write is
                // the store's (counted there), not a timeout.
                add(
                    &self.shared.metrics.cluster_forward_timeouts,
                    keys.len() as u64,
                );
            }
            Some(Stored::Unconfirmed)
        };
        if held {
            // Its row is settled: it goes now, in its place (nothing after it went).
            r.held_batches -= 1;
            r.resend = Some(match r.resend {
                Some((from, last)) => (from.min(seq), last.max(seq)),
                None => (seq, seq),
            });
            let k = remote_key(node);
            if !self.dirty.contains(&k) {
                self.dirty.push(k);
            }
        }
        for key in keys {
            self.forward_settled(key, failed);
        }
    }

    /// A batch parked by an earlier run, acknowledged by `node` (`durable`) or taken but not
    /// made durable there: its row goes, and once that is committed (`unparked`) the next
    /// one (or the link's own batches) may go. Were they to go first, a crash that lost the
    /// drop would send this batch again after a newer incarnation's batches, which the node
    /// would take as a restart of this one.
    fn replay_answered(
        &mut self,
        node: u64,
        inc: u64,
        seq: u64,
        durable: bool,
        me: WeakAddr<RouterMsg>,
    ) {
        let Some(Destination::Remote(r)) = self.destinations.get_mut(&remote_key(node)) else {
            return;
        };
        let Some(front) = r.replay.front_mut() else {
            return;
        };
        if (front.batch.inc, front.batch.seq) != (inc, seq) || front.dropping {
            return;
        }
        front.dropping = true;
        if durable {
            add(&self.shared.metrics.cluster_outbox_replayed, 1);
        } else {
            // Its publishers were told it is safe; the node kept it in memory at best (a
            // delivery its full store refused is dropped), and would never take it again.
            warn!(
                node,
                inc,
                seq,
                messages = front.batch.messages,
                "a parked batch its node took but could not make durable: dropped from the outbox"
            );
            add(
                &self.shared.metrics.cluster_outbox_lost,
                u64::from(front.batch.messages),
            );
        }
        let i = self.to_store.len();
        self.to_store.push(Op::DropOutbox { node, inc, seq }.into());
        self.store_waiters.push(Waiter {
            to: WaiterTo::Unparked(me, node, inc, seq),
            ops: i..i + 1,
        });
    }

    /// The drop of a replayed batch's row is committed: the next may go.
    pub(super) fn unparked(&mut self, node: u64, inc: u64, seq: u64) {
        let key = remote_key(node);
        let Some(Destination::Remote(r)) = self.destinations.get_mut(&key) else {
            return;
        };
        if r.replay
            .front()
            .is_some_and(|x| x.dropping && (x.batch.inc, x.batch.seq) == (inc, seq))
        {
            r.replay.pop_front();
            if !self.dirty.contains(&key) {
                self.dirty.push(key);
            }
        }
    }

    /// The replicated routes changed for `node` and `filter`.
    pub(super) fn remote_route(&mut self, filter: &str, node: u64, present: bool) {
        // The cluster wires every shard before anything can tell it a route (`cluster::start`):
        // a route dropped here would leave that node's subscribers without copies.
        debug_assert!(
            self.cluster.is_some(),
            "a remote route before the cluster wiring"
        );
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
            let slot = self.destinations.slot_for(key);
            match self.router.subscribe(slot, filter, opts) {
                Ok(None) => self.destinations.subscribed(slot),
                Ok(Some(_)) => {}
                Err(e) => {
                    debug!(node, filter, error = %e, "remote route refused");
                    self.destinations.refused(slot);
                    return;
                }
            }
            self.node_destination(node);
        } else if let Some(slot) = self.destinations.slot(&key) {
            if let Ok(Some(_)) = self.router.unsubscribe(&slot, filter) {
                self.destinations.unsubscribed(slot);
            }
        }
    }

    /// A local subscription this shard is home to started (`up`) or ended: the first and
    /// the last of a topic filter are reported to the cluster actor. A new one gets what
    /// its SUBACK waits for: the filter's route holding this node.
    pub(super) fn count_route(
        &mut self,
        raw: &str,
        up: bool,
    ) -> Option<tokio::sync::oneshot::Receiver<()>> {
        self.cluster.as_ref()?;
        let plain = route_of(raw, &self.shared.topic_limits);
        let n = self.route_counts.entry(plain.clone()).or_default();
        if up {
            *n += 1;
            let (done, wait) = tokio::sync::oneshot::channel();
            let msg = if *n == 1 {
                ClusterMsg::Route {
                    filter: plain,
                    present: true,
                    done: Some(done),
                }
            } else {
                ClusterMsg::RouteWait {
                    filter: plain,
                    done,
                }
            };
            self.route_outbox.push_back(msg);
            return Some(wait);
        }
        debug_assert!(*n > 0, "a route counted down below zero");
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.route_counts.remove(&plain);
            self.route_outbox.push_back(ClusterMsg::Route {
                filter: plain,
                present: false,
                done: None,
            });
        }
        None
    }

    /// A retained PUBLISH published here: its change goes through the cluster's log (in
    /// this shard's order, behind its route reports), and a publisher that waits for it
    /// counts it as one more node to hear from.
    pub(super) fn propose_retained(&mut self, msg: &Arc<Message>, me: WeakAddr<RouterMsg>) {
        if self.cluster.is_none() {
            return;
        }
        let done = self.fwd_current.as_mut().map(|f| {
            f.queued += 1;
            (me, f.key)
        });
        let message = crate::cluster::retained_to_cluster(msg, time::now(), time::wall());
        self.route_outbox.push_back(ClusterMsg::Retain {
            topic: msg.topic.to_string(),
            message,
            done,
        });
    }

    /// A publish another node picked this node for as the member of a shared group: one
    /// local member of that group gets it (by the group's strategy, online ones first),
    /// nothing else here does. None left (the last one just went, or moved to another
    /// node): passed on, once, to another node the routes name for the group, marked so
    /// that it goes no further; with none, or passed on already, dropped and counted.
    pub(super) fn publish_to_group(
        &mut self,
        msg: &Arc<Message>,
        to: &SharedTo,
        node: u64,
        ctx: &mut Ctx<Self>,
    ) {
        let pctx = starling_router::PublishContext {
            random: rand::RngCore::next_u64(&mut self.rng),
            publisher_hash: msg
                .publisher
                .as_deref()
                .map_or(0, |p| self.router.publisher_hash(p)),
        };
        let (group, passed) = match to.group.strip_prefix(PASSED_ON) {
            Some(g) => (g, true),
            None => (&*to.group, false),
        };
        let destinations = &self.destinations;
        let local = |s: &Slot| matches!(destinations.at(*s), Some(Destination::Local(_)));
        let online =
            |s: &Slot| matches!(destinations.at(*s), Some(d @ Destination::Local(_)) if d.online());
        let picked = self
            .router
            .pick_shared(group, &to.filter, &pctx, online)
            .or_else(|| self.router.pick_shared(group, &to.filter, &pctx, local));
        let Some((subscriber, opts)) = picked else {
            let remote = |s: &Slot| matches!(destinations.at(*s), Some(Destination::Remote(_)));
            let other = self.router.pick_shared(group, &to.filter, &pctx, remote);
            if let Some((slot, _)) = other.filter(|_| !passed) {
                let key = self.destinations.key(slot).clone();
                add(&self.shared.metrics.cluster_shared_passed_on, 1);
                debug!(group, filter = %to.filter, node = %key, "forwarded for a shared group with no member here: passed on");
                let mark = SharedTo {
                    group: Arc::from(format!("{PASSED_ON}{group}")),
                    filter: to.filter.clone(),
                };
                self.offer_node(&key, msg, Some(mark), None);
                return;
            }
            add(&self.shared.metrics.dropped_other, 1);
            debug!(group, filter = %to.filter, passed, "forwarded for a shared group with no member here");
            return;
        };
        let mut qos0 = crate::flow::Qos0Tally::default();
        self.offer(
            msg,
            subscriber,
            opts.0,
            super::Source::Forwarded(node),
            &mut qos0,
            ctx,
        );
    }

    /// The cluster's log set (`Some`) or deleted the retained message of `topic`.
    pub(super) fn cluster_retained(&mut self, topic: &str, message: Option<Arc<Message>>) {
        let result = match message {
            Some(m) => {
                let size = m.topic.len() + m.payload.len();
                self.retained.publish(topic, m, false, size).map(|_| ())
            }
            None => {
                self.retained.remove(topic);
                Ok(())
            }
        };
        if let Err(e) = result {
            // Over this node's `retained_max`: the cluster keeps it, this node cannot.
            add(&self.shared.metrics.retained_refused, 1);
            debug!(topic, error = %e, "replicated retained message refused here");
        }
    }

    /// The cluster's retained messages of this shard's topics, replacing all but `$SYS`.
    pub(super) fn cluster_retained_reset(&mut self, all: Vec<Arc<Message>>) {
        // `#` matches no topic that starts with `$` (MQTT 4.7.2): `$SYS` stays.
        let gone: Vec<Arc<str>> = match self.retained.matching("#") {
            Ok(found) => found.map(|(t, _)| Arc::from(t)).collect(),
            Err(_) => Vec::new(),
        };
        for t in gone {
            self.retained.remove(&t);
        }
        for m in all {
            let topic = m.topic.clone();
            self.cluster_retained(&topic, Some(m));
        }
    }

    /// Reports what `count_route` found, in order; what finds no room waits for the next
    /// turn (the retry timer is armed by the caller). False while some is left.
    pub(super) fn send_route_outbox(&mut self) -> bool {
        let Some(c) = &self.cluster else {
            return true;
        };
        while let Some(msg) = self.route_outbox.pop_front() {
            match c.actor.try_send(msg) {
                Ok(()) => {}
                Err(starling_rt::TrySendError::Full(msg)) => {
                    self.route_outbox.push_front(msg);
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

/// The route a local subscription gives its node: its topic filter, but for a shared
/// subscription `$share/{group}/{filter}`, so that a publish's node picks one member of the
/// group among all nodes (each node with members counts as one). `$exclusive/` and
/// `$limit/N/` count per node, so their route is the plain filter.
pub(super) fn route_of(raw: &str, limits: &starling_router::TopicLimits) -> String {
    match parse_subscription(raw, limits) {
        Ok(s) => match s.extension {
            Extension::Shared { group } => format!("$share/{group}/{}", s.filter),
            _ => s.filter.to_owned(),
        },
        Err(_) => raw.to_owned(),
    }
}

/// One delivery to another node, with the key of the answer waiting for it: its pending
/// list, under the node-wide queue bound. A full list makes room by dropping its oldest
/// QoS 0 message; without one, the new message is dropped.
pub(super) fn offer_remote(
    node: &mut RemoteNode,
    msg: Arc<Message>,
    key: Option<u64>,
    group: Option<SharedTo>,
    routed_at: u64,
    (bound, outbox): (usize, usize),
) -> Offered {
    // The outbox's policy when full: what is for that node is refused ("refuse").
    if outbox > 0 && node.parked_messages >= outbox {
        return Offered::OutboxFull;
    }
    let was_empty = node.pending.is_empty();
    if node.pending.len() >= bound {
        let qos0 = |m: &Arc<Message>| m.qos == starling_codec::QoS::AtMostOnce;
        match node.pending.iter().position(|(m, _, _, _)| qos0(m)) {
            Some(i) => {
                node.pending.remove(i);
            }
            None => return Offered::Dropped,
        }
    }
    node.pending.push_back((msg, key, group, routed_at));
    if was_empty {
        Offered::First
    } else {
        Offered::Queued
    }
}

impl RouterActor {
    /// A publisher's answer waits for the nodes `f` went to (and for its writes when
    /// `stores`).
    pub(super) fn await_forwards(
        &mut self,
        f: FwdRoute,
        to: AckTo,
        stores: bool,
        ctx: &mut Ctx<Self>,
    ) {
        let outcome = if f.refused > 0 {
            Stored::Refused
        } else {
            Stored::Durable
        };
        let wait = FwdAck {
            to: FwdTo::Client(to),
            nodes_left: f.queued,
            store_pending: stores,
            outcome,
        };
        if wait.nodes_left == 0 && !wait.store_pending {
            self.answer(wait);
            return;
        }
        self.fwd_acks.insert(f.key, wait);
        if self.fwd_timer.is_none() {
            self.fwd_timer = Some(ctx.after(FORWARD_CHECK, RouterMsg::ForwardCheck));
        }
    }

    /// Gathered per publisher, sent at the end of the turn (`send_settled_acks`): one
    /// acknowledgement of a node settles a whole batch, often many publishes of each
    /// publisher, and a message per publish cost each publisher a turn per publish.
    fn answer(&mut self, w: FwdAck) {
        let to = match w.to {
            FwdTo::Client(to) => to,
            FwdTo::Kept => return,
            FwdTo::Link(node, seq) => {
                let written = match w.outcome {
                    Stored::Durable => LinkWrite::Durable,
                    _ => LinkWrite::NotDurable,
                };
                self.link_stored(node, seq, written);
                self.check_links();
                return;
            }
        };
        let id = to.addr.id();
        let entry = (to.tag, w.outcome);
        match self.settled_acks.iter_mut().find(|(a, _)| a.id() == id) {
            Some((_, settled)) => settled.push(entry),
            None => self.settled_acks.push((to.addr, vec![entry])),
        }
    }

    /// Whether a copy node `from` forwarded may go on from here to another node (relayed
    /// to a moving session, passed on for a shared group): such copies of a QoS 1/2
    /// message count towards the answer of its batch (`forwarded_on`).
    pub(super) fn may_forward_on(&self, m: &Message, group: bool) -> bool {
        m.qos != starling_codec::QoS::AtMostOnce
            && self.shared.config.cluster.forward_confirm
            && (group || !self.moving_is_empty())
    }

    /// A copy node `node` forwarded went on from here to the nodes `f` counts: the
    /// batch's answer waits for them, as a write of its own, so that a copy this node
    /// acknowledged is never only in its memory (a kill here would lose it, after its
    /// publisher was told it is safe). With a store they are parked first (`forwarded`),
    /// and that write is what the answer waits for.
    ///
    /// Without a store the answer does not wait: a node without one keeps nothing across
    /// a kill, and acknowledges the copies for its own subscribers once they are in its
    /// memory; the copies it forwards on are kept in memory until their nodes take them
    /// (`RemoteNode::give_up_late`). Waiting made a cycle: two nodes relaying copies of a
    /// session that went back and forth between them each waited for the other's
    /// acknowledgement, and a node answers one node's batches in order, so neither
    /// answered until the forward timeout (seed 49 of the queues-of-two variant).
    pub(super) fn forwarded_on(&mut self, f: FwdRoute, node: u64, ctx: &mut Ctx<Self>) {
        self.fwd_next += 1;
        let w = self.link_writes.entry(node).or_default();
        let seq = w.take_seq();
        let outcome = if f.refused > 0 {
            Stored::Refused
        } else {
            Stored::Durable
        };
        let keeps = self.store.is_none();
        let wait = FwdAck {
            to: FwdTo::Link(node, seq),
            nodes_left: if keeps { 0 } else { f.queued },
            store_pending: false,
            outcome,
        };
        if keeps && f.queued > 0 {
            let kept = FwdAck {
                to: FwdTo::Kept,
                nodes_left: f.queued,
                store_pending: false,
                outcome,
            };
            self.fwd_acks.insert(f.key, kept);
        }
        if wait.nodes_left == 0 {
            self.answer(wait);
        } else {
            self.fwd_acks.insert(f.key, wait);
        }
        if self.fwd_timer.is_none() && !self.fwd_acks.is_empty() {
            self.fwd_timer = Some(ctx.after(FORWARD_CHECK, RouterMsg::ForwardCheck));
        }
    }

    /// Tells each publisher the outcomes of its publishes settled this turn.
    pub(super) fn send_settled_acks(&mut self) {
        for (addr, settled) in std::mem::take(&mut self.settled_acks) {
            self.control(&addr, ClientMsg::Settled(settled));
        }
    }

    /// One node's part of `key` is settled (`None`: it took the message), or the retained
    /// change it proposed.
    pub(super) fn forward_settled(&mut self, key: u64, failed: Option<Stored>) {
        let Some(w) = self.fwd_acks.get_mut(&key) else {
            return;
        };
        w.nodes_left = w.nodes_left.saturating_sub(1);
        if let Some(o) = failed {
            w.outcome = worse(w.outcome, o);
        }
        if w.nodes_left == 0 && !w.store_pending {
            if let Some(w) = self.fwd_acks.remove(&key) {
                self.answer(w);
            }
        }
    }

    /// The store's part of `key` is settled.
    pub(super) fn forward_stored(&mut self, key: u64, outcome: Stored) {
        if self.fwd_gates.open(key) {
            // What waited behind it goes now (or at its turn's flush). A write that
            // failed lets it go too: the message was routed here all the same, and its
            // publisher hears that it is not durable.
            for node in &self.remote_nodes {
                let k = remote_key(*node);
                if let Some(Destination::Remote(r)) = self.destinations.get(&k) {
                    if !r.pending.is_empty() && !self.dirty.contains(&k) {
                        self.dirty.push(k);
                    }
                }
            }
        }
        let Some(w) = self.fwd_acks.get_mut(&key) else {
            return;
        };
        w.store_pending = false;
        w.outcome = worse(w.outcome, outcome);
        if w.nodes_left == 0 {
            if let Some(w) = self.fwd_acks.remove(&key) {
                self.answer(w);
            }
        }
    }

    /// `node` took this shard's batch `seq` (of this shard's incarnation `inc`), durably.
    /// A node takes batches only in order and acknowledges each it made durable, in order,
    /// so an earlier batch still waiting was taken but is not durable there, or its
    /// acknowledgement was lost with a replaced link: unconfirmed, either way.
    pub(super) fn forward_acked(&mut self, node: u64, inc: u64, seq: u64, me: WeakAddr<RouterMsg>) {
        self.forward_answered(node, inc, seq, true, me);
    }

    /// `node` took this shard's batch `seq` (of incarnation `inc`) but could not make it
    /// durable there (its store failed or was full), and will never acknowledge it, nor
    /// take it again. One of this run's is settled as an acknowledgement of a later batch
    /// would settle it: its publishers hear it is unconfirmed, or, parked already, it is
    /// counted as lost. One an earlier run parked: its row goes, counted as lost, and the
    /// link goes on (sent again until acknowledged, it held the link for good).
    pub(super) fn forward_not_durable(
        &mut self,
        node: u64,
        inc: u64,
        seq: u64,
        me: WeakAddr<RouterMsg>,
    ) {
        self.forward_answered(node, inc, seq, false, me);
    }

    /// `node` answered batch `seq`: `durable` (acknowledged) or not.
    fn forward_answered(
        &mut self,
        node: u64,
        inc: u64,
        seq: u64,
        durable: bool,
        me: WeakAddr<RouterMsg>,
    ) {
        let Some(Destination::Remote(r)) = self.destinations.get_mut(&remote_key(node)) else {
            return;
        };
        if inc != r.inc {
            // For an earlier incarnation of this shard (this node restarted since): a
            // batch that run parked, sent again.
            self.replay_answered(node, inc, seq, durable, me);
            return;
        }
        r.heard = time::now();
        let (mut done, mut lost) = (Vec::new(), Vec::new());
        let mut dropped = Vec::new();
        while r.unacked.front().is_some_and(|u| u.seq <= seq) {
            if let Some(u) = r.unacked.pop_front() {
                let n = u.messages.len();
                if u.held {
                    // Never sent, so never taken: an answer for the number of a batch of
                    // the node's earlier link (it left and came back). Counted out all
                    // the same, or the link would wait for it for good.
                    r.held_batches -= 1;
                }
                if u.park == Park::No {
                    r.unacked_messages -= n;
                } else {
                    r.parked_messages -= n;
                    dropped.push(u.seq);
                    if (u.seq != seq || !durable) && u.park == Park::Parked {
                        // Its publishers were told it is safe, and the node skipped it.
                        debug!(node, seq = u.seq, "a parked batch skipped by its node");
                        add(&self.shared.metrics.cluster_outbox_lost, n as u64);
                    }
                }
                if u.seq == seq && durable {
                    done.extend(u.keys);
                } else {
                    lost.extend(u.keys);
                }
            }
        }
        // Without a store, kept in memory only (`RemoteNode::give_up_late`): no row.
        for s in dropped.into_iter().filter(|_| self.store.is_some()) {
            self.to_store
                .push(Op::DropOutbox { node, inc, seq: s }.into());
        }
        if !lost.is_empty() {
            debug!(
                node,
                seq,
                lost = lost.len(),
                "forwarded batches skipped by an acknowledgement: unconfirmed"
            );
            add(
                &self.shared.metrics.cluster_forward_timeouts,
                lost.len() as u64,
            );
        }
        for key in lost {
            self.forward_settled(key, Some(Stored::Unconfirmed));
        }
        for key in done {
            self.forward_settled(key, None);
        }
        self.window_moved(node);
    }

    /// `node` is missing this shard's batches from `from` on (it takes none past a gap):
    /// they go again, in order, ahead of anything new, unless a go-back that covers them
    /// began a moment ago (the node asks once per gap it sees, and batches of the go-back
    /// may still be on their way).
    pub(super) fn forward_resend(&mut self, node: u64, inc: u64, from: u64) {
        let key = remote_key(node);
        let Some(Destination::Remote(r)) = self.destinations.get_mut(&key) else {
            return;
        };
        if inc != r.inc {
            return;
        }
        let now = time::now();
        r.heard = now;
        let top = r.next_seq.saturating_sub(1);
        let (Some(oldest), Some(newest)) = (r.unacked.front(), r.unacked.back()) else {
            return;
        };
        if newest.seq < from {
            return;
        }
        // Batches before the oldest held were given up on: they are not sent again.
        let first = from.max(oldest.seq);
        if r.resent.is_some_and(|(at, start)| {
            start <= from && now.saturating_duration_since(at) < RESEND_DAMP
        }) {
            return;
        }
        debug!(node, from, top, "forwarded batches asked for again");
        // Those from the first held batch on are not sent again but in order, once it may
        // go (`parked`), as any first send: not counted here.
        let end = match r.held_batches {
            0 => top + 1,
            _ => r.unacked.iter().find(|u| u.held).map_or(top + 1, |u| u.seq),
        };
        add(
            &self.shared.metrics.cluster_forward_resent,
            end.min(top + 1).saturating_sub(first),
        );
        r.resent = Some((now, from));
        r.resend = Some(match r.resend {
            Some((next, _)) => (next.min(from), top),
            None => (from, top),
        });
        if !self.dirty.contains(&key) {
            self.dirty.push(key);
        }
    }

    /// Settles what waited too long, or could not be sent; re-arms while anything waits.
    pub(super) fn forward_check(&mut self, ctx: &mut Ctx<Self>) {
        self.fwd_timer = None;
        let now = starling_rt::time::now();
        let mut late = Vec::new();
        let mut probed = Vec::new();
        let mut to_park = Vec::new();
        let mut gone = Vec::new();
        let timeout = self.forward_timeout();
        // Without a store the share bounds what is kept in memory (`give_up_late`).
        let parks = self.outbox_share > 0 && self.store.is_some();
        for node in &self.remote_nodes {
            let Some(Destination::Remote(r)) = self.destinations.get_mut(&remote_key(*node)) else {
                continue;
            };
            late.append(&mut r.lost);
            gone.extend(r.replay_gone.drain(..).map(|(inc, seq)| (r.node, inc, seq)));
            if r.replay.front().is_some_and(|x| {
                !x.dropping
                    && x.sent
                        .is_none_or(|t| now.saturating_duration_since(t) >= REPLAY_AGAIN)
            }) {
                probed.push(remote_key(r.node));
            }
            if parks {
                // Never given up on: parked (the batches stay in order, without a gap).
                to_park.extend(
                    r.unacked
                        .iter()
                        .filter(|u| {
                            u.park == Park::No
                                && now.saturating_duration_since(u.sent_at) >= timeout
                        })
                        .map(|u| (r.node, u.seq)),
                );
            }
            if !parks {
                let acks = &self.fwd_acks;
                let kept = |k| {
                    matches!(
                        acks.get(&k),
                        Some(FwdAck {
                            to: FwdTo::Kept,
                            ..
                        })
                    )
                };
                late.extend(r.give_up_late(now, timeout, kept));
            }
            // A node that said nothing for a while may have lost what it was sent (a
            // replaced connection, its own restart) with nothing after to show it the
            // gap: the oldest batch goes again, and the node asks for the rest.
            let quiet = |t| now.saturating_duration_since(t) >= PROBE_AFTER;
            if r.resend.is_none()
                && quiet(r.heard)
                && r.unacked
                    .front()
                    .is_some_and(|u| !u.held && quiet(u.last_sent))
            {
                if let Some(u) = r.unacked.front() {
                    r.resend = Some((u.seq, u.seq));
                    add(&self.shared.metrics.cluster_forward_resent, 1);
                    probed.push(remote_key(r.node));
                }
            }
        }
        for key in probed {
            if !self.dirty.contains(&key) {
                self.dirty.push(key);
            }
        }
        for (node, inc, seq) in gone {
            self.to_store.push(Op::DropOutbox { node, inc, seq }.into());
        }
        let me = ctx.weak_addr();
        for (node, seq) in to_park {
            self.park(node, seq, me.clone());
        }
        // Timed out, or lost with a closed link: either lets a full window go.
        for node in self.remote_nodes.clone() {
            self.window_moved(node);
        }
        if !late.is_empty() {
            add(
                &self.shared.metrics.cluster_forward_timeouts,
                late.len() as u64,
            );
        }
        for key in late {
            self.forward_settled(key, Some(Stored::Unconfirmed));
        }
        if !self.fwd_acks.is_empty() || self.windows_open() {
            self.fwd_timer = Some(ctx.after(FORWARD_CHECK, RouterMsg::ForwardCheck));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{route_of, FwdGate};
    use starling_router::TopicLimits;

    #[test]
    fn the_gate_lets_messages_go_up_to_its_first_closed_key() {
        let mut g = FwdGate::default();
        assert_eq!(g.first(), None);
        g.close(3);
        g.close(7);
        g.close(9);
        assert_eq!(g.first(), Some(3));
        // Opening a later key lets nothing more go: 3 still stops what follows it.
        assert!(!g.open(7));
        assert_eq!(g.first(), Some(3));
        assert!(g.open(3));
        assert_eq!(g.first(), Some(9));
        // A key never closed (its publisher was not persistent, or it wrote nothing).
        assert!(!g.open(4));
        assert!(g.open(9));
        assert_eq!(g.first(), None);
    }

    #[test]
    fn a_shared_subscription_routes_with_its_group_and_the_others_by_their_filter() {
        let l = TopicLimits::default();
        assert_eq!(route_of("a/+/c", &l), "a/+/c");
        assert_eq!(route_of("$share/g/a/#", &l), "$share/g/a/#");
        assert_eq!(route_of("$queue/a/b", &l), "$share/$queue/a/b");
        assert_eq!(route_of("$exclusive/a/b", &l), "a/b");
        assert_eq!(route_of("$limit/3/a/b", &l), "a/b");
    }
}
