//! One test per validation rule, on hand-written bytes: the error variant
//! and the reason code it maps to.

use bytes::{Bytes, BytesMut};

use crate::*;

const V31: Protocol = Protocol::V3_1;
const V311: Protocol = Protocol::V3_1_1;
const V5: Protocol = Protocol::V5;

/// A packet with a one-byte remaining length.
fn frame(first: u8, body: &[u8]) -> Vec<u8> {
    assert!(body.len() < 128);
    let mut v = vec![first, body.len() as u8];
    v.extend_from_slice(body);
    v
}

fn dec(bytes: &[u8], protocol: Protocol) -> Result<Option<Packet>, Error> {
    decode(&mut BytesMut::from(bytes), protocol, u32::MAX)
}

fn ok(bytes: &[u8], protocol: Protocol) -> Packet {
    dec(bytes, protocol)
        .expect("valid packet")
        .expect("whole packet")
}

fn err(bytes: &[u8], protocol: Protocol) -> Error {
    dec(bytes, protocol).expect_err("invalid packet")
}

fn assert_err(bytes: &[u8], protocol: Protocol, expected: Error, code: ReasonCode) {
    let e = err(bytes, protocol);
    assert_eq!(e, expected);
    assert_eq!(e.reason_code(), code, "{e}");
}

/// A v5 QoS 0 PUBLISH to "a" with these property bytes and payload "x".
fn publish_v5(props: &[u8]) -> Vec<u8> {
    let mut body = vec![0, 1, b'a', props.len() as u8];
    body.extend_from_slice(props);
    body.push(b'x');
    frame(0x30, &body)
}

/// A CONNECT with this name, level, flags and payload (keep alive 60, and
/// for level 5 an empty property list).
fn connect_bytes(name: &[u8], level: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut body = vec![0, name.len() as u8];
    body.extend_from_slice(name);
    body.extend_from_slice(&[level, flags, 0, 60]);
    if level == 5 {
        body.push(0);
    }
    body.extend_from_slice(payload);
    frame(0x10, &body)
}

fn connect_of(bytes: &[u8]) -> Result<Option<Connect>, Error> {
    decode_connect(&mut BytesMut::from(bytes), u32::MAX)
}

const MALFORMED: ReasonCode = ReasonCode::MalformedPacket;
const PROTOCOL: ReasonCode = ReasonCode::ProtocolError;

// ---- fixed header -------------------------------------------------------

#[test]
fn packet_type_zero_is_malformed() {
    assert_err(
        &[0x00, 0x00],
        V5,
        Error::ReservedPacketType {
            packet_type: 0,
            protocol: V5,
        },
        MALFORMED,
    );
}

#[test]
fn auth_before_v5_is_a_reserved_packet_type() {
    assert!(matches!(
        err(&[0xF0, 0x00], V311),
        Error::ReservedPacketType {
            packet_type: 15,
            ..
        }
    ));
}

#[test]
fn reserved_fixed_header_flags_are_malformed() {
    for (first, packet_type) in [
        (0xC1, PacketType::Pingreq),
        (0x60, PacketType::Pubrel),
        (0x80, PacketType::Subscribe),
        (0xA0, PacketType::Unsubscribe),
        (0x42, PacketType::Puback),
        (0xE8, PacketType::Disconnect),
    ] {
        assert_err(
            &[first, 0x00],
            V311,
            Error::InvalidFixedHeaderFlags {
                packet_type,
                flags: first & 0x0F,
            },
            MALFORMED,
        );
    }
}

#[test]
fn mqtt_3_1_pubrel_subscribe_unsubscribe_with_dup_are_accepted() {
    // MQTT 3.1 §3.6: PUBREL is sent at QoS 1 and retried with DUP set, like SUBSCRIBE and
    // UNSUBSCRIBE (§3.8, §3.10).
    assert_eq!(
        ok(&[0x6A, 0x02, 0x00, 0x07], V31),
        Packet::Pubrel(PubAck::new(PacketId::new(7).expect("non-zero")))
    );
    assert!(matches!(
        ok(&frame(0x8A, &[0, 1, 0, 1, b'a', 1]), V31),
        Packet::Subscribe(_)
    ));
    assert!(matches!(
        ok(&frame(0xAA, &[0, 1, 0, 1, b'a']), V31),
        Packet::Unsubscribe(_)
    ));
    // Only DUP: other flag bits stay refused in 3.1.
    assert_err(
        &[0x6B, 0x02, 0x00, 0x07],
        V31,
        Error::InvalidFixedHeaderFlags {
            packet_type: PacketType::Pubrel,
            flags: 0b1011,
        },
        MALFORMED,
    );
}

