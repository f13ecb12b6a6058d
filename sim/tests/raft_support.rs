//! Shared fixtures of the raft simulation suites (`raft_chaos`, `raft_overload`,
//! `raft_membership`): a replicated key-value register, a cluster on simulated machines with
//! crashable disks, two transports over madsim's network (datagrams, or the production QUIC
//! transport with mutual TLS), and a linearizability checker.
//! Included by those suites with `#[path]`; it holds no tests of its own.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use madsim::net::Endpoint;
use madsim::runtime::{Handle, NodeHandle};
use starling_net::CertAuthority;
use starling_raft::eraftpb::Message;
use starling_raft::transport::{decode_message, encode_message};
use starling_raft::{
    node_name, start, Config, Crash, DiskLog, MemDisk, Node, NodeTls, QuicNet, QuicOptions,
    RaftHandle, StateMachine, Transport,
};

pub const RAFT_PORT: u16 = 7000;
const TAG: u64 = 0x5241_4654;

/// Registers `key=value`; a write returns the previous value, a query the current one.
/// `query_cost` models application work (a read that takes time) in simulated time.
#[derive(Default, Clone)]
pub struct Kv {
    pub map: BTreeMap<String, String>,
    pub query_cost: Duration,
}

impl StateMachine for Kv {
    fn apply(&mut self, _index: u64, command: &[u8]) -> Vec<u8> {
        let s = String::from_utf8_lossy(command);
        let (k, v) = s.split_once('=').unwrap_or((&s, ""));
        self.map
            .insert(k.to_string(), v.to_string())
            .unwrap_or_default()
            .into_bytes()
    }
    async fn query(&self, q: &[u8]) -> Vec<u8> {
        if !self.query_cost.is_zero() {
            starling_rt::time::sleep(self.query_cost).await;
        }
        self.map
            .get(&*String::from_utf8_lossy(q))
            .cloned()
            .unwrap_or_default()
            .into_bytes()
    }
    fn snapshot(&self) -> Vec<u8> {
        let mut out = String::new();
        for (k, v) in &self.map {
            out.push_str(&format!("{k}={v}\n"));
        }
        out.into_bytes()
    }
    fn restore(&mut self, s: &[u8]) -> Result<(), String> {
        self.map.clear();
        for line in String::from_utf8_lossy(s).lines() {
            let (k, v) = line.split_once('=').ok_or("bad snapshot line")?;
            self.map.insert(k.into(), v.into());
        }
        Ok(())
    }
}

pub fn ip_of(id: u64) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 1, id as u8))
}

/// Raft messages as datagrams over madsim's network, so that `NetSim` clogs, delays and
/// drops them. `send` never waits: a bounded queue feeds a sender task.
pub struct SimTransport {
    tx: tokio::sync::mpsc::Sender<Message>,
}

impl Transport for SimTransport {
    fn send(&mut self, msg: Message) {
        // A full queue drops the message; raft retransmits.
        let _ = self.tx.try_send(msg);
    }
}

/// How raft messages travel between simulated nodes.
#[derive(Clone)]
pub enum SimNet {
    /// One madsim datagram per message (cheap; lost, delayed and clogged by `NetSim`).
    Datagram,
    /// The production QUIC transport (quinn through starling-net's madsim shim), with each
    /// node's certificate from one cluster CA.
    Quic(Arc<BTreeMap<u64, NodeTls>>),
}

impl SimNet {
    /// QUIC with a fresh cluster CA and a certificate for each of `ids`.
    pub fn quic(ids: &[u64]) -> SimNet {
        let ca = CertAuthority::generate("sim cluster CA").expect("CA");
        let certs = ids
            .iter()
            .map(|&id| {
                let name = node_name(id);
                let identity = ca.issue(&name, &[&name]).expect("node cert").identity();
                let tls = NodeTls {
                    identity,
                    ca: ca.cert_der(),
                };
                (id, tls)
            })
            .collect();
        SimNet::Quic(Arc::new(certs))
    }
}

/// Knobs of one simulated raft node.
#[derive(Clone)]
pub struct NodeOpts {
    pub voters: Vec<u64>,
    pub tweak: Arc<dyn Fn(&mut Config) + Send + Sync>,
    pub query_cost: Duration,
    pub net: SimNet,
}

/// The cluster: simulated machines, their disks, and the live driver of each.
#[derive(Clone)]
pub struct Cluster {
    pub ids: Vec<u64>,
    pub nodes: BTreeMap<u64, NodeHandle>,
    pub disks: BTreeMap<u64, MemDisk>,
    pub handles: Arc<Mutex<BTreeMap<u64, RaftHandle>>>,
}

