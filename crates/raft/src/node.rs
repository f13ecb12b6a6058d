//! The sans-IO raft core: raft-rs `RawNode` plus durable storage plus the state machine.
//! Inputs in (`tick`, `step`, `propose`, `read_index`, membership), effects out
//! (`poll_effect`). It reads no clock and spawns nothing; the driver actor calls it.
//!
//! Call order per turn: any inputs, then [`Node::handle_ready`], then
//! [`Node::apply_committed`] (a bounded batch), then `handle_ready` again (applying a
//! membership change can produce messages), then drain [`Node::poll_effect`].
//!
//! The log's fsync is not done here: an [`Effect::Sync`] hands its wait to the caller, who
//! runs it off the turn and reports with [`Node::on_synced`]. Meanwhile the node keeps
//! stepping messages and appending; what depends on durability (votes, acknowledgements,
//! the leader's own vote for its entries, applying) waits for that report.

use std::collections::{BTreeMap, VecDeque};

use protobuf::Message as _;
use raft::eraftpb::{
    ConfChange, ConfChangeSingle, ConfChangeTransition, ConfChangeType, ConfChangeV2, ConfState,
    Entry, EntryType, Message, MessageType, Snapshot,
};
use raft::{RawNode, SnapshotStatus, StateRole};
use rand::Rng as _;
use starling_rt::rng::Rng;

use crate::config::ValidConfig;
use crate::error::{Error, RequestError, Result};
use crate::sm::{decode_command, encode_command, Dedup, RequestId, StateMachine};
use crate::wal::{make_snapshot, LogStore, SyncJob};

/// A membership change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Membership {
    AddVoter(u64),
    AddLearner(u64),
    Remove(u64),
}

/// The node's role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Follower,
    PreCandidate,
    Candidate,
    Leader,
}

impl From<StateRole> for Role {
    fn from(r: StateRole) -> Self {
        match r {
            StateRole::Follower => Role::Follower,
            StateRole::PreCandidate => Role::PreCandidate,
            StateRole::Candidate => Role::Candidate,
            StateRole::Leader => Role::Leader,
        }
    }
}

/// Replication progress of one peer, as the leader sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerProgress {
    pub matched: u64,
    pub next_index: u64,
    /// raft-rs's replication state: "Probe", "Replicate" or "Snapshot".
    pub state: String,
    pub recent_active: bool,
}

/// A node's view of the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub id: u64,
    pub term: u64,
    pub role: Role,
    pub leader: Option<u64>,
    pub commit: u64,
    pub applied: u64,
    pub voters: Vec<u64>,
    pub learners: Vec<u64>,
    /// Per peer, on the leader only.
    pub progress: BTreeMap<u64, PeerProgress>,
}

/// Something the driver must do, or an outcome it must deliver.
#[derive(Debug)]
pub enum Effect {
    /// Send a raft message to `msg.to`.
    Send(Message),
    /// A proposal was applied (on this node; every node applies every entry).
    Applied {
        id: RequestId,
        index: u64,
        result: Result<Vec<u8>, RequestError>,
    },
    /// A read index for `token` is confirmed and applied: a query now is linearizable.
    ReadReady { token: u64 },
    /// A membership change proposed with `token` took effect.
    MembershipChanged { token: u64, conf: ConfState },
    /// Term or leader changed.
    LeaderChanged { term: u64, leader: Option<u64> },
    /// Run this log sync (it blocks), then report its outcome with [`Node::on_synced`]. At
    /// most one is outstanding; everything written while it runs goes in the next one.
    Sync(SyncJob),
}

/// Why a proposal was not accepted into the local raft.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProposeError {
    /// No leader is known (or leadership is being transferred); retry after an election.
    #[error("no leader to take the proposal")]
    NoLeader,
    #[error("refused: {0}")]
    Refused(String),
}

fn logger() -> slog::Logger {
    // Our own tracing spans carry node, term and leader; raft-rs's log lines are dropped.
    slog::Logger::root(slog::Discard, slog::o!())
}

fn role_of(s: StateRole) -> u8 {
    match s {
        StateRole::Follower => 0,
        StateRole::PreCandidate => 1,
        StateRole::Candidate => 2,
        StateRole::Leader => 3,
    }
}

