//! Messages to and from the cluster actor (the `cluster` module), and the cluster's view of
//! itself as the broker's API shows it.

use std::sync::Arc;

use starling_rt::{Reply, WeakAddr};

use super::*;

// --- to the cluster actor -------------------------------------------------------------

/// A shared group (its name and topic filter) whose member for one publish is a node: that
/// node hands the message to one member of its own in that group, and to nothing else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SharedTo {
    pub group: Arc<str>,
    pub filter: Arc<str>,
}

/// A committed claim of a client id by this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Claim {
    pub epoch: u64,
    /// The node that held the id before (itself, another, or none).
    pub previous: Option<u64>,
}

/// A session moving between nodes: its state and the username it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct HandOff {
    pub state: starling_session::SessionState,
    pub owner: Option<String>,
    /// The node that handed it over: set where it arrives, not sent (the link says it).
    #[serde(skip)]
    pub from: u64,
}

/// Why a claim of a client id was not granted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ClaimError {
    /// No quorum answered in time (this node may be cut off from the majority).
    #[error("the cluster did not commit the claim: {0}")]
    Unavailable(String),
    /// A later claim by another node was committed first (node 0: the id was released).
    #[error("claimed by node {node} meanwhile")]
    Superseded { node: u64 },
}

pub(crate) enum ClusterMsg {
    /// A home shard's local subscriptions to the topic filter `filter` started (`present`)
    /// or all ended; `done` is answered once the replicated routes hold this node for it.
    Route {
        filter: String,
        present: bool,
        done: Option<tokio::sync::oneshot::Sender<()>>,
    },
    /// Another subscription to a filter already counted: answered as `Route`'s `done`.
    RouteWait {
        filter: String,
        done: tokio::sync::oneshot::Sender<()>,
    },
    /// A home shard installed a new `$exclusive/{filter}` (`limit` `None`) or
    /// `$limit/{limit}/{filter}` subscription of `client_id`: count it cluster-wide
    /// (batched), answering `done` with the grant (`None`: not counted, no quorum).
    Hold {
        filter: String,
        client_id: Arc<str>,
        limit: Option<u32>,
        done: tokio::sync::oneshot::Sender<Option<bool>>,
    },
    /// The home shard removed such a subscription: count it off.
    Unhold {
        filter: String,
        client_id: Arc<str>,
        exclusive: bool,
    },
    /// A CONNECT here for a client id this node does not own: claim it (batched with the
    /// other claims waiting), answering with the claim's epoch.
    Claim {
        client_id: Arc<str>,
        reply: Reply<Result<Claim, ClaimError>>,
    },
    /// A CONNECT here for a client id this node claimed with `epoch`: answered, with no
    /// raft commit, once a linearizable read (batched with the others waiting) shows the
    /// claim still stands. A node cut off, or behind on another node's newer claim, must
    /// not serve it from its own memory of the claim.
    Confirm {
        client_id: Arc<str>,
        epoch: u64,
        reply: Reply<Result<(), ClaimError>>,
    },
    /// A node's session of `client_id` for `to`'s claim `epoch`: sent on the data stream.
    SendSession {
        to: u64,
        client_id: Arc<str>,
        epoch: u64,
        handoff: Option<Box<HandOff>>,
    },
    /// The frames of a session `SendSession` gave, encoded off the actor's turn for `to`'s
    /// claim `epoch` of `client_id` (`Err`: the encoding was lost).
    SessionEncoded {
        to: u64,
        client_id: Arc<str>,
        epoch: u64,
        frames: Result<Vec<Vec<u8>>, starling_rt::blocking::JobLost>,
    },
    /// This node's claim `epoch` of `client_id` still waits for the session from node
    /// `from`: ask that node for it again.
    WantSession {
        from: u64,
        client_id: Arc<str>,
        epoch: u64,
    },
    /// Node `by` still waits for the session of `client_id` this node handed over for its
    /// claim `epoch`: send it again, if it is still kept (`cluster::actor::Handed`).
    SessionWanted {
        by: u64,
        client_id: Arc<str>,
        epoch: u64,
    },
    /// A part of a session another node hands over arrived (see
    /// [`RegistryMsg::HandoverComing`]).
    SessionComing {
        client_id: Arc<str>,
        epoch: u64,
    },
    /// A session another node handed over arrived (see [`RegistryMsg::HandedOver`]).
    SessionArrived {
        client_id: Arc<str>,
        epoch: u64,
        handoff: Option<Box<HandOff>>,
    },
    /// The data streams to the other nodes.
    Links(starling_raft::DataLinks),
    /// The session of `client_id` handed over for this node's claim `epoch` is installed
    /// and the routes of its filters hold this node: commit the move's cut
    /// (`Command::Moved`).
    Moved {
        client_id: Arc<str>,
        epoch: u64,
    },
    /// The owners of `client_ids` as the log has them now (a linearizable read through
    /// the leader): the registry's check of the sessions it restored at start.
    ReadOwners {
        client_ids: Vec<Arc<str>>,
        reply: Reply<Result<Vec<Option<starling_cluster::Owner>>, String>>,
    },
    /// The session of `client_id` claimed with `epoch` ended here: release the claim.
    Release {
        client_id: Arc<str>,
        epoch: u64,
    },
    /// The registry, told of claims other nodes make.
    Registry(starling_rt::Addr<RegistryMsg>),
    /// A shard routed the node's stored sessions again and sent their route reports
    /// before this: once every shard said so, the node's routes may be stated.
    Restored,
    /// Batches an earlier run parked were restored: read the members through the leader,
    /// for the shards to give up those of nodes that left (`confirm::check_departed`).
    CheckDeparted,
    /// That read's answer (`None`: it never came).
    MembersRead(Option<Vec<u64>>),
    /// A retained PUBLISH routed here: set (`Some`) or delete the topic's retained message
    /// through the log; `done` (the shard and its key) is told the outcome when a
    /// publisher waits.
    Retain {
        topic: String,
        message: Option<starling_cluster::RetainedMsg>,
        done: Option<(WeakAddr<RouterMsg>, u64)>,
    },
    /// Answered once this node applied everything the leader had committed when the
    /// barrier was asked for (a raft ReadIndex): a SUBSCRIBE's retained messages are read
    /// after it, so that one acknowledged anywhere before is found.
    Barrier(tokio::sync::oneshot::Sender<()>),
    /// The outcome of a barrier's read (false: not confirmed in time).
    BarrierDone(bool),
    /// The read for the reconnects' confirmations in flight answered.
    ConfirmDone(Result<starling_cluster::Answer, String>),
    /// What an entry of the raft log changed, in order (from the replica, on the raft
    /// driver's turn). `replayed`: the entry was committed before this node started (a
    /// restart applies the log again from its start or its snapshot).
    Changed {
        index: u64,
        changes: Vec<starling_cluster::Change>,
        replayed: bool,
    },
    /// The whole replicated state at log `index`, as changes from nothing: the state
    /// was replaced by a snapshot, or changes were lost on the way.
    Reset {
        index: u64,
        all: Vec<starling_cluster::Change>,
        /// A snapshot replaced the state (at start, or sent by the leader), rather than
        /// changes the actor's mailbox had no room for.
        snapshot: bool,
    },
    /// The raft driver is up.
    Raft(starling_raft::RaftHandle),
    /// The outcome of this node's own proposal.
    Proposed {
        kind: Proposal,
        result: Result<starling_cluster::Output, String>,
    },
    Tick,
    /// Node `node` has nothing it routed here before log index `at` on its way any more
    /// (`cluster::actor::through`).
    Through {
        node: u64,
        at: u64,
    },
    /// Shard `shard`'s answer to `RouterMsg::AskThrough` of round `round`: the log index of
    /// the routes it routes under now, and, per other node, the oldest routes' index of a
    /// copy it still holds for that node (sent and not acknowledged, parked, or not yet
    /// sent), for the nodes it holds any for.
    ShardThrough {
        shard: usize,
        round: u64,
        routes_at: u64,
        oldest: Vec<(u64, u64)>,
    },
    Status(Reply<ClusterStatus>),
    /// The replicated routes as this node applied them (filter → nodes), in filter order.
    Routes(Reply<Vec<(String, Vec<u64>)>>),
    /// The transport's peers: the actor makes them follow the members and raft's
    /// configuration.
    Peers(Box<starling_raft::PeerControl>),
    /// Raft's status, asked on every tick (`None`: the driver did not answer).
    RaftStatus(Option<Box<starling_raft::Status>>),
    /// An operator adds `node` (`starling cluster join`): its record through the log, then
    /// it becomes a learner, and a voter once it has caught up. The leader does it.
    AddMember {
        node: u64,
        member: starling_cluster::Member,
        reply: Reply<Result<(), MembershipError>>,
    },
    /// An operator has this node leave the cluster (`starling cluster leave`), its clients
    /// given `drain` to take their sessions to other nodes, and the other nodes as long to
    /// take what this node owes them; answered with what it left behind.
    Leave {
        drain: std::time::Duration,
        reply: Reply<Result<LeftBehind, MembershipError>>,
    },
    /// The leader's removal of a departed member from raft's configuration finished.
    Removed(u64),
    /// An operator's leave of this node finished (`true`: it left, and stops).
    LeaveDone(bool),
    /// This node, which left, is out of raft's configuration, or waited long enough for it:
    /// it stops.
    Linger,
}

