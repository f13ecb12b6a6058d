//! Regression tests for the protocol defects of issue 10 (found by an independent
//! conformance suite), over real loopback sockets: one test per behaviour, each with its own
//! broker on an ephemeral port, each bounded by short timeouts.

mod common;

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use common::*;
use starling_codec::{
    encode, Packet, PacketId, Properties, Protocol, PubAck, Publish, QoS, ReasonCode,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long "nothing arrives" is watched for.
const QUIET: Duration = Duration::from_millis(300);

fn publish_with(topic: &str, qos: QoS, id: Option<u16>, properties: Properties) -> Packet {
    Packet::Publish(Publish {
        dup: false,
        qos,
        retain: false,
        topic: topic.to_owned(),
        packet_id: id.map(pid),
        properties,
        payload: Bytes::from_static(b"x"),
    })
}

fn failing(packet_id: PacketId, reason_code: ReasonCode) -> PubAck {
    PubAck {
        packet_id,
        reason_code,
        properties: Properties::default(),
    }
}

/// The broker sends DISCONNECT `code`, then closes the connection.
async fn expect_disconnect(c: &mut Client, code: ReasonCode) {
    match c.recv().await {
        Some(Packet::Disconnect(d)) => assert_eq!(d.reason_code, code),
        other => panic!("expected DISCONNECT {code:?}, got {other:?}"),
    }
    expect_closed(c).await;
}

/// The broker closes the connection without sending anything more.
async fn expect_closed(c: &mut Client) {
    match c.recv().await {
        None => {}
        other => panic!("expected the connection closed, got {other:?}"),
    }
}

/// The connection is still served: a PINGREQ is answered, and nothing else came before.
async fn expect_alive(c: &mut Client) {
    c.send(Packet::Pingreq).await;
    match c.recv().await {
        Some(Packet::Pingresp) => {}
        other => panic!("expected PINGRESP, got {other:?}"),
    }
}

/// A subscriber on `topic` at `qos` and a publisher; the subscriber's next packet is the
/// PUBLISH the publisher sent, whose packet id is returned (unacknowledged).
async fn delivery(addr: std::net::SocketAddr, protocol: Protocol, qos: QoS) -> (Client, PacketId) {
    let mut sub = Client::connect(addr, protocol, "sub", true).await;
    sub.subscribe(1, "d/t", qos).await;
    let mut publ = Client::connect(addr, protocol, "pub", true).await;
    publ.publish("d/t", b"x", qos, false).await;
    publ.disconnect().await;
    match sub.recv().await {
        Some(Packet::Publish(p)) => {
            assert_eq!(p.qos, qos);
            (sub, p.packet_id.expect("QoS 1/2 has a packet id"))
        }
        other => panic!("expected PUBLISH, got {other:?}"),
    }
}

// ----- (7) topic limits on PUBLISH and on the will -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v5_publish_past_topic_len_max_is_disconnected_with_0x90_and_not_delivered() {
    let (_b, addr) = broker("[mqtt]\ntopic_len_max = 16\n").await;
    let mut sub = Client::connect(addr, Protocol::V5, "sub", true).await;
    sub.subscribe(1, "#", QoS::AtLeastOnce).await;
    let mut p = Client::connect(addr, Protocol::V5, "pub", true).await;
    p.send(publish_with(
        "aaaaaaaa/bbbbbbbb",
        QoS::AtLeastOnce,
        Some(1),
        Properties::default(),
    ))
    .await;
    expect_disconnect(&mut p, ReasonCode::TopicNameInvalid).await;
    sub.expect_no_publish(QUIET).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v311_publish_past_topic_levels_max_closes_the_connection_and_is_not_delivered() {
    let (_b, addr) = broker("[mqtt]\ntopic_levels_max = 3\n").await;
    let mut sub = Client::connect(addr, Protocol::V3_1_1, "sub", true).await;
    sub.subscribe(1, "#", QoS::AtLeastOnce).await;
    let mut p = Client::connect(addr, Protocol::V3_1_1, "pub", true).await;
    // Within the limit: acknowledged and delivered.
    p.publish("a/b/c", b"x", QoS::AtLeastOnce, false).await;
    assert_eq!(sub.recv_publish().await.topic, "a/b/c");
    p.send(publish_with(
        "a/b/c/d",
        QoS::AtLeastOnce,
        Some(2),
        Properties::default(),
    ))
    .await;
    expect_closed(&mut p).await;
    sub.expect_no_publish(QUIET).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn will_topic_past_the_topic_limits_is_refused_at_connect() {
    let (_b, addr) = broker("[mqtt]\ntopic_levels_max = 2\n").await;
    for (protocol, code) in [
        (Protocol::V5, ReasonCode::TopicNameInvalid),
        // 3.x has no code for it: return code 3, the codec's mapping for such refusals.
        (Protocol::V3_1_1, ReasonCode::ServerUnavailable),
    ] {
        let mut c = connect_packet(protocol, "willer", true);
        c.will = Some(will("w/x/y", "gone"));
        let (mut client, ack) = Client::open(addr, c).await;
        assert_eq!(ack.reason_code, code, "{protocol:?}");
        assert!(!ack.session_present);
        expect_closed(&mut client).await;
    }
}

// ----- (8) SUBSCRIBE with QoS 3 -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v5_subscribe_with_qos_3_is_disconnected_with_protocol_error_0x82() {
    let (_b, addr) = broker("").await;
    let mut c = Client::connect(addr, Protocol::V5, "c", true).await;
    // SUBSCRIBE id 1, no properties, filter "a", options 0x03 (Maximum QoS 3).
    c.send_raw(&[0x82, 0x07, 0x00, 0x01, 0x00, 0x00, 0x01, b'a', 0x03])
        .await;
    expect_disconnect(&mut c, ReasonCode::ProtocolError).await;
}

// ----- (9) Message Expiry Interval only when the publisher set one -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v5_message_without_expiry_is_forwarded_without_message_expiry_interval() {
    let (_b, addr) = broker("[mqtt]\nmessage_expiry_max_secs = 60\n").await;
    let mut sub = Client::connect(addr, Protocol::V5, "sub", true).await;
    sub.subscribe(1, "e/#", QoS::AtLeastOnce).await;
    let mut p = Client::connect(addr, Protocol::V5, "pub", true).await;
    p.publish("e/none", b"x", QoS::AtLeastOnce, false).await;
    let got = sub.recv_publish().await;
    assert_eq!(got.topic, "e/none");
    assert_eq!(got.properties.message_expiry_interval, None);
    // A publisher's expiry is forwarded, decremented and capped by the broker's maximum.
    for (asked, most) in [(30, 30), (100_000, 60)] {
        let properties = Properties {
            message_expiry_interval: Some(asked),
            ..Properties::default()
        };
        p.send(publish_with("e/set", QoS::AtMostOnce, None, properties))
            .await;
        let got = sub.recv_publish().await;
        let left = got.properties.message_expiry_interval.expect("forwarded");
        assert!((most - 2..=most).contains(&left), "{asked} -> {left}");
    }
}

