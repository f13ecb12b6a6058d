//! `GET /api/v1/cluster`: this node's view of the raft cluster (not an RMQTT path; RMQTT
//! has no equivalent). What `starling cluster status` prints. A node alone answers too,
//! with `enabled: false`.

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use serde_json::json;
use starling_broker::ClusterStatus;

use crate::reply::{error, resource};
use crate::ApiState;

pub(crate) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(resource("/cluster", "GET").route(web::get().to(status)));
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
