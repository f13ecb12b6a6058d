//! The raft framework: a driver around raft-rs `RawNode` with a durable segmented log, a transport seam and membership changes.

pub mod disk;
mod error;
pub mod wal;

pub use disk::{Crash, Disk, FsDisk, MemDisk};
pub use error::{ConfigError, Error, RequestError, Result};
pub use wal::{DiskLog, FsyncPolicy, LogOptions, LogStore, Recovery};

/// raft-rs's wire types, re-exported so that transports need no direct dependency.
pub use raft::eraftpb;
