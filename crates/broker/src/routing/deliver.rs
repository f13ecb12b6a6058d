//! One delivery to one destination under the session's queue policy and the back-pressure
//! rules, and the hand-over of what is pending to the destinations at a burst's end.

use std::sync::Arc;

use starling_router::DeliveryKind;
use starling_rt::{time, ActorId, Ctx};
use starling_session::{DeliveryOptions, Message, StoreKey};
use tracing::debug;

use super::{remote, RouterActor, Slot, Source, RETRY_BLOCKED};
use crate::destination::{is_qos0, Destination, Flushed, Pushed, SharedTo};
use crate::flow::Qos0Tally;
use crate::metrics::add;
use crate::msg::{HeldDelivery, Publisher, RouterMsg, StoreOp};

impl RouterActor {
    /// One delivery to another node (its subscriber key `key`), marked for a shared group
    /// there or a moving session (`mark`): its pending list, counted towards the waiting
    /// publisher's answer; `from` (a QoS 1/2 publisher) is held back while the node's
    /// window is full.
    pub(super) fn offer_node(
        &mut self,
        key: &Arc<str>,
        msg: &Arc<Message>,
        mark: Option<SharedTo>,
        from: Option<&Publisher>,
    ) {
        let routed_at = self.routed_at();
        let Some(Destination::Remote(node)) = self.destinations.get_mut(key) else {
            return;
        };
        // `cluster.forward_confirm = false`: the publisher's answer does not wait for the
        // other node (a drop here still counts: it is known now).
        let confirm = self.shared.config.cluster.forward_confirm;
        let fkey = self.fwd_current.as_ref().filter(|_| confirm).map(|f| f.key);
        let bounds = (self.remote_pending_max, self.outbox_share);
        let offered = remote::offer_remote(node, msg.clone(), fkey, mark, routed_at, bounds);
        // Checked here first: the window is seldom full, and its own check looks the node
        // up again.
        let full = node.in_flight() >= self.window.high;
        let node = node.node;
        let refused = match offered {
            remote::Offered::Dropped => {
                add(&self.shared.metrics.dropped_mailbox_full, 1);
                true
            }
            remote::Offered::OutboxFull => {
                add(&self.shared.metrics.cluster_outbox_full, 1);
                true
            }
            _ => {
                add(&self.shared.metrics.cluster_forwarded, 1);
                false
            }
        };
        if let Some(f) = self.fwd_current.as_mut() {
            if confirm || refused {
                f.count(offered);
            }
        }
        if offered == remote::Offered::First {
            self.dirty.push(key.clone());
        }
        if let Some(from) = from.filter(|_| full) {
            self.hold_for_window(node, from);
        }
    }

