//! The cluster actor: this node's member record and route batches proposed to raft, and the
//! replicated routes applied to the shards.
//!
//! It waits on the shards (route changes are sent in order, under their back-pressure)
//! and on raft (proposals run in tasks of their own); the shards never wait on it (they
//! `try_send`, keeping what finds no room).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use std::sync::Arc;

use starling_cluster::{decode, encode, Change, Command, Member, Output, Owner, RouteBook};
use starling_raft::{RaftHandle, RequestId};
use starling_rt::{time, Actor, Addr, Ctx, Reply};

use super::retained::from_cluster;
use confirm::Confirm;
use holds::HoldOp;
use retained::{Barrier, RetainOp};

mod confirm;
mod encode;
mod handed;
mod holds;
mod membership;
mod retained;
mod status;
mod through;
use crate::metrics::add;
use crate::msg::{Claim, ClaimError, ClusterMsg, Proposal, RegistryMsg, RouterMsg};
use crate::seeded::SeededMap;
use crate::settings::Shared;
use crate::shards::Shards;

/// How often the actor retries what failed (its Join, a route batch).
const TICK: Duration = Duration::from_millis(500);

pub(crate) struct ClusterActor {
    node: u64,
    me: Member,
    shards: Shards,
    /// For the node's gauges (`routes`).
    shared: Arc<Shared>,
    raft: Option<RaftHandle>,
    book: RouteBook,
    /// The replicated routes as applied here (filter → nodes).
    routes: BTreeMap<String, BTreeSet<u64>>,
    members: BTreeMap<u64, Member>,
    /// How many members the shards count (`RouterMsg::Members`): the peers listed until
    /// more have joined.
    members_told: usize,
    /// SUBACKs waiting for a filter's route to hold this node.
    route_waits: BTreeMap<String, Vec<tokio::sync::oneshot::Sender<()>>>,
    /// The node's stored sessions are routed again (`ClusterMsg::Restored`): until then
    /// its routes are not stated. The first batch after a start states the whole set, and
    /// one taken before the restored subscriptions were counted would take this node's
    /// routes away cluster-wide for a moment: publishes routed then skip the sessions
    /// waiting here for their clients, and are acknowledged all the same.
    restored: bool,
    shards_restored: usize,
    /// This node's Join is applied with its current addresses.
    joined: bool,
    join_in_flight: bool,
    /// Request ids of this process's proposals: one client id per kind, each with at most
    /// one proposal outstanding (raft's deduplication needs that), drawn at start so that
    /// a restarted node never reuses one.
    join_client: u64,
    route_client: u64,
    owner_client: u64,
    retain_client: u64,
    seq: u64,
    /// Client-id ownership as applied here.
    owners: SeededMap<String, Owner>,
    /// Claims and releases waiting for the next batch, and the batch in flight.
    owner_queue: Vec<OwnerOp>,
    owner_in_flight: Option<Vec<OwnerOp>>,
    registry: Option<Addr<RegistryMsg>>,
    /// Retained sets and deletes waiting for the next batch, and the batch in flight.
    retain_queue: Vec<RetainOp>,
    retain_in_flight: Option<Vec<RetainOp>>,
    /// SUBSCRIBEs waiting for a read barrier: those asked since the read in flight started
    /// wait for the next one (a read that began before them proves nothing about them).
    barrier_queue: Vec<Barrier>,
    barrier_in_flight: Option<Vec<Barrier>>,
    /// Retained changes taken, and settled (applied or failed): a barrier also waits for
    /// those taken before it (a client's own retained PUBLISH just before its SUBSCRIBE).
    retain_taken: u64,
    retain_settled: u64,
    /// The data streams, for sessions handed over.
    links: Option<starling_raft::DataLinks>,
    /// `$exclusive/` and `$limit/N/` holds and releases waiting for the next batch, and the
    /// batch in flight (`holds`).
    hold_queue: Vec<HoldOp>,
    hold_in_flight: Option<Vec<HoldOp>>,
    hold_client: u64,
    mark_client: u64,
    /// Reconnects' confirmations of this node's claims waiting for the next read, and those
    /// of the read in flight (`confirm`).
    confirm_queue: Vec<Confirm>,
    confirm_in_flight: Option<Vec<Confirm>>,
    /// The transport's peers, kept to the members (`membership`).
    peers: Option<starling_raft::PeerControl>,
    /// `cluster.peers` of the configuration, and the last cluster address each member's
    /// record gave (kept after it leaves, while raft may still need to reach it).
    config_peers: BTreeMap<u64, std::net::SocketAddr>,
    known_addrs: BTreeMap<u64, std::net::SocketAddr>,
    /// Raft's status as last asked (every tick), and whether a question is in flight.
    raft_status: Option<Box<starling_raft::Status>>,
    status_in_flight: bool,
    /// Members whose record a `Leave` removed: the leader takes them out of raft's
    /// configuration (one at a time: `removing`), once each has the `Leave` itself.
    departed: BTreeMap<u64, membership::Departed>,
    removing: Option<u64>,
    /// The empty entry a departure waits for is proposed and not answered yet.
    mark_in_flight: bool,
    /// This node left and waits to be out of raft's configuration before it stops.
    lingering: bool,
    /// Its own `Leave` applied (in an apply, which has no context): the turn's end starts
    /// the wait to stop.
    stop_due: bool,
    /// This node is leaving or left (an operator's `starling cluster leave`, or its record
    /// removed by a `Leave`): it no longer states its own record.
    leaving: bool,
    /// Told once this node has left, for the daemon to stop.
    left: tokio::sync::watch::Sender<bool>,
    /// An operator's leave of this node is under way (it tells `left` itself when done).
    leave_running: bool,
    /// Sessions handed over lately, to send again if asked.
    handed: handed::Handed,
    /// Sessions to hand over, encoded off this actor's turn.
    encoder: encode::Encoder,
    /// How far this node and the others are through with what they routed (`through`).
    through: through::Through,
}

