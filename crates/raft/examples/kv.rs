//! A replicated key-value store: one raft node per process, QUIC with mutual TLS between them,
//! the log on disk, and a small HTTP interface.
//!
//! ```sh
//! cargo run -p starling-raft --example cert -- --dir certs --nodes 1,2,3 --names 127.0.0.1
//! for i in 1 2 3; do
//!   cargo run -p starling-raft --example kv -- --id $i \
//!     --peers 1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003 \
//!     --data-dir data/$i --certs certs --http 127.0.0.1:800$i &
//! done
//! curl -X PUT --data-binary v1 127.0.0.1:8001/kv/k1    # any node; body: the previous value
//! curl 127.0.0.1:8002/kv/k1                            # linearizable read (ReadIndex)
//! curl '127.0.0.1:8003/kv/k1?stale'                    # this node's copy, may be behind
//! curl 127.0.0.1:8001/status                           # role, term, leader, commit, applied
//! ```
//!
//! A write answers `200` once applied (then it survives any minority of crashes), `503` when
//! its outcome is unknown (no leader in time): retrying is then safe only with the same
//! request id, which this simple interface does not expose, so a client retries by reading.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use rand::Rng as _;
use starling_raft::{
    certs, start, Config, Consistency, DiskLog, FsDisk, FsyncPolicy, Node, QuicNet, QuicOptions,
    RaftHandle, RequestError, RequestId, StateMachine,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Parser, Debug)]
#[command(about = "A replicated key-value store over starling-raft")]
struct Args {
    /// This node's raft id.
    #[arg(long)]
    id: u64,
    /// Every member as id=host:port (raft over QUIC), this node included.
    #[arg(long, value_delimiter = ',')]
    peers: Vec<String>,
    /// Where the write-ahead log and snapshots live.
    #[arg(long)]
    data_dir: PathBuf,
    /// Directory with ca.pem and node-<id>.pem/.key (see the `cert` example).
    #[arg(long)]
    certs: PathBuf,
    /// HTTP address for clients.
    #[arg(long)]
    http: SocketAddr,
    /// Raft tick in milliseconds (election timeout = 10 ticks).
    #[arg(long, default_value_t = 100)]
    tick_ms: u64,
    /// Skip fsync (faster; a power loss may lose acknowledged writes).
    #[arg(long)]
    no_fsync: bool,
}

/// Last-writer-wins registers; a write `key=value` returns the previous value.
#[derive(Default)]
struct Kv(BTreeMap<String, String>);

impl StateMachine for Kv {
    fn apply(&mut self, _index: u64, command: &[u8]) -> Vec<u8> {
        let s = String::from_utf8_lossy(command);
        let (k, v) = s.split_once('=').unwrap_or((&s, ""));
        self.0
            .insert(k.into(), v.into())
            .unwrap_or_default()
            .into_bytes()
    }
    async fn query(&self, q: &[u8]) -> Vec<u8> {
        self.0
            .get(&*String::from_utf8_lossy(q))
            .cloned()
            .unwrap_or_default()
            .into_bytes()
    }
    fn snapshot(&self) -> Vec<u8> {
        // key and value lengths first: values may hold any byte.
        let mut out = Vec::new();
        for (k, v) in &self.0 {
            out.extend_from_slice(&(k.len() as u32).to_be_bytes());
            out.extend_from_slice(&(v.len() as u32).to_be_bytes());
            out.extend_from_slice(k.as_bytes());
            out.extend_from_slice(v.as_bytes());
        }
        out
    }
    fn restore(&mut self, mut s: &[u8]) -> Result<(), String> {
        self.0.clear();
        let take = |s: &mut &[u8], n: usize| -> Result<Vec<u8>, String> {
            if s.len() < n {
                return Err("truncated snapshot".into());
            }
            let (a, b) = s.split_at(n);
            *s = b;
            Ok(a.to_vec())
        };
        while !s.is_empty() {
            let kl = u32::from_be_bytes(take(&mut s, 4)?.try_into().unwrap_or_default());
            let vl = u32::from_be_bytes(take(&mut s, 4)?.try_into().unwrap_or_default());
            let k = String::from_utf8(take(&mut s, kl as usize)?).map_err(|e| e.to_string())?;
            let v = String::from_utf8(take(&mut s, vl as usize)?).map_err(|e| e.to_string())?;
            self.0.insert(k, v);
        }
        Ok(())
    }
}

