//! The byte cap: a full store refuses ops that admit new data, one by one, and still
//! applies deletes and updates of what it holds; space comes back as records go; the
//! refusals and the usage survive a reopen.

mod common;

use common::{message, meta, pid, queued, wall, Model};
use proptest::prelude::*;
use starling_store::{
    DeliveryStage, Fsync, Limits, Location, Op, Refusal, SimDisk, Store, StoredDelivery,
};

fn open(disk: &SimDisk, max_bytes: u64) -> Store {
    let location = Location::Backend(Box::new(disk.clone()));
    Store::open(location, Limits { max_bytes })
        .expect("the store opens")
        .0
}

fn delivery(seq: u64) -> Op {
    Op::PutDelivery {
        client_id: "c".into(),
        seq,
        record: queued("t", &[0; 64]),
    }
}

fn refused_full(store: &mut Store, ops: &[Op]) -> Vec<usize> {
    let committed = store.commit(ops, Fsync::Always).expect("commit");
    committed
        .refused
        .iter()
        .map(|r| {
            assert!(matches!(r.reason, Refusal::Full { .. }), "{r:?}");
            r.op
        })
        .collect()
}

/// Fills a store with deliveries of session "c" until one is refused; returns the store
/// and the seqs stored.
fn fill(disk: &SimDisk, max_bytes: u64) -> (Store, Vec<u64>) {
    let mut store = open(disk, max_bytes);
    let session = Op::PutSession {
        client_id: "c".into(),
        meta: meta(&["t/#"]),
    };
    assert_eq!(refused_full(&mut store, &[session]), [] as [usize; 0]);
    let ops: Vec<Op> = (0..100).map(delivery).collect();
    let refused = refused_full(&mut store, &ops);
    assert!(!refused.is_empty(), "100 deliveries fill {max_bytes} bytes");
    let stored: Vec<u64> = (0..100)
        .filter(|s| !refused.contains(&(*s as usize)))
        .collect();
    assert!(store.usage().bytes <= max_bytes);
    (store, stored)
}

#[test]
fn a_full_store_refuses_each_new_record_and_applies_the_rest_of_the_batch() {
    let disk = SimDisk::new();
    let (mut store, stored) = fill(&disk, 4_000);
    let before = store.usage();
    let batch = [
        // Larger than the room a refused delivery leaves.
        Op::PutSession {
            client_id: "new".into(),
            meta: meta(&["a/long/filter/of/sixty/four/bytes/to/take/more/room/than/is/left/#"; 2]),
        },
        delivery(500),
        Op::PutRetained {
            topic: "r".into(),
            message: message("r", &[1; 200]),
        },
        Op::PutDelayed {
            id: 1,
            due: wall(1),
            target: "t".into(),
            message: message("t", &[1; 200]),
        },
        // Updates of what is stored apply on a full store.
        Op::PutSession {
            client_id: "c".into(),
            meta: meta(&["t/#", "u/#"]),
        },
        Op::PutDelivery {
            client_id: "c".into(),
            seq: stored[0],
            record: StoredDelivery {
                stage: DeliveryStage::Inflight {
                    packet_id: pid(1),
                    phase: starling_session::state::InflightPhase::AwaitingPubcomp,
                },
                delivery: queued("t", &[0; 64]).delivery,
            },
        },
        Op::PutInbound {
            client_id: "c".into(),
            packet_id: pid(9),
        },
    ];
    assert_eq!(refused_full(&mut store, &batch), [0, 1, 2, 3]);
    let after = store.usage();
    assert_eq!(after.sessions, before.sessions);
    assert_eq!(after.deliveries, before.deliveries);
    assert_eq!(after.inbound, 1);
    assert!(after.bytes > before.bytes, "the updates grew it");
    drop(store);
    let store = open(&disk, 4_000);
    assert_eq!(store.usage(), after);
}

