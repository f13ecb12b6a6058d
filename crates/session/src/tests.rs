//! Behaviour of one session, driven by hand: packets in, effects out, time
//! jumped to the next deadline.

use std::num::NonZeroU16;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use starling_codec::{
    decode, Connect, Disconnect, LastWill, Packet, PacketId, PayloadFormat, Properties, Protocol,
    PubAck, Publish, QoS, ReasonCode, RetainHandling, Subscribe, SubscribeFilter,
    SubscriptionOptions, Unsubscribe,
};

use crate::*;

fn pid(n: u16) -> PacketId {
    NonZeroU16::new(n).expect("test ids are non-zero")
}

fn connect(protocol: Protocol, client_id: &str, clean_start: bool) -> Connect {
    Connect {
        protocol,
        clean_start,
        keep_alive: 60,
        client_id: client_id.to_string(),
        will: None,
        username: None,
        password: None,
        properties: Properties::default(),
    }
}

/// An MQTT 5 CONNECT with a session that outlives the connection.
fn v5_persistent(client_id: &str) -> Connect {
    let mut c = connect(Protocol::V5, client_id, false);
    c.properties.session_expiry_interval = Some(3600);
    c
}

fn msg(topic: &str, qos: QoS, payload: &'static [u8]) -> Arc<Message> {
    Arc::new(Message {
        topic: Arc::from(topic),
        payload: Bytes::from_static(payload),
        qos,
        retain: false,
        properties: Properties::default(),
        expires_at: None,
        publisher: Some(Arc::from("publisher")),
        shared_headers: Default::default(),
    })
}

fn sub(qos: QoS) -> DeliveryOptions {
    DeliveryOptions {
        qos,
        ..DeliveryOptions::default()
    }
}

fn publish(topic: &str, qos: QoS, id: Option<u16>, payload: &'static [u8]) -> Packet {
    Packet::Publish(Publish {
        dup: false,
        qos,
        retain: false,
        topic: topic.to_string(),
        packet_id: id.map(pid),
        properties: Properties::default(),
        payload: Bytes::from_static(payload),
    })
}

struct H {
    s: Session,
    now: Instant,
}

impl H {
    fn new(limits: SessionLimits) -> Self {
        Self {
            s: Session::new(Arc::from("c1"), limits),
            now: base_instant(),
        }
    }

    fn attached(limits: SessionLimits, c: &Connect) -> Self {
        let mut h = Self::new(limits);
        h.s.attach(h.now, c).expect("attach");
        h.drain();
        h
    }

    fn drain(&mut self) -> Vec<Effect> {
        std::iter::from_fn(|| self.s.poll_effect()).collect()
    }

    fn packet(&mut self, p: Packet) -> Result<(), SessionError> {
        self.s.handle_packet(self.now, p, &mut AllowAll)
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
        self.s.handle_timeout(self.now);
    }
}

fn sent(effects: &[Effect]) -> Vec<&Packet> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Send(p) => Some(p),
            _ => None,
        })
        .collect()
}

fn published(effects: &[Effect]) -> Vec<&OutgoingPublish> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::SendPublish(p) => Some(p),
            _ => None,
        })
        .collect()
}

fn routed(effects: &[Effect]) -> Vec<&Arc<Message>> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Publish(m) => Some(m),
            _ => None,
        })
        .collect()
}

fn drops(effects: &[Effect]) -> Vec<DropReason> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Dropped { reason, .. } => Some(*reason),
            _ => None,
        })
        .collect()
}

fn wills(effects: &[Effect]) -> Vec<&Arc<Message>> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Will(m) => Some(m),
            _ => None,
        })
        .collect()
}

/// The PUBLISH as the client decodes it.
fn wire(out: &OutgoingPublish, protocol: Protocol) -> Publish {
    let mut buf = BytesMut::from(&out.header[..]);
    buf.extend_from_slice(&out.msg.payload);
    match decode(&mut buf, protocol, u32::MAX) {
        Ok(Some(Packet::Publish(p))) => p,
        other => panic!("not a PUBLISH: {other:?}"),
    }
}

