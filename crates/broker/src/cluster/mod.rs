//! This node in a raft cluster (`cluster.enabled`): the raft group over QUIC whose state is
//! [`starling_cluster::ClusterState`], the cluster actor that keeps this node's member
//! record and routes in it, and the task that hands publishes other nodes forward to the
//! shards.
//!
//! What is replicated and acted on: members, routes (a publish is forwarded once to each
//! node with subscribers for it), client-id ownership (a claim elsewhere takes the session
//! over, and it is handed to the claiming node), retained messages (kept on every node from
//! the log, read after a barrier) and the holders of `$exclusive/` and `$limit/N/`
//! subscriptions (docs/clustering.md).

mod actor;
mod inlink;
mod parts;
mod replica;
mod retained;

pub(crate) use retained::to_cluster as retained_to_cluster;

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::RngCore;
use starling_cluster::{ClusterSm, Member};
use starling_config::{Config, FsyncPolicy, ListenerKind};
use starling_raft::{
    certs, start as start_raft, Config as RaftConfig, DataLinks, DataSendError, DiskLog, FsDisk,
    FsyncPolicy as RaftFsync, Node, QuicNet, QuicOptions, RaftHandle,
};
use starling_rt::{start_with, time, Addr, Options};
use starling_session::WallClock;

use crate::error::BrokerError;
use crate::forward::{self, Frame};
use crate::metrics::add;
use crate::msg::{ClusterMsg, ForwardedPart, LinkFrom, RouterMsg, ShardCluster};
use crate::settings::Shared;
use crate::shards::Shards;

use actor::ClusterActor;
use replica::NodeReplica;

/// Mailbox of the cluster actor: route transitions from every shard and changes from raft.
const CLUSTER_MAILBOX: usize = 4096;
/// Forwarded frames received and not yet routed, before the peers' streams stop being read.
const INBOUND_FRAMES: usize = 256;

/// The running cluster side of a node.
pub(crate) struct ClusterNode {
    actor: Addr<ClusterMsg>,
    raft: RaftHandle,
    net: QuicNet,
    left: tokio::sync::watch::Receiver<bool>,
}

impl ClusterNode {
    /// Starts the raft group, its endpoint and the cluster actor, and wires every shard to
    /// them; `None` when `cluster.enabled` is false.
    ///
    /// # Errors
    /// [`BrokerError::Cluster`] naming the file or the key: certificates that do not load,
    /// a raft log that does not open, an endpoint that cannot bind.
    pub(crate) async fn start(
        shared: &Arc<Shared>,
        shards: &Shards,
    ) -> Result<Option<ClusterNode>, BrokerError> {
        let config = &shared.config;
        let c = &config.cluster;
        if !c.enabled {
            return Ok(None);
        }
        let id = config.node.id;
        let fail =
            |what: &str, e: &dyn std::fmt::Display| BrokerError::Cluster(format!("{what}: {e}"));
        let tls = certs::load_node_tls(&c.certs_dir, id).map_err(|e| {
            fail(
                &format!(
                    "cluster.certs_dir {}: certificates of node {id} (`starling cert cluster`)",
                    c.certs_dir.display()
                ),
                &e,
            )
        })?;
        let mut rc = RaftConfig::new(id);
        if c.bootstrap {
            rc.initial_voters = c.peers.keys().copied().collect();
        }
        rc.tick_interval = std::time::Duration::from_millis(u64::from(c.tick_ms));
        rc.election_tick = c.election_tick as usize;
        rc.raft_priority = c.raft_priority;
        rc.snapshot_threshold = u64::from(c.snapshot_entries);
        rc.log.fsync = match c.fsync {
            FsyncPolicy::Always => RaftFsync::Always,
            FsyncPolicy::Never => RaftFsync::Never,
        };
        let rc = rc.validate().map_err(|e| fail("cluster", &e))?;
        let dir = config.node.data_dir.join("raft");
        let disk =
            FsDisk::open(&dir).map_err(|e| fail(&format!("raft log {}", dir.display()), &e))?;
        let log = DiskLog::open(disk, rc.log.clone())
            .map_err(|e| fail(&format!("raft log {}", dir.display()), &e))?;

        // What the log held committed at start is applied again, in log order.
        let replay_until = starling_raft::LogStore::hard_state(&log).commit;
        let me = member(config);
        let (left_tx, left) = tokio::sync::watch::channel(false);
        let mut rng = starling_rt::rng::rng();
        let actor = start_with(
            ClusterActor::new(
                id,
                me,
                shards.clone(),
                shared.clone(),
                [
                    rng.next_u64(),
                    rng.next_u64(),
                    rng.next_u64(),
                    rng.next_u64(),
                    rng.next_u64(),
                    rng.next_u64(),
                ],
                left_tx,
            ),
            Options::named("cluster").capacity(CLUSTER_MAILBOX),
        );
        let mut net = QuicNet::bind(QuicOptions::new(id, c.bind), &tls)
            .await
            .map_err(|e| fail(&format!("cluster.bind {}", c.bind), &e))?;
        let links = net.data();
        // The shards are wired before the raft node exists: opening it may apply a
        // snapshot, and replaying the log applies entries, and either has the actor tell
        // the shards about routes, moves and departures at once. A shard not wired yet
        // would drop those routes, and route publishes as if no other node subscribed
        // (the joiners-with-kills simulation lost acknowledged publishes that way).
        for shard in shards.all() {
            let wiring = ShardCluster {
                node: id,
                links: links.clone(),
                actor: actor.clone(),
            };
            let _ = shard.send(RouterMsg::Cluster(Box::new(wiring))).await;
        }
        let _ = actor.send(ClusterMsg::Links(links.clone())).await;
        let _ = actor
            .send(ClusterMsg::Peers(Box::new(net.peer_control())))
            .await;
        let node = Node::new(
            rc,
            log,
            ClusterSm::new(NodeReplica::new(actor.clone(), replay_until)),
            rng,
        )
        .map_err(|e| fail(&format!("raft log {}", dir.display()), &e))?;
        let peers: BTreeMap<u64, std::net::SocketAddr> = c.peers.clone();
        let transport = net.transport(peers);
        let raft = start_raft(node, transport);
        let (tx, rx) = tokio::sync::mpsc::channel(INBOUND_FRAMES);
        net.serve_with_data(raft.clone(), Some(tx));
        starling_rt::spawn(inbound(
            rx,
            shards.clone(),
            links.clone(),
            actor.clone(),
            shared.clone(),
        ));
        let _ = actor.send(ClusterMsg::Raft(raft.clone())).await;
        tracing::info!(node_id = id, cluster_addr = %net.local_addr(), peers = c.peers.len(), "cluster endpoint up");
        Ok(Some(ClusterNode {
            actor,
            raft,
            net,
            left,
        }))
    }

