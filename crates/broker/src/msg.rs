//! The messages the broker's actors exchange, apart from the actors: every actor module
//! depends on this one and on no other actor module for what it sends, so the modules form
//! no cycle (an actor that starts another still names that actor's type).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use starling_codec::{Connect, Error as CodecError, Packet, Properties, QoS, ReasonCode};
use starling_rt::{ActorId, Reply, WeakAddr};
use starling_session::{DeliveryOptions, Message, SubscribeRequest};
use tokio::sync::OwnedSemaphorePermit;

use crate::conn::Io;

mod cluster;
mod store;

// --- to a client actor ---------------------------------------------------------------

/// Deliveries per batch message: with the client mailbox's capacity this bounds what one
/// client's mailbox holds.
pub(crate) const BATCH_MAX: usize = 64;

/// One routed message and the options of the subscription(s) it came through.
pub(crate) type Delivery = (Arc<Message>, DeliveryOptions);

/// A connection whose CONNECT was accepted (authenticated and checked), on its way to the
/// actor that owns its client id.
pub(crate) struct NewConn {
    pub connect: Connect,
    pub io: Box<dyn Io>,
    /// Bytes read after the CONNECT (a client may pipeline packets behind it).
    pub buf: BytesMut,
    pub peer: SocketAddr,
    pub username: Option<String>,
    /// Held while the connection lives: the listener's max_connections.
    pub permit: Option<OwnedSemaphorePermit>,
    /// When it was accepted, and on what kind of listener: the handshake latency runs
    /// from here to its CONNACK written.
    pub accepted: starling_rt::time::Instant,
    pub listener: starling_net::ListenerKind,
}

