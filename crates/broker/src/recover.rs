//! What a starting broker takes back from its store, before any listener opens: the store
//! opened and read whole, the router's shards started under the shard map the store's link
//! cursors were written with, the stored sessions given back their client actors, and each
//! shard's retained and delayed messages.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rand::RngCore;
use starling_config::Config;
use starling_router::ShardMap;
use starling_rt::{start_with, time, Addr, Options};
use starling_session::Message;
use starling_store::{Limits as StoreLimits, Location, Recovered, Store};

use crate::error::{BrokerError, StoreOpenError};
use crate::msg::{DelayedKey, RegistryMsg, Restore, RouterMsg, StoreMsg};
use crate::routing::{RouterActor, ShardStart};
use crate::settings::Shared;
use crate::shards::Shards;
use crate::storage::StorageActor;
use crate::ROUTER_MAILBOX;

/// The urgent lane of a router shard: subscribers' back-pressure reports.
const SHARD_URGENT: usize = 1024;

/// Starts the router's shards, each on a worker of its own (modulo the workers): a shard
/// is the busiest actor of a node, and shards that share a thread route in turn rather than
/// at once. Client actors spread over the workers by their id; a client cannot sit beside
/// its shard, since it publishes to topics of every shard.
pub(crate) fn start_shards(
    shared: &Arc<Shared>,
    store: Option<&Addr<StoreMsg>>,
    delayed_base: u64,
    seq_base: u64,
    cursors: &[starling_store::LinkCursor],
    outbox: &[starling_store::OutboxBatch],
    moves: &[(u16, String, Vec<u8>)],
) -> Shards {
    let count = match shared.config.router.shards {
        starling_config::ShardCount::Auto => starling_rt::workers(),
        starling_config::ShardCount::Fixed(n) => n as usize,
    };
    let (seed, cursors) = shard_map_seed(count, cursors, outbox);
    let map = ShardMap::new(count, seed);
    let addrs = (0..count)
        .map(|i| {
            start_with(
                RouterActor::new(
                    shared.clone(),
                    i,
                    map.clone(),
                    store.cloned(),
                    ShardStart {
                        delayed_base,
                        seq_base,
                        cursors,
                        // A batch parked by a shard this run does not have goes again from
                        // another one, under its own shard's name.
                        outbox: outbox
                            .iter()
                            .filter(|b| usize::from(b.shard) % count == i)
                            .cloned()
                            .collect(),
                        moves,
                    },
                ),
                Options {
                    // Back-pressure reports from subscribers (see `flow`), ahead of the
                    // publishes: one per subscriber turn at most, so a deep lane.
                    urgent_capacity: SHARD_URGENT,
                    ..Options::named("router")
                        .capacity(ROUTER_MAILBOX)
                        .on_worker(i)
                },
            )
        })
        .collect::<Vec<Addr<RouterMsg>>>();
    if let Some(store) = store {
        // Told whether the store has room for deliveries that go before their commit.
        let weak = addrs.iter().map(Addr::downgrade).collect();
        if store.try_send(StoreMsg::Shards(weak)).is_err() {
            tracing::warn!("the store did not take the shards' addresses: they hold deliveries");
        }
    }
    tracing::debug!(shards = count, "router started");
    Shards::new(map, addrs, shared.topic_limits, store.cloned())
}

/// The seed of the shard map, and the stored link cursors that hold under it. The cursors
/// name receiving shards, so they mean something only if topics map to shards as they did
/// when they were written: the map is made again from their seed when the shard count is
/// the same. Otherwise (no cursors, another count) a fresh seed, and the cursors are
/// dropped: a batch sent again after the restart may then deliver a QoS 2 message twice
/// (docs/clustering.md).
fn shard_map_seed<'c>(
    count: usize,
    cursors: &'c [starling_store::LinkCursor],
    outbox: &[starling_store::OutboxBatch],
) -> (u64, &'c [starling_store::LinkCursor]) {
    let fresh = || {
        // Batches parked for other nodes go again from the shard that holds their topics
        // now, ahead of what it sends after them: in order only under the same map.
        match outbox.first() {
            Some(b) if usize::from(b.shards) == count => b.map_seed,
            Some(b) => {
                tracing::warn!(
                    stored_shards = b.shards,
                    shards = count,
                    "router shard count changed since batches were parked for other nodes: \
                     they may arrive behind messages published after this restart"
                );
                starling_rt::rng::rng().next_u64()
            }
            None => starling_rt::rng::rng().next_u64(),
        }
    };
    let Some(first) = cursors.first() else {
        return (fresh(), cursors);
    };
    let same =
        |c: &starling_store::LinkCursor| (c.map_seed, c.shards) == (first.map_seed, first.shards);
    if usize::from(first.shards) == count && cursors.iter().all(same) {
        return (first.map_seed, cursors);
    }
    tracing::warn!(
        stored_shards = first.shards,
        shards = count,
        "router shard count changed since the store was written: forwarded batches sent \
         again after this restart are not checked against what was delivered before it"
    );
    (fresh(), &[])
}

