//! Durable raft storage: a segmented write-ahead log of checksummed records, the hard state,
//! and snapshots with log compaction, behind the [`LogStore`] trait.
//!
//! Files in the [`Disk`] directory:
//! - `wal-<seq>.log`: segments. Each holds records `[len u32][crc32 u32][kind u8][payload]`
//!   (little endian; `len` counts kind and payload; the crc covers them). Kinds: an entry
//!   (`1`, protobuf `Entry`) or the hard state (`2`, protobuf `HardState`). An entry at index
//!   `i` replaces every entry at or after `i`, which is how raft truncates a log. Every new
//!   segment opens with the hard state, so the newest hard state is always in the last one.
//! - `snap-<index>.snap`: the newest snapshot, one record of kind `3`, and for a snapshot
//!   received from the leader a record of kind `4` naming the first segment whose entries
//!   follow it (older segments' entries were replaced; their hard states still count).
//!   Written to `snap.tmp`, synced, then renamed, so a snapshot file is whole or absent.
//!
//! Group commit: `append` and `set_hard_state` write records; `sync` makes them all durable
//! with one fsync, and `begin_sync` does the same with the fsync's wait handed out as a
//! [`SyncJob`], so that the driver keeps appending while a storage thread waits. Recovery cuts a torn tail (the last record of the last segment running off
//! the end of the file) and refuses a bad record anywhere else with [`Error::Corrupt`].

use std::collections::VecDeque;

use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, Storage, StorageError};

use crate::disk::{Disk, SyncWait};
use crate::error::{io_err, Error, Result};

const KIND_ENTRY: u8 = 1;
const KIND_HARD_STATE: u8 = 2;
const KIND_SNAPSHOT: u8 = 3;
/// In a snapshot file after the snapshot: `seq u64`, the first segment whose entries follow
/// it. Entries of older segments are void (a leader's snapshot replaced that log).
const KIND_LOG_FROM: u8 = 4;
const HEADER: usize = 8;
/// No record may claim more: a larger length is garbage, not data.
const RECORD_LEN_MAX: usize = 1 << 30;
const SNAP_TMP: &str = "snap.tmp";

/// When the log forces its writes to stable storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FsyncPolicy {
    /// fsync once per `sync` (once per raft `Ready`: group commit). Raft's safety assumes it.
    #[default]
    Always,
    /// Leave flushing to the OS. A machine crash can lose entries this node acknowledged, so
    /// a committed entry may be lost: for benchmarks and throwaway clusters only.
    Never,
}

/// Tunables of the log.
#[derive(Clone, Debug)]
pub struct LogOptions {
    /// A segment is sealed and a new one started once it holds this many bytes.
    pub segment_bytes_max: u64,
    pub fsync: FsyncPolicy,
}

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            segment_bytes_max: 64 << 20,
            fsync: FsyncPolicy::Always,
        }
    }
}

/// What recovery found and repaired.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Bytes cut from the end of the last segment (a torn last write).
    pub torn_bytes: u64,
    pub segments: usize,
    pub entries: usize,
}

/// Durable storage for one raft node: raft-rs reads it through [`Storage`], the driver
/// writes it through these methods, in the order of a `Ready`.
pub trait LogStore: Storage + Send + 'static {
    /// Writes entries (not yet durable). `entries[0].index` may be at most `last_index + 1`;
    /// entries at and after it are replaced.
    fn append(&mut self, entries: &[Entry]) -> Result<()>;
    /// Writes the hard state (not yet durable).
    fn set_hard_state(&mut self, hs: &HardState) -> Result<()>;
    /// Makes every write so far durable (one fsync, per the fsync policy).
    fn sync(&mut self) -> Result<()>;
    /// As `sync`, but the wait is handed out: once the returned job has run (on any thread),
    /// every write made before this call is durable. `None`: nothing is left to wait for.
    /// Writes made after the call need another one. The default syncs at once.
    fn begin_sync(&mut self) -> Result<Option<SyncJob>> {
        self.sync()?;
        Ok(None)
    }
    /// Installs a snapshot received from the leader: the log restarts after it. Durable on
    /// return.
    fn apply_snapshot(&mut self, snap: Snapshot) -> Result<()>;
    /// Records a snapshot of the local state machine at an applied index and drops the log
    /// up to it. Durable on return.
    fn compact(&mut self, snap: Snapshot) -> Result<()>;
    fn hard_state(&self) -> HardState;
    /// The newest snapshot (index 0 and empty if none).
    fn latest_snapshot(&self) -> &Snapshot;
    /// True if this store has never held a snapshot, an entry or a vote.
    fn is_fresh(&self) -> bool;
}

