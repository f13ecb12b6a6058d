//! The Starling MQTT broker on one node: listener, client, registry, router and `$SYS` actors over the session core.
//!
//! # Actors and message flow
//! - **Listener** (one per configured listener): accepts connections (the accept loop is its
//!   input stream), enforces `max_connections`, and runs each connection's transport
//!   handshake and CONNECT handshake (read under a timeout, authenticate, `check_connect`)
//!   in a task of its own, then hands the stream to the registry.
//! - **Registry**: maps each client id to its client actor; a client id is owned by one
//!   actor at a time. A CONNECT for a known id goes to that actor (resume or takeover),
//!   otherwise a new actor starts.
//! - **Client** (one per client id): owns the sans-IO [`starling_session::Session`] for the
//!   session's whole life and, while connected, the socket: decoded packets arrive as its
//!   input stream, effects are encoded into one buffer and written once per batch. It
//!   outlives its connection for persistent sessions (queue, will delay, expiry timers) and
//!   asks the registry to retire it when the session ends.
//! - **Router**: subscription trie, retained store, `$delayed/` timers; fans a publish out
//!   as `Arc<Message>` into a bounded pending list per subscriber, handed to each client
//!   actor as one batch per burst with `try_send` (a full mailbox keeps the batch for a
//!   retry; a full pending list applies the queue drop policy and counts). Publishers `send`
//!   to it and so meet back-pressure.
//! - **Store** (when `storage.enabled`): the one writer of the durable store
//!   (`starling-store`, redb under `node.data_dir`); gathers writes and commits them
//!   together on a blocking worker. Shards write retained and delayed messages there; at
//!   start the store is read back and each shard gets its part before any listener opens.
//! - **Sys**: `$SYS/brokers/{node}/...` statistics every `sys_interval_secs` (listener
//!   counters under `.../listeners/{kind}/{port}/...`); the built-in event provider
//!   publishes `.../clients/{id}/connected|disconnected` events.
//!
//! Authentication, authorization and lifecycle events go through one hook chain
//! ([`hooks`], the `starling-hooks` crate), fixed at start-up: the built-in providers (the
//! password file, the ACL, the `$SYS` client events), then an embedder's
//! ([`Broker::start_with`]).
//!
//! Certificates of tls, wss and quic listeners are re-read from their files by
//! [`Broker::reload_tls`] (the `starling` binary calls it on SIGHUP); connections already
//! up keep the certificate they were accepted with.

mod admin;
mod builtin;
mod client;
mod cluster;
mod conn;
mod destination;
mod error;
mod flow;
mod forward;
mod gate;
mod listener;
mod listing;
mod metrics;
mod msg;
mod refuse;
mod registry;
mod routing;
mod settings;
mod shards;
mod stats;
mod storage;
mod sys;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rand::RngCore;
use starling_config::{Config, ListenerConfig, ListenerKind};
use starling_net::{
    ClientAuth, CounterSnapshot, HandshakeLimits, ListenerCounters, ListenerSettings, MqttListener,
    ProxyProtocol, QuicConfig, TlsFiles, TlsReloader, Transport, WsConfig,
};
use starling_router::ShardMap;
use starling_rt::{start_with, time, Addr, Options};
use starling_session::Message;
use starling_store::{Limits as StoreLimits, Location, Recovered, Store};

pub use admin::{Admin, AdminError, AdminPublish, PluginInfo};
pub use conn::Io;
pub use error::{BrokerError, StoreOpenError};
pub use metrics::{
    HistogramSnapshot, Latencies, MetricKind, MetricsSnapshot, RmqttSnapshot, BOUNDS_US,
};
pub use msg::{ClientInfo, ClientSubscriptions, ClusterStatus, MemberStatus, MembershipError};
pub use starling_cluster::Member;
/// The hook seam, for embedders: providers to start the broker with
/// ([`Broker::start_with`]).
pub use starling_hooks as hooks;
/// Where a store lives, for [`Broker::start_with_store`].
pub use starling_store::Location as StoreLocation;
pub use stats::{BrokerStats, Level, StatLevel};