impl Cluster {
    /// Starts `ids` as simulated machines, each running a raft driver on its own disk.
    pub fn start(ids: &[u64], opts: NodeOpts) -> Cluster {
        // `check!` fired inside an actor must end the run: the watcher re-raises it.
        starling_sim::runner::spawn_tripwire_watcher();
        let handle = Handle::current();
        let handles: Arc<Mutex<BTreeMap<u64, RaftHandle>>> = Arc::default();
        let mut nodes = BTreeMap::new();
        let mut disks = BTreeMap::new();
        for &id in ids {
            let disk = MemDisk::new();
            disks.insert(id, disk.clone());
            let handles = handles.clone();
            let opts = opts.clone();
            let all = ids.to_vec();
            let node = handle
                .create_node()
                .name(format!("raft-{id}"))
                .ip(ip_of(id))
                .init(move || boot(id, all.clone(), disk.clone(), opts.clone(), handles.clone()))
                .build();
            nodes.insert(id, node);
        }
        Cluster {
            ids: ids.to_vec(),
            nodes,
            disks,
            handles,
        }
    }

    pub fn handle(&self, id: u64) -> Option<RaftHandle> {
        self.handles.lock().unwrap().get(&id).cloned()
    }

    /// Power loss: the machine stops, unsynced bytes are lost or torn.
    pub fn kill(&self, id: u64, torn_seed: u64) {
        self.handles.lock().unwrap().remove(&id);
        Handle::current().kill(self.nodes[&id].id());
        self.disks[&id].crash(Crash::Torn { seed: torn_seed });
    }

    pub fn restart(&self, id: u64) {
        Handle::current().restart(self.nodes[&id].id());
    }

    pub fn node_id(&self, id: u64) -> madsim::task::NodeId {
        self.nodes[&id].id()
    }

    /// The leader as the live nodes see it, if they agree on one that claims it.
    pub fn leader(&self) -> Option<u64> {
        let hs = self.handles.lock().unwrap().clone();
        for (id, h) in &hs {
            let m = h.metrics();
            if m.leader.load(std::sync::atomic::Ordering::Relaxed) == *id {
                return Some(*id);
            }
        }
        None
    }
}

async fn boot(
    id: u64,
    all: Vec<u64>,
    disk: MemDisk,
    opts: NodeOpts,
    handles: Arc<Mutex<BTreeMap<u64, RaftHandle>>>,
) {
    let mut cfg = Config::new(id);
    cfg.initial_voters = opts.voters.clone();
    (opts.tweak)(&mut cfg);
    let cfg = cfg.validate().expect("valid config");
    // Recovery must always succeed: a crash only ever tears the tail.
    let log = DiskLog::open(disk, cfg.log.clone()).expect("log recovers after a crash");
    let sm = Kv {
        map: BTreeMap::new(),
        query_cost: opts.query_cost,
    };
    let node = Node::new(cfg, log, sm, starling_rt::rng::rng()).expect("node starts");
    // Held until the node dies: the QUIC endpoint lives as long as its node.
    let mut _quic = None;
    match &opts.net {
        SimNet::Datagram => {
            let h = start_datagram(id, node).await;
            handles.lock().unwrap().insert(id, h);
        }
        SimNet::Quic(certs) => {
            let addr = SocketAddr::new(ip_of(id), RAFT_PORT);
            let mut net = QuicNet::bind(QuicOptions::new(id, addr), &certs[&id])
                .await
                .expect("bind QUIC");
            let peers = all
                .iter()
                .map(|&p| (p, SocketAddr::new(ip_of(p), RAFT_PORT)))
                .collect();
            let h = start(node, net.transport(peers));
            net.serve(h.clone());
            handles.lock().unwrap().insert(id, h);
            _quic = Some(net);
        }
    }
    // The init task is the node's main: tasks it spawned were observed never to run once
    // it returned, so it stays until the node is killed.
    std::future::pending::<()>().await;
}

async fn start_datagram(id: u64, node: Node<DiskLog<MemDisk>, Kv>) -> RaftHandle {
    let ep = Arc::new(
        Endpoint::bind(SocketAddr::new(ip_of(id), RAFT_PORT))
            .await
            .expect("bind"),
    );
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Message>(4096);
    let h = start(node, SimTransport { tx });
    let send_ep = ep.clone();
    starling_rt::spawn(async move {
        while let Some(m) = rx.recv().await {
            let to = SocketAddr::new(ip_of(m.to), RAFT_PORT);
            let _ = send_ep.send_to(to, TAG, &encode_message(&m)).await;
        }
    });
    let recv_h = h.clone();
    starling_rt::spawn(async move {
        while let Ok((data, _from)) = ep.recv_from_raw(TAG).await {
            let Ok(bytes) = data.downcast::<Vec<u8>>() else {
                continue;
            };
            if let Ok(m) = decode_message(&bytes, 64 << 20) {
                recv_h.deliver(m);
            }
        }
    });
    h
}

