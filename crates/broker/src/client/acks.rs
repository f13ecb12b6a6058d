//! Acknowledgements that wait for the store: the PUBACK or PUBREC of a QoS 1/2 publish that
//! changes stored state (a retained message, a `$delayed/` publish) goes out only once the
//! shard's write of it is durable. MQTT (4.6) wants acknowledgements in the order their
//! PUBLISHes came, so what follows a waiting one waits behind it, ready.

use std::collections::VecDeque;

use starling_codec::{Packet, PacketId, Properties, PubAck, ReasonCode};

use crate::msg::{Stored, OWN_WRITE};

/// A client's acknowledgements held back, oldest first.
#[derive(Debug, Default)]
pub(super) struct Acks {
    next: u32,
    /// The publish just routed whose acknowledgement is the next one the session emits.
    awaiting: Option<u32>,
    parked: VecDeque<Parked>,
    /// Inbound QoS 2 messages this actor routed whose PUBREC waited: by packet id, until
    /// their PUBREL, the answer's tag or the answer. Kept across connections: a publisher
    /// that did not get its PUBREC sends the PUBLISH again on its next connection (MQTT
    /// 4.4), and the session, which never routes it twice, answers that resend with a
    /// PUBREC that must say what the first routing came to, not success whatever it was.
    inbound: Vec<(PacketId, Settled)>,
}

/// What became of an inbound QoS 2 message's routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settled {
    /// Waiting for the answer under this tag.
    Pending(u32),
    Done(Stored),
}

/// How to answer a QoS 2 PUBLISH sent again under a packet id still awaiting its PUBREL.
#[derive(Debug, PartialEq)]
pub(super) enum Resent {
    /// As the session says (the first routing is known to be confirmed).
    Pass(Packet),
    /// Held until the first routing's answer, which decides it.
    Parked,
    /// Sent with this error code; the exchange ends and the session must free the id.
    Failed(Packet, PacketId),
}

#[derive(Debug)]
struct Parked {
    /// `None` once it may go (in its turn).
    waits_for: Option<u32>,
    ack: Ack,
}

/// A parked PUBACK or PUBREC, kept small. A publisher whose acknowledgements wait for other
/// nodes has its whole window parked here, each one pushed, scanned by every answer and
/// popped; as a whole `Packet` (its property list inline, a few hundred bytes) that copying
/// was a visible share of a cross-node publish's cost.
#[derive(Debug)]
struct Ack {
    pubrec: bool,
    packet_id: PacketId,
    reason_code: ReasonCode,
    /// Boxed, and only when it has any (a reason string): the usual acknowledgement has none.
    properties: Option<Box<Properties>>,
}

impl Ack {
    /// The acknowledgement in `p`, or `p` back if it is none (boxed: that way is not taken
    /// by the callers, and a bare `Packet` would make every result its size).
    fn of(p: Packet) -> Result<Ack, Box<Packet>> {
        match p {
            Packet::Puback(a) => Ok(Ack::new(false, a)),
            Packet::Pubrec(a) => Ok(Ack::new(true, a)),
            other => Err(Box::new(other)),
        }
    }

    fn new(pubrec: bool, a: PubAck) -> Ack {
        Ack {
            pubrec,
            packet_id: a.packet_id,
            reason_code: a.reason_code,
            properties: (!a.properties.is_empty()).then(|| Box::new(a.properties)),
        }
    }

