//! Putting a handed-over session back together from the parts its frame was cut into (a
//! session with a long queue can be larger than one frame of the data stream). Sans-IO:
//! the inbound task feeds it each part, in the order the stream brought them.

use std::collections::HashMap;

/// What this node holds at most of sessions being put together, all senders together: a
/// part past it drops its session (the claiming CONNECT then waits in vain and starts
/// afresh, counted in `cluster.handover.timeouts`).
pub(crate) const PARTS_BYTES_MAX: usize = 512 << 20;

struct Assembly {
    epoch: u64,
    total: u32,
    next: u32,
    bytes: Vec<u8>,
    /// Where each part taken ends in `bytes`.
    ends: Vec<usize>,
}

/// What a part did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Fed {
    /// It was the last: the whole frame.
    Whole(Vec<u8>),
    /// Taken, or the same as a part already taken: the session is on its way. (The sender
    /// sends a session again when the claiming node asks while the first copy is still
    /// coming; the copies' parts can interleave on the stream, and a copy's part 0 must
    /// not throw away what the first copy brought.)
    Coming,
    /// Dropped: past a lost part, over the cap, or of no session being put together.
    Dropped,
}

/// Sessions being put together, by (sending node, client id).
#[derive(Default)]
pub(crate) struct Parts {
    sessions: HashMap<(u64, String), Assembly>,
    held: usize,
}

impl Parts {
    /// Part `index` of `total` of the session frame of `client_id` for claim `epoch`, from
    /// node `from`. A part the same as one taken is passed over. A part out of order (one
    /// lost with a replaced connection) drops what was gathered; a part 0 that differs
    /// starts afresh (a session the sender encoded anew, after a restart).
    pub(crate) fn part(
        &mut self,
        from: u64,
        client_id: &str,
        (epoch, index, total): (u64, u32, u32),
        bytes: &[u8],
    ) -> Fed {
        let key = (from, client_id.to_owned());
        if let Some(a) = self.sessions.get(&key) {
            if (a.epoch, a.total) == (epoch, total) && index < a.next {
                let i = index as usize;
                let start = if i == 0 { 0 } else { a.ends[i - 1] };
                if a.bytes[start..a.ends[i]] == *bytes {
                    return Fed::Coming;
                }
            }
        }
        if index == 0 {
            self.drop_one(&key);
            self.sessions.insert(
                key.clone(),
                Assembly {
                    epoch,
                    total,
                    next: 0,
                    bytes: Vec::new(),
                    ends: Vec::new(),
                },
            );
        }
        let fits = self.held + bytes.len() <= PARTS_BYTES_MAX;
        let Some(a) = self.sessions.get_mut(&key) else {
            return Fed::Dropped;
        };
        if (a.epoch, a.total, a.next) != (epoch, total, index) || !fits {
            tracing::warn!(
                from,
                client_id,
                index,
                total,
                fits,
                "a handed-over session's part out of order or over the cap: dropped"
            );
            self.drop_one(&key);
            return Fed::Dropped;
        }
        a.bytes.extend_from_slice(bytes);
        a.ends.push(a.bytes.len());
        a.next += 1;
        self.held += bytes.len();
        if a.next < a.total {
            return Fed::Coming;
        }
        let Some(a) = self.sessions.remove(&key) else {
            return Fed::Dropped;
        };
        self.held -= a.bytes.len();
        Fed::Whole(a.bytes)
    }

    fn drop_one(&mut self, key: &(u64, String)) {
        if let Some(a) = self.sessions.remove(key) {
            self.held -= a.bytes.len();
        }
    }

    /// Bytes held for sessions not yet whole.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.held
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Fed::{Coming, Dropped};

    fn whole(b: &[u8]) -> Fed {
        Fed::Whole(b.to_vec())
    }

