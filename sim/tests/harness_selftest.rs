//! The harness checks itself: a deliberately failing scenario prints a replay command, and
//! running that command's seed fails the same way at the same virtual time.

use std::time::Duration;

use starling_sim::relay::{node_main, Oracle};
use starling_sim::runner::{parse_corpus, run_seed, seeds};
use starling_sim::{Cluster, Knobs, Nemesis, RunConfig};

const CFG: RunConfig = RunConfig::new("harness_selftest", "seeded_failure_replays_identically");

/// The relay under chaos with a false invariant that trips at the 300th delivery: a virtual
/// time that depends on every latency, fault and schedule the seed drew.
async fn deliberately_failing() {
    let knobs = Knobs::current();
    let oracle = Oracle::shared();
    oracle.lock().unwrap().tripwire = Some(300);
    let o = oracle.clone();
    let cluster = Cluster::build(3, move |i| node_main(i, 3, 10_000, o.clone()));
    let mut nemesis = Nemesis::new(knobs);
    nemesis.chaos(&cluster).await;
    madsim::time::sleep(Duration::from_secs(600)).await;
    unreachable!("the tripwire fires long before");
}

fn seed_of(replay: &str) -> u64 {
    let rest = replay
        .split("MADSIM_TEST_SEED=")
        .nth(1)
        .expect("the replay command sets MADSIM_TEST_SEED");
    rest.split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn seeded_failure_replays_identically() {
    let first = run_seed(&CFG, 42, deliberately_failing).expect_err("the scenario must fail");
    assert!(first.message.contains("tripwire"), "{}", first.message);
    assert!(first.at.is_some(), "the failure's virtual time is recorded");
    assert!(
        first.replay.contains("--test harness_selftest")
            && first
                .replay
                .contains("seeded_failure_replays_identically --exact"),
        "the replay command names the suite and test: {}",
        first.replay
    );

    let again = run_seed(&CFG, seed_of(&first.replay), deliberately_failing).unwrap_err();
    assert_eq!(again.message, first.message, "same failure");
    assert_eq!(again.at, first.at, "same virtual time");

    // And the failure really depends on the seed.
    let other = run_seed(&CFG, 43, deliberately_failing).unwrap_err();
    assert_ne!(other.at, first.at);
}

#[test]
fn corpus_lines_select_suite_and_test() {
    let text = "# comment\nsuite_a test_x 7  # why\nsuite_a test_y 8\nsuite_b test_x 9\n\nsuite_a test_x 11\n";
    assert_eq!(parse_corpus(text, "suite_a", "test_x"), vec![7, 11]);
    assert_eq!(parse_corpus(text, "suite_b", "test_x"), vec![9]);
    assert!(parse_corpus(text, "suite_c", "test_x").is_empty());
}

#[test]
fn default_seed_range_is_fixed_for_reproducible_ci() {
    if std::env::var("MADSIM_TEST_SEED").is_ok() || std::env::var("MADSIM_TEST_NUM").is_ok() {
        return; // the caller chose the seeds
    }
    let s = seeds(&RunConfig::new("nope", "nope").seeds(5));
    assert_eq!(s, vec![1, 2, 3, 4, 5]);
}