/// The wait of a [`LogStore::begin_sync`]: run it off the driver's turn, report the outcome.
pub struct SyncJob {
    file: String,
    wait: SyncWait,
}

impl SyncJob {
    /// Waits for the sync (blocks: an fsync).
    pub fn run(self) -> Result<()> {
        (self.wait)().map_err(io_err("sync", &self.file))
    }
}

impl std::fmt::Debug for SyncJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncJob").field("file", &self.file).finish()
    }
}

struct Segment {
    seq: u64,
    /// The highest entry index written into it (0: none).
    max_index: u64,
    bytes: u64,
}

fn segment_name(seq: u64) -> String {
    format!("wal-{seq:016x}.log")
}

fn snap_name(index: u64) -> String {
    format!("snap-{index:016x}.snap")
}

fn parse_hex(name: &str, prefix: &str, suffix: &str) -> Option<u64> {
    let mid = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
    u64::from_str_radix(mid, 16).ok()
}

fn frame(out: &mut Vec<u8>, kind: u8, payload: &[u8]) {
    let len = u32::try_from(payload.len() + 1).expect("record below 4 GiB");
    let mut h = crc32fast::Hasher::new();
    h.update(&[kind]);
    h.update(payload);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&h.finalize().to_le_bytes());
    out.push(kind);
    out.extend_from_slice(payload);
}

enum Parsed<'a> {
    Record {
        kind: u8,
        payload: &'a [u8],
        next: usize,
    },
    /// The record runs off the end of the data (or the rest is zeros): a torn write.
    Torn,
    Bad(&'static str),
}

