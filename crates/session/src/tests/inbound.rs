//! The client's PUBLISHes: QoS flows, aliases, limits, the gate.

use super::*;

// ----- inbound QoS -----

#[test]
fn qos0_inbound_routed_without_ack() {
    let mut h = H::attached(
        SessionLimits::default(),
        &connect(Protocol::V3_1_1, "c1", true),
    );
    h.packet(publish("a/b", QoS::AtMostOnce, None, b"x"))
        .unwrap();
    let e = h.drain();
    assert_eq!(routed(&e).len(), 1);
    assert_eq!(&*routed(&e)[0].topic, "a/b");
    assert_eq!(routed(&e)[0].publisher.as_deref(), Some("c1"));
    assert!(sent(&e).is_empty());
}

#[test]
fn qos1_inbound_routed_then_acked() {
    let mut h = H::attached(SessionLimits::default(), &connect(Protocol::V5, "c1", true));
    h.packet(publish("a", QoS::AtLeastOnce, Some(7), b"x"))
        .unwrap();
    let e = h.drain();
    assert!(
        matches!(e[0], Effect::Publish(_)),
        "route before acknowledging"
    );
    assert_eq!(sent(&e), vec![&Packet::Puback(PubAck::new(pid(7)))]);
}

#[test]
fn qos2_inbound_duplicate_not_routed_twice() {
    let mut h = H::attached(SessionLimits::default(), &v5_persistent("c1"));
    h.packet(publish("a", QoS::ExactlyOnce, Some(3), b"x"))
        .unwrap();
    let e = h.drain();
    assert_eq!(routed(&e).len(), 1);
    assert_eq!(sent(&e), vec![&Packet::Pubrec(PubAck::new(pid(3)))]);
    // The client did not see the PUBREC and sends again, even across a reconnect.
    h.s.detach(h.now, DetachReason::ConnectionLost);
    h.s.attach(h.now, &v5_persistent("c1")).unwrap();
    h.drain();
    let Packet::Publish(mut again) = publish("a", QoS::ExactlyOnce, Some(3), b"x") else {
        unreachable!()
    };
    again.dup = true;
    h.packet(Packet::Publish(again)).unwrap();
    let e = h.drain();
    assert!(routed(&e).is_empty());
    assert_eq!(sent(&e), vec![&Packet::Pubrec(PubAck::new(pid(3)))]);
    h.packet(Packet::Pubrel(PubAck::new(pid(3)))).unwrap();
    assert_eq!(
        sent(&h.drain()),
        vec![&Packet::Pubcomp(PubAck::new(pid(3)))]
    );
    // Released: the id now names a new message.
    h.packet(publish("a", QoS::ExactlyOnce, Some(3), b"y"))
        .unwrap();
    assert_eq!(routed(&h.drain()).len(), 1);
}

#[test]
fn an_abandoned_qos2_id_is_released_and_names_a_new_message() {
    let mut h = H::attached(SessionLimits::default(), &v5_persistent("c1"));
    h.packet(publish("a", QoS::ExactlyOnce, Some(4), b"x"))
        .unwrap();
    assert_eq!(routed(&h.drain()).len(), 1);
    // The broker turned its PUBREC into an error (a node did not confirm the forward).
    h.s.abandon_inbound(pid(4), false);
    let e = h.drain();
    assert!(
        e.iter().any(|e| matches!(
            e,
            Effect::Store(crate::StoreChange::InboundReleased(id)) if *id == pid(4)
        )),
        "the stored id is released too: {e:?}"
    );
    h.packet(publish("a", QoS::ExactlyOnce, Some(4), b"y"))
        .unwrap();
    assert_eq!(routed(&h.drain()).len(), 1, "a new message, routed");
    // Abandoning an id the session does not hold changes nothing.
    h.s.abandon_inbound(pid(5), false);
    assert!(h.drain().is_empty());
}

#[test]
fn an_abandoned_qos2_id_kept_in_the_store_is_free_in_the_session_all_the_same() {
    let mut h = H::attached(SessionLimits::default(), &v5_persistent("c1"));
    h.packet(publish("a", QoS::ExactlyOnce, Some(6), b"x"))
        .unwrap();
    assert_eq!(routed(&h.drain()).len(), 1);
    h.s.abandon_inbound(pid(6), true);
    let e = h.drain();
    assert!(
        !e.iter()
            .any(|e| matches!(e, Effect::Store(crate::StoreChange::InboundReleased(_)))),
        "the stored id stays: {e:?}"
    );
    assert_eq!(h.s.inbound_qos2_len(), 0);
    h.packet(publish("a", QoS::ExactlyOnce, Some(6), b"y"))
        .unwrap();
    assert_eq!(routed(&h.drain()).len(), 1, "a new message, routed");
}

