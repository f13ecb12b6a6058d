//! Packet types: what the codec decodes into and encodes from.

use std::num::NonZeroU16;

use bytes::Bytes;

use crate::{Error, Properties, ReasonCode};

/// A packet identifier. Zero is not a valid identifier (MQTT 5 §2.2.1), so the
/// type cannot hold it.
pub type PacketId = NonZeroU16;

/// The protocol version of a connection, fixed by its CONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// MQTT 3.1: protocol name `MQIsdp`, level 3.
    V3_1,
    /// MQTT 3.1.1: protocol name `MQTT`, level 4.
    V3_1_1,
    /// MQTT 5.0: protocol name `MQTT`, level 5.
    V5,
}

impl Protocol {
    /// The protocol level byte of CONNECT (MQTT 5 §3.1.2.2).
    pub fn level(self) -> u8 {
        match self {
            Protocol::V3_1 => 3,
            Protocol::V3_1_1 => 4,
            Protocol::V5 => 5,
        }
    }

    /// The protocol name string of CONNECT (MQTT 5 §3.1.2.1; MQTT 3.1 §3.1).
    pub fn name(self) -> &'static str {
        match self {
            Protocol::V3_1 => "MQIsdp",
            Protocol::V3_1_1 | Protocol::V5 => "MQTT",
        }
    }

    /// True for MQTT 5, the only version with properties and reason codes.
    pub fn is_v5(self) -> bool {
        self == Protocol::V5
    }
}

/// Quality of service (MQTT 5 §4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum QoS {
    /// QoS 0: at most once.
    #[default]
    AtMostOnce = 0,
    /// QoS 1: at least once.
    AtLeastOnce = 1,
    /// QoS 2: exactly once.
    ExactlyOnce = 2,
}

impl QoS {
    /// The QoS for the two-bit value, or `None` for the reserved value 3.
    pub fn from_u8(value: u8) -> Option<QoS> {
        match value {
            0 => Some(QoS::AtMostOnce),
            1 => Some(QoS::AtLeastOnce),
            2 => Some(QoS::ExactlyOnce),
            _ => None,
        }
    }

    /// The two-bit wire value.
    pub fn as_u8(self) -> u8 {
        self as u8
    }
}

/// The control packet type, the high nibble of the first byte (MQTT 5 §2.1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PacketType {
    /// 1
    Connect = 1,
    /// 2
    Connack = 2,
    /// 3
    Publish = 3,
    /// 4
    Puback = 4,
    /// 5
    Pubrec = 5,
    /// 6
    Pubrel = 6,
    /// 7
    Pubcomp = 7,
    /// 8
    Subscribe = 8,
    /// 9
    Suback = 9,
    /// 10
    Unsubscribe = 10,
    /// 11
    Unsuback = 11,
    /// 12
    Pingreq = 12,
    /// 13
    Pingresp = 13,
    /// 14
    Disconnect = 14,
    /// 15, MQTT 5 only.
    Auth = 15,
}

impl PacketType {
    /// The packet type for a high-nibble value, `None` for the reserved 0 and
    /// for anything above 15.
    pub fn from_u8(value: u8) -> Option<PacketType> {
        use PacketType::*;
        Some(match value {
            1 => Connect,
            2 => Connack,
            3 => Publish,
            4 => Puback,
            5 => Pubrec,
            6 => Pubrel,
            7 => Pubcomp,
            8 => Subscribe,
            9 => Suback,
            10 => Unsubscribe,
            11 => Unsuback,
            12 => Pingreq,
            13 => Pingresp,
            14 => Disconnect,
            15 => Auth,
            _ => return None,
        })
    }
}

/// A decoded or to-be-encoded MQTT control packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet {
    /// CONNECT (MQTT 5 §3.1). Boxed: with two property sets it is several
    /// times larger than the other packets, and it is rare.
    Connect(Box<Connect>),
    /// CONNACK (MQTT 5 §3.2).
    Connack(Connack),
    /// PUBLISH (MQTT 5 §3.3).
    Publish(Publish),
    /// PUBACK (MQTT 5 §3.4).
    Puback(PubAck),
    /// PUBREC (MQTT 5 §3.5).
    Pubrec(PubAck),
    /// PUBREL (MQTT 5 §3.6).
    Pubrel(PubAck),
    /// PUBCOMP (MQTT 5 §3.7).
    Pubcomp(PubAck),
    /// SUBSCRIBE (MQTT 5 §3.8).
    Subscribe(Subscribe),
    /// SUBACK (MQTT 5 §3.9).
    Suback(Suback),
    /// UNSUBSCRIBE (MQTT 5 §3.10).
    Unsubscribe(Unsubscribe),
    /// UNSUBACK (MQTT 5 §3.11).
    Unsuback(Unsuback),
    /// PINGREQ (MQTT 5 §3.12).
    Pingreq,
    /// PINGRESP (MQTT 5 §3.13).
    Pingresp,
    /// DISCONNECT (MQTT 5 §3.14). In 3.x it carries no reason or properties.
    Disconnect(Disconnect),
    /// AUTH (MQTT 5 §3.15), MQTT 5 only.
    Auth(Auth),
}

