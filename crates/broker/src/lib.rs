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
mod recover;
mod refuse;
mod registry;
mod routing;
mod seeded;
mod settings;
mod shards;
mod stats;
mod storage;
mod sys;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rand::RngCore;
use starling_config::{Config, ListenerConfig, ListenerKind};
use starling_net::{
    ClientAuth, CounterSnapshot, HandshakeLimits, ListenerCounters, ListenerSettings, MqttListener,
    ProxyProtocol, QuicConfig, TlsFiles, TlsReloader, Transport, WsConfig,
};
use starling_rt::{start_with, Addr, Options};
use starling_store::{Location, Recovered};

pub use admin::{Admin, AdminError, AdminPublish, PluginInfo};
pub use conn::Io;
pub use error::{BrokerError, StoreOpenError};
pub use metrics::{
    HistogramSnapshot, Latencies, MetricKind, MetricsSnapshot, RmqttSnapshot, BOUNDS_US,
};
pub use msg::{
    ClientInfo, ClientSubscriptions, ClusterStatus, LeftBehind, MemberStatus, MembershipError,
};
pub use recover::store_path;
pub use starling_cluster::Member;
/// The hook seam, for embedders: providers to start the broker with
/// ([`Broker::start_with`]).
pub use starling_hooks as hooks;
/// Where a store lives, for [`Broker::start_with_store`].
pub use starling_store::Location as StoreLocation;
pub use stats::{BrokerStats, Level, StatLevel};

use listener::{ListenerActor, ListenerCtx, ListenerMsg};
use listing::ListingActor;
use msg::{ListingMsg, RegistryMsg, StoreMsg};
use recover::{open_store, restore, restore_sessions, start_shards};
use registry::Registry;
use settings::Shared;
use shards::Shards;
use starling_hooks::{Chain, Hooks};
use sys::{SysActor, SysEvents, SysMsg};

/// Mailbox of the router: deep enough to absorb a burst from many publishers; a full one
/// makes publishers wait (back-pressure), never grows.
pub(crate) const ROUTER_MAILBOX: usize = 4096;
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
        // Batches an earlier run parked for other nodes: some may be for nodes that left.
        let parked = !recovered.outbox.is_empty();
        let router = start_shards(
            &shared,
            store.as_ref(),
            recovered.next_delayed_id,
            seq_base,
            &recovered.links,
            &recovered.outbox,
            &recovered.moves,
        );
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
            if let Some(c) = cluster.as_ref().filter(|_| parked) {
                let _ = c.actor().send(msg::ClusterMsg::CheckDeparted).await;
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
