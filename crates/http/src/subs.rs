//! Subscriptions, routes and retained messages (docs/http-api.md).

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Value};
use starling_broker::ClientSubscriptions;
use starling_codec::{QoS, SubscriptionOptions};
use starling_router::{filter_matches, parse_subscription, Extension, TopicLimits};

use crate::reply::{error, resource};
use crate::ApiState;

type State = web::Data<ApiState>;

pub(crate) fn routes(cfg: &mut web::ServiceConfig) {
    let get = web::get;
    cfg.service(resource("/subscriptions", "GET").route(get().to(subscriptions)))
        .service(resource("/subscriptions/{clientid}", "GET").route(get().to(client_subscriptions)))
        .service(resource("/routes", "GET").route(get().to(routes_list)))
        .service(resource("/routes/{topic:.*}", "GET").route(get().to(routes_for)))
        .service(
            resource("/retains", "GET, DELETE")
                .route(get().to(retains))
                .route(web::delete().to(delete_retain)),
        );
}

fn qos_level(q: QoS) -> u8 {
    match q {
        QoS::AtMostOnce => 0,
        QoS::AtLeastOnce => 1,
        QoS::ExactlyOnce => 2,
    }
}

/// One subscription as RMQTT shows it: the plain filter as `topic`, what its prefix said
/// in `opts` (`group` for `$share/`, `limit_subs` for `$limit/`, `exclusive` for
/// `$exclusive/`), and the MQTT 5 options for a 5.0 client.
struct Sub<'a> {
    topic: &'a str,
    group: Option<&'a str>,
    opts: Value,
}

fn sub<'a>(raw: &'a str, o: &SubscriptionOptions, id: Option<u32>, v5: bool) -> Sub<'a> {
    // Filters in a session were validated when subscribed; the loosest limits re-read them.
    let limits = TopicLimits {
        topic_len_max: usize::MAX,
        topic_levels_max: usize::MAX,
    };
    let (topic, ext) = match parse_subscription(raw, &limits) {
        Ok(p) => (p.filter, p.extension),
        Err(_) => (raw, Extension::Plain),
    };
    let mut opts = serde_json::Map::new();
    opts.insert("qos".into(), json!(qos_level(o.qos)));
    let mut group = None;
    match ext {
        Extension::Plain => {}
        Extension::Shared { group: g } => {
            opts.insert("group".into(), json!(g));
            group = Some(g);
        }
        Extension::Exclusive => {
            opts.insert("exclusive".into(), json!(true));
        }
        Extension::Limit { max } => {
            opts.insert("limit_subs".into(), json!(max));
        }
    }
    if v5 {
        opts.insert("no_local".into(), json!(o.no_local));
        opts.insert("retain_as_published".into(), json!(o.retain_as_published));
        opts.insert("retain_handling".into(), json!(o.retain_handling as u8));
        if let Some(id) = id {
            opts.insert("id".into(), json!(id));
        }
    }
    Sub {
        topic,
        group,
        opts: Value::Object(opts),
    }
}

/// `GET /subscriptions` search; other parameters are ignored, as RMQTT does.
#[derive(Debug, Default, Deserialize)]
struct SubSearch {
    _limit: Option<usize>,
    clientid: Option<String>,
    /// The exact filter (without its prefix).
    topic: Option<String>,
    qos: Option<u8>,
    /// The shared group.
    share: Option<String>,
    /// A topic name: the subscriptions whose filter matches it.
    _match_topic: Option<String>,
}

fn sub_rows(s: &ApiState, all: &[ClientSubscriptions], q: &SubSearch, limit: usize) -> Vec<Value> {
    let mut rows = Vec::new();
    for c in all {
        if q.clientid.as_ref().is_some_and(|id| *id != c.client_id) {
            continue;
        }
        for (raw, o, id) in &c.filters {
            let v = sub(raw, o, *id, c.proto_ver == Some(5));
            let keep = q.topic.as_ref().is_none_or(|t| t == v.topic)
                && q._match_topic
                    .as_ref()
                    .is_none_or(|t| filter_matches(v.topic, t))
                && q.qos.is_none_or(|n| n == qos_level(o.qos))
                && q.share.as_ref().is_none_or(|g| Some(g.as_str()) == v.group);
            if !keep {
                continue;
            }
            if rows.len() == limit {
                return rows;
            }
            rows.push(json!({
                "node_id": s.admin.node_id(),
                "clientid": c.client_id,
                "client_addr": c.peer.map(|p| p.to_string()),
                "topic": v.topic,
                "opts": v.opts,
            }));
        }
    }
    rows
}

fn limit_of(s: &ApiState, asked: Option<usize>) -> usize {
    asked
        .filter(|&n| n > 0 && n <= s.max_rows)
        .unwrap_or(s.max_rows)
}

