//! A persistent session's own writes to the store: its meta (subscriptions, will, expiry)
//! on CONNECT, SUBSCRIBE, UNSUBSCRIBE, detach and timeouts; its deliveries' stages and
//! retirements as the session reports them ([`StoreChange`]); its inbound QoS 2 packet
//! identifiers as PUBRELs release them. Also the client actor of a session restored at
//! start, which routes its stored subscriptions again. The shards write the deliveries
//! themselves (see `routing`), and a QoS 2 identifier's record goes with the routing of its
//! PUBLISH.
//!
//! What must be durable before the client sees what follows (a QoS 2 delivery's packet
//! identifier before its PUBLISH, its release before the PUBREL, the subscriptions before
//! the SUBACK, the session before the CONNACK) is a barrier: the output from where it
//! stood at that change waits until the store answers [`OWN_WRITE`], while what was
//! encoded before goes. Everything else is written on the way, in the order the session
//! changed: one writer per session, and the store's mailbox keeps a sender's order.

use std::collections::VecDeque;
use std::sync::Arc;

use starling_codec::{Packet, PacketId};
use starling_hooks::Chain;
use starling_rt::{time, Ctx, WeakAddr};
use starling_session::{Session, StoreChange, SubscribeRequest};
use starling_store::{DeliveryStage, Op, SessionParts, StoredDelivery};

use super::acks::Resent;
use super::Client;
use crate::gate::AuthGate;
use crate::metrics::add;
use crate::msg::{AckTo, RegistryMsg, StoreMsg, StoreOp, Stored, Waiter, WaiterTo, OWN_WRITE};
use crate::settings::Shared;
use crate::shards::Shards;

/// Made when a session that outlives its connection first writes (or is restored).
#[derive(Debug, Default)]
pub(super) struct Persist {
    ops: Vec<StoreOp>,
    /// `ops` holds a change what is sent next must wait for: the output from this offset
    /// on waits for it.
    barrier_at: Option<usize>,
    /// For each barrier write sent and not yet durable, oldest first (the store answers in
    /// order), the output offset from which what is encoded waits for it.
    held: VecDeque<usize>,
    /// The store holds this session (a `PutSession` went out): its end drops it.
    stored: bool,
    /// The meta changed since it was last written.
    meta_dirty: bool,
    /// The inbound QoS 2 identifier of the publish about to be routed.
    pub(super) inbound: Option<PacketId>,
    /// Handed over by another node: nothing of it is in this node's store yet, and all of
    /// it is written before it subscribes (`Client::adopt`).
    adopt: bool,
}

impl Persist {
    pub(super) fn restored() -> Self {
        Self {
            stored: true,
            ..Self::default()
        }
    }

    fn adopted() -> Self {
        Self {
            adopt: true,
            ..Self::default()
        }
    }
}

impl Client {
    /// Whether this session's state goes to the store: it outlives its connection (or is
    /// stored already, and must be dropped there), on a node with a store.
    fn persisting(&self) -> bool {
        self.shards.store().is_some()
            && (self.session.outlives_connection()
                || self.persist.as_ref().is_some_and(|p| p.stored))
    }

    /// The meta is to be written at the end of the turn, the output waiting for it when
    /// `barrier` (SUBACK, CONNACK).
    pub(super) fn meta_changed(&mut self, barrier: bool) {
        if !self.persisting() {
            return;
        }
        let at = self.out_len();
        let p = self.persist.get_or_insert_with(Box::default);
        p.meta_dirty = true;
        if barrier {
            p.barrier_at.get_or_insert(at);
        }
    }

    fn out_len(&self) -> usize {
        self.conn.as_ref().map_or(0, |c| c.out.len())
    }

    /// A change the session reported.
    pub(super) fn store_change(&mut self, change: StoreChange) {
        let client_id = self.session.client_id();
        let at = self.out_len();
        let Some(p) = self.persist.as_mut().filter(|p| p.stored) else {
            return;
        };
        if change.must_precede() {
            p.barrier_at.get_or_insert(at);
        }
        let op = match change {
            StoreChange::Stage {
                seq,
                packet_id,
                phase,
            } => Op::StageDelivery {
                client_id: client_id.to_string(),
                seq,
                stage: DeliveryStage::Inflight { packet_id, phase },
            }
            .into(),
            // The shared id: most retirements cancel their record before its commit.
            StoreChange::Retire { seq } => StoreOp::Retire {
                client_id: client_id.clone(),
                seq,
            },
            StoreChange::InboundReleased(packet_id) => Op::DropInbound {
                client_id: client_id.to_string(),
                packet_id,
            }
            .into(),
            StoreChange::InboundRouted(packet_id) => {
                p.inbound = Some(packet_id);
                return;
            }
        };
        p.ops.push(op);
    }

