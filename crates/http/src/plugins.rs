//! RMQTT's plugin paths (`/plugins...`), answered with the broker's hook-chain providers:
//! the built-in password file, ACL and `$SYS` events, and an embedder's. They are compiled
//! in and fixed at start-up, so they are listed with their settings, and loading,
//! unloading or reloading one is refused with 409 and what to do instead.

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use serde_json::{json, Map, Value};
use starling_broker::PluginInfo;

use crate::reply::{error, other_node, resource};
use crate::ApiState;

type State = web::Data<ApiState>;

pub(crate) fn routes(cfg: &mut web::ServiceConfig) {
    let get = web::get;
    let put = web::put;
    cfg.service(resource("/plugins", "GET").route(get().to(all)))
        .service(resource("/plugins/{node}", "GET").route(get().to(node)))
        .service(resource("/plugins/{node}/{plugin}", "GET").route(get().to(one)))
        .service(resource("/plugins/{node}/{plugin}/config", "GET").route(get().to(config)))
        .service(resource("/plugins/{node}/{plugin}/config/reload", "PUT").route(put().to(reload)))
        .service(resource("/plugins/{node}/{plugin}/load", "PUT").route(put().to(load)))
        .service(resource("/plugins/{node}/{plugin}/unload", "PUT").route(put().to(unload)));
}

/// RMQTT's plugin object.
fn plugin_json(p: &PluginInfo) -> Value {
    let hooks: Vec<&str> = p.hooks.iter().map(|h| h.as_str()).collect();
    json!({
        "name": p.about.name,
        "version": p.about.version,
        "descr": p.about.descr,
        // Every provider in the chain runs from start-up to shutdown.
        "active": true,
        "inited": true,
        "immutable": true,
        "attrs": {"hooks": hooks},
    })
}

fn listed(s: &ApiState) -> Vec<Value> {
    s.admin.plugins().iter().map(plugin_json).collect()
}

async fn all(s: State) -> HttpResponse {
    HttpResponse::Ok().json([json!({"node": s.admin.node_id(), "plugins": listed(&s)})])
}

async fn node(s: State, id: web::Path<String>) -> HttpResponse {
    match other_node(&s, &id) {
        Some(r) => r,
        None => HttpResponse::Ok().json(listed(&s)),
    }
}

/// The plugin `name` on node `id`, or the 404 to answer.
fn find(s: &ApiState, id: &str, name: &str) -> Result<PluginInfo, Box<HttpResponse>> {
    if let Some(r) = other_node(s, id) {
        return Err(Box::new(r));
    }
    s.admin
        .plugins()
        .into_iter()
        .find(|p| p.about.name == name)
        .ok_or_else(|| {
            let r = error(StatusCode::NOT_FOUND, format_args!("no plugin {name:?}"));
            Box::new(r)
        })
}

async fn one(s: State, path: web::Path<(String, String)>) -> HttpResponse {
    match find(&s, &path.0, &path.1) {
        Ok(p) => HttpResponse::Ok().json(plugin_json(&p)),
        Err(r) => *r,
    }
}

async fn config(s: State, path: web::Path<(String, String)>) -> HttpResponse {
    match find(&s, &path.0, &path.1) {
        Ok(p) => {
            let settings: Map<String, Value> = p
                .about
                .settings
                .into_iter()
                .map(|(k, v)| (k, Value::from(v)))
                .collect();
            HttpResponse::Ok().json(settings)
        }
        Err(r) => *r,
    }
}

/// What a change to a fixed provider gets: 409, and how to make the change instead.
fn fixed(s: &ApiState, path: &(String, String), what: &str) -> HttpResponse {
    match find(s, &path.0, &path.1) {
        Ok(p) => error(
            StatusCode::CONFLICT,
            format_args!(
                "{} cannot be {what} while the broker runs: providers are fixed at start-up; \
                 change the configuration (or the embedder's hooks) and restart",
                p.about.name
            ),
        ),
        Err(r) => *r,
    }
}

async fn reload(s: State, path: web::Path<(String, String)>) -> HttpResponse {
    fixed(&s, &path, "reloaded")
}

async fn load(s: State, path: web::Path<(String, String)>) -> HttpResponse {
    fixed(&s, &path, "loaded")
}

async fn unload(s: State, path: web::Path<(String, String)>) -> HttpResponse {
    fixed(&s, &path, "unloaded")
}
