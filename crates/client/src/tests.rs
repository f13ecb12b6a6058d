//! Behaviour of the core against a fake broker made of codec packets.

use std::num::NonZeroU16;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use starling_codec::{
    decode, decode_connect, encode, Connack, Connect, Disconnect, Packet, PacketId, Properties,
    Protocol, PubAck, Publish, QoS, ReasonCode, SubscribeFilter, SubscriptionOptions,
};

use crate::{Acks, ClientCore, ClientOptions, Error, Event, State};

fn connect_packet(protocol: Protocol) -> Connect {
    Connect {
        protocol,
        clean_start: true,
        keep_alive: 0,
        client_id: "c".into(),
        will: None,
        username: None,
        password: None,
        properties: Properties::default(),
    }
}

fn id(n: u16) -> PacketId {
    PacketId::new(n).unwrap()
}

fn ok_connack(session_present: bool, properties: Properties) -> Packet {
    Packet::Connack(Connack {
        session_present,
        reason_code: ReasonCode::Success,
        properties,
    })
}

fn message(qos: QoS, packet_id: Option<u16>) -> Packet {
    Packet::Publish(Publish {
        dup: false,
        qos,
        retain: false,
        topic: "t".into(),
        packet_id: packet_id.map(id),
        properties: Properties::default(),
        payload: Bytes::from_static(b"m"),
    })
}

/// The broker's side: decodes what the client wrote, encodes what it answers.
struct Peer {
    client: ClientCore,
    protocol: Protocol,
    now: Instant,
    seen_connect: bool,
}

impl Peer {
    fn new(options: ClientOptions) -> Peer {
        let protocol = options.connect.protocol;
        Peer {
            client: ClientCore::new(options),
            protocol,
            // Only an origin: the tests move time themselves from here.
            #[allow(clippy::disallowed_methods)]
            now: Instant::now(),
            seen_connect: false,
        }
    }

    /// Connected with `connack`, and the CONNECT taken off the wire.
    fn connected(options: ClientOptions, connack: Packet) -> Peer {
        let mut peer = Peer::new(options);
        peer.client.connect(peer.now).unwrap();
        assert!(matches!(peer.sent()[..], [Packet::Connect(_)]));
        peer.feed(&connack).unwrap();
        assert!(matches!(peer.events()[..], [Event::Connected(_)]));
        peer
    }

    fn v5() -> Peer {
        Peer::connected(
            ClientOptions::new(connect_packet(Protocol::V5)),
            ok_connack(false, Properties::default()),
        )
    }

    /// Every packet the client queued since the last call.
    fn sent(&mut self) -> Vec<Packet> {
        let mut wire = BytesMut::new();
        self.client.poll_transmit(&mut wire);
        let mut packets = Vec::new();
        if !self.seen_connect && !wire.is_empty() {
            let c = decode_connect(&mut wire, u32::MAX).unwrap().unwrap();
            packets.push(Packet::Connect(Box::new(c)));
            self.seen_connect = true;
        }
        while let Some(p) = decode(&mut wire, self.protocol, u32::MAX).unwrap() {
            if let Packet::Connect(_) = p {
                self.seen_connect = true;
            }
            packets.push(p);
        }
        assert!(wire.is_empty(), "whole packets only");
        packets
    }

    fn feed(&mut self, packet: &Packet) -> Result<(), Error> {
        let mut wire = BytesMut::new();
        encode(packet, self.protocol, u32::MAX, &mut wire).unwrap();
        self.client.handle_buf(self.now, &mut wire)
    }

    fn events(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.client.poll_event()).collect()
    }

    fn publish(&mut self, qos: QoS) -> Result<Option<PacketId>, Error> {
        self.client.publish(
            self.now,
            "t",
            Bytes::from_static(b"p"),
            qos,
            false,
            Properties::default(),
        )
    }
}

