//! The file-system seam under the log: a flat directory of named files.
//!
//! [`FsDisk`] is the real one (std::fs). [`MemDisk`] keeps every file in memory with its
//! synced and unsynced bytes apart, so that a simulation can `crash()` it: unsynced bytes
//! are lost, or a prefix of them survives (a torn write). madsim has no power-failure model;
//! this is ours.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// The waiting half of a sync started with [`Disk::sync_later`]: it may run on any thread.
pub type SyncWait = Box<dyn FnOnce() -> io::Result<()> + Send>;

/// A directory of files, as the log needs it.
///
/// Contract: `append` may be lost on a crash until `sync` of that file returns. `create`,
/// `rename`, `remove` and `truncate` are durable when they return (the real implementation
/// syncs the directory). `rename` is atomic.
pub trait Disk: Send + 'static {
    /// Names of the files present, in any order.
    fn list(&self) -> io::Result<Vec<String>>;
    /// The whole content of a file.
    fn read(&self, name: &str) -> io::Result<Vec<u8>>;
    /// Creates an empty file, replacing any file of that name.
    fn create(&mut self, name: &str) -> io::Result<()>;
    /// Appends bytes to an existing file.
    fn append(&mut self, name: &str, data: &[u8]) -> io::Result<()>;
    /// Makes every byte appended to the file so far durable.
    fn sync(&mut self, name: &str) -> io::Result<()>;
    /// A `sync` whose wait runs elsewhere, so that the log's owner keeps working during the
    /// fsync: once the returned wait returns `Ok`, every byte appended to the file before
    /// this call is durable (later ones may or may not be). `None`: they already are, there
    /// is nothing to wait for. The default syncs at once: correct, but it blocks the caller.
    fn sync_later(&mut self, name: &str) -> io::Result<Option<SyncWait>> {
        self.sync(name)?;
        Ok(None)
    }
    /// Cuts a file to `len` bytes.
    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()>;
    /// Atomically replaces `to` with `from`.
    fn rename(&mut self, from: &str, to: &str) -> io::Result<()>;
    /// Deletes a file; deleting a missing file is not an error.
    fn remove(&mut self, name: &str) -> io::Result<()>;
}

/// Files in one directory of the real file system.
pub struct FsDisk {
    dir: PathBuf,
    /// Open append handles, so that a group of appends costs no extra open.
    open: HashMap<String, File>,
}

impl FsDisk {
    /// Uses `dir`, creating it if needed.
    pub fn open(dir: impl Into<PathBuf>) -> io::Result<Self> {
        let dir = dir.into();
        fs::create_dir_all(&dir)?;
        Ok(FsDisk {
            dir,
            open: HashMap::new(),
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn sync_dir(&self) -> io::Result<()> {
        // A new, renamed or removed name is durable only once its directory is synced.
        File::open(&self.dir)?.sync_all()
    }

    fn handle(&mut self, name: &str) -> io::Result<&mut File> {
        if !self.open.contains_key(name) {
            let f = OpenOptions::new().append(true).open(self.path(name))?;
            self.open.insert(name.to_string(), f);
        }
        // Inserted just above when missing.
        Ok(self.open.get_mut(name).expect("handle present"))
    }
}

impl Disk for FsDisk {
    fn list(&self) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for e in fs::read_dir(&self.dir)? {
            let e = e?;
            if e.file_type()?.is_file() {
                if let Ok(n) = e.file_name().into_string() {
                    out.push(n);
                }
            }
        }
        Ok(out)
    }

    fn read(&self, name: &str) -> io::Result<Vec<u8>> {
        fs::read(self.path(name))
    }

    fn create(&mut self, name: &str) -> io::Result<()> {
        self.open.remove(name);
        File::create(self.path(name))?;
        self.sync_dir()
    }

    fn append(&mut self, name: &str, data: &[u8]) -> io::Result<()> {
        self.handle(name)?.write_all(data)
    }

    fn sync(&mut self, name: &str) -> io::Result<()> {
        self.handle(name)?.sync_data()
    }

    fn sync_later(&mut self, name: &str) -> io::Result<Option<SyncWait>> {
        // A second descriptor of the same open file: fsync through it flushes what was
        // written through the first, while the first keeps taking appends.
        let f = self.handle(name)?.try_clone()?;
        Ok(Some(Box::new(move || f.sync_data())))
    }

    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        self.open.remove(name);
        let f = OpenOptions::new().write(true).open(self.path(name))?;
        f.set_len(len)?;
        f.sync_all()
    }

    fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        self.open.remove(from);
        self.open.remove(to);
        fs::rename(self.path(from), self.path(to))?;
        self.sync_dir()
    }

