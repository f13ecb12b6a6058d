//! The cluster actor: this node's member record and route batches proposed to raft, and the
//! replicated routes applied to the shards.
//!
//! It waits on the shards (route changes are sent in order, under their back-pressure)
//! and on raft (proposals run in tasks of their own); the shards never wait on it (they
//! `try_send`, keeping what finds no room).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use starling_cluster::{decode, encode, Change, Command, Member, Output, RouteBook};
use starling_raft::{RaftHandle, RequestId, Role};
use starling_rt::{Actor, Ctx, Reply};

use crate::msg::{ClusterMsg, ClusterStatus, MemberStatus, RouterMsg};
use crate::shards::Shards;

/// How often the actor retries what failed (its Join, a route batch).
const TICK: Duration = Duration::from_millis(500);

pub(crate) struct ClusterActor {
    node: u64,
    me: Member,
    shards: Shards,
    raft: Option<RaftHandle>,
    book: RouteBook,
    /// The replicated routes as applied here (filter → nodes).
    routes: BTreeMap<String, BTreeSet<u64>>,
    members: BTreeMap<u64, Member>,
    /// SUBACKs waiting for a filter's route to hold this node.
    route_waits: BTreeMap<String, Vec<tokio::sync::oneshot::Sender<()>>>,
    /// This node's Join is applied with its current addresses.
    joined: bool,
    join_in_flight: bool,
    /// Request ids of this process's proposals: one client id per kind, each with at most
    /// one proposal outstanding (raft's deduplication needs that), drawn at start so that
    /// a restarted node never reuses one.
    join_client: u64,
    route_client: u64,
    seq: u64,
}

impl ClusterActor {
    pub(crate) fn new(node: u64, me: Member, shards: Shards, clients: (u64, u64)) -> Self {
        ClusterActor {
            node,
            me,
            shards,
            raft: None,
            book: RouteBook::new(node),
            routes: BTreeMap::new(),
            members: BTreeMap::new(),
            route_waits: BTreeMap::new(),
            joined: false,
            join_in_flight: false,
            join_client: clients.0,
            route_client: clients.1,
            seq: 0,
        }
    }

    fn propose(&mut self, join: bool, command: Command, ctx: &mut Ctx<Self>) {
        let Some(raft) = self.raft.clone() else {
            return;
        };
        self.seq += 1;
        let id = RequestId {
            client_id: if join {
                self.join_client
            } else {
                self.route_client
            },
            seq: self.seq,
        };
        ctx.spawn_then(
            async move { raft.propose(id, encode(&command)).await },
            move |r| ClusterMsg::Proposed {
                join,
                result: match r {
                    Ok(bytes) => decode::<Output>(&bytes).map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                },
            },
        );
    }

    /// Proposes what is due: this node's Join until it is applied, then route batches.
    fn propose_due(&mut self, ctx: &mut Ctx<Self>) {
        if !self.joined {
            if !self.join_in_flight && self.raft.is_some() {
                self.join_in_flight = true;
                let c = Command::Join {
                    node: self.node,
                    member: self.me.clone(),
                };
                self.propose(true, c, ctx);
            }
            return;
        }
        if let Some(batch) = self.book.take_batch() {
            self.propose(false, batch, ctx);
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

    async fn changed(&mut self, changes: Vec<Change>) {
        for c in changes {
            match c {
                Change::Member { node, member } => {
                    match member {
                        Some(m) => {
                            if node == self.node && m == self.me {
                                self.joined = true;
                            }
                            self.members.insert(node, m);
                        }
                        None => {
                            self.members.remove(&node);
                        }
                    };
                }
                Change::Route { filter, nodes } => self.route(filter, nodes).await,
                // Ownership and retained messages are replicated but not acted on yet:
                // sessions and retained messages are still per node (docs/clustering.md).
                Change::Owner { .. } | Change::Retained { .. } => {}
            }
        }
    }

    /// Replaces the replicated view with `all` (the whole state as changes).
    async fn reset(&mut self, all: Vec<Change>) {
        let mut routes: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        let mut members = BTreeMap::new();
        for c in all {
            match c {
                Change::Route { filter, nodes } => {
                    routes.insert(filter, nodes);
                }
                Change::Member {
                    node,
                    member: Some(m),
                } => {
                    members.insert(node, m);
                }
                _ => {}
            }
        }
        self.joined = members.get(&self.node) == Some(&self.me);
        self.members = members;
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

    fn status(&self, reply: Reply<ClusterStatus>) {
        let members = self.members.clone();
        let node = self.node;
        let routes = self.routes.len();
        let routes_converged = self.book.converged();
        let raft = self.raft.clone();
        starling_rt::spawn(async move {
            let st = match raft {
                Some(r) => r.status().await.ok(),
                None => None,
            };
            let voters: BTreeSet<u64> = st
                .as_ref()
                .map(|s| s.voters.iter().copied().collect())
                .unwrap_or_default();
            let learners: BTreeSet<u64> = st
                .as_ref()
                .map(|s| s.learners.iter().copied().collect())
                .unwrap_or_default();
            let ids: BTreeSet<u64> = members
                .keys()
                .chain(&voters)
                .chain(&learners)
                .copied()
                .collect();
            let is_leader = st.as_ref().is_some_and(|s| s.role == Role::Leader);
            let members = ids
                .into_iter()
                .map(|id| {
                    let m = members.get(&id);
                    let progress = st.as_ref().and_then(|s| s.progress.get(&id));
                    MemberStatus {
                        id,
                        mqtt: m.map(|m| m.mqtt.clone()),
                        cluster: m.map(|m| m.cluster.clone()),
                        http: m.and_then(|m| m.http.clone()),
                        voter: voters.contains(&id),
                        // The leader's own entry: it hears itself.
                        active: is_leader
                            .then(|| id == node || progress.is_some_and(|p| p.recent_active)),
                        matched: progress.map(|p| p.matched),
                    }
                })
                .collect();
            let _ = reply.send(ClusterStatus {
                node,
                role: st
                    .as_ref()
                    .map_or("unknown", |s| role_name(s.role))
                    .to_owned(),
                term: st.as_ref().map_or(0, |s| s.term),
                leader: st.as_ref().and_then(|s| s.leader),
                commit: st.as_ref().map_or(0, |s| s.commit),
                applied: st.as_ref().map_or(0, |s| s.applied),
                members,
                routes,
                routes_converged,
            });
        });
    }
}

pub(crate) fn role_name(r: Role) -> &'static str {
    match r {
        Role::Leader => "leader",
        Role::Follower => "follower",
        Role::Candidate => "candidate",
        Role::PreCandidate => "pre_candidate",
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
            ClusterMsg::Changed(changes) => {
                self.changed(changes).await;
                self.propose_due(ctx);
            }
            ClusterMsg::Reset(all) => {
                self.reset(all).await;
                self.propose_due(ctx);
            }
            ClusterMsg::Proposed { join, result } => {
                let ok = matches!(result, Ok(Output::Done));
                if join {
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
            ClusterMsg::Tick => self.propose_due(ctx),
            ClusterMsg::Status(reply) => self.status(reply),
        }
    }
}
