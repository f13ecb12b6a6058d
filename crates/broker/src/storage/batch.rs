//! The storage actor's pending batch: what the next commit writes, with whom it answers.
//! Sans-IO, so its one rule can be tested alone: a delivery record retired while still
//! pending leaves the batch with its retirement (two holes), and a waiter whose ops all
//! became holes is answered at once instead of by the commit.

use std::collections::HashMap;
use std::ops::Range;

use crate::msg::StoreOp;

/// A seq in `Batch::puts` put more than once in the batch (a record and a change of its
/// stage by a second put): its retirement is written, not cancelled.
const PUT_AGAIN: usize = usize::MAX;

/// A waiter on the batch; `W` is whom to tell.
struct Waiting<W> {
    /// `None` once told.
    to: Option<W>,
    range: Range<usize>,
    /// Ops of `range` that are not holes.
    live: usize,
    /// May be told before the commit when all its ops are holes.
    early: bool,
}

pub(super) struct Batch<W> {
    /// `None` where a record and its retirement cancelled out: a hole keeps every index
    /// (waiters', retained puts', held deliveries') where it was.
    ops: Vec<Option<StoreOp>>,
    /// The delivery records of `ops` by seq (a seq is this node's and put once, but for a
    /// second put in the same batch), for the retirements that cancel them.
    puts: HashMap<u64, usize>,
    holes: usize,
    /// In the order they came, so their ranges ascend.
    waiting: Vec<Waiting<W>>,
}

/// A batch taken for its commit.
pub(super) struct Taken<W> {
    /// The ops to write, holes out.
    pub ops: Vec<StoreOp>,
    /// The batch index of each of `ops`; empty when there were no holes (the same indices).
    pub live: Vec<usize>,
    /// The waiters not told yet, with their ranges (batch indices).
    pub waiting: Vec<(W, Range<usize>)>,
}

impl<W> Default for Batch<W> {
    fn default() -> Self {
        Self {
            ops: Vec::new(),
            puts: HashMap::new(),
            holes: 0,
            waiting: Vec::new(),
        }
    }
}

impl<W> Batch<W> {
    /// Ops and holes: the index the next write's first op gets.
    pub(super) fn len(&self) -> usize {
        self.ops.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    pub(super) fn has_waiters(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// One write: its waiters (ranges into `ops`; `early` when the waiter may be told
    /// before the commit) and its ops. Returns the waiters whose ops all cancelled out
    /// (to be told now) and how many records were cancelled.
    pub(super) fn add(
        &mut self,
        ops: Vec<StoreOp>,
        then: impl IntoIterator<Item = (W, Range<usize>, bool)>,
    ) -> (Vec<W>, u64) {
        let base = self.ops.len();
        self.waiting.extend(then.into_iter().map(|(to, r, early)| {
            debug_assert!(r.end <= ops.len(), "a waiter past its write");
            let range = r.start + base..r.end + base;
            Waiting {
                to: Some(to),
                live: range.len(),
                range,
                early,
            }
        }));
        self.ops.reserve(ops.len());
        let (mut told, mut cancelled) = (Vec::new(), 0);
        for op in ops {
            if self.push(op, &mut told) {
                cancelled += 1;
            }
        }
        (told, cancelled)
    }

    /// Appends one op, or a hole for it and its record when it retires a record still
    /// pending. Whether it cancelled one.
    fn push(&mut self, op: StoreOp, told: &mut Vec<W>) -> bool {
        let at = self.ops.len();
        match op.delivery_key() {
            Some((_, seq, true)) => {
                self.puts
                    .entry(seq)
                    .and_modify(|i| *i = PUT_AGAIN)
                    .or_insert(at);
            }
            Some((client_id, seq, false)) => {
                // Another client's seq is left alone, and so is its record's entry (found by
                // the property test: dropped here, a later put of the seq looked like its
                // only one).
                let found = self.puts.get(&seq).copied().filter(|&i| i != PUT_AGAIN);
                if let Some(i) = found {
                    let same = self.ops[i]
                        .as_ref()
                        .and_then(StoreOp::delivery_key)
                        .is_some_and(|(c, _, put)| put && c == client_id);
                    if same {
                        self.puts.remove(&seq);
                        self.ops[i] = None;
                        self.ops.push(None);
                        self.holes += 2;
                        self.hole_at(i, told);
                        self.hole_at(at, told);
                        return true;
                    }
                }
            }
            None => {}
        }
        self.ops.push(Some(op));
        false
    }

    /// `ops[k]` became a hole: the waiter whose range holds it has one op less to wait
    /// for, and one with none left is told now (when it may be).
    fn hole_at(&mut self, k: usize, told: &mut Vec<W>) {
        let n = self.waiting.partition_point(|w| w.range.start <= k);
        // The writers' ranges are disjoint and ascend (one per publish, forwarded batch or
        // client write). Were they not, the one found might not hold `k`: then none is
        // counted down, and the waiter that does waits for the commit, as without holes.
        let Some(w) = n.checked_sub(1).map(|n| &mut self.waiting[n]) else {
            return;
        };
        if !w.range.contains(&k) {
            return;
        }
        w.live -= 1;
        if w.live == 0 && w.early {
            told.extend(w.to.take());
        }
    }

    /// Everything, for a commit; the batch is empty after.
    pub(super) fn take(&mut self) -> Taken<W> {
        self.puts.clear();
        let holes = std::mem::take(&mut self.holes);
        let ops = std::mem::take(&mut self.ops);
        let (ops, live) = if holes == 0 {
            (ops.into_iter().flatten().collect(), Vec::new())
        } else {
            let mut live = Vec::with_capacity(ops.len() - holes);
            let ops = ops
                .into_iter()
                .enumerate()
                .filter_map(|(i, op)| op.inspect(|_| live.push(i)))
                .collect();
            (ops, live)
        };
        let waiting = std::mem::take(&mut self.waiting)
            .into_iter()
            .filter_map(|w| w.to.map(|to| (to, w.range)))
            .collect();
        Taken { ops, live, waiting }
    }
}

#[cfg(test)]
#[path = "batch_tests.rs"]
mod tests;