use listener::{ListenerActor, ListenerCtx, ListenerMsg};
use listing::ListingActor;
use msg::{DelayedKey, ListingMsg, RegistryMsg, Restore, RouterMsg, StoreMsg};
use registry::Registry;
use routing::RouterActor;
use settings::Shared;
use shards::Shards;
use starling_hooks::{Chain, Hooks};
use storage::StorageActor;
use sys::{SysActor, SysEvents, SysMsg};

/// Mailbox of the router: deep enough to absorb a burst from many publishers; a full one
/// makes publishers wait (back-pressure), never grows.
pub(crate) const ROUTER_MAILBOX: usize = 4096;
/// The urgent lane of a router shard: subscribers' back-pressure reports.
const SHARD_URGENT: usize = 1024;

/// Starts the router's shards, each on a worker of its own (modulo the workers): a shard
/// is the busiest actor of a node, and shards that share a thread route in turn rather than
/// at once. Client actors spread over the workers by their id; a client cannot sit beside
/// its shard, since it publishes to topics of every shard.
fn start_shards(
    shared: &Arc<Shared>,
    store: Option<&Addr<StoreMsg>>,
    delayed_base: u64,
    seq_base: u64,
) -> Shards {
    let count = match shared.config.router.shards {
        starling_config::ShardCount::Auto => starling_rt::workers(),
        starling_config::ShardCount::Fixed(n) => n as usize,
    };
    let map = ShardMap::new(count, starling_rt::rng::rng().next_u64());
    let addrs = (0..count)
        .map(|i| {
            start_with(
                RouterActor::new(
                    shared.clone(),
                    i,
                    map.clone(),
                    store.cloned(),
                    delayed_base,
                    seq_base,
                ),
                Options {
                    // Back-pressure reports from subscribers (see `flow`), ahead of the
                    // publishes: one per subscriber turn at most, so a deep lane.
                    urgent_capacity: SHARD_URGENT,
                    ..Options::named("router")
                        .capacity(ROUTER_MAILBOX)
                        .on_worker(i)
                },
            )
        })
        .collect();
    tracing::debug!(shards = count, "router started");
    Shards::new(map, addrs, shared.topic_limits, store.cloned())
}

/// One started listener, with what the broker keeps to observe and reload it.
struct BoundListener {
    kind: ListenerKind,
    addr: SocketAddr,
    actor: Addr<ListenerMsg>,
    counters: Arc<ListenerCounters>,
    /// The files a reload re-reads and the handle that swaps them in (tls, wss, quic).
    tls: Option<(TlsFiles, TlsReloader)>,
}

/// A running broker. Start it inside the runtime (`Runtime::block_on`, or a tokio test).
pub struct Broker {
    shared: Arc<Shared>,
    listeners: Vec<BoundListener>,
    registry: Addr<RegistryMsg>,
    _router: Shards,
    sys: Addr<SysMsg>,
    /// The operator's kept lists of clients and subscriptions.
    listing: Addr<ListingMsg>,
    /// The hook chain, for [`Broker::serve_stream`] (listeners hold their own handle).
    chain: Arc<Chain>,
    /// The storage actor, when `storage.enabled`.
    store: Option<Addr<StoreMsg>>,
    /// This node's cluster side, when `cluster.enabled`.
    cluster: Option<cluster::ClusterNode>,
}

impl Broker {
    /// Validates the auth files, binds every listener and starts the actors.
    ///
    /// # Errors
    /// [`BrokerError::Listener`] when a listener cannot bind or its TLS material does not
    /// load; [`BrokerError::Auth`] when the password or ACL file does not load.
    pub async fn start(config: Config) -> Result<Broker, BrokerError> {
        Broker::start_with(config, Hooks::new()).await
    }

    /// As [`Broker::start`], with an embedder's providers in the hook chain: the seam for
    /// plugins and tests. The chain is fixed from here on: the built-in providers the
    /// configuration asks for first (the password file, the ACL file, the `$SYS` client
    /// events), then `hooks`' in the order they were added. An operation every
    /// authorizer ignores gets `auth.acl_default`; a CONNECT every authenticator ignores,
    /// the listener's `allow_anonymous`.
    ///
    /// # Errors
    /// As [`Broker::start`].
    pub async fn start_with(config: Config, hooks: Hooks) -> Result<Broker, BrokerError> {
        Broker::start_inner(config, hooks, None).await
    }

