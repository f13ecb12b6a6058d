//! proptest strategies for valid packets of every type and version.

#![allow(dead_code)]

use bytes::Bytes;
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use starling_codec::property_id as id;
use starling_codec::*;

pub fn protocol() -> impl Strategy<Value = Protocol> {
    prop_oneof![
        Just(Protocol::V3_1),
        Just(Protocol::V3_1_1),
        Just(Protocol::V5)
    ]
}

/// Strings without disallowed code points, some multi-byte.
pub fn text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 _./é€😀-]{0,12}"
}

pub fn topic_name() -> impl Strategy<Value = String> {
    "[a-z0-9/$é]{1,16}"
}

pub fn topic_filter() -> impl Strategy<Value = String> {
    let level = prop_oneof![Just("+".to_string()), "[a-z0-9é]{0,4}"];
    (option::of("[a-z0-9]{1,4}"), vec(level, 1..4), any::<bool>()).prop_map(
        |(share, levels, hash)| {
            let mut f = levels.join("/");
            if hash {
                f = if f.is_empty() { "#".into() } else { f + "/#" };
            }
            if f.is_empty() {
                f = "a".into();
            }
            match share {
                Some(name) => format!("$share/{name}/{f}"),
                None => f,
            }
        },
    )
}

pub fn bytes(max: usize) -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..max).prop_map(Bytes::from)
}

pub fn qos() -> impl Strategy<Value = QoS> {
    prop_oneof![
        Just(QoS::AtMostOnce),
        Just(QoS::AtLeastOnce),
        Just(QoS::ExactlyOnce)
    ]
}

pub fn packet_id() -> impl Strategy<Value = PacketId> {
    (1u16..).prop_map(|v| PacketId::new(v).expect("range starts at 1"))
}

/// Which properties a place may carry (MQTT 5 §2.2.2.2), written from the
/// spec table independently of the crate's own table.
pub fn allowed(place: &str) -> Vec<u8> {
    use id::*;
    let mut v = vec![USER_PROPERTY];
    match place {
        "will" => v.extend([
            PAYLOAD_FORMAT_INDICATOR,
            MESSAGE_EXPIRY_INTERVAL,
            CONTENT_TYPE,
            RESPONSE_TOPIC,
            CORRELATION_DATA,
            WILL_DELAY_INTERVAL,
        ]),
        "connect" => v.extend([
            SESSION_EXPIRY_INTERVAL,
            AUTHENTICATION_METHOD,
            AUTHENTICATION_DATA,
            REQUEST_PROBLEM_INFORMATION,
            REQUEST_RESPONSE_INFORMATION,
            RECEIVE_MAXIMUM,
            TOPIC_ALIAS_MAXIMUM,
            MAXIMUM_PACKET_SIZE,
        ]),
        "connack" => v.extend([
            REASON_STRING,
            SESSION_EXPIRY_INTERVAL,
            ASSIGNED_CLIENT_IDENTIFIER,
            SERVER_KEEP_ALIVE,
            AUTHENTICATION_METHOD,
            AUTHENTICATION_DATA,
            RESPONSE_INFORMATION,
            SERVER_REFERENCE,
            RECEIVE_MAXIMUM,
            TOPIC_ALIAS_MAXIMUM,
            MAXIMUM_QOS,
            RETAIN_AVAILABLE,
            MAXIMUM_PACKET_SIZE,
            WILDCARD_SUBSCRIPTION_AVAILABLE,
            SUBSCRIPTION_IDENTIFIER_AVAILABLE,
            SHARED_SUBSCRIPTION_AVAILABLE,
        ]),
        "publish" => v.extend([
            PAYLOAD_FORMAT_INDICATOR,
            MESSAGE_EXPIRY_INTERVAL,
            CONTENT_TYPE,
            RESPONSE_TOPIC,
            CORRELATION_DATA,
            SUBSCRIPTION_IDENTIFIER,
            TOPIC_ALIAS,
        ]),
        "ack" => v.push(REASON_STRING),
        "subscribe" => v.push(SUBSCRIPTION_IDENTIFIER),
        "unsubscribe" => {}
        "disconnect" => v.extend([REASON_STRING, SESSION_EXPIRY_INTERVAL, SERVER_REFERENCE]),
        "auth" => v.extend([REASON_STRING, AUTHENTICATION_METHOD, AUTHENTICATION_DATA]),
        other => panic!("unknown place {other}"),
    }
    v
}

