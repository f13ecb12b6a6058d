//! A copy forwarded on from another node's batch is parked before it is sent
//! (`remote::park_forwarded_on`), and goes once its row is durable.

use std::sync::atomic::Ordering;

use starling_store::Op;

use crate::destination::{remote_key, Destination, Flushed, Park, RemoteNode};
use crate::msg::{RouterMsg, StoreOp, Stored};
use crate::routing::testkit::{message, shard};
use crate::routing::RouterActor;

struct Sink;

impl starling_rt::Actor for Sink {
    type Msg = RouterMsg;
    async fn handle(&mut self, _: RouterMsg, _: &mut starling_rt::Ctx<Self>) {}
}

fn node(shard: &mut RouterActor, n: u64) -> &mut RemoteNode {
    match shard.destinations.get_mut(&remote_key(n)) {
        Some(Destination::Remote(r)) => r,
        _ => panic!("node {n}'s destination"),
    }
}

/// Flushes node `n`'s destination as the shard's burst end does.
fn flush(shard: &mut RouterActor, n: u64) -> Flushed {
    match shard.destinations.get_mut(&remote_key(n)) {
        Some(d) => d.flush(0, None),
        None => panic!("node {n}'s destination"),
    }
}

/// The outbox rows the shard writes, as (node, batch, messages).
fn rows(shard: &RouterActor) -> Vec<(u64, u64, u32)> {
    shard
        .to_store
        .iter()
        .filter_map(|op| match op {
            StoreOp::Op(o) => match &**o {
                Op::PutOutbox(b) => Some((b.node, b.seq, b.messages)),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// A shard whose link to node 7 (incarnation 9) holds two batches, parked as a copy
/// forwarded on was routed: a local publisher's copy under routes' index 10 (key 3), and
/// the copy forwarded on under index 11 (key 5). Their rows are being written.
fn two_held() -> (std::sync::Arc<crate::settings::Shared>, RouterActor) {
    let (shared, mut shard) = shard();
    let mut r = RemoteNode::new(7, starling_raft::DataLinks::default(), 9);
    r.pending.push_back((message(), Some(3), None, 10));
    r.pending.push_back((message(), Some(5), None, 11));
    shard
        .destinations
        .insert(remote_key(7), Destination::Remote(r));
    shard.remote_nodes.push(7);
    let me = starling_rt::start(Sink).downgrade();
    shard.park_forwarded_on(5, &me);
    (shared, shard)
}

/// What waits for a node, the copy forwarded on last, is parked at once in a batch per
/// routes' index; nothing goes (not even what comes after) until its row is durable, and
/// then the batch goes in its place. Another node's waiting messages are left alone.
#[tokio::test]
async fn a_copy_forwarded_on_is_parked_with_what_waits_before_it_and_goes_once_durable() {
    let (shared, mut shard) = shard();
    for n in [7, 8] {
        let r = RemoteNode::new(n, starling_raft::DataLinks::default(), 9);
        shard
            .destinations
            .insert(remote_key(n), Destination::Remote(r));
        shard.remote_nodes.push(n);
    }
    let r = node(&mut shard, 7);
    // A local publisher's copy (key 3), then the copy forwarded on (key 5), under the
    // next routes' index.
    r.pending.push_back((message(), Some(3), None, 10));
    r.pending.push_back((message(), None, None, 10));
    r.pending.push_back((message(), Some(5), None, 11));
    node(&mut shard, 8)
        .pending
        .push_back((message(), Some(4), None, 10));
    let me = starling_rt::start(Sink).downgrade();

    shard.park_forwarded_on(6, &me);
    assert!(rows(&shard).is_empty(), "nothing from key 6 on waits");
    shard.park_forwarded_on(5, &me);

    assert_eq!(rows(&shard), vec![(7, 1, 2), (7, 2, 1)]);
    let r = node(&mut shard, 7);
    assert!(r.pending.is_empty());
    assert_eq!(r.held_batches, 2);
    assert_eq!(r.parked_messages, 3);
    assert_eq!(r.in_flight(), 0, "parked: out of the window");
    let batches: Vec<_> = r.unacked.iter().map(|u| (u.seq, u.held, u.park)).collect();
    assert_eq!(
        batches,
        vec![(1, true, Park::Writing), (2, true, Park::Writing)]
    );
    assert_eq!(r.unacked[0].keys, vec![3]);
    assert_eq!(node(&mut shard, 8).pending.len(), 1, "another node's stay");

    // A later copy waits behind them: a flush sends nothing (the link would refuse it:
    // it is closed, and what waits would be given up).
    let r = node(&mut shard, 7);
    r.pending.push_back((message(), Some(9), None, 11));
    assert_eq!(flush(&mut shard, 7), Flushed::Done);
    let r = node(&mut shard, 7);
    assert_eq!((r.pending.len(), r.lost.len()), (1, 0));

    // The first row is durable: that batch goes now, the second still waits for its own.
    shard.parked(7, 1, Stored::Durable);
    let r = node(&mut shard, 7);
    assert_eq!(r.held_batches, 1);
    assert_eq!(
        (r.unacked[0].held, r.unacked[0].park),
        (false, Park::Parked)
    );
    assert_eq!(r.resend, Some((1, 1)));
    assert!(shard.dirty.contains(&remote_key(7)));
    assert_eq!(
        shared.metrics.cluster_outbox_parked.load(Ordering::Relaxed),
        2
    );
    shard.parked(7, 2, Stored::Failed);
    let r = node(&mut shard, 7);
    assert_eq!(r.held_batches, 0);
    assert_eq!(
        (r.unacked[1].held, r.unacked[1].park),
        (false, Park::Unbacked)
    );
    assert_eq!(r.resend, Some((1, 2)), "it goes as well, unbacked");
}

/// The store's answers for two held batches may come the other way round: the later one
/// still does not go before the earlier one may.
#[tokio::test]
async fn a_held_batch_answered_first_waits_for_the_one_before_it() {
    let (_shared, mut shard) = two_held();

    shard.parked(7, 2, Stored::Durable);
    assert_eq!(node(&mut shard, 7).resend, Some((2, 2)));
    assert_eq!(flush(&mut shard, 7), Flushed::Done);
    // Tried, it would have found the link closed and given the resend up.
    assert_eq!(node(&mut shard, 7).resend, Some((2, 2)), "batch 2 waits");

    shard.parked(7, 1, Stored::Durable);
    let r = node(&mut shard, 7);
    assert_eq!((r.held_batches, r.resend), (0, Some((1, 2))));
}

/// A node that asks for batches again is sent those before the first held one: the held
/// ones go in order once they may, and are not counted as sent again.
#[tokio::test]
async fn batches_asked_for_again_count_only_those_before_a_held_one() {
    let (shared, mut shard) = two_held();
    shard.parked(7, 1, Stored::Durable);

    shard.forward_resend(7, 9, 1);
    assert_eq!(
        shared
            .metrics
            .cluster_forward_resent
            .load(Ordering::Relaxed),
        1,
        "batch 1 goes again, batch 2 is still held"
    );
    assert_eq!(node(&mut shard, 7).resend, Some((1, 2)));
}

/// Without an outbox, batches not acknowledged in time are given up from the front of the
/// window, but never a parked one (a copy forwarded on is parked whatever the outbox's
/// bound): the link cannot skip it, so a late batch behind it waits with it, and is given
/// up once the parked one is acknowledged.
#[tokio::test]
async fn without_an_outbox_a_parked_batch_is_never_given_up_nor_what_is_behind_it() {
    let (_shared, mut shard) = two_held();
    let timeout = std::time::Duration::from_secs(2);
    let r = node(&mut shard, 7);
    let t0 = starling_rt::time::now();
    let late = t0 + timeout * 3;
    r.unacked.push_back(crate::destination::Unacked {
        seq: 3,
        sent_at: t0,
        last_sent: t0,
        keys: vec![8],
        messages: vec![(message(), None)],
        routed_at: 11,
        park: Park::No,
        held: false,
    });
    r.unacked_messages += 1;

    assert!(
        r.give_up_late(late, timeout, |_| false).is_empty(),
        "the parked batch stays"
    );
    assert_eq!(r.unacked.len(), 3);

    // The two parked batches acknowledged: the late one behind them goes now.
    r.unacked.drain(..2);
    assert!(
        r.give_up_late(t0, timeout, |_| false).is_empty(),
        "not late yet"
    );
    assert_eq!(r.give_up_late(late, timeout, |_| false), vec![8]);
    assert!(r.unacked.is_empty());
    assert_eq!(r.unacked_messages, 0);
}

/// Without a store a copy forwarded on is kept in memory, not parked: its batch, late, is
/// neither given up nor counted in the window any more, and stays to be sent again; a
/// batch late behind it is kept too (the link cannot skip a batch), its publishers told
/// it is not confirmed; the batch late in front of it is given up as before.
#[test]
fn without_a_store_a_late_batch_with_a_kept_copy_stays_and_so_does_what_is_behind_it() {
    let t0 = starling_rt::time::now();
    let timeout = std::time::Duration::from_secs(2);
    let late = t0 + timeout * 3;
    let mut r = RemoteNode::new(7, starling_raft::DataLinks::default(), 9);
    // Batch 1: a publisher's copy (key 2); 2: a kept copy (key 4) beside a publisher's
    // (key 6); 3: a publisher's (key 8); 4: a publisher's, not late yet (key 10).
    for (seq, keys, sent_at) in [
        (1, vec![2], t0),
        (2, vec![4, 6], t0),
        (3, vec![8], t0),
        (4, vec![10], late),
    ] {
        let n = keys.len();
        r.unacked.push_back(crate::destination::Unacked {
            seq,
            sent_at,
            last_sent: sent_at,
            keys,
            messages: vec![(message(), None); n],
            routed_at: 11,
            park: Park::No,
            held: false,
        });
        r.unacked_messages += n;
    }
    let kept = |k: u64| k == 4;

    assert_eq!(r.give_up_late(late, timeout, kept), vec![2, 6, 8]);
    let left: Vec<_> = r
        .unacked
        .iter()
        .map(|u| (u.seq, u.park, u.keys.clone()))
        .collect();
    assert_eq!(
        left,
        vec![
            (2, Park::Unbacked, vec![4]),
            (3, Park::Unbacked, vec![]),
            (4, Park::No, vec![10]),
        ]
    );
    assert_eq!((r.unacked_messages, r.parked_messages), (1, 3));

    // Later still, the last one is late too: kept behind the others, nothing given up twice.
    let later = late + timeout * 3;
    assert_eq!(r.give_up_late(later, timeout, kept), vec![10]);
    assert_eq!(r.unacked.len(), 3);
    assert_eq!((r.unacked_messages, r.parked_messages), (0, 4));
}

/// A batch kept in memory (no store) that its node then acknowledges goes, with no outbox
/// row to drop: a shard without a store writes nothing.
#[tokio::test]
async fn without_a_store_a_kept_batch_acknowledged_goes_and_writes_nothing() {
    let (_shared, mut shard) = shard();
    let mut r = RemoteNode::new(7, starling_raft::DataLinks::default(), 9);
    let t0 = starling_rt::time::now();
    r.unacked.push_back(crate::destination::Unacked {
        seq: 1,
        sent_at: t0,
        last_sent: t0,
        keys: vec![4],
        messages: vec![(message(), None)],
        routed_at: 11,
        park: Park::Unbacked,
        held: false,
    });
    r.parked_messages = 1;
    shard
        .destinations
        .insert(remote_key(7), Destination::Remote(r));
    shard.remote_nodes.push(7);
    let me = starling_rt::start(Sink).downgrade();

    shard.forward_acked(7, 9, 1, me);

    let r = node(&mut shard, 7);
    assert!(r.unacked.is_empty());
    assert_eq!(r.parked_messages, 0);
    assert!(shard.to_store.is_empty(), "no store: no row to drop");
}

/// In the middle of a burst a node's waiting list goes only once it fills a frame (256),
/// or when batches are to be sent again first.
#[test]
fn a_partial_batch_may_wait_for_more_unless_it_fills_a_frame_or_a_resend_is_due() {
    let mut r = RemoteNode::new(7, starling_raft::DataLinks::default(), 9);
    for _ in 0..255 {
        r.pending.push_back((message(), None, None, 1));
    }
    assert!(r.may_wait_for_more());
    r.resend = Some((1, 1));
    assert!(!r.may_wait_for_more(), "a resend goes at once");
    r.resend = None;
    r.pending.push_back((message(), None, None, 1));
    assert!(!r.may_wait_for_more(), "a whole frame goes");
}
