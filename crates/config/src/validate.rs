//! Parsing and the validation pass: raw TOML → typed [`Config`] plus warnings.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use crate::error::{ConfigError, Warning};
use crate::keys::check_unknown_keys;
use crate::model::*;

impl Config {
    /// Reads, parses and validates the file at `path`. Relative paths in it (`node.data_dir`,
    /// `auth.*_file`, `listeners[].tls.*_file`) are resolved against the file's directory.
    ///
    /// Errors are wrapped in [`ConfigError::InFile`], so the message names the file, then
    /// the key and the problem.
    pub fn load(path: impl AsRef<Path>) -> Result<(Config, Vec<Warning>), ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let base = path.parent().filter(|p| !p.as_os_str().is_empty());
        parse(&text, base).map_err(|e| ConfigError::InFile {
            path: path.to_path_buf(),
            source: Box::new(e),
        })
    }

    /// Parses and validates configuration text; relative paths stay as written.
    #[allow(clippy::should_implement_trait)] // also returns warnings, which `FromStr` cannot
    pub fn from_str(text: &str) -> Result<(Config, Vec<Warning>), ConfigError> {
        parse(text, None)
    }
}

fn parse(text: &str, base: Option<&Path>) -> Result<(Config, Vec<Warning>), ConfigError> {
    let table: toml::Table = toml::from_str(text).map_err(|e| ConfigError::Syntax {
        message: e.to_string().trim_end().to_owned(),
    })?;
    check_unknown_keys(&table)?;
    let raw: RawConfig =
        serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
            ConfigError::BadValue {
                key: e.path().to_string(),
                message: plain_words(e.into_inner().message()),
            }
        })?;
    validate(raw, base)
}

/// serde speaks Rust ("expected u16", "expected struct MqttConfig"); say it in the
/// file's terms.
fn plain_words(message: &str) -> String {
    let mut out = message.to_owned();
    for (rust, words) in [
        ("expected u8", "expected an integer from 0 to 255"),
        ("expected u16", "expected an integer from 0 to 65535"),
        ("expected u32", "expected an integer from 0 to 4294967295"),
        ("expected u64", "expected a non-negative integer"),
    ] {
        if let Some(head) = out.strip_suffix(rust) {
            out = format!("{head}{words}");
        }
    }
    if let Some(idx) = out.find("expected struct ") {
        out.truncate(idx);
        out.push_str("expected a table");
    }
    out
}

fn validate(raw: RawConfig, base: Option<&Path>) -> Result<(Config, Vec<Warning>), ConfigError> {
    let mut warnings = Vec::new();
    let node = validate_node(raw.node, base)?;
    validate_mqtt(&raw.mqtt)?;
    if let ShardCount::Fixed(n) = raw.router.shards {
        range("router.shards", n, 1, 256)?;
    }
    range(
        "storage.commit_interval_ms",
        raw.storage.commit_interval_ms,
        0,
        1000,
    )?;
    range("storage.max_bytes", raw.storage.max_bytes, 1 << 20, 1 << 50)?;
    let auth = AuthConfig {
        password_file: raw
            .auth
            .password_file
            .map(|p| resolve_file("auth.password_file", p, base))
            .transpose()?,
        acl_file: raw
            .auth
            .acl_file
            .map(|p| resolve_file("auth.acl_file", p, base))
            .transpose()?,
        acl_default: raw.auth.acl_default,
        client_id_policy: raw.auth.client_id_policy,
        verify_threads: raw.auth.verify_threads,
        verify_queue: raw.auth.verify_queue,
        failed_logins_max: raw.auth.failed_logins_max,
        failed_logins_window_secs: raw.auth.failed_logins_window_secs,
        failed_login_ban_secs: raw.auth.failed_login_ban_secs,
        verdict_timeout_ms: raw.auth.verdict_timeout_ms,
        timeout_verdict: raw.auth.timeout_verdict,
    };
    validate_auth(&auth)?;
    validate_log(&raw.log)?;
    validate_http(&raw.http, &mut warnings)?;
    let cluster = validate_cluster(raw.cluster, node.id, base)?;

    let listeners = match raw.listeners {
        None => vec![ListenerConfig::default()],
        Some(raws) => {
            let mut all = Vec::with_capacity(raws.len());
            for (i, l) in raws.into_iter().enumerate() {
                all.push(validate_listener(i, l, base, &raw.mqtt)?);
            }
            check_unique_binds(&all)?;
            let mut enabled = Vec::with_capacity(all.len());
            for (index, (listener, runnable)) in all.into_iter().enumerate() {
                if runnable {
                    enabled.push(listener);
                } else {
                    warnings.push(Warning::ListenerNeedsCertificate {
                        index,
                        kind: listener.kind,
                        bind: listener.bind,
                    });
                }
            }
            enabled
        }
    };
    if listeners.is_empty() {
        return Err(ConfigError::NoListeners);
    }
    let config = Config {
        node,
        listeners,
        mqtt: raw.mqtt,
        router: raw.router,
        storage: raw.storage,
        auth,
        http: raw.http,
        log: raw.log,
        cluster,
    };
    Ok((config, warnings))
}

