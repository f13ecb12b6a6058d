//! The HTTP API against its OpenAPI document (`GET /api/v1/openapi.json`): schemathesis
//! generates requests from the document, valid and not, and checks every answer, the
//! daemon running with real MQTT clients connected so that its lists are not empty. Any
//! finding fails the test: a 5xx, a body or a status or a content type the document does
//! not give, a request without the token that was not refused.

#![allow(clippy::disallowed_methods)]

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{free_port, have, mosquitto, next_line, temp_dir, watcher, Daemon};

const TOKEN: &str = "fuzz-t0ken";
/// Cases per operation and phase: enough to reach every parameter's edges, small enough that
/// the run takes well under two minutes on two cores.
const MAX_EXAMPLES: &str = "50";
/// A run that takes longer than this has hung.
const RUN_MAX: Duration = Duration::from_secs(300);
/// The generator's seed: fixed, so that CI runs the same cases on the same code (a finding
/// reproduces, and a change that is fine does not fail on a new draw).
/// `STARLING_FUZZ_SEED=<n>` explores others; the report prints the seed it used.
const SEED: &str = "20261202";

#[test]
fn schemathesis_finds_nothing_against_the_openapi_document() {
    // Its CLI (`st`) by its module: pip may put `st` off the PATH, and another program
    // may have the name.
    if !have(
        "python3",
        &["-m", "schemathesis.cli", "--version"],
        "pip install schemathesis",
    ) || !have(
        "python3",
        &["-c", "import paho.mqtt.client as m; m.CallbackAPIVersion"],
        "pip install paho-mqtt",
    ) {
        return;
    }
    let dir = temp_dir("http-fuzz");
    let mqtt = free_port();
    let config = common::api_config(&dir, mqtt, TOKEN, "");
    let mut d = Daemon::start(&config);
    let port = common::logged_addr(&mut d, "HTTP API serving", "http_addr=").port();

    // Clients, subscriptions (one shared), routes and a retained message to list.
    let (_one, lines) = watcher(mqtt, "fuzz-one", "fuzz/#");
    next_line(&lines, "subscribed");
    let (_two, lines) = watcher(mqtt, "fuzz-two", "$share/g/fuzz/+");
    next_line(&lines, "subscribed");
    let port_arg = mqtt.to_string();
    let args = ["-p", &port_arg, "-t", "fuzz/kept", "-m", "kept", "-r"];
    if mosquitto("mosquitto_pub", &args).is_none() {
        return;
    }

    // In a directory of its own: schemathesis reads a schemathesis.toml where it runs. Its
    // report goes to a file, which no pipe left unread can block.
    let seed = std::env::var("STARLING_FUZZ_SEED").unwrap_or_else(|_| SEED.to_owned());
    let report = dir.join("schemathesis.out");
    let sink = std::fs::File::create(&report).expect("report file");
    let mut st = Command::new("python3")
        .current_dir(&dir)
        .args(["-m", "schemathesis.cli", "run"])
        .arg(format!("http://127.0.0.1:{port}/api/v1/openapi.json"))
        .args(["--header", &format!("Authorization: Bearer {TOKEN}")])
        .args(["--checks", "all"])
        .args(["--max-examples", MAX_EXAMPLES])
        .args(["--seed", &seed])
        // One worker: with two, hypothesis parses lambdas' source from two threads at once,
        // and CPython 3.11's AST builder keeps its recursion depth per interpreter, not per
        // thread, so a run can fail with "AST constructor recursion depth mismatch" (python/
        // cpython#106905; a CI run on Python 3.11.7 did) without anything wrong here.
        .args(["--workers", "1"])
        .args(["--request-timeout", "10"])
        .args(["--generation-database", "none"])
        .arg("--no-color")
        .stdout(sink.try_clone().expect("report file"))
        .stderr(sink)
        .spawn()
        .expect("st runs");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = st.try_wait().expect("st") {
            break Some(status);
        }
        if started.elapsed() > RUN_MAX {
            let _ = st.kill();
            let _ = st.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let text = std::fs::read_to_string(&report).unwrap_or_default();
    println!("{text}");
    println!("schemathesis ran for {:?}", started.elapsed());
    let status = status.unwrap_or_else(|| panic!("schemathesis still ran after {RUN_MAX:?}"));
    assert!(
        status.success(),
        "schemathesis found something (its report above)"
    );
    // A run that tested nothing would pass too.
    assert!(text.contains("passed"), "no operation tested: {text}");
    drop(d);
}
