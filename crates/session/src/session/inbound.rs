//! Packets from the client, and the router's answers to its SUBSCRIBE and UNSUBSCRIBE.

use std::sync::Arc;

use starling_codec::{
    Disconnect, Packet, PacketId, PayloadFormat, Properties, Protocol, PubAck, Publish, QoS,
    ReasonCode, Suback, Subscribe, SubscriptionOptions, Unsuback, Unsubscribe,
};
use tracing::debug;

use super::{ack, granted, Gate, PendingSubscribe, Phase, Session};
use crate::{DropReason, Effect, Instant, Message, SessionError, SubscribeRequest};

impl Session {
    /// A packet from the attached client (anything after its CONNECT).
    ///
    /// Queues acknowledgements ([`Effect::Send`]), accepted messages
    /// ([`Effect::Publish`]), router requests ([`Effect::Subscribe`],
    /// [`Effect::Unsubscribe`]); a DISCONNECT detaches (will discarded for
    /// reason 0x00) and queues [`Effect::Close`]`(None)`.
    ///
    /// # Errors
    /// A protocol violation: the session has then detached as for a broken
    /// connection (will kept) and queued [`Effect::Close`] with the error's
    /// [`SessionError::reason_code`] (MQTT 5). [`SessionError::NotAttached`]
    /// if no connection is attached (nothing queued).
    pub fn handle_packet(
        &mut self,
        now: Instant,
        packet: Packet,
        gate: &mut dyn Gate,
    ) -> Result<(), SessionError> {
        let Phase::Attached(conn) = &mut self.phase else {
            return Err(SessionError::NotAttached);
        };
        // Keep alive counts any control packet (MQTT 5 §3.1.2.10).
        conn.last_rx = now;
        // The client sent something after its CONNECT: it goes on from the CONNACK's
        // answer, whatever it was.
        self.unheard = false;
        let result = match packet {
            Packet::Connect(_) => Err(SessionError::SecondConnect),
            Packet::Publish(p) => self.on_publish(now, p, gate),
            Packet::Puback(a) => self.on_puback(now, &a),
            Packet::Pubrec(a) => self.on_pubrec(now, &a),
            Packet::Pubrel(a) => {
                self.on_pubrel(&a);
                Ok(())
            }
            Packet::Pubcomp(a) => self.on_pubcomp(now, &a),
            Packet::Subscribe(s) => self.on_subscribe(s, gate),
            Packet::Unsubscribe(u) => {
                self.on_unsubscribe(u);
                Ok(())
            }
            Packet::Pingreq => {
                self.effects.push_back(Effect::Send(Packet::Pingresp));
                Ok(())
            }
            Packet::Disconnect(d) => self.on_disconnect(now, &d),
            other @ (Packet::Connack(_)
            | Packet::Suback(_)
            | Packet::Unsuback(_)
            | Packet::Pingresp
            | Packet::Auth(_)) => Err(SessionError::UnexpectedPacket {
                packet_type: other.packet_type(),
            }),
        };
        if let Err(e) = &result {
            debug!(client_id = %self.client_id, error = %e, "protocol error by client");
            self.detach_with(now, Some(e.reason_code()), true);
        }
        self.check_invariants();
        result
    }

    /// The router's answer to [`Effect::Subscribe`] `packet_id`: per
    /// forwarded filter, in order, the granted QoS or a SUBACK failure code
    /// (exclusive held, limit reached, quota exceeded...). Queues the SUBACK
    /// if attached. Unknown `packet_id`s are ignored.
    pub fn subscribed(
        &mut self,
        _now: Instant,
        packet_id: PacketId,
        results: Vec<Result<QoS, ReasonCode>>,
    ) {
        let Some(pending) = self
            .rare
            .as_mut()
            .and_then(|r| r.pending_subscribes.remove(&packet_id))
        else {
            debug!(client_id = %self.client_id, packet_id, "subscribed: unknown packet id");
            return;
        };
        let mut results = results.into_iter();
        let mut forwarded = pending.forwarded.into_iter();
        let mut reason_codes = Vec::with_capacity(pending.codes.len());
        for code in pending.codes {
            let code = match code {
                Some(code) => code,
                None => {
                    // One forwarded request per undecided filter, by construction.
                    let Some(req) = forwarded.next() else {
                        reason_codes.push(ReasonCode::UnspecifiedError);
                        continue;
                    };
                    match results.next() {
                        Some(Ok(qos)) => {
                            let qos = qos.min(req.options.qos);
                            let mut options = req.options;
                            options.qos = qos;
                            self.subscriptions
                                .insert(req.filter, (options, req.subscription_id));
                            granted(qos)
                        }
                        Some(Err(code)) => code,
                        None => ReasonCode::UnspecifiedError,
                    }
                }
            };
            reason_codes.push(code);
        }
        if self.is_attached() {
            self.effects.push_back(Effect::Send(Packet::Suback(Suback {
                packet_id,
                reason_codes,
                properties: Properties::default(),
            })));
        }
    }