    pub(crate) fn actor(&self) -> Addr<ClusterMsg> {
        self.actor.clone()
    }

    /// Resolves once this node has left the cluster (`starling cluster leave`).
    pub(crate) async fn left(&self) {
        let mut left = self.left.clone();
        // An error: the actor is gone, so the node is stopping anyway.
        let _ = left.wait_for(|l| *l).await;
    }

    /// Stops raft and closes the endpoint.
    pub(crate) fn stop(&self) {
        self.raft.stop();
        self.net.close();
        self.actor.stop();
    }
}

/// This node's record: how clients and the other members reach it.
fn member(config: &Config) -> Member {
    let mqtt = config.cluster.advertise_mqtt.clone().unwrap_or_else(|| {
        config
            .listeners
            .iter()
            .find(|l| l.kind == ListenerKind::Tcp)
            .or(config.listeners.first())
            .map(|l| l.bind.to_string())
            .unwrap_or_default()
    });
    // How the others dial it: its own `cluster.peers` entry when it has one (`bind` may be
    // a wildcard address), else its bind.
    let cluster = config
        .cluster
        .peers
        .get(&config.node.id)
        .copied()
        .unwrap_or(config.cluster.bind);
    Member {
        mqtt,
        cluster: cluster.to_string(),
        http: config.http.enabled.then(|| config.http.bind.to_string()),
    }
}

/// Batches routed here and waiting for the shards' link barriers before their sender hears
/// they were taken: a bound on what one peer's acknowledgements may owe (each of its shards
/// stops at its window long before, `routing::link`).
const ACKS_OWED: usize = 4096;

/// One routed batch whose acknowledgement waits: its sending shard, that shard's
/// incarnation, the batch's number, and the barriers of the shards its messages went to.
/// A batch to acknowledge once its barriers answer (`Some`), or one taken before and sent
/// again, to acknowledge again (`None`: behind what is owed before it).
type OwedAck = (
    u16,
    u64,
    u64,
    Option<Vec<tokio::sync::oneshot::Receiver<bool>>>,
);

