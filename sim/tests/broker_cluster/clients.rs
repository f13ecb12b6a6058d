//! The clients: persistent subscribers, the publishers and the mover.

#[allow(unused_imports)]
use super::*;

pub(crate) fn opts(client_id: &str) -> ConnectOpts {
    ConnectOpts {
        client_id: client_id.to_owned(),
        protocol: Protocol::V5,
        clean_start: true,
        session_expiry: 3600,
        will: None,
    }
}

/// Connects until a CONNACK with success comes back, or `deadline` passes.
pub(crate) async fn connect_by(
    addr: SocketAddr,
    o: &ConnectOpts,
    deadline: Instant,
) -> Option<(MqttClient, starling_codec::Connack)> {
    while Instant::now() < deadline {
        if let Ok(Ok(c)) = timeout(Duration::from_secs(5), MqttClient::connect(addr, o)).await {
            return Some(c);
        }
        sleep(ms(200)).await;
    }
    None
}

/// Connects `o`'s client to `node` (retrying as long as it takes), checks that the session
/// a previous connection left there is still there, and makes the next connection resume
/// it. `None`: it never connected.
pub(crate) async fn resume_on(node: usize, o: &mut ConnectOpts) -> Option<MqttClient> {
    let forever = Instant::now() + Duration::from_secs(3600);
    let (c, connack) = connect_by(mqtt_addr(node), o, forever).await?;
    check!(
        o.clean_start || connack.session_present,
        "{}: its session on node{} is gone",
        o.client_id,
        node + 1
    );
    o.clean_start = false;
    Some(c)
}

/// A persistent session of `client_id` left on `node`: connected, subscribed to `filter` at
/// QoS 1 (until the SUBACK), disconnected. From a client node of its own.
pub(crate) async fn leave_subscribed(
    clients: &mut ClientNodes,
    node: usize,
    client_id: &str,
    filter: &str,
) {
    let (client_id, filter) = (client_id.to_owned(), filter.to_owned());
    let forever = Instant::now() + Duration::from_secs(60);
    let task = clients.node(&client_id).spawn(async move {
        let (mut c, _) = connect_by(mqtt_addr(node), &opts(&client_id), forever)
            .await
            .expect("the subscriber connects");
        c.subscribe(1, &filter, QoS::AtLeastOnce)
            .await
            .expect("the subscriber subscribes");
        while !matches!(c.recv().await.expect("a SUBACK"), Packet::Suback(_)) {}
        c.disconnect().await;
    });
    task.await.expect("the subscriber's connection");
}

/// Connects `client_id` (from client node `name`) to `node` with its session kept, and
/// takes the messages that come, acknowledging each, until it has `n` or 10 s pass
/// quietly: (session present, the numbers of the messages, as `parse` reads them).
pub(crate) async fn resume_and_take(
    clients: &mut ClientNodes,
    name: &str,
    node: usize,
    client_id: &str,
    n: usize,
) -> (bool, Vec<u64>) {
    let task = spawn_resume_and_take(clients, name, node, client_id, n, Duration::from_secs(10));
    task.await.expect("the client's connection")
}

/// As [`resume_and_take`], on a task of its own, with `quiet` the time without a message
/// after which it stops waiting.
pub(crate) fn spawn_resume_and_take(
    clients: &mut ClientNodes,
    name: &str,
    node: usize,
    client_id: &str,
    n: usize,
    quiet: Duration,
) -> madsim::task::JoinHandle<(bool, Vec<u64>)> {
    let id = client_id.to_owned();
    clients.node(name).spawn(async move {
        let mut o = opts(&id);
        o.clean_start = false;
        let forever = Instant::now() + Duration::from_secs(600);
        let (mut c, connack) = connect_by(mqtt_addr(node), &o, forever)
            .await
            .expect("the client connects with its session kept");
        let mut got = Vec::new();
        while connack.session_present && got.len() < n {
            match timeout(quiet, c.recv()).await {
                Ok(Ok(Packet::Publish(p))) => {
                    puback(&mut c, &p).await;
                    got.push(parse(&p.payload).1);
                }
                Ok(Ok(_)) => {}
                _ => break,
            }
        }
        c.disconnect().await;
        (connack.session_present, got)
    })
}