fn validate_http(h: &HttpConfig, warnings: &mut Vec<Warning>) -> Result<(), ConfigError> {
    range("http.max_body_bytes", h.max_body_bytes, 1024, 16 << 20)?;
    range("http.max_connections", h.max_connections, 1, 10_000)?;
    range("http.workers", h.workers, 1, 16)?;
    range("http.max_rows", h.max_rows, 1, 100_000)?;
    range("http.list_cache_ms", h.list_cache_ms, 0, 60_000)?;
    if let Some(t) = &h.bearer_token {
        if t.trim().is_empty() || t.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(ConfigError::Invalid {
                key: "http.bearer_token".into(),
                problem: "must be non-empty, without spaces or control characters",
            });
        }
    }
    if h.enabled && h.bearer_token.is_none() && !h.bind.ip().is_loopback() {
        warnings.push(Warning::HttpWithoutToken { bind: h.bind });
    }
    Ok(())
}

fn validate_node(node: NodeConfig, base: Option<&Path>) -> Result<NodeConfig, ConfigError> {
    range("node.id", node.id, 1, u64::MAX)?;
    if node.name.trim().is_empty() {
        return Err(invalid("node.name", "must not be empty"));
    }
    Ok(NodeConfig {
        data_dir: resolve_file("node.data_dir", node.data_dir, base)?,
        ..node
    })
}

/// MQTT 5 uses 0xFFFF_FFFF for "never expires"; a finite cap must stay below it.
const SECS_MAX: u64 = u32::MAX as u64 - 1;

