//! The storage actor: the one writer of the durable store (`starling-store`). Writes from
//! the shards are gathered and committed together, one fsync for many (group commit), on a
//! blocking worker of their own, so that no actor's thread waits for the disk.
//!
//! A commit starts as soon as writes are pending and none is running (after at most
//! `storage.commit_interval_ms`, when that is set); what arrives while one runs goes into
//! the next. Each write may ask to be told when it is durable.
//!
//! A delivery record retired before its commit started (a QoS 1 delivery sent at once and
//! acknowledged meanwhile, see `routing::deliver`) is taken out of the pending batch with
//! its retirement: neither is written. Under load, with commits back to back, most of a
//! persistent subscriber's records go this way.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use starling_config::FsyncPolicy;
use starling_rt::blocking::BlockingPool;
use starling_rt::{time, Actor, ActorId, Ctx, Reply, TimerId, TrySendError, WeakAddr};
use starling_session::Message;
use starling_store::{Fsync, Op, Store};
use tracing::{debug, error, warn};

use crate::metrics::add;
use crate::msg::{
    ClientMsg, CommitDone, Delivery, HeldDelivery, LinkWrite, RouterMsg, StoreMsg, StoreOp, Stored,
    Waiter, WaiterTo, OWN_WRITE,
};
use crate::settings::Shared;

mod batch;

use batch::{Batch, Taken};

/// Pending ops past which a commit starts without waiting for `commit_interval_ms`. A commit
/// takes what is pending whole (each publisher is told about its own ops), so a commit is
/// bounded by what the mailbox holds: at most `STORE_MAILBOX` writes of one shard turn each.
const COMMIT_OPS_MAX: usize = 8192;

/// How long a batch that only early-sent deliveries and retirements wait on may wait for its
/// commit (with `commit_interval_ms = 0`): subscribers' acknowledgements arriving meanwhile
/// take records back out unwritten, and nothing waits on the commit but publishers that
/// such an acknowledgement answers too.
const EARLY_GRACE: Duration = Duration::from_millis(5);

/// A delivery record may go out before its commit while more than this share of
/// `max_bytes` is free (1/4): near the cap, a record the store refuses must not have been
/// delivered, since its publisher hears it was not taken.
const EARLY_ROOM_DIVISOR: u64 = 4;

pub(crate) struct StorageActor {
    shared: Arc<Shared>,
    /// `None` while a commit runs (the store is on the worker).
    store: Option<Store>,
    pool: BlockingPool,
    fsync: Fsync,
    interval: Duration,
    /// Whether something in `pending` must not wait (see [`EARLY_GRACE`]).
    urgent: bool,
    /// What the next commit writes, and who waits for it (see [`Batch`]). The indices
    /// below are into it.
    pending: Batch<Waiter>,
    /// Whether the shards may send QoS 1 deliveries to persistent sessions before their
    /// records are durable (`routing::deliver`): while the store has room.
    early: bool,
    /// The router's shards (`StoreMsg::Shards`, at start), told when `early` changes.
    shards: Vec<WeakAddr<RouterMsg>>,
    /// Retained puts of `pending` (op index, message, its shard), taken back if refused.
    retained: Vec<(usize, Arc<Message>, WeakAddr<RouterMsg>)>,
    /// Deliveries held for `pending` (op indices into it), handed back to their shard.
    deliveries: Vec<(HeldDelivery, WeakAddr<RouterMsg>)>,
    armed: Option<TimerId>,
    /// Waiting for everything pending to be committed.
    flushing: Vec<Reply<()>>,
    /// Waiting for the store to be closed, after the last commit.
    closing: Vec<Reply<()>>,
    /// The worker died with the store: nothing more can be written.
    lost: bool,
}

