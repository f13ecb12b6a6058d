//! Errors of the session: a peer breaking the protocol, or the broker calling
//! out of order.

use starling_codec::{PacketType, QoS, ReasonCode};

/// Why [`Session::handle_packet`](crate::Session::handle_packet) or
/// [`Session::attach`](crate::Session::attach) failed.
///
/// Protocol violations by the client have already closed the session's side
/// of the connection (an [`Effect::Close`](crate::Effect::Close) with
/// [`SessionError::reason_code`] is queued) when they are returned; the
/// error is for logs and counters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// A second CONNECT on one connection (MQTT 5 §3.1: protocol error).
    #[error("second CONNECT on the connection")]
    SecondConnect,
    /// A packet a client never sends (CONNACK, SUBACK, ...), or AUTH, which
    /// needs an enhanced authentication the session does not do.
    #[error("unexpected {packet_type:?} from the client")]
    UnexpectedPacket {
        /// Its type.
        packet_type: PacketType,
    },
    /// A PUBLISH from a client with a Subscription Identifier (MQTT 5 §3.3.4).
    #[error("PUBLISH from a client with a subscription identifier")]
    SubscriptionIdInPublish,
    /// A Topic Alias of 0 or above the maximum we announced (MQTT 5 §3.3.2.3.4).
    #[error("topic alias {alias} not in 1..={max}")]
    TopicAliasInvalid {
        /// The alias sent.
        alias: u16,
        /// Our Topic Alias Maximum.
        max: u16,
    },
    /// An empty topic with an alias that names no topic yet (MQTT 5 §3.3.4).
    #[error("topic alias {alias} used before it was set")]
    TopicAliasUnknown {
        /// The alias sent.
        alias: u16,
    },
    /// More unreleased QoS 2 PUBLISHes than our Receive Maximum (MQTT 5 §3.3.4).
    #[error("more than {max} QoS 2 messages awaiting PUBREL")]
    ReceiveMaximumExceeded {
        /// Our Receive Maximum.
        max: u16,
    },
    /// A PUBLISH above our Maximum QoS (MQTT 5 §3.2.2.3.4).
    #[error("PUBLISH with {qos:?} above the maximum {max:?}")]
    QosNotSupported {
        /// The QoS sent.
        qos: QoS,
        /// Our maximum.
        max: QoS,
    },
    /// A retained PUBLISH where retain is not available (MQTT 5 §3.2.2.3.5).
    #[error("retained PUBLISH but retain is not available")]
    RetainNotSupported,
    /// A SUBSCRIBE with a Subscription Identifier where they are not
    /// available (MQTT 5 §3.2.2.3.12).
    #[error("subscription identifiers are not available")]
    SubscriptionIdsNotSupported,
    /// No Local on a shared subscription (MQTT 5 §3.8.3.1).
    #[error("no local set on shared subscription {filter}")]
    NoLocalOnShared {
        /// The filter.
        filter: String,
    },
    /// A PUBLISH topic longer than `topic_len_max` (MQTT 5 §3.3.2.1 lets the
    /// server refuse a well-formed topic with 0x90).
    #[error("topic of {len} bytes exceeds {max}")]
    TopicTooLong {
        /// Its length in bytes.
        len: usize,
        /// `topic_len_max`.
        max: usize,
    },
    /// A PUBLISH topic with more levels than `topic_levels_max` (0x90 as above).
    #[error("topic of {levels} levels exceeds {max}")]
    TopicTooManyLevels {
        /// Its `/`-separated levels.
        levels: usize,
        /// `topic_levels_max`.
        max: usize,
    },
    /// An acknowledgement of the wrong type for the delivery it names: PUBREC
    /// or PUBCOMP for QoS 1, PUBACK for QoS 2, PUBCOMP before PUBREC
    /// (MQTT 3.1.1 §4.8: close the connection; MQTT 5 §4.13: 0x82).
    #[error("{packet_type:?} for packet {packet_id} in the wrong stage of its flow")]
    UnexpectedAck {
        /// The acknowledgement received.
        packet_type: PacketType,
        /// The packet identifier it names.
        packet_id: u16,
    },
    /// The CONNACK does not fit the client's Maximum Packet Size (MQTT 5
    /// §3.1.2.11.4): nothing may be sent, and without a CONNACK the
    /// connection cannot go on. Returned by
    /// [`Session::attach`](crate::Session::attach) with the session unchanged
    /// and nothing queued: close the connection without writing anything.
    #[error("CONNACK of {size} bytes exceeds the client's maximum packet size {max}")]
    ConnackTooLarge {
        /// The CONNACK's size in bytes.
        size: u64,
        /// The client's Maximum Packet Size.
        max: u32,
    },
    /// DISCONNECT setting a session expiry when CONNECT had 0 (MQTT 5 §3.14.2.2.2).
    #[error("session expiry set on DISCONNECT after 0 on CONNECT")]
    SessionExpiryAfterZero,
    /// The broker called [`Session::handle_packet`](crate::Session::handle_packet)
    /// while no connection is attached.
    #[error("no connection attached")]
    NotAttached,
    /// The broker called [`Session::attach`](crate::Session::attach) while a
    /// connection is attached; detach it first (takeover).
    #[error("a connection is already attached")]
    AlreadyAttached,
}

