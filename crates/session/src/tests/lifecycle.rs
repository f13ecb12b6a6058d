//! The will and the session's expiry.

use super::*;

// ----- will and session expiry -----

#[test]
fn will_published_when_connection_lost() {
    let c = with_will(connect(Protocol::V3_1_1, "c1", true), None);
    let mut h = H::attached(SessionLimits::default(), &c);
    h.s.detach(h.now, DetachReason::ConnectionLost);
    let e = h.drain();
    let w = wills(&e);
    assert_eq!(w.len(), 1);
    assert_eq!(&*w[0].topic, "will/c1");
    assert_eq!(w[0].publisher.as_deref(), Some("c1"));
    assert!(e.iter().any(|e| matches!(e, Effect::SessionEnded { .. })));
    assert!(h.s.is_ended());
}

#[test]
fn will_discarded_on_normal_disconnect() {
    let c = with_will(connect(Protocol::V5, "c1", true), None);
    let mut h = H::attached(SessionLimits::default(), &c);
    h.packet(Packet::Disconnect(Disconnect::default())).unwrap();
    let e = h.drain();
    assert!(wills(&e).is_empty());
    assert_eq!(closed(&e), Some(None));
}

#[test]
fn disconnect_with_will_0x04_publishes_the_will() {
    let c = with_will(connect(Protocol::V5, "c1", true), None);
    let mut h = H::attached(SessionLimits::default(), &c);
    h.packet(Packet::Disconnect(Disconnect {
        reason_code: ReasonCode::DisconnectWithWillMessage,
        properties: Properties::default(),
    }))
    .unwrap();
    assert_eq!(wills(&h.drain()).len(), 1);
}

#[test]
fn will_published_after_protocol_error() {
    let c = with_will(connect(Protocol::V5, "c1", true), None);
    let mut h = H::attached(SessionLimits::default(), &c);
    h.packet(Packet::Pingresp).unwrap_err();
    assert_eq!(wills(&h.drain()).len(), 1);
}

#[test]
fn will_delayed_then_published() {
    let c = with_will(v5_persistent("c1"), Some(5));
    let mut h = H::attached(SessionLimits::default(), &c);
    h.s.detach(h.now, DetachReason::ConnectionLost);
    assert!(wills(&h.drain()).is_empty());
    assert_eq!(h.s.poll_timeout(), Some(h.now + Duration::from_secs(5)));
    h.advance(Duration::from_secs(5));
    assert_eq!(wills(&h.drain()).len(), 1);
    assert!(!h.s.is_ended(), "the session outlives the will");
}

#[test]
fn will_delayed_then_cancelled_by_reconnect() {
    let c = with_will(v5_persistent("c1"), Some(5));
    let mut h = H::attached(SessionLimits::default(), &c);
    h.s.detach(h.now, DetachReason::ConnectionLost);
    h.now += Duration::from_secs(3);
    h.s.attach(h.now, &v5_persistent("c1")).unwrap();
    h.advance(Duration::from_secs(10));
    assert!(wills(&h.drain()).is_empty());
}

#[test]
fn will_sent_at_session_end_when_expiry_shorter_than_delay() {
    let mut c = with_will(connect(Protocol::V5, "c1", false), Some(100));
    c.properties.session_expiry_interval = Some(10);
    let mut h = H::attached(SessionLimits::default(), &c);
    h.s.detach(h.now, DetachReason::ConnectionLost);
    h.drain();
    assert_eq!(h.s.poll_timeout(), Some(h.now + Duration::from_secs(10)));
    h.advance(Duration::from_secs(10));
    let e = h.drain();
    assert_eq!(wills(&e).len(), 1);
    assert!(e.iter().any(|e| matches!(e, Effect::SessionEnded { .. })));
}

#[test]
fn takeover_closes_with_0x8e() {
    let mut h = H::attached(SessionLimits::default(), &v5_persistent("c1"));
    // The client shows it read its CONNACK (see the `unheard` tests below).
    h.packet(Packet::Pingreq).unwrap();
    h.s.detach(h.now, DetachReason::TakenOver);
    assert_eq!(closed(&h.drain()), Some(Some(ReasonCode::SessionTakenOver)));
    let a = h.s.attach(h.now, &v5_persistent("c1")).unwrap();
    assert!(a.session_present);
}

