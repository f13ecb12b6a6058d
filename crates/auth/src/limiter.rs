//! Failed-login limits per source address: after `failures_max` failed verifications from
//! one source within `window`, that source is banned for `ban`, and its CONNECTs with
//! credentials are refused without spending a password verification on them.
//!
//! Sans-IO: every call takes `now`, a monotonic time as a [`Duration`] since any origin the
//! caller keeps fixed (the broker: its start on the runtime's clock), so tests jump time and
//! the guard needs no clock type of its own. IPv6 sources are grouped by /64 (one subscriber's allocation), since
//! a single host can pick any address in its /64.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

/// The limits of a [`LoginGuard`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureLimits {
    /// Failed logins from one source within `window` that start a ban (at least 1).
    pub failures_max: u32,
    /// The window failures are counted in, from a source's first failure.
    pub window: Duration,
    /// How long a ban lasts.
    pub ban: Duration,
    /// Sources tracked at most; failures from further sources are not tracked (and so
    /// never banned) until expired entries are pruned. Bounds the guard's memory.
    pub sources_max: usize,
}

/// Whether a source may have its credentials verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Verify.
    Verify,
    /// Verify, behind sources without recent failures: this one failed within its window
    /// (or its ban ended less than a window ago), so a storm from many addresses waits
    /// behind the clients that are not part of it.
    VerifyLater,
    /// Refuse without verifying: the source is banned until `until`.
    Banned {
        /// When the ban ends.
        until: Duration,
    },
}

/// What recording a failure did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// Counted; `failures` so far in the source's window.
    Counted {
        /// Failures in the current window, this one included.
        failures: u32,
    },
    /// This failure started a ban of the source.
    BanStarted {
        /// When the ban ends.
        until: Duration,
    },
    /// The table is full: the failure is not tracked.
    Untracked,
}

#[derive(Debug, Clone, Copy)]
struct Source {
    window_start: Duration,
    failures: u32,
    banned_until: Option<Duration>,
}

impl Source {
    fn expired(&self, now: Duration, limits: &FailureLimits) -> bool {
        let ban_over = self.banned_until.is_none_or(|u| now >= u);
        ban_over && now.saturating_sub(self.window_start) >= limits.window
    }
}

/// Failed-login counts and bans by source address.
#[derive(Debug, Clone)]
pub struct LoginGuard {
    limits: FailureLimits,
    sources: BTreeMap<IpAddr, Source>,
}

impl LoginGuard {
    /// An empty guard.
    pub fn new(limits: FailureLimits) -> Self {
        assert!(limits.failures_max >= 1, "failures_max must be at least 1");
        Self {
            limits,
            sources: BTreeMap::new(),
        }
    }

    /// Whether credentials from `ip` may be verified now.
    pub fn check(&self, now: Duration, ip: IpAddr) -> Admission {
        match self.sources.get(&source_key(ip)) {
            Some(Source {
                banned_until: Some(until),
                ..
            }) if now < *until => Admission::Banned { until: *until },
            Some(s) if !s.expired(now, &self.limits) => Admission::VerifyLater,
            _ => Admission::Verify,
        }
    }

    /// Records a failed verification from `ip`.
    pub fn record_failure(&mut self, now: Duration, ip: IpAddr) -> Recorded {
        let key = source_key(ip);
        if !self.sources.contains_key(&key) && self.sources.len() >= self.limits.sources_max {
            self.prune(now);
            if self.sources.len() >= self.limits.sources_max {
                return Recorded::Untracked;
            }
        }
        let limits = self.limits;
        let s = self.sources.entry(key).or_insert(Source {
            window_start: now,
            failures: 0,
            banned_until: None,
        });
        if now.saturating_sub(s.window_start) >= limits.window {
            s.window_start = now;
            s.failures = 0;
        }
        s.failures = s.failures.saturating_add(1);
        if s.failures >= limits.failures_max {
            let until = now.saturating_add(limits.ban);
            s.banned_until = Some(until);
            // A new window starts with the ban, so one more failure after it ends does
            // not ban again at once.
            s.window_start = until;
            s.failures = 0;
            return Recorded::BanStarted { until };
        }
        Recorded::Counted {
            failures: s.failures,
        }
    }