pub(crate) enum ClientMsg {
    /// A new connection for this client id (first, resumed, or a takeover).
    Attach(Box<NewConn>),
    /// Packets decoded from the attached connection, then the decoder's error if it failed
    /// after them (the input ends there).
    Input(Vec<Packet>, Option<CodecError>),
    /// The read side of the attached connection ended (EOF or error).
    InputEnd,
    /// Routed messages from shard `.0`, oldest first (at most `BATCH_MAX`).
    Deliver(u16, Vec<Delivery>),
    /// The session's timer.
    Timeout,
    /// As a publisher: hold back PUBLISH for the subscriber `subscriber` on `shard` until
    /// released (see the `flow` module).
    Hold {
        shard: u16,
        subscriber: ActorId,
    },
    Release {
        shard: u16,
        subscriber: ActorId,
    },
    /// As a subscriber: `shard` watches its backlog (report every change) or stops.
    Watch {
        shard: u16,
        on: bool,
    },
    /// As a subscriber: `shard` found it stalled while holding publishers back (with
    /// `backpressure_stuck_policy = "disconnect"` it is disconnected).
    Stalled {
        shard: u16,
    },
    /// A later authorization verdict on `topic` (see `gate`), `None` past
    /// `auth.verdict_timeout_ms`. `attach` is the connection it was asked for (a verdict
    /// for an earlier connection, whose address may differ, is dropped); `seq` the wait's.
    Verdict {
        attach: u32,
        seq: u32,
        kind: AuthzKind,
        topic: Arc<str>,
        verdict: Option<bool>,
    },
    /// The store answered for a publish whose acknowledgement waits for it (see the
    /// client's `acks` module), or, with tag [`OWN_WRITE`], for the client's own write of
    /// its session (what it sends next waits for that).
    Stored {
        tag: u32,
        outcome: Stored,
    },
    /// The publishes under these tags changed nothing in the store: their
    /// acknowledgements may go. One message per publisher and shard burst, not per publish.
    Routed(Vec<u32>),
    /// What became of publishes whose acknowledgements waited for other nodes of the
    /// cluster (and maybe the store), by tag: one message per publisher and turn of the
    /// shard that settled them.
    Settled(Vec<(u32, Stored)>),
    /// A session restored from the store at start, or (`moved`: the claim's epoch) handed
    /// over by another node: subscribe its filters again, then answer (before the
    /// listeners open) whether the routes of its filters held this node by then (true
    /// when it has none).
    Resubscribe {
        /// The claim's epoch, and the node that handed it over.
        moved: Option<(u64, u64)>,
        reply: Reply<bool>,
    },
    /// The broker is stopping.
    Shutdown(Reply<()>),
    /// The node is leaving its cluster: the connection closes with 0x9C Use another server
    /// (MQTT 5: with a Server Reference naming another member's MQTT address, when there is
    /// one) and the session stays (for the node the client reconnects to, which takes it
    /// over), or ends with it if it does not outlive its connection.
    Move(Option<Arc<String>>),
    /// An operator asks what this client is (the HTTP API).
    Info(Reply<ClientInfo>),
    /// An operator asks for this client's subscriptions.
    Subscriptions(Reply<ClientSubscriptions>),
    /// An operator discards this client's session: its connection, if any, is closed (v5
    /// DISCONNECT 0x98 Administrative action), its will published, its subscriptions and
    /// queue dropped. Answers what the client was.
    Kick(Reply<ClientInfo>),
    /// Another node took the client id over and continues the session: its state (none
    /// when it does not outlive its connection, and then it just ends) with the username
    /// it belongs to; the session ends here (MQTT 5: DISCONNECT 0x8E), the connection's
    /// will published if its delay is zero, as a takeover does. `to`: the node and its
    /// claim's epoch (what was routed to this session before the move's cut is relayed
    /// there: `routing::moving`).
    HandOver {
        to: (u64, u64),
        reply: Reply<Option<Box<HandOff>>>,
    },
    /// The hand-over's second step, behind every delivery the shards sent before they
    /// started relaying: the state is taken now.
    HandOverNow(Reply<Option<Box<HandOff>>>),
    /// A session another node handed over too late for its CONNECT, which went on afresh
    /// here, would take this one's place: this session ends and answers true if it never
    /// held more than its name (`Session::give_way`), and otherwise stays as it is.
    GiveWay(Reply<bool>),
    /// An operator subscribes the connected client to `filters` (valid ones) at `qos`: as
    /// its own SUBSCRIBE would (quota, authorization, retained messages after), with no
    /// SUBACK. Answers, per filter, the granted QoS or the code that refused it.
    Subscribe {
        filters: Vec<String>,
        qos: QoS,
        reply: Reply<Result<Vec<Result<QoS, ReasonCode>>, NotConnected>>,
    },
    /// An operator unsubscribes the connected client from `filters`, with no UNSUBACK:
    /// per filter, the router's code (0x11 when it had no such subscription).
    Unsubscribe {
        filters: Vec<String>,
        reply: Reply<Result<Vec<ReasonCode>, NotConnected>>,
    },
}

/// An operator's subscribe or unsubscribe for a client without a connection: it would
/// act on a session that no one is there to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NotConnected;

/// A client as an operator sees it (`GET /api/v1/clients`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientInfo {
    pub client_id: String,
    pub username: Option<String>,
    /// The connection's address; `None` while the session has none.
    pub peer: Option<SocketAddr>,
    pub connected: bool,
    /// When the current connection was accepted, in Unix seconds; `None` while offline.
    pub connected_at: Option<u64>,
    /// 3 (MQTT 3.1), 4 (3.1.1) or 5; `None` for a session restored and not yet resumed.
    pub proto_ver: Option<u8>,
    /// The keep alive in force, seconds (0: off or offline).
    pub keepalive: u16,
    /// Whether the current connection asked for a clean start (clean session in 3.x).
    pub clean_start: bool,
    /// Session Expiry Interval in force, seconds (`u32::MAX`: never).
    pub expiry_interval: u32,
    pub subscriptions: usize,
    pub inflight: usize,
    pub max_inflight: usize,
    pub mqueue_len: usize,
    pub max_mqueue: usize,
}

