//! The broker's session configuration, validated once, and the CONNECT checks
//! that decide between a session and a refusing CONNACK.

use std::time::Duration;

use starling_codec::{Connack, Connect, PayloadFormat, Properties, Protocol, QoS, ReasonCode};

/// What to do when a message arrives for a full queue (MQTT 5 §4.9 leaves
/// the choice to the server). Every drop is reported as
/// [`Effect::Dropped`](crate::Effect::Dropped) with
/// [`DropReason::QueueFull`](crate::DropReason::QueueFull).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueFullPolicy {
    /// Refuse the arriving message; the queue keeps what it has.
    DropNew,
    /// Evict the oldest queued QoS 0 message to make room; if the queue
    /// holds none, refuse the arriving message. QoS 0 promised nothing, so it
    /// goes first.
    #[default]
    DropOldestQos0,
    /// Evict the oldest queued message whatever its QoS (freshest data wins).
    DropOldest,
}

impl QueueFullPolicy {
    /// The one coding of the policy, for the session's queue and for every list of
    /// deliveries held in front of it (the broker's router keeps one per subscriber): which
    /// entry of a full queue of `len` to evict for a new message, or `None` to refuse the
    /// new one. `queued_qos0` is how many entries are QoS 0 deliveries and `first_qos0`
    /// finds the oldest of them (asked only when there is one).
    pub fn victim(
        self,
        len: usize,
        queued_qos0: usize,
        first_qos0: impl FnOnce() -> Option<usize>,
    ) -> Option<usize> {
        match self {
            QueueFullPolicy::DropNew => None,
            QueueFullPolicy::DropOldestQos0 if queued_qos0 == 0 => None,
            QueueFullPolicy::DropOldestQos0 => first_qos0(),
            QueueFullPolicy::DropOldest => (len > 0).then_some(0),
        }
    }
}

/// Per-session limits and features, from the broker configuration.
///
/// Every field is a finite value; where a feature can be off it is an
/// `Option` or a `bool`, never a magic 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionLimits {
    /// Our cap on outbound QoS 1/2 messages awaiting acknowledgement. The
    /// window of a connection is `min(inflight_max, client's Receive
    /// Maximum)`. At least 1.
    pub inflight_max: u16,
    /// The Receive Maximum we announce: inbound QoS 2 messages the client
    /// may have unreleased at once (MQTT 5 §3.2.2.3.3). At least 1. QoS 1
    /// messages are acknowledged at once and never accumulate.
    pub receive_max: u16,
    /// Cap on messages waiting for the window or for the client to come back.
    pub mqueue_len_max: usize,
    /// What a full queue does.
    pub mqueue_policy: QueueFullPolicy,
    /// Queue QoS 0 messages for a disconnected persistent session (MQTT 5
    /// §3.1.2.4 makes this optional).
    pub queue_qos0_offline: bool,
    /// Room past twice `mqueue_len_max` for messages whose publisher is held back (see
    /// [`Self::mqueue_len_hard`]): what can be on its way before the hold takes effect (a
    /// broker sets its router's mailbox bound). Default 0.
    pub mqueue_held_slack: usize,
    /// MQTT 3.x only: resend unacknowledged messages after this long while
    /// connected. `None`: only on reconnect. Never used for MQTT 5, which
    /// forbids resending except on reconnect (MQTT 5 §4.4).
    pub retry_interval: Option<Duration>,
    /// The Topic Alias Maximum we announce (inbound aliases), 0 = none.
    pub topic_alias_max: u16,
    /// Our Maximum Packet Size, as announced in CONNACK. The connection's
    /// decoder enforces it; the session only announces it.
    pub packet_size_max: u32,
    /// Largest keep alive we accept, in seconds; larger requests from MQTT 5
    /// clients are lowered with Server Keep Alive (MQTT 5 §3.2.2.3.14).
    pub keepalive_secs_max: u16,
    /// Smallest non-zero keep alive we accept, in seconds; smaller requests from MQTT 5
    /// clients are raised with Server Keep Alive. MQTT 3.x has no way to tell the client,
    /// so its own value stands there.
    pub keepalive_secs_min: u16,
    /// Whether a client may switch keep alive off (0). If not, a 0 request
    /// becomes `keepalive_secs_max`.
    pub keepalive_zero_allowed: bool,
    /// Cap on the session expiry interval, in seconds; `u32::MAX` allows
    /// sessions that never expire (MQTT 5 §3.1.2.11.2). MQTT 3.x sessions
    /// with Clean Session 0 get this value.
    pub session_expiry_secs_max: u32,
    /// Cap on message expiry. Also bounds how long a message without one is
    /// kept (queued, in flight, retained), so that nothing waits forever; such
    /// a message is still forwarded without a Message Expiry Interval (MQTT 5
    /// §3.3.2.3.3: absent means it does not expire). A publisher's interval
    /// above the cap is forwarded as the cap. `None`: only the publisher's.
    pub message_expiry_max: Option<Duration>,
    /// Maximum QoS we accept and grant (MQTT 5 §3.2.2.3.4).
    pub qos_max: QoS,
    /// Retained messages supported (MQTT 5 §3.2.2.3.5).
    pub retain_available: bool,
    /// Wildcard subscriptions supported.
    pub wildcard_available: bool,
    /// Subscription identifiers supported.
    pub subscription_ids_available: bool,
    /// Shared subscriptions supported.
    pub shared_available: bool,
    /// Cap on subscriptions of one session; past it SUBACK says 0x97.
    pub subscriptions_max: usize,
    /// Longest client identifier we accept, in bytes.
    pub client_id_len_max: usize,
    /// Longest topic name a client may publish to (or name as its will), in
    /// bytes; past it: DISCONNECT 0x90 (will: CONNACK 0x90).
    pub topic_len_max: usize,
    /// Most `/`-separated levels of a topic name a client may publish to (or
    /// name as its will); past it, as for `topic_len_max`.
    pub topic_levels_max: usize,
    /// Response Information for clients that request it (MQTT 5
    /// §3.1.2.11.7); `None` sends none.
    pub response_information: Option<String>,
    /// Check that payloads marked UTF-8 (Payload Format Indicator 1) are
    /// UTF-8 (MQTT 5 §3.3.2.3.2 allows it).
    pub validate_utf8_payload: bool,
}