/// A claim (with whom to answer), a release or a move's cut (with the times it was
/// proposed before), waiting for its commit.
enum OwnerOp {
    Claim(Arc<str>, Reply<Result<Claim, ClaimError>>),
    Release(Arc<str>, u64),
    Moved(Arc<str>, u64, u32),
}

/// Times a move's cut is proposed again after a failed proposal (no quorum for a while):
/// after that the shards stop waiting for it on their own (`routing::moving`).
const MOVED_TRIES: u32 = 5;

/// Claims and releases per proposal at most: one entry of the log stays small.
const OWNER_BATCH_MAX: usize = 1024;

impl ClusterActor {
    pub(crate) fn new(
        node: u64,
        me: Member,
        shards: Shards,
        shared: Arc<Shared>,
        clients: [u64; 6],
        left: tokio::sync::watch::Sender<bool>,
    ) -> Self {
        let config_peers = shared.config.cluster.peers.clone();
        let members_told = config_peers.len();
        ClusterActor {
            node,
            me,
            shards,
            shared,
            raft: None,
            book: RouteBook::new(node),
            routes: BTreeMap::new(),
            members: BTreeMap::new(),
            members_told,
            route_waits: BTreeMap::new(),
            restored: false,
            shards_restored: 0,
            joined: false,
            join_in_flight: false,
            join_client: clients[0],
            route_client: clients[1],
            owner_client: clients[2],
            retain_client: clients[3],
            seq: 0,
            owners: SeededMap::with_hasher(crate::seeded::hasher()),
            owner_queue: Vec::new(),
            owner_in_flight: None,
            registry: None,
            retain_queue: Vec::new(),
            retain_in_flight: None,
            barrier_queue: Vec::new(),
            barrier_in_flight: None,
            retain_taken: 0,
            retain_settled: 0,
            links: None,
            hold_queue: vec![HoldOp::DropMine],
            hold_in_flight: None,
            hold_client: clients[4],
            mark_client: clients[5],
            confirm_queue: Vec::new(),
            confirm_in_flight: None,
            peers: None,
            config_peers,
            known_addrs: BTreeMap::new(),
            raft_status: None,
            status_in_flight: false,
            departed: BTreeMap::new(),
            removing: None,
            mark_in_flight: false,
            lingering: false,
            stop_due: false,
            leaving: false,
            left,
            leave_running: false,
            handed: handed::Handed::default(),
            encoder: encode::Encoder::new(),
            through: through::Through::default(),
        }
    }