#[test]
fn pubrel_with_dup_is_malformed_in_3_1_1_and_5() {
    for protocol in [V311, V5] {
        assert_err(
            &[0x6A, 0x02, 0x00, 0x07],
            protocol,
            Error::InvalidFixedHeaderFlags {
                packet_type: PacketType::Pubrel,
                flags: 0b1010,
            },
            MALFORMED,
        );
    }
}

#[test]
fn fixed_header_is_checked_before_the_body_arrives() {
    // Only the first byte is there: still refused.
    assert!(matches!(
        err(&[0xC1], V311),
        Error::InvalidFixedHeaderFlags { .. }
    ));
}

#[test]
fn remaining_length_longer_than_four_bytes_is_malformed() {
    assert_err(
        &[0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01],
        V311,
        Error::VarIntTooLong,
        MALFORMED,
    );
}

#[test]
fn non_minimal_remaining_length_is_malformed() {
    assert_err(
        &[0xC0, 0x80, 0x00],
        V311,
        Error::VarIntNonMinimal,
        MALFORMED,
    );
}

#[test]
fn trailing_bytes_after_the_last_field_are_malformed() {
    assert_err(
        &[0xC0, 0x01, 0x00],
        V311,
        Error::TrailingBytes { count: 1 },
        MALFORMED,
    );
    // A 3.1.1 PUBACK is exactly two bytes of packet id.
    assert_err(
        &frame(0x40, &[0, 1, 0]),
        V311,
        Error::TrailingBytes { count: 1 },
        MALFORMED,
    );
}

#[test]
fn field_past_the_remaining_length_is_malformed() {
    // Topic claims 5 bytes, 1 present.
    assert_err(
        &frame(0x30, &[0, 5, b'a']),
        V311,
        Error::UnexpectedEndOfPacket,
        MALFORMED,
    );
}

#[test]
fn partial_packet_needs_more_bytes_and_consumes_nothing() {
    let whole = frame(0x30, &[0, 1, b'a', b'x', b'y']);
    for cut in 0..whole.len() {
        let mut buf = BytesMut::from(&whole[..cut]);
        assert_eq!(decode(&mut buf, V311, u32::MAX), Ok(None), "cut at {cut}");
        assert_eq!(buf.len(), cut);
    }
}

#[test]
fn packet_too_large_maps_to_packet_too_large_reason() {
    let bytes = frame(0x30, &[0, 1, b'a', 1, 2, 3]);
    let e = decode(&mut BytesMut::from(&bytes[..]), V311, 7).unwrap_err();
    assert_eq!(e, Error::PacketTooLarge { size: 8, max: 7 });
    assert_eq!(e.reason_code(), ReasonCode::PacketTooLarge);
}

// ---- strings ------------------------------------------------------------

#[test]
fn invalid_utf8_in_a_string_is_malformed() {
    assert_err(
        &frame(0x30, &[0, 2, 0xC3, 0x28]),
        V311,
        Error::InvalidUtf8,
        MALFORMED,
    );
}

#[test]
fn nul_in_a_topic_name_is_malformed() {
    assert_err(
        &frame(0x30, &[0, 3, b'a', 0, b'b']),
        V311,
        Error::DisallowedCodePoint { code_point: 0 },
        MALFORMED,
    );
}

#[test]
fn control_character_in_a_string_is_malformed() {
    assert_err(
        &frame(0x30, &[0, 2, b'a', 0x07]),
        V311,
        Error::DisallowedCodePoint { code_point: 7 },
        MALFORMED,
    );
}

#[test]
fn non_character_in_a_string_is_malformed() {
    // U+FFFF is EF BF BF.
    assert_err(
        &frame(0x30, &[0, 3, 0xEF, 0xBF, 0xBF]),
        V311,
        Error::DisallowedCodePoint { code_point: 0xFFFF },
        MALFORMED,
    );
}

// ---- PUBLISH ------------------------------------------------------------

#[test]
fn publish_with_qos_3_is_malformed() {
    assert_err(
        &frame(0x36, &[0, 1, b'a', 0, 1]),
        V311,
        Error::InvalidQoS,
        MALFORMED,
    );
}

#[test]
fn qos0_publish_with_dup_is_malformed() {
    assert_err(
        &frame(0x38, &[0, 1, b'a']),
        V311,
        Error::DupWithQoS0,
        MALFORMED,
    );
}

#[test]
fn wildcard_in_publish_topic_is_topic_name_invalid() {
    for topic in [&b"a/+"[..], b"#", b"a/b#"] {
        let mut body = vec![0, topic.len() as u8];
        body.extend_from_slice(topic);
        assert_err(
            &frame(0x30, &body),
            V311,
            Error::TopicNameWildcard,
            ReasonCode::TopicNameInvalid,
        );
    }
}

