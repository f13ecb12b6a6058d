//! Acknowledgements that wait for the store: the PUBACK or PUBREC of a QoS 1/2 publish that
//! changes stored state (a retained message, a `$delayed/` publish) goes out only once the
//! shard's write of it is durable. MQTT (4.6) wants acknowledgements in the order their
//! PUBLISHes came, so what follows a waiting one waits behind it, ready.

use std::collections::VecDeque;

use starling_codec::{Packet, PacketId, ReasonCode};

use crate::msg::{Stored, OWN_WRITE};

/// A client's acknowledgements held back, oldest first.
#[derive(Debug, Default)]
pub(super) struct Acks {
    next: u32,
    /// The publish just routed whose acknowledgement is the next one the session emits.
    awaiting: Option<u32>,
    parked: VecDeque<Parked>,
}

#[derive(Debug)]
struct Parked {
    /// `None` once it may go (in its turn).
    waits_for: Option<u32>,
    packet: Packet,
}

impl Acks {
    /// A publish is about to be routed and its acknowledgement must wait for the store:
    /// the tag the shard answers with.
    pub(super) fn request(&mut self) -> u32 {
        self.next = self.next.wrapping_add(1);
        if self.next == OWN_WRITE {
            self.next = 1;
        }
        self.awaiting = Some(self.next);
        self.next
    }

    /// An acknowledgement the session emits: back if it may be written now, else kept.
    pub(super) fn pass(&mut self, p: Packet) -> Option<Packet> {
        let is_ack = matches!(p, Packet::Puback(_) | Packet::Pubrec(_));
        let waits_for = if is_ack { self.awaiting.take() } else { None };
        if waits_for.is_none() && (self.parked.is_empty() || !is_ack) {
            // Nothing ahead of it (or not an acknowledgement of a publish: PINGRESP,
            // SUBACK, PUBCOMP of an earlier flow, which MQTT does not order with PUBACKs).
            return Some(p);
        }
        self.parked.push_back(Parked {
            waits_for,
            packet: p,
        });
        None
    }

    /// The store answered for `tag`: an MQTT 5 acknowledgement says if it was refused or
    /// not confirmed. Returns the packet id of a PUBREC turned into an error: that ends the
    /// QoS 2 exchange (MQTT 5 §4.3.3), and the session must stop waiting for its PUBREL.
    pub(super) fn stored(&mut self, tag: u32, outcome: Stored, v5: bool) -> Option<PacketId> {
        let p = self.parked.iter_mut().find(|p| p.waits_for == Some(tag))?;
        p.waits_for = None;
        let code = match outcome {
            // MQTT 5 §3.4.2.1 / §3.5.2.1: the store is full, or a node did not confirm.
            Stored::Refused => ReasonCode::QuotaExceeded,
            Stored::Unconfirmed => ReasonCode::UnspecifiedError,
            Stored::Durable | Stored::Failed => return None,
        };
        if !v5 {
            // 3.x has no failing acknowledgement.
            return None;
        }
        match &mut p.packet {
            Packet::Puback(a) if !a.reason_code.is_error() => {
                a.reason_code = code;
                None
            }
            Packet::Pubrec(a) if !a.reason_code.is_error() => {
                a.reason_code = code;
                Some(a.packet_id)
            }
            _ => None,
        }
    }

    /// The acknowledgements that may go now, in order.
    pub(super) fn ready(&mut self) -> impl Iterator<Item = Packet> + '_ {
        std::iter::from_fn(|| {
            if self.parked.front()?.waits_for.is_none() {
                self.parked.pop_front().map(|p| p.packet)
            } else {
                None
            }
        })
    }

    pub(super) fn is_empty(&self) -> bool {
        self.parked.is_empty() && self.awaiting.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use starling_codec::PubAck;
    use std::num::NonZeroU16;

    fn puback(id: u16) -> Packet {
        Packet::Puback(PubAck::new(NonZeroU16::new(id).expect("non-zero")))
    }

    fn ids(ps: Vec<Packet>) -> Vec<u16> {
        ps.into_iter()
            .map(|p| match p {
                Packet::Puback(a) | Packet::Pubrec(a) => a.packet_id.get(),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn acknowledgements_behind_a_waiting_one_wait_and_go_in_order() {
        let mut a = Acks::default();
        assert!(a.pass(puback(1)).is_some(), "nothing waits: at once");
        let t2 = a.request();
        assert!(a.pass(puback(2)).is_none());
        assert!(a.pass(puback(3)).is_none(), "behind 2, though ready");
        let t4 = a.request();
        assert!(a.pass(puback(4)).is_none());
        assert!(
            a.pass(Packet::Pingresp).is_some(),
            "not ordered with PUBACKs"
        );
        a.stored(t4, Stored::Durable, true);
        assert!(ids(a.ready().collect()).is_empty(), "2 still waits");
        a.stored(t2, Stored::Durable, true);
        assert_eq!(ids(a.ready().collect()), vec![2, 3, 4]);
        assert!(a.is_empty());
    }

    #[test]
    fn a_refused_write_gives_quota_exceeded_on_a_v5_puback_only() {
        let mut a = Acks::default();
        let t = a.request();
        assert!(a.pass(puback(7)).is_none());
        a.stored(t, Stored::Refused, true);
        let first = a.ready().next();
        match first {
            Some(Packet::Puback(p)) => assert_eq!(p.reason_code, ReasonCode::QuotaExceeded),
            other => panic!("{other:?}"),
        }
        let t = a.request();
        assert!(a.pass(puback(8)).is_none());
        a.stored(t, Stored::Refused, false);
        let first = a.ready().next();
        match first {
            Some(Packet::Puback(p)) => assert_eq!(p.reason_code, ReasonCode::Success),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_unconfirmed_qos2_publish_gets_a_failing_pubrec_on_v5_and_its_id_back() {
        let pubrec = |id| Packet::Pubrec(PubAck::new(NonZeroU16::new(id).expect("non-zero")));
        let mut a = Acks::default();
        let t = a.request();
        assert!(a.pass(pubrec(9)).is_none());
        assert_eq!(
            a.stored(t, Stored::Unconfirmed, true),
            NonZeroU16::new(9),
            "the session must stop waiting for PUBREL 9"
        );
        match a.ready().next() {
            Some(Packet::Pubrec(p)) => assert_eq!(p.reason_code, ReasonCode::UnspecifiedError),
            other => panic!("{other:?}"),
        }
        // A durable one, and 3.x (no failing acknowledgement): unchanged, nothing released.
        for (outcome, v5) in [(Stored::Durable, true), (Stored::Unconfirmed, false)] {
            let t = a.request();
            assert!(a.pass(pubrec(10)).is_none());
            assert_eq!(a.stored(t, outcome, v5), None);
            match a.ready().next() {
                Some(Packet::Pubrec(p)) => assert_eq!(p.reason_code, ReasonCode::Success),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn an_answer_for_a_forgotten_tag_changes_nothing() {
        let mut a = Acks::default();
        a.stored(42, Stored::Durable, true);
        let t = a.request();
        assert!(a.pass(puback(1)).is_none());
        a.stored(t.wrapping_add(1), Stored::Durable, true);
        assert_eq!(a.ready().count(), 0);
    }
}
