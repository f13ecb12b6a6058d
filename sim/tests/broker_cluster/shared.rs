//! A shared group across nodes (check 8): two members of `$share/g/s/#` with persistent
//! sessions, one on each of two nodes, and a QoS 1 publisher on the publishers' node. Every
//! publish acknowledged with success must reach at least one member (each message goes to
//! one member cluster-wide; a member that reconnects may get a redelivery, MQTT 4.4). The
//! first member leaves the group and joins again all the time, so its node is often left
//! with no member while copies picked for it are on their way.

#[allow(unused_imports)]
use super::*;
use starling_codec::Unsubscribe;

/// The group's filter, and the topics the publisher spreads over.
const GROUP: &str = "$share/g/s/#";

/// What the group's clients saw.
#[derive(Default)]
pub(crate) struct SharedLog {
    /// Members whose SUBACK came.
    pub(crate) subacked: BTreeSet<usize>,
    /// Publishes sent, and those acknowledged with success.
    pub(crate) sent: u64,
    pub(crate) acked: BTreeSet<u64>,
    /// Deliveries, by member: (seq, member).
    pub(crate) got: BTreeMap<u64, BTreeSet<usize>>,
    pub(crate) publisher_done: bool,
}

/// Acknowledged publishes no member got.
pub(crate) fn lost(log: &SharedLog) -> Vec<u64> {
    log.acked
        .iter()
        .filter(|s| !log.got.contains_key(s))
        .copied()
        .collect()
}

/// Member `k` on `node`: subscribes once (persistent session), then takes what comes,
/// reconnecting (resuming) when its connection ends. Member 0 churns: it leaves the group
/// (UNSUBSCRIBE) 300-900 ms after each SUBACK, still taking what its session holds, and
/// joins again 200-600 ms after the UNSUBACK, so that its node often has no member left
/// while copies picked for it are on their way (docs/clustering.md: they are passed on).
pub(crate) async fn member(k: usize, node: usize, oracle: Shared) {
    let churn = k == 0;
    let mut o = opts(&format!("shared{k}"));
    let mut subscribed = false;
    let mut id = 1u32;
    loop {
        // Resumed, and checked to be: a member's queue must survive its reconnects.
        let Some(mut c) = resume_on(node, &mut o).await else {
            return;
        };
        // A churning member may have left the group when its connection ended: it joins
        // again (a SUBSCRIBE it holds already is granted as well).
        if (!subscribed || churn) && c.subscribe(id, GROUP, QoS::AtLeastOnce).await.is_err() {
            continue;
        }
        let mut flip: Option<Instant> = None;
        let mut joined = false;
        loop {
            let wait = flip.map_or(Duration::from_secs(3600), |t| {
                t.saturating_duration_since(Instant::now())
            });
            let p = match timeout(wait, c.recv()).await {
                Ok(Ok(p)) => p,
                Ok(Err(_)) => break,
                Err(_) => {
                    flip = None;
                    id = id % 60_000 + 1;
                    let sent = if joined {
                        c.send(&Packet::Unsubscribe(Unsubscribe {
                            packet_id: pid(id),
                            filters: vec![GROUP.into()],
                            properties: Properties::default(),
                        }))
                        .await
                    } else {
                        c.subscribe(id, GROUP, QoS::AtLeastOnce).await
                    };
                    if sent.is_err() {
                        break;
                    }
                    continue;
                }
            };
            match p {
                Packet::Suback(s) => {
                    check!(
                        s.reason_codes.iter().all(|c| !c.is_error()),
                        "shared{k}: SUBACK {:?}",
                        s.reason_codes
                    );
                    subscribed = true;
                    joined = true;
                    lock(&oracle).shared.subacked.insert(k);
                    if churn && !lock(&oracle).stop {
                        flip = Some(Instant::now() + ms(thread_rng().gen_range(300..900)));
                    }
                }
                Packet::Unsuback(_) => {
                    joined = false;
                    flip = Some(Instant::now() + ms(thread_rng().gen_range(200..600)));
                }
                Packet::Publish(p) => {
                    if let Ok(seq) = std::str::from_utf8(&p.payload).unwrap_or("").parse::<u64>() {
                        lock(&oracle).shared.got.entry(seq).or_default().insert(k);
                    }
                    if let (QoS::AtLeastOnce, Some(id)) = (p.qos, p.packet_id) {
                        if c.send(&Packet::Puback(ack(id))).await.is_err() {
                            break;
                        }
                    }
                }
                _ => {}
            }
        }
        sleep(ms(200)).await;
    }
}

/// The publisher on `node`: QoS 1, one at a time, every `pace`, until told to stop.
pub(crate) async fn publisher(node: usize, pace: Duration, oracle: Shared) {
    let o = opts("shared-publisher");
    let mut seq = 0u64;
    let mut id = 0u32;
    'connection: while !lock(&oracle).stop {
        let forever = Instant::now() + Duration::from_secs(3600);
        let Some((mut c, _)) = connect_by(mqtt_addr(node), &o, forever).await else {
            break;
        };
        while !lock(&oracle).stop {
            seq += 1;
            id = id % 60_000 + 1;
            let p = Packet::Publish(Publish {
                dup: false,
                qos: QoS::AtLeastOnce,
                retain: false,
                topic: format!("s/{}", seq % 3),
                packet_id: Some(pid(id)),
                properties: Properties::default(),
                payload: Bytes::from(seq.to_string()),
            });
            lock(&oracle).shared.sent += 1;
            if c.send(&p).await.is_err() {
                continue 'connection;
            }
            // Longer than a forward's timeout (15 s): an unconfirmed forward is answered.
            loop {
                match timeout(Duration::from_secs(20), c.recv()).await {
                    Ok(Ok(Packet::Puback(a))) if a.packet_id == pid(id) => {
                        if a.reason_code == ReasonCode::Success {
                            lock(&oracle).shared.acked.insert(seq);
                        }
                        break;
                    }
                    Ok(Ok(_)) => {}
                    _ => continue 'connection,
                }
            }
            sleep(pace).await;
        }
    }
    lock(&oracle).shared.publisher_done = true;
}