#[test]
fn empty_publish_topic_is_a_protocol_error_without_topic_alias() {
    assert_err(&frame(0x30, &[0, 0]), V311, Error::TopicNameEmpty, PROTOCOL);
    assert_err(
        &frame(0x30, &[0, 0, 0]),
        V5,
        Error::TopicNameEmpty,
        PROTOCOL,
    );
}

#[test]
fn empty_publish_topic_with_topic_alias_is_accepted_in_v5() {
    let Packet::Publish(p) = ok(&frame(0x30, &[0, 0, 3, 0x23, 0, 7, b'x']), V5) else {
        panic!("not a publish");
    };
    assert_eq!(p.topic, "");
    assert_eq!(p.properties.topic_alias, Some(7));
    assert_eq!(p.payload, Bytes::from_static(b"x"));
}

#[test]
fn publish_packet_id_zero_is_a_protocol_error() {
    assert_err(
        &frame(0x32, &[0, 1, b'a', 0, 0]),
        V311,
        Error::PacketIdZero,
        PROTOCOL,
    );
}

#[test]
fn publish_payload_is_sliced_from_the_input_buffer() {
    let mut buf = BytesMut::from(&frame(0x30, &[0, 1, b'a', b'h', b'i'])[..]);
    let start = buf.as_ptr() as usize;
    let Some(Packet::Publish(p)) = decode(&mut buf, V311, u32::MAX).unwrap() else {
        panic!("not a publish");
    };
    // The payload points into the original allocation: no copy.
    assert_eq!(p.payload.as_ptr() as usize, start + 5);
    assert_eq!(&p.payload[..], b"hi");
}

// ---- properties -----------------------------------------------------------

#[test]
fn duplicate_property_is_a_protocol_error() {
    assert_err(
        &publish_v5(&[0x02, 0, 0, 0, 1, 0x02, 0, 0, 0, 2]),
        V5,
        Error::DuplicateProperty { id: 0x02 },
        PROTOCOL,
    );
}

#[test]
fn user_properties_may_repeat_and_keep_their_order() {
    let up = |k: u8, v: u8| [0x26, 0, 1, k, 0, 1, v];
    let mut props = Vec::new();
    props.extend_from_slice(&up(b'k', b'2'));
    props.extend_from_slice(&up(b'k', b'1'));
    props.extend_from_slice(&up(b'a', b'0'));
    let Packet::Publish(p) = ok(&publish_v5(&props), V5) else {
        panic!()
    };
    let pairs: Vec<(&str, &str)> = p
        .properties
        .user_properties
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(pairs, [("k", "2"), ("k", "1"), ("a", "0")]);
}

#[test]
fn publish_may_carry_several_subscription_identifiers() {
    let Packet::Publish(p) = ok(&publish_v5(&[0x0B, 5, 0x0B, 0x80, 0x01]), V5) else {
        panic!()
    };
    assert_eq!(p.properties.subscription_identifiers, [5, 128]);
}

#[test]
fn subscribe_with_two_subscription_identifiers_is_a_protocol_error() {
    assert_err(
        &frame(0x82, &[0, 1, 4, 0x0B, 1, 0x0B, 2, 0, 1, b'a', 0]),
        V5,
        Error::DuplicateProperty { id: 0x0B },
        PROTOCOL,
    );
}

#[test]
fn property_not_allowed_on_the_packet_is_malformed() {
    // Topic Alias on PUBACK.
    assert_err(
        &frame(0x40, &[0, 1, 0, 3, 0x23, 0, 1]),
        V5,
        Error::PropertyNotAllowed {
            id: 0x23,
            packet_type: PacketType::Puback,
        },
        MALFORMED,
    );
    // Will Delay Interval among the CONNECT (not will) properties.
    let mut body = vec![0, 4, b'M', b'Q', b'T', b'T', 5, 0x02, 0, 60];
    body.extend_from_slice(&[5, 0x18, 0, 0, 0, 1, 0, 0]);
    assert!(matches!(
        connect_of(&frame(0x10, &body)),
        Err(Error::PropertyNotAllowed { id: 0x18, .. })
    ));
}

#[test]
fn unknown_property_identifier_is_malformed() {
    assert_err(
        &publish_v5(&[0x04, 0]),
        V5,
        Error::UnknownProperty { id: 0x04 },
        MALFORMED,
    );
}

#[test]
fn topic_alias_zero_is_a_protocol_error() {
    assert_err(
        &publish_v5(&[0x23, 0, 0]),
        V5,
        Error::PropertyValueZero { id: 0x23 },
        PROTOCOL,
    );
}