    /// The PUBREC for the inbound QoS 2 `packet_id` went out with an error after all (the
    /// broker could not confirm where the message went): the exchange ends there (MQTT 5
    /// §4.3.3), so the id is free again and a new PUBLISH under it is a new message.
    ///
    /// `keep_stored`: the stored record of the id stays (until a new message takes the id,
    /// or the session ends). Were that PUBREC lost with a crash, the client sends the
    /// PUBLISH again with DUP, and the restarted broker finds the id and answers it again
    /// instead of routing the message a second time (which a broker that may have
    /// delivered it in part, to other nodes, must not do).
    pub fn abandon_inbound(&mut self, packet_id: PacketId, keep_stored: bool) {
        if self
            .rare
            .as_mut()
            .is_some_and(|r| r.inbound_qos2.remove(&packet_id))
            && !keep_stored
        {
            self.effects
                .push_back(Effect::Store(crate::StoreChange::InboundReleased(
                    packet_id,
                )));
        }
    }

    /// The router's answer to [`Effect::Unsubscribe`] `packet_id`: one
    /// reason code per filter (`Success`, `NoSubscriptionExisted`, or a
    /// failure). Queues the UNSUBACK if attached.
    pub fn unsubscribed(&mut self, _now: Instant, packet_id: PacketId, results: Vec<ReasonCode>) {
        let Some(filters) = self
            .rare
            .as_mut()
            .and_then(|r| r.pending_unsubscribes.remove(&packet_id))
        else {
            debug!(client_id = %self.client_id, packet_id, "unsubscribed: unknown packet id");
            return;
        };
        let mut reason_codes = results;
        reason_codes.resize(filters.len(), ReasonCode::UnspecifiedError);
        for (filter, code) in filters.iter().zip(&reason_codes) {
            if !code.is_error() {
                self.subscriptions.remove(filter);
            }
        }
        if self.is_attached() {
            self.effects
                .push_back(Effect::Send(Packet::Unsuback(Unsuback {
                    packet_id,
                    reason_codes,
                    properties: Properties::default(),
                })));
        }
    }

