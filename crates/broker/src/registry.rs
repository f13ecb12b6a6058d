//! The registry actor: which client actor owns each client identifier. A client id is owned
//! by one actor at a time, so every connection for it goes through that actor (resume,
//! takeover) and no two sessions for one id ever coexist.

use std::sync::Arc;
use std::time::Duration;

use starling_codec::ReasonCode;
use starling_config::ClientIdPolicy;
use starling_hooks::{Chain, Event, EventKind, Subject, What};
use starling_rt::{start_with, time, Actor, Addr, Ctx, Options, TrySendError};
use tracing::debug;

use crate::client::Client;
use crate::metrics::add;
use crate::msg::{Claim, ClaimError, ClientMsg, ClusterMsg, HandOff, NewConn, RegistryMsg};
use crate::refuse::refuse_with;
use crate::seeded::SeededMap;
use crate::settings::Shared;
use crate::shards::Shards;

#[cfg(test)]
mod adopt_tests;
mod handover;
use handover::{Adopting, Awaited};

/// How long shutdown waits for each client to say goodbye.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(2);
/// Restored sessions resubscribing at once, at start.
const RESTORE_CHUNK: usize = 256;

struct Entry {
    addr: Addr<ClientMsg>,
    attaches: u32,
    /// The identity the session belongs to (its username; `None` for anonymous): only
    /// connections of that identity may resume or take it over.
    owner: Option<Arc<str>>,
}

pub(crate) struct Registry {
    shared: Arc<Shared>,
    shards: Shards,
    chain: Arc<Chain>,
    clients: SeededMap<Arc<str>, Entry>,
    /// In a cluster: the cluster actor, and the client ids this node claimed (in this
    /// process) with their epochs. A CONNECT for one of them costs no raft commit, only a
    /// read.
    cluster: Option<Addr<ClusterMsg>>,
    claimed: SeededMap<Arc<str>, u64>,
    /// CONNECTs waiting for the session the previous owner node hands over, by client id.
    handovers: SeededMap<Arc<str>, Awaited>,
    /// Sessions handed over for a claim of this node whose answer has not reached this
    /// actor yet: the previous node may apply the claim, hand the session over and have it
    /// arrive here before the claim's own answer does. Kept (at most [`EARLY_MAX`], for
    /// [`HANDOVER_WAIT`]) until the claim's CONNECT takes it.
    early: SeededMap<Arc<str>, (u64, Box<HandOff>, time::Instant)>,
    /// CONNECTs for client ids this node claimed, waiting for the cluster to confirm the
    /// claim still stands (a newer CONNECT for the id takes the older one's place).
    confirming: SeededMap<Arc<str>, Box<NewConn>>,
    /// CONNECTs waiting for this node's claim of their client id to commit. A newer
    /// CONNECT for the id takes the older one's place, as in `confirming`: the claim is
    /// this node's either way, and the client's latest connection is the one it serves (an
    /// older one answered later would take the session from it).
    claiming: SeededMap<Arc<str>, Box<NewConn>>,
    /// Handed-over sessions being routed here (their subscriptions), the last step before
    /// a CONNECT resumes them, with the CONNECT that waits for it, if one does yet; a newer
    /// CONNECT takes the older one's place here too.
    resuming: SeededMap<Arc<str>, Option<Box<NewConn>>>,
    /// Sessions handed over after their CONNECT went on afresh, taking the fresh session's
    /// place if it gives way (`handover::adopt_late`).
    adopting: SeededMap<Arc<str>, Adopting>,
    /// The node is leaving its cluster (`RegistryMsg::Drain`): CONNECTs are refused, so
    /// that clients reconnect to another node and their sessions follow them there.
    draining: bool,
    /// Where the clients it sends away are pointed (MQTT 5 Server Reference).
    draining_to: Vec<Arc<String>>,
}

/// Sessions kept for claims not yet answered, at most (each is a session's whole state).
const EARLY_MAX: usize = 256;

