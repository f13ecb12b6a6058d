//! What the binary's end-to-end tests share: a daemon under test, its log, its address, and
//! the real clients they drive.

// Real processes on the wall clock, never under the simulator.
#![allow(clippy::disallowed_methods, dead_code)]

pub mod cluster;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const WAIT: Duration = Duration::from_secs(20);

pub fn starling() -> Command {
    Command::new(env!("CARGO_BIN_EXE_starling"))
}

pub fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("starling-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// A running daemon whose log lines arrive on a channel; stopped with SIGTERM when dropped.
pub struct Daemon {
    pub child: Child,
    pub lines: mpsc::Receiver<String>,
    pub seen: Vec<String>,
}

impl Daemon {
    pub fn start(config: &Path) -> Daemon {
        let mut child = starling()
            .arg("--config")
            .arg(config)
            .arg("--workers")
            .arg("1")
            .env("NO_COLOR", "1")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starling starts");
        let (tx, lines) = mpsc::channel();
        for out in [
            Box::new(child.stdout.take().expect("piped")) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().expect("piped")),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            });
        }
        Daemon {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a log line containing `text`.
    pub fn expect(&mut self, text: &str) {
        let deadline = Instant::now() + WAIT;
        if self.seen.iter().any(|l| l.contains(text)) {
            return;
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let hit = line.contains(text);
                    self.seen.push(line);
                    if hit {
                        return;
                    }
                }
                Err(_) => panic!("no log line with {text:?}; saw:\n{}", self.seen.join("\n")),
            }
        }
    }

    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill runs");
        assert!(status.success());
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return; // killed by the test
        }
        self.signal("TERM");
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn listening_addr(d: &mut Daemon) -> std::net::SocketAddr {
    logged_addr(d, "listening", "addr=")
}

/// The address after `key` in the first log line containing `text` (waited for).
pub fn logged_addr(d: &mut Daemon, text: &str, key: &str) -> std::net::SocketAddr {
    d.expect(text);
    let line = d.seen.iter().find(|l| l.contains(text)).expect("seen");
    let addr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix(key))
        .unwrap_or_else(|| panic!("{key} in the line {line:?}"));
    addr.parse().expect("a socket address")
}

/// Runs a mosquitto client program; `None` when it is not installed (and CI is not set:
/// under CI a missing client fails the test).
pub fn mosquitto(program: &str, args: &[&str]) -> Option<std::process::Output> {
    match Command::new(program).args(args).output() {
        Ok(out) => Some(out),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if std::env::var_os("CI").is_some() {
                panic!("{program} is missing and CI is set: install mosquitto-clients");
            }
            println!("skipped: {program} not found (apt-get install mosquitto-clients)");
            None
        }
        Err(e) => panic!("{program}: {e}"),
    }
}

/// A port free now, for a broker that must come back on the same one.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// Whether a program runs; under CI a missing one fails the test instead.
pub fn have(program: &str, check: &[&str], install: &str) -> bool {
    let ok = Command::new(program)
        .args(check)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "{program} is missing and CI is set: {install}"
        );
        println!("skipped: {program} missing ({install})");
    }
    ok
}

/// The paho subscriber of `tests/clients/watch_v5.py`, its lines on a channel.
pub fn watcher(port: u16, id: &str, topic: &str) -> (Child, mpsc::Receiver<String>) {
    watcher_with(port, id, topic, &[])
}

/// As [`watcher`], with more arguments of `watch_v5.py` (e.g. `--expiry 3600`).
pub fn watcher_with(
    port: u16,
    id: &str,
    topic: &str,
    extra: &[&str],
) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/clients/watch_v5.py"
        ))
        .args(["--port", &port.to_string(), "--id", id, "--topic", topic])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3 runs");
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().expect("piped");
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    (child, rx)
}

pub fn next_line(rx: &mpsc::Receiver<String>, want: &str) {
    let line = rx
        .recv_timeout(WAIT)
        .unwrap_or_else(|_| panic!("no line, waiting for {want:?}"));
    assert_eq!(line, want);
}

/// A config in `dir` with a TCP listener on 127.0.0.1:`mqtt`, the store under `dir`, and the
/// HTTP API on a free loopback port behind `token`, then `extra` (more sections).
pub fn api_config(dir: &Path, mqtt: u16, token: &str, extra: &str) -> PathBuf {
    let config = dir.join("starling.toml");
    std::fs::write(
        &config,
        format!(
            "[node]\ndata_dir = \"{}\"\n\
             [[listeners]]\nkind = \"tcp\"\nbind = \"127.0.0.1:{mqtt}\"\n\
             [http]\nenabled = true\nbind = \"127.0.0.1:0\"\nbearer_token = \"{token}\"\n{extra}",
            dir.join("data").display()
        ),
    )
    .expect("write config");
    config
}