#[test]
fn connack_success_connects_and_sets_the_window_from_receive_maximum() {
    let props = Properties {
        receive_maximum: Some(3),
        ..Properties::default()
    };
    let peer = Peer::connected(
        ClientOptions::new(connect_packet(Protocol::V5)),
        ok_connack(false, props),
    );
    assert_eq!(peer.client.state(), State::Connected);
    assert_eq!(peer.client.window(), 3);
}

#[test]
fn refusing_connack_is_reported_and_closes() {
    let mut peer = Peer::new(ClientOptions::new(connect_packet(Protocol::V3_1_1)));
    peer.client.connect(peer.now).unwrap();
    peer.sent();
    let refused = Packet::Connack(Connack {
        session_present: false,
        reason_code: ReasonCode::NotAuthorized,
        properties: Properties::default(),
    });
    peer.feed(&refused).unwrap();
    assert!(matches!(&peer.events()[..], [Event::Connected(c)] if c.reason_code.is_error()));
    assert_eq!(peer.client.state(), State::Closed);
    assert_eq!(peer.publish(QoS::AtMostOnce), Err(Error::NotConnected));
}

#[test]
fn packet_before_connack_is_a_protocol_error() {
    let mut peer = Peer::new(ClientOptions::new(connect_packet(Protocol::V5)));
    peer.client.connect(peer.now).unwrap();
    let err = peer.feed(&message(QoS::AtMostOnce, None)).unwrap_err();
    assert!(matches!(err, Error::Unexpected { .. }), "{err:?}");
    assert_eq!(peer.client.state(), State::Closed);
}

#[test]
fn malformed_input_is_a_decode_error() {
    let mut peer = Peer::v5();
    // Packet type 0 is reserved (MQTT 5 §2.1.2).
    let err = peer
        .client
        .handle_bytes(peer.now, &[0x00, 0x00])
        .unwrap_err();
    assert!(matches!(err, Error::Decode(_)), "{err:?}");
}

#[test]
fn qos1_publish_completes_on_puback() {
    let mut peer = Peer::v5();
    let pid = peer.publish(QoS::AtLeastOnce).unwrap().unwrap();
    assert!(matches!(&peer.sent()[..], [Packet::Publish(p)] if p.packet_id == Some(pid)));
    assert_eq!(peer.client.inflight(), 1);
    peer.feed(&Packet::Puback(PubAck::new(pid))).unwrap();
    assert_eq!(
        peer.events(),
        [Event::Published {
            packet_id: pid,
            reason_code: ReasonCode::Success
        }]
    );
    assert_eq!(peer.client.inflight(), 0);
}

#[test]
fn qos2_publish_sends_pubrel_on_pubrec_and_completes_on_pubcomp() {
    let mut peer = Peer::v5();
    let pid = peer.publish(QoS::ExactlyOnce).unwrap().unwrap();
    peer.sent();
    peer.feed(&Packet::Pubrec(PubAck::new(pid))).unwrap();
    assert_eq!(peer.sent(), [Packet::Pubrel(PubAck::new(pid))]);
    assert!(peer.events().is_empty());
    peer.feed(&Packet::Pubcomp(PubAck::new(pid))).unwrap();
    assert!(
        matches!(&peer.events()[..], [Event::Published { packet_id, .. }] if *packet_id == pid)
    );
}

#[test]
fn failing_pubrec_ends_the_exchange_without_pubrel() {
    let mut peer = Peer::v5();
    let pid = peer.publish(QoS::ExactlyOnce).unwrap().unwrap();
    peer.sent();
    let mut rec = PubAck::new(pid);
    rec.reason_code = ReasonCode::QuotaExceeded;
    peer.feed(&Packet::Pubrec(rec)).unwrap();
    assert!(peer.sent().is_empty());
    assert_eq!(
        peer.events(),
        [Event::Published {
            packet_id: pid,
            reason_code: ReasonCode::QuotaExceeded
        }]
    );
}