/// How long a CONNECT that resumes a session another node held waits for that node to hand
/// it over while nothing of it comes; past it the session starts afresh here (the other
/// node is down or cut off). A large session comes in parts, and each restarts the wait.
const HANDOVER_WAIT: Duration = Duration::from_secs(3);
/// How often a waiting CONNECT looks at its wait; the previous node is asked again when
/// nothing came for that long (the frame may have been dropped with a link redialled).
const HANDOVER_TICK: Duration = Duration::from_secs(1);
/// How long a CONNECT waits for its session at most, however steadily it comes (256 MiB
/// at about 4.5 MB/s).
const HANDOVER_WAIT_MAX: Duration = Duration::from_secs(60);

/// How long a CONNECT waits for the cluster to commit its claim before it is refused
/// (MQTT 5 CONNACK 0x88 Server unavailable, 3.x return code 3).
const CLAIM_WAIT: Duration = Duration::from_secs(5);

impl Registry {
    pub(crate) fn new(
        shared: Arc<Shared>,
        shards: Shards,
        chain: Arc<Chain>,
        cluster: Option<Addr<ClusterMsg>>,
    ) -> Self {
        let h = crate::seeded::hasher();
        Self {
            shared,
            shards,
            chain,
            clients: SeededMap::with_hasher(h),
            cluster,
            claimed: SeededMap::with_hasher(h),
            handovers: SeededMap::with_hasher(h),
            early: SeededMap::with_hasher(h),
            confirming: SeededMap::with_hasher(h),
            claiming: SeededMap::with_hasher(h),
            resuming: SeededMap::with_hasher(h),
            adopting: SeededMap::with_hasher(h),
            draining: false,
            draining_to: Vec::new(),
        }
    }

    /// A CONNECT: in a cluster, for a client id this node has not claimed, the claim is
    /// committed first; for one it claimed, a linearizable read confirms that the claim
    /// still stands (both off this actor's turn; other CONNECTs go on meanwhile).
    async fn connect(&mut self, client_id: Arc<str>, conn: Box<NewConn>, ctx: &mut Ctx<Self>) {
        if self.draining {
            return self.refuse(conn, ReasonCode::UseAnotherServer);
        }
        let Some(cluster) = self.cluster.clone() else {
            return self.connect_here(client_id, conn, ctx).await;
        };
        if let Some(waiting) = self.handovers.get_mut(&client_id) {
            // A newer CONNECT for a session still on its way: it waits in the older one's
            // place (which is closed), as a takeover would have it.
            waiting.conn = conn;
            return;
        }
        if let Some(waiting) = self
            .confirming
            .get_mut(&client_id)
            .or_else(|| self.claiming.get_mut(&client_id))
        {
            *waiting = conn;
            return;
        }
        if let Some(waiting) = self.resuming.get_mut(&client_id) {
            *waiting = Some(conn);
            return;
        }
        if let Some(a) = self.adopting.get_mut(&client_id) {
            // The session is changing places: the CONNECT resumes whichever stays.
            a.conn = Some(conn);
            return;
        }
        if let Some(&epoch) = self.claimed.get(&client_id) {
            if self.shared.config.cluster.reconnect_reads == starling_config::ClusterReads::Local {
                // `cluster.reconnect_reads = "local"`: the claim as this node knows it.
                return self.connect_here(client_id, conn, ctx).await;
            }
            // Claimed here before, but another node may have claimed it since, and this
            // node not heard yet (cut off, or behind): a read, not a commit, says.
            self.confirming.insert(client_id.clone(), conn);
            let id = client_id.clone();
            ctx.spawn_then(
                async move {
                    let ask = cluster.ask(|reply| ClusterMsg::Confirm {
                        client_id: id,
                        epoch,
                        reply,
                    });
                    within_claim_wait(ask, "no read in time").await
                },
                move |result| RegistryMsg::Confirmed {
                    client_id,
                    epoch,
                    result,
                },
            );
            return;
        }
        self.claim(client_id, conn, cluster, ctx);
    }

