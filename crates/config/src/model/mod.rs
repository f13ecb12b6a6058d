//! The typed configuration. Sections that the file maps one-to-one derive `Deserialize`;
//! listeners go through a raw form because their defaults depend on their kind.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use serde::Deserialize;

mod cluster;

pub(crate) use cluster::RawCluster;
pub use cluster::{ClusterConfig, ClusterReads};

/// The whole validated configuration. `Config::default()` is what an empty file gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `[node]`: this broker's identity and storage.
    pub node: NodeConfig,
    /// `[[listeners]]`: the listeners to start, in file order, without the ones disabled
    /// by a [`crate::Warning`]. Never empty.
    pub listeners: Vec<ListenerConfig>,
    /// `[mqtt]`: protocol limits and features.
    pub mqtt: MqttConfig,
    /// `[router]`: how routing is split over topic shards.
    pub router: RouterSettings,
    /// `[storage]`: the durable store of sessions, retained and delayed messages.
    pub storage: StorageConfig,
    /// `[auth]`: password file and ACL.
    pub auth: AuthConfig,
    /// `[http]`: the HTTP API and metrics.
    pub http: HttpConfig,
    /// `[log]`: logging.
    pub log: LogConfig,
    /// `[cluster]`: membership of a raft cluster.
    pub cluster: ClusterConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            node: NodeConfig::default(),
            listeners: vec![ListenerConfig::default()],
            mqtt: MqttConfig::default(),
            router: RouterSettings::default(),
            storage: StorageConfig::default(),
            auth: AuthConfig::default(),
            http: HttpConfig::default(),
            log: LogConfig::default(),
            cluster: ClusterConfig::default(),
        }
    }
}

/// `[node]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// Node id in the cluster, at least 1 (raft ids are non-zero). Default 1.
    pub id: u64,
    /// Node name, used in `$SYS/brokers/{name}/...`. Default `starling@127.0.0.1`.
    pub name: String,
    /// Directory for durable state. Default `data` (next to the config file when loaded).
    pub data_dir: PathBuf,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            id: 1,
            name: "starling@127.0.0.1".to_owned(),
            data_dir: PathBuf::from("data"),
        }
    }
}

/// A listener's transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ListenerKind {
    /// MQTT over TCP (default port 1883).
    Tcp,
    /// MQTT over TLS (8883).
    Tls,
    /// MQTT over WebSocket (8080).
    Ws,
    /// MQTT over WebSocket over TLS (8443).
    Wss,
    /// MQTT over QUIC, one bidirectional stream (UDP 14567).
    Quic,
}

impl ListenerKind {
    /// The port a listener of this kind binds when `bind` is absent.
    pub fn default_port(self) -> u16 {
        match self {
            Self::Tcp => 1883,
            Self::Tls => 8883,
            Self::Ws => 8080,
            Self::Wss => 8443,
            Self::Quic => 14567,
        }
    }

    /// Whether the transport needs a certificate (TLS, or QUIC which embeds TLS 1.3).
    pub fn needs_tls(self) -> bool {
        matches!(self, Self::Tls | Self::Wss | Self::Quic)
    }

    /// Whether the transport is a WebSocket.
    pub fn is_websocket(self) -> bool {
        matches!(self, Self::Ws | Self::Wss)
    }

    /// Whether the transport runs over UDP (ports do not clash with TCP ones).
    pub fn is_udp(self) -> bool {
        self == Self::Quic
    }
}

impl fmt::Display for ListenerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Tcp => "tcp",
            Self::Tls => "tls",
            Self::Ws => "ws",
            Self::Wss => "wss",
            Self::Quic => "quic",
        })
    }
}