/// `n` QoS 1 publishes to `topic` through `node` by `client_id`, each acknowledged before
/// the next; the payload of number `seq` (from 1) is `payload(seq)`.
pub(crate) async fn publish_acked(
    clients: &mut ClientNodes,
    node: usize,
    (client_id, topic): (&str, &str),
    n: u64,
    payload: fn(u64) -> Bytes,
) {
    let (client_id, topic) = (client_id.to_owned(), topic.to_owned());
    let forever = Instant::now() + Duration::from_secs(60);
    let task = clients.node(&client_id).spawn(async move {
        let (mut c, _) = connect_by(mqtt_addr(node), &opts(&client_id), forever)
            .await
            .expect("the publisher connects");
        publish_numbered(&mut c, &topic, n, payload).await;
        c.disconnect().await;
    });
    task.await.expect("the publisher");
}

/// `n` QoS 1 publishes to `topic` on connection `c`, each acknowledged before the next;
/// the payload of number `seq` (from 1) is `payload(seq)`.
pub(crate) async fn publish_numbered(
    c: &mut MqttClient,
    topic: &str,
    n: u64,
    payload: fn(u64) -> Bytes,
) {
    for seq in 1..=n {
        let publish = numbered(topic, seq, payload(seq));
        c.send(&publish).await.expect("publish");
        while !matches!(c.recv().await.expect("a PUBACK"), Packet::Puback(_)) {}
    }
}

/// QoS 1 publish number `seq` (its packet id) to `topic`.
pub(crate) fn numbered(topic: &str, seq: u64, payload: Bytes) -> Packet {
    Packet::Publish(Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: false,
        topic: topic.into(),
        packet_id: Some(pid(seq as u32)),
        properties: Properties::default(),
        payload,
    })
}

/// Acknowledges a QoS 1 publish `p` on `c` (nothing for QoS 0); a broken connection shows
/// at the next read.
pub(crate) async fn puback(c: &mut MqttClient, p: &Publish) {
    if let Some(id) = p.packet_id {
        let _ = c.send(&Packet::Puback(ack(id))).await;
    }
}

pub(crate) fn ack(id: std::num::NonZeroU16) -> PubAck {
    PubAck::new(id)
}

pub(crate) fn parse(payload: &[u8]) -> (usize, u64) {
    let s = std::str::from_utf8(payload).expect("utf-8 payload");
    let (a, b) = s.split_once(':').expect("publisher:seq");
    (a.parse().expect("publisher"), b.parse().expect("seq"))
}

pub(crate) fn subscribe_all(id: u32) -> Packet {
    Packet::Subscribe(Subscribe {
        packet_id: pid(id),
        filters: vec![SubscribeFilter {
            filter: "t/#".into(),
            options: SubscriptionOptions {
                qos: QoS::ExactlyOnce,
                no_local: false,
                retain_as_published: false,
                retain_handling: RetainHandling::DoNotSend,
            },
        }],
        properties: Properties::default(),
    })
}

/// A persistent subscriber on `node`: subscribes once, then records every delivery,
/// reconnecting (resuming its session) if its connection ends.
pub(crate) async fn subscriber(k: usize, node: usize, variant: Variant, oracle: Shared) {
    let mut o = opts(&format!("sub{k}"));
    // QoS 2 packet ids received and not yet released, kept across connections as MQTT asks
    // of a client (§4.3.3): a resent PUBLISH of one of them is not a new message.
    let mut unreleased: BTreeSet<u16> = BTreeSet::new();
    let mut subscribed = false;
    loop {
        let Some(mut c) = resume_on(node, &mut o).await else {
            return;
        };
        if !subscribed && c.send(&subscribe_all(1)).await.is_err() {
            continue;
        }
        loop {
            let Ok(p) = c.recv().await else { break };
            match p {
                Packet::Suback(s) => {
                    check!(
                        s.reason_codes == [ReasonCode::GrantedQoS2],
                        "sub{k}: SUBACK {:?}",
                        s.reason_codes
                    );
                    subscribed = true;
                    lock(&oracle).subacked.insert(k, elapsed());
                }
                Packet::Publish(p) => {
                    let (publisher, seq) = parse(&p.payload);
                    let topic: u64 = p.topic["t/".len()..].parse().expect("t/N");
                    let new = match (p.qos, p.packet_id) {
                        (QoS::ExactlyOnce, Some(id)) => unreleased.insert(id.get()),
                        _ => true,
                    };
                    if new {
                        lock(&oracle).arrivals.entry(k).or_default().push(Arrival {
                            publisher,
                            seq,
                            topic,
                            dup: p.dup,
                        });
                    }
                    if !variant.ack_delay.is_zero() {
                        sleep(variant.ack_delay).await;
                    }
                    let reply = match (p.qos, p.packet_id) {
                        (QoS::AtLeastOnce, Some(id)) => Some(Packet::Puback(ack(id))),
                        (QoS::ExactlyOnce, Some(id)) => Some(Packet::Pubrec(ack(id))),
                        _ => None,
                    };
                    if let Some(r) = reply {
                        if c.send(&r).await.is_err() {
                            break;
                        }
                    }
                }
                Packet::Pubrel(r) => {
                    unreleased.remove(&r.packet_id.get());
                    if c.send(&Packet::Pubcomp(ack(r.packet_id))).await.is_err() {
                        break;
                    }
                }
                Packet::Disconnect(d) => {
                    check!(
                        false,
                        "sub{k} was disconnected by node{}: {:?}",
                        node + 1,
                        d.reason_code
                    );
                }
                _ => {}
            }
        }
        lock(&oracle).subscriber_reconnects += 1;
        sleep(ms(200)).await;
    }
}

