//! What the core tells its caller.

use starling_codec::{
    Auth, Connack, Disconnect, Packet, PacketId, Publish, ReasonCode, Suback, Unsuback,
};

/// Something that happened on the connection, from [`ClientCore::poll_event`](crate::ClientCore::poll_event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The CONNACK. A failing reason code means the broker refused and the
    /// connection is closed; `session_present` says whether the session resumed.
    Connected(Connack),
    /// A message from the broker, already acknowledged with
    /// [`Acks::Auto`](crate::Acks::Auto). The payload shares the read buffer.
    Message(Publish),
    /// A QoS 1/2 PUBLISH of ours ended: PUBACK, PUBCOMP, or a failing PUBREC.
    Published {
        /// Its identifier, as `publish` returned it.
        packet_id: PacketId,
        /// The final acknowledgement's reason (`Success` in 3.x).
        reason_code: ReasonCode,
    },
    /// A QoS 1/2 PUBLISH of ours that will never be acknowledged: the
    /// broker kept no session, or it could not be resent (not kept, or
    /// `resend_on_reconnect` off).
    Abandoned(PacketId),
    /// The SUBACK of a SUBSCRIBE.
    Subscribed(Suback),
    /// The UNSUBACK of an UNSUBSCRIBE.
    Unsubscribed(Unsuback),
    /// A PINGRESP.
    Pong,
    /// The broker's DISCONNECT; the connection is closed.
    Disconnected(Disconnect),
    /// AUTH (5.0 enhanced authentication, MQTT 5 §4.12): the caller answers.
    Auth(Auth),
    /// With [`Acks::Manual`](crate::Acks::Manual): a PUBREL from the broker,
    /// or a PUBACK, PUBREC or PUBCOMP for an exchange the core does not own.
    Ack(Packet),
}

impl Event {
    /// The packet this event came from, for callers that want packets;
    /// `None` for `Published` and `Abandoned`, which end exchanges rather
    /// than mirror one packet.
    pub fn into_packet(self) -> Option<Packet> {
        Some(match self {
            Event::Connected(c) => Packet::Connack(c),
            Event::Message(p) => Packet::Publish(p),
            Event::Subscribed(s) => Packet::Suback(s),
            Event::Unsubscribed(u) => Packet::Unsuback(u),
            Event::Pong => Packet::Pingresp,
            Event::Disconnected(d) => Packet::Disconnect(d),
            Event::Auth(a) => Packet::Auth(a),
            Event::Ack(p) => p,
            Event::Published { .. } | Event::Abandoned(_) => return None,
        })
    }
}
