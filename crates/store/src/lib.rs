//! Durable storage of persistent MQTT sessions, retained and delayed messages, on redb.
//!
//! A [`Store`] is the synchronous layer under the broker's storage actor, which batches
//! ops from many clients and commits them together with one fsync (group commit):
//! [`Store::commit`]`(&ops, Fsync::Always)`. It reads no clock (deadlines come in as
//! wall-clock [`SystemTime`](std::time::SystemTime)s inside the ops), starts no thread and
//! needs no async runtime.
//!
//! Sessions are stored incrementally, so that a publish to a session with a long queue
//! writes one small record: the session's meta ([`SessionMeta`]) in one table, each
//! delivery ([`StoredDelivery`]) under `(client id, seq)` in another, inbound QoS 2 packet
//! identifiers in a third. [`Store::open`] reassembles them into
//! [`SessionState`](starling_session::SessionState)s ([`Recovered`]). `docs/persistence.md`
//! describes the tables and the encoding.
//!
//! [`check`] verifies a store file offline. With the `testkit` feature, `SimDisk` is a redb
//! backend that loses unsynced writes on a simulated crash.

mod apply;
mod error;
mod op;
mod record;
mod scan;
#[cfg(feature = "testkit")]
mod sim;
mod store;
mod tables;

pub use error::{DecodeProblem, Place, RecordKey, StoreError};
pub use op::{Committed, Fsync, Limits, LinkCursor, Op, OutboxBatch, Refusal, Refused, Usage};
pub use record::{DeliveryStage, SessionMeta, SessionParts, StoredDelivery, VALUE_VERSION};
pub use scan::{Delayed, Recovered, RecoveredSession};
#[cfg(feature = "testkit")]
pub use sim::{DiskStats, SimDisk, TornWrite};
pub use store::{check, CheckReport, Location, Store};
pub use tables::FORMAT_VERSION;
