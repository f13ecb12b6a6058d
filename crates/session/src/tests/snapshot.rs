//! Snapshot and restore: the state survives serialization and a move to a clock that
//! started elsewhere, and a state no session can be in is refused with a typed error.

use std::time::SystemTime;

use starling_codec::VAR_INT_MAX;

use super::*;
use crate::state::*;

/// A wall-clock time for the test's `now`: any will do, as long as each test keeps to it.
fn wall_at_base() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn round_trip(state: &SessionState) -> SessionState {
    let bytes = bincode::serialize(state).expect("serializes");
    bincode::deserialize(&bytes).expect("deserializes")
}

fn busy_limits() -> SessionLimits {
    SessionLimits {
        inflight_max: 3,
        wildcard_available: false,
        ..SessionLimits::default()
    }
}

/// A v5 session with something in every part of its state, detached at `h.now`.
fn busy_session() -> H {
    let limits = busy_limits();
    let mut c = with_will(v5_persistent("c1"), Some(30));
    c.properties.receive_maximum = Some(3);
    let mut h = H::attached(limits, &c);
    // A granted subscription, an unanswered SUBSCRIBE (one filter refused by the session)
    // and an unanswered UNSUBSCRIBE.
    let mut s = subscribe(1, &[("a/b", QoS::ExactlyOnce)]);
    s.properties.subscription_identifiers = vec![9];
    h.packet(Packet::Subscribe(s)).unwrap();
    h.s.subscribed(h.now, pid(1), vec![Ok(QoS::AtLeastOnce)]);
    let s = subscribe(2, &[("x/#", QoS::AtMostOnce), ("y", QoS::AtLeastOnce)]);
    h.packet(Packet::Subscribe(s)).unwrap();
    h.packet(Packet::Unsubscribe(Unsubscribe {
        packet_id: pid(3),
        filters: vec!["a/b".into()],
        properties: Properties::default(),
    }))
    .unwrap();
    // An inbound QoS 2 message awaiting PUBREL.
    h.packet(publish("in", QoS::ExactlyOnce, Some(7), b"q2"))
        .unwrap();
    // Three in flight (QoS 1, QoS 2 released, QoS 2 published) and two queued, one of them
    // with an announced expiry and properties.
    let mut with_props = (*msg("t/p", QoS::ExactlyOnce, b"p")).clone();
    with_props.properties.content_type = Some("text/plain".into());
    with_props.properties.user_properties = vec![("k".into(), "v".into())];
    with_props.expires_at = Some(Expiry::announced(h.now + Duration::from_secs(90)));
    let opts = DeliveryOptions {
        subscription_ids: [9].into(),
        ..sub(QoS::ExactlyOnce)
    };
    for m in [
        msg("t/1", QoS::AtLeastOnce, b"1"),
        msg("t/2", QoS::ExactlyOnce, b"2"),
        msg("t/3", QoS::ExactlyOnce, b"3"),
        Arc::new(with_props),
        msg("t/5", QoS::AtLeastOnce, b"5"),
    ] {
        h.s.deliver(h.now, &m, &opts);
    }
    let e = h.drain();
    let q2 = published(&e)[1].packet_id.unwrap();
    h.packet(Packet::Pubrec(PubAck::new(q2))).unwrap();
    h.drain();
    h.s.detach(h.now, DetachReason::ConnectionLost);
    h.drain();
    h
}

