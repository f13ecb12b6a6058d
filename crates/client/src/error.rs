//! The core's one error type: what the broker or the caller did that the
//! protocol does not allow.

use starling_codec::{PacketId, PacketType};

/// An error from [`ClientCore`](crate::ClientCore). Errors from input
/// (`handle_*`) mean the broker broke the protocol: close the connection.
/// Errors from commands leave the core as it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The broker sent bytes the codec refuses (MQTT 5 §4.13).
    #[error("malformed packet from the broker: {0}")]
    Decode(starling_codec::Error),
    /// One of our packets did not encode: a bad topic, or larger than the
    /// broker's Maximum Packet Size (MQTT 5 §3.2.2.3.6).
    #[error("cannot encode {packet_type:?}: {source}")]
    Encode {
        /// The packet.
        packet_type: PacketType,
        /// The codec's reason.
        source: starling_codec::Error,
    },
    /// A packet a broker never sends, or not at this point of the
    /// connection (anything before CONNACK, a second CONNACK).
    #[error("unexpected {packet_type:?} while {state}")]
    Unexpected {
        /// The packet.
        packet_type: PacketType,
        /// Where the connection was.
        state: &'static str,
    },
    /// An acknowledgement for a packet identifier that is not waiting for
    /// that kind of acknowledgement (MQTT 5 §2.2.1).
    #[error("{packet_type:?} for packet id {packet_id}, which is not awaiting one")]
    UnknownPacketId {
        /// The acknowledgement.
        packet_type: PacketType,
        /// Its packet identifier.
        packet_id: PacketId,
    },
    /// No PINGRESP within the keep-alive interval after a PINGREQ
    /// (MQTT 5 §3.1.2.10): the connection is dead.
    #[error("no PINGRESP within {keep_alive_secs} s")]
    KeepAliveTimeout {
        /// The keep-alive interval in force.
        keep_alive_secs: u16,
    },
    /// A command that needs an accepted connection came before CONNACK or
    /// after the connection ended.
    #[error("not connected")]
    NotConnected,
    /// A QoS 1/2 PUBLISH would exceed the in-flight window (the broker's
    /// Receive Maximum, MQTT 5 §4.9, or the configured `inflight_max`).
    #[error("in-flight window of {window} full")]
    WindowFull {
        /// The window.
        window: u16,
    },
    /// Every packet identifier is taken: the oldest one in use is 65,535
    /// identifiers behind, waiting for an acknowledgement that has not come.
    #[error("all 65535 packet identifiers are in use")]
    PacketIdsExhausted,
}