impl StorageActor {
    pub(crate) fn new(shared: Arc<Shared>, store: Store) -> Self {
        let s = &shared.config.storage;
        let fsync = match s.fsync {
            FsyncPolicy::Always => Fsync::Always,
            FsyncPolicy::Never => Fsync::Never,
        };
        let interval = Duration::from_millis(u64::from(s.commit_interval_ms));
        // What the store held at open, before the first commit.
        set_usage(&shared, &store);
        let early = has_room(&store);
        Self {
            shared,
            store: Some(store),
            // One thread: commits are serial by nature (one writer); one queued job at most,
            // since a commit starts only when the last one is back.
            pool: BlockingPool::new("store", 1, 1),
            fsync,
            interval,
            urgent: false,
            pending: Batch::default(),
            early,
            shards: Vec::new(),
            retained: Vec::new(),
            deliveries: Vec::new(),
            armed: None,
            flushing: Vec::new(),
            closing: Vec::new(),
            lost: false,
        }
    }

    fn write(
        &mut self,
        ops: Vec<StoreOp>,
        then: Vec<Waiter>,
        retained: Vec<(usize, Arc<Message>)>,
        deliveries: Vec<HeldDelivery>,
        shard: Option<WeakAddr<RouterMsg>>,
        ctx: &mut Ctx<Self>,
    ) {
        let base = self.pending.len();
        if let Some(shard) = shard {
            self.retained.extend(
                retained
                    .into_iter()
                    .map(|(i, m)| (i + base, m, shard.clone())),
            );
            self.deliveries.extend(deliveries.into_iter().map(|mut h| {
                h.op = h.op.map(|i| i + base);
                (h, shard.clone())
            }));
        }
        // Only a publisher may be told before the commit: a client counts the answers to
        // its own writes in order, and the cluster's waiters go by the commit.
        let early = |w: &Waiter| matches!(&w.to, WaiterTo::Client(to) if to.tag != OWN_WRITE);
        self.urgent |= !self.deliveries.is_empty()
            || then.iter().any(|w| !early(w))
            || ops
                .iter()
                .any(|op| !matches!(op, StoreOp::Delivery { .. } | StoreOp::Retire { .. }));
        let then = then.into_iter().map(|w| {
            let early = early(&w);
            let ops = w.ops.clone();
            (w, ops, early)
        });
        let (told, cancelled) = self.pending.add(ops, then);
        add(&self.shared.metrics.store_cancelled, cancelled);
        // Publishes whose every record was retired before its commit: delivered and
        // acknowledged wherever they were stored for, so nothing of them needs the disk.
        tell_all(told.into_iter().map(|w| (w, Stored::Durable)));
        if self.store.is_none() {
            // A commit runs: this goes into the next.
            return;
        }
        self.kick(ctx);
    }

    /// Starts a commit, or arms the timer for one: with `commit_interval_ms = 0` only a
    /// batch that nothing urgent waits on waits, for [`EARLY_GRACE`].
    fn kick(&mut self, ctx: &mut Ctx<Self>) {
        let now = self.pending.is_empty()
            || self.pending.len() >= COMMIT_OPS_MAX
            || (self.interval.is_zero() && self.urgent)
            || !self.flushing.is_empty()
            || !self.closing.is_empty();
        if now {
            self.start(ctx);
        } else if self.armed.is_none() {
            let wait = if self.interval.is_zero() {
                EARLY_GRACE
            } else {
                self.interval
            };
            self.armed = Some(ctx.after(wait, StoreMsg::CommitNow));
        }
    }

