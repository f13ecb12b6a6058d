//! Membership while the cluster runs: an operator's join (`starling cluster join`) and
//! leave (`starling cluster leave`), the leader removing from raft's configuration the
//! members whose record left the log, and the transport's peers following the members.
//!
//! - **Join**, on the leader: the new node's record is committed first (so every node
//!   dials it), then it becomes a learner, and a voter once the leader sees it hold the log
//!   as it was when it was added. A node that never catches up stays a learner: it counts
//!   in no quorum, so a wrong address or a node that is down cannot cost the cluster its
//!   majority.
//! - **Leave**, on the leaving node: it sends its clients away (0x9C Use another server,
//!   new CONNECTs refused) and waits a while for their sessions to follow them to the
//!   nodes they reconnect to, hands leadership away if it has it, commits a `Leave` of its
//!   own record (its routes, remaining client ids and holds go with it on every node),
//!   then waits for the leader to take it out of raft's configuration (a little while at
//!   most: a removed node may not hear the commit) and stops.
//! - **Peers** are the members' cluster addresses, plus raft's voters and learners without
//!   a record yet (the first members, by their `cluster.peers` entry); a member that left
//!   and is out of raft's configuration is no longer dialed.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use starling_cluster::{decode, encode, Command, Member, Output};
use starling_raft::{RaftHandle, RequestError, RequestId, Role, Status};
use starling_rt::time::Instant;
use starling_rt::{time, Ctx, Reply};

use super::ClusterActor;
use crate::msg::{ClusterMsg, LeftBehind, MembershipError, Owed, Proposal, RegistryMsg, RouterMsg};
use crate::shards::Shards;

/// How long a new learner has to catch up before the join gives up (it stays a learner).
const CATCH_UP: Duration = Duration::from_secs(30);
/// How long a leaving node waits to see itself out of raft's configuration, when its
/// acknowledgement of its removal is needed (one other voter), and when it is not.
const LEAVE_WAIT: Duration = Duration::from_secs(10);
const LEAVE_WAIT_SHORT: Duration = Duration::from_secs(1);
/// How long a leader handing leadership away waits for another node to take it.
const TRANSFER_WAIT: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(100);
/// How long a node that left keeps its raft running at most, waiting to be out of the
/// configuration. The leader's removal needs a status tick, an entry, its replication and
/// a conf change: well under a second on a healthy cluster. The node seldom sees the
/// removal itself (the leader stops sending to it), so it mostly waits all of it; one that
/// stops before the leader saw it reach the entry is removed after `DEPARTED_GRACE`.
const LINGER: Duration = Duration::from_secs(2);
/// How often a draining node counts the sessions it still holds.
const DRAIN_POLL: Duration = Duration::from_millis(200);
/// How long the leader waits for a departed member to hold its own `Leave` before it takes
/// it out of the configuration anyway (it is down, or cut off).
const DEPARTED_GRACE: Duration = Duration::from_secs(30);

/// A member whose record a `Leave` removed, until it is out of raft's configuration. A
/// member removed from the configuration before it applied its own `Leave` would never
/// learn it left (nobody replicates to it any more): it would stay up, alone, trying to
/// rejoin an election it is no longer part of.
///
/// So the leader waits for the member's log to hold an entry sent after the `Leave` was
/// committed (`mark`: the highest next index of the leader's first status after applying
/// the `Leave`; the leader proposes an empty entry if nothing else comes). Raft's append
/// that carried it also carried a commit index at least the `Leave`'s, and the member
/// acknowledged it, so it has the `Leave` committed and applies it on its own. (Holding
/// the `Leave` itself was not enough: the member may have its entry without hearing it is
/// committed, and a partition at that moment left it out for good.)
#[derive(Debug, Clone, Copy)]
pub(crate) struct Departed {
    mark: Option<u64>,
    /// The member's log reaches `mark`.
    held: bool,
    at: Instant,
}

impl Departed {
    pub(crate) fn now() -> Departed {
        Departed {
            mark: None,
            held: false,
            at: time::now(),
        }
    }
}

