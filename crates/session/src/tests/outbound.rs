//! Deliveries to the client: QoS flows, the window, the queue, resends, expiry.

use super::*;

// ----- outbound QoS, window, queue -----

#[test]
fn qos1_outbound_window_then_queue_then_ack_releases() {
    let l = SessionLimits {
        inflight_max: 2,
        ..SessionLimits::default()
    };
    let mut h = H::attached(l, &connect(Protocol::V3_1_1, "c1", true));
    for _ in 0..3 {
        h.s.deliver(
            h.now,
            &msg("t", QoS::AtLeastOnce, b"x"),
            &sub(QoS::AtLeastOnce),
        );
    }
    let e = h.drain();
    let out = published(&e);
    assert_eq!(out.len(), 2);
    assert_eq!((h.s.inflight_len(), h.s.queue_len()), (2, 1));
    let first = out[0].packet_id.unwrap();
    h.packet(Packet::Puback(PubAck::new(first))).unwrap();
    let e = h.drain();
    assert_eq!(published(&e).len(), 1);
    assert_eq!((h.s.inflight_len(), h.s.queue_len()), (2, 0));
}

#[test]
fn client_receive_maximum_bounds_the_window() {
    let mut c = connect(Protocol::V5, "c1", true);
    c.properties.receive_maximum = Some(1);
    let mut h = H::attached(SessionLimits::default(), &c);
    assert_eq!(h.s.window(), 1);
    h.s.deliver(
        h.now,
        &msg("t", QoS::ExactlyOnce, b"1"),
        &sub(QoS::ExactlyOnce),
    );
    h.s.deliver(
        h.now,
        &msg("t", QoS::AtLeastOnce, b"2"),
        &sub(QoS::AtLeastOnce),
    );
    assert_eq!(published(&h.drain()).len(), 1);
    assert_eq!(h.s.queue_len(), 1);
}

#[test]
fn qos_downgraded_to_subscription_maximum() {
    let mut h = H::attached(SessionLimits::default(), &connect(Protocol::V5, "c1", true));
    h.s.deliver(
        h.now,
        &msg("t", QoS::ExactlyOnce, b"x"),
        &sub(QoS::AtMostOnce),
    );
    let e = h.drain();
    assert_eq!(published(&e)[0].qos, QoS::AtMostOnce);
    assert_eq!(published(&e)[0].packet_id, None);
    assert_eq!(h.s.inflight_len(), 0);
}

#[test]
fn qos2_outbound_pubrec_pubrel_pubcomp() {
    let mut h = H::attached(SessionLimits::default(), &connect(Protocol::V5, "c1", true));
    h.s.deliver(
        h.now,
        &msg("t", QoS::ExactlyOnce, b"x"),
        &sub(QoS::ExactlyOnce),
    );
    let e = h.drain();
    let id = published(&e)[0].packet_id.unwrap();
    h.packet(Packet::Pubrec(PubAck::new(id))).unwrap();
    assert_eq!(sent(&h.drain()), vec![&Packet::Pubrel(PubAck::new(id))]);
    assert_eq!(h.s.inflight_len(), 1);
    // What the PUBCOMP will acknowledge, for the broker's acked event.
    let (m, qos) = h.s.inflight_message(id).expect("in flight");
    assert_eq!((&*m.topic, qos), ("t", QoS::ExactlyOnce));
    h.packet(Packet::Pubcomp(PubAck::new(id))).unwrap();
    assert!(h.drain().is_empty());
    assert_eq!(h.s.inflight_len(), 0);
    assert!(h.s.inflight_message(id).is_none());
}

#[test]
fn qos2_failing_pubrec_ends_the_exchange() {
    let mut h = H::attached(SessionLimits::default(), &connect(Protocol::V5, "c1", true));
    h.s.deliver(
        h.now,
        &msg("t", QoS::ExactlyOnce, b"x"),
        &sub(QoS::ExactlyOnce),
    );
    let e = h.drain();
    let id = published(&e)[0].packet_id.unwrap();
    let mut rec = PubAck::new(id);
    rec.reason_code = ReasonCode::QuotaExceeded;
    h.packet(Packet::Pubrec(rec)).unwrap();
    assert!(sent(&h.drain()).is_empty());
    assert_eq!(h.s.inflight_len(), 0);
}