#[test]
fn subscription_identifier_zero_is_a_protocol_error() {
    assert_err(
        &frame(0x82, &[0, 1, 2, 0x0B, 0, 0, 1, b'a', 0]),
        V5,
        Error::PropertyValueZero { id: 0x0B },
        PROTOCOL,
    );
}

#[test]
fn receive_maximum_zero_is_a_protocol_error() {
    // CONNACK with Receive Maximum 0.
    assert_err(
        &frame(0x20, &[0, 0, 3, 0x21, 0, 0]),
        V5,
        Error::PropertyValueZero { id: 0x21 },
        PROTOCOL,
    );
}

#[test]
fn maximum_packet_size_zero_is_a_protocol_error() {
    assert_err(
        &frame(0x20, &[0, 0, 5, 0x27, 0, 0, 0, 0]),
        V5,
        Error::PropertyValueZero { id: 0x27 },
        PROTOCOL,
    );
}

#[test]
fn flag_property_other_than_0_or_1_is_a_protocol_error() {
    assert_err(
        &frame(0x20, &[0, 0, 2, 0x25, 2]),
        V5,
        Error::InvalidPropertyValue { id: 0x25 },
        PROTOCOL,
    );
}

#[test]
fn maximum_qos_2_is_a_protocol_error() {
    assert_err(
        &frame(0x20, &[0, 0, 2, 0x24, 2]),
        V5,
        Error::InvalidPropertyValue { id: 0x24 },
        PROTOCOL,
    );
}

#[test]
fn payload_format_indicator_other_than_0_or_1_is_a_protocol_error() {
    assert_err(
        &publish_v5(&[0x01, 2]),
        V5,
        Error::InvalidPropertyValue { id: 0x01 },
        PROTOCOL,
    );
}

#[test]
fn response_topic_with_wildcard_is_a_protocol_error() {
    assert_err(
        &publish_v5(&[0x08, 0, 1, b'#']),
        V5,
        Error::InvalidPropertyValue { id: 0x08 },
        PROTOCOL,
    );
}

#[test]
fn non_minimal_property_identifier_is_malformed() {
    assert_err(
        &publish_v5(&[0x81, 0x00, 0]),
        V5,
        Error::VarIntNonMinimal,
        MALFORMED,
    );
}

#[test]
fn property_length_past_the_packet_is_malformed() {
    assert_err(
        &frame(0x30, &[0, 1, b'a', 9, 0x01, 0]),
        V5,
        Error::UnexpectedEndOfPacket,
        MALFORMED,
    );
}

// ---- reason codes -------------------------------------------------------

#[test]
fn reason_code_not_allowed_in_the_packet_is_malformed() {
    // 0x04 Disconnect with Will Message is not a PUBACK code.
    assert_err(
        &frame(0x40, &[0, 1, 0x04]),
        V5,
        Error::ReasonCodeNotAllowed {
            packet_type: PacketType::Puback,
            code: 0x04,
        },
        MALFORMED,
    );
    // 0x03 is no reason code at all.
    assert!(matches!(
        err(&[0xE0, 0x01, 0x03], V5),
        Error::ReasonCodeNotAllowed { code: 0x03, .. }
    ));
}

#[test]
fn v5_acks_accept_every_short_form() {
    let id = PacketId::new(1).unwrap();
    assert_eq!(
        ok(&frame(0x40, &[0, 1]), V5),
        Packet::Puback(PubAck::new(id))
    );
    assert_eq!(
        ok(&frame(0x50, &[0, 1, 0x10]), V5),
        Packet::Pubrec(PubAck {
            reason_code: ReasonCode::NoMatchingSubscribers,
            ..PubAck::new(id)
        })
    );
    assert_eq!(
        ok(&frame(0x62, &[0, 1, 0x92, 0]), V5),
        Packet::Pubrel(PubAck {
            reason_code: ReasonCode::PacketIdentifierNotFound,
            ..PubAck::new(id)
        })
    );
}

#[test]
fn v5_disconnect_with_zero_length_is_a_normal_disconnection() {
    // mqttbytes 0.6 refuses this, the most common v5 DISCONNECT.
    assert_eq!(
        ok(&[0xE0, 0x00], V5),
        Packet::Disconnect(Disconnect::default())
    );
    assert_eq!(
        ok(&[0xE0, 0x01, 0x04], V5),
        Packet::Disconnect(Disconnect {
            reason_code: ReasonCode::DisconnectWithWillMessage,
            properties: Properties::default(),
        })
    );
}

#[test]
fn auth_with_reason_code_but_no_property_length_is_malformed() {
    assert_eq!(ok(&[0xF0, 0x00], V5), Packet::Auth(Auth::default()));
    assert_err(
        &[0xF0, 0x01, 0x18],
        V5,
        Error::UnexpectedEndOfPacket,
        MALFORMED,
    );
}

