use super::*;
use crate::disk::{Crash, MemDisk};

fn ent(index: u64, term: u64) -> Entry {
    Entry {
        index,
        term,
        data: vec![index as u8; 3].into(),
        ..Default::default()
    }
}

fn small() -> LogOptions {
    LogOptions {
        segment_bytes_max: 128,
        fsync: FsyncPolicy::Always,
    }
}

fn indexes<D: Disk>(l: &DiskLog<D>) -> Vec<(u64, u64)> {
    l.entries.iter().map(|e| (e.index, e.term)).collect()
}

#[test]
fn synced_entries_survive_a_crash_and_unsynced_ones_do_not() {
    let disk = MemDisk::new();
    let mut l = DiskLog::open(disk.clone(), small()).unwrap();
    l.append(&[ent(1, 1), ent(2, 1)]).unwrap();
    let hs = HardState {
        term: 1,
        commit: 2,
        ..Default::default()
    };
    l.set_hard_state(&hs).unwrap();
    l.sync().unwrap();
    l.append(&[ent(3, 1)]).unwrap();
    drop(l);
    disk.crash(Crash::LoseUnsynced);
    let l = DiskLog::open(disk, small()).unwrap();
    assert_eq!(indexes(&l), vec![(1, 1), (2, 1)]);
    assert_eq!(l.hard_state(), hs);
}

#[test]
fn torn_tail_is_cut_and_reported() {
    let disk = MemDisk::new();
    let mut l = DiskLog::open(disk.clone(), small()).unwrap();
    l.append(&[ent(1, 1)]).unwrap();
    l.sync().unwrap();
    l.append(&[ent(2, 1)]).unwrap();
    drop(l);
    // Keep all but the last byte of the unsynced record.
    let (name, len) = disk
        .files()
        .into_iter()
        .find(|(n, _)| n.starts_with("wal-"))
        .unwrap();
    let mut d = disk.clone();
    d.truncate(&name, len as u64 - 1).unwrap();
    let l = DiskLog::open(disk.clone(), small()).unwrap();
    assert_eq!(indexes(&l), vec![(1, 1)]);
    assert!(l.recovery().torn_bytes > 0);
    // Appending after recovery continues cleanly.
    let mut l = l;
    l.append(&[ent(2, 2)]).unwrap();
    l.sync().unwrap();
    drop(l);
    let l = DiskLog::open(disk, small()).unwrap();
    assert_eq!(indexes(&l), vec![(1, 1), (2, 2)]);
}

#[test]
fn corrupted_middle_record_is_refused() {
    let disk = MemDisk::new();
    let mut l = DiskLog::open(disk.clone(), LogOptions::default()).unwrap();
    l.append(&[ent(1, 1), ent(2, 1), ent(3, 1)]).unwrap();
    l.sync().unwrap();
    drop(l);
    let name = segment_name(1);
    // The hard-state record opens the segment; byte 40 falls inside entry 1.
    assert!(disk.corrupt(&name, 40));
    match DiskLog::open(disk, LogOptions::default()) {
        Err(Error::Corrupt { file, .. }) => assert_eq!(file, name),
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("corruption accepted"),
    }
}

#[test]
fn compaction_drops_covered_segments_and_keeps_the_rest() {
    let disk = MemDisk::new();
    let mut l = DiskLog::open(disk.clone(), small()).unwrap();
    for i in 1..=40 {
        l.append(&[ent(i, 1)]).unwrap();
        l.sync().unwrap();
    }
    let before = disk.files().len();
    let conf = ConfState {
        voters: vec![1, 2, 3],
        ..Default::default()
    };
    l.compact(make_snapshot(30, 1, conf.clone(), b"state".to_vec()))
        .unwrap();
    assert!(disk.files().len() < before);
    assert_eq!(l.first_index().unwrap(), 31);
    assert_eq!(l.term(30).unwrap(), 1);
    assert!(l.term(29).is_err());
    drop(l);
    let l = DiskLog::open(disk, small()).unwrap();
    assert_eq!(l.first_index().unwrap(), 31);
    assert_eq!(l.last_index().unwrap(), 40);
    assert_eq!(l.initial_state().unwrap().conf_state, conf);
    assert_eq!(&l.latest_snapshot().data[..], b"state");
}

#[test]
fn leader_snapshot_replaces_the_log() {
    let disk = MemDisk::new();
    let mut l = DiskLog::open(disk.clone(), small()).unwrap();
    l.append(&[ent(1, 1), ent(2, 1), ent(3, 1)]).unwrap();
    l.sync().unwrap();
    l.apply_snapshot(make_snapshot(10, 3, ConfState::default(), vec![]))
        .unwrap();
    assert_eq!(l.last_index().unwrap(), 10);
    drop(l);
    let l = DiskLog::open(disk, small()).unwrap();
    assert_eq!(l.first_index().unwrap(), 11);
    assert_eq!(l.last_index().unwrap(), 10);
    assert_eq!(l.hard_state().commit, 10);
}

