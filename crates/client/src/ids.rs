//! Packet identifiers in use, as a ring in allocation order.
//!
//! Identifiers are handed out in sequence (1, 2, …, 65535, 1, …) and live in
//! a `VecDeque` whose front is the oldest still in use; a released slot in
//! the middle stays as a hole until everything before it is released. Every
//! operation is O(1) and allocation-free once the ring has grown to its
//! working size, which the load tool needs at a million messages a second;
//! and iteration is in sending order, which resending needs (MQTT 5 §4.6).
//! The cost: an identifier that is never acknowledged stops allocation
//! 65,535 identifiers later ([`Ring::push`] returns `None`).

use std::collections::VecDeque;

use starling_codec::PacketId;

/// The number of packet identifiers (MQTT 5 §2.2.1: 1..=65535).
const IDS: usize = u16::MAX as usize;

#[derive(Debug, Clone)]
pub(crate) struct Ring<T> {
    slots: VecDeque<Option<T>>,
    /// The identifier of `slots[0]`.
    front: PacketId,
    used: usize,
}

impl<T> Ring<T> {
    pub(crate) fn new() -> Self {
        Ring {
            slots: VecDeque::new(),
            front: PacketId::MIN,
            used: 0,
        }
    }

    /// Identifiers in use.
    pub(crate) fn len(&self) -> usize {
        self.used
    }

    /// The identifier the next [`Ring::push`] takes, or `None` if all are in use.
    pub(crate) fn next_id(&self) -> Option<PacketId> {
        (self.slots.len() < IDS).then(|| nth_after(self.front, self.slots.len()))
    }

    /// Takes the next identifier for `value`, or `None` if all are in use.
    pub(crate) fn push(&mut self, value: T) -> Option<PacketId> {
        let id = self.next_id()?;
        self.slots.push_back(Some(value));
        self.used += 1;
        Some(id)
    }

    pub(crate) fn get_mut(&mut self, id: PacketId) -> Option<&mut T> {
        let i = self.index(id)?;
        self.slots[i].as_mut()
    }

    /// Releases `id`, returning what it held, or `None` if it was not in use.
    pub(crate) fn remove(&mut self, id: PacketId) -> Option<T> {
        let i = self.index(id)?;
        let value = self.slots[i].take()?;
        self.used -= 1;
        while let Some(None) = self.slots.front() {
            self.slots.pop_front();
            self.front = nth_after(self.front, 1);
        }
        assert!(self.used <= self.slots.len(), "used slots fit the ring");
        Some(value)
    }

    /// Releases every identifier, keeping what they held, in sending order.
    /// The next identifier continues the sequence, so that a late
    /// acknowledgement of an old one is not mistaken for a new one's.
    pub(crate) fn drain(&mut self) -> Vec<(PacketId, T)> {
        let front = self.front;
        let out = self
            .slots
            .drain(..)
            .enumerate()
            .filter_map(|(i, v)| v.map(|v| (nth_after(front, i), v)))
            .collect::<Vec<_>>();
        self.front = nth_after(
            front,
            out.last().map_or(0, |(id, _)| offset(front, *id) + 1),
        );
        self.used = 0;
        out
    }

    /// What is in use, in sending order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (PacketId, &T)> {
        let front = self.front;
        self.slots
            .iter()
            .enumerate()
            .filter_map(move |(i, v)| v.as_ref().map(|v| (nth_after(front, i), v)))
    }

    fn index(&self, id: PacketId) -> Option<usize> {
        let i = offset(self.front, id);
        (i < self.slots.len()).then_some(i)
    }
}

/// The identifier `n` places after `id`, wrapping from 65535 to 1.
fn nth_after(id: PacketId, n: usize) -> PacketId {
    let zero_based = (usize::from(id.get()) - 1 + n) % IDS;
    // In 1..=65535 by construction.
    PacketId::new(zero_based as u16 + 1).expect("non-zero")
}

/// How many places `id` is after `front`, in 0..65535.
fn offset(front: PacketId, id: PacketId) -> usize {
    (usize::from(id.get()) + IDS - usize::from(front.get())) % IDS
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    fn id(n: u16) -> PacketId {
        PacketId::new(n).unwrap()
    }

    #[test]
    fn identifiers_wrap_from_65535_to_1() {
        let mut ring = Ring::new();
        for n in 1..=u16::MAX {
            assert_eq!(ring.push(()), Some(id(n)));
            ring.remove(id(n)).unwrap();
        }
        assert_eq!(ring.push(()), Some(id(1)));
    }

    #[test]
    fn an_unacknowledged_identifier_blocks_allocation_a_full_cycle_later() {
        let mut ring = Ring::new();
        let stuck = ring.push(()).unwrap();
        for _ in 1..IDS {
            let n = ring.push(()).unwrap();
            ring.remove(n).unwrap();
        }
        assert_eq!(ring.push(()), None, "the next identifier would be {stuck}");
        ring.remove(stuck).unwrap();
        assert_eq!(ring.push(()), Some(stuck));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Push,
        /// Remove the n-th identifier in use (modulo), or a random one.
        RemoveInUse(usize),
        RemoveAny(u16),
        Drain,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => Just(Op::Push),
            3 => any::<usize>().prop_map(Op::RemoveInUse),
            1 => (1..=u16::MAX).prop_map(Op::RemoveAny),
            1 => Just(Op::Drain),
        ]
    }

    proptest! {
        /// The ring agrees with a map of identifiers in use: identifiers are
        /// unique while in use, removal finds exactly what was pushed, and
        /// iteration is in pushing order.
        #[test]
        fn ring_agrees_with_a_map_of_identifiers_in_use(ops in prop::collection::vec(op(), 1..400)) {
            let mut ring = Ring::new();
            let mut model: BTreeMap<u16, u64> = BTreeMap::new();
            let mut seq = 0u64;
            for op in ops {
                match op {
                    Op::Push => {
                        seq += 1;
                        let got = ring.push(seq).unwrap();
                        prop_assert!(model.insert(got.get(), seq).is_none(), "{got} handed out twice");
                    }
                    Op::RemoveInUse(n) => {
                        if let Some(&k) = model.keys().nth(n % model.len().max(1)) {
                            prop_assert_eq!(ring.remove(id(k)), model.remove(&k));
                        }
                    }
                    Op::RemoveAny(k) => {
                        prop_assert_eq!(ring.remove(id(k)), model.remove(&k));
                    }
                    Op::Drain => {
                        let drained: Vec<u64> = ring.drain().into_iter().map(|(_, v)| v).collect();
                        let mut expected: Vec<u64> = model.values().copied().collect();
                        expected.sort_unstable();
                        prop_assert_eq!(drained, expected);
                        model.clear();
                    }
                }
                prop_assert_eq!(ring.len(), model.len());
                let order: Vec<u64> = ring.iter().map(|(_, v)| *v).collect();
                let mut sorted = order.clone();
                sorted.sort_unstable();
                prop_assert_eq!(order, sorted, "iteration is in pushing order");
            }
        }
    }
}