fn validate_mqtt(m: &MqttConfig) -> Result<(), ConfigError> {
    // 2 bytes is the smallest packet (PINGREQ); 268435455 is the largest Remaining Length
    // (MQTT 5 §1.5.5), a cap on the whole packet that keeps well clear of u32 overflow.
    range("mqtt.max_packet_size", m.max_packet_size, 2, 268_435_455)?;
    range("mqtt.max_inflight", m.max_inflight, 1, 65535)?;
    range(
        "mqtt.max_mqueue_len",
        m.max_mqueue_len,
        1,
        u64::from(u32::MAX),
    )?;
    range("mqtt.keepalive_max_secs", m.keepalive_max_secs, 1, 65535)?;
    if m.keepalive_min_secs > m.keepalive_max_secs {
        return Err(ConfigError::GreaterThan {
            key: "mqtt.keepalive_min_secs".to_owned(),
            value: m.keepalive_min_secs.into(),
            other_key: "mqtt.keepalive_max_secs".to_owned(),
            other_value: m.keepalive_max_secs.into(),
        });
    }
    range(
        "mqtt.session_expiry_max_secs",
        m.session_expiry_max_secs,
        0,
        SECS_MAX,
    )?;
    range(
        "mqtt.message_expiry_max_secs",
        m.message_expiry_max_secs,
        1,
        SECS_MAX,
    )?;
    // A resend more often than every second would only add load; once a day is the
    // longest that still behaves like a retry.
    range("mqtt.retry_interval_secs", m.retry_interval_secs, 1, 86_400)?;
    // Receive Maximum 0 is a protocol error (MQTT 5 §3.2.2.3.3).
    range("mqtt.receive_max", m.receive_max, 1, 65535)?;
    // MQTT 3.1.1 §3.1.3.1: the server must allow client ids of 1 to 23 bytes.
    range("mqtt.client_id_len_max", m.client_id_len_max, 23, 65535)?;
    range("mqtt.topic_levels_max", m.topic_levels_max, 1, 65535)?;
    range("mqtt.topic_len_max", m.topic_len_max, 1, 65535)?;
    range(
        "mqtt.subscriptions_max",
        m.subscriptions_max,
        1,
        u64::from(u32::MAX),
    )?;
    range("mqtt.retained_max", m.retained_max, 1, u64::MAX)?;
    range("mqtt.retained_bytes_max", m.retained_bytes_max, 1, u64::MAX)?;
    range("mqtt.max_qos", m.max_qos, 0, 2)?;
    range(
        "mqtt.delayed_publish_max",
        m.delayed_publish_max,
        1,
        u64::from(u32::MAX),
    )?;
    range("mqtt.delayed_max_secs", m.delayed_max_secs, 1, SECS_MAX)?;
    range("mqtt.sys_interval_secs", m.sys_interval_secs, 1, 86_400)?;
    range(
        "mqtt.backpressure_max_secs",
        m.backpressure_max_secs,
        1,
        3600,
    )?;
    range(
        "mqtt.backpressure_stall_secs",
        m.backpressure_stall_secs,
        1,
        3600,
    )?;
    range(
        "mqtt.backpressure_stalls_max",
        m.backpressure_stalls_max,
        1,
        1000,
    )?;
    range(
        "mqtt.backpressure_window_secs",
        m.backpressure_window_secs,
        1,
        86_400,
    )?;
    if m.response_information.as_deref() == Some("") {
        return Err(invalid(
            "mqtt.response_information",
            "must not be empty (leave it out to send none)",
        ));
    }
    Ok(())
}

fn validate_auth(a: &AuthConfig) -> Result<(), ConfigError> {
    if let Some(threads) = a.verify_threads {
        // Each verification holds 19 MiB (argon2id's m): more threads than that are memory,
        // not throughput.
        range("auth.verify_threads", threads, 1, 256)?;
    }
    range("auth.verify_queue", a.verify_queue, 1, 65535)?;
    // A client's input waits this long at most: past a minute it is a stuck client.
    range("auth.verdict_timeout_ms", a.verdict_timeout_ms, 1, 60_000)?;
    range("auth.failed_logins_max", a.failed_logins_max, 1, 1_000_000)?;
    range(
        "auth.failed_logins_window_secs",
        a.failed_logins_window_secs,
        1,
        86_400,
    )?;
    range(
        "auth.failed_login_ban_secs",
        a.failed_login_ban_secs,
        1,
        86_400,
    )?;
    Ok(())
}

const LOG_LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

fn validate_log(log: &LogConfig) -> Result<(), ConfigError> {
    let ok = !log.level.trim().is_empty()
        && log.level.split(',').all(|directive| {
            let level = directive.rsplit_once('=').map_or(directive, |(_, l)| l);
            LOG_LEVELS.contains(&level.trim().to_ascii_lowercase().as_str())
        });
    if ok {
        Ok(())
    } else {
        Err(ConfigError::BadLogLevel {
            key: "log.level".to_owned(),
            value: log.level.clone(),
        })
    }
}