    fn remove(&mut self, name: &str) -> io::Result<()> {
        self.open.remove(name);
        match fs::remove_file(self.path(name)) {
            Ok(()) => self.sync_dir(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[derive(Clone, Default, Debug)]
struct MemFile {
    /// Everything written, as a reader sees it.
    data: Vec<u8>,
    /// How many leading bytes of `data` survive a crash.
    synced: usize,
    /// Renewed whenever `data` may no longer extend what a pending [`Disk::sync_later`]
    /// saw (create, truncate, crash): such a sync then makes nothing durable.
    epoch: u64,
}

/// How a [`MemDisk`] crash treats bytes that were written but not synced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Crash {
    /// Every unsynced byte is lost.
    LoseUnsynced,
    /// Of each file's unsynced bytes a prefix survives, its length drawn from the seed: the
    /// last record written before the crash may be cut anywhere (a torn write).
    Torn { seed: u64 },
}

/// An in-memory disk with crash semantics, for tests and simulation.
///
/// Clones share the same files: the simulated machine keeps its disk across a node's kill and
/// restart, as hardware does. This is a model of a device, not state shared between actors.
///
/// A [`Disk::sync_later`] makes bytes durable only when its wait runs (on the driver's
/// storage thread, or a simulated task), as a real fsync: a crash before then loses them.
/// [`MemDisk::with_instant_sync`] models a device whose sync takes no time instead.
#[derive(Clone, Default)]
pub struct MemDisk {
    files: Arc<Mutex<BTreeMap<String, MemFile>>>,
    epochs: Arc<AtomicU64>,
    instant_sync: bool,
}

impl MemDisk {
    pub fn new() -> Self {
        Self::default()
    }

    /// `sync_later` syncs at once and leaves nothing to wait for: no hand-off to a storage
    /// thread, so that a benchmark without a disk measures raft and the driver alone.
    pub fn with_instant_sync(mut self) -> Self {
        self.instant_sync = true;
        self
    }

    fn next_epoch(&self) -> u64 {
        self.epochs.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, MemFile>> {
        // No code path panics while holding the lock with the map half-changed.
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Simulates a power loss: unsynced bytes are dropped or torn, as `mode` says.
    pub fn crash(&self, mode: Crash) {
        let mut files = self.lock();
        let epoch = self.next_epoch();
        let mut state = match mode {
            Crash::LoseUnsynced => 0,
            Crash::Torn { seed } => seed | 1,
        };
        for f in files.values_mut() {
            let unsynced = f.data.len() - f.synced;
            let keep = if state == 0 || unsynced == 0 {
                0
            } else {
                // xorshift64: a tiny deterministic generator, enough to pick cut points.
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state % (unsynced as u64 + 1)) as usize
            };
            f.data.truncate(f.synced + keep);
            f.synced = f.data.len();
            // A sync started before the power loss never finished.
            f.epoch = epoch;
        }
    }

    /// Flips one byte of a file (tests of corruption detection). False if out of range.
    pub fn corrupt(&self, name: &str, offset: usize) -> bool {
        let mut files = self.lock();
        match files.get_mut(name).and_then(|f| f.data.get_mut(offset)) {
            Some(b) => {
                *b ^= 0x5a;
                true
            }
            None => false,
        }
    }

    /// An independent copy of the current files (a checker inspects a copy so that its
    /// recovery cannot change the disk of a running node).
    pub fn fork(&self) -> MemDisk {
        MemDisk {
            files: Arc::new(Mutex::new(self.lock().clone())),
            epochs: Arc::new(AtomicU64::new(self.epochs.load(Ordering::Relaxed))),
            instant_sync: self.instant_sync,
        }
    }

    /// Bytes written but not yet synced, over all files.
    pub fn unsynced_bytes(&self) -> usize {
        self.lock().values().map(|f| f.data.len() - f.synced).sum()
    }

    /// Names and sizes of the files (for tests and diagnostics).
    pub fn files(&self) -> Vec<(String, usize)> {
        self.lock()
            .iter()
            .map(|(n, f)| (n.clone(), f.data.len()))
            .collect()
    }
}

fn not_found(name: &str) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("no file {name}"))
}

impl Disk for MemDisk {
    fn list(&self) -> io::Result<Vec<String>> {
        Ok(self.lock().keys().cloned().collect())
    }

    fn read(&self, name: &str) -> io::Result<Vec<u8>> {
        self.lock()
            .get(name)
            .map(|f| f.data.clone())
            .ok_or_else(|| not_found(name))
    }

    fn create(&mut self, name: &str) -> io::Result<()> {
        let epoch = self.next_epoch();
        self.lock().insert(
            name.to_string(),
            MemFile {
                epoch,
                ..MemFile::default()
            },
        );
        Ok(())
    }

    fn append(&mut self, name: &str, data: &[u8]) -> io::Result<()> {
        let mut files = self.lock();
        let f = files.get_mut(name).ok_or_else(|| not_found(name))?;
        f.data.extend_from_slice(data);
        Ok(())
    }

    fn sync(&mut self, name: &str) -> io::Result<()> {
        let mut files = self.lock();
        let f = files.get_mut(name).ok_or_else(|| not_found(name))?;
        f.synced = f.data.len();
        Ok(())
    }

    fn sync_later(&mut self, name: &str) -> io::Result<Option<SyncWait>> {
        if self.instant_sync {
            self.sync(name)?;
            return Ok(None);
        }
        let (epoch, mark) = {
            let files = self.lock();
            let f = files.get(name).ok_or_else(|| not_found(name))?;
            (f.epoch, f.data.len())
        };
        // Durable only when the wait runs, as a real fsync: a crash before it loses the bytes.
        let disk = self.clone();
        let name = name.to_string();
        Ok(Some(Box::new(move || {
            let mut files = disk.lock();
            if let Some(f) = files.get_mut(&name).filter(|f| f.epoch == epoch) {
                f.synced = f.synced.max(mark.min(f.data.len()));
            }
            Ok(())
        })))
    }

    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        let mut files = self.lock();
        let f = files.get_mut(name).ok_or_else(|| not_found(name))?;
        let len = usize::try_from(len).unwrap_or(usize::MAX).min(f.data.len());
        f.data.truncate(len);
        f.synced = f.synced.min(len);
        f.epoch = self.next_epoch();
        Ok(())
    }

    fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        let mut files = self.lock();
        let f = files.remove(from).ok_or_else(|| not_found(from))?;
        files.insert(to.to_string(), f);
        Ok(())
    }

