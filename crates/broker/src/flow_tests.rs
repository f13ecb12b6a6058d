//! The back-pressure state machines, driven by hand: time jumps, reports and checks in,
//! outcomes out.

use std::time::Duration;

use super::*;

fn rules() -> StallRules {
    StallRules {
        stall: Duration::from_secs(2),
        max: Duration::from_secs(10),
        stalls_max: 2,
        window: Duration::from_secs(60),
        high: 50,
        low: 25,
    }
}

fn t0() -> Instant {
    starling_rt::time::now()
}

/// An actor that takes any message: a publisher to hold and release.
struct Sink;

impl starling_rt::Actor for Sink {
    type Msg = ClientMsg;
    async fn handle(&mut self, _: ClientMsg, _: &mut starling_rt::Ctx<Self>) {}
}

fn report(taken: u64, queued: usize) -> FlowReport {
    FlowReport {
        taken,
        queued,
        saturated: false,
        progressed: false,
    }
}

fn holder(n: u64) -> Holder {
    let addr = starling_rt::start(Sink);
    (ActorId(n), addr.downgrade(), 0, true)
}

#[tokio::test]
async fn a_subscriber_is_backlogged_from_high_until_down_to_low() {
    let (r, now) = (rules(), t0());
    let mut b = Backlog::new(now, true);
    b.handed(30);
    assert!(
        !b.judge(|| now, 10, &r).0,
        "40 waiting: under the high mark"
    );
    let (holds, o) = b.judge(|| now, 20, &r);
    let o = o.expect("a stretch begins");
    assert!(holds, "30 in its mailbox and 20 pending");
    assert_eq!(o.watch, Some(true), "the stretch begins: watch it");
    assert_eq!(o.check_at, Some(now + r.stall));
    assert!(b.hold(holder(7)));
    assert!(!b.hold(holder(7)), "once per publisher and stretch");
    // It took 10 and queued them: still 40 waiting, over the low mark.
    let o = b.report(now, report(10, 10), 20, &r);
    assert!(o.release.is_empty() && o.watch.is_none());
    assert!(b.judge(|| now, 20, &r).0);
    // It took everything and sent most of it out.
    let o = b.report(now, report(30, 5), 0, &r);
    assert_eq!(o.release.len(), 1, "the held publisher goes");
    assert_eq!(o.watch, Some(false));
    assert!(!b.judge(|| now, 0, &r).0);
}

#[test]
fn what_is_on_its_way_counts_as_waiting() {
    let now = t0();
    let mut b = Backlog::new(now, true);
    b.handed(7);
    b.report(now, report(3, 3), 0, &rules());
    assert_eq!(
        b.waiting(2),
        3 + 4 + 2,
        "queued, in its mailbox, pending here"
    );
}

#[tokio::test]
async fn a_subscriber_that_takes_nothing_in_stalls_and_releases_its_publishers() {
    let (r, now) = (rules(), t0());
    let mut b = Backlog::new(now, true);
    b.handed(60);
    let (_, o) = b.judge(|| now, 0, &r);
    let at = o.and_then(|o| o.check_at).unwrap();
    b.hold(holder(1));
    b.hold(holder(2));
    // Progress one second in: the check finds it alive and looks again later.
    let o = b.report(now + Duration::from_secs(1), report(5, 50), 0, &r);
    assert!(o.release.is_empty());
    let o = b.check(at, b.epoch(), &r);
    assert!(!o.stalled);
    assert_eq!(o.check_at, Some(now + Duration::from_secs(3)));
    // Nothing more for two seconds: stalled.
    let o = b.check(now + Duration::from_secs(3), b.epoch(), &r);
    assert!(o.stalled);
    assert_eq!(o.release.len(), 2);
    assert!(!b.judge(|| now, 0, &r).0, "stuck: it holds no one");
    // It drains: it may hold again.
    b.report(now + Duration::from_secs(4), report(60, 0), 0, &r);
    b.handed(60);
    assert!(b.judge(|| now, 0, &r).0);
}

#[test]
fn a_subscriber_backlogged_past_the_maximum_stalls_even_while_it_progresses() {
    let (r, now) = (rules(), t0());
    let mut b = Backlog::new(now, true);
    b.handed(100);
    b.judge(|| now, 0, &r);
    let mut t = now;
    let mut taken = 0;
    let stalled = loop {
        t += Duration::from_secs(1);
        taken += 1;
        b.report(t, report(taken, 90), 0, &r);
        let o = b.check(t, b.epoch(), &r);
        if o.stalled {
            break t;
        }
    };
    assert_eq!(stalled, now + r.max);
}

#[test]
fn a_subscriber_that_stalls_too_often_holds_no_one_for_the_window() {
    let (r, now) = (rules(), t0());
    let mut b = Backlog::new(now, true);
    let mut t = now;
    for stall in 0..r.stalls_max {
        b.handed(60);
        assert!(
            b.judge(|| t, 0, &r).0,
            "stall {stall}: holds again after draining"
        );
        t += r.stall;
        assert!(b.check(t, b.epoch(), &r).stalled);
        b.report(t, report(60 * u64::from(stall + 1), 0), 0, &r);
    }
    b.handed(60);
    assert!(!b.judge(|| t, 0, &r).0, "over budget: drained or not");
    // A new window: held again once drained.
    t = now + r.window + r.stall * 3;
    b.report(t, report(60 * u64::from(r.stalls_max + 1), 0), 0, &r);
    b.handed(60);
    assert!(b.judge(|| t, 0, &r).0);
}

