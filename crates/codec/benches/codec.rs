//! Decode and encode of a 64-byte-payload PUBLISH, the broker's hot path.

use bytes::{Bytes, BytesMut};
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use starling_codec::{
    decode, encode, encode_publish_header, Packet, PacketId, Properties, Protocol, Publish, QoS,
};

fn publish() -> Publish {
    Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: false,
        topic: "sensors/building-7/floor-3/temperature".into(),
        packet_id: PacketId::new(42),
        properties: Properties::default(),
        payload: Bytes::from(vec![0xA5; 64]),
    }
}

fn bench(c: &mut Criterion) {
    let p = publish();
    for protocol in [Protocol::V3_1_1, Protocol::V5] {
        let packet = Packet::Publish(p.clone());
        let mut wire = BytesMut::new();
        encode(&packet, protocol, u32::MAX, &mut wire).expect("valid");
        let wire = wire.freeze();

        c.bench_function(&format!("decode_publish_64B_{protocol:?}"), |b| {
            b.iter(|| {
                let mut buf = BytesMut::from(&wire[..]);
                black_box(decode(&mut buf, protocol, u32::MAX).expect("valid"))
            })
        });
        c.bench_function(&format!("encode_publish_64B_{protocol:?}"), |b| {
            let mut out = BytesMut::with_capacity(256);
            b.iter(|| {
                out.clear();
                black_box(encode(&packet, protocol, u32::MAX, &mut out).expect("valid"))
            })
        });
        c.bench_function(&format!("encode_publish_header_64B_{protocol:?}"), |b| {
            let mut out = BytesMut::with_capacity(256);
            let header = p.header();
            b.iter(|| {
                out.clear();
                black_box(
                    encode_publish_header(&header, p.payload.len(), protocol, u32::MAX, &mut out)
                        .expect("valid"),
                )
            })
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
