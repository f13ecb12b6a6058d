//! What the broker sends: the CONNACK and session resumption, PUBLISH and
//! the acknowledgements of our exchanges.

use std::time::{Duration, Instant};

use starling_codec::{
    Connack, Packet, PacketId, PacketType, PubAck, Publish, QoS, ReasonCode, PACKET_SIZE_MAX,
};

use super::{unexpected, unknown_id, ClientCore, Pending, Step};
use crate::{Acks, Error, Event, State};

impl ClientCore {
    /// The receiving half of a PUBLISH the caller decoded itself and keeps
    /// (a load generator's hot loop: a PUBLISH is 400 bytes, and not moving
    /// it through an [`Event`] saved a third of the receive path): with
    /// [`Acks::Auto`], queues its PUBACK or PUBREC; returns whether it is a new message, false for a QoS 2 repeat
    /// before PUBREL (MQTT 5 §4.3.3). With [`Acks::Manual`], always true.
    #[inline]
    pub fn acknowledge_publish(&mut self, now: Instant, publish: &Publish) -> Result<bool, Error> {
        match self.state {
            State::Connected => {}
            // As `handle_packet`: the connection is over, its input ignored.
            State::Closed => return Ok(false),
            State::Idle | State::Connecting => return Err(self.before_connack(PacketType::Publish)),
        }
        if self.options.acks == Acks::Manual {
            return Ok(true);
        }
        // Present exactly for QoS 1/2: the codec checks MQTT 5 §2.2.1.
        let Some(id) = publish.packet_id else {
            return Ok(true);
        };
        match publish.qos {
            QoS::AtMostOnce => Ok(true),
            QoS::AtLeastOnce => {
                self.queue(now, &Packet::Puback(PubAck::new(id)))?;
                Ok(true)
            }
            QoS::ExactlyOnce => {
                self.queue(now, &Packet::Pubrec(PubAck::new(id)))?;
                // Until PUBREL, a repeat is the same message.
                Ok(self.received_qos2.insert(id))
            }
        }
    }

    pub(super) fn on_connack(&mut self, now: Instant, connack: Connack) -> Result<(), Error> {
        if connack.reason_code.is_error() {
            self.state = State::Closed;
            self.events.push_back(Event::Connected(connack));
            return Ok(());
        }
        self.state = State::Connected;
        let props = &connack.properties;
        let v5 = self.protocol().is_v5();
        let receive_maximum = props.receive_maximum.filter(|_| v5).unwrap_or(u16::MAX);
        self.window = self.options.inflight_max.get().min(receive_maximum);
        self.peer_packet_size_max = props.maximum_packet_size.unwrap_or(PACKET_SIZE_MAX);
        // MQTT 5 §3.2.2.3.14: the broker's Server Keep Alive replaces ours.
        let keep_alive = props
            .server_keep_alive
            .filter(|_| v5)
            .unwrap_or(self.options.connect.keep_alive);
        self.keep_alive = (keep_alive > 0).then(|| Duration::from_secs(u64::from(keep_alive)));
        let resume = connack.session_present && self.options.resend_on_reconnect;
        if !connack.session_present {
            // MQTT 5 §3.2.2.1.1: without a session on the broker, ours goes too.
            self.received_qos2.clear();
        }
        self.events.push_back(Event::Connected(connack));
        self.resume_or_abandon(now, resume)
    }

