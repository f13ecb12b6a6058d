//! The driver actor: one [`Node`] on the runtime seam, ticked by a timer, fed by a
//! [`Transport`], answering the application's requests.
//!
//! Raft messages arrive on the mailbox's urgent lane and are handled before any queued
//! client request, and committed entries are applied in bounded batches between messages,
//! so a follower flooded with client work still answers heartbeats within one batch or one
//! query (the follower-overload scenario of issue 4).
//!
//! The log's fsync runs on a storage thread of the runtime's blocking pool (under madsim, a
//! simulated task), one at a time; its outcome comes back as the actor's own input. While it
//! runs, the driver steps messages and appends what arrives, and the next sync covers all
//! of it. Proposals that queue up meanwhile are proposed together, as one raft message.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use raft::eraftpb::{ConfState, Message};
use starling_rt::blocking::{BlockingPool, Job};
use starling_rt::time::{self, Instant};
use starling_rt::{Actor, Addr, Ctx, Options, Reply};
use tracing::Instrument;

use crate::error::{Error, RequestError};
use crate::node::{Effect, Membership, Node, ProposeError, Status};
use crate::sm::{RequestId, StateMachine};
use crate::transport::Transport;
use crate::wal::{LogStore, SyncJob};

/// Proposals proposed together at most: one raft message, one append.
const PROPOSE_BATCH_MAX: usize = 256;

/// How fresh a read must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consistency {
    /// Linearizable: confirmed through ReadIndex with the leader, answered once this node
    /// has applied up to that index.
    Linearizable,
    /// Stale: answered from this node's state now. May miss recent writes (or, on a
    /// partitioned node, many); never waits for the network.
    Stale,
}

/// The driver's mailbox.
pub enum Msg {
    /// A raft message from a peer (urgent lane unless `raft_priority` is off).
    Raft(Message),
    Tick,
    /// Continue applying a committed backlog.
    Apply,
    Propose {
        id: RequestId,
        command: Vec<u8>,
        reply: Reply<Result<Vec<u8>, RequestError>>,
    },
    Read {
        query: Vec<u8>,
        consistency: Consistency,
        reply: Reply<Result<Vec<u8>, RequestError>>,
    },
    ChangeMembership {
        change: Membership,
        reply: Reply<Result<ConfState, RequestError>>,
    },
    TransferLeader {
        to: u64,
    },
    Campaign,
    Status {
        reply: Reply<Status>,
    },
    /// The outcome of the log sync the driver started (its own input, never sent to it).
    Synced(crate::Result<()>),
}

/// Counters for metrics and tests.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Times the known leader or term changed.
    pub leader_changes: AtomicU64,
    /// The current term and leader (0: none).
    pub term: AtomicU64,
    pub leader: AtomicU64,
    /// Raft messages dropped because the raft queue was full.
    pub raft_dropped: AtomicU64,
    /// Entries applied.
    pub applied: AtomicU64,
    /// Log syncs completed (each covers every ready written before it started).
    pub syncs: AtomicU64,
    /// Raft proposal messages made from client proposals (each carries a batch).
    pub proposal_batches: AtomicU64,
}

/// The application's handle on a running driver.
#[derive(Clone)]
pub struct RaftHandle {
    addr: Addr<Msg>,
    metrics: Arc<Metrics>,
    raft_priority: bool,
}

impl RaftHandle {
    /// Hands an incoming raft message to the driver without waiting. Returns false if it
    /// was dropped (queue full or driver stopped); raft retransmits.
    pub fn deliver(&self, msg: Message) -> bool {
        let r = if self.raft_priority {
            self.addr.try_send_urgent(Msg::Raft(msg))
        } else {
            self.addr.try_send(Msg::Raft(msg))
        };
        if r.is_err() {
            self.metrics.raft_dropped.fetch_add(1, Ordering::Relaxed);
        }
        r.is_ok()
    }

    async fn ask<R>(&self, make: impl FnOnce(Reply<R>) -> Msg) -> Result<R, RequestError> {
        self.addr.ask(make).await.map_err(|_| RequestError::Stopped)
    }

    /// Proposes `command` under `id` and waits for its output. Callable on any node
    /// (forwarded to the leader, retried across leader changes until the request timeout).
    /// After [`RequestError::Timeout`], proposing again with the same id is safe: it is
    /// applied at most once.
    pub async fn propose(&self, id: RequestId, command: Vec<u8>) -> Result<Vec<u8>, RequestError> {
        self.ask(|reply| Msg::Propose { id, command, reply })
            .await?
    }