    /// As [`Broker::start_with`], on the store at `store` rather than the file under
    /// `node.data_dir` (when `storage.enabled`): the simulator's crashable disk.
    ///
    /// # Errors
    /// As [`Broker::start`].
    pub async fn start_with_store(
        config: Config,
        hooks: Hooks,
        store: Location,
    ) -> Result<Broker, BrokerError> {
        Broker::start_inner(config, hooks, Some(store)).await
    }

    async fn start_inner(
        config: Config,
        hooks: Hooks,
        location: Option<Location>,
    ) -> Result<Broker, BrokerError> {
        let shared = Shared::new(config)?;
        let (store, recovered) = match open_store(&shared, location)? {
            Some((store, recovered)) => (Some(store), recovered),
            None => (None, Recovered::default()),
        };
        let mut recovered = recovered;
        // Above every stored delivery's key: new deliveries never take a stored one's.
        let seq_base = recovered
            .sessions
            .iter()
            .flat_map(|s| s.inflight_seqs.iter().chain(&s.queue_seqs))
            .max()
            .map_or(0, |m| m + 1);
        let router = start_shards(&shared, store.as_ref(), recovered.next_delayed_id, seq_base);
        // Before the sessions are routed again: their subscriptions are the node's routes.
        let cluster = cluster::ClusterNode::start(&shared, &router).await?;
        // `retained_reads = "local"`: a SUBSCRIBE keeps what its install read from this
        // node's replica.
        let linearizable =
            shared.config.cluster.retained_reads == starling_config::ClusterReads::Linearizable;
        let router = match &cluster {
            Some(_) if linearizable => router.clustered(),
            _ => router,
        };
        let sessions = std::mem::take(&mut recovered.sessions);
        let default_allow = shared.config.auth.acl_default == starling_config::AclDefault::Allow;
        let chain = builtin::builtin(&shared)
            .observe_with(SysEvents::new(shared.clone(), router.clone()))
            .then(hooks)
            .build(default_allow);
        let registry = start_with(
            Registry::new(
                shared.clone(),
                router.clone(),
                chain.clone(),
                cluster.as_ref().map(cluster::ClusterNode::actor),
            ),
            Options::named("registry").capacity(1024),
        );
        if let Some(c) = &cluster {
            let _ = c
                .actor()
                .send(msg::ClusterMsg::Registry(registry.clone()))
                .await;
        }
        restore_sessions(&shared, &registry, sessions).await;
        // After the sessions are routed again: a delayed message due at once must find them.
        restore(&router, recovered).await;
        if cluster.is_some() {
            // Through each shard, behind the route reports of the restored subscriptions.
            for shard in router.all() {
                let _ = shard.send(msg::RouterMsg::Restored).await;
            }
        }
        warn_volatile_state(&shared.config);
        let mut listeners = Vec::new();
        for lc in &shared.config.listeners {
            let bound = bind(lc, shared.config.mqtt.max_packet_size).await?;
            let addr = bound.local_addr();
            let counters = bound.counters();
            let tls = tls_files(lc).zip(bound.tls_reloader());
            let lctx = ListenerCtx::new(
                &shared,
                registry.clone(),
                lc,
                counters.clone(),
                chain.clone(),
            );
            let actor = start_with(ListenerActor::new(bound, lctx), Options::named("listener"));
            tracing::info!(kind = %lc.kind, %addr, "listening");
            listeners.push(BoundListener {
                kind: lc.kind,
                addr,
                actor,
                counters,
                tls,
            });
        }
        let listener_counters = listeners
            .iter()
            .map(|l| (l.kind, l.addr.port(), l.counters.clone()))
            .collect();
        let sys = start_with(
            SysActor::new(
                shared.clone(),
                router.clone(),
                listener_counters,
                cluster.as_ref().map(cluster::ClusterNode::actor),
            ),
            Options::named("sys"),
        );
        let listing = start_with(
            ListingActor::new(shared.clone(), registry.clone()),
            Options::named("listing"),
        );
        Ok(Broker {
            shared,
            listeners,
            registry,
            _router: router,
            sys,
            listing,
            chain,
            store,
            cluster,
        })
    }

