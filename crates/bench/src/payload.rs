//! The stamp at the head of every payload, and the per-stream sequence
//! tracker that counts unique, duplicate and reordered deliveries.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, BytesMut};

/// Bytes of the stamp: send time (u64 ns), publisher index (u32), sequence (u64).
pub const STAMP_LEN: usize = 8 + 4 + 8;

/// The clock all stamps are read from.
///
/// A stamp is nanoseconds since the Unix epoch, taken as the wall clock read
/// once at start plus the monotonic time since, so that within one process
/// latencies are exact monotonic differences, and a `sub` run in another
/// process on the same machine still reads meaningful latencies (both start
/// from the same wall clock).
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
    start_wall_ns: u64,
}

impl Clock {
    /// Reads both clocks now.
    pub fn start() -> Clock {
        let start_wall_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Clock {
            start: Instant::now(),
            start_wall_ns,
        }
    }

    /// The instant the clock started.
    pub fn origin(&self) -> Instant {
        self.start
    }

    /// The stamp for now.
    pub fn now_ns(&self) -> u64 {
        self.start_wall_ns + self.start.elapsed().as_nanos() as u64
    }

    /// Nanoseconds from the clock's start to `at`.
    pub fn since_start_ns(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.start).as_nanos() as u64
    }

    /// The instant `ns` nanoseconds after start.
    pub fn at(&self, ns: u64) -> Instant {
        self.start + Duration::from_nanos(ns)
    }
}

/// What a received payload says about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// [`Clock::now_ns`] at encoding.
    pub sent_ns: u64,
    /// Index of the publisher in its run.
    pub publisher: u32,
    /// Per-publisher sequence number from 0.
    pub seq: u64,
}

impl Stamp {
    /// Appends the stamp and `size - STAMP_LEN` zero bytes of padding.
    pub fn put(&self, size: usize, dst: &mut BytesMut) {
        debug_assert!(size >= STAMP_LEN, "sizes are validated against STAMP_LEN");
        dst.put_u64(self.sent_ns);
        dst.put_u32(self.publisher);
        dst.put_u64(self.seq);
        dst.put_bytes(0, size - STAMP_LEN);
    }

    /// Reads a stamp, or `None` from a payload too short to be ours.
    pub fn read(payload: &[u8]) -> Option<Stamp> {
        let head: &[u8; STAMP_LEN] = payload.get(..STAMP_LEN)?.try_into().ok()?;
        // The slices below are fixed sub-ranges of a STAMP_LEN array.
        Some(Stamp {
            sent_ns: u64::from_be_bytes(head[0..8].try_into().expect("8 bytes")),
            publisher: u32::from_be_bytes(head[8..12].try_into().expect("4 bytes")),
            seq: u64::from_be_bytes(head[12..20].try_into().expect("8 bytes")),
        })
    }
}

/// How far back a tracker remembers which sequence numbers it saw. MQTT
/// keeps one publisher's messages in order on a topic (MQTT 5 §4.6), so
/// late arrivals are rare and close; older repeats count as duplicates.
pub const SEQ_WINDOW: u64 = 4096;

/// Counts deliveries of one publisher's stream to one subscriber in bounded
/// memory: unique, duplicate and late (reordered) messages.
#[derive(Debug, Clone, Default)]
pub struct SeqTracker {
    /// One more than the highest sequence seen.
    next: u64,
    /// Seen bits for sequences `[next - SEQ_WINDOW, next)`, indexed by `seq % SEQ_WINDOW`.
    seen: Option<Box<[u64; (SEQ_WINDOW / 64) as usize]>>,
    /// Distinct sequences seen.
    pub unique: u64,
    /// Sequences seen again (or too late to tell).
    pub duplicates: u64,
    /// Sequences that arrived after a higher one.
    pub reordered: u64,
}

impl SeqTracker {
    /// Records one delivery of `seq`.
    pub fn record(&mut self, seq: u64) {
        let seen = self
            .seen
            .get_or_insert_with(|| Box::new([0; (SEQ_WINDOW / 64) as usize]));
        let bit = |s: u64| ((s % SEQ_WINDOW / 64) as usize, 1u64 << (s % 64));
        if seq >= self.next {
            // Forget the bits of the sequences that slide out of the window:
            // their slots now stand for the skipped range [next, seq).
            if seq - self.next >= SEQ_WINDOW {
                seen.fill(0);
            } else {
                for s in self.next..seq {
                    let (w, b) = bit(s);
                    seen[w] &= !b;
                }
            }
            let (w, b) = bit(seq);
            seen[w] |= b;
            self.next = seq + 1;
            self.unique += 1;
        } else if self.next - seq > SEQ_WINDOW {
            self.duplicates += 1;
        } else {
            let (w, b) = bit(seq);
            if seen[w] & b != 0 {
                self.duplicates += 1;
            } else {
                seen[w] |= b;
                self.unique += 1;
                self.reordered += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamp_round_trips_and_pads_to_size() {
        let mut buf = BytesMut::new();
        let stamp = Stamp {
            sent_ns: 123_456_789,
            publisher: 7,
            seq: 42,
        };
        stamp.put(64, &mut buf);
        assert_eq!(buf.len(), 64);
        assert_eq!(Stamp::read(&buf), Some(stamp));
        assert_eq!(Stamp::read(&buf[..STAMP_LEN - 1]), None);
    }

    #[test]
    fn tracker_counts_in_order_stream_as_unique() {
        let mut t = SeqTracker::default();
        for s in 0..10_000 {
            t.record(s);
        }
        assert_eq!((t.unique, t.duplicates, t.reordered), (10_000, 0, 0));
    }

    #[test]
    fn tracker_tells_duplicates_from_late_arrivals() {
        let mut t = SeqTracker::default();
        for s in [0, 1, 3, 4, 1, 2, 2, 4] {
            t.record(s);
        }
        assert_eq!(t.unique, 5);
        assert_eq!(t.reordered, 1, "2 arrived after 3");
        assert_eq!(t.duplicates, 3, "1, 2 and 4 again");
    }

    #[test]
    fn tracker_gap_leaves_missing_messages_uncounted() {
        let mut t = SeqTracker::default();
        t.record(0);
        t.record(SEQ_WINDOW * 3);
        t.record(SEQ_WINDOW * 3 + 1);
        assert_eq!(t.unique, 3);
        // A sequence in the skipped range but inside the window is late, not a duplicate.
        t.record(SEQ_WINDOW * 3 - 5);
        assert_eq!((t.unique, t.duplicates), (4, 0));
        // One older than the window cannot be told apart and counts as duplicate.
        t.record(1);
        assert_eq!(t.duplicates, 1);
    }
}
