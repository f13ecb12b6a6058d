//! The web dashboard in headless Chromium: the daemon with `[http]` on and a bearer token,
//! a paho MQTT 5 subscriber (`tests/clients/watch_v5.py`), mosquitto_pub, and the broker
//! crate's `tests/js/dashboard.js` driving the page with puppeteer-core. The page asks for
//! the token, then shows the subscriber, its subscription and the retained messages, its
//! rate chart goes from 0 to more when mosquitto_pub sends a burst, its publish form reaches
//! the subscriber and its kick button disconnects it (0x98); no console error, failed
//! request or error status on the way. A screenshot of each view goes to
//! `target/dashboard-screenshots/`.

#![allow(clippy::disallowed_methods)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{free_port, have, temp_dir, Daemon, WAIT};
use serde_json::Value;

const TOKEN: &str = "dash-t0ken-for-tests";
const SHOTS: [&str; 6] = [
    "token",
    "overview",
    "clients",
    "subscriptions",
    "retained",
    "publish",
];

fn js_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../broker/tests/js")
}

/// Where a person finds the screenshots: beside the build, whatever the target dir is
/// (the binary sits in `<target>/<profile>/`).
fn screenshot_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_starling"))
        .parent()
        .and_then(Path::parent)
        .expect("the target dir")
        .join("dashboard-screenshots")
}

/// A child stopped when the test ends, passed or not: SIGTERM first, so that node closes
/// the browser it started rather than leaving it behind.
struct Stopped(Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A child's stdout, a line at a time, on a channel.
fn lines_of(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().expect("piped");
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// Skips the subscriber's lines up to `want` (a burst's messages come first).
fn watcher_says(rx: &mpsc::Receiver<String>, want: &str) {
    let deadline = Instant::now() + WAIT;
    let mut last = String::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line == want => return,
            Ok(line) => last = line,
            Err(_) => panic!("the subscriber never said {want:?}; last: {last:?}"),
        }
    }
}

/// The driver's report of step `name`.
fn report(rx: &mpsc::Receiver<String>, name: &str) -> Value {
    let line = rx
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("the browser driver said nothing, waiting for {name:?}"));
    let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    assert_ne!(
        v["event"], "fail",
        "the browser driver failed: {}",
        v["error"]
    );
    assert_eq!(v["event"], name, "{v}");
    println!("{line}");
    v
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("a list: {v}"))
        .iter()
        .map(|s| s.as_str().expect("a string").to_owned())
        .collect()
}

/// The table rows a report holds, cells as text.
fn rows(v: &Value) -> Vec<Vec<String>> {
    v.as_array()
        .unwrap_or_else(|| panic!("rows: {v}"))
        .iter()
        .map(strings)
        .collect()
}

fn mosquitto_pub(port: u16, args: &[&str]) {
    let out = Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("mosquitto_pub runs");
    assert!(out.status.success(), "mosquitto_pub {args:?}: {out:?}");
}

fn tell(stdin: &mut ChildStdin, line: &str) {
    writeln!(stdin, "{line}").expect("write to the browser driver");
}

/// A program's path on `PATH`: puppeteer wants a file, not a name.
fn on_path(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// Chromium, node and puppeteer-core, or `None` with a note (a failure under CI).
fn browser_tools() -> Option<PathBuf> {
    let chromium = ["chromium", "chromium-browser"]
        .into_iter()
        .find_map(on_path)
        .filter(|p| Command::new(p).arg("--version").output().is_ok());
    let Some(chromium) = chromium else {
        have("chromium", &["--version"], "apt-get install chromium");
        return None;
    };
    if !have("node", &["--version"], "apt-get install nodejs") {
        return None;
    }
    let puppeteer = js_dir().join("node_modules/puppeteer-core/package.json");
    if !puppeteer.exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "puppeteer-core is missing and CI is set: cd crates/broker/tests/js && npm ci"
        );
        println!("skipped: puppeteer-core missing (cd crates/broker/tests/js && npm ci)");
        return None;
    }
    Some(chromium)
}

