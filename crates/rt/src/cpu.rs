//! A simulated node's CPU, for tests that need work to take time: under madsim a turn costs
//! no simulated time at all, so a node flooded by clients answers its raft peers as fast as
//! an idle one, and follower overload cannot be shown with broker load.
//!
//! A test installs a [`CpuModel`] on a node (from the node's own init, before its actors
//! start). From then on every actor turn on that node first waits for its thread, then holds
//! it for the turn's cost in simulated time:
//!
//! - the node has `workers` threads, as production has one arbiter per core; an actor runs
//!   on the thread its placement picks (the same hash as production's), one turn at a time
//!   per thread, in the order the turns became ready: a run queue, as an arbiter's is;
//! - an actor started with [`crate::Options::own_thread`] has a thread of its own, as in
//!   production, and only ever waits for its own turns (the host has a core to spare for
//!   it: an idealisation, since a real one shares the cores with the workers and the
//!   kernel's scheduler gives it a slice, short when it mostly sleeps).
//!
//! Nodes without a model, the default, run exactly as before: no turn waits, so seeds found
//! before the model existed replay unchanged. Plain tasks (sockets, timers) are free.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use madsim::task::NodeId;
use tokio::sync::Semaphore;

use crate::backend::Place;
use crate::time;

/// What a simulated node's turns cost.
#[derive(Clone)]
pub struct CpuModel {
    /// Worker threads; at least one.
    pub workers: usize,
    /// The cost of one turn of an actor with this name ([`crate::Options::name`]).
    pub cost: Arc<dyn Fn(&'static str) -> Duration + Send + Sync>,
}

/// One actor name's turns on one node, since its model was installed.
#[derive(Debug, Clone, Copy, Default)]
pub struct TurnStats {
    pub turns: u64,
    /// Simulated time spent on the turns themselves.
    pub busy: Duration,
    /// The longest a turn waited for its thread.
    pub waited_max: Duration,
}

struct NodeCpu {
    model: CpuModel,
    threads: Vec<Arc<Semaphore>>,
    stats: Mutex<HashMap<&'static str, TurnStats>>,
}

thread_local! {
    /// The models of this thread's simulation, by node, with the seed they belong to: a
    /// runtime per test runs on one thread, and one thread runs seed after seed.
    static CPUS: RefCell<(u64, HashMap<NodeId, Arc<NodeCpu>>)> = RefCell::new((0, HashMap::new()));
}

fn seed() -> u64 {
    madsim::runtime::Handle::current().seed()
}

/// Gives the current simulated node this model, replacing any it had (a restarted node
/// installs afresh: its previous life's waiting turns died with it).
pub fn install(model: CpuModel) {
    assert!(model.workers >= 1, "a CPU model needs a worker");
    let node = Arc::new(NodeCpu {
        threads: (0..model.workers)
            .map(|_| Arc::new(Semaphore::new(1)))
            .collect(),
        model,
        stats: Mutex::new(HashMap::new()),
    });
    let seed = seed();
    CPUS.with(|c| {
        let mut c = c.borrow_mut();
        if c.0 != seed {
            *c = (seed, HashMap::new());
        }
        c.1.insert(madsim::plugin::node(), node);
    });
}

/// The turns of every node with a model, by node and actor name.
pub fn stats() -> Vec<(NodeId, &'static str, TurnStats)> {
    let seed = seed();
    CPUS.with(|c| {
        let c = c.borrow();
        if c.0 != seed {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (node, cpu) in &c.1 {
            let stats = cpu.stats.lock().unwrap_or_else(|e| e.into_inner());
            out.extend(stats.iter().map(|(name, s)| (*node, *name, *s)));
        }
        out.sort_by_key(|(n, name, _)| (*n, *name));
        out
    })
}

fn current() -> Option<Arc<NodeCpu>> {
    let seed = seed();
    CPUS.with(|c| {
        let c = c.borrow();
        if c.0 != seed {
            return None;
        }
        c.1.get(&madsim::plugin::node()).cloned()
    })
}

/// The same spread as production's arbiters.
fn slot(key: u64, n: usize) -> usize {
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize % n
}

/// Waits for the turn's thread and holds it for the turn's cost, if the node has a model.
pub(crate) async fn charge(place: Place, name: &'static str) {
    let Some(cpu) = current() else {
        return;
    };
    let cost = (cpu.model.cost)(name);
    if cost.is_zero() {
        return;
    }
    let n = cpu.threads.len();
    let thread = match place {
        Place::Key(key) => Some(slot(key, n)),
        Place::Worker(w) => Some(w % n),
        Place::Own => None,
    };
    let asked = time::now();
    let _held = match thread {
        Some(i) => Some(
            cpu.threads[i]
                .clone()
                .acquire_owned()
                .await
                .expect("never closed"),
        ),
        None => None,
    };
    let waited = time::now().saturating_duration_since(asked);
    time::sleep(cost).await;
    let mut stats = cpu.stats.lock().unwrap_or_else(|e| e.into_inner());
    let s = stats.entry(name).or_default();
    s.turns += 1;
    s.busy += cost;
    s.waited_max = s.waited_max.max(waited);
}