    #[test]
    fn parts_in_order_make_the_frame_and_a_gap_drops_it() {
        let mut p = Parts::default();
        assert_eq!(p.part(2, "c", (7, 0, 3), b"ab"), Coming);
        assert_eq!(p.part(2, "c", (7, 1, 3), b"cd"), Coming);
        // Another sender's session of the same client id is another assembly.
        assert_eq!(p.part(3, "c", (8, 0, 2), b"zz"), Coming);
        assert_eq!(p.part(2, "c", (7, 2, 3), b"e"), whole(b"abcde"));
        assert_eq!(p.held(), 2);
        assert_eq!(p.part(3, "c", (8, 1, 2), b"y"), whole(b"zzy"));
        // Part 1 lost: part 2 drops the assembly.
        assert_eq!(p.part(2, "d", (9, 0, 3), b"ab"), Coming);
        assert_eq!(p.part(2, "d", (9, 2, 3), b"ef"), Dropped);
        assert_eq!(p.part(2, "d", (9, 1, 3), b"cd"), Dropped);
        assert_eq!(p.held(), 0);
        // Encoded anew (the sender restarted): a part 0 that differs starts afresh.
        assert_eq!(p.part(2, "d", (9, 0, 2), b"ab"), Coming);
        assert_eq!(p.part(2, "d", (9, 0, 2), b"AB"), Coming);
        assert_eq!(p.part(2, "d", (9, 1, 2), b"C"), whole(b"ABC"));
        // A part of no assembly: nothing.
        assert_eq!(p.part(2, "e", (1, 1, 2), b"x"), Dropped);
        assert_eq!(p.held(), 0);
    }

    /// The claiming node asked again while the first copy was coming: the two copies'
    /// parts interleave on the stream, and the session is put together once, whole.
    #[test]
    fn a_copy_sent_again_meanwhile_neither_restarts_nor_breaks_the_first() {
        let mut p = Parts::default();
        let copy: [&[u8]; 3] = [b"ab", b"cd", b"e"];
        let part = |p: &mut Parts, i: usize| p.part(2, "c", (7, i as u32, 3), copy[i]);
        assert_eq!(part(&mut p, 0), Coming);
        assert_eq!(part(&mut p, 1), Coming);
        assert_eq!(part(&mut p, 0), Coming, "the copy's part 0 is passed over");
        assert_eq!(part(&mut p, 1), Coming);
        assert_eq!(part(&mut p, 2), whole(b"abcde"));
        assert_eq!(
            part(&mut p, 2),
            Dropped,
            "the copy's last part finds nothing"
        );
        assert_eq!(p.held(), 0);
        // The first copy's last part lost with a redialled link: the copy completes it.
        assert_eq!(part(&mut p, 0), Coming);
        assert_eq!(part(&mut p, 1), Coming);
        assert_eq!(part(&mut p, 0), Coming);
        assert_eq!(part(&mut p, 1), Coming);
        assert_eq!(part(&mut p, 2), whole(b"abcde"));
        // A part taken that comes again different is out of order.
        assert_eq!(part(&mut p, 0), Coming);
        assert_eq!(part(&mut p, 1), Coming);
        assert_eq!(p.part(2, "c", (7, 1, 3), b"XY"), Dropped);
        assert_eq!(p.held(), 0);
    }

    #[test]
    fn a_session_over_the_cap_is_dropped_whole() {
        let mut p = Parts::default();
        let big = vec![0u8; PARTS_BYTES_MAX / 2 + 1];
        assert_eq!(p.part(2, "a", (1, 0, 3), &big), Coming);
        assert_eq!(p.part(2, "b", (1, 0, 3), &big), Dropped);
        assert_eq!(p.held(), big.len(), "b's part did not fit, and b went");
        assert_eq!(p.part(2, "b", (1, 1, 3), b"x"), Dropped);
        assert_eq!(p.part(2, "a", (1, 1, 3), b"x"), Coming);
        assert_eq!(p.held(), big.len() + 1);
    }
}