#[test]
fn session_expiry_ends_session_and_reports_subscriptions() {
    let mut h = H::attached(SessionLimits::default(), &v5_persistent("c1"));
    h.packet(Packet::Subscribe(subscribe(1, &[("a", QoS::AtLeastOnce)])))
        .unwrap();
    h.s.subscribed(h.now, pid(1), vec![Ok(QoS::AtLeastOnce)]);
    h.s.deliver(
        h.now,
        &msg("a", QoS::AtLeastOnce, b"x"),
        &sub(QoS::AtLeastOnce),
    );
    h.s.detach(h.now, DetachReason::ConnectionLost);
    h.drain();
    h.advance(Duration::from_secs(3599));
    assert!(!h.s.is_ended());
    h.advance(Duration::from_secs(1));
    let e = h.drain();
    assert!(h.s.is_ended());
    assert_eq!(drops(&e), [DropReason::SessionEnded]);
    assert!(e.contains(&Effect::SessionEnded {
        subscriptions: vec!["a".into()]
    }));
    h.s.deliver(
        h.now,
        &msg("a", QoS::AtLeastOnce, b"x"),
        &sub(QoS::AtLeastOnce),
    );
    assert_eq!(drops(&h.drain()), [DropReason::SessionEnded]);
}

#[test]
fn v3_clean_session_false_gets_broker_maximum_expiry() {
    let l = SessionLimits {
        session_expiry_secs_max: 50,
        ..SessionLimits::default()
    };
    let mut h = H::attached(l, &connect(Protocol::V3_1_1, "c1", false));
    h.s.detach(h.now, DetachReason::ConnectionLost);
    assert_eq!(h.s.poll_timeout(), Some(h.now + Duration::from_secs(50)));
}

#[test]
fn clean_start_ends_old_session() {
    let mut h = H::attached(SessionLimits::default(), &v5_persistent("c1"));
    h.s.deliver(
        h.now,
        &msg("a", QoS::AtLeastOnce, b"x"),
        &sub(QoS::AtLeastOnce),
    );
    h.s.detach(h.now, DetachReason::ConnectionLost);
    h.drain();
    let a =
        h.s.attach(h.now, &connect(Protocol::V5, "c1", true))
            .unwrap();
    assert!(!a.session_present);
    let e = h.drain();
    assert_eq!(drops(&e), [DropReason::SessionEnded]);
    let ended = e
        .iter()
        .position(|e| matches!(e, Effect::SessionEnded { .. }));
    let ack = e
        .iter()
        .position(|e| matches!(e, Effect::Send(Packet::Connack(_))));
    assert!(ended < ack, "old state ends before the CONNACK");
    assert_eq!(h.s.inflight_len(), 0);
}

#[test]
fn disconnect_cannot_raise_session_expiry_from_zero() {
    let mut h = H::attached(SessionLimits::default(), &connect(Protocol::V5, "c1", true));
    let mut d = Disconnect::default();
    d.properties.session_expiry_interval = Some(10);
    let err = h.packet(Packet::Disconnect(d)).unwrap_err();
    assert_eq!(err, SessionError::SessionExpiryAfterZero);
}

#[test]
fn disconnect_session_expiry_zero_ends_session() {
    let mut h = H::attached(SessionLimits::default(), &v5_persistent("c1"));
    let mut d = Disconnect::default();
    d.properties.session_expiry_interval = Some(0);
    h.packet(Packet::Disconnect(d)).unwrap();
    assert!(h.s.is_ended());
}

// ----- a CONNECT told there was no session, and not heard from since -----

/// Attaches `c` and returns its CONNACK's Session Present.
fn present(h: &mut H, c: &Connect) -> bool {
    h.drain();
    let a = h.s.attach(h.now, c).unwrap();
    assert_eq!(connack(&h.drain()).session_present, a.session_present);
    a.session_present
}

