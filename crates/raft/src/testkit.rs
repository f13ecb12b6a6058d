//! Test fixtures (feature `testkit`): an in-process network of drivers standing in for the
//! QUIC transport, for tests and examples in one process. Not part of a production build.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use raft::eraftpb::Message;

use crate::driver::RaftHandle;
use crate::transport::Transport;

/// An in-process network of drivers, by raft id: for tests and examples in one process.
///
/// A registry behind a lock is acceptable here because it is a test fixture standing in for
/// the network, not state shared between production actors.
#[derive(Clone, Default)]
pub struct LocalNet {
    peers: Arc<Mutex<BTreeMap<u64, RaftHandle>>>,
}

impl LocalNet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers (or replaces, after a restart) the driver of node `id`.
    pub fn register(&self, id: u64, handle: RaftHandle) {
        self.peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, handle);
    }

    /// Removes node `id`: messages to it are dropped (a crashed or partitioned node).
    pub fn unregister(&self, id: u64) {
        self.peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }

    /// A transport that sends from this network.
    pub fn transport(&self) -> LocalTransport {
        LocalTransport { net: self.clone() }
    }
}

/// The sending half of a [`LocalNet`].
pub struct LocalTransport {
    net: LocalNet,
}

impl Transport for LocalTransport {
    fn send(&mut self, msg: Message) {
        let to = self
            .net
            .peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&msg.to)
            .cloned();
        if let Some(h) = to {
            h.deliver(msg);
        }
    }
}