    /// Claims `client_id` for `conn`: committed off this actor's turn, the CONNECT waiting
    /// in `claiming`.
    fn claim(
        &mut self,
        client_id: Arc<str>,
        conn: Box<NewConn>,
        cluster: Addr<ClusterMsg>,
        ctx: &mut Ctx<Self>,
    ) {
        let replaced = self.claiming.insert(client_id.clone(), conn);
        debug_assert!(replaced.is_none(), "one claim in flight per client id");
        let id = client_id.clone();
        ctx.spawn_then(
            async move {
                let ask = cluster.ask(|reply| ClusterMsg::Claim {
                    client_id: id,
                    reply,
                });
                within_claim_wait(ask, "no commit in time").await
            },
            move |result| RegistryMsg::Claimed { client_id, result },
        );
    }

    async fn claimed(
        &mut self,
        client_id: Arc<str>,
        result: Result<Claim, ClaimError>,
        ctx: &mut Ctx<Self>,
    ) {
        let Some(conn) = self.claiming.remove(&client_id) else {
            debug_assert!(false, "a claim's answer with no CONNECT waiting");
            return;
        };
        match result {
            Ok(Claim { epoch, previous }) => {
                let e = self.claimed.entry(client_id.clone()).or_default();
                *e = (*e).max(epoch);
                let me = self.shared.config.node.id;
                if previous.is_some_and(|p| p != me) && !conn.connect.clean_start {
                    // The previous owner hands the session over once it applies this claim.
                    debug!(client_id = %client_id, epoch, from = ?previous, "waiting for the session from its previous node");
                    let now = time::now();
                    let waiting = Awaited {
                        epoch,
                        conn,
                        from: previous,
                        since: now,
                        heard: now,
                    };
                    self.handovers.insert(client_id.clone(), waiting);
                    if let Some((e, handoff, _)) = self.early.remove(&client_id) {
                        if e == epoch {
                            // It came before this answer did.
                            if let Some((c, conn)) =
                                self.handed_over(client_id, epoch, Some(handoff), ctx)
                            {
                                self.connect_here(c, conn, ctx).await;
                            }
                            return;
                        }
                    }
                    ctx.after(
                        HANDOVER_TICK,
                        RegistryMsg::HandoverTick { client_id, epoch },
                    );
                    return;
                }
                self.connect_here(client_id, conn, ctx).await;
            }
            Err(e) => {
                debug!(client_id = %client_id, error = %e, "CONNECT refused: client id not claimed");
                self.refuse(conn, ReasonCode::ServerUnavailable);
            }
        }
    }

    /// The cluster's answer to a CONNECT for a client id claimed here with `epoch`.
    async fn confirmed(
        &mut self,
        client_id: Arc<str>,
        epoch: u64,
        result: Result<(), ClaimError>,
        ctx: &mut Ctx<Self>,
    ) {
        let Some(conn) = self.confirming.remove(&client_id) else {
            return;
        };
        let still_mine = self.claimed.get(&client_id).is_some_and(|&e| e >= epoch);
        match result {
            Ok(()) if still_mine => self.connect_here(client_id, conn, ctx).await,
            Ok(()) | Err(ClaimError::Superseded { .. }) => {
                // Another node's claim came first; its take-over (applied here before this
                // answer) handed the session here over. This CONNECT claims anew.
                debug!(client_id = %client_id, epoch, "claim superseded meanwhile; claiming again");
                if self.claimed.get(&client_id).is_some_and(|&e| e <= epoch) {
                    self.claimed.remove(&client_id);
                }
                match self.cluster.clone() {
                    Some(cluster) => self.claim(client_id, conn, cluster, ctx),
                    None => self.connect_here(client_id, conn, ctx).await,
                }
            }
            Err(e) => {
                debug!(client_id = %client_id, error = %e, "CONNECT refused: claim not confirmed");
                self.refuse(conn, ReasonCode::ServerUnavailable);
            }
        }
    }