impl Packet {
    /// The control packet type.
    pub fn packet_type(&self) -> PacketType {
        match self {
            Packet::Connect(_) => PacketType::Connect,
            Packet::Connack(_) => PacketType::Connack,
            Packet::Publish(_) => PacketType::Publish,
            Packet::Puback(_) => PacketType::Puback,
            Packet::Pubrec(_) => PacketType::Pubrec,
            Packet::Pubrel(_) => PacketType::Pubrel,
            Packet::Pubcomp(_) => PacketType::Pubcomp,
            Packet::Subscribe(_) => PacketType::Subscribe,
            Packet::Suback(_) => PacketType::Suback,
            Packet::Unsubscribe(_) => PacketType::Unsubscribe,
            Packet::Unsuback(_) => PacketType::Unsuback,
            Packet::Pingreq => PacketType::Pingreq,
            Packet::Pingresp => PacketType::Pingresp,
            Packet::Disconnect(_) => PacketType::Disconnect,
            Packet::Auth(_) => PacketType::Auth,
        }
    }
}

/// CONNECT (MQTT 5 §3.1).
///
/// A zero-length `client_id` decodes fine; whether to accept it (3.1.1 needs
/// clean session, 3.1 needs 1–23 characters) is the broker's decision, as it
/// answers with a CONNACK rather than by closing the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connect {
    /// The protocol version this CONNECT asks for; later packets on the
    /// connection are decoded and encoded with it.
    pub protocol: Protocol,
    /// Clean Start (5.0) / Clean Session (3.x).
    pub clean_start: bool,
    /// Keep alive in seconds, 0 = off.
    pub keep_alive: u16,
    /// The client identifier.
    pub client_id: String,
    /// The will message, if the Will Flag is set.
    pub will: Option<LastWill>,
    /// The user name, if the User Name Flag is set.
    pub username: Option<String>,
    /// The password, if the Password Flag is set. Binary data, not UTF-8 (MQTT 5 §3.1.3.5).
    pub password: Option<Bytes>,
    /// CONNECT properties (5.0 only; always empty in 3.x).
    pub properties: Properties,
}

/// The will message of a CONNECT (MQTT 5 §3.1.2.5, §3.1.3.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastWill {
    /// A topic name: no wildcards, not empty.
    pub topic: String,
    /// The will payload (binary).
    pub payload: Bytes,
    /// Will QoS.
    pub qos: QoS,
    /// Will Retain.
    pub retain: bool,
    /// Will properties (5.0 only; always empty in 3.x).
    pub properties: Properties,
}

/// CONNACK (MQTT 5 §3.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connack {
    /// Session Present. Always false in 3.1, which has no such flag.
    pub session_present: bool,
    /// The MQTT 5 reason code; 3.x return codes are mapped with
    /// [`ReasonCode::from_connack_v3`] / [`ReasonCode::to_connack_v3`].
    pub reason_code: ReasonCode,
    /// CONNACK properties (5.0 only).
    pub properties: Properties,
}

/// PUBLISH (MQTT 5 §3.3). The payload is a slice of the receive buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publish {
    /// DUP flag; never set with QoS 0.
    pub dup: bool,
    /// QoS.
    pub qos: QoS,
    /// RETAIN flag.
    pub retain: bool,
    /// The topic name. Empty only in 5.0 with a Topic Alias property (MQTT 5 §3.3.2.1).
    pub topic: String,
    /// Present exactly when `qos` is 1 or 2 (MQTT 5 §2.2.1).
    pub packet_id: Option<PacketId>,
    /// PUBLISH properties (5.0 only).
    pub properties: Properties,
    /// The application message, shared with the receive buffer (no copy).
    pub payload: Bytes,
}

impl Publish {
    /// A borrowed view of everything but the payload, for
    /// [`encode_publish_header`](crate::encode_publish_header).
    pub fn header(&self) -> PublishHeader<'_> {
        PublishHeader {
            dup: self.dup,
            qos: self.qos,
            retain: self.retain,
            topic: &self.topic,
            packet_id: self.packet_id,
            properties: &self.properties,
        }
    }
}

/// The part of a PUBLISH before its payload, borrowed, so a broker can build
/// one per subscriber (own packet id, QoS, retain, subscription identifiers)
/// without copying the topic or the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublishHeader<'a> {
    /// DUP flag; never set with QoS 0.
    pub dup: bool,
    /// QoS.
    pub qos: QoS,
    /// RETAIN flag.
    pub retain: bool,
    /// The topic name.
    pub topic: &'a str,
    /// Present exactly when `qos` is 1 or 2.
    pub packet_id: Option<PacketId>,
    /// PUBLISH properties (ignored for 3.x).
    pub properties: &'a Properties,
}

/// PUBACK, PUBREC, PUBREL and PUBCOMP, which share one shape (MQTT 5 §3.4–§3.7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PubAck {
    /// The PUBLISH being acknowledged.
    pub packet_id: PacketId,
    /// Reason code (5.0); `Success` in 3.x.
    pub reason_code: ReasonCode,
    /// Properties (5.0 only; Reason String and User Property).
    pub properties: Properties,
}

