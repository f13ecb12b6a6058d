# Starling tasks. `just --list` shows them all.
set shell := ["bash", "-euo", "pipefail", "-c"]

# Run the broker (embedded defaults unless given `--config FILE`).
run *ARGS:
    cargo run --release --bin starling -- {{ARGS}}

# The example three-node cluster (config/cluster/node{1,2,3}.toml) in the foreground, with its
# certificates written first if missing; Ctrl-C or SIGTERM stops all three.
cluster:
    scripts/cluster.sh

# Build everything.
build:
    cargo build --workspace

# Every test: workspace unit/integration tests, then the simulation suites.
test: test-workspace sim

test-workspace:
    cargo test --workspace

# The chaos suites under the deterministic simulator, plus a determinism check.
sim:
    cd sim && cargo test --features sim
    cd sim && MADSIM_TEST_CHECK_DETERMINISM=1 MADSIM_TEST_NUM=5 cargo test --features sim --test rt_relay

# One simulation test on one seed, e.g. `just sim-one rt_relay relay_ordered_and_complete_under_partitions_and_restarts 42`.
sim-one SUITE TEST SEED:
    cd sim && MADSIM_TEST_SEED={{SEED}} cargo test --features sim --test {{SUITE}} -- {{TEST}} --exact --nocapture

# Explore new seeds (not run in CI): `just sim-explore rt_relay 1000`.
sim-explore SUITE NUM="1000":
    cd sim && MADSIM_TEST_SEED=$(date +%s) MADSIM_TEST_NUM={{NUM}} cargo test --features sim --test {{SUITE}}

# Formatting and clippy, production and simulation builds.
lint:
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets -- -D warnings
    cd sim && cargo fmt -- --check
    cd sim && cargo clippy --features sim --all-targets -- -D warnings

fmt:
    cargo fmt --all
    cd sim && cargo fmt

# Criterion benchmarks of the workspace crates.
bench:
    cargo bench --workspace

# Side by side against Mosquitto (and RMQTT/rumqttd when on PATH): ratio table into docs/benchmarks.md.
# Knobs as environment variables, e.g. `REPS=1 DURATION=3 just bench-compare` (see the script's header).
bench-compare:
    scripts/bench-compare.sh

# One node against the three-node example cluster on loopback: pairs and fan-out QoS 1
# across nodes, CONNECTs on every node, the brokers' CPU per delivery; a markdown table.
# Knobs as environment variables, e.g. `REPS=1 DURATION=2 just bench-cluster` (see the script's header).
bench-cluster:
    scripts/bench-cluster.sh

# Topic shards against one router, unpinned: fan-in at `[router] shards = 1` and `= 2`.
bench-shards:
    scripts/bench-shards.sh
