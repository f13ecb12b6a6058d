//! Oracle: valid MQTT 3.1.1 packets agree with mqttbytes 0.6 both ways.
//!
//! Our packets are translated field by field into mqttbytes' types. Then:
//! both encoders write the same bytes, mqttbytes decodes our bytes into the
//! translated packet, and we decode mqttbytes' bytes into our packet.
//!
//! mqttbytes' known gaps shape the generator (see the shared facts file):
//! it stores user name and password as UTF-8 strings and treats an empty
//! one as absent, so both are non-empty text here; 3.1 and 5.0 are out of
//! its reach or unreliable, so only 3.1.1 is compared.

mod strategy;

use bytes::{Bytes, BytesMut};
use mqttbytes::v4 as mb;
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use starling_codec::*;

const V311: Protocol = Protocol::V3_1_1;

fn mb_qos(q: QoS) -> mqttbytes::QoS {
    match q {
        QoS::AtMostOnce => mqttbytes::QoS::AtMostOnce,
        QoS::AtLeastOnce => mqttbytes::QoS::AtLeastOnce,
        QoS::ExactlyOnce => mqttbytes::QoS::ExactlyOnce,
    }
}

/// Our packet in mqttbytes' types, field by field.
fn to_mb(p: &Packet) -> mb::Packet {
    match p {
        Packet::Connect(c) => mb::Packet::Connect(mb::Connect {
            protocol: mqttbytes::Protocol::V4,
            keep_alive: c.keep_alive,
            client_id: c.client_id.clone(),
            clean_session: c.clean_start,
            last_will: c.will.as_ref().map(|w| mb::LastWill {
                topic: w.topic.clone(),
                message: w.payload.clone(),
                qos: mb_qos(w.qos),
                retain: w.retain,
            }),
            login: c.username.as_ref().map(|u| mb::Login {
                username: u.clone(),
                password: c
                    .password
                    .as_ref()
                    .map(|p| String::from_utf8(p.to_vec()).expect("generated as text"))
                    .unwrap_or_default(),
            }),
        }),
        Packet::Connack(c) => mb::Packet::ConnAck(mb::ConnAck {
            session_present: c.session_present,
            code: match c.reason_code.to_connack_v3() {
                0 => mb::ConnectReturnCode::Success,
                1 => mb::ConnectReturnCode::RefusedProtocolVersion,
                2 => mb::ConnectReturnCode::BadClientId,
                3 => mb::ConnectReturnCode::ServiceUnavailable,
                4 => mb::ConnectReturnCode::BadUserNamePassword,
                _ => mb::ConnectReturnCode::NotAuthorized,
            },
        }),
        Packet::Publish(p) => mb::Packet::Publish(mb::Publish {
            dup: p.dup,
            qos: mb_qos(p.qos),
            retain: p.retain,
            topic: p.topic.clone(),
            pkid: p.packet_id.map_or(0, |id| id.get()),
            payload: p.payload.clone(),
        }),
        Packet::Puback(a) => mb::Packet::PubAck(mb::PubAck::new(a.packet_id.get())),
        Packet::Pubrec(a) => mb::Packet::PubRec(mb::PubRec::new(a.packet_id.get())),
        Packet::Pubrel(a) => mb::Packet::PubRel(mb::PubRel::new(a.packet_id.get())),
        Packet::Pubcomp(a) => mb::Packet::PubComp(mb::PubComp::new(a.packet_id.get())),
        Packet::Subscribe(s) => mb::Packet::Subscribe(mb::Subscribe {
            pkid: s.packet_id.get(),
            filters: s
                .filters
                .iter()
                .map(|f| mb::SubscribeFilter::new(f.filter.clone(), mb_qos(f.options.qos)))
                .collect(),
        }),
        Packet::Suback(s) => mb::Packet::SubAck(mb::SubAck::new(
            s.packet_id.get(),
            s.reason_codes
                .iter()
                .map(|c| match c {
                    ReasonCode::Success => {
                        mb::SubscribeReasonCode::Success(mb_qos(QoS::AtMostOnce))
                    }
                    ReasonCode::GrantedQoS1 => {
                        mb::SubscribeReasonCode::Success(mb_qos(QoS::AtLeastOnce))
                    }
                    ReasonCode::GrantedQoS2 => {
                        mb::SubscribeReasonCode::Success(mb_qos(QoS::ExactlyOnce))
                    }
                    _ => mb::SubscribeReasonCode::Failure,
                })
                .collect(),
        )),
        Packet::Unsubscribe(u) => mb::Packet::Unsubscribe(mb::Unsubscribe {
            pkid: u.packet_id.get(),
            topics: u.filters.clone(),
        }),
        Packet::Unsuback(u) => mb::Packet::UnsubAck(mb::UnsubAck::new(u.packet_id.get())),
        Packet::Pingreq => mb::Packet::PingReq,
        Packet::Pingresp => mb::Packet::PingResp,
        Packet::Disconnect(_) => mb::Packet::Disconnect,
        Packet::Auth(_) => unreachable!("no AUTH in 3.1.1"),
    }
}