// --------------------------------------------------------------------------------------
// Linearizability of a key-value register, in the style of Wing & Gong with Lowe's cache
// (as Porcupine does): search for an order of the operations that respects real time and
// the register's semantics. Keys are independent registers, checked one at a time.

#[derive(Clone, Debug)]
pub enum OpKind {
    /// Write a value; `prev` is the value it replaced, if the write completed.
    Write { value: String, prev: Option<String> },
    /// A read that returned `value`.
    Read { value: String },
}

#[derive(Clone, Debug)]
pub struct Op {
    pub client: u64,
    pub key: String,
    pub call: u64,
    /// `u64::MAX` when the outcome is unknown (timeout, node killed): it may have taken
    /// effect at any time after `call`, or never.
    pub ret: u64,
    pub kind: OpKind,
}

/// Shared history of operations.
#[derive(Clone, Default)]
pub struct History(pub Arc<Mutex<Vec<Op>>>);

impl History {
    pub fn push(&self, op: Op) {
        self.0.lock().unwrap().push(op);
    }
    pub fn ops(&self) -> Vec<Op> {
        self.0.lock().unwrap().clone()
    }
}

/// Checks every key's history; returns the first key without a linearization.
pub fn check_linearizable(ops: &[Op]) -> Result<(), String> {
    let mut by_key: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in ops {
        // Reads without an answer constrain nothing.
        if op.ret == u64::MAX && matches!(op.kind, OpKind::Read { .. }) {
            continue;
        }
        by_key.entry(&op.key).or_default().push(op);
    }
    for (key, ops) in by_key {
        if !check_register(&ops) {
            return Err(format!("key {key}: no linearization of {} ops", ops.len()));
        }
    }
    Ok(())
}

fn check_register(ops: &[&Op]) -> bool {
    let n = ops.len();
    let words = n.div_ceil(64);
    let required: usize = ops.iter().filter(|o| o.ret != u64::MAX).count();
    let mut seen: HashSet<(Vec<u64>, String)> = HashSet::new();
    // Depth-first search over (linearized set, register value).
    let mut stack: Vec<(Vec<u64>, String, usize)> = vec![(vec![0; words], String::new(), 0)];
    while let Some((done, value, completed)) = stack.pop() {
        if completed == required {
            return true;
        }
        if !seen.insert((done.clone(), value.clone())) {
            continue;
        }
        let is_done = |i: usize| done[i / 64] & (1 << (i % 64)) != 0;
        // An op can go next only if it was called before every pending op returned.
        let min_ret = (0..n)
            .filter(|&i| !is_done(i))
            .map(|i| ops[i].ret)
            .min()
            .unwrap_or(u64::MAX);
        for i in 0..n {
            if is_done(i) || ops[i].call > min_ret {
                continue;
            }
            let next = match &ops[i].kind {
                OpKind::Write { value: v, prev } => {
                    if let Some(p) = prev {
                        if *p != value {
                            continue;
                        }
                    }
                    v.clone()
                }
                OpKind::Read { value: v } => {
                    if *v != value {
                        continue;
                    }
                    value.clone()
                }
            };
            let mut d = done.clone();
            d[i / 64] |= 1 << (i % 64);
            let c = completed + usize::from(ops[i].ret != u64::MAX);
            stack.push((d, next, c));
        }
    }
    false
}

#[test]
fn checker_accepts_a_linear_history_and_rejects_a_stale_read() {
    let w = |client, call, ret, v: &str, prev: Option<&str>| Op {
        client,
        key: "k".into(),
        call,
        ret,
        kind: OpKind::Write {
            value: v.into(),
            prev: prev.map(Into::into),
        },
    };
    let r = |client, call, ret, v: &str| Op {
        client,
        key: "k".into(),
        call,
        ret,
        kind: OpKind::Read { value: v.into() },
    };
    // Concurrent writes, then a read of the last one.
    let ok = vec![
        w(1, 0, 10, "a", Some("")),
        w(2, 5, 15, "b", Some("a")),
        r(3, 20, 25, "b"),
        w(4, 21, u64::MAX, "c", None),
        r(3, 30, 35, "c"),
    ];
    assert!(check_linearizable(&ok).is_ok());
    // A read after a completed write that still sees the old value.
    let stale = vec![w(1, 0, 10, "a", Some("")), r(2, 20, 30, "")];
    assert!(check_linearizable(&stale).is_err());
    // An unknown write that never shows up is fine; one that shows up before its call is not.
    let early = vec![r(2, 0, 5, "x"), w(1, 10, u64::MAX, "x", None)];
    assert!(check_linearizable(&early).is_err());
}
