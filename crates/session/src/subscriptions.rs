//! A session's subscriptions: filter → granted options and subscription identifier, in
//! filter order.
//!
//! A sorted `Vec`, not a `BTreeMap`: most sessions hold one subscription or a few, and a
//! `BTreeMap`'s first leaf is 408 bytes whatever it holds, paid by every subscribed
//! connection of a fleet. Lookups are a binary search; an insert or a removal moves the
//! entries after it, which for a session's handful of filters is less than a tree's
//! bookkeeping. A session's count is bounded by `subscriptions_max`.

use starling_codec::SubscriptionOptions;

/// What a session holds per filter: the options as granted, and the subscription identifier.
pub type Subscription = (SubscriptionOptions, Option<u32>);

/// Filter → [`Subscription`], iterated in filter order (as a `BTreeMap` would be).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subscriptions {
    entries: Vec<(String, Subscription)>,
}

impl Subscriptions {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn find(&self, filter: &str) -> Result<usize, usize> {
        self.entries
            .binary_search_by(|(f, _)| f.as_str().cmp(filter))
    }

    pub fn get(&self, filter: &str) -> Option<&Subscription> {
        self.find(filter).ok().map(|i| &self.entries[i].1)
    }

    pub fn contains_key(&self, filter: &str) -> bool {
        self.find(filter).is_ok()
    }

    /// Sets `filter`'s subscription; the one it replaces, if any.
    pub fn insert(&mut self, filter: String, sub: Subscription) -> Option<Subscription> {
        match self.find(&filter) {
            Ok(i) => Some(std::mem::replace(&mut self.entries[i].1, sub)),
            Err(i) => {
                // Room for exactly one at first: the common session never holds more.
                if self.entries.capacity() == 0 {
                    self.entries.reserve_exact(1);
                }
                self.entries.insert(i, (filter, sub));
                None
            }
        }
    }

    pub fn remove(&mut self, filter: &str) -> Option<Subscription> {
        let i = self.find(filter).ok()?;
        let (_, sub) = self.entries.remove(i);
        if self.entries.is_empty() {
            self.entries = Vec::new();
        }
        Some(sub)
    }

    /// In filter order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Subscription)> {
        self.entries.iter().map(|(f, s)| (f, s))
    }

    /// In filter order.
    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.entries.iter().map(|(f, _)| f)
    }

    /// The filters, in order, the subscriptions given up.
    pub fn into_keys(self) -> impl Iterator<Item = String> {
        self.entries.into_iter().map(|(f, _)| f)
    }
}

impl std::ops::Index<&str> for Subscriptions {
    type Output = Subscription;

    /// Panics when `filter` is not subscribed, as a map's index does.
    fn index(&self, filter: &str) -> &Subscription {
        self.get(filter).expect("no subscription for this filter")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use starling_codec::QoS;
    use std::collections::BTreeMap;

    fn sub(q: u8, id: Option<u32>) -> Subscription {
        let qos = match q % 3 {
            0 => QoS::AtMostOnce,
            1 => QoS::AtLeastOnce,
            _ => QoS::ExactlyOnce,
        };
        (
            SubscriptionOptions {
                qos,
                ..SubscriptionOptions::default()
            },
            id,
        )
    }

    proptest! {
        /// It behaves as the `BTreeMap` it replaced, operation by operation.
        #[test]
        fn behaves_as_a_btreemap(ops in prop::collection::vec(
            (any::<bool>(), "[a-c]{0,3}", any::<u8>(), prop::option::of(1u32..5)), 0..60)
        ) {
            let mut ours = Subscriptions::new();
            let mut model = BTreeMap::new();
            for (insert, f, q, id) in ops {
                if insert {
                    prop_assert_eq!(ours.insert(f.clone(), sub(q, id)), model.insert(f, sub(q, id)));
                } else {
                    prop_assert_eq!(ours.remove(&f), model.remove(&f));
                }
                prop_assert_eq!(ours.len(), model.len());
                prop_assert!(ours.iter().eq(model.iter()));
                for f in model.keys() {
                    prop_assert_eq!(ours.get(f), model.get(f));
                    prop_assert!(ours.contains_key(f));
                }
            }
            prop_assert!(ours.clone().into_keys().eq(model.into_keys()));
        }
    }

    #[test]
    fn one_subscription_takes_one_slot() {
        let mut s = Subscriptions::new();
        s.insert("a/b".into(), sub(1, None));
        assert_eq!(s.entries.capacity(), 1);
        s.remove("a/b");
        assert_eq!(s.entries.capacity(), 0);
    }
}