#[derive(Clone, Copy)]
pub(crate) enum Stage {
    /// QoS 1 awaiting PUBACK, or QoS 2 awaiting PUBREC.
    Published,
    /// QoS 2 awaiting PUBCOMP.
    Released,
}

pub(crate) struct Pending {
    pub(crate) seq: u64,
    pub(crate) topic: u64,
    pub(crate) stage: Stage,
}

pub(crate) fn publish_packet(k: usize, id: u16, qos: QoS, p: &Pending, dup: bool) -> Packet {
    Packet::Publish(Publish {
        dup,
        qos,
        retain: false,
        topic: format!("t/{}", p.topic),
        packet_id: Some(pid(u32::from(id) - 1)),
        properties: Properties::default(),
        payload: Bytes::from(format!("{k}:{}", p.seq)),
    })
}

/// Publisher `k` on `node`: up to `WINDOW` publishes in flight, one every `pace`, on
/// random topics, until told to stop (and `PUBLISH_MIN` are sent); then it settles what is
/// in flight and ends. Each
/// publish is sent once (resent with DUP only after a reconnect, as MQTT asks): one whose
/// acknowledgement is a failure is not tried again.
pub(crate) async fn publisher(k: usize, node: usize, pace: Duration, oracle: Shared) {
    let qos = PUBLISHER_QOS[k];
    let mut o = opts(&format!("pub{k}"));
    let mut pending: BTreeMap<u16, Pending> = BTreeMap::new();
    let mut seq = 0u64;
    let mut next_id = 0u32;
    loop {
        let Some(mut c) = resume_on(node, &mut o).await else {
            return;
        };
        // Resend what is not acknowledged (MQTT 5 §4.4): PUBLISH with DUP, or PUBREL.
        let mut up = true;
        for (id, p) in &pending {
            let pkt = match p.stage {
                Stage::Published => publish_packet(k, *id, qos, p, true),
                Stage::Released => Packet::Pubrel(ack(pid(u32::from(*id) - 1))),
            };
            if c.send(&pkt).await.is_err() {
                up = false;
                break;
            }
        }
        if !up {
            sleep(ms(200)).await;
            continue;
        }
        let mut next_at = Instant::now();
        loop {
            let stop = lock(&oracle).stop && seq >= PUBLISH_MIN;
            if stop && pending.is_empty() {
                lock(&oracle).publishers_done += 1;
                c.disconnect().await;
                return;
            }
            let now = Instant::now();
            if !stop && seq < PUBLISH_MAX && pending.len() < WINDOW && now >= next_at {
                next_at = now + pace;
                seq += 1;
                let topic = thread_rng().gen_range(0..TOPICS);
                lock(&oracle).sent.insert(
                    (k, seq),
                    Sent {
                        topic,
                        qos,
                        at: elapsed(),
                    },
                );
                next_id += 1;
                let id = pid(next_id).get();
                let p = Pending {
                    seq,
                    topic,
                    stage: Stage::Published,
                };
                let pkt = publish_packet(k, id, qos, &p, false);
                pending.insert(id, p);
                if c.send(&pkt).await.is_err() {
                    break;
                }
            }
            let wait = if pending.len() < WINDOW && !stop {
                next_at.saturating_duration_since(Instant::now())
            } else {
                ms(100)
            };
            let Ok(r) = timeout(wait, c.recv()).await else {
                continue;
            };
            let Ok(pkt) = r else { break };
            match pkt {
                Packet::Puback(a) if qos == QoS::AtLeastOnce => {
                    if let Some(p) = pending.remove(&a.packet_id.get()) {
                        settle(&oracle, k, p.seq, a.reason_code, "PUBACK");
                    }
                }
                Packet::Pubrec(a) if qos == QoS::ExactlyOnce => {
                    let id = a.packet_id.get();
                    if a.reason_code == ReasonCode::Success {
                        if let Some(p) = pending.get_mut(&id) {
                            p.stage = Stage::Released;
                        }
                        if c.send(&Packet::Pubrel(ack(a.packet_id))).await.is_err() {
                            break;
                        }
                    } else if let Some(p) = pending.remove(&id) {
                        // A failed PUBREC ends the exchange (MQTT 5 §4.3.3).
                        settle(&oracle, k, p.seq, a.reason_code, "PUBREC");
                    }
                }
                Packet::Pubcomp(a) if qos == QoS::ExactlyOnce => {
                    if let Some(p) = pending.remove(&a.packet_id.get()) {
                        // 0x92 answers a PUBREL resent after the broker completed it (its
                        // PUBCOMP went down with the connection): it was delivered.
                        let code = match a.reason_code {
                            ReasonCode::PacketIdentifierNotFound => ReasonCode::Success,
                            c => c,
                        };
                        settle(&oracle, k, p.seq, code, "PUBCOMP");
                    }
                }
                Packet::Disconnect(d) => {
                    check!(
                        false,
                        "pub{k} disconnected by node{}: {:?}",
                        node + 1,
                        d.reason_code
                    );
                }
                other => check!(false, "pub{k} ({qos:?}) got {other:?}"),
            }
        }
        sleep(ms(200)).await;
    }
}

