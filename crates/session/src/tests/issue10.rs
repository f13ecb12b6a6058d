//! Issue 10: protocol defects found by the conformance suite.

use super::*;

// ----- issue 10: protocol defects found by the conformance suite -----

/// A v5 session with one delivery of `qos` in flight; returns its packet id.
fn with_delivery(protocol: Protocol, qos: QoS) -> (H, PacketId) {
    let mut h = H::attached(SessionLimits::default(), &connect(protocol, "c1", true));
    h.s.deliver(h.now, &msg("t", qos, b"x"), &sub(qos));
    let id = published(&h.drain())[0].packet_id.expect("QoS 1/2");
    (h, id)
}

fn small_topics() -> SessionLimits {
    SessionLimits {
        topic_len_max: 8,
        topic_levels_max: 3,
        ..SessionLimits::default()
    }
}

#[test]
fn v5_publish_topic_past_topic_len_max_disconnects_0x90() {
    let mut h = H::attached(small_topics(), &connect(Protocol::V5, "c1", true));
    let e = h.packet(publish("aaaa/bbbb", QoS::AtLeastOnce, Some(1), b"x"));
    assert_eq!(e, Err(SessionError::TopicTooLong { len: 9, max: 8 }));
    let e = h.drain();
    assert!(routed(&e).is_empty());
    assert!(sent(&e).is_empty(), "no PUBACK: {e:?}");
    assert_eq!(closed(&e), Some(Some(ReasonCode::TopicNameInvalid)));
}

#[test]
fn v311_publish_topic_past_topic_levels_max_closes_the_connection() {
    let mut h = H::attached(small_topics(), &connect(Protocol::V3_1_1, "c1", true));
    let e = h.packet(publish("a/b/c/d", QoS::AtMostOnce, None, b"x"));
    assert_eq!(
        e,
        Err(SessionError::TopicTooManyLevels { levels: 4, max: 3 })
    );
    let e = h.drain();
    assert!(routed(&e).is_empty());
    assert_eq!(closed(&e), Some(None));
}

#[test]
fn publish_topic_at_the_topic_limits_is_routed() {
    let mut h = H::attached(small_topics(), &connect(Protocol::V5, "c1", true));
    h.packet(publish("aa/bb/cc", QoS::AtMostOnce, None, b"x"))
        .unwrap();
    assert_eq!(routed(&h.drain()).len(), 1);
}

#[test]
fn aliased_publish_is_held_to_the_topic_limits() {
    let l = SessionLimits {
        topic_len_max: 3,
        ..SessionLimits::default()
    };
    let mut h = H::attached(l, &connect(Protocol::V5, "c1", true));
    let Packet::Publish(mut p) = publish("abcd", QoS::AtMostOnce, None, b"x") else {
        unreachable!()
    };
    p.properties.topic_alias = Some(1);
    assert!(matches!(
        h.packet(Packet::Publish(p)),
        Err(SessionError::TopicTooLong { .. })
    ));
}

#[test]
fn will_topic_past_the_topic_limits_refused_at_connect() {
    for protocol in [Protocol::V3_1_1, Protocol::V5] {
        let mut c = with_will(connect(protocol, "c1", true), None);
        assert_eq!(
            check_connect(&c, &small_topics()),
            Ok(ClientIdentity::Given)
        );
        c.will.as_mut().unwrap().topic = "a/b/c/d".into();
        assert_eq!(
            check_connect(&c, &small_topics()),
            Err(ReasonCode::TopicNameInvalid)
        );
        c.will.as_mut().unwrap().topic = "abcdefghi".into();
        assert_eq!(
            check_connect(&c, &small_topics()),
            Err(ReasonCode::TopicNameInvalid)
        );
    }
}

#[test]
fn message_without_expiry_forwarded_without_one_under_a_broker_maximum() {
    let l = SessionLimits {
        message_expiry_max: Some(Duration::from_secs(10)),
        ..SessionLimits::default()
    };
    let mut publisher = H::attached(l.clone(), &connect(Protocol::V5, "p", true));
    publisher
        .packet(publish("t", QoS::AtLeastOnce, Some(1), b"x"))
        .unwrap();
    let m = Arc::clone(routed(&publisher.drain())[0]);
    let mut h = H::attached(l, &connect(Protocol::V5, "c1", true));
    h.now = publisher.now;
    h.s.deliver(h.now, &m, &sub(QoS::AtLeastOnce));
    let got = wire(published(&h.drain())[0], Protocol::V5);
    // MQTT 5 §3.3.2.3.3: absent means it does not expire; nothing to forward.
    assert_eq!(got.properties.message_expiry_interval, None);
    // The broker's bound still holds for how long it keeps the message.
    h.now += Duration::from_secs(11);
    h.s.deliver(h.now, &m, &sub(QoS::AtLeastOnce));
    assert_eq!(drops(&h.drain()), vec![DropReason::Expired]);
}

