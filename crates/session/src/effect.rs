//! What the session asks of the broker, drained with
//! [`Session::poll_effect`](crate::Session::poll_effect).

use std::sync::Arc;

use bytes::Bytes;
use starling_codec::{Packet, PacketId, QoS, ReasonCode, RetainHandling, SubscriptionOptions};

use crate::state::InflightPhase;
use crate::Message;

/// One thing for the broker to do. Effects come out in the order they must
/// happen; the broker handles each before the next.
// `Send` is large (a Packet holds a full Properties); acknowledgements are
// frequent, and moving a few hundred bytes costs less than boxing each one.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Write this packet to the client, encoded for
    /// [`Session::protocol`](crate::Session::protocol) within
    /// [`Session::client_packet_size_max`](crate::Session::client_packet_size_max).
    /// Never a PUBLISH: those come as [`Effect::SendPublish`].
    Send(Packet),
    /// Write a PUBLISH to the client: `header`, then the shared payload.
    SendPublish(OutgoingPublish),
    /// Route this message, accepted from the client's PUBLISH (QoS 2 is
    /// routed on PUBLISH receipt and its packet identifier held until PUBREL,
    /// MQTT 5 §4.3.3 method A). Retained messages (`msg.retain`) also update
    /// the retained store.
    Publish(Arc<Message>),
    /// Add these subscriptions in the router for this client, then call
    /// [`Session::subscribed`](crate::Session::subscribed) with `packet_id`
    /// and one result per filter, in order, before delivering any retained
    /// message for them (so that SUBACK goes first). Which retained messages
    /// to send: [`SubscribeRequest::wants_retained`].
    Subscribe {
        /// The SUBSCRIBE's packet identifier.
        packet_id: PacketId,
        /// The filters that passed the session's checks and the [`Gate`](crate::Gate).
        filters: Vec<SubscribeRequest>,
    },
    /// Remove these subscriptions of this client, then call
    /// [`Session::unsubscribed`](crate::Session::unsubscribed) with one
    /// reason code per filter (`Success` or `NoSubscriptionExisted`).
    Unsubscribe {
        /// The UNSUBSCRIBE's packet identifier.
        packet_id: PacketId,
        /// The raw filters, in order.
        filters: Vec<String>,
    },
    /// Publish the client's will now. The broker applies its publish ACL to
    /// it, as for any PUBLISH (the gate is not at hand when a timer fires).
    Will(Arc<Message>),
    /// Close the connection; for `Some(code)` write `DISCONNECT(code)` first
    /// (MQTT 5 only; the session never asks for it on older versions, nor for
    /// one past the client's Maximum Packet Size, MQTT 5 §3.1.2.11.4). The
    /// session has already detached: do not call
    /// [`Session::detach`](crate::Session::detach) for this connection.
    Close(Option<ReasonCode>),
    /// The session state ended (expiry, clean start, session expiry 0):
    /// remove these subscriptions of this client from the router. If the
    /// session is not attached again right away (clean start), the
    /// [`Session`](crate::Session) may be dropped.
    SessionEnded {
        /// The filters the session held, as subscribed.
        subscriptions: Vec<String>,
    },
    /// A stored delivery changed (see [`DeliveryOptions::stored`](crate::DeliveryOptions)),
    /// or an inbound QoS 2 packet identifier was released: write it to the store. When
    /// [`StoreChange::must_precede`] says so, nothing sent after this effect may reach the
    /// client before the change is durable.
    Store(StoreChange),
    /// A message meant for this client was dropped; for the counters.
    Dropped {
        /// Why.
        reason: DropReason,
        /// The QoS it would have been delivered with.
        qos: QoS,
    },
}

/// A change to a session's stored deliveries, keyed by the delivery's store key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreChange {
    /// The QoS 2 delivery went out under `packet_id` and now awaits acknowledgement in
    /// `phase`. (A QoS 1 delivery is not staged: a crash sends it again, as a new PUBLISH.)
    Stage {
        /// Its store key.
        seq: u64,
        /// The packet identifier it is sent (or released) under.
        packet_id: PacketId,
        /// Where its flow now stands.
        phase: InflightPhase,
    },
    /// The delivery is done with: acknowledged, sent at QoS 0, expired or dropped.
    Retire {
        /// Its store key.
        seq: u64,
    },
    /// The client's QoS 2 PUBLISH under this packet identifier is routed by the
    /// [`Effect::Publish`] that follows: store the identifier with that routing.
    InboundRouted(PacketId),
    /// The client's PUBREL released this inbound QoS 2 packet identifier.
    InboundReleased(PacketId),
}

