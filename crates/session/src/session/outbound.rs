//! Messages to the client: delivery, the inflight window, the queue, acknowledgements, encoding.

use std::borrow::Cow;
use std::num::NonZeroU16;
use std::sync::Arc;

use bytes::Bytes;
use starling_codec::{
    encode_publish_header, Error as CodecError, Packet, PacketId, PubAck, PublishHeader, QoS,
};
use tracing::debug;

use super::{ack, unexpected_ack, Inflight, Pending, Phase, Session, Stage};
use crate::{DeliveryOptions, DropReason, Effect, Instant, Message, OutgoingPublish, SessionError};

/// Scratch space a PUBLISH header needs besides its topic: fixed header, packet id and the
/// usual properties.
const HEADER_ROOM: usize = 64;
/// Reserved at once for the headers of a burst.
const HEADER_CHUNK: usize = 2048;

impl Session {
    /// A message routed to this client through a subscription with
    /// `options` (or a retained message found by a SUBSCRIBE).
    ///
    /// Skips the client's own messages under No Local; sends at
    /// `min(message QoS, subscription QoS)`; RETAIN as published only with
    /// Retain As Published or for retained-on-subscribe; drops expired
    /// messages. Sends now if attached and the window allows
    /// ([`Effect::SendPublish`]), else queues it (bounded, drop policy);
    /// while detached, QoS 0 is queued only if `queue_qos0_offline`. Every
    /// drop is an [`Effect::Dropped`].
    pub fn deliver(&mut self, now: Instant, msg: &Arc<Message>, options: &DeliveryOptions) {
        let qos = msg.qos.min(options.qos);
        let stored = options.stored.get();
        if self.is_ended() {
            self.dropped(DropReason::SessionEnded, qos);
            self.retire(stored);
            return;
        }
        // MQTT 5 §3.8.3.1: No Local.
        if options.no_local && msg.publisher.as_deref() == Some(&*self.client_id) {
            self.retire(stored);
            return;
        }
        // MQTT 5 §3.3.2.3.3: an expired message is not delivered.
        if msg.is_expired(now) {
            self.dropped(DropReason::Expired, qos);
            self.retire(stored);
            return;
        }
        // MQTT 5 §3.3.1.3: RETAIN is kept for retained messages sent on
        // subscribe, and on normal delivery only with Retain As Published.
        let retain = options.from_retained || (options.retain_as_published && msg.retain);
        let pending = Pending {
            msg: Arc::clone(msg),
            qos,
            retain,
            sub_ids: options.subscription_ids.to_vec(),
            stored,
            from_retained: options.from_retained,
        };
        match &self.phase {
            Phase::Attached(conn) => {
                let window = conn.window;
                if self.queue.is_empty() {
                    if qos == QoS::AtMostOnce {
                        self.send_qos0(now, pending);
                        return;
                    }
                    if self.inflight.len() < window {
                        self.start_inflight(now, pending);
                        self.check_invariants();
                        return;
                    }
                }
                self.enqueue(pending, options.held_back);
                // An eviction may have put QoS 0 at the front, which needs no slot.
                self.pump(now);
            }
            _ => {
                if qos == QoS::AtMostOnce && !self.limits.queue_qos0_offline {
                    self.dropped(DropReason::Offline, qos);
                    self.retire(stored);
                    return;
                }
                self.enqueue(pending, options.held_back);
            }
        }
        self.check_invariants();
    }

    // An acknowledgement naming a packet id we do not hold is a late duplicate (a 3.x
    // retry, a resend after reconnect) and is ignored as MQTT 5 §4.3.2-4.3.3 allow; one
    // naming a delivery in another stage of its flow is a protocol violation (MQTT 3.1.1
    // §4.8: close the connection; MQTT 5 §4.13: DISCONNECT 0x82).

    pub(super) fn on_puback(&mut self, now: Instant, a: &PubAck) -> Result<(), SessionError> {
        match self.inflight.get(&a.packet_id).map(|f| f.stage) {
            Some(Stage::Qos1) => {
                let stored = self
                    .inflight
                    .remove(&a.packet_id)
                    .and_then(|f| f.out.stored);
                self.retire(stored);
                self.pump(now);
                Ok(())
            }
            Some(Stage::Qos2Published | Stage::Qos2Released) => Err(unexpected_ack(
                starling_codec::PacketType::Puback,
                a.packet_id,
            )),
            None => {
                debug!(client_id = %self.client_id, packet_id = a.packet_id, "stray PUBACK");
                Ok(())
            }
        }
    }

