//! The operator's lists of clients and of their subscriptions (`GET /api/v1/clients`,
//! `/subscriptions`): gathered by asking every client actor, and kept for
//! `http.list_cache_ms` so that a dashboard or a script polling them does not put one
//! message per client on the broker's cores per request.
//!
//! A kept list is given again only while nothing that would show in it has happened: no
//! connection has come or gone, no session was created, resumed or ended, no subscription
//! was made or removed (the broker's counters of those events are unchanged since it was
//! gathered). What such a list may show stale, for at most `list_cache_ms`, are a client's
//! live counts: queued and in-flight messages.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use starling_rt::{time, Actor, Addr, Ctx, Reply};

use crate::msg::{ClientMsg, ListingMsg, RegistryMsg};
use crate::settings::Shared;

/// How long one client actor may take to describe itself before it is left out of a list
/// (a client blocked writing to a peer that reads nothing must not hang the operator).
pub(crate) const INFO_WAIT: Duration = Duration::from_secs(2);
/// Client actors asked at once for a list.
const INFO_CHUNK: usize = 256;

/// A list as gathered, with when and after which events.
struct Kept<T> {
    at: time::Instant,
    events: u64,
    rows: Arc<[T]>,
}

pub(crate) struct ListingActor {
    shared: Arc<Shared>,
    registry: Addr<RegistryMsg>,
    max_age: Duration,
    clients: Option<Kept<crate::msg::ClientInfo>>,
    subscriptions: Option<Kept<crate::msg::ClientSubscriptions>>,
}

impl ListingActor {
    pub(crate) fn new(shared: Arc<Shared>, registry: Addr<RegistryMsg>) -> Self {
        let max_age = Duration::from_millis(u64::from(shared.config.http.list_cache_ms));
        Self {
            shared,
            registry,
            max_age,
            clients: None,
            subscriptions: None,
        }
    }

    /// The events a list shows, counted: any change of the sum means a kept list may be
    /// missing a client, show a gone one, or have a subscription count wrong.
    fn events(&self) -> u64 {
        let r = &self.shared.metrics.rmqtt;
        [
            &r.client_connected,
            &r.client_disconnected,
            &r.session_created,
            &r.session_resumed,
            &r.session_terminated,
            &r.session_subscribed,
            &r.session_unsubscribed,
        ]
        .iter()
        .map(|c| c.load(Relaxed))
        .fold(0u64, u64::wrapping_add)
    }
}

/// `kept` if it may be given again, else a fresh list from `gather`, kept in its place.
async fn list<T, F>(
    kept: &mut Option<Kept<T>>,
    events: u64,
    max_age: Duration,
    gather: F,
) -> Arc<[T]>
where
    F: std::future::Future<Output = Vec<T>>,
{
    let now = time::now();
    if let Some(k) = kept {
        if k.events == events && now.saturating_duration_since(k.at) < max_age {
            return k.rows.clone();
        }
    }
    // The events are read before the clients are asked: one that happens while they
    // answer makes the next request gather again, even if this list already shows it.
    let rows: Arc<[T]> = gather.await.into();
    if !max_age.is_zero() {
        *kept = Some(Kept {
            at: now,
            events,
            rows: rows.clone(),
        });
    }
    rows
}

/// Asks every client actor, [`INFO_CHUNK`] at a time; those that do not answer within
/// [`INFO_WAIT`] are left out.
async fn ask_all<R: Send + 'static>(
    registry: &Addr<RegistryMsg>,
    make: fn(Reply<R>) -> ClientMsg,
) -> Vec<R> {
    let Ok(addrs) = registry.ask(RegistryMsg::Clients).await else {
        return Vec::new();
    };
    let mut out = Vec::with_capacity(addrs.len());
    for chunk in addrs.chunks(INFO_CHUNK) {
        let asks = chunk.iter().map(|a| time::timeout(INFO_WAIT, a.ask(make)));
        out.extend(
            futures::future::join_all(asks)
                .await
                .into_iter()
                .filter_map(|r| r.and_then(Result::ok)),
        );
    }
    out
}

impl Actor for ListingActor {
    type Msg = ListingMsg;

    async fn handle(&mut self, msg: ListingMsg, _ctx: &mut Ctx<Self>) {
        let events = self.events();
        match msg {
            ListingMsg::Clients(reply) => {
                let gather = ask_all(&self.registry, ClientMsg::Info);
                let rows = list(&mut self.clients, events, self.max_age, gather).await;
                let _ = reply.send(rows);
            }
            ListingMsg::Subscriptions(reply) => {
                let gather = async {
                    let mut all = ask_all(&self.registry, ClientMsg::Subscriptions).await;
                    all.retain(|s| !s.filters.is_empty());
                    all
                };
                let rows = list(&mut self.subscriptions, events, self.max_age, gather).await;
                let _ = reply.send(rows);
            }
        }
    }
}
