//! Broker-wide counters, for `$SYS` and tests.
//!
//! Relaxed atomics behind an `Arc`: every actor bumps them, only the `$SYS` actor and
//! [`crate::Broker::metrics`] read them. They are metrics, not state: nothing decides on
//! them, so they are not a channel between actors.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

mod histogram;
mod rate;
mod rmqtt;
pub(crate) use histogram::{Histogram, Local};
pub use histogram::{HistogramSnapshot, BOUNDS_US};
pub(crate) use rate::Rate;
pub use rmqtt::RmqttSnapshot;
use starling_net::ListenerKind;
use starling_rt::time;

/// The live counters.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    /// RMQTT's own metric names (metrics/rmqtt.rs).
    pub rmqtt: rmqtt::RmqttCounters,
    pub clients_connected: AtomicU64,
    pub connections_refused: AtomicU64,
    pub messages_received: AtomicU64,
    pub messages_sent: AtomicU64,
    pub bytes_received: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub dropped_queue_full: AtomicU64,
    pub dropped_mailbox_full: AtomicU64,
    pub dropped_expired: AtomicU64,
    pub dropped_other: AtomicU64,
    pub delayed_refused: AtomicU64,
    pub retained_refused: AtomicU64,
    pub reserved_topic_refused: AtomicU64,
    pub dropped_acl: AtomicU64,
    pub client_id_refused: AtomicU64,
    pub backpressure_stalls: AtomicU64,
    pub backpressure_holds: AtomicU64,
    // Before authentication (listener.rs).
    pub connect_too_large: AtomicU64,
    pub connect_budget_waits: AtomicU64,
    pub login_failed: AtomicU64,
    pub login_banned: AtomicU64,
    pub verify_queue_full: AtomicU64,
    // The hook chain (gate.rs, listener.rs).
    pub verdict_timeouts: AtomicU64,
    // The durable store (storage.rs).
    pub store_commits: AtomicU64,
    pub store_ops: AtomicU64,
    /// Delivery records retired before their commit: neither written (`storage`).
    pub store_cancelled: AtomicU64,
    /// Summed over commits: divided by `store_commits`, the mean commit latency.
    pub store_commit_us: AtomicU64,
    pub store_refused: AtomicU64,
    pub store_errors: AtomicU64,
    /// Logical bytes held (a gauge, set after each commit).
    pub store_bytes: AtomicU64,
    /// Sessions and messages (deliveries) held, gauges like `store_bytes`.
    pub store_sessions: AtomicU64,
    pub store_messages: AtomicU64,
    // The cluster (routing/remote.rs, cluster/).
    pub cluster_forwarded: AtomicU64,
    pub cluster_received: AtomicU64,
    pub cluster_forward_timeouts: AtomicU64,
    pub cluster_forward_not_durable: AtomicU64,
    pub cluster_shared_passed_on: AtomicU64,
    pub cluster_forward_resent: AtomicU64,
    pub cluster_forward_out_of_order: AtomicU64,
    pub cluster_outbox_parked: AtomicU64,
    pub cluster_outbox_replayed: AtomicU64,
    pub cluster_outbox_full: AtomicU64,
    pub cluster_outbox_lost: AtomicU64,
    pub cluster_link_holds: AtomicU64,
    pub cluster_sessions_received: AtomicU64,
    pub cluster_sessions_stored: AtomicU64,
    pub cluster_handover_timeouts: AtomicU64,
    pub cluster_handover_cut_short: AtomicU64,
    pub cluster_sessions_late: AtomicU64,
    pub cluster_sessions_discarded: AtomicU64,
    pub cluster_forward_batches: AtomicU64,
    pub cluster_forward_bytes: AtomicU64,
    pub cluster_raft_commits: AtomicU64,
    pub cluster_raft_commit_us: AtomicU64,
    /// High-water marks of `clients_connected` and of the sessions the registry holds
    /// (RMQTT's `connections.max`, `sessions.max`): raised where the count rises.
    pub clients_connected_max: AtomicU64,
    pub sessions_max: AtomicU64,
    /// The sessions the registry holds (set where it changes), so that a count asks no
    /// actor; and the high-water mark of `store_messages` (RMQTT's `message_storages`).
    pub sessions: AtomicU64,
    pub store_messages_max: AtomicU64,
    /// The router's state counts with their high-water marks (RMQTT's `subscriptions`,
    /// `subscriptions_shared`, `retaineds`, `delayed_publishs`, `topics`), moved by each
    /// shard at the end of a burst by what changed in it since its last report.
    pub subscriptions: Gauge,
    pub subscriptions_shared: Gauge,
    pub retained: Gauge,
    pub delayed: Gauge,
    pub topics: Gauge,
    /// Messages forwarded to other nodes and not yet acknowledged, or waiting to be sent
    /// (RMQTT's `forwards`), moved by the shards as the rest.
    pub forwards: Gauge,
    /// Messages parked in the outbox for other nodes (being written, written, or parked by
    /// an earlier run and not yet taken), moved by the shards as the rest.
    pub outbox: Gauge,
    /// Connections between accept and the registry taking their CONNECT (transport
    /// handshake, CONNECT read, authentication): RMQTT's `handshakings`.
    pub handshakings: Gauge,
    /// Among `handshakings`, those past their CONNECT read: being authenticated and
    /// checked against the limits (RMQTT's `handshakings_active`).
    pub handshakings_active: Gauge,
    /// CONNACKs written per second, accepted or refused (RMQTT's `handshakings_rate`).
    pub handshakings_rate: Rate,
    /// What the client actors' sessions hold, moved by each actor at the end of its turn
    /// by what changed in that turn (RMQTT's `message_queues`, `out_inflights`,
    /// `in_inflights`): queued messages, outbound QoS 1/2 messages awaiting their
    /// acknowledgement, inbound QoS 2 messages awaiting PUBREL.
    pub message_queues: Gauge,
    pub out_inflights: Gauge,
    pub in_inflights: Gauge,
    /// In a cluster, the replicated routes' (filter, node) pairs as applied here (RMQTT's
    /// `routes`), moved by the cluster actor; with one node, `topics` is the figure.
    pub routes: Gauge,
    /// Accept to CONNACK written, per kind of listener ([`LISTENER_KINDS`] order).
    pub handshake: [Histogram; 5],
    /// A PUBLISH read (its message made) to a PUBLISH of it written to a subscriber.
    pub delivery: Histogram,
}