#[test]
fn a_resume_told_there_was_no_session_is_told_so_again_until_the_client_speaks() {
    let mut h = H::new(SessionLimits::default());
    assert!(!present(&mut h, &v5_persistent("c1")));
    assert!(h.s.is_unheard());
    // Lost with its CONNACK, or given up on by a client that did not wait for it: the
    // client may think its old session (and its subscriptions) still stands.
    h.s.detach(h.now, DetachReason::ConnectionLost);
    assert!(!present(&mut h, &v5_persistent("c1")), "told again");
    h.s.detach(h.now, DetachReason::TakenOver);
    assert!(
        !present(&mut h, &v5_persistent("c1")),
        "nor after a takeover"
    );
    // Any packet shows the client read it: from then on the session is there.
    h.packet(Packet::Pingreq).unwrap();
    assert!(!h.s.is_unheard());
    h.s.detach(h.now, DetachReason::ConnectionLost);
    assert!(present(&mut h, &v5_persistent("c1")));
}

#[test]
fn a_clean_start_or_a_session_that_holds_something_is_present_as_ever() {
    // Clean Start 1 asked for nothing: the session it made is there for the next CONNECT
    // (MQTT 5 §3.2.2.1.1), heard from or not.
    let mut clean = connect(Protocol::V5, "c1", true);
    clean.properties.session_expiry_interval = Some(3600);
    let mut h = H::new(SessionLimits::default());
    assert!(!present(&mut h, &clean));
    h.s.detach(h.now, DetachReason::ConnectionLost);
    assert!(present(&mut h, &v5_persistent("c1")));

    // A subscription, pipelined behind the CONNECT, is something the client gave.
    let mut h = H::new(SessionLimits::default());
    assert!(!present(&mut h, &v5_persistent("c1")));
    h.packet(Packet::Subscribe(subscribe(
        1,
        &[("t/#", QoS::AtLeastOnce)],
    )))
    .unwrap();
    h.s.detach(h.now, DetachReason::ConnectionLost);
    assert!(present(&mut h, &v5_persistent("c1")));

    // A message queued for it (however it came) is kept and announced.
    let mut h = H::new(SessionLimits::default());
    assert!(!present(&mut h, &v5_persistent("c1")));
    h.s.detach(h.now, DetachReason::ConnectionLost);
    h.s.deliver(
        h.now,
        &msg("t/1", QoS::AtLeastOnce, b"x"),
        &sub(QoS::AtLeastOnce),
    );
    h.drain();
    assert!(present(&mut h, &v5_persistent("c1")));
}

#[test]
fn a_session_its_client_never_heard_of_is_handed_over_as_none() {
    let mut h = H::new(SessionLimits::default());
    assert!(!present(&mut h, &v5_persistent("c1")));
    assert_eq!(
        h.s.hand_over(h.now, std::time::SystemTime::UNIX_EPOCH),
        None
    );
    assert!(h.s.is_ended());

    let mut h = H::new(SessionLimits::default());
    assert!(!present(&mut h, &v5_persistent("c1")));
    h.packet(Packet::Pingreq).unwrap();
    assert!(h
        .s
        .hand_over(h.now, std::time::SystemTime::UNIX_EPOCH)
        .is_some());
}

#[test]
fn only_a_detached_session_that_never_held_anything_gives_way_to_a_late_one() {
    // Started afresh for a CONNECT whose session came late, and lost with its CONNACK.
    let mut h = H::new(SessionLimits::default());
    assert!(!present(&mut h, &v5_persistent("c1")));
    assert!(!h.s.give_way(h.now), "not while its connection is open");
    h.s.detach(h.now, DetachReason::ConnectionLost);
    h.drain();
    assert!(h.s.give_way(h.now));
    assert!(h.s.is_ended());
    assert!(
        wills(&h.drain()).is_empty(),
        "it had no will, and gives none"
    );

    // Its client spoke since: the session is its own.
    let mut h = H::new(SessionLimits::default());
    assert!(!present(&mut h, &v5_persistent("c1")));
    h.packet(Packet::Pingreq).unwrap();
    h.s.detach(h.now, DetachReason::ConnectionLost);
    assert!(!h.s.give_way(h.now));
    assert!(!h.s.is_ended());

    // A will waiting for its delay is the client's too: it goes at its time.
    let mut h = H::new(SessionLimits::default());
    assert!(!present(&mut h, &with_will(v5_persistent("c1"), Some(30))));
    h.s.detach(h.now, DetachReason::ConnectionLost);
    assert!(!h.s.give_way(h.now));
    assert!(!h.s.is_ended());
}