// ----- (10) wrong acknowledgement type -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v5_puback_for_a_qos2_delivery_is_a_protocol_error() {
    let (_b, addr) = broker("").await;
    let (mut sub, id) = delivery(addr, Protocol::V5, QoS::ExactlyOnce).await;
    sub.send(Packet::Puback(PubAck::new(id))).await;
    expect_disconnect(&mut sub, ReasonCode::ProtocolError).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v5_pubrec_for_a_qos1_delivery_is_a_protocol_error() {
    let (_b, addr) = broker("").await;
    let (mut sub, id) = delivery(addr, Protocol::V5, QoS::AtLeastOnce).await;
    sub.send(Packet::Pubrec(PubAck::new(id))).await;
    expect_disconnect(&mut sub, ReasonCode::ProtocolError).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v5_puback_after_pubrel_is_a_protocol_error() {
    let (_b, addr) = broker("").await;
    let (mut sub, id) = delivery(addr, Protocol::V5, QoS::ExactlyOnce).await;
    sub.send(Packet::Pubrec(PubAck::new(id))).await;
    match sub.recv().await {
        Some(Packet::Pubrel(r)) => assert_eq!(r.packet_id, id),
        other => panic!("expected PUBREL, got {other:?}"),
    }
    sub.send(Packet::Puback(PubAck::new(id))).await;
    expect_disconnect(&mut sub, ReasonCode::ProtocolError).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v5_pubcomp_while_awaiting_pubrec_is_a_protocol_error() {
    let (_b, addr) = broker("").await;
    let (mut sub, id) = delivery(addr, Protocol::V5, QoS::ExactlyOnce).await;
    sub.send(Packet::Pubcomp(PubAck::new(id))).await;
    expect_disconnect(&mut sub, ReasonCode::ProtocolError).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v311_wrong_acknowledgement_closes_the_connection() {
    let (_b, addr) = broker("").await;
    let (mut sub, id) = delivery(addr, Protocol::V3_1_1, QoS::AtLeastOnce).await;
    sub.send(Packet::Pubrec(PubAck::new(id))).await;
    expect_closed(&mut sub).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledgements_for_unknown_packet_ids_keep_the_connection() {
    let (_b, addr) = broker("").await;
    let mut c = Client::connect(addr, Protocol::V5, "c", true).await;
    c.send(Packet::Puback(PubAck::new(pid(99)))).await;
    c.send(Packet::Pubcomp(PubAck::new(pid(99)))).await;
    expect_alive(&mut c).await;
}

// ----- (11) a CONNACK the client's Maximum Packet Size cannot hold -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v5_connack_past_the_client_maximum_packet_size_closes_at_once_sending_nothing() {
    let (_b, addr) = broker("").await;
    let mut connect = connect_packet(Protocol::V5, "tiny", true);
    connect.properties.maximum_packet_size = Some(2);
    let mut bytes = BytesMut::new();
    encode(
        &Packet::Connect(Box::new(connect)),
        Protocol::V5,
        u32::MAX,
        &mut bytes,
    )
    .expect("encodable");
    let mut s = TcpStream::connect(addr).await.expect("tcp connect");
    s.write_all(&bytes).await.expect("write");
    // Closed well before a keep alive (60 s) or handshake timeout could do it, and with
    // nothing sent: no CONNACK, no DISCONNECT.
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "connection still open after 3 s");
    assert!(got.is_empty(), "sent {got:02x?}");
}

// ----- (12) MQTT 3.1 leniencies -----

/// A QoS 2 PUBLISH by `c` up to the broker's PUBREC.
async fn publish_qos2_until_pubrec(c: &mut Client, id: u16) {
    c.send(publish_with(
        "q/t",
        QoS::ExactlyOnce,
        Some(id),
        Properties::default(),
    ))
    .await;
    match c.recv().await {
        Some(Packet::Pubrec(a)) => assert_eq!(a.packet_id, pid(id)),
        other => panic!("expected PUBREC, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_3_1_pubrel_resent_with_dup_is_accepted() {
    let (_b, addr) = broker("").await;
    let mut sub = Client::connect(addr, Protocol::V3_1, "sub", true).await;
    sub.subscribe(1, "q/t", QoS::ExactlyOnce).await;
    let mut c = Client::connect(addr, Protocol::V3_1, "pub", true).await;
    publish_qos2_until_pubrec(&mut c, 5).await;
    // PUBREL with DUP and QoS 1 (0x6A), as a 3.1 client retries it.
    c.send_raw(&[0x6A, 0x02, 0x00, 0x05]).await;
    match c.recv().await {
        Some(Packet::Pubcomp(a)) => assert_eq!(a.packet_id, pid(5)),
        other => panic!("expected PUBCOMP, got {other:?}"),
    }
    assert_eq!(sub.recv_publish().await.topic, "q/t");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v311_pubrel_with_dup_closes_the_connection() {
    let (_b, addr) = broker("").await;
    let mut c = Client::connect(addr, Protocol::V3_1_1, "pub", true).await;
    publish_qos2_until_pubrec(&mut c, 5).await;
    c.send_raw(&[0x6A, 0x02, 0x00, 0x05]).await;
    expect_closed(&mut c).await;
}

/// A CONNECT for `protocol` with the reserved connect flag (bit 0) set.
fn connect_with_reserved_flag(protocol: Protocol) -> Vec<u8> {
    let mut bytes = BytesMut::new();
    let c = connect_packet(protocol, "flags", true);
    encode(
        &Packet::Connect(Box::new(c)),
        protocol,
        u32::MAX,
        &mut bytes,
    )
    .expect("encodable");
    // Fixed header (2), name length (2), name, level, then the flags.
    let flags_at = 2 + 2 + usize::from(bytes[3]) + 1;
    assert_eq!(bytes[flags_at] & 0x01, 0);
    bytes[flags_at] |= 0x01;
    bytes.to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_3_1_connect_with_the_reserved_flag_bit_is_accepted() {
    let (_b, addr) = broker("").await;
    let mut s = TcpStream::connect(addr).await.expect("tcp connect");
    s.write_all(&connect_with_reserved_flag(Protocol::V3_1))
        .await
        .expect("write");
    let mut ack = [0u8; 4];
    tokio::time::timeout(WAIT, s.read_exact(&mut ack))
        .await
        .expect("CONNACK in time")
        .expect("CONNACK");
    assert_eq!(ack, [0x20, 0x02, 0x00, 0x00], "accepted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v311_and_v5_connect_with_the_reserved_flag_bit_is_refused() {
    let (_b, addr) = broker("").await;
    for protocol in [Protocol::V3_1_1, Protocol::V5] {
        let mut s = TcpStream::connect(addr).await.expect("tcp connect");
        s.write_all(&connect_with_reserved_flag(protocol))
            .await
            .expect("write");
        let mut got = Vec::new();
        let read = tokio::time::timeout(WAIT, s.read_to_end(&mut got)).await;
        assert!(read.is_ok(), "{protocol:?}: connection still open");
        // Closed, at most after a refusing CONNACK (v5: 0x81 Malformed Packet).
        let accepted = got.len() >= 4 && got[0] == 0x20 && got[3] == 0x00;
        assert!(!accepted, "{protocol:?}: accepted: {got:02x?}");
    }
}

// ----- (13) PUBREL only after a successful PUBREC -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v5_failing_pubrec_for_a_qos2_delivery_gets_no_pubrel_and_frees_the_id() {
    let (_b, addr) = broker("").await;
    let (mut sub, id) = delivery(addr, Protocol::V5, QoS::ExactlyOnce).await;
    sub.send(Packet::Pubrec(failing(id, ReasonCode::UnspecifiedError)))
        .await;
    // Nothing comes back (no PUBREL) and the exchange is over: a PUBCOMP for it now names
    // no delivery, which is not a protocol error.
    expect_alive(&mut sub).await;
    sub.send(Packet::Pubcomp(PubAck::new(id))).await;
    expect_alive(&mut sub).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v5_failing_pubrec_after_pubrel_gets_no_second_pubrel() {
    let (_b, addr) = broker("").await;
    let (mut sub, id) = delivery(addr, Protocol::V5, QoS::ExactlyOnce).await;
    sub.send(Packet::Pubrec(PubAck::new(id))).await;
    match sub.recv().await {
        Some(Packet::Pubrel(r)) => assert_eq!(r.packet_id, id),
        other => panic!("expected PUBREL, got {other:?}"),
    }
    // A duplicate PUBREC now says failure: the exchange ends, no PUBREL answers it.
    sub.send(Packet::Pubrec(failing(id, ReasonCode::UnspecifiedError)))
        .await;
    expect_alive(&mut sub).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v5_unsolicited_failing_pubrec_gets_no_pubrel() {
    let (_b, addr) = broker("").await;
    let mut c = Client::connect(addr, Protocol::V5, "c", true).await;
    c.send(Packet::Pubrec(failing(
        pid(42),
        ReasonCode::UnspecifiedError,
    )))
    .await;
    expect_alive(&mut c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v5_unsolicited_pubrec_gets_pubrel_0x92() {
    let (_b, addr) = broker("").await;
    let mut c = Client::connect(addr, Protocol::V5, "c", true).await;
    c.send(Packet::Pubrec(PubAck::new(pid(42)))).await;
    match c.recv().await {
        Some(Packet::Pubrel(r)) => {
            assert_eq!(r.packet_id, pid(42));
            assert_eq!(r.reason_code, ReasonCode::PacketIdentifierNotFound);
        }
        other => panic!("expected PUBREL, got {other:?}"),
    }
}

// ----- (6) `$SYS` and the other `$` topics are the broker's -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v5_publish_to_bare_sys_is_refused_with_0x87_and_counted() {
    let (b, addr) = broker("").await;
    let mut sub = Client::connect(addr, Protocol::V5, "sub", true).await;
    sub.subscribe(1, "$SYS", QoS::AtLeastOnce).await;
    let mut p = Client::connect(addr, Protocol::V5, "pub", true).await;
    p.send(publish_with(
        "$SYS",
        QoS::AtLeastOnce,
        Some(1),
        Properties::default(),
    ))
    .await;
    match p.recv().await {
        Some(Packet::Puback(a)) => assert_eq!(a.reason_code, ReasonCode::NotAuthorized),
        other => panic!("expected PUBACK, got {other:?}"),
    }
    p.send(publish_with(
        "$SYS",
        QoS::ExactlyOnce,
        Some(2),
        Properties::default(),
    ))
    .await;
    match p.recv().await {
        Some(Packet::Pubrec(a)) => assert_eq!(a.reason_code, ReasonCode::NotAuthorized),
        other => panic!("expected PUBREC, got {other:?}"),
    }
    sub.expect_no_publish(QUIET).await;
    assert_eq!(b.metrics().reserved_topic_refused, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v311_publish_to_a_dollar_topic_is_acknowledged_and_dropped() {
    let (_b, addr) = broker("").await;
    let mut sub = Client::connect(addr, Protocol::V3_1_1, "sub", true).await;
    sub.subscribe(1, "$app/#", QoS::AtLeastOnce).await;
    let mut p = Client::connect(addr, Protocol::V3_1_1, "pub", true).await;
    // 3.x has no failing PUBACK: acknowledged, never delivered.
    p.publish("$app/x", b"x", QoS::AtLeastOnce, false).await;
    sub.expect_no_publish(QUIET).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retained_publish_to_sys_is_not_stored() {
    let (_b, addr) = broker("").await;
    let mut p = Client::connect(addr, Protocol::V5, "pub", true).await;
    let mut retained = publish_with("$SYS", QoS::AtLeastOnce, Some(1), Properties::default());
    if let Packet::Publish(ref mut r) = retained {
        r.retain = true;
    }
    p.send(retained).await;
    match p.recv().await {
        Some(Packet::Puback(a)) => assert_eq!(a.reason_code, ReasonCode::NotAuthorized),
        other => panic!("expected PUBACK, got {other:?}"),
    }
    let mut late = Client::connect(addr, Protocol::V5, "late", true).await;
    late.subscribe(1, "$SYS", QoS::AtLeastOnce).await;
    late.expect_no_publish(QUIET).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn will_on_a_sys_topic_is_not_published() {
    let (b, addr) = broker("").await;
    let mut sub = Client::connect(addr, Protocol::V5, "sub", true).await;
    sub.subscribe(1, "$SYS", QoS::AtLeastOnce).await;
    let mut c = connect_packet(Protocol::V3_1_1, "willer", true);
    // The bare `$SYS`: `$SYS/...` was already refused.
    c.will = Some(will("$SYS", "gone"));
    let (w, ack) = Client::open(addr, c).await;
    assert!(!ack.reason_code.is_error());
    w.kill();
    sub.expect_no_publish(QUIET * 2).await;
    assert_eq!(b.metrics().reserved_topic_refused, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_publish_to_a_sys_topic_is_refused() {
    let (_b, addr) = broker("").await;
    let mut p = Client::connect(addr, Protocol::V5, "pub", true).await;
    p.send(publish_with(
        "$delayed/1/$SYS/x",
        QoS::AtLeastOnce,
        Some(1),
        Properties::default(),
    ))
    .await;
    match p.recv().await {
        Some(Packet::Puback(a)) => assert_eq!(a.reason_code, ReasonCode::NotAuthorized),
        other => panic!("expected PUBACK, got {other:?}"),
    }
}