#[test]
fn detached_session_resumes_after_a_round_trip_as_the_original_does() {
    let mut h = busy_session();
    let state = h.s.snapshot(h.now, wall_at_base());
    let d = state.detached.as_ref().expect("detached with state");
    assert_eq!(d.inflight.len(), 3);
    assert_eq!(d.queue.len(), 2);
    assert_eq!(
        d.inflight.iter().map(|f| f.phase).collect::<Vec<_>>(),
        [
            InflightPhase::AwaitingPuback,
            InflightPhase::AwaitingPubcomp,
            InflightPhase::AwaitingPubrec
        ]
    );
    assert_eq!(d.inbound_qos2, [pid(7)]);
    assert_eq!(d.pending_subscribes.len(), 1);
    assert_eq!(d.pending_unsubscribes.len(), 1);
    assert!(d.will.as_ref().is_some_and(|w| w.due_at.is_some()));
    let back = round_trip(&state);
    assert_eq!(back, state);

    let mut restored = Session::restore(back, busy_limits(), h.now, wall_at_base()).unwrap();
    assert_eq!(restored.snapshot(h.now, wall_at_base()), state);
    assert_eq!(restored.poll_timeout(), h.s.poll_timeout());
    assert!(restored.poll_effect().is_none(), "restore queues nothing");

    // Both resume alike: CONNACK, the resends in order, the router's late answers.
    h.now += Duration::from_secs(5);
    let c = v5_persistent("c1");
    h.s.attach(h.now, &c).unwrap();
    restored.attach(h.now, &c).unwrap();
    for s in [&mut h.s, &mut restored] {
        s.subscribed(h.now, pid(2), vec![Ok(QoS::AtLeastOnce)]);
        s.unsubscribed(h.now, pid(3), vec![ReasonCode::Success]);
        s.handle_packet(
            h.now,
            publish("in", QoS::ExactlyOnce, Some(7), b"q2"),
            &mut AllowAll,
        )
        .unwrap();
    }
    let original = h.drain();
    let again: Vec<Effect> = std::iter::from_fn(|| restored.poll_effect()).collect();
    assert_eq!(again, original);
    assert!(connack(&again).session_present);
    assert!(
        routed(&again).is_empty(),
        "the resent QoS 2 PUBLISH is not routed twice"
    );
    // Two PUBLISHes again and a PUBREL; the window (3) is full, the queue waits.
    assert_eq!(published(&again).len(), 2);
    assert_eq!(
        sent(&again).len(),
        5,
        "CONNACK, PUBREL, SUBACK, UNSUBACK, PUBREC"
    );
}

#[test]
fn deadlines_land_where_the_wall_clock_says_on_a_clock_that_started_elsewhere() {
    let h = busy_session();
    let state = h.s.snapshot(h.now, wall_at_base());
    // Restored 10 s later by the wall clock, on a node whose monotonic clock reads
    // something else entirely.
    let elsewhere = h.now + Duration::from_secs(5000);
    let mut s = Session::restore(
        state,
        SessionLimits::default(),
        elsewhere,
        wall_at_base() + Duration::from_secs(10),
    )
    .unwrap();
    // The will delay (30 s) had 20 s left, the session expiry (3600 s) 3590 s.
    assert_eq!(s.poll_timeout(), Some(elsewhere + Duration::from_secs(20)));
    s.handle_timeout(elsewhere + Duration::from_secs(20));
    let e: Vec<Effect> = std::iter::from_fn(|| s.poll_effect()).collect();
    assert_eq!(wills(&e).len(), 1);
    assert_eq!(
        s.poll_timeout(),
        Some(elsewhere + Duration::from_secs(3590))
    );
    // The queued message's announced expiry (90 s) has 60 s left 20 s later: sent as 60.
    s.attach(elsewhere + Duration::from_secs(20), &v5_persistent("c1"))
        .unwrap();
    let e: Vec<Effect> = std::iter::from_fn(|| s.poll_effect()).collect();
    let expiries: Vec<Option<u32>> = published(&e)
        .iter()
        .map(|p| wire(p, Protocol::V5).properties.message_expiry_interval)
        .collect();
    assert!(expiries.contains(&Some(60)), "{expiries:?}");
}

#[test]
fn a_state_stored_past_its_deadlines_ends_at_the_first_timeout() {
    let h = busy_session();
    let state = h.s.snapshot(h.now, wall_at_base());
    let later = wall_at_base() + Duration::from_secs(7200);
    let mut s = Session::restore(state, SessionLimits::default(), h.now, later).unwrap();
    assert!(s.poll_timeout().is_some_and(|t| t <= h.now));
    s.handle_timeout(h.now);
    let e: Vec<Effect> = std::iter::from_fn(|| s.poll_effect()).collect();
    assert_eq!(wills(&e).len(), 1);
    assert!(matches!(e.last(), Some(Effect::SessionEnded { .. })));
    assert!(s.is_ended());
}

#[test]
fn an_attached_session_is_taken_as_if_its_connection_were_lost_then() {
    let mut h = H::attached(
        SessionLimits::default(),
        &with_will(v5_persistent("c1"), Some(30)),
    );
    h.s.deliver(
        h.now,
        &msg("t", QoS::AtLeastOnce, b"x"),
        &sub(QoS::AtLeastOnce),
    );
    h.drain();
    let attached = h.s.snapshot(h.now, wall_at_base());
    h.s.detach(h.now, DetachReason::ConnectionLost);
    assert_eq!(h.s.snapshot(h.now, wall_at_base()), attached);
}

