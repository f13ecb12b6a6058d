//! The configuration turned, once, into what each actor needs: session limits, router and
//! retained configs, the ACL. Shared read-only behind an `Arc`.

use std::sync::Arc;
use std::time::Duration;

use starling_auth::{Acl, Decision, PasswordFile};
use starling_codec::QoS;
use starling_config::{AclDefault, Config, DropPolicy, SharedStrategy as CfgStrategy};
use starling_router::{RetainedConfig, RouterConfig, SharedStrategy, TopicLimits};
use starling_session::{QueueFullPolicy, SessionLimits};

use crate::metrics::Metrics;
use crate::BrokerError;

/// Read-mostly broker state every actor may hold.
#[derive(Debug)]
pub(crate) struct Shared {
    pub config: Config,
    pub limits: Arc<SessionLimits>,
    pub topic_limits: TopicLimits,
    pub acl: Acl,
    pub passwords: Option<PasswordFile>,
    pub metrics: Metrics,
    /// `node.name`, for events.
    pub node: Arc<str>,
    /// `$SYS/brokers/{node}`.
    pub sys_prefix: String,
    /// Mailbox bound of a client actor, in messages: input batches from its socket and
    /// delivery batches from the router wait here before the session.
    pub client_mailbox: usize,
}

impl Shared {
    pub(crate) fn new(config: Config) -> Result<Arc<Self>, BrokerError> {
        let m = &config.mqtt;
        let limits = SessionLimits {
            inflight_max: m.max_inflight.max(1),
            receive_max: m.receive_max.max(1),
            mqueue_len_max: m.max_mqueue_len as usize,
            mqueue_policy: match m.mqueue_drop_policy {
                DropPolicy::DropOldestQos0First => QueueFullPolicy::DropOldestQos0,
                DropPolicy::DropNew => QueueFullPolicy::DropNew,
            },
            // Queued offline only where they are stored too (`storage.queue_qos0`).
            queue_qos0_offline: config.storage.enabled && config.storage.queue_qos0,
            // Publishes accepted but not yet routed are bounded by the router's mailbox:
            // that is what can reach a backlogged subscriber before its publishers stop.
            mqueue_held_slack: crate::ROUTER_MAILBOX,
            retry_interval: Some(Duration::from_secs(u64::from(m.retry_interval_secs.max(1)))),
            topic_alias_max: m.topic_alias_max,
            packet_size_max: m.max_packet_size,
            keepalive_secs_max: m.keepalive_max_secs,
            keepalive_secs_min: m.keepalive_min_secs,
            keepalive_zero_allowed: m.allow_zero_keepalive,
            session_expiry_secs_max: m.session_expiry_max_secs,
            message_expiry_max: Some(Duration::from_secs(u64::from(m.message_expiry_max_secs))),
            qos_max: QoS::from_u8(m.max_qos).unwrap_or(QoS::ExactlyOnce),
            retain_available: m.retain_available,
            wildcard_available: m.wildcard_subscription,
            subscription_ids_available: true,
            shared_available: m.shared_subscription,
            subscriptions_max: m.subscriptions_max as usize,
            client_id_len_max: usize::from(m.client_id_len_max),
            topic_len_max: usize::from(m.topic_len_max),
            topic_levels_max: usize::from(m.topic_levels_max),
            response_information: m.response_information.clone(),
            validate_utf8_payload: false,
        };
        let topic_limits = TopicLimits {
            topic_len_max: usize::from(m.topic_len_max),
            topic_levels_max: usize::from(m.topic_levels_max),
        };
        let default = match config.auth.acl_default {
            AclDefault::Allow => Decision::Allow,
            AclDefault::Deny => Decision::Deny,
        };
        let acl = match &config.auth.acl_file {
            Some(path) => Acl::load(path)?.with_default(default),
            None => Acl::empty(default),
        };
        let passwords = match &config.auth.password_file {
            Some(path) => Some(PasswordFile::load(path)?),
            None => None,
        };
        let sys_prefix = format!("$SYS/brokers/{}", config.node.name);
        let node = Arc::from(config.node.name.as_str());
        // Deliveries come in batches of at most `routing::BATCH_MAX`, so 64 messages hold up
        // to 4096 deliveries: a burst is absorbed while one slow subscriber still holds a
        // bounded number (what does not fit waits in the router, bounded by max_mqueue_len).
        let client_mailbox = 64;
        Ok(Arc::new(Self {
            config,
            limits: Arc::new(limits),
            topic_limits,
            acl,
            passwords,
            metrics: Metrics::default(),
            node,
            sys_prefix,
            client_mailbox,
        }))
    }

    pub(crate) fn router_config(&self, hash_seed: u64) -> RouterConfig {
        let m = &self.config.mqtt;
        RouterConfig {
            limits: self.topic_limits,
            // The per-client cap is the session's; the router's is a node-wide backstop.
            subscriptions_max: 10_000_000,
            shared_strategy: match m.shared_strategy {
                CfgStrategy::RoundRobin => SharedStrategy::RoundRobin,
                CfgStrategy::Random => SharedStrategy::Random,
                CfgStrategy::Sticky => SharedStrategy::Sticky,
                CfgStrategy::HashClientid => SharedStrategy::PublisherHash,
            },
            hash_seed,
        }
    }

    pub(crate) fn retained_config(&self, hash_seed: u64) -> RetainedConfig {
        let m = &self.config.mqtt;
        RetainedConfig {
            limits: self.topic_limits,
            retained_max: usize::try_from(m.retained_max).unwrap_or(usize::MAX),
            retained_bytes_max: usize::try_from(m.retained_bytes_max).unwrap_or(usize::MAX),
            hash_seed,
        }
    }
}
