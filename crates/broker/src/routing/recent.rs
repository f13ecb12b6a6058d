//! The last publishes a shard routed, kept a moment for a SUBSCRIBE that raced them.
//!
//! Two clients' packets are read on different threads, so a PUBLISH the node took in
//! after another client's SUBSCRIBE can reach the shard first and miss the subscription
//! (paho's `test_request_response` publishes right after the other client's SUBSCRIBE,
//! without waiting for its SUBACK, and a broker that reads one socket at a time never
//! misses it). The subscription is stamped with the moment its client took the SUBSCRIBE
//! in; the shard hands it the publishes it routed before the install but took in after
//! that moment, and they are delivered after the SUBACK, as if they had been routed after.

use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::time::Duration;

use starling_router::{filter_matches, parse_subscription, Extension};
use starling_rt::time::Instant;
use starling_session::{DeliveryOptions, Message, SubscribeRequest};

use super::RouterActor;
use crate::msg::SubscribeResult;

/// Publishes kept per shard. A race is a few microseconds wide; under load this many
/// cover about as long, at light load much longer.
const KEPT: usize = 32;
/// How much earlier than the SUBSCRIBE a publish may have been taken in and still count
/// as after it. A packet's moment is the kernel's receive stamp of its bytes where the
/// transport has one (`conn::arrival`), which orders two clients' packets as they came.
/// Where it has none (QUIC, the first segments before the kernel turned stamping on), each
/// client's packets are stamped by its own thread when that thread gets to them, and the
/// thread woken first is not always the one whose bytes came first:
/// measured against paho's suite on two cores, the PUBLISH sent after a SUBSCRIBE was
/// stamped 54-126 µs before it in every race seen (8 in 25 runs), and without the slack
/// one race in thirty of a tighter reproduction was still lost (none of 300 with 200 µs,
/// on an idle machine; a thread kept off its core longer than the slack still loses one,
/// `tests/races.rs`).
/// Kept small: a publish whose PUBACK reached its client before another client's SUBSCRIBE
/// was sent must not reach that subscription, and a loopback round trip can be that fast.
const SLACK: Duration = Duration::from_micros(200);
/// Larger payloads are not kept: the ring must not pin much memory on an idle shard.
const PAYLOAD_MAX: usize = 16 * 1024;

pub(super) struct Recent {
    ring: VecDeque<(Instant, Kept)>,
}

/// How a publish is kept. One that was delivered is kept weakly: a strong hold would
/// make every delivery of it copy its encoded header for a holder that never encodes it
/// (`Session::encode`, the copy is kept only for a message someone else still holds),
/// which costs fan-in and pairs about a tenth of their rate. Such a publish can be caught
/// up only while its deliveries still hold it (queued or on their way to the socket); one
/// delivered to nobody, the race paho's tests run into, is held until it leaves the ring.
enum Kept {
    Held(Arc<Message>),
    Delivered(Weak<Message>),
}

impl Kept {
    fn get(&self) -> Option<Arc<Message>> {
        match self {
            Kept::Held(m) => Some(m.clone()),
            Kept::Delivered(w) => w.upgrade(),
        }
    }
}

impl Default for Recent {
    fn default() -> Self {
        Recent {
            ring: VecDeque::with_capacity(KEPT),
        }
    }
}

/// A subscription that may catch up: its request's index, its topic filter (no
/// extension prefix) and what a delivery through it carries.
pub(super) struct CatchUp {
    pub at: usize,
    pub filter: String,
    pub options: DeliveryOptions,
}

impl Recent {
    /// A publish taken in on this node (`received_at`), just routed; `delivered`, whether
    /// a delivery of it holds it now.
    #[inline]
    pub(super) fn note(&mut self, msg: &Arc<Message>, delivered: bool) {
        let Some(at) = msg.received_at else { return };
        if msg.payload.len() > PAYLOAD_MAX {
            return;
        }
        if self.ring.len() == KEPT {
            self.ring.pop_front();
        }
        let kept = if delivered {
            Kept::Delivered(Arc::downgrade(msg))
        } else {
            Kept::Held(msg.clone())
        };
        self.ring.push_back((at, kept));
    }

