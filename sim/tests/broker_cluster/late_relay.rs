//! A copy routed to a moving session's old node before the move's cut that reaches it long
//! after: node C cannot reach node A, so the QoS 1 publishes C routes to a session on A are
//! parked in C's outbox (and acknowledged to their publisher). The session's client then
//! moves to node B, and only 45 s later, well past the 30 s the relay used to last, does
//! the cut between C and A heal. C sends the parked batches again; A must still relay them
//! to the session, now on B, which gets each once. (Before, A's relay had ended, and the
//! parked messages were dropped there.)
//!
//! [`OldNode::Restarted`]: A is also killed and restarted after the move, before the
//! parked copies come: its relay comes back from its store. [`OldNode::KilledRelaying`]:
//! A cannot reach B when the parked copies come, and is killed 0.5 s later, before its
//! relay is parked: it must not have acknowledged them to C, which sends them again
//! after A's restart. [`OldNode::KilledAtHandover`]: A is killed the moment the session
//! has left it for B (its commits set 200 ms apart under load): its relay must come back
//! from its store. (The hand-over waits for A's record of the move; an idle store commits
//! it at once anyway, so this run passes without that wait too.)
//! [`OldNode::NewNodeKilledAtHandover`]: A stays up, and C cannot reach B either, where a
//! second persistent session subscribed to the same filter, so C parks the same copies
//! for B too; B is killed the moment it has stored the session handed over to it. The
//! copies C routed to B before the move's cut come after B's restart: B must skip them
//! for the moved session, whose copies A relays, so it must have stored that judgement
//! before the session (before, it was stored with the shard's next commit, after the
//! session, and each message came twice).
//! [`OldNode::KilledRelayingBesideStayer`]: as `KilledRelaying`, with a second persistent
//! session on A subscribed to the same filter. A stores its copy of each parked message
//! with the link's cursor, which then covers the copy A relays too: A must have written
//! the relayed copy to its outbox in that commit, or the restarted A skips it when C sends
//! the batch again (lost before the relay was parked with the cursor).
//! [`OldNode::KilledRelayingBesideStayerWithoutOutbox`]: the same with A's outbox off
//! (`cluster.outbox_max_messages = 0`, A restarted so before the scenario): A must still
//! park a copy it relays, whatever the outbox's bound for its own publishes (before, it
//! kept it in memory only, and the cursor stored with the stayer's copy covered it).

#[allow(unused_imports)]
use super::*;
use std::sync::atomic::{AtomicBool, Ordering};

/// Three nodes with stores (C parks what A does not take), no nemesis: the scenario cuts
/// C off from A itself. Batches are parked after 1.2 s without an acknowledgement.
pub(crate) const LATE_RELAY: Variant = Variant {
    name: "late-relay",
    faults: false,
    mqtt: "max_mqueue_len = 100000\nbackpressure_max_secs = 1\n",
    cluster: "forward_timeout_ms = 200\n",
    ..SOUND
};

/// The same, its run in a directory of its own (the old node is restarted).
pub(crate) const LATE_RELAY_RESTART: Variant = Variant {
    name: "late-relay-restart",
    ..LATE_RELAY
};

/// The same, the old node killed as it relays.
pub(crate) const LATE_RELAY_KILLED: Variant = Variant {
    name: "late-relay-killed",
    ..LATE_RELAY
};

/// The same with every commit of the stores put off by 200 ms, the old node killed as the
/// session leaves it.
pub(crate) const LATE_RELAY_HANDOVER_KILL: Variant = Variant {
    name: "late-relay-handover-kill",
    storage: "commit_interval_ms = 200\n",
    ..LATE_RELAY
};

/// The same with the relay ending 30 s after the cut whatever may still come
/// (`cluster.handover_relay_wait = false`): the parked messages are lost at A.
pub(crate) const LATE_RELAY_NO_WAIT: Variant = Variant {
    name: "late-relay-no-wait",
    cluster: "forward_timeout_ms = 200\nhandover_relay_wait = false\n",
    ..LATE_RELAY
};

/// The same with the stores' commits 200 ms apart, the new node killed as it stored the
/// session.
pub(crate) const LATE_RELAY_NEW_NODE_KILL: Variant = Variant {
    name: "late-relay-new-node-kill",
    storage: "commit_interval_ms = 200\n",
    ..LATE_RELAY
};

/// The same, with a persistent session beside the moved one on the old node.
pub(crate) const LATE_RELAY_KILLED_STAYER: Variant = Variant {
    name: "late-relay-killed-stayer",
    ..LATE_RELAY
};

/// The same, the old node's outbox off.
pub(crate) const LATE_RELAY_KILLED_STAYER_NO_OUTBOX: Variant = Variant {
    name: "late-relay-killed-stayer-no-outbox",
    ..LATE_RELAY
};

