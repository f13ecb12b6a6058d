//! Fuzz the decoder: arbitrary bytes never panic, never yield a packet above
//! the size limit, and whatever decodes re-encodes to something that decodes
//! to the same packet.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use starling_codec::{decode, decode_connect, encode, peek_protocol, Packet, Protocol};

/// Small enough that the size check is exercised, large enough for real packets.
const MAX: u32 = 4096;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, bytes)) = data.split_first() else {
        return;
    };
    let _ = peek_protocol(bytes);
    if selector & 0x80 != 0 {
        let mut buf = BytesMut::from(bytes);
        if let Ok(Some(connect)) = decode_connect(&mut buf, MAX) {
            let protocol = connect.protocol;
            check_reencodes(&Packet::Connect(Box::new(connect)), protocol);
        }
        return;
    }
    let protocol = match selector % 3 {
        0 => Protocol::V3_1,
        1 => Protocol::V3_1_1,
        _ => Protocol::V5,
    };
    let mut buf = BytesMut::from(bytes);
    loop {
        let before = buf.len();
        match decode(&mut buf, protocol, MAX) {
            Ok(Some(packet)) => {
                assert!(before - buf.len() <= MAX as usize);
                check_reencodes(&packet, protocol);
            }
            Ok(None) => {
                assert_eq!(before, buf.len());
                break;
            }
            Err(e) => {
                assert!(e.reason_code().is_error());
                break;
            }
        }
    }
});

fn check_reencodes(packet: &Packet, protocol: Protocol) {
    let mut out = BytesMut::new();
    encode(packet, protocol, u32::MAX, &mut out).expect("a decoded packet encodes");
    let again = decode(&mut out, protocol, u32::MAX)
        .expect("re-encoded packet decodes")
        .expect("whole packet");
    assert_eq!(&again, packet);
}
