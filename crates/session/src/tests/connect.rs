//! CONNECT, CONNACK and keep alive.

use super::*;

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
