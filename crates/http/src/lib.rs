//! The HTTP API: RMQTT's `/api/v1` paths and JSON shapes over a running broker, on actix-web.
//!
//! Every handler answers from the broker's [`Admin`] handle (messages to its actors); the
//! server's own state is its configuration. See docs/http-api.md for each endpoint.

use std::net::SocketAddr;

use actix_web::dev::ServerHandle;
use actix_web::{web, App, HttpServer};
use starling_broker::Admin;
use starling_config::HttpConfig;
use thiserror::Error;

mod actions;
mod auth;
mod cluster;
mod dashboard;
mod handlers;
mod plugins;
mod reply;
mod stats;
mod subs;
mod when;

/// Why the API did not start.
#[derive(Debug, Error)]
pub enum HttpError {
    #[error("http.bind: cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// The running API server.
pub struct HttpApi {
    handle: ServerHandle,
    addrs: Vec<SocketAddr>,
}

/// What every handler shares: the broker handle and the limits.
pub(crate) struct ApiState {
    pub admin: Admin,
    pub max_rows: usize,
}

impl HttpApi {
    /// Binds `config.bind` and serves on `config.workers` threads of their own. Call from
    /// inside the broker's runtime (the production one, actix).
    ///
    /// # Errors
    /// [`HttpError::Bind`] when the address cannot be bound.
    pub fn start(config: &HttpConfig, admin: Admin) -> Result<HttpApi, HttpError> {
        let state = web::Data::new(ApiState {
            admin,
            max_rows: config.max_rows as usize,
        });
        let token = web::Data::new(auth::Token(config.bearer_token.clone()));
        let max_body = config.max_body_bytes as usize;
        let server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .app_data(token.clone())
                .app_data(
                    web::JsonConfig::default()
                        .limit(max_body)
                        .error_handler(reply::json_error),
                )
                .app_data(web::QueryConfig::default().error_handler(reply::query_error))
                .app_data(web::PathConfig::default().error_handler(reply::path_error))
                .app_data(web::PayloadConfig::default().limit(max_body))
                .service(
                    web::scope("/api/v1")
                        .wrap(actix_web::middleware::from_fn(auth::check))
                        .configure(handlers::routes)
                        .configure(actions::routes)
                        .configure(stats::routes)
                        .configure(subs::routes)
                        .configure(cluster::routes)
                        .configure(plugins::routes),
                )
                .configure(dashboard::routes)
                .default_service(web::to(reply::not_found))
        })
        .workers(config.workers as usize)
        .max_connections(config.max_connections as usize)
        .disable_signals()
        .bind(config.bind)
        .map_err(|source| HttpError::Bind {
            addr: config.bind,
            source,
        })?;
        let addrs = server.addrs();
        let server = server.run();
        let handle = server.handle();
        actix_web::rt::spawn(server);
        for a in &addrs {
            tracing::info!(http_addr = %a, "HTTP API serving");
        }
        Ok(HttpApi { handle, addrs })
    }

    /// The addresses it listens on (the port, when `http.bind` asked for port 0).
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Stops accepting, lets requests in progress finish, then stops.
    pub async fn stop(self) {
        self.handle.stop(true).await;
    }
}