    fn start(&mut self, ctx: &mut Ctx<Self>) {
        if self.store.is_none() {
            // A commit runs: this goes into the next.
            return;
        }
        if self.pending.is_empty() && !self.pending.has_waiters() {
            // Nothing to commit: deliveries that only waited behind earlier commits (all
            // done now) go back to their shards.
            let held = std::mem::take(&mut self.deliveries);
            hand_back(&self.shared, held, &[]);
            return;
        }
        let Some(mut store) = self.store.take() else {
            return;
        };
        if let Some(t) = self.armed.take() {
            ctx.cancel(t);
        }
        self.urgent = false;
        let Taken { ops, live, waiting } = self.pending.take();
        // Their ranges are batch indices, as the refusals are made again (`committed`).
        let waiting: Vec<Waiter> = waiting
            .into_iter()
            .map(|(w, ops)| Waiter { to: w.to, ops })
            .collect();
        let retained = std::mem::take(&mut self.retained);
        let deliveries = std::mem::take(&mut self.deliveries);
        let fsync = self.fsync;
        let n = ops.len();
        if n == 0 {
            // Everything cancelled out: nothing to make durable, no sync.
            let done = CommitDone {
                store: Some(store),
                result: Ok(starling_store::Committed::default()),
                ops: 0,
                live,
                waiting,
                retained,
                deliveries,
                took: Duration::ZERO,
            };
            return self.committed(done, ctx);
        }
        let started = time::now();
        let job = self.pool.try_run(move || {
            // Encoded here, off the threads that serve connections.
            let (now, wall) = (time::now(), time::wall());
            let ops: Vec<Op> = ops.into_iter().map(|op| op.into_op(now, wall)).collect();
            let result = store.commit(&ops, fsync);
            (store, result)
        });
        match job {
            Ok(job) => ctx.spawn_then(job, move |r| {
                let took = time::now().saturating_duration_since(started);
                let (store, result) = match r {
                    Ok((store, result)) => (Some(store), result.map_err(|e| e.to_string())),
                    Err(lost) => (None, Err(lost.to_string())),
                };
                StoreMsg::Committed(Box::new(CommitDone {
                    store,
                    result,
                    ops: n,
                    live,
                    waiting,
                    retained,
                    deliveries,
                    took,
                }))
            }),
            // The pool holds one job and only this actor submits, one at a time.
            Err(full) => unreachable!("the store's worker is busy with another job: {full}"),
        }
    }

    /// Drops the store, which closes its file (redb makes what `Fsync::Never` committed
    /// durable on close); later writes are refused.
    fn close(&mut self) {
        self.store = None;
        self.lost = true;
        for r in self.closing.drain(..) {
            let _ = r.send(());
        }
    }

    fn committed(&mut self, mut done: CommitDone, ctx: &mut Ctx<Self>) {
        let m = &self.shared.metrics;
        if done.ops > 0 {
            add(&m.store_commits, 1);
            add(&m.store_ops, done.ops as u64);
            add(
                &m.store_commit_us,
                u64::try_from(done.took.as_micros()).unwrap_or(u64::MAX),
            );
        }
        if let (Ok(c), false) = (&mut done.result, done.live.is_empty()) {
            // Back to the batch's indices, holes included.
            for r in &mut c.refused {
                r.op = done.live[r.op];
            }
        }
        match &done.result {
            Ok(c) if !c.refused.is_empty() => {
                add(&m.store_refused, c.refused.len() as u64);
                debug!(refused = c.refused.len(), first = %c.refused[0].reason, "store refused writes");
                for (i, msg, shard) in done.retained {
                    if c.refused.iter().any(|r| r.op == i) {
                        // Not stored: not kept in memory either, so that what subscribers
                        // find is what a restart finds.
                        send_urgent(&shard, RouterMsg::RetainedRefused(msg));
                    }
                }
            }
            Ok(_) => {}
            Err(e) => {
                add(&m.store_errors, 1);
                error!(error = %e, ops = done.ops, "store commit failed: these writes are not durable");
            }
        }
        // The gauges before anyone hears of the commit: a client told its publish is
        // stored reads a usage that counts it (a test asserted so and lost the race).
        if let Some(store) = &done.store {
            set_usage(&self.shared, store);
        }
        // Deliveries after the commit, so that what a subscriber acknowledges is stored.
        let refused: &[starling_store::Refused] = match &done.result {
            Ok(c) => &c.refused,
            Err(_) => &[],
        };
        hand_back(&self.shared, done.deliveries, refused);
        let outcomes = done.waiting.into_iter().map(|w| {
            let outcome = match &done.result {
                Err(_) => Stored::Failed,
                Ok(c)
                    if c.refused
                        .iter()
                        .any(|r| w.ops.contains(&r.op) && drops(&r.reason)) =>
                {
                    Stored::Refused
                }
                Ok(_) => Stored::Durable,
            };
            (w, outcome)
        });
        tell_all(outcomes);
        match done.store {
            Some(store) => {
                let early = has_room(&store);
                if early != self.early {
                    self.early = early;
                    for shard in &self.shards {
                        send_urgent(shard, RouterMsg::StoreRoom(early));
                    }
                }
                self.store = Some(store);
            }
            None => {
                self.lost = true;
                // The worker died with the store (a panic in redb): nothing more can be
                // written. Every later write is refused and logged.
                error!("the store was lost with its worker; later writes are dropped");
            }
        }
        if self.store.is_some()
            && (!self.pending.is_empty()
                || self.pending.has_waiters()
                || !self.deliveries.is_empty())
        {
            self.kick(ctx);
        }
        if (self.pending.is_empty() && self.store.is_some()) || self.lost {
            for r in self.flushing.drain(..) {
                let _ = r.send(());
            }
            if !self.closing.is_empty() {
                self.close();
            }
        }
    }
}

