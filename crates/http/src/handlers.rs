//! Nodes, clients and publish: RMQTT's paths and JSON fields (docs/http-api.md).

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use starling_broker::{AdminPublish, ClientInfo};
use starling_codec::{PayloadFormat, Properties, QoS};

use crate::reply::{error, other_node, present, resource};
use crate::when::{format_utc, parse_when};
use crate::ApiState;

type State = web::Data<ApiState>;

/// The endpoints, as `GET /api/v1` lists them.
const ENDPOINTS: &[(&str, &str, &str)] = &[
    ("GET", "/api/v1", "this list"),
    (
        "GET",
        "/api/v1/openapi.json",
        "the OpenAPI 3 document of this API",
    ),
    ("GET", "/api/v1/brokers", "broker information of each node"),
    (
        "GET",
        "/api/v1/brokers/{id}",
        "broker information of one node",
    ),
    ("GET", "/api/v1/nodes", "node status of each node"),
    ("GET", "/api/v1/nodes/{id}", "node status of one node"),
    ("GET", "/api/v1/health/check", "whether the broker runs"),
    (
        "GET",
        "/api/v1/cluster",
        "this node's view of the cluster: members, their health, the leader",
    ),
    (
        "POST",
        "/api/v1/cluster/members",
        "add a node to the cluster (on the leader): `starling cluster join`",
    ),
    (
        "POST",
        "/api/v1/cluster/leave",
        "this node leaves the cluster, then stops: `starling cluster leave`",
    ),
    ("GET", "/api/v1/clients", "clients, searched"),
    ("GET", "/api/v1/clients/{clientid}", "one client"),
    (
        "DELETE",
        "/api/v1/clients/{clientid}",
        "kick a client and discard its session",
    ),
    (
        "GET",
        "/api/v1/clients/{clientid}/online",
        "whether a client is connected",
    ),
    ("POST", "/api/v1/mqtt/publish", "publish a message"),
    (
        "POST",
        "/api/v1/mqtt/subscribe",
        "subscribe a connected client to filters",
    ),
    (
        "POST",
        "/api/v1/mqtt/unsubscribe",
        "unsubscribe a connected client from a filter",
    ),
    ("GET", "/api/v1/subscriptions", "subscriptions, searched"),
    (
        "GET",
        "/api/v1/subscriptions/{clientid}",
        "one client's subscriptions",
    ),
    (
        "GET",
        "/api/v1/routes",
        "the filters subscribed on each node",
    ),
    (
        "GET",
        "/api/v1/routes/{topic}",
        "the filters that match a topic",
    ),
    ("GET", "/api/v1/retains", "retained messages, paged"),
    (
        "DELETE",
        "/api/v1/retains?topic=",
        "delete one topic's retained message",
    ),
    ("GET", "/api/v1/stats", "state counts of each node"),
    ("GET", "/api/v1/stats/{id}", "state counts of one node"),
    (
        "GET",
        "/api/v1/stats/sum",
        "state counts summed over the nodes",
    ),
    ("GET", "/api/v1/metrics", "counters of each node"),
    ("GET", "/api/v1/metrics/{id}", "counters of one node"),
    (
        "GET",
        "/api/v1/metrics/sum",
        "counters summed over the nodes",
    ),
    (
        "GET",
        "/api/v1/metrics/prometheus",
        "counters in Prometheus text format",
    ),
    (
        "GET",
        "/api/v1/metrics/prometheus/sum",
        "summed counters in Prometheus text format",
    ),
    (
        "GET",
        "/api/v1/plugins",
        "the hook chain's providers (RMQTT's plugins) of each node",
    ),
    ("GET", "/api/v1/plugins/{node}", "the providers of one node"),
    ("GET", "/api/v1/plugins/{node}/{plugin}", "one provider"),
    (
        "GET",
        "/api/v1/plugins/{node}/{plugin}/config",
        "one provider's settings",
    ),
    (
        "PUT",
        "/api/v1/plugins/{node}/{plugin}/config/reload",
        "refused (409): providers are fixed at start-up",
    ),
    (
        "PUT",
        "/api/v1/plugins/{node}/{plugin}/load",
        "refused (409): providers are fixed at start-up",
    ),
    (
        "PUT",
        "/api/v1/plugins/{node}/{plugin}/unload",
        "refused (409): providers are fixed at start-up",
    ),
];

