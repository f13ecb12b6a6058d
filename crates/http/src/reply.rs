//! Answers that are not a handler's data: JSON errors with their status, for bad input,
//! unknown paths and refusals, so that no request gets an HTML page or a bare status.

use actix_web::error::{InternalError, JsonPayloadError, PathError, QueryPayloadError};
use actix_web::http::{header, StatusCode};
use actix_web::{web, HttpRequest, HttpResponse, Resource};

/// `{"code": <status>, "message": ...}` with that status.
pub(crate) fn error(status: StatusCode, message: impl std::fmt::Display) -> HttpResponse {
    HttpResponse::build(status).json(serde_json::json!({
        "code": status.as_u16(),
        "message": message.to_string(),
    }))
}

pub(crate) async fn not_found(req: HttpRequest) -> HttpResponse {
    error(
        StatusCode::NOT_FOUND,
        format_args!("no such endpoint: {} {}", req.method(), req.path()),
    )
}

/// A path's resource, where a method it does not serve gets 405 with `Allow: allow`
/// rather than the 404 of a path that does not exist.
pub(crate) fn resource(path: &str, allow: &'static str) -> Resource {
    web::resource(path).default_service(web::to(move |req: HttpRequest| async move {
        let mut res = error(
            StatusCode::METHOD_NOT_ALLOWED,
            format_args!("{} {}: this path takes {allow}", req.method(), req.path()),
        );
        res.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static(allow));
        res
    }))
}

/// A path segment that is not what its parameter takes (not UTF-8 once decoded).
pub(crate) fn path_error(e: PathError, _: &HttpRequest) -> actix_web::Error {
    let msg = format!("bad path: {e}");
    InternalError::from_response(e, error(StatusCode::NOT_FOUND, msg)).into()
}

pub(crate) fn json_error(e: JsonPayloadError, _: &HttpRequest) -> actix_web::Error {
    let status = match e {
        JsonPayloadError::OverflowKnownLength { .. } | JsonPayloadError::Overflow { .. } => {
            StatusCode::PAYLOAD_TOO_LARGE
        }
        JsonPayloadError::ContentType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        _ => StatusCode::BAD_REQUEST,
    };
    let msg = e.to_string();
    InternalError::from_response(e, error(status, msg)).into()
}

pub(crate) fn query_error(e: QueryPayloadError, _: &HttpRequest) -> actix_web::Error {
    let msg = format!("bad query: {e}");
    InternalError::from_response(e, error(StatusCode::BAD_REQUEST, msg)).into()
}

/// The 404 for a path's `{id}` that names no node of this broker (with one node: any
/// other than this one).
pub(crate) fn other_node(s: &crate::ApiState, id: &str) -> Option<HttpResponse> {
    match id.parse::<u64>() {
        Ok(n) if n == s.admin.node_id() => None,
        _ => Some(error(StatusCode::NOT_FOUND, format_args!("no node {id}"))),
    }
}

/// For an optional body field: absent is `None`, `null` is refused like any other value
/// of the wrong type (serde would read it as absent, which the OpenAPI document does not
/// say and a client sending `null` did not mean).
pub(crate) fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}
