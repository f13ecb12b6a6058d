//! A real session's snapshot, stored as records and read back, restores: the store's
//! reassembly (in-flight and queue order, inbound packet identifiers) is one the session
//! accepts, and the restored session snapshots the same state.
#![allow(clippy::disallowed_methods)] // a test of a sans-IO core needs some Instant: Instant::now

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use starling_codec::{Connect, Packet, PacketId, Properties, Protocol, Publish, QoS};
use starling_session::{
    AllowAll, DeliveryOptions, DetachReason, Instant, Message, Session, SessionLimits,
};
use starling_store::{
    DeliveryStage, Fsync, Limits, Location, Op, SessionParts, SimDisk, Store, StoredDelivery,
};

fn limits() -> SessionLimits {
    SessionLimits {
        inflight_max: 2,
        ..SessionLimits::default()
    }
}

fn message(topic: &str, qos: QoS) -> Arc<Message> {
    Arc::new(Message {
        topic: Arc::from(topic),
        payload: Bytes::from_static(b"payload"),
        qos,
        retain: false,
        properties: Properties::default(),
        expires_at: None,
        publisher: Some(Arc::from("publisher")),
        shared_headers: Default::default(),
        received_at: None,
    })
}

/// Ops storing `state` whole, seqs from 0: in flight first (older), then the queue.
fn ops(state: starling_session::SessionState) -> Vec<Op> {
    let parts = SessionParts::split(state).expect("a persistent session is detached");
    let client_id = parts.client_id.clone();
    let mut ops = vec![Op::PutSession {
        client_id: client_id.clone(),
        meta: parts.meta,
    }];
    let inflight = parts.inflight.into_iter().map(|f| StoredDelivery {
        stage: DeliveryStage::Inflight {
            packet_id: f.packet_id,
            phase: f.phase,
        },
        delivery: f.delivery,
    });
    let queued = parts.queue.into_iter().map(|delivery| StoredDelivery {
        stage: DeliveryStage::Queued,
        delivery,
    });
    for (seq, record) in inflight.chain(queued).enumerate() {
        ops.push(Op::PutDelivery {
            client_id: client_id.clone(),
            seq: seq as u64,
            record,
        });
    }
    for packet_id in parts.inbound_qos2 {
        ops.push(Op::PutInbound {
            client_id: client_id.clone(),
            packet_id,
        });
    }
    ops
}

#[test]
fn a_stored_snapshot_restores_to_the_same_session() {
    let now = Instant::now();
    let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let mut session = Session::new(Arc::from("c1"), limits());
    let mut connect = Connect {
        protocol: Protocol::V5,
        clean_start: false,
        keep_alive: 60,
        client_id: "c1".into(),
        will: None,
        username: None,
        password: None,
        properties: Properties::default(),
    };
    connect.properties.session_expiry_interval = Some(3600);
    session.attach(now, &connect).expect("attach");
    for pid in [9, 4] {
        let publish = Publish {
            dup: false,
            qos: QoS::ExactlyOnce,
            retain: false,
            topic: "in".into(),
            packet_id: PacketId::new(pid),
            properties: Properties::default(),
            payload: Bytes::from_static(b"q2"),
        };
        session
            .handle_packet(now, Packet::Publish(publish), &mut AllowAll)
            .expect("a QoS 2 PUBLISH");
    }
    let options = DeliveryOptions {
        qos: QoS::ExactlyOnce,
        ..DeliveryOptions::default()
    };
    for (topic, qos) in [
        ("t/1", QoS::AtLeastOnce),
        ("t/2", QoS::ExactlyOnce),
        ("t/3", QoS::AtLeastOnce),
        ("t/4", QoS::ExactlyOnce),
    ] {
        session.deliver(now, &message(topic, qos), &options);
    }
    session.detach(now, DetachReason::ConnectionLost);
    while session.poll_effect().is_some() {}
    let state = session.snapshot(now, wall);
    let parts = SessionParts::split(state.clone()).unwrap();
    assert_eq!((parts.inflight.len(), parts.queue.len()), (2, 2));
    assert_eq!(parts.inbound_qos2.len(), 2);

    let disk = SimDisk::new();
    let limits_store = Limits {
        max_bytes: u64::MAX,
    };
    let (mut store, _) =
        Store::open(Location::Backend(Box::new(disk.clone())), limits_store).expect("a new store");
    let committed = store.commit(&ops(state.clone()), Fsync::Always).unwrap();
    assert_eq!(committed.refused, []);
    drop(store);
    let (_, recovered) =
        Store::open(Location::Backend(Box::new(disk)), limits_store).expect("reopens");
    let [stored] = &recovered.sessions[..] else {
        panic!("one session: {recovered:?}");
    };
    assert_eq!(
        (&stored.inflight_seqs[..], &stored.queue_seqs[..]),
        (&[0, 1][..], &[2, 3][..])
    );
    // The session lists inbound identifiers as they came; the store gives them ascending.
    let mut expected = state.clone();
    let detached = expected.detached.as_mut().unwrap();
    detached.inbound_qos2.sort();
    assert_eq!(stored.state, expected);
    let restored =
        Session::restore(stored.state.clone(), limits(), now, wall).expect("it restores");
    assert_eq!(restored.snapshot(now, wall), expected);
}