/// The store's file under `node.data_dir`.
pub fn store_path(config: &Config) -> PathBuf {
    config.node.data_dir.join(STORE_FILE)
}

const STORE_FILE: &str = "store.redb";

/// Opens the store (reading it back whole) and starts its actor; `None` when
/// `storage.enabled` is false.
pub(crate) fn open_store(
    shared: &Arc<Shared>,
    location: Option<Location>,
) -> Result<Option<(Addr<StoreMsg>, Recovered)>, BrokerError> {
    let s = &shared.config.storage;
    if !s.enabled {
        return Ok(None);
    }
    let path = store_path(&shared.config);
    let fail = |source| BrokerError::Store {
        path: path.clone(),
        source: Box::new(source),
    };
    let location = match location {
        Some(l) => l,
        None => {
            std::fs::create_dir_all(&shared.config.node.data_dir)
                .map_err(|e| fail(StoreOpenError::Dir(e)))?;
            Location::File(path.clone())
        }
    };
    let limits = StoreLimits {
        max_bytes: s.max_bytes,
    };
    // Blocking, before any listener opens: nothing is served until the store is read.
    let started = time::now();
    let (store, recovered) = Store::open(location, limits).map_err(|e| fail(e.into()))?;
    let usage = store.usage();
    tracing::info!(
        path = %path.display(),
        sessions = usage.sessions,
        deliveries = usage.deliveries,
        retained = usage.retained,
        delayed = usage.delayed,
        bytes = usage.bytes,
        took_ms = time::now().saturating_duration_since(started).as_millis() as u64,
        "store opened"
    );
    let addr = start_with(
        StorageActor::new(shared.clone(), store),
        Options::named("store").capacity(STORE_MAILBOX),
    );
    Ok(Some((addr, recovered)))
}

/// Writes (batches of ops) the storage actor's mailbox holds before writers wait.
const STORE_MAILBOX: usize = 1024;

/// Gives every stored session back its client actor, detached, and waits until their
/// subscriptions are routed. A session whose connection the stop cut (written while
/// connected) counts as disconnected at this start: its expiry and will delay run from now.
/// One that cannot be restored is logged and left in the store.
pub(crate) async fn restore_sessions(
    shared: &Arc<Shared>,
    registry: &Addr<RegistryMsg>,
    sessions: Vec<starling_store::RecoveredSession>,
) {
    if sessions.is_empty() {
        return;
    }
    let started = time::now();
    let (now, wall) = (time::now(), time::wall());
    let n = sessions.len();
    let mut restored = Vec::with_capacity(n);
    for s in sessions {
        let mut state = s.state;
        if s.connected {
            if let Some(d) = &mut state.detached {
                d.expires_at = (d.expiry_interval_secs != u32::MAX)
                    .then(|| wall.checked_add(Duration::from_secs(d.expiry_interval_secs.into())))
                    .flatten();
                if let Some(w) = &mut d.will {
                    let delay = w.properties.will_delay_interval.unwrap_or(0);
                    w.due_at = wall.checked_add(Duration::from_secs(delay.into()));
                }
            }
        }
        // Deliveries in flight come back in seq order, which is routing order per shard but
        // not send order across shards; a resend must keep send order (MQTT 4.6). Packet ids
        // were handed out in turn, so their circular order is that order.
        let mut inflight_seqs = s.inflight_seqs;
        if let Some(d) = state.detached.as_mut() {
            let first = send_start(d.inflight.iter().map(|f| f.packet_id.get()));
            let mut both: Vec<_> = std::mem::take(&mut d.inflight)
                .into_iter()
                .zip(inflight_seqs)
                .collect();
            both.sort_by_key(|(f, _)| f.packet_id.get().wrapping_sub(first));
            (d.inflight, inflight_seqs) = both.into_iter().unzip();
        }
        // The meta's next packet identifier dates from its last write; the session has sent
        // since. Going on after the last one in flight reuses none a client may still hold
        // (a client that keeps a resent QoS 2 PUBLISH twice, as libmosquitto does, would
        // deliver the stale copy when its identifier comes round again).
        if let Some(last) = state.detached.as_ref().and_then(|d| d.inflight.last()) {
            state.next_packet_id = last
                .packet_id
                .checked_add(1)
                .unwrap_or(std::num::NonZeroU16::MIN);
        }
        let client_id = state.client_id.clone();
        match starling_session::Session::restore(state, shared.limits.clone(), now, wall) {
            Ok(mut session) => {
                session.set_store_keys(
                    inflight_seqs.iter().copied().map(Some),
                    s.queue_seqs.iter().copied().map(Some),
                );
                restored.push((session, s.owner.map(Arc::from)));
            }
            Err(e) => {
                tracing::error!(client_id = %client_id, error = %e, "stored session not restored");
            }
        }
    }
    let count = restored.len();
    let _ = registry
        .ask(|reply| RegistryMsg::Restore(restored, reply))
        .await;
    tracing::info!(
        sessions = count,
        of = n,
        took_ms = time::now().saturating_duration_since(started).as_millis() as u64,
        "stored sessions restored"
    );
}