impl ClusterActor {
    /// Raft's status arrived (every tick): the peers follow it, and the leader removes
    /// departed members from the configuration.
    pub(super) fn raft_status(&mut self, st: Option<Box<Status>>, ctx: &mut Ctx<Self>) {
        self.status_in_flight = false;
        let Some(st) = st else { return };
        // On the leader: no entry at or past the highest next index was sent to anyone yet
        // (its own counts: its next index is past its last entry), so whatever is sent
        // there from now on carries the commit index as it is now, past the `Leave`.
        let next = st.progress.values().map(|p| p.next_index).max();
        let mut need_mark = false;
        for (id, d) in self.departed.iter_mut() {
            if d.mark.is_none() {
                d.mark = next.map(|n| n.max(st.applied + 1));
            }
            let Some(mark) = d.mark else { continue };
            d.held = st.progress.get(id).is_some_and(|p| p.matched >= mark);
            need_mark |= !d.held && next.is_some_and(|n| n <= mark);
        }
        if need_mark && st.role == Role::Leader && !self.mark_in_flight && self.raft.is_some() {
            self.mark_in_flight = true;
            self.propose(Proposal::Mark, Command::Batch(Vec::new()), ctx);
        }
        self.raft_status = Some(st);
        self.sync_peers();
        self.remove_departed(ctx);
    }

    /// Asks raft for its status, unless a question is in flight.
    pub(super) fn ask_status(&mut self, ctx: &mut Ctx<Self>) {
        let Some(raft) = self.raft.clone() else {
            return;
        };
        if self.status_in_flight {
            return;
        }
        self.status_in_flight = true;
        ctx.spawn_then(async move { raft.status().await.ok() }, |st| {
            ClusterMsg::RaftStatus(st.map(Box::new))
        });
    }

    /// Makes the transport dial exactly the members, and the nodes in raft's configuration.
    pub(super) fn sync_peers(&mut self) {
        let Some(peers) = &self.peers else { return };
        for (id, m) in &self.members {
            if let Ok(a) = m.cluster.parse::<SocketAddr>() {
                self.known_addrs.insert(*id, a);
            }
        }
        let mut want: BTreeSet<u64> = self.members.keys().copied().collect();
        // Until raft has answered once, the configured peers stand (a restarted node
        // replays its members before raft runs).
        match &self.raft_status {
            Some(st) => want.extend(st.voters.iter().chain(&st.learners)),
            None => want.extend(self.config_peers.keys()),
        }
        want.remove(&self.node);
        for id in &want {
            // This node's own configuration first: what its operator said to dial.
            let addr = self
                .config_peers
                .get(id)
                .copied()
                .or_else(|| self.members.get(id).and_then(|m| m.cluster.parse().ok()))
                .or_else(|| self.known_addrs.get(id).copied());
            if let Some(addr) = addr {
                if peers.set(*id, addr) {
                    tracing::info!(node_id = self.node, peer = id, %addr, "cluster peer dialed");
                }
            }
        }
        // Only members that left are dropped: a node that connected in unlisted (one being
        // added, heard before its record is) stays dialed.
        for id in peers.list().into_keys() {
            if self.departed.contains_key(&id) && !want.contains(&id) && peers.remove(id) {
                tracing::info!(node_id = self.node, peer = id, "cluster peer dropped");
            }
        }
    }

    /// On the leader: takes out of raft's configuration one member whose record a `Leave`
    /// removed, if no removal is in flight.
    fn remove_departed(&mut self, ctx: &mut Ctx<Self>) {
        let (Some(st), Some(raft)) = (&self.raft_status, &self.raft) else {
            return;
        };
        if st.role != Role::Leader || self.removing.is_some() {
            return;
        }
        let now = time::now();
        let Some(gone) = self
            .departed
            .iter()
            .filter(|(id, _)| **id != self.node)
            .filter(|(id, _)| st.voters.contains(id) || st.learners.contains(id))
            .find(|(_, d)| d.held || now.duration_since(d.at) >= DEPARTED_GRACE)
            .map(|(id, _)| *id)
        else {
            return;
        };
        self.removing = Some(gone);
        let raft = raft.clone();
        let node_id = self.node;
        ctx.spawn_then(
            async move {
                match raft.remove_node(gone).await {
                    Ok(_) => tracing::info!(node_id, removed = gone, "departed member out of raft's configuration"),
                    Err(e) => tracing::warn!(node_id, removed = gone, error = %e, "removing a departed member failed; retrying"),
                }
                gone
            },
            ClusterMsg::Removed,
        );
    }