/// Validates one listener; the bool says whether it can start (false: a TLS kind without
/// certificate, reported as a warning by the caller).
fn validate_listener(
    i: usize,
    l: RawListener,
    base: Option<&Path>,
    mqtt: &MqttConfig,
) -> Result<(ListenerConfig, bool), ConfigError> {
    let key = |k: &str| format!("listeners[{i}].{k}");
    let kind = l.kind;
    let bind = match &l.bind {
        None => SocketAddr::new(IpAddr::from([0, 0, 0, 0]), kind.default_port()),
        Some(s) => s.parse().map_err(|_| ConfigError::NotSocketAddr {
            key: key("bind"),
            value: s.clone(),
        })?,
    };
    let not_applicable = |k: &str, applies_to| ConfigError::NotApplicable {
        key: key(k),
        kind,
        applies_to,
    };
    if l.proxy_protocol.is_some() && !matches!(kind, ListenerKind::Tcp | ListenerKind::Tls) {
        return Err(not_applicable("proxy_protocol", "tcp and tls"));
    }
    if !kind.is_websocket() {
        if l.ws_path.is_some() {
            return Err(not_applicable("ws_path", "ws and wss"));
        }
        if l.ws_x_forwarded_for.is_some() {
            return Err(not_applicable("ws_x_forwarded_for", "ws and wss"));
        }
    }
    if kind != ListenerKind::Quic && l.idle_timeout_secs.is_some() {
        return Err(not_applicable("idle_timeout_secs", "quic"));
    }
    if !kind.needs_tls() && l.tls.is_some() {
        return Err(not_applicable("tls", "tls, wss and quic"));
    }

    let max_connections = l.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS);
    range(
        &key("max_connections"),
        max_connections,
        1,
        u64::from(u32::MAX),
    )?;
    let max_handshakes = l.max_handshakes.unwrap_or(DEFAULT_MAX_HANDSHAKES);
    range(
        &key("max_handshakes"),
        max_handshakes,
        1,
        u64::from(u32::MAX),
    )?;
    let handshake_timeout_secs = l
        .handshake_timeout_secs
        .unwrap_or(DEFAULT_HANDSHAKE_TIMEOUT_SECS);
    // An hour is already far past any real handshake; longer only holds slots for attackers.
    range(
        &key("handshake_timeout_secs"),
        handshake_timeout_secs,
        1,
        3600,
    )?;

    // Left out, the defaults shrink to fit a smaller `mqtt.max_packet_size`; set, they
    // must fit.
    let max_connect_packet_size = match l.max_connect_packet_size {
        None => DEFAULT_MAX_CONNECT_PACKET_SIZE.min(mqtt.max_packet_size),
        Some(v) => {
            // Below the first read buffer nothing is saved, and real CONNECTs get refused.
            range(&key("max_connect_packet_size"), v, 256, 268_435_455)?;
            if v > mqtt.max_packet_size {
                return Err(ConfigError::GreaterThan {
                    key: key("max_connect_packet_size"),
                    value: v.into(),
                    other_key: "mqtt.max_packet_size".to_owned(),
                    other_value: mqtt.max_packet_size.into(),
                });
            }
            v
        }
    };
    let connect_read_budget_bytes = match l.connect_read_budget_bytes {
        None => DEFAULT_CONNECT_READ_BUDGET_BYTES.max(max_connect_packet_size.into()),
        Some(v) => {
            // A budget below one maximal CONNECT would make such a CONNECT wait forever.
            range(
                &key("connect_read_budget_bytes"),
                v,
                max_connect_packet_size.into(),
                1 << 40,
            )?;
            v
        }
    };

    let ws = kind
        .is_websocket()
        .then(|| -> Result<WsConfig, ConfigError> {
            let path = l.ws_path.unwrap_or_else(|| DEFAULT_WS_PATH.to_owned());
            if !path.starts_with('/') {
                return Err(invalid(&key("ws_path"), "must start with '/'"));
            }
            Ok(WsConfig {
                path,
                x_forwarded_for: l.ws_x_forwarded_for.unwrap_or(false),
            })
        })
        .transpose()?;
    let quic = (kind == ListenerKind::Quic)
        .then(|| -> Result<QuicConfig, ConfigError> {
            let idle_timeout_secs = l
                .idle_timeout_secs
                .unwrap_or(DEFAULT_QUIC_IDLE_TIMEOUT_SECS);
            range(&key("idle_timeout_secs"), idle_timeout_secs, 1, 3600)?;
            Ok(QuicConfig { idle_timeout_secs })
        })
        .transpose()?;

    let mut runnable = true;
    let tls = if kind.needs_tls() {
        let raw = l.tls.unwrap_or_default();
        let ca_file = raw
            .ca_file
            .map(|p| resolve_file(&key("tls.ca_file"), p, base))
            .transpose()?;
        let verify_client = raw.verify_client.unwrap_or(false);
        let cn_as_username = raw.cn_as_username.unwrap_or(false);
        if verify_client && ca_file.is_none() {
            return Err(invalid(
                &key("tls.verify_client"),
                "requires tls.ca_file (the CA that client certificates are checked against)",
            ));
        }
        if cn_as_username && !verify_client {
            return Err(invalid(
                &key("tls.cn_as_username"),
                "requires tls.verify_client = true (an unverified CN proves nothing)",
            ));
        }
        match (raw.cert_file, raw.key_file) {
            (Some(cert), Some(key_file)) => Some(TlsConfig {
                cert_file: resolve_file(&key("tls.cert_file"), cert, base)?,
                key_file: resolve_file(&key("tls.key_file"), key_file, base)?,
                ca_file,
                verify_client,
                cn_as_username,
            }),
            // One without the other is a mistake, not a first run without certificates.
            (Some(_), None) => {
                return Err(invalid(
                    &key("tls.key_file"),
                    "missing (tls.cert_file is set)",
                ))
            }
            (None, Some(_)) => {
                return Err(invalid(
                    &key("tls.cert_file"),
                    "missing (tls.key_file is set)",
                ))
            }
            (None, None) => {
                runnable = false;
                None
            }
        }
    } else {
        None
    };

    let listener = ListenerConfig {
        kind,
        bind,
        max_connections,
        max_handshakes,
        handshake_timeout_secs,
        max_connect_packet_size,
        connect_read_budget_bytes,
        allow_anonymous: l.allow_anonymous.unwrap_or(true),
        proxy_protocol: l.proxy_protocol.unwrap_or(false),
        tls,
        ws,
        quic,
    };
    Ok((listener, runnable))
}