    fn on_publish(
        &mut self,
        now: Instant,
        p: Publish,
        gate: &mut dyn Gate,
    ) -> Result<(), SessionError> {
        let Phase::Attached(conn) = &mut self.phase else {
            return Err(SessionError::NotAttached);
        };
        let v5 = conn.protocol.is_v5();
        let limits = &self.limits;
        // MQTT 5 §3.3.4: a client's PUBLISH carries no Subscription Identifier.
        if v5 && !p.properties.subscription_identifiers.is_empty() {
            return Err(SessionError::SubscriptionIdInPublish);
        }
        // MQTT 3.x clients cannot learn our maximum QoS or retain support,
        // so they are served as asked (retain dropped) rather than cut off.
        if v5 && p.qos > limits.qos_max {
            return Err(SessionError::QosNotSupported {
                qos: p.qos,
                max: limits.qos_max,
            });
        }
        if v5 && p.retain && !limits.retain_available {
            return Err(SessionError::RetainNotSupported);
        }
        let retain = p.retain && limits.retain_available;
        // MQTT 5 §3.3.2.3.4: topic aliases, per connection.
        let topic: Arc<str> = match p.properties.topic_alias.filter(|_| v5) {
            Some(alias) => {
                if alias == 0 || alias > limits.topic_alias_max {
                    return Err(SessionError::TopicAliasInvalid {
                        alias,
                        max: limits.topic_alias_max,
                    });
                }
                if p.topic.is_empty() {
                    match conn.aliases_in.get(&alias) {
                        Some(t) => Arc::clone(t),
                        None => return Err(SessionError::TopicAliasUnknown { alias }),
                    }
                } else {
                    let t: Arc<str> = Arc::from(p.topic.as_str());
                    conn.aliases_in.insert(alias, Arc::clone(&t));
                    t
                }
            }
            None if p.topic.is_empty() => return Err(SessionError::TopicAliasUnknown { alias: 0 }),
            None => Arc::from(p.topic.as_str()),
        };
        // The broker's topic caps hold for every PUBLISH, not only for filters and the
        // retained store. A DISCONNECT rather than a failing PUBACK: QoS 0 has no
        // acknowledgement to carry 0x90, and every QoS is treated alike (MQTT 5 §4.13;
        // 3.x closes the connection).
        if let Some(e) = limits.topic_excess(&topic) {
            return Err(e);
        }
        let packet_id = p.packet_id;
        if p.qos == QoS::ExactlyOnce {
            let Some(id) = packet_id else {
                // The codec guarantees a packet id with QoS > 0.
                return Err(SessionError::UnexpectedPacket {
                    packet_type: starling_codec::PacketType::Publish,
                });
            };
            // MQTT 5 §4.3.3: until PUBREL, the same packet id is the same
            // message: acknowledge again, never route twice.
            if self.rare().inbound_qos2.contains(&id) {
                self.effects
                    .push_back(Effect::Send(Packet::Pubrec(PubAck::new(id))));
                return Ok(());
            }
            // MQTT 5 §3.3.4: more unreleased QoS 2 messages than our Receive
            // Maximum. Checked for 3.x too, to bound the state.
            if self.rare().inbound_qos2.len() >= usize::from(limits.receive_max.max(1)) {
                return Err(SessionError::ReceiveMaximumExceeded {
                    max: limits.receive_max,
                });
            }
        }

        let utf8_invalid = v5
            && limits.validate_utf8_payload
            && p.properties.payload_format_indicator == Some(PayloadFormat::Utf8)
            && std::str::from_utf8(&p.payload).is_err();
        let code = if utf8_invalid {
            self.dropped(DropReason::PayloadFormatInvalid, p.qos);
            ReasonCode::PayloadFormatInvalid
        } else if !gate.allow_publish(&topic, p.qos, retain) {
            self.dropped(DropReason::NotAuthorized, p.qos);
            ReasonCode::NotAuthorized
        } else {
            let expires_at = Message::deadline(
                now,
                p.properties.message_expiry_interval,
                self.limits.message_expiry_max,
            );
            let properties = if v5 {
                Message::application_properties(p.properties)
            } else {
                Properties::default()
            };
            let msg = Message {
                topic,
                payload: p.payload,
                qos: p.qos,
                retain,
                properties,
                expires_at,
                publisher: Some(Arc::clone(&self.client_id)),
                shared_headers: Default::default(),
                received_at: Some(now),
            };
            if let (QoS::ExactlyOnce, Some(id)) = (p.qos, packet_id) {
                // Stored with the routing, so that a resend after a crash is not routed again.
                self.effects
                    .push_back(Effect::Store(crate::StoreChange::InboundRouted(id)));
            }
            self.effects.push_back(Effect::Publish(Arc::new(msg)));
            ReasonCode::Success
        };
        // 3.x has no failing acknowledgement: a refused message is
        // acknowledged and dropped.
        let ack_code = if v5 { code } else { ReasonCode::Success };
        match (p.qos, packet_id) {
            (QoS::AtLeastOnce, Some(id)) => {
                self.effects
                    .push_back(Effect::Send(Packet::Puback(ack(id, ack_code))));
            }
            (QoS::ExactlyOnce, Some(id)) => {
                // A failing PUBREC ends the exchange (MQTT 5 §4.3.3): no PUBREL follows.
                if !ack_code.is_error() {
                    self.rare_mut().inbound_qos2.insert(id);
                }
                self.effects
                    .push_back(Effect::Send(Packet::Pubrec(ack(id, ack_code))));
            }
            _ => {}
        }
        Ok(())
    }

    fn on_pubrel(&mut self, a: &PubAck) {
        let code = if self
            .rare
            .as_mut()
            .is_some_and(|r| r.inbound_qos2.remove(&a.packet_id))
        {
            self.effects
                .push_back(Effect::Store(crate::StoreChange::InboundReleased(
                    a.packet_id,
                )));
            ReasonCode::Success
        } else {
            // MQTT 5 §4.3.3: a PUBREL for an id we do not hold still gets a PUBCOMP.
            self.not_found()
        };
        self.effects
            .push_back(Effect::Send(Packet::Pubcomp(ack(a.packet_id, code))));
    }

