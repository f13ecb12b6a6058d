//! `[cluster]`: this node's place in a raft cluster: its cluster address, the members, the
//! certificates, and the raft clock.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::ConfigError;
use crate::model::FsyncPolicy;

/// `[cluster]` as written.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawCluster {
    pub enabled: bool,
    pub bind: Option<SocketAddr>,
    pub certs_dir: PathBuf,
    /// `[cluster.peers]`: `<id> = "host:port"`. TOML keys are strings, so the ids are
    /// parsed here.
    pub peers: BTreeMap<String, String>,
    pub bootstrap: bool,
    pub advertise_mqtt: Option<String>,
    pub tick_ms: u32,
    pub election_tick: u32,
    pub fsync: FsyncPolicy,
}

impl Default for RawCluster {
    fn default() -> Self {
        RawCluster {
            enabled: false,
            bind: None,
            certs_dir: PathBuf::from("certs"),
            peers: BTreeMap::new(),
            bootstrap: true,
            advertise_mqtt: None,
            tick_ms: 100,
            election_tick: 10,
            fsync: FsyncPolicy::Always,
        }
    }
}

/// `[cluster]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// Run as a member of a cluster. Default false: a node alone.
    pub enabled: bool,
    /// The UDP address of the cluster's QUIC endpoint (raft and forwarded publishes).
    /// Default: this node's entry in `peers`.
    pub bind: SocketAddr,
    /// Directory with `ca.pem`, `node-<id>.pem` and `node-<id>.key` (`starling cert`).
    /// Default `certs`, next to the config file.
    pub certs_dir: PathBuf,
    /// Every member by raft id (`node.id`), this node included, with its cluster address.
    pub peers: BTreeMap<u64, SocketAddr>,
    /// The peers are the cluster's first membership: every one of them is started with
    /// the same list. Default true. A node that joins a running cluster later sets false:
    /// it waits for a member to add it (`starling cluster join`) and never campaigns alone.
    pub bootstrap: bool,
    /// The MQTT address other members and `starling cluster status` show for this node.
    /// Default: the first TCP listener's address.
    pub advertise_mqtt: Option<String>,
    /// The raft clock, in milliseconds. 10..=10000, default 100.
    pub tick_ms: u32,
    /// Ticks without a leader before a follower campaigns (randomized up to twice that).
    /// 5..=1000, default 10 (one second).
    pub election_tick: u32,
    /// When the raft log reaches the disk: `"always"` (default: before anything it holds is
    /// acted on) or `"never"`.
    pub fsync: FsyncPolicy,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        let raw = RawCluster::default();
        ClusterConfig {
            enabled: raw.enabled,
            bind: SocketAddr::from(([0, 0, 0, 0], 7001)),
            certs_dir: raw.certs_dir,
            peers: BTreeMap::new(),
            bootstrap: raw.bootstrap,
            advertise_mqtt: None,
            tick_ms: raw.tick_ms,
            election_tick: raw.election_tick,
            fsync: raw.fsync,
        }
    }
}

fn bad(key: &str, message: String) -> ConfigError {
    ConfigError::BadValue {
        key: key.to_owned(),
        message,
    }
}

pub(crate) fn validate_cluster(
    raw: RawCluster,
    node_id: u64,
    base: Option<&Path>,
) -> Result<ClusterConfig, ConfigError> {
    crate::validate::range("cluster.tick_ms", raw.tick_ms, 10, 10_000)?;
    crate::validate::range("cluster.election_tick", raw.election_tick, 5, 1000)?;
    let mut peers = BTreeMap::new();
    for (id, addr) in &raw.peers {
        let key = format!("cluster.peers.{id}");
        let id: u64 = id
            .parse()
            .ok()
            .filter(|id| *id != 0)
            .ok_or_else(|| bad(&key, format!("`{id}` is not a node id (an integer from 1)")))?;
        let addr: SocketAddr = addr
            .parse()
            .map_err(|_| bad(&key, format!("`{addr}` is not a host:port address")))?;
        if let Some((other, _)) = peers.iter().find(|(_, a)| **a == addr) {
            return Err(bad(&key, format!("{addr} is also node {other}'s address")));
        }
        peers.insert(id, addr);
    }
    let certs_dir = match base {
        Some(base) if raw.certs_dir.is_relative() => base.join(&raw.certs_dir),
        _ => raw.certs_dir.clone(),
    };
    let own = peers.get(&node_id).copied();
    if raw.enabled {
        if peers.is_empty() {
            return Err(bad(
                "cluster.peers",
                "lists no member; a cluster needs every member's id and address".into(),
            ));
        }
        if raw.bootstrap && own.is_none() {
            return Err(bad(
                "cluster.bootstrap",
                format!(
                    "this node (node.id = {node_id}) bootstraps but is not among cluster.peers"
                ),
            ));
        }
        if own.is_none() && raw.bind.is_none() {
            return Err(bad(
                "cluster.peers",
                format!(
                    "has no entry for this node (node.id = {node_id}) and cluster.bind is not set"
                ),
            ));
        }
    }
    Ok(ClusterConfig {
        enabled: raw.enabled,
        bind: raw
            .bind
            .or(own)
            .unwrap_or_else(|| ClusterConfig::default().bind),
        certs_dir,
        peers,
        bootstrap: raw.bootstrap,
        advertise_mqtt: raw.advertise_mqtt,
        tick_ms: raw.tick_ms,
        election_tick: raw.election_tick,
        fsync: raw.fsync,
    })
}
