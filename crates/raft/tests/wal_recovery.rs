//! Property: after any sequence of appends, hard-state writes, syncs, compactions and crashes
//! (unsynced bytes lost, or torn anywhere), the recovered log equals the model's durable
//! state plus some prefix of the records written since the last sync — never less than what
//! was synced, never a record that was not written.

use proptest::prelude::*;
use raft::eraftpb::{ConfState, Entry, HardState};
use raft::Storage;
use starling_raft::wal::make_snapshot;
use starling_raft::{Crash, DiskLog, FsyncPolicy, LogOptions, LogStore, MemDisk};

#[derive(Clone, Debug)]
enum Op {
    /// Append `n` entries, replacing the last `back` ones (never below the commit index).
    Append {
        back: u64,
        n: u64,
        new_term: bool,
    },
    /// Raise the commit index by up to `by` (never past the synced last index).
    Commit {
        by: u64,
    },
    Sync,
    Compact {
        at: u64,
    },
    /// Install a leader's snapshot `ahead` entries past the current last index (it replaces
    /// the whole log), at a new term.
    LeaderSnapshot {
        ahead: u64,
    },
    Crash {
        torn: bool,
        seed: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u64..4, 1u64..6, any::<bool>()).prop_map(|(back, n, new_term)| Op::Append { back, n, new_term }),
        2 => (1u64..5).prop_map(|by| Op::Commit { by }),
        3 => Just(Op::Sync),
        1 => (0u64..100).prop_map(|at| Op::Compact { at }),
        1 => (0u64..4).prop_map(|ahead| Op::LeaderSnapshot { ahead }),
        1 => (any::<bool>(), any::<u64>()).prop_map(|(torn, seed)| Op::Crash { torn, seed }),
    ]
}

#[derive(Clone, Debug, PartialEq)]
struct State {
    snap_index: u64,
    snap_term: u64,
    /// (index, term) after the snapshot.
    entries: Vec<(u64, u64)>,
    hs: (u64, u64),
}

impl State {
    fn last(&self) -> u64 {
        self.entries.last().map(|e| e.0).unwrap_or(self.snap_index)
    }
    fn term_at(&self, i: u64) -> u64 {
        if i == self.snap_index {
            return self.snap_term;
        }
        self.entries[(i - self.snap_index - 1) as usize].1
    }
    fn apply(&mut self, r: &Rec) {
        match *r {
            Rec::Entry(i, t) => {
                let keep = i.saturating_sub(self.snap_index + 1) as usize;
                self.entries.truncate(keep);
                if i > self.snap_index {
                    self.entries.push((i, t));
                }
            }
            Rec::Hs(term, commit) => self.hs = (term, commit),
        }
    }
}

#[derive(Clone, Debug)]
enum Rec {
    Entry(u64, u64),
    Hs(u64, u64),
}

fn entry(i: u64, t: u64) -> Entry {
    Entry {
        index: i,
        term: t,
        data: format!("e{i}t{t}").into_bytes().into(),
        ..Default::default()
    }
}

fn observe(l: &DiskLog<MemDisk>) -> State {
    let snap = l.latest_snapshot().get_metadata();
    let first = l.first_index().unwrap();
    let last = l.last_index().unwrap();
    let entries = if last >= first {
        l.entries(first, last + 1, None, raft::GetEntriesContext::empty(false))
            .unwrap()
            .iter()
            .map(|e| {
                assert_eq!(&e.data[..], format!("e{}t{}", e.index, e.term).as_bytes());
                (e.index, e.term)
            })
            .collect()
    } else {
        vec![]
    };
    let hs = l.hard_state();
    State {
        snap_index: snap.index,
        snap_term: snap.term,
        entries,
        hs: (hs.term, hs.commit),
    }
}

fn opts() -> LogOptions {
    LogOptions {
        segment_bytes_max: 150,
        fsync: FsyncPolicy::Always,
    }
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let disk = MemDisk::new();
    let mut log = DiskLog::open(disk.clone(), opts()).unwrap();
    let mut durable = State {
        snap_index: 0,
        snap_term: 0,
        entries: vec![],
        hs: (0, 0),
    };
    let mut current = durable.clone();
    let mut unsynced: Vec<Rec> = vec![];
    let mut term = 1u64;
    for op in ops {
        match op {
            Op::Append { back, n, new_term } => {
                if new_term {
                    term += 1;
                }
                let floor = current.hs.1.max(current.snap_index) + 1;
                let start = (current.last() + 1).saturating_sub(back).max(floor);
                let es: Vec<Entry> = (start..start + n).map(|i| entry(i, term)).collect();
                log.append(&es).unwrap();
                for e in &es {
                    let r = Rec::Entry(e.index, e.term);
                    current.apply(&r);
                    unsynced.push(r);
                }
            }
            Op::Commit { by } => {
                let commit = (current.hs.1 + by).min(durable.last()).min(current.last());
                if commit <= current.hs.1 {
                    continue;
                }
                let hs = HardState {
                    term,
                    commit,
                    ..Default::default()
                };
                log.set_hard_state(&hs).unwrap();
                let r = Rec::Hs(term, commit);
                current.apply(&r);
                unsynced.push(r);
            }
            Op::Sync => {
                log.sync().unwrap();
                durable = current.clone();
                unsynced.clear();
            }
            Op::Compact { at } => {
                let lo = current.snap_index + 1;
                let hi = current.hs.1;
                if hi < lo {
                    continue;
                }
                let idx = lo + at % (hi - lo + 1);
                let t = current.term_at(idx);
                log.compact(make_snapshot(idx, t, ConfState::default(), vec![1, 2]))
                    .unwrap();
                current.entries.retain(|e| e.0 > idx);
                current.snap_index = idx;
                current.snap_term = t;
                durable = current.clone();
                unsynced.clear();
            }
            Op::LeaderSnapshot { ahead } => {
                term += 1;
                let idx = current.last().max(current.hs.1) + ahead + 1;
                log.apply_snapshot(make_snapshot(idx, term, ConfState::default(), vec![3]))
                    .unwrap();
                current.entries.clear();
                current.snap_index = idx;
                current.snap_term = term;
                current.hs = (current.hs.0.max(term), current.hs.1.max(idx));
                durable = current.clone();
                unsynced.clear();
            }
            Op::Crash { torn, seed } => {
                drop(log);
                disk.crash(if torn {
                    Crash::Torn { seed }
                } else {
                    Crash::LoseUnsynced
                });
                log = DiskLog::open(disk.clone(), opts()).unwrap();
                let got = observe(&log);
                let mut candidate = durable.clone();
                let mut ok = got == candidate;
                let allowed = if torn { unsynced.len() } else { 0 };
                for r in unsynced.iter().take(allowed) {
                    if ok {
                        break;
                    }
                    candidate.apply(r);
                    ok = got == candidate;
                }
                prop_assert!(
                    ok,
                    "recovered {got:?}\n durable {durable:?}\n unsynced {unsynced:?}"
                );
                durable = got.clone();
                current = got;
                unsynced.clear();
            }
        }
    }
    // A clean reopen after a final sync sees exactly the current state.
    log.sync().unwrap();
    drop(log);
    let log = DiskLog::open(disk, opts()).unwrap();
    prop_assert_eq!(observe(&log), current);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]
    #[test]
    fn recovery_matches_the_model(ops in proptest::collection::vec(op(), 1..80)) {
        run(ops)?;
    }
}