/// The kinds of listener the handshake histogram is labelled with, in its order.
pub(crate) const LISTENER_KINDS: [ListenerKind; 5] = [
    ListenerKind::Tcp,
    ListenerKind::Tls,
    ListenerKind::Ws,
    ListenerKind::Wss,
    ListenerKind::Quic,
];

impl Metrics {
    /// The handshake histogram of a listener kind.
    pub(crate) fn handshake(&self, kind: ListenerKind) -> &Histogram {
        let i = LISTENER_KINDS.iter().position(|&k| k == kind);
        // Every kind is in the table (its test says so).
        &self.handshake[i.unwrap_or(0)]
    }

    /// A CONNACK went out on a connection of a `kind` listener accepted at `accepted`.
    pub(crate) fn connack_written(&self, kind: ListenerKind, accepted: time::Instant) {
        let took = time::now().saturating_duration_since(accepted);
        self.handshake(kind).observe(took);
        self.handshakings_rate.tick(time::unix_secs());
    }

    pub(crate) fn latencies(&self) -> Latencies {
        Latencies {
            handshake: std::array::from_fn(|i| {
                (kind_label(LISTENER_KINDS[i]), self.handshake[i].read())
            }),
            delivery: self.delivery.read(),
        }
    }
}

/// The `listener` label of a kind (its `Display`, as a `&'static str` for the snapshot).
fn kind_label(kind: ListenerKind) -> &'static str {
    match kind {
        ListenerKind::Tcp => "tcp",
        ListenerKind::Tls => "tls",
        ListenerKind::Ws => "ws",
        ListenerKind::Wss => "wss",
        ListenerKind::Quic => "quic",
    }
}

