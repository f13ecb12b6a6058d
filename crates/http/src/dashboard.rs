//! The web dashboard: a page at `/` and its script, style and icon under `/dashboard/`,
//! compiled into the binary. The files hold no data (the page asks `/api/v1` for it, with
//! the token), so they are served without the token: docs/security.md.

use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};

/// One embedded file and what it is served as.
pub(crate) struct Asset {
    pub path: &'static str,
    pub body: &'static [u8],
    pub content_type: &'static str,
    etag: u64,
}

const fn asset(path: &'static str, body: &'static [u8], content_type: &'static str) -> Asset {
    Asset {
        path,
        body,
        content_type,
        etag: fnv1a(body),
    }
}

pub(crate) const ASSETS: &[Asset] = &[
    asset(
        "/",
        include_bytes!("../assets/index.html"),
        "text/html; charset=utf-8",
    ),
    asset(
        "/dashboard/app.js",
        include_bytes!("../assets/app.js"),
        "text/javascript; charset=utf-8",
    ),
    asset(
        "/dashboard/plot.js",
        include_bytes!("../assets/plot.js"),
        "text/javascript; charset=utf-8",
    ),
    asset(
        "/dashboard/style.css",
        include_bytes!("../assets/style.css"),
        "text/css; charset=utf-8",
    ),
    asset(
        "/dashboard/icon.svg",
        include_bytes!("../assets/icon.svg"),
        "image/svg+xml",
    ),
];

/// The page runs only its own files and talks only to its own origin; client ids and
/// payloads it shows come from MQTT clients, so a slip into markup must not become script.
/// `frame-ancestors 'none'`: no other site can frame the kick buttons.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'none'; base-uri 'none'; \
                   frame-ancestors 'none'";

pub(crate) fn routes(cfg: &mut web::ServiceConfig) {
    for a in ASSETS {
        cfg.route(
            a.path,
            web::get().to(move |req: HttpRequest| async move { serve(&req, a) }),
        )
        .route(
            a.path,
            web::head().to(move |req: HttpRequest| async move { serve(&req, a) }),
        );
    }
}

/// `no-cache` with an ETag: the browser asks every time and mostly gets a 304, so a page
/// never runs a script older than the binary it talks to (the paths carry no version).
fn serve(req: &HttpRequest, a: &Asset) -> HttpResponse {
    let etag = format!("\"{:016x}\"", a.etag);
    let fresh = req
        .headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| etag_listed(v, &etag));
    let mut res = if fresh {
        HttpResponse::build(StatusCode::NOT_MODIFIED)
    } else {
        HttpResponse::build(StatusCode::OK)
    };
    res.insert_header((header::ETAG, etag))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header((
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ))
        .insert_header((header::REFERRER_POLICY, "no-referrer"));
    if a.content_type.starts_with("text/html") {
        res.insert_header((header::CONTENT_SECURITY_POLICY, CSP));
    }
    if fresh {
        return res.finish();
    }
    res.content_type(a.content_type).body(a.body)
}

/// Whether an `If-None-Match` value (`*`, or a list of tags, weak or not) names `etag`.
fn etag_listed(header: &str, etag: &str) -> bool {
    header
        .split(',')
        .map(str::trim)
        .any(|t| t == "*" || t.strip_prefix("W/").unwrap_or(t) == etag)
}

/// FNV-1a, at compile time: a tag that changes when a file does is all an ETag needs.
const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    h
}

#[cfg(test)]
#[path = "dashboard_tests.rs"]
mod tests;
