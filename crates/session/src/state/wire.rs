//! Serde adapters writing the codec's types in MQTT's own encoding, for
//! `#[serde(with = "...")]`: the codec stays free of serde, and the encoding is the one
//! the spec fixes rather than one a derive would choose.

use bytes::{Bytes, BytesMut};
use serde::de::Error as _;
use serde::ser::Error as _;
use serde::{Deserialize, Deserializer, Serializer};
use starling_codec::{PacketType, Properties, PropertyPlace};

/// A QoS as its two-bit value.
pub(super) mod qos {
    use super::*;
    use starling_codec::QoS;

    pub fn serialize<S: Serializer>(qos: &QoS, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u8(qos.as_u8())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<QoS, D::Error> {
        let b = u8::deserialize(d)?;
        QoS::from_u8(b).ok_or_else(|| D::Error::custom(format_args!("QoS {b} is not 0, 1 or 2")))
    }
}

/// A reason code as its byte.
pub(super) mod reason_code {
    use super::*;
    use starling_codec::ReasonCode;

    pub fn serialize<S: Serializer>(code: &ReasonCode, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u8(code.as_u8())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ReasonCode, D::Error> {
        let b = u8::deserialize(d)?;
        ReasonCode::from_u8(b)
            .ok_or_else(|| D::Error::custom(format_args!("no reason code {b:#04x}")))
    }
}

/// Subscription options as the MQTT 5 options byte (MQTT 5 §3.8.3.1).
pub(super) mod subscription_options {
    use super::*;
    use starling_codec::SubscriptionOptions;

    pub fn serialize<S: Serializer>(o: &SubscriptionOptions, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u8(o.to_byte())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SubscriptionOptions, D::Error> {
        SubscriptionOptions::from_byte(u8::deserialize(d)?).map_err(D::Error::custom)
    }
}

/// Properties as the MQTT 5 property list of a PUBLISH (length first, MQTT 5 §2.2.2).
pub(super) mod publish_properties {
    use super::*;

    const PLACE: PropertyPlace = PropertyPlace::Packet(PacketType::Publish);

    pub fn serialize<S: Serializer>(p: &Properties, s: S) -> Result<S::Ok, S::Error> {
        put(p, PLACE, s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Properties, D::Error> {
        get(PLACE, d)
    }
}

/// Properties as the MQTT 5 will property list of a CONNECT (MQTT 5 §3.1.3.2).
pub(super) mod will_properties {
    use super::*;

    const PLACE: PropertyPlace = PropertyPlace::Will;

    pub fn serialize<S: Serializer>(p: &Properties, s: S) -> Result<S::Ok, S::Error> {
        put(p, PLACE, s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Properties, D::Error> {
        get(PLACE, d)
    }
}

fn put<S: Serializer>(p: &Properties, place: PropertyPlace, s: S) -> Result<S::Ok, S::Error> {
    let mut buf = BytesMut::new();
    starling_codec::encode_properties(p, place, &mut buf).map_err(S::Error::custom)?;
    s.serialize_bytes(&buf)
}

fn get<'de, D: Deserializer<'de>>(place: PropertyPlace, d: D) -> Result<Properties, D::Error> {
    // `Bytes` accepts what formats make of bytes (a byte string, or a sequence of numbers).
    let raw = Bytes::deserialize(d)?;
    starling_codec::decode_properties(raw, place).map_err(D::Error::custom)
}