/// The latency histograms at one moment (each bucket read on its own).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Latencies {
    /// From a connection's accept to its CONNACK written (accepted or refused), per kind
    /// of listener (`tcp`, `tls`, `ws`, `wss`, `quic`). Connections that end before any
    /// CONNACK (a failed transport handshake, no CONNECT in time) are not in it.
    pub handshake: [(&'static str, HistogramSnapshot); 5],
    /// From the broker making a message (reading its PUBLISH, publishing a will, an API
    /// publish, a forwarded message's arrival) to the first write of a PUBLISH of it to a
    /// subscriber's socket: one per delivery, every QoS. Not in it: retained messages sent
    /// at SUBSCRIBE, resends (DUP), messages read back from the store, the broker's own
    /// `$SYS` messages.
    pub delivery: HistogramSnapshot,
}

impl Latencies {
    /// Handshakes over every kind of listener.
    pub fn handshakes(&self) -> u64 {
        self.handshake.iter().map(|(_, h)| h.count()).sum()
    }
}

/// A count that goes up and down, with the highest value it reached.
///
/// One locked operation a move: the count is signed and added to (each mover's own
/// contribution never goes below zero, so neither does the sum once every move is in; one
/// read between a mover's moves may be low and reads as at least 0), and the mark is
/// raised only when a plain load says it must be.
#[derive(Debug, Default)]
pub(crate) struct Gauge {
    count: AtomicI64,
    max: AtomicU64,
}

impl Gauge {
    /// Moves the count by `delta` and raises the mark to the new value.
    pub(crate) fn shift(&self, delta: i64) {
        if delta == 0 {
            return;
        }
        let now = self.count.fetch_add(delta, Ordering::Relaxed) + delta;
        if delta > 0 {
            let now = now.max(0).unsigned_abs();
            if now > self.max.load(Ordering::Relaxed) {
                self.max.fetch_max(now, Ordering::Relaxed);
            }
        }
    }

    pub(crate) fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed).max(0).unsigned_abs()
    }

    pub(crate) fn max(&self) -> u64 {
        get(&self.max)
    }
}

/// Adds one to a gauge and raises its high-water mark to the new value.
pub(crate) fn add_with_max(c: &AtomicU64, max: &AtomicU64) {
    let now = c.fetch_add(1, Ordering::Relaxed) + 1;
    max.fetch_max(now, Ordering::Relaxed);
}