    /// The connection went: the QoS 1 deliveries in flight, not staged as they were sent,
    /// are staged now, so that a restart resends them with their packet ids.
    pub(super) fn stage_qos1(&mut self) {
        if self.persist.as_ref().is_some_and(|p| p.stored) {
            for change in self.session.qos1_stages() {
                self.store_change(change);
            }
        }
    }

    /// The session ended: its records go.
    pub(super) fn session_dropped(&mut self) {
        let client_id = self.session.client_id().to_string();
        if let Some(p) = self.persist.as_mut().filter(|p| p.stored) {
            // What the session changed before is moot: its records all go.
            p.ops.clear();
            p.ops.push(Op::DropSession { client_id }.into());
            p.stored = false;
            p.meta_dirty = false;
        }
    }

    /// The identifier to store with the publish being routed, when this session is stored.
    pub(super) fn inbound_for_publish(&mut self) -> Option<(std::sync::Arc<str>, PacketId)> {
        let id = self.persist.as_mut()?.inbound.take()?;
        Some((self.session.client_id().clone(), id))
    }

    /// How much of `out_len` bytes of output may be written now: what was encoded before
    /// the oldest barrier write that is not durable yet.
    pub(super) fn sendable(&self, out_len: usize) -> usize {
        self.persist
            .as_ref()
            .and_then(|p| p.held.front())
            .map_or(out_len, |&at| at.min(out_len))
    }

    /// `n` bytes of output went out (or were dropped with their connection): the offsets
    /// of what waits move back.
    pub(super) fn output_sent(&mut self, n: usize) {
        if let Some(p) = &mut self.persist {
            for at in p.held.iter_mut().chain(p.barrier_at.as_mut()) {
                *at = at.saturating_sub(n);
            }
        }
    }

    /// The store answered the oldest barrier write.
    pub(super) fn own_write_durable(&mut self) {
        if let Some(p) = &mut self.persist {
            p.held.pop_front();
        }
    }

    /// Whether `write_store` has anything to do.
    pub(super) fn store_pending(&self) -> bool {
        matches!(&self.persist, Some(p) if p.meta_dirty || !p.ops.is_empty() || p.barrier_at.is_some())
    }

    /// Sends what the turn changed, in one write (the meta last: it is the newest state).
    pub(super) async fn write_store(&mut self, ctx: &mut Ctx<Self>) {
        let meta = match &self.persist {
            Some(p) if p.meta_dirty => self.meta_op(),
            Some(p) if !p.ops.is_empty() || p.barrier_at.is_some() => None,
            _ => return,
        };
        let Some(store) = self.shards.store().cloned() else {
            return;
        };
        let Some(p) = self.persist.as_mut() else {
            return;
        };
        if p.meta_dirty {
            p.meta_dirty = false;
            match meta {
                Some(op) => {
                    p.ops.push(op.into());
                    p.stored = true;
                }
                None if p.stored => {
                    p.ops.push(
                        Op::DropSession {
                            client_id: self.session.client_id().to_string(),
                        }
                        .into(),
                    );
                    p.stored = false;
                }
                None => {}
            }
        }
        let ops = std::mem::take(&mut p.ops);
        let barrier = p.barrier_at.take();
        if ops.is_empty() {
            return;
        }
        let then = if let Some(at) = barrier {
            p.held.push_back(at);
            vec![Waiter {
                to: WaiterTo::Client(AckTo {
                    addr: ctx.weak_addr(),
                    tag: OWN_WRITE,
                    inbound: None,
                }),
                ops: 0..ops.len(),
            }]
        } else {
            Vec::new()
        };
        let write = StoreMsg::Write {
            ops,
            then,
            retained: Vec::new(),
            deliveries: Vec::new(),
            shard: None,
        };
        // Waited on when full: one writer per session keeps its order.
        if store.send(write).await.is_err() {
            // The store stopped (shutdown): nothing will answer.
            if barrier.is_some() {
                if let Some(p) = &mut self.persist {
                    p.held.pop_back();
                }
            }
        }
    }

