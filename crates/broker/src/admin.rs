//! The operator's seam: what the HTTP API (and tools after it) ask of a running broker.
//! Every answer comes from the actors by message (the registry for who is there, each
//! client actor for what it is, the shards for routing state), never by reaching into
//! their state; the counters are the broker's metrics.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use starling_codec::{Properties, QoS, ReasonCode};
use starling_hooks::{About, Chain, HookKind};
use starling_router::{parse_subscription, validate_topic_filter, validate_topic_name};
use starling_rt::{time, Addr};
use starling_session::{Expiry, Message};
use thiserror::Error;

use crate::gate::is_reserved;
use crate::listing::INFO_WAIT;
use crate::metrics::{add, MetricsSnapshot};
use crate::msg::{
    ClientInfo, ClientMsg, ClientSubscriptions, ClusterMsg, ClusterStatus, LeftBehind, ListingMsg,
    MembershipError, NotConnected, RegistryMsg, RouterMsg,
};
use crate::settings::Shared;
use crate::shards::Shards;

/// How long an operator's subscribe or unsubscribe may take in the client actor: a
/// verdict's deadline and the shards' answers fit well within it.
const CHANGE_WAIT: Duration = Duration::from_secs(15);

/// Why an operator's request was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum AdminError {
    #[error("invalid topic: {0}")]
    Topic(String),
    #[error("topic {0:?} is reserved for the broker")]
    Reserved(String),
    #[error("the broker is stopping")]
    Stopping,
    #[error("no session for client {0:?}")]
    NoSession(String),
    #[error("client {0:?} is not connected")]
    NotConnected(String),
    #[error("client {0:?} did not answer in time")]
    Unanswered(String),
}

/// A message an operator publishes (`POST /api/v1/mqtt/publish`).
#[derive(Debug, Clone)]
pub struct AdminPublish {
    pub topic: String,
    pub payload: Bytes,
    pub qos: QoS,
    pub retain: bool,
    /// MQTT 5 Message Expiry Interval, seconds.
    pub expiry_secs: Option<u32>,
    /// Payload Format Indicator, Content Type, Response Topic, Correlation Data, User
    /// Properties, as subscribers get them.
    pub properties: Properties,
}

/// A handle on a running broker for its operator; cheap to clone, usable from any thread
/// of the runtime.
#[derive(Clone)]
pub struct Admin {
    shared: Arc<Shared>,
    registry: Addr<RegistryMsg>,
    listing: Addr<ListingMsg>,
    shards: Shards,
    started: SystemTime,
    cluster: Option<Addr<ClusterMsg>>,
    chain: Arc<Chain>,
}

/// A provider of the hook chain, as an operator sees it: RMQTT's plugin
/// (`GET /api/v1/plugins`). Every provider is fixed at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginInfo {
    pub about: About,
    /// The hooks it is on, in chain order.
    pub hooks: Vec<HookKind>,
}

impl Admin {
    pub(crate) fn new(
        shared: Arc<Shared>,
        registry: Addr<RegistryMsg>,
        listing: Addr<ListingMsg>,
        shards: Shards,
        cluster: Option<Addr<ClusterMsg>>,
        chain: Arc<Chain>,
    ) -> Self {
        Self {
            shared,
            registry,
            listing,
            shards,
            started: time::wall(),
            cluster,
            chain,
        }
    }

    /// This node's view of the cluster; `None` when `cluster.enabled` is false.
    ///
    /// # Errors
    /// [`AdminError::Stopping`] when the cluster actor no longer answers.
    pub async fn cluster_status(&self) -> Result<Option<ClusterStatus>, AdminError> {
        let Some(c) = &self.cluster else {
            return Ok(None);
        };
        c.ask(ClusterMsg::Status)
            .await
            .map(Some)
            .map_err(|_| AdminError::Stopping)
    }