impl Actor for StorageActor {
    type Msg = StoreMsg;

    async fn handle(&mut self, msg: StoreMsg, ctx: &mut Ctx<Self>) {
        match msg {
            StoreMsg::Write {
                ops,
                then,
                retained,
                deliveries,
                shard,
            } => {
                if self.lost {
                    add(&self.shared.metrics.store_errors, 1);
                    warn!(ops = ops.len(), "store closed or lost: writes dropped");
                    for w in then {
                        match w.to {
                            WaiterTo::Link(shard, node, seq) => {
                                let outcome = LinkWrite::StoreGone;
                                send_urgent(&shard, RouterMsg::LinkStored { node, seq, outcome });
                            }
                            _ => tell(w, Stored::Failed),
                        }
                    }
                    // Routed all the same: delivered from memory.
                    if let Some(shard) = shard {
                        let held = deliveries.into_iter().map(|h| (h, shard.clone()));
                        hand_back(&self.shared, held.collect(), &[]);
                    }
                    return;
                }
                self.write(ops, then, retained, deliveries, shard, ctx);
            }
            StoreMsg::Shards(shards) => {
                // A shard holds every record's delivery until told.
                for shard in &shards {
                    send_urgent(shard, RouterMsg::StoreRoom(self.early));
                }
                self.shards = shards;
            }
            StoreMsg::CommitNow => {
                self.armed = None;
                self.start(ctx);
            }
            StoreMsg::Committed(done) => self.committed(*done, ctx),
            StoreMsg::Close(reply) => {
                self.closing.push(reply);
                if self.lost || (self.pending.is_empty() && self.store.is_some()) {
                    self.close();
                } else {
                    self.start(ctx);
                }
            }
            StoreMsg::Flush(reply) => {
                if self.lost || (self.pending.is_empty() && self.store.is_some()) {
                    let _ = reply.send(());
                } else {
                    self.flushing.push(reply);
                    self.start(ctx);
                }
            }
        }
    }
}

/// Hands deliveries back to their shards once what they waited for is committed, in order,
/// one message per shard. One whose record was refused is dropped: its publisher hears the
/// store is full.
fn hand_back(
    shared: &Shared,
    held: Vec<(HeldDelivery, WeakAddr<RouterMsg>)>,
    refused: &[starling_store::Refused],
) {
    let mut to_shards: Vec<ToShard> = Vec::new();
    for (h, shard) in held {
        if h.op
            .is_some_and(|i| refused.iter().any(|r| r.op == i && drops(&r.reason)))
        {
            add(&shared.metrics.dropped_other, 1);
            continue;
        }
        let d = (h.subscriber, h.actor, h.delivery);
        match to_shards.iter_mut().find(|(s, _)| s.id() == shard.id()) {
            Some((_, ds)) => ds.push(d),
            None => to_shards.push((shard, vec![d])),
        }
    }
    for (shard, ds) in to_shards {
        send_urgent(&shard, RouterMsg::StoredDeliveries(ds));
    }
}

/// Whether a refused delivery record drops its delivery. A session that is not stored (it
/// stopped outliving its connection, or ended, while the delivery was on its way) needs no
/// record: delivered from memory, as for a session that never was persistent. Any other
/// refusal (full, unencodable) drops it, as its publisher is told.
fn drops(reason: &starling_store::Refusal) -> bool {
    !matches!(reason, starling_store::Refusal::NoSession)
}

