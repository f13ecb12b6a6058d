//! Randomness: seeded by the simulator under `--cfg madsim`, by the OS otherwise.
//!
//! Callers that need a stream of random numbers build one generator from [`seed`] and keep
//! it, so that a simulation seed reproduces every draw.

use rand::SeedableRng;
pub use rand_chacha::ChaCha8Rng as Rng;

/// A fresh 64-bit seed from the runtime's entropy source.
pub fn seed() -> u64 {
    #[cfg(madsim)]
    {
        madsim::rand::random::<u64>()
    }
    #[cfg(not(madsim))]
    {
        rand::random::<u64>()
    }
}

/// A generator seeded from [`seed`].
pub fn rng() -> Rng {
    Rng::seed_from_u64(seed())
}