#[test]
fn qos1_redelivered_with_dup_after_reconnect() {
    let mut h = H::attached(SessionLimits::default(), &v5_persistent("c1"));
    h.s.deliver(
        h.now,
        &msg("t", QoS::AtLeastOnce, b"a"),
        &sub(QoS::AtLeastOnce),
    );
    h.s.deliver(
        h.now,
        &msg("t", QoS::AtLeastOnce, b"b"),
        &sub(QoS::AtLeastOnce),
    );
    let e = h.drain();
    let ids: Vec<_> = published(&e).iter().map(|p| p.packet_id).collect();
    h.s.detach(h.now, DetachReason::ConnectionLost);
    h.drain();
    let a = h.s.attach(h.now, &v5_persistent("c1")).unwrap();
    assert!(a.session_present);
    let e = h.drain();
    assert!(connack(&e).session_present);
    let again = published(&e);
    assert_eq!(again.iter().map(|p| p.packet_id).collect::<Vec<_>>(), ids);
    assert!(again.iter().all(|p| p.dup));
    assert!(wire(again[0], Protocol::V5).dup);
    assert_eq!(&again[0].msg.payload[..], b"a", "original order");
}

#[test]
fn smaller_receive_maximum_on_reconnect_resends_all_but_sends_nothing_new() {
    let mut h = H::attached(SessionLimits::default(), &v5_persistent("c1"));
    for _ in 0..3 {
        h.s.deliver(
            h.now,
            &msg("t", QoS::AtLeastOnce, b"a"),
            &sub(QoS::AtLeastOnce),
        );
    }
    let ids: Vec<_> = published(&h.drain())
        .iter()
        .map(|p| p.packet_id.unwrap())
        .collect();
    h.s.detach(h.now, DetachReason::ConnectionLost);
    let mut c = v5_persistent("c1");
    c.properties.receive_maximum = Some(1);
    h.s.attach(h.now, &c).unwrap();
    h.s.deliver(
        h.now,
        &msg("t", QoS::AtLeastOnce, b"new"),
        &sub(QoS::AtLeastOnce),
    );
    // MQTT 5 §4.4 asks for every unacknowledged PUBLISH again.
    assert_eq!(published(&h.drain()).len(), 3);
    h.packet(Packet::Puback(PubAck::new(ids[0]))).unwrap();
    h.packet(Packet::Puback(PubAck::new(ids[1]))).unwrap();
    assert!(
        published(&h.drain()).is_empty(),
        "still 1 in flight, window 1"
    );
    h.packet(Packet::Puback(PubAck::new(ids[2]))).unwrap();
    assert_eq!(&published(&h.drain())[0].msg.payload[..], b"new");
}

#[test]
fn expired_inflight_qos1_not_resent_and_qos2_released() {
    let mut h = H::attached(SessionLimits::default(), &v5_persistent("c1"));
    for qos in [QoS::AtLeastOnce, QoS::ExactlyOnce] {
        let mut m = (*msg("t", qos, b"x")).clone();
        m.expires_at = Some(Expiry::announced(h.now + Duration::from_secs(5)));
        h.s.deliver(h.now, &Arc::new(m), &sub(qos));
    }
    let e = h.drain();
    let q2 = published(&e)[1].packet_id.unwrap();
    h.s.detach(h.now, DetachReason::ConnectionLost);
    h.now += Duration::from_secs(10);
    h.s.attach(h.now, &v5_persistent("c1")).unwrap();
    let e = h.drain();
    assert!(published(&e).is_empty());
    assert_eq!(drops(&e), [DropReason::Expired; 2]);
    // The QoS 2 id may be held by the client: release it rather than reuse it.
    assert_eq!(sent(&e)[1..], [&Packet::Pubrel(PubAck::new(q2))]);
    h.packet(Packet::Pubcomp(PubAck::new(q2))).unwrap();
    assert_eq!(h.s.inflight_len(), 0);
}

#[test]
fn inflight_message_resent_with_remaining_expiry() {
    let mut h = H::attached(SessionLimits::default(), &v5_persistent("c1"));
    let mut m = (*msg("t", QoS::AtLeastOnce, b"x")).clone();
    m.expires_at = Some(Expiry::announced(h.now + Duration::from_secs(30)));
    h.s.deliver(h.now, &Arc::new(m), &sub(QoS::AtLeastOnce));
    h.drain();
    h.s.detach(h.now, DetachReason::ConnectionLost);
    h.now += Duration::from_secs(10);
    h.s.attach(h.now, &v5_persistent("c1")).unwrap();
    let e = h.drain();
    let w = wire(published(&e)[0], Protocol::V5);
    assert_eq!(w.properties.message_expiry_interval, Some(20));
}