/// The first sent of packet ids handed out in turn: the one after the widest gap between
/// them (where the counter wrapped, or the oldest still in flight). Sorting by
/// `id.wrapping_sub(first)` then gives send order.
fn send_start(ids: impl Iterator<Item = u16>) -> u16 {
    let mut ids: Vec<u16> = ids.collect();
    ids.sort_unstable();
    let n = ids.len();
    (0..n)
        .max_by_key(|&k| ids[k].wrapping_sub(ids[(k + n - 1) % n]))
        .map_or(0, |k| ids[k])
}

/// Hands each shard its part of what the store held, and waits until all have it.
pub(crate) async fn restore(shards: &Shards, recovered: Recovered) {
    let n = shards.count();
    let now = time::now();
    let wall = time::wall();
    type Part = (Vec<Arc<Message>>, Vec<(DelayedKey, Arc<Message>)>);
    let mut parts: Vec<Part> = (0..n).map(|_| (Vec::new(), Vec::new())).collect();
    for (topic, m) in recovered.retained {
        let i = shards.index_for_publish(&topic);
        parts[i].0.push(Arc::new(Message::from_state(m, now, wall)));
    }
    for d in recovered.delayed {
        let i = shards.index_for_publish(&d.target);
        let mut m = Message::from_state(d.message, now, wall);
        m.topic = Arc::from(d.target);
        parts[i].1.push((
            DelayedKey {
                id: d.id,
                due: d.due,
            },
            Arc::new(m),
        ));
    }
    for (i, (retained, delayed)) in parts.into_iter().enumerate() {
        if retained.is_empty() && delayed.is_empty() {
            continue;
        }
        let (done, wait) = tokio::sync::oneshot::channel();
        let msg = RouterMsg::Restore(Box::new(Restore {
            retained,
            delayed,
            done,
        }));
        if shards.get(i).send(msg).await.is_ok() {
            let _ = wait.await;
        }
    }
}

#[cfg(test)]
mod send_order_tests {
    use super::send_start;

    fn in_send_order(ids: &[u16]) -> Vec<u16> {
        let first = send_start(ids.iter().copied());
        let mut v = ids.to_vec();
        v.sort_by_key(|id| id.wrapping_sub(first));
        v
    }

    #[test]
    fn packet_ids_come_back_in_the_order_they_were_handed_out() {
        assert_eq!(in_send_order(&[3, 1, 2]), [1, 2, 3]);
        // Wrapped: 65534, 65535, then 1, 2.
        assert_eq!(in_send_order(&[2, 65535, 1, 65534]), [65534, 65535, 1, 2]);
        // Holes where deliveries were acknowledged.
        assert_eq!(in_send_order(&[40, 7, 9]), [7, 9, 40]);
        assert_eq!(in_send_order(&[9]), [9]);
        assert!(in_send_order(&[]).is_empty());
    }
}