/// One validated `[[listeners]]` entry. `tls` is `Some` exactly for tls, wss and quic;
/// `ws` exactly for ws and wss; `quic` exactly for quic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerConfig {
    /// The transport.
    pub kind: ListenerKind,
    /// Address and port; default `0.0.0.0` and the kind's port.
    pub bind: SocketAddr,
    /// Open connections at most; further ones are refused. Default 100000.
    pub max_connections: u32,
    /// Transport handshakes (PROXY, TLS, WebSocket, QUIC) in progress at most; more wait in
    /// the kernel's accept queue. Default 1000.
    pub max_handshakes: u32,
    /// Seconds from accept to a complete CONNECT before the connection is closed. Default 10.
    pub handshake_timeout_secs: u32,
    /// Largest CONNECT accepted, in bytes, whole packet: what one unauthenticated
    /// connection may make the broker buffer. Larger ones are refused (v5: CONNACK 0x95).
    /// At most `mqtt.max_packet_size`. Default 16384.
    pub max_connect_packet_size: u32,
    /// Bytes of CONNECTs being read at once on this listener, at most. A CONNECT larger
    /// than the first read buffer (256 bytes) reserves its declared size from this budget
    /// before it is buffered, waiting (under the handshake timeout) while the budget is
    /// spent. At least `max_connect_packet_size`. Default 16 MiB.
    pub connect_read_budget_bytes: u64,
    /// Whether clients without a username may connect. Default true.
    pub allow_anonymous: bool,
    /// Whether connections start with a PROXY protocol v1/v2 header (tcp and tls only).
    /// Default false.
    pub proxy_protocol: bool,
    /// Certificate settings.
    pub tls: Option<TlsConfig>,
    /// WebSocket settings.
    pub ws: Option<WsConfig>,
    /// QUIC settings.
    pub quic: Option<QuicConfig>,
}

impl Default for ListenerConfig {
    fn default() -> Self {
        Self {
            kind: ListenerKind::Tcp,
            bind: SocketAddr::from((Ipv4Addr::UNSPECIFIED, ListenerKind::Tcp.default_port())),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_handshakes: DEFAULT_MAX_HANDSHAKES,
            handshake_timeout_secs: DEFAULT_HANDSHAKE_TIMEOUT_SECS,
            max_connect_packet_size: DEFAULT_MAX_CONNECT_PACKET_SIZE,
            connect_read_budget_bytes: DEFAULT_CONNECT_READ_BUDGET_BYTES,
            allow_anonymous: true,
            proxy_protocol: false,
            tls: None,
            ws: None,
            quic: None,
        }
    }
}

pub(crate) const DEFAULT_MAX_CONNECTIONS: u32 = 100_000;
pub(crate) const DEFAULT_MAX_HANDSHAKES: u32 = 1000;
pub(crate) const DEFAULT_HANDSHAKE_TIMEOUT_SECS: u32 = 10;
// A v5 CONNECT with a client id, credentials, authentication data and a will with
// properties is well under 4 KiB; 16 KiB leaves room for a large will payload while 1,500
// stalled CONNECTs hold at most 24 MiB (and the read budget caps them lower).
pub(crate) const DEFAULT_MAX_CONNECT_PACKET_SIZE: u32 = 16 * 1024;
// About a thousand maximal CONNECTs in flight, or any number of ordinary (< 256 B) ones.
pub(crate) const DEFAULT_CONNECT_READ_BUDGET_BYTES: u64 = 16 * 1024 * 1024;
pub(crate) const DEFAULT_WS_PATH: &str = "/mqtt";
pub(crate) const DEFAULT_QUIC_IDLE_TIMEOUT_SECS: u32 = 30;

/// A listener's certificate material.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// PEM certificate chain.
    pub cert_file: PathBuf,
    /// PEM private key.
    pub key_file: PathBuf,
    /// PEM CA bundle that client certificates are verified against.
    pub ca_file: Option<PathBuf>,
    /// Whether clients must present a certificate signed by `ca_file`.
    pub verify_client: bool,
    /// Whether the client certificate's CN becomes the username.
    pub cn_as_username: bool,
}

/// A WebSocket listener's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WsConfig {
    /// The HTTP path of the upgrade. Default `/mqtt`.
    pub path: String,
    /// Whether the client's address is taken from `X-Forwarded-For` (behind a proxy).
    pub x_forwarded_for: bool,
}

/// A QUIC listener's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuicConfig {
    /// Seconds without traffic before the connection is closed. Default 30.
    pub idle_timeout_secs: u32,
}