/// Arbitrary properties, restricted to those `place` allows.
pub fn properties(place: &'static str) -> impl Strategy<Value = Properties> {
    let max_sub_ids = if place == "publish" { 3 } else { 2 };
    let a = (
        option::of(prop_oneof![
            Just(PayloadFormat::Unspecified),
            Just(PayloadFormat::Utf8)
        ]),
        option::of(any::<u32>()),
        option::of(text()),
        option::of(topic_name()),
        option::of(bytes(8)),
        vec(1u32..=VAR_INT_MAX, 0..max_sub_ids),
        option::of(any::<u32>()),
        option::of(text()),
        option::of(any::<u16>()),
        option::of(text()),
        option::of(bytes(8)),
    );
    let b = (
        option::of(any::<bool>()),
        option::of(any::<u32>()),
        option::of(any::<bool>()),
        option::of(text()),
        option::of(text()),
        option::of(text()),
        option::of(1u16..),
        option::of(any::<u16>()),
        option::of(1u16..),
        option::of(prop_oneof![Just(QoS::AtMostOnce), Just(QoS::AtLeastOnce)]),
        option::of(any::<bool>()),
    );
    let c = (
        vec((text(), text()), 0..3),
        option::of(1u32..),
        option::of(any::<bool>()),
        option::of(any::<bool>()),
        option::of(any::<bool>()),
    );
    (a, b, c).prop_map(move |(a, b, c)| {
        let ok = allowed(place);
        let keep = |pid: u8| ok.contains(&pid);
        let mut p = Properties::default();
        if keep(id::PAYLOAD_FORMAT_INDICATOR) {
            p.payload_format_indicator = a.0;
        }
        if keep(id::MESSAGE_EXPIRY_INTERVAL) {
            p.message_expiry_interval = a.1;
        }
        if keep(id::CONTENT_TYPE) {
            p.content_type = a.2;
        }
        if keep(id::RESPONSE_TOPIC) {
            p.response_topic = a.3;
        }
        if keep(id::CORRELATION_DATA) {
            p.correlation_data = a.4;
        }
        if keep(id::SUBSCRIPTION_IDENTIFIER) {
            p.subscription_identifiers = a.5;
        }
        if keep(id::SESSION_EXPIRY_INTERVAL) {
            p.session_expiry_interval = a.6;
        }
        if keep(id::ASSIGNED_CLIENT_IDENTIFIER) {
            p.assigned_client_identifier = a.7;
        }
        if keep(id::SERVER_KEEP_ALIVE) {
            p.server_keep_alive = a.8;
        }
        if keep(id::AUTHENTICATION_METHOD) {
            p.authentication_method = a.9;
        }
        if keep(id::AUTHENTICATION_DATA) {
            p.authentication_data = a.10;
            // Authentication Data needs a method (MQTT 5 §3.1.2.11.10).
            if p.authentication_data.is_some() && p.authentication_method.is_none() {
                p.authentication_method = Some("SCRAM".into());
            }
        }
        if keep(id::REQUEST_PROBLEM_INFORMATION) {
            p.request_problem_information = b.0;
        }
        if keep(id::WILL_DELAY_INTERVAL) {
            p.will_delay_interval = b.1;
        }
        if keep(id::REQUEST_RESPONSE_INFORMATION) {
            p.request_response_information = b.2;
        }
        if keep(id::RESPONSE_INFORMATION) {
            p.response_information = b.3;
        }
        if keep(id::SERVER_REFERENCE) {
            p.server_reference = b.4;
        }
        if keep(id::REASON_STRING) {
            p.reason_string = b.5;
        }
        if keep(id::RECEIVE_MAXIMUM) {
            p.receive_maximum = b.6;
        }
        if keep(id::TOPIC_ALIAS_MAXIMUM) {
            p.topic_alias_maximum = b.7;
        }
        if keep(id::TOPIC_ALIAS) {
            p.topic_alias = b.8;
        }
        if keep(id::MAXIMUM_QOS) {
            p.maximum_qos = b.9;
        }
        if keep(id::RETAIN_AVAILABLE) {
            p.retain_available = b.10;
        }
        p.user_properties = c.0;
        if keep(id::MAXIMUM_PACKET_SIZE) {
            p.maximum_packet_size = c.1;
        }
        if keep(id::WILDCARD_SUBSCRIPTION_AVAILABLE) {
            p.wildcard_subscription_available = c.2;
        }
        if keep(id::SUBSCRIPTION_IDENTIFIER_AVAILABLE) {
            p.subscription_identifier_available = c.3;
        }
        if keep(id::SHARED_SUBSCRIPTION_AVAILABLE) {
            p.shared_subscription_available = c.4;
        }
        p
    })
}

