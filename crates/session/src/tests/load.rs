//! Fan-out and overload: shared QoS 0 headers, the full queue and back-pressure.

use super::*;

#[test]
fn qos0_header_encoded_once_per_protocol_family_and_shared() {
    let m = msg("fleet/a/temp", QoS::AtMostOnce, b"21.5");
    let mut v311_a = H::attached(
        SessionLimits::default(),
        &connect(Protocol::V3_1_1, "a", true),
    );
    let mut v31_b = H::attached(
        SessionLimits::default(),
        &connect(Protocol::V3_1, "b", true),
    );
    let mut v5_c = H::attached(SessionLimits::default(), &connect(Protocol::V5, "c", true));
    let mut headers = Vec::new();
    for h in [&mut v311_a, &mut v31_b, &mut v5_c] {
        h.s.deliver(h.now, &m, &sub(QoS::AtMostOnce));
        let e = h.drain();
        let out = published(&e)[0].clone();
        headers.push((out.header.clone(), out));
    }
    // The second 3.x subscriber shares the first one's bytes (the cached copy).
    let cached3 = m
        .shared_headers
        .slot(false)
        .get()
        .expect("3.x header cached");
    assert_eq!(headers[1].0.as_ptr(), cached3.as_ptr());
    assert_eq!(headers[0].0, headers[1].0);
    // MQTT 5 has its own (a property length byte).
    assert_ne!(headers[0].0, headers[2].0);
    for (i, protocol) in [Protocol::V3_1_1, Protocol::V3_1, Protocol::V5]
        .into_iter()
        .enumerate()
    {
        let p = wire(&headers[i].1, protocol);
        assert_eq!(
            (p.topic.as_str(), &p.payload[..]),
            ("fleet/a/temp", &b"21.5"[..])
        );
        assert_eq!((p.qos, p.retain, p.dup), (QoS::AtMostOnce, false, false));
    }
}

#[test]
fn shared_qos0_header_still_honours_client_maximum_packet_size() {
    let m = msg("t", QoS::AtMostOnce, b"012345678901234567890123456789");
    let mut big = H::attached(
        SessionLimits::default(),
        &connect(Protocol::V5, "big", true),
    );
    big.s.deliver(big.now, &m, &sub(QoS::AtMostOnce));
    assert_eq!(published(&big.drain()).len(), 1);
    let mut c = connect(Protocol::V5, "small", true);
    // Room for the CONNACK (16 bytes), not for the 36-byte PUBLISH.
    c.properties.maximum_packet_size = Some(20);
    let mut small = H::attached(SessionLimits::default(), &c);
    small.s.deliver(small.now, &m, &sub(QoS::AtMostOnce));
    let e = small.drain();
    assert!(published(&e).is_empty());
    assert_eq!(drops(&e), vec![DropReason::TooLarge]);
}

#[test]
fn per_subscriber_headers_are_not_shared() {
    // RETAIN (retain as published), a subscription identifier, QoS 1: all per delivery.
    let mut m = (*msg("t/r", QoS::AtLeastOnce, b"x")).clone();
    m.retain = true;
    let m = Arc::new(m);
    let mut h = H::attached(SessionLimits::default(), &connect(Protocol::V5, "a", true));
    let mut o = sub(QoS::AtMostOnce);
    o.retain_as_published = true;
    h.s.deliver(h.now, &m, &o);
    let mut o = sub(QoS::AtMostOnce);
    o.subscription_ids = [7].into();
    h.s.deliver(h.now, &m, &o);
    h.s.deliver(h.now, &m, &sub(QoS::AtLeastOnce));
    assert_eq!(published(&h.drain()).len(), 3);
    assert!(m.shared_headers.slot(true).get().is_none());
}

#[test]
fn refuses_new_exactly_when_a_full_queue_would_drop_any_arrival() {
    // Returns the flag with the queue full, and whether an arrival of `qos` then got in.
    let run = |policy, first_qos, qos| {
        let limits = SessionLimits {
            mqueue_len_max: 2,
            mqueue_policy: policy,
            queue_qos0_offline: true,
            ..SessionLimits::default()
        };
        let mut h = H::attached(limits, &v5_persistent("c1"));
        h.s.detach(h.now, DetachReason::ConnectionLost);
        h.drain();
        assert!(!h.s.refuses_new());
        h.s.deliver(h.now, &msg("t", first_qos, b"0"), &sub(first_qos));
        assert!(!h.s.refuses_new(), "one of two queued");
        h.s.deliver(
            h.now,
            &msg("t", QoS::AtLeastOnce, b"1"),
            &sub(QoS::AtLeastOnce),
        );
        let refuses = h.s.refuses_new();
        h.s.deliver(h.now, &msg("t", qos, b"x"), &sub(qos));
        h.s.attach(h.now, &v5_persistent("c1")).unwrap();
        let e = h.drain();
        let got_in = published(&e).iter().any(|p| &p.msg.payload[..] == b"x");
        (refuses, got_in)
    };
    use QueueFullPolicy::*;
    for qos in [QoS::AtMostOnce, QoS::AtLeastOnce] {
        assert_eq!(run(DropNew, QoS::AtLeastOnce, qos), (true, false));
        assert_eq!(run(DropOldestQos0, QoS::AtLeastOnce, qos), (true, false));
        assert_eq!(run(DropOldestQos0, QoS::AtMostOnce, qos), (false, true));
        assert_eq!(run(DropOldest, QoS::AtLeastOnce, qos), (false, true));
    }
}