    /// The bound address of each listener, in config order (the real port when the config
    /// said port 0).
    pub fn local_addrs(&self) -> Vec<(ListenerKind, SocketAddr)> {
        self.listeners.iter().map(|l| (l.kind, l.addr)).collect()
    }

    /// The first listener of `kind`, if any.
    pub fn local_addr(&self, kind: ListenerKind) -> Option<SocketAddr> {
        self.listeners
            .iter()
            .find(|l| l.kind == kind)
            .map(|l| l.addr)
    }

    /// Each listener's transport counters now (accepted, failed and timed-out handshakes,
    /// refusals over `max_handshakes`), in config order.
    pub fn listener_counters(&self) -> Vec<(ListenerKind, SocketAddr, CounterSnapshot)> {
        self.listeners
            .iter()
            .map(|l| (l.kind, l.addr, l.counters.snapshot()))
            .collect()
    }

    /// Re-reads the certificate, key and client CA files of every tls, wss and quic listener
    /// and uses them for handshakes from now on; established connections keep theirs. Every
    /// listener is tried; each outcome is logged (a failure names the file), and a listener
    /// whose files do not load keeps its previous certificate.
    ///
    /// Returns how many listeners were reloaded.
    ///
    /// # Errors
    /// [`BrokerError::TlsReload`] for the first listener that failed (all are attempted).
    pub fn reload_tls(&self) -> Result<usize, BrokerError> {
        let mut reloaded = 0;
        let mut first_error = None;
        for l in &self.listeners {
            let Some((files, reloader)) = &l.tls else {
                continue;
            };
            match files.load().and_then(|tls| reloader.reload(&tls)) {
                Ok(()) => {
                    reloaded += 1;
                    tracing::info!(
                        kind = %l.kind,
                        addr = %l.addr,
                        cert = %files.cert.display(),
                        "certificate reloaded"
                    );
                }
                Err(e) => {
                    tracing::error!(
                        kind = %l.kind,
                        addr = %l.addr,
                        error = %e,
                        "certificate reload failed; the previous certificate stays"
                    );
                    first_error.get_or_insert(BrokerError::TlsReload {
                        kind: l.kind,
                        addr: l.addr,
                        source: Box::new(e),
                    });
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(reloaded),
        }
    }

    /// The counters now.
    /// A handle for the operator's requests (the HTTP API): see [`Admin`].
    pub fn admin(&self) -> Admin {
        Admin::new(
            self.shared.clone(),
            self.registry.clone(),
            self.listing.clone(),
            self._router.clone(),
            self.cluster.as_ref().map(cluster::ClusterNode::actor),
            self.chain.clone(),
        )
    }

    pub fn metrics(&self) -> MetricsSnapshot {
        self.shared.metrics.snapshot()
    }

    /// The handshake and delivery latency histograms.
    pub fn latencies(&self) -> crate::Latencies {
        self.shared.metrics.latencies()
    }

    /// Hands an already accepted stream (any transport) to the broker, as a listener would:
    /// the CONNECT handshake runs in the caller's task.
    pub async fn serve_stream(
        &self,
        io: Box<dyn Io>,
        peer: SocketAddr,
        kind: starling_net::ListenerKind,
    ) {
        let lc = ListenerConfig::default();
        let lctx = Arc::new(ListenerCtx::new(
            &self.shared,
            self.registry.clone(),
            &lc,
            Arc::new(ListenerCounters::default()),
            self.chain.clone(),
        ));
        let accepted = starling_rt::time::now();
        let info = starling_net::ConnInfo {
            peer,
            transport_peer: peer,
            local: peer,
            kind,
            tls_client_cn: None,
        };
        self.shared.metrics.handshakings.shift(1);
        listener::serve(io, info, None, None, lctx, accepted).await;
        self.shared.metrics.handshakings.shift(-1);
    }

    /// Resolves once this node has left its cluster (`starling cluster leave`); never
    /// without a cluster. The daemon then stops, as on SIGTERM.
    pub async fn left(&self) {
        match &self.cluster {
            Some(c) => c.left().await,
            None => std::future::pending().await,
        }
    }

    /// Stops accepting, closes every connection (MQTT 5: DISCONNECT 0x8B) and stops the
    /// actors.
    pub async fn shutdown(self) {
        for l in &self.listeners {
            l.actor.stop();
        }
        let _ = self.registry.ask(RegistryMsg::Shutdown).await;
        self.registry.stop();
        self.sys.stop();
        if let Some(c) = &self.cluster {
            c.stop();
        }
        if let Some(store) = &self.store {
            // What the shards wrote last is committed, and the file closed, before the
            // process ends (or another broker opens it).
            let _ = store.ask(StoreMsg::Close).await;
            store.stop();
        }
    }

    /// Waits until every write handed to the store so far is committed; at once without a
    /// store. For tests and orderly stops.
    pub async fn flush_store(&self) {
        if let Some(store) = &self.store {
            let _ = store.ask(StoreMsg::Flush).await;
        }
    }
}

async fn bind(lc: &ListenerConfig, max_packet_size: u32) -> Result<MqttListener, BrokerError> {
    let err = |source| BrokerError::Listener {
        kind: lc.kind,
        addr: lc.bind,
        source: Box::new(source),
    };
    let tls = || -> Result<_, BrokerError> {
        let files = tls_files(lc).ok_or_else(|| {
            err(starling_net::NetError::ListenerConfig {
                reason: "listener needs TLS settings",
            })
        })?;
        files.load().map_err(err)
    };
    let ws = || {
        let w = lc.ws.clone().unwrap_or_default_ws();
        WsConfig {
            path: w.0,
            trust_x_forwarded_for: w.1,
            // Some clients send each packet as one WebSocket message.
            message_size_max: max_packet_size as usize + 16,
            // Before authentication: the largest CONNECT, its frame header and an HTTP
            // upgrade request of up to 8 KiB (browsers send well under 2 KiB).
            preauth_bytes_max: lc.max_connect_packet_size as usize + 8 * 1024 + 16,
        }
    };
    let transport = match lc.kind {
        ListenerKind::Tcp => Transport::Tcp,
        ListenerKind::Tls => Transport::Tls(tls()?),
        ListenerKind::Ws => Transport::Ws(ws()),
        ListenerKind::Wss => Transport::Wss(tls()?, ws()),
        ListenerKind::Quic => {
            let mut seed = [0u8; 32];
            starling_rt::rng::rng().fill_bytes(&mut seed);
            let mut q = QuicConfig::new(seed);
            // As for WebSocket: what a client may make the endpoint buffer before its
            // CONNECT is accepted (the listener raises it then).
            q.preauth_receive_window = Some(lc.max_connect_packet_size + 8 * 1024 + 16);
            if let Some(c) = &lc.quic {
                q.idle_timeout = Duration::from_secs(u64::from(c.idle_timeout_secs.max(1)));
                if q.keep_alive_interval.is_some_and(|k| k >= q.idle_timeout) {
                    q.keep_alive_interval = Some(q.idle_timeout / 2);
                }
            }
            Transport::Quic(tls()?, q)
        }
    };
    let settings = ListenerSettings {
        limits: HandshakeLimits {
            handshakes_in_flight_max: (lc.max_handshakes as usize).max(1),
            handshake_timeout: Duration::from_secs(u64::from(lc.handshake_timeout_secs.max(1))),
        },
        proxy_protocol: lc.proxy_protocol.then(ProxyProtocol::default),
    };
    MqttListener::bind(lc.bind, transport, settings)
        .await
        .map_err(err)
}

/// Nothing is persisted yet (`node.data_dir` stays empty), so say so where operators look
/// whenever a session can outlive its connection, which with the defaults is always: MQTT
/// 3.x clean-session-0 clients are always accepted, and v5 ones when
/// `session_expiry_max_secs` > 0.
fn warn_volatile_state(config: &Config) {
    if !config.storage.enabled {
        tracing::warn!(
            "storage.enabled is false: sessions, retained and delayed messages are kept in \
             memory only and are lost on restart"
        );
    }
}

/// The store's file under `node.data_dir`.
pub fn store_path(config: &Config) -> PathBuf {
    config.node.data_dir.join(STORE_FILE)
}

const STORE_FILE: &str = "store.redb";

/// Opens the store (reading it back whole) and starts its actor; `None` when
/// `storage.enabled` is false.
fn open_store(
    shared: &Arc<Shared>,
    location: Option<Location>,
) -> Result<Option<(Addr<StoreMsg>, Recovered)>, BrokerError> {
    let s = &shared.config.storage;
    if !s.enabled {
        return Ok(None);
    }
    let path = store_path(&shared.config);
    let fail = |source| BrokerError::Store {
        path: path.clone(),
        source: Box::new(source),
    };
    let location = match location {
        Some(l) => l,
        None => {
            std::fs::create_dir_all(&shared.config.node.data_dir)
                .map_err(|e| fail(StoreOpenError::Dir(e)))?;
            Location::File(path.clone())
        }
    };
    let limits = StoreLimits {
        max_bytes: s.max_bytes,
    };
    // Blocking, before any listener opens: nothing is served until the store is read.
    let started = time::now();
    let (store, recovered) = Store::open(location, limits).map_err(|e| fail(e.into()))?;
    let usage = store.usage();
    tracing::info!(
        path = %path.display(),
        sessions = usage.sessions,
        deliveries = usage.deliveries,
        retained = usage.retained,
        delayed = usage.delayed,
        bytes = usage.bytes,
        took_ms = time::now().saturating_duration_since(started).as_millis() as u64,
        "store opened"
    );
    let addr = start_with(
        StorageActor::new(shared.clone(), store),
        Options::named("store").capacity(STORE_MAILBOX),
    );
    Ok(Some((addr, recovered)))
}

/// Writes (batches of ops) the storage actor's mailbox holds before writers wait.
const STORE_MAILBOX: usize = 1024;

/// Gives every stored session back its client actor, detached, and waits until their
/// subscriptions are routed. A session whose connection the stop cut (written while
/// connected) counts as disconnected at this start: its expiry and will delay run from now.
/// One that cannot be restored is logged and left in the store.
async fn restore_sessions(
    shared: &Arc<Shared>,
    registry: &Addr<RegistryMsg>,
    sessions: Vec<starling_store::RecoveredSession>,
) {
    if sessions.is_empty() {
        return;
    }
    let started = time::now();
    let (now, wall) = (time::now(), time::wall());
    let n = sessions.len();
    let mut restored = Vec::with_capacity(n);
    for s in sessions {
        let mut state = s.state;
        if s.connected {
            if let Some(d) = &mut state.detached {
                d.expires_at = (d.expiry_interval_secs != u32::MAX)
                    .then(|| wall.checked_add(Duration::from_secs(d.expiry_interval_secs.into())))
                    .flatten();
                if let Some(w) = &mut d.will {
                    let delay = w.properties.will_delay_interval.unwrap_or(0);
                    w.due_at = wall.checked_add(Duration::from_secs(delay.into()));
                }
            }
        }
        // Deliveries in flight come back in seq order, which is routing order per shard but
        // not send order across shards; a resend must keep send order (MQTT 4.6). Packet ids
        // were handed out in turn, so their circular order is that order.
        let mut inflight_seqs = s.inflight_seqs;
        if let Some(d) = state.detached.as_mut() {
            let first = send_start(d.inflight.iter().map(|f| f.packet_id.get()));
            let mut both: Vec<_> = std::mem::take(&mut d.inflight)
                .into_iter()
                .zip(inflight_seqs)
                .collect();
            both.sort_by_key(|(f, _)| f.packet_id.get().wrapping_sub(first));
            (d.inflight, inflight_seqs) = both.into_iter().unzip();
        }
        // The meta's next packet identifier dates from its last write; the session has sent
        // since. Going on after the last one in flight reuses none a client may still hold
        // (a client that keeps a resent QoS 2 PUBLISH twice, as libmosquitto does, would
        // deliver the stale copy when its identifier comes round again).
        if let Some(last) = state.detached.as_ref().and_then(|d| d.inflight.last()) {
            state.next_packet_id = last
                .packet_id
                .checked_add(1)
                .unwrap_or(std::num::NonZeroU16::MIN);
        }
        let client_id = state.client_id.clone();
        match starling_session::Session::restore(state, shared.limits.clone(), now, wall) {
            Ok(mut session) => {
                session.set_store_keys(
                    inflight_seqs.iter().copied().map(Some),
                    s.queue_seqs.iter().copied().map(Some),
                );
                restored.push((session, s.owner.map(Arc::from)));
            }
            Err(e) => {
                tracing::error!(client_id = %client_id, error = %e, "stored session not restored");
            }
        }
    }
    let count = restored.len();
    let _ = registry
        .ask(|reply| RegistryMsg::Restore(restored, reply))
        .await;
    tracing::info!(
        sessions = count,
        of = n,
        took_ms = time::now().saturating_duration_since(started).as_millis() as u64,
        "stored sessions restored"
    );
}

/// The first sent of packet ids handed out in turn: the one after the widest gap between
/// them (where the counter wrapped, or the oldest still in flight). Sorting by
/// `id.wrapping_sub(first)` then gives send order.
fn send_start(ids: impl Iterator<Item = u16>) -> u16 {
    let mut ids: Vec<u16> = ids.collect();
    ids.sort_unstable();
    let n = ids.len();
    (0..n)
        .max_by_key(|&k| ids[k].wrapping_sub(ids[(k + n - 1) % n]))
        .map_or(0, |k| ids[k])
}

/// Hands each shard its part of what the store held, and waits until all have it.
async fn restore(shards: &Shards, recovered: Recovered) {
    let n = shards.count();
    let now = time::now();
    let wall = time::wall();
    type Part = (Vec<Arc<Message>>, Vec<(DelayedKey, Arc<Message>)>);
    let mut parts: Vec<Part> = (0..n).map(|_| (Vec::new(), Vec::new())).collect();
    for (topic, m) in recovered.retained {
        let i = shards.index_for_publish(&topic);
        parts[i].0.push(Arc::new(Message::from_state(m, now, wall)));
    }
    for d in recovered.delayed {
        let i = shards.index_for_publish(&d.target);
        let mut m = Message::from_state(d.message, now, wall);
        m.topic = Arc::from(d.target);
        parts[i].1.push((
            DelayedKey {
                id: d.id,
                due: d.due,
            },
            Arc::new(m),
        ));
    }
    for (i, (retained, delayed)) in parts.into_iter().enumerate() {
        if retained.is_empty() && delayed.is_empty() {
            continue;
        }
        let (done, wait) = tokio::sync::oneshot::channel();
        let msg = RouterMsg::Restore(Box::new(Restore {
            retained,
            delayed,
            done,
        }));
        if shards.get(i).send(msg).await.is_ok() {
            let _ = wait.await;
        }
    }
}

/// The certificate files of a listener with TLS settings (tls, wss, quic).
fn tls_files(lc: &ListenerConfig) -> Option<TlsFiles> {
    let t = lc.tls.as_ref()?;
    let client_auth = match (&t.ca_file, t.verify_client) {
        (Some(ca), true) => ClientAuth::Required(ca.clone()),
        (Some(ca), false) => ClientAuth::Optional(ca.clone()),
        (None, _) => ClientAuth::None,
    };
    Some(TlsFiles {
        cert: t.cert_file.clone(),
        key: t.key_file.clone(),
        client_auth,
    })
}

trait WsDefaults {
    fn unwrap_or_default_ws(self) -> (String, bool);
}

impl WsDefaults for Option<starling_config::WsConfig> {
    fn unwrap_or_default_ws(self) -> (String, bool) {
        match self {
            Some(w) => (w.path, w.x_forwarded_for),
            None => (starling_net::WS_PATH_DEFAULT.to_owned(), false),
        }
    }
}

#[cfg(test)]
mod send_order_tests {
    use super::send_start;

    fn in_send_order(ids: &[u16]) -> Vec<u16> {
        let first = send_start(ids.iter().copied());
        let mut v = ids.to_vec();
        v.sort_by_key(|id| id.wrapping_sub(first));
        v
    }

    #[test]
    fn packet_ids_come_back_in_the_order_they_were_handed_out() {
        assert_eq!(in_send_order(&[3, 1, 2]), [1, 2, 3]);
        // Wrapped: 65534, 65535, then 1, 2.
        assert_eq!(in_send_order(&[2, 65535, 1, 65534]), [65534, 65535, 1, 2]);
        // Holes where deliveries were acknowledged.
        assert_eq!(in_send_order(&[40, 7, 9]), [7, 9, 40]);
        assert_eq!(in_send_order(&[9]), [9]);
        assert!(in_send_order(&[]).is_empty());
    }
}
