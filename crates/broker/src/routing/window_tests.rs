//! The window of messages in flight to another node (`cluster.forward_window_messages`):
//! the QoS 1/2 publishers whose messages go there are held from its high mark on and go
//! again at its low mark.

use std::sync::atomic::Ordering;

use starling_config::Config;

use crate::destination::{remote_key, Destination, RemoteNode};
use crate::msg::{ClientMsg, Publisher};
use crate::routing::testkit::{message, shard_with};
use crate::routing::RouterActor;

struct Client;

impl starling_rt::Actor for Client {
    type Msg = ClientMsg;
    async fn handle(&mut self, _: ClientMsg, _: &mut starling_rt::Ctx<Self>) {}
}

/// Shard 0 of one under `config`, with a link to node 7.
fn linked(config: Config) -> RouterActor {
    let (_, mut shard) = shard_with(config);
    let r = RemoteNode::new(7, starling_raft::DataLinks::default(), 9);
    shard
        .destinations
        .insert(remote_key(7), Destination::Remote(r));
    shard.remote_nodes.push(7);
    shard
}

fn node(shard: &mut RouterActor) -> &mut RemoteNode {
    match shard.destinations.get_mut(&remote_key(7)) {
        Some(Destination::Remote(r)) => r,
        _ => panic!("node 7's destination"),
    }
}

fn holding(shard: &mut RouterActor) -> usize {
    node(shard).holding.len()
}

/// A publisher (its client actor kept alive with it).
fn publisher() -> (starling_rt::Addr<ClientMsg>, Publisher) {
    let client = starling_rt::start(Client);
    let p = Publisher {
        id: client.id(),
        addr: client.downgrade(),
        epoch: 0,
    };
    (client, p)
}

#[tokio::test]
async fn a_publisher_is_held_from_the_windows_high_mark_until_its_low_mark() {
    let mut config = Config::default();
    config.cluster.forward_window_messages = 8;
    let mut shard = linked(config);
    let (_client, p) = publisher();
    let key = remote_key(7);
    for _ in 0..7 {
        shard.offer_node(&key, &message(), None, Some(&p));
    }
    assert_eq!(holding(&mut shard), 0, "7 of 8 in flight");
    shard.offer_node(&key, &message(), None, Some(&p));
    assert_eq!(holding(&mut shard), 1, "held at 8");
    assert!(shard.sent_holds.contains_key(&p.id));
    let holds = &shard.shared.metrics.backpressure_holds;
    assert_eq!(holds.load(Ordering::Relaxed), 1);

    // Acknowledged down to 5: above the low mark (4), still held.
    node(&mut shard).pending.drain(..3);
    shard.window_moved(7);
    assert_eq!(holding(&mut shard), 1);
    // Down to 4: it goes.
    node(&mut shard).pending.drain(..1);
    shard.window_moved(7);
    assert_eq!(holding(&mut shard), 0);
    assert!(!shard.sent_holds.contains_key(&p.id), "released");
}

/// One node's link carries all of its subscribers' messages: the automatic window of a
/// three-node cluster (what two other members may have in flight to one backlogged
/// subscriber fits the room past its high mark: (6,096 - 500) / 2) holds nobody at one
/// subscriber's backlog bound, the window before; what waits for the node is not dropped at
/// one subscriber's queue bound either.
#[tokio::test]
async fn the_automatic_window_shares_a_subscribers_room_among_the_other_members() {
    let mut config = Config::default();
    for n in 1..=3u16 {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 7000 + n));
        config.cluster.peers.insert(u64::from(n), addr);
    }
    let mut shard = linked(config);
    let limits = &shard.shared.limits;
    assert_eq!(
        (limits.mqueue_len_hard(), limits.backlog_high()),
        (6096, 500)
    );
    assert_eq!((shard.window.high, shard.window.low), (2798, 1399));

    let (_client, p) = publisher();
    let key = remote_key(7);
    for _ in 0..2797 {
        shard.offer_node(&key, &message(), None, Some(&p));
    }
    assert_eq!(holding(&mut shard), 0);
    assert_eq!(node(&mut shard).pending.len(), 2797, "none dropped");
    shard.offer_node(&key, &message(), None, Some(&p));
    assert_eq!(holding(&mut shard), 1, "held at 2798");
    let m = &shard.shared.metrics;
    assert_eq!(m.dropped_mailbox_full.load(Ordering::Relaxed), 0);
}

/// Without peers (a lone node's shard) the room is all one other node's.
#[tokio::test]
async fn the_automatic_window_of_one_other_node_is_the_whole_room() {
    let shard = linked(Config::default());
    assert_eq!(shard.window.high, 6096 - 500);
}

/// A node that joins beyond the peers listed is one more sender: told of five members, a
/// shard of a three-peer configuration shares the room among four others ((6,096 - 500) /
/// 4 = 1,399), and its publishers are held from there. Told of fewer members than the
/// peers listed (a cold start, before every Join is applied), it keeps the peers' count.
#[tokio::test]
async fn the_automatic_window_shrinks_when_members_join_beyond_the_peers_listed() {
    let mut config = Config::default();
    for n in 1..=3u16 {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 7000 + n));
        config.cluster.peers.insert(u64::from(n), addr);
    }
    let mut shard = linked(config);
    shard.members(1);
    assert_eq!(
        shard.window.high, 2798,
        "the listed peers count at a cold start"
    );

    shard.members(5);
    assert_eq!((shard.window.high, shard.window.low), (1399, 699));
    assert_eq!(shard.remote_pending_max, 2798);
    let (_client, p) = publisher();
    let key = remote_key(7);
    for _ in 0..1398 {
        shard.offer_node(&key, &message(), None, Some(&p));
    }
    assert_eq!(holding(&mut shard), 0);
    shard.offer_node(&key, &message(), None, Some(&p));
    assert_eq!(holding(&mut shard), 1, "held at 1399");

    // Two of them left again: back to the listed peers' window.
    shard.members(3);
    assert_eq!(shard.window.high, 2798);
}

/// A window set by hand is not resized by the membership.
#[tokio::test]
async fn a_window_set_by_hand_stays_whatever_the_members() {
    let mut config = Config::default();
    config.cluster.forward_window_messages = 8;
    let mut shard = linked(config);
    shard.members(9);
    assert_eq!(shard.window.high, 8);
}
