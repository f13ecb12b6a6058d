//! The `kv` example as three real processes on loopback (QUIC with mutual TLS between them,
//! logs on disk): writers hit every node concurrently; the leader is killed with SIGKILL in
//! the middle of the writes and restarted. Expectation: the cluster elects a new leader and
//! keeps acknowledging writes, the restarted node rejoins, and every acknowledged write is
//! read back (linearizably) from every node.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use starling_rt::time;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const IDS: [u64; 3] = [1, 2, 3];
const WRITERS: u64 = 6;
const READERS_PER_NODE: usize = 8;

/// Builds the example with the cargo that runs this test, into the same target directory.
fn example_binary() -> PathBuf {
    let mut cargo = Command::new(env!("CARGO"));
    cargo.args(["build", "-q", "-p", "starling-raft", "--example", "kv"]);
    // Variables cargo set for this test process only: build scripts track some of them
    // (ring's does, CARGO_MANIFEST_DIR), and seeing them changed would rebuild the world.
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if [
            "CARGO_PKG_",
            "CARGO_MANIFEST_",
            "CARGO_CRATE_",
            "CARGO_BIN_",
            "CARGO_PRIMARY_",
        ]
        .iter()
        .any(|p| k.starts_with(p))
            || k == "CARGO_TARGET_TMPDIR"
        {
            cargo.env_remove(&*k);
        }
    }
    let status = cargo.status().expect("run cargo");
    assert!(status.success(), "building the kv example failed");
    // target/<profile>/deps/kv_processes-<hash> → target/<profile>/examples/kv
    let exe = std::env::current_exe().expect("test path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target dir");
    profile_dir.join("examples").join("kv")
}

struct Cluster {
    bin: PathBuf,
    dir: PathBuf,
    peers: String,
    http: BTreeMap<u64, SocketAddr>,
    children: BTreeMap<u64, Child>,
}

