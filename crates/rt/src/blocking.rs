//! A bounded pool for CPU-heavy blocking work (password hashing) that must not run on the
//! threads that serve connections.
//!
//! [`BlockingPool::try_run`] admits a job only while fewer than `threads + queue` jobs are
//! admitted and unfinished; otherwise it returns [`PoolFull`] at once, so a storm of
//! requests is refused instead of growing a queue. The production backend runs jobs on
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
    threads: usize,
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
        BlockingPool {
            inner: Arc::new(Inner {
                workers: Workers::new(name, threads),
                admitted: Arc::new(Semaphore::new(capacity)),
                capacity,
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

    /// Jobs admitted and not finished (running or waiting).
    pub fn in_flight(&self) -> usize {
        self.inner.capacity - self.inner.admitted.available_permits()
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
        let permit = self
            .inner
            .admitted
            .clone()
            .try_acquire_owned()
            .map_err(|_| PoolFull {
                capacity: self.inner.capacity,
            })?;
        let (tx, rx) = oneshot::channel();
        self.inner.workers.submit(Box::new(move || {
            // A panicking job must not take a worker thread (or, under madsim, the whole
            // simulation) with it; its caller sees `JobLost`.
            if let Ok(out) = catch_unwind(AssertUnwindSafe(f)) {
                let _ = tx.send(out);
            }
            // The place is freed only once the work is done, so `capacity` bounds the
            // work in the system, not just the queue.
            drop(permit);
        }));
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
        assert_eq!(pool.in_flight(), 0);
    }
}