    /// Whether this node runs in a cluster (`cluster.enabled`).
    pub fn is_clustered(&self) -> bool {
        self.cluster.is_some()
    }

    /// The replicated routes as this node applied them: each filter with the nodes that
    /// have subscribers for it, in filter order (empty without a cluster).
    pub async fn cluster_routes(&self) -> Vec<(String, Vec<u64>)> {
        match &self.cluster {
            Some(c) => c.ask(ClusterMsg::Routes).await.unwrap_or_default(),
            None => Vec::new(),
        }
    }

    /// Adds `node` to the cluster (`starling cluster join`): its record, then as a learner,
    /// then as a voter once it has caught up. Only the leader does it.
    ///
    /// # Errors
    /// [`MembershipError`]: not clustered, not the leader (with the leader to ask), a wrong
    /// request, or raft not carrying it out in time.
    pub async fn cluster_add_member(
        &self,
        node: u64,
        member: starling_cluster::Member,
    ) -> Result<(), MembershipError> {
        let Some(c) = &self.cluster else {
            return Err(MembershipError::NotClustered);
        };
        c.ask(|reply| ClusterMsg::AddMember {
            node,
            member,
            reply,
        })
        .await
        .unwrap_or_else(|_| Err(MembershipError::Failed("the broker is stopping".to_owned())))
    }

    /// Has this node leave the cluster (`starling cluster leave`): its clients are sent to
    /// the other nodes (0x9C Use another server) and given `drain` to take their sessions
    /// there, and the other nodes as long to take what it forwards or relays to them, then
    /// it leaves; once it has, the node stops ([`crate::Broker::left`]). Answers what it
    /// gave up when the drain time was over.
    ///
    /// # Errors
    /// As [`Admin::cluster_add_member`].
    pub async fn cluster_leave(&self, drain: Duration) -> Result<LeftBehind, MembershipError> {
        let Some(c) = &self.cluster else {
            return Err(MembershipError::NotClustered);
        };
        c.ask(|reply| ClusterMsg::Leave { drain, reply })
            .await
            .unwrap_or_else(|_| Err(MembershipError::Failed("the broker is stopping".to_owned())))
    }

    /// The hook chain's providers, each once (a provider on two hooks is one plugin), in
    /// chain order.
    pub fn plugins(&self) -> Vec<PluginInfo> {
        let mut out: Vec<PluginInfo> = Vec::new();
        for (hook, about) in self.chain.providers() {
            match out.iter_mut().find(|p| p.about.name == about.name) {
                Some(p) => p.hooks.push(hook),
                None => out.push(PluginInfo {
                    about,
                    hooks: vec![hook],
                }),
            }
        }
        out
    }

    /// `node.id`.
    pub fn node_id(&self) -> u64 {
        self.shared.config.node.id
    }

    /// `node.name`.
    pub fn node_name(&self) -> &str {
        &self.shared.config.node.name
    }

    /// When the broker started (wall clock).
    pub fn started(&self) -> SystemTime {
        self.started
    }

    pub fn metrics(&self) -> MetricsSnapshot {
        self.shared.metrics.snapshot()
    }

    /// The handshake and delivery latency histograms.
    pub fn latencies(&self) -> crate::Latencies {
        self.shared.metrics.latencies()
    }

    /// The state counts, from gauges (see `stats::stats_of`): no actor is asked.
    pub async fn stats(&self) -> crate::stats::BrokerStats {
        crate::stats::stats_of(&self.shared)
    }

    /// Every client (online or with a session kept), in no particular order: a list kept
    /// for up to `http.list_cache_ms` while no client came or went (listing.rs). A client
    /// that does not answer within 2 s is left out.
    pub async fn clients(&self) -> Arc<[ClientInfo]> {
        self.listing
            .ask(ListingMsg::Clients)
            .await
            .unwrap_or_else(|_| Arc::from([]))
    }