    fn propose(&mut self, kind: Proposal, command: Command, ctx: &mut Ctx<Self>) {
        // Every caller checks first: what it took out of its queue would be lost here.
        let Some(raft) = self.raft.clone() else {
            debug_assert!(false, "a {kind:?} proposal without raft");
            return;
        };
        self.seq += 1;
        let id = RequestId {
            client_id: match kind {
                Proposal::Join => self.join_client,
                Proposal::Routes => self.route_client,
                Proposal::Owners => self.owner_client,
                Proposal::Retained => self.retain_client,
                Proposal::Holds => self.hold_client,
                Proposal::Mark => self.mark_client,
            },
            seq: self.seq,
        };
        let shared = self.shared.clone();
        ctx.spawn_then(
            async move {
                let started = time::now();
                let r = raft.propose(id, encode(&command)).await;
                if r.is_ok() {
                    let m = &shared.metrics;
                    let us = time::now().saturating_duration_since(started).as_micros();
                    add(&m.cluster_raft_commits, 1);
                    add(
                        &m.cluster_raft_commit_us,
                        u64::try_from(us).unwrap_or(u64::MAX),
                    );
                }
                r
            },
            move |r| ClusterMsg::Proposed {
                kind,
                result: match r {
                    Ok(bytes) => decode::<Output>(&bytes).map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                },
            },
        );
    }

    /// Proposes what is due: this node's Join until it is applied, then route batches.
    fn propose_due(&mut self, ctx: &mut Ctx<Self>) {
        if self.raft.is_none() {
            // A restarted node learns `joined` from its own log before raft's handle
            // arrives: a batch taken now would stay in flight with nobody proposing it,
            // and the book sends no other while one is in flight.
            return;
        }
        if self.leaving {
            // A node that left states nothing more: its record, routes and claims are gone
            // from the log and must stay gone.
            return;
        }
        if !self.joined {
            if !self.join_in_flight {
                self.join_in_flight = true;
                let c = Command::Join {
                    node: self.node,
                    member: self.me.clone(),
                };
                self.propose(Proposal::Join, c, ctx);
            }
            return;
        }
        // Taking a batch marks it in flight: not before it may be proposed.
        let batch = if self.restored {
            self.book.take_batch()
        } else {
            None
        };
        if let Some(batch) = batch {
            self.propose(Proposal::Routes, batch, ctx);
        }
        self.propose_owners(ctx);
        self.propose_retained(ctx);
        self.propose_holds(ctx);
    }

    /// Proposes the claims and releases waiting, as one batch, if none is in flight.
    fn propose_owners(&mut self, ctx: &mut Ctx<Self>) {
        // After this node's Join: a claim by a node that is not a member is refused.
        if self.owner_in_flight.is_some()
            || self.owner_queue.is_empty()
            || self.raft.is_none()
            || !self.joined
        {
            return;
        }
        let n = self.owner_queue.len().min(OWNER_BATCH_MAX);
        let ops: Vec<OwnerOp> = self.owner_queue.drain(..n).collect();
        let node = self.node;
        let commands = ops
            .iter()
            .map(|op| match op {
                OwnerOp::Claim(c, _) => Command::Claim {
                    client_id: c.to_string(),
                    node,
                },
                OwnerOp::Release(c, epoch) => Command::Release {
                    client_id: c.to_string(),
                    owner: Owner {
                        node,
                        epoch: *epoch,
                    },
                },
                OwnerOp::Moved(c, epoch, _) => Command::Moved {
                    client_id: c.to_string(),
                    node,
                    epoch: *epoch,
                },
            })
            .collect();
        self.owner_in_flight = Some(ops);
        self.propose(Proposal::Owners, Command::Batch(commands), ctx);
    }