#[test]
fn queued_qos0_evicted_to_front_is_sent_without_a_slot() {
    let l = SessionLimits {
        inflight_max: 1,
        mqueue_len_max: 2,
        mqueue_policy: QueueFullPolicy::DropOldest,
        ..SessionLimits::default()
    };
    let mut h = H::attached(l, &connect(Protocol::V5, "c1", true));
    h.s.deliver(
        h.now,
        &msg("t", QoS::AtLeastOnce, b"1"),
        &sub(QoS::AtLeastOnce),
    );
    h.s.deliver(
        h.now,
        &msg("t", QoS::AtLeastOnce, b"2"),
        &sub(QoS::AtLeastOnce),
    );
    h.s.deliver(
        h.now,
        &msg("t", QoS::AtMostOnce, b"3"),
        &sub(QoS::AtMostOnce),
    );
    h.s.deliver(
        h.now,
        &msg("t", QoS::AtLeastOnce, b"4"),
        &sub(QoS::AtLeastOnce),
    );
    let e = h.drain();
    let payloads: Vec<u8> = published(&e).iter().map(|p| p.msg.payload[0]).collect();
    assert_eq!(payloads, b"13");
    assert_eq!(drops(&e), [DropReason::QueueFull]);
    assert_eq!(h.s.queue_len(), 1);
}

#[test]
fn unsubscribe_with_packet_id_in_use_answered_0x91() {
    let mut h = H::attached(SessionLimits::default(), &connect(Protocol::V5, "c1", true));
    let u = Unsubscribe {
        packet_id: pid(4),
        filters: vec!["a".into()],
        properties: Properties::default(),
    };
    h.packet(Packet::Unsubscribe(u.clone())).unwrap();
    h.drain();
    h.packet(Packet::Unsubscribe(u)).unwrap();
    let e = h.drain();
    let Packet::Unsuback(ack) = sent(&e)[0] else {
        panic!("{e:?}")
    };
    assert_eq!(ack.reason_codes, [ReasonCode::PacketIdentifierInUse]);
}

#[test]
fn qos2_pubrel_resent_after_reconnect() {
    let mut h = H::attached(SessionLimits::default(), &v5_persistent("c1"));
    h.s.deliver(
        h.now,
        &msg("t", QoS::ExactlyOnce, b"a"),
        &sub(QoS::ExactlyOnce),
    );
    let id = published(&h.drain())[0].packet_id.unwrap();
    h.packet(Packet::Pubrec(PubAck::new(id))).unwrap();
    h.s.detach(h.now, DetachReason::ConnectionLost);
    h.drain();
    h.s.attach(h.now, &v5_persistent("c1")).unwrap();
    let e = h.drain();
    assert!(
        published(&e).is_empty(),
        "no PUBLISH after PUBREL (MQTT 5 §4.3.3)"
    );
    assert_eq!(sent(&e)[1..], [&Packet::Pubrel(PubAck::new(id))]);
}

#[test]
fn v3_unacked_message_resent_with_dup_after_retry_interval() {
    let l = SessionLimits {
        retry_interval: Some(Duration::from_secs(10)),
        ..SessionLimits::default()
    };
    let mut h = H::attached(l, &connect(Protocol::V3_1_1, "c1", true));
    h.s.deliver(
        h.now,
        &msg("t", QoS::AtLeastOnce, b"a"),
        &sub(QoS::AtLeastOnce),
    );
    h.drain();
    assert_eq!(h.s.poll_timeout(), Some(h.now + Duration::from_secs(10)));
    h.advance(Duration::from_secs(10));
    let e = h.drain();
    assert_eq!(published(&e).len(), 1);
    assert!(published(&e)[0].dup);
}