pub(crate) fn routes(cfg: &mut web::ServiceConfig) {
    let get = web::get;
    cfg.service(resource("", "GET").route(get().to(list)))
        .service(resource("/openapi.json", "GET").route(get().to(openapi)))
        .service(resource("/brokers", "GET").route(get().to(brokers)))
        .service(resource("/brokers/{id}", "GET").route(get().to(broker)))
        .service(resource("/nodes", "GET").route(get().to(nodes)))
        .service(resource("/nodes/{id}", "GET").route(get().to(node)))
        .service(resource("/health/check", "GET").route(get().to(health)))
        .service(resource("/clients", "GET").route(get().to(clients)))
        .service(
            resource("/clients/{clientid}", "GET, DELETE")
                .route(get().to(client))
                .route(web::delete().to(kick)),
        )
        .service(resource("/clients/{clientid}/online", "GET").route(get().to(online)))
        .service(resource("/mqtt/publish", "POST").route(web::post().to(publish)));
}

async fn list() -> HttpResponse {
    let all: Vec<Value> = ENDPOINTS
        .iter()
        .map(|(method, path, descr)| json!({"name": path, "method": method, "path": path, "descr": descr}))
        .collect();
    HttpResponse::Ok().json(all)
}

/// The OpenAPI document of every endpoint, written from this code and checked against the
/// running server by a schemathesis run (crates/starling/tests/http_fuzz.rs).
pub(crate) const OPENAPI: &str = include_str!("../openapi.json");

async fn openapi() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(OPENAPI)
}

fn uptime(s: &ApiState) -> String {
    let secs = unix_now().saturating_sub(started_secs(s));
    format!(
        "{} days {} hours, {} minutes, {} seconds",
        secs / 86_400,
        secs % 86_400 / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

fn version() -> String {
    format!("starling/{}", env!("CARGO_PKG_VERSION"))
}

fn broker_info(s: &ApiState) -> Value {
    json!({
        "version": version(),
        "uptime": uptime(s),
        "sysdescr": "Starling MQTT Broker",
        "running": true,
        "node_id": s.admin.node_id(),
        "node_name": s.admin.node_name(),
        "datetime": format_utc(unix_now()),
    })
}

pub(crate) fn unix_now() -> u64 {
    starling_rt::time::unix_secs()
}

fn started_secs(s: &ApiState) -> u64 {
    s.admin
        .started()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn brokers(s: State) -> HttpResponse {
    HttpResponse::Ok().json([broker_info(&s)])
}

async fn broker(s: State, id: web::Path<String>) -> HttpResponse {
    other_node(&s, &id).unwrap_or_else(|| HttpResponse::Ok().json(broker_info(&s)))
}

/// `/proc/loadavg` and `/proc/meminfo` where the system has them (Linux); left out where
/// it does not.
fn system_load(out: &mut serde_json::Map<String, Value>) {
    if let Ok(l) = std::fs::read_to_string("/proc/loadavg") {
        let v: Vec<f64> = l
            .split_whitespace()
            .take(3)
            .filter_map(|x| x.parse().ok())
            .collect();
        if let [l1, l5, l15] = v[..] {
            out.insert("load1".into(), json!(l1));
            out.insert("load5".into(), json!(l5));
            out.insert("load15".into(), json!(l15));
        }
    }
    if let Ok(m) = std::fs::read_to_string("/proc/meminfo") {
        let kb = |key: &str| {
            m.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
                .map(|v| v * 1024)
        };
        if let (Some(total), Some(avail)) = (kb("MemTotal:"), kb("MemAvailable:")) {
            out.insert("memory_total".into(), json!(total));
            out.insert("memory_free".into(), json!(avail));
            out.insert("memory_used".into(), json!(total.saturating_sub(avail)));
        }
    }
}

fn node_info(s: &ApiState) -> Value {
    let mut m = serde_json::Map::new();
    m.insert(
        "connections".into(),
        json!(s.admin.metrics().clients_connected),
    );
    m.insert(
        "boottime".into(),
        json!(format_utc(
            s.admin
                .started()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        )),
    );
    system_load(&mut m);
    m.insert("running".into(), json!(true));
    m.insert("node_id".into(), json!(s.admin.node_id()));
    m.insert("node_name".into(), json!(s.admin.node_name()));
    m.insert("uptime".into(), json!(uptime(s)));
    m.insert("version".into(), json!(version()));
    Value::Object(m)
}

async fn nodes(s: State) -> HttpResponse {
    HttpResponse::Ok().json([node_info(&s)])
}

async fn node(s: State, id: web::Path<String>) -> HttpResponse {
    other_node(&s, &id).unwrap_or_else(|| HttpResponse::Ok().json(node_info(&s)))
}

async fn health(s: State) -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "running": true,
        "nodes": [{"node_id": s.admin.node_id(), "running": true}],
    }))
}

