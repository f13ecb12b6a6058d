//! A session's state as a plain value, to save and to move: what
//! [`Session::snapshot`](crate::Session::snapshot) returns and
//! [`Session::restore`](crate::Session::restore) takes.
//!
//! The types derive serde's `Serialize` and `Deserialize` and pick no format: the store
//! chooses one. Fields of MQTT types are written in MQTT's own encoding, which is compact
//! and fixed by the spec: a QoS, a reason code and subscription options as their byte,
//! properties as an MQTT 5 property list (decoded as strictly as in a packet, so that a
//! state whose properties a PUBLISH or a will could not carry fails to deserialize).
//! Payloads are bytes.
//!
//! Deadlines are wall-clock [`SystemTime`]s, so that they survive a restart, where the
//! monotonic [`Instant`](crate::Instant)s the session runs on mean nothing; the session
//! converts at the boundary with the `now` and `wall` its caller passes, and reads no clock.
//!
//! Deserializing checks the encoding; [`Session::restore`](crate::Session::restore) checks
//! the rest (duplicate packet identifiers, limits, a phase that does not fit its QoS, ...)
//! and says what is wrong with a [`RestoreError`](crate::RestoreError).

use std::time::SystemTime;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use starling_codec::{PacketId, Properties, QoS, ReasonCode, SubscriptionOptions};

mod wire;

/// The layout version [`SessionState::version`] carries; restore refuses any other. Bump
/// it when a field changes meaning or shape.
pub const SESSION_STATE_VERSION: u32 = 1;

/// Everything a session owns beyond its connection, at one moment.
///
/// Not in it: what belongs to a connection (keep alive, topic aliases, the limits the
/// client announced), since a restored session is detached; effects not yet drained; the
/// broker's [`SessionLimits`](crate::SessionLimits), which restore takes afresh.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionState {
    /// [`SESSION_STATE_VERSION`] when it was taken.
    pub version: u32,
    /// The client identifier.
    pub client_id: String,
    /// The packet identifier the next outbound QoS 1/2 delivery tries first (identifiers in
    /// flight are skipped). Kept even without state: a session that ended goes on counting
    /// from here.
    pub next_packet_id: PacketId,
    /// The state of a session that outlives its connection; `None` when there is none
    /// (never attached, or ended): the restored session then starts afresh when a
    /// connection attaches.
    pub detached: Option<DetachedState>,
}

/// The state a detached session keeps until a connection resumes it or it expires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DetachedState {
    /// The Session Expiry Interval in force, seconds; `u32::MAX`: never expires.
    pub expiry_interval_secs: u32,
    /// When the session ends unless a connection resumes it; `None`: never.
    pub expires_at: Option<SystemTime>,
    /// The will of the last connection, if not yet published nor discarded.
    pub will: Option<WillState>,
    /// Filters the router granted, in filter order.
    pub subscriptions: Vec<SubscriptionState>,
    /// Outbound QoS 1/2 deliveries awaiting acknowledgement, in the order they were first
    /// sent: a resumed session resends them in this order (MQTT 5 §4.6).
    pub inflight: Vec<InflightState>,
    /// Messages waiting for the window or for a connection, oldest first.
    pub queue: Vec<DeliveryState>,
    /// Packet identifiers of the client's QoS 2 PUBLISHes routed and awaiting PUBREL
    /// (MQTT 5 §4.3.3): a resent PUBLISH with one of them is not routed again.
    pub inbound_qos2: Vec<PacketId>,
    /// SUBSCRIBEs forwarded to the router and not yet answered: a late answer still records
    /// the subscriptions, and the session's end still removes the filters from the router.
    pub pending_subscribes: Vec<PendingSubscribeState>,
    /// UNSUBSCRIBEs forwarded to the router and not yet answered.
    pub pending_unsubscribes: Vec<PendingUnsubscribeState>,
    /// The last CONNECT asked to resume a session and was told there was none, and the
    /// client has sent nothing since ([`Session::is_unheard`](crate::Session::is_unheard)).
    pub unheard: bool,
}

