//! `GET /api/v1/cluster`: this node's view of the raft cluster (not an RMQTT path; RMQTT
//! has no equivalent). What `starling cluster status` prints. A node alone answers too,
//! with `enabled: false`. `POST /api/v1/cluster/members` (on the leader) adds a node and
//! `POST /api/v1/cluster/leave` has this node leave: what `starling cluster join` and
//! `leave` ask for.

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use serde::Deserialize;
use serde_json::json;
use starling_broker::{ClusterStatus, Member, MembershipError};

use crate::reply::{error, present, resource};
use crate::ApiState;

pub(crate) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(resource("/cluster", "GET").route(web::get().to(status)))
        .service(resource("/cluster/members", "POST").route(web::post().to(add_member)))
        .service(resource("/cluster/leave", "POST").route(web::post().to(leave)));
}

/// A node to add: its id and its record (what its own `GET /cluster` shows under `self`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AddMember {
    id: u64,
    mqtt: String,
    cluster: String,
    #[serde(default, deserialize_with = "present")]
    http: Option<String>,
}

/// A refused membership change: 409 when the node is the wrong one to ask (not clustered,
/// not the leader, with the leader to ask instead), 400 for a wrong request, 503 when raft
/// did not carry it out in time.
fn membership_error(e: &MembershipError) -> HttpResponse {
    match e {
        MembershipError::NotLeader {
            leader,
            leader_http,
            ..
        } => HttpResponse::Conflict().json(json!({
            "code": 409,
            "message": e.to_string(),
            "leader": leader,
            "leader_http": leader_http,
        })),
        MembershipError::NotClustered => error(StatusCode::CONFLICT, e),
        MembershipError::Refused(_) => error(StatusCode::BAD_REQUEST, e),
        MembershipError::Failed(_) => error(StatusCode::SERVICE_UNAVAILABLE, e),
    }
}

async fn add_member(s: web::Data<ApiState>, body: web::Json<AddMember>) -> HttpResponse {
    let b = body.into_inner();
    let member = Member {
        mqtt: b.mqtt,
        cluster: b.cluster,
        http: b.http,
    };
    match s.admin.cluster_add_member(b.id, member).await {
        Ok(()) => HttpResponse::Ok().json(json!({ "joined": b.id })),
        Err(e) => membership_error(&e),
    }
}

/// How long a leaving node's clients have to take their sessions to other nodes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaveQuery {
    #[serde(default = "default_drain")]
    drain_secs: u32,
}

fn default_drain() -> u32 {
    DRAIN_SECS_DEFAULT
}

const DRAIN_SECS_DEFAULT: u32 = 30;
const DRAIN_SECS_MAX: u32 = 3600;

async fn leave(s: web::Data<ApiState>, q: web::Query<LeaveQuery>) -> HttpResponse {
    if q.drain_secs > DRAIN_SECS_MAX {
        return error(
            StatusCode::BAD_REQUEST,
            format_args!("drain_secs: at most {DRAIN_SECS_MAX}"),
        );
    }
    let drain = std::time::Duration::from_secs(u64::from(q.drain_secs));
    match s.admin.cluster_leave(drain).await {
        Ok(behind) => HttpResponse::Ok().json(json!({
            "left": s.admin.node_id(),
            "sessions_left_behind": behind.sessions,
            "messages_left_behind": behind.messages,
            "relays_left_behind": behind.relays,
        })),
        Err(e) => membership_error(&e),
    }
}

pub(crate) fn status_json(s: &ClusterStatus) -> serde_json::Value {
    json!({
        "enabled": true,
        "node": s.node,
        "role": s.role,
        "term": s.term,
        "leader": s.leader,
        "commit": s.commit,
        "applied": s.applied,
        "routes": s.routes,
        "routes_converged": s.routes_converged,
        "leader_changes": s.leader_changes,
        "left": s.left,
        "self": {
            "mqtt": s.this.mqtt,
            "cluster": s.this.cluster,
            "http": s.this.http,
        },
        "members": s.members.iter().map(|m| json!({
            "id": m.id,
            "mqtt": m.mqtt,
            "cluster": m.cluster,
            "http": m.http,
            "voter": m.voter,
            "active": m.active,
            "matched": m.matched,
        })).collect::<Vec<_>>(),
    })
}

async fn status(s: web::Data<ApiState>) -> HttpResponse {
    match s.admin.cluster_status().await {
        Ok(Some(st)) => HttpResponse::Ok().json(status_json(&st)),
        Ok(None) => HttpResponse::Ok().json(json!({
            "enabled": false,
            "node": s.admin.node_id(),
            "role": "standalone",
            "term": 0,
            "leader": null,
            "commit": 0,
            "applied": 0,
            "routes": 0,
            "routes_converged": true,
            "leader_changes": 0,
            "members": [],
        })),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e),
    }
}
