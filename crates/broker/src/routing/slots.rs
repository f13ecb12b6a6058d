//! A shard's destinations, each in a numbered slot: the router's subscriptions name a
//! subscriber by its slot, so that a delivery finds its destination by an index instead of
//! hashing the client id twice (the online check, then the offer), and copies a number
//! instead of raising and dropping a reference count (fan-out QoS 0 1.08x,
//! docs/benchmarks.md, "Fourteenth look").
//!
//! A slot lives while its destination does or while the router holds a subscription that
//! names it (a subscription outlives its session's end until its unsubscribe comes): so a
//! slot the router hands out always names the key it was subscribed under. An admitted
//! `$exclusive/` subscription that evicts a holder whose removal has not arrived yet (a
//! cluster race, `Router::subscribe_admitted`) lets the holder's slot go at once: that
//! removal finds no subscription, and would not (it left the holder's slot counted one
//! too many, kept until the process ended).

use std::collections::HashMap;
use std::sync::Arc;

use foldhash::fast::FixedState;

use crate::destination::Destination;

/// A subscriber (a local client or another node) as the router's subscriptions name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Slot(u32);

impl Slot {
    /// A slot no key has: what a key without a slot is asked about (no subscription
    /// names it).
    pub(crate) const NONE: Slot = Slot(u32::MAX);
}

struct Entry {
    key: Arc<str>,
    dest: Option<Destination>,
    /// Subscriptions in the router that name this slot.
    subs: u32,
}

/// Destinations by key (a client id, or `remote_key` of a node) and by slot.
pub(crate) struct Destinations {
    entries: Vec<Option<Entry>>,
    index: HashMap<Arc<str>, u32, FixedState>,
    free: Vec<u32>,
}

impl Destinations {
    pub(crate) fn new(seed: u64) -> Self {
        Destinations {
            entries: Vec::new(),
            index: HashMap::with_hasher(FixedState::with_seed(seed)),
            free: Vec::new(),
        }
    }

    fn entry(&self, key: &str) -> Option<&Entry> {
        let i = *self.index.get(key)?;
        self.entries[i as usize].as_ref()
    }

    fn entry_mut(&mut self, key: &str) -> Option<&mut Entry> {
        let i = *self.index.get(key)?;
        self.entries[i as usize].as_mut()
    }

    pub(crate) fn get(&self, key: &str) -> Option<&Destination> {
        self.entry(key)?.dest.as_ref()
    }

    pub(crate) fn get_mut(&mut self, key: &str) -> Option<&mut Destination> {
        self.entry_mut(key)?.dest.as_mut()
    }

    #[cfg(test)]
    pub(crate) fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Puts `dest` under `key`, in the slot the key already has if any; returns the
    /// destination it replaces.
    pub(crate) fn insert(&mut self, key: Arc<str>, dest: Destination) -> Option<Destination> {
        let slot = self.slot_for(key);
        let e = self.entries[slot.0 as usize]
            .as_mut()
            .expect("a slot just found or made");
        e.dest.replace(dest)
    }

    /// The destination under `key`, made by `make` if there is none.
    pub(crate) fn get_or_insert_with(
        &mut self,
        key: Arc<str>,
        make: impl FnOnce() -> Destination,
    ) -> &mut Destination {
        let slot = self.slot_for(key);
        let e = self.entries[slot.0 as usize]
            .as_mut()
            .expect("a slot just found or made");
        e.dest.get_or_insert_with(make)
    }

    /// Takes the destination under `key` out; its slot goes once no subscription names it.
    pub(crate) fn remove(&mut self, key: &str) -> Option<Destination> {
        let i = *self.index.get(key)?;
        let dest = self.entries[i as usize].as_mut()?.dest.take();
        self.free_if_unused(i);
        dest
    }

    /// The slot of `key`, made (with no destination yet) if it has none: for a
    /// subscription about to be added under it.
    pub(crate) fn slot_for(&mut self, key: Arc<str>) -> Slot {
        if let Some(&i) = self.index.get(&key) {
            return Slot(i);
        }
        let e = Entry {
            key: key.clone(),
            dest: None,
            subs: 0,
        };
        let i = match self.free.pop() {
            Some(i) => {
                debug_assert!(self.entries[i as usize].is_none());
                self.entries[i as usize] = Some(e);
                i
            }
            None => {
                let i = u32::try_from(self.entries.len())
                    .ok()
                    .filter(|&i| i < Slot::NONE.0)
                    .expect("fewer than 2^32 - 1 destinations");
                self.entries.push(Some(e));
                i
            }
        };
        self.index.insert(key, i);
        Slot(i)
    }

