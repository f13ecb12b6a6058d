//! The one error type of the crate, and the names it uses for places, tables and keys.

use std::fmt;
use std::path::PathBuf;

/// Where a store lives, as errors name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// A file.
    File(PathBuf),
    /// A custom redb storage backend (a test disk, ...).
    Backend,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::File(path) => write!(f, "file {}", path.display()),
            Place::Backend => f.write_str("a custom storage backend"),
        }
    }
}

/// The key of a record, as errors name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordKey {
    /// A row of the meta table.
    Meta(String),
    /// A session's meta record.
    Session(String),
    /// A delivery of a session.
    Delivery { client_id: String, seq: u64 },
    /// An inbound QoS 2 packet identifier of a session.
    Inbound { client_id: String, packet_id: u16 },
    /// A retained message.
    Retained(String),
    /// A delayed message.
    Delayed { due_ms: u64, id: u64 },
    /// A batch parked for another node.
    Outbox { node: u64, inc: u64, seq: u64 },
}

impl fmt::Display for RecordKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordKey::Meta(name) => write!(f, "{name:?}"),
            RecordKey::Session(id) => write!(f, "{id:?}"),
            RecordKey::Delivery { client_id, seq } => write!(f, "({client_id:?}, seq {seq})"),
            RecordKey::Inbound {
                client_id,
                packet_id,
            } => write!(f, "({client_id:?}, packet id {packet_id})"),
            RecordKey::Retained(topic) => write!(f, "{topic:?}"),
            RecordKey::Delayed { due_ms, id } => write!(f, "(due {due_ms} ms, id {id})"),
            RecordKey::Outbox { node, inc, seq } => {
                write!(f, "(node {node}, incarnation {inc}, batch {seq})")
            }
        }
    }
}

/// Why a stored record does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeProblem {
    /// The value has no bytes, not even its version byte.
    #[error("the value is empty")]
    Empty,
    /// The value's first byte names a layout this build does not read.
    #[error("value layout version {found}; this build reads {supported}")]
    UnknownValueVersion { found: u8, supported: u8 },
    /// The bytes after the version byte are not a value of the table's type.
    #[error("malformed value: {0}")]
    Malformed(postcard::Error),
    /// The value is shorter than its fixed header.
    #[error("the value is truncated")]
    Truncated,
    /// A value decoded with bytes left over.
    #[error("{0} bytes after the value")]
    TrailingBytes(usize),
    /// Packet identifier 0, which MQTT never uses (MQTT 5 §2.2.1).
    #[error("packet identifier 0")]
    ZeroPacketId,
}

/// What can go wrong opening, reading or writing a store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// redb could not open the database: missing or unreadable file, not a redb file,
    /// corrupted pages, ...
    #[error("cannot open the store in {at}: {source}")]
    Open {
        at: Place,
        #[source]
        source: redb::DatabaseError,
    },
    /// redb failed in a transaction (I/O, corruption found while reading, ...). After an
    /// I/O failure redb refuses further writes: reopen the store.
    #[error("store in {at}: {source}")]
    Redb {
        at: Place,
        #[source]
        source: redb::Error,
    },
    /// The store was written in a layout this build does not read.
    #[error("store in {at} has format version {found}; this build reads version {supported}")]
    UnknownFormat {
        at: Place,
        found: u64,
        supported: u64,
    },
    /// A redb database with tables but no store format version: not a store.
    #[error("{at} is a redb database but not a store: no format version (tables: {tables:?})")]
    NotAStore { at: Place, tables: Vec<String> },
    /// A record does not decode.
    #[error("store in {at}: table {table}, key {key}: {problem}")]
    Decode {
        at: Place,
        table: &'static str,
        key: RecordKey,
        problem: DecodeProblem,
    },
    /// A delivery or inbound packet identifier of a client with no stored session.
    #[error("store in {at}: table {table}, key {key}: no stored session owns it")]
    Orphan {
        at: Place,
        table: &'static str,
        key: RecordKey,
    },
}

impl StoreError {
    pub(crate) fn redb(at: &Place, source: impl Into<redb::Error>) -> StoreError {
        StoreError::Redb {
            at: at.clone(),
            source: source.into(),
        }
    }
}

/// Names the place in a redb error: `txn.open_table(T).at(at)?`.
pub(crate) trait At<T> {
    fn at(self, at: &Place) -> Result<T, StoreError>;
}

impl<T, E: Into<redb::Error>> At<T> for Result<T, E> {
    fn at(self, at: &Place) -> Result<T, StoreError> {
        self.map_err(|e| StoreError::redb(at, e))
    }
}
