//! Latency histograms with fixed buckets, for the Prometheus exposition: the handshake
//! (accept to CONNACK written) and the delivery (PUBLISH read to PUBLISH written).
//!
//! The live [`Histogram`] is relaxed atomics like the counters beside it. A hot path does
//! not add to it per event: it fills a [`Local`] on its own stack (plain integers) and
//! adds that once per write batch ([`Histogram::add`]), a few atomic adds for a whole batch.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the buckets, in microseconds: 50 µs to 10 s in 1-2.5-5 steps. Below
/// 50 µs nothing an operator acts on differs; past 10 s a latency is an outage (a client
/// gone quiet, a backlog), which the `+Inf` bucket and the sum still show.
pub const BOUNDS_US: [u64; 17] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

/// Buckets with the `+Inf` one last.
const BUCKETS: usize = BOUNDS_US.len() + 1;

/// The bucket of a latency: the first whose bound it does not pass (Prometheus' `le`).
fn bucket(us: u64) -> usize {
    BOUNDS_US.partition_point(|&b| b < us)
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The live histogram: per-bucket counts (not cumulative, so one event is one add) and the
/// sum of what was observed.
#[derive(Debug, Default)]
pub(crate) struct Histogram {
    buckets: [AtomicU64; BUCKETS],
    sum_us: AtomicU64,
}

impl Histogram {
    /// Records one latency: for paths that see one event at a time (a handshake).
    pub(crate) fn observe(&self, d: Duration) {
        let us = micros(d);
        self.buckets[bucket(us)].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// Adds what a [`Local`] gathered: one atomic add per bucket it used, and the sum.
    pub(crate) fn add(&self, local: &Local) {
        if local.count == 0 {
            return;
        }
        for (b, &n) in self.buckets.iter().zip(&local.buckets) {
            if n > 0 {
                b.fetch_add(u64::from(n), Ordering::Relaxed);
            }
        }
        self.sum_us.fetch_add(local.sum_us, Ordering::Relaxed);
    }

    pub(crate) fn read(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            buckets: self.buckets.each_ref().map(|b| b.load(Ordering::Relaxed)),
            sum_us: self.sum_us.load(Ordering::Relaxed),
        }
    }
}

/// Latencies gathered on one actor's stack before they go to a [`Histogram`] together.
#[derive(Debug, Default)]
pub(crate) struct Local {
    buckets: [u32; BUCKETS],
    sum_us: u64,
    count: u32,
}

impl Local {
    pub(crate) fn observe(&mut self, d: Duration) {
        let us = micros(d);
        let b = &mut self.buckets[bucket(us)];
        *b = b.saturating_add(1);
        self.sum_us = self.sum_us.saturating_add(us);
        self.count = self.count.saturating_add(1);
    }
}

/// A histogram at one moment. Each bucket is read on its own, so under load a snapshot may
/// lag a few events between buckets; the count is their sum, so it always equals the
/// `+Inf` bucket as Prometheus requires.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Events per bucket (not cumulative), in the order of [`BOUNDS_US`], `+Inf` last.
    pub buckets: [u64; BUCKETS],
    /// The observed latencies summed, in microseconds.
    pub sum_us: u64,
}

impl HistogramSnapshot {
    /// Events observed.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// The cumulative counts Prometheus' `_bucket` samples carry: each bound (in seconds,
    /// `None` for `+Inf`) with the events at or under it.
    pub fn cumulative(&self) -> impl Iterator<Item = (Option<f64>, u64)> + '_ {
        let bounds = BOUNDS_US.iter().map(|&b| Some(b as f64 / 1e6));
        bounds
            .chain(std::iter::once(None))
            .zip(self.buckets.iter().scan(0u64, |acc, &n| {
                *acc += n;
                Some(*acc)
            }))
    }

    /// What grew since `earlier` (a snapshot taken before this one), for tests and rates.
    pub fn since(&self, earlier: &Self) -> Self {
        let mut buckets = self.buckets;
        for (b, e) in buckets.iter_mut().zip(&earlier.buckets) {
            *b = b.saturating_sub(*e);
        }
        Self {
            buckets,
            sum_us: self.sum_us.saturating_sub(earlier.sum_us),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn a_latency_lands_in_the_first_bucket_whose_bound_it_does_not_pass() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(50), 0, "le is inclusive");
        assert_eq!(bucket(51), 1);
        assert_eq!(bucket(1_000), 4);
        assert_eq!(bucket(10_000_000), BOUNDS_US.len() - 1);
        assert_eq!(bucket(10_000_001), BOUNDS_US.len(), "+Inf");
        assert_eq!(bucket(u64::MAX), BOUNDS_US.len());
    }

    #[test]
    fn a_local_batch_adds_up_like_single_observations() {
        let single = Histogram::default();
        let batched = Histogram::default();
        let mut local = Local::default();
        for n in [10, 50, 60, 700, 700, 3_000_000, 20_000_000] {
            single.observe(us(n));
            local.observe(us(n));
        }
        batched.add(&local);
        batched.add(&Local::default());
        assert_eq!(single.read(), batched.read());
        let s = batched.read();
        assert_eq!(s.count(), 7);
        assert_eq!(s.sum_us, 10 + 50 + 60 + 1_400 + 3_000_000 + 20_000_000);
    }

    #[test]
    fn the_exposed_buckets_are_cumulative_and_end_with_the_count() {
        let h = Histogram::default();
        for n in [40, 40, 90, 600, 20_000_000] {
            h.observe(us(n));
        }
        let s = h.read();
        let c: Vec<(Option<f64>, u64)> = s.cumulative().collect();
        assert_eq!(c.len(), BOUNDS_US.len() + 1);
        assert_eq!(c[0], (Some(0.00005), 2));
        assert_eq!(c[1], (Some(0.0001), 3));
        assert_eq!(c[2], (Some(0.00025), 3));
        assert_eq!(c[3].1, 3, "600 µs is past 500 µs");
        assert_eq!(c[4], (Some(0.001), 4));
        assert_eq!(c[BOUNDS_US.len() - 1], (Some(10.0), 4));
        assert_eq!(c[BOUNDS_US.len()], (None, 5));
        assert!(c.windows(2).all(|w| w[0].1 <= w[1].1));
        assert_eq!(s.since(&s).count(), 0);
    }
}
