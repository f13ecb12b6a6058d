//! Retained reads (check 6): a writer on the publishers' node sets the retained message of
//! `r/0` again and again (QoS 1, payload its sequence number, one at a time), and a reader
//! on each other node subscribes to `r/0`, takes the retained message the SUBSCRIBE gives,
//! unsubscribes, and does it again. A read whose SUBACK granted the subscription must see
//! the last write acknowledged before its SUBSCRIBE was sent, or a later one
//! (`cluster.retained_reads = "linearizable"`, docs/clustering.md); a refused SUBACK (no
//! quorum) is allowed. The `local` variant serves reads from the node's own replica and
//! must be caught.

#[allow(unused_imports)]
use super::*;

use starling_codec::Unsubscribe;

/// The topic the writer keeps a retained message on.
const TOPIC: &str = "r/0";

/// One read: when its SUBSCRIBE was sent, on which node, and what it saw (`None`: no
/// retained message came with the granted subscription).
#[derive(Clone, Debug)]
pub(crate) struct Read {
    pub(crate) reader: usize,
    pub(crate) node: usize,
    pub(crate) asked: Duration,
    pub(crate) seen: Option<u64>,
}

/// What the retained clients saw.
#[derive(Default)]
pub(crate) struct RetainedLog {
    /// seq → when its PUBACK (success) came.
    pub(crate) acked: BTreeMap<u64, Duration>,
    pub(crate) reads: Vec<Read>,
    pub(crate) refused: u64,
    /// Writes answered with a failing PUBACK, and writes whose answer never came.
    pub(crate) failed: u64,
    pub(crate) unanswered: u64,
}

/// Reads that saw an older state than one acknowledged before they asked.
pub(crate) fn stale(log: &RetainedLog) -> Vec<(Read, u64)> {
    log.reads
        .iter()
        .filter_map(|r| {
            let must = log
                .acked
                .iter()
                .filter(|(_, at)| **at < r.asked)
                .map(|(seq, _)| *seq)
                .max()?;
            (r.seen.is_none_or(|s| s < must)).then(|| (r.clone(), must))
        })
        .collect()
}

fn retained_publish(id: u32, seq: u64) -> Packet {
    Packet::Publish(Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: true,
        topic: TOPIC.into(),
        packet_id: Some(pid(id)),
        properties: Properties::default(),
        payload: Bytes::from(seq.to_string()),
    })
}

/// The writer on `node`: one retained publish at a time, until told to stop.
pub(crate) async fn writer(node: usize, oracle: Shared) {
    let o = opts("retained-writer");
    let mut seq = 0u64;
    let mut id = 0u32;
    while !lock(&oracle).stop {
        let forever = Instant::now() + Duration::from_secs(3600);
        let Some((mut c, _)) = connect_by(mqtt_addr(node), &o, forever).await else {
            return;
        };
        loop {
            if lock(&oracle).stop {
                c.disconnect().await;
                return;
            }
            seq += 1;
            id = id % 60_000 + 1;
            if c.send(&retained_publish(id, seq)).await.is_err() {
                break;
            }
            // Longer than a forward's timeout (15 s): a PUBACK that waits for a node cut off
            // comes, as a failure, before the writer gives up on it.
            let acked = loop {
                match timeout(Duration::from_secs(20), c.recv()).await {
                    Ok(Ok(Packet::Puback(a))) if a.packet_id == pid(id) => {
                        break Some(a.reason_code == ReasonCode::Success);
                    }
                    Ok(Ok(_)) => continue,
                    _ => break None,
                }
            };
            match acked {
                Some(true) => {
                    lock(&oracle).retained.acked.insert(seq, elapsed());
                }
                Some(false) => lock(&oracle).retained.failed += 1,
                None => {
                    lock(&oracle).retained.unanswered += 1;
                    break;
                }
            }
            sleep(ms(thread_rng().gen_range(20..150))).await;
        }
        sleep(ms(200)).await;
    }
}

