//! The store: open (with recovery), commit batches, usage, and the offline check.

use std::ops::Bound;
use std::path::{Path, PathBuf};

use redb::{BackendError, Builder, Database, Durability, ReadableDatabase, StorageBackend};

use crate::apply::Batch;
use crate::error::{At, Place, StoreError};
use crate::op::{Committed, Fsync, Limits, Op, Refused, Usage};
use crate::scan::{self, Recovered};
use crate::tables::{
    self, DELAYED, DELIVERIES, INBOUND, LINKS, META, MOVES, OUTBOX, RETAINED, SESSIONS,
};

/// Where a store lives.
#[derive(Debug)]
pub enum Location {
    /// A file, created (with its store) when missing or empty.
    File(PathBuf),
    /// A custom redb backend, such as the crashable `SimDisk` of the `testkit` feature.
    Backend(Box<dyn StorageBackend>),
}

/// Durable storage of persistent sessions, retained and delayed messages.
///
/// Synchronous and single-writer: one actor owns it, batches ops from many clients and
/// commits them together. It reads no clock and starts no thread.
#[derive(Debug)]
pub struct Store {
    db: Database,
    at: Place,
    limits: Limits,
    usage: Usage,
    next_delayed_id: u64,
}

/// What [`check`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckReport {
    pub path: PathBuf,
    pub format_version: u64,
    /// Counts and logical bytes of every table.
    pub usage: Usage,
}

fn builder() -> Builder {
    let mut b = Builder::new();
    // Verifies every page's checksum at open: redb documents that a plain open of a file
    // altered behind its back may panic, and that this check returns `Corrupted` instead.
    // The store reads every record at open anyway, so it costs little more.
    b.set_check_integrity_on_open(true);
    b
}

impl Store {
    /// Opens the store at `location`, creating it when the location is empty, and reads it
    /// back whole: redb first recovers from a crash (back to its last durable commit), then
    /// every record is decoded and every delivery and inbound packet identifier matched to
    /// its session. Usage is recounted from the records, so nothing but the records is kept.
    ///
    /// Errors name the location and, for a record, its table and key.
    pub fn open(location: Location, limits: Limits) -> Result<(Store, Recovered), StoreError> {
        let (db, at) = match location {
            Location::File(path) => {
                let at = Place::File(path.clone());
                match builder().create(&path) {
                    Ok(db) => (db, at),
                    Err(source) => return Err(StoreError::Open { at, source }),
                }
            }
            Location::Backend(backend) => match builder().create_with_backend(Boxed(backend)) {
                Ok(db) => (db, Place::Backend),
                Err(source) => {
                    let at = Place::Backend;
                    return Err(StoreError::Open { at, source });
                }
            },
        };
        init(&db, &at)?;
        let scan = scan::scan(&db, &at)?;
        let next_delayed_id = scan.recovered.next_delayed_id;
        let store = Store {
            db,
            at,
            limits,
            usage: scan.usage,
            next_delayed_id,
        };
        Ok((store, scan.recovered))
    }

    /// Applies `ops` in order in one transaction and commits it.
    ///
    /// Deletes always apply. An op that admits new data (a new session, delivery, retained
    /// or delayed message, or a retained or delayed message that grows) past
    /// [`Limits::max_bytes`] is refused alone and listed in [`Committed::refused`], as are
    /// deliveries and inbound identifiers of a client with no stored session; the other ops
    /// apply. Updates of admitted data (a session's meta, a delivery's stage, an inbound
    /// identifier) always apply, so usage may pass the cap by their growth.
    ///
    /// An empty batch with [`Fsync::Always`] makes the earlier [`Fsync::Never`] commits
    /// durable. On `Err` nothing of the batch applied; after an I/O error redb refuses
    /// further writes, and the store must be reopened.
    pub fn commit(&mut self, ops: &[Op], fsync: Fsync) -> Result<Committed, StoreError> {
        let at = &self.at;
        let mut txn = self.db.begin_write().at(at)?;
        let durability = match fsync {
            Fsync::Always => Durability::Immediate,
            Fsync::Never => Durability::None,
        };
        txn.set_durability(durability).at(at)?;
        let mut refused = Vec::new();
        let (usage, next_delayed_id) = {
            let mut batch = Batch::open(&txn, at, self.limits, self.usage, self.next_delayed_id)?;
            for (op, item) in ops.iter().enumerate() {
                if let Some(reason) = batch.apply(item)? {
                    refused.push(Refused { op, reason });
                }
            }
            let usage = batch.usage;
            (usage, batch.finish()?)
        };
        txn.commit().at(at)?;
        self.usage = usage;
        self.next_delayed_id = next_delayed_id;
        Ok(Committed { refused })
    }

