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
}

/// Sessions being put together, by (sending node, client id).
#[derive(Default)]
pub(crate) struct Parts {
    sessions: HashMap<(u64, String), Assembly>,
    held: usize,
}

impl Parts {
    /// Part `index` of `total` of the session frame of `client_id` for claim `epoch`, from
    /// node `from`: the whole frame once its last part is here. A part out of order (one
    /// lost with a replaced connection) drops what was gathered; a part 0 starts afresh.
    pub(crate) fn part(
        &mut self,
        from: u64,
        client_id: &str,
        (epoch, index, total): (u64, u32, u32),
        bytes: &[u8],
    ) -> Option<Vec<u8>> {
        let key = (from, client_id.to_owned());
        if index == 0 {
            self.drop_one(&key);
            self.sessions.insert(
                key.clone(),
                Assembly {
                    epoch,
                    total,
                    next: 0,
                    bytes: Vec::new(),
                },
            );
        }
        let fits = self.held + bytes.len() <= PARTS_BYTES_MAX;
        let a = self.sessions.get_mut(&key)?;
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
            return None;
        }
        a.bytes.extend_from_slice(bytes);
        a.next += 1;
        self.held += bytes.len();
        if a.next < a.total {
            return None;
        }
        let a = self.sessions.remove(&key)?;
        self.held -= a.bytes.len();
        Some(a.bytes)
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

    #[test]
    fn parts_in_order_make_the_frame_and_a_gap_drops_it() {
        let mut p = Parts::default();
        assert_eq!(p.part(2, "c", (7, 0, 3), b"ab"), None);
        assert_eq!(p.part(2, "c", (7, 1, 3), b"cd"), None);
        // Another sender's session of the same client id is another assembly.
        assert_eq!(p.part(3, "c", (8, 0, 2), b"zz"), None);
        assert_eq!(p.part(2, "c", (7, 2, 3), b"e"), Some(b"abcde".to_vec()));
        assert_eq!(p.held(), 2);
        // Part 1 lost: part 2 drops the assembly.
        assert_eq!(p.part(3, "c", (8, 1, 2), b"y"), Some(b"zzy".to_vec()));
        assert_eq!(p.part(2, "d", (9, 0, 3), b"ab"), None);
        assert_eq!(p.part(2, "d", (9, 2, 3), b"ef"), None);
        assert_eq!(p.part(2, "d", (9, 1, 3), b"cd"), None);
        assert_eq!(p.held(), 0);
        // Sent again whole: part 0 starts afresh.
        assert_eq!(p.part(2, "d", (9, 0, 2), b"ab"), None);
        assert_eq!(p.part(2, "d", (9, 0, 2), b"AB"), None);
        assert_eq!(p.part(2, "d", (9, 1, 2), b"C"), Some(b"ABC".to_vec()));
        // A part of no assembly: nothing.
        assert_eq!(p.part(2, "e", (1, 1, 2), b"x"), None);
        assert_eq!(p.held(), 0);
    }

    #[test]
    fn a_session_over_the_cap_is_dropped_whole() {
        let mut p = Parts::default();
        let big = vec![0u8; PARTS_BYTES_MAX / 2 + 1];
        assert_eq!(p.part(2, "a", (1, 0, 3), &big), None);
        assert_eq!(p.part(2, "b", (1, 0, 3), &big), None);
        assert_eq!(p.held(), big.len(), "b's part did not fit, and b went");
        assert_eq!(p.part(2, "b", (1, 1, 3), b"x"), None);
        assert_eq!(p.part(2, "a", (1, 1, 3), b"x"), None);
        assert_eq!(p.held(), big.len() + 1);
    }
}