/// Properties for `place` in 5.0, none in 3.x.
fn props_for(protocol: Protocol, place: &'static str) -> BoxedStrategy<Properties> {
    if protocol.is_v5() {
        properties(place).boxed()
    } else {
        Just(Properties::default()).boxed()
    }
}

/// A reason code that `packet_type` allows in `protocol` and that survives
/// the round trip (3.x acks carry none, so only Success).
fn reason(protocol: Protocol, packet_type: PacketType) -> BoxedStrategy<ReasonCode> {
    let codes: Vec<ReasonCode> = if protocol.is_v5() {
        ALL_REASON_CODES
            .iter()
            .copied()
            .filter(|c| c.allowed_in(packet_type))
            .collect()
    } else {
        match packet_type {
            PacketType::Connack => (0..=5).filter_map(ReasonCode::from_connack_v3).collect(),
            PacketType::Suback => vec![
                ReasonCode::Success,
                ReasonCode::GrantedQoS1,
                ReasonCode::GrantedQoS2,
                ReasonCode::UnspecifiedError,
            ],
            _ => vec![ReasonCode::Success],
        }
    };
    proptest::sample::select(codes).boxed()
}

pub fn connect(protocol: Protocol) -> impl Strategy<Value = Connect> {
    let will = option::of((
        topic_name(),
        bytes(16),
        qos(),
        any::<bool>(),
        props_for(protocol, "will"),
    ))
    .prop_map(|w| {
        w.map(|(topic, payload, qos, retain, properties)| LastWill {
            topic,
            payload,
            qos,
            retain,
            properties,
        })
    });
    (
        any::<bool>(),
        any::<u16>(),
        text(),
        will,
        option::of(text()),
        option::of(bytes(12)),
        props_for(protocol, "connect"),
    )
        .prop_map(
            move |(clean_start, keep_alive, client_id, will, username, password, properties)| {
                // 3.x: no password without a user name (MQTT 3.1.1 §3.1.2.9).
                let password = if protocol.is_v5() || username.is_some() {
                    password
                } else {
                    None
                };
                Connect {
                    protocol,
                    clean_start,
                    keep_alive,
                    client_id,
                    will,
                    username,
                    password,
                    properties,
                }
            },
        )
}

pub fn publish(protocol: Protocol) -> impl Strategy<Value = Publish> {
    (
        qos(),
        any::<bool>(),
        any::<bool>(),
        topic_name(),
        any::<bool>(),
        packet_id(),
        props_for(protocol, "publish"),
        bytes(64),
    )
        .prop_map(
            move |(qos, dup, retain, topic, empty_topic, id, properties, payload)| {
                // 5.0: an empty topic with a Topic Alias (MQTT 5 §3.3.2.1).
                let topic = if empty_topic && properties.topic_alias.is_some() {
                    String::new()
                } else {
                    topic
                };
                Publish {
                    dup: dup && qos != QoS::AtMostOnce,
                    qos,
                    retain,
                    topic,
                    packet_id: (qos != QoS::AtMostOnce).then_some(id),
                    properties,
                    payload,
                }
            },
        )
}

fn pub_ack(protocol: Protocol, packet_type: PacketType) -> impl Strategy<Value = PubAck> {
    (
        packet_id(),
        reason(protocol, packet_type),
        props_for(protocol, "ack"),
    )
        .prop_map(|(packet_id, reason_code, properties)| PubAck {
            packet_id,
            reason_code,
            properties,
        })
}