/// A `[[listeners]]` entry as written; every field but `kind` is optional so that keys
/// which do not apply to the kind can be reported.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawListener {
    pub kind: ListenerKind,
    pub bind: Option<String>,
    pub max_connections: Option<u32>,
    pub max_handshakes: Option<u32>,
    pub handshake_timeout_secs: Option<u32>,
    pub max_connect_packet_size: Option<u32>,
    pub connect_read_budget_bytes: Option<u64>,
    pub allow_anonymous: Option<bool>,
    pub proxy_protocol: Option<bool>,
    pub tls: Option<RawTls>,
    pub ws_path: Option<String>,
    pub ws_x_forwarded_for: Option<bool>,
    pub idle_timeout_secs: Option<u32>,
}

/// `[listeners.tls]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTls {
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    pub verify_client: Option<bool>,
    pub cn_as_username: Option<bool>,
}

/// The file's top level as written.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawConfig {
    pub node: NodeConfig,
    pub listeners: Option<Vec<RawListener>>,
    pub mqtt: MqttConfig,
    pub router: RouterSettings,
    pub storage: StorageConfig,
    pub auth: AuthConfig,
    pub http: HttpConfig,
    pub log: LogConfig,
    pub cluster: RawCluster,
}

/// What to drop when a client's message queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum DropPolicy {
    /// Drop the oldest queued QoS 0 message; when none is queued, the arriving message.
    #[default]
    #[serde(rename = "drop_oldest_qos0_first")]
    DropOldestQos0First,
    /// Drop the message that does not fit.
    #[serde(rename = "drop_new")]
    DropNew,
}

/// How a shared subscription group picks a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SharedStrategy {
    /// Members take turns.
    #[default]
    RoundRobin,
    /// A random member.
    Random,
    /// The same member until it leaves.
    Sticky,
    /// A member chosen by a hash of the publisher's client id.
    HashClientid,
}