    fn packet(self) -> Packet {
        let a = PubAck {
            packet_id: self.packet_id,
            reason_code: self.reason_code,
            properties: self.properties.map(|p| *p).unwrap_or_default(),
        };
        if self.pubrec {
            Packet::Pubrec(a)
        } else {
            Packet::Puback(a)
        }
    }
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
        if let (Packet::Pubrec(a), Some(tag)) = (&p, waits_for) {
            self.inbound.retain(|(id, _)| *id != a.packet_id);
            self.inbound.push((a.packet_id, Settled::Pending(tag)));
        }
        if waits_for.is_none() && (self.parked.is_empty() || !is_ack) {
            // Nothing ahead of it (or not an acknowledgement of a publish: PINGRESP,
            // SUBACK, PUBCOMP of an earlier flow, which MQTT does not order with PUBACKs).
            return Some(p);
        }
        match Ack::of(p) {
            Ok(ack) => {
                self.parked.push_back(Parked { waits_for, ack });
                None
            }
            // Not reached: only an acknowledgement gets here.
            Err(p) => Some(*p),
        }
    }

    /// The store answered for `tag`: an MQTT 5 acknowledgement says if it was refused or
    /// not confirmed. Returns the packet id of a PUBREC turned into an error: that ends the
    /// QoS 2 exchange (MQTT 5 §4.3.3), and the session must stop waiting for its PUBREL.
    pub(super) fn stored(&mut self, tag: u32, outcome: Stored, v5: bool) -> Option<PacketId> {
        for (_, s) in &mut self.inbound {
            if *s == Settled::Pending(tag) {
                *s = Settled::Done(outcome);
            }
        }
        let code = match outcome {
            // MQTT 5 §3.4.2.1 / §3.5.2.1: the store is full, or a node did not confirm.
            Stored::Refused => Some(ReasonCode::QuotaExceeded),
            Stored::Unconfirmed => Some(ReasonCode::UnspecifiedError),
            Stored::Durable | Stored::Failed => None,
        };
        // 3.x has no failing acknowledgement.
        let code = code.filter(|_| v5);
        let mut abandoned = None;
        // The first PUBREC and, on a later connection, the one for its resend.
        for p in self.parked.iter_mut().filter(|p| p.waits_for == Some(tag)) {
            p.waits_for = None;
            let Some(code) = code else { continue };
            let a = &mut p.ack;
            if !a.reason_code.is_error() {
                a.reason_code = code;
                if a.pubrec {
                    abandoned = Some(a.packet_id);
                }
            }
        }
        if let Some(id) = abandoned {
            self.released(id);
        }
        abandoned
    }

    /// The acknowledgements that may go now, in order.
    pub(super) fn ready(&mut self) -> impl Iterator<Item = Packet> + '_ {
        std::iter::from_fn(|| {
            if self.parked.front()?.waits_for.is_none() {
                self.parked.pop_front().map(|p| p.ack.packet())
            } else {
                None
            }
        })
    }

    pub(super) fn is_empty(&self) -> bool {
        self.parked.is_empty() && self.awaiting.is_none() && self.inbound.is_empty()
    }

    /// Whether the session's next acknowledgement is that of a publish just routed.
    pub(super) fn is_awaiting(&self) -> bool {
        self.awaiting.is_some()
    }

    /// The connection closed: what waited to be written belonged to it (its client sends
    /// those PUBLISHes again), but the inbound QoS 2 outcomes outlive it.
    pub(super) fn connection_closed(&mut self) {
        self.parked.clear();
        self.awaiting = None;
    }

    /// The inbound QoS 2 exchange of `id` ended (PUBCOMP sent, or abandoned).
    pub(super) fn released(&mut self, id: PacketId) {
        self.inbound.retain(|(i, _)| *i != id);
    }

    /// The session answers a QoS 2 PUBLISH sent again under `pubrec`'s packet id, which it
    /// routed before and does not route twice. The answer says what that routing came to:
    /// success only once it is known confirmed (MQTT 5 may say otherwise: 0x97, 0x80, and
    /// the exchange ends; 3.x has no failing PUBREC). `unknown_fails`: the routing was not
    /// this actor's (a session restored from the store or handed over by another node)
    /// and may have gone to other nodes that never confirmed it.
    pub(super) fn resent(&mut self, pubrec: Packet, v5: bool, unknown_fails: bool) -> Resent {
        let Packet::Pubrec(mut a) = pubrec else {
            return Resent::Pass(pubrec);
        };
        let id = a.packet_id;
        let code = match self.inbound.iter().find(|(i, _)| *i == id).map(|e| e.1) {
            Some(Settled::Pending(tag)) => {
                self.parked.push_back(Parked {
                    waits_for: Some(tag),
                    ack: Ack::new(true, a),
                });
                return Resent::Parked;
            }
            Some(Settled::Done(Stored::Refused)) => ReasonCode::QuotaExceeded,
            Some(Settled::Done(Stored::Unconfirmed)) => ReasonCode::UnspecifiedError,
            None if unknown_fails => ReasonCode::UnspecifiedError,
            Some(Settled::Done(Stored::Durable | Stored::Failed)) | None => {
                return self.pass_resent(Packet::Pubrec(a));
            }
        };
        if !v5 {
            return self.pass_resent(Packet::Pubrec(a));
        }
        a.reason_code = code;
        self.released(id);
        Resent::Failed(Packet::Pubrec(a), id)
    }

    /// A resent PUBLISH's PUBREC that may go: behind any that wait, in order.
    fn pass_resent(&mut self, p: Packet) -> Resent {
        if self.parked.is_empty() {
            return Resent::Pass(p);
        }
        match Ack::of(p) {
            Ok(ack) => {
                self.parked.push_back(Parked {
                    waits_for: None,
                    ack,
                });
                Resent::Parked
            }
            Err(p) => Resent::Pass(*p),
        }
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

    fn pubrec(id: u16) -> Packet {
        Packet::Pubrec(PubAck::new(NonZeroU16::new(id).expect("non-zero")))
    }

    fn code(p: &Packet) -> ReasonCode {
        match p {
            Packet::Puback(a) | Packet::Pubrec(a) => a.reason_code,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_qos2_resend_on_a_new_connection_waits_for_the_first_routing_and_says_how_it_went() {
        let mut a = Acks::default();
        let t = a.request();
        assert!(a.pass(pubrec(5)).is_none());
        // The connection drops before the answer; the publisher sends PUBLISH 5 again.
        a.connection_closed();
        assert!(!a.is_empty(), "the outcome of 5 is still owed");
        assert_eq!(a.resent(pubrec(5), true, true), Resent::Parked);
        // The first routing was not confirmed by another node: the resend must not be
        // told it was, and the exchange ends (the id is free for a new message).
        assert_eq!(a.stored(t, Stored::Unconfirmed, true), NonZeroU16::new(5));
        let out: Vec<Packet> = a.ready().collect();
        assert_eq!(out.len(), 1);
        assert_eq!(code(&out[0]), ReasonCode::UnspecifiedError);
        assert!(a.is_empty());
    }

    #[test]
    fn a_qos2_resend_after_the_answer_came_while_disconnected_gets_that_answer() {
        for (outcome, v5, want, released) in [
            (Stored::Durable, true, ReasonCode::Success, false),
            (
                Stored::Unconfirmed,
                true,
                ReasonCode::UnspecifiedError,
                true,
            ),
            (Stored::Refused, true, ReasonCode::QuotaExceeded, true),
            // 3.x has no failing PUBREC.
            (Stored::Unconfirmed, false, ReasonCode::Success, false),
        ] {
            let mut a = Acks::default();
            let t = a.request();
            assert!(a.pass(pubrec(6)).is_none());
            a.connection_closed();
            assert_eq!(a.stored(t, outcome, v5), None, "nothing parked any more");
            let (p, freed) = match a.resent(pubrec(6), v5, true) {
                Resent::Pass(p) => (p, false),
                Resent::Failed(p, id) => {
                    assert_eq!(id.get(), 6);
                    (p, true)
                }
                Resent::Parked => panic!("{outcome:?}: nothing to wait for"),
            };
            assert_eq!(code(&p), want, "{outcome:?} v5={v5}");
            assert_eq!(freed, released, "{outcome:?} v5={v5}");
        }
    }

    #[test]
    fn a_qos2_resend_of_a_routing_not_made_here_fails_in_a_cluster_on_v5_only() {
        let mut a = Acks::default();
        match a.resent(pubrec(7), true, true) {
            Resent::Failed(p, id) => {
                assert_eq!(code(&p), ReasonCode::UnspecifiedError);
                assert_eq!(id.get(), 7);
            }
            other => panic!("{other:?}"),
        }
        for (v5, unknown_fails) in [(false, true), (true, false)] {
            match a.resent(pubrec(7), v5, unknown_fails) {
                Resent::Pass(p) => assert_eq!(code(&p), ReasonCode::Success),
                other => panic!("{other:?}"),
            }
        }
        assert!(a.is_empty());
    }

    #[test]
    fn a_released_qos2_exchange_forgets_its_outcome() {
        let mut a = Acks::default();
        let t = a.request();
        assert!(a.pass(pubrec(8)).is_none());
        a.stored(t, Stored::Durable, true);
        assert_eq!(a.ready().count(), 1);
        assert!(!a.is_empty(), "kept until the PUBREL");
        a.released(NonZeroU16::new(8).expect("non-zero"));
        assert!(a.is_empty());
    }

    #[test]
    fn a_parked_acknowledgements_properties_and_kind_come_out_as_they_went_in() {
        let mut a = Acks::default();
        let t = a.request();
        let mut with = PubAck::new(NonZeroU16::new(3).expect("non-zero"));
        with.reason_code = ReasonCode::NoMatchingSubscribers;
        with.properties.reason_string = Some("none here".into());
        assert!(a.pass(Packet::Pubrec(with.clone())).is_none());
        assert!(a.pass(puback(4)).is_none());
        a.stored(t, Stored::Durable, true);
        let out: Vec<Packet> = a.ready().collect();
        assert_eq!(out, vec![Packet::Pubrec(with), puback(4)]);
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