    pub(super) fn on_pubrec(&mut self, now: Instant, a: &PubAck) -> Result<(), SessionError> {
        let id = a.packet_id;
        // [MQTT-4.3.3-4]: PUBREL only after a PUBREC below 0x80. A failing PUBREC
        // ends the exchange (MQTT 5 §4.3.3): the message counts as acknowledged,
        // is discarded, and its packet id is free again.
        let failed = a.reason_code.is_error();
        match self.inflight.get_mut(&id).map(|f| (f.stage, f)) {
            Some((Stage::Qos2Published | Stage::Qos2Released, _)) if failed => {
                let stored = self.inflight.remove(&id).and_then(|f| f.out.stored);
                self.retire(stored);
                self.pump(now);
            }
            // Released already: a duplicate PUBREC (the client answered a PUBLISH
            // resent by 3.x retry or on reconnect) is answered with the PUBREL again.
            Some((stage @ (Stage::Qos2Published | Stage::Qos2Released), f)) => {
                f.stage = Stage::Qos2Released;
                f.sent_at = now;
                let stored = f.out.stored;
                if stage == Stage::Qos2Published {
                    // Released in the store before the PUBREL goes.
                    self.stage(stored, id, Stage::Qos2Released);
                }
                self.effects
                    .push_back(Effect::Send(Packet::Pubrel(PubAck::new(id))));
            }
            Some((Stage::Qos1, _)) => {
                return Err(unexpected_ack(starling_codec::PacketType::Pubrec, id));
            }
            None if failed => {
                debug!(client_id = %self.client_id, packet_id = id, "stray failing PUBREC");
            }
            None => {
                // MQTT 5 §4.3.3: a PUBREL still goes back, saying 0x92 (3.x: plain).
                let code = self.not_found();
                self.effects
                    .push_back(Effect::Send(Packet::Pubrel(ack(id, code))));
            }
        }
        Ok(())
    }

    pub(super) fn on_pubcomp(&mut self, now: Instant, a: &PubAck) -> Result<(), SessionError> {
        match self.inflight.get(&a.packet_id).map(|f| f.stage) {
            Some(Stage::Qos2Released) => {
                let stored = self
                    .inflight
                    .remove(&a.packet_id)
                    .and_then(|f| f.out.stored);
                self.retire(stored);
                self.pump(now);
                Ok(())
            }
            Some(Stage::Qos1 | Stage::Qos2Published) => Err(unexpected_ack(
                starling_codec::PacketType::Pubcomp,
                a.packet_id,
            )),
            None => {
                debug!(client_id = %self.client_id, packet_id = a.packet_id, "stray PUBCOMP");
                Ok(())
            }
        }
    }

    /// Moves queued messages out while the window allows.
    pub(super) fn pump(&mut self, now: Instant) {
        let Some(window) = self.conn().map(|c| c.window) else {
            return;
        };
        while let Some(front) = self.queue.front() {
            if front.msg.is_expired(now) {
                let qos = front.qos;
                let stored = self.queue_pop_front().and_then(|p| p.stored);
                self.dropped(DropReason::Expired, qos);
                self.retire(stored);
                continue;
            }
            if front.qos != QoS::AtMostOnce && self.inflight.len() >= window {
                break;
            }
            let Some(p) = self.queue_pop_front() else {
                break;
            };
            if p.qos == QoS::AtMostOnce {
                self.send_qos0(now, p);
            } else {
                self.start_inflight(now, p);
            }
        }
    }

    fn send_qos0(&mut self, now: Instant, p: Pending) {
        let stored = p.stored;
        match self.encode(now, &p, None, false) {
            Ok(header) => self.emit_publish(header, p, None, false),
            Err(reason) => self.dropped(reason, p.qos),
        }
        self.retire(stored);
    }

    fn start_inflight(&mut self, now: Instant, p: Pending) {
        let window = self.window();
        assert!(self.inflight.len() < window, "inflight window full");
        let id = self.next_packet_id();
        match self.encode(now, &p, Some(id), false) {
            Ok(header) => {
                let stage = if p.qos == QoS::AtLeastOnce {
                    Stage::Qos1
                } else {
                    Stage::Qos2Published
                };
                let seq = self.next_seq;
                self.next_seq += 1;
                // QoS 2: in the store before the PUBLISH (see `StoreChange`). QoS 1 is not
                // staged: after a crash its record, still queued, is sent again under a new
                // packet id, which at least once allows; that saves a write per message.
                if stage != Stage::Qos1 {
                    self.stage(p.stored, id, stage);
                }
                self.emit_publish(header, p.clone(), Some(id), false);
                self.inflight.insert(
                    id,
                    Inflight {
                        seq,
                        out: p,
                        stage,
                        sent_at: now,
                    },
                );
            }
            Err(reason) => {
                self.dropped(reason, p.qos);
                self.retire(p.stored);
            }
        }
    }