/// `[mqtt]`: protocol limits and features; every limit is finite.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MqttConfig {
    /// Largest packet accepted or sent, in bytes, whole packet. 2..=268435455, default 1 MiB.
    pub max_packet_size: u32,
    /// QoS 1/2 messages in flight to one client. 1..=65535, default 32.
    pub max_inflight: u16,
    /// Messages queued for one client (offline or over the window). Default 1000.
    pub max_mqueue_len: u32,
    /// What a full queue drops. Default `drop_oldest_qos0_first`.
    pub mqueue_drop_policy: DropPolicy,
    /// Whether an online subscriber whose queue is half full holds back the clients that
    /// publish QoS 1/2 messages to it (they are not read until it drains to a quarter),
    /// instead of its queue dropping what does not fit. Default true.
    pub backpressure: bool,
    /// Whether QoS 0 publishes are held back too, when more than half of one publish's
    /// deliveries go to subscribers that are backlogged: QoS 0 may be dropped, but routing
    /// a flood that is mostly dropped takes the time the subscribers need to drain. One
    /// slow subscriber among many never holds a QoS 0 publisher. Needs `backpressure`.
    /// Default true.
    pub backpressure_qos0: bool,
    /// Longest a subscriber may stay backlogged without draining to a quarter before it
    /// stops holding its publishers back (its queue then drops by its policy, as without
    /// back-pressure): a client that stops acknowledging must not stall its publishers
    /// for good. 1..=3600, default 10.
    pub backpressure_max_secs: u32,
    /// A subscriber holding publishers back that takes nothing in (acknowledges nothing,
    /// its queue does not move) for this long is stalled: it stops holding them at once.
    /// Well-behaved slow subscribers acknowledge something every round trip. 1..=3600,
    /// default 2.
    pub backpressure_stall_secs: u32,
    /// Stalls (or `backpressure_max_secs` expiries) a subscriber may have within
    /// `backpressure_window_secs`; past that it holds no one back until the window ends,
    /// so that a client draining now and then cannot stall the broker over and over.
    /// 1..=1000, default 2.
    pub backpressure_stalls_max: u32,
    /// The window stalls are counted in. 1..=86400, default 60.
    pub backpressure_window_secs: u32,
    /// What happens to a subscriber found stalled: `drop` (its queue drops by its policy
    /// until it drains) or `disconnect` (v5 DISCONNECT 0x97 Quota exceeded). Default drop.
    pub backpressure_stuck_policy: StuckPolicy,
    /// Which subscribers may hold publishers back: `all` or `authenticated` (clients with
    /// a username; anonymous subscribers then only drop). Default all.
    pub backpressure_holders: BackpressureHolders,
    /// Largest keep alive accepted; larger requests get this (v5 Server Keep Alive). Default 65535.
    pub keepalive_max_secs: u16,
    /// Smallest non-zero keep alive accepted. Default 0.
    pub keepalive_min_secs: u16,
    /// Whether keep alive 0 (no keep alive) is accepted. Default true.
    pub allow_zero_keepalive: bool,
    /// Largest session expiry granted. Default 7200 (2 hours).
    pub session_expiry_max_secs: u32,
    /// Longest a message is kept; a larger publisher expiry is capped to it, and a message
    /// without one is kept this long but forwarded without one. Default 86400.
    pub message_expiry_max_secs: u32,
    /// Seconds before an unacknowledged QoS 1/2 message is resent. Default 30.
    pub retry_interval_secs: u32,
    /// Topic Alias Maximum announced to clients (0 = no aliases). Default 16.
    pub topic_alias_max: u16,
    /// Receive Maximum announced to clients. Default 128.
    pub receive_max: u16,
    /// Longest client id, in bytes (at least 23, MQTT 3.1.1 §3.1.3.1). Default 256.
    pub client_id_len_max: u16,
    /// Most levels in a topic or filter. Default 128.
    pub topic_levels_max: u16,
    /// Longest topic or filter, in bytes. Default 65535.
    pub topic_len_max: u16,
    /// Subscriptions per client. Default 1000.
    pub subscriptions_max: u32,
    /// Whether retained messages are stored. Default true.
    pub retain_available: bool,
    /// Retained messages stored at most. Default 1000000.
    pub retained_max: u64,
    /// Retained payload bytes stored at most. Default 1 GiB.
    pub retained_bytes_max: u64,
    /// Highest QoS granted. 0..=2, default 2.
    pub max_qos: u8,
    /// Whether filters with `+`/`#` are accepted. Default true.
    pub wildcard_subscription: bool,
    /// Whether `$share/` subscriptions are accepted. Default true.
    pub shared_subscription: bool,
    /// How shared groups pick a member. Default `round_robin`.
    pub shared_strategy: SharedStrategy,
    /// `$delayed/` messages pending at most. Default 100000.
    pub delayed_publish_max: u32,
    /// Longest `$delayed/{secs}` accepted. Default 604800 (7 days).
    pub delayed_max_secs: u32,
    /// Response Information sent to v5 clients that request it. Default none.
    pub response_information: Option<String>,
    /// Seconds between `$SYS` publications. Default 10.
    pub sys_interval_secs: u32,
}

impl Default for MqttConfig {
    fn default() -> Self {
        Self {
            max_packet_size: 1024 * 1024,
            max_inflight: 32,
            max_mqueue_len: 1000,
            mqueue_drop_policy: DropPolicy::DropOldestQos0First,
            backpressure: true,
            backpressure_qos0: true,
            backpressure_max_secs: 10,
            backpressure_stall_secs: 2,
            backpressure_stalls_max: 2,
            backpressure_window_secs: 60,
            backpressure_stuck_policy: StuckPolicy::Drop,
            backpressure_holders: BackpressureHolders::All,
            keepalive_max_secs: 65535,
            keepalive_min_secs: 0,
            allow_zero_keepalive: true,
            session_expiry_max_secs: 2 * 60 * 60,
            message_expiry_max_secs: 24 * 60 * 60,
            retry_interval_secs: 30,
            topic_alias_max: 16,
            receive_max: 128,
            client_id_len_max: 256,
            topic_levels_max: 128,
            topic_len_max: 65535,
            subscriptions_max: 1000,
            retain_available: true,
            retained_max: 1_000_000,
            retained_bytes_max: 1024 * 1024 * 1024,
            max_qos: 2,
            wildcard_subscription: true,
            shared_subscription: true,
            shared_strategy: SharedStrategy::RoundRobin,
            delayed_publish_max: 100_000,
            delayed_max_secs: 7 * 24 * 60 * 60,
            response_information: None,
            sys_interval_secs: 10,
        }
    }
}