#[test]
fn publish_beyond_the_window_is_refused_until_an_ack_frees_a_slot() {
    let mut options = ClientOptions::new(connect_packet(Protocol::V3_1_1));
    options.inflight_max = NonZeroU16::new(2).unwrap();
    let mut peer = Peer::connected(options, ok_connack(false, Properties::default()));
    let first = peer.publish(QoS::AtLeastOnce).unwrap().unwrap();
    peer.publish(QoS::ExactlyOnce).unwrap();
    assert_eq!(
        peer.publish(QoS::AtLeastOnce),
        Err(Error::WindowFull { window: 2 })
    );
    assert!(!peer.client.can_publish());
    // QoS 0 is not windowed.
    assert_eq!(peer.publish(QoS::AtMostOnce), Ok(None));
    peer.feed(&Packet::Puback(PubAck::new(first))).unwrap();
    assert!(peer.client.can_publish());
}

#[test]
fn ack_for_an_identifier_not_in_flight_is_a_protocol_error() {
    let mut peer = Peer::v5();
    let err = peer.feed(&Packet::Puback(PubAck::new(id(9)))).unwrap_err();
    assert_eq!(
        err,
        Error::UnknownPacketId {
            packet_type: starling_codec::PacketType::Puback,
            packet_id: id(9)
        }
    );
}

#[test]
fn ack_of_the_wrong_kind_is_a_protocol_error() {
    let mut peer = Peer::v5();
    let pid = peer.publish(QoS::AtLeastOnce).unwrap().unwrap();
    let err = peer.feed(&Packet::Pubcomp(PubAck::new(pid))).unwrap_err();
    assert!(matches!(err, Error::UnknownPacketId { .. }), "{err:?}");
}

#[test]
fn incoming_qos1_is_acknowledged_and_delivered() {
    let mut peer = Peer::v5();
    peer.feed(&message(QoS::AtLeastOnce, Some(5))).unwrap();
    assert_eq!(peer.sent(), [Packet::Puback(PubAck::new(id(5)))]);
    assert!(matches!(&peer.events()[..], [Event::Message(p)] if p.packet_id == Some(id(5))));
}

#[test]
fn incoming_qos2_is_delivered_once_until_pubrel_then_completed() {
    let mut peer = Peer::v5();
    peer.feed(&message(QoS::ExactlyOnce, Some(7))).unwrap();
    peer.feed(&message(QoS::ExactlyOnce, Some(7))).unwrap();
    assert_eq!(
        peer.sent(),
        [
            Packet::Pubrec(PubAck::new(id(7))),
            Packet::Pubrec(PubAck::new(id(7)))
        ]
    );
    assert_eq!(peer.events().len(), 1, "the repeat is the same message");
    peer.feed(&Packet::Pubrel(PubAck::new(id(7)))).unwrap();
    assert_eq!(peer.sent(), [Packet::Pubcomp(PubAck::new(id(7)))]);
    // After PUBREL the identifier is free for a new message.
    peer.feed(&message(QoS::ExactlyOnce, Some(7))).unwrap();
    assert_eq!(peer.events().len(), 1);
}

#[test]
fn pubrel_for_an_unknown_identifier_is_completed_with_not_found_in_v5() {
    let mut peer = Peer::v5();
    peer.feed(&Packet::Pubrel(PubAck::new(id(3)))).unwrap();
    let mut comp = PubAck::new(id(3));
    comp.reason_code = ReasonCode::PacketIdentifierNotFound;
    assert_eq!(peer.sent(), [Packet::Pubcomp(comp)]);
}