    /// Runs `query` against the state machine with the given consistency.
    pub async fn read(
        &self,
        query: Vec<u8>,
        consistency: Consistency,
    ) -> Result<Vec<u8>, RequestError> {
        self.ask(|reply| Msg::Read {
            query,
            consistency,
            reply,
        })
        .await?
    }

    /// Adds `id` as a voter (send it the cluster's address first). Returns the new
    /// membership once applied here.
    pub async fn add_voter(&self, id: u64) -> Result<ConfState, RequestError> {
        self.change(Membership::AddVoter(id)).await
    }

    /// Adds `id` as a learner: it replicates but does not vote.
    pub async fn add_learner(&self, id: u64) -> Result<ConfState, RequestError> {
        self.change(Membership::AddLearner(id)).await
    }

    pub async fn remove_node(&self, id: u64) -> Result<ConfState, RequestError> {
        self.change(Membership::Remove(id)).await
    }

    async fn change(&self, change: Membership) -> Result<ConfState, RequestError> {
        self.ask(|reply| Msg::ChangeMembership { change, reply })
            .await?
    }

    /// Asks the leader (if this node is it) to hand leadership to `to`.
    pub async fn transfer_leader(&self, to: u64) -> Result<(), RequestError> {
        self.addr
            .send(Msg::TransferLeader { to })
            .await
            .map_err(|_| RequestError::Stopped)
    }

    /// Starts an election on this node.
    pub async fn campaign(&self) -> Result<(), RequestError> {
        self.addr
            .send(Msg::Campaign)
            .await
            .map_err(|_| RequestError::Stopped)
    }

    pub async fn status(&self) -> Result<Status, RequestError> {
        self.ask(|reply| Msg::Status { reply }).await
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Stops the driver.
    pub fn stop(&self) {
        self.addr.stop();
    }

    /// A client with its own id, numbering its requests, one outstanding at a time.
    pub fn client(&self, client_id: u64) -> Client {
        Client {
            handle: self.clone(),
            client_id,
            next_seq: 1,
        }
    }
}

/// A proposer with a stable client id: each `propose` gets the next sequence number and is
/// retried under it, so that it is applied exactly once.
pub struct Client {
    handle: RaftHandle,
    client_id: u64,
    next_seq: u64,
}

impl Client {
    /// Proposes `command`; on timeout, retries the same request id up to `attempts` times.
    pub async fn propose(
        &mut self,
        command: Vec<u8>,
        attempts: usize,
    ) -> Result<Vec<u8>, RequestError> {
        let id = RequestId {
            client_id: self.client_id,
            seq: self.next_seq,
        };
        self.next_seq += 1;
        let mut last = RequestError::Timeout;
        for _ in 0..attempts.max(1) {
            match self.handle.propose(id, command.clone()).await {
                Err(RequestError::Timeout) => last = RequestError::Timeout,
                other => return other,
            }
        }
        Err(last)
    }

