//! Lifecycle events, for observers.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use starling_codec::{PacketId, Protocol, QoS, ReasonCode};

use crate::about::{type_about, About};

/// Who an event is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    /// The node's name (`node.name`).
    pub node: Arc<str>,
    /// The client identifier; empty in [`What::ClientConnect`] and a refused
    /// [`What::ClientConnack`] when the broker was to assign one.
    pub client_id: Arc<str>,
    /// The username: as sent before authentication, as authenticated after.
    pub username: Option<Arc<str>>,
}

/// One lifecycle event: a small owned value (its strings are shared `Arc`s and its payload
/// a `Bytes`, so making one copies nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Who.
    pub who: Subject,
    /// What happened.
    pub what: What,
}

impl Event {
    /// Its kind.
    pub fn kind(&self) -> EventKind {
        self.what.kind()
    }
}

/// What happened, with what is relevant to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum What {
    /// A CONNECT was received (before authentication).
    ClientConnect {
        /// The client's address.
        peer: SocketAddr,
        /// Its protocol version.
        protocol: Protocol,
    },
    /// The CONNACK was sent, with this code (`Success`, or the refusal).
    ClientConnack {
        /// The client's address.
        peer: SocketAddr,
        /// The CONNACK's reason code (MQTT 5 terms; 3.x clients got the matching return
        /// code).
        code: ReasonCode,
    },
    /// The connection is attached to its session.
    ClientConnected {
        /// The client's address.
        peer: SocketAddr,
        /// Its protocol version.
        protocol: Protocol,
        /// The keep alive in force, seconds.
        keep_alive: u16,
        /// Its Clean Start (Clean Session in 3.x) flag.
        clean_start: bool,
    },
    /// The connection ended.
    ClientDisconnected {
        /// Why.
        reason: DisconnectReason,
    },
    /// A new session began with this connection.
    SessionCreated,
    /// This connection resumed an existing session.
    SessionResumed,
    /// A subscription was granted.
    SessionSubscribed {
        /// The filter as subscribed (`$share/...` included).
        filter: Arc<str>,
        /// The QoS granted.
        qos: QoS,
    },
    /// A subscription was removed.
    SessionUnsubscribed {
        /// The filter as subscribed.
        filter: Arc<str>,
    },
    /// The session ended (expiry, clean start, session expiry 0).
    SessionTerminated,
    /// A PUBLISH from the client was accepted for routing.
    MessagePublish {
        /// Its topic (an alias resolved).
        topic: Arc<str>,
        /// Its QoS.
        qos: QoS,
        /// Its RETAIN flag.
        retain: bool,
        /// Its payload (shared, not copied).
        payload: Bytes,
    },
    /// A message was written to the subscriber `who`.
    MessageDelivered {
        /// Its topic.
        topic: Arc<str>,
        /// The QoS it was sent with.
        qos: QoS,
        /// Its packet identifier (QoS 1 and 2).
        packet_id: Option<PacketId>,
    },
    /// The subscriber `who` acknowledged a delivery (PUBACK for QoS 1, PUBCOMP for QoS 2).
    MessageAcked {
        /// Its topic.
        topic: Arc<str>,
        /// The QoS it was sent with.
        qos: QoS,
        /// Its packet identifier.
        packet_id: PacketId,
    },
    /// A message meant for the client `who` was dropped.
    MessageDropped {
        /// Its topic, where the broker still had it.
        topic: Option<Arc<str>>,
        /// The QoS it would have been delivered with.
        qos: QoS,
        /// Why.
        reason: DropReason,
    },
}

