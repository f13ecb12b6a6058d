//! Connections coming and going: attach, detach, timers, the will and the end of the state.

use std::collections::BTreeMap;
use std::mem;
use std::sync::Arc;
use std::time::Duration;

use starling_codec::{
    Connack, Connect, Error as CodecError, Packet, PacketId, Properties, QoS, ReasonCode,
    PACKET_SIZE_MAX,
};
use tracing::debug;

use super::{disconnect_fits, Attached, Conn, DetachReason, Phase, Session, Will};
use crate::{DropReason, Effect, Instant, Message, SessionError};

impl Session {
    /// A connection whose CONNECT passed [`check_connect`](crate::check_connect)
    /// attaches: a new session, a resumed one, or (Clean Start) a fresh
    /// start that ends the old state first ([`Effect::SessionEnded`]).
    ///
    /// Queues, in order: the CONNACK ([`Effect::Send`]), then on resume the
    /// resends of every unacknowledged PUBLISH with DUP set and every PUBREL
    /// (MQTT 5 §4.4), then queued messages as the window allows. A pending
    /// will of the previous connection is cancelled (MQTT 5 §3.1.2.5).
    ///
    /// Negotiates: window `min(client Receive Maximum, inflight_max)`; the
    /// client's Maximum Packet Size and Topic Alias Maximum; keep alive
    /// (capped for MQTT 5 with Server Keep Alive; 3.x clients cannot be told,
    /// so their own value stands, except 0 when not allowed); session expiry
    /// (capped; 3.x Clean Session 0 gets `session_expiry_secs_max`).
    ///
    /// # Errors
    /// [`SessionError::AlreadyAttached`]: detach the old connection first.
    /// [`SessionError::ConnackTooLarge`]: the CONNACK does not fit the
    /// client's Maximum Packet Size; the session is unchanged (a pending
    /// will keeps waiting) and nothing is queued: close the connection
    /// without sending anything.
    pub fn attach(&mut self, now: Instant, connect: &Connect) -> Result<Attached, SessionError> {
        if self.is_attached() {
            return Err(SessionError::AlreadyAttached);
        }
        let v5 = connect.protocol.is_v5();
        let props = &connect.properties;
        let had_state = matches!(self.phase, Phase::Detached { .. });
        let session_present = had_state && !connect.clean_start && !self.is_unheard();

        let limits = &self.limits;
        let asked_ka = connect.keep_alive;
        let keep_alive_secs = if asked_ka == 0 {
            if limits.keepalive_zero_allowed {
                0
            } else {
                limits.keepalive_secs_max
            }
        } else if v5 {
            // The minimum is applied first so that a misconfigured min > max still
            // respects the maximum (config validation refuses that anyway).
            asked_ka
                .max(limits.keepalive_secs_min)
                .min(limits.keepalive_secs_max)
        } else {
            asked_ka
        };
        let asked_expiry = if v5 {
            props.session_expiry_interval.unwrap_or(0)
        } else if connect.clean_start {
            0
        } else {
            u32::MAX
        };
        let expiry_secs = asked_expiry.min(limits.session_expiry_secs_max);
        let client_receive_max = if v5 {
            props.receive_maximum.unwrap_or(u16::MAX)
        } else {
            u16::MAX
        };
        let window = usize::from(client_receive_max.min(limits.inflight_max).max(1));
        let conn = Conn {
            protocol: connect.protocol,
            keep_alive: (keep_alive_secs > 0)
                .then(|| Duration::from_secs(u64::from(keep_alive_secs))),
            last_rx: now,
            window,
            packet_size_max: if v5 {
                props.maximum_packet_size.unwrap_or(PACKET_SIZE_MAX)
            } else {
                PACKET_SIZE_MAX
            },
            alias_out_max: if v5 {
                props.topic_alias_maximum.unwrap_or(0)
            } else {
                0
            },
            aliases_out: BTreeMap::new(),
            aliases_in: BTreeMap::new(),
        };

        let mut p = Properties::default();
        if v5 {
            if expiry_secs != asked_expiry {
                p.session_expiry_interval = Some(expiry_secs);
            }
            if limits.receive_max != u16::MAX {
                p.receive_maximum = Some(limits.receive_max.max(1));
            }
            if limits.qos_max != QoS::ExactlyOnce {
                p.maximum_qos = Some(limits.qos_max);
            }
            if !limits.retain_available {
                p.retain_available = Some(false);
            }
            if limits.packet_size_max < PACKET_SIZE_MAX {
                p.maximum_packet_size = Some(limits.packet_size_max);
            }
            if connect.client_id.is_empty() {
                p.assigned_client_identifier = Some(self.client_id.to_string());
            }
            if limits.topic_alias_max > 0 {
                p.topic_alias_maximum = Some(limits.topic_alias_max);
            }
            if !limits.wildcard_available {
                p.wildcard_subscription_available = Some(false);
            }
            if !limits.subscription_ids_available {
                p.subscription_identifier_available = Some(false);
            }
            if !limits.shared_available {
                p.shared_subscription_available = Some(false);
            }
            if keep_alive_secs != asked_ka {
                p.server_keep_alive = Some(keep_alive_secs);
            }
            if props.request_response_information == Some(true) {
                p.response_information = limits.response_information.clone();
            }
        }
        let connack = Packet::Connack(Connack {
            session_present,
            reason_code: ReasonCode::Success,
            properties: p,
        });
        // MQTT 5 §3.1.2.11.4: a packet past the client's maximum is not sent.
        // Without its CONNACK the client cannot go on, and nothing else may
        // come first ([MQTT-3.2.0-1]), not even a DISCONNECT ([MQTT-3.14.0-1]):
        // the connection is closed before anything changes. Measured only when
        // the client announced a maximum, so that ordinary connects encode the
        // CONNACK once.
        if v5 && props.maximum_packet_size.is_some() {
            self.scratch.clear();
            if let Err(CodecError::PacketTooLarge { size, max }) = starling_codec::encode(
                &connack,
                conn.protocol,
                conn.packet_size_max,
                &mut self.scratch,
            ) {
                debug!(client_id = %self.client_id, size, max, "CONNACK too large for the client");
                return Err(SessionError::ConnackTooLarge { size, max });
            }
            self.scratch.clear();
        }
        // A new connection for the client identifier deletes a will still
        // waiting for its delay (MQTT 5 §3.1.2.5); so a clean start does not
        // publish it either.
        self.will = None;
        self.set_will_at(None);
        if had_state && connect.clean_start {
            self.end_state(now);
        }
        self.expiry_secs = expiry_secs;
        self.will = connect.will.clone().map(|will| {
            Box::new(Will {
                delay: Duration::from_secs(u64::from(
                    will.properties.will_delay_interval.unwrap_or(0),
                )),
                will,
            })
        });
        self.phase = Phase::Attached(Box::new(conn));
        self.unheard = !connect.clean_start && !session_present;
        debug!(
            client_id = %self.client_id,
            session_present,
            keep_alive_secs,
            window,
            expiry_secs = self.expiry_secs,
            "session attached"
        );
        self.effects.push_back(Effect::Send(connack));
        if session_present {
            let mut order: Vec<(u64, PacketId)> =
                self.inflight.iter().map(|(id, f)| (f.seq, *id)).collect();
            order.sort_unstable();
            for (_, id) in order {
                self.resend(now, id);
            }
        }
        self.pump(now);
        self.check_invariants();
        Ok(Attached {
            session_present,
            keep_alive_secs,
        })
    }

