//! Files that are not a good store: `open` and `check` both refuse them with an error that
//! names the file and what is wrong (for a record: its table and key), and never panic.
//!
//! The raw rows are written with redb directly, under the table names the layout fixes.

mod common;

use std::path::{Path, PathBuf};

use redb::TableDefinition;
use starling_store::{
    check, DecodeProblem, Fsync, Limits, LinkCursor, Location, Op, RecordKey, Store, StoreError,
};

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const SESSIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("sessions");
const DELIVERIES: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("deliveries");
type LinkKey = (u64, u16, u16);
type LinkValue = (u64, u64, u32, u64, u16);
const LINKS: TableDefinition<LinkKey, LinkValue> = TableDefinition::new("forward_links");

fn open(path: &Path) -> Result<Store, StoreError> {
    let limits = Limits {
        max_bytes: u64::MAX,
    };
    Store::open(Location::File(path.to_owned()), limits).map(|(store, _)| store)
}

/// Both entry points refuse the file, and their messages name it and contain `problem`.
fn both_refuse(path: &Path, problem: &str) -> [StoreError; 2] {
    let errors = [
        open(path).expect_err("open refuses it"),
        check(path).expect_err("check refuses it"),
    ];
    for e in &errors {
        let text = e.to_string();
        assert!(
            text.contains(&path.display().to_string()),
            "no path in {text}"
        );
        assert!(text.contains(problem), "no {problem:?} in {text}");
    }
    errors
}

/// A good store with a session and some deliveries, closed.
fn good_store(dir: &Path) -> PathBuf {
    let path = dir.join("store.redb");
    let mut store = open(&path).unwrap();
    let mut ops = vec![Op::PutSession {
        client_id: "c".into(),
        meta: common::meta(&["t/#"]),
    }];
    ops.extend((0..200).map(|seq| Op::PutDelivery {
        client_id: "c".into(),
        seq,
        record: common::queued("t", &[seq as u8; 64]),
    }));
    store.commit(&ops, Fsync::Always).unwrap();
    path
}

/// Writes raw rows into a store file.
fn with_raw(path: &Path, f: impl FnOnce(&redb::WriteTransaction)) {
    let db = redb::Database::create(path).unwrap();
    let txn = db.begin_write().unwrap();
    f(&txn);
    txn.commit().unwrap();
}

#[test]
fn a_file_of_garbage_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("garbage.redb");
    // A fixed pseudo-random pattern, not zeros: redb takes an empty file for a new one.
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let bytes: Vec<u8> = (0..65_536)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(&path, bytes).unwrap();
    for e in both_refuse(&path, "cannot open the store") {
        assert!(matches!(e, StoreError::Open { .. }), "{e:?}");
    }
}

#[test]
fn a_truncated_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = good_store(dir.path());
    let len = std::fs::metadata(&path).unwrap().len();
    for keep in [len / 2, 4096, 100] {
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(keep).unwrap();
        drop(file);
        for e in both_refuse(&path, "cannot open the store") {
            assert!(matches!(e, StoreError::Open { .. }), "{keep} bytes: {e:?}");
        }
    }
}

#[test]
fn a_store_of_another_format_version_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = good_store(dir.path());
    with_raw(&path, |txn| {
        txn.open_table(META)
            .unwrap()
            .insert("format_version", 99)
            .unwrap();
    });
    for e in both_refuse(&path, "format version 99") {
        assert!(
            matches!(e, StoreError::UnknownFormat { found: 99, .. }),
            "{e:?}"
        );
    }
}

/// Not a bad file: a store written before the `moves` table (format version 3) is read
/// by `check` as it is, and brought up to the current version by `open`, records kept.
#[test]
fn a_version_3_store_is_brought_up_to_the_current_version_with_its_records() {
    const MOVES: TableDefinition<(u16, &str), &[u8]> = TableDefinition::new("moves");
    let dir = tempfile::tempdir().unwrap();
    let path = good_store(dir.path());
    with_raw(&path, |txn| {
        assert!(
            txn.delete_table(MOVES).unwrap(),
            "a new store has the table"
        );
        txn.open_table(META)
            .unwrap()
            .insert("format_version", 3)
            .unwrap();
    });
    let report = check(&path).unwrap();
    assert_eq!((report.format_version, report.usage.deliveries), (3, 200));
    let limits = Limits {
        max_bytes: u64::MAX,
    };
    let (mut store, recovered) = Store::open(Location::File(path.clone()), limits).unwrap();
    assert_eq!(recovered.sessions.len(), 1);
    assert!(recovered.moves.is_empty());
    let put = Op::PutMove {
        shard: 1,
        client_id: "c".to_owned(),
        record: vec![1, 2, 3],
    };
    store.commit(&[put], Fsync::Always).unwrap();
    drop(store);
    let report = check(&path).unwrap();
    assert_eq!(report.format_version, starling_store::FORMAT_VERSION);
    let (_, recovered) = Store::open(Location::File(path), limits).unwrap();
    assert_eq!(recovered.moves, vec![(1, "c".to_owned(), vec![1, 2, 3])]);
}