/// A client as `GET /clients` shows it, in RMQTT's fields; serialized straight from the
/// broker's `ClientInfo` (a listing renders thousands of them a second when polled).
#[derive(Serialize)]
struct ClientRow<'a> {
    node_id: u64,
    clientid: &'a str,
    /// `""` when anonymous.
    username: &'a str,
    superuser: bool,
    proto_ver: Option<u8>,
    ip_address: Option<std::net::IpAddr>,
    port: Option<u16>,
    connected: bool,
    /// `""` while offline.
    connected_at: String,
    keepalive: u16,
    clean_start: bool,
    expiry_interval: u32,
    subscriptions_cnt: usize,
    inflight: usize,
    max_inflight: usize,
    mqueue_len: usize,
    max_mqueue: usize,
}

fn client_row<'a>(s: &ApiState, c: &'a ClientInfo) -> ClientRow<'a> {
    ClientRow {
        node_id: s.admin.node_id(),
        clientid: &c.client_id,
        username: c.username.as_deref().unwrap_or(""),
        superuser: false,
        proto_ver: c.proto_ver,
        ip_address: c.peer.map(|p| p.ip()),
        port: c.peer.map(|p| p.port()),
        connected: c.connected,
        connected_at: c.connected_at.map(format_utc).unwrap_or_default(),
        keepalive: c.keepalive,
        clean_start: c.clean_start,
        expiry_interval: c.expiry_interval,
        subscriptions_cnt: c.subscriptions,
        inflight: c.inflight,
        max_inflight: c.max_inflight,
        mqueue_len: c.mqueue_len,
        max_mqueue: c.max_mqueue,
    }
}

/// `GET /clients` search: every given condition must hold. Other parameters are ignored,
/// as RMQTT does.
#[derive(Debug, Default, Deserialize)]
struct ClientSearch {
    _limit: Option<usize>,
    clientid: Option<String>,
    username: Option<String>,
    ip_address: Option<String>,
    connected: Option<bool>,
    clean_start: Option<bool>,
    proto_ver: Option<u8>,
    _like_clientid: Option<String>,
    _like_username: Option<String>,
    _gte_connected_at: Option<String>,
    _lte_connected_at: Option<String>,
    _gte_mqueue_len: Option<usize>,
    _lte_mqueue_len: Option<usize>,
}