#[test]
fn pubrel_for_unknown_id_gets_pubcomp_0x92() {
    let mut h = H::attached(SessionLimits::default(), &connect(Protocol::V5, "c1", true));
    h.packet(Packet::Pubrel(PubAck::new(pid(9)))).unwrap();
    let e = h.drain();
    let Packet::Pubcomp(a) = sent(&e)[0] else {
        panic!("{e:?}")
    };
    assert_eq!(a.reason_code, ReasonCode::PacketIdentifierNotFound);
}

#[test]
fn receive_maximum_exceeded_disconnects_0x93() {
    let l = SessionLimits {
        receive_max: 2,
        ..SessionLimits::default()
    };
    let mut h = H::attached(l, &connect(Protocol::V5, "c1", true));
    h.packet(publish("a", QoS::ExactlyOnce, Some(1), b"x"))
        .unwrap();
    h.packet(publish("a", QoS::ExactlyOnce, Some(2), b"x"))
        .unwrap();
    h.drain();
    let err = h
        .packet(publish("a", QoS::ExactlyOnce, Some(3), b"x"))
        .unwrap_err();
    assert_eq!(err, SessionError::ReceiveMaximumExceeded { max: 2 });
    let e = h.drain();
    assert!(routed(&e).is_empty());
    assert_eq!(closed(&e), Some(Some(ReasonCode::ReceiveMaximumExceeded)));
}

#[test]
fn publish_with_subscription_id_is_protocol_error() {
    let mut h = H::attached(SessionLimits::default(), &connect(Protocol::V5, "c1", true));
    let Packet::Publish(mut p) = publish("a", QoS::AtMostOnce, None, b"x") else {
        unreachable!()
    };
    p.properties.subscription_identifiers = vec![4];
    let err = h.packet(Packet::Publish(p)).unwrap_err();
    assert_eq!(err.reason_code(), ReasonCode::ProtocolError);
    assert_eq!(closed(&h.drain()), Some(Some(ReasonCode::ProtocolError)));
}

#[test]
fn publish_above_maximum_qos_disconnects_0x9b() {
    let l = SessionLimits {
        qos_max: QoS::AtLeastOnce,
        ..SessionLimits::default()
    };
    let mut h = H::attached(l, &connect(Protocol::V5, "c1", true));
    let err = h
        .packet(publish("a", QoS::ExactlyOnce, Some(1), b"x"))
        .unwrap_err();
    assert_eq!(err.reason_code(), ReasonCode::QoSNotSupported);
}

#[test]
fn topic_alias_inbound_resolves_later_publishes() {
    let l = SessionLimits {
        topic_alias_max: 2,
        ..SessionLimits::default()
    };
    let mut h = H::attached(l, &connect(Protocol::V5, "c1", true));
    let with_alias = |topic: &str, alias| {
        let Packet::Publish(mut p) = publish(topic, QoS::AtMostOnce, None, b"x") else {
            unreachable!()
        };
        p.properties.topic_alias = Some(alias);
        Packet::Publish(p)
    };
    let Packet::Publish(first) = with_alias("long/topic", 1) else {
        unreachable!()
    };
    let Packet::Publish(alias_only) = with_alias("", 1) else {
        unreachable!()
    };
    // The broker's look-ahead sees what the session will resolve.
    assert_eq!(h.s.publish_topic(&first), Some("long/topic"));
    assert_eq!(h.s.publish_topic(&alias_only), None, "not set yet");
    h.packet(Packet::Publish(first)).unwrap();
    assert_eq!(h.s.publish_topic(&alias_only), Some("long/topic"));
    h.packet(Packet::Publish(alias_only)).unwrap();
    let e = h.drain();
    let topics: Vec<&str> = routed(&e).iter().map(|m| &*m.topic).collect();
    assert_eq!(topics, ["long/topic", "long/topic"]);
    assert_eq!(routed(&e)[1].properties.topic_alias, None);
    // Unknown alias: protocol error.
    let err = h.packet(with_alias("", 2)).unwrap_err();
    assert_eq!(err.reason_code(), ReasonCode::ProtocolError);
}

