//! The router's shards as the other actors see them: which shard a publish goes to, and the
//! exchanges that reach several (a SUBSCRIBE to a wildcard filter, an UNSUBSCRIBE, a
//! session's end, presence, statistics).
//!
//! A subscription is decided by its home shard (see [`starling_router::ShardMap`]): the
//! only shard of a filter without wildcards, or for a filter with wildcards the shard its
//! topic filter hashes to, which alone counts `$exclusive/` and `$limit/N/` places. Once the
//! home granted it, the other shards install it as admitted. The SUBACK waits for every
//! shard, so a publish sent after it reaches the subscriber whatever shard routes it. With
//! one shard every exchange is the one message it was before shards.

use std::sync::Arc;

use futures::future::join_all;
use starling_codec::ReasonCode;
use starling_router::parse_subscription;
use starling_router::{Reach, ShardMap, TopicLimits};
use starling_rt::time::Instant;
use starling_rt::{ActorId, Addr, WeakAddr};
use starling_session::{DeliveryOptions, SubscribeRequest};

use crate::msg::{
    Admission, ClientMsg, HoldWait, RouterMsg, StoreMsg, SubscribeMsg, SubscribeResult,
};

/// Longest a SUBACK waits for the cluster's routes to hold a new subscription's filter.
const ROUTE_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// A cheap handle on every shard (one pointer).
#[derive(Clone)]
pub(crate) struct Shards(Arc<Inner>);

struct Inner {
    map: ShardMap,
    addrs: Vec<Addr<RouterMsg>>,
    limits: TopicLimits,
    /// The node's store, when `storage.enabled`: beside the shards' addresses because every
    /// client actor that writes its session there holds this handle already.
    store: Option<Addr<StoreMsg>>,
    /// `cluster.enabled`: a SUBSCRIBE's retained messages are read after a read barrier.
    clustered: bool,
}

/// Requests of one SUBSCRIBE bound for one shard, with their places in the packet.
struct Part {
    shard: usize,
    at: Vec<usize>,
    filters: Vec<SubscribeRequest>,
}

impl Shards {
    pub(crate) fn new(
        map: ShardMap,
        addrs: Vec<Addr<RouterMsg>>,
        limits: TopicLimits,
        store: Option<Addr<StoreMsg>>,
    ) -> Self {
        assert_eq!(map.count(), addrs.len(), "one address per shard");
        Self(Arc::new(Inner {
            map,
            addrs,
            limits,
            store,
            clustered: false,
        }))
    }

    /// The same shards, in a cluster: SUBSCRIBEs read their retained messages after a read
    /// barrier (see `cluster_retained`). The cluster actor keeps a handle without it.
    pub(crate) fn clustered(&self) -> Self {
        let i = &self.0;
        Self(Arc::new(Inner {
            map: i.map.clone(),
            addrs: i.addrs.clone(),
            limits: i.limits,
            store: i.store.clone(),
            clustered: true,
        }))
    }

    /// Whether SUBSCRIBEs read their retained messages again in a cluster.
    pub(crate) fn is_clustered(&self) -> bool {
        self.0.clustered
    }

    /// In a cluster, reads a SUBSCRIBE's retained messages again (replacing `r.retained`)
    /// once this node applied what the cluster had committed when asked, and every retained
    /// change this node's shards took before: a retained message acknowledged through any
    /// node before the SUBSCRIBE, or published by this client just before it, is found.
    /// The subscriptions are installed already (so no live publish waits for this). Without
    /// a quorum within a bound, no retained message is given (this node's may be old): a
    /// new subscription that wanted them is refused with 0x80 Unspecified error and taken
    /// back, and one that existed already stays as it was installed, its result 0x80 too
    /// (`cluster.retained_reads = "local"` reads this node's at once instead).
    pub(crate) async fn cluster_retained(
        &self,
        client_id: &str,
        filters: &[SubscribeRequest],
        r: &mut SubscribeResult,
    ) {
        if !self.0.clustered {
            return;
        }
        let wanted: Vec<(usize, String, DeliveryOptions)> = filters
            .iter()
            .enumerate()
            .filter(|(i, f)| {
                r.results.get(*i).is_some_and(Result::is_ok)
                    && f.wants_retained(r.new.get(*i).copied().unwrap_or(false))
            })
            .map(|(i, f)| {
                let plain = parse_subscription(&f.filter, &self.0.limits)
                    .map(|s| s.filter)
                    .unwrap_or(&f.filter)
                    .to_owned();
                (
                    i,
                    plain,
                    DeliveryOptions::retained(&f.options, f.subscription_id),
                )
            })
            .collect();
        if wanted.is_empty() {
            return;
        }
        // Through every shard: each passes the barrier on behind the retained changes it
        // took before, so the cluster actor sees them first.
        let waits = self.0.addrs.iter().map(|a| async move {
            let (done, wait) = tokio::sync::oneshot::channel();
            a.send(RouterMsg::Barrier(done)).await.is_ok() && wait.await.is_ok()
        });
        let passed = starling_rt::time::timeout(ROUTE_WAIT, join_all(waits)).await;
        if !passed.is_some_and(|all| all.into_iter().all(|ok| ok)) {
            tracing::debug!(%client_id, "retained messages not confirmed by the cluster; subscriptions that wanted them refused");
            r.retained.clear();
            let mut back = Vec::new();
            for (i, _, _) in &wanted {
                if r.new.get(*i).copied().unwrap_or(false) {
                    if let Some(f) = filters.get(*i) {
                        back.push(f.filter.clone());
                    }
                }
                if let (Some(res), Some(new)) = (r.results.get_mut(*i), r.new.get_mut(*i)) {
                    *res = Err(ReasonCode::UnspecifiedError);
                    *new = false;
                }
            }
            if !back.is_empty() {
                let _ = self.unsubscribe(client_id.into(), back).await;
            }
            return;
        }
        let mut retained = Vec::new();
        for (_, filter, options) in wanted {
            let asks = self.0.addrs.iter().map(|a| {
                let filter = filter.clone();
                a.ask(|reply| RouterMsg::Retained {
                    filter,
                    limit: usize::MAX,
                    reply,
                })
            });
            for found in join_all(asks).await.into_iter().flatten() {
                retained.extend(found.into_iter().map(|m| (m, options.clone())));
            }
        }
        r.retained = retained;
    }

