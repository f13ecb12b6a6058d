//! A session saved and restored along the way behaves as one that never stopped.
//!
//! Two drivers of `sequence/mod.rs` read the same random input in lockstep (connects,
//! client packets, deliveries at every QoS with and without expiry, acknowledgements,
//! router answers, detaches, ends, time jumps). At random steps both lose their
//! connection, if they have one, and optionally sit out a downtime; the second is then
//! snapshotted, serialized, deserialized and restored (the downtime later by both clocks)
//! while the first simply waits. From then on both must give the same effects, the same
//! state and the same next deadline, step by step.
//!
//! Each checkpoint of an attached session also checks the attached snapshot: restored
//! and timed out at once, it must give the detach's effects (but for its Close) and end up
//! in the state the detach left.

mod sequence;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use proptest::prelude::*;
use sequence::{Driver, Input};
use starling_session::{DetachReason, Effect, Instant, Session, SessionState};

/// The wall-clock time of the drivers' base instant: any will do.
fn wall_base() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn wall(base: Instant, now: Instant) -> SystemTime {
    wall_base() + (now - base)
}

fn round_trip(state: &SessionState) -> SessionState {
    let bytes = bincode::serialize(state).expect("a snapshot serializes");
    let back: SessionState = bincode::deserialize(&bytes).expect("and deserializes");
    assert_eq!(&back, state, "the round trip changed the state");
    back
}

fn drain(s: &mut Session) -> Vec<Effect> {
    std::iter::from_fn(|| s.poll_effect()).collect()
}

/// Both drivers agree on everything observable; their logs are cleared.
fn compare(base: Instant, a: &mut Driver, b: &mut Driver) {
    assert_eq!(a.now, b.now);
    assert_eq!(a.log, b.log, "effects differ");
    let (sa, sb) = (&a.s, &b.s);
    assert_eq!(sa.is_attached(), sb.is_attached());
    assert_eq!(sa.is_ended(), sb.is_ended());
    assert_eq!(
        sa.poll_timeout(),
        sb.poll_timeout(),
        "next deadline differs"
    );
    assert_eq!(sa.inflight_len(), sb.inflight_len());
    assert_eq!(sa.queue_len(), sb.queue_len());
    assert_eq!(sa.window(), sb.window());
    assert_eq!(sa.subscriptions(), sb.subscriptions());
    let w = wall(base, a.now);
    assert_eq!(
        sa.snapshot(a.now, w),
        sb.snapshot(b.now, w),
        "state differs"
    );
    for log in [&mut a.log, &mut b.log] {
        log.as_mut().expect("logging").clear();
    }
}

/// Both lose their connection, if any, and wait out `down` seconds; `b` goes through a
/// snapshot and is restored after the downtime.
fn checkpoint(base: Instant, a: &mut Driver, b: &mut Driver, down: u16) {
    let before = b.now;
    // The store keys live beside the state (a store keeps them as its records' keys).
    let attached =
        b.s.is_attached()
            .then(|| (b.s.snapshot(before, wall(base, before)), b.s.store_keys()));
    for d in [&mut *a, &mut *b] {
        d.s.detach(d.now, DetachReason::ConnectionLost);
        d.drain();
    }
    if let Some((state, keys)) = attached {
        let log = b.log.as_ref().expect("logging");
        let Some((Effect::Close(_), after_close)) = log.split_first() else {
            panic!("the detach did not start with a Close: {log:?}");
        };
        let mut t = Session::restore(
            round_trip(&state),
            b.limits.clone(),
            before,
            wall(base, before),
        )
        .expect("an attached snapshot restores");
        t.set_store_keys(keys.0, keys.1);
        t.handle_timeout(before);
        assert_eq!(drain(&mut t), after_close, "attached snapshot, restored");
        let w = wall(base, before);
        assert_eq!(t.snapshot(before, w), b.s.snapshot(before, w));
        hand_over(before, w, &state, &b.limits);
    }
    let state = round_trip(&b.s.snapshot(before, wall(base, before)));
    let keys = b.s.store_keys();
    let down = Duration::from_secs(u64::from(down));
    a.now += down;
    a.s.handle_timeout(a.now);
    a.drain();
    b.now += down;
    b.s = Session::restore(state, b.limits.clone(), b.now, wall(base, b.now))
        .expect("a snapshot restores");
    b.s.set_store_keys(keys.0, keys.1);
    b.s.handle_timeout(b.now);
    b.drain();
}

