//! A shared group across nodes (check 8): two members of `$share/g/s/#` with persistent
//! sessions, one on each of two nodes, and a QoS 1 publisher on the publishers' node. Every
//! publish acknowledged with success must reach at least one member (each message goes to
//! one member cluster-wide; a member that reconnects may get a redelivery, MQTT 4.4).

#[allow(unused_imports)]
use super::*;

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
/// reconnecting (resuming) when its connection ends.
pub(crate) async fn member(k: usize, node: usize, oracle: Shared) {
    let mut o = opts(&format!("shared{k}"));
    let mut subscribed = false;
    loop {
        // Resumed, and checked to be: a member's queue must survive its reconnects.
        let Some(mut c) = resume_on(node, &mut o).await else {
            return;
        };
        if !subscribed && c.subscribe(1, GROUP, QoS::AtLeastOnce).await.is_err() {
            continue;
        }
        loop {
            let Ok(p) = c.recv().await else { break };
            match p {
                Packet::Suback(s) => {
                    check!(
                        s.reason_codes.iter().all(|c| !c.is_error()),
                        "shared{k}: SUBACK {:?}",
                        s.reason_codes
                    );
                    subscribed = true;
                    lock(&oracle).shared.subacked.insert(k);
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