/// Adds `n` to a counter.
pub(crate) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Subtracts 1, never below 0.
pub(crate) fn dec(c: &AtomicU64) {
    let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// A copy of the counters at one moment (each read on its own).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    /// RMQTT's own metrics (`client.connect`, `messages.publish`, ...).
    pub rmqtt: RmqttSnapshot,
    /// Clients with an attached connection.
    pub clients_connected: u64,
    /// Connections refused at accept (max_connections) or at CONNECT (auth, bad CONNECT).
    pub connections_refused: u64,
    /// PUBLISH packets accepted from clients.
    pub messages_received: u64,
    /// PUBLISH packets written to clients.
    pub messages_sent: u64,
    /// Bytes read from client sockets.
    pub bytes_received: u64,
    /// Bytes written to client sockets.
    pub bytes_sent: u64,
    /// Messages a session's full queue dropped (its drop policy).
    pub dropped_queue_full: u64,
    /// Deliveries dropped because the subscriber's actor fell behind: its mailbox stayed full
    /// and the router's pending list for it reached `max_mqueue_len`.
    pub dropped_mailbox_full: u64,
    /// Messages dropped because their expiry passed.
    pub dropped_expired: u64,
    /// Messages dropped for any other reason (offline QoS 0, too large, not authorized...).
    pub dropped_other: u64,
    /// `$delayed/` publishes refused (malformed, too long a delay, too many pending).
    pub delayed_refused: u64,
    /// Retained messages the store refused (its caps).
    pub retained_refused: u64,
    /// Client publishes (wills and `$delayed/` targets included) refused because their
    /// topic is reserved for the broker (`$SYS`, any `$` topic but `$delayed/`).
    pub reserved_topic_refused: u64,
    /// Deliveries withheld because the subscriber's ACL denies it the topic.
    pub dropped_acl: u64,
    /// CONNECTs refused because their client id belongs to another identity.
    pub client_id_refused: u64,
    /// Subscribers found stalled while holding publishers back (they stopped holding).
    pub backpressure_stalls: u64,
    /// Publishers held back for a backlogged subscriber (one per publisher and stretch).
    pub backpressure_holds: u64,
    /// CONNECTs refused because they declared more than the listener's
    /// `max_connect_packet_size`.
    pub connect_too_large: u64,
    /// CONNECT reads that had to wait for the listener's `connect_read_budget_bytes`.
    pub connect_budget_waits: u64,
    /// CONNECTs whose credentials were verified and found wrong (or absent where needed).
    pub login_failed: u64,
    /// CONNECTs with credentials refused unverified: their address is banned after
    /// `failed_logins_max` failures.
    pub login_banned: u64,
    /// CONNECTs refused because the password verification queue was full.
    pub verify_queue_full: u64,
    /// Later verdicts that missed their deadline: authorizations past
    /// `auth.verdict_timeout_ms` (they got `auth.timeout_verdict`) and authentications past
    /// the handshake deadline (refused with 0x88).
    pub verdict_timeouts: u64,
    /// Store commits, and the ops they carried.
    pub store_commits: u64,
    pub store_ops: u64,
    /// Delivery records retired before their commit, so neither was written.
    pub store_cancelled: u64,
    /// Microseconds spent in commits, summed.
    pub store_commit_us: u64,
    /// Writes the store refused (full, or for a session it does not hold).
    pub store_refused: u64,
    /// Commits that failed: their writes are not durable.
    pub store_errors: u64,
    /// Keys plus values held by the store, after the last commit.
    pub store_bytes: u64,
    /// Persistent sessions and their queued or in-flight messages held by the store.
    pub store_sessions: u64,
    pub store_messages: u64,
    /// Messages forwarded to other nodes (one per node per publish), received from them,
    /// and forwarded QoS 1/2 messages whose node did not acknowledge them in time.
    pub cluster_forwarded: u64,
    pub cluster_received: u64,
    pub cluster_forward_timeouts: u64,
    /// Forwarded publishes whose deliveries to persistent sessions here could not be
    /// stored: their batches are not acknowledged (the publisher hears unconfirmed).
    pub cluster_forward_not_durable: u64,
    /// Forwarded publishes for a shared group that had no member left here, passed on to
    /// another node the routes name for it.
    pub cluster_shared_passed_on: u64,
    /// Forwarded batches sent again (asked for by their node, or probing a quiet one), and
    /// batches received here out of order (past a gap, or again) and dropped.
    pub cluster_forward_resent: u64,
    pub cluster_forward_out_of_order: u64,
    /// Forwarded messages parked in the outbox for a node that did not acknowledge them
    /// in time; batches parked by an earlier run sent again and acknowledged; messages
    /// refused because a node's part of the outbox was full; parked messages a node
    /// skipped.
    pub cluster_outbox_parked: u64,
    pub cluster_outbox_replayed: u64,
    pub cluster_outbox_full: u64,
    pub cluster_outbox_lost: u64,
    /// Times a subscriber here that fell behind held another node's link back (its
    /// batches acknowledged only once it drained), counted per link and stretch.
    pub cluster_link_holds: u64,
    /// Sessions other nodes handed over here, those of them written to this node's store
    /// before they were resumed, and CONNECTs that waited for one in vain.
    pub cluster_sessions_received: u64,
    pub cluster_sessions_stored: u64,
    pub cluster_handover_timeouts: u64,
    /// Moves whose relay (on the node the session left) or judgement (on the node it came
    /// to) ended before every other member was through with their cut: more waited past
    /// their grace than a shard keeps. A copy routed before such a cut that comes later is
    /// lost.
    pub cluster_handover_cut_short: u64,
    /// Sessions handed over after their CONNECT went on afresh that took the fresh
    /// session's place (it had never held more than its name).
    pub cluster_sessions_late: u64,
    /// Stored sessions found owned by another node as this node started (taken over
    /// while it was down): handed to that node instead of restored here.
    pub cluster_sessions_discarded: u64,
    /// Batch frames handed to the links to other nodes (first sends, resends, replays),
    /// and their bytes.
    pub cluster_forward_batches: u64,
    pub cluster_forward_bytes: u64,
    /// Messages parked in the outbox for other nodes now (a gauge).
    pub cluster_outbox_depth: u64,
    /// This node's raft proposals that committed (routes, claims, retained messages,
    /// holds, its membership), and the microseconds from proposal to applied output.
    pub cluster_raft_commits: u64,
    pub cluster_raft_commit_us: u64,
}

