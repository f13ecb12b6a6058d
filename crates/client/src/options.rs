//! How a [`ClientCore`](crate::ClientCore) behaves, and where its connection is.

use std::num::NonZeroU16;

use starling_codec::{Connect, PACKET_SIZE_MAX};

/// Who acknowledges what the broker sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Acks {
    /// The core answers every PUBLISH (PUBACK, or PUBREC then PUBCOMP on
    /// PUBREL), delivers a QoS 2 message once however often the broker
    /// repeats it (MQTT 5 §4.3.3), and refuses acknowledgements for packet
    /// identifiers it is not waiting on.
    #[default]
    Auto,
    /// The caller answers PUBLISH and PUBREL (with [`ClientCore::acknowledge`](crate::ClientCore::acknowledge)
    /// or [`ClientCore::send_packet`](crate::ClientCore::send_packet)); the core still completes the flows
    /// of what it published itself. Acknowledgements it is not waiting for
    /// reach the caller as [`Event::Ack`](crate::Event::Ack), and nothing is deduplicated:
    /// for tests that own the protocol state they check.
    Manual,
}

/// How a [`ClientCore`](crate::ClientCore) behaves; the CONNECT it sends is part of it.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// The CONNECT sent by every [`ClientCore::connect`](crate::ClientCore::connect): protocol version,
    /// client id, Clean Start, keep alive, will, credentials, properties.
    pub connect: Connect,
    /// QoS 1/2 PUBLISHes awaiting acknowledgement, at most. The broker's
    /// Receive Maximum (MQTT 5 §3.2.2.3.3) lowers it for a connection.
    pub inflight_max: NonZeroU16,
    /// Who acknowledges incoming messages.
    pub acks: Acks,
    /// The largest packet accepted from the broker, fixed header included.
    /// Advertise it yourself in `connect.properties.maximum_packet_size`
    /// (5.0) if the broker should know.
    pub packet_size_max: u32,
    /// Keep each QoS 1/2 PUBLISH made with [`ClientCore::publish`](crate::ClientCore::publish) until its
    /// acknowledgement, and resend it (DUP set) or its PUBREL when a later
    /// connection resumes the session (MQTT 5 §4.4). Costs one allocation
    /// per message; off, unacknowledged messages are abandoned on reconnect.
    pub resend_on_reconnect: bool,
}

impl ClientOptions {
    /// Automatic acknowledgements, a window of 65,535, any packet size, no
    /// resending.
    pub fn new(connect: Connect) -> Self {
        ClientOptions {
            connect,
            inflight_max: NonZeroU16::MAX,
            acks: Acks::Auto,
            packet_size_max: PACKET_SIZE_MAX,
            resend_on_reconnect: false,
        }
    }
}

/// Where a connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// No connection: before the first [`ClientCore::connect`](crate::ClientCore::connect) or after
    /// [`ClientCore::connection_lost`](crate::ClientCore::connection_lost).
    Idle,
    /// CONNECT queued, CONNACK not yet received.
    Connecting,
    /// CONNACK accepted the connection.
    Connected,
    /// Ended: by a DISCONNECT either way, a refusing CONNACK, or a protocol
    /// error. Input is ignored; close the transport.
    Closed,
}