impl What {
    /// Its kind.
    pub fn kind(&self) -> EventKind {
        match self {
            What::ClientConnect { .. } => EventKind::ClientConnect,
            What::ClientConnack { .. } => EventKind::ClientConnack,
            What::ClientConnected { .. } => EventKind::ClientConnected,
            What::ClientDisconnected { .. } => EventKind::ClientDisconnected,
            What::SessionCreated => EventKind::SessionCreated,
            What::SessionResumed => EventKind::SessionResumed,
            What::SessionSubscribed { .. } => EventKind::SessionSubscribed,
            What::SessionUnsubscribed { .. } => EventKind::SessionUnsubscribed,
            What::SessionTerminated => EventKind::SessionTerminated,
            What::MessagePublish { .. } => EventKind::MessagePublish,
            What::MessageDelivered { .. } => EventKind::MessageDelivered,
            What::MessageAcked { .. } => EventKind::MessageAcked,
            What::MessageDropped { .. } => EventKind::MessageDropped,
        }
    }
}

/// The kinds of [`What`], for [`EventMask`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
#[allow(missing_docs)]
pub enum EventKind {
    ClientConnect,
    ClientConnack,
    ClientConnected,
    ClientDisconnected,
    SessionCreated,
    SessionResumed,
    SessionSubscribed,
    SessionUnsubscribed,
    SessionTerminated,
    MessagePublish,
    MessageDelivered,
    MessageAcked,
    MessageDropped,
}

/// A set of [`EventKind`]s: what a provider wants to see. The broker makes an event only if
/// some provider wants its kind, so a chain without event providers costs a bit test per
/// event point and nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EventMask(u16);

impl EventMask {
    /// No kind.
    pub const NONE: EventMask = EventMask(0);
    /// Every kind.
    pub const ALL: EventMask = EventMask((1 << 13) - 1);

    /// This set with `kind` added.
    pub const fn with(self, kind: EventKind) -> Self {
        EventMask(self.0 | 1 << kind as u8)
    }

    /// Whether `kind` is in the set.
    pub const fn has(self, kind: EventKind) -> bool {
        self.0 & (1 << kind as u8) != 0
    }

    /// Both sets.
    pub const fn union(self, other: EventMask) -> Self {
        EventMask(self.0 | other.0)
    }
}

/// Why a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DisconnectReason {
    /// The client sent DISCONNECT with this reason code (0x00 normal, 0x04 with will, ...;
    /// 3.x: 0x00).
    Client(ReasonCode),
    /// The connection broke, or the client closed it without DISCONNECT.
    ConnectionLost,
    /// The broker closed it: 0x8D keep alive timeout, 0x8E session taken over, 0x8B
    /// shutting down, 0x97 quota exceeded (a stalled subscriber), or the protocol error
    /// the client made (0x81, 0x82, ...). Also for 3.x clients, who were sent no
    /// DISCONNECT.
    Server(ReasonCode),
}

/// Why a message was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DropReason {
    /// The client's queue was full and its policy dropped this one.
    QueueFull,
    /// Its message expiry interval passed before it could be sent.
    Expired,
    /// Larger than the client's Maximum Packet Size.
    TooLarge,
    /// QoS 0 for a disconnected session.
    Offline,
    /// The session had ended.
    SessionEnded,
    /// An inbound PUBLISH marked UTF-8 whose payload is not.
    PayloadFormatInvalid,
    /// Refused by authorization: an inbound PUBLISH, or a delivery the client may not read.
    NotAuthorized,
    /// Another reason (a message the broker could not encode).
    Other,
}

/// Observes events, fire and forget. Called on the actor where the event happens (a
/// client's, a CONNECT handshake's task), in the order the events happen for that client:
/// `on_event` must return at once (copy what it needs and hand it to an actor or a
/// channel with a non-blocking send; drop, and count, when that is full).
pub trait EventProvider: Send + Sync + 'static {
    /// The kinds it wants; only these are made and passed to it.
    fn wants(&self) -> EventMask {
        EventMask::ALL
    }

    /// One event.
    fn on_event(&self, event: &Event);

    /// How it presents itself to an operator (`GET /api/v1/plugins`); by default, its
    /// type's name.
    fn about(&self) -> About {
        type_about::<Self>()
    }
}
