//! `[cluster]`: this node's place in a raft cluster: its cluster address, the members, the
//! certificates, and the raft clock.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use super::FsyncPolicy;

/// `[cluster]` as written.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawCluster {
    pub enabled: bool,
    pub bind: Option<SocketAddr>,
    pub certs_dir: PathBuf,
    /// `[cluster.peers]`: `<id> = "host:port"`. TOML keys are strings, so the ids are
    /// parsed here.
    pub peers: BTreeMap<String, String>,
    pub bootstrap: bool,
    pub advertise_mqtt: Option<String>,
    pub tick_ms: u32,
    pub election_tick: u32,
    pub fsync: FsyncPolicy,
    pub retained_reads: ClusterReads,
    pub reconnect_reads: ClusterReads,
    pub forward_confirm: bool,
    pub handover_relay: bool,
    pub handover_order: bool,
    pub handover_relay_wait: bool,
    pub raft_priority: bool,
    pub outbox_max_messages: u32,
    pub forward_window_messages: u32,
    pub forward_timeout_ms: u32,
    pub snapshot_entries: u32,
}

impl Default for RawCluster {
    fn default() -> Self {
        RawCluster {
            enabled: false,
            bind: None,
            certs_dir: PathBuf::from("certs"),
            peers: BTreeMap::new(),
            bootstrap: true,
            advertise_mqtt: None,
            tick_ms: 100,
            election_tick: 10,
            fsync: FsyncPolicy::Always,
            retained_reads: ClusterReads::Linearizable,
            reconnect_reads: ClusterReads::Linearizable,
            forward_confirm: true,
            handover_relay: true,
            handover_order: true,
            handover_relay_wait: true,
            raft_priority: true,
            outbox_max_messages: 100_000,
            forward_window_messages: 0,
            forward_timeout_ms: 5_000,
            snapshot_entries: 10_000,
        }
    }
}

/// `cluster.retained_reads` and `cluster.reconnect_reads`: how a SUBSCRIBE reads the
/// retained messages it gets, and how a reconnect to this node checks that its claim of
/// the client id still stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClusterReads {
    /// Through the leader (a raft read barrier): what was acknowledged anywhere before is
    /// seen. Without a quorum the request is refused rather than answered from an old view
    /// (SUBACK 0x80, CONNACK 0x88).
    #[default]
    Linearizable,
    /// From this node's replica at once: no round trip, but a node that lags or is cut
    /// off answers from what it has, possibly an old view.
    Local,
}

