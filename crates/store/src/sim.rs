//! `SimDisk`: an in-memory redb backend that loses power on demand, so that tests and the
//! simulator can check what survives a crash without a real file.

use std::sync::{Arc, Mutex, MutexGuard};

use redb::StorageBackend;

/// An in-memory disk that keeps the writes made since the last `sync_data` apart from the
/// synced image, and drops them when it [crashes](SimDisk::crash).
///
/// Handles are cheap clones of one shared disk. A crash starts a new epoch: the handle it
/// returns serves the next `Store::open`, while every handle of the old epoch (the one
/// inside the crashed store's database) fails all further I/O, as a dead process would
/// write nothing more.
#[derive(Debug, Clone)]
pub struct SimDisk {
    disk: Arc<Mutex<Disk>>,
    epoch: u64,
}

/// What a crash leaves of the writes made since the last sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TornWrite {
    /// Every one is lost.
    None,
    /// Every one is lost but the first `bytes` bytes of the last write: a disk that
    /// reorders writes and tore the one it was doing.
    Last { bytes: usize },
    /// The first `writes` reached the disk whole, then `bytes` bytes of the next one: a disk
    /// that writes in order and lost power partway.
    InOrder { writes: usize, bytes: usize },
}

/// I/O counts since the disk was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskStats {
    pub writes: u64,
    pub syncs: u64,
    pub crashes: u64,
    /// Writes made since the last sync.
    pub unsynced: usize,
}

#[derive(Debug)]
enum Change {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Default)]
struct Disk {
    epoch: u64,
    /// What survives a crash.
    durable: Vec<u8>,
    /// What reads see: `durable` with `unsynced` applied.
    current: Vec<u8>,
    unsynced: Vec<Change>,
    /// Writes that still land before the power goes; `None`: no cut planned.
    writes_left: Option<u64>,
    stats: DiskStats,
}

impl Default for SimDisk {
    fn default() -> Self {
        SimDisk::new()
    }
}

impl SimDisk {
    /// An empty disk.
    pub fn new() -> SimDisk {
        SimDisk {
            disk: Arc::default(),
            epoch: 0,
        }
    }

    /// Loses power: the writes made since the last sync are dropped, but for what `torn`
    /// keeps. Returns the handle to reopen the disk with; this handle and its clones fail
    /// every call from now on.
    pub fn crash(&self, torn: TornWrite) -> SimDisk {
        let mut disk = self.lock();
        let unsynced = std::mem::take(&mut disk.unsynced);
        let mut image = std::mem::take(&mut disk.durable);
        match torn {
            TornWrite::None => {}
            TornWrite::Last { bytes } => {
                let last = unsynced.iter().rev().find_map(|c| match c {
                    Change::Write { offset, data } => Some((*offset, data)),
                    Change::SetLen(_) => None,
                });
                if let Some((offset, data)) = last {
                    write_at(&mut image, offset, &data[..bytes.min(data.len())]);
                }
            }
            TornWrite::InOrder { writes, bytes } => {
                for change in unsynced.iter().take(writes) {
                    apply(&mut image, change);
                }
                if let Some(Change::Write { offset, data }) = unsynced.get(writes) {
                    write_at(&mut image, *offset, &data[..bytes.min(data.len())]);
                }
            }
        }
        disk.current = image.clone();
        disk.durable = image;
        disk.epoch += 1;
        disk.writes_left = None;
        disk.stats.crashes += 1;
        SimDisk {
            disk: Arc::clone(&self.disk),
            epoch: disk.epoch,
        }
    }

    /// Plans a power cut: the next `writes` writes land (unsynced), and from then on every
    /// write, `set_len` and `sync_data` fails until [`SimDisk::crash`].
    pub fn cut_power_after(&self, writes: u64) {
        self.lock().writes_left = Some(writes);
    }

    /// I/O counts so far.
    pub fn stats(&self) -> DiskStats {
        let disk = self.lock();
        DiskStats {
            unsynced: disk.unsynced.len(),
            ..disk.stats
        }
    }

    fn lock(&self) -> MutexGuard<'_, Disk> {
        // A panic while holding the lock leaves the disk as consistent as any step of it:
        // every method changes it in one go.
        self.disk.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The disk, if this handle's process is still alive.
    fn live(&self) -> std::io::Result<MutexGuard<'_, Disk>> {
        let disk = self.lock();
        if disk.epoch == self.epoch {
            Ok(disk)
        } else {
            Err(std::io::Error::other(
                "simulated crash: this handle's process is gone",
            ))
        }
    }

    /// The disk, if it still takes writes.
    fn powered(&self) -> std::io::Result<MutexGuard<'_, Disk>> {
        let disk = self.live()?;
        if disk.writes_left == Some(0) {
            return Err(std::io::Error::other("simulated power cut"));
        }
        Ok(disk)
    }
}