/// A client's subscriptions as an operator sees them (`GET /api/v1/subscriptions`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientSubscriptions {
    pub client_id: String,
    pub peer: Option<SocketAddr>,
    /// 3, 4 or 5, as in [`ClientInfo::proto_ver`].
    pub proto_ver: Option<u8>,
    /// Each filter as subscribed (with its `$share/`, `$exclusive/` or `$limit/` prefix),
    /// its options and its subscription identifier.
    pub filters: Vec<(String, starling_codec::SubscriptionOptions, Option<u32>)>,
}

/// What an authorization verdict is remembered for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum AuthzKind {
    Publish,
    Subscribe,
    Read,
}

/// What the listing actor answers (listing.rs): whole lists for the operator, kept for a
/// while and shared.
pub(crate) enum ListingMsg {
    Clients(Reply<Arc<[ClientInfo]>>),
    /// The clients with at least one subscription.
    Subscriptions(Reply<Arc<[ClientSubscriptions]>>),
}

// --- to the registry ------------------------------------------------------------------

pub(crate) enum RegistryMsg {
    /// An accepted CONNECT for `client_id`.
    Connect {
        client_id: Arc<str>,
        conn: Box<NewConn>,
    },
    /// A client actor whose session ended asks to go; honoured only if no connection was
    /// sent to it since (`attaches` matches), else the Attach in its mailbox wins.
    Retire {
        client_id: Arc<str>,
        actor: ActorId,
        attaches: u32,
    },
    /// Close every connection (v5 0x8B) and stop every client actor.
    Shutdown(Reply<()>),
    /// The node is leaving its cluster: CONNECTs are refused from now on (0x9C Use another
    /// server, 3.x: 3 Server unavailable) and every connection is closed with 0x9C, the
    /// sessions staying for the nodes their clients reconnect to, each client pointed at
    /// one of `to` (the other members' MQTT addresses) in turn. Answered with the sessions
    /// still here.
    Drain {
        to: Vec<Arc<String>>,
        reply: Reply<usize>,
    },
    /// How many sessions this node still holds.
    Sessions(Reply<usize>),
    /// Every client actor, for an operator's list.
    Clients(Reply<Vec<starling_rt::Addr<ClientMsg>>>),
    /// The client actor of one client id.
    Client(Arc<str>, Reply<Option<starling_rt::Addr<ClientMsg>>>),
    /// The cluster's answer to this node's claim of `client_id` (an epoch, or why not); the
    /// CONNECT waits in `claiming`.
    Claimed {
        client_id: Arc<str>,
        result: Result<Claim, ClaimError>,
    },
    /// The cluster's answer to a reconnect of `client_id`, which this node claimed with
    /// `epoch`: whether that claim still stands (the CONNECT waits in `confirming`).
    Confirmed {
        client_id: Arc<str>,
        epoch: u64,
        result: Result<(), ClaimError>,
    },
    /// Another node claimed `client_id` with `epoch`: a session here under an older claim
    /// is taken over (MQTT 5: DISCONNECT 0x8E) and discarded.
    TakenOver {
        client_id: Arc<str>,
        epoch: u64,
        node: u64,
    },
    /// The session a node handed over for this node's claim `epoch` of `client_id` (`None`:
    /// it had none to give).
    HandedOver {
        client_id: Arc<str>,
        epoch: u64,
        handoff: Option<Box<HandOff>>,
    },
    /// A CONNECT waits for the previous owner's session for this node's claim `epoch` of
    /// `client_id`: time to see how long nothing came (`registry::handover::due`).
    HandoverTick { client_id: Arc<str>, epoch: u64 },
    /// A part of the session of `client_id` for this node's claim `epoch` came: it is on
    /// its way, and its CONNECT waits on.
    HandoverComing { client_id: Arc<str>, epoch: u64 },
    /// The answer of the session started afresh for this node's claim `epoch` of
    /// `client_id` when the previous owner's `handoff` came too late (`ClientMsg::GiveWay`):
    /// `gave`, it ended and the handed-over session takes its place; if not, it stays (its
    /// actor `addr`, `attaches` and `owner` go back into the registry).
    GaveWay {
        client_id: Arc<str>,
        epoch: u64,
        handoff: Box<HandOff>,
        addr: starling_rt::Addr<ClientMsg>,
        attaches: u32,
        owner: Option<Arc<str>>,
        gave: bool,
    },
    /// Sessions restored at start that another node claimed since (client id, the
    /// claim's epoch and node), as the log says once this node caught up: handed over.
    StaleRestored(Vec<(Arc<str>, u64, u64)>),
    /// The handed-over session of `client_id` is routed here: its CONNECT (in
    /// `resuming`) goes on.
    HandoverReady { client_id: Arc<str> },
    /// Sessions read back from the store at start, each with the username it belongs to:
    /// give each a client actor, route its subscriptions again, then answer.
    Restore(
        Vec<(starling_session::Session, Option<Arc<str>>)>,
        Reply<()>,
    ),
}

