//! Shared subscription groups: one member receives each matching publish.

use std::hash::Hash;
use std::sync::Arc;

use crate::Map;

/// How a shared group picks the member that receives a publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SharedStrategy {
    /// Members take turns, in subscription order.
    #[default]
    RoundRobin,
    /// A member drawn from [`PublishContext::random`].
    Random,
    /// The same member until it leaves the group (or refuses a delivery), then the next one.
    Sticky,
    /// A member chosen by [`PublishContext::publisher_hash`], so one publisher's messages go
    /// to one member (keeping their order) while membership does not change.
    PublisherHash,
}

/// Per-publish inputs of the shared-group strategies. The router draws no randomness itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublishContext {
    /// A draw from the caller's seeded RNG; used by [`SharedStrategy::Random`]. One draw per
    /// publish is enough: each group in a match mixes it with its position in the match.
    pub random: u64,
    /// A hash of the publisher's client id, e.g. from [`crate::Router::publisher_hash`];
    /// used by [`SharedStrategy::PublisherHash`].
    pub publisher_hash: u64,
}

/// The outcome of picking a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pick {
    pub index: usize,
    /// The member passed the caller's predicate; `false` means no member did and `index` is
    /// the strategy's first choice.
    pub accepted: bool,
}

/// The members of one `(group, filter)` shared subscription.
///
/// Members live in a `Vec` (the round-robin order) with a map from subscriber to position, so
/// join, leave and pick are O(1) apart from the probe past refusing members.
#[derive(Debug, Clone)]
pub(crate) struct SharedGroup<S, T> {
    pub name: Arc<str>,
    pub filter: Arc<str>,
    members: Vec<(S, T)>,
    index: Map<S, usize>,
    /// Round-robin position of the next pick, taken modulo the member count.
    cursor: usize,
    /// Position of the sticky member, if one was picked and has not left.
    sticky: Option<usize>,
}

impl<S: Clone + Eq + Hash, T> SharedGroup<S, T> {
    pub fn new(name: Arc<str>, filter: Arc<str>, hasher: crate::FixedState) -> Self {
        Self {
            name,
            filter,
            members: Vec::new(),
            index: Map::with_hasher(hasher),
            cursor: 0,
            sticky: None,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    pub fn get(&self, subscriber: &S) -> Option<&T> {
        self.index.get(subscriber).map(|&i| &self.members[i].1)
    }

    pub fn member(&self, index: usize) -> &(S, T) {
        &self.members[index]
    }

    pub fn members(&self) -> impl Iterator<Item = (&S, &T)> {
        self.members.iter().map(|(s, t)| (s, t))
    }

    /// Adds a member at the end of the rotation, or replaces its options in place.
    pub fn insert(&mut self, subscriber: S, options: T) -> Option<T> {
        if let Some(&i) = self.index.get(&subscriber) {
            return Some(std::mem::replace(&mut self.members[i].1, options));
        }
        self.index.insert(subscriber.clone(), self.members.len());
        self.members.push((subscriber, options));
        None
    }

    pub fn remove(&mut self, subscriber: &S) -> Option<T> {
        let i = self.index.remove(subscriber)?;
        let (_, options) = self.members.swap_remove(i);
        let moved_from = self.members.len();
        if i < moved_from {
            // swap_remove moved the last member into slot `i`.
            let moved = &self.members[i].0;
            *self
                .index
                .get_mut(moved)
                .expect("the index holds every member") = i;
        }
        self.sticky = match self.sticky {
            Some(s) if s == i => None,
            Some(s) if s == moved_from => Some(i),
            other => other,
        };
        assert_eq!(self.index.len(), self.members.len());
        Some(options)
    }

    /// Picks a member: the strategy's first choice if `accept` takes it, else the next members
    /// in order until one is accepted. `draw` is this group's share of the publish randomness.
    /// Returns `None` only for an empty group.
    pub fn pick(
        &mut self,
        strategy: SharedStrategy,
        draw: u64,
        publisher_hash: u64,
        accept: &mut dyn FnMut(&S) -> bool,
    ) -> Option<Pick> {
        let n = self.members.len();
        if n == 0 {
            return None;
        }
        let start = match strategy {
            SharedStrategy::RoundRobin => self.cursor % n,
            SharedStrategy::Random => (draw % n as u64) as usize,
            SharedStrategy::PublisherHash => (mix(publisher_hash) % n as u64) as usize,
            SharedStrategy::Sticky => self.sticky.unwrap_or(0),
        };
        let found = (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| accept(&self.members[i].0));
        let pick = match found {
            Some(index) => Pick {
                index,
                accepted: true,
            },
            None => Pick {
                index: start,
                accepted: false,
            },
        };
        match strategy {
            // Advance even when nobody accepted, so queued fallbacks spread over the members.
            SharedStrategy::RoundRobin => self.cursor = pick.index + 1,
            SharedStrategy::Sticky => self.sticky = Some(pick.index),
            SharedStrategy::Random | SharedStrategy::PublisherHash => {}
        }
        Some(pick)
    }
}

/// SplitMix64's finalizer: spreads caller-supplied values (sequential ids, weak hashes) over
/// all 64 bits before they are reduced modulo the member count.
pub(crate) fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(members: &[u32]) -> SharedGroup<u32, ()> {
        let mut g = SharedGroup::new("g".into(), "f".into(), crate::FixedState::with_seed(0));
        for &m in members {
            g.insert(m, ());
        }
        g
    }

    fn pick(
        g: &mut SharedGroup<u32, ()>,
        s: SharedStrategy,
        accept: &mut dyn FnMut(&u32) -> bool,
    ) -> (u32, bool) {
        let p = g.pick(s, 0, 0, accept).expect("group is not empty");
        (g.member(p.index).0, p.accepted)
    }

    #[test]
    fn leaving_member_keeps_index_consistent() {
        let mut g = group(&[1, 2, 3, 4]);
        assert_eq!(g.remove(&2), Some(()));
        assert_eq!(g.remove(&2), None);
        assert!(g.get(&4).is_some() && g.get(&1).is_some() && g.get(&3).is_some());
        assert_eq!(g.remove(&4), Some(()));
        assert_eq!(g.members().map(|(s, _)| *s).collect::<Vec<_>>(), vec![1, 3]);
    }

    #[test]
    fn sticky_member_follows_swap_remove() {
        let mut g = group(&[1, 2, 3]);
        let mut only_three = |s: &u32| *s == 3;
        assert_eq!(
            pick(&mut g, SharedStrategy::Sticky, &mut only_three),
            (3, true)
        );
        g.remove(&1); // moves 3 into slot 0
        assert_eq!(
            pick(&mut g, SharedStrategy::Sticky, &mut |_| true),
            (3, true)
        );
        g.remove(&3);
        assert_eq!(
            pick(&mut g, SharedStrategy::Sticky, &mut |_| true),
            (2, true)
        );
    }

    #[test]
    fn nobody_accepting_returns_first_choice_unaccepted() {
        let mut g = group(&[1, 2]);
        assert_eq!(
            pick(&mut g, SharedStrategy::RoundRobin, &mut |_| false),
            (1, false)
        );
        assert_eq!(
            pick(&mut g, SharedStrategy::RoundRobin, &mut |_| false),
            (2, false)
        );
    }
}
