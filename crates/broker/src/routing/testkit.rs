//! What the shard's unit tests share: a message and a shard of one, outside a cluster.

use std::sync::Arc;

use bytes::Bytes;
use starling_codec::QoS;
use starling_config::Config;
use starling_router::ShardMap;
use starling_session::Message;

use crate::routing::{RouterActor, ShardStart};
use crate::settings::Shared;

/// A QoS 1 message on `t`.
pub(super) fn message() -> Arc<Message> {
    Arc::new(Message {
        topic: Arc::from("t"),
        payload: Bytes::from_static(b"m"),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: Default::default(),
        expires_at: None,
        publisher: None,
        shared_headers: Default::default(),
        received_at: None,
    })
}

/// Shard 0 of one, with no store and nothing restored.
pub(super) fn shard() -> (Arc<Shared>, RouterActor) {
    shard_with(Config::default())
}

/// The same under `config`.
pub(super) fn shard_with(config: Config) -> (Arc<Shared>, RouterActor) {
    let shared = Shared::new(config).expect("config");
    let start = ShardStart {
        delayed_base: 0,
        seq_base: 0,
        cursors: &[],
        outbox: Vec::new(),
        moves: &[],
    };
    let shard = RouterActor::new(shared.clone(), 0, ShardMap::new(1, 0), None, start);
    (shared, shard)
}