const ROAMER: &str = "relay-roamer";
/// A persistent session on A with the roamer's filter (`KilledRelayingBesideStayer`).
const STAYER: &str = "relay-stayer";
const FILTER: &str = "relay/#";
/// Publishes parked at C for the roamer's session on A.
const PARKED: u64 = 5;
/// How long after the move C stays cut off from A.
const CUT_OFF: Duration = Duration::from_secs(45);

/// What becomes of the session's old node meanwhile.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum OldNode {
    Up,
    Restarted,
    KilledRelaying,
    KilledRelayingBesideStayer,
    /// As `KilledRelayingBesideStayer`, A's outbox off.
    KilledRelayingBesideStayerWithoutOutbox,
    KilledAtHandover,
    /// Up; the new node is killed instead (see the module's doc).
    NewNodeKilledAtHandover,
}

/// Kills node `n` (its store losing what it had not synced) and starts it again 2 s later.
async fn restart(setup: &Setup, cluster: &Cluster, n: usize) {
    cluster.kill(n);
    setup.crash_disk(n);
    lock(&setup.admins).remove(&n);
    sleep(Duration::from_secs(2)).await;
    cluster.restart(n);
}

pub(crate) async fn scenario(variant: Variant, old: OldNode) {
    let (setup, cluster, base) = start(variant, 1, true);
    // Raft runs between the leader and each follower: the cut is between the followers,
    // so that every node goes on applying the log (the move's cut included).
    let (b, a, c) = leader_and_followers(&setup).await;
    let mut clients = ClientNodes::default();
    let forever = Instant::now() + Duration::from_secs(600);
    let no_outbox = old == OldNode::KilledRelayingBesideStayerWithoutOutbox;
    if no_outbox {
        lock(&setup.node_cluster).insert(a, "outbox_max_messages = 0\n");
        restart(&setup, &cluster, a).await;
        let again = wait_leader(&setup, Duration::from_secs(30)).await;
        check!(
            again == Some(b as u64 + 1),
            "the leader moved from node {} to {again:?} as A restarted with its outbox off",
            b + 1
        );
    }

    // The roamer's session on A, its filter routed to A by C.
    leave_subscribed(&mut clients, a, ROAMER, FILTER).await;
    let stayer = old == OldNode::KilledRelayingBesideStayer || no_outbox;
    if stayer {
        leave_subscribed(&mut clients, a, STAYER, FILTER).await;
    }
    // C routes the filter to B as well, for a session there.
    let both = old == OldNode::NewNodeKilledAtHandover;
    if both {
        leave_subscribed(&mut clients, b, STAYER, FILTER).await;
    }
    let routed_to = if both { vec![a, b] } else { vec![a] };
    wait_routed(&setup, c, FILTER, &routed_to).await;
    let c_admin = setup.admin(c).expect("C runs");

    // C cannot reach A: its publishes for the session are parked, and acknowledged.
    if both {
        // Nor B, the leader: the publisher is connected first (its claim is a commit).
        let go = Arc::new(AtomicBool::new(false));
        let publisher = connected_publisher(&mut clients, c, go.clone()).await;
        cluster.clog_one_way(c, a);
        cluster.clog_one_way(c, b);
        go.store(true, Ordering::SeqCst);
        publisher.await.expect("the publisher");
    } else {
        cluster.clog_one_way(c, a);
        publish_acked(
            &mut clients,
            c,
            ("relay-publisher", "relay/x"),
            PARKED,
            |seq| Bytes::from(format!("0:{seq}")),
        )
        .await;
    }
    let parked = c_admin.metrics().cluster_outbox_parked;
    let wanted = if both { 2 * PARKED } else { PARKED };
    check!(
        parked >= wanted,
        "C parked {parked} messages, not the {wanted} it could not deliver"
    );

    // The roamer moves to B, and waits there for what was routed to its session on A
    // (connected again, its session kept, after a kill of B).
    let roamer = clients.node("relay-roamer").spawn(async move {
        let mut o = opts(ROAMER);
        o.clean_start = false;
        let mut got = Vec::new();
        let mut present = true;
        let by = Instant::now() + CUT_OFF + Duration::from_secs(60);
        'conn: while present && Instant::now() < by {
            let (mut c, connack) = connect_by(mqtt_addr(b), &o, forever)
                .await
                .expect("the roamer connects to B");
            present = connack.session_present;
            if !present {
                c.disconnect().await;
                break;
            }
            loop {
                let left = by.saturating_duration_since(Instant::now());
                match timeout(left, c.recv()).await {
                    Ok(Ok(Packet::Publish(p))) => {
                        puback(&mut c, &p).await;
                        got.push(parse(&p.payload).1);
                        // One more than expected is waited for only briefly: a copy twice.
                        if got.len() == PARKED as usize {
                            let extra = timeout(Duration::from_secs(10), c.recv()).await;
                            if let Ok(Ok(Packet::Publish(p))) = extra {
                                got.push(parse(&p.payload).1);
                            }
                            c.disconnect().await;
                            break 'conn;
                        }
                    }
                    Ok(Ok(_)) => {}
                    Ok(Err(_)) => continue 'conn,
                    Err(_) => break,
                }
            }
            c.disconnect().await;
            break;
        }
        (present, got)
    });
    match old {
        OldNode::Up => sleep(CUT_OFF).await,
        OldNode::Restarted => {
            // Once the move is done and stored on A (its session dropped there, its relay
            // kept), A is killed, loses what it had not synced, and starts again.
            sleep(Duration::from_secs(5)).await;
            restart(&setup, &cluster, a).await;
            sleep(CUT_OFF - Duration::from_secs(7)).await;
        }
        OldNode::KilledAtHandover => {
            // The moment the session has left A for B (asked of each node's actors, no
            // network in between): A's record of the move is due with its next commit,
            // up to 200 ms later, unless the hand-over waited for it.
            let (a_admin, b_admin) = (
                setup.admin(a).expect("A runs"),
                setup.admin(b).expect("B runs"),
            );
            let by = Instant::now() + Duration::from_secs(30);
            while a_admin.client(ROAMER).await.is_some() || b_admin.client(ROAMER).await.is_none() {
                check!(
                    Instant::now() < by,
                    "the roamer's session did not move from A to B within 30 s"
                );
                sleep(ms(1)).await;
            }
            restart(&setup, &cluster, a).await;
            sleep(CUT_OFF - Duration::from_secs(2)).await;
        }
        OldNode::NewNodeKilledAtHandover => {
            // The moment B has stored the session handed over to it (asked of its
            // actors): its judgement of the move must be stored already.
            wait_session_stored(&setup, b).await;
            restart(&setup, &cluster, b).await;
            sleep(CUT_OFF - Duration::from_secs(2)).await;
        }
        OldNode::KilledRelaying
        | OldNode::KilledRelayingBesideStayer
        | OldNode::KilledRelayingBesideStayerWithoutOutbox => {
            sleep(CUT_OFF).await;
            // A takes C's parked batches but cannot relay them to B (parked after 1.2 s).
            cluster.clog_one_way(a, b);
            cluster.unclog_one_way(c, a);
            sleep(ms(500)).await;
            restart(&setup, &cluster, a).await;
        }
    }
    cluster.heal_network();

    let (present, mut got) = roamer.await.expect("the roamer's connection");
    check!(
        present,
        "the roamer's session was not there after its move to B (session present 0)"
    );
    got.sort_unstable();
    check!(
        got == (1..=PARKED).collect::<Vec<_>>(),
        "the roamer got {got:?} of the {PARKED} messages parked for its session on A \
         (wanted each once)"
    );
    if stayer {
        // Its copies were what made A store the link's cursor: they are all there too.
        let (present, mut got) =
            resume_and_take(&mut clients, STAYER, a, STAYER, PARKED as usize).await;
        got.sort_unstable();
        got.dedup();
        check!(
            present && got == (1..=PARKED).collect::<Vec<_>>(),
            "the stayer on A got {got:?} of the {PARKED} parked messages (session present \
             {present})"
        );
    }
    let _ = std::fs::remove_dir_all(&base);
}

/// The publisher connected to `node`, its [`PARKED`] QoS 1 publishes to `relay/x` (each
/// acknowledged before the next) going once `go` is set.
async fn connected_publisher(
    clients: &mut ClientNodes,
    node: usize,
    go: Arc<AtomicBool>,
) -> madsim::task::JoinHandle<()> {
    let connected = Arc::new(AtomicBool::new(false));
    let up = connected.clone();
    let task = clients.node("relay-publisher").spawn(async move {
        let forever = Instant::now() + Duration::from_secs(60);
        let (mut c, _) = connect_by(mqtt_addr(node), &opts("relay-publisher"), forever)
            .await
            .expect("the publisher connects");
        up.store(true, Ordering::SeqCst);
        while !go.load(Ordering::SeqCst) {
            sleep(ms(10)).await;
        }
        publish_numbered(&mut c, "relay/x", PARKED, |seq| {
            Bytes::from(format!("0:{seq}"))
        })
        .await;
        c.disconnect().await;
    });
    while !connected.load(Ordering::SeqCst) {
        sleep(ms(10)).await;
    }
    task
}