    /// One client, if the broker has a session for it.
    pub async fn client(&self, client_id: &str) -> Option<ClientInfo> {
        let addr = self.lookup(client_id).await?;
        time::timeout(INFO_WAIT, addr.ask(ClientMsg::Info))
            .await?
            .ok()
    }

    /// Discards a client's session (its connection closed with v5 DISCONNECT 0x98): what
    /// it was, or `None` if the broker had no session for it.
    pub async fn kick(&self, client_id: &str) -> Option<ClientInfo> {
        let addr = self.lookup(client_id).await?;
        addr.ask(ClientMsg::Kick).await.ok()
    }

    /// The subscriptions of every client that has one, kept as [`Admin::clients`] is.
    pub async fn subscriptions(&self) -> Arc<[ClientSubscriptions]> {
        self.listing
            .ask(ListingMsg::Subscriptions)
            .await
            .unwrap_or_else(|_| Arc::from([]))
    }

    /// One client's subscriptions, if the broker has a session for it.
    pub async fn client_subscriptions(&self, client_id: &str) -> Option<ClientSubscriptions> {
        let addr = self.lookup(client_id).await?;
        time::timeout(INFO_WAIT, addr.ask(ClientMsg::Subscriptions))
            .await?
            .ok()
    }

    /// Subscribes a connected client to `filters` (each may carry `$share/`,
    /// `$exclusive/` or `$limit/`) at `qos`, as its own SUBSCRIBE would, quota and
    /// authorization included, but with no SUBACK: per filter, in order, the QoS granted
    /// or the SUBACK code that refused it.
    ///
    /// # Errors
    /// [`AdminError::Topic`] for a filter that is not valid (nothing is subscribed then),
    /// [`AdminError::NoSession`], [`AdminError::NotConnected`], and
    /// [`AdminError::Unanswered`] when the client's actor took too long (the
    /// subscriptions may still be made).
    pub async fn subscribe(
        &self,
        client_id: &str,
        filters: Vec<String>,
        qos: QoS,
    ) -> Result<Vec<Result<QoS, ReasonCode>>, AdminError> {
        for f in &filters {
            parse_subscription(f, &self.shared.topic_limits)
                .map_err(|e| AdminError::Topic(format!("{f:?}: {e}")))?;
        }
        let addr = self.connected(client_id).await?;
        let answer = addr.ask(|reply| ClientMsg::Subscribe {
            filters,
            qos,
            reply,
        });
        self.changed(client_id, time::timeout(CHANGE_WAIT, answer).await)
    }

    /// Unsubscribes a connected client from `filters`, with no UNSUBACK: per filter, the
    /// code (0x11 No subscription existed when it had none).
    ///
    /// # Errors
    /// As [`Admin::subscribe`].
    pub async fn unsubscribe(
        &self,
        client_id: &str,
        filters: Vec<String>,
    ) -> Result<Vec<ReasonCode>, AdminError> {
        for f in &filters {
            parse_subscription(f, &self.shared.topic_limits)
                .map_err(|e| AdminError::Topic(format!("{f:?}: {e}")))?;
        }
        let addr = self.connected(client_id).await?;
        let answer = addr.ask(|reply| ClientMsg::Unsubscribe { filters, reply });
        self.changed(client_id, time::timeout(CHANGE_WAIT, answer).await)
    }

    async fn connected(&self, client_id: &str) -> Result<Addr<ClientMsg>, AdminError> {
        self.lookup(client_id)
            .await
            .ok_or_else(|| AdminError::NoSession(client_id.to_owned()))
    }

    /// A client actor's answer to a change: `None` past the wait, `Err` from a closed
    /// mailbox (the actor just retired: its session is gone).
    fn changed<T, E>(
        &self,
        client_id: &str,
        answer: Option<Result<Result<T, NotConnected>, E>>,
    ) -> Result<T, AdminError> {
        match answer {
            None => Err(AdminError::Unanswered(client_id.to_owned())),
            Some(Err(_)) => Err(AdminError::NoSession(client_id.to_owned())),
            Some(Ok(Err(NotConnected))) => Err(AdminError::NotConnected(client_id.to_owned())),
            Some(Ok(Ok(v))) => Ok(v),
        }
    }