    /// Another node (`node`) claimed `client_id` with `epoch`: a session here under an older
    /// claim (or restored from the store, under none) is handed over to it, and that node
    /// is told even when there is nothing to hand over, so that its CONNECT stops waiting.
    fn taken_over(&mut self, client_id: &Arc<str>, epoch: u64, node: u64) {
        if self
            .claimed
            .get(client_id)
            .is_some_and(|&mine| mine >= epoch)
        {
            return;
        }
        if let Some(a) = self.adopting.get_mut(client_id) {
            // Acted on once the session that stays is known.
            if a.taken.is_none_or(|(e, _)| e < epoch) {
                a.taken = Some((epoch, node));
            }
            return;
        }
        self.claimed.remove(client_id);
        let Some(cluster) = self.cluster.clone() else {
            return;
        };
        let entry = self.clients.remove(client_id);
        self.sessions_mark();
        let client_id = client_id.clone();
        starling_rt::spawn(async move {
            let handoff = match entry {
                Some(e) if !e.addr.is_closed() => {
                    debug!(client_id = %client_id, epoch, node, "session taken over by another node");
                    let ask = e.addr.ask(|reply| ClientMsg::HandOver {
                        to: (node, epoch),
                        reply,
                    });
                    ask.await.ok().flatten()
                }
                _ => None,
            };
            let msg = ClusterMsg::SendSession {
                to: node,
                client_id,
                epoch,
                handoff,
            };
            let _ = cluster.send(msg).await;
        });
    }

    async fn connect_here(&mut self, client_id: Arc<str>, conn: Box<NewConn>, ctx: &mut Ctx<Self>) {
        let username = conn.username.as_deref();
        if !id_allowed(
            self.shared.config.auth.client_id_policy,
            &client_id,
            username,
        ) {
            debug!(client_id = %client_id, username, "CONNECT refused: client id not allowed for this user");
            self.refuse(conn, ReasonCode::ClientIdentifierNotValid);
            return;
        }
        let conn = match self.clients.get_mut(&client_id) {
            Some(e) if !e.addr.is_closed() && e.owner.as_deref() != username => {
                // Another identity's session, online or not: neither resumed nor taken
                // over. Counted and logged at debug only: it is cheap for a client to
                // repeat (the counter shows a storm).
                debug!(client_id = %client_id, username, "CONNECT refused: client id belongs to another user");
                self.refuse(conn, ReasonCode::ClientIdentifierNotValid);
                return;
            }
            Some(e) if !e.addr.is_closed() => {
                e.attaches = e.attaches.wrapping_add(1);
                // Urgent lane: a takeover must not wait behind a slow subscriber's backlog.
                match e.addr.try_send_urgent(ClientMsg::Attach(conn)) {
                    Ok(()) => return,
                    Err(TrySendError::Full(m)) => match e.addr.send(m).await {
                        Ok(()) => return,
                        Err(c) => take_conn(c.0),
                    },
                    Err(TrySendError::Closed(m)) => take_conn(m),
                }
            }
            _ => Some(conn),
        };
        let Some(conn) = conn else { return };
        let client = Client::new(
            self.shared.clone(),
            self.shards.clone(),
            self.chain.clone(),
            ctx.weak_addr(),
            client_id.clone(),
            conn,
        );
        let owner = client.owner();
        let opts = Options::named("client")
            .capacity(self.shared.client_mailbox)
            .release_idle_queues();
        let addr = start_with(client, opts);
        self.clients.insert(
            client_id,
            Entry {
                addr,
                attaches: 1,
                owner,
            },
        );
        self.sessions_mark();
    }

    /// Answers a CONNECT with `code`, off the registry's turn: a client id this identity may
    /// not use (v5 0x85 Client Identifier not valid, 3.x return code 2), or one the cluster
    /// did not let this node claim (0x88 Server unavailable, 3.x return code 3).
    /// Tells every client actor to send its client away (`ClientMsg::Move`), without
    /// waiting: on the urgent lane, so that a busy client's own traffic does not delay it.
    fn send_away(&self) {
        let to = &self.draining_to;
        for (i, e) in self.clients.values().enumerate() {
            // Spread over the other members, so that they share the clients.
            let reference = (!to.is_empty()).then(|| to[i % to.len()].clone());
            let _ = e.addr.try_send_urgent(ClientMsg::Move(reference));
        }
    }

