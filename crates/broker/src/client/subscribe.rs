//! Subscriptions routed for the client, from its own SUBSCRIBE and UNSUBSCRIBE or from an
//! operator's: the shards' side, with the events providers asked for.

use std::sync::Arc;

use starling_codec::ReasonCode;
use starling_hooks::{EventKind, What};
use starling_router::{filter_matches, parse_subscription, Extension};
use starling_rt::time::Instant;
use starling_rt::Ctx;
use starling_session::{DeliveryOptions, Message, SubscribeRequest};

use super::Client;
use crate::flow::{Reporter, StallRules};
use crate::metrics::add;
use crate::msg::SubscribeResult;

impl Client {
    /// Routes `filters` (checked by the session) to the shards: their answer, one result
    /// per filter, and the retained messages to deliver once the subscriptions are stored.
    /// `since`: when the client's SUBSCRIBE was taken in, for the publishes taken in after
    /// it that reached their shard first (`SubscribeResult::caught`).
    pub(super) async fn route_subscribe(
        &mut self,
        filters: Vec<SubscribeRequest>,
        since: Option<Instant>,
        ctx: &mut Ctx<Self>,
    ) -> SubscribeResult {
        let client_id = self.client_id();
        let me = ctx.weak_addr();
        self.meet_shards(&filters, ctx);
        let may_hold = self.may_hold();
        let persistent = self.stores_deliveries();
        let named = self.wanted(EventKind::SessionSubscribed).then(|| {
            let f = filters.iter();
            f.map(|f| (Arc::<str>::from(f.filter.as_str()), f.options.qos))
                .collect::<Vec<_>>()
        });
        // A cluster reads the retained messages again after the install (see `Shards`).
        let again = self.shards.is_clustered().then(|| filters.clone());
        let mut r = self
            .shards
            .subscribe(client_id.clone(), me, may_hold, persistent, filters, since)
            .await;
        if let Some(filters) = again {
            self.shards
                .cluster_retained(&client_id, &filters, &mut r)
                .await;
        }
        if !r.caught.is_empty() {
            self.drop_delivered(&mut r.caught, &r.retained);
        }
        let installed = r.results.iter().filter(|r| r.is_ok()).count();
        add(
            &self.shared.metrics.rmqtt.session_subscribed,
            installed as u64,
        );
        for ((filter, asked), r) in named.into_iter().flatten().zip(&r.results) {
            if let Ok(qos) = r {
                let qos = (*qos).min(asked);
                self.emit(EventKind::SessionSubscribed, || What::SessionSubscribed {
                    filter,
                    qos,
                });
            }
        }
        r
    }

    /// Keeps of `caught` what no subscription the client held before this SUBSCRIBE
    /// matches (one that did had it delivered), and what is not among the `retained`
    /// messages it gets. Shared ones do not count: a group's
    /// publish goes to one member.
    fn drop_delivered(
        &self,
        caught: &mut Vec<(Arc<Message>, DeliveryOptions)>,
        retained: &[(Arc<Message>, DeliveryOptions)],
    ) {
        let limits = &self.shared.topic_limits;
        let held: Vec<&str> = self
            .session
            .subscriptions()
            .keys()
            .filter_map(|raw| parse_subscription(raw, limits).ok())
            .filter(|p| !matches!(p.extension, Extension::Shared { .. }))
            .map(|p| p.filter)
            .collect();
        caught.retain(|(m, _)| !held.iter().any(|f| filter_matches(f, &m.topic)));
        // A retained publish that raced the SUBSCRIBE is read from the retained store too:
        // the client gets it once, as the retained copy.
        caught.retain(|(m, _)| {
            !retained
                .iter()
                .any(|(k, _)| k.topic == m.topic && k.payload == m.payload)
        });
        // Oldest first across shards: the order the node took them in.
        caught.sort_by_key(|(m, _)| m.received_at);
    }

    /// Removes `filters` from the shards: one code per filter.
    pub(super) async fn route_unsubscribe(&mut self, filters: Vec<String>) -> Vec<ReasonCode> {
        let client_id = self.client_id();
        let named = self.wanted(EventKind::SessionUnsubscribed).then(|| {
            let f = filters.iter();
            f.map(|f| Arc::<str>::from(f.as_str())).collect::<Vec<_>>()
        });
        let codes = self.shards.unsubscribe(client_id, filters).await;
        // RMQTT counts a subscription removed, not a filter that matched none.
        let removed = codes.iter().filter(|&&c| c == ReasonCode::Success).count();
        add(
            &self.shared.metrics.rmqtt.session_unsubscribed,
            removed as u64,
        );
        for (filter, code) in named.into_iter().flatten().zip(&codes) {
            if !code.is_error() {
                self.emit(EventKind::SessionUnsubscribed, || {
                    What::SessionUnsubscribed { filter }
                });
            }
        }
        codes
    }

    /// Notes the shards `filters` reach as ones that know this subscriber (presence and
    /// the session's end go to them).
    pub(super) fn meet_shards(&mut self, filters: &[SubscribeRequest], ctx: &Ctx<Self>) {
        let shards = self.shards.count();
        let rules = StallRules::new(&self.shared.config.mqtt, &self.shared.limits);
        let reach: Vec<_> = filters
            .iter()
            .map(|f| self.shards.reach(&f.filter))
            .collect();
        let f = self.flow_mut(ctx);
        let r = f
            .reporter
            .get_or_insert_with(|| Reporter::new(shards, &rules));
        for reach in reach {
            (0..shards)
                .filter(|&s| reach.includes(s))
                .for_each(|s| r.met(s));
        }
    }
}
