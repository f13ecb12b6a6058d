//! Property tests: encode/decode round trips, arbitrary input, streaming.

mod strategy;

use bytes::BytesMut;
use proptest::collection::vec;
use proptest::prelude::*;
use starling_codec::*;

fn encode_one(packet: &Packet, protocol: Protocol) -> BytesMut {
    let mut buf = BytesMut::new();
    let n = encode(packet, protocol, u32::MAX, &mut buf).expect("valid packet encodes");
    assert_eq!(n, buf.len(), "encode reports the bytes it wrote");
    buf
}

/// Decodes until the buffer runs dry or an error; returns the packets and
/// checks that no packet bigger than `max` came out.
fn drain(buf: &mut BytesMut, protocol: Protocol, max: u32) -> Vec<Packet> {
    let mut out = Vec::new();
    loop {
        let before = buf.len();
        match decode(buf, protocol, max) {
            Ok(Some(p)) => {
                assert!(before - buf.len() <= max as usize);
                out.push(p);
            }
            Ok(None) => {
                assert_eq!(before, buf.len(), "Ok(None) consumes nothing");
                return out;
            }
            Err(e) => {
                // Every error maps to a failure reason code.
                assert!(e.reason_code().is_error());
                return out;
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn decode_of_encode_is_identity_for_every_packet_and_version((protocol, packet) in strategy::any_packet()) {
        let mut buf = encode_one(&packet, protocol);
        let decoded = decode(&mut buf, protocol, u32::MAX).expect("decodes").expect("whole packet");
        prop_assert_eq!(&decoded, &packet);
        prop_assert!(buf.is_empty(), "no bytes left over");
    }

    #[test]
    fn connect_decodes_without_knowing_the_version(connect in strategy::protocol().prop_flat_map(strategy::connect)) {
        let packet = Packet::Connect(Box::new(connect.clone()));
        let mut buf = encode_one(&packet, connect.protocol);
        prop_assert_eq!(peek_protocol(&buf).expect("valid"), Some(connect.protocol));
        let decoded = decode_connect(&mut buf, u32::MAX).expect("decodes").expect("whole");
        prop_assert_eq!(decoded, connect);
    }

    #[test]
    fn publish_header_plus_shared_payload_equals_full_encoding((v, p) in strategy::protocol().prop_flat_map(|v| strategy::publish(v).prop_map(move |p| (v, p)))) {
        let full = encode_one(&Packet::Publish(p.clone()), v);
        let mut head = BytesMut::new();
        let n = encode_publish_header(&p.header(), p.payload.len(), v, u32::MAX, &mut head).expect("encodes");
        prop_assert_eq!(n, head.len());
        head.extend_from_slice(&p.payload);
        prop_assert_eq!(head, full);
    }

    #[test]
    fn packet_larger_than_max_is_refused_by_encoder_and_decoder((protocol, packet) in strategy::any_packet()) {
        let full = encode_one(&packet, protocol);
        let size = full.len() as u32;
        let mut dst = BytesMut::from(&b"keep"[..]);
        let err = encode(&packet, protocol, size - 1, &mut dst).expect_err("too large");
        prop_assert_eq!(err, Error::PacketTooLarge { size: u64::from(size), max: size - 1 });
        prop_assert_eq!(&dst[..], b"keep", "nothing written on error");
        let mut buf = full.clone();
        let err = decode(&mut buf, protocol, size - 1).expect_err("too large");
        prop_assert_eq!(err.reason_code(), ReasonCode::PacketTooLarge);
        let mut buf = full;
        prop_assert!(decode(&mut buf, protocol, size).expect("fits").is_some());
    }

    #[test]
    fn arbitrary_bytes_never_panic_nor_exceed_max(protocol in strategy::protocol(), data in vec(any::<u8>(), 0..512), max in 2u32..600) {
        let mut buf = BytesMut::from(&data[..]);
        drain(&mut buf, protocol, max);
        let mut buf = BytesMut::from(&data[..]);
        let _ = decode_connect(&mut buf, max);
        let _ = peek_protocol(&data);
    }

    #[test]
    fn arbitrary_bodies_behind_a_valid_header_never_panic_and_reencode(protocol in strategy::protocol(), first in prop_oneof![(1u8..=15).prop_map(|t| t << 4), Just(0x32u8), Just(0x3Bu8), Just(0x62), Just(0x82), Just(0xA2)], body in vec(any::<u8>(), 0..128)) {
        // Aim below the fixed header so the body parsers see the random bytes.
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&[first, body.len() as u8]);
        if body.len() >= 128 { return Ok(()); }
        buf.extend_from_slice(&body);
        if let Ok(Some(packet)) = decode(&mut buf, protocol, u32::MAX) {
            // Whatever the decoder accepts, the encoder accepts and reproduces.
            let mut again = encode_one(&packet, protocol);
            let back = decode(&mut again, protocol, u32::MAX).expect("re-decodes").expect("whole");
            prop_assert_eq!(back, packet);
        }
    }

    #[test]
    fn streaming_in_arbitrary_chunks_never_loses_a_frame((protocol, packets) in strategy::protocol().prop_flat_map(|p| vec(strategy::packet(p), 1..8).prop_map(move |v| (p, v))), cuts in vec(any::<prop::sample::Index>(), 0..12)) {
        let mut wire = Vec::new();
        for p in &packets {
            wire.extend_from_slice(&encode_one(p, protocol));
        }
        let mut points: Vec<usize> = cuts.iter().map(|i| i.index(wire.len() + 1)).collect();
        points.push(0);
        points.push(wire.len());
        points.sort_unstable();
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for w in points.windows(2) {
            buf.extend_from_slice(&wire[w[0]..w[1]]);
            while let Some(p) = decode(&mut buf, protocol, u32::MAX).expect("valid stream") {
                got.push(p);
            }
        }
        prop_assert!(buf.is_empty());
        prop_assert_eq!(got, packets);
    }
}

#[test]
fn huge_declared_length_is_refused_from_the_fixed_header_alone() {
    // PUBLISH declaring 268,435,455 bytes, only 5 bytes present.
    let mut buf = BytesMut::from(&[0x30, 0xFF, 0xFF, 0xFF, 0x7F][..]);
    let cap = buf.capacity();
    let err = decode(&mut buf, Protocol::V5, 1024).expect_err("too large");
    assert_eq!(
        err,
        Error::PacketTooLarge {
            size: 268_435_460,
            max: 1024
        }
    );
    assert_eq!(err.reason_code(), ReasonCode::PacketTooLarge);
    assert_eq!(buf.capacity(), cap, "no allocation");
    assert_eq!(buf.len(), 5, "nothing consumed");
}

#[test]
fn max_packet_size_counts_the_fixed_header() {
    // PINGREQ is 2 bytes: one type byte, one length byte.
    let mut buf = BytesMut::from(&[0xC0, 0x00][..]);
    assert!(decode(&mut buf.clone(), Protocol::V3_1_1, 1).is_err());
    assert_eq!(
        decode(&mut buf, Protocol::V3_1_1, 2).unwrap(),
        Some(Packet::Pingreq)
    );
}
