//! Per-delivery choices (aliases, subscription identifiers, No Local, RETAIN) and SUBSCRIBE/UNSUBSCRIBE.

use super::*;

// ----- aliases, subscription ids, no local, retain -----

#[test]
fn topic_alias_assigned_outbound_up_to_client_max() {
    let mut c = connect(Protocol::V5, "c1", true);
    c.properties.topic_alias_maximum = Some(1);
    let mut h = H::attached(SessionLimits::default(), &c);
    for t in ["a/1", "a/1", "b/2"] {
        h.s.deliver(h.now, &msg(t, QoS::AtMostOnce, b"x"), &sub(QoS::AtMostOnce));
    }
    let e = h.drain();
    let got: Vec<(String, Option<u16>)> = published(&e)
        .iter()
        .map(|p| {
            let w = wire(p, Protocol::V5);
            (w.topic, w.properties.topic_alias)
        })
        .collect();
    assert_eq!(
        got,
        [
            ("a/1".to_string(), Some(1)),
            (String::new(), Some(1)),
            ("b/2".to_string(), None)
        ]
    );
}

#[test]
fn no_topic_alias_when_client_allows_none() {
    let mut h = H::attached(SessionLimits::default(), &connect(Protocol::V5, "c1", true));
    h.s.deliver(
        h.now,
        &msg("a", QoS::AtMostOnce, b"x"),
        &sub(QoS::AtMostOnce),
    );
    h.s.deliver(
        h.now,
        &msg("a", QoS::AtMostOnce, b"x"),
        &sub(QoS::AtMostOnce),
    );
    let e = h.drain();
    for p in published(&e) {
        let w = wire(p, Protocol::V5);
        assert_eq!((w.topic.as_str(), w.properties.topic_alias), ("a", None));
    }
}

#[test]
fn subscription_ids_attached_to_deliveries() {
    let mut h = H::attached(SessionLimits::default(), &connect(Protocol::V5, "c1", true));
    let opts = DeliveryOptions {
        qos: QoS::AtMostOnce,
        subscription_ids: [3, 9].into(),
        ..DeliveryOptions::default()
    };
    h.s.deliver(h.now, &msg("a", QoS::AtMostOnce, b"x"), &opts);
    let e = h.drain();
    let w = wire(published(&e)[0], Protocol::V5);
    assert_eq!(w.properties.subscription_identifiers, [3, 9]);
}

#[test]
fn no_local_skips_own_messages() {
    let mut h = H::attached(SessionLimits::default(), &connect(Protocol::V5, "c1", true));
    let mut own = (*msg("a", QoS::AtMostOnce, b"x")).clone();
    own.publisher = Some(Arc::from("c1"));
    let opts = DeliveryOptions {
        no_local: true,
        ..sub(QoS::AtMostOnce)
    };
    h.s.deliver(h.now, &Arc::new(own), &opts);
    h.s.deliver(h.now, &msg("a", QoS::AtMostOnce, b"x"), &opts);
    let e = h.drain();
    assert_eq!(published(&e).len(), 1);
    assert!(drops(&e).is_empty(), "skipping is not a drop");
}

#[test]
fn retain_flag_cleared_unless_retain_as_published_or_from_retained() {
    let mut h = H::attached(SessionLimits::default(), &connect(Protocol::V5, "c1", true));
    let mut m = (*msg("a", QoS::AtMostOnce, b"x")).clone();
    m.retain = true;
    let m = Arc::new(m);
    let so = SubscriptionOptions::default();
    h.s.deliver(h.now, &m, &DeliveryOptions::subscription(&so, None));
    let rap = SubscriptionOptions {
        retain_as_published: true,
        ..so
    };
    h.s.deliver(h.now, &m, &DeliveryOptions::subscription(&rap, None));
    h.s.deliver(h.now, &m, &DeliveryOptions::retained(&so, None));
    let e = h.drain();
    let flags: Vec<bool> = published(&e)
        .iter()
        .map(|p| wire(p, Protocol::V5).retain)
        .collect();
    assert_eq!(flags, [false, true, true]);
}

#[test]
fn retain_handling_decides_retained_sends() {
    let req = |rh, filter: &str| SubscribeRequest {
        filter: filter.into(),
        options: SubscriptionOptions {
            retain_handling: rh,
            ..SubscriptionOptions::default()
        },
        subscription_id: None,
    };
    use RetainHandling::*;
    assert!(req(SendAtSubscribe, "a").wants_retained(false));
    assert!(req(SendIfNewSubscription, "a").wants_retained(true));
    assert!(!req(SendIfNewSubscription, "a").wants_retained(false));
    assert!(!req(DoNotSend, "a").wants_retained(true));
    assert!(!req(SendAtSubscribe, "$share/g/a").wants_retained(true));
    assert!(!req(SendAtSubscribe, "$queue/a").wants_retained(true));
}

// ----- subscribe / unsubscribe -----