/// Two listeners clash when they use the same transport protocol (TCP or UDP) and port,
/// and the same address or either is unspecified (`0.0.0.0`/`[::]` takes the port on
/// every address).
fn check_unique_binds(all: &[(ListenerConfig, bool)]) -> Result<(), ConfigError> {
    for (i, (a, _)) in all.iter().enumerate() {
        for (j, (b, _)) in all.iter().enumerate().take(i) {
            let clash = a.kind.is_udp() == b.kind.is_udp()
                && a.bind.port() == b.bind.port()
                && (a.bind.ip() == b.bind.ip()
                    || a.bind.ip().is_unspecified()
                    || b.bind.ip().is_unspecified());
            if clash {
                return Err(ConfigError::DuplicateBind {
                    key: format!("listeners[{i}].bind"),
                    addr: a.bind,
                    other: j,
                    other_addr: b.bind,
                });
            }
        }
    }
    Ok(())
}

fn resolve_file(key: &str, path: PathBuf, base: Option<&Path>) -> Result<PathBuf, ConfigError> {
    if path.as_os_str().is_empty() {
        return Err(invalid(key, "must not be empty"));
    }
    Ok(match base {
        Some(base) if path.is_relative() => base.join(path),
        _ => path,
    })
}

pub(crate) fn range(
    key: &str,
    value: impl Into<u64>,
    min: u64,
    max: u64,
) -> Result<(), ConfigError> {
    let value = value.into();
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(ConfigError::OutOfRange {
            key: key.to_owned(),
            value,
            min,
            max,
        })
    }
}