    /// Retained messages whose topics match `filter`, in topic order, from `offset`, at
    /// most `limit`; and whether more follow.
    ///
    /// # Errors
    /// [`AdminError::Topic`] for a filter that is not a valid topic filter.
    pub async fn retained(
        &self,
        filter: &str,
        offset: usize,
        limit: usize,
    ) -> Result<(Vec<Arc<Message>>, bool), AdminError> {
        validate_topic_filter(filter, &self.shared.topic_limits)
            .map_err(|e| AdminError::Topic(e.to_string()))?;
        // Each shard sends its first offset + limit + 1: enough to cut the page and tell
        // whether more follow, whatever the shards' shares.
        let want = offset.saturating_add(limit).saturating_add(1);
        let mut all = Vec::new();
        for shard in self.shards.all() {
            let got = shard
                .ask(|reply| RouterMsg::Retained {
                    filter: filter.to_owned(),
                    limit: want,
                    reply,
                })
                .await;
            all.extend(got.unwrap_or_default());
        }
        all.sort_unstable_by(|a, b| a.topic.cmp(&b.topic));
        let more = all.len() > offset.saturating_add(limit);
        let page = all.into_iter().skip(offset).take(limit).collect();
        Ok((page, more))
    }

    /// Deletes the retained message of `topic`: false if there was none.
    ///
    /// # Errors
    /// As [`Admin::publish`], for a topic that is not a topic name or is reserved.
    pub async fn delete_retained(&self, topic: &str) -> Result<bool, AdminError> {
        validate_topic_name(topic, &self.shared.topic_limits)
            .map_err(|e| AdminError::Topic(e.to_string()))?;
        let (found, _) = self.retained(topic, 0, 1).await?;
        if found.is_empty() {
            return Ok(false);
        }
        self.publish(AdminPublish {
            topic: topic.to_owned(),
            payload: Bytes::new(),
            qos: QoS::AtMostOnce,
            retain: true,
            expiry_secs: None,
            properties: Properties::default(),
        })
        .await?;
        Ok(true)
    }

    async fn lookup(&self, client_id: &str) -> Option<Addr<ClientMsg>> {
        self.registry
            .ask(|reply| RegistryMsg::Client(Arc::from(client_id), reply))
            .await
            .ok()
            .flatten()
    }

    /// Publishes as the broker: routed like a client's publish (retained, `$delayed/`,
    /// shared groups), with no publisher to acknowledge.
    ///
    /// # Errors
    /// [`AdminError::Topic`] for a topic that is not a valid topic name,
    /// [`AdminError::Reserved`] for `$SYS` and the other `$` topics but `$delayed/`.
    pub async fn publish(&self, p: AdminPublish) -> Result<(), AdminError> {
        validate_topic_name(&p.topic, &self.shared.topic_limits)
            .map_err(|e| AdminError::Topic(e.to_string()))?;
        if is_reserved(&p.topic) {
            return Err(AdminError::Reserved(p.topic));
        }
        let expires_at = p
            .expiry_secs
            .map(|s| Expiry::announced(time::now() + Duration::from_secs(u64::from(s))));
        let msg = Arc::new(Message {
            topic: Arc::from(p.topic),
            payload: p.payload,
            qos: p.qos,
            retain: p.retain,
            properties: p.properties,
            expires_at,
            publisher: None,
            shared_headers: Default::default(),
            received_at: Some(time::now()),
        });
        self.shards
            .for_publish(&msg.topic)
            .send(RouterMsg::Publish(msg, None, None))
            .await
            .map_err(|_| AdminError::Stopping)?;
        add(&self.shared.metrics.rmqtt.messages_publish_admin, 1);
        Ok(())
    }
}