/// Records the outcome of (publisher, seq). Success confirms it; 0x80 (its destination
/// nodes did not acknowledge in time) and 0x97 (a node's forwarding queue was full) leave
/// it unconfirmed; anything else is wrong here (0x10 would mean that node 1 did not know
/// of subscribers that were routed before the first publish).
pub(crate) fn settle(oracle: &Shared, k: usize, seq: u64, code: ReasonCode, what: &str) {
    let ok = match code {
        ReasonCode::Success => true,
        ReasonCode::UnspecifiedError | ReasonCode::QuotaExceeded => false,
        other => {
            check!(false, "pub{k}: {what} {other:?} for message {seq}");
            false
        }
    };
    lock(oracle).settled.insert((k, seq), ok);
}

/// Reads the mover's connection `idx` (to `node`, its CONNECT sent at `since`) until it
/// ends, and records how.
pub(crate) async fn watch_mover(
    idx: usize,
    (node, since): (usize, Duration),
    mut c: MqttClient,
    oracle: Shared,
    faults: Faults,
) {
    let how = loop {
        match c.recv().await {
            Ok(Packet::Disconnect(d)) => break format!("DISCONNECT {:?}", d.reason_code),
            Ok(Packet::Publish(p)) => {
                if p.topic.starts_with("t/") {
                    let mut g = lock(&oracle);
                    g.mover_got.insert(parse(&p.payload));
                    g.mover_arrivals.push(parse(&p.payload));
                }
                puback(&mut c, &p).await;
            }
            Ok(_) => {}
            Err(_) => break "closed".to_string(),
        }
    };
    // A node killed under it closes it, moved or not.
    let (killed, log) = {
        let f = lock(&faults);
        (f.killed_since(node, since), f.log.join("\n"))
    };
    let mut g = lock(&oracle);
    let superseded = g.superseded_by.get(&idx).copied();
    check!(
        how == "closed" || how == "DISCONNECT SessionTakenOver",
        "mover connection {idx} ended with {how}"
    );
    check!(
        superseded.is_some() || killed,
        "mover connection {idx} to node{} (CONNECT from {since:?}) ended ({how}) at {:?} before any other connection took its session\nfaults:\n{log}",
        node + 1,
        elapsed()
    );
    g.ended.insert(idx, (elapsed(), how));
}

/// The mover subscribes to the publishers' topics and reads up to a SUBACK that grants it,
/// taking the publishes routed to it meanwhile; a refusal (0x80: a node that cannot confirm
/// the retained messages without a quorum) is tried again, as a real client would. False if
/// the connection broke first.
async fn mover_subscribes(c: &mut MqttClient, oracle: &Shared) -> bool {
    loop {
        match mover_subscribe_once(c, oracle).await {
            Some(true) => return true,
            Some(false) => sleep(ms(250)).await,
            None => return false,
        }
    }
}

