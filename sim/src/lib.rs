//! Starling's chaos harness: simulated clusters built from a seed, a nemesis, invariant checks and replayable seeds.
//!
//! A suite is a plain `#[test]` that calls [`run`] with an async scenario. The runner picks
//! the seeds (the corpus for that test first, then `MADSIM_TEST_SEED`/`MADSIM_TEST_NUM` or
//! the default range), runs each in a fresh simulated world, prints the seed and the knobs
//! derived from it, and on failure prints one command that replays exactly that run.
//! See `docs/simulation.md`.

#[cfg(not(madsim))]
compile_error!(
    "starling-sim must be built with `--cfg madsim`: run it as `cd sim && cargo test --features sim` \
     (sim/.cargo/config.toml sets the flag; an exported RUSTFLAGS replaces it)"
);

pub mod cluster;
pub mod disk;
pub mod knobs;
pub mod mqtt;
pub mod nemesis;
pub mod relay;
pub mod runner;

pub use cluster::{Cluster, SimNode};
pub use knobs::Knobs;
pub use nemesis::{Fault, Nemesis};
pub use runner::{run, run_seed, Failure, RunConfig};

/// Virtual time since the start of the current simulation.
pub fn elapsed() -> std::time::Duration {
    madsim::time::TimeHandle::current().elapsed()
}

/// Fails the scenario with `msg` unless `cond` holds: an invariant check with the virtual
/// time in its message, so that a replay can be compared with the original failure.
#[macro_export]
macro_rules! check {
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            $crate::runner::trip(format!(
                "invariant violated at {:?}: {}",
                $crate::elapsed(),
                format!($($arg)+)
            ));
        }
    };
}
