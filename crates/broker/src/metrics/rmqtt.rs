//! RMQTT's own metric names (`client.connect`, `messages.publish`, ...), for operators and
//! scripts that read RMQTT's `/api/v1/metrics`: what RMQTT counts with its counter plugin,
//! counted here at the broker's own event points (listener, client actor, gate, router
//! shard) with relaxed atomics, never more than one add per publish.
//!
//! A figure that another one already counts is computed when the snapshot is read rather
//! than counted twice: `messages.publish.custom` is `messages_received`,
//! `messages.delivered` is `messages_sent`, `messages.dropped` the sum of the `dropped_*`
//! counters, `client.publish.check.acl` the publishes allowed plus those denied, and
//! `messages.publish` the sum of its four sources. docs/http-api.md says what each counts.

use std::sync::atomic::{AtomicU64, Ordering};

use starling_codec::ReasonCode;

use super::MetricsSnapshot;

/// One table makes the live counters, their snapshot and the list of names with their
/// help: a name added to one cannot be missing from the others. `counted` are atomics
/// bumped where the event happens; `computed` are filled from the other figures by
/// [`RmqttSnapshot::computed`].
macro_rules! rmqtt_metrics {
    (
        counted { $($c:ident => $c_help:literal,)* }
        computed { $($d:ident => $d_help:literal,)* }
    ) => {
        /// The live counters (field names are RMQTT's names with `_` for `.`).
        #[derive(Debug, Default)]
        pub(crate) struct RmqttCounters {
            $(pub $c: AtomicU64,)*
        }

        /// RMQTT's metrics at one moment, each read on its own; the field names are
        /// RMQTT's with `_` for `.` (`client_connack_auth_error` is
        /// `client.connack.auth.error`).
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct RmqttSnapshot {
            $(#[doc = $c_help] pub $c: u64,)*
            $(#[doc = $d_help] pub $d: u64,)*
        }

        impl RmqttCounters {
            /// The counted figures; the computed ones are 0 until
            /// [`RmqttSnapshot::computed`].
            pub(crate) fn read(&self) -> RmqttSnapshot {
                RmqttSnapshot {
                    $($c: self.$c.load(Ordering::Relaxed),)*
                    $($d: 0,)*
                }
            }
        }

        impl RmqttSnapshot {
            /// Every figure with its name (the field's) and what it counts.
            pub fn named(&self) -> Vec<(&'static str, &'static str, u64)> {
                vec![
                    $((stringify!($c), $c_help, self.$c),)*
                    $((stringify!($d), $d_help, self.$d),)*
                ]
            }

            /// What each figure grew by since `earlier` (a snapshot taken before this one),
            /// for rates and tests.
            pub fn since(&self, earlier: &Self) -> Self {
                Self {
                    $($c: self.$c.saturating_sub(earlier.$c),)*
                    $($d: self.$d.saturating_sub(earlier.$d),)*
                }
            }
        }
    };
}

rmqtt_metrics! {
    counted {
        client_connect => "CONNECT packets received (decoded)",
        client_connack => "CONNACKs sent in answer to a CONNECT, any code",
        client_connack_error => "CONNACKs sent with a failure code",
        client_connack_auth_error => "CONNACKs refusing bad credentials or not authorized",
        client_authenticate => "CONNECTs authenticated (credentials or certificate checked)",
        client_auth_anonymous => "CONNECTs without a username",
        client_auth_anonymous_error => "CONNECTs without a username refused by authentication",
        client_connected => "Connections that got a session",
        client_disconnected => "Connections with a session that closed",
        client_handshaking_timeout => "Connections that sent no complete CONNECT in time",
        client_subscribe => "Topic filters to subscribe to, from clients and operators",
        client_subscribe_auth_error => "Topic filters refused by authorization",
        client_subscribe_error => "Topic filters refused for another reason",
        client_subscribe_check_acl => "Authorization checks of topic filters",
        client_unsubscribe => "Topic filters to unsubscribe from, from clients and operators",
        client_publish_auth_error => "Client publishes denied by authorization",
        client_publish_error => "Client publishes refused (denied, reserved topic, bad payload)",
        session_created => "Sessions created",
        session_resumed => "Sessions resumed by a new connection",
        session_subscribed => "Subscriptions installed",
        session_unsubscribed => "Subscriptions removed by an unsubscribe",
        session_terminated => "Sessions ended",
        messages_publish_admin => "Messages published through the HTTP API",
        messages_publish_lastwill => "Wills published",
        messages_publish_system => "Messages the broker published on $SYS topics",
        messages_acked => "Deliveries acknowledged (PUBACK, PUBCOMP)",
        messages_nonsubscribed => "Messages routed that matched no subscriber",
    }
    computed {
        messages_publish => "Messages routed from every source",
        messages_publish_custom => "Messages published by clients",
        messages_delivered => "PUBLISH packets written to clients",
        messages_dropped => "Messages and deliveries dropped, for any reason",
        client_publish_check_acl => "Authorization checks of client publishes",
    }
}

impl RmqttSnapshot {
    /// With the computed figures filled from `s` (Starling's own counters) and the counted
    /// ones.
    pub(crate) fn computed(mut self, s: &MetricsSnapshot) -> Self {
        self.messages_publish_custom = s.messages_received;
        self.messages_publish = self.messages_publish_custom
            + self.messages_publish_admin
            + self.messages_publish_lastwill
            + self.messages_publish_system;
        self.messages_delivered = s.messages_sent;
        self.messages_dropped = s.dropped_queue_full
            + s.dropped_mailbox_full
            + s.dropped_expired
            + s.dropped_other
            + s.dropped_acl;
        // Every client publish that reaches the gate outside the reserved namespace is
        // checked once: those allowed are routed (`messages_received`), the others denied.
        self.client_publish_check_acl = s.messages_received + self.client_publish_auth_error;
        self
    }
}

impl RmqttCounters {
    /// A CONNACK answering a CONNECT, with its code; `anonymous`: the CONNECT had no
    /// username. RMQTT counts Bad User Name or Password and Not Authorized as auth errors.
    pub(crate) fn connack(&self, code: ReasonCode, anonymous: bool) {
        let add = |c: &AtomicU64| {
            c.fetch_add(1, Ordering::Relaxed);
        };
        add(&self.client_connack);
        if code == ReasonCode::Success {
            return;
        }
        add(&self.client_connack_error);
        if matches!(
            code,
            ReasonCode::BadUserNameOrPassword | ReasonCode::NotAuthorized
        ) {
            add(&self.client_connack_auth_error);
            if anonymous {
                add(&self.client_auth_anonymous_error);
            }
        }
    }

    /// A SUBSCRIBE's (or an operator's subscribe's) answers, one code per filter: refusals
    /// by authorization and for other reasons.
    pub(crate) fn subscribe_refusals(&self, codes: impl IntoIterator<Item = ReasonCode>) {
        for code in codes {
            if code == ReasonCode::NotAuthorized {
                self.client_subscribe_auth_error
                    .fetch_add(1, Ordering::Relaxed);
            } else if code.is_error() {
                self.client_subscribe_error.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connack_codes_count_as_rmqtt_counts_them() {
        let c = RmqttCounters::default();
        c.connack(ReasonCode::Success, true);
        c.connack(ReasonCode::BadUserNameOrPassword, false);
        c.connack(ReasonCode::NotAuthorized, true);
        c.connack(ReasonCode::ServerUnavailable, true);
        let r = c.read();
        assert_eq!(r.client_connack, 4);
        assert_eq!(r.client_connack_error, 3);
        assert_eq!(r.client_connack_auth_error, 2);
        assert_eq!(r.client_auth_anonymous_error, 1);
    }

    #[test]
    fn subscribe_refusals_tell_authorization_from_other_reasons() {
        let c = RmqttCounters::default();
        c.subscribe_refusals([
            ReasonCode::GrantedQoS1,
            ReasonCode::NotAuthorized,
            ReasonCode::QuotaExceeded,
            ReasonCode::Success,
            ReasonCode::NotAuthorized,
        ]);
        let r = c.read();
        assert_eq!(
            (r.client_subscribe_auth_error, r.client_subscribe_error),
            (2, 1)
        );
    }

    #[test]
    fn sums_and_aliases_are_computed_from_what_is_counted() {
        let c = RmqttCounters::default();
        c.messages_publish_admin.store(2, Ordering::Relaxed);
        c.messages_publish_lastwill.store(3, Ordering::Relaxed);
        c.messages_publish_system.store(5, Ordering::Relaxed);
        c.client_publish_auth_error.store(7, Ordering::Relaxed);
        let s = MetricsSnapshot {
            messages_received: 11,
            messages_sent: 13,
            dropped_queue_full: 1,
            dropped_mailbox_full: 2,
            dropped_expired: 4,
            dropped_other: 8,
            dropped_acl: 16,
            ..MetricsSnapshot::default()
        };
        let r = c.read().computed(&s);
        assert_eq!(r.messages_publish_custom, 11);
        assert_eq!(r.messages_publish, 11 + 2 + 3 + 5);
        assert_eq!(r.messages_delivered, 13);
        assert_eq!(r.messages_dropped, 31);
        assert_eq!(r.client_publish_check_acl, 11 + 7);
    }
}
