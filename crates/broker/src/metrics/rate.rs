//! A per-second rate with its high-water mark (RMQTT's `handshakings_rate`), kept by the
//! events themselves: no ticker has to run for it, so an idle broker spends nothing on it.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Events per wall-clock second: `count` is the last whole second's, `max` the largest
/// whole second's since start.
///
/// An event in a new second rolls the finished second's count over; a reader rolls it too
/// when the events have stopped. Events racing a roll may be counted in the neighbouring
/// second: a rate for operators, not an account.
#[derive(Debug, Default)]
pub(crate) struct Rate {
    /// The second `current` counts (Unix seconds).
    second: AtomicU64,
    current: AtomicU64,
    /// The count of the second before `second`.
    last: AtomicU64,
    max: AtomicU64,
}

impl Rate {
    /// One event at Unix second `now`.
    pub(crate) fn tick(&self, now: u64) {
        self.roll(now);
        self.current.fetch_add(1, Relaxed);
    }

    /// The last whole second's count and the largest since start, as of Unix second `now`.
    pub(crate) fn read(&self, now: u64) -> (u64, u64) {
        self.roll(now);
        (self.last.load(Relaxed), self.max.load(Relaxed))
    }

    fn roll(&self, now: u64) {
        let was = self.second.load(Relaxed);
        if now <= was {
            return;
        }
        // One roller per second: the loser of the exchange counts into the new second.
        if self
            .second
            .compare_exchange(was, now, Relaxed, Relaxed)
            .is_err()
        {
            return;
        }
        let finished = self.current.swap(0, Relaxed);
        // `finished` belongs to `was`: it is the last whole second only if `now` follows it.
        let last = if now == was + 1 { finished } else { 0 };
        self.last.store(last, Relaxed);
        // A second with events that a gap followed still counts towards the mark.
        self.max.fetch_max(finished, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::Rate;

    #[test]
    fn counts_the_last_whole_second_and_keeps_the_largest() {
        let r = Rate::default();
        r.tick(100);
        r.tick(100);
        r.tick(100);
        // Second 100 is not over at 100.
        assert_eq!(r.read(100), (0, 0));
        assert_eq!(r.read(101), (3, 3));
        r.tick(101);
        assert_eq!(r.read(102), (1, 3));
        // No events in 102: the rate falls to 0, the mark stays.
        assert_eq!(r.read(103), (0, 3));
        r.tick(105);
        r.tick(105);
        r.tick(105);
        r.tick(105);
        // 105's events, read two seconds later, are not the last second's.
        assert_eq!(r.read(107), (0, 4));
    }

    #[test]
    fn a_clock_that_steps_back_moves_nothing() {
        let r = Rate::default();
        r.tick(50);
        r.tick(49);
        assert_eq!(r.read(51), (2, 2));
    }
}