/// One SUBSCRIBE of the mover: whether it was granted, `None` if the connection broke.
async fn mover_subscribe_once(c: &mut MqttClient, oracle: &Shared) -> Option<bool> {
    c.subscribe(1, "t/#", QoS::AtLeastOnce).await.ok()?;
    loop {
        match c.recv().await {
            Ok(Packet::Suback(s)) => {
                return Some(!s.reason_codes.iter().any(|r| r.is_error()));
            }
            // Publishes routed to it between the SUBACK's routing and its sending.
            Ok(Packet::Publish(p)) => {
                if p.topic.starts_with("t/") {
                    let mut g = lock(oracle);
                    g.mover_got.insert(parse(&p.payload));
                    g.mover_arrivals.push(parse(&p.payload));
                }
                puback(c, &p).await;
            }
            Ok(other) => check!(false, "the mover got {other:?} before its SUBACK"),
            Err(_) => return None,
        }
    }
}

/// The mover: its client id connects on node 2, then on node 3 while connected on node 2,
/// then on node 2 again (or, going round `nodes`, on node 1), and so on, each connection
/// held a while; one move after the heal.
pub(crate) async fn mover(setup: Arc<Setup>, faults: Faults, oracle: Shared, nodes: Vec<usize>) {
    let mut o = opts(MOVER);
    let mut at = nodes[0];
    let forever = Instant::now() + Duration::from_secs(3600);
    let first_at = elapsed();
    let Some((mut c, _)) = connect_by(mqtt_addr(at), &o, forever).await else {
        return;
    };
    o.clean_start = false;
    // The publishers' topics: what was routed to its session while it moved must reach it
    // (check 9).
    if !mover_subscribes(&mut c, &oracle).await {
        check!(false, "the mover's first connection did not hold");
        return;
    }
    lock(&oracle).mover_subacked = Some(elapsed());
    let mut conn = 0usize;
    let watch = (at, first_at);
    starling_rt::spawn(watch_mover(conn, watch, c, oracle.clone(), faults.clone()));
    loop {
        let (least, most) = setup.variant.move_pause_ms;
        sleep(ms(thread_rng().gen_range(least..most))).await;
        let last = lock(&oracle).healed;
        let next = nodes.iter().position(|n| *n == at).map_or(0, |i| i + 1);
        let to = nodes[next % nodes.len()];
        let before = lock(&faults).clock;
        let started = elapsed();
        let index = {
            let mut g = lock(&oracle);
            let index = g.moves.len();
            g.superseded_by.insert(conn, index);
            index
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        let Some((c, connack)) = connect_by(mqtt_addr(to), &o, deadline).await else {
            check!(
                false,
                "the mover could not connect to node{} for 30 s",
                to + 1
            );
            return;
        };
        let connack_at = elapsed();
        let after = lock(&faults).clock;
        let clean = FaultClock::calm_through(&before, &after, started);
        // Asked at once (an actor's answer, no network in between): if the old node still
        // holds the session now, it held it when the new node sent its CONNACK.
        let left_behind = match (clean, setup.admin(at)) {
            (true, Some(a)) => a.client(MOVER).await,
            _ => None,
        };
        let faults_so_far = || lock(&faults).log.join("\n");
        if let Some(info) = &left_behind {
            check!(
                false,
                "move {index} node{}->node{} (begun at {started:?}): at the CONNACK, node{} still has the session ({info:?})\nfaults:\n{}",
                at + 1,
                to + 1,
                at + 1,
                faults_so_far()
            );
        }
        check!(
            !clean || connack.session_present,
            "move {index} node{}->node{} (begun at {started:?}, CONNACK at {connack_at:?}): the session did not move (session present false)\nfaults:\n{}",
            at + 1,
            to + 1,
            faults_so_far()
        );
        lock(&oracle).moves.push(Move {
            from: at,
            to,
            started,
            connack: connack_at,
            clean,
            session_present: connack.session_present,
        });
        let mut c = c;
        // Told its session is gone, it subscribes again, as a real client does: what was
        // sent from the move's start to this SUBACK is excused (check 9). A connection that
        // breaks first is left to the next move.
        if !connack.session_present && mover_subscribes(&mut c, &oracle).await {
            lock(&oracle).mover_lost.push((started, elapsed()));
        }
        conn += 1;
        // From the CONNECT on: a node killed with the CONNACK on its way closes it too.
        let watch = (to, started);
        starling_rt::spawn(watch_mover(conn, watch, c, oracle.clone(), faults.clone()));
        at = to;
        if last && clean {
            break;
        }
    }
    lock(&oracle).mover_done = true;
}
