//! The variants the broker cluster suite runs: what the brokers are configured with, which
//! clients run beside the main ones, and how the subscribers behave.

#[allow(unused_imports)]
use super::*;

/// What the brokers are configured with, and how the subscribers behave.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Variant {
    pub(crate) name: &'static str,
    /// Broker nodes: the publishers on the first, a subscriber on each of the others.
    pub(crate) nodes: usize,
    /// Nodes that start outside the cluster (`bootstrap = false`), after the others: the
    /// membership variant adds the first (with a subscriber) and adds then removes the
    /// second while the faults go on.
    pub(crate) joiners: usize,
    /// A retained writer and readers run, and check 6 judges their reads.
    pub(crate) retained: bool,
    /// A shared group with a member on each of two nodes runs, and check 8 judges it.
    pub(crate) shared: bool,
    /// More lines of `[cluster]`.
    pub(crate) cluster: &'static str,
    /// Faults include a node overloaded (paused most of the time, as a node whose actors
    /// are swamped answers late).
    pub(crate) overload: bool,
    /// Lines of `[mqtt]`.
    pub(crate) mqtt: &'static str,
    /// How long a subscriber waits before acknowledging each delivery.
    pub(crate) ack_delay: Duration,
    /// Faults include a node killed and restarted, its store on a simulated disk that
    /// loses what was not synced (the store is then always on).
    pub(crate) kills: bool,
    /// More lines of `[storage]`.
    pub(crate) storage: &'static str,
    /// A nemesis runs (partitions, delays, and kills or overload as above); without one
    /// the run is calm, and nothing excuses a loss.
    pub(crate) faults: bool,
    /// The mover's pause between moves, in milliseconds (a range).
    pub(crate) move_pause_ms: (u64, u64),
    /// A third publisher runs, on the first of the mover's nodes: the node a move leaves,
    /// or the one it comes to, has a publisher of its own.
    pub(crate) mover_node_publisher: bool,
    /// The mover goes round three nodes (the two subscribers' and the publishers'), so a
    /// session may move on while its last move's relay is still on its way.
    pub(crate) mover_ring: bool,
}

/// The broker as it should be: queues deep enough for the whole run.
pub(crate) const SOUND: Variant = Variant {
    name: "sound",
    nodes: 3,
    joiners: 0,
    retained: false,
    shared: false,
    cluster: "",
    overload: false,
    mqtt: "max_mqueue_len = 100000\n",
    ack_delay: Duration::ZERO,
    kills: false,
    storage: "",
    faults: true,
    move_pause_ms: (500, 2000),
    mover_node_publisher: false,
    mover_ring: false,
};

/// The same with five nodes, and overloaded nodes among the faults.
pub(crate) const SOUND5: Variant = Variant {
    name: "sound5",
    nodes: 5,
    overload: true,
    ..SOUND
};

/// Three nodes, and two that join while the faults go on, one of which leaves again.
pub(crate) const MEMBERSHIP: Variant = Variant {
    name: "membership",
    joiners: 2,
    ..SOUND
};

/// The membership variant with kills among the faults: a node joining or leaving, or one
/// the operator asks, may be killed and restarted meanwhile (one that left and stopped is
/// not).
pub(crate) const MEMBERSHIP_KILLS: Variant = Variant {
    name: "membership-kills",
    joiners: 2,
    kills: true,
    ..SOUND
};

/// Three nodes, any of which may be killed and restarted on what its disk kept (the
/// leader among them when it is one).
pub(crate) const KILLS: Variant = Variant {
    name: "kills",
    kills: true,
    ..SOUND
};

/// The kills, with every commit of the store put off by 200 ms: a kill then often falls
/// between a QoS 2 publish's forward and the commit of its publisher's packet identifier on
/// the publishers' node. Were the forward let go first, the publisher's resend after the
/// restart would be routed again, and arrive twice at the subscribers (check 1).
pub(crate) const KILLS_SLOW_COMMIT: Variant = Variant {
    name: "kills-slow-commit",
    storage: "commit_interval_ms = 200\n",
    ..KILLS
};

/// The kills, with forwarded batches parked in the outbox after 1.2 s without an
/// acknowledgement (`backpressure_max_secs = 1`, `forward_timeout_ms = 200`) instead of
/// 15 s: most partitions and kills last longer, so publishers are told their messages are
/// safe while they sit in the outbox, which must then deliver them, after a kill of the
/// publishers' node too (check 1).
pub(crate) const KILLS_PARKED: Variant = Variant {
    name: "kills-parked",
    mqtt: "max_mqueue_len = 100000\nbackpressure_max_secs = 1\n",
    cluster: "forward_timeout_ms = 200\n",
    ..KILLS
};

/// Three nodes with a shared group across two of them.
pub(crate) const SHARED_GROUP: Variant = Variant {
    name: "shared",
    shared: true,
    ..SOUND
};

/// Three nodes with the retained writer and readers.
pub(crate) const RETAINED: Variant = Variant {
    name: "retained",
    retained: true,
    ..SOUND
};

/// The same, reading retained messages from each node's own replica: stale reads must be
/// caught.
pub(crate) const RETAINED_LOCAL: Variant = Variant {
    name: "retained-local",
    cluster: "retained_reads = \"local\"\n",
    ..RETAINED
};