impl SessionLimits {
    /// Messages waiting for a session (queued, or on their way to it) from which the
    /// publishers feeding it are held back: half the queue bound, so that what they send
    /// before the word reaches them still fits.
    pub fn backlog_high(&self) -> usize {
        (self.mqueue_len_max / 2).max(1)
    }

    /// The queue bound for messages whose publisher is held back (see
    /// [`DeliveryOptions::held_back`](crate::DeliveryOptions::held_back)): twice
    /// `mqueue_len_max` and `mqueue_held_slack`, room for what publishers sent before the
    /// hold reached them.
    pub fn mqueue_len_hard(&self) -> usize {
        self.mqueue_len_max
            .saturating_mul(2)
            .saturating_add(self.mqueue_held_slack)
    }

    /// Whether a topic name is within `topic_len_max` and `topic_levels_max`.
    pub fn topic_allowed(&self, topic: &str) -> bool {
        self.topic_excess(topic).is_none()
    }

    /// Which topic limit `topic` exceeds, if any.
    pub(crate) fn topic_excess(&self, topic: &str) -> Option<crate::SessionError> {
        if topic.len() > self.topic_len_max {
            return Some(crate::SessionError::TopicTooLong {
                len: topic.len(),
                max: self.topic_len_max,
            });
        }
        // Counted only when it could matter: a topic of n bytes has at most n + 1 levels.
        if topic.len() >= self.topic_levels_max {
            let levels = topic.bytes().filter(|&b| b == b'/').count() + 1;
            if levels > self.topic_levels_max {
                return Some(crate::SessionError::TopicTooManyLevels {
                    levels,
                    max: self.topic_levels_max,
                });
            }
        }
        None
    }

    /// Messages waiting below which held-back publishers are let go again: a quarter of the
    /// queue bound, so that they resume in bursts rather than one message at a time.
    pub fn backlog_low(&self) -> usize {
        self.mqueue_len_max / 4
    }
}

impl Default for SessionLimits {
    /// The broker defaults of issue 3: 16 inflight, 1000 queued, 1 MiB packets.
    fn default() -> Self {
        Self {
            inflight_max: 16,
            receive_max: 128,
            mqueue_len_max: 1000,
            mqueue_policy: QueueFullPolicy::default(),
            queue_qos0_offline: false,
            mqueue_held_slack: 0,
            retry_interval: Some(Duration::from_secs(30)),
            topic_alias_max: 64,
            packet_size_max: 1 << 20,
            keepalive_secs_max: 65535,
            keepalive_secs_min: 0,
            keepalive_zero_allowed: true,
            session_expiry_secs_max: 2 * 60 * 60,
            message_expiry_max: None,
            qos_max: QoS::ExactlyOnce,
            retain_available: true,
            wildcard_available: true,
            subscription_ids_available: true,
            shared_available: true,
            subscriptions_max: 1000,
            client_id_len_max: 65535,
            topic_len_max: 65535,
            topic_levels_max: 128,
            response_information: None,
            validate_utf8_payload: false,
        }
    }
}