// --- to the router --------------------------------------------------------------------

/// The router's answer to a SUBSCRIBE.
#[derive(Debug, Default)]
pub(crate) struct SubscribeResult {
    /// One per request, in order.
    pub results: Vec<Result<QoS, ReasonCode>>,
    /// One per request: the subscription did not exist before (for Retain Handling 1).
    pub new: Vec<bool>,
    /// Retained messages to deliver after the SUBACK, with their options.
    pub retained: Vec<(Arc<Message>, DeliveryOptions)>,
    /// Publishes taken in after the SUBSCRIBE that reached their shard before its new
    /// subscriptions did (`routing::recent`): delivered after the retained ones.
    pub caught: Vec<(Arc<Message>, DeliveryOptions)>,
    /// In a cluster: answered once the replicated routes hold this node for each new
    /// subscription's filter (the SUBACK waits for them, up to a bound), so that a publish
    /// on another node after the SUBACK reaches the subscriber.
    pub route_waits: Vec<tokio::sync::oneshot::Receiver<()>>,
    /// Whether the replicated routes held this node for every new subscription's filter
    /// before the answer (`Shards::subscribe`; always, outside a cluster).
    pub routes_held: bool,
    /// In a cluster: new `$exclusive/` and `$limit/N/` subscriptions, whose grant is the
    /// cluster's (see [`HoldWait`]).
    pub holds: Vec<HoldWait>,
}

/// A `$exclusive/` or `$limit/N/` subscription installed by its home shard whose grant
/// waits for the cluster's count (`ClusterMsg::Hold`): its request's index, the verdict
/// (`Some(granted)`, `None` when the count could not be taken), and its retained messages,
/// delivered only if granted.
#[derive(Debug)]
pub(crate) struct HoldWait {
    pub at: usize,
    pub verdict: tokio::sync::oneshot::Receiver<Option<bool>>,
    pub retained: Vec<(Arc<Message>, DeliveryOptions)>,
}

/// How a shard takes a subscription (see the `shards` module).
#[derive(Debug)]
pub(crate) enum Admission {
    /// It decides: the filter's only or home shard.
    Decide,
    /// The home shard granted it; `new` (one per request) is what the home found, which
    /// decides whether retained messages are sent.
    Admitted { new: Vec<bool> },
}

/// A subscriber's report to one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FlowReport {
    /// Deliveries taken from this shard's batches so far.
    pub taken: u64,
    /// Its session's queue now.
    pub queued: usize,
    /// Its session refuses new messages (the shard then drops them rather than hand them
    /// over to be dropped).
    pub saturated: bool,
    /// It acknowledged a delivery since its last report: progress, even if its queue did not
    /// move.
    pub progressed: bool,
}

/// A publisher that may be held back (see the `flow` module).
#[derive(Clone)]
pub(crate) struct Publisher {
    pub id: ActorId,
    pub addr: WeakAddr<ClientMsg>,
    /// How many times it has been released so far: a shard that held it in an earlier
    /// epoch holds it again (its earlier Hold was lifted by another subscriber's Release).
    pub epoch: u32,
}