/// What happens to a subscriber found stalled while it held publishers back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StuckPolicy {
    /// It stops holding publishers back; its queue drops by its policy until it drains.
    #[default]
    Drop,
    /// It is disconnected (v5 DISCONNECT 0x97 Quota exceeded).
    Disconnect,
}

/// Which subscribers may hold publishers back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackpressureHolders {
    /// Every online subscriber.
    #[default]
    All,
    /// Only clients that connected with a username.
    Authenticated,
}

/// The decision when no ACL rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AclDefault {
    /// Permit.
    #[default]
    Allow,
    /// Refuse.
    Deny,
}

/// `[auth]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// Password file (`username:$argon2id$...` lines); none = usernames are not verified.
    pub password_file: Option<PathBuf>,
    /// ACL file (TOML rules); none = every operation gets `acl_default`.
    pub acl_file: Option<PathBuf>,
    /// Decision when no rule matches. Default `allow`.
    pub acl_default: AclDefault,
    /// Which client ids an identity may use. Default `bound`.
    pub client_id_policy: ClientIdPolicy,
    /// Threads verifying passwords, apart from the threads serving connections. 1..=256;
    /// absent = half the cores, at least 1.
    pub verify_threads: Option<u32>,
    /// Verifications waiting for a thread at most; a CONNECT that finds the queue full is
    /// refused with CONNACK 0x88 Server unavailable (3.x: 3). 1..=65535, default 32.
    pub verify_queue: u32,
    /// Failed logins from one address (IPv6: one /64) within `failed_logins_window_secs`
    /// that ban it for `failed_login_ban_secs`. 1..=1000000, default 10.
    pub failed_logins_max: u32,
    /// The window failed logins are counted in. 1..=86400, default 60.
    pub failed_logins_window_secs: u32,
    /// How long a banned address has its CONNECTs with credentials refused without
    /// verification (CONNACK 0x88 / 3). 1..=86400, default 60.
    pub failed_login_ban_secs: u32,
    /// How long a client's PUBLISH or SUBSCRIBE waits for an authorizer that answers later
    /// (its input is held back meanwhile, in order). 1..=60000, default 5000.
    pub verdict_timeout_ms: u32,
    /// The verdict a PUBLISH or SUBSCRIBE gets when its authorizer misses
    /// `verdict_timeout_ms` (never remembered). Default `deny`.
    pub timeout_verdict: TimeoutVerdict,
}

/// What an authorization that missed its deadline decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TimeoutVerdict {
    /// Refuse (MQTT 5 PUBACK/SUBACK 0x87 Not authorized).
    #[default]
    Deny,
    /// Permit.
    Allow,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            password_file: None,
            acl_file: None,
            acl_default: AclDefault::default(),
            client_id_policy: ClientIdPolicy::default(),
            verify_threads: None,
            verify_queue: 32,
            failed_logins_max: 10,
            failed_logins_window_secs: 60,
            failed_login_ban_secs: 60,
            verdict_timeout_ms: 5000,
            timeout_verdict: TimeoutVerdict::default(),
        }
    }
}

/// Which client ids an identity (username, or certificate CN) may use. Every policy binds
/// a session to the identity that created it; the others are stricter still.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientIdPolicy {
    /// Any client id; a session belongs to the identity that created it, and a CONNECT
    /// by another identity with its client id is refused.
    #[default]
    Bound,
    /// As `bound`, and a client with a username must use it as its client id.
    EqualUsername,
    /// As `bound`, and a client with a username must use a client id that is the
    /// username or starts with `{username}-`.
    UsernamePrefix,
}