    /// The batch of claims and releases in flight was applied (`outputs`, one per op) or
    /// failed (`Err`).
    fn owners_done(&mut self, result: Result<Output, String>) {
        let Some(ops) = self.owner_in_flight.take() else {
            return;
        };
        let outputs = match result {
            Ok(Output::Batch(o)) => Ok(o),
            Ok(other) => Err(format!("unexpected output {other:?}")),
            Err(e) => Err(e),
        };
        for (i, op) in ops.into_iter().enumerate() {
            let (client_id, reply) = match op {
                OwnerOp::Claim(client_id, reply) => (client_id, reply),
                OwnerOp::Moved(c, epoch, tries) if outputs.is_err() && tries < MOVED_TRIES => {
                    self.owner_queue.push(OwnerOp::Moved(c, epoch, tries + 1));
                    continue;
                }
                _ => continue,
            };
            let answer = match &outputs {
                Ok(outs) => match outs.get(i) {
                    Some(Output::Claimed { owner, previous }) => {
                        // A later claim by another node, applied before this answer came
                        // back, wins: this one is fenced before it is used.
                        match self.owners.get(&*client_id) {
                            Some(now) if now.epoch > owner.epoch && now.node != self.node => {
                                Err(ClaimError::Superseded { node: now.node })
                            }
                            _ => Ok(Claim {
                                epoch: owner.epoch,
                                previous: previous.map(|p| p.node),
                            }),
                        }
                    }
                    other => Err(ClaimError::Unavailable(format!("{other:?}"))),
                },
                Err(e) => Err(ClaimError::Unavailable(e.clone())),
            };
            let _ = reply.send(answer);
        }
    }

    /// Ownership of `client_id` changed to `owner`: a claim by another node takes over a
    /// session held here under an older one, or under none (`unowned_takes`).
    ///
    /// A claim applied again at a restart (`unowned_takes` false) takes a session here only
    /// when it took the id from this node: the log is applied again from the oldest claim,
    /// and an older claim of another node, before this node's own, handed away the session
    /// this node had just restored from its store (to a node that no longer wanted it). A
    /// new claim, or a snapshot, which says who owns the id now, takes whatever session
    /// this node holds for the id: one restored under a claim it no longer shows, or one a
    /// reconnect got from a stale claim.
    async fn owner_changed(
        &mut self,
        client_id: String,
        owner: Option<Owner>,
        unowned_takes: bool,
    ) {
        let before = match owner {
            Some(o) => self.owners.insert(client_id.clone(), o),
            None => self.owners.remove(&client_id),
        };
        let Some(o) = owner else { return };
        let takes = match before {
            Some(b) => b.node == self.node,
            None => unowned_takes,
        };
        if o.node == self.node || !takes {
            return;
        }
        if let Some(r) = &self.registry {
            let msg = RegistryMsg::TakenOver {
                client_id: Arc::from(client_id),
                epoch: o.epoch,
                node: o.node,
            };
            let _ = r.send(msg).await;
        }
    }

    /// Applies one filter's new node set: each other node gained or lost is told to every
    /// shard, in order.
    async fn route(&mut self, filter: String, nodes: Vec<u64>) {
        self.book.replicated(&filter, &nodes);
        if self.book.routed(&filter) {
            for w in self.route_waits.remove(&filter).into_iter().flatten() {
                let _ = w.send(());
            }
        }
        let new: BTreeSet<u64> = nodes.into_iter().collect();
        let old = self.routes.remove(&filter).unwrap_or_default();
        // Every change of the view passes here (a reset too): the gauge follows it.
        self.shared
            .metrics
            .routes
            .shift(new.len() as i64 - old.len() as i64);
        let me = self.node;
        let gained: Vec<u64> = new.difference(&old).copied().filter(|n| *n != me).collect();
        let lost: Vec<u64> = old.difference(&new).copied().filter(|n| *n != me).collect();
        for (node, present) in gained
            .into_iter()
            .map(|n| (n, true))
            .chain(lost.into_iter().map(|n| (n, false)))
        {
            for shard in self.shards.all() {
                let msg = RouterMsg::RemoteRoute {
                    filter: filter.clone(),
                    node,
                    present,
                };
                let _ = shard.send(msg).await;
            }
        }
        if !new.is_empty() {
            self.routes.insert(filter, new);
        }
    }