    /// Where a CONNECT refused while this node drains is pointed (MQTT 5 Server
    /// Reference): one of the other members, the same one for a client id each time.
    fn reference_for(&self, client_id: &str) -> Option<String> {
        use std::hash::{Hash, Hasher};
        let to = &self.draining_to;
        if to.is_empty() {
            return None;
        }
        // SipHash with fixed keys: the same member for the same id across retries.
        let mut h = std::collections::hash_map::DefaultHasher::new();
        client_id.hash(&mut h);
        Some(to[(h.finish() % to.len() as u64) as usize].to_string())
    }

    fn refuse(&self, conn: Box<NewConn>, code: ReasonCode) {
        add(&self.shared.metrics.connections_refused, 1);
        if code == ReasonCode::ClientIdentifierNotValid {
            add(&self.shared.metrics.client_id_refused, 1);
        }
        let NewConn {
            connect,
            mut io,
            permit,
            peer,
            username,
            accepted,
            listener,
            ..
        } = *conn;
        self.shared.metrics.rmqtt.connack(code, username.is_none());
        if self.chain.wants(EventKind::ClientConnack) {
            self.chain.emit(&Event {
                who: Subject {
                    node: self.shared.node.clone(),
                    client_id: Arc::from(connect.client_id.as_str()),
                    username: username.as_deref().map(Arc::from),
                },
                what: What::ClientConnack { peer, code },
            });
        }
        let mut connack = starling_session::refusal(code);
        if code == ReasonCode::UseAnotherServer && connect.protocol.is_v5() {
            connack.properties.server_reference = self.reference_for(&connect.client_id);
        }
        let client_max = connect.properties.maximum_packet_size.unwrap_or(u32::MAX);
        let shared = self.shared.clone();
        starling_rt::spawn(async move {
            let timed = || shared.metrics.connack_written(listener, accepted);
            refuse_with(&mut io, connect.protocol, connack, client_max, timed).await;
            drop(permit);
        });
    }
}

/// The cluster actor's answer to a claim or a confirmation, or `Unavailable` if it does not
/// come within [`CLAIM_WAIT`] (`late` says what did not happen) or the actor stopped.
/// The sessions restored at start (`client_ids`) that the log gives to another node, read
/// through the leader: a linearizable read, so that it reflects every claim committed
/// before it, the ones this node's own log did not yet hold as committed at its start
/// included (asked in the middle of the log's replay, an older claim of another node
/// could pass for the owner). Tried until it is answered, for a while; none if never.
async fn stale_restored(
    cluster: Addr<ClusterMsg>,
    client_ids: Vec<Arc<str>>,
    me: u64,
) -> Vec<(Arc<str>, u64, u64)> {
    for _ in 0..STALE_READS {
        let ids = client_ids.clone();
        let ask = cluster.ask(|reply| ClusterMsg::ReadOwners {
            client_ids: ids,
            reply,
        });
        if let Some(Ok(Ok(owners))) = time::timeout(STALE_READ_WAIT, ask).await {
            return client_ids
                .into_iter()
                .zip(owners)
                .filter_map(|(c, o)| o.filter(|o| o.node != me).map(|o| (c, o.epoch, o.node)))
                .collect();
        }
        time::sleep(STALE_READ_WAIT).await;
    }
    tracing::warn!(
        sessions = client_ids.len(),
        "the restored sessions' owners could not be read; kept as they are"
    );
    Vec::new()
}

/// The restored sessions' check: each read's bound, the pause between two, and how many.
const STALE_READ_WAIT: Duration = Duration::from_secs(5);
const STALE_READS: u32 = 24;

async fn within_claim_wait<R>(
    ask: impl std::future::Future<Output = Result<Result<R, ClaimError>, starling_rt::AskError>>,
    late: &str,
) -> Result<R, ClaimError> {
    match time::timeout(CLAIM_WAIT, ask).await {
        Some(Ok(r)) => r,
        Some(Err(_)) => Err(ClaimError::Unavailable("the cluster actor stopped".into())),
        None => Err(ClaimError::Unavailable(late.into())),
    }
}

