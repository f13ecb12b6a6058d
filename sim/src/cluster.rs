//! Simulated nodes: each has an address, an init closure that (re)starts its services, and
//! can be killed, restarted, paused and partitioned.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};

use madsim::net::NetSim;
use madsim::runtime::{Handle, NodeHandle};

/// One simulated machine.
pub struct SimNode {
    pub index: usize,
    pub ip: IpAddr,
    pub handle: NodeHandle,
}

/// Nodes `10.0.0.1 ..= 10.0.0.n`, and a client machine at `10.0.1.1` for test drivers.
pub struct Cluster {
    pub nodes: Vec<SimNode>,
    pub client: NodeHandle,
}

/// The address of node `i` (0-based).
pub fn node_ip(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, (i + 1) as u8))
}

/// The `[cluster.peers]` entries of broker nodes `nodes` (0-based; raft id `i + 1`), each
/// at its address and `port`: `1 = "10.0.0.1:7001"`, a line each.
pub fn peers_toml(nodes: impl IntoIterator<Item = usize>, port: u16) -> String {
    nodes
        .into_iter()
        .map(|n| {
            format!(
                "{} = \"{}\"\n",
                n + 1,
                std::net::SocketAddr::new(node_ip(n), port)
            )
        })
        .collect()
}

impl Cluster {
    /// Builds `n` nodes; `init(i)` is the node's main task, run at start and at each restart.
    pub fn build<F, Fut>(n: usize, init: F) -> Cluster
    where
        F: Fn(usize) -> Fut + Send + Sync + Clone + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        crate::runner::spawn_tripwire_watcher();
        let h = Handle::current();
        let nodes = (0..n)
            .map(|i| {
                let init = init.clone();
                let handle = h
                    .create_node()
                    .name(format!("node{i}"))
                    .ip(node_ip(i))
                    .init(move || init(i))
                    .build();
                SimNode {
                    index: i,
                    ip: node_ip(i),
                    handle,
                }
            })
            .collect();
        let client = h
            .create_node()
            .name("client")
            .ip(IpAddr::V4(Ipv4Addr::new(10, 0, 1, 1)))
            .build();
        Cluster { nodes, client }
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Crash-stops node `i`: its tasks vanish, its sockets close.
    pub fn kill(&self, i: usize) {
        Handle::current().kill(self.nodes[i].handle.id());
    }

    /// Kills (if needed) and restarts node `i`, re-running its init.
    pub fn restart(&self, i: usize) {
        // madsim refuses a restart of a live node (its ports are still bound).
        Handle::current().kill(self.nodes[i].handle.id());
        Handle::current().restart(self.nodes[i].handle.id());
    }

    pub fn pause(&self, i: usize) {
        Handle::current().pause(self.nodes[i].handle.id());
    }

    pub fn resume(&self, i: usize) {
        Handle::current().resume(self.nodes[i].handle.id());
    }

    /// Cuts node `i` off from everyone, both ways.
    pub fn isolate(&self, i: usize) {
        NetSim::current().clog_node(self.nodes[i].handle.id());
    }

    /// Drops traffic from `a` to `b` only.
    pub fn clog_one_way(&self, a: usize, b: usize) {
        NetSim::current().clog_link(self.nodes[a].handle.id(), self.nodes[b].handle.id());
    }

    /// Lets traffic from `a` to `b` through again.
    pub fn unclog_one_way(&self, a: usize, b: usize) {
        NetSim::current().unclog_link(self.nodes[a].handle.id(), self.nodes[b].handle.id());
    }

    /// Drops traffic between `a` and `b`, both ways.
    pub fn clog_link(&self, a: usize, b: usize) {
        self.clog_one_way(a, b);
        self.clog_one_way(b, a);
    }

    /// Removes every partition.
    pub fn heal_network(&self) {
        let net = NetSim::current();
        for a in &self.nodes {
            net.unclog_node(a.handle.id());
            for b in &self.nodes {
                if a.index != b.index {
                    net.unclog_link(a.handle.id(), b.handle.id());
                }
            }
        }
    }
}