#[test]
fn v3_pubrel_replacing_an_expired_qos2_resend_is_retried_a_full_interval_later() {
    let l = SessionLimits {
        retry_interval: Some(Duration::from_secs(30)),
        ..SessionLimits::default()
    };
    let c = connect(Protocol::V3_1_1, "c1", false);
    let mut h = H::attached(l, &c);
    let mut m = (*msg("t", QoS::ExactlyOnce, b"x")).clone();
    m.expires_at = Some(Expiry::announced(h.now + Duration::from_secs(5)));
    h.s.deliver(h.now, &Arc::new(m), &sub(QoS::ExactlyOnce));
    let id = published(&h.drain())[0].packet_id.unwrap();
    h.s.detach(h.now, DetachReason::ConnectionLost);
    h.now += Duration::from_secs(20);
    h.s.attach(h.now, &c).unwrap();
    // Expired: released with a PUBREL instead of resent, and that PUBREL was sent now.
    assert_eq!(sent(&h.drain())[1..], [&Packet::Pubrel(PubAck::new(id))]);
    assert_eq!(h.s.poll_timeout(), Some(h.now + Duration::from_secs(30)));
    h.advance(Duration::from_secs(29));
    assert!(sent(&h.drain()).is_empty());
}

#[test]
fn v5_never_resends_while_connected() {
    let l = SessionLimits {
        retry_interval: Some(Duration::from_secs(10)),
        ..SessionLimits::default()
    };
    let mut h = H::attached(l, &connect(Protocol::V5, "c1", true));
    h.s.deliver(
        h.now,
        &msg("t", QoS::AtLeastOnce, b"a"),
        &sub(QoS::AtLeastOnce),
    );
    h.drain();
    h.advance(Duration::from_secs(30));
    assert!(published(&h.drain()).is_empty());
}

#[test]
fn queue_full_drops_and_counts() {
    let limits = |policy| SessionLimits {
        mqueue_len_max: 2,
        mqueue_policy: policy,
        queue_qos0_offline: true,
        ..SessionLimits::default()
    };
    let fill = |policy| {
        let mut h = H::attached(limits(policy), &v5_persistent("c1"));
        h.s.detach(h.now, DetachReason::ConnectionLost);
        h.drain();
        h.s.deliver(
            h.now,
            &msg("t", QoS::AtMostOnce, b"0"),
            &sub(QoS::AtMostOnce),
        );
        h.s.deliver(
            h.now,
            &msg("t", QoS::AtLeastOnce, b"1"),
            &sub(QoS::AtLeastOnce),
        );
        h.s.deliver(
            h.now,
            &msg("t", QoS::AtLeastOnce, b"2"),
            &sub(QoS::AtLeastOnce),
        );
        let e = h.drain();
        assert_eq!(drops(&e), [DropReason::QueueFull]);
        assert_eq!(h.s.queue_len(), 2);
        h.s.attach(h.now, &v5_persistent("c1")).unwrap();
        let e = h.drain();
        published(&e)
            .iter()
            .map(|p| p.msg.payload[0])
            .collect::<Vec<_>>()
    };
    assert_eq!(fill(QueueFullPolicy::DropNew), b"01");
    assert_eq!(fill(QueueFullPolicy::DropOldestQos0), b"12");
    assert_eq!(fill(QueueFullPolicy::DropOldest), b"12");
}

#[test]
fn offline_qos0_dropped_unless_configured() {
    let mut h = H::attached(SessionLimits::default(), &v5_persistent("c1"));
    h.s.detach(h.now, DetachReason::ConnectionLost);
    h.drain();
    h.s.deliver(
        h.now,
        &msg("t", QoS::AtMostOnce, b"0"),
        &sub(QoS::AtMostOnce),
    );
    assert_eq!(drops(&h.drain()), [DropReason::Offline]);
    h.s.deliver(
        h.now,
        &msg("t", QoS::AtLeastOnce, b"1"),
        &sub(QoS::AtLeastOnce),
    );
    assert_eq!(h.s.queue_len(), 1);
}

#[test]
fn oversize_message_dropped_for_client_maximum_packet_size() {
    let mut c = connect(Protocol::V5, "c1", true);
    c.properties.maximum_packet_size = Some(20);
    let mut h = H::attached(SessionLimits::default(), &c);
    h.s.deliver(
        h.now,
        &msg("t", QoS::AtLeastOnce, &[0; 32]),
        &sub(QoS::AtLeastOnce),
    );
    h.s.deliver(
        h.now,
        &msg("t", QoS::AtLeastOnce, b"ok"),
        &sub(QoS::AtLeastOnce),
    );
    let e = h.drain();
    assert_eq!(drops(&e), [DropReason::TooLarge]);
    assert_eq!(published(&e).len(), 1);
    assert!(published(&e)[0].size() <= 20);
    assert_eq!(h.s.inflight_len(), 1, "the dropped one took no slot");
}

