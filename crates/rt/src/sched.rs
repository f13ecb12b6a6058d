//! The kernel scheduling class of the production threads (Linux; a no-op elsewhere).
//!
//! The system thread (the one `Runtime::block_on` runs on) carries the I/O tasks that are not
//! actors: the cluster's QUIC endpoint and connections, listeners' accept loops. Each
//! forwarded batch and each acknowledgement wakes it from a worker, or a worker from it.
//! Under `SCHED_OTHER` every such wake-up preempts the worker at once, so on a busy CPU the
//! two threads take turns batch by batch, each switch costing a context switch and a cold
//! cache. `SCHED_BATCH` keeps its fair share of the CPU and changes one thing: its wake-ups
//! do not preempt a running thread, so it runs at the end of the worker's slice (a few
//! milliseconds at most) and takes everything queued for it by then in one go. Raft's
//! timing is in hundreds of milliseconds, and its driver, on a thread of its own
//! (`Options::own_thread`), keeps the normal class: only the hop through the endpoint
//! waits. Measured: pairs QoS 1 across a pinned three-node cluster, docs/benchmarks.md.
//!
//! Threads the system thread starts later would inherit the class: the runtime's own
//! threads (own-thread actors, blocking pools) go back to the normal class as they start.
//! Threads other crates start from it keep the batch class (the HTTP API's actix-web
//! workers: management traffic, which loses nothing by waiting a slice). A process the
//! operator started in another class (`chrt`) is left as it is.

use std::sync::atomic::{AtomicBool, Ordering};

/// The system thread was moved to `SCHED_BATCH` by [`io_thread`]: the threads it starts are
/// moved back. Process-wide, as the class is: set once, before any actor runs.
static MOVED: AtomicBool = AtomicBool::new(false);

/// Puts the calling thread, the system thread, in `SCHED_BATCH`, if it is in the normal class.
pub(crate) fn io_thread() {
    if imp::policy() == Some(imp::OTHER) {
        match imp::set(imp::BATCH) {
            Ok(()) => MOVED.store(true, Ordering::Relaxed),
            Err(e) => {
                tracing::debug!(error = %e, "the system thread keeps the normal scheduling class")
            }
        }
    }
}

/// Puts a thread the system thread started back in the normal class, if [`io_thread`] moved
/// the system thread out of it.
pub(crate) fn normal_thread() {
    if MOVED.load(Ordering::Relaxed) && imp::policy() == Some(imp::BATCH) {
        if let Err(e) = imp::set(imp::OTHER) {
            tracing::debug!(error = %e, "a runtime thread stays in SCHED_BATCH");
        }
    }
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
mod imp {
    pub(super) const OTHER: libc::c_int = libc::SCHED_OTHER;
    pub(super) const BATCH: libc::c_int = libc::SCHED_BATCH;

    /// The calling thread's policy.
    pub(super) fn policy() -> Option<libc::c_int> {
        // SAFETY: no pointers; pid 0 names the calling thread.
        let p = unsafe { libc::sched_getscheduler(0) };
        (p >= 0).then_some(p)
    }

    /// Sets the calling thread's policy (static priority 0, which both classes require).
    pub(super) fn set(policy: libc::c_int) -> std::io::Result<()> {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `param` is a valid, initialised struct that outlives the call; pid 0 names
        // the calling thread, not the process.
        let r = unsafe { libc::sched_setscheduler(0, policy, &param) };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    pub(super) const OTHER: i32 = 0;
    pub(super) const BATCH: i32 = 3;

    pub(super) fn policy() -> Option<i32> {
        None
    }

    pub(super) fn set(_policy: i32) -> std::io::Result<()> {
        Ok(())
    }
}