impl ClientSearch {
    fn matches(&self, c: &ClientInfo, gte: Option<u64>, lte: Option<u64>) -> bool {
        let user = c.username.as_deref().unwrap_or("");
        self.clientid.as_ref().is_none_or(|v| *v == c.client_id)
            && self.username.as_ref().is_none_or(|v| v == user)
            && self
                .ip_address
                .as_ref()
                .is_none_or(|v| c.peer.is_some_and(|p| p.ip().to_string() == *v))
            && self.connected.is_none_or(|v| v == c.connected)
            && self.clean_start.is_none_or(|v| v == c.clean_start)
            && self.proto_ver.is_none_or(|v| Some(v) == c.proto_ver)
            && self
                ._like_clientid
                .as_ref()
                .is_none_or(|v| c.client_id.contains(v.as_str()))
            && self
                ._like_username
                .as_ref()
                .is_none_or(|v| user.contains(v.as_str()))
            && gte.is_none_or(|t| c.connected_at.is_some_and(|at| at >= t))
            && lte.is_none_or(|t| c.connected_at.is_some_and(|at| at <= t))
            && self._gte_mqueue_len.is_none_or(|n| c.mqueue_len >= n)
            && self._lte_mqueue_len.is_none_or(|n| c.mqueue_len <= n)
    }
}

async fn clients(s: State, q: web::Query<ClientSearch>) -> HttpResponse {
    let when = |v: &Option<String>, key: &str| match v.as_deref().filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) => parse_when(v)
            .map(Some)
            .ok_or_else(|| format!("{key}: not Unix seconds or \"YYYY-MM-DD HH:MM:SS\" (UTC)")),
    };
    let (gte, lte) = match (
        when(&q._gte_connected_at, "_gte_connected_at"),
        when(&q._lte_connected_at, "_lte_connected_at"),
    ) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => return bad(e),
    };
    let limit = q
        ._limit
        .filter(|&n| n > 0 && n <= s.max_rows)
        .unwrap_or(s.max_rows);
    let listed = match &q.clientid {
        // The one client: one ask, not a scan.
        Some(id) => s
            .admin
            .client(id)
            .await
            .into_iter()
            .collect::<std::sync::Arc<[_]>>(),
        None => s.admin.clients().await,
    };
    let found: Vec<ClientRow<'_>> = listed
        .iter()
        .filter(|c| q.matches(c, gte, lte))
        .take(limit)
        .map(|c| client_row(&s, c))
        .collect();
    HttpResponse::Ok().json(found)
}

async fn client(s: State, id: web::Path<String>) -> HttpResponse {
    match s.admin.client(&id).await {
        Some(c) => HttpResponse::Ok().json(client_row(&s, &c)),
        None => error(
            StatusCode::NOT_FOUND,
            format_args!("no session for client {id:?}"),
        ),
    }
}

async fn kick(s: State, id: web::Path<String>) -> HttpResponse {
    match s.admin.kick(&id).await {
        Some(c) => HttpResponse::Ok().json(json!({
            "node": s.admin.node_id(),
            "ipaddress": c.peer.map(|p| p.to_string()),
            "clientid": c.client_id,
            "username": c.username.as_deref().unwrap_or(""),
        })),
        None => error(
            StatusCode::NOT_FOUND,
            format_args!("no session for client {id:?}"),
        ),
    }
}

async fn online(s: State, id: web::Path<String>) -> HttpResponse {
    let on = s.admin.client(&id).await.is_some_and(|c| c.connected);
    HttpResponse::Ok().json(on)
}