    /// What the store holds now.
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// The caps the store was opened with.
    pub fn limits(&self) -> Limits {
        self.limits
    }
}

/// Writes the format version and creates the tables, unless the store has them.
fn init(db: &Database, at: &Place) -> Result<(), StoreError> {
    let txn = db.begin_read().at(at)?;
    let found = scan::format_version(&txn, at)?;
    drop(txn);
    match found {
        Some(tables::FORMAT_VERSION) => return Ok(()),
        // Versions 2, 3 and 4 only added a table each.
        Some(_) => {
            let txn = db.begin_write().at(at)?;
            {
                txn.open_table(LINKS).at(at)?;
                txn.open_table(OUTBOX).at(at)?;
                txn.open_table(MOVES).at(at)?;
                let mut meta = txn.open_table(META).at(at)?;
                meta.insert(tables::FORMAT_VERSION_KEY, tables::FORMAT_VERSION)
                    .at(at)?;
            }
            return txn.commit().at(at);
        }
        None => {}
    }
    let txn = db.begin_write().at(at)?;
    {
        txn.open_table(SESSIONS).at(at)?;
        txn.open_table(LINKS).at(at)?;
        txn.open_table(OUTBOX).at(at)?;
        txn.open_table(MOVES).at(at)?;
        txn.open_table(DELIVERIES).at(at)?;
        txn.open_table(INBOUND).at(at)?;
        txn.open_table(RETAINED).at(at)?;
        txn.open_table(DELAYED).at(at)?;
        let mut meta = txn.open_table(META).at(at)?;
        meta.insert(tables::FORMAT_VERSION_KEY, tables::FORMAT_VERSION)
            .at(at)?;
    }
    txn.commit().at(at)
}

/// Verifies the store file at `path` offline: opens it (redb recovers it if a writer
/// crashed, and verifies every page's checksum), decodes every record, checks that every
/// delivery and inbound packet identifier belongs to a stored session, and counts.
///
/// A missing or empty file is an error, not a new store. Errors name the file and, for a
/// record, its table and key.
pub fn check(path: &Path) -> Result<CheckReport, StoreError> {
    let at = Place::File(path.to_owned());
    let db = builder().open(path).map_err(|source| StoreError::Open {
        at: at.clone(),
        source,
    })?;
    let scan = scan::scan(&db, &at)?;
    Ok(CheckReport {
        path: path.to_owned(),
        format_version: scan.format_version,
        usage: scan.usage,
    })
}

/// A boxed backend is not itself a [`StorageBackend`]; this forwards every method, the
/// locking ones included, so that a backend which locks keeps doing so.
#[derive(Debug)]
struct Boxed(Box<dyn StorageBackend>);

impl StorageBackend for Boxed {
    fn len(&self) -> Result<u64, std::io::Error> {
        self.0.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        self.0.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        self.0.set_len(len)
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        self.0.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        self.0.write(offset, data)
    }

    fn close(&self) -> Result<(), std::io::Error> {
        self.0.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.0.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.0.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.0.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.0.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.0.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.0.query_lock_range(start, end)
    }
}
