//! Rate limits for log lines that peers can cause: one line per interval, with a count of
//! the ones held back, so a storm of bad handshakes or failed logins cannot flood the log.
//!
//! ```no_run
//! # async fn f() {
//! use std::time::Duration;
//! let throttle = starling_rt::throttle::Throttle::new(Duration::from_secs(10));
//! if let Some(suppressed) = throttle.admit() {
//!     tracing::info!(suppressed, "handshake failed");
//! }
//! # }
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::time::{self, Instant};

/// Admits at most one event per interval on the runtime's clock and counts the others.
///
/// Atomics rather than an actor: it is called from every connection task of a listener,
/// decides nothing but whether a log line is written, and must cost no message per call.
#[derive(Debug)]
pub struct Throttle {
    interval: Duration,
    base: Instant,
    /// Nanoseconds after `base` from which the next event is admitted.
    next: AtomicU64,
    suppressed: AtomicU64,
}

impl Throttle {
    /// A throttle admitting one event per `interval`; the first event is admitted.
    pub fn new(interval: Duration) -> Self {
        Throttle {
            interval,
            base: time::now(),
            next: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(k)` if this event may be logged, `k` being how many were held back since the
    /// last admitted one; `None` (and counted) otherwise.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(time::now())
    }

    /// [`Throttle::admit`] at time `now`.
    pub fn admit_at(&self, now: Instant) -> Option<u64> {
        let now = nanos(now.saturating_duration_since(self.base));
        let next = self.next.load(Ordering::Relaxed);
        let due = now >= next
            && self
                .next
                .compare_exchange(
                    next,
                    now.saturating_add(nanos(self.interval)),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok();
        if due {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_event_per_interval_with_the_held_back_count() {
        let t = Throttle::new(Duration::from_secs(10));
        let at = |s| t.base + Duration::from_secs(s);
        assert_eq!(t.admit_at(at(0)), Some(0));
        assert_eq!(t.admit_at(at(0)), None);
        assert_eq!(t.admit_at(at(5)), None);
        assert_eq!(t.admit_at(at(9)), None);
        assert_eq!(t.admit_at(at(10)), Some(3));
        assert_eq!(t.admit_at(at(11)), None);
        assert_eq!(t.admit_at(at(70)), Some(1));
    }
}