/// `[cluster]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// Run as a member of a cluster. Default false: a node alone.
    pub enabled: bool,
    /// The UDP address of the cluster's QUIC endpoint (raft and forwarded publishes).
    /// Default: this node's entry in `peers`.
    pub bind: SocketAddr,
    /// Directory with `ca.pem`, `node-<id>.pem` and `node-<id>.key` (`starling cert`).
    /// Default `certs`, next to the config file.
    pub certs_dir: PathBuf,
    /// Every member by raft id (`node.id`), this node included, with its cluster address.
    pub peers: BTreeMap<u64, SocketAddr>,
    /// The peers are the cluster's first membership: every one of them is started with
    /// the same list. Default true. A node that joins a running cluster later sets false:
    /// it waits for a member to add it (`starling cluster join`) and never campaigns alone.
    pub bootstrap: bool,
    /// The MQTT address other members and `starling cluster status` show for this node.
    /// Default: the first TCP listener's address.
    pub advertise_mqtt: Option<String>,
    /// The raft clock, in milliseconds. 10..=10000, default 100.
    pub tick_ms: u32,
    /// Ticks without a leader before a follower campaigns (randomized up to twice that).
    /// 5..=1000, default 10 (one second).
    pub election_tick: u32,
    /// When the raft log reaches the disk: `"always"` (default: before anything it holds is
    /// acted on) or `"never"`.
    pub fsync: FsyncPolicy,
    /// How a SUBSCRIBE reads retained messages: `"linearizable"` (default) or `"local"`.
    pub retained_reads: ClusterReads,
    /// How a CONNECT for a client id this node claimed before is served: after a
    /// linearizable read of its owner (default), or `"local"`, from this node's memory of
    /// the claim (no round trip; a node cut off, or behind on another node's newer claim,
    /// then serves a second live session for the id until it hears of the claim).
    pub reconnect_reads: ClusterReads,
    /// A QoS 1/2 publish forwarded to other nodes is acknowledged once they took it
    /// (default true), or at once (false: lower latency, but a forward lost with a link or
    /// a node is lost after the publisher was told it arrived).
    pub forward_confirm: bool,
    /// A session handed over to another node leaves its subscriptions here for a while,
    /// relaying to it what was routed to them before the move's cut (default true). False
    /// ends them with the session: publishes routed to this node in the moment of the
    /// move are lost (only to show that the simulation's check catches it).
    pub handover_relay: bool,
    /// A session that moved here holds a copy another node forwarded to it directly, in
    /// the first seconds after the move's cut, until its old node says it relayed all
    /// that node sent it before the cut (default true), so that a publisher's messages
    /// on a topic keep their order across the move. False delivers it at once: a copy
    /// relayed through the old node may then come after a later one (only to show that
    /// the simulation's order check catches it).
    pub handover_order: bool,
    /// A moved session's relay on its old node, and its new node's judgement of the
    /// move's cut, last (30 s at least) until every other member said that nothing it
    /// routed before the cut is still on its way here (default true), so that a copy
    /// routed before the cut that comes late (a link cut off for long, a batch parked in
    /// the outbox and replayed) is still relayed, and delivered once. False ends them 30 s
    /// after the cut: such a copy is then lost (only to show that the simulation's check
    /// catches it).
    pub handover_relay_wait: bool,
    /// The raft driver runs on a thread of its own and takes its peers' messages ahead of
    /// client work (default true). False puts it on a worker, behind the clients there:
    /// only to show what a follower flooded by clients then does to its leader (the
    /// simulation's overload test).
    pub raft_priority: bool,
    /// Forwarded QoS 1/2 publishes this node may park for one other node that does not
    /// acknowledge them within the forward timeout, kept in the store (and in memory) and
    /// sent again until it does. 0..=10,000,000, default 100,000; 0 (or a node without a
    /// store) parks none of them: their publishers are told *unconfirmed*. (A copy a node
    /// with a store forwards on from another node's batch is parked whatever this says;
    /// a node without a store keeps such copies in memory until their node takes them,
    /// and this bounds them the same way.) Past it, a publish
    /// for that node is refused (`"refuse"`: MQTT 5 0x97, counted in
    /// `cluster.outbox.full`).
    pub outbox_max_messages: u32,
    /// Forwarded messages in flight to one other node (waiting to be sent, or sent and not
    /// yet acknowledged), split over the shards: from there on the QoS 1/2 publishers whose
    /// messages go to that node are held back (they are not read) until it is down to
    /// half. 0..=1,000,000; 0 (the default) sizes it so that what every other member may
    /// have in flight to one backlogged subscriber fits its hard queue bound: 1.5 times
    /// `mqtt.max_mqueue_len` plus 4,096, divided by the other members (those of `peers`,
    /// or of the replicated membership once it has more; 2,798 for three nodes with the
    /// default queue). Memory for one node's window is at most this many
    /// messages of up to `mqtt.max_packet_size`, and twice that waiting when the link
    /// itself is full.
    pub forward_window_messages: u32,
    /// How long a forwarded batch waits for its node's acknowledgement past
    /// `mqtt.backpressure_max_secs` (a subscriber there may hold the link that long)
    /// before it is parked in the outbox, or, with none, its publishers are told it is not
    /// confirmed. 100..=600,000 ms, default 5,000.
    pub forward_timeout_ms: u32,
    /// Applied raft entries after which the log is compacted into a snapshot of the
    /// cluster state (members, owners, routes, retained messages). A restart restores the
    /// snapshot, then replays the entries after it; a member that lags behind the
    /// compaction is sent the snapshot. 10..=10,000,000, default 10,000.
    pub snapshot_entries: u32,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        let raw = RawCluster::default();
        ClusterConfig {
            enabled: raw.enabled,
            bind: SocketAddr::from(([0, 0, 0, 0], 7001)),
            certs_dir: raw.certs_dir,
            peers: BTreeMap::new(),
            bootstrap: raw.bootstrap,
            advertise_mqtt: None,
            tick_ms: raw.tick_ms,
            election_tick: raw.election_tick,
            fsync: raw.fsync,
            retained_reads: raw.retained_reads,
            reconnect_reads: raw.reconnect_reads,
            forward_confirm: raw.forward_confirm,
            handover_relay: raw.handover_relay,
            handover_order: raw.handover_order,
            handover_relay_wait: raw.handover_relay_wait,
            raft_priority: raw.raft_priority,
            outbox_max_messages: raw.outbox_max_messages,
            forward_window_messages: raw.forward_window_messages,
            forward_timeout_ms: raw.forward_timeout_ms,
            snapshot_entries: raw.snapshot_entries,
        }
    }
}