// ----- expiry -----

#[test]
fn expired_message_not_delivered() {
    let mut h = H::attached(SessionLimits::default(), &v5_persistent("c1"));
    let mut m = (*msg("t", QoS::AtLeastOnce, b"x")).clone();
    m.expires_at = Some(Expiry::announced(h.now + Duration::from_secs(5)));
    let m = Arc::new(m);
    h.s.detach(h.now, DetachReason::ConnectionLost);
    h.s.deliver(h.now, &m, &sub(QoS::AtLeastOnce));
    h.drain();
    h.now += Duration::from_secs(6);
    h.s.deliver(h.now, &m, &sub(QoS::AtLeastOnce));
    assert_eq!(drops(&h.drain()), [DropReason::Expired]);
    h.s.attach(h.now, &v5_persistent("c1")).unwrap();
    let e = h.drain();
    assert!(published(&e).is_empty());
    assert_eq!(
        drops(&e),
        [DropReason::Expired],
        "the queued copy expired too"
    );
}

#[test]
fn message_expiry_interval_decremented_when_sent() {
    let mut publisher = H::attached(SessionLimits::default(), &connect(Protocol::V5, "p", true));
    let Packet::Publish(mut p) = publish("t", QoS::AtLeastOnce, Some(1), b"x") else {
        unreachable!()
    };
    p.properties.message_expiry_interval = Some(60);
    publisher.packet(Packet::Publish(p)).unwrap();
    let m = Arc::clone(routed(&publisher.drain())[0]);
    assert_eq!(m.properties.message_expiry_interval, None);

    let mut h = H::attached(SessionLimits::default(), &v5_persistent("c1"));
    h.now = publisher.now + Duration::from_secs(20);
    h.s.deliver(h.now, &m, &sub(QoS::AtLeastOnce));
    let e = h.drain();
    let got = wire(published(&e)[0], Protocol::V5);
    assert_eq!(got.properties.message_expiry_interval, Some(40));
}

#[test]
fn message_expiry_capped_by_broker_maximum() {
    let l = SessionLimits {
        message_expiry_max: Some(Duration::from_secs(10)),
        ..SessionLimits::default()
    };
    let mut h = H::attached(l, &connect(Protocol::V3_1_1, "p", true));
    h.packet(publish("t", QoS::AtMostOnce, None, b"x")).unwrap();
    let m = Arc::clone(routed(&h.drain())[0]);
    // Kept at most that long, but the publisher set no expiry: none is announced.
    assert_eq!(
        m.expires_at,
        Some(Expiry {
            at: h.now + Duration::from_secs(10),
            announced: false
        })
    );
}

#[test]
fn only_a_first_send_of_a_routed_message_carries_its_latency_start() {
    let mut h = H::attached(SessionLimits::default(), &v5_persistent("c1"));
    let at = h.now;
    let timed = |qos| {
        Arc::new(Message {
            received_at: Some(at),
            ..Message::clone(&msg("t", qos, b"a"))
        })
    };
    h.s.deliver(h.now, &timed(QoS::AtLeastOnce), &sub(QoS::AtLeastOnce));
    h.s.deliver(h.now, &timed(QoS::AtMostOnce), &sub(QoS::AtMostOnce));
    let retained = DeliveryOptions::retained(&SubscriptionOptions::default(), None);
    h.s.deliver(h.now, &timed(QoS::AtMostOnce), &retained);
    h.s.deliver(
        h.now,
        &msg("t", QoS::AtMostOnce, b"b"),
        &sub(QoS::AtMostOnce),
    );
    let e = h.drain();
    let starts: Vec<_> = published(&e).iter().map(|p| p.latency_from).collect();
    assert_eq!(starts, [Some(at), Some(at), None, None]);
    // The QoS 1 one is resent on the next connection, with DUP: untimed.
    h.s.detach(h.now, DetachReason::ConnectionLost);
    h.drain();
    h.s.attach(h.now, &v5_persistent("c1")).unwrap();
    let e = h.drain();
    let again = published(&e);
    assert_eq!(again.len(), 1);
    assert!(again[0].dup && again[0].latency_from.is_none());
}
