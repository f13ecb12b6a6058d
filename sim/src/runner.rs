//! Runs a scenario over seeds: the corpus first, then the requested or default range. Prints
//! each seed with its knobs; on failure, one command that replays exactly that run.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;
use std::task::Waker;
use std::time::Duration;

use madsim::runtime::Runtime;

use crate::knobs::Knobs;

/// Which test this is and how many seeds it runs by default.
#[derive(Clone, Copy, Debug)]
pub struct RunConfig {
    /// The test binary (the file name under `sim/tests/` without `.rs`).
    pub suite: &'static str,
    /// The `#[test]` function name.
    pub test: &'static str,
    /// Seeds run when neither `MADSIM_TEST_SEED` nor `MADSIM_TEST_NUM` is set.
    pub default_seeds: u64,
    /// Virtual-time limit of one run: a hung scenario fails instead of spinning.
    pub time_limit: Duration,
    /// The test is `#[ignore]`d: its replay command passes `--ignored`.
    pub ignored: bool,
}

impl RunConfig {
    pub const fn new(suite: &'static str, test: &'static str) -> Self {
        RunConfig {
            suite,
            test,
            default_seeds: 100,
            time_limit: Duration::from_secs(600),
            ignored: false,
        }
    }

    pub const fn seeds(mut self, n: u64) -> Self {
        self.default_seeds = n;
        self
    }

    /// For a test marked `#[ignore]`: replays say `--ignored`, or they would run nothing.
    pub const fn ignored(mut self) -> Self {
        self.ignored = true;
        self
    }

    /// The command that replays `seed` of this test.
    pub fn replay_command(&self, seed: u64) -> String {
        format!(
            "cd sim && MADSIM_TEST_SEED={seed} cargo test --features sim --test {} -- {} --exact --nocapture{}",
            self.suite,
            self.test,
            if self.ignored { " --ignored" } else { "" }
        )
    }
}

/// A failed run.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    pub seed: u64,
    /// Virtual time at which the panic happened.
    pub at: Option<Duration>,
    pub message: String,
    pub replay: String,
}

thread_local! {
    static PANIC_AT: Cell<Option<Duration>> = const { Cell::new(None) };
    // One simulated world runs on one thread, so the tripwire of a run is thread-local.
    static TRIPPED: RefCell<Option<String>> = const { RefCell::new(None) };
    static WATCHER: RefCell<Option<Waker>> = const { RefCell::new(None) };
}

/// Fails the run: records `msg`, wakes the tripwire watcher, and panics the calling task.
///
/// The watcher matters because an invariant is often checked inside an actor, and the
/// runtime catches actor panics (that is supervision); the watcher is a plain simulator task
/// whose panic ends the whole run at the same virtual instant.
pub fn trip(msg: String) -> ! {
    TRIPPED.with(|t| {
        let mut t = t.borrow_mut();
        if t.is_none() {
            *t = Some(msg.clone());
        }
    });
    if let Some(w) = WATCHER.with(|w| w.borrow_mut().take()) {
        w.wake();
    }
    panic!("{msg}");
}

/// Starts the task that turns a [`trip`] anywhere in the world into the run's failure.
/// [`crate::Cluster::build`] calls it.
pub fn spawn_tripwire_watcher() {
    madsim::task::spawn(std::future::poll_fn(|cx| {
        if let Some(msg) = TRIPPED.with(|t| t.borrow().clone()) {
            panic!("{msg}");
        }
        WATCHER.with(|w| *w.borrow_mut() = Some(cx.waker().clone()));
        std::task::Poll::<()>::Pending
    }));
}

fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if let Some(t) = madsim::time::TimeHandle::try_current() {
                PANIC_AT.with(|c| {
                    // The first panic is the cause; later ones are the unwinding's echoes.
                    if c.get().is_none() {
                        c.set(Some(t.elapsed()));
                    }
                });
            }
            prev(info)
        }));
    });
}

fn message_of(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic".into()
    }
}