#[test]
fn an_attached_snapshot_publishes_a_will_without_delay_at_the_first_timeout() {
    // Session expiry 0 and no will delay: the detach would publish the will and end.
    let mut h = H::attached(
        SessionLimits::default(),
        &with_will(connect(Protocol::V5, "c1", true), None),
    );
    let state = round_trip(&h.s.snapshot(h.now, wall_at_base()));
    let mut s = Session::restore(state, SessionLimits::default(), h.now, wall_at_base()).unwrap();
    s.handle_timeout(h.now);
    let restored: Vec<Effect> = std::iter::from_fn(|| s.poll_effect()).collect();
    h.s.detach(h.now, DetachReason::ConnectionLost);
    let detached = h.drain();
    assert_eq!(
        restored,
        detached[1..],
        "the detach's effects after its Close"
    );
    assert_eq!(wills(&restored).len(), 1);
    assert!(s.is_ended());
}

#[test]
fn an_ended_session_keeps_only_its_packet_id_counter() {
    let mut h = H::attached(SessionLimits::default(), &connect(Protocol::V5, "c1", true));
    h.s.deliver(
        h.now,
        &msg("t", QoS::AtLeastOnce, b"x"),
        &sub(QoS::AtLeastOnce),
    );
    h.s.detach(h.now, DetachReason::ConnectionLost);
    assert!(h.s.is_ended());
    let state = round_trip(&h.s.snapshot(h.now, wall_at_base()));
    assert_eq!(state.detached, None);
    assert_eq!(state.next_packet_id, pid(2));
    let mut s = Session::restore(state, SessionLimits::default(), h.now, wall_at_base()).unwrap();
    assert!(s.is_ended());
    s.attach(h.now, &connect(Protocol::V5, "c1", true)).unwrap();
    s.deliver(
        h.now,
        &msg("t", QoS::AtLeastOnce, b"x"),
        &sub(QoS::AtLeastOnce),
    );
    let e: Vec<Effect> = std::iter::from_fn(|| s.poll_effect()).collect();
    assert_eq!(published(&e)[0].packet_id, Some(pid(2)));
}

/// Restores `state` after `break_it` changed it, under the default limits.
fn restore_broken(break_it: impl FnOnce(&mut SessionState)) -> Result<Session, RestoreError> {
    let h = busy_session();
    let mut state = h.s.snapshot(h.now, wall_at_base());
    break_it(&mut state);
    Session::restore(state, busy_limits(), h.now, wall_at_base())
}

fn detached(s: &mut SessionState) -> &mut DetachedState {
    s.detached.as_mut().expect("busy_session has state")
}

#[test]
fn restore_refuses_states_no_session_can_be_in() {
    use RestoreError::*;
    let err = |f: fn(&mut SessionState)| restore_broken(f).map(|_| ()).unwrap_err();
    assert_eq!(
        err(|s| s.version = 2),
        UnsupportedVersion {
            found: 2,
            supported: SESSION_STATE_VERSION
        }
    );
    assert_eq!(
        err(|s| {
            let d = detached(s);
            d.inflight[1].packet_id = d.inflight[0].packet_id;
        }),
        DuplicatePacketId {
            list: PacketIdList::Inflight,
            packet_id: 1
        }
    );
    assert_eq!(
        err(|s| {
            let d = detached(s);
            let extra = InflightState {
                packet_id: pid(99),
                ..d.inflight[0].clone()
            };
            d.inflight.push(extra);
        }),
        InflightOverLimit { len: 4, max: 3 }
    );
    assert_eq!(
        err(|s| detached(s).inflight[0].phase = InflightPhase::AwaitingPubrec),
        InflightPhaseMismatch {
            packet_id: 1,
            qos: QoS::AtLeastOnce,
            phase: InflightPhase::AwaitingPubrec
        }
    );
    assert_eq!(
        err(|s| detached(s).inbound_qos2.push(pid(7))),
        DuplicatePacketId {
            list: PacketIdList::InboundQos2,
            packet_id: 7
        }
    );
    assert_eq!(
        err(|s| {
            let d = detached(s);
            let again = d.pending_subscribes[0].clone();
            d.pending_subscribes.push(again);
        }),
        DuplicatePacketId {
            list: PacketIdList::PendingSubscribes,
            packet_id: 2
        }
    );
    assert_eq!(
        err(|s| {
            let d = detached(s);
            let again = d.pending_unsubscribes[0].clone();
            d.pending_unsubscribes.push(again);
        }),
        DuplicatePacketId {
            list: PacketIdList::PendingUnsubscribes,
            packet_id: 3
        }
    );
    assert_eq!(
        err(|s| {
            let d = detached(s);
            let again = d.subscriptions[0].clone();
            d.subscriptions.push(again);
        }),
        DuplicateSubscription {
            filter: "a/b".into()
        }
    );
    assert_eq!(
        err(|s| detached(s).queue[0].subscription_ids = vec![0]),
        SubscriptionIdInvalid { id: 0 }
    );
    assert_eq!(
        err(|s| detached(s).subscriptions[0].subscription_id = Some(VAR_INT_MAX + 1)),
        SubscriptionIdInvalid {
            id: VAR_INT_MAX + 1
        }
    );
}