    fn newer<'a>(
        &'a self,
        since: Instant,
        client_id: &'a str,
    ) -> impl Iterator<Item = Arc<Message>> + 'a {
        self.ring
            .iter()
            .filter(move |(at, _)| *at + SLACK > since)
            .filter_map(|(_, k)| k.get())
            .filter(move |m| m.publisher.as_deref() != Some(client_id))
    }

    /// Whether a publish not by `client_id` was taken in after `since`: almost never, so
    /// a SUBSCRIBE looks no further.
    pub(super) fn any_after(&self, since: Instant, client_id: &str) -> bool {
        self.newer(since, client_id).next().is_some()
    }

    /// The kept publishes taken in after `since`, not published by `client_id` (its own are
    /// in order already: its actor sends nothing after the SUBSCRIBE before the answer),
    /// that the new subscriptions `subs` match: each once, with the merged options of the
    /// ones it matches, oldest first.
    pub(super) fn caught(
        &self,
        since: Instant,
        client_id: &str,
        subs: &[CatchUp],
    ) -> Vec<(Arc<Message>, DeliveryOptions)> {
        let mut out = Vec::new();
        for m in self.newer(since, client_id) {
            let mut options: Option<DeliveryOptions> = None;
            for s in subs.iter().filter(|s| filter_matches(&s.filter, &m.topic)) {
                match options.as_mut() {
                    Some(o) => o.merge(s.options.clone()),
                    None => options = Some(s.options.clone()),
                }
            }
            out.extend(options.map(|o| (m, o)));
        }
        out
    }
}

impl RouterActor {
    /// The requests of a SUBSCRIBE that may catch up, before they are installed: plain,
    /// exclusive and limited ones; not a shared group's (one member gets each publish, and
    /// it was picked already).
    pub(super) fn catch_ups(&self, filters: &[SubscribeRequest]) -> Vec<CatchUp> {
        let limits = &self.shared.topic_limits;
        filters
            .iter()
            .enumerate()
            .filter_map(|(at, req)| {
                let parsed = parse_subscription(&req.filter, limits).ok()?;
                if matches!(parsed.extension, Extension::Shared { .. }) {
                    return None;
                }
                Some(CatchUp {
                    at,
                    filter: parsed.filter.to_owned(),
                    options: DeliveryOptions::subscription(&req.options, req.subscription_id),
                })
            })
            .collect()
    }