    /// The connection went away without the client's DISCONNECT (a
    /// DISCONNECT goes through [`Session::handle_packet`] instead). Queues
    /// [`Effect::Close`] (with a reason code for MQTT 5, where one applies),
    /// starts the will delay (or publishes the will, [`Effect::Will`], if it
    /// is 0) and the session expiry; with session expiry 0 the session ends
    /// now ([`Effect::SessionEnded`]). No-op when not attached.
    pub fn detach(&mut self, now: Instant, reason: DetachReason) {
        self.detach_with(now, reason.reason_code(), true);
        self.check_invariants();
    }

    /// Ends the session now, whatever its state (administrative discard):
    /// detaches with 0x98 if attached, publishes a pending will, queues
    /// [`Effect::SessionEnded`].
    pub fn end(&mut self, now: Instant) {
        self.end_because(now, DetachReason::Administrative);
    }

    /// As [`Session::end`], telling a connected MQTT 5 client `why` in its DISCONNECT
    /// (another node of the cluster took the client identifier over: 0x8E).
    pub fn end_because(&mut self, now: Instant, why: DetachReason) {
        self.detach_with(now, why.reason_code(), true);
        if matches!(self.phase, Phase::Detached { .. }) {
            self.end_state(now);
            self.phase = Phase::Ended;
        }
    }