    pub(super) fn removed(&mut self, node: u64, ctx: &mut Ctx<Self>) {
        if self.removing == Some(node) {
            self.removing = None;
        }
        self.ask_status(ctx);
    }

    /// An operator's join of `node`: run on its own task, answered from there.
    pub(super) fn add_member(
        &mut self,
        node: u64,
        member: Member,
        reply: Reply<Result<(), MembershipError>>,
    ) {
        let Some(raft) = self.raft.clone() else {
            let _ = reply.send(Err(MembershipError::Failed(
                "raft is not running yet".to_owned(),
            )));
            return;
        };
        // A node id that stands for another machine: taking its record would make every
        // node dial the newcomer in its place.
        if let Some(m) = self.members.get(&node).filter(|m| **m != member) {
            let _ = reply.send(Err(MembershipError::Refused(format!(
                "node {node} is already a member, at {} (MQTT {}): have it leave first, or \
                 give the new node another node.id",
                m.cluster, m.mqtt
            ))));
            return;
        }
        let me = self.node;
        let members = self.members.clone();
        let request = self.membership_request();
        starling_rt::spawn(async move {
            let r = join(&raft, me, node, member, request, |leader| {
                members.get(&leader).and_then(|m| m.http.clone())
            })
            .await;
            match &r {
                Ok(()) => tracing::info!(node_id = me, joined = node, "member added"),
                // The operator's tool asks the leader next.
                Err(e @ MembershipError::NotLeader { .. }) => {
                    tracing::debug!(node_id = me, node, error = %e, "join asked of a follower");
                }
                Err(e) => tracing::warn!(node_id = me, node, error = %e, "join not done"),
            }
            let _ = reply.send(r);
        });
    }

    /// An operator's leave of this node: run on its own task; `ClusterMsg::Left` follows
    /// once it is done.
    pub(super) fn leave(
        &mut self,
        drain: Duration,
        reply: Reply<Result<LeftBehind, MembershipError>>,
        ctx: &mut Ctx<Self>,
    ) {
        if self.leaving {
            // Its `Leave` is applied already (an earlier request that timed out, say).
            let _ = reply.send(Ok(LeftBehind::default()));
            let _ = self.left.send(true);
            return;
        }
        let Some(raft) = self.raft.clone() else {
            let _ = reply.send(Err(MembershipError::Failed(
                "raft is not running yet".to_owned(),
            )));
            return;
        };
        let me = self.node;
        let registry = self.registry.clone();
        let shards = self.shards.clone();
        let to = move_targets(&self.members, me);
        self.leave_running = true;
        // Under the request id of this node's own `Join`s, with the next number: raft's
        // deduplication then refuses any of them still on its way (a retry after a leader
        // change, say), which applied after the `Leave` would bring the node back.
        self.seq += 1;
        let request = RequestId {
            client_id: self.join_client,
            seq: self.seq,
        };
        ctx.spawn_then(
            async move {
                let r = match may_leave(&raft, me).await {
                    Ok(voters) => {
                        // One drain time for both: the sessions first (their moves leave
                        // relays behind), then what the other nodes are owed.
                        let deadline = time::now() + drain;
                        let sessions = match registry {
                            Some(r) => drain_sessions(&r, me, to, deadline).await,
                            None => 0,
                        };
                        let owed = drain_owed(&shards, me, deadline).await;
                        let behind = LeftBehind {
                            sessions,
                            messages: owed.messages,
                            relays: owed.relays,
                        };
                        leave(&raft, me, voters, request).await.map(|()| behind)
                    }
                    Err(e) => Err(e),
                };
                let done = r.is_ok();
                match &r {
                    Ok(behind) => {
                        tracing::info!(
                            node_id = me,
                            sessions_left_behind = behind.sessions,
                            messages_left_behind = behind.messages,
                            relays_left_behind = behind.relays,
                            "left the cluster; stopping"
                        );
                    }
                    Err(e) => tracing::warn!(node_id = me, error = %e, "leave not done"),
                }
                let _ = reply.send(r);
                done
            },
            ClusterMsg::LeaveDone,
        );
    }