#[test]
fn v3_disconnect_with_a_body_is_malformed() {
    assert!(matches!(
        err(&[0xE0, 0x01, 0x00], V311),
        Error::TrailingBytes { .. }
    ));
}

// ---- SUBSCRIBE / UNSUBSCRIBE --------------------------------------------

#[test]
fn subscribe_without_filters_is_a_protocol_error() {
    assert_err(
        &frame(0x82, &[0, 1]),
        V311,
        Error::EmptyPayload {
            packet_type: PacketType::Subscribe,
        },
        PROTOCOL,
    );
}

#[test]
fn unsubscribe_without_filters_is_a_protocol_error() {
    assert_err(
        &frame(0xA2, &[0, 1, 0]),
        V5,
        Error::EmptyPayload {
            packet_type: PacketType::Unsubscribe,
        },
        PROTOCOL,
    );
}

#[test]
fn suback_without_codes_is_a_protocol_error() {
    assert!(matches!(
        err(&frame(0x90, &[0, 1]), V311),
        Error::EmptyPayload { .. }
    ));
}

#[test]
fn subscribe_packet_id_zero_is_a_protocol_error() {
    assert_err(
        &frame(0x82, &[0, 0, 0, 1, b'a', 0]),
        V311,
        Error::PacketIdZero,
        PROTOCOL,
    );
}

#[test]
fn hash_not_last_in_filter_is_topic_filter_invalid() {
    assert_err(
        &frame(0x82, &[0, 1, 0, 5, b'a', b'/', b'#', b'/', b'b', 0]),
        V311,
        Error::TopicFilterWildcardMisplaced,
        ReasonCode::TopicFilterInvalid,
    );
}

#[test]
fn plus_not_alone_in_its_level_is_topic_filter_invalid() {
    assert_err(
        &frame(0xA2, &[0, 1, 0, 4, b'a', b'+', b'/', b'b']),
        V311,
        Error::TopicFilterWildcardMisplaced,
        ReasonCode::TopicFilterInvalid,
    );
}

#[test]
fn empty_topic_filter_is_invalid() {
    assert_err(
        &frame(0x82, &[0, 1, 0, 0, 0]),
        V311,
        Error::TopicFilterEmpty,
        ReasonCode::TopicFilterInvalid,
    );
}

#[test]
fn shared_subscription_without_filter_is_invalid() {
    let f = b"$share/g";
    let mut body = vec![0, 1, 0, f.len() as u8];
    body.extend_from_slice(f);
    body.push(0);
    assert_err(
        &frame(0x82, &body),
        V311,
        Error::SharedSubscriptionInvalid,
        ReasonCode::TopicFilterInvalid,
    );
}

#[test]
fn subscription_options_reserved_bits_are_malformed() {
    assert_err(
        &frame(0x82, &[0, 1, 0, 0, 1, b'a', 0x40]),
        V5,
        Error::SubscriptionOptionsReserved,
        MALFORMED,
    );
    // In 3.1.1 only the two QoS bits exist.
    assert_err(
        &frame(0x82, &[0, 1, 0, 1, b'a', 0x04]),
        V311,
        Error::SubscriptionOptionsReserved,
        MALFORMED,
    );
}

#[test]
fn subscription_qos_3_is_a_protocol_error() {
    // MQTT 5 §3.8.3.1: "It is a Protocol Error if the Maximum QoS field has the value 3".
    assert_err(
        &frame(0x82, &[0, 1, 0, 0, 1, b'a', 3]),
        V5,
        Error::SubscriptionQoSInvalid,
        PROTOCOL,
    );
    // 3.1.1 only closes the connection; the same error either way.
    assert_err(
        &frame(0x82, &[0, 1, 0, 1, b'a', 3]),
        V311,
        Error::SubscriptionQoSInvalid,
        PROTOCOL,
    );
}

#[test]
fn publish_qos_3_stays_malformed() {
    // MQTT 5 §3.3.1.2: unlike SUBSCRIBE, a PUBLISH with both QoS bits set is malformed.
    assert_err(
        &frame(0x36, &[0, 1, b'a', 0, 1]),
        V5,
        Error::InvalidQoS,
        MALFORMED,
    );
}

#[test]
fn retain_handling_3_is_a_protocol_error() {
    assert_err(
        &frame(0x82, &[0, 1, 0, 0, 1, b'a', 0x30]),
        V5,
        Error::RetainHandlingInvalid,
        PROTOCOL,
    );
}

