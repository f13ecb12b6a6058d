//! The codec's one error type and its mapping to MQTT 5 reason codes.

use crate::{PacketType, Protocol, QoS, ReasonCode};

/// Everything that can go wrong decoding or encoding a packet.
///
/// Decoding errors are caused by the peer: the connection must then be
/// closed, in 5.0 after a DISCONNECT (or, for a CONNECT, a CONNACK) carrying
/// [`Error::reason_code`]. Encoding errors mean the packet given to the
/// encoder breaks a rule (or is too large for the peer); nothing is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The whole packet (fixed header included) is larger than allowed.
    /// On decode, refused as soon as the remaining length is read.
    #[error("packet of {size} bytes exceeds the maximum packet size of {max}")]
    PacketTooLarge {
        /// Whole packet size in bytes.
        size: u64,
        /// The limit.
        max: u32,
    },
    /// A variable byte integer has a fifth byte (MQTT 5 §1.5.5).
    #[error("variable byte integer longer than 4 bytes")]
    VarIntTooLong,
    /// A variable byte integer uses more bytes than its value needs (MQTT 5 §1.5.5).
    #[error("variable byte integer not minimally encoded")]
    VarIntNonMinimal,
    /// Encoding a value above 268,435,455 as a variable byte integer.
    #[error("value {value} does not fit a variable byte integer")]
    VarIntOutOfRange {
        /// The value.
        value: u32,
    },
    /// Packet type 0, or AUTH (15) before MQTT 5 (MQTT 5 §2.1.2).
    #[error("reserved packet type {packet_type} for {protocol:?}")]
    ReservedPacketType {
        /// The high nibble of the first byte.
        packet_type: u8,
        /// The connection's protocol.
        protocol: Protocol,
    },
    /// Fixed header flags differ from the values the spec fixes (MQTT 5 §2.1.3).
    #[error("invalid fixed header flags {flags:#06b} for {packet_type:?}")]
    InvalidFixedHeaderFlags {
        /// The packet type.
        packet_type: PacketType,
        /// The low nibble of the first byte.
        flags: u8,
    },
    /// A field runs past the remaining length.
    #[error("field runs past the end of the packet")]
    UnexpectedEndOfPacket,
    /// Bytes remain after the last field (MQTT 5 §2.1.4).
    #[error("{count} trailing bytes after the last field")]
    TrailingBytes {
        /// How many.
        count: usize,
    },
    /// A string is not well-formed UTF-8 (MQTT 5 §1.5.4).
    #[error("string is not valid UTF-8")]
    InvalidUtf8,
    /// A string holds U+0000, a control character or a non-character (MQTT 5 §1.5.4).
    #[error("string holds disallowed code point U+{code_point:04X}")]
    DisallowedCodePoint {
        /// The code point.
        code_point: u32,
    },
    /// A string or binary field longer than 65,535 bytes (encode only).
    #[error("field of {len} bytes exceeds 65535")]
    FieldTooLong {
        /// Its length.
        len: usize,
    },
    /// The first packet of a connection is not CONNECT (MQTT 5 §3.1).
    #[error("first packet is {packet_type}, not CONNECT")]
    FirstPacketNotConnect {
        /// The packet type nibble received.
        packet_type: u8,
    },
    /// CONNECT protocol name is neither `MQTT` nor `MQIsdp` with the matching level.
    #[error("unknown protocol name")]
    InvalidProtocolName,
    /// CONNECT protocol level is not 3, 4 or 5 (MQTT 5 §3.1.2.2).
    #[error("unsupported protocol level {level}")]
    UnsupportedProtocolVersion {
        /// The level byte.
        level: u8,
    },
    /// Encoding a CONNECT with a `protocol` other than the one asked for.
    #[error("CONNECT is {connect:?} but encoding for {requested:?}")]
    ConnectProtocolMismatch {
        /// `Connect::protocol`.
        connect: Protocol,
        /// The encoder's protocol argument.
        requested: Protocol,
    },
    /// CONNECT flags bit 0 is reserved and must be 0 (MQTT 5 §3.1.2.3).
    #[error("CONNECT reserved flag set")]
    ConnectReservedFlag,
    /// Will QoS or Will Retain set without the Will Flag (MQTT 5 §3.1.2.6, §3.1.2.7).
    #[error("will QoS or retain set without will flag")]
    WillFlagsWithoutWill,
    /// A PUBLISH or Will QoS field holds 3 (MQTT 5 §3.3.1.2, §3.1.2.6: "is a
    /// Malformed Packet").
    #[error("QoS 3 is reserved")]
    InvalidQoS,
    /// A SUBSCRIBE's Maximum QoS holds 3. Its own variant because MQTT 5
    /// §3.8.3.1 makes it a Protocol Error, not a Malformed Packet as for
    /// PUBLISH and the will.
    #[error("subscription maximum QoS 3 is reserved")]
    SubscriptionQoSInvalid,
    /// Password Flag without User Name Flag, forbidden before 5.0 (MQTT 3.1.1 §3.1.2.9).
    #[error("password without user name")]
    PasswordWithoutUsername,
    /// Authentication Data without Authentication Method (MQTT 5 §3.1.2.11.10).
    #[error("authentication data without authentication method")]
    AuthDataWithoutMethod,
    /// CONNACK acknowledge flags bits 7–1 are reserved (MQTT 5 §3.2.2.1).
    #[error("CONNACK reserved flags set")]
    ConnackReservedFlags,
    /// CONNACK with Session Present and a failure code (MQTT 5 §3.2.2.1.1).
    #[error("CONNACK with session present and an error code")]
    SessionPresentWithError,
    /// A reason (or 3.x return) code that is undefined or not allowed in this packet (MQTT 5 §2.4).
    #[error("reason code {code:#04x} not allowed in {packet_type:?}")]
    ReasonCodeNotAllowed {
        /// The packet type.
        packet_type: PacketType,
        /// The code.
        code: u8,
    },
    /// Empty topic name (MQTT 5 §4.7.3), allowed only in a 5.0 PUBLISH with a Topic Alias.
    #[error("empty topic name")]
    TopicNameEmpty,
    /// `+` or `#` in a topic name (MQTT 5 §3.3.2.1).
    #[error("wildcard in topic name")]
    TopicNameWildcard,
    /// Empty topic filter (MQTT 5 §4.7.3).
    #[error("empty topic filter")]
    TopicFilterEmpty,
    /// `#` not alone and last in its level, or `+` not alone in its level (MQTT 5 §4.7.1).
    #[error("misplaced wildcard in topic filter")]
    TopicFilterWildcardMisplaced,
    /// `$share/` without a valid share name and filter (MQTT 5 §4.8.2).
    #[error("invalid shared subscription")]
    SharedSubscriptionInvalid,
    /// No Local on a shared subscription (MQTT 5 §3.8.3.1).
    #[error("no local set on a shared subscription")]
    NoLocalOnSharedSubscription,
    /// Packet identifier 0 where one is required (MQTT 5 §2.2.1).
    #[error("packet identifier 0")]
    PacketIdZero,
    /// Encoding a PUBLISH whose packet id presence does not match its QoS (MQTT 5 §2.2.1).
    #[error("packet identifier presence does not match {qos:?}")]
    PacketIdMismatch {
        /// The PUBLISH QoS.
        qos: QoS,
    },
    /// DUP set on a QoS 0 PUBLISH (MQTT 5 §3.3.1.1).
    #[error("DUP set on a QoS 0 PUBLISH")]
    DupWithQoS0,
    /// SUBSCRIBE, UNSUBSCRIBE, SUBACK or 5.0 UNSUBACK without entries (MQTT 5 §3.8.3, §3.10.3).
    #[error("{packet_type:?} without entries")]
    EmptyPayload {
        /// The packet type.
        packet_type: PacketType,
    },
    /// Subscription options reserved bits set (MQTT 5 §3.8.3.1; in 3.x the upper six bits).
    #[error("subscription options reserved bits set")]
    SubscriptionOptionsReserved,
    /// Retain Handling 3 (MQTT 5 §3.8.3.1).
    #[error("retain handling 3 is reserved")]
    RetainHandlingInvalid,
    /// An undefined property identifier (MQTT 5 §2.2.2.2).
    #[error("unknown property identifier {id:#04x}")]
    UnknownProperty {
        /// The identifier.
        id: u32,
    },
    /// A property that this packet may not carry (MQTT 5 §2.2.2.2).
    #[error("property {id:#04x} not allowed in {packet_type:?}")]
    PropertyNotAllowed {
        /// The property identifier.
        id: u8,
        /// The packet type (Connect also for will properties).
        packet_type: PacketType,
    },
    /// A property given twice that may appear only once (MQTT 5 §2.2.2.2).
    #[error("duplicate property {id:#04x}")]
    DuplicateProperty {
        /// The property identifier.
        id: u8,
    },
    /// Topic Alias, Receive Maximum, Maximum Packet Size or Subscription Identifier of 0.
    #[error("property {id:#04x} must not be 0")]
    PropertyValueZero {
        /// The property identifier.
        id: u8,
    },
    /// A property value outside its range (a flag not 0/1, Maximum QoS 2, a
    /// Response Topic with wildcards, a Subscription Identifier above 268,435,455).
    #[error("invalid value for property {id:#04x}")]
    InvalidPropertyValue {
        /// The property identifier.
        id: u8,
    },
    /// Encoding a packet type that the protocol does not have (AUTH before 5.0).
    #[error("{packet_type:?} does not exist in {protocol:?}")]
    PacketNotInProtocol {
        /// The packet type.
        packet_type: PacketType,
        /// The protocol.
        protocol: Protocol,
    },
}