    async fn changed(&mut self, index: u64, changes: Vec<Change>, replayed: bool) {
        let mut left = Vec::new();
        let mut routes = false;
        for c in changes {
            match c {
                Change::Member { node, member } => {
                    match member {
                        Some(m) => {
                            if node == self.node && m == self.me {
                                self.joined = true;
                            }
                            self.departed.remove(&node);
                            self.members.insert(node, m);
                        }
                        None => {
                            if node == self.node {
                                self.joined = false;
                                self.left_here();
                            }
                            self.departed.insert(node, membership::Departed::now());
                            // Not from this node's own log at its start: that node may have
                            // joined again since, with batches parked for it after.
                            if self.members.remove(&node).is_some() && !replayed {
                                left.push(node);
                            }
                        }
                    };
                    self.sync_peers();
                }
                Change::Route { filter, nodes } => {
                    routes = true;
                    self.route(filter, nodes).await;
                }
                Change::Owner { client_id, owner } => {
                    self.owner_changed(client_id, owner, !replayed).await
                }
                Change::Retained { topic, message } => {
                    self.retained_changed(topic, message).await;
                }
                Change::Moved {
                    client_id,
                    node,
                    epoch,
                } => {
                    routes = true;
                    let client_id: Arc<str> = Arc::from(client_id);
                    for shard in self.shards.all() {
                        let msg = RouterMsg::Moved {
                            client_id: client_id.clone(),
                            node,
                            epoch,
                            index,
                        };
                        let _ = shard.send(msg).await;
                    }
                }
            }
        }
        if routes {
            self.routes_at(index).await;
        }
        self.nodes_left(left).await;
        self.tell_members().await;
    }

    /// Tells every shard how many members there are, when that changes the automatic
    /// forwarding window, shared among the others (`routing::forward_window`): only past
    /// the peers listed, which the shards count from the start.
    async fn tell_members(&mut self) {
        let n = self
            .members
            .len()
            .max(self.shared.config.cluster.peers.len());
        if n == self.members_told {
            return;
        }
        self.members_told = n;
        for shard in self.shards.all() {
            let _ = shard.send(RouterMsg::Members(n)).await;
        }
    }

    /// Tells every shard that the routes up to `index` are applied (behind the route
    /// changes it was told of): what they route from now on is stamped with it
    /// (`routing::moving`).
    async fn routes_at(&self, index: u64) {
        for shard in self.shards.all() {
            let _ = shard.send(RouterMsg::RoutesAt(index)).await;
        }
    }

    /// Tells every shard that `nodes` left, once their routes are gone (a `Leave` applies
    /// its routes' removal after the member's).
    async fn nodes_left(&mut self, nodes: Vec<u64>) {
        for node in nodes.into_iter().filter(|n| *n != self.node) {
            for shard in self.shards.all() {
                let _ = shard.send(RouterMsg::NodeLeft(node)).await;
            }
        }
    }

