//! A shard's part of SUBSCRIBE and UNSUBSCRIBE: admission (its home decides, the others
//! install what the home granted), the cluster route a first subscription reports, and
//! the retained messages a new subscription gets.

use std::sync::Arc;

use starling_codec::ReasonCode;
use starling_router::{parse_subscription, Extension, RouterError};
use starling_rt::{time, WeakAddr};
use starling_session::{DeliveryOptions, SubscribeRequest};
use tracing::debug;

use super::{RouterActor, Slot, SubOpts};
use crate::destination::Destination;
use crate::flow::Backlog;
use crate::msg::{Admission, ClientMsg, ClusterMsg, HoldWait, SubscribeResult};

impl RouterActor {
    pub(super) fn subscribe(
        &mut self,
        client_id: Arc<str>,
        client: WeakAddr<ClientMsg>,
        may_hold: bool,
        persistent: bool,
        filters: Vec<SubscribeRequest>,
        admission: Admission,
    ) -> SubscribeResult {
        match self.destinations.get_mut(&client_id) {
            Some(Destination::Local(d)) if d.addr.id() == client.id() => d.persistent = persistent,
            _ => {
                // New, or an actor after one whose session ended: its counts start over.
                let mut fresh = Destination::local(client, Backlog::new(time::now(), may_hold));
                if let Destination::Local(l) = &mut fresh {
                    l.persistent = persistent;
                }
                if let Some(mut old) = self.destinations.insert(client_id.clone(), fresh) {
                    let released = old.end();
                    self.release(released, old.actor());
                }
            }
        }
        let slot = self.destinations.slot_for(client_id.clone());
        let mut res = SubscribeResult::default();
        for (i, req) in filters.into_iter().enumerate() {
            let mut hold = None;
            let opts = SubOpts(DeliveryOptions::subscription(
                &req.options,
                req.subscription_id,
            ));
            let (outcome, new) = match &admission {
                Admission::Decide => {
                    let r = self.router.subscribe(slot, &req.filter, opts);
                    let new = matches!(r, Ok(None));
                    self.owned += usize::from(new);
                    self.owned_shared += usize::from(new && self.is_shared(&req.filter));
                    if new {
                        if let Some(wait) = self.count_route(&req.filter, true) {
                            res.route_waits.push(wait);
                        }
                        hold = self.count_hold(&client_id, &req.filter, true).map(|mut h| {
                            h.at = i;
                            h
                        });
                    }
                    (r, new)
                }
                Admission::Admitted { new } => {
                    let r = self.router.subscribe_admitted(slot, &req.filter, opts);
                    let r = r.map(|(old, evicted)| {
                        // The holder's subscription went here; its removal, when it
                        // comes, finds none, so its slot is let go now.
                        if let Some(holder) = evicted {
                            self.destinations.unsubscribed(holder);
                        }
                        old
                    });
                    (r, new.get(i).copied().unwrap_or(false))
                }
            };
            if matches!(outcome, Ok(None)) {
                self.destinations.subscribed(slot);
            }
            match outcome {
                Ok(_) => {
                    res.results.push(Ok(req.options.qos));
                    res.new.push(new);
                    if req.wants_retained(new) {
                        let plain = parse_subscription(&req.filter, &self.shared.topic_limits)
                            .map(|s| s.filter)
                            .unwrap_or(&req.filter);
                        let options = DeliveryOptions::retained(&req.options, req.subscription_id);
                        // One whose grant is the cluster's gets them only if granted.
                        let to = match hold.as_mut() {
                            Some(h) => &mut h.retained,
                            None => &mut res.retained,
                        };
                        if let Ok(found) = self.retained.matching(plain) {
                            for (_, m) in found {
                                to.push((m.clone(), options.clone()));
                            }
                        }
                    }
                    res.holds.extend(hold);
                }
                Err(e) => {
                    debug!(client_id = %client_id, filter = %req.filter, error = %e, "subscribe refused");
                    res.results.push(Err(subscribe_refusal(&e)));
                    res.new.push(false);
                }
            }
        }
        res
    }

    /// Removes a subscription; counts it off if this shard is its home.
    pub(super) fn unsubscribe(
        &mut self,
        client_id: &Arc<str>,
        filter: &str,
    ) -> Result<bool, RouterError> {
        let slot = self.destinations.slot(client_id).unwrap_or(Slot::NONE);
        let removed = self.router.unsubscribe(&slot, filter)?.is_some();
        if removed {
            self.destinations.unsubscribed(slot);
        }
        if removed && self.map.reach(filter, &self.shared.topic_limits).home() == self.index {
            self.owned -= 1;
            self.owned_shared -= usize::from(self.is_shared(filter));
            let _ = self.count_route(filter, false);
            let _ = self.count_hold(client_id, filter, false);
        }
        Ok(removed)
    }

    /// In a cluster, a `$exclusive/` or `$limit/N/` subscription this shard is home to
    /// started (`up`: its grant waits for the cluster's count, returned) or ended (counted
    /// off), reported in order with the routes.
    fn count_hold(&mut self, client_id: &Arc<str>, raw: &str, up: bool) -> Option<HoldWait> {
        self.cluster.as_ref()?;
        let parsed = parse_subscription(raw, &self.shared.topic_limits).ok()?;
        let limit = match parsed.extension {
            Extension::Exclusive => None,
            Extension::Limit { max } => Some(max),
            _ => return None,
        };
        let filter = parsed.filter.to_owned();
        let client_id = client_id.clone();
        if !up {
            self.route_outbox.push_back(ClusterMsg::Unhold {
                filter,
                client_id,
                exclusive: limit.is_none(),
            });
            return None;
        }
        let (done, verdict) = tokio::sync::oneshot::channel();
        self.route_outbox.push_back(ClusterMsg::Hold {
            filter,
            client_id,
            limit,
            done,
        });
        Some(HoldWait {
            at: 0,
            verdict,
            retained: Vec::new(),
        })
    }

    /// A `$share/{group}/` or `$queue/` subscription, as the router core parses it.
    pub(super) fn is_shared(&self, raw: &str) -> bool {
        parse_subscription(raw, &self.shared.topic_limits)
            .is_ok_and(|p| matches!(p.extension, Extension::Shared { .. }))
    }
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
