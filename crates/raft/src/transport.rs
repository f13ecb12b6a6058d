//! The transport seam: how raft messages reach peers. The QUIC transport (`starling-net`)
//! implements [`Transport`]; the `testkit` feature's `LocalNet` connects drivers in one
//! process for tests.

use protobuf::Message as _;
use raft::eraftpb::Message;

use crate::error::{Error, Result};

/// Carries raft messages to peers.
///
/// `send` is called from the driver's turn, so it must not block: queue the message and
/// return. Dropping a message is allowed (raft retransmits); an implementation should count
/// drops. Incoming messages are handed to the local driver with `RaftHandle::deliver`.
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