    /// Replaces the replicated view with `all` (the whole state as changes).
    async fn reset(&mut self, all: Vec<Change>) {
        let mut routes: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        let mut members = BTreeMap::new();
        let mut owners = Vec::new();
        let mut departed = Vec::new();
        let (now, wall) = (time::now(), time::wall());
        let mut retained: Vec<Vec<Arc<starling_session::Message>>> =
            vec![Vec::new(); self.shards.count()];
        for c in all {
            match c {
                Change::Retained {
                    topic,
                    message: Some(m),
                } => {
                    if let Some(m) = from_cluster(&topic, &m, now, wall) {
                        retained[self.shards.index_for_publish(&topic)].push(m);
                    }
                }
                Change::Route { filter, nodes } => {
                    routes.insert(filter, nodes);
                }
                Change::Owner {
                    client_id,
                    owner: Some(o),
                } => owners.push((client_id, o)),
                Change::Member {
                    node,
                    member: Some(m),
                } => {
                    members.insert(node, m);
                }
                Change::Member { node, member: None } => {
                    departed.push(node);
                }
                _ => {}
            }
        }
        if self.joined && !members.contains_key(&self.node) {
            self.left_here();
        }
        self.joined = members.get(&self.node) == Some(&self.me);
        // Those whose record goes now left, and so did those the snapshot names (format 1
        // named none): a node restarted on a snapshot taken after a `Leave` knew of no
        // record to go, and as leader kept the node in raft's configuration for good.
        let mut left = Vec::new();
        for gone in self.members.keys().filter(|n| !members.contains_key(n)) {
            self.departed.insert(*gone, membership::Departed::now());
            left.push(*gone);
        }
        for gone in departed {
            if gone != self.node {
                self.departed
                    .entry(gone)
                    .or_insert_with(membership::Departed::now);
            } else if self.raft.is_none() {
                // This node's own snapshot, at its start (raft's handle comes after it),
                // says it left: it stops again, as when it replays its `Leave` from the
                // log. Not a leader's snapshot, sent to a node that joins again under the
                // same id with an empty data dir.
                self.left_here();
            }
        }
        self.members = members;
        self.sync_peers();
        self.book.replicated_reset();
        let gone: Vec<String> = self
            .routes
            .keys()
            .filter(|f| !routes.contains_key(*f))
            .cloned()
            .collect();
        for f in gone {
            self.route(f, Vec::new()).await;
        }
        for (f, nodes) in routes {
            self.route(f, nodes).await;
        }
        let mut gone: std::collections::HashSet<String> = self.owners.keys().cloned().collect();
        for (c, o) in owners {
            gone.remove(&c);
            if self.owners.get(&c) != Some(&o) {
                self.owner_changed(c, Some(o), true).await;
            }
        }
        for c in gone {
            self.owners.remove(&c);
        }
        for (shard, part) in self.shards.all().iter().zip(retained) {
            let _ = shard.send(RouterMsg::ClusterRetainedReset(part)).await;
        }
        self.nodes_left(left).await;
        self.tell_members().await;
    }

    fn wait_route(&mut self, filter: String, done: tokio::sync::oneshot::Sender<()>) {
        if self.book.routed(&filter) {
            let _ = done.send(());
            return;
        }
        let waits = self.route_waits.entry(filter).or_default();
        // SUBACKs stop waiting after a bound of their own: drop the ones nobody awaits.
        waits.retain(|w| !w.is_closed());
        waits.push(done);
    }
}

impl Actor for ClusterActor {
    type Msg = ClusterMsg;

    async fn started(&mut self, ctx: &mut Ctx<Self>) {
        ctx.every(TICK, || ClusterMsg::Tick);
    }