    fn on_subscribe(&mut self, s: Subscribe, gate: &mut dyn Gate) -> Result<(), SessionError> {
        let v5 = self.protocol().is_some_and(Protocol::is_v5);
        let limits = &self.limits;
        let subscription_id = s.properties.subscription_identifiers.first().copied();
        if subscription_id.is_some() && !limits.subscription_ids_available {
            return Err(SessionError::SubscriptionIdsNotSupported);
        }
        if self.rare().pending_subscribes.contains_key(&s.packet_id) {
            let code = if v5 {
                ReasonCode::PacketIdentifierInUse
            } else {
                ReasonCode::UnspecifiedError
            };
            self.effects.push_back(Effect::Send(Packet::Suback(Suback {
                packet_id: s.packet_id,
                reason_codes: vec![code; s.filters.len()],
                properties: Properties::default(),
            })));
            return Ok(());
        }
        let mut count = self.subscriptions.len();
        let mut codes = Vec::with_capacity(s.filters.len());
        let mut forwarded = Vec::new();
        for f in s.filters {
            // MQTT 5 §3.8.3.1: No Local on a shared subscription is a protocol error.
            if v5 && f.filter.starts_with("$share/") && f.options.no_local {
                return Err(SessionError::NoLocalOnShared { filter: f.filter });
            }
            let code = match self.admit_filter(f.filter, f.options, &mut count, gate) {
                Ok(mut req) => {
                    req.subscription_id = subscription_id;
                    forwarded.push(req);
                    None
                }
                Err(code) => Some(code),
            };
            codes.push(code);
        }
        if forwarded.is_empty() {
            self.effects.push_back(Effect::Send(Packet::Suback(Suback {
                packet_id: s.packet_id,
                reason_codes: codes.into_iter().flatten().collect(),
                properties: Properties::default(),
            })));
        } else {
            self.effects.push_back(Effect::Subscribe {
                packet_id: s.packet_id,
                filters: forwarded.clone(),
            });
            self.rare_mut()
                .pending_subscribes
                .insert(s.packet_id, PendingSubscribe { codes, forwarded });
        }
        Ok(())
    }

    /// One filter of a SUBSCRIBE (the client's or an operator's): what the broker offers,
    /// the quota (`count` is the subscriptions so far, this one counted if admitted) and
    /// the gate; the request for the router, or the SUBACK code that refuses it.
    pub(super) fn admit_filter(
        &self,
        filter: String,
        options: SubscriptionOptions,
        count: &mut usize,
        gate: &mut dyn Gate,
    ) -> Result<SubscribeRequest, ReasonCode> {
        let limits = &self.limits;
        let exists = self.subscriptions.contains_key(&filter);
        let qos = options.qos.min(limits.qos_max);
        if filter.starts_with("$share/") && !limits.shared_available {
            return Err(ReasonCode::SharedSubscriptionsNotSupported);
        }
        if !limits.wildcard_available && filter.contains(['+', '#']) {
            return Err(ReasonCode::WildcardSubscriptionsNotSupported);
        }
        if !exists && *count >= limits.subscriptions_max {
            return Err(ReasonCode::QuotaExceeded);
        }
        if !gate.allow_subscribe(&filter, qos) {
            return Err(ReasonCode::NotAuthorized);
        }
        if !exists {
            *count += 1;
        }
        Ok(SubscribeRequest {
            filter,
            options: SubscriptionOptions { qos, ..options },
            subscription_id: None,
        })
    }

    fn on_unsubscribe(&mut self, u: Unsubscribe) {
        if self.rare().pending_unsubscribes.contains_key(&u.packet_id) {
            // 3.x UNSUBACK has no codes; the codec leaves them out.
            self.effects
                .push_back(Effect::Send(Packet::Unsuback(Unsuback {
                    packet_id: u.packet_id,
                    reason_codes: vec![ReasonCode::PacketIdentifierInUse; u.filters.len()],
                    properties: Properties::default(),
                })));
            return;
        }
        self.effects.push_back(Effect::Unsubscribe {
            packet_id: u.packet_id,
            filters: u.filters.clone(),
        });
        self.rare_mut()
            .pending_unsubscribes
            .insert(u.packet_id, u.filters);
    }

    fn on_disconnect(&mut self, now: Instant, d: &Disconnect) -> Result<(), SessionError> {
        if self.protocol().is_some_and(Protocol::is_v5) {
            if let Some(secs) = d.properties.session_expiry_interval {
                // MQTT 5 §3.14.2.2.2: 0 on CONNECT cannot become non-zero.
                if self.expiry_secs == 0 && secs != 0 {
                    return Err(SessionError::SessionExpiryAfterZero);
                }
                self.expiry_secs = secs.min(self.limits.session_expiry_secs_max);
            }
        }
        // MQTT 5 §3.14.4 / 3.1.1 §3.14.4: a normal DISCONNECT discards the
        // will; 0x04 (and any other reason) keeps it.
        let keep_will = d.reason_code != ReasonCode::NORMAL_DISCONNECTION;
        debug!(client_id = %self.client_id, reason = ?d.reason_code, "client disconnected");
        self.detach_with(now, None, keep_will);
        Ok(())
    }
}