impl Metrics {
    pub(crate) fn snapshot(&self) -> MetricsSnapshot {
        let mut s = MetricsSnapshot {
            rmqtt: self.rmqtt.read(),
            clients_connected: get(&self.clients_connected),
            connections_refused: get(&self.connections_refused),
            messages_received: get(&self.messages_received),
            messages_sent: get(&self.messages_sent),
            bytes_received: get(&self.bytes_received),
            bytes_sent: get(&self.bytes_sent),
            dropped_queue_full: get(&self.dropped_queue_full),
            dropped_mailbox_full: get(&self.dropped_mailbox_full),
            dropped_expired: get(&self.dropped_expired),
            dropped_other: get(&self.dropped_other),
            delayed_refused: get(&self.delayed_refused),
            retained_refused: get(&self.retained_refused),
            reserved_topic_refused: get(&self.reserved_topic_refused),
            dropped_acl: get(&self.dropped_acl),
            client_id_refused: get(&self.client_id_refused),
            backpressure_stalls: get(&self.backpressure_stalls),
            backpressure_holds: get(&self.backpressure_holds),
            connect_too_large: get(&self.connect_too_large),
            connect_budget_waits: get(&self.connect_budget_waits),
            login_failed: get(&self.login_failed),
            login_banned: get(&self.login_banned),
            verify_queue_full: get(&self.verify_queue_full),
            verdict_timeouts: get(&self.verdict_timeouts),
            store_commits: get(&self.store_commits),
            store_ops: get(&self.store_ops),
            store_cancelled: get(&self.store_cancelled),
            store_commit_us: get(&self.store_commit_us),
            store_refused: get(&self.store_refused),
            store_errors: get(&self.store_errors),
            store_bytes: get(&self.store_bytes),
            store_sessions: get(&self.store_sessions),
            store_messages: get(&self.store_messages),
            cluster_forwarded: get(&self.cluster_forwarded),
            cluster_received: get(&self.cluster_received),
            cluster_forward_timeouts: get(&self.cluster_forward_timeouts),
            cluster_forward_not_durable: get(&self.cluster_forward_not_durable),
            cluster_shared_passed_on: get(&self.cluster_shared_passed_on),
            cluster_forward_resent: get(&self.cluster_forward_resent),
            cluster_forward_out_of_order: get(&self.cluster_forward_out_of_order),
            cluster_outbox_parked: get(&self.cluster_outbox_parked),
            cluster_outbox_replayed: get(&self.cluster_outbox_replayed),
            cluster_outbox_full: get(&self.cluster_outbox_full),
            cluster_outbox_lost: get(&self.cluster_outbox_lost),
            cluster_link_holds: get(&self.cluster_link_holds),
            cluster_sessions_received: get(&self.cluster_sessions_received),
            cluster_sessions_stored: get(&self.cluster_sessions_stored),
            cluster_handover_timeouts: get(&self.cluster_handover_timeouts),
            cluster_handover_cut_short: get(&self.cluster_handover_cut_short),
            cluster_sessions_late: get(&self.cluster_sessions_late),
            cluster_sessions_discarded: get(&self.cluster_sessions_discarded),
            cluster_forward_batches: get(&self.cluster_forward_batches),
            cluster_forward_bytes: get(&self.cluster_forward_bytes),
            cluster_outbox_depth: self.outbox.count(),
            cluster_raft_commits: get(&self.cluster_raft_commits),
            cluster_raft_commit_us: get(&self.cluster_raft_commit_us),
        };
        // Its sums and aliases are made of the figures above.
        s.rmqtt = s.rmqtt.computed(&s);
        s
    }
}