fn parse_peers(list: &[String]) -> anyhow::Result<BTreeMap<u64, SocketAddr>> {
    list.iter()
        .map(|p| {
            let (id, addr) = p.split_once('=').context("peer must be id=host:port")?;
            Ok((id.parse()?, addr.parse()?))
        })
        .collect()
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let peers = parse_peers(&args.peers)?;
    let bind = *peers
        .get(&args.id)
        .context("--peers must include this node's own address")?;
    let tls = certs::load_node_tls(&args.certs, args.id)?;
    let mut cfg = Config::new(args.id);
    cfg.initial_voters = peers.keys().copied().collect();
    cfg.tick_interval = Duration::from_millis(args.tick_ms);
    if args.no_fsync {
        cfg.log.fsync = FsyncPolicy::Never;
    }
    let cfg = cfg.validate()?;
    let disk = FsDisk::open(&args.data_dir).context("data dir")?;
    let log = DiskLog::open(disk, cfg.log.clone())?;

    starling_rt::Runtime::new(2).block_on(async move {
        let node = Node::new(cfg, log, Kv::default(), starling_rt::rng::rng())?;
        let mut net = QuicNet::bind(QuicOptions::new(args.id, bind), &tls).await?;
        let raft = start(node, net.transport(peers));
        net.serve(raft.clone());
        let http = starling_net::listen(args.http).await?;
        println!(
            "kv node {} ready: raft {} http {}",
            args.id,
            net.local_addr(),
            http.local_addr()
        );
        loop {
            let (stream, _) = http.accept().await?;
            let raft = raft.clone();
            starling_rt::spawn(async move {
                let _ = serve_http(stream, raft).await;
            });
        }
    })
}

/// Largest request head and body this interface reads.
const HEAD_BYTES_MAX: usize = 8 << 10;
const BODY_BYTES_MAX: usize = 1 << 20;

/// One request per connection (`Connection: close`).
async fn serve_http(mut s: starling_net::Stream, raft: RaftHandle) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > HEAD_BYTES_MAX {
            return respond(&mut s, 431, b"head too large").await;
        }
        let mut chunk = [0u8; 1024];
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut lines = head.lines();
    let mut first = lines.next().unwrap_or("").split_whitespace();
    let (method, target) = (first.next().unwrap_or(""), first.next().unwrap_or(""));
    let len: usize = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0);
    if len > BODY_BYTES_MAX {
        return respond(&mut s, 413, b"body too large").await;
    }
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let mut chunk = vec![0u8; len - body.len()];
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(len);
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let (code, out) = match (method, path.strip_prefix("/kv/")) {
        (_, Some(key)) if key.is_empty() || key.contains('=') => (400, b"bad key".to_vec()),
        ("GET", Some(key)) => {
            let c = if query == "stale" {
                Consistency::Stale
            } else {
                Consistency::Linearizable
            };
            reply(raft.read(key.as_bytes().to_vec(), c).await)
        }
        ("PUT", Some(key)) => {
            // A fresh client id per request: never a duplicate of another request's id, in
            // this process or any earlier one.
            let id = RequestId {
                client_id: starling_rt::rng::rng().gen(),
                seq: 1,
            };
            let mut cmd = format!("{key}=").into_bytes();
            cmd.extend_from_slice(&body);
            reply(raft.propose(id, cmd).await)
        }
        ("GET", None) if path == "/status" => match raft.status().await {
            Ok(st) => (
                200,
                format!(
                    "id={} role={:?} leader={} term={} commit={} applied={} voters={:?}\n",
                    st.id,
                    st.role,
                    st.leader.unwrap_or(0),
                    st.term,
                    st.commit,
                    st.applied,
                    st.voters
                )
                .into_bytes(),
            ),
            Err(e) => (503, e.to_string().into_bytes()),
        },
        _ => (404, b"not found".to_vec()),
    };
    respond(&mut s, code, &out).await
}

fn reply(r: Result<Vec<u8>, RequestError>) -> (u16, Vec<u8>) {
    match r {
        Ok(v) => (200, v),
        Err(e) => (503, e.to_string().into_bytes()),
    }
}

async fn respond(s: &mut starling_net::Stream, code: u16, body: &[u8]) -> std::io::Result<()> {
    let reason = match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
        _ => "Service Unavailable",
    };
    let head = format!(
        "HTTP/1.1 {code} {reason}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await?;
    s.write_all(body).await?;
    s.flush().await?;
    s.shutdown().await
}
