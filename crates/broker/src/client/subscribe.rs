//! Subscriptions routed for the client, from its own SUBSCRIBE and UNSUBSCRIBE or from an
//! operator's: the shards' side, with the events providers asked for.

use std::sync::Arc;

use starling_codec::ReasonCode;
use starling_hooks::{EventKind, What};
use starling_rt::Ctx;
use starling_session::SubscribeRequest;

use super::Client;
use crate::flow::{Reporter, StallRules};
use crate::metrics::add;
use crate::msg::SubscribeResult;

impl Client {
    /// Routes `filters` (checked by the session) to the shards: their answer, one result
    /// per filter, and the retained messages to deliver once the subscriptions are stored.
    pub(super) async fn route_subscribe(
        &mut self,
        filters: Vec<SubscribeRequest>,
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
            .subscribe(client_id.clone(), me, may_hold, persistent, filters)
            .await;
        if let Some(filters) = again {
            self.shards
                .cluster_retained(&client_id, &filters, &mut r)
                .await;
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