    /// This node's own `Leave` is applied: it states nothing more, and it stops unless an
    /// operator's leave in progress says so itself.
    pub(super) fn left_here(&mut self) {
        self.leaving = true;
        if !self.leave_running {
            self.stop_due = true;
        }
    }

    /// An operator's leave finished (`true`: done).
    pub(super) fn leave_done(&mut self, done: bool, ctx: &mut Ctx<Self>) {
        self.leave_running = false;
        if done || self.leaving {
            self.stop_when_out(ctx);
        }
    }

    /// Stops once raft's configuration no longer holds this node, or after `LINGER`: until
    /// then its raft keeps answering, so that the leader sees its log reach the entry that
    /// proves it heard its `Leave` committed (`Departed`) and takes it out at once, rather
    /// than after `DEPARTED_GRACE`.
    pub(super) fn stop_when_out(&mut self, ctx: &mut Ctx<Self>) {
        let Some(raft) = self.raft.clone() else {
            let _ = self.left.send(true);
            return;
        };
        if self.lingering {
            return;
        }
        self.lingering = true;
        let me = self.node;
        ctx.spawn_then(
            async move {
                let until = time::now() + LINGER;
                while time::now() < until {
                    match raft.status().await {
                        Ok(st) if !st.voters.contains(&me) && !st.learners.contains(&me) => break,
                        Err(_) => break,
                        Ok(_) => time::sleep(POLL).await,
                    }
                }
            },
            |()| ClusterMsg::Linger,
        );
    }

    /// A request id of its own for an operator's proposal: a client id drawn now, so that
    /// raft's deduplication never confuses it with another.
    fn membership_request(&mut self) -> RequestId {
        use rand::RngCore;
        RequestId {
            client_id: starling_rt::rng::rng().next_u64(),
            seq: 1,
        }
    }
}

/// The leader's answer to a wrong node: who leads, and its API address if known.
fn not_leader(me: u64, st: &Status, http_of: impl Fn(u64) -> Option<String>) -> MembershipError {
    MembershipError::NotLeader {
        node: me,
        leader: st.leader,
        leader_http: st.leader.and_then(http_of),
    }
}

fn failed(what: &str, e: RequestError) -> MembershipError {
    MembershipError::Failed(format!("{what}: {e}"))
}

async fn status(raft: &RaftHandle) -> Result<Status, MembershipError> {
    raft.status().await.map_err(|e| failed("raft status", e))
}

async fn propose(raft: &RaftHandle, id: RequestId, c: &Command) -> Result<(), MembershipError> {
    let out = raft
        .propose(id, encode(c))
        .await
        .map_err(|e| failed("proposal", e))?;
    match decode::<Output>(&out) {
        Ok(Output::Done) => Ok(()),
        Ok(other) => Err(MembershipError::Failed(format!(
            "proposal refused: {other:?}"
        ))),
        Err(e) => Err(MembershipError::Failed(format!("proposal's answer: {e}"))),
    }
}