impl Error {
    /// The MQTT 5 reason code to send when closing a connection for this
    /// error: in a DISCONNECT, or in the CONNACK when decoding the CONNECT
    /// failed. The one place where peer errors meet reason codes.
    ///
    /// Malformed Packet (0x81) is for bytes that cannot be parsed as the
    /// spec's encoding (MQTT 5 §4.13.1, and wherever the spec says "is a
    /// Malformed Packet", e.g. §2.1.3 flags, §1.5.4 strings, §2.2.2.2 property
    /// identifiers); Protocol Error (0x82) for well-formed data the spec
    /// forbids ("It is a Protocol Error ...": duplicate properties, zero
    /// values, empty SUBSCRIBE).
    pub fn reason_code(&self) -> ReasonCode {
        use Error::*;
        match self {
            PacketTooLarge { .. } => ReasonCode::PacketTooLarge,
            InvalidProtocolName | UnsupportedProtocolVersion { .. } => {
                ReasonCode::UnsupportedProtocolVersion
            }
            TopicNameWildcard => ReasonCode::TopicNameInvalid,
            TopicFilterEmpty | TopicFilterWildcardMisplaced | SharedSubscriptionInvalid => {
                ReasonCode::TopicFilterInvalid
            }
            FirstPacketNotConnect { .. }
            | AuthDataWithoutMethod
            | SessionPresentWithError
            | TopicNameEmpty
            | NoLocalOnSharedSubscription
            | PacketIdZero
            | PacketIdMismatch { .. }
            | EmptyPayload { .. }
            | RetainHandlingInvalid
            | SubscriptionQoSInvalid
            | DuplicateProperty { .. }
            | PropertyValueZero { .. }
            | InvalidPropertyValue { .. }
            | ConnectProtocolMismatch { .. }
            | PacketNotInProtocol { .. } => ReasonCode::ProtocolError,
            VarIntTooLong
            | VarIntNonMinimal
            | VarIntOutOfRange { .. }
            | ReservedPacketType { .. }
            | InvalidFixedHeaderFlags { .. }
            | UnexpectedEndOfPacket
            | TrailingBytes { .. }
            | InvalidUtf8
            | DisallowedCodePoint { .. }
            | FieldTooLong { .. }
            | ConnectReservedFlag
            | WillFlagsWithoutWill
            | InvalidQoS
            | PasswordWithoutUsername
            | ConnackReservedFlags
            | ReasonCodeNotAllowed { .. }
            | DupWithQoS0
            | SubscriptionOptionsReserved
            | UnknownProperty { .. }
            | PropertyNotAllowed { .. } => ReasonCode::MalformedPacket,
        }
    }
}
