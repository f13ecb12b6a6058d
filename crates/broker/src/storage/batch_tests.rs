//! The pending batch against a model: what it commits leaves the store as the writes one
//! by one would, and a waiter is told early exactly when all its ops cancelled out.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use proptest::prelude::*;
use starling_codec::{Properties, QoS};
use starling_session::{DeliveryOptions, Message};
use starling_store::Op;

use super::Batch;
use crate::msg::StoreOp;

const CLIENTS: [&str; 2] = ["a", "b"];

fn message() -> Arc<Message> {
    Arc::new(Message {
        topic: Arc::from("t"),
        payload: Bytes::from_static(b"p"),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: Properties::default(),
        expires_at: None,
        publisher: None,
        shared_headers: Default::default(),
        received_at: None,
    })
}

/// An op as the test draws it.
#[derive(Debug, Clone)]
enum Draw {
    /// A new record of client `c` (a fresh seq).
    Put(usize),
    /// The record of the `n`th put so far put again (a stage change), as a store op.
    PutAgain(usize),
    /// Retires the `n`th put so far, by client `c` (maybe not its own).
    Retire(usize, usize),
    /// Retires a seq committed before this batch.
    RetireOld(usize, u64),
    Other,
}

fn draw() -> impl Strategy<Value = Draw> {
    prop_oneof![
        4 => (0..2usize).prop_map(Draw::Put),
        1 => any::<usize>().prop_map(Draw::PutAgain),
        4 => (any::<usize>(), 0..2usize).prop_map(|(n, c)| Draw::Retire(n, c)),
        1 => (0..2usize, 0..4u64).prop_map(|(c, s)| Draw::RetireOld(c, s)),
        1 => Just(Draw::Other),
    ]
}

/// A write: its ops, and cut points splitting them into waiters' ranges, each early or not.
fn write() -> impl Strategy<Value = (Vec<Draw>, Vec<(usize, bool)>)> {
    (
        prop::collection::vec(draw(), 1..8),
        prop::collection::vec((0..8usize, any::<bool>()), 0..4),
    )
}

/// What an op does to the set of stored (client, seq) records.
fn apply(set: &mut BTreeSet<(String, u64)>, op: &Op) {
    match op {
        Op::PutDelivery { client_id, seq, .. } => {
            set.insert((client_id.clone(), *seq));
        }
        Op::DropDelivery { client_id, seq } => {
            set.remove(&(client_id.clone(), *seq));
        }
        _ => {}
    }
}

fn op(s: StoreOp) -> Op {
    s.into_op(starling_rt::time::now(), starling_rt::time::wall())
}