fn connack(effects: &[Effect]) -> &starling_codec::Connack {
    match effects.first() {
        Some(Effect::Send(Packet::Connack(c))) => c,
        other => panic!("first effect is not a CONNACK: {other:?}"),
    }
}

fn closed(effects: &[Effect]) -> Option<Option<ReasonCode>> {
    effects.iter().find_map(|e| match e {
        Effect::Close(c) => Some(*c),
        _ => None,
    })
}

// ----- CONNECT / CONNACK -----

#[test]
fn connack_v5_announces_limits_and_assigned_id() {
    let limits = SessionLimits {
        receive_max: 10,
        topic_alias_max: 5,
        qos_max: QoS::AtLeastOnce,
        retain_available: false,
        shared_available: false,
        keepalive_secs_max: 30,
        session_expiry_secs_max: 100,
        response_information: Some("resp/".into()),
        ..SessionLimits::default()
    };
    let mut c = connect(Protocol::V5, "", true);
    c.properties.session_expiry_interval = Some(1000);
    c.properties.request_response_information = Some(true);
    assert_eq!(check_connect(&c, &limits), Ok(ClientIdentity::MustAssign));
    let mut h = H::new(limits);
    let a = h.s.attach(h.now, &c).unwrap();
    assert_eq!(a.keep_alive_secs, 30);
    let e = h.drain();
    let ack = connack(&e);
    assert!(!ack.session_present);
    let p = &ack.properties;
    assert_eq!(p.assigned_client_identifier.as_deref(), Some("c1"));
    assert_eq!(p.receive_maximum, Some(10));
    assert_eq!(p.topic_alias_maximum, Some(5));
    assert_eq!(p.maximum_qos, Some(QoS::AtLeastOnce));
    assert_eq!(p.retain_available, Some(false));
    assert_eq!(p.shared_subscription_available, Some(false));
    assert_eq!(p.server_keep_alive, Some(30));
    assert_eq!(p.session_expiry_interval, Some(100));
    assert_eq!(p.response_information.as_deref(), Some("resp/"));
}

#[test]
fn response_information_only_when_requested() {
    let limits = SessionLimits {
        response_information: Some("resp/".into()),
        ..SessionLimits::default()
    };
    let mut h = H::new(limits);
    h.s.attach(h.now, &connect(Protocol::V5, "c1", true))
        .unwrap();
    assert_eq!(connack(&h.drain()).properties.response_information, None);
}

#[test]
fn empty_client_id_refused_for_v31_and_persistent_v311() {
    let l = SessionLimits::default();
    let c = connect(Protocol::V3_1_1, "", false);
    assert_eq!(
        check_connect(&c, &l),
        Err(ReasonCode::ClientIdentifierNotValid)
    );
    let c = connect(Protocol::V3_1, "", true);
    assert_eq!(
        check_connect(&c, &l),
        Err(ReasonCode::ClientIdentifierNotValid)
    );
    let c = connect(Protocol::V3_1_1, "", true);
    assert_eq!(check_connect(&c, &l), Ok(ClientIdentity::MustAssign));
}

#[test]
fn will_qos_above_maximum_refused_for_v5() {
    let l = SessionLimits {
        qos_max: QoS::AtMostOnce,
        ..SessionLimits::default()
    };
    let mut c = connect(Protocol::V5, "c1", true);
    c.will = Some(LastWill {
        topic: "w".into(),
        payload: Bytes::new(),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: Properties::default(),
    });
    assert_eq!(check_connect(&c, &l), Err(ReasonCode::QoSNotSupported));
}

#[test]
fn second_connect_is_protocol_error() {
    let c = connect(Protocol::V5, "c1", true);
    let mut h = H::attached(SessionLimits::default(), &c);
    let err = h.packet(Packet::Connect(Box::new(c))).unwrap_err();
    assert_eq!(err, SessionError::SecondConnect);
    assert_eq!(closed(&h.drain()), Some(Some(ReasonCode::ProtocolError)));
    assert!(!h.s.is_attached());
}