/// What a node that left the cluster gave up when its drain time was over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeftBehind {
    /// Persistent sessions whose clients did not reconnect to another node: they end with
    /// the node.
    pub sessions: usize,
    /// Messages some other node had not acknowledged yet (waiting, in flight, or parked in
    /// the outbox for a node it could not reach): lost with the node.
    pub messages: usize,
    /// Sessions that moved away and that another member might still route a copy to
    /// this node for (their move's cut not applied, or some member not through with it):
    /// such a copy is lost.
    pub relays: usize,
}

/// What one shard still owes the other nodes (`RouterMsg::Owed`): see [`LeftBehind`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Owed {
    pub messages: usize,
    pub relays: usize,
}

/// Why an operator's membership change did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MembershipError {
    #[error("this node is not in a cluster (cluster.enabled is false)")]
    NotClustered,
    /// Membership changes go through the leader: ask it (its API address, when known).
    #[error("node {node} is not the leader (leader: {})", leader.map_or("unknown".to_owned(), |l| l.to_string()))]
    NotLeader {
        node: u64,
        leader: Option<u64>,
        leader_http: Option<String>,
    },
    /// The request itself is wrong (node id 0, this node, the last voter leaving).
    #[error("{0}")]
    Refused(String),
    /// Raft did not carry it out in time; the change may be partly made (the message says
    /// how far it got), and asking again is safe.
    #[error("{0}")]
    Failed(String),
}