/// A will waiting to be published.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WillState {
    /// The will topic.
    pub topic: String,
    /// The will payload.
    pub payload: Bytes,
    /// The will QoS.
    #[serde(with = "wire::qos")]
    pub qos: QoS,
    /// The will's RETAIN flag.
    pub retain: bool,
    /// The will properties as the CONNECT carried them, Will Delay Interval included (the
    /// delay is read from there, as on attach).
    #[serde(with = "wire::will_properties")]
    pub properties: Properties,
    /// When it is published: the will delay of a detached session runs out then (MQTT 5
    /// §3.1.3.2.2). `None`: only when the session ends.
    pub due_at: Option<SystemTime>,
}

/// One subscription, granted or awaiting the router.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubscriptionState {
    /// The raw filter, extensions included (`$share/g/f`, ...).
    pub filter: String,
    /// The options, QoS as granted (or as asked, while the router has not answered).
    #[serde(with = "wire::subscription_options")]
    pub options: SubscriptionOptions,
    /// The SUBSCRIBE's Subscription Identifier.
    pub subscription_id: Option<u32>,
}

/// An outbound QoS 1/2 delivery awaiting acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InflightState {
    /// Its packet identifier.
    pub packet_id: PacketId,
    /// Where its flow stands.
    pub phase: InflightPhase,
    /// The delivery; its QoS is the one the phase belongs to.
    pub delivery: DeliveryState,
}

/// Where an outbound QoS 1/2 flow stands (MQTT 5 §4.3.2, §4.3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum InflightPhase {
    /// QoS 1 PUBLISH sent, awaiting PUBACK.
    AwaitingPuback,
    /// QoS 2 PUBLISH sent, awaiting PUBREC.
    AwaitingPubrec,
    /// QoS 2 PUBREL sent, awaiting PUBCOMP.
    AwaitingPubcomp,
}

impl InflightPhase {
    /// The QoS of the deliveries in this phase.
    pub fn qos(self) -> QoS {
        match self {
            InflightPhase::AwaitingPuback => QoS::AtLeastOnce,
            InflightPhase::AwaitingPubrec | InflightPhase::AwaitingPubcomp => QoS::ExactlyOnce,
        }
    }
}

/// A message on its way to this client, with the choices its subscription made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryState {
    /// The message.
    pub message: MessageState,
    /// The QoS it goes out with: `min(message QoS, subscription QoS)`.
    #[serde(with = "wire::qos")]
    pub qos: QoS,
    /// The RETAIN flag it goes out with.
    pub retain: bool,
    /// The Subscription Identifiers it goes out with, in order.
    pub subscription_ids: Vec<u32>,
}

/// An application message ([`Message`](crate::Message)), as routed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageState {
    /// The topic name.
    pub topic: String,
    /// The payload.
    pub payload: Bytes,
    /// The QoS it was published with.
    #[serde(with = "wire::qos")]
    pub qos: QoS,
    /// The RETAIN flag it was published with.
    pub retain: bool,
    /// Its application properties, as a PUBLISH carries them.
    #[serde(with = "wire::publish_properties")]
    pub properties: Properties,
    /// When it expires; `None`: never.
    pub expiry: Option<ExpiryState>,
    /// The publisher's client identifier, for No Local.
    pub publisher: Option<String>,
}

/// When a message expires ([`Expiry`](crate::Expiry)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpiryState {
    /// The deadline.
    pub at: SystemTime,
    /// Whether subscribers are told what is left of it (the publisher set one).
    pub announced: bool,
}

/// A SUBSCRIBE the router has not answered yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingSubscribeState {
    /// The SUBSCRIBE's packet identifier.
    pub packet_id: PacketId,
    /// One per filter of the SUBSCRIBE, in order.
    pub filters: Vec<PendingFilter>,
}

/// One filter of an unanswered SUBSCRIBE.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PendingFilter {
    /// The session decided it (refused it): this SUBACK code.
    Decided(#[serde(with = "wire::reason_code")] ReasonCode),
    /// Forwarded to the router, which has not answered.
    Forwarded(SubscriptionState),
}

/// An UNSUBSCRIBE the router has not answered yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingUnsubscribeState {
    /// The UNSUBSCRIBE's packet identifier.
    pub packet_id: PacketId,
    /// Its filters, in order.
    pub filters: Vec<String>,
}
