//! The `$SYS` actor: publishes the broker's statistics under `$SYS/brokers/{node}/` every
//! `mqtt.sys_interval_secs` and once at start, retained so that a new subscriber sees the
//! latest values: one topic per figure, and all of them as JSON under `.../stats` and
//! `.../metrics`.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use starling_config::ListenerKind;
use starling_hooks::{About, Event, EventKind, EventMask, EventProvider, What};
use starling_net::ListenerCounters;
use starling_rt::{time, Actor, Ctx, TrySendError};

use crate::metrics::add;
use crate::msg::{sys_message, ClusterMsg, ClusterStatus, RouterMsg};
use crate::settings::Shared;
use crate::shards::Shards;

pub(crate) enum SysMsg {
    Tick,
}

pub(crate) struct SysActor {
    shared: Arc<Shared>,
    shards: Shards,
    started_at: time::Instant,
    /// Each listener's kind, bound port and transport counters.
    listeners: Vec<(ListenerKind, u16, Arc<ListenerCounters>)>,
    /// The cluster actor, when `cluster.enabled`: its view goes under `.../cluster/`.
    cluster: Option<starling_rt::Addr<ClusterMsg>>,
}

impl SysActor {
    pub(crate) fn new(
        shared: Arc<Shared>,
        shards: Shards,
        listeners: Vec<(ListenerKind, u16, Arc<ListenerCounters>)>,
        cluster: Option<starling_rt::Addr<ClusterMsg>>,
    ) -> Self {
        Self {
            shared,
            shards,
            started_at: time::now(),
            listeners,
            cluster,
        }
    }

    /// `.../cluster/...`: this node's role, the leader it follows, the term, its commit and
    /// applied indices, leader changes seen, the routes, and each member with its health
    /// (known on the leader: `up` or `down`; `unknown` elsewhere); all of it as JSON under
    /// `.../cluster`.
    async fn cluster(&self) {
        let Some(c) = &self.cluster else { return };
        let Ok(st) = c.ask(ClusterMsg::Status).await else {
            return;
        };
        let leader = st
            .leader
            .map_or_else(|| "none".to_owned(), |l| l.to_string());
        for (name, value) in [
            ("cluster/role", st.role.clone()),
            ("cluster/leader", leader),
            ("cluster/term", st.term.to_string()),
            ("cluster/commit", st.commit.to_string()),
            ("cluster/applied", st.applied.to_string()),
            ("cluster/leader_changes", st.leader_changes.to_string()),
            ("cluster/routes", st.routes.to_string()),
            ("cluster/members/count", st.members.len().to_string()),
        ] {
            self.publish(name, value).await;
        }
        for m in &st.members {
            self.publish(
                &format!("cluster/members/{}/health", m.id),
                health(m.active).to_owned(),
            )
            .await;
        }
        self.publish("cluster", cluster_json(&st)).await;
    }

    async fn publish(&self, name: &str, value: String) {
        let topic = format!("{}/{}", self.shared.sys_prefix, name);
        let msg = sys_message(topic, value, true);
        add(&self.shared.metrics.rmqtt.messages_publish_system, 1);
        let _ = self
            .shards
            .for_publish(&msg.topic)
            .send(RouterMsg::Publish(msg, None, None))
            .await;
    }

    async fn tick(&self) {
        let m = self.shared.metrics.snapshot();
        // The counts are the shards' gauges (each moves them at the end of a burst), the
        // same figures `GET /api/v1/stats` reads: no shard is asked.
        let g = &self.shared.metrics;
        let uptime = time::now().saturating_duration_since(self.started_at);
        let values = [
            ("version", env!("CARGO_PKG_VERSION").to_owned()),
            ("uptime", uptime.as_secs().to_string()),
            ("clients/connected", m.clients_connected.to_string()),
            ("messages/received", m.messages_received.to_string()),
            ("messages/sent", m.messages_sent.to_string()),
            ("bytes/received", m.bytes_received.to_string()),
            ("bytes/sent", m.bytes_sent.to_string()),
            ("messages/dropped", m.rmqtt.messages_dropped.to_string()),
            ("backpressure/holds", m.backpressure_holds.to_string()),
            ("backpressure/stalls", m.backpressure_stalls.to_string()),
            ("subscriptions/count", g.subscriptions.count().to_string()),
            ("retained/count", g.retained.count().to_string()),
            ("delayed/count", g.delayed.count().to_string()),
            ("store/commits", m.store_commits.to_string()),
            ("store/ops", m.store_ops.to_string()),
            ("store/cancelled", m.store_cancelled.to_string()),
            (
                "store/commit_us_mean",
                m.store_commit_us
                    .checked_div(m.store_commits)
                    .unwrap_or(0)
                    .to_string(),
            ),
            ("store/bytes", m.store_bytes.to_string()),
            ("store/sessions", m.store_sessions.to_string()),
            ("store/messages", m.store_messages.to_string()),
            ("store/refused", m.store_refused.to_string()),
            ("store/errors", m.store_errors.to_string()),
        ];
        for (name, value) in values {
            self.publish(name, value).await;
        }
        // The same figures as JSON objects, in the HTTP API's names (docs/http-api.md).
        let mut stats_json = String::from("{");
        for (i, (name, v)) in crate::stats::stats_of(&self.shared).pairs().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            let _ = write!(stats_json, "{sep}\"{name}\":{v}");
        }
        stats_json.push('}');
        self.publish("stats", stats_json).await;
        let fields: Vec<String> = m
            .every()
            .iter()
            .map(|(name, _, _, v)| format!("\"{}\":{v}", name.replace('_', ".")))
            .collect();
        self.publish("metrics", format!("{{{}}}", fields.join(",")))
            .await;
        self.cluster().await;
        for (kind, port, counters) in &self.listeners {
            let c = counters.snapshot();
            for (name, value) in [
                ("accepted", c.accepted),
                ("handshake_failed", c.handshake_failed),
                // Every connection that did not reach a complete CONNECT in time, whether
                // its transport handshake or its CONNECT was late.
                ("handshake_timed_out", c.timed_out + c.connect_timed_out),
                ("connect_timed_out", c.connect_timed_out),
            ] {
                self.publish(
                    &format!("listeners/{kind}/{port}/{name}"),
                    value.to_string(),
                )
                .await;
            }
        }
    }
}