fn parse(data: &[u8], off: usize) -> Parsed<'_> {
    let rest = &data[off..];
    if rest.len() < HEADER {
        return Parsed::Torn;
    }
    let len = u32::from_le_bytes(rest[0..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes"));
    let reaches_end = HEADER.saturating_add(len) >= rest.len();
    if len == 0 || len > RECORD_LEN_MAX {
        // A file extended by the OS but whose data never landed reads as zeros.
        if rest.iter().all(|b| *b == 0) {
            return Parsed::Torn;
        }
        return Parsed::Bad("impossible record length");
    }
    if HEADER + len > rest.len() {
        return Parsed::Torn;
    }
    let body = &rest[HEADER..HEADER + len];
    if crc32fast::hash(body) != crc {
        return if reaches_end {
            Parsed::Torn
        } else {
            Parsed::Bad("checksum mismatch")
        };
    }
    Parsed::Record {
        kind: body[0],
        payload: &body[1..],
        next: off + HEADER + len,
    }
}

fn decode<M: protobuf::Message>(what: &'static str, b: &[u8]) -> Result<M> {
    M::parse_from_bytes(b).map_err(|source| Error::Decode { what, source })
}

fn encode<M: protobuf::Message>(m: &M) -> Vec<u8> {
    // Encoding an in-memory protobuf message cannot fail (no required fields in eraftpb).
    m.write_to_bytes().expect("eraftpb messages always encode")
}

/// The segmented write-ahead log on a [`Disk`].
pub struct DiskLog<D: Disk> {
    disk: D,
    opts: LogOptions,
    snapshot: Snapshot,
    /// Entries from `snapshot.index + 1`, contiguous. Bounded by the snapshot threshold.
    entries: VecDeque<Entry>,
    hard_state: HardState,
    segments: Vec<Segment>,
    /// Records written since the last sync.
    dirty: bool,
    recovery: Recovery,
}

impl<D: Disk> DiskLog<D> {
    /// Opens the log on `disk`, recovering whatever it holds.
    pub fn open(mut disk: D, opts: LogOptions) -> Result<Self> {
        let names = disk.list().map_err(io_err("list", "."))?;
        let mut seqs: Vec<u64> = names
            .iter()
            .filter_map(|n| parse_hex(n, "wal-", ".log"))
            .collect();
        seqs.sort_unstable();
        let mut snaps: Vec<u64> = names
            .iter()
            .filter_map(|n| parse_hex(n, "snap-", ".snap"))
            .collect();
        snaps.sort_unstable();
        if names.iter().any(|n| n == SNAP_TMP) {
            // A snapshot whose write did not finish: the previous one still stands.
            disk.remove(SNAP_TMP).map_err(io_err("remove", SNAP_TMP))?;
        }

        let mut snapshot = Snapshot::default();
        let mut log_from = 0u64;
        if let Some(&newest) = snaps.last() {
            let name = snap_name(newest);
            let data = disk.read(&name).map_err(io_err("read", &name))?;
            // Renamed into place only after a sync: a bad snapshot file is corruption.
            match parse(&data, 0) {
                Parsed::Record {
                    kind: KIND_SNAPSHOT,
                    payload,
                    next,
                } => {
                    snapshot = decode("snapshot", payload)?;
                    if let Parsed::Record {
                        kind: KIND_LOG_FROM,
                        payload,
                        ..
                    } = parse(&data, next)
                    {
                        let b: [u8; 8] = payload.try_into().map_err(|_| Error::Corrupt {
                            file: name.clone(),
                            offset: next as u64,
                            reason: "bad log-from record",
                        })?;
                        log_from = u64::from_le_bytes(b);
                    }
                }
                Parsed::Record { .. } => {
                    return Err(Error::Corrupt {
                        file: name,
                        offset: 0,
                        reason: "not a snapshot record",
                    })
                }
                Parsed::Torn | Parsed::Bad(_) => {
                    return Err(Error::Corrupt {
                        file: name,
                        offset: 0,
                        reason: "snapshot record damaged",
                    })
                }
            }
            for &old in &snaps[..snaps.len() - 1] {
                let n = snap_name(old);
                disk.remove(&n).map_err(io_err("remove", &n))?;
            }
        }

        let snap_index = snapshot.get_metadata().index;
        let mut log = DiskLog {
            disk,
            opts,
            snapshot,
            entries: VecDeque::new(),
            hard_state: HardState::default(),
            segments: Vec::new(),
            dirty: false,
            recovery: Recovery::default(),
        };
        let count = seqs.len();
        for (i, seq) in seqs.into_iter().enumerate() {
            log.replay_segment(seq, i + 1 == count, snap_index, seq >= log_from)?;
        }
        log.recovery.segments = log.segments.len();
        log.recovery.entries = log.entries.len();

        // A snapshot is committed by definition.
        let snap_term = log.snapshot.get_metadata().term;
        if log.hard_state.commit < snap_index {
            log.hard_state.commit = snap_index;
        }
        if log.hard_state.term < snap_term {
            log.hard_state.term = snap_term;
        }
        let last = log.last();
        if log.hard_state.commit > last {
            return Err(Error::CommitBeyondLog {
                commit: log.hard_state.commit,
                last,
            });
        }
        // A crash between installing a leader's snapshot and switching segments: the new log
        // must start in a segment whose entries count, and the void ones can go (their hard
        // state lives on in the new segment).
        if log.segments.last().is_none_or(|a| a.seq < log_from) {
            log.start_segment(log_from.max(1))?;
        }
        // Delete them now: a later compaction snapshot no longer carries the marker.
        {
            let void: Vec<u64> = log
                .segments
                .iter()
                .map(|s| s.seq)
                .filter(|&q| q < log_from)
                .collect();
            for q in void {
                let n = segment_name(q);
                log.disk.remove(&n).map_err(io_err("remove", &n))?;
            }
            log.segments.retain(|s| s.seq >= log_from);
        }
        Ok(log)
    }

    fn replay_segment(
        &mut self,
        seq: u64,
        is_last: bool,
        snap_index: u64,
        entries_count: bool,
    ) -> Result<()> {
        let name = segment_name(seq);
        let data = self.disk.read(&name).map_err(io_err("read", &name))?;
        let mut seg = Segment {
            seq,
            max_index: 0,
            bytes: 0,
        };
        let mut off = 0usize;
        while off < data.len() {
            match parse(&data, off) {
                Parsed::Record {
                    kind,
                    payload,
                    next,
                } => {
                    match kind {
                        KIND_ENTRY => {
                            let e: Entry = decode("entry", payload)?;
                            if entries_count {
                                seg.max_index = seg.max_index.max(e.index);
                                self.replay_entry(e, snap_index, &name)?;
                            }
                        }
                        KIND_HARD_STATE => self.hard_state = decode("hard state", payload)?,
                        _ => {
                            return Err(Error::Corrupt {
                                file: name,
                                offset: off as u64,
                                reason: "unknown record kind",
                            })
                        }
                    }
                    off = next;
                }
                Parsed::Torn if is_last => {
                    let cut = (data.len() - off) as u64;
                    tracing::warn!(file = %name, offset = off, bytes = cut, "cutting torn log tail");
                    self.disk
                        .truncate(&name, off as u64)
                        .map_err(io_err("truncate", &name))?;
                    self.recovery.torn_bytes += cut;
                    break;
                }
                Parsed::Torn => {
                    return Err(Error::Corrupt {
                        file: name,
                        offset: off as u64,
                        reason: "sealed segment ends in a partial record",
                    })
                }
                Parsed::Bad(reason) => {
                    return Err(Error::Corrupt {
                        file: name,
                        offset: off as u64,
                        reason,
                    })
                }
            }
        }
        seg.bytes = off as u64;
        self.segments.push(seg);
        Ok(())
    }

    fn replay_entry(&mut self, e: Entry, snap_index: u64, file: &str) -> Result<()> {
        // An entry at index i replaces the log from i on, as `append` did when it was written.
        let keep = e.index.saturating_sub(snap_index + 1) as usize;
        self.entries.truncate(keep);
        if e.index <= snap_index {
            // Covered by the snapshot; it still cut the stale entries after it above.
            return Ok(());
        }
        let last = self.last();
        if e.index != last + 1 {
            return Err(Error::Gap {
                file: file.to_string(),
                index: e.index,
                last,
            });
        }
        self.entries.push_back(e);
        Ok(())
    }

    /// What recovery found when this log was opened.
    pub fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    /// The disk underneath (tests inspect it).
    pub fn disk(&self) -> &D {
        &self.disk
    }

    fn first(&self) -> u64 {
        self.snapshot.get_metadata().index + 1
    }

    fn last(&self) -> u64 {
        self.entries
            .back()
            .map(|e| e.index)
            .unwrap_or(self.snapshot.get_metadata().index)
    }

    fn active(&mut self) -> &mut Segment {
        // `open` leaves at least one segment and nothing removes the last one.
        self.segments.last_mut().expect("an active segment")
    }

    fn write(&mut self, buf: &[u8], max_index: u64) -> Result<()> {
        let seg = self.active();
        let name = segment_name(seg.seq);
        seg.bytes += buf.len() as u64;
        seg.max_index = seg.max_index.max(max_index);
        self.disk
            .append(&name, buf)
            .map_err(io_err("append", &name))?;
        self.dirty = true;
        Ok(())
    }

    fn sync_active(&mut self) -> Result<()> {
        let name = segment_name(self.active().seq);
        self.disk.sync(&name).map_err(io_err("sync", &name))?;
        self.dirty = false;
        Ok(())
    }

    /// Starts segment `seq` with the current hard state, durably.
    fn start_segment(&mut self, seq: u64) -> Result<()> {
        let name = segment_name(seq);
        self.disk.create(&name).map_err(io_err("create", &name))?;
        self.segments.push(Segment {
            seq,
            max_index: 0,
            bytes: 0,
        });
        let mut buf = Vec::new();
        frame(&mut buf, KIND_HARD_STATE, &encode(&self.hard_state));
        self.write(&buf, 0)?;
        self.sync_active()
    }

    fn roll(&mut self) -> Result<()> {
        // A sealed segment is always fully synced, whatever the fsync policy: recovery treats
        // damage in it as corruption.
        self.sync_active()?;
        let seq = self.active().seq + 1;
        self.start_segment(seq)
    }

    /// Writes the snapshot file durably and removes older ones.
    fn write_snapshot(&mut self, snap: &Snapshot, log_from: Option<u64>) -> Result<()> {
        let mut buf = Vec::new();
        frame(&mut buf, KIND_SNAPSHOT, &encode(snap));
        if let Some(seq) = log_from {
            frame(&mut buf, KIND_LOG_FROM, &seq.to_le_bytes());
        }
        let d = &mut self.disk;
        d.create(SNAP_TMP).map_err(io_err("create", SNAP_TMP))?;
        d.append(SNAP_TMP, &buf)
            .map_err(io_err("append", SNAP_TMP))?;
        d.sync(SNAP_TMP).map_err(io_err("sync", SNAP_TMP))?;
        let name = snap_name(snap.get_metadata().index);
        d.rename(SNAP_TMP, &name).map_err(io_err("rename", &name))?;
        let old = self.snapshot.get_metadata().index;
        if old != snap.get_metadata().index {
            let old_name = snap_name(old);
            if self
                .disk
                .list()
                .map_err(io_err("list", "."))?
                .contains(&old_name)
            {
                self.disk
                    .remove(&old_name)
                    .map_err(io_err("remove", &old_name))?;
            }
        }
        Ok(())
    }

    fn check_newer(&self, snap: &Snapshot) -> Result<()> {
        let current = self.snapshot.get_metadata().index;
        let offered = snap.get_metadata().index;
        if offered <= current && !(offered == current && current == 0) {
            return Err(Error::SnapshotOutOfDate { offered, current });
        }
        Ok(())
    }

    fn entry_at(&self, idx: u64) -> &Entry {
        &self.entries[(idx - self.first()) as usize]
    }
}

impl<D: Disk> LogStore for DiskLog<D> {
    fn append(&mut self, entries: &[Entry]) -> Result<()> {
        let Some(head) = entries.first() else {
            return Ok(());
        };
        let (first, last) = (self.first(), self.last());
        if head.index < first || head.index > last + 1 {
            return Err(Error::AppendOutOfRange {
                index: head.index,
                first,
                last,
            });
        }
        let mut buf = Vec::new();
        self.entries.truncate((head.index - first) as usize);
        for e in entries {
            assert_eq!(e.index, self.last() + 1, "appended entries are contiguous");
            frame(&mut buf, KIND_ENTRY, &encode(e));
            self.entries.push_back(e.clone());
        }
        self.write(&buf, self.last())
    }

    fn set_hard_state(&mut self, hs: &HardState) -> Result<()> {
        if *hs == self.hard_state {
            return Ok(());
        }
        self.hard_state = hs.clone();
        let mut buf = Vec::new();
        frame(&mut buf, KIND_HARD_STATE, &encode(hs));
        self.write(&buf, 0)
    }

    fn sync(&mut self) -> Result<()> {
        if self.dirty && self.opts.fsync == FsyncPolicy::Always {
            self.sync_active()?;
        }
        if self.active().bytes >= self.opts.segment_bytes_max {
            self.roll()?;
        }
        Ok(())
    }

    fn begin_sync(&mut self) -> Result<Option<SyncJob>> {
        if self.active().bytes >= self.opts.segment_bytes_max {
            // Sealing waits in the caller, once a segment: recovery takes damage in a sealed
            // segment for corruption, so it must be whole before the next one starts.
            self.roll()?;
            return Ok(None);
        }
        if !self.dirty || self.opts.fsync == FsyncPolicy::Never {
            return Ok(None);
        }
        let file = segment_name(self.active().seq);
        let wait = self.disk.sync_later(&file).map_err(io_err("sync", &file))?;
        // Covered by the job; what compaction drops (applied, so persisted) is already on
        // disk.
        self.dirty = false;
        Ok(wait.map(|wait| SyncJob { file, wait }))
    }

    fn apply_snapshot(&mut self, snap: Snapshot) -> Result<()> {
        self.check_newer(&snap)?;
        let (index, term) = (snap.get_metadata().index, snap.get_metadata().term);
        let next = self.active().seq + 1;
        // The snapshot names the segment the new log starts in, so that a crash before the
        // old segments are gone cannot bring their entries back after it.
        self.write_snapshot(&snap, Some(next))?;
        self.snapshot = snap;
        // The leader's snapshot replaces our whole log: nothing we held can be kept.
        self.entries.clear();
        self.hard_state.commit = self.hard_state.commit.max(index);
        self.hard_state.term = self.hard_state.term.max(term);
        // A fresh segment with the new hard state, then the old segments can go.
        self.start_segment(next)?;
        let old: Vec<u64> = self.segments[..self.segments.len() - 1]
            .iter()
            .map(|s| s.seq)
            .collect();
        for seq in old {
            let n = segment_name(seq);
            self.disk.remove(&n).map_err(io_err("remove", &n))?;
        }
        self.segments.drain(..self.segments.len() - 1);
        Ok(())
    }

    fn compact(&mut self, snap: Snapshot) -> Result<()> {
        self.check_newer(&snap)?;
        let index = snap.get_metadata().index;
        let last = self.last();
        if index > last {
            return Err(Error::AppendOutOfRange {
                index,
                first: self.first(),
                last,
            });
        }
        // The entries the snapshot covers must be durable before they may be dropped.
        if self.dirty {
            self.sync_active()?;
        }
        self.write_snapshot(&snap, None)?;
        let drop = (index + 1 - self.first()) as usize;
        self.entries.drain(..drop);
        self.snapshot = snap;
        // Drop sealed segments whose entries are all covered; the active one always stays
        // (it holds the newest hard state).
        while self.segments.len() > 1 && self.segments[0].max_index <= index {
            let n = segment_name(self.segments[0].seq);
            self.disk.remove(&n).map_err(io_err("remove", &n))?;
            self.segments.remove(0);
        }
        Ok(())
    }

    fn hard_state(&self) -> HardState {
        self.hard_state.clone()
    }

    fn latest_snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    fn is_fresh(&self) -> bool {
        self.snapshot.get_metadata().index == 0
            && self.entries.is_empty()
            && self.hard_state == HardState::default()
    }
}

impl<D: Disk> Storage for DiskLog<D> {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(
            self.hard_state.clone(),
            self.snapshot.get_metadata().get_conf_state().clone(),
        ))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low < self.first() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last() + 1 || low > high {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let max = max_size.into().unwrap_or(u64::MAX);
        let mut out = Vec::new();
        let mut size = 0u64;
        for i in low..high {
            let e = self.entry_at(i);
            size += u64::from(e.compute_size());
            // At least one entry, even past the limit, as the trait requires.
            if !out.is_empty() && size > max {
                break;
            }
            out.push(e.clone());
        }
        Ok(out)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        let meta = self.snapshot.get_metadata();
        if idx == meta.index {
            return Ok(meta.term);
        }
        if idx < self.first() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if idx > self.last() {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        Ok(self.entry_at(idx).term)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.first())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last())
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        if self.snapshot.get_metadata().index < request_index {
            // The driver takes a newer one at its next snapshot point; raft asks again.
            return Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        Ok(self.snapshot.clone())
    }
}

/// A snapshot carrying `data` at `index`/`term` with membership `conf`.
pub fn make_snapshot(index: u64, term: u64, conf: ConfState, data: Vec<u8>) -> Snapshot {
    let mut s = Snapshot {
        data: data.into(),
        ..Default::default()
    };
    let m = s.mut_metadata();
    m.index = index;
    m.term = term;
    m.set_conf_state(conf);
    s
}

#[cfg(test)]
mod tests;
