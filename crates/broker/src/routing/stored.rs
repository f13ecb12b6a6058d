//! The shard's part of the store: deliveries to persistent sessions handed over once
//! durable, retained and delayed messages written as they change and read back at start.

use std::sync::Arc;
use std::time::Duration;

use starling_router::{parse_delayed, Delayed};
use starling_rt::{time, ActorId, Ctx};
use starling_session::Message;
use starling_store::Op;
use tracing::debug;

use super::RouterActor;
use crate::destination::{Destination, Pushed};
use crate::metrics::add;
use crate::msg::{DelayedKey, Delivery, RouterMsg, StoreOp};

impl RouterActor {
    /// Deliveries whose records are durable (or that waited behind such), in routing order:
    /// into their subscribers' pending lists. A stored one is kept up to the hard bound,
    /// since its publisher may have been acknowledged; one dropped even so loses its
    /// record too.
    pub(super) fn stored_deliveries(&mut self, ds: Vec<(Arc<str>, ActorId, Delivery)>) {
        let hard = self.shared.limits.mqueue_len_hard();
        for (subscriber, actor, d) in ds {
            if !self.moving_is_empty() && self.relay_routed(&subscriber, &d.0) {
                // Its session is being handed over: the copy goes to its new node, and
                // the record here with the session.
                if let Some(Destination::Local(c)) = self.destinations.get_mut(&subscriber) {
                    if c.addr.id() == actor {
                        c.held = c.held.saturating_sub(1);
                    }
                }
                if let Some(seq) = d.1.stored.get() {
                    self.to_store.push(StoreOp::Retire {
                        client_id: subscriber.clone(),
                        seq,
                    });
                }
                continue;
            }
            let dest = self.destinations.get_mut(&subscriber);
            if dest.as_ref().is_some_and(|d| d.actor() != actor) {
                // Its session ended (its records with it) and a new one took the client id.
                continue;
            }
            let Some(Destination::Local(client)) = dest else {
                if let Some(seq) = d.1.stored.get() {
                    self.to_store.push(StoreOp::Retire {
                        client_id: subscriber.clone(),
                        seq,
                    });
                }
                continue;
            };
            client.held = client.held.saturating_sub(1);
            let was_empty = client.pending.is_empty();
            let seq = d.1.stored.get();
            // Dropped, with its record: this one, or an older one the policy picked.
            let dropped = match client
                .pending
                .push(d, hard, self.shared.limits.mqueue_policy)
            {
                Pushed::Taken { evicted } => {
                    if was_empty {
                        self.dirty.push(subscriber.clone());
                    }
                    evicted
                }
                Pushed::Refused => {
                    add(&self.shared.metrics.dropped_mailbox_full, 1);
                    seq
                }
            };
            if let Some(seq) = dropped {
                self.to_store.push(StoreOp::Retire {
                    client_id: subscriber,
                    seq,
                });
            }
        }
    }

    pub(super) fn store_retained(&mut self, msg: &Arc<Message>) {
        let size = msg.topic.len() + msg.payload.len();
        let stored = self
            .retained
            .publish(&msg.topic, msg.clone(), msg.payload.is_empty(), size);
        match stored {
            Err(e) => {
                add(&self.shared.metrics.retained_refused, 1);
                debug!(topic = %msg.topic, error = %e, "retained message refused");
            }
            // `$SYS` values are the broker's own and made again at start.
            Ok(_) if self.store.is_some() && !msg.topic.starts_with("$SYS") => {
                let topic = msg.topic.to_string();
                if msg.payload.is_empty() {
                    self.to_store.push(Op::DropRetained { topic }.into());
                } else {
                    self.store_retained.push((self.to_store.len(), msg.clone()));
                    self.to_store.push(
                        Op::PutRetained {
                            topic,
                            message: msg.to_state(time::now(), time::wall()),
                        }
                        .into(),
                    );
                }
            }
            Ok(_) => {}
        }
    }

    /// The retained and delayed messages the store held at start, before any client
    /// connects: put back as they were, without writing them again.
    pub(super) fn restore(
        &mut self,
        retained: Vec<Arc<Message>>,
        delayed: Vec<(DelayedKey, Arc<Message>)>,
        ctx: &mut Ctx<Self>,
    ) {
        if self.cluster.is_some() && !retained.is_empty() {
            // In a cluster the log holds the retained messages; these were kept before
            // this node joined one, and putting them back here alone would make this
            // node's view differ from the others'.
            tracing::warn!(
                count = retained.len(),
                "retained messages of the local store ignored: the cluster's log holds them"
            );
            return self.restore(Vec::new(), delayed, ctx);
        }
        for m in retained {
            let size = m.topic.len() + m.payload.len();
            if let Err(e) = self.retained.publish(&m.topic.clone(), m, false, size) {
                add(&self.shared.metrics.retained_refused, 1);
                tracing::warn!(error = %e, "stored retained message over the limits: not restored");
            }
        }
        let wall = time::wall();
        for (key, m) in delayed {
            self.delayed += 1;
            let left = key.due.duration_since(wall).unwrap_or(Duration::ZERO);
            ctx.after(left, RouterMsg::DelayedDue(m, Some(key)));
        }
    }

    /// `$delayed/{secs}/{topic}`: publish `topic` after `secs` seconds. This shard owns
    /// `topic` (see [`ShardMap::of_publish`]), so the due message is routed here.
    pub(super) fn schedule(&mut self, msg: &Arc<Message>, ctx: &mut Ctx<Self>) {
        let m = &self.shared.config.mqtt;
        let parsed = parse_delayed(&msg.topic, &self.shared.topic_limits, m.delayed_max_secs);
        let Ok(Some(Delayed { secs, target })) = parsed else {
            add(&self.shared.metrics.delayed_refused, 1);
            debug!(topic = %msg.topic, ?parsed, "malformed $delayed publish dropped");
            return;
        };
        if self.delayed >= self.delayed_max {
            add(&self.shared.metrics.delayed_refused, 1);
            debug!(topic = %msg.topic, max = m.delayed_publish_max, "$delayed publish dropped: too many pending");
            return;
        }
        let mut due = Message::clone(msg);
        due.topic = Arc::from(target);
        self.delayed += 1;
        let delay = Duration::from_secs(u64::from(secs));
        let key = self.store.is_some().then(|| {
            let key = DelayedKey {
                id: self.delayed_next,
                due: time::wall() + delay,
            };
            self.delayed_next += self.map.count() as u64;
            self.to_store.push(
                Op::PutDelayed {
                    id: key.id,
                    due: key.due,
                    target: due.topic.to_string(),
                    message: due.to_state(time::now(), time::wall()),
                }
                .into(),
            );
            key
        });
        ctx.after(delay, RouterMsg::DelayedDue(Arc::new(due), key));
    }
}