#[test]
fn manual_acks_leave_publish_and_pubrel_to_the_caller() {
    let mut options = ClientOptions::new(connect_packet(Protocol::V5));
    options.acks = Acks::Manual;
    let mut peer = Peer::connected(options, ok_connack(false, Properties::default()));
    peer.feed(&message(QoS::ExactlyOnce, Some(4))).unwrap();
    peer.feed(&message(QoS::ExactlyOnce, Some(4))).unwrap();
    peer.feed(&Packet::Pubrel(PubAck::new(id(4)))).unwrap();
    peer.feed(&Packet::Puback(PubAck::new(id(40)))).unwrap();
    assert!(peer.sent().is_empty(), "nothing answered by the core");
    let events = peer.events();
    assert_eq!(events.len(), 4, "no deduplication: {events:?}");
    assert_eq!(events[2], Event::Ack(Packet::Pubrel(PubAck::new(id(4)))));
    assert_eq!(events[3], Event::Ack(Packet::Puback(PubAck::new(id(40)))));
    peer.client
        .acknowledge(peer.now, id(4), Some(QoS::ExactlyOnce))
        .unwrap();
    peer.client.acknowledge(peer.now, id(4), None).unwrap();
    assert_eq!(
        peer.sent(),
        [
            Packet::Pubrec(PubAck::new(id(4))),
            Packet::Pubcomp(PubAck::new(id(4)))
        ]
    );
}

#[test]
fn manual_mode_still_completes_its_own_publishes() {
    let mut options = ClientOptions::new(connect_packet(Protocol::V3_1_1));
    options.acks = Acks::Manual;
    let mut peer = Peer::connected(options, ok_connack(false, Properties::default()));
    let pid = peer.publish(QoS::ExactlyOnce).unwrap().unwrap();
    peer.sent();
    peer.feed(&Packet::Pubrec(PubAck::new(pid))).unwrap();
    assert_eq!(peer.sent(), [Packet::Pubrel(PubAck::new(pid))]);
    peer.feed(&Packet::Pubcomp(PubAck::new(pid))).unwrap();
    assert!(matches!(&peer.events()[..], [Event::Published { .. }]));
}

#[test]
fn subscribe_and_unsubscribe_report_their_acks() {
    let mut peer = Peer::v5();
    let filter = SubscribeFilter {
        filter: "a/#".into(),
        options: SubscriptionOptions::default(),
    };
    let sid = peer
        .client
        .subscribe(peer.now, vec![filter], Properties::default())
        .unwrap();
    let suback = match &peer.sent()[..] {
        [Packet::Subscribe(s)] => starling_codec::Suback {
            packet_id: s.packet_id,
            reason_codes: vec![ReasonCode::Success],
            properties: Properties::default(),
        },
        other => panic!("expected SUBSCRIBE, got {other:?}"),
    };
    assert_eq!(suback.packet_id, sid);
    peer.feed(&Packet::Suback(suback.clone())).unwrap();
    assert_eq!(peer.events(), [Event::Subscribed(suback.clone())]);
    // A second SUBACK for the same identifier answers nothing.
    assert!(peer.feed(&Packet::Suback(suback)).is_err());
}

#[test]
fn packets_split_across_reads_are_handled_when_whole() {
    let mut peer = Peer::v5();
    let mut wire = BytesMut::new();
    encode(
        &message(QoS::AtLeastOnce, Some(1)),
        Protocol::V5,
        u32::MAX,
        &mut wire,
    )
    .unwrap();
    encode(
        &message(QoS::AtMostOnce, None),
        Protocol::V5,
        u32::MAX,
        &mut wire,
    )
    .unwrap();
    let (a, b) = wire.split_at(3);
    peer.client.handle_bytes(peer.now, a).unwrap();
    assert!(peer.events().is_empty());
    peer.client.handle_bytes(peer.now, b).unwrap();
    assert_eq!(peer.events().len(), 2);
}

