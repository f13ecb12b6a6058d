//! A session handed over after its CONNECT went on afresh (`handover::adopt_late`), whose
//! fresh session ends on its own while it is asked to give way.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use starling_config::Config;
use starling_router::ShardMap;
use starling_rt::{Actor, Addr, Ctx};
use starling_session::state::SESSION_STATE_VERSION;
use starling_session::SessionState;
use tokio::sync::mpsc;

use super::{Entry, Registry};
use crate::msg::{ClientMsg, ClusterMsg, HandOff, RegistryMsg, RouterMsg};
use crate::settings::Shared;
use crate::shards::Shards;

/// A shard that takes everything and does nothing.
struct Shard;

impl Actor for Shard {
    type Msg = RouterMsg;
    async fn handle(&mut self, _: RouterMsg, _: &mut Ctx<Self>) {}
}

/// The cluster actor, as far as the registry's `Release`s go: each is passed on.
struct Cluster(mpsc::UnboundedSender<(Arc<str>, u64)>);

impl Actor for Cluster {
    type Msg = ClusterMsg;
    async fn handle(&mut self, msg: ClusterMsg, _: &mut Ctx<Self>) {
        if let ClusterMsg::Release { client_id, epoch } = msg {
            let _ = self.0.send((client_id, epoch));
        }
    }
}

/// A fresh session whose expiry falls due as it is asked to give way: it retires (as its
/// actor does when it ends), then answers that it did not give way. The registry's address
/// is set once it started (it must hold this actor's before it starts): a test double's
/// shortcut, not a pattern for actors.
struct Fresh {
    client_id: Arc<str>,
    registry: Arc<OnceLock<Addr<RegistryMsg>>>,
}

impl Actor for Fresh {
    type Msg = ClientMsg;
    async fn handle(&mut self, msg: ClientMsg, ctx: &mut Ctx<Self>) {
        if let ClientMsg::GiveWay(reply) = msg {
            let registry = self.registry.get().expect("the registry started");
            let retire = RegistryMsg::Retire {
                client_id: self.client_id.clone(),
                actor: ctx.id(),
                attaches: 1,
            };
            let _ = registry.send(retire).await;
            let _ = reply.send(false);
        }
    }
}

/// Neither session stays: the late one does not take the place of a session that ended,
/// and the fresh one's claim is released as with any session that ends. Before, the
/// fresh session was put back as live (its `Retire` found no entry while the adoption
/// held it), its claim kept for good.
#[tokio::test]
async fn a_fresh_session_that_ends_while_asked_to_give_way_is_not_put_back() {
    let shared = Shared::new(Config::default()).expect("config");
    let shard = starling_rt::start(Shard);
    let shards = Shards::new(
        ShardMap::new(1, 0),
        vec![shard.clone()],
        shared.topic_limits,
        None,
    );
    let chain = crate::builtin::builtin(&shared).build(true);
    let (released, mut releases) = mpsc::unbounded_channel();
    let cluster = starling_rt::start(Cluster(released));

    let client_id: Arc<str> = Arc::from("late");
    let registry_cell = Arc::new(OnceLock::new());
    let fresh = starling_rt::start(Fresh {
        client_id: client_id.clone(),
        registry: registry_cell.clone(),
    });
    let mut registry = Registry::new(shared, shards, chain, Some(cluster.clone()));
    registry.clients.insert(
        client_id.clone(),
        Entry {
            addr: fresh.clone(),
            attaches: 1,
            owner: None,
        },
    );
    registry.claimed.insert(client_id.clone(), 5);
    let registry = starling_rt::start(registry);
    let _ = registry_cell.set(registry.clone());

    let handoff = HandOff {
        state: SessionState {
            version: SESSION_STATE_VERSION,
            client_id: client_id.to_string(),
            next_packet_id: std::num::NonZeroU16::MIN,
            detached: None,
        },
        owner: None,
        from: 2,
    };
    let late = RegistryMsg::HandedOver {
        client_id: client_id.clone(),
        epoch: 5,
        handoff: Some(Box::new(handoff)),
    };
    registry.send(late).await.expect("the registry takes it");

    let release = tokio::time::timeout(Duration::from_secs(5), releases.recv())
        .await
        .expect("the claim is released")
        .expect("the cluster actor lives");
    assert_eq!(release, (client_id, 5));
    for _ in 0..100 {
        if fresh.is_closed() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(fresh.is_closed(), "the fresh session's actor is stopped");
}