fn invalid(key: &str, problem: &'static str) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_owned(),
        problem,
    }
}

// --- [cluster] ---

fn bad(key: &str, message: String) -> ConfigError {
    ConfigError::BadValue {
        key: key.to_owned(),
        message,
    }
}

fn validate_cluster(
    raw: RawCluster,
    node_id: u64,
    base: Option<&Path>,
) -> Result<ClusterConfig, ConfigError> {
    range("cluster.tick_ms", raw.tick_ms, 10, 10_000)?;
    range("cluster.election_tick", raw.election_tick, 5, 1000)?;
    range(
        "cluster.outbox_max_messages",
        raw.outbox_max_messages,
        0,
        10_000_000,
    )?;
    range(
        "cluster.forward_window_messages",
        raw.forward_window_messages,
        0,
        1_000_000,
    )?;
    range(
        "cluster.forward_timeout_ms",
        raw.forward_timeout_ms,
        100,
        600_000,
    )?;
    range(
        "cluster.snapshot_entries",
        raw.snapshot_entries,
        10,
        10_000_000,
    )?;
    let mut peers = BTreeMap::new();
    for (id, addr) in &raw.peers {
        let key = format!("cluster.peers.{id}");
        let id: u64 = id
            .parse()
            .ok()
            .filter(|id| *id != 0)
            .ok_or_else(|| bad(&key, format!("`{id}` is not a node id (an integer from 1)")))?;
        let addr: SocketAddr = addr
            .parse()
            .map_err(|_| bad(&key, format!("`{addr}` is not a host:port address")))?;
        if let Some((other, _)) = peers.iter().find(|(_, a)| **a == addr) {
            return Err(bad(&key, format!("{addr} is also node {other}'s address")));
        }
        peers.insert(id, addr);
    }
    let certs_dir = match base {
        Some(base) if raw.certs_dir.is_relative() => base.join(&raw.certs_dir),
        _ => raw.certs_dir.clone(),
    };
    let own = peers.get(&node_id).copied();
    if raw.enabled {
        if peers.is_empty() {
            return Err(bad(
                "cluster.peers",
                "lists no member; a cluster needs every member's id and address".into(),
            ));
        }
        if raw.bootstrap && own.is_none() {
            return Err(bad(
                "cluster.bootstrap",
                format!(
                    "this node (node.id = {node_id}) bootstraps but is not among cluster.peers"
                ),
            ));
        }
        if own.is_none() && raw.bind.is_none() {
            return Err(bad(
                "cluster.peers",
                format!(
                    "has no entry for this node (node.id = {node_id}) and cluster.bind is not set"
                ),
            ));
        }
    }
    Ok(ClusterConfig {
        enabled: raw.enabled,
        bind: raw
            .bind
            .or(own)
            .unwrap_or_else(|| ClusterConfig::default().bind),
        certs_dir,
        peers,
        bootstrap: raw.bootstrap,
        advertise_mqtt: raw.advertise_mqtt,
        tick_ms: raw.tick_ms,
        election_tick: raw.election_tick,
        fsync: raw.fsync,
        retained_reads: raw.retained_reads,
        reconnect_reads: raw.reconnect_reads,
        forward_confirm: raw.forward_confirm,
        handover_relay: raw.handover_relay,
        handover_order: raw.handover_order,
        handover_relay_wait: raw.handover_relay_wait,
        raft_priority: raw.raft_priority,
        outbox_max_messages: raw.outbox_max_messages,
        forward_window_messages: raw.forward_window_messages,
        forward_timeout_ms: raw.forward_timeout_ms,
        snapshot_entries: raw.snapshot_entries,
    })
}
