//! MQTT 3.1, 3.1.1 and 5.0 codec: bytes to packets and back, strictly validated, sans-IO.
//!
//! # Use from a broker
//!
//! ```
//! use bytes::BytesMut;
//! use starling_codec::{decode, decode_connect, encode, Connack, Packet, ReasonCode, Properties};
//!
//! // Bytes read from a socket accumulate in `buf`.
//! let mut buf = BytesMut::from(&b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00"[..]);
//! let max = 1 << 20; // our packet_size_max
//! // The first packet fixes the protocol version of the connection.
//! let connect = decode_connect(&mut buf, max).unwrap().expect("whole packet");
//! let protocol = connect.protocol;
//! // Later packets: loop until Ok(None) (needs more bytes).
//! while let Some(packet) = decode(&mut buf, protocol, max).unwrap() {
//!     let _ = packet;
//! }
//! // Replies are encoded for the same version, within the client's Maximum Packet Size.
//! let mut out = BytesMut::new();
//! let connack = Packet::Connack(Connack {
//!     session_present: false,
//!     reason_code: ReasonCode::Success,
//!     properties: Properties::default(),
//! });
//! encode(&connack, protocol, u32::MAX, &mut out).unwrap();
//! assert_eq!(&out[..], b"\x20\x02\x00\x00");
//! ```
//!
//! On a decoding error, close the connection; in 5.0 first send a
//! DISCONNECT (or CONNACK) with [`Error::reason_code`].
//!
//! For fan-out, [`encode_publish_header`] writes everything of a PUBLISH but
//! its payload, which the caller sends from the shared [`bytes::Bytes`].

#![warn(missing_docs)]

mod decode;
mod encode;
mod error;
mod properties;
mod reason;
mod types;
#[cfg(test)]
mod validation_tests;
mod wire;

pub use decode::{decode, decode_connect, peek_protocol};
pub use encode::{encode, encode_publish_header};
pub use error::Error;
pub use properties::{
    decode_properties, encode_properties, id as property_id, PayloadFormat, Properties,
    PropertyPlace,
};
pub use reason::{ReasonCode, ALL_REASON_CODES};
pub use types::*;
pub use wire::VAR_INT_MAX;

/// The largest packet MQTT can express: a 1-byte type, a 4-byte remaining
/// length, and 268,435,455 bytes of body (MQTT 5 §1.5.5, §2.1.4).
pub const PACKET_SIZE_MAX: u32 = 1 + 4 + VAR_INT_MAX;
