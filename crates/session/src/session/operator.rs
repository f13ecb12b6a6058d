//! Subscriptions an operator makes or drops for the attached client (the broker's HTTP
//! API): checked as the filters of the client's own SUBSCRIBE are, recorded as the router
//! answers, with no SUBACK or UNSUBACK, since the client asked for nothing.

use starling_codec::{QoS, ReasonCode, SubscriptionOptions};

use super::{Gate, Session};
use crate::SubscribeRequest;

impl Session {
    /// Checks an operator's filters (raw, extensions included, already valid) as a
    /// SUBSCRIBE's: per filter, in order, the request to route or the reason code that
    /// refuses it. Nothing is recorded until [`Session::operator_subscribed`].
    pub fn operator_subscribe(
        &self,
        filters: Vec<String>,
        options: SubscriptionOptions,
        gate: &mut dyn Gate,
    ) -> Vec<Result<SubscribeRequest, ReasonCode>> {
        let mut count = self.subscriptions.len();
        filters
            .into_iter()
            .map(|f| self.admit_filter(f, options, &mut count, gate))
            .collect()
    }

    /// The router's answer to the routed requests of [`Session::operator_subscribe`], one
    /// per request in order: each granted one is recorded, at the lower of the QoS asked
    /// and the QoS granted.
    pub fn operator_subscribed(
        &mut self,
        requests: Vec<SubscribeRequest>,
        results: &[Result<QoS, ReasonCode>],
    ) {
        // The session now holds what a later connection must find there.
        if results.iter().any(Result::is_ok) {
            self.unheard = false;
        }
        for (req, r) in requests.into_iter().zip(results) {
            if let Ok(qos) = r {
                let options = SubscriptionOptions {
                    qos: (*qos).min(req.options.qos),
                    ..req.options
                };
                self.subscriptions
                    .insert(req.filter, (options, req.subscription_id));
            }
        }
        self.check_invariants();
    }

    /// The router's codes for filters an operator unsubscribed, one per filter: those it
    /// removed are forgotten.
    pub fn operator_unsubscribed(&mut self, filters: &[String], codes: &[ReasonCode]) {
        for (f, code) in filters.iter().zip(codes) {
            if !code.is_error() {
                self.subscriptions.remove(f);
            }
        }
        self.check_invariants();
    }
}