    /// The node's store (see `storage`), when it has one.
    pub(crate) fn store(&self) -> Option<&Addr<StoreMsg>> {
        self.0.store.as_ref()
    }

    /// A block of `n` delivery seqs, `base..base + n`, that no shard hands out afterwards,
    /// all of its later seqs being above it: for a session that arrives with its deliveries
    /// (a handover), whose records need keys of this node's. Seqs key a session's own
    /// records, so a shard's handing out some of the block to other sessions meanwhile
    /// collides with nothing; and the session is subscribed here only after, so what is
    /// routed to it here later sorts behind its queue at a restart. `None` if a shard
    /// stopped.
    pub(crate) async fn reserve_seqs(&self, n: u64) -> Option<u64> {
        let mut base = 0;
        for a in self.0.addrs.iter() {
            let next = a
                .ask(|reply| RouterMsg::SeqFloor { at_least: 0, reply })
                .await
                .ok()?;
            base = base.max(next);
        }
        let top = base.checked_add(n)?;
        for a in self.0.addrs.iter() {
            a.ask(|reply| RouterMsg::SeqFloor {
                at_least: top,
                reply,
            })
            .await
            .ok()?;
        }
        Some(base)
    }

    pub(crate) fn count(&self) -> usize {
        self.0.addrs.len()
    }

    /// The shard that routes a publish to `topic` (see [`ShardMap::of_publish`]).
    /// Every shard, in index order.
    pub(crate) fn all(&self) -> &[Addr<RouterMsg>] {
        &self.0.addrs
    }

    pub(crate) fn for_publish(&self, topic: &str) -> &Addr<RouterMsg> {
        match &self.0.addrs[..] {
            [only] => only,
            all => &all[self.0.map.of_publish(topic)],
        }
    }

    /// The shard that owns `topic`'s publishes (and its retained message).
    pub(crate) fn index_for_publish(&self, topic: &str) -> usize {
        self.0.map.of_publish(topic)
    }

    pub(crate) fn reach(&self, filter: &str) -> Reach {
        self.0.map.reach(filter, &self.0.limits)
    }