    fn remove(&mut self, name: &str) -> io::Result<()> {
        self.lock().remove(name);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_drops_unsynced_bytes() {
        let mut d = MemDisk::new();
        d.create("a").unwrap();
        d.append("a", b"hello").unwrap();
        d.sync("a").unwrap();
        d.append("a", b" world").unwrap();
        assert_eq!(d.unsynced_bytes(), 6);
        d.crash(Crash::LoseUnsynced);
        assert_eq!(d.read("a").unwrap(), b"hello");
    }

    #[test]
    fn torn_crash_keeps_a_prefix_of_unsynced_bytes() {
        for seed in 0..50 {
            let mut d = MemDisk::new();
            d.create("a").unwrap();
            d.append("a", b"ab").unwrap();
            d.sync("a").unwrap();
            d.append("a", b"cdefgh").unwrap();
            d.crash(Crash::Torn { seed });
            let got = d.read("a").unwrap();
            assert!(got.len() >= 2 && b"abcdefgh".starts_with(&got), "{got:?}");
        }
    }

    #[test]
    fn a_later_sync_covers_what_was_written_before_it_and_only_once_it_runs() {
        let mut d = MemDisk::new();
        d.create("a").unwrap();
        d.append("a", b"one").unwrap();
        let wait = d.sync_later("a").unwrap().expect("a wait");
        d.append("a", b"two").unwrap();
        assert_eq!(
            d.unsynced_bytes(),
            6,
            "nothing is durable before the wait runs"
        );
        wait().unwrap();
        assert_eq!(
            d.unsynced_bytes(),
            3,
            "bytes appended after the call are not covered"
        );
        // A sync still pending at a power loss makes nothing durable afterwards.
        let wait = d.sync_later("a").unwrap().expect("a wait");
        d.crash(Crash::LoseUnsynced);
        d.append("a", b"three").unwrap();
        wait().unwrap();
        assert_eq!(d.read("a").unwrap(), b"onethree");
        assert_eq!(d.unsynced_bytes(), 5);
        let mut d = d.with_instant_sync();
        assert!(d.sync_later("a").unwrap().is_none());
        assert_eq!(d.unsynced_bytes(), 0);
    }

    #[test]
    fn fs_disk_round_trip() {
        let dir = std::env::temp_dir().join(format!("starling-raft-disk-{}", std::process::id()));
        let mut d = FsDisk::open(&dir).unwrap();
        d.create("x").unwrap();
        d.append("x", b"12345").unwrap();
        d.sync("x").unwrap();
        d.append("x", b"6").unwrap();
        d.sync_later("x").unwrap().expect("a wait")().unwrap();
        d.truncate("x", 3).unwrap();
        d.rename("x", "y").unwrap();
        assert_eq!(d.read("y").unwrap(), b"123");
        assert!(d.list().unwrap().contains(&"y".to_string()));
        d.remove("y").unwrap();
        d.remove("y").unwrap();
        let _ = fs::remove_dir_all(dir);
    }
}