async fn join(
    raft: &RaftHandle,
    me: u64,
    node: u64,
    member: Member,
    request: RequestId,
    http_of: impl Fn(u64) -> Option<String>,
) -> Result<(), MembershipError> {
    if node == 0 {
        return Err(MembershipError::Refused(
            "node id 0 is not a node".to_owned(),
        ));
    }
    if node == me {
        return Err(MembershipError::Refused(format!(
            "node {node} is this node: run `starling cluster join` with the new node's --config"
        )));
    }
    match member.cluster.parse::<SocketAddr>() {
        Err(_) => {
            return Err(MembershipError::Refused(format!(
                "node {node}'s cluster address {:?} is not host:port with an IP address",
                member.cluster
            )))
        }
        Ok(a) if a.ip().is_unspecified() || a.port() == 0 => {
            return Err(MembershipError::Refused(format!(
                "node {node}'s cluster address {a} cannot be dialed: list the node in its own \
                 cluster.peers with the address the others reach it at"
            )))
        }
        Ok(_) => {}
    }
    let st = status(raft).await?;
    if st.role != Role::Leader {
        return Err(not_leader(me, &st, http_of));
    }
    propose(raft, request, &Command::Join { node, member }).await?;
    if st.voters.contains(&node) {
        return Ok(());
    }
    if !st.learners.contains(&node) {
        raft.add_learner(node)
            .await
            .map_err(|e| failed(&format!("adding node {node} as a learner"), e))?;
    }
    // The log as it is once the learner is in: holding it, the node is a voter that does
    // not slow the quorum down.
    let target = status(raft).await?.commit;
    let deadline = time::now() + CATCH_UP;
    loop {
        let st = status(raft).await?;
        if st.role != Role::Leader {
            return Err(MembershipError::Failed(format!(
                "leadership moved while node {node} caught up: it is a learner; run join again"
            )));
        }
        if st
            .progress
            .get(&node)
            .is_some_and(|p| p.matched >= target && p.recent_active)
        {
            break;
        }
        if time::now() >= deadline {
            return Err(MembershipError::Failed(format!(
                "node {node} did not catch up within {}s and stays a learner (it counts in no \
                 quorum): check that it runs with cluster.bootstrap = false, has a certificate \
                 from this cluster's CA, and is reachable at its cluster address; then run \
                 join again, or leave to drop it",
                CATCH_UP.as_secs()
            )));
        }
        time::sleep(POLL).await;
    }
    raft.add_voter(node)
        .await
        .map_err(|e| failed(&format!("making node {node} a voter"), e))?;
    Ok(())
}

/// Whether this node may leave: it is in raft's configuration and not the last voter.
/// The voters but it, if so.
async fn may_leave(raft: &RaftHandle, me: u64) -> Result<usize, MembershipError> {
    let st = status(raft).await?;
    if !st.voters.contains(&me) && !st.learners.contains(&me) {
        return Err(MembershipError::Refused(format!(
            "node {me} is not in the cluster's configuration"
        )));
    }
    if st.voters.iter().all(|v| *v == me) {
        return Err(MembershipError::Refused(format!(
            "node {me} is the last voter: a cluster cannot lose its last member"
        )));
    }
    Ok(st.voters.iter().filter(|v| **v != me).count())
}

/// The MQTT addresses of the other members a leaving node points its MQTT 5 clients to
/// (Server Reference): their `cluster.advertise_mqtt`, or their first TCP listener's bind.
/// A wildcard bind (0.0.0.0, ::) names no server a client could reach, so it is left out.
fn move_targets(members: &BTreeMap<u64, Member>, me: u64) -> Vec<Arc<String>> {
    members
        .iter()
        .filter(|(node, _)| **node != me)
        .map(|(_, m)| m.mqtt.as_str())
        .filter(|a| !a.is_empty())
        .filter(|a| {
            a.parse::<std::net::SocketAddr>()
                .map_or(true, |s| !s.ip().is_unspecified())
        })
        .map(|a| Arc::new(a.to_owned()))
        .collect()
}

/// Closes every connection with 0x9C Use another server and refuses new ones, then waits,
/// up to `drain`, for the sessions here to move with their clients to the nodes they
/// reconnect to (each such CONNECT claims the client id, and this node hands the session
/// over). The sessions still here at the end, which the `Leave` gives up.
async fn drain_sessions(
    registry: &starling_rt::Addr<RegistryMsg>,
    me: u64,
    to: Vec<Arc<String>>,
    deadline: Instant,
) -> usize {
    let Ok(mut left) = registry.ask(|reply| RegistryMsg::Drain { to, reply }).await else {
        return 0;
    };
    tracing::info!(
        node_id = me,
        sessions = left,
        "leaving: clients sent to the other nodes"
    );
    while left > 0 && time::now() < deadline {
        time::sleep(DRAIN_POLL).await;
        left = registry.ask(RegistryMsg::Sessions).await.unwrap_or(0);
    }
    if left > 0 {
        tracing::warn!(node_id = me, sessions = left, "leaving with sessions whose clients did not reconnect elsewhere in time: they end here");
    }
    left
}