    /// MQTT 5 §4.4: on a resumed session, resend unacknowledged PUBLISHes
    /// with DUP set and PUBRELs, in their original order and identifiers.
    fn resume_or_abandon(&mut self, now: Instant, resume: bool) -> Result<(), Error> {
        if !resume {
            for (id, _) in self.ids.drain() {
                self.events.push_back(Event::Abandoned(id));
            }
            self.inflight = 0;
            return Ok(());
        }
        let mut abandoned = Vec::new();
        let mut resend = Vec::new();
        for (id, pending) in self.ids.iter() {
            match pending {
                Pending::Puback(Some(m)) | Pending::Pubrec(Some(m)) => {
                    let mut m = Publish::clone(m);
                    m.dup = true;
                    resend.push(Packet::Publish(m));
                }
                Pending::Pubcomp => resend.push(Packet::Pubrel(PubAck::new(id))),
                _ => abandoned.push(id),
            }
        }
        for id in abandoned {
            self.ids.remove(id);
            self.inflight -= 1;
            self.events.push_back(Event::Abandoned(id));
        }
        for packet in &resend {
            self.queue(now, packet)?;
        }
        Ok(())
    }

    /// Handles a packet on an accepted connection; returns its event, if it has one.
    pub(super) fn on_packet(
        &mut self,
        now: Instant,
        packet: Packet,
    ) -> Result<Option<Event>, Error> {
        let manual = self.options.acks == Acks::Manual;
        match packet {
            Packet::Publish(publish) => self.on_publish(now, publish),
            Packet::Puback(ack) => self.on_ack(now, PacketType::Puback, ack),
            Packet::Pubrec(ack) => self.on_ack(now, PacketType::Pubrec, ack),
            Packet::Pubcomp(ack) => self.on_ack(now, PacketType::Pubcomp, ack),
            Packet::Pubrel(rel) if manual => Ok(Some(Event::Ack(Packet::Pubrel(rel)))),
            Packet::Pubrel(rel) => {
                let mut comp = PubAck::new(rel.packet_id);
                if !self.received_qos2.remove(&rel.packet_id) && self.protocol().is_v5() {
                    // MQTT 5 §3.7.2.1: still answered, with this reason.
                    comp.reason_code = ReasonCode::PacketIdentifierNotFound;
                }
                self.queue(now, &Packet::Pubcomp(comp))?;
                Ok(None)
            }
            Packet::Suback(suback) => {
                if !self.answered(suback.packet_id, |p| matches!(p, Pending::Suback)) && !manual {
                    return Err(unknown_id(PacketType::Suback, suback.packet_id));
                }
                Ok(Some(Event::Subscribed(suback)))
            }
            Packet::Unsuback(unsuback) => {
                let id = unsuback.packet_id;
                if !self.answered(id, |p| matches!(p, Pending::Unsuback)) && !manual {
                    return Err(unknown_id(PacketType::Unsuback, id));
                }
                Ok(Some(Event::Unsubscribed(unsuback)))
            }
            Packet::Pingresp => {
                self.ping_sent = None;
                Ok(Some(Event::Pong))
            }
            Packet::Disconnect(disconnect) => {
                self.state = State::Closed;
                Ok(Some(Event::Disconnected(disconnect)))
            }
            Packet::Auth(auth) => Ok(Some(Event::Auth(auth))),
            other @ (Packet::Connect(_)
            | Packet::Connack(_)
            | Packet::Subscribe(_)
            | Packet::Unsubscribe(_)
            | Packet::Pingreq) => Err(unexpected(&other, "connected")),
        }
    }

    fn on_publish(&mut self, now: Instant, publish: Publish) -> Result<Option<Event>, Error> {
        Ok(self
            .acknowledge_publish(now, &publish)?
            .then_some(Event::Message(publish)))
    }

    fn on_ack(
        &mut self,
        now: Instant,
        packet_type: PacketType,
        ack: PubAck,
    ) -> Result<Option<Event>, Error> {
        match self.step_exchange(now, packet_type, &ack)? {
            Some(Step::Ended(reason_code)) => Ok(Some(Event::Published {
                packet_id: ack.packet_id,
                reason_code,
            })),
            Some(Step::Continued) => Ok(None),
            None => self.stray(packet_type, ack),
        }
    }

