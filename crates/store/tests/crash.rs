//! A store on a `SimDisk` that loses power: random batches, some committed with
//! `Fsync::Always` and some with `Fsync::Never`, then a crash (between commits, or by a
//! power cut in the middle of one), with or without a torn write. Reopened, the store must
//! hold the model as of one commit, never older than the last acknowledged `Always` commit
//! and never a mix of two.
//!
//! What redb 4.6 does, found by reading it and checked by
//! `redb_loses_never_commits_after_the_last_synced_one`: a `Durability::None` commit writes
//! its pages (some may reach the disk when its cache evicts them) but never the header that
//! points to them; only an `Immediate` commit writes the header (both slots, the new root
//! checksummed) and calls `sync_data` once. A crash therefore brings back exactly the last
//! `Immediate` commit, or the one in progress if its header made it whole.

mod common;

use common::Model;
use proptest::prelude::*;
use starling_store::{Fsync, Limits, Location, Op, Recovered, SimDisk, Store, TornWrite};

const UNLIMITED: Limits = Limits {
    max_bytes: u64::MAX,
};

fn open(disk: SimDisk) -> Result<(Store, Recovered), starling_store::StoreError> {
    Store::open(Location::Backend(Box::new(disk)), UNLIMITED)
}

/// How the crash comes.
#[derive(Debug, Clone)]
enum Crash {
    /// After the batches: every commit returned.
    AtEnd,
    /// The power goes after this many more writes, in some commit (or not at all, if the
    /// batches write less): that commit fails, and the crash follows.
    PowerCut { after_writes: u64 },
}

/// How much of the unsynced writes survive, as a share of them (per mille) and a tear.
#[derive(Debug, Clone)]
enum Tear {
    Nothing,
    Last { bytes: usize },
    InOrder { permille: usize, bytes: usize },
}

struct Outcome {
    /// The model after each commit, the initial empty one first.
    models: Vec<Model>,
    /// The index in `models` of the last acknowledged `Always` commit.
    synced: usize,
    recovered: Recovered,
}

fn run(batches: &[(Vec<Op>, Fsync)], crash: &Crash, tear: &Tear) -> Outcome {
    let disk = SimDisk::new();
    let (mut store, _) = open(disk.clone()).expect("a new store opens");
    if let Crash::PowerCut { after_writes } = crash {
        disk.cut_power_after(*after_writes);
    }
    let mut model = Model::default();
    let mut models = vec![model.clone()];
    let mut synced = 0;
    for (batch, fsync) in batches {
        for op in batch {
            model.apply(op);
        }
        models.push(model.clone());
        match store.commit(batch, *fsync) {
            Ok(_) if *fsync == Fsync::Always => synced = models.len() - 1,
            Ok(_) => {}
            Err(_) => {
                assert!(
                    matches!(crash, Crash::PowerCut { .. }),
                    "only a power cut fails"
                );
                break;
            }
        }
    }
    let unsynced = disk.stats().unsynced;
    let torn = match *tear {
        Tear::Nothing => TornWrite::None,
        Tear::Last { bytes } => TornWrite::Last { bytes },
        Tear::InOrder { permille, bytes } => TornWrite::InOrder {
            writes: unsynced * permille / 1000,
            bytes,
        },
    };
    // The crash comes before the store is dropped: its database's close, which would make
    // pending commits durable, finds a dead disk.
    let revived = disk.crash(torn);
    drop(store);
    let (_, recovered) = open(revived).expect("a crashed store reopens");
    Outcome {
        models,
        synced,
        recovered,
    }
}

fn check(outcome: &Outcome) {
    let candidates: Vec<usize> = (outcome.synced..outcome.models.len())
        .filter(|&k| outcome.models[k].recovered() == outcome.recovered)
        .collect();
    assert!(
        !candidates.is_empty(),
        "recovered {:?}\nmatches no commit from the last synced one ({}) on",
        outcome.recovered,
        outcome.synced
    );
}

fn fsync() -> impl Strategy<Value = Fsync> {
    prop_oneof![Just(Fsync::Always), Just(Fsync::Never)]
}

fn crash() -> impl Strategy<Value = Crash> {
    prop_oneof![
        1 => Just(Crash::AtEnd),
        3 => (0u64..150).prop_map(|after_writes| Crash::PowerCut { after_writes }),
    ]
}

fn tear() -> impl Strategy<Value = Tear> {
    prop_oneof![
        Just(Tear::Nothing),
        (0usize..5000).prop_map(|bytes| Tear::Last { bytes }),
        (0usize..=1000, 0usize..5000)
            .prop_map(|(permille, bytes)| Tear::InOrder { permille, bytes }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn a_crash_brings_back_one_commit_no_older_than_the_last_synced(
        batches in proptest::collection::vec(
            (proptest::collection::vec(common::op(), 1..8), fsync()),
            1..16,
        ),
        crash in crash(),
        tear in tear(),
    ) {
        check(&run(&batches, &crash, &tear));
    }
}

/// The finding the module doc states, pinned: after an `Always` commit, `Never` commits
/// are visible while the store runs and gone after a crash, whatever is torn.
#[test]
fn redb_loses_never_commits_after_the_last_synced_one() {
    let session = |c: &str| Op::PutSession {
        client_id: c.into(),
        meta: common::meta(&[]),
    };
    let batches = vec![
        (vec![session("a")], Fsync::Never),
        (vec![session("b")], Fsync::Always),
        (vec![session("c")], Fsync::Never),
        (vec![session("d")], Fsync::Never),
    ];
    for tear in [
        Tear::Nothing,
        Tear::Last { bytes: 4096 },
        Tear::InOrder {
            permille: 1000,
            bytes: 0,
        },
    ] {
        let outcome = run(&batches, &Crash::AtEnd, &tear);
        assert_eq!(outcome.synced, 2);
        assert_eq!(outcome.recovered, outcome.models[2].recovered(), "{tear:?}");
    }
}

/// A power cut in the middle of an `Always` commit leaves the commit before it or the whole
/// commit, never a part: over every cut point of one commit, both occur.
#[test]
fn a_power_cut_inside_a_synced_commit_leaves_all_or_nothing_of_it() {
    let ops = |c: &str| {
        let mut ops = vec![Op::PutSession {
            client_id: c.into(),
            meta: common::meta(&["t/#"]),
        }];
        ops.extend((0..40).map(|seq| Op::PutDelivery {
            client_id: c.into(),
            seq,
            record: common::queued("t/x", &[7; 64]),
        }));
        ops
    };
    let batches = vec![(ops("a"), Fsync::Always), (ops("b"), Fsync::Always)];
    let mut outcomes = [0usize; 3];
    for after_writes in 0..60 {
        for tear in [
            Tear::Nothing,
            Tear::InOrder {
                permille: 1000,
                bytes: 0,
            },
            Tear::InOrder {
                permille: 500,
                bytes: 100,
            },
        ] {
            let outcome = run(&batches, &Crash::PowerCut { after_writes }, &tear);
            check(&outcome);
            let k = (0..outcome.models.len())
                .find(|&k| outcome.models[k].recovered() == outcome.recovered)
                .expect("check found one");
            outcomes[k] += 1;
        }
    }
    assert!(outcomes[1] > 0 && outcomes[2] > 0, "{outcomes:?}");
}