#[test]
fn restore_refuses_a_state_past_the_limits_it_is_restored_under() {
    let h = busy_session();
    let state = h.s.snapshot(h.now, wall_at_base());
    let tight = |limits: SessionLimits| {
        Session::restore(state.clone(), limits, h.now, wall_at_base()).map(|_| ())
    };
    assert_eq!(
        tight(SessionLimits {
            inflight_max: 2,
            ..SessionLimits::default()
        }),
        Err(RestoreError::InflightOverLimit { len: 3, max: 2 })
    );
    assert_eq!(
        tight(SessionLimits {
            mqueue_len_max: 0,
            ..SessionLimits::default()
        }),
        Err(RestoreError::QueueOverLimit { len: 2, max: 0 })
    );
}

#[test]
fn an_encoding_no_mqtt_packet_allows_fails_to_serialize_or_deserialize() {
    // A QoS of 3 where a message's QoS goes: the field after the topic and the payload.
    let h = busy_session();
    let state = h.s.snapshot(h.now, wall_at_base());
    let m = state.detached.unwrap().queue[0].message.clone();
    let mut bytes = bincode::serialize(&m).unwrap();
    let at = bincode::serialize(&(&m.topic, &m.payload)).unwrap().len();
    assert_eq!(bytes[at], m.qos.as_u8());
    bytes[at] = 3;
    assert!(bincode::deserialize::<MessageState>(&bytes).is_err());
    // A property a PUBLISH cannot carry.
    let mut bad = m;
    bad.properties.session_expiry_interval = Some(1);
    assert!(bincode::serialize(&bad).is_err());
}

#[test]
fn inflight_keeps_its_send_order_across_a_packet_id_wrap() {
    let mut s = Session::restore(
        SessionState {
            version: SESSION_STATE_VERSION,
            client_id: "c1".into(),
            next_packet_id: pid(u16::MAX),
            detached: None,
        },
        SessionLimits::default(),
        base_instant(),
        wall_at_base(),
    )
    .unwrap();
    let mut h = H::new(SessionLimits::default());
    let c = v5_persistent("c1");
    s.attach(h.now, &c).unwrap();
    for n in [b"1", b"2"] {
        s.deliver(
            h.now,
            &msg("t", QoS::AtLeastOnce, n),
            &sub(QoS::AtLeastOnce),
        );
    }
    s.detach(h.now, DetachReason::ConnectionLost);
    drain_all(&mut s);
    let state = round_trip(&s.snapshot(h.now, wall_at_base()));
    let ids: Vec<u16> = state
        .detached
        .as_ref()
        .unwrap()
        .inflight
        .iter()
        .map(|f| f.packet_id.get())
        .collect();
    assert_eq!(ids, [u16::MAX, 1], "send order, not identifier order");
    h.s = Session::restore(state, SessionLimits::default(), h.now, wall_at_base()).unwrap();
    h.s.attach(h.now, &c).unwrap();
    let resent: Vec<Bytes> = published(&h.drain())
        .iter()
        .map(|p| p.msg.payload.clone())
        .collect();
    assert_eq!(resent, [&b"1"[..], &b"2"[..]]);
}

fn drain_all(s: &mut Session) -> Vec<Effect> {
    std::iter::from_fn(|| s.poll_effect()).collect()
}
