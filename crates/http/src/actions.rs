//! `POST /mqtt/subscribe` and `/mqtt/unsubscribe`: a connected client's subscriptions
//! changed on its behalf, as its own SUBSCRIBE or UNSUBSCRIBE would (docs/http-api.md).

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use serde::Deserialize;
use serde_json::{Map, Value};
use starling_broker::AdminError;
use starling_codec::{QoS, ReasonCode};

use crate::reply::{error, present, resource};
use crate::ApiState;

type State = web::Data<ApiState>;

pub(crate) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(resource("/mqtt/subscribe", "POST").route(web::post().to(subscribe)))
        .service(resource("/mqtt/unsubscribe", "POST").route(web::post().to(unsubscribe)));
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SubscribeBody {
    #[serde(default, deserialize_with = "present")]
    topic: Option<String>,
    /// Comma-separated, each trimmed; `topic` joins them.
    #[serde(default, deserialize_with = "present")]
    topics: Option<String>,
    #[serde(default)]
    qos: u8,
    clientid: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UnsubscribeBody {
    topic: String,
    clientid: String,
}

fn refused(e: &AdminError) -> HttpResponse {
    let status = match e {
        AdminError::Topic(_) | AdminError::Reserved(_) => StatusCode::BAD_REQUEST,
        AdminError::NoSession(_) | AdminError::NotConnected(_) => StatusCode::NOT_FOUND,
        AdminError::Unanswered(_) | AdminError::Stopping => StatusCode::SERVICE_UNAVAILABLE,
    };
    error(status, e)
}

/// A SUBACK code as the answer's text for a filter it refused: its name and its value.
fn code_text(code: ReasonCode) -> String {
    format!("{code:?} (0x{:02X})", code.as_u8())
}

async fn subscribe(s: State, body: web::Json<SubscribeBody>) -> HttpResponse {
    let b = body.into_inner();
    let mut filters: Vec<String> = b
        .topics
        .as_deref()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect();
    filters.extend(b.topic);
    if filters.is_empty() {
        return error(StatusCode::BAD_REQUEST, "topic or topics is required");
    }
    let qos = match b.qos {
        0 => QoS::AtMostOnce,
        1 => QoS::AtLeastOnce,
        2 => QoS::ExactlyOnce,
        n => {
            return error(
                StatusCode::BAD_REQUEST,
                format_args!("qos: {n} is not 0, 1 or 2"),
            )
        }
    };
    match s.admin.subscribe(&b.clientid, filters.clone(), qos).await {
        Ok(results) => {
            let mut out = Map::new();
            for (f, r) in filters.into_iter().zip(results) {
                let v = match r {
                    Ok(_) => Value::Bool(true),
                    Err(code) => Value::String(code_text(code)),
                };
                out.insert(f, v);
            }
            HttpResponse::Ok().json(out)
        }
        Err(e) => refused(&e),
    }
}

async fn unsubscribe(s: State, body: web::Json<UnsubscribeBody>) -> HttpResponse {
    let b = body.into_inner();
    match s.admin.unsubscribe(&b.clientid, vec![b.topic]).await {
        Ok(codes) => match codes
            .first()
            .copied()
            .unwrap_or(ReasonCode::UnspecifiedError)
        {
            // `false`: there was no such subscription to remove.
            ReasonCode::NoSubscriptionExisted => HttpResponse::Ok().json(false),
            code if !code.is_error() => HttpResponse::Ok().json(true),
            code => error(StatusCode::SERVICE_UNAVAILABLE, code_text(code)),
        },
        Err(e) => refused(&e),
    }
}