/// One raft replica: consensus, durable log and state machine.
pub struct Node<L: LogStore, S: StateMachine> {
    raw: RawNode<L>,
    sm: S,
    dedup: Dedup,
    cfg: ValidConfig,
    rng: Rng,
    applied: u64,
    applied_term: u64,
    /// Membership as of `applied` (for snapshots).
    conf: ConfState,
    /// Committed entries not yet applied, in log order.
    to_apply: VecDeque<Entry>,
    /// Read indexes confirmed by the leader, waiting for `applied` to reach them.
    reads: VecDeque<(u64, u64)>,
    snapshot_index: u64,
    /// Set when a snapshot from the leader was installed and raft must learn it is applied.
    restored: bool,
    effects: VecDeque<Effect>,
    /// Peers a snapshot was sent to in the current ready, to report to raft after advance.
    snapshots_sent: Vec<u64>,
    /// (term, role, leader) when the election timeout was last drawn.
    seen: (u64, u8, u64),
    election_timeout: usize,
    /// raft-rs numbers its readies. Every one up to `written` is in the store, up to
    /// `durable` on disk; `must_sync` is the last that wrote something a crash must not
    /// lose (more than a commit index).
    written: u64,
    durable: u64,
    must_sync: u64,
    /// The ready number the outstanding [`Effect::Sync`] makes durable.
    syncing: Option<u64>,
    /// Votes and acknowledgements by ready number, held until that ready is durable.
    held: VecDeque<(u64, Vec<Message>)>,
}

impl<L: LogStore, S: StateMachine> Node<L, S> {
    /// Opens a replica on `store` (recovered by the caller), bootstrapping the initial
    /// membership if the store is fresh and this node is listed in it. `rng` supplies the
    /// randomized election timeouts (seeded by the runtime, so simulations replay).
    pub fn new(cfg: ValidConfig, mut store: L, mut sm: S, rng: Rng) -> Result<Self> {
        let mut dedup = Dedup::default();
        if store.is_fresh() && cfg.initial_voters.contains(&cfg.id) {
            // Bootstrap as a snapshot at index 1: a node added later has an empty log, so the
            // leader, missing entry 1, sends it this snapshot and with it the initial
            // membership. Every initial member writes the same one.
            let conf = ConfState {
                voters: cfg.initial_voters.clone(),
                ..Default::default()
            };
            let data = dedup.encode_snapshot(&sm.snapshot());
            store.apply_snapshot(make_snapshot(1, 1, conf, data))?;
        }
        let snap = store.latest_snapshot().clone();
        let meta = snap.get_metadata();
        if meta.index > 0 {
            let (d, rest) = Dedup::decode_snapshot(&snap.data)?;
            sm.restore(rest).map_err(Error::Restore)?;
            dedup = d;
        }
        let rc = raft::Config {
            id: cfg.id,
            election_tick: cfg.election_tick,
            heartbeat_tick: cfg.heartbeat_tick,
            // The state machine is rebuilt from the snapshot and the log on every start.
            applied: meta.index,
            max_size_per_msg: cfg.max_size_per_msg,
            max_inflight_msgs: cfg.max_inflight_msgs,
            check_quorum: cfg.check_quorum,
            pre_vote: cfg.pre_vote,
            ..Default::default()
        };
        rc.validate()?;
        let raw = RawNode::new(&rc, store, &logger())?;
        let mut node = Node {
            raw,
            sm,
            dedup,
            rng,
            applied: meta.index,
            applied_term: meta.term,
            conf: meta.get_conf_state().clone(),
            to_apply: VecDeque::new(),
            reads: VecDeque::new(),
            snapshot_index: meta.index,
            restored: false,
            effects: VecDeque::new(),
            snapshots_sent: Vec::new(),
            seen: (u64::MAX, 0, 0),
            election_timeout: 0,
            written: 0,
            durable: 0,
            must_sync: 0,
            syncing: None,
            held: VecDeque::new(),
            cfg,
        };
        node.settle();
        Ok(node)
    }