    pub fn handle(&self) -> &RaftHandle {
        &self.handle
    }
}

struct Pending<T> {
    deadline: Instant,
    next_try: Instant,
    replies: Vec<Reply<Result<T, RequestError>>>,
}

struct PendingProposal {
    command: Vec<u8>,
    wait: Pending<Vec<u8>>,
}

struct PendingRead {
    query: Vec<u8>,
    wait: Pending<Vec<u8>>,
}

/// The driver actor.
pub struct Driver<L: LogStore, S: StateMachine, T: Transport> {
    node: Node<L, S>,
    transport: T,
    metrics: Arc<Metrics>,
    proposals: BTreeMap<RequestId, PendingProposal>,
    reads: BTreeMap<u64, PendingRead>,
    changes: BTreeMap<u64, Pending<ConfState>>,
    next_token: u64,
    apply_scheduled: bool,
    /// Proposals received but not yet handed to raft: proposed together once the mailbox
    /// is empty, the batch full, or the messages queued behind its first one handled.
    batch: Vec<RequestId>,
    /// Turns the batch may still wait: counted from the queue behind its first proposal,
    /// so that a mailbox that never empties cannot hold it back.
    batch_turns: usize,
    /// Command bytes in the batch: a follower forwards it whole, so it stays within one
    /// raft message's size.
    batch_bytes: u64,
    /// The storage thread, and the sync running on it.
    sync_pool: BlockingPool,
    sync: Option<Job<crate::Result<()>>>,
    /// Re-propose or re-read after this long without an outcome (an election timeout: by
    /// then a lost forward or a leader change has surely happened).
    retry_after: Duration,
}

/// Starts the driver for `node`, sending through `transport`.
pub fn start<L: LogStore, S: StateMachine, T: Transport>(
    node: Node<L, S>,
    transport: T,
) -> RaftHandle {
    let cfg = node.config().clone();
    let metrics = Arc::new(Metrics::default());
    let retry_after = cfg.tick_interval * cfg.election_tick as u32;
    let driver = Driver {
        node,
        transport,
        metrics: metrics.clone(),
        proposals: BTreeMap::new(),
        reads: BTreeMap::new(),
        changes: BTreeMap::new(),
        next_token: 1,
        apply_scheduled: false,
        batch: Vec::new(),
        batch_turns: 0,
        batch_bytes: 0,
        // One thread: syncs of one log are sequential by design. Room for one more job than
        // the one that runs, which `Node` never asks for.
        sync_pool: BlockingPool::new("raft-sync", 1, 1),
        sync: None,
        retry_after,
    };
    let opts = Options {
        mailbox_capacity: cfg.client_queue_max,
        urgent_capacity: cfg.raft_queue_max,
        name: "raft",
        // Its peers take a late answer for a dead node: on a worker it would wait behind
        // every client turn ready there.
        own_thread: cfg.raft_priority,
        ..Options::default()
    };
    let addr = starling_rt::start_with(driver, opts);
    RaftHandle {
        addr,
        metrics,
        raft_priority: cfg.raft_priority,
    }
}

impl<T> Pending<T> {
    fn new(
        now: Instant,
        timeout: Duration,
        retry: Duration,
        reply: Reply<Result<T, RequestError>>,
    ) -> Self {
        Pending {
            deadline: now + timeout,
            next_try: now + retry,
            replies: vec![reply],
        }
    }

    fn finish(self, r: Result<T, RequestError>)
    where
        T: Clone,
    {
        for reply in self.replies {
            let _ = reply.send(r.clone());
        }
    }
}

impl<L: LogStore, S: StateMachine, T: Transport> Driver<L, S, T> {
    fn pending_count(&self) -> usize {
        self.proposals.len() + self.reads.len() + self.changes.len()
    }

    fn token(&mut self) -> u64 {
        let t = self.next_token;
        self.next_token += 1;
        t
    }

    /// Runs raft's ready cycle, a bounded apply batch, and carries out the effects.
    async fn drive(&mut self, ctx: &mut Ctx<Self>) {
        if let Err(e) = self.cycle() {
            // A storage failure leaves the replica unable to keep raft's promises: stop
            // rather than vote or acknowledge without durability.
            tracing::error!(node_id = self.node.id(), error = %e, "raft storage failed; stopping");
            ctx.stop();
            return;
        }
        while let Some(effect) = self.node.poll_effect() {
            match effect {
                Effect::Send(m) => self.transport.send(m),
                Effect::Applied { id, result, .. } => {
                    self.metrics.applied.fetch_add(1, Ordering::Relaxed);
                    if let Some(p) = self.proposals.remove(&id) {
                        p.wait.finish(result);
                    }
                }
                Effect::ReadReady { token } => {
                    if let Some(r) = self.reads.remove(&token) {
                        let out = self.node.state_machine().query(&r.query).await;
                        r.wait.finish(Ok(out));
                    }
                }
                Effect::MembershipChanged { token, conf } => {
                    if let Some(p) = self.changes.remove(&token) {
                        p.finish(Ok(conf));
                    }
                }
                Effect::LeaderChanged { term, leader } => {
                    tracing::info!(term, leader = leader.unwrap_or(0), "raft leader changed");
                    self.metrics.leader_changes.fetch_add(1, Ordering::Relaxed);
                    self.metrics.term.store(term, Ordering::Relaxed);
                    self.metrics
                        .leader
                        .store(leader.unwrap_or(0), Ordering::Relaxed);
                }
                Effect::Sync(job) => {
                    if !self.start_sync(job) {
                        ctx.stop();
                        return;
                    }
                }
            }
        }
        if self.node.has_pending_apply() && !self.apply_scheduled {
            // Continue on the normal lane, behind raft traffic: a long backlog never delays a
            // heartbeat by more than one batch.
            self.apply_scheduled = ctx.addr().try_send(Msg::Apply).is_ok();
        }
    }

