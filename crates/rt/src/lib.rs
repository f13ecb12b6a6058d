//! The actor and runtime seam: actors, mailboxes, timers, clock, rng and spawn, run by actix in production and by madsim in simulation.
//!
//! Everything that is time, randomness, spawning or scheduling goes through this crate, so
//! that one `--cfg madsim` build replays a whole cluster deterministically from a seed.
//! See `docs/architecture.md` for the actor topology built on it.

// This crate is the seam: it is the one place allowed to read clocks, draw OS randomness and
// spawn tasks directly (the root clippy.toml bans those everywhere else).
#![allow(clippy::disallowed_methods)]

mod actor;
pub mod blocking;
#[cfg(madsim)]
pub mod cpu;
mod mailbox;
pub mod rng;
#[cfg(not(madsim))]
mod sched;
pub mod throttle;
pub mod time;

#[cfg(not(madsim))]
#[path = "backend_actix.rs"]
mod backend;
#[cfg(madsim)]
#[path = "backend_sim.rs"]
mod backend;

#[cfg(feature = "testkit")]
pub mod testkit;

pub use actor::{
    start, start_watched, start_with, Actor, ActorId, Addr, AskError, Ctx, Exit, ExitWatch,
    Options, Reply, TimerId, WeakAddr,
};
pub use backend::{workers, Runtime};
pub use mailbox::{Closed, TrySendError};

use std::future::Future;

/// Spawns a plain task on the current runtime (simulated node under madsim).
pub fn spawn<F>(fut: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(fut)
}

/// Gives the other ready tasks of this thread a turn before going on: an actor whose
/// mailbox never empties (a shard under a flood) would otherwise run its whole mailbox in
/// one poll, and the actors it feeds would not drain theirs meanwhile. Wakes itself, so it
/// needs nothing from the backend (the simulator runs it the same way).
pub async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            return std::task::Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
    .await;
}

/// The name of the backend compiled in: "actix" or "madsim".
pub const BACKEND: &str = if cfg!(madsim) { "madsim" } else { "actix" };