#[test]
fn no_local_on_a_shared_subscription_is_a_protocol_error() {
    let f = b"$share/g/a";
    let mut body = vec![0, 1, 0, 0, f.len() as u8];
    body.extend_from_slice(f);
    body.push(0x04);
    assert_err(
        &frame(0x82, &body),
        V5,
        Error::NoLocalOnSharedSubscription,
        PROTOCOL,
    );
}

#[test]
fn v5_subscription_options_decode_every_field() {
    let Packet::Subscribe(s) = ok(&frame(0x82, &[0, 9, 0, 0, 1, b'a', 0x2E]), V5) else {
        panic!()
    };
    assert_eq!(
        s.filters[0].options,
        SubscriptionOptions {
            qos: QoS::ExactlyOnce,
            no_local: true,
            retain_as_published: true,
            retain_handling: RetainHandling::DoNotSend,
        }
    );
}

// ---- CONNECT ------------------------------------------------------------

#[test]
fn connect_detects_each_protocol_version() {
    for (name, level, protocol) in [
        (&b"MQIsdp"[..], 3, V31),
        (b"MQTT", 4, V311),
        (b"MQTT", 5, V5),
    ] {
        let bytes = connect_bytes(name, level, 0x02, &[0, 1, b'c']);
        assert_eq!(peek_protocol(&bytes), Ok(Some(protocol)));
        let c = connect_of(&bytes).unwrap().unwrap();
        assert_eq!(c.protocol, protocol);
        assert_eq!(c.client_id, "c");
        assert!(c.clean_start);
        assert_eq!(c.keep_alive, 60);
    }
}

#[test]
fn unsupported_protocol_level_maps_to_unsupported_protocol_version() {
    let e = connect_of(&connect_bytes(b"MQTT", 6, 0, &[0, 0])).unwrap_err();
    assert_eq!(e, Error::UnsupportedProtocolVersion { level: 6 });
    assert_eq!(e.reason_code(), ReasonCode::UnsupportedProtocolVersion);
    assert_eq!(e.reason_code().to_connack_v3(), 0x01);
}

#[test]
fn unknown_protocol_name_maps_to_unsupported_protocol_version() {
    let e = connect_of(&connect_bytes(b"MQTX", 4, 0, &[0, 0])).unwrap_err();
    assert_eq!(e, Error::InvalidProtocolName);
    assert_eq!(e.reason_code(), ReasonCode::UnsupportedProtocolVersion);
}

#[test]
fn first_packet_other_than_connect_is_a_protocol_error() {
    let e = connect_of(&[0xC0, 0x00]).unwrap_err();
    assert_eq!(e, Error::FirstPacketNotConnect { packet_type: 12 });
    assert_eq!(e.reason_code(), PROTOCOL);
}

#[test]
fn connect_reserved_flag_is_malformed() {
    for level in [4, 5] {
        let e = connect_of(&connect_bytes(b"MQTT", level, 0x01 | 0x02, &[0, 1, b'c'])).unwrap_err();
        assert_eq!(e, Error::ConnectReservedFlag);
        assert_eq!(e.reason_code(), MALFORMED);
    }
}

#[test]
fn mqtt_3_1_connect_with_the_unused_flag_bit_is_accepted() {
    // MQTT 3.1 leaves bit 0 unused without requiring 0: ignored, the other flags stand.
    let c = connect_of(&connect_bytes(b"MQIsdp", 3, 0x01 | 0x02, &[0, 1, b'c']))
        .expect("accepted")
        .expect("whole packet");
    assert_eq!(c.protocol, V31);
    assert!(c.clean_start);
    assert_eq!(c.client_id, "c");
}

#[test]
fn will_qos_or_retain_without_will_flag_is_malformed() {
    for flags in [0x08, 0x10, 0x20] {
        let e = connect_of(&connect_bytes(b"MQTT", 4, flags, &[0, 0])).unwrap_err();
        assert_eq!(e, Error::WillFlagsWithoutWill);
        assert_eq!(e.reason_code(), MALFORMED);
    }
}

#[test]
fn will_qos_3_is_malformed() {
    let payload = [0, 0, 0, 1, b't', 0, 0];
    let e = connect_of(&connect_bytes(b"MQTT", 4, 0x04 | 0x18, &payload)).unwrap_err();
    assert_eq!(e, Error::InvalidQoS);
}

#[test]
fn will_topic_with_wildcard_is_refused() {
    let payload = [0, 0, 0, 1, b'#', 0, 0];
    let e = connect_of(&connect_bytes(b"MQTT", 4, 0x04, &payload)).unwrap_err();
    assert_eq!(e, Error::TopicNameWildcard);
}

