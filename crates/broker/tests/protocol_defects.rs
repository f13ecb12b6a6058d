//! Regression tests for the protocol defects of issue 10 (found by an independent
//! conformance suite), over real loopback sockets: one test per behaviour, each with its own
//! broker on an ephemeral port, each bounded by short timeouts.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use starling_broker::Broker;
use starling_codec::{
    Connack, Packet, PacketId, Properties, Protocol, PubAck, Publish, QoS, ReasonCode,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long "nothing arrives" is watched for.
const QUIET: Duration = Duration::from_millis(300);

// ----- building and sending packets -----

/// A PUBLISH of "x" on `topic` at `qos`, with packet id `id` (none at QoS 0).
fn publish_packet(topic: &str, qos: QoS, id: u16) -> Publish {
    Publish {
        dup: false,
        qos,
        retain: false,
        topic: topic.to_owned(),
        packet_id: (qos != QoS::AtMostOnce).then(|| pid(id)),
        properties: Properties::default(),
        payload: Bytes::from_static(b"x"),
    }
}

/// `c` sends [`publish_packet`]`(topic, qos, id)` and waits for no answer.
async fn send_publish(c: &mut Client, topic: &str, qos: QoS, id: u16) {
    c.send(Packet::Publish(publish_packet(topic, qos, id)))
        .await;
}

/// An acknowledgement carrying `reason_code`, typically a failing one.
fn failing(packet_id: PacketId, reason_code: ReasonCode) -> PubAck {
    PubAck {
        packet_id,
        reason_code,
        properties: Properties::default(),
    }
}

// ----- setting up clients -----

/// A broker with `extra` configuration; on it a subscriber ("sub") on `filter` at `qos`,
/// then a publisher ("pub"), both clean.
async fn subscriber_and_publisher(
    extra: &str,
    protocol: Protocol,
    filter: &str,
    qos: QoS,
) -> (Broker, Client, Client) {
    let (b, addr) = broker(extra).await;
    let mut sub = Client::connect(addr, protocol, "sub", true).await;
    sub.subscribe(1, filter, qos).await;
    let publ = Client::connect(addr, protocol, "pub", true).await;
    (b, sub, publ)
}

/// A broker, and on it a subscriber whose next packet is a PUBLISH at `qos` from another
/// client; returns the broker, the subscriber and the delivery's packet id (unacknowledged).
async fn delivery(protocol: Protocol, qos: QoS) -> (Broker, Client, PacketId) {
    let (b, mut sub, mut publ) = subscriber_and_publisher("", protocol, "d/t", qos).await;
    publ.publish("d/t", b"x", qos, false).await;
    publ.disconnect().await;
    match sub.recv().await {
        Some(Packet::Publish(p)) => {
            assert_eq!(p.qos, qos);
            (b, sub, p.packet_id.expect("QoS 1/2 has a packet id"))
        }
        other => panic!("expected PUBLISH, got {other:?}"),
    }
}

/// A broker with the default configuration, and one clean v5 client "c" on it.
async fn v5_client() -> (Broker, Client) {
    let (b, addr) = broker("").await;
    let c = Client::connect(addr, Protocol::V5, "c", true).await;
    (b, c)
}

/// Opens client "willer" (clean) with a will on `topic`; returns it and its CONNACK.
async fn open_with_will(addr: SocketAddr, protocol: Protocol, topic: &str) -> (Client, Connack) {
    let mut c = connect_packet(protocol, "willer", true);
    c.will = Some(will(topic, "gone"));
    Client::open(addr, c).await
}

/// A bare TCP connection to `addr` on which `bytes` were written.
async fn raw_connection(addr: SocketAddr, bytes: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("tcp connect");
    s.write_all(bytes).await.expect("write");
    s
}

/// Everything the broker sends on `s` until it closes it, or `None` if it is still open
/// after `within`.
async fn read_until_closed(s: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let read = tokio::time::timeout(within, s.read_to_end(&mut got)).await;
    read.is_ok().then_some(got)
}

// ----- what the broker answers -----

/// Which acknowledgement [`expect_ack`] waits for.
#[derive(Debug, Clone, Copy)]
enum Ack {
    Puback,
    Pubrec,
    Pubrel,
    Pubcomp,
}

/// The broker's next packet to `c` is a `kind`; returns it.
async fn expect_ack(c: &mut Client, kind: Ack) -> PubAck {
    match (kind, c.recv().await) {
        (Ack::Puback, Some(Packet::Puback(a)))
        | (Ack::Pubrec, Some(Packet::Pubrec(a)))
        | (Ack::Pubrel, Some(Packet::Pubrel(a)))
        | (Ack::Pubcomp, Some(Packet::Pubcomp(a))) => a,
        (_, other) => panic!("expected {kind:?}, got {other:?}"),
    }
}

/// The broker's next packet to `c` is a `kind` refusing with 0x87 Not Authorized.
async fn expect_not_authorized(c: &mut Client, kind: Ack) {
    let ack = expect_ack(c, kind).await;
    assert_eq!(ack.reason_code, ReasonCode::NotAuthorized, "{kind:?}");
}

/// The broker sends DISCONNECT `code`, then closes the connection.
async fn expect_disconnect(c: &mut Client, code: ReasonCode) {
    match c.recv().await {
        Some(Packet::Disconnect(d)) => assert_eq!(d.reason_code, code),
        other => panic!("expected DISCONNECT {code:?}, got {other:?}"),
    }
    expect_closed(c).await;
}

/// `c` sends `wrong`; the broker answers DISCONNECT 0x82 Protocol Error and closes.
async fn expect_protocol_error_for(c: &mut Client, wrong: Packet) {
    c.send(wrong).await;
    expect_disconnect(c, ReasonCode::ProtocolError).await;
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

/// `c` sends a QoS 2 PUBLISH with packet id `id`; the broker answers PUBREC for it.
async fn publish_qos2_until_pubrec(c: &mut Client, id: u16) {
    send_publish(c, "q/t", QoS::ExactlyOnce, id).await;
    assert_eq!(expect_ack(c, Ack::Pubrec).await.packet_id, pid(id));
}

/// `c` accepts delivery `id` with PUBREC; the broker answers PUBREL for it.
async fn pubrec_until_pubrel(c: &mut Client, id: PacketId) {
    c.send(Packet::Pubrec(PubAck::new(id))).await;
    assert_eq!(expect_ack(c, Ack::Pubrel).await.packet_id, id);
}

// ----- (7) topic limits on PUBLISH and on the will -----

/// A v5 PUBLISH on a topic longer than the limit gets DISCONNECT 0x90 and reaches no one.
#[test]
fn v5_publish_past_topic_len_max_is_disconnected_with_0x90_and_not_delivered() {
    common::on_actix(async {
        let config = "[mqtt]\ntopic_len_max = 16\n";
        let (_b, mut sub, mut p) =
            subscriber_and_publisher(config, Protocol::V5, "#", QoS::AtLeastOnce).await;
        send_publish(&mut p, "aaaaaaaa/bbbbbbbb", QoS::AtLeastOnce, 1).await;
        expect_disconnect(&mut p, ReasonCode::TopicNameInvalid).await;
        sub.expect_no_publish(QUIET).await;
    })
}

/// A 3.1.1 PUBLISH on a topic with too many levels closes the connection, undelivered.
#[test]
fn v311_publish_past_topic_levels_max_closes_the_connection_and_is_not_delivered() {
    common::on_actix(async {
        let config = "[mqtt]\ntopic_levels_max = 3\n";
        let (_b, mut sub, mut p) =
            subscriber_and_publisher(config, Protocol::V3_1_1, "#", QoS::AtLeastOnce).await;
        // Within the limit: acknowledged and delivered.
        p.publish("a/b/c", b"x", QoS::AtLeastOnce, false).await;
        assert_eq!(sub.recv_publish().await.topic, "a/b/c");
        send_publish(&mut p, "a/b/c/d", QoS::AtLeastOnce, 2).await;
        expect_closed(&mut p).await;
        sub.expect_no_publish(QUIET).await;
    })
}

/// A will whose topic breaks the topic limits refuses the CONNECT itself.
#[test]
fn will_topic_past_the_topic_limits_is_refused_at_connect() {
    common::on_actix(async {
        let (_b, addr) = broker("[mqtt]\ntopic_levels_max = 2\n").await;
        for (protocol, code) in [
            (Protocol::V5, ReasonCode::TopicNameInvalid),
            // 3.x has no code for it: return code 3, the codec's mapping for such refusals.
            (Protocol::V3_1_1, ReasonCode::ServerUnavailable),
        ] {
            let (mut client, ack) = open_with_will(addr, protocol, "w/x/y").await;
            assert_eq!(ack.reason_code, code, "{protocol:?}");
            assert!(!ack.session_present);
            expect_closed(&mut client).await;
        }
    })
}

// ----- (8) SUBSCRIBE with QoS 3 -----

/// A v5 SUBSCRIBE asking for Maximum QoS 3 gets DISCONNECT 0x82 Protocol Error.
#[test]
fn v5_subscribe_with_qos_3_is_disconnected_with_protocol_error_0x82() {
    common::on_actix(async {
        let (_b, mut c) = v5_client().await;
        // SUBSCRIBE id 1, no properties, filter "a", options 0x03 (Maximum QoS 3).
        c.send_raw(&[0x82, 0x07, 0x00, 0x01, 0x00, 0x00, 0x01, b'a', 0x03])
            .await;
        expect_disconnect(&mut c, ReasonCode::ProtocolError).await;
    })
}

// ----- (9) Message Expiry Interval only when the publisher set one -----

/// Only a message whose publisher set an expiry is forwarded with one (decremented, capped).
#[test]
fn v5_message_without_expiry_is_forwarded_without_message_expiry_interval() {
    common::on_actix(async {
        let config = "[mqtt]\nmessage_expiry_max_secs = 60\n";
        let (_b, mut sub, mut p) =
            subscriber_and_publisher(config, Protocol::V5, "e/#", QoS::AtLeastOnce).await;
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
            let expiring = Publish {
                properties,
                ..publish_packet("e/set", QoS::AtMostOnce, 0)
            };
            p.send(Packet::Publish(expiring)).await;
            let got = sub.recv_publish().await;
            let left = got.properties.message_expiry_interval.expect("forwarded");
            assert!((most - 2..=most).contains(&left), "{asked} -> {left}");
        }
    })
}

// ----- (10) wrong acknowledgement type -----

/// A v5 subscriber answering a QoS 2 delivery with PUBACK gets DISCONNECT 0x82.
#[test]
fn v5_puback_for_a_qos2_delivery_is_a_protocol_error() {
    common::on_actix(async {
        let (_b, mut sub, id) = delivery(Protocol::V5, QoS::ExactlyOnce).await;
        expect_protocol_error_for(&mut sub, Packet::Puback(PubAck::new(id))).await;
    })
}

/// A v5 subscriber answering a QoS 1 delivery with PUBREC gets DISCONNECT 0x82.
#[test]
fn v5_pubrec_for_a_qos1_delivery_is_a_protocol_error() {
    common::on_actix(async {
        let (_b, mut sub, id) = delivery(Protocol::V5, QoS::AtLeastOnce).await;
        expect_protocol_error_for(&mut sub, Packet::Pubrec(PubAck::new(id))).await;
    })
}

/// A v5 PUBACK for a QoS 2 delivery already past PUBREL gets DISCONNECT 0x82.
#[test]
fn v5_puback_after_pubrel_is_a_protocol_error() {
    common::on_actix(async {
        let (_b, mut sub, id) = delivery(Protocol::V5, QoS::ExactlyOnce).await;
        pubrec_until_pubrel(&mut sub, id).await;
        expect_protocol_error_for(&mut sub, Packet::Puback(PubAck::new(id))).await;
    })
}

/// A v5 PUBCOMP for a QoS 2 delivery still awaiting its PUBREC gets DISCONNECT 0x82.
#[test]
fn v5_pubcomp_while_awaiting_pubrec_is_a_protocol_error() {
    common::on_actix(async {
        let (_b, mut sub, id) = delivery(Protocol::V5, QoS::ExactlyOnce).await;
        expect_protocol_error_for(&mut sub, Packet::Pubcomp(PubAck::new(id))).await;
    })
}

/// A 3.1.1 subscriber's wrong acknowledgement closes its connection (3.x broker sends no DISCONNECT).
#[test]
fn v311_wrong_acknowledgement_closes_the_connection() {
    common::on_actix(async {
        let (_b, mut sub, id) = delivery(Protocol::V3_1_1, QoS::AtLeastOnce).await;
        sub.send(Packet::Pubrec(PubAck::new(id))).await;
        expect_closed(&mut sub).await;
    })
}

/// PUBACK and PUBCOMP naming no delivery are ignored, not a protocol error.
#[test]
fn acknowledgements_for_unknown_packet_ids_keep_the_connection() {
    common::on_actix(async {
        let (_b, mut c) = v5_client().await;
        c.send(Packet::Puback(PubAck::new(pid(99)))).await;
        c.send(Packet::Pubcomp(PubAck::new(pid(99)))).await;
        expect_alive(&mut c).await;
    })
}

// ----- (11) a CONNACK the client's Maximum Packet Size cannot hold -----

/// A CONNACK too large for the client's Maximum Packet Size is not sent: the broker closes.
#[test]
fn v5_connack_past_the_client_maximum_packet_size_closes_at_once_sending_nothing() {
    common::on_actix(async {
        let (_b, addr) = broker("").await;
        let mut connect = connect_packet(Protocol::V5, "tiny", true);
        connect.properties.maximum_packet_size = Some(2);
        let mut s = raw_connection(addr, &connect_bytes(connect)).await;
        // Closed well before a keep alive (60 s) or handshake timeout could do it, and with
        // nothing sent: no CONNACK, no DISCONNECT.
        let got = read_until_closed(&mut s, Duration::from_secs(3))
            .await
            .expect("connection still open after 3 s");
        assert!(got.is_empty(), "sent {got:02x?}");
    })
}

// ----- (12) MQTT 3.1 leniencies -----

/// A 3.1 client's PUBREL retried with DUP (and QoS 1) completes the exchange.
#[test]
fn mqtt_3_1_pubrel_resent_with_dup_is_accepted() {
    common::on_actix(async {
        let (_b, mut sub, mut c) =
            subscriber_and_publisher("", Protocol::V3_1, "q/t", QoS::ExactlyOnce).await;
        publish_qos2_until_pubrec(&mut c, 5).await;
        // PUBREL with DUP and QoS 1 (0x6A), as a 3.1 client retries it.
        c.send_raw(&[0x6A, 0x02, 0x00, 0x05]).await;
        assert_eq!(expect_ack(&mut c, Ack::Pubcomp).await.packet_id, pid(5));
        assert_eq!(sub.recv_publish().await.topic, "q/t");
    })
}

/// The same PUBREL with DUP from a 3.1.1 client is malformed and closes the connection.
#[test]
fn v311_pubrel_with_dup_closes_the_connection() {
    common::on_actix(async {
        let (_b, addr) = broker("").await;
        let mut c = Client::connect(addr, Protocol::V3_1_1, "pub", true).await;
        publish_qos2_until_pubrec(&mut c, 5).await;
        c.send_raw(&[0x6A, 0x02, 0x00, 0x05]).await;
        expect_closed(&mut c).await;
    })
}

/// A CONNECT for `protocol` with the reserved connect flag (bit 0) set.
fn connect_with_reserved_flag(protocol: Protocol) -> Vec<u8> {
    let mut bytes = connect_bytes(connect_packet(protocol, "flags", true));
    // Fixed header (2), name length (2), name, level, then the flags.
    let flags_at = 2 + 2 + usize::from(bytes[3]) + 1;
    assert_eq!(bytes[flags_at] & 0x01, 0);
    bytes[flags_at] |= 0x01;
    bytes.to_vec()
}

/// A 3.1 CONNECT with the reserved flag bit set is still accepted.
#[test]
fn mqtt_3_1_connect_with_the_reserved_flag_bit_is_accepted() {
    common::on_actix(async {
        let (_b, addr) = broker("").await;
        let mut s = raw_connection(addr, &connect_with_reserved_flag(Protocol::V3_1)).await;
        let mut ack = [0u8; 4];
        tokio::time::timeout(WAIT, s.read_exact(&mut ack))
            .await
            .expect("CONNACK in time")
            .expect("CONNACK");
        assert_eq!(ack, [0x20, 0x02, 0x00, 0x00], "accepted");
    })
}

/// A 3.1.1 or v5 CONNECT with the reserved flag bit set is refused and closed.
#[test]
fn v311_and_v5_connect_with_the_reserved_flag_bit_is_refused() {
    common::on_actix(async {
        let (_b, addr) = broker("").await;
        for protocol in [Protocol::V3_1_1, Protocol::V5] {
            let mut s = raw_connection(addr, &connect_with_reserved_flag(protocol)).await;
            let got = read_until_closed(&mut s, WAIT)
                .await
                .unwrap_or_else(|| panic!("{protocol:?}: connection still open"));
            // Closed, at most after a refusing CONNACK (v5: 0x81 Malformed Packet).
            let accepted = got.len() >= 4 && got[0] == 0x20 && got[3] == 0x00;
            assert!(!accepted, "{protocol:?}: accepted: {got:02x?}");
        }
    })
}

// ----- (13) PUBREL only after a successful PUBREC -----

/// A failing PUBREC ends a QoS 2 delivery: no PUBREL, and its packet id is free again.
#[test]
fn v5_failing_pubrec_for_a_qos2_delivery_gets_no_pubrel_and_frees_the_id() {
    common::on_actix(async {
        let (_b, mut sub, id) = delivery(Protocol::V5, QoS::ExactlyOnce).await;
        sub.send(Packet::Pubrec(failing(id, ReasonCode::UnspecifiedError)))
            .await;
        // Nothing comes back (no PUBREL) and the exchange is over: a PUBCOMP for it now names
        // no delivery, which is not a protocol error.
        expect_alive(&mut sub).await;
        sub.send(Packet::Pubcomp(PubAck::new(id))).await;
        expect_alive(&mut sub).await;
    })
}

/// A failing duplicate PUBREC after the PUBREL is not answered with another PUBREL.
#[test]
fn v5_failing_pubrec_after_pubrel_gets_no_second_pubrel() {
    common::on_actix(async {
        let (_b, mut sub, id) = delivery(Protocol::V5, QoS::ExactlyOnce).await;
        pubrec_until_pubrel(&mut sub, id).await;
        // A duplicate PUBREC now says failure: the exchange ends, no PUBREL answers it.
        sub.send(Packet::Pubrec(failing(id, ReasonCode::UnspecifiedError)))
            .await;
        expect_alive(&mut sub).await;
    })
}

/// A failing PUBREC naming no delivery gets no PUBREL either.
#[test]
fn v5_unsolicited_failing_pubrec_gets_no_pubrel() {
    common::on_actix(async {
        let (_b, mut c) = v5_client().await;
        let unsolicited = failing(pid(42), ReasonCode::UnspecifiedError);
        c.send(Packet::Pubrec(unsolicited)).await;
        expect_alive(&mut c).await;
    })
}

/// A successful PUBREC naming no delivery gets PUBREL 0x92 Packet Identifier Not Found.
#[test]
fn v5_unsolicited_pubrec_gets_pubrel_0x92() {
    common::on_actix(async {
        let (_b, mut c) = v5_client().await;
        c.send(Packet::Pubrec(PubAck::new(pid(42)))).await;
        let rel = expect_ack(&mut c, Ack::Pubrel).await;
        assert_eq!(rel.packet_id, pid(42));
        assert_eq!(rel.reason_code, ReasonCode::PacketIdentifierNotFound);
    })
}

// ----- (6) `$SYS` and the other `$` topics are the broker's -----

/// v5 PUBLISH at QoS 1 and 2 to the bare `$SYS` is refused with 0x87, counted, undelivered.
#[test]
fn v5_publish_to_bare_sys_is_refused_with_0x87_and_counted() {
    common::on_actix(async {
        let (b, mut sub, mut p) =
            subscriber_and_publisher("", Protocol::V5, "$SYS", QoS::AtLeastOnce).await;
        send_publish(&mut p, "$SYS", QoS::AtLeastOnce, 1).await;
        expect_not_authorized(&mut p, Ack::Puback).await;
        send_publish(&mut p, "$SYS", QoS::ExactlyOnce, 2).await;
        expect_not_authorized(&mut p, Ack::Pubrec).await;
        sub.expect_no_publish(QUIET).await;
        assert_eq!(b.metrics().reserved_topic_refused, 2);
    })
}

/// A 3.1.1 PUBLISH to a `$` topic is acknowledged (3.x cannot refuse) but never delivered.
#[test]
fn v311_publish_to_a_dollar_topic_is_acknowledged_and_dropped() {
    common::on_actix(async {
        let (_b, mut sub, mut p) =
            subscriber_and_publisher("", Protocol::V3_1_1, "$app/#", QoS::AtLeastOnce).await;
        // 3.x has no failing PUBACK: acknowledged, never delivered.
        p.publish("$app/x", b"x", QoS::AtLeastOnce, false).await;
        sub.expect_no_publish(QUIET).await;
    })
}

/// A retained PUBLISH to `$SYS` is refused and not kept for later subscribers.
#[test]
fn retained_publish_to_sys_is_not_stored() {
    common::on_actix(async {
        let (_b, addr) = broker("").await;
        let mut p = Client::connect(addr, Protocol::V5, "pub", true).await;
        let retained = Publish {
            retain: true,
            ..publish_packet("$SYS", QoS::AtLeastOnce, 1)
        };
        p.send(Packet::Publish(retained)).await;
        expect_not_authorized(&mut p, Ack::Puback).await;
        let mut late = Client::connect(addr, Protocol::V5, "late", true).await;
        late.subscribe(1, "$SYS", QoS::AtLeastOnce).await;
        late.expect_no_publish(QUIET).await;
    })
}

/// A will on the bare `$SYS` is accepted at CONNECT but never published, and counted.
#[test]
fn will_on_a_sys_topic_is_not_published() {
    common::on_actix(async {
        let (b, addr) = broker("").await;
        let mut sub = Client::connect(addr, Protocol::V5, "sub", true).await;
        sub.subscribe(1, "$SYS", QoS::AtLeastOnce).await;
        // The bare `$SYS`: `$SYS/...` was already refused.
        let (w, ack) = open_with_will(addr, Protocol::V3_1_1, "$SYS").await;
        assert!(!ack.reason_code.is_error());
        w.kill();
        sub.expect_no_publish(QUIET * 2).await;
        assert_eq!(b.metrics().reserved_topic_refused, 1);
    })
}

/// A delayed PUBLISH (`$delayed/N/...`) whose target is a `$SYS` topic is refused with 0x87.
#[test]
fn delayed_publish_to_a_sys_topic_is_refused() {
    common::on_actix(async {
        let (_b, addr) = broker("").await;
        let mut p = Client::connect(addr, Protocol::V5, "pub", true).await;
        send_publish(&mut p, "$delayed/1/$SYS/x", QoS::AtLeastOnce, 1).await;
        expect_not_authorized(&mut p, Ack::Puback).await;
    })
}