proptest! {
    #[test]
    fn a_batch_commits_what_its_writes_would_and_tells_early_only_what_cancelled_out(
        writes in prop::collection::vec(write(), 1..6),
    ) {
        let msg = message();
        let opts = DeliveryOptions { qos: QoS::AtLeastOnce, ..DeliveryOptions::default() };
        let mut batch: Batch<usize> = Batch::default();
        // Seqs 0..4 were committed before (for either client); new ones start at 100.
        let before: BTreeSet<(String, u64)> =
            (0..4).flat_map(|s| CLIENTS.map(|c| (c.to_string(), s))).collect();
        let mut puts: Vec<(usize, u64)> = Vec::new();
        let mut next_seq = 100;
        let mut all: Vec<Op> = Vec::new();
        let mut waiters: Vec<(std::ops::Range<usize>, bool)> = Vec::new();
        let mut told: HashSet<usize> = HashSet::new();
        for (draws, cuts) in writes {
            let base = all.len();
            let mut ops = Vec::new();
            for d in draws {
                let s = match d {
                    Draw::Put(c) => {
                        let seq = next_seq;
                        next_seq += 1;
                        puts.push((c, seq));
                        StoreOp::delivery(Arc::from(CLIENTS[c]), seq, &msg, &opts)
                    }
                    Draw::PutAgain(n) if !puts.is_empty() => {
                        let (c, seq) = puts[n % puts.len()];
                        StoreOp::from(op(StoreOp::delivery(Arc::from(CLIENTS[c]), seq, &msg, &opts)))
                    }
                    Draw::Retire(n, c) if !puts.is_empty() => {
                        let (_, seq) = puts[n % puts.len()];
                        StoreOp::Retire { client_id: Arc::from(CLIENTS[c]), seq }
                    }
                    Draw::RetireOld(c, seq) => StoreOp::from(Op::DropDelivery {
                        client_id: CLIENTS[c].to_string(),
                        seq,
                    }),
                    _ => StoreOp::from(Op::DropRetained { topic: "r".into() }),
                };
                all.push(op(s.clone()));
                ops.push(s);
            }
            // Waiters over consecutive, disjoint ranges of this write.
            let n = ops.len();
            let mut cuts: Vec<(usize, bool)> = cuts.into_iter().map(|(c, e)| (c % (n + 1), e)).collect();
            cuts.sort_by_key(|c| c.0);
            let mut then = Vec::new();
            let mut start = 0;
            for (end, early) in cuts {
                if end > start {
                    let id = waiters.len();
                    waiters.push((base + start..base + end, early));
                    then.push((id, start..end, early));
                    start = end;
                }
            }
            let (now, _) = batch.add(ops, then);
            told.extend(now);
        }
        let taken = batch.take();
        // The commit leaves the store as every op in order would.
        let mut want = before.clone();
        all.iter().for_each(|o| apply(&mut want, o));
        let mut got = before.clone();
        let committed: Vec<Op> = taken.ops.into_iter().map(op).collect();
        committed.iter().for_each(|o| apply(&mut got, o));
        prop_assert_eq!(&got, &want);
        // `live` names where each committed op stood.
        let live: Vec<usize> = if taken.live.is_empty() {
            (0..committed.len()).collect()
        } else {
            taken.live.clone()
        };
        prop_assert_eq!(live.len(), committed.len());
        for (o, &i) in committed.iter().zip(&live) {
            prop_assert_eq!(o, &all[i]);
        }
        // Told early exactly when early and every op of its range is a hole; every other
        // waiter is left for the commit, once.
        let live: HashSet<usize> = live.into_iter().collect();
        let later: HashSet<usize> = taken.waiting.iter().map(|(w, _)| *w).collect();
        prop_assert_eq!(later.len(), taken.waiting.len());
        for (id, (range, early)) in waiters.iter().enumerate() {
            let cancelled = range.clone().all(|i| !live.contains(&i));
            prop_assert_eq!(told.contains(&id), *early && cancelled, "waiter {} {:?}", id, range);
            prop_assert_eq!(later.contains(&id), !told.contains(&id));
        }
        for (w, range) in &taken.waiting {
            prop_assert_eq!(range, &waiters[*w].0);
        }
    }
}

#[test]
fn a_record_retired_in_the_batch_leaves_with_its_retirement_and_tells_its_publisher() {
    let msg = message();
    let opts = DeliveryOptions::default();
    let mut batch: Batch<&str> = Batch::default();
    let put = StoreOp::delivery(Arc::from("s"), 7, &msg, &opts);
    let (told, n) = batch.add(vec![put], [("publisher", 0..1, true)]);
    assert!(told.is_empty());
    assert_eq!(n, 0);
    let retire = StoreOp::Retire {
        client_id: Arc::from("s"),
        seq: 7,
    };
    let (told, n) = batch.add(vec![retire], [("own write", 0..1, false)]);
    assert_eq!((told, n), (vec!["publisher"], 1));
    let taken = batch.take();
    assert!(taken.ops.is_empty());
    assert_eq!(
        taken.waiting.len(),
        1,
        "the client's own write waits for the commit"
    );
    assert!(batch.is_empty());
}