    /// One delivery to one subscriber's destination: held-back marking, the saturated
    /// short cut, then its pending list under the session's queue policy.
    pub(super) fn offer(
        &mut self,
        msg: &Arc<Message>,
        slot: Slot,
        mut opts: DeliveryOptions,
        source: Source<'_>,
        qos0: &mut Qos0Tally,
        ctx: &mut Ctx<Self>,
    ) {
        let (from, local, kind, link) = match source {
            Source::Local(from, kind) => (from, true, kind, None),
            Source::Forwarded(node) => (None, false, None, Some(node)),
        };
        // One lookup per delivery, by index: what must be sent or scheduled is carried out
        // after.
        let Some((subscriber, dest)) = self.destinations.at_mut(slot) else {
            return;
        };
        let client = match dest {
            Destination::Local(client) => client,
            Destination::Remote(_) => {
                // Forwarded publishes stop here: the node they came from sent them to
                // every node that needed them.
                if local {
                    let group = match kind {
                        Some(DeliveryKind::Shared { group, filter, .. }) => Some(SharedTo {
                            group: group.clone(),
                            filter: filter.clone(),
                        }),
                        _ => None,
                    };
                    let key = subscriber.clone();
                    self.offer_node(&key, msg, group, from.filter(|_| !is_qos0(msg, &opts)));
                }
                return;
            }
        };
        // MQTT 5 §3.8.3.1 No Local, decided here as well as by the session: the delivery
        // would cost the publisher's own mailbox a message only to be thrown away, and
        // would count as one that holds the message (`recent`).
        if opts.no_local && msg.publisher.as_deref() == Some(&**subscriber) {
            return;
        }
        let me = client.addr.id();
        let mut outcome = None;
        let mut hold = false;
        // Held back for a delivery to an online subscriber only, and never by itself.
        let may_hold = from.is_some_and(|f| f.id != me) && client.online;
        // A QoS 0 delivery counts towards holding its publisher only when it finds no room
        // (`Qos0Tally`): holding one whose subscribers are merely behind turned a steady
        // fan-out into stop-and-go, at three quarters of the throughput.
        let qos0_may_hold =
            may_hold && is_qos0(msg, &opts) && self.shared.config.mqtt.backpressure_qos0;
        // A forwarded one holds back the link it came by, the same way (`link`).
        let link_may_hold = link.is_some() && client.online;
        if (may_hold || link_may_hold) && !is_qos0(msg, &opts) {
            // What waits here and in its mailbox counts: its own queue shows a flood only
            // after its next turn, too late for what is routed meanwhile.
            let (holds, o) = client
                .backlog
                .judge(time::now, client.pending.len(), &self.rules);
            outcome = o;
            if holds {
                hold = true;
                // Read and acknowledged before the hold reached its publisher: kept
                // past the queue bound (up to the hard bound) rather than dropped.
                opts.held_back = true;
            }
        }
        let mut no_room = false;
        let mut first = false;
        // A persistent session's delivery that needs a record waits for it to be durable,
        // and whatever follows it to that session waits behind it (order, MQTT 4.6); but a
        // QoS 1 delivery to an online subscriber goes at once, while the store has room
        // (`store_early`): its publisher's acknowledgement still waits for the record, and
        // a subscriber's PUBACK that comes before the commit takes the record back out of
        // it unwritten (`storage`). A crash before the commit may send it twice, which QoS 1
        // allows; QoS 2 must not show its packet id before it is durable.
        let store = self.store.is_some()
            && client.persistent
            && (!is_qos0(msg, &opts) || (self.shared.limits.queue_qos0_offline && !client.online));
        let early = store
            && self.store_early
            && client.held == 0
            && client.online
            && msg.qos.min(opts.qos) == starling_codec::QoS::AtLeastOnce;
        if early {
            let seq = self.seq_next;
            self.seq_next += self.map.count() as u64;
            opts.stored = StoreKey::new(seq);
            self.to_store
                .push(StoreOp::delivery(subscriber.clone(), seq, msg, &opts));
            let was_empty = client.pending.is_empty();
            // Kept up to the hard bound, as a held one is: its publisher may be told it is
            // stored.
            let pushed = client.pending.push(
                (msg.clone(), opts),
                self.shared.limits.mqueue_len_hard(),
                self.shared.limits.mqueue_policy,
            );
            // Dropped, this one (its record cancelled in the same write) or an older one.
            let dropped = match pushed {
                Pushed::Taken { evicted } => {
                    first = was_empty;
                    evicted
                }
                Pushed::Refused => {
                    add(&self.shared.metrics.dropped_mailbox_full, 1);
                    Some(seq)
                }
            };
            if let Some(seq) = dropped {
                self.to_store.push(StoreOp::Retire {
                    client_id: subscriber.clone(),
                    seq,
                });
            }
        } else if store || client.held > 0 {
            let op = store.then(|| {
                let seq = self.seq_next;
                self.seq_next += self.map.count() as u64;
                opts.stored = StoreKey::new(seq);
                self.to_store
                    .push(StoreOp::delivery(subscriber.clone(), seq, msg, &opts));
                self.to_store.len() - 1
            });
            client.held += 1;
            self.store_deliveries.push(HeldDelivery {
                op,
                subscriber: subscriber.clone(),
                actor: me,
                delivery: (msg.clone(), opts),
            });
        } else if client.backlog.saturated() && !opts.held_back {
            // What the session would do with it, without the trip.
            add(&self.shared.metrics.dropped_queue_full, 1);
            no_room = true;
        } else {
            let was_empty = client.pending.is_empty();
            let bound = if opts.held_back {
                self.shared.limits.mqueue_len_hard()
            } else {
                self.pending_max
            };
            // Full: this one or an older one is dropped.
            no_room = client.pending.len() >= bound;
            match client
                .pending
                .push((msg.clone(), opts), bound, self.shared.limits.mqueue_policy)
            {
                Pushed::Taken { evicted } => {
                    first = was_empty;
                    if no_room {
                        // An older delivery made room (the queue policy's victim): a drop too.
                        add(&self.shared.metrics.dropped_mailbox_full, 1);
                    }
                    if let Some(seq) = evicted {
                        self.to_store.push(StoreOp::Retire {
                            client_id: subscriber.clone(),
                            seq,
                        });
                    }
                }
                Pushed::Refused => {
                    add(&self.shared.metrics.dropped_mailbox_full, 1);
                    debug!(client_id = %subscriber, topic = %msg.topic, "delivery dropped: client behind");
                }
            }
        }
        if qos0_may_hold {
            let holds = no_room && {
                let (holds, o) = client
                    .backlog
                    .judge(time::now, client.pending.len(), &self.rules);
                outcome = o;
                holds
            };
            // Counted now, decided for the whole publish.
            qos0.count(holds, subscriber);
        }
        // The key, owned, only for what comes after the destination's borrow, which is
        // seldom: a delivery otherwise raises and drops no count of it.
        let Some(subscriber) = (hold || outcome.is_some() || first).then(|| subscriber.clone())
        else {
            return;
        };
        if hold {
            if let Some(from) = from {
                self.hold_for(&subscriber, from);
            }
            if let Some(node) = link {
                self.hold_link(node, &subscriber);
            }
        }
        if let Some(o) = outcome {
            self.apply(&subscriber, o, ctx);
        }
        if first {
            self.dirty.push(subscriber);
        }
    }