/// Whether a metric only grows (a counter) or goes up and down (a gauge).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    Counter,
    Gauge,
}

impl MetricsSnapshot {
    /// Starling's own figures ([`MetricsSnapshot::named`]), then RMQTT's (counters all):
    /// what an exposition lists.
    pub fn every(&self) -> Vec<(&'static str, &'static str, MetricKind, u64)> {
        let mut all = self.named().to_vec();
        let rmqtt = self.rmqtt.named().into_iter();
        all.extend(rmqtt.map(|(name, help, v)| (name, help, MetricKind::Counter, v)));
        all
    }

    /// Every figure of Starling's own with its name (the field's), what it counts and its
    /// kind ([`MetricsSnapshot::every`] adds RMQTT's, for expositions that list them all).
    pub fn named(&self) -> [(&'static str, &'static str, MetricKind, u64); 55] {
        use MetricKind::{Counter as C, Gauge as G};
        [
            (
                "clients_connected",
                "Clients with an attached connection",
                G,
                self.clients_connected,
            ),
            (
                "connections_refused",
                "Connections refused at accept or CONNECT",
                C,
                self.connections_refused,
            ),
            (
                "messages_received",
                "PUBLISH packets accepted from clients",
                C,
                self.messages_received,
            ),
            (
                "messages_sent",
                "PUBLISH packets written to clients",
                C,
                self.messages_sent,
            ),
            (
                "bytes_received",
                "Bytes read from client sockets",
                C,
                self.bytes_received,
            ),
            (
                "bytes_sent",
                "Bytes written to client sockets",
                C,
                self.bytes_sent,
            ),
            (
                "dropped_queue_full",
                "Messages a full session queue dropped",
                C,
                self.dropped_queue_full,
            ),
            (
                "dropped_mailbox_full",
                "Deliveries dropped where a shard's pending list was full",
                C,
                self.dropped_mailbox_full,
            ),
            (
                "dropped_expired",
                "Messages dropped because their expiry passed",
                C,
                self.dropped_expired,
            ),
            (
                "dropped_other",
                "Messages dropped for other reasons",
                C,
                self.dropped_other,
            ),
            (
                "delayed_refused",
                "Delayed publishes refused",
                C,
                self.delayed_refused,
            ),
            (
                "retained_refused",
                "Retained messages the retained store refused",
                C,
                self.retained_refused,
            ),
            (
                "reserved_topic_refused",
                "Publishes refused for a reserved topic",
                C,
                self.reserved_topic_refused,
            ),
            (
                "dropped_acl",
                "Deliveries withheld by the subscriber's ACL",
                C,
                self.dropped_acl,
            ),
            (
                "client_id_refused",
                "CONNECTs refused: client id of another identity",
                C,
                self.client_id_refused,
            ),
            (
                "backpressure_stalls",
                "Subscribers found stalled while holding publishers",
                C,
                self.backpressure_stalls,
            ),
            (
                "backpressure_holds",
                "Publishers held back for a backlogged subscriber",
                C,
                self.backpressure_holds,
            ),
            (
                "connect_too_large",
                "CONNECTs larger than max_connect_packet_size",
                C,
                self.connect_too_large,
            ),
            (
                "connect_budget_waits",
                "CONNECT reads that waited for the read budget",
                C,
                self.connect_budget_waits,
            ),
            (
                "login_failed",
                "CONNECTs whose credentials were wrong or missing",
                C,
                self.login_failed,
            ),
            (
                "login_banned",
                "CONNECTs refused from a banned address",
                C,
                self.login_banned,
            ),
            (
                "verify_queue_full",
                "CONNECTs refused: password verification queue full",
                C,
                self.verify_queue_full,
            ),
            (
                "verdict_timeouts",
                "Authorization verdicts that timed out",
                C,
                self.verdict_timeouts,
            ),
            (
                "cluster_forwarded",
                "Messages forwarded to other nodes of the cluster",
                C,
                self.cluster_forwarded,
            ),
            (
                "cluster_received",
                "Messages other nodes of the cluster forwarded here",
                C,
                self.cluster_received,
            ),
            (
                "cluster_forward_timeouts",
                "Forwarded QoS 1/2 messages whose node did not acknowledge them in time",
                C,
                self.cluster_forward_timeouts,
            ),
            (
                "cluster_forward_not_durable",
                "Forwarded messages whose deliveries here could not be stored (not acknowledged)",
                C,
                self.cluster_forward_not_durable,
            ),
            (
                "cluster_shared_passed_on",
                "Forwarded messages for a shared group with no member left here, passed on to another node",
                C,
                self.cluster_shared_passed_on,
            ),
            (
                "cluster_forward_resent",
                "Forwarded batches sent again: asked for by their node, or probing a quiet one",
                C,
                self.cluster_forward_resent,
            ),
            (
                "cluster_outbox_parked",
                "Forwarded messages parked in the outbox for a node that did not acknowledge them in time",
                C,
                self.cluster_outbox_parked,
            ),
            (
                "cluster_outbox_replayed",
                "Batches parked by an earlier run of this node, sent again and acknowledged",
                C,
                self.cluster_outbox_replayed,
            ),
            (
                "cluster_outbox_full",
                "Forwarded messages refused because their node's part of the outbox was full",
                C,
                self.cluster_outbox_full,
            ),
            (
                "cluster_outbox_lost",
                "Parked messages their node skipped (not durable there)",
                C,
                self.cluster_outbox_lost,
            ),
            (
                "cluster_forward_out_of_order",
                "Forwarded batches received out of order (past a gap, or again) and dropped",
                C,
                self.cluster_forward_out_of_order,
            ),
            (
                "cluster_link_holds",
                "Times a backlogged subscriber held another node's forwarding link back",
                C,
                self.cluster_link_holds,
            ),
            (
                "cluster_sessions_received",
                "Sessions other nodes of the cluster handed over here",
                C,
                self.cluster_sessions_received,
            ),
            (
                "cluster_sessions_stored",
                "Sessions handed over here that were written to this node's store before they resumed",
                C,
                self.cluster_sessions_stored,
            ),
            (
                "cluster_handover_timeouts",
                "CONNECTs that waited in vain for the previous node's session",
                C,
                self.cluster_handover_timeouts,
            ),
            (
                "cluster_handover_cut_short",
                "Moves whose relay or judgement ended before every other member was through with their cut",
                C,
                self.cluster_handover_cut_short,
            ),
            (
                "cluster_sessions_late",
                "Sessions handed over after their CONNECT went on afresh that took the fresh session's place",
                C,
                self.cluster_sessions_late,
            ),
            (
                "cluster_sessions_discarded",
                "Stored sessions another node had taken over while this node was down, handed to it at start",
                C,
                self.cluster_sessions_discarded,
            ),
            (
                "cluster_forward_batches",
                "Batches of forwarded messages sent to other nodes (first sends, resends, replays)",
                C,
                self.cluster_forward_batches,
            ),
            (
                "cluster_forward_bytes",
                "Bytes of the batches of forwarded messages sent to other nodes",
                C,
                self.cluster_forward_bytes,
            ),
            (
                "cluster_outbox_depth",
                "Messages parked in the outbox for other nodes",
                G,
                self.cluster_outbox_depth,
            ),
            (
                "cluster_raft_commits",
                "This node's raft proposals that committed",
                C,
                self.cluster_raft_commits,
            ),
            (
                "cluster_raft_commit_us",
                "Microseconds from this node's raft proposals to their applied output",
                C,
                self.cluster_raft_commit_us,
            ),
            ("store_commits", "Store commits", C, self.store_commits),
            ("store_ops", "Store operations committed", C, self.store_ops),
            (
                "store_cancelled",
                "Delivery records retired before their commit (neither written)",
                C,
                self.store_cancelled,
            ),
            (
                "store_commit_us",
                "Microseconds spent in store commits",
                C,
                self.store_commit_us,
            ),
            (
                "store_refused",
                "Writes the full store refused",
                C,
                self.store_refused,
            ),
            (
                "store_errors",
                "Store commits that failed",
                C,
                self.store_errors,
            ),
            (
                "store_bytes",
                "Bytes held by the store",
                G,
                self.store_bytes,
            ),
            (
                "store_sessions",
                "Sessions held by the store",
                G,
                self.store_sessions,
            ),
            (
                "store_messages",
                "Messages held by the store",
                G,
                self.store_messages,
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::{kind_label, Gauge, Metrics, MetricsSnapshot, LISTENER_KINDS};

    #[test]
    fn each_listener_kind_has_its_own_handshake_histogram() {
        let m = Metrics::default();
        for (i, &k) in LISTENER_KINDS.iter().enumerate() {
            assert_eq!(kind_label(k), k.to_string());
            m.handshake(k)
                .observe(std::time::Duration::from_micros(10 * (i as u64 + 1)));
        }
        let l = m.latencies();
        assert_eq!(l.handshakes(), 5);
        for (i, (label, h)) in l.handshake.iter().enumerate() {
            assert_eq!((*label, h.count()), (kind_label(LISTENER_KINDS[i]), 1));
            assert_eq!(h.sum_us, 10 * (i as u64 + 1));
        }
    }

    #[test]
    fn a_gauge_keeps_its_highest_value_and_never_reads_below_zero() {
        let g = Gauge::default();
        g.shift(3);
        g.shift(-2);
        g.shift(4);
        assert_eq!((g.count(), g.max()), (5, 5));
        g.shift(-9);
        assert_eq!((g.count(), g.max()), (0, 5));
        g.shift(0);
        assert_eq!((g.count(), g.max()), (0, 5));
    }

    #[test]
    fn every_lists_every_field_once() {
        // Less one for the `rmqtt` field, whose own fields are listed.
        let fields = format!("{:?}", MetricsSnapshot::default())
            .matches(": ")
            .count()
            - 1;
        let named = MetricsSnapshot::default().every();
        assert_eq!(
            named.len(),
            fields,
            "a field is missing from MetricsSnapshot::every"
        );
        let mut names: Vec<&str> = named.iter().map(|n| n.0).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), fields);
        let debug = format!("{:?}", MetricsSnapshot::default());
        for n in names {
            assert!(debug.contains(&format!("{n}: ")), "{n} is not a field");
        }
    }
}
