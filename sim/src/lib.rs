//! Starling's chaos harness: simulated clusters built from a seed, a nemesis, invariant checks and replayable seeds.

#[cfg(not(madsim))]
compile_error!(
    "starling-sim must be built with `--cfg madsim`: run it as `cd sim && cargo test --features sim` \
     (sim/.cargo/config.toml sets the flag; an exported RUSTFLAGS replaces it)"
);