/// A session handed over to another node gives the state it would be saved with, but for
/// its will (a will waiting for its delay is deleted by the new connection, MQTT 5
/// §3.1.2.5), and ends here with nothing published and nothing dropped: the messages
/// travel. None for a session that does not outlive its connection, nor for one its client
/// has not spoken to since it was told there was none.
fn hand_over(
    now: Instant,
    w: SystemTime,
    state: &SessionState,
    limits: &starling_session::SessionLimits,
) {
    let mut h = Session::restore(state.clone(), limits.clone(), now, w).expect("restores");
    drain(&mut h);
    // A session its client was told did not exist, and has not spoken to since, holds
    // nothing the client gave it: none travels, and the other node says so again.
    let outlives = h.outlives_connection() && !h.is_unheard();
    let mut saved = h.snapshot(now, w);
    if let Some(d) = saved.detached.as_mut() {
        d.will = None;
    }
    let given = h.hand_over(now, w);
    let effects = drain(&mut h);
    assert!(h.is_ended(), "the session ends where it was handed over");
    if !outlives {
        assert_eq!(given, None);
        return;
    }
    assert_eq!(
        given.as_ref(),
        Some(&saved),
        "handed over as it would be saved"
    );
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, Effect::Will(_) | Effect::Dropped { .. })),
        "nothing published or dropped on a handover: {effects:?}"
    );
    assert!(
        matches!(effects.last(), Some(Effect::SessionEnded { .. })),
        "{effects:?}"
    );
}

/// Runs `data` through both drivers, with a checkpoint after each step named in
/// `checkpoints` (step → downtime in seconds).
fn run(data: &[u8], checkpoints: &BTreeMap<usize, u16>) -> usize {
    let base = sequence::base_instant();
    let (mut ia, mut ib) = (Input(data), Input(data));
    let (Some(mut a), Some(mut b)) = (Driver::new(&mut ia, base), Driver::new(&mut ib, base))
    else {
        return 0;
    };
    a.log = Some(Vec::new());
    b.log = Some(Vec::new());
    if a.attach(&mut ia).is_none() | b.attach(&mut ib).is_none() {
        return 0;
    }
    compare(base, &mut a, &mut b);
    let mut restores = 0;
    for step in 0.. {
        let (Some(op), Some(op_b)) = (ia.byte(), ib.byte()) else {
            break;
        };
        assert_eq!(op, op_b, "the drivers read their inputs differently");
        let (done_a, done_b) = (a.step(op, &mut ia), b.step(op, &mut ib));
        assert_eq!(done_a, done_b);
        compare(base, &mut a, &mut b);
        if done_a.is_none() {
            break;
        }
        a.check_state();
        b.check_state();
        if let Some(&down) = checkpoints.get(&step) {
            checkpoint(base, &mut a, &mut b, down);
            compare(base, &mut a, &mut b);
            restores += 1;
        }
    }
    restores
}

fn downtime() -> impl Strategy<Value = u16> {
    // Mostly none; sometimes past the will delay (3 s), the message expiry bound (30 s) or
    // the session expiry bound (100 s) of the driver's limits.
    prop_oneof![3 => Just(0u16), 1 => 1u16..5, 1 => 5u16..200]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2048,
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_restored_session_behaves_as_one_that_never_stopped(
        data in proptest::collection::vec(any::<u8>(), 0..512),
        checkpoints in proptest::collection::btree_map(0usize..160, downtime(), 0..6),
    ) {
        run(&data, &checkpoints);
    }
}

/// Restores happen in practice: over a fixed family of inputs, a fair share of the
/// checkpoints are reached (inputs end early, so not all are).
#[test]
fn checkpoints_are_reached() {
    let data: Vec<u8> = (0..400u32).map(|i| (i * 37 % 251) as u8).collect();
    let checkpoints: BTreeMap<usize, u16> = (0..40).map(|i| (i * 3, (i % 4) as u16 * 20)).collect();
    assert!(run(&data, &checkpoints) >= 10);
}

/// A connected client's session handed over to another node: its will goes as a takeover
/// on one node sends it, at once when its delay is zero, and not when it would wait (the
/// new connection deletes it); no will travels in the state.
#[test]
fn a_handover_sends_the_connected_clients_will_as_a_takeover_does() {
    use bytes::Bytes;
    use starling_codec::{Connect, LastWill, Properties, Protocol, QoS};
    for (delay, published) in [(0u32, true), (5, false)] {
        let now = sequence::base_instant();
        let mut s = Session::new(
            std::sync::Arc::from("c"),
            starling_session::SessionLimits::default(),
        );
        let connect = Connect {
            protocol: Protocol::V5,
            clean_start: true,
            keep_alive: 60,
            client_id: "c".to_owned(),
            will: Some(LastWill {
                topic: "w/c".to_owned(),
                payload: Bytes::from_static(b"gone"),
                qos: QoS::AtLeastOnce,
                retain: false,
                properties: Properties {
                    will_delay_interval: Some(delay),
                    ..Properties::default()
                },
            }),
            username: None,
            password: None,
            properties: Properties {
                session_expiry_interval: Some(3600),
                ..Properties::default()
            },
        };
        s.attach(now, &connect).expect("attaches");
        drain(&mut s);
        let state = s
            .hand_over(now, wall(now, now))
            .expect("a persistent session");
        let effects = drain(&mut s);
        let wills = effects
            .iter()
            .filter(|e| matches!(e, Effect::Will(m) if &*m.topic == "w/c"))
            .count();
        assert_eq!(
            wills,
            usize::from(published),
            "will delay {delay}: {effects:?}"
        );
        assert!(s.is_ended());
        assert!(
            state.detached.as_ref().is_some_and(|d| d.will.is_none()),
            "no will travels"
        );
    }
}
