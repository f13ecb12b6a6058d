//! The crate's one error enum, plus the small ones returned to API callers.

use std::io;

/// Errors of the raft framework: storage, configuration and driving raft-rs.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file operation failed.
    #[error("{op} {file}: {source}")]
    Io {
        op: &'static str,
        file: String,
        #[source]
        source: io::Error,
    },
    /// A record before the end of the log failed its checksum or framing: the disk lost data
    /// that had been synced. Recovery refuses to guess.
    #[error("corrupted log record in {file} at offset {offset}: {reason}")]
    Corrupt {
        file: String,
        offset: u64,
        reason: &'static str,
    },
    /// Two log records that must be adjacent are not (an entry index jumped forward).
    #[error("log gap in {file}: entry {index} follows {last}")]
    Gap { file: String, index: u64, last: u64 },
    /// The persisted commit index points past the last persisted entry (only possible when
    /// syncing was disabled and the machine crashed).
    #[error("hard state commit {commit} is beyond the last log index {last}")]
    CommitBeyondLog { commit: u64, last: u64 },
    /// A snapshot older than the one already held was offered.
    #[error("snapshot at index {offered} is older than the current one at {current}")]
    SnapshotOutOfDate { offered: u64, current: u64 },
    /// Entries handed to `append` do not continue the log.
    #[error("append of entry {index} does not follow the log (first {first}, last {last})")]
    AppendOutOfRange { index: u64, first: u64, last: u64 },
    /// The storage thread ended a log sync without an outcome (it panicked, or none could
    /// be started): whether the log is durable is unknown.
    #[error("the log sync was lost (storage thread panicked or missing)")]
    SyncLost,
    /// A protobuf record could not be decoded.
    #[error("decoding {what}: {source}")]
    Decode {
        what: &'static str,
        #[source]
        source: protobuf::ProtobufError,
    },
    /// A command or snapshot of ours could not be decoded.
    #[error("malformed {what}")]
    Malformed { what: &'static str },
    /// The state machine refused a snapshot.
    #[error("state machine restore failed: {0}")]
    Restore(String),
    /// raft-rs refused an operation.
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The transport seam failed: TLS material, binding, certificate generation.
    #[error("transport: {0}")]
    Net(#[from] starling_net::NetError),
}

/// Why a configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("node id must not be 0 (raft reserves it)")]
    ZeroId,
    #[error("heartbeat_tick ({heartbeat}) must be smaller than election_tick ({election})")]
    HeartbeatNotBelowElection { heartbeat: usize, election: usize },
    #[error("{field} must be greater than zero")]
    Zero { field: &'static str },
    #[error("initial membership includes node 0")]
    ZeroVoter,
}

/// Why a proposal, read or membership change did not complete.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// No outcome by the deadline. The request may still take effect: retry with the same
    /// request id to be sure it is applied exactly once.
    #[error("request timed out; its outcome is unknown")]
    Timeout,
    /// The raft driver has stopped.
    #[error("the raft node has stopped")]
    Stopped,
    /// Too many requests are waiting; back off.
    #[error("too many pending requests ({max})")]
    Overloaded { max: usize },
    /// The request id was already applied with a newer sequence number; its result is gone.
    #[error("request {client_id}/{seq} was superseded by a newer request of the same client")]
    Superseded { client_id: u64, seq: u64 },
    /// raft refused the change (e.g. a configuration change is already pending).
    #[error("refused: {0}")]
    Refused(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn io_err<'a>(op: &'static str, file: &'a str) -> impl FnOnce(io::Error) -> Error + 'a {
    move |source| Error::Io {
        op,
        file: file.to_string(),
        source,
    }
}