impl PubAck {
    /// A successful acknowledgement without properties.
    pub fn new(packet_id: PacketId) -> PubAck {
        PubAck {
            packet_id,
            reason_code: ReasonCode::Success,
            properties: Properties::default(),
        }
    }
}

/// Retain Handling subscription option (MQTT 5 §3.8.3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RetainHandling {
    /// 0: send retained messages at the time of the subscribe.
    #[default]
    SendAtSubscribe = 0,
    /// 1: send retained messages only if the subscription did not exist.
    SendIfNewSubscription = 1,
    /// 2: do not send retained messages.
    DoNotSend = 2,
}

/// Subscription options of one topic filter (MQTT 5 §3.8.3.1). In 3.x only
/// `qos` exists; the other fields are false/default there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SubscriptionOptions {
    /// Maximum QoS.
    pub qos: QoS,
    /// No Local (5.0).
    pub no_local: bool,
    /// Retain As Published (5.0).
    pub retain_as_published: bool,
    /// Retain Handling (5.0).
    pub retain_handling: RetainHandling,
}

impl SubscriptionOptions {
    /// The options byte of MQTT 5 (§3.8.3.1): QoS in bits 0–1, No Local in bit 2, Retain
    /// As Published in bit 3, Retain Handling in bits 4–5. MQTT 3.x sends the QoS bits only.
    pub fn to_byte(self) -> u8 {
        self.qos.as_u8()
            | u8::from(self.no_local) << 2
            | u8::from(self.retain_as_published) << 3
            | (self.retain_handling as u8) << 4
    }

    /// Reads an MQTT 5 options byte.
    ///
    /// # Errors
    /// Reserved bits 6–7 set ([`Error::SubscriptionOptionsReserved`]), QoS 3
    /// ([`Error::SubscriptionQoSInvalid`]), Retain Handling 3 ([`Error::RetainHandlingInvalid`]).
    pub fn from_byte(byte: u8) -> Result<SubscriptionOptions, Error> {
        // MQTT 5 §3.8.3.1: bits 7–6 reserved.
        if byte & 0xC0 != 0 {
            return Err(Error::SubscriptionOptionsReserved);
        }
        let qos = QoS::from_u8(byte & 0b11).ok_or(Error::SubscriptionQoSInvalid)?;
        let retain_handling = match (byte >> 4) & 0b11 {
            0 => RetainHandling::SendAtSubscribe,
            1 => RetainHandling::SendIfNewSubscription,
            2 => RetainHandling::DoNotSend,
            _ => return Err(Error::RetainHandlingInvalid),
        };
        Ok(SubscriptionOptions {
            qos,
            no_local: byte & 0x04 != 0,
            retain_as_published: byte & 0x08 != 0,
            retain_handling,
        })
    }
}

/// One topic filter of a SUBSCRIBE with its options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscribeFilter {
    /// The topic filter (wildcards allowed, `$share/{name}/{filter}` checked).
    pub filter: String,
    /// Its options.
    pub options: SubscriptionOptions,
}

/// SUBSCRIBE (MQTT 5 §3.8). At least one filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscribe {
    /// Packet identifier.
    pub packet_id: PacketId,
    /// The filters, in order, at least one.
    pub filters: Vec<SubscribeFilter>,
    /// Properties (5.0: at most one Subscription Identifier, User Property).
    pub properties: Properties,
}

/// SUBACK (MQTT 5 §3.9).
///
/// In 3.x each code is a granted QoS (`Success`, `GrantedQoS1`,
/// `GrantedQoS2`) or a failure; any failure code is written as 0x80, and 0x80
/// decodes as `UnspecifiedError`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suback {
    /// Packet identifier of the SUBSCRIBE.
    pub packet_id: PacketId,
    /// One code per filter, in order, at least one.
    pub reason_codes: Vec<ReasonCode>,
    /// Properties (5.0 only).
    pub properties: Properties,
}

/// UNSUBSCRIBE (MQTT 5 §3.10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsubscribe {
    /// Packet identifier.
    pub packet_id: PacketId,
    /// The topic filters, at least one.
    pub filters: Vec<String>,
    /// Properties (5.0 only: User Property).
    pub properties: Properties,
}

/// UNSUBACK (MQTT 5 §3.11).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsuback {
    /// Packet identifier of the UNSUBSCRIBE.
    pub packet_id: PacketId,
    /// 5.0: one code per filter, at least one. 3.x: has no payload, so
    /// always empty when decoded and ignored when encoded.
    pub reason_codes: Vec<ReasonCode>,
    /// Properties (5.0 only).
    pub properties: Properties,
}

/// DISCONNECT (MQTT 5 §3.14).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Disconnect {
    /// Reason (5.0); `Success` (Normal disconnection) in 3.x.
    pub reason_code: ReasonCode,
    /// Properties (5.0 only).
    pub properties: Properties,
}

/// AUTH (MQTT 5 §3.15).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Auth {
    /// `Success`, `ContinueAuthentication` or `ReAuthenticate`.
    pub reason_code: ReasonCode,
    /// Properties (Authentication Method/Data, Reason String, User Property).
    pub properties: Properties,
}
