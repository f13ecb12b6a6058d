//! A bounded pool for CPU-heavy blocking work (password hashing) that must not run on the
//! threads that serve connections.
//!
//! [`BlockingPool::try_run`] admits a job only while fewer than `threads + queue` jobs are
//! admitted and unfinished; otherwise it returns [`PoolFull`] at once, so a storm of
//! requests is refused instead of growing a queue. [`BlockingPool::try_run_later`] admits
//! into a second lane of `queue` places whose jobs run only when no job of the first waits:
//! work from suspect sources (addresses that failed logins) fills its own lane and cannot
//! refuse, nor delay past one job, the work of everyone else. The production backend runs jobs on
//! `threads` dedicated OS threads; the madsim backend (which has no threads) runs each job
//! on a simulated task of its own, so callers behave the same in both.
//!
//! ```no_run
//! # async fn f() {
//! let pool = starling_rt::blocking::BlockingPool::new("verify", 1, 32);
//! match pool.try_run(|| 6 * 7) {
//!     Ok(job) => assert_eq!(job.await, Ok(42)),
//!     Err(full) => eprintln!("busy: {full}"),
//! }
//! # }
//! ```

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::{oneshot, Semaphore};

use crate::backend::Workers;

/// The pool was at capacity: `threads` jobs running and `queue` waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("blocking pool full ({capacity} jobs admitted)")]
pub struct PoolFull {
    /// `threads + queue`.
    pub capacity: usize,
}

/// An admitted job ended without a result: it panicked, or the pool had no thread to run
/// it (none could be started).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("blocking job lost (panicked or no worker thread)")]
pub struct JobLost;

/// A job to run on a worker: everything it needs is moved in.
pub(crate) type Task = Box<dyn FnOnce() + Send + 'static>;

/// A bounded pool of blocking workers. Cheap to clone; the workers stop once every clone
/// is dropped and the admitted jobs are done.
#[derive(Clone)]
pub struct BlockingPool {
    inner: Arc<Inner>,
}

struct Inner {
    workers: Workers,
    admitted: Arc<Semaphore>,
    capacity: usize,
    /// Places of the second lane.
    later: Arc<Semaphore>,
    later_capacity: usize,
    threads: usize,
}

/// Which lane a job waits in: [`Lane::First`] jobs run before any waiting [`Lane::Later`]
/// job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    First,
    Later,
}

impl std::fmt::Debug for BlockingPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockingPool")
            .field("threads", &self.inner.threads)
            .field("capacity", &self.inner.capacity)
            .field("available", &self.inner.admitted.available_permits())
            .finish()
    }
}

impl BlockingPool {
    /// A pool of `threads` workers (at least 1) and room for `queue` jobs waiting for one.
    /// Threads are named `{name}-{i}`. A thread that cannot be started is logged; jobs then
    /// run on the others (with none, every job ends in [`JobLost`]).
    pub fn new(name: &str, threads: usize, queue: usize) -> Self {
        let threads = threads.max(1);
        let capacity = threads.saturating_add(queue).min(Semaphore::MAX_PERMITS);
        let later_capacity = queue.clamp(1, Semaphore::MAX_PERMITS);
        BlockingPool {
            inner: Arc::new(Inner {
                workers: Workers::new(name, threads),
                admitted: Arc::new(Semaphore::new(capacity)),
                capacity,
                later: Arc::new(Semaphore::new(later_capacity)),
                later_capacity,
                threads,
            }),
        }
    }

    /// Half the available cores, at least 1: on a small machine the other half keeps
    /// serving connections while the pool is saturated.
    pub fn default_threads() -> usize {
        std::thread::available_parallelism()
            .map(|n| n.get() / 2)
            .unwrap_or(1)
            .max(1)
    }

    /// The number of worker threads.
    pub fn threads(&self) -> usize {
        self.inner.threads
    }

    /// Jobs admitted and not finished (running or waiting), both lanes.
    pub fn in_flight(&self) -> usize {
        self.inner.capacity - self.inner.admitted.available_permits() + self.inner.later_capacity
            - self.inner.later.available_permits()
    }