/// A disk whose next segment creation fails once armed: a crash at that point.
struct FailingCreate {
    inner: MemDisk,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Disk for FailingCreate {
    fn list(&self) -> std::io::Result<Vec<String>> {
        self.inner.list()
    }
    fn read(&self, name: &str) -> std::io::Result<Vec<u8>> {
        self.inner.read(name)
    }
    fn create(&mut self, name: &str) -> std::io::Result<()> {
        if name.starts_with("wal-") && self.armed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(std::io::Error::other("power lost"));
        }
        self.inner.create(name)
    }
    fn append(&mut self, name: &str, data: &[u8]) -> std::io::Result<()> {
        self.inner.append(name, data)
    }
    fn sync(&mut self, name: &str) -> std::io::Result<()> {
        self.inner.sync(name)
    }
    fn truncate(&mut self, name: &str, len: u64) -> std::io::Result<()> {
        self.inner.truncate(name, len)
    }
    fn rename(&mut self, from: &str, to: &str) -> std::io::Result<()> {
        self.inner.rename(from, to)
    }
    fn remove(&mut self, name: &str) -> std::io::Result<()> {
        self.inner.remove(name)
    }
}

#[test]
fn crash_while_installing_leader_snapshot_does_not_resurrect_the_old_log() {
    let disk = MemDisk::new();
    let armed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let fd = FailingCreate {
        inner: disk.clone(),
        armed: armed.clone(),
    };
    let mut l = DiskLog::open(fd, LogOptions::default()).unwrap();
    let batch: Vec<Entry> = (1..=5).map(|i| ent(i, 1)).collect();
    l.append(&batch).unwrap();
    let hs = HardState {
        term: 2,
        vote: 3,
        commit: 2,
        ..Default::default()
    };
    l.set_hard_state(&hs).unwrap();
    l.sync().unwrap();
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    // The leader's snapshot at 3 (term 2) conflicts with our entries 3..5 at term 1.
    assert!(l
        .apply_snapshot(make_snapshot(3, 2, ConfState::default(), vec![]))
        .is_err());
    drop(l);
    disk.crash(Crash::LoseUnsynced);
    let mut l = DiskLog::open(disk.clone(), LogOptions::default()).unwrap();
    assert_eq!(l.last_index().unwrap(), 3, "entries 4 and 5 stay void");
    assert_eq!(l.hard_state().vote, 3, "the vote survives");
    assert_eq!(l.hard_state().commit, 3);
    // A later compaction snapshot carries no marker; the old log must still stay gone.
    l.append(&[ent(4, 2)]).unwrap();
    l.sync().unwrap();
    l.compact(make_snapshot(4, 2, ConfState::default(), vec![]))
        .unwrap();
    drop(l);
    let l = DiskLog::open(disk, LogOptions::default()).unwrap();
    assert_eq!(l.last_index().unwrap(), 4);
    assert_eq!(l.term(4).unwrap(), 2);
}

#[test]
fn real_files_recover_from_a_torn_tail() {
    use crate::disk::FsDisk;
    let dir = std::env::temp_dir().join(format!("starling-raft-wal-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut l = DiskLog::open(FsDisk::open(&dir).unwrap(), small()).unwrap();
    l.append(&[ent(1, 1), ent(2, 1)]).unwrap();
    l.sync().unwrap();
    l.append(&[ent(3, 1)]).unwrap();
    drop(l);
    // The last record lost its final bytes, as after a power cut mid-write.
    let seg = dir.join(segment_name(1));
    let len = std::fs::metadata(&seg).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .unwrap()
        .set_len(len - 3)
        .unwrap();
    let l = DiskLog::open(FsDisk::open(&dir).unwrap(), small()).unwrap();
    assert_eq!(indexes(&l), vec![(1, 1), (2, 1)]);
    assert!(l.recovery().torn_bytes > 0);
    drop(l);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn overwritten_suffix_does_not_return_after_compaction() {
    let disk = MemDisk::new();
    let mut l = DiskLog::open(disk.clone(), small()).unwrap();
    let batch: Vec<Entry> = (1..=10).map(|i| ent(i, 1)).collect();
    l.append(&batch).unwrap();
    l.sync().unwrap();
    l.append(&[ent(5, 2), ent(6, 2)]).unwrap();
    l.sync().unwrap();
    l.compact(make_snapshot(6, 2, ConfState::default(), vec![]))
        .unwrap();
    drop(l);
    let l = DiskLog::open(disk, small()).unwrap();
    assert_eq!(l.last_index().unwrap(), 6);
}

#[test]
fn begin_sync_makes_earlier_writes_durable_only_once_its_job_ran() {
    let disk = MemDisk::new();
    let mut l = DiskLog::open(disk.clone(), small()).unwrap();
    l.append(&[ent(1, 1)]).unwrap();
    let job = l.begin_sync().unwrap().expect("a write to sync");
    assert!(l.begin_sync().unwrap().is_none(), "nothing new since");
    l.append(&[ent(2, 1)]).unwrap();
    job.run().unwrap();
    drop(l);
    disk.crash(Crash::LoseUnsynced);
    let l = DiskLog::open(disk.clone(), small()).unwrap();
    assert_eq!(
        indexes(&l),
        vec![(1, 1)],
        "entry 2 came after the sync began"
    );

    let mut l = l;
    l.append(&[ent(2, 2)]).unwrap();
    let job = l.begin_sync().unwrap().expect("a write to sync");
    drop(l);
    // Power lost while the job waited: it never ran.
    disk.crash(Crash::LoseUnsynced);
    drop(job);
    let l = DiskLog::open(disk, small()).unwrap();
    assert_eq!(indexes(&l), vec![(1, 1)]);
}