    /// Hands each pending batch to its destination; one without room keeps its batch
    /// here for the next flush or the retry timer. Returns how many had no room.
    pub(super) fn flush(&mut self, ctx: &mut Ctx<Self>) -> usize {
        self.flush_some(ctx, true)
    }

    /// [`Self::flush`]; mid-burst (`whole` false: the mailbox still holds publishes), a
    /// node's waiting list goes only once it fills a frame. Its batch and acknowledgement
    /// cost the same at any size, and at the stride a steady stream cut them at 64.
    pub(super) fn flush_some(&mut self, ctx: &mut Ctx<Self>, whole: bool) -> usize {
        self.routed = 0;
        let mut blocked = 0;
        let mut forwarded = false;
        let mut i = 0;
        while i < self.dirty.len() {
            let Some(dest) = self.destinations.get_mut(&self.dirty[i]) else {
                self.dirty.swap_remove(i);
                continue;
            };
            if matches!(dest, Destination::Remote(r) if !whole && r.may_wait_for_more()) {
                i += 1;
                continue;
            }
            forwarded |= matches!(dest, Destination::Remote(_));
            match dest.flush(self.index as u16, self.fwd_gates.first()) {
                Flushed::Blocked => {
                    blocked += 1;
                    i += 1;
                }
                Flushed::Done => {
                    self.dirty.swap_remove(i);
                }
                Flushed::Gone => {
                    let released = dest.end();
                    self.dirty.swap_remove(i);
                    self.release(released, ActorId(0));
                }
            }
        }
        self.send_outbox();
        // Sent batches wait for their acknowledgements, keyed or not (the window).
        if forwarded && self.fwd_timer.is_none() {
            self.fwd_timer = Some(ctx.after(remote::FORWARD_CHECK, RouterMsg::ForwardCheck));
        }
        if (blocked > 0 || !self.outbox.is_empty()) && self.retry.is_none() {
            self.retry = Some(ctx.after(RETRY_BLOCKED, RouterMsg::RetryBlocked));
        }
        blocked
    }
}
