//! The example cluster of `config/cluster/` as real processes, for the cluster tests: its
//! files with free ports put in, `starling cluster status` read and waited on, and the
//! python clients that publish and count acknowledgements.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{have, starling, temp_dir, Daemon};

/// Ports of one node: MQTT, HTTP API, cluster (UDP).
#[derive(Clone, Copy)]
pub struct Ports {
    pub mqtt: u16,
    pub http: u16,
    pub cluster: u16,
}

/// A free port below the ephemeral range (Linux starts it at 32768), from a block of this
/// process's: one the kernel picks from that range may become some client's local port
/// before the node binds it (a full test run once saw a node never join so). `udp`: free
/// for UDP (the cluster endpoint), else for TCP.
pub fn low_port(udp: bool) -> u16 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let base = 20_000 + (std::process::id() % 400) * 30;
    loop {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let port = u16::try_from(20_000 + (base - 20_000 + n) % 12_000).expect("below 32000");
        let free = if udp {
            std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok()
        } else {
            std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
        };
        if free {
            return port;
        }
    }
}

pub fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

/// The example files with this run's ports and `extra` appended, and the certificates
/// they name.
pub fn configs(dir: &Path, extra: &str) -> (Vec<PathBuf>, Vec<Ports>) {
    configs_each(dir, [extra; 3])
}

/// As [`configs`], with each node's own `extra`.
pub fn configs_each(dir: &Path, extras: [&str; 3]) -> (Vec<PathBuf>, Vec<Ports>) {
    let ports: Vec<Ports> = (0..3)
        .map(|_| Ports {
            mqtt: low_port(false),
            http: low_port(false),
            cluster: low_port(true),
        })
        .collect();
    let mut files = Vec::new();
    for i in 1..=3usize {
        let mut text = std::fs::read_to_string(repo_file(&format!("config/cluster/node{i}.toml")))
            .expect("the example config");
        for (j, p) in ports.iter().enumerate() {
            let j = j + 1;
            text = text
                .replace(
                    &format!("\"127.0.0.1:{}\"", 1882 + j),
                    &format!("\"127.0.0.1:{}\"", p.mqtt),
                )
                .replace(
                    &format!("\"127.0.0.1:{}\"", 6060 + j),
                    &format!("\"127.0.0.1:{}\"", p.http),
                )
                .replace(
                    &format!("\"127.0.0.1:{}\"", 7000 + j),
                    &format!("\"127.0.0.1:{}\"", p.cluster),
                );
        }
        let ps = ports[i - 1];
        for port in [ps.mqtt, ps.http, ps.cluster] {
            assert!(
                text.contains(&format!(":{port}\"")),
                "node{i}.toml took its ports"
            );
        }
        let text = with_extra(text, extras[i - 1]);
        let path = dir.join(format!("node{i}.toml"));
        std::fs::write(&path, text).expect("write config");
        files.push(path);
    }
    // The ACL the example files name, next to them.
    std::fs::copy(repo_file("config/cluster/acl.toml"), dir.join("acl.toml"))
        .expect("copy acl.toml");
    node_certs(dir, "1,2,3");
    (files, ports)
}

/// `text` with the tables of `extra`: a table the file has already (the examples have
/// `[mqtt]` and `[auth]`) gets the extra keys at its top, TOML allowing a table once; the
/// others are appended.
fn with_extra(mut text: String, extra: &str) -> String {
    let mut rest = String::new();
    let mut sections: Vec<(String, String)> = Vec::new();
    for line in extra.lines() {
        let t = line.trim();
        if t.starts_with('[') && t.ends_with(']') {
            sections.push((t.to_owned(), String::new()));
        } else if let Some((_, body)) = sections.last_mut() {
            body.push_str(line);
            body.push('\n');
        } else {
            rest.push_str(line);
            rest.push('\n');
        }
    }
    for (header, body) in sections {
        let at = format!("\n{header}\n");
        match text.find(&at) {
            Some(i) if !header.starts_with("[[") => text.insert_str(i + at.len(), &body),
            _ => text.push_str(&format!("\n{header}\n{body}")),
        }
    }
    text.push_str(&rest);
    text
}

/// The certificates of `nodes` (`1,2,3`) in `dir/certs`, from its CA (made once).
pub fn node_certs(dir: &Path, nodes: &str) {
    let out = starling()
        .args(["cert", "cluster"])
        .arg(dir.join("certs"))
        .args(["--nodes", nodes, "--name", "127.0.0.1"])
        .output()
        .expect("starling cert cluster runs");
    assert!(out.status.success(), "starling cert cluster: {out:?}");
}