    /// Subscribes through every shard the filters reach; answers once all have.
    pub(crate) async fn subscribe(
        &self,
        client_id: Arc<str>,
        client: WeakAddr<ClientMsg>,
        may_hold: bool,
        persistent: bool,
        filters: Vec<SubscribeRequest>,
        since: Option<Instant>,
    ) -> SubscribeResult {
        let n = filters.len();
        let reach: Vec<Reach> = filters.iter().map(|f| self.reach(&f.filter)).collect();
        // First the deciding shard of each filter.
        let mut parts = group(
            filters
                .iter()
                .cloned()
                .enumerate()
                .map(|(i, f)| (reach[i].home(), i, f)),
        );
        let asks = parts.drain(..).map(|p| {
            let (client_id, client) = (client_id.clone(), client.clone());
            async move {
                let r = self.0.addrs[p.shard]
                    .ask(|reply| {
                        RouterMsg::Subscribe(Box::new(SubscribeMsg {
                            client_id,
                            client,
                            may_hold,
                            persistent,
                            filters: p.filters,
                            admission: Admission::Decide,
                            since,
                            reply,
                        }))
                    })
                    .await
                    .unwrap_or_default();
                (p.at, r)
            }
        });
        let mut out = SubscribeResult {
            results: vec![Err(ReasonCode::UnspecifiedError); n],
            new: vec![false; n],
            retained: Vec::new(),
            caught: Vec::new(),
            route_waits: Vec::new(),
            routes_held: true,
            holds: Vec::new(),
        };
        let mut route_waits = Vec::new();
        let mut holds = Vec::new();
        for (at, mut r) in join_all(asks).await {
            route_waits.append(&mut r.route_waits);
            for mut h in r.holds.drain(..) {
                if let Some(&i) = at.get(h.at) {
                    h.at = i;
                    holds.push(h);
                }
            }
            // A shard that stopped answers nothing: its filters stay refused.
            for (k, i) in at.into_iter().enumerate() {
                if let (Some(res), Some(new)) = (r.results.get(k), r.new.get(k)) {
                    out.results[i] = *res;
                    out.new[i] = *new;
                }
            }
            out.retained.extend(r.retained);
            out.caught.extend(r.caught);
        }
        // In a cluster, `$exclusive/` and `$limit/N/` are granted by the cluster's count:
        // what it refused (or could not count) is taken back before any other shard
        // installs it, and its retained messages are not delivered.
        let refused = self.settle_holds(holds, &filters, &mut out).await;
        // Then every other shard installs what its home granted.
        let granted = filters
            .into_iter()
            .enumerate()
            .filter(|(i, _)| matches!(reach[*i], Reach::All { .. }) && out.results[*i].is_ok());
        let mut installs: Vec<(usize, usize, SubscribeRequest)> = Vec::new();
        for (i, f) in granted {
            for s in (0..self.count()).filter(|&s| s != reach[i].home()) {
                installs.push((s, i, f.clone()));
            }
        }
        let asks = group(installs.into_iter()).into_iter().map(|p| {
            let (client_id, client) = (client_id.clone(), client.clone());
            let new = p.at.iter().map(|&i| out.new[i]).collect();
            async move {
                self.0.addrs[p.shard]
                    .ask(|reply| {
                        RouterMsg::Subscribe(Box::new(SubscribeMsg {
                            client_id,
                            client,
                            may_hold,
                            persistent,
                            filters: p.filters,
                            admission: Admission::Admitted { new },
                            since,
                            reply,
                        }))
                    })
                    .await
                    .unwrap_or_default()
            }
        });
        for r in join_all(asks).await {
            out.retained.extend(r.retained);
            out.caught.extend(r.caught);
        }
        if !refused.is_empty() {
            let _ = self.unsubscribe(client_id.clone(), refused).await;
        }
        if !route_waits.is_empty() {
            // Bounded: without a raft quorum the subscription still works on this node.
            let all = join_all(route_waits);
            out.routes_held = match starling_rt::time::timeout(ROUTE_WAIT, all).await {
                Some(each) => each.iter().all(Result::is_ok),
                None => {
                    tracing::debug!(%client_id, "SUBACK sent before the cluster's routes hold it");
                    false
                }
            };
        }
        out
    }

    /// Waits (up to [`ROUTE_WAIT`] in all) for the cluster's verdict on each hold: granted,
    /// its retained messages join `out`'s; refused, its result becomes 0x97 Quota exceeded;
    /// not counted in time (no quorum), 0x80 Unspecified error, since exclusivity cannot be
    /// promised. Returns the filters refused, to be taken back.
    async fn settle_holds(
        &self,
        holds: Vec<HoldWait>,
        filters: &[SubscribeRequest],
        out: &mut SubscribeResult,
    ) -> Vec<String> {
        if holds.is_empty() {
            return Vec::new();
        }
        let deadline = starling_rt::time::now() + ROUTE_WAIT;
        let mut refused = Vec::new();
        for h in holds {
            let left = deadline.saturating_duration_since(starling_rt::time::now());
            let verdict = starling_rt::time::timeout(left, h.verdict)
                .await
                .and_then(Result::ok)
                .flatten();
            if verdict == Some(true) {
                out.retained.extend(h.retained);
                continue;
            }
            let code = match verdict {
                Some(_) => ReasonCode::QuotaExceeded,
                None => ReasonCode::UnspecifiedError,
            };
            if let (Some(r), Some(new), Some(f)) = (
                out.results.get_mut(h.at),
                out.new.get_mut(h.at),
                filters.get(h.at),
            ) {
                *r = Err(code);
                *new = false;
                refused.push(f.filter.clone());
            }
        }
        refused
    }