pub(crate) struct SubscribeMsg {
    pub client_id: Arc<str>,
    pub client: WeakAddr<ClientMsg>,
    /// Whether it may hold its publishers back (`mqtt.backpressure_holders`).
    pub may_hold: bool,
    /// Whether its session outlives its connection: its QoS 1/2 deliveries are stored.
    pub persistent: bool,
    pub filters: Vec<SubscribeRequest>,
    pub admission: Admission,
    /// When its client took the SUBSCRIBE in: publishes taken in after that moment that
    /// reached the shard before it are handed back (`SubscribeResult::caught`). `None` for
    /// subscriptions restored, moved or made by an operator.
    pub since: Option<starling_rt::time::Instant>,
    pub reply: Reply<SubscribeResult>,
}

/// A shard's part in the cluster, given once at start when `cluster.enabled`.
pub(crate) struct ShardCluster {
    pub node: u64,
    /// Where forwarded batches go: one data stream per peer.
    pub links: starling_raft::DataLinks,
    /// Told when this shard's local subscriptions to a filter it is home to start or end.
    pub actor: starling_rt::Addr<ClusterMsg>,
}

/// The batch a forwarded publish came in: the sending node, its shard, that shard's
/// incarnation and the batch's number (`cluster/inlink.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LinkFrom {
    pub node: u64,
    pub shard: u16,
    pub inc: u64,
    pub seq: u64,
}

/// What became of the store writes of another node's forwarded publishes (see
/// [`RouterMsg::LinkStored`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LinkWrite {
    Durable,
    /// The commit failed, or the store refused a write (full).
    NotDurable,
    /// The store is closed or lost (this node stops, or must be restarted): nothing is
    /// said of the batch, so that its sender sends it again to the restarted node, whose
    /// stored cursor tells what of it is durable.
    StoreGone,
}

/// A shard's part of a forwarded batch (see [`RouterMsg::Forwarded`]).
pub(crate) struct ForwardedPart {
    pub from: LinkFrom,
    /// The log index of the routes the batch was routed under (see `routing::moving`).
    pub routed_at: u64,
    pub messages: Vec<(Arc<Message>, Option<SharedTo>)>,
    pub done: tokio::sync::oneshot::Sender<bool>,
}