/// Whether `policy` lets a client with `username` use `client_id` at all (whose session it
/// is, is the entry's `owner`). Anonymous clients have no name to hold an id to.
fn id_allowed(policy: ClientIdPolicy, client_id: &str, username: Option<&str>) -> bool {
    let Some(user) = username else { return true };
    match policy {
        ClientIdPolicy::Bound => true,
        ClientIdPolicy::EqualUsername => client_id == user,
        ClientIdPolicy::UsernamePrefix => {
            client_id == user
                || client_id
                    .strip_prefix(user)
                    .is_some_and(|rest| rest.starts_with('-'))
        }
    }
}

fn take_conn(m: ClientMsg) -> Option<Box<NewConn>> {
    match m {
        ClientMsg::Attach(c) => Some(c),
        _ => None,
    }
}

impl Registry {
    /// A detached client actor for `session` (read back from the store, or `handed_over`
    /// by another node), belonging to `owner`, registered under its client id.
    fn start_restored(
        &mut self,
        session: starling_session::Session,
        owner: Option<Arc<str>>,
        handed_over: bool,
        ctx: &mut Ctx<Self>,
    ) -> Addr<ClientMsg> {
        let client_id = session.client_id().clone();
        let client = Client::restored(
            self.shared.clone(),
            self.shards.clone(),
            self.chain.clone(),
            ctx.weak_addr(),
            session,
            owner.clone(),
            handed_over,
        );
        let opts = Options::named("client")
            .capacity(self.shared.client_mailbox)
            .release_idle_queues();
        let addr = start_with(client, opts);
        let entry = Entry {
            addr: addr.clone(),
            attaches: 0,
            owner,
        };
        self.clients.insert(client_id, entry);
        self.sessions_mark();
        addr
    }