    /// Sends an in-flight message again: the PUBLISH with DUP, or the PUBREL.
    pub(super) fn resend(&mut self, now: Instant, id: PacketId) {
        let Some(f) = self.inflight.get(&id) else {
            return;
        };
        if f.stage == Stage::Qos2Released {
            self.effects
                .push_back(Effect::Send(Packet::Pubrel(PubAck::new(id))));
        } else {
            let out = f.out.clone();
            let encoded = if out.msg.is_expired(now) {
                Err(DropReason::Expired)
            } else {
                self.encode(now, &out, Some(id), true)
            };
            match encoded {
                Ok(header) => self.emit_publish(header, out, Some(id), true),
                Err(reason) => {
                    self.dropped(reason, out.qos);
                    // A QoS 2 delivery stays, released: its PUBREL went out now, so its
                    // retry counts from now too (a stale send time would resend the PUBREL
                    // at the next timer).
                    self.abandon(id);
                }
            }
        }
        if let Some(f) = self.inflight.get_mut(&id) {
            f.sent_at = now;
        }
    }

    /// Gives up an in-flight PUBLISH. QoS 1 is forgotten. QoS 2 is released
    /// with a PUBREL instead of forgotten: the client may hold the packet id
    /// from an earlier copy, and would take a new message under the same id
    /// for a duplicate (MQTT 5 §4.3.3).
    fn abandon(&mut self, id: PacketId) {
        let Some(f) = self.inflight.get_mut(&id) else {
            return;
        };
        if f.stage == Stage::Qos1 {
            let stored = self.inflight.remove(&id).and_then(|f| f.out.stored);
            self.retire(stored);
        } else {
            let was = std::mem::replace(&mut f.stage, Stage::Qos2Released);
            let stored = f.out.stored;
            if was != Stage::Qos2Released {
                self.stage(stored, id, Stage::Qos2Released);
            }
            self.effects
                .push_back(Effect::Send(Packet::Pubrel(PubAck::new(id))));
        }
    }

    fn enqueue(&mut self, p: Pending, held_back: bool) {
        let cap = if held_back && p.qos != QoS::AtMostOnce {
            self.limits.mqueue_len_hard()
        } else {
            self.limits.mqueue_len_max
        };
        if self.queue.len() >= cap {
            let queue = &self.queue;
            let evict =
                self.limits
                    .mqueue_policy
                    .victim(queue.len(), self.queued_qos0 as usize, || {
                        queue.iter().position(|q| q.qos == QoS::AtMostOnce)
                    });
            match evict.and_then(|i| self.queue.remove(i)) {
                Some(old) => {
                    if old.qos == QoS::AtMostOnce {
                        self.queued_qos0 -= 1;
                    }
                    self.dropped(DropReason::QueueFull, old.qos);
                    self.retire(old.stored);
                }
                None => {
                    self.dropped(DropReason::QueueFull, p.qos);
                    self.retire(p.stored);
                    return;
                }
            }
        }
        if p.qos == QoS::AtMostOnce {
            self.queued_qos0 += 1;
        }
        self.queue.push_back(p);
    }

    fn queue_pop_front(&mut self) -> Option<Pending> {
        let p = self.queue.pop_front()?;
        if p.qos == QoS::AtMostOnce {
            self.queued_qos0 -= 1;
        }
        Some(p)
    }