#[test]
fn backlogged_from_half_the_queue_until_a_quarter_and_never_while_detached() {
    let l = SessionLimits {
        inflight_max: 1,
        mqueue_len_max: 8,
        ..SessionLimits::default()
    };
    let mut h = H::attached(l, &connect(Protocol::V3_1_1, "c1", false));
    let mut was = false;
    let mut seen = Vec::new();
    // One in flight, then the queue grows to 6.
    for _ in 0..7 {
        h.s.deliver(
            h.now,
            &msg("t", QoS::AtLeastOnce, b"x"),
            &sub(QoS::AtLeastOnce),
        );
        was = h.s.backlogged(was, 0);
        seen.push((h.s.queue_len(), was));
    }
    assert_eq!(
        seen,
        [
            (0, false),
            (1, false),
            (2, false),
            (3, false),
            (4, true),
            (5, true),
            (6, true)
        ]
    );
    // Each acknowledgement moves one queued message into the window.
    let mut seen = Vec::new();
    for _ in 0..5 {
        let e = h.drain();
        let out = published(&e);
        assert_eq!(out.len(), 1, "one in flight at a time");
        let id = out[0].packet_id.unwrap();
        h.packet(Packet::Puback(PubAck::new(id))).unwrap();
        was = h.s.backlogged(was, 0);
        seen.push((h.s.queue_len(), was));
    }
    assert_eq!(
        seen,
        [(5, true), (4, true), (3, true), (2, false), (1, false)]
    );
    // Back over half, then the connection goes: nobody is held back by an offline queue.
    for _ in 0..4 {
        h.s.deliver(
            h.now,
            &msg("t", QoS::AtLeastOnce, b"x"),
            &sub(QoS::AtLeastOnce),
        );
    }
    assert!(h.s.backlogged(false, 0));
    // Messages on their way count as queued.
    assert!(h.s.backlogged(false, 100));
    h.s.detach(h.now, DetachReason::ConnectionLost);
    assert!(!h.s.backlogged(true, 100));
}

#[test]
fn held_back_deliveries_go_past_the_queue_bound_up_to_twice_it() {
    let l = SessionLimits {
        inflight_max: 1,
        mqueue_len_max: 4,
        mqueue_policy: QueueFullPolicy::DropNew,
        ..SessionLimits::default()
    };
    let mut h = H::attached(l, &connect(Protocol::V3_1_1, "c1", false));
    let held = DeliveryOptions {
        held_back: true,
        ..sub(QoS::AtLeastOnce)
    };
    // One in flight, four queued: full for anything not held back.
    for _ in 0..5 {
        h.s.deliver(
            h.now,
            &msg("t", QoS::AtLeastOnce, b"x"),
            &sub(QoS::AtLeastOnce),
        );
    }
    assert!(h.s.refuses_new());
    h.s.deliver(
        h.now,
        &msg("t", QoS::AtLeastOnce, b"x"),
        &sub(QoS::AtLeastOnce),
    );
    assert_eq!(h.s.queue_len(), 4, "not held back: dropped");
    for _ in 0..6 {
        h.s.deliver(h.now, &msg("t", QoS::AtLeastOnce, b"x"), &held);
    }
    assert_eq!(h.s.queue_len(), 8, "held back: kept up to twice the bound");
    // QoS 0 is never held back, so never kept past the bound.
    h.s.deliver(h.now, &msg("t", QoS::AtMostOnce, b"x"), &held);
    assert_eq!(h.s.queue_len(), 8);
    let drops = h
        .drain()
        .iter()
        .filter(|e| {
            matches!(
                e,
                Effect::Dropped {
                    reason: DropReason::QueueFull,
                    ..
                }
            )
        })
        .count();
    assert_eq!(drops, 1 + 2 + 1);
}