#[test]
fn dropped_deliveries_make_room_for_new_ones_and_the_cap_holds_after_a_reopen() {
    let disk = SimDisk::new();
    let (mut store, stored) = fill(&disk, 4_000);
    let full = store.usage();
    let drops: Vec<Op> = stored[..3]
        .iter()
        .map(|&seq| Op::DropDelivery {
            client_id: "c".into(),
            seq,
        })
        .collect();
    assert_eq!(refused_full(&mut store, &drops), [] as [usize; 0]);
    assert_eq!(store.usage().deliveries, full.deliveries - 3);
    drop(store);
    let mut store = open(&disk, 4_000);
    let adds: Vec<Op> = (200..210).map(delivery).collect();
    assert_eq!(refused_full(&mut store, &adds), [3, 4, 5, 6, 7, 8, 9]);
    assert_eq!(store.usage(), full);
}

#[test]
fn a_retained_message_may_shrink_but_not_grow_on_a_full_store() {
    let disk = SimDisk::new();
    let mut store = open(&disk, 300);
    let put = |n| Op::PutRetained {
        topic: "r".into(),
        message: message("r", &vec![1; n]),
    };
    assert_eq!(refused_full(&mut store, &[put(150)]), [] as [usize; 0]);
    assert_eq!(refused_full(&mut store, &[put(400)]), [0]);
    assert_eq!(refused_full(&mut store, &[put(10)]), [] as [usize; 0]);
    assert_eq!(refused_full(&mut store, &[put(100)]), [] as [usize; 0]);
    let used = store.usage().bytes;
    assert!(used <= 300, "{used}");
}

#[test]
fn a_tiny_cap_refuses_everything_without_panicking() {
    let disk = SimDisk::new();
    let mut store = open(&disk, 0);
    let ops: Vec<Op> = common_ops();
    let committed = store.commit(&ops, Fsync::Always).expect("commit");
    assert_eq!(committed.refused.len(), ops.len() - 2, "{committed:?}");
    assert_eq!(store.usage(), Default::default());
}

fn common_ops() -> Vec<Op> {
    vec![
        Op::PutSession {
            client_id: "c".into(),
            meta: meta(&[]),
        },
        delivery(1),
        Op::PutInbound {
            client_id: "c".into(),
            packet_id: pid(1),
        },
        Op::PutRetained {
            topic: "r".into(),
            message: message("r", b""),
        },
        Op::DropRetained { topic: "r".into() },
        Op::DropSession {
            client_id: "c".into(),
        },
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Under a random cap, the store equals a model that applies every op the store did not
    /// refuse; deletes are never refused; the usage kept equals the usage recounted.
    #[test]
    fn refused_ops_change_nothing_and_the_others_apply(
        batches in common::batches(24),
        max_bytes in 0u64..3_000,
    ) {
        let disk = SimDisk::new();
        let mut store = open(&disk, max_bytes);
        let mut model = Model::default();
        for batch in &batches {
            let committed = store.commit(batch, Fsync::Never).expect("commit");
            let mut refused = committed.refused.iter().peekable();
            for (i, op) in batch.iter().enumerate() {
                if refused.peek().is_some_and(|r| r.op == i) {
                    let r = refused.next().unwrap();
                    let adds = matches!(op, Op::PutSession { .. } | Op::PutDelivery { .. }
                        | Op::PutRetained { .. } | Op::PutDelayed { .. } | Op::PutInbound { .. }
                        | Op::PutOutbox(_));
                    prop_assert!(adds, "a delete was refused: {op:?} {r:?}");
                    if let Refusal::Full { used, adds, max } = r.reason {
                        prop_assert!(used + adds > max);
                    }
                } else {
                    prop_assert!(model.apply(op), "the model refuses {op:?}");
                }
            }
        }
        let usage = store.usage();
        drop(store);
        let (store, recovered) = Store::open(
            Location::Backend(Box::new(disk)),
            Limits { max_bytes },
        ).unwrap();
        prop_assert_eq!(recovered, model.recovered());
        prop_assert_eq!(store.usage(), usage);
    }
}