    /// Forgets sources whose window and ban are over.
    pub fn prune(&mut self, now: Duration) {
        let limits = self.limits;
        self.sources.retain(|_, s| !s.expired(now, &limits));
    }

    /// Sources tracked now.
    pub fn len(&self) -> usize {
        self.sources.len()
    }

    /// Whether no source is tracked.
    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }
}

/// The unit a limit applies to: an IPv4 address, an IPv6 /64 (IPv4-mapped IPv6 addresses
/// count as their IPv4 address).
fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: FailureLimits = FailureLimits {
        failures_max: 3,
        window: Duration::from_secs(60),
        ban: Duration::from_secs(30),
        sources_max: 2,
    };

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_source_is_banned_after_max_failures_within_the_window_and_then_released() {
        let t0 = Duration::from_secs(1000);
        let mut g = LoginGuard::new(LIMITS);
        let a = ip("192.0.2.1");
        assert_eq!(g.check(t0, a), Admission::Verify);
        assert_eq!(g.record_failure(t0, a), Recorded::Counted { failures: 1 });
        assert_eq!(g.record_failure(t0, a), Recorded::Counted { failures: 2 });
        assert_eq!(g.check(t0, a), Admission::VerifyLater, "failed recently");
        let until = t0 + Duration::from_secs(40);
        let third = g.record_failure(t0 + Duration::from_secs(10), a);
        assert_eq!(third, Recorded::BanStarted { until });
        assert_eq!(
            g.check(t0 + Duration::from_secs(39), a),
            Admission::Banned { until }
        );
        assert_eq!(
            g.check(until, a),
            Admission::VerifyLater,
            "released, still suspect for a window"
        );
        assert_eq!(g.check(until + LIMITS.window, a), Admission::Verify);
        // Another source is unaffected.
        assert_eq!(g.check(t0, ip("192.0.2.2")), Admission::Verify);
    }

    #[test]
    fn failures_spread_over_more_than_a_window_never_ban() {
        let t0 = Duration::from_secs(1000);
        let mut g = LoginGuard::new(LIMITS);
        let a = ip("192.0.2.1");
        for i in 0..10 {
            let r = g.record_failure(t0 + Duration::from_secs(31 * i), a);
            assert!(matches!(r, Recorded::Counted { .. }), "{r:?}");
        }
    }

    #[test]
    fn ipv6_sources_are_grouped_by_slash_64_and_mapped_v4_is_v4() {
        let t0 = Duration::from_secs(1000);
        let mut g = LoginGuard::new(LIMITS);
        g.record_failure(t0, ip("2001:db8::1"));
        g.record_failure(t0, ip("2001:db8::2"));
        g.record_failure(t0, ip("2001:db8::ffff:3"));
        assert!(matches!(
            g.check(t0, ip("2001:db8::99")),
            Admission::Banned { .. }
        ));
        assert_eq!(g.check(t0, ip("2001:db8:0:1::1")), Admission::Verify);
        assert_eq!(g.check(t0, ip("192.0.2.9")), Admission::Verify);
        assert_eq!(source_key(ip("::ffff:192.0.2.7")), ip("192.0.2.7"));
    }

    #[test]
    fn a_full_table_prunes_expired_sources_and_otherwise_stops_tracking() {
        let t0 = Duration::from_secs(1000);
        let mut g = LoginGuard::new(LIMITS);
        g.record_failure(t0, ip("192.0.2.1"));
        g.record_failure(t0, ip("192.0.2.2"));
        assert_eq!(g.record_failure(t0, ip("192.0.2.3")), Recorded::Untracked);
        let later = t0 + Duration::from_secs(61);
        assert_eq!(
            g.record_failure(later, ip("192.0.2.3")),
            Recorded::Counted { failures: 1 }
        );
        assert_eq!(g.len(), 1);
    }
}