fn subscription_options(protocol: Protocol) -> impl Strategy<Value = SubscriptionOptions> {
    (
        qos(),
        any::<bool>(),
        any::<bool>(),
        prop_oneof![
            Just(RetainHandling::SendAtSubscribe),
            Just(RetainHandling::SendIfNewSubscription),
            Just(RetainHandling::DoNotSend)
        ],
    )
        .prop_map(
            move |(qos, no_local, retain_as_published, retain_handling)| {
                if protocol.is_v5() {
                    SubscriptionOptions {
                        qos,
                        no_local,
                        retain_as_published,
                        retain_handling,
                    }
                } else {
                    SubscriptionOptions {
                        qos,
                        ..Default::default()
                    }
                }
            },
        )
}

pub fn packet(protocol: Protocol) -> BoxedStrategy<Packet> {
    let v5 = protocol.is_v5();
    let mut choices: Vec<BoxedStrategy<Packet>> = vec![
        connect(protocol)
            .prop_map(|c| Packet::Connect(Box::new(c)))
            .boxed(),
        (
            any::<bool>(),
            reason(protocol, PacketType::Connack),
            props_for(protocol, "connack"),
        )
            .prop_map(move |(sp, reason_code, properties)| {
                Packet::Connack(Connack {
                    session_present: sp && !reason_code.is_error() && protocol != Protocol::V3_1,
                    reason_code,
                    properties,
                })
            })
            .boxed(),
        publish(protocol).prop_map(Packet::Publish).boxed(),
        pub_ack(protocol, PacketType::Puback)
            .prop_map(Packet::Puback)
            .boxed(),
        pub_ack(protocol, PacketType::Pubrec)
            .prop_map(Packet::Pubrec)
            .boxed(),
        pub_ack(protocol, PacketType::Pubrel)
            .prop_map(Packet::Pubrel)
            .boxed(),
        pub_ack(protocol, PacketType::Pubcomp)
            .prop_map(Packet::Pubcomp)
            .boxed(),
        (
            packet_id(),
            vec((topic_filter(), subscription_options(protocol)), 1..4),
            props_for(protocol, "subscribe"),
        )
            .prop_map(|(packet_id, filters, properties)| {
                let filters = filters
                    .into_iter()
                    .map(|(filter, mut options)| {
                        // No Local is a Protocol Error on a shared subscription.
                        if filter.starts_with("$share/") {
                            options.no_local = false;
                        }
                        SubscribeFilter { filter, options }
                    })
                    .collect();
                Packet::Subscribe(Subscribe {
                    packet_id,
                    filters,
                    properties,
                })
            })
            .boxed(),
        (
            packet_id(),
            vec(reason(protocol, PacketType::Suback), 1..4),
            props_for(protocol, "ack"),
        )
            .prop_map(|(packet_id, reason_codes, properties)| {
                Packet::Suback(Suback {
                    packet_id,
                    reason_codes,
                    properties,
                })
            })
            .boxed(),
        (
            packet_id(),
            vec(topic_filter(), 1..4),
            props_for(protocol, "unsubscribe"),
        )
            .prop_map(|(packet_id, filters, properties)| {
                Packet::Unsubscribe(Unsubscribe {
                    packet_id,
                    filters,
                    properties,
                })
            })
            .boxed(),
        (
            packet_id(),
            vec(reason(protocol, PacketType::Unsuback), 1..4),
            props_for(protocol, "ack"),
        )
            .prop_map(move |(packet_id, reason_codes, properties)| {
                Packet::Unsuback(Unsuback {
                    packet_id,
                    reason_codes: if v5 { reason_codes } else { Vec::new() },
                    properties,
                })
            })
            .boxed(),
        Just(Packet::Pingreq).boxed(),
        Just(Packet::Pingresp).boxed(),
        (
            reason(protocol, PacketType::Disconnect),
            props_for(protocol, "disconnect"),
        )
            .prop_map(|(reason_code, properties)| {
                Packet::Disconnect(Disconnect {
                    reason_code,
                    properties,
                })
            })
            .boxed(),
    ];
    if v5 {
        choices.push(
            (reason(protocol, PacketType::Auth), properties("auth"))
                .prop_map(|(reason_code, properties)| {
                    Packet::Auth(Auth {
                        reason_code,
                        properties,
                    })
                })
                .boxed(),
        );
    }
    proptest::strategy::Union::new(choices).boxed()
}

/// A protocol and a valid packet for it.
pub fn any_packet() -> impl Strategy<Value = (Protocol, Packet)> {
    protocol().prop_flat_map(|p| packet(p).prop_map(move |pk| (p, pk)))
}
