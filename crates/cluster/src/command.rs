//! What the cluster's raft log carries: commands, their outputs, queries and answers, and
//! their byte encoding (postcard, behind a version byte so that a later layout can be told
//! apart from this one).

use serde::{Deserialize, Serialize};

/// A node's raft id (never 0).
pub type NodeId = u64;

/// How the rest of the cluster reaches a member.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Its MQTT TCP listener, as clients reach it (`host:port`).
    pub mqtt: String,
    /// Its cluster (QUIC) address.
    pub cluster: String,
    /// Its HTTP API, when it serves one.
    pub http: Option<String>,
}

/// Who holds a client id's session, and since which claim.
///
/// The epoch is the fencing token: every claim gets a larger one than any claim before it,
/// cluster-wide, so a node that still believes it owns a client id can be told it no longer
/// does by comparing epochs, whatever it missed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Owner {
    pub node: NodeId,
    pub epoch: u64,
}

/// A retained message as the cluster keeps it: independent of the broker's types, so that
/// the state machine needs no MQTT codec.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetainedMsg {
    pub payload: Vec<u8>,
    /// 0, 1 or 2.
    pub qos: u8,
    /// MQTT 5 publish properties as the broker encoded them (opaque here).
    pub properties: Vec<u8>,
    /// Wall-clock expiry in Unix seconds (message expiry interval). Readers compare it with
    /// their own clock; the state machine keeps no clock, so it never expires anything.
    pub expires_at: Option<u64>,
}

/// One change to the cluster state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Adds a member or updates its addresses.
    Join { node: NodeId, member: Member },
    /// Removes a member with its routes and the client ids it owned.
    Leave { node: NodeId },
    /// `node` takes `client_id` (a CONNECT there). The newest claim wins, as in MQTT's
    /// session take-over.
    Claim { client_id: String, node: NodeId },
    /// The session of `client_id` ended where `owner` held it. Only the current owner with
    /// the current epoch releases: a late release from a fenced node changes nothing.
    Release { client_id: String, owner: Owner },
    /// Filters that `node` now has subscribers for (`add`) or no longer has (`remove`).
    Routes {
        node: NodeId,
        add: Vec<String>,
        remove: Vec<String>,
    },
    /// Everything `node` has subscribers for, replacing what was recorded (a node that
    /// restarted, or whose view drifted, states its whole set once).
    ResetRoutes { node: NodeId, filters: Vec<String> },
    /// Sets (`Some`) or deletes (`None`) the retained message of a topic.
    Retain {
        topic: String,
        message: Option<RetainedMsg>,
    },
    /// Several commands in one log entry, applied in order (one commit, one fsync).
    Batch(Vec<Command>),
    /// `client_id` on `node` subscribes `$exclusive/{filter}` (`limit` `None`) or
    /// `$limit/{limit}/{filter}`: granted when no other client holds the exclusive one, or
    /// fewer than `limit` clients hold the limited one (a client that holds it already is
    /// granted again, from whatever node: its session moved). Answered `Held`.
    Hold {
        filter: String,
        client_id: String,
        node: NodeId,
        limit: Option<u32>,
    },
    /// `client_id` on `node` no longer holds the exclusive (`exclusive`) or limited
    /// subscription to `filter`; a release from a node the client has left changes nothing.
    Unhold {
        filter: String,
        client_id: String,
        node: NodeId,
        exclusive: bool,
    },
    /// `node` restarted: the holds of its clients from before are gone (those whose
    /// sessions it restored hold again as they subscribe).
    DropHolds { node: NodeId },
    /// `node` installed the session of `client_id` that its claim `epoch` took over, and
    /// the routes of its subscriptions hold `node` (they were committed before this). It
    /// changes no state: its log index is the cut of that move. A publish routed under the
    /// routes of an earlier index reaches the session through the node it left, one routed
    /// under this index or a later one reaches it directly (see the broker's
    /// `routing::moving`). Applied even when a newer claim came first: the node the
    /// session left still needs the cut.
    Moved {
        client_id: String,
        node: NodeId,
        epoch: u64,
    },
}

/// What applying a command gave.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Output {
    Done,
    /// The claim's new owner, and the owner it replaced.
    Claimed {
        owner: Owner,
        previous: Option<Owner>,
    },
    /// Whether the release matched the current owner.
    Released(bool),
    /// The retained message's version (a cluster-wide counter, for tests and tracing).
    Retained {
        version: u64,
    },
    Batch(Vec<Output>),
    /// Whether a [`Command::Hold`] was granted.
    Held(bool),
    /// Not applied, and why (an unknown node, an undecodable entry).
    Refused(String),
}

/// A read of the cluster state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Query {
    Owner(String),
    /// The owners of several client ids at once, in order.
    Owners(Vec<String>),
    Members,
    Routes,
    /// Retained messages whose topic matches `filter`, at most `limit` of them.
    Retained {
        filter: String,
        limit: u32,
    },
    Summary,
}

/// The answer to a [`Query`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Answer {
    Owner(Option<Owner>),
    Owners(Vec<Option<Owner>>),
    Members(Vec<(NodeId, Member)>),
    Routes(Vec<(String, Vec<NodeId>)>),
    Retained(Vec<(String, RetainedMsg)>),
    Summary(Summary),
    Refused(String),
}

/// Sizes of the replicated state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub members: u64,
    pub owners: u64,
    pub routes: u64,
    pub retained: u64,
    /// The last log index applied.
    pub applied: u64,
}

const FORMAT_V1: u8 = 1;

/// Why bytes did not decode.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("empty")]
    Empty,
    #[error("unknown format version {0}")]
    Version(u8),
    #[error("{0}")]
    Body(String),
}

/// `[version][postcard]`.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let mut out = vec![FORMAT_V1];
    // postcard only fails on a writer error or an unsupported type; a Vec and these types
    // have neither.
    out.extend(postcard::to_stdvec(value).expect("cluster types serialize"));
    out
}

/// The inverse of [`encode`].
///
/// # Errors
/// [`DecodeError`] for empty input, another version, or a body that is not a `T`.
pub fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, DecodeError> {
    match bytes.split_first() {
        None => Err(DecodeError::Empty),
        Some((&FORMAT_V1, body)) => {
            postcard::from_bytes(body).map_err(|e| DecodeError::Body(e.to_string()))
        }
        Some((&v, _)) => Err(DecodeError::Version(v)),
    }
}
