//! Proposal throughput and commit latency of a 3-node cluster in one process.
//!
//! ```sh
//! cargo run --release -p starling-raft --example bench -- --net quic --disk fs --clients 64
//! ```
//!
//! `--net quic`: the production QUIC transport over loopback (mutual TLS); `--net local`: the
//! in-process `LocalNet` (no serialization, no sockets). `--disk fs`: the WAL on files in a
//! temporary directory, synced with the default policy (group commit on a storage thread);
//! `--disk mem`: `MemDisk` with instant syncs (no storage thread: raft and the driver alone).
//! `--clients N` proposers, each with one request outstanding, all through the leader.
//! Latency is measured from `propose` to its output (committed on a quorum and applied on
//! the leader). Prints one line per run.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::{Parser, ValueEnum};
use starling_raft::{
    node_name, start, Config, DiskLog, FsDisk, LocalNet, MemDisk, Node, NodeTls, QuicNet,
    QuicOptions, RaftHandle, StateMachine, Transport,
};
use starling_rt::time;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Net {
    Quic,
    Local,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum DiskKind {
    Fs,
    Mem,
}

#[derive(Parser, Debug)]
struct Args {
    #[arg(long, value_enum, default_value = "quic")]
    net: Net,
    #[arg(long, value_enum, default_value = "fs")]
    disk: DiskKind,
    /// Concurrent proposers.
    #[arg(long, default_value_t = 64)]
    clients: u64,
    /// Measured seconds (after 1 s of warm-up).
    #[arg(long, default_value_t = 5)]
    secs: u64,
    /// Bytes per command.
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// Runtime workers (actix arbiters).
    #[arg(long, default_value_t = 2)]
    workers: usize,
}

/// Counts applied commands; the bench measures raft, not the state machine.
#[derive(Default)]
struct Counter(u64);

impl StateMachine for Counter {
    fn apply(&mut self, _index: u64, _command: &[u8]) -> Vec<u8> {
        self.0 += 1;
        Vec::new()
    }
    async fn query(&self, _q: &[u8]) -> Vec<u8> {
        self.0.to_be_bytes().to_vec()
    }
    fn snapshot(&self) -> Vec<u8> {
        self.0.to_be_bytes().to_vec()
    }
    fn restore(&mut self, s: &[u8]) -> Result<(), String> {
        self.0 = u64::from_be_bytes(s.try_into().map_err(|_| "bad snapshot")?);
        Ok(())
    }
}

fn config(id: u64) -> Config {
    let mut c = Config::new(id);
    c.initial_voters = vec![1, 2, 3];
    c.tick_interval = Duration::from_millis(50);
    c.snapshot_threshold = 100_000;
    c
}

/// Starts node `id` on the chosen disk, sending through `transport`.
fn start_node(
    id: u64,
    disk: DiskKind,
    dir: &std::path::Path,
    transport: impl Transport,
) -> anyhow::Result<RaftHandle> {
    let cfg = config(id).validate()?;
    let rng = starling_rt::rng::rng();
    Ok(match disk {
        DiskKind::Mem => {
            let log = DiskLog::open(MemDisk::new().with_instant_sync(), cfg.log.clone())?;
            start(Node::new(cfg, log, Counter::default(), rng)?, transport)
        }
        DiskKind::Fs => {
            let log = DiskLog::open(FsDisk::open(dir.join(format!("n{id}")))?, cfg.log.clone())?;
            start(Node::new(cfg, log, Counter::default(), rng)?, transport)
        }
    })
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dir = std::env::temp_dir().join(format!("starling-raft-bench-{}", std::process::id()));
    let result = starling_rt::Runtime::new(args.workers).block_on(run(&args, &dir));
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn run(args: &Args, dir: &std::path::Path) -> anyhow::Result<()> {
    let mut handles = Vec::new();
    let mut nets = Vec::new();
    match args.net {
        Net::Local => {
            let net = LocalNet::new();
            for id in 1..=3 {
                let h = start_node(id, args.disk, dir, net.transport())?;
                net.register(id, h.clone());
                handles.push(h);
            }
        }
        Net::Quic => {
            let ca = starling_net::CertAuthority::generate("bench CA")?;
            let mut peers = BTreeMap::new();
            for id in 1..=3u64 {
                let name = node_name(id);
                let tls = NodeTls {
                    identity: ca.issue(&name, &[&name])?.identity(),
                    ca: ca.cert_der(),
                };
                let bind: SocketAddr = "127.0.0.1:0".parse()?;
                let n = QuicNet::bind(QuicOptions::new(id, bind), &tls).await?;
                peers.insert(id, n.local_addr());
                nets.push(n);
            }
            for (i, n) in nets.iter_mut().enumerate() {
                let h = start_node(i as u64 + 1, args.disk, dir, n.transport(peers.clone()))?;
                n.serve(h.clone());
                handles.push(h);
            }
        }
    }
    let mut leader = None;
    for _ in 0..200 {
        time::sleep(Duration::from_millis(50)).await;
        if let Ok(s) = handles[0].status().await {
            if let Some(l) = s.leader {
                leader = Some(l);
                break;
            }
        }
    }
    let leader = leader.ok_or_else(|| anyhow::anyhow!("no leader"))?;
    let lh: RaftHandle = handles[(leader - 1) as usize].clone();

    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let latencies: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let mut tasks = Vec::new();
    for c in 0..args.clients {
        let (lh, measuring, stop, latencies) = (
            lh.clone(),
            measuring.clone(),
            stop.clone(),
            latencies.clone(),
        );
        let cmd = vec![b'x'; args.size];
        tasks.push(starling_rt::spawn(async move {
            let mut client = lh.client(c + 1);
            let mut mine = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = time::now();
                if client.propose(cmd.clone(), 1).await.is_ok() && measuring.load(Ordering::Relaxed)
                {
                    mine.push(t.elapsed());
                }
            }
            latencies
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(mine);
        }));
    }
    time::sleep(Duration::from_secs(1)).await;
    measuring.store(true, Ordering::Relaxed);
    let t0 = time::now();
    time::sleep(Duration::from_secs(args.secs)).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await?;
    }
    let mut l = latencies.lock().unwrap_or_else(|e| e.into_inner()).clone();
    l.sort();
    anyhow::ensure!(!l.is_empty(), "nothing committed");
    let pct = |p: f64| l[((l.len() as f64 * p) as usize).min(l.len() - 1)];
    println!(
        "net={:?} disk={:?} clients={} size={}B: {:.0} proposals/s, latency p50 {:.2} ms p99 {:.2} ms ({} samples)",
        args.net,
        args.disk,
        args.clients,
        args.size,
        l.len() as f64 / elapsed.as_secs_f64(),
        pct(0.50).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3,
        l.len()
    );
    for h in &handles {
        h.stop();
    }
    for n in &nets {
        n.close();
    }
    Ok(())
}