/// Waits, until `deadline`, for the other nodes to take what this node owes them: every
/// message forwarded or parked for them acknowledged, and no copy routed to a session that
/// moved away still to come for its relay (its cut applied, and every other member through
/// with it). A node that stopped at once would lose them all: its publishers were answered
/// for the parked ones, and the others drop its routes and links once its `Leave` applies.
/// What is still owed at the end, which the `Leave` gives up.
async fn drain_owed(shards: &Shards, me: u64, deadline: Instant) -> Owed {
    let mut waited = false;
    loop {
        let mut owed = Owed::default();
        for shard in shards.all() {
            if let Ok(o) = shard.ask(RouterMsg::Owed).await {
                owed.messages += o.messages;
                owed.relays += o.relays;
            }
        }
        if owed == Owed::default() {
            if waited {
                tracing::info!(
                    node_id = me,
                    "leaving: the other nodes took what they were owed"
                );
            }
            return owed;
        }
        if time::now() >= deadline {
            tracing::warn!(
                node_id = me,
                messages = owed.messages,
                relays = owed.relays,
                "leaving with messages the other nodes did not take in time, or relays still \
                 awaited: they are lost"
            );
            return owed;
        }
        if !waited {
            tracing::info!(
                node_id = me,
                messages = owed.messages,
                relays = owed.relays,
                "leaving: waiting for the other nodes to take what they are owed"
            );
            waited = true;
        }
        time::sleep(DRAIN_POLL).await;
    }
}

async fn leave(
    raft: &RaftHandle,
    me: u64,
    others: usize,
    request: RequestId,
) -> Result<(), MembershipError> {
    hand_over_leadership(raft, me).await?;
    propose(raft, request, &Command::Leave { node: me }).await?;
    // The leader now takes this node out of the configuration. A removed node rarely hears
    // that its removal committed, so the wait is bounded: short when the other voters are
    // a quorum without it, longer when its acknowledgement counts (two voters).
    let wait = if others >= 2 {
        LEAVE_WAIT_SHORT
    } else {
        LEAVE_WAIT
    };
    let deadline = time::now() + wait;
    let give_up = time::now() + LEAVE_WAIT * 3;
    loop {
        let st = status(raft).await?;
        if !st.voters.contains(&me) && !st.learners.contains(&me) {
            return Ok(());
        }
        let now = time::now();
        if st.role == Role::Leader {
            // Leadership came back meanwhile: a leader cannot remove itself, and one that
            // stopped leading would leave the others to notice it is gone first.
            if now >= give_up {
                return Err(MembershipError::Failed(format!(
                    "node {me} left the cluster's record but still leads: no other voter takes \
                     over; stopping it makes the others elect a leader, which removes it"
                )));
            }
            let _ = hand_over_leadership(raft, me).await;
        } else if now >= deadline {
            return Ok(());
        }
        time::sleep(POLL).await;
    }
}

/// If this node leads, hands leadership to the voter that holds most of the log, and waits
/// until it took it.
async fn hand_over_leadership(raft: &RaftHandle, me: u64) -> Result<(), MembershipError> {
    let deadline = time::now() + TRANSFER_WAIT;
    loop {
        let st = status(raft).await?;
        if st.role != Role::Leader {
            return Ok(());
        }
        let to = st
            .voters
            .iter()
            .filter(|v| **v != me)
            .filter_map(|v| st.progress.get(v).map(|p| (p.recent_active, p.matched, *v)))
            .max()
            .map(|(_, _, v)| v);
        let Some(to) = to else {
            return Err(MembershipError::Refused(format!(
                "node {me} leads and no other voter can take over"
            )));
        };
        if time::now() >= deadline {
            return Err(MembershipError::Failed(format!(
                "node {me} leads and node {to} did not take leadership within {}s",
                TRANSFER_WAIT.as_secs()
            )));
        }
        raft.transfer_leader(to)
            .await
            .map_err(|e| failed("leadership transfer", e))?;
        time::sleep(POLL * 3).await;
    }
}