#[test]
fn topic_alias_above_maximum_disconnects_0x94() {
    let l = SessionLimits {
        topic_alias_max: 2,
        ..SessionLimits::default()
    };
    let mut h = H::attached(l, &connect(Protocol::V5, "c1", true));
    let Packet::Publish(mut p) = publish("t", QoS::AtMostOnce, None, b"x") else {
        unreachable!()
    };
    p.properties.topic_alias = Some(3);
    let err = h.packet(Packet::Publish(p)).unwrap_err();
    assert_eq!(err, SessionError::TopicAliasInvalid { alias: 3, max: 2 });
    assert_eq!(
        closed(&h.drain()),
        Some(Some(ReasonCode::TopicAliasInvalid))
    );
}

#[test]
fn publish_denied_v5_acked_with_0x87_and_not_routed() {
    let mut h = H::attached(SessionLimits::default(), &connect(Protocol::V5, "c1", true));
    h.s.handle_packet(
        h.now,
        publish("a", QoS::AtLeastOnce, Some(1), b"x"),
        &mut DenyAll,
    )
    .unwrap();
    h.s.handle_packet(
        h.now,
        publish("a", QoS::ExactlyOnce, Some(2), b"x"),
        &mut DenyAll,
    )
    .unwrap();
    let e = h.drain();
    assert!(routed(&e).is_empty());
    let codes: Vec<ReasonCode> = sent(&e)
        .iter()
        .map(|p| match p {
            Packet::Puback(a) | Packet::Pubrec(a) => a.reason_code,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(codes, [ReasonCode::NotAuthorized; 2]);
    assert_eq!(drops(&e), [DropReason::NotAuthorized; 2]);
}

#[test]
fn publish_denied_v3_silently_dropped_but_acknowledged() {
    let mut h = H::attached(
        SessionLimits::default(),
        &connect(Protocol::V3_1_1, "c1", true),
    );
    h.s.handle_packet(
        h.now,
        publish("a", QoS::AtLeastOnce, Some(1), b"x"),
        &mut DenyAll,
    )
    .unwrap();
    let e = h.drain();
    assert!(routed(&e).is_empty());
    assert_eq!(sent(&e), vec![&Packet::Puback(PubAck::new(pid(1)))]);
}

#[test]
fn payload_marked_utf8_but_invalid_answered_0x99_when_validating() {
    let l = SessionLimits {
        validate_utf8_payload: true,
        ..SessionLimits::default()
    };
    let mut h = H::attached(l, &connect(Protocol::V5, "c1", true));
    let Packet::Publish(mut p) = publish("a", QoS::AtLeastOnce, Some(1), b"\xff\xfe") else {
        unreachable!()
    };
    p.properties.payload_format_indicator = Some(PayloadFormat::Utf8);
    h.packet(Packet::Publish(p)).unwrap();
    let e = h.drain();
    assert!(routed(&e).is_empty());
    let Packet::Puback(a) = sent(&e)[0] else {
        panic!()
    };
    assert_eq!(a.reason_code, ReasonCode::PayloadFormatInvalid);
}

#[test]
fn user_properties_and_payload_format_pass_through_routing() {
    let mut h = H::attached(SessionLimits::default(), &connect(Protocol::V5, "c1", true));
    let Packet::Publish(mut p) = publish("a", QoS::AtMostOnce, None, b"x") else {
        unreachable!()
    };
    p.properties.user_properties = vec![("k".into(), "v".into())];
    p.properties.payload_format_indicator = Some(PayloadFormat::Utf8);
    p.properties.content_type = Some("text/plain".into());
    p.properties.response_topic = Some("reply".into());
    p.properties.correlation_data = Some(Bytes::from_static(b"c"));
    h.packet(Packet::Publish(p.clone())).unwrap();
    let m = Arc::clone(routed(&h.drain())[0]);
    // And out to a v5 subscriber.
    let mut sub5 = H::attached(SessionLimits::default(), &connect(Protocol::V5, "c2", true));
    sub5.s.deliver(sub5.now, &m, &sub(QoS::AtMostOnce));
    let e = sub5.drain();
    let got = wire(published(&e)[0], Protocol::V5);
    assert_eq!(got.properties, p.properties);
}