#[test]
fn v3_protocol_error_closes_without_reason_code() {
    let c = connect(Protocol::V3_1_1, "c1", true);
    let mut h = H::attached(SessionLimits::default(), &c);
    h.packet(Packet::Connect(Box::new(c))).unwrap_err();
    assert_eq!(closed(&h.drain()), Some(None));
}

#[test]
fn pingreq_answered_with_pingresp() {
    let mut h = H::attached(
        SessionLimits::default(),
        &connect(Protocol::V3_1, "c1", true),
    );
    h.packet(Packet::Pingreq).unwrap();
    assert_eq!(sent(&h.drain()), vec![&Packet::Pingresp]);
}

// ----- keep alive -----

#[test]
fn keepalive_timeout_closes_with_0x8d_after_one_and_a_half_periods() {
    let mut h = H::attached(SessionLimits::default(), &connect(Protocol::V5, "c1", true));
    assert_eq!(h.s.poll_timeout(), Some(h.now + Duration::from_secs(90)));
    h.advance(Duration::from_secs(80));
    h.packet(Packet::Pingreq).unwrap();
    h.drain();
    h.advance(Duration::from_secs(80));
    assert!(h.s.is_attached(), "a packet restarts the keep alive");
    h.advance(Duration::from_secs(10));
    let e = h.drain();
    assert_eq!(closed(&e), Some(Some(ReasonCode::KeepAliveTimeout)));
    assert!(!h.s.is_attached());
}

#[test]
fn keepalive_zero_replaced_by_maximum_when_not_allowed() {
    let l = SessionLimits {
        keepalive_zero_allowed: false,
        keepalive_secs_max: 20,
        ..SessionLimits::default()
    };
    let mut c = connect(Protocol::V5, "c1", true);
    c.keep_alive = 0;
    let mut h = H::new(l);
    assert_eq!(h.s.attach(h.now, &c).unwrap().keep_alive_secs, 20);
    assert_eq!(connack(&h.drain()).properties.server_keep_alive, Some(20));
}

#[test]
fn keepalive_below_minimum_raised_with_server_keep_alive() {
    let l = SessionLimits {
        keepalive_secs_min: 30,
        ..SessionLimits::default()
    };
    let mut c = connect(Protocol::V5, "c1", true);
    c.keep_alive = 5;
    let mut h = H::new(l);
    assert_eq!(h.s.attach(h.now, &c).unwrap().keep_alive_secs, 30);
    assert_eq!(connack(&h.drain()).properties.server_keep_alive, Some(30));
}

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
    h.packet(with_alias("long/topic", 1)).unwrap();
    h.packet(with_alias("", 1)).unwrap();
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

struct DenyAll;
impl Gate for DenyAll {
    fn allow_publish(&mut self, _: &str, _: QoS, _: bool) -> bool {
        false
    }
    fn allow_subscribe(&mut self, _: &str, _: QoS) -> bool {
        false
    }
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
    h.packet(Packet::Pubcomp(PubAck::new(id))).unwrap();
    assert!(h.drain().is_empty());
    assert_eq!(h.s.inflight_len(), 0);
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
        subscription_ids: vec![3, 9],
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
}

// ----- subscribe / unsubscribe -----

fn subscribe(id: u16, filters: &[(&str, QoS)]) -> Subscribe {
    Subscribe {
        packet_id: pid(id),
        filters: filters
            .iter()
            .map(|(f, q)| SubscribeFilter {
                filter: f.to_string(),
                options: SubscriptionOptions {
                    qos: *q,
                    ..SubscriptionOptions::default()
                },
            })
            .collect(),
        properties: Properties::default(),
    }
}

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

// ----- will and session expiry -----

fn with_will(mut c: Connect, delay: Option<u32>) -> Connect {
    let properties = Properties {
        will_delay_interval: delay,
        ..Properties::default()
    };
    c.will = Some(LastWill {
        topic: "will/c1".into(),
        payload: Bytes::from_static(b"gone"),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties,
    });
    c
}

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
    o.subscription_ids = vec![7];
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

/// Where a test's time starts: any instant will do, the test moves time itself.
#[allow(clippy::disallowed_methods)] // no clock is read again: time only advances by hand
fn base_instant() -> std::time::Instant {
    std::time::Instant::now()
}