    /// The session's meta record as it stands, `None` when it has nothing to keep.
    fn meta_op(&self) -> Option<Op> {
        let state = self.session.snapshot_meta(time::now(), time::wall());
        let mut parts = SessionParts::split(state)?;
        if !self.session.outlives_connection() {
            return None;
        }
        parts.meta.owner = self.gate.username().map(|u| u.to_string());
        parts.meta.connected = self.session.is_attached();
        Some(Op::PutSession {
            client_id: parts.client_id,
            meta: parts.meta,
        })
    }

    /// A client actor for a session restored from the store at start, or handed over by
    /// another node (`handed_over`: not in this node's store yet), detached, belonging to
    /// `owner`.
    pub(crate) fn restored(
        shared: Arc<Shared>,
        shards: Shards,
        chain: Arc<Chain>,
        registry: WeakAddr<RegistryMsg>,
        session: Session,
        owner: Option<Arc<str>>,
        handed_over: bool,
    ) -> Self {
        let gate = AuthGate::new(
            shared.clone(),
            chain,
            owner.as_deref().map(String::from),
            session.client_id().clone(),
            std::net::Ipv4Addr::UNSPECIFIED.into(),
        );
        let mut c = Self::with(shared, shards, registry, session, gate);
        c.persist = Some(Box::new(if handed_over {
            Persist::adopted()
        } else {
            Persist::restored()
        }));
        c
    }

