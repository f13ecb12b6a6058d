//! The transport seam: how raft messages reach peers. The QUIC transport (`starling-net`)
//! implements [`Transport`]; [`LocalNet`] connects drivers in one process for tests.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use protobuf::Message as _;
use raft::eraftpb::Message;

use crate::error::{Error, Result};

use crate::driver::RaftHandle;

/// Carries raft messages to peers.
///
/// `send` is called from the driver's turn, so it must not block: queue the message and
/// return. Dropping a message is allowed (raft retransmits); an implementation should count
/// drops. Incoming messages are handed to the local driver with [`RaftHandle::deliver`].
pub trait Transport: Send + 'static {
    fn send(&mut self, msg: Message);
}

/// Encodes a raft message for the wire (protobuf, as raft-rs defines it).
pub fn encode_message(msg: &Message) -> Vec<u8> {
    // Encoding an in-memory eraftpb message cannot fail (no required fields).
    msg.write_to_bytes()
        .expect("eraftpb messages always encode")
}

/// Decodes a raft message of at most `size_max` bytes. Feed it only bytes from authenticated
/// peers: raft-rs's protobuf 2.28 decoder has a known advisory (CVE-2025-53605).
pub fn decode_message(bytes: &[u8], size_max: usize) -> Result<Message> {
    if bytes.len() > size_max {
        return Err(Error::Malformed {
            what: "raft message over the size limit",
        });
    }
    Message::parse_from_bytes(bytes).map_err(|source| Error::Decode {
        what: "raft message",
        source,
    })
}

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