    /// Encodes the PUBLISH header for the attached connection: per-delivery
    /// properties, an outbound topic alias, the client's size limit.
    fn encode(
        &mut self,
        now: Instant,
        p: &Pending,
        packet_id: Option<PacketId>,
        dup: bool,
    ) -> Result<Bytes, DropReason> {
        let sub_ids_ok = self.limits.subscription_ids_available;
        let Phase::Attached(conn) = &mut self.phase else {
            return Err(DropReason::SessionEnded);
        };
        let v5 = conn.protocol.is_v5();
        let msg = &p.msg;
        // Outbound aliases, first come first served up to the client's
        // Topic Alias Maximum (MQTT 5 §3.3.2.3.4); later topics go in full.
        let (topic, alias, new_alias) = match conn.aliases_out.get(&msg.topic) {
            Some(&a) if v5 => ("", Some(a), false),
            None if v5 && usize::from(conn.alias_out_max) > conn.aliases_out.len() => {
                // Fits in u16: bounded by alias_out_max.
                let a = u16::try_from(conn.aliases_out.len() + 1).unwrap_or(u16::MAX);
                (&*msg.topic, Some(a), true)
            }
            _ => (&*msg.topic, None, false),
        };
        let expiry = msg.remaining_expiry_secs(now).map(|s| s.max(1));
        let sub_ids = if sub_ids_ok { &p.sub_ids[..] } else { &[] };
        let properties = if v5 && (expiry.is_some() || alias.is_some() || !sub_ids.is_empty()) {
            let mut props = msg.properties.clone();
            props.message_expiry_interval = expiry;
            props.topic_alias = alias;
            props.subscription_identifiers = sub_ids.to_vec();
            Cow::Owned(props)
        } else {
            Cow::Borrowed(&msg.properties)
        };
        // A QoS 0 header with nothing per subscriber is the same bytes for every subscriber on
        // the same protocol family: the first encodes it, the rest share it.
        let shareable = p.qos == QoS::AtMostOnce
            && !dup
            && !p.retain
            && alias.is_none()
            && matches!(properties, Cow::Borrowed(_));
        if shareable {
            if let Some(h) = msg.shared_headers.slot(v5).get() {
                let size = (h.len() + msg.payload.len()) as u64;
                if size > u64::from(conn.packet_size_max) {
                    return Err(DropReason::TooLarge);
                }
                return Ok(h.clone());
            }
        }
        if self.scratch.capacity() - self.scratch.len() < HEADER_ROOM + topic.len() {
            // One allocation for many headers: each is split off and frozen, so a scratch
            // grown a put at a time allocated and copied three times per delivery (a tenth
            // of a fan-in's instructions). The chunk lives only while the headers carved
            // from it do: until they are written out, at the end of the burst.
            self.scratch
                .reserve(HEADER_CHUNK.max(HEADER_ROOM + topic.len()));
        }
        let header = PublishHeader {
            dup,
            qos: p.qos,
            retain: p.retain,
            topic,
            packet_id,
            properties: &properties,
        };
        match encode_publish_header(
            &header,
            msg.payload.len(),
            conn.protocol,
            conn.packet_size_max,
            &mut self.scratch,
        ) {
            Ok(_) => {
                if new_alias {
                    if let Some(a) = alias {
                        conn.aliases_out.insert(Arc::clone(&msg.topic), a);
                    }
                }
                let h = self.scratch.split().freeze();
                // Kept only while another holder may still encode it: a message delivered
                // once (a fan-in's) would pay the copy for nobody.
                if shareable && Arc::strong_count(msg) > 1 {
                    // A copy of its own size: `h` shares the scratch buffer's allocation,
                    // which the message (perhaps long queued) should not keep alive. Another
                    // session may have set it meanwhile: the same bytes.
                    let _ = msg.shared_headers.slot(v5).set(Bytes::copy_from_slice(&h));
                }
                Ok(h)
            }
            // MQTT 5 §3.1.2.11.4: too large for the client: discard as if sent.
            Err(CodecError::PacketTooLarge { .. }) => Err(DropReason::TooLarge),
            Err(e) => {
                debug!(client_id = %self.client_id, error = %e, "unencodable PUBLISH");
                Err(DropReason::Unencodable)
            }
        }
    }

    fn emit_publish(&mut self, header: Bytes, p: Pending, packet_id: Option<PacketId>, dup: bool) {
        let latency_from = p.msg.received_at.filter(|_| !dup && !p.from_retained);
        self.effects.push_back(Effect::SendPublish(OutgoingPublish {
            header,
            msg: p.msg,
            packet_id,
            qos: p.qos,
            dup,
            retain: p.retain,
            latency_from,
        }));
    }

    fn next_packet_id(&mut self) -> PacketId {
        // Terminates: the caller checked inflight.len() < window <= 65535,
        // so at least one of the 65535 ids is free.
        loop {
            let id = self.next_packet_id;
            self.next_packet_id = id.checked_add(1).unwrap_or(1);
            if let Some(id) = NonZeroU16::new(id) {
                if !self.inflight.contains_key(&id) {
                    return id;
                }
            }
        }
    }
}