/// What [`check_connect`] found acceptable about a CONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientIdentity {
    /// The client named itself; use `connect.client_id`.
    Given,
    /// The client sent an empty identifier: the broker assigns one (from the
    /// runtime's rng) and passes it to [`Session::new`](crate::Session::new);
    /// the session announces it in CONNACK (MQTT 5 §3.2.2.3.7).
    MustAssign,
}

/// Checks a CONNECT before any session is looked up or taken over.
///
/// Call it after authentication and before [`Session::attach`](crate::Session::attach); on `Err`,
/// send [`refusal`]`(code)` and close the connection (MQTT 5 §3.2.2.2: a
/// refusing CONNACK has Session Present 0 and nothing else is sent).
///
/// Refuses: an empty client identifier where the version does not allow one
/// (3.1 always, 3.1.1 with Clean Session 0: MQTT 3.1.1 §3.1.3.1) and one
/// longer than `client_id_len_max` (0x85); an MQTT 5 will with a QoS above
/// `qos_max` (0x9B, MQTT 5 §3.2.2.3.4) or with retain when retain is not
/// available (0x9A, §3.2.2.3.5); a will payload marked UTF-8 that is not,
/// when validation is on (0x99); a will topic past `topic_len_max` or
/// `topic_levels_max` (0x90, which MQTT 5 §3.2.2.2 lists for "the Will Topic
/// Name is not malformed, but is not accepted by this Server"; a 3.x client
/// reads 0x03 Server unavailable, the codec's mapping for codes 3.x lacks, as
/// 3.x has no code for it and a will the client asked for cannot be dropped
/// silently); enhanced authentication (0x8C), which the session does not
/// implement.
pub fn check_connect(
    connect: &Connect,
    limits: &SessionLimits,
) -> Result<ClientIdentity, ReasonCode> {
    let v5 = connect.protocol.is_v5();
    let identity = if connect.client_id.is_empty() {
        match connect.protocol {
            Protocol::V5 => ClientIdentity::MustAssign,
            Protocol::V3_1_1 if connect.clean_start => ClientIdentity::MustAssign,
            _ => return Err(ReasonCode::ClientIdentifierNotValid),
        }
    } else if connect.client_id.len() > limits.client_id_len_max {
        return Err(ReasonCode::ClientIdentifierNotValid);
    } else {
        ClientIdentity::Given
    };
    if connect.properties.authentication_method.is_some() {
        return Err(ReasonCode::BadAuthenticationMethod);
    }
    if let Some(will) = &connect.will {
        if !limits.topic_allowed(&will.topic) {
            return Err(ReasonCode::TopicNameInvalid);
        }
        // MQTT 3.x has no way to refuse these: the will is downgraded instead
        // when it is published.
        if v5 && will.qos > limits.qos_max {
            return Err(ReasonCode::QoSNotSupported);
        }
        if v5 && will.retain && !limits.retain_available {
            return Err(ReasonCode::RetainNotSupported);
        }
        if limits.validate_utf8_payload
            && will.properties.payload_format_indicator == Some(PayloadFormat::Utf8)
            && std::str::from_utf8(&will.payload).is_err()
        {
            return Err(ReasonCode::PayloadFormatInvalid);
        }
    }
    Ok(identity)
}

/// A CONNACK refusing the connection with `code` (Session Present 0). The
/// codec maps the code to a 3.x return code for older clients.
pub fn refusal(code: ReasonCode) -> Connack {
    Connack {
        session_present: false,
        reason_code: code,
        properties: Properties::default(),
    }
}

#[cfg(test)]
mod policy_tests {
    use super::QueueFullPolicy::{self, *};

    /// A queue of QoS flags (true: QoS 0) after a new entry arrives at a full one.
    fn after(policy: QueueFullPolicy, mut q: Vec<bool>, new: bool) -> Vec<bool> {
        let qos0 = q.iter().filter(|&&z| z).count();
        let at = policy.victim(q.len(), qos0, || q.iter().position(|&z| z));
        if let Some(i) = at {
            q.remove(i);
            q.push(new);
        }
        q
    }

    #[test]
    fn each_policy_picks_its_victim() {
        let q = vec![false, true, false];
        assert_eq!(after(DropNew, q.clone(), true), q);
        assert_eq!(
            after(DropOldestQos0, q.clone(), false),
            [false, false, false]
        );
        // A new QoS 0 message also evicts the oldest QoS 0: the freshest wins.
        assert_eq!(after(DropOldestQos0, q.clone(), true), [false, false, true]);
        assert_eq!(after(DropOldestQos0, vec![false; 2], true), [false; 2]);
        assert_eq!(after(DropOldest, q, true), [true, false, true]);
        assert_eq!(after(DropOldest, Vec::new(), true), Vec::<bool>::new());
    }
}
