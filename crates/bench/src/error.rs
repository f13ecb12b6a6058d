//! The bench's error types: one for arguments, one for a client's life.

use std::io;

use starling_codec::{PacketType, ReasonCode};

/// An argument that cannot make a bounded, meaningful run. Checked once,
/// before any socket is opened.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ArgError {
    /// `--clients` is 0 or above the cap.
    #[error("--clients must be between 1 and {max}, got {clients}")]
    ClientsOutOfRange {
        /// Given.
        clients: u32,
        /// The cap.
        max: u32,
    },
    /// More sockets than this process may open.
    #[error(
        "{needed} connections need more descriptors than the open-file limit of {limit} allows \
         (the tool keeps {reserve} for itself)"
    )]
    FileLimit {
        /// Connections asked for.
        needed: u64,
        /// RLIMIT_NOFILE soft limit.
        limit: u64,
        /// Descriptors kept for the runtime, stdio and /proc reads.
        reserve: u64,
    },
    /// The payload cannot hold the stamp, or exceeds the cap.
    #[error("--payload-size must be between {min} and {max} bytes, got {size}")]
    PayloadSizeOutOfRange {
        /// Given.
        size: usize,
        /// The stamp's size.
        min: usize,
        /// The cap.
        max: usize,
    },
    /// A rate of zero would never send.
    #[error("--{name} must be above 0")]
    ZeroRate {
        /// The flag.
        name: &'static str,
    },
    /// Zero or above the cap.
    #[error("--duration-secs must be between 0 (exclusive) and {max}, got {secs}")]
    DurationOutOfRange {
        /// Given.
        secs: f64,
        /// The cap.
        max: f64,
    },
    /// `--count` of zero would send nothing.
    #[error("--count must be at least the number of publishers ({publishers}), got {count}")]
    CountTooSmall {
        /// Given.
        count: u64,
        /// Each publisher sends at least one message.
        publishers: u32,
    },
    /// The in-flight window does not fit packet identifiers.
    #[error("--inflight must be between 1 and {max}, got {inflight}")]
    InflightOutOfRange {
        /// Given.
        inflight: u32,
        /// The cap.
        max: u32,
    },
    /// Topics with wildcards cannot be published to.
    #[error("publish topic {topic:?} must not contain '+' or '#'")]
    WildcardInPublishTopic {
        /// The topic.
        topic: String,
    },
    /// --sub-host/--sub-port given to a scenario without subscribers.
    #[error("--sub-host/--sub-port need subscribers, and {scenario} has none")]
    NoSubscribers {
        /// The scenario.
        scenario: &'static str,
    },
    /// More --sub-port ports than subscribers: some would get nobody.
    #[error("--sub-port lists {ports} ports for {subscribers} subscriber(s)")]
    SubPortsUnused {
        /// Ports given.
        ports: usize,
        /// Subscribers of the run.
        subscribers: u32,
    },
    /// Host is not an address and does not resolve.
    #[error("cannot resolve {host}:{port}")]
    Unresolvable {
        /// Host.
        host: String,
        /// Port.
        port: u16,
    },
}

/// What ended one client's connection early. The summary counts these by
/// [`ClientError::kind`].
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A socket operation failed.
    #[error("{op}: {source}")]
    Io {
        /// What was being done: "connect", "bind", "read", "write".
        op: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// The broker closed the connection.
    #[error("connection closed by the broker during {during}")]
    Closed {
        /// The phase.
        during: &'static str,
    },
    /// No answer in time.
    #[error("timed out waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: &'static str,
    },
    /// The broker sent bytes our codec refuses.
    #[error("undecodable packet from the broker: {0}")]
    Decode(starling_codec::Error),
    /// Our own packet did not encode (a bug or an over-small Maximum Packet Size).
    #[error("cannot encode {packet_type:?}: {source}")]
    Encode {
        /// The packet.
        packet_type: PacketType,
        /// The codec error.
        source: starling_codec::Error,
    },
    /// CONNACK with a failure reason.
    #[error("connection refused: {reason:?}")]
    Refused {
        /// The reason code.
        reason: ReasonCode,
    },
    /// SUBACK with a failure reason.
    #[error("subscription to {filter:?} refused: {reason:?}")]
    SubscribeRefused {
        /// The filter.
        filter: String,
        /// The reason code.
        reason: ReasonCode,
    },
    /// A packet that has no place at this point of the exchange.
    #[error("unexpected {packet_type:?} during {during}")]
    Unexpected {
        /// The packet.
        packet_type: PacketType,
        /// The phase.
        during: &'static str,
    },
    /// The broker sent DISCONNECT.
    #[error("disconnected by the broker: {reason:?}")]
    Disconnected {
        /// Its reason (Success in 3.x).
        reason: ReasonCode,
    },
    /// The client core refused what the broker did or what we asked
    /// (keep-alive timeout, a full window): see [`starling_client::Error`].
    #[error("protocol: {0}")]
    Protocol(starling_client::Error),
}

impl From<starling_client::Error> for ClientError {
    /// Keeps the kinds the report counted before the core existed.
    fn from(e: starling_client::Error) -> Self {
        use starling_client::Error as E;
        match e {
            E::Decode(e) => ClientError::Decode(e),
            E::Encode {
                packet_type,
                source,
            } => ClientError::Encode {
                packet_type,
                source,
            },
            E::Unexpected { packet_type, state } => ClientError::Unexpected {
                packet_type,
                during: state,
            },
            E::UnknownPacketId { packet_type, .. } => ClientError::Unexpected {
                packet_type,
                during: "run (packet id not in flight)",
            },
            E::KeepAliveTimeout { .. } => ClientError::Timeout { what: "PINGRESP" },
            other => ClientError::Protocol(other),
        }
    }
}

impl ClientError {
    /// A short stable name for counting errors by kind in the report.
    pub fn kind(&self) -> &'static str {
        match self {
            ClientError::Io { op: "connect", .. } => "connect",
            ClientError::Io { op: "bind", .. } => "bind",
            ClientError::Io { source, .. } if source.kind() == io::ErrorKind::ConnectionReset => {
                "reset"
            }
            ClientError::Io { .. } => "io",
            ClientError::Closed { .. } => "closed",
            ClientError::Timeout { .. } => "timeout",
            ClientError::Decode(_) => "decode",
            ClientError::Encode { .. } => "encode",
            ClientError::Refused { .. } => "refused",
            ClientError::SubscribeRefused { .. } => "subscribe_refused",
            ClientError::Unexpected { .. } => "unexpected_packet",
            ClientError::Disconnected { .. } => "disconnected",
            ClientError::Protocol(_) => "protocol",
        }
    }
}