    /// raft-rs draws the randomized election timeout from `thread_rng` whenever it resets
    /// (a new term, role or leader). That draw is not reproducible under simulation, so after
    /// every call into raft we replace it with one from our seeded generator, drawn exactly
    /// when (term, role, leader) changed: a deterministic function of deterministic state.
    /// Nothing reads the timeout between raft's reset and this fix-up (it is read only when
    /// a tick ends, after at least one more call).
    fn settle(&mut self) {
        let r = &self.raw.raft;
        let now = (r.term, role_of(r.state), r.leader_id);
        if now != self.seen {
            let leader_changed = now.0 != self.seen.0 || now.2 != self.seen.2;
            self.seen = now;
            let e = self.cfg.election_tick;
            self.election_timeout = self.rng.gen_range(e..2 * e);
            if leader_changed {
                tracing::debug!(
                    node_id = self.cfg.id,
                    term = now.0,
                    leader_id = now.2,
                    "leader changed"
                );
                self.effects.push_back(Effect::LeaderChanged {
                    term: now.0,
                    leader: (now.2 != 0).then_some(now.2),
                });
            }
        }
        if self.raw.raft.randomized_election_timeout() != self.election_timeout {
            self.raw
                .raft
                .set_randomized_election_timeout(self.election_timeout);
        }
    }

    /// Advances raft's logical clock by one tick.
    pub fn tick(&mut self) {
        self.raw.tick();
        self.settle();
    }

    /// Feeds a message from a peer. Messages for unknown peers or local types are dropped.
    pub fn step(&mut self, msg: Message) {
        if raft::raw_node::is_local_msg(msg.get_msg_type()) || msg.to != self.cfg.id {
            return;
        }
        // Errors here are peer-caused (a message from a removed node, a stale term): raft has
        // already ignored the message, and so do we.
        let _ = self.raw.step(msg);
        self.settle();
    }

    /// Proposes a command. On a follower raft forwards it to the leader; the outcome is an
    /// [`Effect::Applied`] with this id, here, once the entry is applied.
    pub fn propose(&mut self, id: RequestId, command: &[u8]) -> Result<(), ProposeError> {
        let r = self.raw.propose(vec![], encode_command(id, command));
        self.settle();
        match r {
            Ok(()) => Ok(()),
            Err(raft::Error::ProposalDropped) => Err(ProposeError::NoLeader),
            Err(e) => Err(ProposeError::Refused(e.to_string())),
        }
    }

