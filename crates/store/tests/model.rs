//! Random op sequences, committed in random batches, read back by a reopen: the store
//! holds what a plain in-memory model holds, refuses what the model refuses, and the usage
//! it keeps while running equals the one it recounts at open.

mod common;

use common::Model;
use proptest::prelude::*;
use starling_store::{Fsync, Limits, Location, Op, Refusal, SimDisk, Store};

const UNLIMITED: Limits = Limits {
    max_bytes: u64::MAX,
};

fn open(disk: &SimDisk) -> (Store, starling_store::Recovered) {
    Store::open(Location::Backend(Box::new(disk.clone())), UNLIMITED).expect("the store opens")
}

fn run(batches: &[Vec<Op>], reopen_every: usize) {
    let disk = SimDisk::new();
    let (mut store, _) = open(&disk);
    let mut model = Model::default();
    for (i, batch) in batches.iter().enumerate() {
        let committed = store.commit(batch, Fsync::Never).expect("commit");
        let refused: Vec<usize> = batch
            .iter()
            .enumerate()
            .filter(|(_, op)| !model.apply(op))
            .map(|(i, _)| i)
            .collect();
        let got: Vec<usize> = committed.refused.iter().map(|r| r.op).collect();
        assert_eq!(got, refused, "refused ops differ in batch {i}: {batch:?}");
        assert!(committed
            .refused
            .iter()
            .all(|r| r.reason == Refusal::NoSession));
        if (i + 1) % reopen_every == 0 {
            let usage = store.usage();
            drop(store);
            let recovered;
            (store, recovered) = open(&disk);
            assert_eq!(recovered, model.recovered(), "after batch {i}");
            assert_eq!(store.usage(), usage, "usage kept vs usage recounted");
        }
    }
    let usage = store.usage();
    drop(store);
    let (store, recovered) = open(&disk);
    assert_eq!(recovered, model.recovered());
    assert_eq!(store.usage(), usage);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn reopened_store_equals_the_model(batches in common::batches(24), reopen_every in 1usize..8) {
        run(&batches, reopen_every);
    }
}
