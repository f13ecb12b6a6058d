//! The application message shared by every subscriber, and the options of the
//! subscription a delivery comes through.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use starling_codec::{Properties, QoS, SubscriptionOptions};

use crate::Instant;

/// An application message as routed: built once from a client's PUBLISH (or
/// a will, or by the broker) and shared by all subscribers as `Arc<Message>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The topic name (never empty: inbound aliases are already resolved).
    pub topic: Arc<str>,
    /// The payload, shared with the receive buffer.
    pub payload: Bytes,
    /// The QoS it was published with.
    pub qos: QoS,
    /// The RETAIN flag it was published with.
    pub retain: bool,
    /// The application properties of MQTT 5 (payload format, content type,
    /// response topic, correlation data, user properties), passed through to
    /// subscribers. Never holds a topic alias, subscription identifiers or a
    /// message expiry interval: those are per delivery, and expiry is
    /// `expires_at`.
    pub properties: Properties,
    /// When it expires (MQTT 5 §3.3.2.3.3); `None`: never.
    pub expires_at: Option<Expiry>,
    /// The client identifier of the publisher, for No Local; `None` for
    /// messages the broker itself publishes.
    pub publisher: Option<Arc<str>>,
    /// PUBLISH headers encoded once and shared by subscribers (start with
    /// `SharedHeaders::default()`).
    pub shared_headers: SharedHeaders,
    /// When this node made it (read its PUBLISH, published a will, took it from the HTTP
    /// API or from another node), for the broker's delivery latency. `None` where that
    /// moment means nothing on this node's clock: a message read back from the store or
    /// from a session state, or one the broker publishes itself.
    pub received_at: Option<Instant>,
}

/// When a message expires, and whether its subscribers are told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expiry {
    /// The deadline: past it the message is dropped rather than sent.
    pub at: Instant,
    /// The publisher set a Message Expiry Interval: deliveries carry what is
    /// left of it (MQTT 5 §3.3.2.3.3, [MQTT-3.3.2-6]). `false` for the broker's
    /// own bound on a message that has none (`message_expiry_max`): such a
    /// message goes out without the property, since for its subscribers it
    /// does not expire.
    pub announced: bool,
}

impl Expiry {
    /// A deadline the publisher set (and subscribers are told of).
    pub fn announced(at: Instant) -> Self {
        Self {
            at,
            announced: true,
        }
    }
}

/// The PUBLISH headers of one message's QoS 0 deliveries that need nothing
/// per subscriber (no topic alias, no expiry, no subscription identifier, no
/// RETAIN): index 0 for MQTT 3.x, 1 for MQTT 5. The first such delivery
/// encodes its header here, and every later one shares those bytes instead of
/// encoding its own. Not part of the message's value: it compares equal and
/// clones empty.
#[derive(Default)]
pub struct SharedHeaders([OnceLock<Bytes>; 2]);

impl SharedHeaders {
    pub(crate) fn slot(&self, v5: bool) -> &OnceLock<Bytes> {
        &self.0[usize::from(v5)]
    }
}

impl Clone for SharedHeaders {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl PartialEq for SharedHeaders {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for SharedHeaders {}

impl fmt::Debug for SharedHeaders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SharedHeaders")
    }
}

impl Message {
    /// True when the message expired at or before `now`.
    pub fn is_expired(&self, now: Instant) -> bool {
        self.expires_at.is_some_and(|e| e.at <= now)
    }

    /// The Message Expiry Interval to send at `now`: the seconds left,
    /// rounded up so that a live message never says 0 (MQTT 5 §3.3.2.3.3:
    /// the received value minus the time waited in the server). `None` for a
    /// message whose publisher set none, even when the broker bounds how long
    /// it keeps it.
    pub fn remaining_expiry_secs(&self, now: Instant) -> Option<u32> {
        self.expires_at.filter(|e| e.announced).map(|e| {
            let left = e.at.saturating_duration_since(now);
            let secs = left.as_secs() + u64::from(left.subsec_nanos() > 0);
            u32::try_from(secs).unwrap_or(u32::MAX)
        })
    }

    /// Application properties of a PUBLISH or a will, with the per-hop
    /// fields (topic alias, subscription identifiers, expiry, will delay)
    /// removed.
    pub(crate) fn application_properties(mut p: Properties) -> Properties {
        p.topic_alias = None;
        p.subscription_identifiers = Vec::new();
        p.message_expiry_interval = None;
        p.will_delay_interval = None;
        p
    }

    /// The expiry of a message received at `now` with this Message Expiry
    /// Interval, capped by the broker's `max`; without an interval, `max`
    /// alone bounds how long it is kept, unannounced.
    pub(crate) fn deadline(
        now: Instant,
        interval_secs: Option<u32>,
        max: Option<Duration>,
    ) -> Option<Expiry> {
        let asked = interval_secs.map(|s| Duration::from_secs(u64::from(s)));
        let d = match (asked, max) {
            (Some(a), Some(m)) => Some(a.min(m)),
            (a, m) => a.or(m),
        }?;
        // An instant past the clock's range means "never" in practice.
        now.checked_add(d).map(|at| Expiry {
            at,
            announced: asked.is_some(),
        })
    }
}

