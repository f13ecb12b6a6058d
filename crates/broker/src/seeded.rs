//! Hash maps keyed by what clients choose (client ids): hashed with a seed drawn from the
//! runtime, secret in production and the run's own under the simulator. std's
//! `RandomState` is neither: madsim does not seed it, so a seed's run changed with whatever
//! built a `HashMap` first on the thread (the log subscriber did).

use foldhash::fast::FixedState;
use rand::RngCore;

/// A map whose iteration order is the seed's under the simulator.
pub(crate) type SeededMap<K, V> = std::collections::HashMap<K, V, FixedState>;

/// A hasher for [`SeededMap`]s, its seed drawn from the runtime now.
pub(crate) fn hasher() -> FixedState {
    FixedState::with_seed(starling_rt::rng::rng().next_u64())
}