    /// The slot of `key`, if it has one.
    pub(crate) fn slot(&self, key: &str) -> Option<Slot> {
        self.index.get(key).map(|&i| Slot(i))
    }

    /// The router added a subscription naming `slot`.
    pub(crate) fn subscribed(&mut self, slot: Slot) {
        if let Some(e) = self.entries[slot.0 as usize].as_mut() {
            e.subs += 1;
        }
    }

    /// The router removed a subscription naming `slot`.
    pub(crate) fn unsubscribed(&mut self, slot: Slot) {
        if let Some(e) = self.entries[slot.0 as usize].as_mut() {
            debug_assert!(e.subs > 0, "a slot unsubscribed more than subscribed");
            e.subs = e.subs.saturating_sub(1);
        }
        self.free_if_unused(slot.0);
    }

    /// A slot made for a subscription the router refused goes, if nothing else holds it.
    pub(crate) fn refused(&mut self, slot: Slot) {
        self.free_if_unused(slot.0);
    }

    fn free_if_unused(&mut self, i: u32) {
        let unused = self.entries[i as usize]
            .as_ref()
            .is_some_and(|e| e.dest.is_none() && e.subs == 0);
        if unused {
            if let Some(e) = self.entries[i as usize].take() {
                self.index.remove(&e.key);
                self.free.push(i);
            }
        }
    }

    /// The key a slot the router handed out names.
    pub(crate) fn key(&self, slot: Slot) -> &Arc<str> {
        &self.entries[slot.0 as usize]
            .as_ref()
            .expect("a slot the router names is live")
            .key
    }

    /// The destination in `slot`, if it has one now.
    pub(crate) fn at(&self, slot: Slot) -> Option<&Destination> {
        self.entries[slot.0 as usize].as_ref()?.dest.as_ref()
    }

    /// The key and the destination in `slot`, if it has one now.
    pub(crate) fn at_mut(&mut self, slot: Slot) -> Option<(&Arc<str>, &mut Destination)> {
        let e = self.entries[slot.0 as usize].as_mut()?;
        Some((&e.key, e.dest.as_mut()?))
    }

    /// Live slots (with a destination or named by a subscription).
    #[cfg(test)]
    pub(crate) fn slots(&self) -> usize {
        self.index.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::destination::RemoteNode;

    fn remote(node: u64) -> Destination {
        Destination::Remote(RemoteNode::new(
            node,
            starling_raft::DataLinks::default(),
            1,
        ))
    }

    #[test]
    fn a_slot_lives_while_its_destination_or_a_subscription_does() {
        let mut d = Destinations::new(1);
        let a: Arc<str> = Arc::from("a");
        let s = d.slot_for(a.clone());
        d.subscribed(s);
        assert!(d.at(s).is_none(), "subscribed before its destination came");
        assert!(d.insert(a.clone(), remote(1)).is_none());
        assert_eq!(d.slot(&a), Some(s), "the same slot");
        assert!(d.at(s).is_some() && d.get("a").is_some());
        // The destination goes first: the slot stays for the subscription.
        assert!(d.remove("a").is_some());
        assert_eq!(d.key(s), &a);
        assert!(d.at(s).is_none() && !d.contains_key("a"));
        d.unsubscribed(s);
        assert_eq!(d.slots(), 0, "freed with its last subscription");
        // A freed slot is used again, for whatever key comes next.
        let b = d.slot_for(Arc::from("b"));
        assert_eq!(b, s);
        assert_eq!(&**d.key(b), "b");
        assert_eq!(d.slot("a"), None);
    }

    #[test]
    fn a_destination_without_subscriptions_frees_its_slot_when_removed() {
        let mut d = Destinations::new(2);
        d.get_or_insert_with(Arc::from("n"), || remote(3));
        d.get_or_insert_with(Arc::from("n"), || unreachable!("already there"));
        let s = d.slot("n").unwrap();
        d.subscribed(s);
        d.unsubscribed(s);
        assert!(d.get("n").is_some(), "kept: it has its destination");
        assert!(d.remove("n").is_some());
        assert_eq!(d.slots(), 0);
        assert!(d.remove("n").is_none());
    }

    #[test]
    fn a_slot_made_for_a_refused_subscription_goes_unless_held() {
        let mut d = Destinations::new(3);
        let s = d.slot_for(Arc::from("x"));
        d.refused(s);
        assert_eq!(d.slots(), 0);
        d.insert(Arc::from("y"), remote(4));
        let y = d.slot_for(Arc::from("y"));
        d.refused(y);
        assert_eq!(d.slot("y"), Some(y), "held by its destination");
    }
}