#[test]
fn publisher_expiry_above_the_broker_maximum_forwarded_as_the_maximum() {
    let l = SessionLimits {
        message_expiry_max: Some(Duration::from_secs(10)),
        ..SessionLimits::default()
    };
    let mut publisher = H::attached(l.clone(), &connect(Protocol::V5, "p", true));
    let Packet::Publish(mut p) = publish("t", QoS::AtLeastOnce, Some(1), b"x") else {
        unreachable!()
    };
    p.properties.message_expiry_interval = Some(100);
    publisher.packet(Packet::Publish(p)).unwrap();
    let m = Arc::clone(routed(&publisher.drain())[0]);
    let mut h = H::attached(l, &connect(Protocol::V5, "c1", true));
    h.now = publisher.now + Duration::from_secs(4);
    h.s.deliver(h.now, &m, &sub(QoS::AtLeastOnce));
    let got = wire(published(&h.drain())[0], Protocol::V5);
    assert_eq!(got.properties.message_expiry_interval, Some(6));
}

#[test]
fn will_without_expiry_published_without_an_announced_expiry() {
    let l = SessionLimits {
        message_expiry_max: Some(Duration::from_secs(10)),
        ..SessionLimits::default()
    };
    let c = with_will(connect(Protocol::V5, "c1", true), None);
    let mut h = H::attached(l, &c);
    h.s.detach(h.now, DetachReason::ConnectionLost);
    let e = h.drain();
    let w = wills(&e)[0];
    assert!(w.expires_at.is_some_and(|e| !e.announced));
    assert_eq!(w.remaining_expiry_secs(h.now), None);
}

/// Each wrong acknowledgement for a delivery in a given stage: the error, and what the
/// connection is closed with.
fn assert_wrong_ack(protocol: Protocol, qos: QoS, release: bool, wrong: fn(PubAck) -> Packet) {
    let (mut h, id) = with_delivery(protocol, qos);
    if release {
        h.packet(Packet::Pubrec(PubAck::new(id))).unwrap();
        h.drain();
    }
    let p = wrong(PubAck::new(id));
    let packet_type = p.packet_type();
    assert_eq!(
        h.packet(p),
        Err(SessionError::UnexpectedAck {
            packet_type,
            packet_id: id.get()
        })
    );
    let e = h.drain();
    assert!(sent(&e).is_empty(), "{e:?}");
    let code = protocol.is_v5().then_some(ReasonCode::ProtocolError);
    assert_eq!(closed(&e), Some(code));
}

#[test]
fn v5_pubrec_or_pubcomp_for_a_qos1_delivery_is_a_protocol_error() {
    assert_wrong_ack(Protocol::V5, QoS::AtLeastOnce, false, Packet::Pubrec);
    assert_wrong_ack(Protocol::V5, QoS::AtLeastOnce, false, Packet::Pubcomp);
}

#[test]
fn v5_puback_for_a_qos2_delivery_is_a_protocol_error() {
    assert_wrong_ack(Protocol::V5, QoS::ExactlyOnce, false, Packet::Puback);
    // After PUBREL too: the PUBCOMP phase.
    assert_wrong_ack(Protocol::V5, QoS::ExactlyOnce, true, Packet::Puback);
}

#[test]
fn v5_pubcomp_while_awaiting_pubrec_is_a_protocol_error() {
    assert_wrong_ack(Protocol::V5, QoS::ExactlyOnce, false, Packet::Pubcomp);
}

#[test]
fn v3_wrong_acknowledgement_closes_the_connection() {
    for protocol in [Protocol::V3_1, Protocol::V3_1_1] {
        assert_wrong_ack(protocol, QoS::AtLeastOnce, false, Packet::Pubrec);
        assert_wrong_ack(protocol, QoS::ExactlyOnce, true, Packet::Puback);
    }
}

#[test]
fn acknowledgements_for_unknown_packet_ids_are_not_protocol_errors() {
    let mut h = H::attached(SessionLimits::default(), &connect(Protocol::V5, "c1", true));
    h.packet(Packet::Puback(PubAck::new(pid(9)))).unwrap();
    h.packet(Packet::Pubcomp(PubAck::new(pid(9)))).unwrap();
    assert!(h.drain().is_empty());
    h.packet(Packet::Pubrec(PubAck::new(pid(9)))).unwrap();
    assert_eq!(
        sent(&h.drain()),
        vec![&Packet::Pubrel(PubAck {
            packet_id: pid(9),
            reason_code: ReasonCode::PacketIdentifierNotFound,
            properties: Properties::default(),
        })]
    );
    assert!(h.s.is_attached());
}

#[test]
fn duplicate_pubrec_after_pubrel_is_answered_with_pubrel_again() {
    let (mut h, id) = with_delivery(Protocol::V3_1_1, QoS::ExactlyOnce);
    h.packet(Packet::Pubrec(PubAck::new(id))).unwrap();
    h.packet(Packet::Pubrec(PubAck::new(id))).unwrap();
    assert_eq!(sent(&h.drain()).len(), 2);
    assert!(h.s.is_attached());
}