impl SessionError {
    /// The MQTT 5 DISCONNECT reason code for this error: the one place that
    /// maps what a client did wrong to a reason code.
    pub fn reason_code(&self) -> ReasonCode {
        use SessionError::*;
        match self {
            SecondConnect
            | UnexpectedPacket { .. }
            | SubscriptionIdInPublish
            | TopicAliasUnknown { .. }
            | NoLocalOnShared { .. }
            | UnexpectedAck { .. }
            | SessionExpiryAfterZero => ReasonCode::ProtocolError,
            TopicTooLong { .. } | TopicTooManyLevels { .. } => ReasonCode::TopicNameInvalid,
            ConnackTooLarge { .. } => ReasonCode::PacketTooLarge,
            TopicAliasInvalid { .. } => ReasonCode::TopicAliasInvalid,
            ReceiveMaximumExceeded { .. } => ReasonCode::ReceiveMaximumExceeded,
            QosNotSupported { .. } => ReasonCode::QoSNotSupported,
            RetainNotSupported => ReasonCode::RetainNotSupported,
            SubscriptionIdsNotSupported => ReasonCode::SubscriptionIdentifiersNotSupported,
            NotAttached | AlreadyAttached => ReasonCode::ImplementationSpecificError,
        }
    }
}

/// Why [`Session::restore`](crate::Session::restore) refused a
/// [`SessionState`](crate::SessionState): it was read from a store and is not a state a
/// session can be in (corrupted, or written under larger limits than the broker now has).
///
/// An enum of its own rather than more [`SessionError`] variants: these come from the
/// broker's own storage, not from a client, and have no reason code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestoreError {
    /// The state was written in another layout.
    #[error("session state version {found}, this build reads version {supported}")]
    UnsupportedVersion {
        /// The state's version.
        found: u32,
        /// [`SESSION_STATE_VERSION`](crate::state::SESSION_STATE_VERSION).
        supported: u32,
    },
    /// A packet identifier appears twice in one list.
    #[error("packet identifier {packet_id} appears twice among the {list}")]
    DuplicatePacketId {
        /// Which list.
        list: PacketIdList,
        /// The identifier.
        packet_id: u16,
    },
    /// More deliveries in flight than `inflight_max` allows.
    #[error("{len} deliveries in flight, more than inflight_max {max}")]
    InflightOverLimit {
        /// In the state.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// More queued messages than the queue's hard bound
    /// ([`SessionLimits::mqueue_len_hard`](crate::SessionLimits::mqueue_len_hard)).
    #[error("{len} queued messages, more than the queue's bound {max}")]
    QueueOverLimit {
        /// In the state.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// More inbound QoS 2 messages awaiting PUBREL than `receive_max`.
    #[error("{len} inbound QoS 2 messages awaiting PUBREL, more than receive_max {max}")]
    InboundQos2OverLimit {
        /// In the state.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// An in-flight delivery whose QoS is not the one of its phase.
    #[error("delivery {packet_id} in flight at {qos:?} in phase {phase:?}")]
    InflightPhaseMismatch {
        /// Its packet identifier.
        packet_id: u16,
        /// Its QoS.
        qos: QoS,
        /// Its phase.
        phase: crate::state::InflightPhase,
    },
    /// Two subscriptions to one filter.
    #[error("two subscriptions to {filter}")]
    DuplicateSubscription {
        /// The filter.
        filter: String,
    },
    /// A Subscription Identifier outside 1..=268,435,455 (MQTT 5 §3.8.2.1.2).
    #[error("subscription identifier {id} outside 1..=268435455")]
    SubscriptionIdInvalid {
        /// The identifier.
        id: u32,
    },
}

/// The lists of a [`SessionState`](crate::SessionState) keyed by packet identifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PacketIdList {
    /// Outbound deliveries in flight.
    Inflight,
    /// Inbound QoS 2 messages awaiting PUBREL.
    InboundQos2,
    /// Unanswered SUBSCRIBEs.
    PendingSubscribes,
    /// Unanswered UNSUBSCRIBEs.
    PendingUnsubscribes,
}

impl std::fmt::Display for PacketIdList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PacketIdList::Inflight => "deliveries in flight",
            PacketIdList::InboundQos2 => "inbound QoS 2 messages",
            PacketIdList::PendingSubscribes => "unanswered SUBSCRIBEs",
            PacketIdList::PendingUnsubscribes => "unanswered UNSUBSCRIBEs",
        })
    }
}
