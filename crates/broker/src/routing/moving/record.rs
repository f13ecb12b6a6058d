//! A shard's judgement of one session's moves as the store keeps it, so that a node that
//! restarts still relays what was routed to it for a session that left before (a batch
//! parked for it while it was down comes after its restart), and still skips a direct copy
//! routed before the cut of one that came (its old node relays that one).
//!
//! What a restart does not keep: when a cut was learnt (its grace starts again at the
//! restart, and so does the order hold of a session that came) and the releases sent or
//! taken. The order hold comes back: a node killed while it held copies back for order did
//! not acknowledge them, so they come again after its restart, beside the old node's
//! relays sent again, in either order; held again, they wait for the old node's release
//! behind its relays as before. A relay restored
//! is not in the shard's router: its filters are matched against the forwarded copies
//! routed before its cut ([`Moves::restored_relays`]), which are the only ones it is for.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use starling_router::{filter_matches, parse_subscription, TopicLimits};
use starling_session::Instant;

use super::{Cut, Move, Moves, Moving, Stay};

/// The layouts, postcard behind this version byte: 2 adds the order across the last move
/// here (a build without it cannot read such a record, and drops it).
const RECORD_V1: u8 = 1;
const RECORD_V2: u8 = 2;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct MoveRecord {
    stays: Vec<StayRecord>,
    filters: Vec<String>,
    /// The node the session came from and the filters its order is held on.
    order: Option<(u64, Vec<String>)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct MoveRecordV1 {
    stays: Vec<StayRecord>,
    filters: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct StayRecord {
    came: Option<MoveKept>,
    left: Option<(u64, MoveKept)>,
}

/// A move's claim epoch and its cut's log index (`None`: not learnt yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct MoveKept {
    epoch: u64,
    cut: Option<u64>,
}

impl MoveKept {
    fn of(m: &Move) -> Self {
        MoveKept {
            epoch: m.epoch,
            cut: match m.cut {
                Cut::At { index, .. } => Some(index),
                Cut::Unknown { .. } => None,
            },
        }
    }

    /// As if learnt (or waited for) from `now` on.
    fn back(self, now: Instant) -> Move {
        Move {
            epoch: self.epoch,
            cut: match self.cut {
                Some(index) => Cut::At { index, known: now },
                None => Cut::Unknown { since: now },
            },
        }
    }
}

impl Moving {
    fn record(&self) -> MoveRecord {
        MoveRecord {
            stays: self
                .stays
                .iter()
                .map(|s| StayRecord {
                    came: s.came.as_ref().map(MoveKept::of),
                    left: s.left.as_ref().map(|(to, l)| (*to, MoveKept::of(l))),
                })
                .collect(),
            filters: self.filters.clone(),
            order: self.order.as_ref().map(|o| (o.from, o.filters.clone())),
        }
    }
}

fn encode(r: &MoveRecord) -> Vec<u8> {
    // Plain data into a Vec: it cannot fail.
    postcard::to_extend(r, vec![RECORD_V2]).expect("a move record serializes")
}

fn decode(bytes: &[u8]) -> Option<MoveRecord> {
    match bytes.split_first() {
        Some((&RECORD_V2, body)) => postcard::from_bytes(body).ok(),
        Some((&RECORD_V1, body)) => {
            let v1: MoveRecordV1 = postcard::from_bytes(body).ok()?;
            Some(MoveRecord {
                stays: v1.stays,
                filters: v1.filters,
                order: None,
            })
        }
        _ => None,
    }
}

impl Moves {
    /// The sessions whose judgement changed since the last call, each with its record to
    /// store (`None`: it ended, its record goes).
    pub(crate) fn take_dirty(&mut self) -> Vec<(Arc<str>, Option<Vec<u8>>)> {
        let dirty = std::mem::take(&mut self.dirty);
        dirty
            .into_iter()
            .map(|c| {
                let record = self.by_client.get(&c).map(|m| encode(&m.record()));
                (c, record)
            })
            .collect()
    }

    /// Takes back what the store kept of `client_id`'s moves: `records` are every shard's
    /// (their relays' filters are put together: a restored relay is matched by topic, not
    /// by the shard its filters were installed in). Whether any could be read. The session
    /// is marked to be stored again, under this shard's own row.
    pub(crate) fn restore(
        &mut self,
        client_id: Arc<str>,
        records: &[Vec<u8>],
        now: Instant,
    ) -> bool {
        let mut read = records.iter().filter_map(|r| decode(r));
        let Some(first) = read.next() else {
            return false;
        };
        let mut filters = first.filters;
        let order = first.order;
        for r in read {
            for f in r.filters {
                if !filters.contains(&f) {
                    filters.push(f);
                }
            }
        }
        let stays: Vec<Stay> = first
            .stays
            .iter()
            .map(|s| Stay {
                came: s.came.map(|c| c.back(now)),
                // The session came back with its subscriptions, if it is here.
                installed: true,
                left: s.left.map(|(to, l)| (to, l.back(now))),
            })
            .collect();
        if stays.is_empty() {
            return false;
        }
        // Held again from the restart on (its cut is learnt anew then), if the session's
        // last stay here began with a move (whether it moved on since or not).
        let order = order
            .filter(|_| stays.last().is_some_and(|s| s.came.is_some()))
            .map(|(from, filters)| super::Order::from(from, filters));
        self.ordering += usize::from(order.is_some());
        let m = Moving {
            stays,
            filters,
            order,
            marked: Default::default(),
            restored: true,
            ended_here: true,
        };
        if let Some(old) = self.by_client.insert(client_id.clone(), m) {
            self.ordering -= usize::from(old.order.is_some());
        }
        self.stale = true;
        self.dirty.insert(client_id);
        true
    }

    /// The sessions that left this node before it restarted whose relay holds a copy on
    /// `topic` routed at `at`: where each went, and the claim it went by. Their filters
    /// are not in the shard's router, so a forwarded copy is matched here; a copy routed
    /// at or after every restored relay's cut is none of theirs, and costs a comparison.
    pub(crate) fn restored_relays(
        &mut self,
        topic: &str,
        at: u64,
        limits: &TopicLimits,
    ) -> Vec<(Arc<str>, u64, u64)> {
        // 0 while none is restored: nothing is below it.
        if at >= self.counts().restored_below {
            return Vec::new();
        }
        self.by_client
            .iter()
            .filter(|(_, m)| m.restored && !m.here())
            .filter(|(_, m)| m.stays.iter().any(|s| s.holds(at)))
            .filter(|(_, m)| {
                m.filters.iter().any(|raw| {
                    // `$exclusive/` and `$limit/N/` ones: by the filter they carry.
                    let f = parse_subscription(raw, limits).map_or(raw.as_str(), |p| p.filter);
                    filter_matches(f, topic)
                })
            })
            .filter_map(|(c, m)| {
                let (to, l) = m.stays.last()?.left?;
                Some((c.clone(), to, l.epoch))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{LinkKey, Release, Verdict, Via, CUT_GRACE, ORDER_HOLD};
    use super::*;

    const A: u64 = 1;
    const B: u64 = 2;

    fn id() -> Arc<str> {
        Arc::from("c")
    }

    /// A relay and a judgement of a cut come back from their records as they were,
    /// judging copies as before; the relay's copies are matched by topic.
    #[test]
    fn a_restarted_node_judges_a_move_as_before_from_its_record() {
        let now = starling_rt::time::now();
        let l = TopicLimits::default();
        let (mut a, mut b) = (Moves::default(), Moves::default());
        a.went(id(), B, 7, now);
        a.relay_filters("c", vec!["$exclusive/t/#".into()]);
        a.cut("c", (B, 7), 12, A, now);
        b.came(id(), 7, now);
        b.cut("c", (B, 7), 12, B, now);
        let rows = |m: &mut Moves| -> Vec<Vec<u8>> {
            m.take_dirty().into_iter().filter_map(|(_, r)| r).collect()
        };
        let (a_rows, b_rows) = (rows(&mut a), rows(&mut b));
        assert_eq!((a_rows.len(), b_rows.len()), (1, 1));
        assert!(a.take_dirty().is_empty(), "nothing changed since");

        let later = now + CUT_GRACE * 4;
        let mut a2 = Moves::default();
        // Another shard's row of the same session adds its filters.
        let mut other = Moves::default();
        other.went(id(), B, 7, now);
        other.relay_filters("c", vec!["u".into()]);
        let mut a_all = a_rows.clone();
        a_all.extend(rows(&mut other));
        assert!(a2.restore(id(), &a_all, later));
        assert!(
            !a2.restore(id(), &[vec![9, 9]], later),
            "an unreadable record"
        );
        assert_eq!(
            a2.verdict("c", 11, Via::Direct, starling_rt::time::now()),
            Some(Verdict::Relay(B, 7))
        );
        assert_eq!(
            a2.verdict("c", 12, Via::Direct, starling_rt::time::now()),
            Some(Verdict::Skip)
        );
        assert_eq!(a2.restored_relays("t/x", 11, &l), vec![(id(), B, 7)]);
        assert_eq!(a2.restored_relays("u", 11, &l), vec![(id(), B, 7)]);
        assert!(
            a2.restored_relays("t/x", 12, &l).is_empty(),
            "routed at the cut"
        );
        assert!(
            a2.restored_relays("v", 11, &l).is_empty(),
            "no filter of it"
        );
        // Stored again under the restored shard's own row.
        assert_eq!(a2.take_dirty().len(), 1);

        let mut b2 = Moves::default();
        assert!(b2.restore(id(), &b_rows, later));
        assert_eq!(
            b2.verdict("c", 11, Via::Direct, starling_rt::time::now()),
            Some(Verdict::Skip)
        );
        assert_eq!(
            b2.verdict("c", 12, Via::Direct, starling_rt::time::now()),
            Some(Verdict::Deliver)
        );
        assert!(
            b2.restored_relays("t/x", 11, &l).is_empty(),
            "the session is here"
        );

        // Its grace starts again at the restart; then it ends once through, and its
        // record goes (a restored relay has nothing in the router to take down).
        a2.through(12);
        assert_eq!(a2.expire(later + CUT_GRACE / 2), (Vec::new(), 0));
        assert!(a2.take_dirty().is_empty());
        assert_eq!(a2.expire(later + CUT_GRACE), (Vec::new(), 0));
        assert!(a2.is_empty());
        assert_eq!(a2.take_dirty(), vec![(id(), None)]);
        assert!(a2.restored_relays("t/x", 11, &l).is_empty());
    }

    /// The order across a move comes back from its record, held again from the restart on
    /// for the hold's time; once over, the record says so. A record of the first layout
    /// still reads, without an order.
    #[test]
    fn a_restarted_node_holds_a_moved_sessions_order_again() {
        let now = starling_rt::time::now();
        let rows = |m: &mut Moves| -> Vec<Vec<u8>> {
            m.take_dirty().into_iter().filter_map(|(_, r)| r).collect()
        };
        let mut b = Moves::default();
        b.came(id(), 7, now);
        b.keep_order("c", A);
        b.installed("c", || vec!["t/#".into()]);
        b.cut("c", (B, 7), 12, B, now);
        let b_rows = rows(&mut b);

        let later = now + CUT_GRACE;
        let c_link: LinkKey = (3, 0, 1);
        let mut b2 = Moves::default();
        assert!(b2.restore(id(), &b_rows, later));
        assert!(b2.may_hold());
        assert!(b2.holds("c", c_link, 12, "t/1", later));
        assert!(!b2.holds("c", c_link, 11, "t/1", later), "before the cut");
        assert!(!b2.holds("c", (A, 0, 1), 12, "t/1", later), "A's own link");
        assert!(!b2.holds("c", c_link, 12, "u/1", later), "not handed over");
        assert_eq!(b2.release("c", 7, c_link, Arc::from("t/1")), Release::Taken);
        assert!(!b2.holds("c", c_link, 12, "t/1", later));
        assert!(b2.holds("c", c_link, 12, "t/2", later));
        assert!(!b2.holds("c", c_link, 12, "t/2", later + ORDER_HOLD));
        b2.take_dirty();
        b2.expire(later + ORDER_HOLD);
        assert!(!b2.may_hold());
        let mut b3 = Moves::default();
        assert!(b3.restore(id(), &rows(&mut b2), later));
        assert!(!b3.may_hold(), "the hold was over when it was stored");

        let v1 = MoveRecordV1 {
            stays: vec![StayRecord {
                came: Some(MoveKept {
                    epoch: 7,
                    cut: Some(12),
                }),
                left: None,
            }],
            filters: Vec::new(),
        };
        let v1 = postcard::to_extend(&v1, vec![RECORD_V1]).expect("a v1 record");
        let mut b4 = Moves::default();
        assert!(b4.restore(id(), &[v1], later));
        assert_eq!(
            b4.verdict("c", 12, Via::Direct, starling_rt::time::now()),
            Some(Verdict::Deliver)
        );
        assert_eq!(
            b4.verdict("c", 11, Via::Direct, starling_rt::time::now()),
            Some(Verdict::Skip)
        );
        assert!(!b4.may_hold());
    }
}