#[test]
fn will_decodes_with_its_properties_in_v5() {
    // Will properties: Will Delay Interval 10; topic "t"; payload "p".
    let payload = [0, 0, 5, 0x18, 0, 0, 0, 10, 0, 1, b't', 0, 1, b'p'];
    let c = connect_of(&connect_bytes(b"MQTT", 5, 0x04 | 0x08 | 0x20, &payload))
        .unwrap()
        .unwrap();
    let w = c.will.expect("will");
    assert_eq!(w.topic, "t");
    assert_eq!(&w.payload[..], b"p");
    assert_eq!(w.qos, QoS::AtLeastOnce);
    assert!(w.retain);
    assert_eq!(w.properties.will_delay_interval, Some(10));
}

#[test]
fn password_without_username_is_malformed_before_v5() {
    for (name, level) in [(&b"MQIsdp"[..], 3), (b"MQTT", 4)] {
        let e = connect_of(&connect_bytes(name, level, 0x40, &[0, 0, 0, 1, b'p'])).unwrap_err();
        assert_eq!(e, Error::PasswordWithoutUsername);
        assert_eq!(e.reason_code(), MALFORMED);
    }
}

#[test]
fn password_without_username_is_allowed_in_v5() {
    let c = connect_of(&connect_bytes(b"MQTT", 5, 0x40, &[0, 0, 0, 1, b'p']))
        .unwrap()
        .unwrap();
    assert_eq!(c.username, None);
    assert_eq!(c.password.as_deref(), Some(&b"p"[..]));
}

#[test]
fn binary_password_is_bytes_not_utf8() {
    let payload = [0, 0, 0, 1, b'u', 0, 3, 0xFF, 0x00, 0xC3];
    let c = connect_of(&connect_bytes(b"MQTT", 4, 0xC0, &payload))
        .unwrap()
        .unwrap();
    assert_eq!(c.username.as_deref(), Some("u"));
    assert_eq!(c.password.as_deref(), Some(&[0xFF, 0x00, 0xC3][..]));
}

#[test]
fn authentication_data_without_method_is_a_protocol_error() {
    let mut body = vec![0, 4, b'M', b'Q', b'T', b'T', 5, 0x02, 0, 60];
    body.extend_from_slice(&[4, 0x16, 0, 1, 0xAA, 0, 0]);
    let e = connect_of(&frame(0x10, &body)).unwrap_err();
    assert_eq!(e, Error::AuthDataWithoutMethod);
    assert_eq!(e.reason_code(), PROTOCOL);
}

#[test]
fn peek_protocol_waits_for_the_level_byte() {
    let bytes = connect_bytes(b"MQTT", 5, 0, &[0, 0]);
    for cut in 0..9 {
        assert_eq!(peek_protocol(&bytes[..cut]), Ok(None), "cut {cut}");
    }
    assert_eq!(peek_protocol(&bytes[..9]), Ok(Some(V5)));
}

// ---- CONNACK ------------------------------------------------------------

#[test]
fn connack_reserved_flags_are_malformed() {
    assert_err(
        &frame(0x20, &[0x02, 0]),
        V311,
        Error::ConnackReservedFlags,
        MALFORMED,
    );
    // 3.1 has no Session Present bit.
    assert_err(
        &frame(0x20, &[0x01, 0]),
        V31,
        Error::ConnackReservedFlags,
        MALFORMED,
    );
}

#[test]
fn connack_with_session_present_and_an_error_is_a_protocol_error() {
    assert_err(
        &frame(0x20, &[0x01, 0x05]),
        V311,
        Error::SessionPresentWithError,
        PROTOCOL,
    );
}

#[test]
fn v5_connack_without_property_length_is_malformed() {
    // mqttbytes 0.6 writes this; it is missing the property length.
    assert_err(
        &frame(0x20, &[0, 0]),
        V5,
        Error::UnexpectedEndOfPacket,
        MALFORMED,
    );
}

#[test]
fn v3_connack_return_codes_map_to_reason_codes() {
    let Packet::Connack(c) = ok(&frame(0x20, &[0, 0x04]), V311) else {
        panic!()
    };
    assert_eq!(c.reason_code, ReasonCode::BadUserNameOrPassword);
    assert_err(
        &frame(0x20, &[0, 0x06]),
        V311,
        Error::ReasonCodeNotAllowed {
            packet_type: PacketType::Connack,
            code: 6,
        },
        MALFORMED,
    );
}

// ---- encoder ------------------------------------------------------------

fn enc(packet: &Packet, protocol: Protocol) -> Result<BytesMut, Error> {
    let mut buf = BytesMut::new();
    encode(packet, protocol, u32::MAX, &mut buf).map(|_| buf)
}

fn publish(topic: &str) -> Publish {
    Publish {
        dup: false,
        qos: QoS::AtMostOnce,
        retain: false,
        topic: topic.into(),
        packet_id: None,
        properties: Properties::default(),
        payload: Bytes::from_static(b"x"),
    }
}