    /// Publishes how many sessions the registry holds (`sessions.count`), raising their
    /// high-water mark (`sessions.max`): after every change to `clients`.
    fn sessions_mark(&self) {
        let n = self.clients.len() as u64;
        let m = &self.shared.metrics;
        m.sessions.store(n, std::sync::atomic::Ordering::Relaxed);
        m.sessions_max
            .fetch_max(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// The claim goes with the session that ended (a later CONNECT claims again).
    fn release_claim(&mut self, client_id: Arc<str>) {
        if let (Some(epoch), Some(c)) = (self.claimed.remove(&client_id), &self.cluster) {
            let _ = c.try_send(ClusterMsg::Release { client_id, epoch });
        }
    }
}

impl Actor for Registry {
    type Msg = RegistryMsg;

    async fn handle(&mut self, msg: RegistryMsg, ctx: &mut Ctx<Self>) {
        match msg {
            RegistryMsg::Connect { client_id, conn } => self.connect(client_id, conn, ctx).await,
            RegistryMsg::Retire {
                client_id,
                actor,
                attaches,
            } => {
                let retire = self
                    .clients
                    .get(&client_id)
                    .is_some_and(|e| e.addr.id() == actor && e.attaches == attaches);
                if retire {
                    debug!(client_id = %client_id, "session ended; client actor retired");
                    if let Some(e) = self.clients.remove(&client_id) {
                        e.addr.stop();
                    }
                    self.sessions_mark();
                    self.release_claim(client_id);
                } else if let Some(a) = self.adopting.get_mut(&client_id) {
                    // Out of `clients` while it is asked to give way: answered after.
                    a.retired = Some((actor, attaches));
                }
            }
            RegistryMsg::Restore(sessions, reply) => {
                let mut asks = Vec::with_capacity(sessions.len());
                let restored_ids: Vec<Arc<str>> = sessions
                    .iter()
                    .map(|(s, _)| s.client_id().clone())
                    .collect();
                for (session, owner) in sessions {
                    asks.push(self.start_restored(session, owner, false, ctx));
                }
                // Routed before the listeners open: a publish after start reaches them. A few
                // hundred at a time (one join over 100k asks spent most of a start polling).
                for chunk in asks.chunks(RESTORE_CHUNK) {
                    let each = chunk
                        .iter()
                        .map(|a| a.ask(|reply| ClientMsg::Resubscribe { moved: None, reply }));
                    futures::future::join_all(each).await;
                }
                let _ = reply.send(());
                // In a cluster, the log may say another node took some of them over while
                // this node was down, in a claim applied before they were restored (which
                // then found nothing to hand over): checked once this node caught up.
                if let Some(cluster) = self.cluster.clone().filter(|_| !restored_ids.is_empty()) {
                    let me = self.shared.config.node.id;
                    ctx.spawn_then(
                        stale_restored(cluster, restored_ids, me),
                        RegistryMsg::StaleRestored,
                    );
                }
            }
            RegistryMsg::Clients(reply) => {
                let all = self.clients.values().map(|e| e.addr.clone());
                let _ = reply.send(all.collect());
            }
            RegistryMsg::Client(client_id, reply) => {
                let _ = reply.send(self.clients.get(&client_id).map(|e| e.addr.clone()));
            }
            RegistryMsg::Claimed { client_id, result } => {
                self.claimed(client_id, result, ctx).await
            }
            RegistryMsg::Confirmed {
                client_id,
                epoch,
                result,
            } => self.confirmed(client_id, epoch, result, ctx).await,
            RegistryMsg::TakenOver {
                client_id,
                epoch,
                node,
            } => self.taken_over(&client_id, epoch, node),
            RegistryMsg::HandedOver {
                client_id,
                epoch,
                handoff,
            } => {
                if let Some((client_id, conn)) = self.handed_over(client_id, epoch, handoff, ctx) {
                    self.connect_here(client_id, conn, ctx).await;
                }
            }
            RegistryMsg::GaveWay {
                client_id,
                epoch,
                handoff,
                addr,
                attaches,
                owner,
                gave,
            } => {
                let entry = Entry {
                    addr,
                    attaches,
                    owner,
                };
                self.gave_way(client_id, epoch, handoff, entry, gave, ctx)
                    .await;
            }
            RegistryMsg::HandoverTick { client_id, epoch } => {
                self.handover_tick(client_id, epoch, ctx).await
            }
            RegistryMsg::HandoverComing { client_id, epoch } => {
                if let Some(w) = self.handovers.get_mut(&client_id) {
                    if w.epoch == epoch {
                        debug!(client_id = %client_id, epoch, "a part of the session came");
                        w.heard = time::now();
                    }
                }
            }
            RegistryMsg::StaleRestored(stale) => {
                for (client_id, epoch, node) in stale {
                    if self.clients.contains_key(&client_id) {
                        tracing::info!(client_id = %client_id, epoch, node, "a restored session another node took over meanwhile is handed over");
                        add(&self.shared.metrics.cluster_sessions_discarded, 1);
                        self.taken_over(&client_id, epoch, node);
                    }
                }
            }
            RegistryMsg::HandoverReady { client_id } => {
                if let Some(Some(conn)) = self.resuming.remove(&client_id) {
                    self.connect_here(client_id, conn, ctx).await;
                }
            }
            RegistryMsg::Drain { to, reply } => {
                self.draining = true;
                self.draining_to = to;
                self.send_away();
                let _ = reply.send(self.clients.len());
            }
            RegistryMsg::Sessions(reply) => {
                // Again: a client whose urgent lane was full missed the first one (a client
                // already moved, or offline, ignores it).
                if self.draining {
                    self.send_away();
                }
                let _ = reply.send(self.clients.len());
            }
            RegistryMsg::Shutdown(reply) => {
                // All at once: one slow peer's last write must not hold up the others.
                let goodbyes = self.clients.drain().map(|(_, e)| async move {
                    let _ = time::timeout(SHUTDOWN_WAIT, e.addr.ask(ClientMsg::Shutdown)).await;
                    e.addr.stop();
                });
                futures::future::join_all(goodbyes).await;
                let _ = reply.send(());
            }
        }
    }
}