/// Routes what other nodes forward, frame by frame, in order per sender, and acknowledges
/// each batch once its messages are in this node's shards and no subscriber there holds
/// the sender's link back (each peer's acknowledgements go in order from a task of its
/// own, so a held link delays no other peer); hands acknowledgements of this node's
/// batches to the shard that sent them. Waiting on a shard stops this task reading, and so
/// the peers' streams (QUIC flow control).
async fn inbound(
    mut rx: tokio::sync::mpsc::Receiver<(u64, Vec<u8>)>,
    shards: Shards,
    links: DataLinks,
    actor: Addr<ClusterMsg>,
    shared: Arc<Shared>,
) {
    let node_id = shared.config.node.id;
    let mut owed: BTreeMap<u64, tokio::sync::mpsc::Sender<OwedAck>> = BTreeMap::new();
    let mut order = inlink::InLinks::default();
    let mut sessions = parts::Parts::default();
    while let Some((from, frame)) = rx.recv().await {
        let clock = WallClock {
            now: time::now(),
            wall: time::wall(),
        };
        let frame = match forward::decode(&frame, &clock) {
            Ok(f) => f,
            Err(e) => {
                // Only a member with a certificate from the cluster CA can send one.
                tracing::warn!(node_id, from, error = %e, "forwarded frame refused");
                continue;
            }
        };
        match frame {
            Frame::Publish(forward::Batch {
                shard,
                pos,
                seq,
                probe,
                routed_at,
                messages,
            }) => {
                let v = order.batch((from, shard), pos, seq, probe, time::now());
                if let Some(from_seq) = v.ask {
                    tracing::debug!(
                        node_id,
                        from,
                        shard,
                        seq,
                        missing_from = from_seq,
                        "forwarded batches missing: asked for again"
                    );
                    // One try: a request that finds no room is made again by the next
                    // batch past the gap, or the sender's probe.
                    let _ = links.try_send(from, forward::encode_resend(shard, pos.inc, from_seq));
                }
                if !v.take {
                    add(&shared.metrics.cluster_forward_out_of_order, 1);
                    if v.again {
                        let acks = owed.entry(from).or_insert_with(|| owe(&links, from));
                        if acks.send((shard, pos.inc, seq, None)).await.is_err() {
                            return;
                        }
                    }
                    continue;
                }
                let link = LinkFrom {
                    node: from,
                    shard,
                    inc: pos.inc,
                    seq,
                };
                add(&shared.metrics.cluster_received, messages.len() as u64);
                // One message per shard the batch touches, with its part in order and the
                // link's barrier: a mailbox send per publish cost more than routing it.
                let mut parts: Vec<Vec<_>> = vec![Vec::new(); shards.count()];
                for (m, group) in messages {
                    let i = shards.index_for_publish(&m.topic);
                    parts[i].push((m, group));
                }
                let mut barriers = Vec::new();
                for (to, messages) in shards.all().iter().zip(parts) {
                    if messages.is_empty() {
                        continue;
                    }
                    let (done, wait) = tokio::sync::oneshot::channel();
                    let msg = RouterMsg::Forwarded(Box::new(ForwardedPart {
                        from: link,
                        routed_at,
                        messages,
                        done,
                    }));
                    if to.send(msg).await.is_err() {
                        return;
                    }
                    barriers.push(wait);
                }
                let acks = owed.entry(from).or_insert_with(|| owe(&links, from));
                if acks
                    .send((shard, pos.inc, seq, Some(barriers)))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Frame::SessionPart {
                client_id,
                epoch,
                index,
                total,
                bytes,
            } => {
                let whole = match sessions.part(from, &client_id, (epoch, index, total), &bytes) {
                    parts::Fed::Whole(whole) => whole,
                    parts::Fed::Coming => {
                        // The claiming CONNECT waits on while its session keeps coming.
                        let msg = ClusterMsg::SessionComing {
                            client_id: Arc::from(client_id),
                            epoch,
                        };
                        if actor.send(msg).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    parts::Fed::Dropped => continue,
                };
                drop(bytes);
                match forward::decode(&whole, &clock) {
                    Ok(Frame::Session {
                        client_id,
                        epoch,
                        handoff,
                    }) => {
                        if !session_arrived(&actor, (client_id, from), epoch, handoff).await {
                            return;
                        }
                    }
                    other => {
                        let e = other.err().map(|e| e.to_string());
                        tracing::warn!(node_id, from, error = ?e, "a handed-over session's parts make no session frame");
                    }
                }
            }
            Frame::Session {
                client_id,
                epoch,
                handoff,
            } => {
                if !session_arrived(&actor, (client_id, from), epoch, handoff).await {
                    return;
                }
            }
            Frame::SessionWanted { client_id, epoch } => {
                let msg = ClusterMsg::SessionWanted {
                    by: from,
                    client_id: Arc::from(client_id),
                    epoch,
                };
                if actor.send(msg).await.is_err() {
                    return;
                }
            }
            Frame::Through { at } => {
                if actor
                    .send(ClusterMsg::Through { node: from, at })
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Frame::Ack { shard, inc, seq } => {
                // A batch parked by a shard this run does not have went from another one
                // under its name (`recover::start_shards`).
                let Some(to) = shards.all().get(usize::from(shard) % shards.count()) else {
                    continue;
                };
                let msg = RouterMsg::ForwardAcked {
                    node: from,
                    inc,
                    seq,
                };
                if to.send(msg).await.is_err() {
                    return;
                }
            }
            Frame::NotDurable { shard, inc, seq } => {
                let Some(to) = shards.all().get(usize::from(shard) % shards.count()) else {
                    continue;
                };
                let msg = RouterMsg::ForwardNotDurable {
                    node: from,
                    inc,
                    seq,
                };
                if to.send(msg).await.is_err() {
                    return;
                }
            }
            Frame::Resend {
                shard,
                inc,
                from: first,
            } => {
                let Some(to) = shards.all().get(usize::from(shard)) else {
                    continue;
                };
                let msg = RouterMsg::ForwardResend {
                    node: from,
                    inc,
                    from: first,
                };
                if to.send(msg).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Hands a session another node handed over to the cluster actor; false once the actor is
/// gone (the node stops).
async fn session_arrived(
    actor: &Addr<ClusterMsg>,
    (client_id, from): (String, u64),
    epoch: u64,
    mut handoff: Option<Box<crate::msg::HandOff>>,
) -> bool {
    if let Some(h) = handoff.as_mut() {
        h.from = from;
    }
    let client_id = Arc::from(client_id);
    let msg = ClusterMsg::SessionArrived {
        client_id,
        epoch,
        handoff,
    };
    actor.send(msg).await.is_ok()
}

/// The queue of acknowledgements owed to `to`, and the task that sends them.
fn owe(links: &DataLinks, to: u64) -> tokio::sync::mpsc::Sender<OwedAck> {
    let (tx, rx) = tokio::sync::mpsc::channel(ACKS_OWED);
    starling_rt::spawn(acknowledge(rx, links.clone(), to));
    tx
}

/// Answers `to`'s batches in the order they were routed, each once its barriers are
/// answered (a shard that stops answers none: it is stopping, and so is this node):
/// acknowledged if durable, refused if not.
async fn acknowledge(mut rx: tokio::sync::mpsc::Receiver<OwedAck>, links: DataLinks, to: u64) {
    let mut acked = inlink::Acked::default();
    while let Some((shard, inc, seq, barriers)) = rx.recv().await {
        let Some(barriers) = barriers else {
            for r in acked.again(shard, inc, seq) {
                reply(&links, to, (shard, inc), r).await;
            }
            continue;
        };
        let mut took = inlink::Took::Durable;
        for b in barriers {
            match b.await {
                Ok(true) => {}
                Ok(false) if took == inlink::Took::Durable => took = inlink::Took::NotDurable,
                Ok(false) => {}
                // A shard gone (the node stopping) took nothing for sure.
                Err(_) => took = inlink::Took::Unknown,
            }
        }
        if took != inlink::Took::Durable {
            // Unacknowledged, the batch counts as unconfirmed at its node: its publishers
            // are not told it is durable (one parked there already was: it is counted as
            // lost there).
            tracing::debug!(
                node = to,
                shard,
                seq,
                ?took,
                "forwarded batch not durable here: not acknowledged"
            );
        }
        if let Some(r) = acked.done(shard, inc, seq, took) {
            reply(&links, to, (shard, inc), r).await;
        }
    }
}

/// Sends an acknowledgement or a refusal, waiting for room a little: it is small, and the
/// sender's publishers wait for it. One that cannot go in time is settled by the sender's
/// timeout (an acknowledgement), or its next send of the batch (a refusal).
async fn reply(links: &DataLinks, to: u64, (shard, inc): (u16, u64), r: inlink::Reply) {
    let frame = match r {
        inlink::Reply::Ack(seq) => forward::encode_ack(shard, inc, seq),
        inlink::Reply::NotDurable(seq) => forward::encode_not_durable(shard, inc, seq),
    };
    send_frame(links, to, frame).await;
}

/// Sends `frames` to `to` in order, off the caller's turn (each as [`send_frame`]).
pub(crate) fn send_frames(links: DataLinks, to: u64, frames: Vec<Vec<u8>>) {
    starling_rt::spawn(async move {
        for frame in frames {
            send_frame(&links, to, frame).await;
        }
    });
}

/// Sends `frame` to `to`, waiting up to a second for room on its stream.
pub(crate) async fn send_frame(links: &DataLinks, to: u64, mut frame: Vec<u8>) {
    for _ in 0..100 {
        match links.try_send(to, frame) {
            Ok(()) | Err(DataSendError::Closed) => return,
            Err(DataSendError::Full(f)) => {
                frame = f;
                starling_rt::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    }
}