#[test]
fn the_dashboard_shows_clients_moves_its_chart_and_acts_in_headless_chromium() {
    let Some(chromium) = browser_tools() else {
        return;
    };
    if common::mosquitto("mosquitto_pub", &["--help"]).is_none()
        || !have(
            "python3",
            &["-c", "import paho.mqtt.client as m; m.CallbackAPIVersion"],
            "pip install paho-mqtt",
        )
    {
        return;
    }
    let dir = temp_dir("dashboard");
    let mqtt = free_port();
    let config = common::api_config(&dir, mqtt, TOKEN, "");
    let mut d = Daemon::start(&config);
    let http = common::logged_addr(&mut d, "HTTP API serving", "http_addr=").port();

    let mut watcher = Command::new("python3");
    watcher
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/clients/watch_v5.py"
        ))
        .args(["--port", &mqtt.to_string()])
        .args(["--id", "dash-watcher", "--topic", "dash/#"])
        .stdout(Stdio::piped());
    let mut watcher = Stopped(watcher.spawn().expect("python3 runs"));
    let heard = lines_of(&mut watcher.0);
    watcher_says(&heard, "subscribed");
    mosquitto_pub(
        mqtt,
        &["-t", "dash/retained/one", "-m", "kept", "-r", "-q", "1"],
    );
    mosquitto_pub(
        mqtt,
        &["-t", "dash/retained/two", "-m", r#"{"temp": 21.5}"#, "-r"],
    );
    watcher_says(&heard, r#"msg dash/retained/two {"temp": 21.5}"#);

    let shots = screenshot_dir();
    std::fs::create_dir_all(&shots).expect("screenshot dir");
    for name in SHOTS {
        let _ = std::fs::remove_file(shots.join(format!("{name}.png")));
    }
    let url = format!("http://127.0.0.1:{http}/");
    let mut driver = Command::new("node");
    driver
        .arg(js_dir().join("dashboard.js"))
        .arg(&url)
        .arg(TOKEN)
        .arg(&shots)
        .arg(chromium)
        .current_dir(js_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut driver = Stopped(driver.spawn().expect("node runs"));
    let mut to_driver = driver.0.stdin.take().expect("piped");
    let said = lines_of(&mut driver.0);

    // Without the token every API call is a 401 and the page asks; nothing else failed.
    let asked = report(&said, "token_asked");
    let refused = strings(&asked["bad_status"]);
    assert!(!refused.is_empty(), "{asked}");
    for r in &refused {
        assert!(
            r.starts_with(&format!("401 GET {url}api/v1/")),
            "only the API may refuse before the token: {r}"
        );
    }
    for c in strings(&asked["console"]) {
        assert!(c.contains("401"), "a console message besides the 401s: {c}");
    }
    assert_eq!(asked["page_errors"], Value::Array(vec![]), "{asked}");
    assert_eq!(asked["failed"], Value::Array(vec![]), "{asked}");
    let again = report(&said, "reloaded");
    assert_eq!(
        again["dialog_hidden"], true,
        "a reload asked for the token again"
    );

    // The rate chart reads 0 at rest and more than 0 once a burst is published.
    let idle = report(&said, "idle");
    assert!(idle["samples"].as_u64().unwrap() >= 3, "{idle}");
    assert_eq!(
        (idle["received"].as_f64(), idle["sent"].as_f64()),
        (Some(0.0), Some(0.0))
    );
    mosquitto_pub(mqtt, &["-t", "dash/burst", "-m", "x", "--repeat", "300"]);
    tell(&mut to_driver, "published");
    let burst = report(&said, "burst");
    assert!(
        burst["received"].as_f64().unwrap() > 0.0,
        "the received rate stayed 0: {burst}"
    );
    assert!(
        burst["sent"].as_f64().unwrap() > 0.0,
        "the sent rate stayed 0: {burst}"
    );
    let overview = report(&said, "overview");
    assert_eq!(overview["connections"], "1", "{overview}");
    let nodes = rows(&overview["nodes"]);
    assert_eq!(nodes.len(), 1, "{overview}");
    assert_eq!(nodes[0][0], "1", "{overview}");

    // The subscriber is listed, and the search finds it or nothing.
    let clients = report(&said, "clients");
    let listed = rows(&clients["listed"]);
    let me = listed
        .iter()
        .find(|r| r[0] == "dash-watcher")
        .unwrap_or_else(|| panic!("the subscriber is not listed: {clients}"));
    assert_eq!(me[3], "5", "protocol: {me:?}");
    assert_eq!(me[4], "yes", "connected: {me:?}");
    assert!(me[2].starts_with("127.0.0.1:"), "address: {me:?}");
    assert!(rows(&clients["none"]).is_empty(), "{clients}");
    let matched = rows(&clients["matched"]);
    assert_eq!(matched.len(), 1, "{clients}");
    assert_eq!(matched[0][0], "dash-watcher");

    let subs = report(&said, "subscriptions");
    let subs = rows(&subs["listed"]);
    assert!(
        subs.iter()
            .any(|r| r[0] == "dash-watcher" && r[1] == "dash/#" && r[2] == "1"),
        "{subs:?}"
    );

    // Retained messages are listed with their payloads, and one is deleted from its row.
    let retained = report(&said, "retained");
    let topics = |v: &Value| -> Vec<(String, String)> {
        rows(v)
            .into_iter()
            .map(|r| (r[0].clone(), r[2].clone()))
            .collect()
    };
    let one = ("dash/retained/one".to_owned(), "kept".to_owned());
    let two = (
        "dash/retained/two".to_owned(),
        r#"{"temp": 21.5}"#.to_owned(),
    );
    let before = topics(&retained["before"]);
    assert!(before.contains(&one) && before.contains(&two), "{retained}");
    let after = topics(&retained["after"]);
    assert!(!after.contains(&one) && after.contains(&two), "{retained}");
    // The delete is an empty retained publish, which the subscriber receives.
    watcher_says(&heard, "msg dash/retained/one ");

    let published = report(&said, "published");
    assert!(
        published["result"]
            .as_str()
            .unwrap()
            .starts_with("result ok: Published to dash/form"),
        "{published}"
    );
    watcher_says(&heard, "msg dash/form from the dashboard");

    let kicked = report(&said, "kicked");
    assert!(
        !rows(&kicked["listed"])
            .iter()
            .any(|r| r[0] == "dash-watcher"),
        "{kicked}"
    );
    watcher_says(&heard, "disconnected 152");

    // With the token, not one thing went wrong in the whole visit.
    let done = report(&said, "done");
    for key in ["console", "page_errors", "failed", "bad_status"] {
        assert_eq!(done[key], Value::Array(vec![]), "{key}: {done}");
    }
    for name in SHOTS {
        let png = std::fs::read(shots.join(format!("{name}.png")))
            .unwrap_or_else(|e| panic!("no screenshot of {name}: {e}"));
        assert!(png.starts_with(b"\x89PNG"), "{name}.png is not a PNG");
        assert!(png.len() > 10_000, "{name}.png is {} bytes", png.len());
    }
    println!("screenshots: {}", shots.display());
    let _ = std::fs::remove_dir_all(&dir);
}