impl StoreChange {
    /// Whether what the session sends after this change must wait until it is durable. A
    /// QoS 2 delivery's packet identifier and phase must be: a crash that forgot them would
    /// send the message again under a new identifier, which the client takes for a new
    /// message (MQTT 4.3.3), or resend a PUBLISH the client already released. QoS 1 needs
    /// no such wait: a resend after a crash is allowed (at least once).
    pub fn must_precede(&self) -> bool {
        matches!(self, StoreChange::Stage { phase, .. } if *phase != InflightPhase::AwaitingPuback)
    }
}

/// Why a message was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// The queue was full and its policy dropped this one.
    QueueFull,
    /// Its message expiry interval passed before it could be sent.
    Expired,
    /// Larger than the client's Maximum Packet Size (MQTT 5 §3.1.2.11.4:
    /// the server discards it as if it had been sent).
    TooLarge,
    /// QoS 0 for a disconnected session, and QoS 0 is not queued offline.
    Offline,
    /// The session had ended (a delivery raced with the session's end), or
    /// the message was still queued or in flight when it ended.
    SessionEnded,
    /// An inbound PUBLISH marked UTF-8 whose payload is not (MQTT 5 §3.3.2.3.2).
    PayloadFormatInvalid,
    /// An inbound PUBLISH the [`Gate`](crate::Gate) refused.
    NotAuthorized,
    /// The codec refused the PUBLISH for another reason than its size (a
    /// broker bug, such as an invalid topic in a broker-made message).
    Unencodable,
}

/// One filter of a SUBSCRIBE for the router.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscribeRequest {
    /// The raw filter, extensions included (`$share/g/f`, `$exclusive/f`, ...).
    pub filter: String,
    /// The options, QoS already capped at the broker's maximum.
    pub options: SubscriptionOptions,
    /// The SUBSCRIBE's Subscription Identifier, to attach to deliveries.
    pub subscription_id: Option<u32>,
}

impl SubscribeRequest {
    /// Whether to send matching retained messages after this subscribe, given
    /// whether the router found it `new` (no subscription to the same filter
    /// existed): Retain Handling 0 always, 1 only if new, 2 never (MQTT 5
    /// §3.8.3.1); never for a shared subscription (MQTT 5 §4.8.2), `$queue/` included.
    pub fn wants_retained(&self, new: bool) -> bool {
        // `$queue/{filter}` is a shared subscription too (the group `$queue`).
        if self.filter.starts_with("$share/") || self.filter.starts_with("$queue/") {
            return false;
        }
        match self.options.retain_handling {
            RetainHandling::SendAtSubscribe => true,
            RetainHandling::SendIfNewSubscription => new,
            RetainHandling::DoNotSend => false,
        }
    }
}

/// A PUBLISH to the client, encoded but for its payload, which stays shared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutgoingPublish {
    /// Fixed header, topic (or alias), packet identifier and properties,
    /// already checked against the client's Maximum Packet Size with the
    /// payload counted. Write it, then `msg.payload`.
    pub header: Bytes,
    /// The message; its payload follows `header` on the wire.
    pub msg: Arc<Message>,
    /// The packet identifier, for QoS 1 and 2.
    pub packet_id: Option<PacketId>,
    /// The QoS sent.
    pub qos: QoS,
    /// The DUP flag sent.
    pub dup: bool,
    /// The RETAIN flag sent.
    pub retain: bool,
    /// When this delivery's latency started, for the broker's histogram: the message's
    /// [`received_at`](Message::received_at) on the first send of a routed message.
    /// `None` for a resend (DUP: its latency was its first send's), a retained message
    /// sent because of a SUBSCRIBE (its age says nothing of the broker's latency) and a
    /// message with no receive time.
    pub latency_from: Option<crate::Instant>,
}

impl OutgoingPublish {
    /// The packet's size on the wire, header and payload.
    pub fn size(&self) -> usize {
        self.header.len() + self.msg.payload.len()
    }
}
