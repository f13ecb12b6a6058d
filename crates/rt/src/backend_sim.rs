//! Simulation backend: each actor is a madsim task on the current simulated node, so killing
//! a node kills its actors and every schedule is decided by the simulation seed.

use std::future::Future;

/// Where an actor runs: which of its node's simulated threads it waits for when a test gave
/// the node a CPU model (`crate::cpu`); nothing to choose otherwise.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Place {
    Key(u64),
    Worker(usize),
    Own,
}

/// A turn's claim on the simulated node's CPU model.
pub(crate) struct CpuSlot {
    place: Place,
    name: &'static str,
}

impl CpuSlot {
    pub(crate) fn new(place: Place, name: &'static str) -> Self {
        CpuSlot { place, name }
    }

    pub(crate) async fn charge(&self) {
        crate::cpu::charge(self.place, self.name).await
    }
}

/// One worker: the simulated node runs every task on one thread.
pub fn workers() -> usize {
    1
}

pub(crate) fn spawn_actor<F>(_place: Place, fut: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    // Placement means nothing in a single-threaded simulation.
    tokio::spawn(fut);
}

/// The simulation runtime: a fresh madsim world (tests normally use `#[madsim::test]`).
pub struct Runtime {
    _workers: usize,
}

impl Runtime {
    pub fn new(workers: usize) -> Self {
        Runtime { _workers: workers }
    }

    pub fn per_core() -> Self {
        Self::new(1)
    }

    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        madsim::runtime::Runtime::new().block_on(f)
    }
}

/// The workers of a [`crate::blocking::BlockingPool`] under madsim, which has no threads:
/// each job runs on a simulated task of its own, so the caller first yields (as it would
/// while a real worker runs the job) and the simulation seed decides the order.
pub(crate) struct Workers;

impl Workers {
    pub(crate) fn new(_name: &str, _threads: usize) -> Self {
        Workers
    }

    /// Both lanes alike: the simulated scheduler, driven by the seed, orders the tasks.
    pub(crate) fn submit(&self, _lane: crate::blocking::Lane, job: crate::blocking::Task) {
        tokio::spawn(async move { job() });
    }
}
