//! One delivery per subscriber: a client whose subscriptions overlap gets one copy of a
//! publish (MQTT 5 §3.3.4 lets the server choose; one copy is what clients expect and what
//! MQTT 3.1.1 §3.3.5 asks for), with options merged from every matching subscription.

use std::hash::Hash;

use crate::{Delivery, DeliveryKind, PublishContext, Router};

/// How a subscription's options combine with another matching subscription's of the same
/// subscriber. The MQTT rule: the highest QoS, No Local only if every one says so, Retain
/// As Published if any does, every Subscription Identifier.
pub trait Merge {
    fn merge(&mut self, other: Self);
}

/// How far back a delivery looks for the same subscriber to merge with: the trie yields one
/// subscriber's matches from different levels, not always adjacent; a bounded look-back
/// keeps a publish to many subscribers linear. Beyond it a subscriber with that many
/// overlapping filters among other subscribers' gets a second copy, which MQTT 5 allows.
pub const MERGE_WINDOW: usize = 64;

impl<S: Clone + Eq + Hash, T: Clone + Merge> Router<S, T> {
    /// [`Router::route`] with overlapping subscriptions of one subscriber merged into one
    /// delivery. Shared-group deliveries stay apart: each group's copy is its own (MQTT 5
    /// §4.8.2), even to a member that also subscribes plainly. `out` is cleared first.
    ///
    /// `scratch` is reused between calls (the unmerged matches). `same` tells whether two
    /// subscribers are one (pass `==`, or a pointer comparison first where that is cheaper).
    pub fn route_merged(
        &mut self,
        topic: &str,
        ctx: &PublishContext,
        accept: impl FnMut(&S) -> bool,
        scratch: &mut Vec<Delivery<S, T>>,
        out: &mut Vec<Delivery<S, T>>,
        same: impl Fn(&S, &S) -> bool,
    ) {
        out.clear();
        scratch.clear();
        let sources = self.route(topic, ctx, accept, scratch);
        if sources <= 1 {
            // Within one subscriber set every subscriber is distinct: nothing to merge.
            out.append(scratch);
            return;
        }
        for d in scratch.drain(..) {
            let plain = !matches!(d.kind, DeliveryKind::Shared { .. });
            let earlier = if plain {
                out.iter_mut().rev().take(MERGE_WINDOW).find(|e| {
                    !matches!(e.kind, DeliveryKind::Shared { .. })
                        && same(&e.subscriber, &d.subscriber)
                })
            } else {
                None
            };
            match earlier {
                Some(e) => e.options.merge(d.options),
                None => out.push(d),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RouterConfig;

    /// The MQTT rule on a small stand-in for the broker's options.
    #[derive(Debug, Clone, PartialEq, Eq, Default)]
    struct Opts {
        qos: u8,
        no_local: bool,
        rap: bool,
        ids: Vec<u32>,
    }

    impl Merge for Opts {
        fn merge(&mut self, o: Self) {
            self.qos = self.qos.max(o.qos);
            self.no_local &= o.no_local;
            self.rap |= o.rap;
            self.ids.extend(o.ids);
        }
    }

    fn opts(qos: u8, id: u32) -> Opts {
        Opts {
            qos,
            no_local: true,
            rap: false,
            ids: vec![id],
        }
    }

    fn route(r: &mut Router<u32, Opts>, topic: &str) -> Vec<Delivery<u32, Opts>> {
        let (mut scratch, mut out) = (Vec::new(), Vec::new());
        r.route_merged(
            topic,
            &PublishContext::default(),
            |_| true,
            &mut scratch,
            &mut out,
            |a, b| a == b,
        );
        out
    }

    #[test]
    fn overlapping_subscriptions_give_one_copy_at_the_highest_qos_with_every_id() {
        let mut r = Router::new(RouterConfig::default());
        r.subscribe(1, "a/b", opts(0, 1)).unwrap();
        r.subscribe(1, "a/+", opts(2, 2)).unwrap();
        r.subscribe(1, "#", opts(1, 3)).unwrap();
        r.subscribe(2, "a/#", opts(1, 4)).unwrap();
        let mut out = route(&mut r, "a/b");
        out.sort_by_key(|d| d.subscriber);
        assert_eq!(out.len(), 2, "{out:?}");
        let one = &out[0].options;
        assert_eq!(one.qos, 2);
        let mut ids = one.ids.clone();
        ids.sort_unstable();
        assert_eq!(ids, vec![1, 2, 3]);
        assert_eq!(out[1].options, opts(1, 4));
    }

    #[test]
    fn no_local_holds_only_if_every_match_says_so() {
        let mut r = Router::new(RouterConfig::default());
        r.subscribe(1, "a/b", opts(0, 1)).unwrap();
        let mut loose = opts(0, 2);
        loose.no_local = false;
        loose.rap = true;
        r.subscribe(1, "a/#", loose).unwrap();
        let out = route(&mut r, "a/b");
        assert_eq!(out.len(), 1);
        assert!(!out[0].options.no_local);
        assert!(out[0].options.rap);
    }

    #[test]
    fn a_shared_copy_stays_apart_from_the_plain_one() {
        let mut r = Router::new(RouterConfig::default());
        r.subscribe(1, "a/b", opts(0, 1)).unwrap();
        r.subscribe(1, "$share/g/a/b", opts(1, 2)).unwrap();
        r.subscribe(1, "$share/h/a/+", opts(1, 3)).unwrap();
        r.subscribe(1, "$exclusive/a/#", opts(2, 4)).unwrap();
        let out = route(&mut r, "a/b");
        let shared = out
            .iter()
            .filter(|d| matches!(d.kind, DeliveryKind::Shared { .. }))
            .count();
        assert_eq!((out.len(), shared), (3, 2), "{out:?}");
        let plain = out
            .iter()
            .find(|d| !matches!(d.kind, DeliveryKind::Shared { .. }))
            .unwrap();
        assert_eq!(plain.options.qos, 2, "plain and exclusive merge");
    }
}