/// Reconnects served from each node's memory of its claims (`cluster.reconnect_reads =
/// "local"`): a node behind on another node's newer claim serves the mover a second live
/// session, which check 3 must catch.
pub(crate) const RECONNECT_LOCAL: Variant = Variant {
    name: "reconnect-local",
    cluster: "reconnect_reads = \"local\"\n",
    ..SOUND
};

/// Forwards not confirmed (`cluster.forward_confirm = false`), with kills: a publisher is
/// answered before the other nodes took its message, so a batch lost with its killed
/// sending node is an acknowledged message lost, which check 1 must catch. (Without kills
/// the links send lost batches again, and nothing is lost: docs/clustering.md.)
pub(crate) const FORWARD_UNCONFIRMED: Variant = Variant {
    name: "forward-unconfirmed",
    cluster: "forward_confirm = false\n",
    kills: true,
    ..SOUND
};

/// No faults, and the mover moving every 100-400 ms while the publishers go on: every
/// publish confirmed while it moves must reach it, once routed to the node it left (check
/// 9 excuses nothing in a calm run).
pub(crate) const MOVES: Variant = Variant {
    name: "moves",
    faults: false,
    move_pause_ms: (100, 400),
    mover_node_publisher: true,
    ..SOUND
};

/// The moves round three nodes, a few milliseconds apart: a move on before the last one's
/// relay is done (copies relayed down the chain) must still lose nothing and keep order.
pub(crate) const MOVES_CHAINED: Variant = Variant {
    name: "moves-chained",
    move_pause_ms: (5, 60),
    mover_ring: true,
    ..MOVES
};

/// The moves back and forth between two nodes, a few milliseconds apart: a session that
/// comes back to a node while what that node relayed to it on the other one is still on
/// its way back must still get it in order.
pub(crate) const MOVES_PINGPONG: Variant = Variant {
    name: "moves-pingpong",
    move_pause_ms: (5, 60),
    ..MOVES
};

/// The moves without the handover's relay (`cluster.handover_relay = false`): what was
/// routed to the mover's old node in the moment of a move is lost there, which check 9
/// must catch.
pub(crate) const NO_RELAY: Variant = Variant {
    name: "no-relay",
    cluster: "handover_relay = false\n",
    ..MOVES
};

/// The moves with a moved session's direct copies delivered at once
/// (`cluster.handover_order = false`): a copy relayed through the mover's old node can then
/// come after a later one of its publisher, which check 10 must catch.
pub(crate) const NO_ORDER: Variant = Variant {
    name: "no-order",
    cluster: "handover_order = false\n",
    ..MOVES
};

/// Back-pressure across nodes all the time: subscribers' queues of 20 (a high mark of 10)
/// that take up to four deliveries at a time and 10 ms over each, under the nemesis. A
/// forwarded delivery to a backlogged subscriber holds its link; nothing may be lost, and
/// each publisher's order holds. The stall rules are relaxed (30 s, any number of stalls):
/// with the default ones (2 s without taking anything in, twice a minute) the nemesis's
/// delays make a subscriber stall, and past that it holds no one and drops at its queue
/// bound, by design (seed 2 lost 88 that way).
pub(crate) const HELD: Variant = Variant {
    name: "held",
    mqtt: "max_mqueue_len = 20\nmax_inflight = 4\nbackpressure_stall_secs = 30\nbackpressure_max_secs = 30\nbackpressure_stalls_max = 1000\n",
    ack_delay: Duration::from_millis(10),
    ..SOUND
};

/// The same with queues of two and stall rules of 600 s: a subscriber is behind all the
/// time and never judged stalled within a run, so a moving session's copies relayed on from
/// another node's batch keep finding it backlogged. Without a store, two nodes relaying such
/// copies to each other (the session went back and forth) once each waited for the other's
/// acknowledgement of what it relayed before acknowledging the batch it came in, in a cycle
/// the forward timeout (here 605 s) alone ended (seed 49).
pub(crate) const HELD_TINY: Variant = Variant {
    name: "held-tiny",
    mqtt: "max_mqueue_len = 2\nmax_inflight = 4\nbackpressure_stall_secs = 600\nbackpressure_max_secs = 600\nbackpressure_stalls_max = 1000\n",
    ..HELD
};

/// A broker that loses acknowledged messages: a subscriber's queue holds two, back-pressure
/// is off so nothing slows the publishers, one delivery in flight at a time, and the
/// subscribers take 100 ms per message. A forwarded batch is acknowledged once the
/// subscriber's node routed it, so what its full queue then drops was acknowledged to the
/// publisher: check 1 must see it missing.
pub(crate) const LOSSY: Variant = Variant {
    name: "lossy",
    nodes: 3,
    joiners: 0,
    retained: false,
    shared: false,
    cluster: "",
    overload: false,
    mqtt: "max_mqueue_len = 2\nmax_inflight = 1\nbackpressure = false\nmqueue_drop_policy = \"drop_new\"\n",
    ack_delay: Duration::from_millis(100),
    kills: false,
    storage: "",
    faults: true,
    move_pause_ms: (500, 2000),
    mover_node_publisher: false,
    mover_ring: false,
};
