//! The raft framework: a driver around raft-rs `RawNode` with a durable segmented log, a transport seam and membership changes.

pub mod certs;
mod config;
pub mod disk;
pub mod driver;
mod error;
pub mod node;
pub mod quic;
mod sm;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod transport;
pub mod wal;

pub use config::{Config, ValidConfig};
pub use disk::{Crash, Disk, FsDisk, MemDisk, SyncWait};
pub use driver::{start, Client, Consistency, Metrics, RaftHandle};
pub use error::{ConfigError, Error, RequestError, Result};
pub use node::{Effect, Membership, Node, PeerProgress, ProposeError, Role, Status};
pub use quic::{
    node_name, DataLinks, DataSendError, NodeTls, PeerControl, QuicMetrics, QuicNet, QuicOptions,
    QuicTransport,
};
pub use sm::{RequestId, StateMachine};
#[cfg(feature = "testkit")]
pub use testkit::{LocalNet, LocalTransport};
pub use transport::Transport;
pub use wal::{DiskLog, FsyncPolicy, LogOptions, LogStore, Recovery, SyncJob};

/// raft-rs's wire types, re-exported so that transports need no direct dependency.
pub use raft::eraftpb;
/// raft-rs's storage read trait, implemented by every [`LogStore`].
pub use raft::{GetEntriesContext, Storage};