    /// Hands `job` to the storage thread; its outcome arrives through `poll_input`.
    fn start_sync(&mut self, job: SyncJob) -> bool {
        match self.sync_pool.try_run(move || job.run()) {
            Ok(j) => {
                self.sync = Some(j);
                true
            }
            Err(full) => {
                // `Node` asks for one sync at a time, so this is a bug, not load: without the
                // sync, nothing this node wrote may be acknowledged.
                tracing::error!(node_id = self.node.id(), error = %full, "raft sync refused; stopping");
                false
            }
        }
    }

    /// Proposes the batch as one raft message.
    fn flush_proposals(&mut self, now: Instant) {
        let ids = std::mem::take(&mut self.batch);
        self.batch_bytes = 0;
        // A proposal may have timed out while it waited in the batch.
        let proposals = &self.proposals;
        let batch: Vec<(RequestId, &[u8])> = ids
            .iter()
            .filter_map(|id| proposals.get(id).map(|p| (*id, &p.command[..])))
            .collect();
        if batch.is_empty() {
            return;
        }
        self.metrics
            .proposal_batches
            .fetch_add(1, Ordering::Relaxed);
        let r = self.node.propose_batch(batch);
        for id in ids {
            match &r {
                Ok(()) => {}
                // Try again at the next tick rather than after a whole interval.
                Err(ProposeError::NoLeader) => {
                    if let Some(p) = self.proposals.get_mut(&id) {
                        p.wait.next_try = now;
                    }
                }
                Err(ProposeError::Refused(why)) => {
                    if let Some(p) = self.proposals.remove(&id) {
                        p.wait.finish(Err(RequestError::Refused(why.clone())));
                    }
                }
            }
        }
    }

    fn cycle(&mut self) -> crate::Result<()> {
        self.node.handle_ready()?;
        self.node
            .apply_committed(self.node.config().apply_batch_max)?;
        self.node.handle_ready()
    }

    fn on_tick(&mut self) {
        self.node.tick();
        let now = time::now();
        let retry = self.retry_after;
        // Expire what is past its deadline; retry what waited a retry interval.
        let expired: Vec<RequestId> = self
            .proposals
            .iter()
            .filter(|(_, p)| p.wait.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            if let Some(p) = self.proposals.remove(&id) {
                p.wait.finish(Err(RequestError::Timeout));
            }
        }
        let due: Vec<RequestId> = self
            .proposals
            .iter()
            .filter(|(_, p)| p.wait.next_try <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            if let Some(p) = self.proposals.get_mut(&id) {
                p.wait.next_try = now + retry;
                let cmd = p.command.clone();
                // Safe to repeat: the state machine layer applies a request id once.
                let _ = self.node.propose(id, &cmd);
            }
        }
        let expired: Vec<u64> = self
            .reads
            .iter()
            .filter(|(_, r)| r.wait.deadline <= now)
            .map(|(t, _)| *t)
            .collect();
        for t in expired {
            if let Some(r) = self.reads.remove(&t) {
                r.wait.finish(Err(RequestError::Timeout));
            }
        }
        let due: Vec<u64> = self
            .reads
            .iter()
            .filter(|(_, r)| r.wait.next_try <= now)
            .map(|(t, _)| *t)
            .collect();
        for t in due {
            if let Some(r) = self.reads.get_mut(&t) {
                r.wait.next_try = now + retry;
                self.node.read_index(t);
            }
        }
        let expired: Vec<u64> = self
            .changes
            .iter()
            .filter(|(_, c)| c.deadline <= now)
            .map(|(t, _)| *t)
            .collect();
        for t in expired {
            if let Some(c) = self.changes.remove(&t) {
                c.finish(Err(RequestError::Timeout));
            }
        }
    }
}

impl<L: LogStore, S: StateMachine, T: Transport> Actor for Driver<L, S, T> {
    type Msg = Msg;

    async fn started(&mut self, ctx: &mut Ctx<Self>) {
        let period = self.node.config().tick_interval;
        ctx.every(period, || Msg::Tick);
        self.drive(ctx).await;
    }

