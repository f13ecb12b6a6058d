//! Production backend: actors run on actix arbiters, one per core, placed by a hash of the
//! actor's key so that related actors can share a thread.
//!
//! Actors are not `actix::Actor`s: our handlers are async and must behave identically inside
//! madsim, where actix cannot run (its arbiters start OS threads and its timers hang). actix
//! provides the system, the arbiters (a single-threaded tokio runtime each) and placement.

use std::future::Future;
use std::sync::{Arc, Mutex};

use actix::{Arbiter, ArbiterHandle, System};

type Registry = Vec<(usize, Arc<[ArbiterHandle]>)>;

/// Arbiters of each running actix system, by system id. Process-global on purpose: actors
/// spawned from any arbiter thread must find their siblings. Never used under madsim.
static ARBITERS: Mutex<Registry> = Mutex::new(Vec::new());

/// The threads of actors that have one of their own ([`Place::Own`]), by system id: stopped
/// and joined with the system's workers.
static OWN: Mutex<Vec<(usize, Arbiter)>> = Mutex::new(Vec::new());

fn arbiters_of(system: usize) -> Option<Arc<[ArbiterHandle]>> {
    let reg = ARBITERS.lock().unwrap_or_else(|e| e.into_inner());
    reg.iter()
        .find(|(id, _)| *id == system)
        .map(|(_, a)| a.clone())
}

/// Fibonacci hashing spreads sequential keys (actor ids) over the arbiters.
fn slot(key: u64, n: usize) -> usize {
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize % n
}

/// Where an actor runs.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Place {
    /// On the arbiter this key hashes to.
    Key(u64),
    /// On this arbiter, modulo their number.
    Worker(usize),
    /// On an arbiter of its own, which stops when the actor ends.
    Own,
}

/// The CPU model's handle on a turn: nothing in production (see the simulation backend).
pub(crate) struct CpuSlot;

impl CpuSlot {
    pub(crate) fn new(_place: Place, _name: &'static str) -> Self {
        CpuSlot
    }

    #[inline]
    pub(crate) fn charge(&self) -> std::future::Ready<()> {
        std::future::ready(())
    }
}

pub(crate) fn spawn_actor<F>(place: Place, fut: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    if let Some(sys) = System::try_current() {
        if let Some(arbs) = arbiters_of(sys.id()) {
            if !arbs.is_empty() {
                let i = match place {
                    Place::Key(key) => slot(key, arbs.len()),
                    Place::Worker(w) => w % arbs.len(),
                    Place::Own => {
                        let own = Arbiter::new();
                        let _ = own.spawn(async move {
                            crate::sched::normal_thread();
                            fut.await;
                            Arbiter::current().stop();
                        });
                        OWN.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push((sys.id(), own));
                        return;
                    }
                };
                // A stopped arbiter drops the future, which closes the actor's mailbox: its
                // senders then see `Closed`, never a silent black hole.
                let _ = arbs[i].spawn(fut);
                return;
            }
        }
    }
    tokio::spawn(fut);
}

/// How many workers the current runtime runs actors on: its arbiters; 1 outside one.
pub fn workers() -> usize {
    System::try_current()
        .and_then(|sys| arbiters_of(sys.id()))
        .map_or(1, |a| a.len().max(1))
}

/// The production runtime: an actix system plus `workers` arbiters.
pub struct Runtime {
    workers: usize,
}

impl Runtime {
    /// A runtime with `workers` arbiters (at least one).
    pub fn new(workers: usize) -> Self {
        Runtime {
            workers: workers.max(1),
        }
    }

    /// One arbiter per available core.
    pub fn per_core() -> Self {
        Self::new(
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
        )
    }

    /// Runs `f` on the system thread until it completes, then stops the arbiters.
    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        let workers = self.workers;
        let sys = System::new();
        let (out, id, arbiters) = sys.block_on(async move {
            let arbiters: Vec<Arbiter> = (0..workers).map(|_| Arbiter::new()).collect();
            let handles: Arc<[ArbiterHandle]> = arbiters.iter().map(|a| a.handle()).collect();
            let id = System::current().id();
            ARBITERS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((id, handles));
            // Once the workers exist: they keep the normal class (see `sched`).
            crate::sched::io_thread();
            (f.await, id, arbiters)
        });
        ARBITERS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(s, _)| *s != id);
        let own: Vec<Arbiter> = {
            let mut all = OWN.lock().unwrap_or_else(|e| e.into_inner());
            let (mine, others) = std::mem::take(&mut *all)
                .into_iter()
                .partition(|(s, _)| *s == id);
            *all = others;
            mine.into_iter().map(|(_, a)| a).collect()
        };
        for a in arbiters.iter().chain(&own) {
            a.stop();
        }
        for a in arbiters.into_iter().chain(own) {
            let _ = a.join();
        }
        out
    }
}

/// The workers of a [`crate::blocking::BlockingPool`]: dedicated OS threads taking jobs
/// from two lanes, the first before the second. The lanes themselves are unbounded because
/// the pool admits a bounded number of jobs into each before anything reaches them.
pub(crate) struct Workers {
    lanes: Arc<Mutex<Lanes>>,
    /// One token per submitted job: a worker that takes a token finds a job in a lane.
    /// Closed (every worker returns) when the pool, and so this sender, is dropped.
    tokens: std::sync::mpsc::Sender<()>,
}

#[derive(Default)]
struct Lanes {
    first: std::collections::VecDeque<crate::blocking::Task>,
    later: std::collections::VecDeque<crate::blocking::Task>,
}

impl Workers {
    pub(crate) fn new(name: &str, threads: usize) -> Self {
        let (tokens, rx) = std::sync::mpsc::channel::<()>();
        // std's receiver is single-consumer; the workers take turns at it. The lock is held
        // only by an idle worker waiting for a token, never while a job runs.
        let rx = Arc::new(Mutex::new(rx));
        let lanes = Arc::new(Mutex::new(Lanes::default()));
        for i in 0..threads {
            let rx = rx.clone();
            let lanes = lanes.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    crate::sched::normal_thread();
                    loop {
                        let token = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                        if token.is_err() {
                            // Every sender is gone: the pool was dropped.
                            return;
                        }
                        let job = {
                            let mut l = lanes.lock().unwrap_or_else(|e| e.into_inner());
                            l.first.pop_front().or_else(|| l.later.pop_front())
                        };
                        // A token is sent only after its job is in a lane, so one is there.
                        if let Some(job) = job {
                            job();
                        }
                    }
                });
            if let Err(e) = spawned {
                tracing::error!(pool = name, error = %e, "blocking pool thread did not start");
            }
        }
        Workers { lanes, tokens }
    }

    pub(crate) fn submit(&self, lane: crate::blocking::Lane, job: crate::blocking::Task) {
        {
            let mut l = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
            match lane {
                crate::blocking::Lane::First => l.first.push_back(job),
                crate::blocking::Lane::Later => l.later.push_back(job),
            }
        }
        // Fails only when no worker thread started: the job then stays in its lane and
        // is dropped with the pool, and its caller sees `JobLost` at the latest then.
        if self.tokens.send(()).is_err() {
            let mut l = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
            l.first.clear();
            l.later.clear();
        }
    }
}