#[test]
fn encoder_refuses_a_wildcard_topic_name() {
    assert_eq!(
        enc(&Packet::Publish(publish("a/+")), V311),
        Err(Error::TopicNameWildcard)
    );
}

#[test]
fn encoder_refuses_a_packet_id_that_does_not_match_qos() {
    let mut p = publish("a");
    p.qos = QoS::AtLeastOnce;
    assert_eq!(
        enc(&Packet::Publish(p), V311),
        Err(Error::PacketIdMismatch {
            qos: QoS::AtLeastOnce
        })
    );
}

#[test]
fn encoder_refuses_a_property_the_packet_cannot_carry() {
    let mut ack = PubAck::new(PacketId::new(1).unwrap());
    ack.properties.topic_alias = Some(1);
    assert_eq!(
        enc(&Packet::Puback(ack), V5),
        Err(Error::PropertyNotAllowed {
            id: 0x23,
            packet_type: PacketType::Puback
        })
    );
}

#[test]
fn encoder_refuses_auth_before_v5() {
    assert!(matches!(
        enc(&Packet::Auth(Auth::default()), V311),
        Err(Error::PacketNotInProtocol { .. })
    ));
}

#[test]
fn encoder_drops_v5_only_fields_for_v3() {
    let mut p = publish("a");
    p.properties.message_expiry_interval = Some(5);
    p.properties.user_properties.push(("k".into(), "v".into()));
    assert_eq!(
        &enc(&Packet::Publish(p), V311).unwrap()[..],
        b"\x30\x04\x00\x01ax"
    );
    let d = Disconnect {
        reason_code: ReasonCode::ServerShuttingDown,
        properties: Properties::default(),
    };
    assert_eq!(&enc(&Packet::Disconnect(d), V311).unwrap()[..], b"\xE0\x00");
}

#[test]
fn encoder_maps_v5_connack_codes_to_v3_return_codes() {
    let c = Connack {
        session_present: false,
        reason_code: ReasonCode::NotAuthorized,
        properties: Properties::default(),
    };
    assert_eq!(
        &enc(&Packet::Connack(c), V311).unwrap()[..],
        b"\x20\x02\x00\x05"
    );
}

#[test]
fn encoder_writes_v5_connack_with_its_property_length() {
    let c = Connack {
        session_present: true,
        reason_code: ReasonCode::Success,
        properties: Properties::default(),
    };
    assert_eq!(
        &enc(&Packet::Connack(c), V5).unwrap()[..],
        b"\x20\x03\x01\x00\x00"
    );
}

#[test]
fn encoder_writes_shortest_v5_ack_and_disconnect() {
    let id = PacketId::new(0x0102).unwrap();
    assert_eq!(
        &enc(&Packet::Puback(PubAck::new(id)), V5).unwrap()[..],
        b"\x40\x02\x01\x02"
    );
    assert_eq!(
        &enc(&Packet::Disconnect(Disconnect::default()), V5).unwrap()[..],
        b"\xE0\x00"
    );
}

#[test]
fn encoder_refuses_connect_for_another_protocol() {
    let c = Connect {
        protocol: V5,
        clean_start: true,
        keep_alive: 0,
        client_id: String::new(),
        will: None,
        username: None,
        password: None,
        properties: Properties::default(),
    };
    assert_eq!(
        enc(&Packet::Connect(Box::new(c)), V311),
        Err(Error::ConnectProtocolMismatch {
            connect: V5,
            requested: V311
        })
    );
}

#[test]
fn encoder_refuses_an_oversize_packet_and_writes_nothing() {
    let p = publish("a");
    let mut buf = BytesMut::new();
    assert_eq!(
        encode(&Packet::Publish(p.clone()), V311, 5, &mut buf),
        Err(Error::PacketTooLarge { size: 6, max: 5 })
    );
    assert!(buf.is_empty());
    assert_eq!(encode(&Packet::Publish(p), V311, 6, &mut buf), Ok(6));
}

#[test]
fn shared_payload_publish_header_counts_the_payload_in_the_size() {
    let p = publish("a");
    let mut head = BytesMut::new();
    let n = encode_publish_header(&p.header(), 1000, V311, u32::MAX, &mut head).unwrap();
    assert_eq!(n, 6);
    // Remaining length 1003 = 0xEB 0x07.
    assert_eq!(&head[..], b"\x30\xEB\x07\x00\x01a");
    assert!(encode_publish_header(&p.header(), 1000, V311, 1000, &mut head).is_err());
    assert_eq!(head.len(), 6, "nothing appended on error");
}