    /// The PUBACK, PUBREC or PUBCOMP half of [`Self::handle_packet`], for
    /// a caller that decodes itself (the load tool: a [`Packet`] and an
    /// [`Event`] are 400 bytes each, and not moving them saved a third of
    /// the publishing path). Returns the reason code when `ack` ends one of
    /// our exchanges, which `handle_packet` would report as
    /// [`Event::Published`]; `None` when it advances one (a PUBREC: the
    /// PUBREL is queued) or, with [`Acks::Manual`], belongs to none (then
    /// queued as [`Event::Ack`]).
    ///
    /// # Panics
    /// If `packet_type` is not PUBACK, PUBREC or PUBCOMP.
    pub fn handle_ack(
        &mut self,
        now: Instant,
        packet_type: PacketType,
        ack: &PubAck,
    ) -> Result<Option<ReasonCode>, Error> {
        assert!(
            matches!(
                packet_type,
                PacketType::Puback | PacketType::Pubrec | PacketType::Pubcomp
            ),
            "handle_ack takes PUBACK, PUBREC or PUBCOMP, not {packet_type:?}"
        );
        match self.state {
            State::Connected => {}
            State::Closed => return Ok(None),
            State::Idle | State::Connecting => return Err(self.before_connack(packet_type)),
        }
        let step = self.step_exchange(now, packet_type, ack);
        match step.map_err(|e| self.fail(e))? {
            Some(Step::Ended(reason_code)) => Ok(Some(reason_code)),
            Some(Step::Continued) => Ok(None),
            None => {
                let event = self
                    .stray(packet_type, ack.clone())
                    .map_err(|e| self.fail(e))?;
                self.events.extend(event);
                Ok(None)
            }
        }
    }

    /// Moves our exchange of `ack.packet_id` on, or `None` if no exchange
    /// of ours awaits this acknowledgement.
    #[inline]
    fn step_exchange(
        &mut self,
        now: Instant,
        packet_type: PacketType,
        ack: &PubAck,
    ) -> Result<Option<Step>, Error> {
        let id = ack.packet_id;
        let ended = match (packet_type, self.ids.get_mut(id)) {
            (PacketType::Puback, Some(Pending::Puback(_))) => true,
            // MQTT 5 §4.3.3: a failing PUBREC ends the exchange, no PUBREL.
            (PacketType::Pubrec, Some(Pending::Pubrec(_))) if ack.reason_code.is_error() => true,
            // A repeated PUBREC (after our DUP resend) is answered again.
            (PacketType::Pubrec, Some(slot @ (Pending::Pubrec(_) | Pending::Pubcomp))) => {
                // The message is not resent after PUBREC, only the PUBREL.
                *slot = Pending::Pubcomp;
                self.queue(now, &Packet::Pubrel(PubAck::new(id)))?;
                false
            }
            (PacketType::Pubcomp, Some(Pending::Pubcomp)) => true,
            _ => return Ok(None),
        };
        if !ended {
            return Ok(Some(Step::Continued));
        }
        self.ids.remove(id);
        self.inflight -= 1;
        Ok(Some(Step::Ended(ack.reason_code)))
    }

    /// An acknowledgement for no exchange of ours: the caller's in manual
    /// mode, a protocol error otherwise.
    fn stray(&mut self, packet_type: PacketType, ack: PubAck) -> Result<Option<Event>, Error> {
        if self.options.acks == Acks::Auto {
            return Err(unknown_id(packet_type, ack.packet_id));
        }
        Ok(Some(Event::Ack(match packet_type {
            PacketType::Puback => Packet::Puback(ack),
            PacketType::Pubrec => Packet::Pubrec(ack),
            _ => Packet::Pubcomp(ack),
        })))
    }

    /// Releases `id` if it awaits what `is` accepts.
    fn answered(&mut self, id: PacketId, is: impl Fn(&Pending) -> bool) -> bool {
        let awaited = self.ids.get_mut(id).is_some_and(|p| is(p));
        if awaited {
            self.ids.remove(id);
        }
        awaited
    }
}
