//! The knobs of one run, all derived from its seed, so that the seed alone names the run.

use std::fmt;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Fault and timing parameters of one simulated run.
#[derive(Clone, Debug, PartialEq)]
pub struct Knobs {
    pub seed: u64,
    /// Simulated nodes.
    pub nodes: usize,
    /// Length of the chaos phase (faults injected, safety checked).
    pub chaos: Duration,
    /// After the heal, the system must converge within this.
    pub heal_deadline: Duration,
    /// Mean time between two nemesis actions.
    pub fault_every: Duration,
    /// Per-packet latency range during chaos.
    pub latency: (Duration, Duration),
    /// Probability that a nemesis action is a kill (then restart) rather than a partition.
    pub kill_ratio: f64,
    /// Probability that a nemesis action is an overload (a node slowed by pause/resume).
    pub overload_ratio: f64,
}

impl Knobs {
    /// Derives the knobs from `seed` with its own generator (not the simulator's), so that
    /// they are known before the world starts and do not shift the simulation's draws.
    pub fn derive(seed: u64) -> Knobs {
        let mut r = ChaCha8Rng::seed_from_u64(seed ^ 0x005E_ED0F_C4A0_5000);
        let lat_lo = r.gen_range(1..5u64);
        let lat_hi = lat_lo + r.gen_range(1..40u64);
        Knobs {
            seed,
            nodes: 3,
            chaos: Duration::from_secs(r.gen_range(10..30)),
            heal_deadline: Duration::from_secs(20),
            fault_every: Duration::from_millis(r.gen_range(300..2000)),
            latency: (Duration::from_millis(lat_lo), Duration::from_millis(lat_hi)),
            kill_ratio: r.gen_range(0.0..0.4),
            overload_ratio: r.gen_range(0.0..0.2),
        }
    }

    /// The knobs of the run in progress.
    pub fn current() -> Knobs {
        Knobs::derive(madsim::runtime::Handle::current().seed())
    }
}

impl fmt::Display for Knobs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "nodes={} chaos={:?} heal_deadline={:?} fault_every={:?} latency={:?}..{:?} kill_ratio={:.2} overload_ratio={:.2}",
            self.nodes,
            self.chaos,
            self.heal_deadline,
            self.fault_every,
            self.latency.0,
            self.latency.1,
            self.kill_ratio,
            self.overload_ratio
        )
    }
}