    /// Proposes several commands as one raft message: one append and, on the leader, one
    /// replication message per follower for all of them. All are accepted or none is.
    pub fn propose_batch<'a>(
        &mut self,
        batch: impl IntoIterator<Item = (RequestId, &'a [u8])>,
    ) -> Result<(), ProposeError> {
        let entries: Vec<Entry> = batch
            .into_iter()
            .map(|(id, command)| Entry {
                data: encode_command(id, command).into(),
                ..Default::default()
            })
            .collect();
        if entries.is_empty() {
            return Ok(());
        }
        // What `RawNode::propose` builds for one entry; raft-rs takes many in one message.
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgPropose);
        m.from = self.cfg.id;
        m.set_entries(entries.into());
        let r = self.raw.raft.step(m);
        self.settle();
        match r {
            Ok(()) => Ok(()),
            Err(raft::Error::ProposalDropped) => Err(ProposeError::NoLeader),
            Err(e) => Err(ProposeError::Refused(e.to_string())),
        }
    }

    /// Asks for a linearizable read point; [`Effect::ReadReady`] with `token` follows once
    /// the leader confirmed its leadership and this node applied up to the read index. With
    /// no leader the request is dropped silently: the driver times it out.
    pub fn read_index(&mut self, token: u64) {
        self.raw.read_index(token.to_le_bytes().to_vec());
        self.settle();
    }

    /// Proposes a membership change (raft conf change v2);
    /// [`Effect::MembershipChanged`] with `token` follows when it is applied.
    pub fn change_membership(
        &mut self,
        token: u64,
        change: Membership,
    ) -> Result<(), ProposeError> {
        let (ty, id) = match change {
            Membership::AddVoter(id) => (ConfChangeType::AddNode, id),
            Membership::AddLearner(id) => (ConfChangeType::AddLearnerNode, id),
            Membership::Remove(id) => (ConfChangeType::RemoveNode, id),
        };
        let cc = ConfChangeV2 {
            transition: ConfChangeTransition::Auto,
            changes: vec![ConfChangeSingle {
                change_type: ty,
                node_id: id,
                ..Default::default()
            }]
            .into(),
            ..Default::default()
        };
        let r = self
            .raw
            .propose_conf_change(token.to_le_bytes().to_vec(), cc);
        self.settle();
        match r {
            Ok(()) => Ok(()),
            Err(raft::Error::ProposalDropped) => Err(ProposeError::NoLeader),
            Err(e) => Err(ProposeError::Refused(e.to_string())),
        }
    }

    /// Asks the leader to hand leadership to `to` (only meaningful on the leader).
    pub fn transfer_leader(&mut self, to: u64) {
        self.raw.transfer_leader(to);
        self.settle();
    }

    /// Starts an election now (tests, and operator-driven recovery).
    pub fn campaign(&mut self) -> Result<()> {
        self.raw.campaign()?;
        self.settle();
        Ok(())
    }

    /// Handles raft's readies in the order raft-rs documents, with its asynchronous
    /// persistence: messages (a leader sends before persisting, raft thesis §10.2.1),
    /// snapshot, committed entries (queued for apply), entries and hard state written but
    /// not synced, persisted messages (votes and acknowledgements) held, then
    /// `advance_append_async`. [`Node::persist`] decides when a ready counts as durable.
    pub fn handle_ready(&mut self) -> Result<()> {
        // Persisting a ready can make the next one (a commit, entries to apply), so loop.
        while self.raw.has_ready() {
            let mut rd = self.raw.ready();
            let number = rd.number();
            for m in rd.take_messages() {
                self.send(m);
            }
            if !rd.snapshot().is_empty() {
                let snap = rd.snapshot().clone();
                self.raw.mut_store().apply_snapshot(snap.clone())?;
                self.install(&snap)?;
            }
            self.queue_committed(rd.take_committed_entries());
            self.raw.mut_store().append(rd.entries())?;
            if let Some(hs) = rd.hs() {
                // The commit index rides along; alone it need not be synced (after a crash
                // raft learns it again), which is what `must_sync` says.
                self.raw.mut_store().set_hard_state(hs)?;
            }
            if rd.must_sync() {
                self.must_sync = number;
            }
            for rs in rd.take_read_states() {
                if let Ok(b) = <[u8; 8]>::try_from(&rs.request_ctx[..]) {
                    self.reads.push_back((rs.index, u64::from_le_bytes(b)));
                }
            }
            let persisted = rd.take_persisted_messages();
            if !persisted.is_empty() {
                self.held.push_back((number, persisted));
            }
            self.raw.advance_append_async(rd);
            self.written = number;
            self.persist()?;
        }
        // Readies written while the last sync ran, when no new one came since.
        self.persist()?;
        // raft waits for a report on every snapshot it sends before it probes that peer
        // again. We report it sent: if it was lost or refused (a snapshot older than the
        // peer's membership), the probe fails and raft sends the newest snapshot.
        for to in std::mem::take(&mut self.snapshots_sent) {
            self.raw.report_snapshot(to, SnapshotStatus::Finish);
        }
        if self.restored {
            self.restored = false;
            self.raw.advance_apply_to(self.applied);
        }
        self.settle();
        self.release_reads();
        Ok(())
    }

    /// Group commit: with no sync outstanding, the readies written since the last durable
    /// one become durable together, at once if none of them must be synced, otherwise
    /// through one [`Effect::Sync`]. With one outstanding, they wait for it to end and go
    /// in the next.
    fn persist(&mut self) -> Result<()> {
        if self.syncing.is_some() || self.durable == self.written {
            return Ok(());
        }
        if self.must_sync <= self.durable {
            self.mark_durable(self.written);
            return Ok(());
        }
        match self.raw.mut_store().begin_sync()? {
            Some(job) => {
                self.syncing = Some(self.written);
                self.effects.push_back(Effect::Sync(job));
            }
            None => self.mark_durable(self.written),
        }
        Ok(())
    }

    /// Readies up to `number` are on disk: raft may count this node's entries (a leader
    /// its own vote in the commit quorum) and apply them, and what they held may go out.
    fn mark_durable(&mut self, number: u64) {
        self.durable = number;
        self.raw.on_persist_ready(number);
        while self.held.front().is_some_and(|(n, _)| *n <= number) {
            if let Some((_, msgs)) = self.held.pop_front() {
                for m in msgs {
                    self.send(m);
                }
            }
        }
        self.settle();
    }

    /// The outcome of the last [`Effect::Sync`]. An error leaves the log's durability
    /// unknown: the caller must stop this replica. Call [`Node::handle_ready`] next: it
    /// starts the next sync, after any proposals made in between, so that it covers them.
    pub fn on_synced(&mut self, outcome: Result<()>) -> Result<()> {
        outcome?;
        if let Some(number) = self.syncing.take() {
            self.mark_durable(number);
        }
        Ok(())
    }

    /// True while an [`Effect::Sync`] has not been reported.
    pub fn is_syncing(&self) -> bool {
        self.syncing.is_some()
    }

    fn send(&mut self, m: Message) {
        if m.get_msg_type() == MessageType::MsgSnapshot {
            self.snapshots_sent.push(m.to);
        }
        self.effects.push_back(Effect::Send(m));
    }

    fn queue_committed(&mut self, entries: Vec<Entry>) {
        for e in entries {
            let expect = self
                .to_apply
                .back()
                .map(|l| l.index)
                .unwrap_or(self.applied)
                + 1;
            assert_eq!(
                e.index, expect,
                "committed entries arrive in order, none skipped"
            );
            self.to_apply.push_back(e);
        }
    }

    /// Replaces the state machine with a snapshot from the leader.
    fn install(&mut self, snap: &Snapshot) -> Result<()> {
        let meta = snap.get_metadata();
        assert!(meta.index > self.applied, "a leader snapshot moves forward");
        let (d, rest) = Dedup::decode_snapshot(&snap.data)?;
        self.sm.restore(rest).map_err(Error::Restore)?;
        self.dedup = d;
        // Entries handed out before the snapshot are covered by it.
        self.to_apply.clear();
        self.applied = meta.index;
        self.applied_term = meta.term;
        self.conf = meta.get_conf_state().clone();
        self.snapshot_index = meta.index;
        self.restored = true;
        Ok(())
    }

    /// Applies up to `budget` committed entries, in order, none skipped. Returns how many.
    pub fn apply_committed(&mut self, budget: usize) -> Result<usize> {
        let mut n = 0;
        let mut membership_changed = false;
        while n < budget {
            let Some(e) = self.to_apply.pop_front() else {
                break;
            };
            assert_eq!(e.index, self.applied + 1, "apply never skips an entry");
            match e.get_entry_type() {
                EntryType::EntryNormal => {
                    // Empty data: the no-op a new leader commits at the start of its term.
                    if !e.data.is_empty() {
                        match decode_command(&e.data) {
                            Ok((id, cmd)) => {
                                let result = self.dedup.apply(&mut self.sm, e.index, id, cmd);
                                self.effects.push_back(Effect::Applied {
                                    id,
                                    index: e.index,
                                    result,
                                });
                            }
                            // Only our own encoder writes entries; a foreign one is skipped
                            // identically on every replica, so they stay equal.
                            Err(_) => tracing::warn!(index = e.index, "undecodable entry"),
                        }
                    }
                }
                EntryType::EntryConfChangeV2 => {
                    let cc = ConfChangeV2::parse_from_bytes(&e.data).map_err(|source| {
                        Error::Decode {
                            what: "conf change",
                            source,
                        }
                    })?;
                    self.apply_conf(&cc, &e.context)?;
                    membership_changed = true;
                }
                EntryType::EntryConfChange => {
                    // We propose only v2, but a v1 change is one single change.
                    let v1 =
                        ConfChange::parse_from_bytes(&e.data).map_err(|source| Error::Decode {
                            what: "conf change",
                            source,
                        })?;
                    let cc = ConfChangeV2 {
                        changes: vec![ConfChangeSingle {
                            change_type: v1.get_change_type(),
                            node_id: v1.node_id,
                            ..Default::default()
                        }]
                        .into(),
                        ..Default::default()
                    };
                    self.apply_conf(&cc, &e.context)?;
                    membership_changed = true;
                }
            }
            self.applied = e.index;
            self.applied_term = e.term;
            n += 1;
        }
        if n > 0 {
            self.raw.advance_apply_to(self.applied);
            self.settle();
            self.release_reads();
            // After a membership change, snapshot at once: a new member that needs a
            // snapshot refuses one whose membership does not include it.
            if membership_changed
                || self.applied - self.snapshot_index >= self.cfg.snapshot_threshold
            {
                self.snapshot_now()?;
            }
        }
        Ok(n)
    }

    fn apply_conf(&mut self, cc: &ConfChangeV2, ctx: &[u8]) -> Result<()> {
        // raft validates a change when it is proposed; a change that fails here fails the
        // same way on every replica, which leaves membership as it was everywhere.
        match self.raw.apply_conf_change(cc) {
            Ok(mut cs) => {
                // raft-rs keeps members in hash sets: sort, so that snapshots and answers
                // do not depend on hash order.
                sort_conf(&mut cs);
                self.conf = cs.clone();
                if let Ok(b) = <[u8; 8]>::try_from(ctx) {
                    self.effects.push_back(Effect::MembershipChanged {
                        token: u64::from_le_bytes(b),
                        conf: cs,
                    });
                }
            }
            Err(e) => tracing::warn!(error = %e, "conf change refused at apply"),
        }
        Ok(())
    }

    /// Snapshots the state machine at `applied` and compacts the log up to it.
    pub fn snapshot_now(&mut self) -> Result<()> {
        if self.applied <= self.snapshot_index {
            return Ok(());
        }
        let data = self.dedup.encode_snapshot(&self.sm.snapshot());
        let snap = make_snapshot(self.applied, self.applied_term, self.conf.clone(), data);
        self.raw.mut_store().compact(snap)?;
        self.snapshot_index = self.applied;
        tracing::debug!(
            node_id = self.cfg.id,
            index = self.applied,
            "snapshot taken"
        );
        Ok(())
    }

    fn release_reads(&mut self) {
        while let Some(&(index, token)) = self.reads.front() {
            if index > self.applied {
                break;
            }
            self.reads.pop_front();
            self.effects.push_back(Effect::ReadReady { token });
        }
    }

    /// The next effect to carry out.
    pub fn poll_effect(&mut self) -> Option<Effect> {
        self.effects.pop_front()
    }

    /// True if committed entries wait to be applied.
    pub fn has_pending_apply(&self) -> bool {
        !self.to_apply.is_empty()
    }

    pub fn state_machine(&self) -> &S {
        &self.sm
    }

    pub fn id(&self) -> u64 {
        self.cfg.id
    }

    pub fn config(&self) -> &ValidConfig {
        &self.cfg
    }

    pub fn is_leader(&self) -> bool {
        self.raw.raft.state == StateRole::Leader
    }

    pub fn leader(&self) -> Option<u64> {
        let l = self.raw.raft.leader_id;
        (l != 0).then_some(l)
    }

    pub fn term(&self) -> u64 {
        self.raw.raft.term
    }

    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// The log store (tests read the persisted log through it).
    pub fn store(&self) -> &L {
        self.raw.store()
    }

    pub fn status(&self) -> Status {
        let r = &self.raw.raft;
        let mut progress = BTreeMap::new();
        if r.state == StateRole::Leader {
            for (id, p) in r.prs().iter() {
                progress.insert(
                    *id,
                    PeerProgress {
                        matched: p.matched,
                        next_index: p.next_idx,
                        state: format!("{:?}", p.state),
                        recent_active: p.recent_active,
                    },
                );
            }
        }
        let mut cs = r.prs().conf().to_conf_state();
        sort_conf(&mut cs);
        Status {
            id: self.cfg.id,
            term: r.term,
            role: r.state.into(),
            leader: self.leader(),
            commit: r.raft_log.committed,
            applied: self.applied,
            voters: cs.voters,
            learners: cs.learners,
            progress,
        }
    }
}

fn sort_conf(cs: &mut ConfState) {
    cs.voters.sort_unstable();
    cs.learners.sort_unstable();
    cs.voters_outgoing.sort_unstable();
    cs.learners_next.sort_unstable();
}

/// True for message types that carry no client data and must never wait (for metrics and
/// transports that want to prioritise).
pub fn is_heartbeat(m: &Message) -> bool {
    matches!(
        m.get_msg_type(),
        MessageType::MsgHeartbeat | MessageType::MsgHeartbeatResponse
    )
}