    async fn handle(&mut self, msg: ClusterMsg, ctx: &mut Ctx<Self>) {
        match msg {
            ClusterMsg::Raft(raft) => {
                self.raft = Some(raft);
                self.propose_due(ctx);
                self.start_barrier(ctx);
                self.start_confirm(ctx);
            }
            ClusterMsg::Route {
                filter,
                present,
                done,
            } => {
                if present {
                    self.book.subscribed(&filter);
                } else {
                    self.book.unsubscribed(&filter);
                }
                if let Some(done) = done {
                    self.wait_route(filter, done);
                }
                self.propose_due(ctx);
            }
            ClusterMsg::RouteWait { filter, done } => self.wait_route(filter, done),
            ClusterMsg::Changed {
                index,
                changes,
                replayed,
            } => {
                self.changed(index, changes, replayed).await;
                self.propose_due(ctx);
            }
            ClusterMsg::Reset {
                index,
                all,
                snapshot,
            } => {
                self.reset(all).await;
                // Index 0: the empty state a first start bootstraps from.
                if snapshot && index > 0 {
                    tracing::info!(
                        node_id = self.node,
                        index,
                        members = self.members.len(),
                        departed = self.departed.len(),
                        routes = self.routes.len(),
                        owners = self.owners.len(),
                        "cluster state restored from a snapshot"
                    );
                }
                self.routes_at(index).await;
                self.propose_due(ctx);
            }
            ClusterMsg::Claim { client_id, reply } => {
                self.owner_queue.push(OwnerOp::Claim(client_id, reply));
                self.propose_owners(ctx);
            }
            ClusterMsg::Hold {
                filter,
                client_id,
                limit,
                done,
            } => {
                self.hold_queue.push(HoldOp::Hold {
                    filter,
                    client_id,
                    limit,
                    done,
                });
                self.propose_holds(ctx);
            }
            ClusterMsg::Unhold {
                filter,
                client_id,
                exclusive,
            } => {
                self.hold_queue.push(HoldOp::Unhold {
                    filter,
                    client_id,
                    exclusive,
                });
                self.propose_holds(ctx);
            }
            ClusterMsg::Release { client_id, epoch } => {
                self.owner_queue.push(OwnerOp::Release(client_id, epoch));
                self.propose_owners(ctx);
            }
            ClusterMsg::ReadOwners { client_ids, reply } => self.read_owners(client_ids, reply),
            ClusterMsg::Moved { client_id, epoch } => {
                self.owner_queue.push(OwnerOp::Moved(client_id, epoch, 0));
                self.propose_owners(ctx);
            }
            ClusterMsg::Registry(r) => self.registry = Some(r),
            ClusterMsg::Restored => {
                self.shards_restored += 1;
                if self.shards_restored == self.shards.all().len() {
                    self.restored = true;
                    self.propose_due(ctx);
                }
            }
            ClusterMsg::CheckDeparted => self.check_departed(ctx),
            ClusterMsg::MembersRead(read) => self.members_read(read).await,
            ClusterMsg::Links(l) => self.links = Some(l),
            ClusterMsg::SendSession {
                to,
                client_id,
                epoch,
                handoff,
            } => {
                if self.links.is_some() {
                    let s = encode::ToEncode {
                        to,
                        client_id,
                        epoch,
                        handoff,
                    };
                    if let Some(job) = self.encoder.submit(s, self.node) {
                        ctx.spawn_then(job, session_encoded);
                    }
                }
            }
            ClusterMsg::SessionEncoded {
                to,
                client_id,
                epoch,
                frames,
            } => {
                if let Some(job) = self.encoder.finished(self.node) {
                    ctx.spawn_then(job, session_encoded);
                }
                let frames = frames.unwrap_or_else(|_| {
                    tracing::error!(node_id = self.node, %client_id, "encoding a handed-over session failed; the new node starts it afresh");
                    encode::frames(self.node, &client_id, epoch, None)
                });
                if let Some(links) = self.links.clone() {
                    self.handed
                        .keep((to, client_id, epoch), &frames, time::now());
                    super::send_frames(links, to, frames);
                }
            }
            ClusterMsg::SessionWanted {
                by,
                client_id,
                epoch,
            } => {
                let again = self.handed.wanted(by, &client_id, epoch, time::now());
                if let (Some(frames), Some(links)) = (again, self.links.clone()) {
                    tracing::debug!(node_id = self.node, %client_id, epoch, by, "a handed-over session sent again");
                    super::send_frames(links, by, frames);
                }
            }
            ClusterMsg::WantSession {
                from,
                client_id,
                epoch,
            } => {
                if let Some(links) = self.links.clone() {
                    let frame = crate::forward::encode_session_wanted(&client_id, epoch);
                    super::send_frames(links, from, vec![frame]);
                }
            }
            ClusterMsg::SessionComing { client_id, epoch } => {
                if let Some(r) = &self.registry {
                    let _ = r
                        .send(RegistryMsg::HandoverComing { client_id, epoch })
                        .await;
                }
            }
            ClusterMsg::SessionArrived {
                client_id,
                epoch,
                handoff,
            } => {
                if let Some(r) = &self.registry {
                    let msg = RegistryMsg::HandedOver {
                        client_id,
                        epoch,
                        handoff,
                    };
                    let _ = r.send(msg).await;
                }
            }
            ClusterMsg::Retain {
                topic,
                message,
                done,
            } => {
                self.retain_taken += 1;
                self.retain_queue.push(RetainOp {
                    topic,
                    message,
                    done,
                });
                self.propose_retained(ctx);
            }
            ClusterMsg::Barrier(done) => {
                self.barrier_queue.retain(|b| !b.done.is_closed());
                self.barrier_queue.push(Barrier {
                    mark: self.retain_taken,
                    done,
                });
                self.start_barrier(ctx);
            }
            ClusterMsg::BarrierDone(ok) => self.barrier_done(ok, ctx),
            ClusterMsg::Confirm {
                client_id,
                epoch,
                reply,
            } => {
                self.confirm_queue.push(Confirm {
                    client_id,
                    epoch,
                    reply,
                });
                self.start_confirm(ctx);
            }
            ClusterMsg::ConfirmDone(answer) => self.confirm_done(answer, ctx),
            ClusterMsg::Proposed {
                kind: Proposal::Retained,
                result,
            } => {
                self.retained_done(&result).await;
                self.propose_retained(ctx);
                self.start_barrier(ctx);
            }
            ClusterMsg::Proposed {
                kind: Proposal::Holds,
                result,
            } => {
                self.holds_done(result);
                self.propose_holds(ctx);
            }
            ClusterMsg::Proposed {
                kind: Proposal::Owners,
                result,
            } => {
                self.owners_done(result);
                self.propose_owners(ctx);
            }
            ClusterMsg::Proposed {
                kind: Proposal::Mark,
                result,
            } => {
                self.mark_in_flight = false;
                if result.is_err() {
                    tracing::debug!(node_id = self.node, outcome = ?result, "mark after a leave not applied; again at the next status");
                }
            }
            ClusterMsg::Proposed { kind, result } => {
                let ok = matches!(result, Ok(Output::Done));
                if kind == Proposal::Join {
                    self.join_in_flight = false;
                    if ok {
                        // Applied (a Join that changed nothing, after a restart with the
                        // same addresses, shows up in no change).
                        self.joined = true;
                        tracing::info!(node_id = self.node, "cluster member record applied");
                        self.propose_due(ctx);
                    } else {
                        tracing::debug!(node_id = self.node, outcome = ?result, "join not applied yet");
                    }
                } else {
                    if !ok {
                        tracing::debug!(node_id = self.node, outcome = ?result, "route batch not applied; restating");
                    }
                    self.book.done(ok);
                    if ok {
                        self.propose_due(ctx);
                    }
                }
            }
            ClusterMsg::Tick => {
                self.propose_due(ctx);
                self.ask_status(ctx);
                self.through_tick();
                self.tell_through().await;
            }
            ClusterMsg::Through { node, at } => self.through_heard(node, at).await,
            ClusterMsg::ShardThrough {
                shard,
                round,
                routes_at,
                oldest,
            } => self.shard_through(shard, round, routes_at, oldest),
            ClusterMsg::Status(reply) => self.status(reply),
            ClusterMsg::Routes(reply) => {
                let routes = self
                    .routes
                    .iter()
                    .map(|(f, nodes)| (f.clone(), nodes.iter().copied().collect()))
                    .collect();
                let _ = reply.send(routes);
            }
            ClusterMsg::Peers(p) => {
                self.peers = Some(*p);
                self.sync_peers();
            }
            ClusterMsg::RaftStatus(st) => self.raft_status(st, ctx),
            ClusterMsg::AddMember {
                node,
                member,
                reply,
            } => self.add_member(node, member, reply),
            ClusterMsg::Leave { drain, reply } => self.leave(drain, reply, ctx),
            ClusterMsg::Removed(node) => self.removed(node, ctx),
            ClusterMsg::LeaveDone(done) => self.leave_done(done, ctx),
            ClusterMsg::Linger => {
                let _ = self.left.send(true);
            }
        }
        if std::mem::take(&mut self.stop_due) {
            self.stop_when_out(ctx);
        }
    }
}

/// The message an encoded session comes back as.
fn session_encoded((to, client_id, epoch, frames): encode::Encoded) -> ClusterMsg {
    ClusterMsg::SessionEncoded {
        to,
        client_id,
        epoch,
        frames,
    }
}