/// How one delivery reaches a session: the options of the matching
/// subscription, or of the subscribe that found a retained message.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeliveryOptions {
    /// The subscription's maximum QoS; the message goes out at
    /// `min(message qos, this)` (MQTT 5 §3.8.4).
    pub qos: QoS,
    /// No Local: skip messages this client published (MQTT 5 §3.8.3.1).
    pub no_local: bool,
    /// Retain As Published: keep the RETAIN flag on normal delivery;
    /// otherwise it is cleared (MQTT 5 §3.3.1.3).
    pub retain_as_published: bool,
    /// Subscription Identifiers of the matching subscriptions (MQTT 5
    /// §3.3.4), in the order to send them. Sent to MQTT 5 clients only.
    pub subscription_ids: SubscriptionIds,
    /// True when the broker sends a retained message because of a new
    /// SUBSCRIBE: RETAIN stays 1 whatever `retain_as_published` says
    /// (MQTT 5 §3.3.1.3).
    pub from_retained: bool,
    /// The message's publisher is being held back for this session (broker back-pressure):
    /// it was read and acknowledged before the hold reached it, so a full queue keeps it
    /// rather than dropping it, up to [`SessionLimits::mqueue_len_hard`](crate::SessionLimits::mqueue_len_hard).
    pub held_back: bool,
    /// The key of this delivery's record in the broker's store, when it is stored (a QoS 1/2
    /// delivery to a session that outlives its connection): the session then reports each
    /// change of it as an [`Effect::Store`](crate::Effect::Store).
    pub stored: StoreKey,
}

/// The Subscription Identifiers of one delivery, in one word: none (the common case) costs
/// no allocation. With [`StoreKey`], it keeps [`DeliveryOptions`] at 24 bytes and a pending
/// delivery with its message at 32, two to a cache line: a fan-out appends one to each
/// subscriber's list per publish, and the lists' size is what it touches.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SubscriptionIds(thin_vec::ThinVec<u32>);

impl SubscriptionIds {
    /// Appends another delivery's, in their order.
    pub fn append(&mut self, other: SubscriptionIds) {
        if self.0.is_empty() {
            self.0 = other.0;
        } else {
            self.0.extend(other.0);
        }
    }
}

impl std::ops::Deref for SubscriptionIds {
    type Target = [u32];

    fn deref(&self) -> &[u32] {
        &self.0
    }
}

impl fmt::Debug for SubscriptionIds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl FromIterator<u32> for SubscriptionIds {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl<const N: usize> From<[u32; N]> for SubscriptionIds {
    fn from(ids: [u32; N]) -> Self {
        ids.into_iter().collect()
    }
}

/// The key of a delivery's record in the broker's store, if it has one: a `u64` with no
/// room lost to an `Option`'s tag (see [`SubscriptionIds`]). Keys are a shard's sequence
/// numbers, which never reach `u64::MAX`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct StoreKey(u64);

impl StoreKey {
    /// No record.
    pub const NONE: StoreKey = StoreKey(u64::MAX);

    /// The record `seq`.
    pub fn new(seq: u64) -> Self {
        assert_ne!(seq, u64::MAX, "a store key out of range");
        StoreKey(seq)
    }

    /// The record's key, if there is one.
    pub fn get(self) -> Option<u64> {
        (self.0 != u64::MAX).then_some(self.0)
    }
}

impl Default for StoreKey {
    fn default() -> Self {
        Self::NONE
    }
}

impl From<Option<u64>> for StoreKey {
    fn from(seq: Option<u64>) -> Self {
        seq.map_or(Self::NONE, Self::new)
    }
}

impl fmt::Debug for StoreKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.get().fmt(f)
    }
}

impl DeliveryOptions {
    /// Options for normal delivery through a subscription.
    pub fn subscription(options: &SubscriptionOptions, subscription_id: Option<u32>) -> Self {
        Self {
            qos: options.qos,
            no_local: options.no_local,
            retain_as_published: options.retain_as_published,
            subscription_ids: subscription_id.into_iter().collect(),
            from_retained: false,
            held_back: false,
            stored: StoreKey::NONE,
        }
    }

    /// Folds in the options of another subscription of this session that matched the same
    /// publish, for one copy (MQTT 5 §3.3.4): the highest QoS, every Subscription
    /// Identifier, No Local only if both say so, Retain As Published if either does.
    pub fn merge(&mut self, other: DeliveryOptions) {
        self.qos = self.qos.max(other.qos);
        self.no_local &= other.no_local;
        self.retain_as_published |= other.retain_as_published;
        self.subscription_ids.append(other.subscription_ids);
        self.from_retained &= other.from_retained;
        self.held_back |= other.held_back;
    }

    /// Options for a retained message sent in answer to a SUBSCRIBE.
    pub fn retained(options: &SubscriptionOptions, subscription_id: Option<u32>) -> Self {
        Self {
            from_retained: true,
            ..Self::subscription(options, subscription_id)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_options_take_the_highest_qos_and_every_identifier() {
        let mut a = DeliveryOptions {
            qos: QoS::AtMostOnce,
            no_local: true,
            subscription_ids: [1].into(),
            ..DeliveryOptions::default()
        };
        a.merge(DeliveryOptions {
            qos: QoS::ExactlyOnce,
            no_local: false,
            retain_as_published: true,
            subscription_ids: [7].into(),
            ..DeliveryOptions::default()
        });
        assert_eq!(a.qos, QoS::ExactlyOnce);
        assert!(!a.no_local && a.retain_as_published);
        assert_eq!(*a.subscription_ids, [1, 7]);
    }

    #[test]
    #[cfg(target_pointer_width = "64")]
    fn a_pending_delivery_is_half_a_cache_line() {
        assert_eq!(std::mem::size_of::<(Arc<Message>, DeliveryOptions)>(), 32);
    }
}