/// Whether more than a quarter of `max_bytes` is free (see [`EARLY_ROOM_DIVISOR`]).
fn has_room(store: &Store) -> bool {
    let max = store.limits().max_bytes;
    store.usage().bytes < max - max / EARLY_ROOM_DIVISOR
}

/// The store's gauges for `$SYS`.
fn set_usage(shared: &Shared, store: &Store) {
    let (u, m) = (store.usage(), &shared.metrics);
    let set =
        |g: &std::sync::atomic::AtomicU64, v| g.store(v, std::sync::atomic::Ordering::Relaxed);
    set(&m.store_bytes, u.bytes);
    set(&m.store_sessions, u.sessions);
    set(&m.store_messages, u.deliveries);
    m.store_messages_max
        .fetch_max(u.deliveries, std::sync::atomic::Ordering::Relaxed);
}

/// A shard and the deliveries a commit made durable for it.
type ToShard = (WeakAddr<RouterMsg>, Vec<(Arc<str>, ActorId, Delivery)>);

/// A publisher's answers, by tag.
type Settled = Vec<(u32, Stored)>;

/// Tells each waiter its outcome: one message per publisher (a commit answers hundreds of
/// publishes of one publisher under load, and one message each overflowed its urgent lane).
fn tell_all(outcomes: impl Iterator<Item = (Waiter, Stored)>) {
    let mut answers: Vec<(WeakAddr<ClientMsg>, Settled)> = Vec::new();
    let mut by_client: HashMap<ActorId, usize> = HashMap::new();
    for (w, outcome) in outcomes {
        match w.to {
            WaiterTo::Client(to) if to.tag != OWN_WRITE => match by_client.get(&to.addr.id()) {
                Some(&i) => answers[i].1.push((to.tag, outcome)),
                None => {
                    by_client.insert(to.addr.id(), answers.len());
                    answers.push((to.addr, vec![(to.tag, outcome)]));
                }
            },
            to => tell(Waiter { to, ops: w.ops }, outcome),
        }
    }
    for (addr, mut settled) in answers {
        let msg = match settled.len() {
            1 => {
                let (tag, outcome) = settled.remove(0);
                ClientMsg::Stored { tag, outcome }
            }
            _ => ClientMsg::Settled(settled),
        };
        send_urgent(&addr, msg);
    }
}

/// Tells a publisher (or the shard that gathers its acknowledgement): its acknowledgements
/// wait for this.
fn tell(w: Waiter, outcome: Stored) {
    match w.to {
        WaiterTo::Client(to) => send_urgent(
            &to.addr,
            ClientMsg::Stored {
                tag: to.tag,
                outcome,
            },
        ),
        WaiterTo::Shard(shard, key) => {
            send_urgent(&shard, RouterMsg::ForwardStored { key, outcome })
        }
        WaiterTo::Link(shard, node, seq) => {
            let outcome = if outcome == Stored::Durable {
                LinkWrite::Durable
            } else {
                LinkWrite::NotDurable
            };
            send_urgent(&shard, RouterMsg::LinkStored { node, seq, outcome });
        }
        WaiterTo::Parked(shard, node, seq) => {
            send_urgent(&shard, RouterMsg::Parked { node, seq, outcome });
        }
        // Whatever the outcome: a drop that failed leaves a row a restart sends again,
        // which the node acknowledges again (it took the batch) or takes.
        WaiterTo::Unparked(shard, node, inc, seq) => {
            send_urgent(&shard, RouterMsg::Unparked { node, inc, seq });
        }
        WaiterTo::Done(tx) => {
            let _ = tx.send(outcome);
        }
    }
}

/// On `to`'s urgent lane, behind no delivery; if even that is full, from a task that waits
/// for room, so that the store never waits on another actor. Nothing when `to` is gone:
/// nobody waits any more.
fn send_urgent<M: Send + 'static>(to: &WeakAddr<M>, msg: M) {
    if let Err(TrySendError::Full(msg)) = to.try_send_urgent(msg) {
        if let Some(addr) = to.upgrade() {
            starling_rt::spawn(async move {
                let _ = addr.send(msg).await;
            });
        }
    }
}