#[test]
fn a_publish_decoded_by_the_caller_is_acknowledged_without_an_event() {
    let mut peer = Peer::v5();
    let Packet::Publish(p) = message(QoS::ExactlyOnce, Some(8)) else {
        unreachable!()
    };
    assert_eq!(peer.client.acknowledge_publish(peer.now, &p), Ok(true));
    assert_eq!(
        peer.client.acknowledge_publish(peer.now, &p),
        Ok(false),
        "a repeat"
    );
    assert_eq!(
        peer.sent(),
        [
            Packet::Pubrec(PubAck::new(id(8))),
            Packet::Pubrec(PubAck::new(id(8)))
        ]
    );
    assert!(peer.events().is_empty());
    let mut before = Peer::new(ClientOptions::new(connect_packet(Protocol::V5)));
    assert!(before.client.acknowledge_publish(before.now, &p).is_err());
}

#[test]
fn acks_decoded_by_the_caller_end_exchanges_without_an_event() {
    use starling_codec::PacketType::{Puback, Pubcomp, Pubrec};
    let mut peer = Peer::v5();
    let q1 = peer.publish(QoS::AtLeastOnce).unwrap().unwrap();
    let q2 = peer.publish(QoS::ExactlyOnce).unwrap().unwrap();
    peer.sent();
    let now = peer.now;
    let c = &mut peer.client;
    assert_eq!(
        c.handle_ack(now, Puback, &PubAck::new(q1)),
        Ok(Some(ReasonCode::Success))
    );
    assert_eq!(
        c.handle_ack(now, Pubrec, &PubAck::new(q2)),
        Ok(None),
        "goes on"
    );
    assert_eq!(
        c.handle_ack(now, Pubcomp, &PubAck::new(q2)),
        Ok(Some(ReasonCode::Success))
    );
    assert_eq!(c.inflight(), 0);
    assert_eq!(peer.sent(), [Packet::Pubrel(PubAck::new(q2))]);
    assert!(peer.events().is_empty());
    let err = peer
        .client
        .handle_ack(now, Puback, &PubAck::new(q1))
        .unwrap_err();
    assert!(matches!(err, Error::UnknownPacketId { .. }), "{err:?}");
}

#[test]
fn publish_with_writes_the_payload_in_place_after_queued_output() {
    let mut peer = Peer::v5();
    peer.feed(&message(QoS::AtLeastOnce, Some(2))).unwrap(); // queues a PUBACK
    let mut out = BytesMut::new();
    let pid = peer
        .client
        .publish_with(
            peer.now,
            "t",
            QoS::AtLeastOnce,
            false,
            &Properties::default(),
            3,
            &mut out,
            |o| o.extend_from_slice(b"abc"),
        )
        .unwrap();
    assert_eq!(peer.client.transmit_len(), 0);
    let first = decode(&mut out, Protocol::V5, u32::MAX).unwrap().unwrap();
    assert_eq!(
        first,
        Packet::Puback(PubAck::new(id(2))),
        "the queued ack goes first"
    );
    match decode(&mut out, Protocol::V5, u32::MAX).unwrap().unwrap() {
        Packet::Publish(p) => {
            assert_eq!(p.packet_id, pid);
            assert_eq!(&p.payload[..], b"abc");
        }
        other => panic!("expected PUBLISH, got {other:?}"),
    }
}

#[test]
fn keep_alive_pings_after_half_the_interval_and_times_out_without_pingresp() {
    let mut connect = connect_packet(Protocol::V3_1_1);
    connect.keep_alive = 10;
    let mut peer = Peer::connected(
        ClientOptions::new(connect),
        ok_connack(false, Properties::default()),
    );
    let start = peer.now;
    assert_eq!(
        peer.client.poll_timeout(),
        Some(start + Duration::from_secs(5))
    );
    peer.client
        .handle_timeout(start + Duration::from_secs(4))
        .unwrap();
    assert!(peer.sent().is_empty(), "not due yet");
    peer.client
        .handle_timeout(start + Duration::from_secs(5))
        .unwrap();
    assert_eq!(peer.sent(), [Packet::Pingreq]);
    assert_eq!(
        peer.client.poll_timeout(),
        Some(start + Duration::from_secs(15))
    );
    let err = peer
        .client
        .handle_timeout(start + Duration::from_secs(15))
        .unwrap_err();
    assert_eq!(
        err,
        Error::KeepAliveTimeout {
            keep_alive_secs: 10
        }
    );
    assert_eq!(peer.client.state(), State::Closed);
    assert_eq!(peer.client.poll_timeout(), None);
}