    /// A session handed over by another node writes all it holds to this node's store (its
    /// meta, its deliveries under seqs of this node's, its inbound QoS 2 identifiers) and
    /// waits until that is durable, before it subscribes: the registry lets its CONNECT
    /// resume only after, so a crash of this node right after the move loses none of what
    /// the old node held. Nothing on a node without a store, or for a session that does
    /// not outlive its connection; a write that fails leaves it in memory only (logged),
    /// as every handover was before.
    pub(super) async fn adopt(&mut self) {
        if !self
            .persist
            .as_mut()
            .is_some_and(|p| std::mem::take(&mut p.adopt))
        {
            return;
        }
        let Some(store) = self.shards.store().cloned() else {
            return;
        };
        if !self.session.outlives_connection() {
            return;
        }
        let state = self.session.snapshot(time::now(), time::wall());
        let Some(mut parts) = SessionParts::split(state) else {
            return;
        };
        let n = parts.inflight.len() + parts.queue.len();
        // Keys only for deliveries: a session that brought none asks no shard.
        let base = match n {
            0 => 0,
            n => match self.shards.reserve_seqs(n as u64).await {
                Some(base) => base,
                None => return,
            },
        };
        parts.meta.owner = self.gate.username().map(|u| u.to_string());
        parts.meta.connected = false;
        let client_id = parts.client_id;
        let mut ops = Vec::with_capacity(n + parts.inbound_qos2.len() + 2);
        // Whatever an earlier life of this client id here left: the session is this one.
        ops.push(Op::DropSession {
            client_id: client_id.clone(),
        });
        ops.push(Op::PutSession {
            client_id: client_id.clone(),
            meta: parts.meta,
        });
        let mut seqs = base..;
        let mut put = |seq: u64, stage: DeliveryStage, delivery| {
            ops.push(Op::PutDelivery {
                client_id: client_id.clone(),
                seq,
                record: StoredDelivery { stage, delivery },
            });
            Some(seq)
        };
        let inflight: Vec<Option<u64>> = parts
            .inflight
            .into_iter()
            .zip(&mut seqs)
            .map(|(f, seq)| {
                let stage = DeliveryStage::Inflight {
                    packet_id: f.packet_id,
                    phase: f.phase,
                };
                put(seq, stage, f.delivery)
            })
            .collect();
        let queue: Vec<Option<u64>> = parts
            .queue
            .into_iter()
            .zip(&mut seqs)
            .map(|(d, seq)| put(seq, DeliveryStage::Queued, d))
            .collect();
        for packet_id in parts.inbound_qos2 {
            ops.push(Op::PutInbound {
                client_id: client_id.clone(),
                packet_id,
            });
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let write = StoreMsg::Write {
            then: vec![Waiter {
                to: WaiterTo::Done(tx),
                ops: 0..ops.len(),
            }],
            ops: ops.into_iter().map(StoreOp::from).collect(),
            retained: Vec::new(),
            deliveries: Vec::new(),
            shard: None,
        };
        if store.send(write).await.is_err() {
            return;
        }
        match rx.await {
            Ok(Stored::Durable) => {
                self.session.set_store_keys(inflight, queue);
                if let Some(p) = &mut self.persist {
                    p.stored = true;
                }
                add(&self.shared.metrics.cluster_sessions_stored, 1);
            }
            outcome => {
                tracing::warn!(%client_id, ?outcome, deliveries = n, "a handed-over session was not stored: it is kept in memory only");
            }
        }
    }

    /// Whether the shards store this session's QoS 1/2 deliveries before handing them over.
    pub(super) fn stores_deliveries(&self) -> bool {
        self.shards.store().is_some() && self.session.outlives_connection()
    }

    /// A session restored at start subscribes its filters again, as they were granted; the
    /// retained messages they match are not sent again.
    pub(super) async fn resubscribe(&mut self, ctx: &mut Ctx<Self>) -> bool {
        let filters: Vec<SubscribeRequest> = self
            .session
            .subscriptions()
            .iter()
            .map(|(filter, (options, id))| SubscribeRequest {
                filter: filter.clone(),
                options: *options,
                subscription_id: *id,
            })
            .collect();
        if filters.is_empty() {
            return true;
        }
        self.meet_shards(&filters, ctx);
        let may_hold = self.may_hold();
        let r = self
            .shards
            .subscribe(
                self.client_id(),
                ctx.weak_addr(),
                may_hold,
                true,
                filters,
                None,
            )
            .await;
        self.presence(false).await;
        if r.results.iter().any(Result::is_err) {
            tracing::warn!(client_id = %self.client_id(), "a stored subscription was refused at restore");
        }
        r.routes_held
    }

    /// Whether a QoS 1/2 publish's acknowledgement waits for its routing's answer: with a
    /// store (it may reach a persistent session) or in a cluster (it may be forwarded).
    pub(super) fn waits_for_routing(&self) -> bool {
        self.shards.store().is_some() || self.shared.config.cluster.enabled
    }

    /// Whether a QoS 2 packet id freed by a failing PUBREC keeps its stored record (see
    /// `Session::abandon_inbound`): in a cluster, where the message may have reached other
    /// nodes, a resend after a crash must not be routed again.
    fn keep_abandoned(&self) -> bool {
        self.shared.config.cluster.enabled
    }

    /// The session's PUBREC for a QoS 2 PUBLISH sent again under a packet id it routed
    /// before (see `Acks::resent`): back if it goes now.
    pub(super) fn resent(&mut self, p: Packet) -> Option<Packet> {
        let v5 = self.conn.as_ref().is_some_and(|c| c.protocol.is_v5());
        // A routing this actor did not make (restored, or handed over) may have been
        // forwarded to nodes that never confirmed it.
        let unknown_fails = self.shared.config.cluster.enabled;
        let acks = self.acks.get_or_insert_with(Box::default);
        let out = match acks.resent(p, v5, unknown_fails) {
            Resent::Pass(p) => Some(p),
            Resent::Parked => None,
            Resent::Failed(p, id) => {
                self.session.abandon_inbound(id, self.keep_abandoned());
                Some(p)
            }
        };
        if self.acks.as_ref().is_some_and(|a| a.is_empty()) {
            self.acks = None;
        }
        out
    }

    /// The answer for the publishes under `tags`: the acknowledgements waiting for them go,
    /// in order. Returns whether the session has effects to run (a QoS 2 exchange ended by
    /// a failing PUBREC releases its packet id).
    pub(super) fn stored(&mut self, tags: &[u32], outcome: Stored) -> bool {
        let v5 = self.conn.as_ref().is_some_and(|c| c.protocol.is_v5());
        let Some(a) = self.acks.as_mut() else {
            return false;
        };
        let mut abandoned = Vec::new();
        for &tag in tags {
            abandoned.extend(a.stored(tag, outcome, v5));
        }
        let ready: Vec<Packet> = a.ready().collect();
        if a.is_empty() {
            // Nothing waits: an idle connection keeps no box.
            self.acks = None;
        }
        for p in &ready {
            self.encode(p);
        }
        for id in &abandoned {
            self.session.abandon_inbound(*id, self.keep_abandoned());
        }
        !abandoned.is_empty()
    }
}