/// `[router]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouterSettings {
    /// Topic shards, each an actor with its own part of the subscriptions, retained and
    /// delayed messages: `"auto"` (one per worker thread, the default) or 1..=256.
    pub shards: ShardCount,
}

/// `[http]`: the HTTP API on RMQTT's paths (`/api/v1/...`), served by the broker process.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Serve it. Default false: it lists clients, kicks them and publishes, so it is
    /// switched on by the operator (config/starling.toml does, on loopback).
    pub enabled: bool,
    /// Address to listen on. Default `0.0.0.0:6060` (RMQTT's).
    pub bind: SocketAddr,
    /// When set, every request under `/api/v1` must carry `Authorization: Bearer <token>`;
    /// others get 401. Default unset (no check; a warning when bound beyond loopback).
    pub bearer_token: Option<String>,
    /// Largest request body accepted, in bytes; a larger one gets 413. 1 KiB..=16 MiB,
    /// default 1 MiB.
    pub max_body_bytes: u32,
    /// Connections served at once; more wait in the accept backlog. 1..=10000, default 256.
    pub max_connections: u32,
    /// Threads serving requests (each asks the broker's actors by message). 1..=16,
    /// default 1.
    pub workers: u16,
    /// Rows a list returns at most, whatever `_limit` asks. 1..=100000, default 10000.
    pub max_rows: u32,
    /// How long a gathered list of clients or subscriptions may be given again while no
    /// client connected, disconnected or changed its subscriptions, in milliseconds (its
    /// queued and in-flight counts may be that old). 0 asks every client actor for every
    /// request. 0..=60000, default 1000.
    pub list_cache_ms: u32,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            bind: SocketAddr::from((Ipv4Addr::UNSPECIFIED, 6060)),
            bearer_token: None,
            max_body_bytes: 1 << 20,
            max_connections: 256,
            workers: 1,
            max_rows: 10_000,
            list_cache_ms: 1000,
        }
    }
}

/// `[storage]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageConfig {
    /// Keep sessions that outlive their connection, retained and delayed messages in
    /// `{node.data_dir}/store.redb`, across restarts and kills. Default true; false keeps
    /// them in memory only.
    pub enabled: bool,
    /// When a commit reaches the disk: `"always"` (the default: each commit is synced
    /// before what it holds is acknowledged) or `"never"` (the operating system writes it
    /// when it likes; a power cut can lose what was acknowledged since the last sync, a
    /// kill of the broker alone cannot).
    pub fsync: FsyncPolicy,
    /// How long a commit may wait to gather more writes, in milliseconds (0..=1000). The
    /// default, 0, commits at once when no commit is running; writes that come meanwhile
    /// share the next one.
    pub commit_interval_ms: u32,
    /// The store's cap on what it holds (keys plus values), in bytes: past it new
    /// persistent messages are refused (MQTT 5: PUBACK 0x97 Quota exceeded). At least
    /// 1 MiB; default 1 GiB.
    pub max_bytes: u64,
    /// Whether QoS 0 messages for an offline persistent session are queued, and stored with
    /// the session. Default false: they are dropped, as MQTT allows.
    pub queue_qos0: bool,
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            fsync: FsyncPolicy::Always,
            commit_interval_ms: 0,
            max_bytes: 1 << 30,
            queue_qos0: false,
        }
    }
}

/// `storage.fsync`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FsyncPolicy {
    #[default]
    Always,
    Never,
}

/// `router.shards`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShardCount {
    /// One per worker thread of the runtime.
    #[default]
    Auto,
    Fixed(u32),
}

impl<'de> Deserialize<'de> for ShardCount {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Count(u32),
            Word(String),
        }
        match Raw::deserialize(d)? {
            Raw::Count(n) => Ok(ShardCount::Fixed(n)),
            Raw::Word(w) if w == "auto" => Ok(ShardCount::Auto),
            Raw::Word(_) => Err(serde::de::Error::custom(
                "expected \"auto\" or an integer from 1 to 256",
            )),
        }
    }
}

/// `[log]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// A level (`info`) or tracing directives (`info,starling_net=debug`). Default `info`.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            level: "info".to_owned(),
        }
    }
}