async fn subscriptions(s: State, q: web::Query<SubSearch>) -> HttpResponse {
    let limit = limit_of(&s, q._limit);
    let all: std::sync::Arc<[_]> = match &q.clientid {
        Some(id) => s.admin.client_subscriptions(id).await.into_iter().collect(),
        None => s.admin.subscriptions().await,
    };
    HttpResponse::Ok().json(sub_rows(&s, &all, &q, limit))
}

async fn client_subscriptions(s: State, id: web::Path<String>) -> HttpResponse {
    match s.admin.client_subscriptions(&id).await {
        Some(c) => HttpResponse::Ok().json(sub_rows(
            &s,
            std::slice::from_ref(&c),
            &SubSearch::default(),
            usize::MAX,
        )),
        None => error(
            StatusCode::NOT_FOUND,
            format_args!("no session for client {id:?}"),
        ),
    }
}

/// The routes (`[{node_id, topic}]`): in a cluster, the replicated route table as this
/// node applied it (each filter with every node that has subscribers for it); alone, the
/// distinct filters subscribed on this node, each once.
async fn route_rows(s: &ApiState, topic: Option<&str>, limit: usize) -> Vec<Value> {
    if s.admin.is_clustered() {
        return s
            .admin
            .cluster_routes()
            .await
            .into_iter()
            .filter(|(f, _)| topic.is_none_or(|t| filter_matches(f, t)))
            .flat_map(|(f, nodes)| {
                nodes
                    .into_iter()
                    .map(move |n| json!({"node_id": n, "topic": f.clone()}))
            })
            .take(limit)
            .collect();
    }
    let mut filters = std::collections::BTreeSet::new();
    for c in s.admin.subscriptions().await.iter() {
        for (raw, o, id) in &c.filters {
            filters.insert(sub(raw, o, *id, false).topic.to_owned());
        }
    }
    filters
        .into_iter()
        .filter(|f| topic.is_none_or(|t| filter_matches(f, t)))
        .take(limit)
        .map(|f| json!({"node_id": s.admin.node_id(), "topic": f}))
        .collect()
}

#[derive(Debug, Default, Deserialize)]
struct Limit {
    _limit: Option<usize>,
}

async fn routes_list(s: State, q: web::Query<Limit>) -> HttpResponse {
    let limit = match q._limit {
        Some(0) => 0,
        other => limit_of(&s, other),
    };
    HttpResponse::Ok().json(route_rows(&s, None, limit).await)
}

async fn routes_for(s: State, topic: web::Path<String>) -> HttpResponse {
    if topic.is_empty() || topic.contains(['+', '#']) {
        return error(StatusCode::BAD_REQUEST, "a topic name, without wildcards");
    }
    HttpResponse::Ok().json(route_rows(&s, Some(&topic), s.max_rows).await)
}

#[derive(Debug, Default, Deserialize)]
struct RetainQuery {
    topic_filter: Option<String>,
    offset: Option<usize>,
    limit: Option<usize>,
}

async fn retains(s: State, q: web::Query<RetainQuery>) -> HttpResponse {
    let filter = q
        .topic_filter
        .as_deref()
        .filter(|f| !f.is_empty())
        .unwrap_or("#");
    let limit = limit_of(&s, q.limit);
    match s.admin.retained(filter, q.offset.unwrap_or(0), limit).await {
        Ok((items, has_more)) => {
            let b64 = base64::engine::general_purpose::STANDARD;
            let items: Vec<Value> = items
                .iter()
                .map(|m| {
                    json!({
                        "topic": &*m.topic,
                        "publish": {
                            "topic": &*m.topic,
                            "qos": qos_level(m.qos),
                            "retain": true,
                            "payload": b64.encode(&m.payload),
                        },
                        "client_id": m.publisher.as_deref(),
                    })
                })
                .collect();
            HttpResponse::Ok().json(json!({"items": items, "has_more": has_more}))
        }
        Err(e) => error(StatusCode::BAD_REQUEST, e),
    }
}

#[derive(Debug, Deserialize)]
struct TopicQuery {
    topic: Option<String>,
}

async fn delete_retain(s: State, q: web::Query<TopicQuery>) -> HttpResponse {
    // As is: spaces (and other white space) are part of a topic name (MQTT 4.7.3).
    let Some(topic) = q.topic.as_deref().filter(|t| !t.is_empty()) else {
        return error(StatusCode::BAD_REQUEST, "topic is required");
    };
    match s.admin.delete_retained(topic).await {
        Ok(true) => HttpResponse::Ok()
            .content_type("text/plain; charset=utf-8")
            .body("ok"),
        Ok(false) => error(
            StatusCode::NOT_FOUND,
            format_args!("no retained message on {topic:?}"),
        ),
        Err(e) => error(StatusCode::BAD_REQUEST, e),
    }
}
