//! Answers that are not a handler's data: JSON errors with their status, for bad input,
//! unknown paths and refusals, so that no request gets an HTML page or a bare status.

use actix_web::error::{InternalError, JsonPayloadError, QueryPayloadError};
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};

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
