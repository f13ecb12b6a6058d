//! Sessions moving between nodes, as one shard sees them: which copy of a publish reaches a
//! session that is being handed over, so that none is lost and none arrives twice.
//!
//! A session moves from node A to node B when B claims its client id. The routes of its
//! subscriptions move from A to B through the raft log, and every node applies that at its
//! own pace, so for a while a publish may be routed to A, to B, or to both. The cut is a
//! log entry of its own ([`starling_cluster::Command::Moved`], index M), which B proposes
//! once the session is installed and the routes of its subscriptions hold B. Every batch
//! of forwarded publishes carries the index of the routes it was routed under (`routed
//! at`), and both nodes judge a copy by it:
//! - a copy routed before M is the old node's: A relays it to B, marked for the session
//!   (the session's subscriptions stay installed on A as a relay, and keep A in their
//!   routes, until well after M); B takes it only from A;
//! - a copy routed at M or later is the new node's: B delivers it directly, A drops its own.
//!
//! Routed before M, a publish went to A (A's routes held the session's filters until after
//! M); routed at M or later, it went to B (B's routes were committed before M). So each
//! publish reaches the session exactly once, whichever node it came from, and however far
//! behind that node was. Until a shard has applied M it cannot judge a copy routed under a
//! later index than its own: the shard keeps such a batch back until its own routes catch
//! up ([`Moves::waits_for`]).
//!
//! A session may come back to a node it left, and leave again: each shard keeps, per
//! moving session, the stretches of the log during which its node held the session (from
//! the cut that brought it to the cut that took it away), and a copy routed within one of
//! them is this node's, wherever the session is now. A copy this node owns is delivered
//! if the session is here, and relayed to where it went if not (down the chain, if it
//! moved on again); a copy routed in another node's stretch is that node's to deliver.
//!
//! Order across the cut is not kept: a copy relayed through A can arrive at B after a
//! later copy from the same publisher that took the direct way.
//!
//! Plain data, no clock of its own: the shard passes the time in.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use starling_session::Instant;

/// How long a known cut is kept after it was learnt: a copy routed before it may still be
/// on its way (a batch sent again, or parked in the outbox and replayed). Past it, the old
/// node's relay goes, and with it the old node's routes for the session's filters.
pub(crate) const CUT_GRACE: Duration = Duration::from_secs(30);

/// How long a cut that never becomes known is waited for (the new node could not commit
/// it, or it lies in a snapshot this node installed): the move's judgement stops then,
/// and copies go by the routes alone, as without a move.
pub(crate) const CUT_WAIT_MAX: Duration = Duration::from_secs(60);

/// One move's cut, as this shard knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// Not applied here yet, since `since`.
    Unknown { since: Instant },
    /// At this log index, learnt at `known`.
    At { index: u64, known: Instant },
}

impl Cut {
    fn done(&self, now: Instant) -> bool {
        match *self {
            Cut::Unknown { since } => now.saturating_duration_since(since) >= CUT_WAIT_MAX,
            Cut::At { known, .. } => now.saturating_duration_since(known) >= CUT_GRACE,
        }
    }

    fn known(&self) -> bool {
        matches!(self, Cut::At { .. })
    }

    /// Whether a copy routed at `at` came before the cut (an unknown cut is later than any
    /// copy the shard lets through: see [`Moves::waits_for`]).
    fn after(&self, at: u64) -> bool {
        match *self {
            Cut::Unknown { .. } => true,
            Cut::At { index, .. } => at < index,
        }
    }
}

/// A move of the session, as one end of it: the claim's epoch and the move's cut.
#[derive(Debug, Clone, Copy)]
struct Move {
    epoch: u64,
    cut: Cut,
}

/// A stretch of the log during which this node held the session: from the cut that
/// brought it here (`None`: it was here before any move this shard judges) to the cut that
/// took it to `to` (`None`: it is still here).
#[derive(Debug, Clone, Copy)]
struct Stay {
    came: Option<Move>,
    /// Its subscriptions are installed again here (a copy relayed for it waits until then).
    installed: bool,
    left: Option<(u64, Move)>,
}

impl Stay {
    /// Whether a copy routed at `at` was routed while this node held the session.
    fn holds(&self, at: u64) -> bool {
        self.came.is_none_or(|c| !c.cut.after(at)) && self.left.is_none_or(|(_, l)| l.cut.after(at))
    }
}

#[derive(Debug, Clone, Default)]
struct Moving {
    /// Oldest first; only the last may be open.
    stays: Vec<Stay>,
    /// The subscriptions kept installed as the session's relay while it is away.
    filters: Vec<String>,
}

impl Moving {
    fn here(&self) -> bool {
        self.stays.last().is_some_and(|s| s.left.is_none())
    }
}