/// Not a bad file: a store written before the `forward_links` table (format version 1)
/// is read by `check` as it is, and brought up to version 2 by `open`, records kept.
#[test]
fn a_version_1_store_is_brought_up_to_the_current_version_with_its_records() {
    let dir = tempfile::tempdir().unwrap();
    let path = good_store(dir.path());
    with_raw(&path, |txn| {
        assert!(
            txn.delete_table(LINKS).unwrap(),
            "a new store has the table"
        );
        txn.open_table(META)
            .unwrap()
            .insert("format_version", 1)
            .unwrap();
    });
    let report = check(&path).unwrap();
    assert_eq!((report.format_version, report.usage.deliveries), (1, 200));
    let limits = Limits {
        max_bytes: u64::MAX,
    };
    let (mut store, recovered) = Store::open(Location::File(path.clone()), limits).unwrap();
    assert_eq!(recovered.sessions.len(), 1);
    assert!(recovered.links.is_empty());
    let cursor = LinkCursor {
        node: 2,
        shard: 1,
        to_shard: 0,
        inc: 77,
        seq: 12,
        taken: 3,
        map_seed: 41,
        shards: 2,
    };
    store
        .commit(&[Op::PutLinkCursor(cursor)], Fsync::Always)
        .unwrap();
    drop(store);
    let report = check(&path).unwrap();
    assert_eq!(report.format_version, starling_store::FORMAT_VERSION);
    let (_, recovered) = Store::open(Location::File(path), limits).unwrap();
    assert_eq!(recovered.links, vec![cursor]);
    assert_eq!(recovered.sessions[0].queue_seqs.len(), 200);
}

#[test]
fn a_redb_file_without_a_format_version_is_not_a_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.redb");
    with_raw(&path, |txn| {
        txn.open_table(TableDefinition::<u64, u64>::new("something"))
            .unwrap()
            .insert(1, 2)
            .unwrap();
    });
    for e in both_refuse(&path, "not a store") {
        assert!(matches!(e, StoreError::NotAStore { .. }), "{e:?}");
    }
}

#[test]
fn a_record_that_does_not_decode_is_named_by_table_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = good_store(dir.path());
    with_raw(&path, |txn| {
        let mut t = txn.open_table(DELIVERIES).unwrap();
        t.insert(("c", 7), [starling_store::VALUE_VERSION, 0xff].as_slice())
            .unwrap();
    });
    for e in both_refuse(
        &path,
        "table deliveries, key (\"c\", seq 7): malformed value",
    ) {
        let StoreError::Decode {
            table,
            key,
            problem,
            ..
        } = e
        else {
            panic!("{e:?}");
        };
        assert_eq!(table, "deliveries");
        assert_eq!(
            key,
            RecordKey::Delivery {
                client_id: "c".into(),
                seq: 7
            }
        );
        assert!(matches!(problem, DecodeProblem::Malformed(_)));
    }
}

#[test]
fn a_value_of_an_unknown_layout_version_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = good_store(dir.path());
    with_raw(&path, |txn| {
        let mut t = txn.open_table(SESSIONS).unwrap();
        t.insert("c", [42u8, 0, 0].as_slice()).unwrap();
    });
    both_refuse(&path, "table sessions, key \"c\": value layout version 42");
}

#[test]
fn a_delivery_without_its_session_is_an_orphan() {
    let dir = tempfile::tempdir().unwrap();
    let path = good_store(dir.path());
    with_raw(&path, |txn| {
        txn.open_table(SESSIONS).unwrap().remove("c").unwrap();
    });
    for e in both_refuse(
        &path,
        "table deliveries, key (\"c\", seq 0): no stored session",
    ) {
        assert!(matches!(e, StoreError::Orphan { .. }), "{e:?}");
    }
}

#[test]
fn a_missing_file_is_an_error_for_check_and_a_missing_directory_for_open() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.redb");
    let e = check(&missing).expect_err("check needs a file");
    assert!(e.to_string().contains("nope.redb"), "{e}");
    assert!(!missing.exists(), "check created the file");
    let nowhere = dir.path().join("no-dir").join("store.redb");
    let e = open(&nowhere).expect_err("open needs the directory");
    assert!(e.to_string().contains("no-dir"), "{e}");
}

#[test]
fn a_file_with_damaged_pages_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = good_store(dir.path());
    let good = std::fs::read(&path).unwrap();
    let limits = Limits {
        max_bytes: u64::MAX,
    };
    let reopen = || Store::open(Location::File(path.clone()), limits).map(|(_, r)| r);
    let expected = reopen().unwrap();
    // Every page after the first (redb's header), one at a time: bit rot in a page the
    // committed trees use fails its checksum; in a free page it changes nothing.
    let (mut refused, mut pages) = (0, 0);
    for page in 1..good.len() / 4096 {
        let mut bytes = good.clone();
        for b in &mut bytes[page * 4096..(page + 1) * 4096] {
            *b ^= 0x55;
        }
        std::fs::write(&path, &bytes).unwrap();
        pages += 1;
        let opened = reopen();
        match (opened, check(&path)) {
            (Err(a), Err(b)) => {
                for e in [a, b] {
                    assert!(e.to_string().contains("store.redb"), "{e}");
                }
                refused += 1;
            }
            (Ok(recovered), Ok(_)) => assert_eq!(recovered, expected, "page {page}"),
            (a, b) => panic!("open and check disagree on page {page}: {a:?} {b:?}"),
        }
    }
    assert!(refused > 0, "none of {pages} damaged pages was noticed");
}