/// `starling cluster status --json` through the node of `config`.
pub fn status(config: &Path) -> Option<serde_json::Value> {
    let out = starling()
        .args(["cluster", "status", "--json", "--config"])
        .arg(config)
        .output()
        .expect("starling cluster status runs");
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

/// Waits until `cond` holds on node `config`'s status, up to `within`; the last status.
pub fn wait_status(
    config: &Path,
    within: Duration,
    what: &str,
    cond: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + within;
    let mut last = None;
    loop {
        if let Some(st) = status(config) {
            if cond(&st) {
                return st;
            }
            last = Some(st);
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; last status: {last:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub fn health(st: &serde_json::Value, id: u64) -> Option<bool> {
    st["members"]
        .as_array()?
        .iter()
        .find(|m| m["id"].as_u64() == Some(id))?["active"]
        .as_bool()
}

/// The `acked PAYLOAD` lines of a publisher, until it ends; `on_ack(n)` after each.
pub fn acked_lines(p: &mut Child, mut on_ack: impl FnMut(usize)) -> BTreeSet<String> {
    let mut acked = BTreeSet::new();
    for line in BufReader::new(p.stdout.take().expect("piped"))
        .lines()
        .map_while(Result::ok)
    {
        if let Some(payload) = line.strip_prefix("acked ") {
            acked.insert(payload.to_owned());
            on_ack(acked.len());
        }
    }
    let _ = p.wait();
    acked
}

pub fn publisher(port: u16, topic: &str, count: usize) -> Child {
    publisher_with(port, topic, count, &[])
}

pub fn publisher_with(port: u16, topic: &str, count: usize, extra: &[&str]) -> Child {
    Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/clients/publish_acked.py"
        ))
        .args(["--port", &port.to_string(), "--topic", topic])
        .args(["--count", &count.to_string()])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3 runs")
}

/// Payloads of `topic` a watcher printed (`msg TOPIC PAYLOAD`), gathered until `want` are
/// all there or `within` passes.
pub fn gather(
    rx: &mpsc::Receiver<String>,
    seen: &mut BTreeSet<(String, String)>,
    want: &BTreeSet<(String, String)>,
    within: Duration,
) {
    let deadline = Instant::now() + within;
    while !want.is_subset(seen) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let mut w = line.splitn(3, ' ');
                if let (Some("msg"), Some(t), Some(p)) = (w.next(), w.next(), w.next()) {
                    seen.insert((t.to_owned(), p.to_owned()));
                }
            }
            Err(_) => return,
        }
    }
}

pub fn missing(want: &BTreeSet<(String, String)>, seen: &BTreeSet<(String, String)>) -> usize {
    want.difference(seen).count()
}

/// Publishes a probe (`topic`, one QoS 1 and one QoS 2 message) through `port` until the
/// watcher behind `rx` gets it, for up to 20 s: a SUBACK waits at most 3 s for its route,
/// so on a loaded machine it may come before other nodes forward to the subscriber. False
/// if it never came.
pub fn until_forwarded(port: u16, topic: &str, rx: &mpsc::Receiver<String>) -> bool {
    let probe: BTreeSet<(String, String)> = [(topic.to_owned(), "1:0".to_owned())].into();
    let mut seen = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while missing(&probe, &seen) > 0 && Instant::now() < deadline {
        let mut p = publisher(port, topic, 1);
        acked_lines(&mut p, |_| {});
        gather(rx, &mut seen, &probe, Duration::from_secs(1));
    }
    missing(&probe, &seen) == 0
}

/// The three example nodes with `extra` in their configs, started, with a leader that
/// hears all (`None` when paho-mqtt, which the tests' clients need, is missing and CI is
/// not set). The daemons stop when the last value is dropped.
pub fn running_cluster(name: &str, extra: &str) -> Option<(Vec<PathBuf>, Vec<Ports>, Vec<Daemon>)> {
    running_cluster_each(name, [extra; 3])
}

/// As [`running_cluster`], with each node's own `extra`.
pub fn running_cluster_each(
    name: &str,
    extras: [&str; 3],
) -> Option<(Vec<PathBuf>, Vec<Ports>, Vec<Daemon>)> {
    if !have(
        "python3",
        &["-c", "import paho.mqtt"],
        "pip install paho-mqtt",
    ) {
        return None;
    }
    let dir = temp_dir(name);
    let (files, ports) = configs_each(&dir, extras);
    let mut nodes: Vec<Daemon> = files.iter().map(|f| Daemon::start(f)).collect();
    for n in &mut nodes {
        n.expect("cluster endpoint up");
    }
    wait_status(
        &files[1],
        Duration::from_secs(30),
        "a leader hearing all",
        |st| st["leader"].as_u64().is_some() && (1..=3).all(|id| health(st, id) == Some(true)),
    );
    Some((files, ports, nodes))
}

/// Node `config`'s answer `n` of `starling ctl stats` (0: its `/stats`, 1: its
/// `/metrics`), under `key`.
pub fn ctl_stats(config: &Path, n: usize, key: &str) -> serde_json::Value {
    let out = starling()
        .arg("--config")
        .arg(config)
        .args(["ctl", "stats"])
        .output()
        .expect("starling ctl stats runs");
    assert!(out.status.success(), "starling ctl stats: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().nth(n).expect("the answer");
    let v: serde_json::Value = serde_json::from_str(line).expect("JSON");
    v[0][key].clone()
}