/// What becomes of one copy of a publish for a moving session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The session here takes it.
    Deliver,
    /// Another copy reaches the session: this one is dropped for it.
    Skip,
    /// Sent on to the session's new node (`.0`), marked for it and its claim there (`.1`).
    Relay(u64, u64),
}

/// The moving sessions of one shard, by client id.
#[derive(Debug, Default)]
pub(crate) struct Moves {
    by_client: HashMap<Arc<str>, Moving>,
}

impl Moves {
    pub(crate) fn is_empty(&self) -> bool {
        self.by_client.is_empty()
    }

    /// The session of `client_id` arrives here, taken over by this node's claim `epoch`.
    /// A relay kept from an earlier stay becomes its subscriptions again.
    pub(crate) fn came(&mut self, client_id: Arc<str>, epoch: u64, now: Instant) {
        let m = self.by_client.entry(client_id).or_default();
        if m.here() {
            // Claimed again before it left (a hand-over tried anew): the newer claim.
            m.stays.pop();
        }
        m.filters.clear();
        m.stays.push(Stay {
            came: Some(Move {
                epoch,
                cut: Cut::Unknown { since: now },
            }),
            installed: false,
            left: None,
        });
    }

    /// The session of `client_id` is being handed over to `to` for its claim `epoch`.
    pub(crate) fn went(&mut self, client_id: Arc<str>, to: u64, epoch: u64, now: Instant) {
        let m = self.by_client.entry(client_id).or_default();
        let left = Some((
            to,
            Move {
                epoch,
                cut: Cut::Unknown { since: now },
            },
        ));
        match m.stays.last_mut() {
            Some(s) if s.left.is_none() => s.left = left,
            // Handed over again before it came back (a newer claim): the newer move.
            Some(s) => {
                if s.left.is_some_and(|(_, l)| l.epoch < epoch) {
                    s.left = left;
                }
            }
            None => m.stays.push(Stay {
                came: None,
                installed: true,
                left,
            }),
        }
    }

    /// The subscriptions of `client_id`'s session that stay installed as its relay (its
    /// session ended here after `went`).
    pub(crate) fn relay_filters(&mut self, client_id: &str, filters: Vec<String>) {
        if let Some(m) = self.by_client.get_mut(client_id).filter(|m| !m.here()) {
            m.filters.extend(filters);
        }
    }

    /// Whether the session of `client_id` left this shard's node and is relayed.
    pub(crate) fn relays(&self, client_id: &str) -> bool {
        self.by_client
            .get(client_id)
            .is_some_and(|m| !m.stays.is_empty() && !m.here())
    }

    /// The session of `client_id` that came here installs its subscriptions. Whether one
    /// had come.
    pub(crate) fn installed(&mut self, client_id: &str) -> bool {
        let stay = self
            .by_client
            .get_mut(client_id)
            .and_then(|m| m.stays.last_mut());
        match stay {
            Some(s) if s.left.is_none() && s.came.is_some() => {
                s.installed = true;
                true
            }
            _ => false,
        }
    }

    /// Whether the session of `client_id` came here by the claim `epoch` (or a later one)
    /// and installed its subscriptions, or left again: a copy relayed for that claim can
    /// be judged. One that comes first (the relay and the session travel apart) waits.
    pub(crate) fn knows(&self, client_id: &str, epoch: u64) -> bool {
        self.by_client.get(client_id).is_some_and(|m| {
            m.stays.iter().any(|s| {
                s.came.is_some_and(|c| c.epoch >= epoch && s.installed)
                    || s.left.is_some_and(|(_, l)| l.epoch > epoch)
            })
        })
    }

    /// The log applied the cut of `client_id`'s move to `node` by claim `epoch` at `index`.
    pub(crate) fn cut(
        &mut self,
        client_id: &str,
        (node, epoch): (u64, u64),
        index: u64,
        me: u64,
        now: Instant,
    ) {
        let Some(m) = self.by_client.get_mut(client_id) else {
            return;
        };
        let at = Cut::At { index, known: now };
        for s in &mut m.stays {
            if let Some(c) = s.came.as_mut().filter(|c| node == me && c.epoch == epoch) {
                c.cut = at;
            }
            if let Some((_, l)) = s
                .left
                .as_mut()
                .filter(|(to, l)| *to == node && l.epoch == epoch)
            {
                l.cut = at;
            }
        }
    }

    /// What becomes of a copy for `client_id` routed at `at`: `relayed` when it came marked
    /// for the session from a node that held it (judged there). `None`: the session is not
    /// moving, the copy goes as any other.
    pub(crate) fn verdict(&self, client_id: &str, at: u64, relayed: bool) -> Option<Verdict> {
        let m = self.by_client.get(client_id)?;
        if !relayed && !m.stays.iter().any(|s| s.holds(at)) {
            return Some(Verdict::Skip);
        }
        Some(match m.stays.last().and_then(|s| s.left) {
            None => Verdict::Deliver,
            Some((to, l)) => Verdict::Relay(to, l.epoch),
        })
    }