/// Runs `scenario` once under `seed` and reports how it ended.
///
/// Each seed runs on a thread of its own: what a dependency keeps per thread (an RNG seeded
/// at its first use, such as quinn-proto's connection ids from `rand::rng()`, tokio's
/// `select!` counter, std's hash keys) would otherwise carry over from the seed before,
/// and a seed run inside a `MADSIM_TEST_NUM` loop would not replay alone (the QUIC suites
/// did not, before).
pub fn run_seed<F>(cfg: &RunConfig, seed: u64, scenario: fn() -> F) -> Result<(), Failure>
where
    F: Future<Output = ()> + 'static,
{
    install_panic_hook();
    let check = std::env::var("MADSIM_TEST_CHECK_DETERMINISM").is_ok();
    let limit = cfg.time_limit;
    let outcome = std::thread::Builder::new()
        .name(format!("{}-seed-{seed}", cfg.test))
        .spawn(move || {
            // `RUST_LOG` shows the brokers' and the nemesis' logs for this seed (without
            // wall-clock times, which would differ between two replays).
            let _log = std::env::var_os("RUST_LOG").map(|_| {
                let fmt = tracing_subscriber::fmt()
                    .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
                    .with_writer(std::io::stderr)
                    .without_time()
                    .finish();
                tracing::subscriber::set_default(fmt)
            });
            PANIC_AT.with(|c| c.set(None));
            TRIPPED.with(|t| *t.borrow_mut() = None);
            WATCHER.with(|w| *w.borrow_mut() = None);
            let result = catch_unwind(AssertUnwindSafe(|| {
                if check {
                    // Runs the seed twice and fails on the first divergent random draw.
                    Runtime::check_determinism(seed, madsim::Config::default(), scenario)
                } else {
                    let mut rt = Runtime::with_seed_and_config(seed, madsim::Config::default());
                    rt.set_time_limit(limit);
                    rt.block_on(scenario())
                }
            }));
            result.map_err(|p| (PANIC_AT.with(|c| c.get()), message_of(&*p)))
        })
        .expect("a thread for the seed")
        .join()
        // The closure catches every panic of the run; one escaping it is the harness's.
        .expect("the seed's thread reports how the run ended");
    outcome.map_err(|(at, message)| Failure {
        seed,
        at,
        message,
        replay: cfg.replay_command(seed),
    })
}

/// Seeds listed for `suite`/`test` in `sim/seeds.txt` (lines `suite test seed  # why`).
pub fn corpus(suite: &str, test: &str) -> Vec<u64> {
    parse_corpus(include_str!("../seeds.txt"), suite, test)
}

/// Parses corpus text (see [`corpus`]).
pub fn parse_corpus(text: &str, suite: &str, test: &str) -> Vec<u64> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            match (it.next(), it.next(), it.next()) {
                (Some(s), Some(t), Some(seed)) if s == suite && t == test => seed.parse().ok(),
                _ => None,
            }
        })
        .collect()
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// The seeds a run covers: `MADSIM_TEST_SEED` (and `MADSIM_TEST_NUM` after it) replays
/// exactly those; otherwise the corpus, then seeds `1..=N` with N = `MADSIM_TEST_NUM` or the
/// test's default. A fixed default range keeps CI reproducible; exploring new seeds is
/// `MADSIM_TEST_SEED=$RANDOM MADSIM_TEST_NUM=1000`.
pub fn seeds(cfg: &RunConfig) -> Vec<u64> {
    let num = env_u64("MADSIM_TEST_NUM");
    if let Some(first) = env_u64("MADSIM_TEST_SEED") {
        return (first..first + num.unwrap_or(1)).collect();
    }
    let mut v = corpus(cfg.suite, cfg.test);
    v.extend(1..=num.unwrap_or(cfg.default_seeds));
    v
}

/// Runs `scenario` on every seed of [`seeds`]; panics with the replay command at the first
/// failure.
pub fn run<F>(cfg: RunConfig, scenario: fn() -> F)
where
    F: Future<Output = ()> + 'static,
{
    let seeds = seeds(&cfg);
    for seed in &seeds {
        println!(
            "[sim] {}::{} seed={seed} {}",
            cfg.suite,
            cfg.test,
            Knobs::derive(*seed)
        );
        if let Err(f) = run_seed(&cfg, *seed, scenario) {
            eprintln!(
                "\n[sim] FAILED {}::{} seed={} at virtual time {:?}: {}\n[sim] knobs: {}\n[sim] replay: {}\n",
                cfg.suite,
                cfg.test,
                f.seed,
                f.at,
                f.message,
                Knobs::derive(f.seed),
                f.replay
            );
            panic!("seed {} failed; replay: {}", f.seed, f.replay);
        }
    }
    println!(
        "[sim] {}::{} passed {} seeds",
        cfg.suite,
        cfg.test,
        seeds.len()
    );
}