    /// Admits `f` to run on a worker and returns the future of its result, or [`PoolFull`]
    /// without running it. The job runs whether or not the future is awaited; dropping the
    /// future only discards the result.
    ///
    /// # Errors
    /// [`PoolFull`] while `threads + queue` jobs are admitted and unfinished.
    pub fn try_run<F, T>(&self, f: F) -> Result<Job<T>, PoolFull>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        self.admit(Lane::First, f)
    }

    /// As [`BlockingPool::try_run`], in the second lane: `f` runs only once no job admitted
    /// by `try_run` waits for a worker. The lanes are admitted apart, so a full second
    /// lane never refuses a `try_run`.
    ///
    /// # Errors
    /// [`PoolFull`] while `queue` jobs of the second lane are admitted and unfinished.
    pub fn try_run_later<F, T>(&self, f: F) -> Result<Job<T>, PoolFull>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        self.admit(Lane::Later, f)
    }

    fn admit<F, T>(&self, lane: Lane, f: F) -> Result<Job<T>, PoolFull>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let (places, capacity) = match lane {
            Lane::First => (&self.inner.admitted, self.inner.capacity),
            Lane::Later => (&self.inner.later, self.inner.later_capacity),
        };
        let permit = places
            .clone()
            .try_acquire_owned()
            .map_err(|_| PoolFull { capacity })?;
        let (tx, rx) = oneshot::channel();
        self.inner.workers.submit(
            lane,
            Box::new(move || {
                // A panicking job must not take a worker thread (or, under madsim, the whole
                // simulation) with it; its caller sees `JobLost`.
                let out = catch_unwind(AssertUnwindSafe(f));
                // The place is freed only once the work is done, so `capacity` bounds the
                // work in the system, not just the queue; and before the result goes out,
                // so that a caller who got it and submits again finds the place free.
                drop(permit);
                if let Ok(out) = out {
                    let _ = tx.send(out);
                }
            }),
        );
        Ok(Job(rx))
    }
}

/// The result of an admitted job.
#[derive(Debug)]
pub struct Job<T>(oneshot::Receiver<T>);

impl<T> Future for Job<T> {
    type Output = Result<T, JobLost>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0)
            .poll(cx)
            .map(|r| r.map_err(|_| JobLost))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_counts_threads_and_queue() {
        let pool = BlockingPool::new("t", 0, 3);
        assert_eq!(pool.threads(), 1);
        assert_eq!(pool.inner.capacity, 4);
        assert_eq!(pool.inner.later_capacity, 3);
        assert_eq!(pool.in_flight(), 0);
    }

    /// Real threads: the order in which one worker takes waiting jobs.
    #[cfg(not(madsim))]
    #[test]
    fn first_lane_jobs_run_before_waiting_later_ones_and_lanes_are_admitted_apart() {
        use std::sync::Mutex;
        let pool = BlockingPool::new("t", 1, 2);
        let order = Arc::new(Mutex::new(Vec::new()));
        let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
        // Occupies the only worker until the gate opens.
        let busy = pool
            .try_run(move || gate_rx.recv().is_ok())
            .expect("admitted");
        let mut jobs = Vec::new();
        for name in ["later-1", "later-2"] {
            let order = order.clone();
            jobs.push(
                pool.try_run_later(move || order.lock().unwrap().push(name))
                    .expect("admitted"),
            );
        }
        assert!(
            pool.try_run_later(|| ()).is_err(),
            "the second lane is full"
        );
        let o = order.clone();
        let first = pool
            .try_run(move || o.lock().unwrap().push("first"))
            .expect("a full second lane does not refuse the first");
        gate_tx.send(()).unwrap();
        assert_eq!(futures::executor::block_on(busy), Ok(true));
        assert_eq!(futures::executor::block_on(first), Ok(()));
        for j in jobs {
            assert_eq!(futures::executor::block_on(j), Ok(()));
        }
        assert_eq!(*order.lock().unwrap(), ["first", "later-1", "later-2"]);
    }
}