#[test]
fn unsolicited_failing_pubrec_gets_no_pubrel() {
    let mut h = H::attached(SessionLimits::default(), &connect(Protocol::V5, "c1", true));
    let mut rec = PubAck::new(pid(9));
    rec.reason_code = ReasonCode::UnspecifiedError;
    h.packet(Packet::Pubrec(rec)).unwrap();
    // [MQTT-4.3.3-4]: PUBREL only after a PUBREC below 0x80.
    assert!(h.drain().is_empty());
}

#[test]
fn failing_pubrec_frees_the_packet_id_and_the_window_slot() {
    let mut c = connect(Protocol::V5, "c1", true);
    c.properties.receive_maximum = Some(1);
    let mut h = H::attached(SessionLimits::default(), &c);
    for payload in [&b"1"[..], b"2"] {
        let m = Arc::new(Message {
            payload: Bytes::from_static(payload),
            ..Message::clone(&msg("t", QoS::ExactlyOnce, b""))
        });
        h.s.deliver(h.now, &m, &sub(QoS::ExactlyOnce));
    }
    let id = published(&h.drain())[0].packet_id.unwrap();
    let mut rec = PubAck::new(id);
    rec.reason_code = ReasonCode::ImplementationSpecificError;
    h.packet(Packet::Pubrec(rec)).unwrap();
    let e = h.drain();
    assert!(sent(&e).is_empty(), "no PUBREL: {e:?}");
    // The slot went to the queued message.
    let next = published(&e);
    assert_eq!(next.len(), 1);
    assert_eq!(&next[0].msg.payload[..], b"2");
    assert_eq!((h.s.inflight_len(), h.s.queue_len()), (1, 0));
}

#[test]
fn failing_pubrec_in_the_pubcomp_phase_gets_no_pubrel() {
    let (mut h, id) = with_delivery(Protocol::V5, QoS::ExactlyOnce);
    h.packet(Packet::Pubrec(PubAck::new(id))).unwrap();
    h.drain();
    let mut rec = PubAck::new(id);
    rec.reason_code = ReasonCode::UnspecifiedError;
    h.packet(Packet::Pubrec(rec)).unwrap();
    assert!(sent(&h.drain()).is_empty());
    assert_eq!(h.s.inflight_len(), 0);
}

#[test]
fn connack_past_the_client_maximum_packet_size_refuses_attach_and_sends_nothing() {
    let mut c = connect(Protocol::V5, "c1", true);
    c.properties.maximum_packet_size = Some(2);
    let mut h = H::new(SessionLimits::default());
    assert!(matches!(
        h.s.attach(h.now, &c),
        Err(SessionError::ConnackTooLarge { max: 2, .. })
    ));
    assert!(h.drain().is_empty());
    assert!(!h.s.is_attached());
    assert_eq!(h.s.poll_timeout(), None, "no keep alive runs");
}

#[test]
fn refused_attach_leaves_a_stored_session_as_it_was() {
    let mut h = H::attached(SessionLimits::default(), &v5_persistent("c1"));
    h.s.deliver(
        h.now,
        &msg("t", QoS::AtLeastOnce, b"x"),
        &sub(QoS::AtLeastOnce),
    );
    h.s.detach(h.now, DetachReason::ConnectionLost);
    h.drain();
    let mut tiny = v5_persistent("c1");
    tiny.clean_start = true;
    tiny.properties.maximum_packet_size = Some(4);
    assert!(h.s.attach(h.now, &tiny).is_err());
    assert!(h.drain().is_empty(), "clean start did not end the state");
    let a = h.s.attach(h.now, &v5_persistent("c1")).unwrap();
    assert!(a.session_present);
    assert_eq!(h.s.inflight_len(), 1);
}

#[test]
fn connack_that_fits_a_small_maximum_is_sent() {
    // Nothing to announce: an empty property list.
    let l = SessionLimits {
        receive_max: u16::MAX,
        topic_alias_max: 0,
        packet_size_max: starling_codec::PACKET_SIZE_MAX,
        ..SessionLimits::default()
    };
    let mut c = connect(Protocol::V5, "c1", true);
    // Fixed header 2, flags, reason code, empty property length: 5 bytes.
    c.properties.maximum_packet_size = Some(5);
    let mut h = H::new(l);
    h.s.attach(h.now, &c).unwrap();
    assert_eq!(connack(&h.drain()).reason_code, ReasonCode::Success);
}

#[test]
fn disconnect_past_the_client_maximum_packet_size_is_not_sent() {
    let mut scratch = BytesMut::new();
    // Fixed header 2 and the reason code: 3 bytes.
    assert!(!crate::session::disconnect_fits(
        ReasonCode::KeepAliveTimeout,
        2,
        &mut scratch
    ));
    assert!(crate::session::disconnect_fits(
        ReasonCode::KeepAliveTimeout,
        3,
        &mut scratch
    ));
    assert!(scratch.is_empty());
}