struct DenyFilter(&'static str);
impl Gate for DenyFilter {
    fn allow_publish(&mut self, _: &str, _: QoS, _: bool) -> bool {
        true
    }
    fn allow_subscribe(&mut self, filter: &str, _: QoS) -> bool {
        filter != self.0
    }
}

#[test]
fn subscribe_forwards_allowed_filters_and_merges_suback() {
    let l = SessionLimits {
        qos_max: QoS::AtLeastOnce,
        ..SessionLimits::default()
    };
    let mut h = H::attached(l, &connect(Protocol::V5, "c1", true));
    let mut s = subscribe(
        5,
        &[
            ("a/#", QoS::ExactlyOnce),
            ("test/nosubscribe", QoS::AtMostOnce),
            ("b", QoS::AtMostOnce),
        ],
    );
    s.properties.subscription_identifiers = vec![42];
    h.s.handle_packet(
        h.now,
        Packet::Subscribe(s),
        &mut DenyFilter("test/nosubscribe"),
    )
    .unwrap();
    let e = h.drain();
    let [Effect::Subscribe { packet_id, filters }] = &e[..] else {
        panic!("{e:?}")
    };
    assert_eq!(*packet_id, pid(5));
    assert_eq!(filters.len(), 2);
    assert_eq!(
        filters[0].options.qos,
        QoS::AtLeastOnce,
        "capped at the maximum"
    );
    assert_eq!(filters[0].subscription_id, Some(42));
    h.s.subscribed(
        h.now,
        pid(5),
        vec![Ok(QoS::AtLeastOnce), Err(ReasonCode::QuotaExceeded)],
    );
    let e = h.drain();
    let Packet::Suback(ack) = sent(&e)[0] else {
        panic!()
    };
    assert_eq!(
        ack.reason_codes,
        [
            ReasonCode::GrantedQoS1,
            ReasonCode::NotAuthorized,
            ReasonCode::QuotaExceeded
        ]
    );
    assert_eq!(h.s.subscriptions().len(), 1);
    assert_eq!(h.s.subscriptions()["a/#"].1, Some(42));
}

#[test]
fn subscribe_all_denied_answers_at_once() {
    let mut h = H::attached(
        SessionLimits::default(),
        &connect(Protocol::V3_1_1, "c1", true),
    );
    h.s.handle_packet(
        h.now,
        Packet::Subscribe(subscribe(1, &[("x", QoS::AtMostOnce)])),
        &mut DenyAll,
    )
    .unwrap();
    let e = h.drain();
    let Packet::Suback(ack) = sent(&e)[0] else {
        panic!("{e:?}")
    };
    assert_eq!(ack.reason_codes, [ReasonCode::NotAuthorized]);
}

#[test]
fn no_local_on_shared_subscription_is_protocol_error() {
    let mut h = H::attached(SessionLimits::default(), &connect(Protocol::V5, "c1", true));
    let mut s = subscribe(1, &[("$share/g/a", QoS::AtMostOnce)]);
    s.filters[0].options.no_local = true;
    let err = h.packet(Packet::Subscribe(s)).unwrap_err();
    assert_eq!(err.reason_code(), ReasonCode::ProtocolError);
}

#[test]
fn subscription_limit_answers_quota_exceeded() {
    let l = SessionLimits {
        subscriptions_max: 1,
        ..SessionLimits::default()
    };
    let mut h = H::attached(l, &connect(Protocol::V5, "c1", true));
    h.packet(Packet::Subscribe(subscribe(
        1,
        &[("a", QoS::AtMostOnce), ("b", QoS::AtMostOnce)],
    )))
    .unwrap();
    let e = h.drain();
    let [Effect::Subscribe { filters, .. }] = &e[..] else {
        panic!("{e:?}")
    };
    assert_eq!(filters.len(), 1);
    h.s.subscribed(h.now, pid(1), vec![Ok(QoS::AtMostOnce)]);
    let e = h.drain();
    let Packet::Suback(ack) = sent(&e)[0] else {
        panic!()
    };
    assert_eq!(
        ack.reason_codes,
        [ReasonCode::Success, ReasonCode::QuotaExceeded]
    );
}

#[test]
fn unsubscribe_round_trip_removes_subscription() {
    let mut h = H::attached(SessionLimits::default(), &connect(Protocol::V5, "c1", true));
    h.packet(Packet::Subscribe(subscribe(1, &[("a", QoS::AtMostOnce)])))
        .unwrap();
    h.s.subscribed(h.now, pid(1), vec![Ok(QoS::AtMostOnce)]);
    h.drain();
    h.packet(Packet::Unsubscribe(Unsubscribe {
        packet_id: pid(2),
        filters: vec!["a".into(), "zz".into()],
        properties: Properties::default(),
    }))
    .unwrap();
    let e = h.drain();
    assert!(matches!(&e[..], [Effect::Unsubscribe { filters, .. }] if filters.len() == 2));
    h.s.unsubscribed(
        h.now,
        pid(2),
        vec![ReasonCode::Success, ReasonCode::NoSubscriptionExisted],
    );
    let e = h.drain();
    let Packet::Unsuback(ack) = sent(&e)[0] else {
        panic!()
    };
    assert_eq!(
        ack.reason_codes,
        [ReasonCode::Success, ReasonCode::NoSubscriptionExisted]
    );
    assert!(h.s.subscriptions().is_empty());
}