#[test]
fn pingresp_clears_the_wait_and_server_keep_alive_replaces_ours() {
    let mut connect = connect_packet(Protocol::V5);
    connect.keep_alive = 60;
    let props = Properties {
        server_keep_alive: Some(4),
        ..Properties::default()
    };
    let mut peer = Peer::connected(ClientOptions::new(connect), ok_connack(false, props));
    let start = peer.now;
    assert_eq!(
        peer.client.poll_timeout(),
        Some(start + Duration::from_secs(2))
    );
    peer.client
        .handle_timeout(start + Duration::from_secs(2))
        .unwrap();
    peer.feed(&Packet::Pingresp).unwrap();
    assert_eq!(peer.events(), [Event::Pong]);
    assert_eq!(
        peer.client.poll_timeout(),
        Some(start + Duration::from_secs(4))
    );
}

/// Connects again after losing the connection, with `session_present`.
fn reconnect(peer: &mut Peer, session_present: bool) {
    peer.client.connection_lost();
    peer.client.options_mut().connect.clean_start = false;
    peer.client.connect(peer.now).unwrap();
    peer.seen_connect = false;
    assert!(matches!(peer.sent()[..], [Packet::Connect(_)]));
    peer.feed(&ok_connack(session_present, Properties::default()))
        .unwrap();
}

#[test]
fn resumed_session_resends_unacknowledged_publish_with_dup_and_pubrel() {
    let mut options = ClientOptions::new(connect_packet(Protocol::V3_1_1));
    options.resend_on_reconnect = true;
    let mut peer = Peer::connected(options, ok_connack(false, Properties::default()));
    let q1 = peer.publish(QoS::AtLeastOnce).unwrap().unwrap();
    let q2 = peer.publish(QoS::ExactlyOnce).unwrap().unwrap();
    let q2b = peer.publish(QoS::ExactlyOnce).unwrap().unwrap();
    peer.sent();
    peer.feed(&Packet::Pubrec(PubAck::new(q2))).unwrap();
    peer.sent();
    reconnect(&mut peer, true);
    let resent = peer.sent();
    assert_eq!(resent.len(), 3, "{resent:?}");
    assert!(matches!(&resent[0], Packet::Publish(p) if p.dup && p.packet_id == Some(q1)));
    assert_eq!(resent[1], Packet::Pubrel(PubAck::new(q2)));
    assert!(matches!(&resent[2], Packet::Publish(p) if p.dup && p.packet_id == Some(q2b)));
    peer.feed(&Packet::Puback(PubAck::new(q1))).unwrap();
    peer.feed(&Packet::Pubcomp(PubAck::new(q2))).unwrap();
    assert_eq!(peer.events().len(), 3, "Connected and two Published");
}

#[test]
fn session_not_present_abandons_unacknowledged_publishes() {
    let mut options = ClientOptions::new(connect_packet(Protocol::V5));
    options.resend_on_reconnect = true;
    let mut peer = Peer::connected(options, ok_connack(false, Properties::default()));
    let q1 = peer.publish(QoS::AtLeastOnce).unwrap().unwrap();
    peer.sent();
    reconnect(&mut peer, false);
    assert!(peer.sent().is_empty());
    assert!(matches!(&peer.events()[..], [Event::Connected(_), Event::Abandoned(a)] if *a == q1));
    assert_eq!(peer.client.inflight(), 0);
    // A late PUBACK from the old connection does not match a new message.
    let next = peer.publish(QoS::AtLeastOnce).unwrap().unwrap();
    assert_ne!(next, q1);
}