    /// What the subscriptions `r` installed anew (granted here, not waiting for the
    /// cluster's count) missed of the publishes taken in after `since`.
    pub(super) fn caught_up(
        &self,
        r: &mut SubscribeResult,
        since: Instant,
        client_id: &str,
        mut subs: Vec<CatchUp>,
    ) {
        subs.retain(|s| {
            let granted = r.results.get(s.at).is_some_and(Result::is_ok);
            let new = r.new.get(s.at).copied().unwrap_or(false);
            granted && new && !r.holds.iter().any(|h| h.at == s.at)
        });
        if !subs.is_empty() {
            r.caught = self.recent.caught(since, client_id, &subs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use starling_codec::{Properties, QoS, SubscriptionOptions};

    fn msg(topic: &str, by: &str, at: Option<Instant>, size: usize) -> Arc<Message> {
        Arc::new(Message {
            topic: Arc::from(topic),
            payload: Bytes::from(vec![0u8; size]),
            qos: QoS::AtLeastOnce,
            retain: false,
            properties: Properties::default(),
            expires_at: None,
            publisher: Some(Arc::from(by)),
            shared_headers: Default::default(),
            received_at: at,
        })
    }

    fn sub(at: usize, filter: &str, qos: QoS, id: Option<u32>) -> CatchUp {
        let o = SubscriptionOptions {
            qos,
            ..Default::default()
        };
        CatchUp {
            at,
            filter: filter.to_owned(),
            options: DeliveryOptions::subscription(&o, id),
        }
    }

    fn topics(c: &[(Arc<Message>, DeliveryOptions)]) -> Vec<&str> {
        c.iter().map(|(m, _)| &*m.topic).collect()
    }

    #[test]
    fn a_subscription_catches_what_was_taken_in_after_its_subscribe_and_nothing_older() {
        let t0 = starling_rt::time::now();
        let ms = Duration::from_millis(1);
        let mut r = Recent::default();
        r.note(&msg("a/old", "p", Some(t0), 4), false);
        r.note(&msg("a/new", "p", Some(t0 + 10 * ms), 4), false);
        r.note(&msg("b/new", "p", Some(t0 + 11 * ms), 4), false);
        // Its own publishes are in order already; the broker's own have no stamp.
        r.note(&msg("a/mine", "s", Some(t0 + 12 * ms), 4), false);
        r.note(&msg("a/sys", "p", None, 4), false);
        let since = t0 + 5 * ms;
        assert!(r.any_after(since, "s"));
        let subs = [sub(0, "a/+", QoS::AtLeastOnce, None)];
        assert_eq!(topics(&r.caught(since, "s", &subs)), ["a/new"]);
        // Within the slack, a publish stamped a little before the SUBSCRIBE counts.
        let just_after = t0 + Duration::from_micros(150);
        assert_eq!(
            topics(&r.caught(just_after, "s", &subs)),
            ["a/old", "a/new"]
        );
        assert!(!r.any_after(t0 + 20 * ms, "s"));
    }

    #[test]
    fn a_publish_two_new_subscriptions_match_is_caught_once_with_their_options_merged() {
        let t0 = starling_rt::time::now();
        let mut r = Recent::default();
        r.note(
            &msg("a/b", "p", Some(t0 + Duration::from_millis(1)), 4),
            false,
        );
        let subs = [
            sub(0, "a/#", QoS::AtMostOnce, Some(1)),
            sub(1, "a/b", QoS::ExactlyOnce, Some(2)),
        ];
        let c = r.caught(t0, "s", &subs);
        assert_eq!(topics(&c), ["a/b"]);
        assert_eq!(c[0].1.qos, QoS::ExactlyOnce);
        assert_eq!(&*c[0].1.subscription_ids, &[1, 2]);
    }

    #[test]
    fn the_ring_keeps_the_last_few_and_no_large_payload() {
        let t0 = starling_rt::time::now();
        let mut r = Recent::default();
        r.note(
            &msg(
                "big",
                "p",
                Some(t0 + Duration::from_millis(1)),
                PAYLOAD_MAX + 1,
            ),
            false,
        );
        assert!(!r.any_after(t0, "s"));
        for i in 0..KEPT + 5 {
            let at = t0 + Duration::from_millis(1 + i as u64);
            r.note(&msg(&format!("t/{i}"), "p", Some(at), 4), false);
        }
        let c = r.caught(t0, "s", &[sub(0, "t/+", QoS::AtLeastOnce, None)]);
        assert_eq!(c.len(), KEPT);
        assert_eq!(&*c[0].0.topic, "t/5");
    }

    #[test]
    fn a_delivered_publish_is_caught_only_while_a_delivery_still_holds_it() {
        let t0 = starling_rt::time::now();
        let mut r = Recent::default();
        let held = msg("a/held", "p", Some(t0 + Duration::from_millis(1)), 4);
        let gone = msg("a/gone", "p", Some(t0 + Duration::from_millis(2)), 4);
        r.note(&held, true);
        r.note(&gone, true);
        // The ring's weak hold leaves the message to its deliveries: a holder that
        // encodes it sees it held once.
        assert_eq!(Arc::strong_count(&held), 1);
        drop(gone);
        let c = r.caught(t0, "s", &[sub(0, "a/+", QoS::AtLeastOnce, None)]);
        assert_eq!(topics(&c), ["a/held"]);
    }
}