pub(crate) enum RouterMsg {
    /// Route (and retain, or schedule if `$delayed/`) a message; with its publisher when
    /// it may be held back, and whom to tell once what it changed in the store is durable
    /// (boxed: rare, and every publish in a shard's mailbox pays for the slot).
    Publish(Arc<Message>, Option<Publisher>, Option<Box<AckTo>>),
    /// Boxed: the largest variant would size every slot of the mailbox, publishes too.
    Subscribe(Box<SubscribeMsg>),
    Unsubscribe {
        client_id: Arc<str>,
        filters: Vec<String>,
        reply: Reply<Vec<ReasonCode>>,
    },
    /// The session ended: forget its subscriptions and its address (if still `actor`'s);
    /// one handed over to another node (`MovedAway` first) keeps its subscriptions but
    /// shared ones for a while, relaying what was routed to them before the move's cut
    /// (`routing::moving`).
    SessionEnded {
        client_id: Arc<str>,
        actor: ActorId,
        filters: Vec<String>,
    },
    /// The session of `client_id` is being handed over to node `to` (its claim `epoch`):
    /// from now on what is routed to it goes there (until the move's cut), and what waits
    /// here for it goes there too once it ended. Answered once the shard's judgement of
    /// the move is stored (at once without a store): a node killed after the session left
    /// must find its relay at its restart. What this shard sent the client before is in
    /// its mailbox ahead of the hand-over.
    MovedAway {
        client_id: Arc<str>,
        to: u64,
        epoch: u64,
        done: Reply<Stored>,
    },
    /// The session of `client_id`, handed over by node `from` for this node's claim
    /// `epoch`, is stored and subscribes next: until its move's cut, only copies relayed
    /// from its old node reach it. `done` is answered once that judgement is stored.
    MovedIn {
        client_id: Arc<str>,
        epoch: u64,
        from: u64,
        done: Reply<Stored>,
    },
    /// The log applied the cut of `client_id`'s move to `node` (claim `epoch`) at `index`.
    Moved {
        client_id: Arc<str>,
        node: u64,
        epoch: u64,
        index: u64,
    },
    /// The log applied the routes up to `index` (every route change of this shard's
    /// `RemoteRoute`s came before): what a publish routed now is stamped with.
    RoutesAt(u64),
    /// Ends the judgements of moves whose time is up (`routing::moving`).
    MovesCheck,
    /// Every other member has nothing it routed here before this log index on its way any
    /// more: the moves whose cut is no later end once their grace is over
    /// (`routing::moving`).
    Through(u64),
    /// What this shard still holds for other nodes, for round `.0`: answered with
    /// `ClusterMsg::ShardThrough`.
    AskThrough(u64),
    /// What this shard still owes the other nodes: asked by a node that leaves before it
    /// does.
    Owed(Reply<Owed>),
    /// A client attached or detached: shared groups prefer online members, and an
    /// offline one holds no publisher back. `persistent`: whether its session now outlives
    /// its connection (a resume may change it), so that its deliveries are stored.
    Presence {
        client_id: Arc<str>,
        online: bool,
        may_hold: bool,
        persistent: bool,
    },
    /// A subscriber's back-pressure report (see the `flow` module).
    Flow {
        client_id: Arc<str>,
        actor: ActorId,
        report: FlowReport,
    },
    /// A check of a backlogged subscriber's progress, for its stretch `epoch`.
    FlowCheck { client_id: Arc<str>, epoch: u64 },
    /// A `$delayed/` message is due; with its key in the store when it was stored.
    DelayedDue(Arc<Message>, Option<DelayedKey>),
    /// The store's retained and delayed messages of this shard, at start.
    Restore(Box<Restore>),
    /// The store refused this retained message (full): it goes, unless another replaced it.
    RetainedRefused(Arc<Message>),
    /// This shard's retained messages whose topics match `filter`, at most `limit`, in
    /// topic order (an operator's list).
    Retained {
        filter: String,
        limit: usize,
        reply: Reply<Vec<Arc<Message>>>,
    },
    /// Retry the batches of clients whose mailbox was full.
    RetryBlocked,
    /// Deliveries to persistent sessions whose records are now durable (or, for those
    /// without a record, which waited behind them): hand them over.
    StoredDeliveries(Vec<(Arc<str>, ActorId, Delivery)>),
    /// Whether the store has room enough that a QoS 1 delivery to an online persistent
    /// session may go before its record is durable (see `storage`).
    StoreRoom(bool),
    /// The cluster's wiring (see [`ShardCluster`]).
    Cluster(Box<ShardCluster>),
    /// The replicated routes list `node` for `filter` (`present`) or no longer do: publishes
    /// this node receives that match it are forwarded there, once per publish.
    RemoteRoute {
        filter: String,
        node: u64,
        present: bool,
    },
    /// `node` left the cluster (its `Leave` applied while this node ran, after its routes
    /// went): what this shard holds for it is given up (`routing::departed`).
    NodeLeft(u64),
    /// The replicated membership now has this many members (this node among them): the
    /// automatic forwarding window is shared among the others (`routing::forward_window`).
    Members(usize),
    /// Nodes whose `Leave` this node applied (from its own log at its start too) and that
    /// the members read through the leader after the start do not include: what this shard
    /// restored from the store for them goes (`routing::departed`).
    Departed(Vec<u64>),
    /// This shard's part of a batch another node forwarded, in the batch's order: each
    /// publish for this node's subscribers only (never forwarded again, not retained here):
    /// its plain subscribers, or (`Some`) one member of the shared group that node picked
    /// this node for. A backlogged subscriber holds that node's link back
    /// (`routing::link`).
    ///
    /// `done` is the link's barrier: answered once no subscriber of this shard holds the
    /// node's link back, so that the batch is acknowledged only then and the node holds its
    /// publishers instead of flooding subscribers here that cannot keep up. It also waits
    /// for the store: it says whether every delivery of the node's publishes this shard
    /// wrote so far is durable (false: one was not, and the node is told so; dropped
    /// unanswered once the store is gone, and the node is told nothing).
    /// (Boxed: one per batch and shard, and the mailbox's slots stay small.)
    Forwarded(Box<ForwardedPart>),
    /// The commit of the store writes of a publish `node` forwarded (its `seq` among them,
    /// see `routing::link::LinkWrites`) is done.
    LinkStored {
        node: u64,
        seq: u64,
        outcome: LinkWrite,
    },
    /// `node` took this shard's batch `seq` (of this shard's incarnation `inc`) durably.
    ForwardAcked { node: u64, inc: u64, seq: u64 },
    /// `node` took this shard's batch `seq` (of incarnation `inc`) but could not make it
    /// durable: it will never acknowledge it.
    ForwardNotDurable { node: u64, inc: u64, seq: u64 },
    /// `node` is missing this shard's batches (of incarnation `inc`) from `from` on.
    ForwardResend { node: u64, inc: u64, from: u64 },
    /// The commit of a forwarded publish's writes is done (see [`WaiterTo::Shard`]).
    ForwardStored { key: u64, outcome: Stored },
    /// The outbox write of batch `seq` parked for `node` is done (see [`WaiterTo::Parked`]).
    Parked {
        node: u64,
        seq: u64,
        outcome: Stored,
    },
    /// The drop of a replayed batch's row is committed (see [`WaiterTo::Unparked`]).
    Unparked { node: u64, inc: u64, seq: u64 },
    /// Settle forwarded batches that waited too long for their node.
    ForwardCheck,
    /// Answers this shard's next delivery seq, after raising it to `at_least` at the least
    /// (keeping the shard's residue): see `Shards::reserve_seqs`.
    SeqFloor { at_least: u64, reply: Reply<u64> },
    /// The node's stored sessions are routed again: tell the cluster actor, behind this
    /// shard's route reports (`ClusterMsg::Restored`).
    Restored,
    /// The cluster committed (`None`) or did not commit (`Some`) the retained change a
    /// waiting publish of this shard proposed (its key, as a forwarded copy's).
    RetainSettled { key: u64, failed: Option<Stored> },
    /// The replicated retained message of a topic of this shard was set or deleted.
    ClusterRetained {
        topic: Arc<str>,
        message: Option<Arc<Message>>,
    },
    /// Answered once the retained changes this shard took before are with the cluster
    /// actor, and it passed a read barrier behind them (see `Shards::cluster_retained`);
    /// at once outside a cluster.
    Barrier(tokio::sync::oneshot::Sender<()>),
    /// The replicated retained messages as a whole (after a snapshot or lost changes):
    /// this shard's part replaces every retained message it holds but `$SYS` ones.
    ClusterRetainedReset(Vec<Arc<Message>>),
}

pub(crate) use cluster::*;
pub use cluster::{ClusterStatus, LeftBehind, MemberStatus, MembershipError};
pub(crate) use store::*;

// --- published by the broker itself ---------------------------------------------------

/// A message the broker itself publishes (QoS 0, no publisher, no expiry).
pub(crate) fn sys_message(topic: String, payload: String, retain: bool) -> Arc<Message> {
    Arc::new(Message {
        topic: Arc::from(topic),
        payload: Bytes::from(payload),
        qos: QoS::AtMostOnce,
        retain,
        properties: Properties::default(),
        expires_at: None,
        publisher: None,
        shared_headers: Default::default(),
        received_at: None,
    })
}

#[cfg(test)]
mod size_tests {
    /// A shard's mailbox holds up to 4,096 of these: every byte of the largest variant is
    /// paid by each publish in it (80 before the subscribe was boxed; now a flow report's
    /// 56 is the largest).
    #[test]
    fn a_router_message_stays_small() {
        assert!(std::mem::size_of::<super::RouterMsg>() <= 56);
    }
}
