//! The broker's state counts (RMQTT's stats: connections, sessions, queues, in-flight
//! messages, routes...), read from gauges the actors move where the state changes.

use std::sync::atomic::Ordering::Relaxed;

use crate::settings::Shared;

/// A state count and its high-water mark since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Level {
    pub count: u64,
    pub max: u64,
}

/// Counts of the broker's state (`GET /api/v1/stats`), each with its high-water mark.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BrokerStats {
    /// Clients with a connection.
    pub connections: Level,
    /// Connections accepted whose CONNECT the registry has not taken yet (transport
    /// handshake, CONNECT read, authentication).
    pub handshakings: Level,
    /// Among `handshakings`, those whose CONNECT was read and is being decided
    /// (authentication, the session limits).
    pub handshakings_active: Level,
    /// CONNACKs written (accepted or refused) in the last whole second; the mark is the
    /// busiest second's.
    pub handshakings_rate: Level,
    /// Sessions, connected or not.
    pub sessions: Level,
    pub subscriptions: Level,
    /// `$share/` and `$queue/` subscriptions, among `subscriptions`.
    pub subscriptions_shared: Level,
    pub retained: Level,
    pub delayed: Level,
    /// Distinct topic filters subscribed on the node (prefixes stripped).
    pub topics: Level,
    /// Topic filter → node relations: with one node, `topics`; in a cluster, the
    /// replicated routes' (filter, node) pairs.
    pub routes: Level,
    /// Messages queued in sessions, for the window or for the client's return.
    pub message_queues: Level,
    /// Outbound QoS 1/2 messages awaiting the client's acknowledgement.
    pub out_inflights: Level,
    /// Inbound QoS 2 messages awaiting the client's PUBREL.
    pub in_inflights: Level,
    /// Messages forwarded to other nodes and not acknowledged yet, or waiting to be sent.
    pub forwards: Level,
    /// Messages held in the store for persistent sessions (queued or in flight).
    pub message_storages: Level,
}

/// One of [`BrokerStats`]' counts, as the API and `$SYS` name it.
#[derive(Debug, Clone, Copy)]
pub struct StatLevel {
    /// RMQTT's stats name: `{name}.count` and `{name}.max`.
    pub name: &'static str,
    /// The Prometheus gauge's stem (`starling_{stem}`, `starling_{stem}_max`).
    pub stem: &'static str,
    pub help: &'static str,
    /// The count is already a gauge among the metrics (under another name): only its
    /// mark is exposed here.
    pub count_elsewhere: bool,
    pub level: Level,
}

impl BrokerStats {
    /// Every count, in the order the API lists them.
    pub fn levels(&self) -> [StatLevel; 16] {
        let l = |name, stem, help, count_elsewhere, level| StatLevel {
            name,
            stem,
            help,
            count_elsewhere,
            level,
        };
        [
            l(
                "connections",
                "connections",
                "Clients connected",
                true,
                self.connections,
            ),
            l(
                "handshakings",
                "handshakings",
                "Connections accepted and not past their CONNECT yet",
                false,
                self.handshakings,
            ),
            l(
                "handshakings_active",
                "handshakings_active",
                "Connections whose CONNECT is being authenticated and checked",
                false,
                self.handshakings_active,
            ),
            l(
                "handshakings_rate",
                "handshakings_rate",
                "Handshakes ended by a CONNACK in the last whole second",
                false,
                self.handshakings_rate,
            ),
            l(
                "sessions",
                "sessions",
                "Sessions, connected or not",
                false,
                self.sessions,
            ),
            l(
                "subscriptions",
                "subscriptions",
                "Subscriptions",
                false,
                self.subscriptions,
            ),
            l(
                "subscriptions_shared",
                "subscriptions_shared",
                "Shared subscriptions",
                false,
                self.subscriptions_shared,
            ),
            l(
                "retaineds",
                "retained",
                "Retained messages",
                false,
                self.retained,
            ),
            l(
                "delayed_publishs",
                "delayed",
                "Delayed publishes waiting",
                false,
                self.delayed,
            ),
            l(
                "topics",
                "topics",
                "Distinct topic filters subscribed",
                false,
                self.topics,
            ),
            l(
                "routes",
                "routes",
                "Topic filter to node relations routed by",
                false,
                self.routes,
            ),
            l(
                "message_queues",
                "message_queues",
                "Messages queued in sessions",
                false,
                self.message_queues,
            ),
            l(
                "out_inflights",
                "out_inflights",
                "Outbound QoS 1/2 messages awaiting acknowledgement",
                false,
                self.out_inflights,
            ),
            l(
                "in_inflights",
                "in_inflights",
                "Inbound QoS 2 messages awaiting PUBREL",
                false,
                self.in_inflights,
            ),
            l(
                "forwards",
                "forwards",
                "Messages forwarded to other nodes and not acknowledged yet",
                false,
                self.forwards,
            ),
            l(
                "message_storages",
                "message_storages",
                "Messages held in the store for persistent sessions",
                true,
                self.message_storages,
            ),
        ]
    }

    /// The counts as RMQTT's stats object's members, in order: `{name}.count`,
    /// `{name}.max`.
    pub fn pairs(&self) -> impl Iterator<Item = (String, u64)> {
        self.levels().into_iter().flat_map(|s| {
            [
                (format!("{}.count", s.name), s.level.count),
                (format!("{}.max", s.name), s.level.max),
            ]
        })
    }
}

/// The state counts now: gauges the actors move where the state changes, so that no
/// actor is asked (the router's trail a change by a shard's burst, the sessions' by a
/// client's turn).
pub(crate) fn stats_of(shared: &Shared) -> BrokerStats {
    let m = &shared.metrics;
    let a = |c: &std::sync::atomic::AtomicU64, max: &std::sync::atomic::AtomicU64| Level {
        count: c.load(Relaxed),
        max: max.load(Relaxed),
    };
    let g = |g: &crate::metrics::Gauge| Level {
        count: g.count(),
        max: g.max(),
    };
    let topics = g(&m.topics);
    BrokerStats {
        connections: a(&m.clients_connected, &m.clients_connected_max),
        handshakings: g(&m.handshakings),
        handshakings_active: g(&m.handshakings_active),
        handshakings_rate: {
            let (count, max) = m.handshakings_rate.read(starling_rt::time::unix_secs());
            Level { count, max }
        },
        sessions: a(&m.sessions, &m.sessions_max),
        subscriptions: g(&m.subscriptions),
        subscriptions_shared: g(&m.subscriptions_shared),
        retained: g(&m.retained),
        delayed: g(&m.delayed),
        topics,
        routes: if shared.config.cluster.enabled {
            g(&m.routes)
        } else {
            topics
        },
        message_queues: g(&m.message_queues),
        out_inflights: g(&m.out_inflights),
        in_inflights: g(&m.in_inflights),
        forwards: g(&m.forwards),
        message_storages: a(&m.store_messages, &m.store_messages_max),
    }
}