/// `POST /mqtt/publish`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PublishBody {
    #[serde(default, deserialize_with = "present")]
    topic: Option<String>,
    /// Comma-separated, each trimmed; `topic` joins them.
    #[serde(default, deserialize_with = "present")]
    topics: Option<String>,
    /// Accepted for RMQTT's scripts; the message is the broker's own.
    #[serde(default, deserialize_with = "present")]
    #[allow(dead_code)]
    clientid: Option<String>,
    payload: String,
    #[serde(default, deserialize_with = "present")]
    encoding: Option<String>,
    #[serde(default)]
    qos: u8,
    #[serde(default)]
    retain: bool,
    #[serde(default, deserialize_with = "present")]
    properties: Option<PublishProperties>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PublishProperties {
    #[serde(default, deserialize_with = "present")]
    message_expiry_interval: Option<u32>,
    #[serde(default, deserialize_with = "present")]
    payload_format_indicator: Option<u8>,
    #[serde(default, deserialize_with = "present")]
    content_type: Option<String>,
    #[serde(default, deserialize_with = "present")]
    response_topic: Option<String>,
    /// Base64.
    #[serde(default, deserialize_with = "present")]
    correlation_data: Option<String>,
    /// An object of name → value, or a list of `[name, value]` pairs (order and repeats
    /// kept).
    #[serde(default, deserialize_with = "present")]
    user_properties: Option<UserProperties>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum UserProperties {
    Pairs(Vec<(String, String)>),
    Map(serde_json::Map<String, Value>),
}

fn bad(msg: impl std::fmt::Display) -> HttpResponse {
    error(StatusCode::BAD_REQUEST, msg)
}

async fn publish(s: State, body: web::Json<PublishBody>) -> HttpResponse {
    let b = body.into_inner();
    let mut topics: Vec<String> = b
        .topics
        .as_deref()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect();
    topics.extend(b.topic);
    if topics.is_empty() {
        return bad("topic or topics is required");
    }
    let qos = match b.qos {
        0 => QoS::AtMostOnce,
        1 => QoS::AtLeastOnce,
        2 => QoS::ExactlyOnce,
        n => return bad(format_args!("qos: {n} is not 0, 1 or 2")),
    };
    let b64 = base64::engine::general_purpose::STANDARD;
    let payload = match b
        .encoding
        .as_deref()
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        None | Some("plain") => bytes::Bytes::from(b.payload),
        Some("base64") => match b64.decode(b.payload.as_bytes()) {
            Ok(p) => bytes::Bytes::from(p),
            Err(e) => return bad(format_args!("payload: not base64: {e}")),
        },
        Some(other) => return bad(format_args!("encoding: {other:?} is not plain or base64")),
    };
    let p = b.properties.unwrap_or_default();
    let payload_format_indicator = match p.payload_format_indicator {
        None => None,
        Some(0) => Some(PayloadFormat::Unspecified),
        Some(1) => Some(PayloadFormat::Utf8),
        Some(n) => return bad(format_args!("payload_format_indicator: {n} is not 0 or 1")),
    };
    let correlation_data = match p.correlation_data.map(|c| b64.decode(c.as_bytes())) {
        None => None,
        Some(Ok(c)) => Some(bytes::Bytes::from(c)),
        Some(Err(e)) => return bad(format_args!("correlation_data: not base64: {e}")),
    };
    let user_properties = match p.user_properties {
        None => Vec::new(),
        Some(UserProperties::Pairs(v)) => v,
        Some(UserProperties::Map(m)) => {
            let mut v = Vec::with_capacity(m.len());
            for (k, val) in m {
                match val {
                    Value::String(s) => v.push((k, s)),
                    _ => return bad(format_args!("user_properties.{k}: not a string")),
                }
            }
            v
        }
    };
    let properties = Properties {
        payload_format_indicator,
        content_type: p.content_type,
        response_topic: p.response_topic,
        correlation_data,
        user_properties,
        ..Properties::default()
    };
    for topic in topics {
        let msg = AdminPublish {
            topic,
            payload: payload.clone(),
            qos,
            retain: b.retain,
            expiry_secs: p.message_expiry_interval,
            properties: properties.clone(),
        };
        if let Err(e) = s.admin.publish(msg).await {
            return bad(e);
        }
    }
    HttpResponse::Ok()
        .content_type("text/plain; charset=utf-8")
        .body("ok")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::{ENDPOINTS, OPENAPI};

    /// The served list and the document name the same endpoints: neither drifts.
    #[test]
    fn the_openapi_document_has_every_listed_endpoint_and_no_other() {
        let doc: serde_json::Value = serde_json::from_str(OPENAPI).expect("JSON");
        assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"));
        let mut documented = BTreeSet::new();
        for (path, ops) in doc["paths"].as_object().expect("paths") {
            for method in ops.as_object().expect("operations").keys() {
                documented.insert((method.to_uppercase(), path.clone()));
            }
        }
        let listed: BTreeSet<_> = ENDPOINTS
            .iter()
            .map(|(m, p, _)| (m.to_string(), p.split('?').next().unwrap().to_owned()))
            .collect();
        assert_eq!(documented, listed);
    }
}