    /// Unsubscribes from every shard the filters reach; the codes are the deciding shards'.
    pub(crate) async fn unsubscribe(
        &self,
        client_id: Arc<str>,
        filters: Vec<String>,
    ) -> Vec<ReasonCode> {
        let n = filters.len();
        let mut codes = vec![ReasonCode::UnspecifiedError; n];
        let mut per: Vec<(Vec<usize>, Vec<String>)> = vec![Default::default(); self.count()];
        let mut homes = vec![0; n];
        for (i, f) in filters.into_iter().enumerate() {
            let reach = self.reach(&f);
            homes[i] = reach.home();
            for (s, p) in per.iter_mut().enumerate() {
                if reach.includes(s) {
                    p.0.push(i);
                    p.1.push(f.clone());
                }
            }
        }
        let asks = per
            .into_iter()
            .enumerate()
            .filter(|(_, p)| !p.1.is_empty())
            .map(|(s, (at, filters))| {
                let client_id = client_id.clone();
                async move {
                    let r = self.0.addrs[s]
                        .ask(|reply| RouterMsg::Unsubscribe {
                            client_id,
                            filters,
                            reply,
                        })
                        .await
                        .unwrap_or_default();
                    (s, at, r)
                }
            });
        for (s, at, r) in join_all(asks).await {
            for (k, i) in at.into_iter().enumerate() {
                if homes[i] == s {
                    if let Some(c) = r.get(k) {
                        codes[i] = *c;
                    }
                }
            }
        }
        codes
    }

    /// The session of `client_id` was handed over here by node `from` for this node's
    /// claim `epoch`: answers once every shard judges what comes for it by the move's cut,
    /// and has stored that it does (a store that failed is not waited for again).
    pub(crate) async fn moved_in(&self, client_id: &Arc<str>, (epoch, from): (u64, u64)) {
        let asks = self.0.addrs.iter().map(|a| {
            a.ask(|done| RouterMsg::MovedIn {
                client_id: client_id.clone(),
                epoch,
                from,
                done,
            })
        });
        join_all(asks).await;
    }

    /// The session of `client_id` is being handed over to `to` (node, claim's epoch):
    /// answers once every shard relays what it routes to the session from now on, and has
    /// stored that it does (a store that failed is not waited for again: the relay runs
    /// from memory).
    pub(crate) async fn moved_away(&self, client_id: &Arc<str>, to: (u64, u64)) {
        let asks = self.0.addrs.iter().map(|a| {
            a.ask(|done| RouterMsg::MovedAway {
                client_id: client_id.clone(),
                to: to.0,
                epoch: to.1,
                done,
            })
        });
        join_all(asks).await;
    }

    /// A session ended: every shard that knows it (`known`, or holds one of its
    /// `filters`) forgets its subscriptions and its address (or keeps them as its relay,
    /// when it was handed over: `moved_away`).
    pub(crate) async fn session_ended(
        &self,
        client_id: Arc<str>,
        actor: ActorId,
        filters: Vec<String>,
        known: &[bool],
    ) {
        let mut per: Vec<Vec<String>> = vec![Vec::new(); self.count()];
        for f in filters {
            let reach = self.reach(&f);
            for (s, p) in per.iter_mut().enumerate() {
                if reach.includes(s) {
                    p.push(f.clone());
                }
            }
        }
        for (s, (addr, filters)) in self.0.addrs.iter().zip(per).enumerate() {
            if filters.is_empty() && !known.get(s).copied().unwrap_or(true) {
                continue;
            }
            let _ = addr
                .send(RouterMsg::SessionEnded {
                    client_id: client_id.clone(),
                    actor,
                    filters,
                })
                .await;
        }
    }

    /// A client attached or detached: the shards that know it (`known`, one flag per
    /// shard) prefer it or not in shared groups, and hold no one back for it while it is
    /// offline. A client that never subscribed costs no message.
    pub(crate) async fn presence(
        &self,
        client_id: Arc<str>,
        online: bool,
        may_hold: bool,
        persistent: bool,
        known: &[bool],
    ) {
        for (s, addr) in self.0.addrs.iter().enumerate() {
            if !known.get(s).copied().unwrap_or(false) {
                continue;
            }
            let _ = addr
                .send(RouterMsg::Presence {
                    client_id: client_id.clone(),
                    online,
                    may_hold,
                    persistent,
                })
                .await;
        }
    }

    /// Shard `i`.
    pub(crate) fn get(&self, i: usize) -> &Addr<RouterMsg> {
        &self.0.addrs[i]
    }
}

/// Groups `(shard, index, request)` by shard, keeping each shard's requests in order.
fn group(items: impl Iterator<Item = (usize, usize, SubscribeRequest)>) -> Vec<Part> {
    let mut parts: Vec<Part> = Vec::new();
    for (shard, i, f) in items {
        match parts.iter_mut().find(|p| p.shard == shard) {
            Some(p) => {
                p.at.push(i);
                p.filters.push(f);
            }
            None => parts.push(Part {
                shard,
                at: vec![i],
                filters: vec![f],
            }),
        }
    }
    parts
}