    /// Whether a batch routed at `at` must wait until this shard applied the routes up to
    /// it (`routes_at` is where it stands): some move's cut is unknown here, and the batch
    /// may have been routed after it.
    pub(crate) fn waits_for(&self, at: u64, routes_at: u64) -> bool {
        at > routes_at
            && self.by_client.values().flat_map(|m| &m.stays).any(|s| {
                s.came.is_some_and(|c| !c.cut.known())
                    || s.left.is_some_and(|(_, l)| !l.cut.known())
            })
    }

    /// Ends the judgements whose time is up; returns, per client id, the relay's filters to
    /// take down (its session left this node for good).
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<(Arc<str>, Vec<String>)> {
        let mut out = Vec::new();
        self.by_client.retain(|client_id, m| {
            // No copy of a stretch that ended long enough ago is on its way any more.
            m.stays
                .retain(|s| s.left.is_none_or(|(_, l)| !l.cut.done(now)));
            if let [only] = m.stays.as_mut_slice() {
                if only.came.is_some_and(|c| c.cut.done(now)) {
                    only.came = None;
                    only.installed = true;
                }
            }
            let plain = matches!(m.stays.as_slice(), [s] if s.came.is_none() && s.left.is_none());
            if m.stays.is_empty() {
                out.push((client_id.clone(), std::mem::take(&mut m.filters)));
            }
            !(m.stays.is_empty() || plain)
        });
        out
    }