/// Reader `k` on `node`: subscribe, take the retained message, unsubscribe, again, until
/// told to stop.
pub(crate) async fn reader(k: usize, node: usize, oracle: Shared) {
    let o = opts(&format!("retained-reader{k}"));
    let mut id = 0u32;
    while !lock(&oracle).stop {
        let forever = Instant::now() + Duration::from_secs(3600);
        let Some((mut c, _)) = connect_by(mqtt_addr(node), &o, forever).await else {
            return;
        };
        while !lock(&oracle).stop {
            id = id % 60_000 + 1;
            let sub = Packet::Subscribe(Subscribe {
                packet_id: pid(id),
                filters: vec![SubscribeFilter {
                    filter: TOPIC.into(),
                    options: SubscriptionOptions {
                        qos: QoS::AtLeastOnce,
                        no_local: false,
                        retain_as_published: false,
                        retain_handling: RetainHandling::SendAtSubscribe,
                    },
                }],
                properties: Properties::default(),
            });
            let asked = elapsed();
            if c.send(&sub).await.is_err() {
                break;
            }
            let Some(granted) = read_one(&mut c, id, k, node, asked, &oracle).await else {
                break;
            };
            if granted {
                id = id % 60_000 + 1;
                let unsub = Packet::Unsubscribe(Unsubscribe {
                    packet_id: pid(id),
                    filters: vec![TOPIC.into()],
                    properties: Properties::default(),
                });
                if c.send(&unsub).await.is_err() || !unsubscribed(&mut c, id).await {
                    break;
                }
            }
            sleep(ms(thread_rng().gen_range(50..300))).await;
        }
        sleep(ms(200)).await;
    }
}

/// The SUBACK of SUBSCRIBE `id` and, when granted, the retained message that follows it
/// (taken within a short wait); recorded in the oracle. `None`: the connection failed.
async fn read_one(
    c: &mut MqttClient,
    id: u32,
    k: usize,
    node: usize,
    asked: Duration,
    oracle: &Shared,
) -> Option<bool> {
    let granted = loop {
        match timeout(Duration::from_secs(10), c.recv()).await {
            Ok(Ok(Packet::Suback(s))) if s.packet_id == pid(id) => {
                break s.reason_codes.first().is_some_and(|c| !c.is_error());
            }
            Ok(Ok(Packet::Publish(p))) => acknowledge(c, &p).await?,
            _ => return None,
        }
    };
    if !granted {
        lock(oracle).retained.refused += 1;
        return Some(false);
    }
    // The retained message comes right behind the SUBACK (MQTT 5 §3.8.4).
    let mut seen = None;
    let until = Instant::now() + ms(500);
    while Instant::now() < until {
        let left = until.saturating_duration_since(Instant::now());
        match timeout(left, c.recv()).await {
            Ok(Ok(Packet::Publish(p))) => {
                acknowledge(c, &p).await?;
                if p.retain && p.topic == TOPIC {
                    seen = std::str::from_utf8(&p.payload)
                        .ok()
                        .and_then(|s| s.parse().ok());
                    break;
                }
            }
            Ok(Ok(_)) => {}
            Ok(Err(_)) => return None,
            Err(_) => break,
        }
    }
    lock(oracle).retained.reads.push(Read {
        reader: k,
        node,
        asked,
        seen,
    });
    Some(true)
}

async fn acknowledge(c: &mut MqttClient, p: &Publish) -> Option<()> {
    if let (QoS::AtLeastOnce, Some(id)) = (p.qos, p.packet_id) {
        c.send(&Packet::Puback(ack(id))).await.ok()?;
    }
    Some(())
}

/// Waits for UNSUBACK `id`, acknowledging what arrives meanwhile.
async fn unsubscribed(c: &mut MqttClient, id: u32) -> bool {
    loop {
        match timeout(Duration::from_secs(10), c.recv()).await {
            Ok(Ok(Packet::Unsuback(u))) if u.packet_id == pid(id) => return true,
            Ok(Ok(Packet::Publish(p))) => {
                if acknowledge(c, &p).await.is_none() {
                    return false;
                }
            }
            Ok(Ok(_)) => {}
            _ => return false,
        }
    }
}
