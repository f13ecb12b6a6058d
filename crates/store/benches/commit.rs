//! Commit throughput on a temp file: batches of 1, 16 and 128 new deliveries (64-byte
//! payloads) per commit, with `Fsync::Always` and `Fsync::Never`; and the cost of opening
//! a store of 100 000 deliveries, which recounts usage while it reads them back.
#![allow(clippy::disallowed_methods)] // a benchmark measures wall time: Instant::now

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use starling_codec::{PacketId, Properties, QoS, SubscriptionOptions};
use starling_session::state::{
    DeliveryState, MessageState, SubscriptionState, SESSION_STATE_VERSION,
};
use starling_store::{
    DeliveryStage, Fsync, Limits, Location, Op, SessionMeta, Store, StoredDelivery,
};

const LIMITS: Limits = Limits {
    max_bytes: u64::MAX,
};
/// The store is started afresh past this many deliveries (untimed), so that a long run
/// measures a store of bounded size.
const RESET_AT: u64 = 50_000;

fn record() -> StoredDelivery {
    StoredDelivery {
        stage: DeliveryStage::Queued,
        delivery: DeliveryState {
            message: MessageState {
                topic: "sensors/building-1/floor-2/temp".into(),
                payload: Bytes::from_static(&[0x5a; 64]),
                qos: QoS::AtLeastOnce,
                retain: false,
                properties: Properties::default(),
                expiry: None,
                publisher: Some("publisher-1".into()),
            },
            qos: QoS::AtLeastOnce,
            retain: false,
            subscription_ids: vec![1],
        },
    }
}

fn session() -> Op {
    Op::PutSession {
        client_id: "subscriber-1".into(),
        meta: SessionMeta {
            state_version: SESSION_STATE_VERSION,
            next_packet_id: PacketId::MIN,
            expiry_interval_secs: 3600,
            expires_at: None,
            will: None,
            subscriptions: vec![SubscriptionState {
                filter: "sensors/#".into(),
                options: SubscriptionOptions {
                    qos: QoS::AtLeastOnce,
                    ..SubscriptionOptions::default()
                },
                subscription_id: Some(1),
            }],
            pending_subscribes: Vec::new(),
            pending_unsubscribes: Vec::new(),
            owner: None,
            connected: false,
            unheard: false,
        },
    }
}

fn fresh(path: &Path) -> Store {
    let _ = std::fs::remove_file(path);
    let (mut store, _) = Store::open(Location::File(path.to_owned()), LIMITS).unwrap();
    store.commit(&[session()], Fsync::Always).unwrap();
    store
}

fn batch(first_seq: u64, n: u64) -> Vec<Op> {
    (first_seq..first_seq + n)
        .map(|seq| Op::PutDelivery {
            client_id: "subscriber-1".into(),
            seq,
            record: record(),
        })
        .collect()
}

fn commits(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.redb");
    let mut group = c.benchmark_group("commit");
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(4));
    for (name, fsync) in [("always", Fsync::Always), ("never", Fsync::Never)] {
        for n in [1u64, 16, 128] {
            group.throughput(Throughput::Elements(n));
            group.bench_with_input(BenchmarkId::new(name, n), &n, |b, &n| {
                let mut store = fresh(&path);
                let mut seq = 0;
                b.iter_custom(|iters| {
                    let mut spent = Duration::ZERO;
                    for _ in 0..iters {
                        if store.usage().deliveries >= RESET_AT {
                            drop(std::mem::replace(&mut store, fresh(&path)));
                            seq = 0;
                        }
                        let ops = batch(seq, n);
                        seq += n;
                        let start = Instant::now();
                        let committed = store.commit(&ops, fsync).unwrap();
                        spent += start.elapsed();
                        assert!(committed.refused.is_empty());
                    }
                    spent
                });
            });
        }
    }
    group.finish();
}

fn open(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("open.redb");
    let mut store = fresh(&path);
    for first in (0..100_000).step_by(1000) {
        store.commit(&batch(first, 1000), Fsync::Never).unwrap();
    }
    drop(store);
    let mut group = c.benchmark_group("open");
    group.sample_size(10);
    group.bench_function("100k_deliveries", |b| {
        b.iter(|| {
            let (store, recovered) = Store::open(Location::File(path.clone()), LIMITS).unwrap();
            assert_eq!(store.usage().deliveries, 100_000);
            recovered
        });
    });
    group.finish();
}

criterion_group!(benches, commits, open);
criterion_main!(benches);