impl Cluster {
    fn spawn(&mut self, id: u64) {
        let log = std::fs::File::create(self.dir.join(format!("node-{id}.log"))).unwrap();
        let child = Command::new(&self.bin)
            .arg("--id")
            .arg(id.to_string())
            .arg("--peers")
            .arg(&self.peers)
            .arg("--data-dir")
            .arg(self.dir.join(format!("data-{id}")))
            .arg("--certs")
            .arg(self.dir.join("certs"))
            .arg("--http")
            .arg(self.http[&id].to_string())
            .args(["--tick-ms", "50"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start kv process");
        self.children.insert(id, child);
    }

    /// SIGKILL: no shutdown path runs.
    fn kill(&mut self, id: u64) {
        if let Some(mut c) = self.children.remove(&id) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let ids: Vec<u64> = self.children.keys().copied().collect();
        for id in ids {
            self.kill(id);
        }
    }
}

/// One HTTP request (`connection: close`); `None` on any transport error or timeout.
async fn http(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> Option<(u16, Vec<u8>)> {
    let exchange = async {
        let mut s = starling_net::connect(addr).await.ok()?;
        let head = format!(
            "{method} {path} HTTP/1.1\r\nhost: kv\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).await.ok()?;
        s.write_all(body).await.ok()?;
        s.flush().await.ok()?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.ok()?;
        let end = out.windows(4).position(|w| w == b"\r\n\r\n")?;
        let code = std::str::from_utf8(out.get(9..12)?).ok()?.parse().ok()?;
        Some((code, out[end + 4..].to_vec()))
    };
    time::timeout(Duration::from_secs(6), exchange)
        .await
        .flatten()
}

async fn status(addr: SocketAddr) -> Option<String> {
    match http(addr, "GET", "/status", b"").await {
        Some((200, b)) => Some(String::from_utf8_lossy(&b).into_owned()),
        _ => None,
    }
}

/// The node that reports itself leader, if any.
async fn leader(c: &Cluster) -> Option<u64> {
    for (&id, &addr) in &c.http {
        if !c.children.contains_key(&id) {
            continue;
        }
        if let Some(s) = status(addr).await {
            if s.contains("role=Leader") {
                return Some(id);
            }
        }
    }
    None
}

#[test]
fn kv_processes_lose_no_acknowledged_write_when_the_leader_is_killed() {
    let bin = example_binary();
    let dir = std::env::temp_dir().join(format!("starling-kv-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for id in IDS {
        starling_raft::certs::issue_node(&dir.join("certs"), id, &["127.0.0.1"]).unwrap();
    }
    // Ports from the process id, so that concurrent runs on one machine do not collide,
    // and below the ephemeral range (Linux starts it at 32768): a port there may be some
    // client's local port at the moment a node binds it (a node failed to start so, and
    // the test with it, when the process id put the ports at 36991-36998).
    let base = 20_000 + (std::process::id() % 1_200) as u16 * 10;
    let peers = IDS
        .iter()
        .map(|id| format!("{id}=127.0.0.1:{}", base + *id as u16))
        .collect::<Vec<_>>()
        .join(",");
    let http_addrs = IDS
        .iter()
        .map(|&id| (id, SocketAddr::from(([127, 0, 0, 1], base + 5 + id as u16))))
        .collect();
    let mut cluster = Cluster {
        bin,
        dir: dir.clone(),
        peers,
        http: http_addrs,
        children: BTreeMap::new(),
    };
    for id in IDS {
        cluster.spawn(id);
    }

    starling_rt::Runtime::new(2).block_on(async {
        let t0 = time::now();
        let mut first = None;
        for _ in 0..200 {
            time::sleep(Duration::from_millis(100)).await;
            first = leader(&cluster).await;
            if first.is_some() {
                break;
            }
        }
        let first = first.expect("a leader within 20 s");
        println!("leader {first} after {:?}", t0.elapsed());

        // Writers: unique keys, each to the next node in turn.
        let acked: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
        let down = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let acked_while_down = Arc::new(AtomicU64::new(0));
        let mut writers = Vec::new();
        for w in 0..WRITERS {
            let (acked, down, stop, during) = (
                acked.clone(),
                down.clone(),
                stop.clone(),
                acked_while_down.clone(),
            );
            let addrs = cluster.http.clone();
            writers.push(starling_rt::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let node = IDS[((w + i) % 3) as usize];
                    let was_down = down.load(Ordering::Relaxed);
                    if node == was_down {
                        continue;
                    }
                    let (key, value) = (format!("w{w}-{i}"), format!("v{i}"));
                    let path = format!("/kv/{key}");
                    if let Some((200, prev)) =
                        http(addrs[&node], "PUT", &path, value.as_bytes()).await
                    {
                        assert!(prev.is_empty(), "{key} was written before");
                        if was_down != 0 {
                            during.fetch_add(1, Ordering::Relaxed);
                        }
                        acked.lock().unwrap().push((key, value));
                    }
                }
            }));
        }

        time::sleep(Duration::from_millis(1500)).await;
        let before_kill = acked.lock().unwrap().len();
        down.store(first, Ordering::Relaxed);
        cluster.kill(first);
        time::sleep(Duration::from_secs(3)).await;
        cluster.spawn(first);
        down.store(0, Ordering::Relaxed);
        time::sleep(Duration::from_secs(2)).await;
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.await.unwrap();
        }
        let acked = acked.lock().unwrap().clone();
        assert!(before_kill > 0, "no write acknowledged before the kill");
        assert!(
            acked_while_down.load(Ordering::Relaxed) > 0,
            "no write acknowledged while the old leader was down"
        );

        // Recovery: a write through every node, the restarted one included.
        for id in IDS {
            let mut ok = false;
            for _ in 0..100 {
                let path = format!("/kv/probe-{id}");
                if let Some((200, _)) = http(cluster.http[&id], "PUT", &path, b"ok").await {
                    ok = true;
                    break;
                }
                time::sleep(Duration::from_millis(200)).await;
            }
            assert!(ok, "node {id} did not accept a write after the restart");
        }

        println!("recovered after {:?}", t0.elapsed());
        // Every acknowledged write, read linearizably through every node (in parallel: a
        // few thousand reads).
        let acked = Arc::new(acked);
        let mut readers = Vec::new();
        for id in IDS {
            for part in 0..READERS_PER_NODE {
                let (acked, addr) = (acked.clone(), cluster.http[&id]);
                readers.push(starling_rt::spawn(async move {
                    for (key, value) in acked.iter().skip(part).step_by(READERS_PER_NODE) {
                        let got = http(addr, "GET", &format!("/kv/{key}"), b"").await;
                        assert_eq!(
                            got,
                            Some((200, value.clone().into_bytes())),
                            "node {id}: acknowledged write {key}={value} lost"
                        );
                    }
                }));
            }
        }
        for r in readers {
            r.await.unwrap();
        }
        println!("verified after {:?}", t0.elapsed());
        println!(
            "{} acknowledged writes ({} while node {first} was down), all read back from 3 nodes",
            acked.len(),
            acked_while_down.load(Ordering::Relaxed)
        );
    });
    drop(cluster);
    std::fs::remove_dir_all(&dir).unwrap();
}