    async fn handle(&mut self, msg: Msg, ctx: &mut Ctx<Self>) {
        let span = tracing::debug_span!(
            "raft",
            node_id = self.node.id(),
            term = self.node.term(),
            leader_id = self.node.leader().unwrap_or(0)
        );
        self.turn(msg, ctx).instrument(span).await
    }

    fn poll_input(&mut self, cx: &mut Context<'_>) -> Poll<Msg> {
        let Some(job) = self.sync.as_mut() else {
            return Poll::Pending;
        };
        match Pin::new(job).poll(cx) {
            Poll::Ready(r) => {
                self.sync = None;
                Poll::Ready(Msg::Synced(r.unwrap_or(Err(Error::SyncLost))))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<L: LogStore, S: StateMachine, T: Transport> Driver<L, S, T> {
    async fn turn(&mut self, msg: Msg, ctx: &mut Ctx<Self>) {
        let now = time::now();
        // Copied out, not cloned: this runs on every turn.
        let (request_timeout, pending_max) = {
            let c = self.node.config();
            (c.request_timeout, c.pending_max)
        };
        match msg {
            Msg::Raft(m) => self.node.step(m),
            Msg::Tick => self.on_tick(),
            Msg::Apply => self.apply_scheduled = false,
            Msg::Propose { id, command, reply } => {
                if let Some(p) = self.proposals.get_mut(&id) {
                    // The same request again while it is pending: answer both at once.
                    p.wait.replies.push(reply);
                } else if self.pending_count() >= pending_max {
                    let _ = reply.send(Err(RequestError::Overloaded { max: pending_max }));
                } else {
                    let wait = Pending::new(now, request_timeout, self.retry_after, reply);
                    self.batch_bytes += command.len() as u64;
                    self.proposals.insert(id, PendingProposal { command, wait });
                    if self.batch.is_empty() {
                        self.batch_turns = ctx.queued();
                    }
                    self.batch.push(id);
                }
            }
            Msg::Read {
                query,
                consistency,
                reply,
            } => match consistency {
                Consistency::Stale => {
                    let out = self.node.state_machine().query(&query).await;
                    let _ = reply.send(Ok(out));
                }
                Consistency::Linearizable => {
                    if self.pending_count() >= pending_max {
                        let _ = reply.send(Err(RequestError::Overloaded { max: pending_max }));
                    } else {
                        let token = self.token();
                        self.node.read_index(token);
                        let wait = Pending::new(now, request_timeout, self.retry_after, reply);
                        self.reads.insert(token, PendingRead { query, wait });
                    }
                }
            },
            Msg::ChangeMembership { change, reply } => {
                let token = self.token();
                let wait = Pending::new(now, request_timeout, request_timeout, reply);
                match self.node.change_membership(token, change) {
                    Ok(()) => {
                        self.changes.insert(token, wait);
                    }
                    Err(ProposeError::NoLeader) => {
                        wait.finish(Err(RequestError::Refused("no leader".to_string())))
                    }
                    Err(ProposeError::Refused(why)) => wait.finish(Err(RequestError::Refused(why))),
                }
            }
            Msg::TransferLeader { to } => self.node.transfer_leader(to),
            Msg::Campaign => {
                let _ = self.node.campaign();
            }
            Msg::Status { reply } => {
                let _ = reply.send(self.node.status());
            }
            Msg::Synced(outcome) => {
                self.metrics.syncs.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = self.node.on_synced(outcome) {
                    tracing::error!(node_id = self.node.id(), error = %e, "raft log sync failed; stopping");
                    ctx.stop();
                    return;
                }
            }
        }
        // Proposals that queued up behind this turn (behind a sync, typically) go into one
        // raft message: the last of the burst, or the last of the messages that were queued
        // when the batch began, sends it. On a `Synced` turn this comes before the next
        // sync starts (in `drive`), which then covers the batch.
        if !self.batch.is_empty() {
            let full = self.batch.len() >= PROPOSE_BATCH_MAX
                || self.batch_bytes >= self.node.config().max_size_per_msg;
            if full || ctx.queued() == 0 || self.batch_turns == 0 {
                self.flush_proposals(now);
            } else {
                self.batch_turns -= 1;
            }
        }
        self.drive(ctx).await;
    }
}