    /// Gives way to a session that another node handed over late, after this one was
    /// started afresh for the CONNECT that waited for it: only a session that never held
    /// more than its name does (detached, unheard, see [`Session::is_unheard`], and with no
    /// will waiting for its delay), and it then ends as taken over. False, and nothing
    /// changes, for any other.
    pub fn give_way(&mut self, now: Instant) -> bool {
        let idle = matches!(self.phase, Phase::Detached { .. })
            && self.is_unheard()
            && self.will.is_none()
            && self.rare().will_at.is_none();
        if idle {
            self.end_because(now, DetachReason::TakenOver);
        }
        idle
    }

    /// Another node takes the session over and continues it (a cluster's handover): the
    /// state it goes on from, deliveries included, and the session ends here without
    /// counting its messages as dropped (they travel in the state). A connected client is
    /// closed with 0x8E (MQTT 5), and its will goes as a takeover on one node sends it
    /// (detach, then the new connection's attach): at once when its delay is zero, while a
    /// will waiting for its delay is deleted by the new connection (MQTT 5 §3.1.2.5), so
    /// none travels. `None`, and an ordinary end ([`Session::end_because`]), for a session
    /// that does not outlive its connection: the takeover closes that connection, so the
    /// session ends with it (MQTT 5 §3.1.2.11.2). `None` too for a session its client was
    /// told did not exist and has not spoken to since (see [`Session::is_unheard`]): the
    /// other node starts afresh and says so, as this one did.
    pub fn hand_over(
        &mut self,
        now: Instant,
        wall: std::time::SystemTime,
    ) -> Option<crate::SessionState> {
        if !self.outlives_connection() || self.is_unheard() {
            self.end_because(now, DetachReason::TakenOver);
            return None;
        }
        if self.is_attached() && self.will.as_ref().is_some_and(|w| w.delay.is_zero()) {
            self.publish_will(now);
        }
        self.will = None;
        self.set_will_at(None);
        let state = self.snapshot(now, wall);
        self.will = None;
        self.set_will_at(None);
        self.queue.clear();
        self.queued_qos0 = 0;
        self.inflight.clear();
        self.detach_with(now, DetachReason::TakenOver.reason_code(), false);
        if matches!(self.phase, Phase::Detached { .. }) {
            self.end_state(now);
            self.phase = Phase::Ended;
        }
        Some(state)
    }