/// What a proposal of the cluster actor carried: each kind has its own raft request ids,
/// with one proposal at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Proposal {
    Join,
    Routes,
    /// A batch of claims and releases.
    Owners,
    /// A batch of retained sets and deletes.
    Retained,
    /// A batch of `$exclusive/` and `$limit/N/` holds and releases.
    Holds,
    /// An empty entry after a `Leave`: the departed member's log reaching it proves the
    /// member heard the `Leave` committed (`cluster::actor::membership`).
    Mark,
}

/// A node's view of the cluster (`starling cluster status`, `GET /api/v1/cluster`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterStatus {
    pub node: u64,
    /// "leader", "follower", "candidate", "pre_candidate", or "unknown" when the raft
    /// driver does not answer.
    pub role: String,
    pub term: u64,
    pub leader: Option<u64>,
    pub commit: u64,
    pub applied: u64,
    pub members: Vec<MemberStatus>,
    /// Filters with at least one node, in the replicated routes.
    pub routes: usize,
    /// This node's local subscriptions are all in the replicated routes.
    pub routes_converged: bool,
    /// Times this node saw the leader or term change since it started.
    pub leader_changes: u64,
    /// This node's own record, as it states it in the log (what `starling cluster join`
    /// sends the leader).
    pub this: starling_cluster::Member,
    /// This node left the cluster (`starling cluster leave`) and is stopping.
    pub left: bool,
}

/// One member as a node sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberStatus {
    pub id: u64,
    pub mqtt: Option<String>,
    pub cluster: Option<String>,
    pub http: Option<String>,
    pub voter: bool,
    /// Known only on the leader: whether it heard from the member within an election
    /// timeout (`None` elsewhere).
    pub active: Option<bool>,
    /// The leader's replication of it: the last log index it holds.
    pub matched: Option<u64>,
}