impl Actor for SysActor {
    type Msg = SysMsg;

    async fn started(&mut self, ctx: &mut Ctx<Self>) {
        let secs = u64::from(self.shared.config.mqtt.sys_interval_secs.max(1));
        ctx.every(Duration::from_secs(secs), || SysMsg::Tick);
        // Publish once at start so the values exist before the first period ends.
        self.tick().await;
    }

    async fn handle(&mut self, msg: SysMsg, _ctx: &mut Ctx<Self>) {
        match msg {
            SysMsg::Tick => self.tick().await,
        }
    }
}

/// The built-in event provider: `$SYS/brokers/{node}/clients/{client_id}/connected` and
/// `.../disconnected`, published (QoS 0, not retained) as JSON in the form Mosquitto and
/// EMQX use.
pub(crate) struct SysEvents {
    shared: Arc<Shared>,
    shards: Shards,
}

impl SysEvents {
    pub(crate) fn new(shared: Arc<Shared>, shards: Shards) -> Self {
        Self { shared, shards }
    }
}

impl EventProvider for SysEvents {
    fn wants(&self) -> EventMask {
        EventMask::NONE
            .with(EventKind::ClientConnected)
            .with(EventKind::ClientDisconnected)
    }

    fn on_event(&self, e: &Event) {
        let id = &e.who.client_id;
        let what = match e.what {
            What::ClientConnected { .. } => "connected",
            _ => "disconnected",
        };
        let topic = format!("{}/clients/{}/{}", self.shared.sys_prefix, id, what);
        let mut payload = format!(
            "{{\"clientid\":\"{}\",\"ts\":{}",
            json_escape(id),
            time::unix_secs()
        );
        if let What::ClientConnected {
            peer,
            protocol,
            keep_alive,
            clean_start,
        } = &e.what
        {
            payload.push_str(&format!(
                ",\"username\":{},\"ipaddress\":\"{}\",\"proto_ver\":{},\"keepalive\":{},\"clean_start\":{}",
                e.who
                    .username
                    .as_deref()
                    .map_or("null".to_owned(), |u| format!("\"{}\"", json_escape(u))),
                peer.ip(),
                protocol.level(),
                keep_alive,
                clean_start
            ));
        }
        payload.push('}');
        let msg = sys_message(topic, payload, false);
        add(&self.shared.metrics.rmqtt.messages_publish_system, 1);
        // An event provider must not block: a full shard mailbox gets the event from a task
        // of its own (rare: connects and disconnects, not messages).
        let shard = self.shards.for_publish(&msg.topic);
        if let Err(TrySendError::Full(m)) = shard.try_send(RouterMsg::Publish(msg, None, None)) {
            let shard = shard.clone();
            starling_rt::spawn(async move {
                let _ = shard.send(m).await;
            });
        }
    }

    fn about(&self) -> About {
        About::named("starling-sys-events")
            .version(env!("CARGO_PKG_VERSION"))
            .descr(
                "Publishes $SYS/brokers/{node}/clients/{clientid}/connected and .../disconnected",
            )
    }
}

/// Escapes a string for a JSON string literal.
fn health(active: Option<bool>) -> &'static str {
    match active {
        Some(true) => "up",
        Some(false) => "down",
        None => "unknown",
    }
}

/// A node's cluster view as one JSON object (the shape of `GET /api/v1/cluster`, with each
/// member's health as a word).
fn cluster_json(st: &ClusterStatus) -> String {
    let opt = |v: Option<u64>| v.map_or_else(|| "null".to_owned(), |v| v.to_string());
    let members: Vec<String> = st
        .members
        .iter()
        .map(|m| {
            format!(
                "{{\"id\":{},\"voter\":{},\"health\":\"{}\",\"matched\":{},\"mqtt\":{}}}",
                m.id,
                m.voter,
                health(m.active),
                opt(m.matched),
                m.mqtt
                    .as_deref()
                    .map_or_else(|| "null".to_owned(), |a| format!("\"{}\"", json_escape(a))),
            )
        })
        .collect();
    format!(
        "{{\"node\":{},\"role\":\"{}\",\"leader\":{},\"term\":{},\"commit\":{},\"applied\":{},\"leader_changes\":{},\"routes\":{},\"routes_converged\":{},\"members\":[{}]}}",
        st.node,
        json_escape(&st.role),
        opt(st.leader),
        st.term,
        st.commit,
        st.applied,
        st.leader_changes,
        st.routes,
        st.routes_converged,
        members.join(",")
    )
}

fn json_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}
