//! `http.bearer_token`: every `/api/v1` request must carry `Authorization: Bearer <token>`.

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header;
use actix_web::middleware::Next;
use actix_web::{web, Error};

use crate::reply;

/// The token the requests must carry, when one is configured.
pub(crate) struct Token(pub Option<String>);

pub(crate) async fn check<B: MessageBody + 'static>(
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<EitherBody<B>>, Error> {
    let want = req.app_data::<web::Data<Token>>().and_then(|t| t.0.clone());
    if let Some(want) = want {
        let got = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !got.is_some_and(|g| same(g.as_bytes(), want.as_bytes())) {
            let res = reply::error(
                actix_web::http::StatusCode::UNAUTHORIZED,
                "bearer token missing or wrong",
            );
            return Ok(req.into_response(res).map_into_right_body());
        }
    }
    next.call(req)
        .await
        .map(ServiceResponse::map_into_left_body)
}

/// Compares without stopping at the first difference, so the time taken does not tell
/// how much of a guess was right.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    #[test]
    fn tokens_compare_whole() {
        assert!(super::same(b"abc", b"abc"));
        assert!(!super::same(b"abc", b"abd"));
        assert!(!super::same(b"abc", b"abcd"));
        assert!(!super::same(b"", b"a"));
    }
}