#[test]
fn a_check_from_an_ended_stretch_does_nothing() {
    let (r, now) = (rules(), t0());
    let mut b = Backlog::new(now, true);
    b.handed(60);
    b.judge(|| now, 0, &r);
    let old = b.epoch();
    b.report(now, report(60, 0), 0, &r);
    b.handed(60);
    b.judge(|| now, 0, &r);
    assert_ne!(b.epoch(), old);
    let o = b.check(now + Duration::from_secs(5), old, &r);
    assert!(!o.stalled && o.check_at.is_none());
}

#[tokio::test]
async fn an_offline_or_excluded_subscriber_never_holds() {
    let (r, now) = (rules(), t0());
    let mut b = Backlog::new(now, false);
    b.handed(100);
    assert!(!b.judge(|| now, 0, &r).0, "excluded");
    let mut b = Backlog::new(now, true);
    b.handed(100);
    assert!(b.judge(|| now, 0, &r).0);
    b.hold(holder(3));
    let o = b.presence(false, true, false);
    assert_eq!(o.release.len(), 1, "offline: its publishers go");
    assert_eq!(o.watch, Some(false));
    assert!(!b.judge(|| now, 0, &r).0);
}

#[test]
fn a_publisher_is_held_by_the_latest_hold_until_that_one_releases_it() {
    let mut h = Holds::default();
    assert!(!h.is_held());
    h.hold(0, ActorId(1));
    h.hold(1, ActorId(2));
    h.release(0, ActorId(1));
    assert!(h.is_held(), "an earlier holder's release does not free it");
    assert_eq!(h.epoch(), 0);
    h.release(1, ActorId(2));
    assert!(!h.is_held());
    assert_eq!(h.epoch(), 1, "released: its publishes carry a new epoch");
}

#[tokio::test]
async fn a_shard_holds_a_released_publisher_again_in_its_new_epoch() {
    let (r, now) = (rules(), t0());
    let mut b = Backlog::new(now, true);
    b.handed(60);
    assert!(b.judge(|| now, 0, &r).0);
    let (id, addr, _, _) = holder(9);
    assert!(b.hold((id, addr.clone(), 0, true)));
    assert!(b.is_holding(id, 0));
    assert!(
        !b.hold((id, addr.clone(), 0, true)),
        "same epoch: held already"
    );
    assert!(
        b.hold((id, addr, 1, true)),
        "released by another since: hold it again"
    );
}

#[test]
fn a_subscriber_reports_every_quantum_and_every_change_while_watched() {
    let mut r = Reporter::new(
        2,
        &StallRules {
            low: 128,
            ..rules()
        },
    );
    assert_eq!(r.quantum, 64);
    r.taken(0, 63);
    assert!(
        r.due(0, false).is_empty(),
        "under a quantum, nothing changed"
    );
    r.taken(0, 1);
    let due = r.due(0, false);
    assert_eq!(due.len(), 1);
    assert_eq!((due[0].0, due[0].1.taken), (0, 64));
    r.watch(1, true);
    r.taken(1, 1);
    let due = r.due(5, false);
    assert_eq!(
        due.iter().map(|d| d.0).collect::<Vec<_>>(),
        [1],
        "watched: each change"
    );
    r.progressed();
    assert_eq!(r.due(5, false).len(), 1, "an acknowledgement is progress");
    let due = r.due(5, true);
    assert_eq!(due.len(), 2, "saturation flips go to every shard");
    assert!(due.iter().all(|d| d.1.saturated));
}

#[test]
fn a_queue_over_the_high_mark_is_told_to_every_shard_once() {
    let mut r = Reporter::new(3, &rules());
    assert!(r.due(49, false).is_empty());
    assert_eq!(r.due(50, false).len(), 3, "over the high mark: every shard");
    assert!(r.due(40, false).is_empty(), "still over the low mark");
    assert_eq!(
        r.due(25, false).len(),
        3,
        "down to the low mark: every shard"
    );
}

#[test]
fn a_full_queue_keeps_what_a_shard_that_has_not_learned_sends() {
    let mut r = Reporter::new(2, &rules());
    assert!(!r.absorbs(0, 49));
    assert!(r.absorbs(0, 50), "over the high mark, shard 0 not watching");
    r.stalled(1);
    assert!(
        !r.absorbs(1, 50),
        "shard 1 found it stalled: its queue drops by policy"
    );
    r.watch(1, false);
    assert!(r.absorbs(1, 50), "drained since");
    let _ = r.due(50, false);
    assert!(r.absorbs(0, 30), "full until down to the low mark");
    assert!(!r.absorbs(0, 25));
}

#[test]
fn a_qos0_publish_holds_only_when_most_of_its_deliveries_find_no_room() {
    let tally = |dropped: &[bool]| {
        let mut t = Qos0Tally::default();
        for (i, d) in dropped.iter().enumerate() {
            t.count(*d, &Arc::from(format!("s{i}")));
        }
        t.overloaded().map(|s| s.to_string())
    };
    assert_eq!(tally(&[]), None);
    assert_eq!(tally(&[true]), Some("s0".into()));
    assert_eq!(tally(&[false]), None);
    // One slow subscriber among others never holds; half is not most.
    assert_eq!(tally(&[false, true, false]), None);
    assert_eq!(tally(&[true, false]), None);
    // Held for the first that found no room.
    assert_eq!(tally(&[false, true, true]), Some("s1".into()));
}