#[test]
fn broker_disconnect_is_reported_and_later_input_ignored() {
    let mut peer = Peer::v5();
    peer.feed(&Packet::Disconnect(Disconnect::default()))
        .unwrap();
    assert!(matches!(&peer.events()[..], [Event::Disconnected(_)]));
    assert_eq!(peer.client.state(), State::Closed);
    peer.feed(&message(QoS::AtLeastOnce, Some(1))).unwrap();
    assert!(peer.events().is_empty());
}

#[derive(Debug, Clone)]
enum Op {
    Publish(u8),
    /// Acknowledge the n-th exchange in flight (modulo), correctly.
    Ack(usize),
    /// An acknowledgement for an arbitrary identifier.
    Stray(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..3).prop_map(Op::Publish),
        3 => any::<usize>().prop_map(Op::Ack),
        1 => (1..=u16::MAX).prop_map(Op::Stray),
    ]
}

proptest! {
    /// Against a broker that acknowledges in any order: the window holds,
    /// identifiers in flight are unique, each exchange ends with exactly one
    /// Published, and acks for identifiers not in flight are errors.
    #[test]
    fn inflight_bookkeeping_agrees_with_a_model(window in 1u16..8, ops in prop::collection::vec(op(), 1..300)) {
        let mut options = ClientOptions::new(connect_packet(Protocol::V5));
        options.inflight_max = NonZeroU16::new(window).unwrap();
        let mut peer = Peer::connected(options, ok_connack(false, Properties::default()));
        // Identifier → QoS, and for QoS 2 whether PUBREC was sent.
        let mut model: std::collections::BTreeMap<u16, (QoS, bool)> = Default::default();
        for op in ops {
            match op {
                Op::Publish(q) => {
                    let qos = QoS::from_u8(q).unwrap();
                    let result = peer.publish(qos);
                    if qos == QoS::AtMostOnce {
                        prop_assert_eq!(result, Ok(None));
                    } else if model.len() == usize::from(window) {
                        prop_assert_eq!(result, Err(Error::WindowFull { window }));
                    } else {
                        let pid = result.unwrap().unwrap();
                        prop_assert!(model.insert(pid.get(), (qos, false)).is_none(), "{} reused", pid);
                    }
                }
                Op::Ack(n) => {
                    let Some((&k, &(qos, recd))) = model.iter().nth(n % model.len().max(1)) else { continue };
                    let ack = PubAck::new(id(k));
                    match (qos, recd) {
                        (QoS::AtLeastOnce, _) => { peer.feed(&Packet::Puback(ack)).unwrap(); model.remove(&k); }
                        (_, false) => {
                            peer.feed(&Packet::Pubrec(ack)).unwrap();
                            model.insert(k, (qos, true));
                            let sent = peer.sent();
                            prop_assert!(sent.contains(&Packet::Pubrel(PubAck::new(id(k)))));
                        }
                        (_, true) => { peer.feed(&Packet::Pubcomp(ack)).unwrap(); model.remove(&k); }
                    }
                    let done = peer.events();
                    let all_this_one = done.iter().all(|e| matches!(e, Event::Published { packet_id, .. } if packet_id.get() == k));
                    prop_assert!(all_this_one, "{:?}", done);
                    prop_assert_eq!(done.len(), usize::from(!model.contains_key(&k)));
                }
                Op::Stray(k) => {
                    if !model.contains_key(&k) {
                        // A fresh core each time: a protocol error closes it.
                        let mut probe = Peer::v5();
                        prop_assert!(probe.feed(&Packet::Puback(PubAck::new(id(k)))).is_err());
                    }
                }
            }
            prop_assert_eq!(peer.client.inflight(), model.len());
            prop_assert!(peer.client.inflight() <= usize::from(window));
            peer.sent();
        }
    }
}