    /// Timers: keep alive (detach with 0x8D after 1.5 × keep alive without a
    /// packet, MQTT 5 §3.1.2.10), 3.x retry of unacknowledged messages, will
    /// delay, session expiry. Call when [`Session::poll_timeout`] has passed;
    /// calling early is harmless.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Phase::Attached(conn) = &self.phase {
            let keep_alive_due = conn
                .keep_alive
                .is_some_and(|ka| now >= conn.last_rx + ka * 3 / 2);
            if keep_alive_due {
                debug!(client_id = %self.client_id, "keep alive timeout");
                self.detach_with(now, Some(ReasonCode::KeepAliveTimeout), true);
            } else if let Some(retry) = self.retry_interval(conn) {
                let mut due: Vec<(u64, PacketId)> = self
                    .inflight
                    .iter()
                    .filter(|(_, f)| f.sent_at + retry <= now)
                    .map(|(id, f)| (f.seq, *id))
                    .collect();
                due.sort_unstable();
                for (_, id) in due {
                    self.resend(now, id);
                }
                self.pump(now);
            }
        }
        if let Phase::Detached { expires_at } = self.phase {
            if self.rare().will_at.is_some_and(|at| at <= now) {
                self.publish_will(now);
            }
            if expires_at.is_some_and(|at| at <= now) {
                debug!(client_id = %self.client_id, "session expired");
                self.end_state(now);
                self.phase = Phase::Ended;
            }
        }
        self.check_invariants();
    }

    pub(super) fn detach_with(&mut self, now: Instant, close: Option<ReasonCode>, keep_will: bool) {
        let Phase::Attached(conn) = &self.phase else {
            return;
        };
        // MQTT 3.x has no DISCONNECT from the server; MQTT 5 §3.1.2.11.4 sends
        // none that exceeds the client's Maximum Packet Size.
        let close = close.filter(|&code| {
            conn.protocol.is_v5() && disconnect_fits(code, conn.packet_size_max, &mut self.scratch)
        });
        let expires_at = if self.expiry_secs == u32::MAX {
            None
        } else {
            now.checked_add(Duration::from_secs(u64::from(self.expiry_secs)))
        };
        self.phase = Phase::Detached { expires_at };
        self.effects.push_back(Effect::Close(close));
        if !keep_will {
            self.will = None;
        }
        if let Some(w) = &self.will {
            if w.delay.is_zero() {
                self.publish_will(now);
            } else {
                let at = now.checked_add(w.delay);
                self.set_will_at(at);
            }
        }
        debug!(
            client_id = %self.client_id,
            reason = ?close,
            expiry_secs = self.expiry_secs,
            "session detached"
        );
        if self.expiry_secs == 0 {
            self.end_state(now);
            self.phase = Phase::Ended;
        }
    }

    fn publish_will(&mut self, now: Instant) {
        self.set_will_at(None);
        let Some(w) = self.will.take() else {
            return;
        };
        let Will { will, .. } = *w;
        let expires_at = Message::deadline(
            now,
            will.properties.message_expiry_interval,
            self.limits.message_expiry_max,
        );
        let msg = Message {
            topic: Arc::from(will.topic),
            payload: will.payload,
            // A 3.x will above our maximum could not be refused at CONNECT.
            qos: will.qos.min(self.limits.qos_max),
            retain: will.retain && self.limits.retain_available,
            properties: Message::application_properties(will.properties),
            expires_at,
            publisher: Some(Arc::clone(&self.client_id)),
            shared_headers: Default::default(),
            received_at: Some(now),
        };
        debug!(client_id = %self.client_id, topic = %msg.topic, "will published");
        self.effects.push_back(Effect::Will(Arc::new(msg)));
    }

    /// Ends the state: the will goes out if still pending (MQTT 5 §3.1.2.5:
    /// at the latest when the session ends), everything else is dropped.
    /// The caller sets the phase.
    fn end_state(&mut self, now: Instant) {
        self.publish_will(now);
        let queued = mem::take(&mut self.queue);
        self.queued_qos0 = 0;
        let inflight = mem::take(&mut self.inflight);
        for qos in queued
            .iter()
            .map(|p| p.qos)
            .chain(inflight.values().map(|f| f.out.qos))
        {
            self.dropped(DropReason::SessionEnded, qos);
        }
        let (pending_subscribes, will_at) = match self.rare.take() {
            Some(r) => (r.pending_subscribes, r.will_at),
            None => (BTreeMap::new(), None),
        };
        // Only the will outlives the session's state.
        self.set_will_at(will_at);
        // A subscribe still at the router will land there: remove it too.
        let pending: Vec<String> = pending_subscribes
            .into_values()
            .flat_map(|p| p.forwarded.into_iter().map(|r| r.filter))
            .collect();
        let mut subscriptions: Vec<String> =
            mem::take(&mut self.subscriptions).into_keys().collect();
        for f in pending {
            if !subscriptions.contains(&f) {
                subscriptions.push(f);
            }
        }
        debug!(client_id = %self.client_id, "session ended");
        self.effects
            .push_back(Effect::SessionEnded { subscriptions });
    }
}
