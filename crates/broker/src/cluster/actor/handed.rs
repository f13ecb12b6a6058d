//! Sessions this node handed over lately, kept a while as the frames that carried them: a
//! frame queued on a data link that is down is dropped when the link is redialled, and
//! the claiming node, still waiting, asks for it again (`SessionWanted`). Without this, its
//! CONNECT would start afresh after the hand-over wait, the session's messages lost.
//!
//! Plain data: the time comes in.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use starling_session::Instant;

/// How long a handed-over session is kept: past the claiming node's wait for it.
pub(super) const KEEP: Duration = Duration::from_secs(10);
/// The frames kept at most, in all: a hand-over past it is not kept (the oldest go first).
pub(super) const KEEP_BYTES: usize = 64 << 20;

struct Sent {
    to: u64,
    client_id: Arc<str>,
    epoch: u64,
    frames: Vec<Vec<u8>>,
    bytes: usize,
    at: Instant,
}

#[derive(Default)]
pub(super) struct Handed {
    sent: VecDeque<Sent>,
    bytes: usize,
}

impl Handed {
    /// Keeps the frames that carried `client_id`'s session to `to` for its claim `epoch`.
    pub(super) fn keep(
        &mut self,
        (to, client_id, epoch): (u64, Arc<str>, u64),
        frames: &[Vec<u8>],
        now: Instant,
    ) {
        self.expire(now);
        let bytes: usize = frames.iter().map(Vec::len).sum();
        if bytes > KEEP_BYTES {
            return;
        }
        while self.bytes + bytes > KEEP_BYTES {
            let Some(old) = self.sent.pop_front() else {
                break;
            };
            self.bytes -= old.bytes;
        }
        self.bytes += bytes;
        self.sent.push_back(Sent {
            to,
            client_id,
            epoch,
            frames: frames.to_vec(),
            bytes,
            at: now,
        });
    }

    /// The frames of the session `by` asks for again (its claim `epoch` of `client_id`),
    /// if still kept.
    pub(super) fn wanted(
        &mut self,
        by: u64,
        client_id: &str,
        epoch: u64,
        now: Instant,
    ) -> Option<Vec<Vec<u8>>> {
        self.expire(now);
        self.sent
            .iter()
            .rev()
            .find(|s| s.to == by && s.epoch == epoch && &*s.client_id == client_id)
            .map(|s| s.frames.clone())
    }

    fn expire(&mut self, now: Instant) {
        while let Some(s) = self.sent.front() {
            if now.saturating_duration_since(s.at) < KEEP {
                break;
            }
            self.bytes -= s.bytes;
            self.sent.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_sent_again_only_to_its_claim_and_only_for_a_while() {
        let now = starling_rt::time::now();
        let mut h = Handed::default();
        h.keep((3, Arc::from("c"), 7), &[vec![1, 2], vec![3]], now);
        assert_eq!(h.wanted(3, "c", 7, now), Some(vec![vec![1, 2], vec![3]]));
        assert_eq!(h.wanted(2, "c", 7, now), None, "another node");
        assert_eq!(h.wanted(3, "c", 8, now), None, "another claim");
        assert_eq!(h.wanted(3, "d", 7, now), None, "another client id");
        assert_eq!(h.wanted(3, "c", 7, now + KEEP), None, "kept no longer");
        assert_eq!(h.bytes, 0);
    }

    #[test]
    fn what_is_kept_stays_under_its_bound() {
        let now = starling_rt::time::now();
        let mut h = Handed::default();
        let big = vec![vec![0u8; KEEP_BYTES / 2 + 1]];
        h.keep((3, Arc::from("a"), 1), &big, now);
        h.keep((3, Arc::from("b"), 2), &big, now);
        assert!(h.bytes <= KEEP_BYTES);
        assert_eq!(h.wanted(3, "a", 1, now), None, "the oldest went");
        assert!(h.wanted(3, "b", 2, now).is_some());
        h.keep((3, Arc::from("huge"), 3), &[vec![0u8; KEEP_BYTES + 1]], now);
        assert!(h.wanted(3, "huge", 3, now).is_none(), "too large to keep");
        assert!(h.wanted(3, "b", 2, now).is_some());
    }
}