    /// Forgets a session that ended here (not handed over).
    pub(crate) fn ended(&mut self, client_id: &str) {
        if self.by_client.get(client_id).is_some_and(Moving::here) {
            self.by_client.remove(client_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: u64 = 1;
    const B: u64 = 2;
    const C: u64 = 3;

    fn t0() -> Instant {
        starling_rt::time::now()
    }

    fn id() -> Arc<str> {
        Arc::from("c")
    }

    /// Where the copies of a publish routed at `at` that reached the nodes `reached` end:
    /// each judged on its node, relays followed.
    fn deliveries(nodes: &[(u64, &Moves)], at: u64, reached: &[u64]) -> Vec<u64> {
        let mut out = Vec::new();
        let mut copies: Vec<(u64, bool)> = reached.iter().map(|n| (*n, false)).collect();
        let mut hops = 0;
        while let Some((node, relayed)) = copies.pop() {
            hops += 1;
            assert!(hops < 100, "relayed in a circle");
            let Some((_, moves)) = nodes.iter().find(|(n, _)| *n == node) else {
                continue;
            };
            match moves.verdict("c", at, relayed) {
                None | Some(Verdict::Deliver) => out.push(node),
                Some(Verdict::Skip) => {}
                Some(Verdict::Relay(to, _)) => copies.push((to, true)),
            }
        }
        out
    }

    /// Every way a publish routed at `at` may have been routed (to the nodes in `must`,
    /// and maybe to those in `may`): it ends at `here`, once.
    fn once_at(nodes: &[(u64, &Moves)], at: u64, must: &[u64], may: &[u64], here: u64) {
        for pick in 0..(1u32 << may.len()) {
            let mut reached = must.to_vec();
            reached.extend(
                may.iter()
                    .enumerate()
                    .filter(|(i, _)| pick & (1 << i) != 0)
                    .map(|(_, n)| *n),
            );
            assert_eq!(
                deliveries(nodes, at, &reached),
                vec![here],
                "routed at {at} to {reached:?}"
            );
        }
    }

    /// Node `node` applies the cut of the move to `to` by claim `epoch` at `index`.
    fn cut(m: &mut Moves, node: u64, (to, epoch): (u64, u64), index: u64) {
        m.cut("c", (to, epoch), index, node, t0());
    }

    #[test]
    fn each_copy_reaches_the_session_once_across_a_move() {
        let now = t0();
        let (mut a, mut b) = (Moves::default(), Moves::default());
        a.went(id(), B, 7, now);
        a.relay_filters("c", vec!["t/#".into()]);
        b.came(id(), 7, now);
        assert!(b.installed("c"));
        // Before the cut is known anywhere: a copy routed at or before both nodes' routes
        // (10) reached A (the routes before the cut hold A), maybe B too.
        once_at(&[(A, &a), (B, &b)], 10, &[A], &[B], B);
        assert!(
            a.waits_for(12, 10) && b.waits_for(12, 10),
            "later ones wait"
        );
        // The cut at 12: before it, A and maybe B; from it, B and maybe A.
        cut(&mut a, A, (B, 7), 12);
        cut(&mut b, B, (B, 7), 12);
        assert!(!a.waits_for(13, 10) && !b.waits_for(13, 10));
        for at in [3, 11] {
            once_at(&[(A, &a), (B, &b)], at, &[A], &[B], B);
        }
        for at in [12, 40] {
            once_at(&[(A, &a), (B, &b)], at, &[B], &[A], B);
        }
    }

    #[test]
    fn a_session_that_moves_on_before_its_first_cut_is_relayed_once_down_the_chain() {
        let now = t0();
        let (mut a, mut b, mut c) = (Moves::default(), Moves::default(), Moves::default());
        a.went(id(), B, 7, now);
        b.came(id(), 7, now);
        b.installed("c");
        // It leaves B for C before B's cut (12) is applied anywhere; C's cut is 15.
        b.went(id(), C, 9, now);
        c.came(id(), 9, now);
        c.installed("c");
        for (n, m) in [(A, &mut a), (B, &mut b), (C, &mut c)] {
            cut(m, n, (B, 7), 12);
            cut(m, n, (C, 9), 15);
        }
        let all = [(A, &a), (B, &b), (C, &c)];
        once_at(&all, 5, &[A], &[B, C], C);
        once_at(&all, 11, &[A], &[B, C], C);
        once_at(&all, 12, &[B], &[A, C], C);
        once_at(&all, 14, &[B], &[A, C], C);
        once_at(&all, 15, &[C], &[A, B], C);
        once_at(&all, 20, &[C], &[A, B], C);
    }

    /// A→B→A: a copy of A's first stay that reaches A late, after the session came back,
    /// is A's to deliver (B may never have had it); one of B's stay is B's to relay back.
    #[test]
    fn a_session_back_where_it_was_takes_the_copies_of_both_its_stays_there() {
        let now = t0();
        let (mut a, mut b) = (Moves::default(), Moves::default());
        a.went(id(), B, 7, now);
        a.relay_filters("c", vec!["t/#".into()]);
        b.came(id(), 7, now);
        b.installed("c");
        b.went(id(), A, 9, now);
        b.relay_filters("c", vec!["t/#".into()]);
        a.came(id(), 9, now);
        assert!(!a.relays("c") && b.relays("c"));
        assert!(
            !a.knows("c", 9),
            "not before its subscriptions are installed"
        );
        assert!(a.installed("c"));
        assert!(a.knows("c", 9) && a.knows("c", 8) && !a.knows("c", 10));
        for (n, m) in [(A, &mut a), (B, &mut b)] {
            cut(m, n, (B, 7), 12);
            cut(m, n, (A, 9), 15);
        }
        let all = [(A, &a), (B, &b)];
        // A held it until 12 and from 15; B in between.
        once_at(&all, 5, &[A], &[B], A);
        once_at(&all, 11, &[A], &[B], A);
        once_at(&all, 12, &[B], &[A], A);
        once_at(&all, 14, &[B], &[A], A);
        once_at(&all, 15, &[A], &[B], A);
    }

    #[test]
    fn judgements_end_after_their_grace_and_give_back_the_relays_filters() {
        let now = t0();
        let mut a = Moves::default();
        a.went(id(), B, 7, now);
        a.relay_filters("c", vec!["t/#".into(), "u".into()]);
        assert!(
            a.expire(now + CUT_GRACE).is_empty(),
            "unknown cuts wait longer"
        );
        a.cut("c", (B, 7), 12, A, now + Duration::from_secs(1));
        assert!(a.expire(now + CUT_GRACE).is_empty());
        let gone = a.expire(now + CUT_GRACE + Duration::from_secs(1));
        assert_eq!(gone, vec![(id(), vec!["t/#".to_string(), "u".to_string()])]);
        assert!(a.is_empty());
        // A cut never learnt stops being waited for.
        let mut b = Moves::default();
        b.came(id(), 7, now);
        assert_eq!(b.verdict("c", 1, false), Some(Verdict::Skip));
        assert!(b.expire(now + CUT_WAIT_MAX).is_empty());
        assert!(b.is_empty());
        assert_eq!(b.verdict("c", 1, false), None);
        // A session that came back keeps its relay's filters as its own: nothing to take
        // down when the judgement ends.
        let mut c = Moves::default();
        c.went(id(), B, 7, now);
        c.relay_filters("c", vec!["t/#".into()]);
        c.came(id(), 9, now);
        c.cut("c", (B, 7), 12, A, now);
        c.cut("c", (A, 9), 15, A, now);
        assert!(c.expire(now + CUT_GRACE).is_empty());
        assert!(c.is_empty());
    }
}