fn mb_write(p: &mb::Packet) -> BytesMut {
    let mut b = BytesMut::new();
    let r = match p {
        mb::Packet::Connect(x) => x.write(&mut b),
        mb::Packet::ConnAck(x) => x.write(&mut b),
        mb::Packet::Publish(x) => x.write(&mut b),
        mb::Packet::PubAck(x) => x.write(&mut b),
        mb::Packet::PubRec(x) => x.write(&mut b),
        mb::Packet::PubRel(x) => x.write(&mut b),
        mb::Packet::PubComp(x) => x.write(&mut b),
        mb::Packet::Subscribe(x) => x.write(&mut b),
        mb::Packet::SubAck(x) => x.write(&mut b),
        mb::Packet::Unsubscribe(x) => x.write(&mut b),
        mb::Packet::UnsubAck(x) => x.write(&mut b),
        mb::Packet::PingReq => mb::PingReq.write(&mut b),
        mb::Packet::PingResp => mb::PingResp.write(&mut b),
        mb::Packet::Disconnect => mb::Disconnect.write(&mut b),
    };
    r.expect("mqttbytes encodes a valid packet");
    b
}

/// Valid 3.1.1 packets within what mqttbytes represents faithfully.
fn oracle_packet() -> impl Strategy<Value = Packet> {
    let connect = (
        strategy::connect(V311),
        option::of(("[a-z0-9]{1,8}", option::of("[a-zA-Z0-9!é]{1,8}"))),
    )
        .prop_map(|(mut c, login)| {
            c.username = login.as_ref().map(|(u, _)| u.clone());
            c.password = login
                .and_then(|(_, p)| p)
                .map(|p| Bytes::from(p.into_bytes()));
            Packet::Connect(Box::new(c))
        });
    prop_oneof![
        1 => connect,
        8 => strategy::packet(V311).prop_filter("connect has its own generator", |p| {
            !matches!(p, Packet::Connect(_))
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn valid_v311_packets_encode_to_the_same_bytes_as_mqttbytes(packet in oracle_packet()) {
        let mut ours = BytesMut::new();
        encode(&packet, V311, u32::MAX, &mut ours).expect("encodes");
        let theirs = mb_write(&to_mb(&packet));
        prop_assert_eq!(&ours[..], &theirs[..]);
    }

    #[test]
    fn mqttbytes_decodes_our_bytes_into_the_same_fields(packet in oracle_packet()) {
        let mut ours = BytesMut::new();
        encode(&packet, V311, u32::MAX, &mut ours).expect("encodes");
        let decoded = mb::read(&mut ours, usize::MAX).expect("mqttbytes decodes");
        prop_assert_eq!(decoded, to_mb(&packet));
    }

    #[test]
    fn we_decode_mqttbytes_bytes_into_the_same_fields(packet in oracle_packet()) {
        let mut theirs = mb_write(&to_mb(&packet));
        let decoded = decode(&mut theirs, V311, u32::MAX).expect("we decode").expect("whole");
        prop_assert_eq!(decoded, packet);
        prop_assert!(theirs.is_empty());
    }

    #[test]
    fn a_stream_written_by_mqttbytes_decodes_in_order(packets in vec(oracle_packet(), 1..6)) {
        let mut stream = BytesMut::new();
        for p in &packets {
            stream.extend_from_slice(&mb_write(&to_mb(p)));
        }
        let mut got = Vec::new();
        while let Some(p) = decode(&mut stream, V311, u32::MAX).expect("valid stream") {
            got.push(p);
        }
        prop_assert_eq!(got, packets);
    }
}

#[test]
fn mqttbytes_accepts_wildcards_in_publish_topics_but_we_refuse_them() {
    // A known mqttbytes gap: it encodes and decodes an invalid PUBLISH.
    let p = mb::Publish::new("a/+", mqttbytes::QoS::AtMostOnce, "x");
    let mut b = BytesMut::new();
    p.write(&mut b).expect("mqttbytes writes it");
    assert_eq!(
        decode(&mut b, V311, u32::MAX),
        Err(Error::TopicNameWildcard)
    );
}