fn write_at(image: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let start = usize::try_from(offset).expect("a simulated disk fits in memory");
    let end = start + data.len();
    if image.len() < end {
        // A real file grows on a write past its end, too.
        image.resize(end, 0);
    }
    image[start..end].copy_from_slice(data);
}

fn apply(image: &mut Vec<u8>, change: &Change) {
    match change {
        Change::Write { offset, data } => write_at(image, *offset, data),
        Change::SetLen(len) => image.resize(
            usize::try_from(*len).expect("a simulated disk fits in memory"),
            0,
        ),
    }
}

impl StorageBackend for SimDisk {
    fn len(&self) -> Result<u64, std::io::Error> {
        Ok(self.live()?.current.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        let disk = self.live()?;
        let start = usize::try_from(offset).map_err(std::io::Error::other)?;
        let Some(src) = disk.current.get(start..start.saturating_add(out.len())) else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "read past the end of the simulated disk",
            ));
        };
        out.copy_from_slice(src);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        let mut disk = self.powered()?;
        let change = Change::SetLen(len);
        apply(&mut disk.current, &change);
        disk.unsynced.push(change);
        Ok(())
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        let mut disk = self.powered()?;
        let unsynced = std::mem::take(&mut disk.unsynced);
        for change in &unsynced {
            apply(&mut disk.durable, change);
        }
        debug_assert_eq!(disk.durable, disk.current);
        disk.stats.syncs += 1;
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        let mut disk = self.powered()?;
        if let Some(left) = disk.writes_left.as_mut() {
            *left -= 1;
        }
        let change = Change::Write {
            offset,
            data: data.to_vec(),
        };
        apply(&mut disk.current, &change);
        disk.unsynced.push(change);
        disk.stats.writes += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(disk: &SimDisk, offset: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0; len];
        disk.read(offset, &mut out).unwrap();
        out
    }

    #[test]
    fn a_crash_keeps_synced_writes_and_drops_the_rest() {
        let disk = SimDisk::new();
        disk.set_len(4).unwrap();
        disk.write(0, &[1, 1, 1, 1]).unwrap();
        disk.sync_data().unwrap();
        disk.write(0, &[2, 2]).unwrap();
        disk.set_len(8).unwrap();
        assert_eq!(read(&disk, 0, 4), [2, 2, 1, 1]);
        let disk2 = disk.crash(TornWrite::None);
        assert_eq!(disk2.len().unwrap(), 4);
        assert_eq!(read(&disk2, 0, 4), [1, 1, 1, 1]);
        assert!(disk.write(0, &[3]).is_err(), "the crashed handle is dead");
        assert!(disk.len().is_err());
    }

    #[test]
    fn torn_writes_keep_a_prefix() {
        let disk = SimDisk::new();
        disk.set_len(4).unwrap();
        disk.sync_data().unwrap();
        disk.write(0, &[1, 1, 1, 1]).unwrap();
        disk.write(2, &[2, 2]).unwrap();
        let last = disk.crash(TornWrite::Last { bytes: 1 });
        assert_eq!(read(&last, 0, 4), [0, 0, 2, 0]);
        last.write(0, &[1, 1, 1, 1]).unwrap();
        last.write(2, &[2, 2]).unwrap();
        let in_order = last.crash(TornWrite::InOrder {
            writes: 1,
            bytes: 1,
        });
        assert_eq!(read(&in_order, 0, 4), [1, 1, 2, 1]);
    }

    #[test]
    fn a_power_cut_fails_writes_and_syncs_after_the_planned_count() {
        let disk = SimDisk::new();
        disk.set_len(2).unwrap();
        disk.cut_power_after(1);
        disk.write(0, &[7]).unwrap();
        assert!(disk.write(1, &[7]).is_err());
        assert!(disk.sync_data().is_err());
        let disk2 = disk.crash(TornWrite::InOrder {
            writes: 2,
            bytes: 0,
        });
        assert_eq!(read(&disk2, 0, 2), [7, 0]);
        disk2.write(1, &[8]).unwrap();
        assert_eq!(disk2.stats().unsynced, 1);
    }
}
