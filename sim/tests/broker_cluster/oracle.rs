//! The oracle: what was sent, settled and received, the checks over it, and which
//! faults are in force (for the mover's judgement).

#[allow(unused_imports)]
use super::*;

#[derive(Clone, Debug)]
pub(crate) struct Sent {
    pub(crate) topic: u64,
    pub(crate) qos: QoS,
    /// Virtual time of its first transmission.
    pub(crate) at: Duration,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Arrival {
    pub(crate) publisher: usize,
    pub(crate) seq: u64,
    pub(crate) topic: u64,
    pub(crate) dup: bool,
}

/// One take-over of the mover's client id.
#[derive(Clone, Debug)]
pub(crate) struct Move {
    pub(crate) from: usize,
    pub(crate) to: usize,
    pub(crate) started: Duration,
    pub(crate) connack: Duration,
    /// No partition was in force at any moment between `started` and `connack`.
    pub(crate) clean: bool,
    pub(crate) session_present: bool,
}

#[derive(Default)]
pub(crate) struct Oracle {
    /// (publisher, seq) → what it was, for every publish handed to the network.
    pub(crate) sent: BTreeMap<(usize, u64), Sent>,
    /// (publisher, seq) → whether its acknowledgement was a success.
    pub(crate) settled: BTreeMap<(usize, u64), bool>,
    /// subscriber → virtual time of its SUBACK (a late subscriber's: when the publishers'
    /// node routed to it, `membership::applied_route`).
    pub(crate) subacked: BTreeMap<usize, Duration>,
    /// Late subscribers whose window has not started: acknowledged, not yet routed to by
    /// the publishers' node.
    pub(crate) unrouted: BTreeSet<usize>,
    /// subscriber → what it received, in order (QoS 2 resends of one packet id once).
    pub(crate) arrivals: BTreeMap<usize, Vec<Arrival>>,
    /// The mover's connections: for each, the move that superseded it (index into
    /// `moves`) and how and when it ended.
    pub(crate) superseded_by: BTreeMap<usize, usize>,
    pub(crate) ended: BTreeMap<usize, (Duration, String)>,
    pub(crate) moves: Vec<Move>,
    /// The mover's first SUBACK, and the publishes it got over all its connections (check
    /// 9).
    pub(crate) mover_subacked: Option<Duration>,
    pub(crate) mover_got: BTreeSet<(usize, u64)>,
    /// The publishes the mover got over all its connections, in the order they came.
    pub(crate) mover_arrivals: Vec<(usize, u64)>,
    /// Moves that lost the mover's session: from the move's start to the SUBACK of its
    /// subscription made again.
    pub(crate) mover_lost: Vec<(Duration, Duration)>,
    /// Publishers stop publishing (they still settle what is in flight).
    pub(crate) stop: bool,
    pub(crate) healed: bool,
    pub(crate) publishers_done: usize,
    pub(crate) mover_done: bool,
    /// The membership variant's operator added and removed its nodes.
    pub(crate) membership_done: bool,
    /// The retained writer's acknowledged writes and the readers' reads (check 6).
    pub(crate) retained: super::retained::RetainedLog,
    /// The shared group's publishes and deliveries (check 8).
    pub(crate) shared: super::shared::SharedLog,
    pub(crate) subscriber_reconnects: u64,
}

pub(crate) type Shared = Arc<Mutex<Oracle>>;

/// Confirmed publishes missing at a subscriber that had subscribed before they were sent:
/// (subscriber, (publisher, seq)).
pub(crate) fn missing(o: &Oracle) -> Vec<(usize, (usize, u64))> {
    let mut out = Vec::new();
    for (&sub, &subacked) in &o.subacked {
        let got: BTreeSet<(usize, u64)> = o
            .arrivals
            .get(&sub)
            .into_iter()
            .flatten()
            .map(|a| (a.publisher, a.seq))
            .collect();
        for (key, sent) in &o.sent {
            if o.settled.get(key) == Some(&true) && sent.at > subacked && !got.contains(key) {
                out.push((sub, *key));
            }
        }
    }
    out
}

/// Confirmed publishes the mover missed (check 9): those sent after its first SUBACK, not
/// between a move that lost its session (the session starts afresh, with no subscription)
/// and the SUBACK of the subscription it made again (none after a lost move it did not
/// subscribe again from), and not within `SETTLE` of a partition or a kill (`faults`: when
/// each began and ended), which may lose a session's messages where it is (a node without
/// a store killed, a handed-over session sent on a link that is down).
pub(crate) fn mover_missing(o: &Oracle, faults: &[(Duration, Duration)]) -> Vec<(usize, u64)> {
    let Some(from) = o.mover_subacked else {
        return Vec::new();
    };
    // A lost move not followed by its SUBACK excuses all after it.
    let mut lost = o.mover_lost.clone();
    let subscribed_again = |m: &Move| lost.iter().any(|&(started, _)| started == m.started);
    if let Some(m) = o
        .moves
        .iter()
        .find(|m| !m.session_present && !subscribed_again(m))
    {
        lost.push((m.started, Duration::MAX));
    }
    let near = |t: Duration| {
        faults
            .iter()
            .any(|&(a, b)| t + SETTLE >= a && t <= b + SETTLE)
    };
    o.sent
        .iter()
        .filter(|(key, s)| {
            o.settled.get(*key) == Some(&true)
                && s.at > from
                && !lost.iter().any(|&(a, b)| s.at >= a && s.at <= b)
                && !near(s.at)
                && !o.mover_got.contains(*key)
        })
        .map(|(key, _)| *key)
        .collect()
}

/// The first publish the mover got before an earlier one of its publisher on its topic
/// (check 10), judged on first arrivals (a QoS 1 redelivery may come again later), among
/// those sent while no partition or kill was near (`faults`, as for check 9).
pub(crate) fn mover_reordered(o: &Oracle, faults: &[(Duration, Duration)]) -> Option<String> {
    let near = |t: Duration| {
        faults
            .iter()
            .any(|&(a, b)| t + SETTLE >= a && t <= b + SETTLE)
    };
    let mut seen: BTreeSet<(usize, u64)> = BTreeSet::new();
    let mut highest: BTreeMap<(usize, u64), (u64, usize)> = BTreeMap::new();
    for (i, key) in o.mover_arrivals.iter().enumerate() {
        if !seen.insert(*key) {
            continue;
        }
        let Some(s) = o.sent.get(key).filter(|s| !near(s.at)) else {
            continue;
        };
        let top = highest.entry((key.0, s.topic)).or_insert((0, 0));
        if key.1 < top.0 {
            return Some(format!(
                "publisher {} on t/{}: {} (sent at {:?}, arrival {i}) came after {} (arrival {})",
                key.0, s.topic, key.1, s.at, top.0, top.1
            ));
        }
        *top = (key.1, i);
    }
    None
}

/// The first problem in one subscriber's arrivals: a message never sent, a QoS 2 message
/// twice, or a message that arrived after a later one of its publisher on its topic.
///
/// Order is judged among the messages first sent after `since`, the subscriber's window.
/// One sent before it was not routed to this subscriber then; it reaches it only when its
/// publisher sends it again after a reconnect, a new publish to the broker, after later
/// ones went out (a late subscriber on a joiner saw that with kills, seed 2).
pub(crate) fn judge_arrivals(
    sub: usize,
    arrivals: &[Arrival],
    sent: &BTreeMap<(usize, u64), Sent>,
    since: Duration,
) -> Result<(), String> {
    let mut seen: BTreeSet<(usize, u64)> = BTreeSet::new();
    let mut highest: BTreeMap<(usize, u64), u64> = BTreeMap::new();
    for (i, a) in arrivals.iter().enumerate() {
        let key = (a.publisher, a.seq);
        let Some(s) = sent.get(&key) else {
            return Err(format!("sub{sub} got {key:?}, never published"));
        };
        if s.topic != a.topic {
            return Err(format!(
                "sub{sub} got {key:?} on t/{}, published on t/{}",
                a.topic, s.topic
            ));
        }
        if !seen.insert(key) {
            if s.qos == QoS::ExactlyOnce {
                return Err(format!(
                    "sub{sub} got QoS 2 message {key:?} twice (arrival {i}, dup {})",
                    a.dup
                ));
            }
            // A QoS 1 redelivery: order is judged on first arrivals.
            continue;
        }
        if s.at <= since {
            continue;
        }
        let top = highest.entry((a.publisher, a.topic)).or_insert(0);
        if a.seq < *top {
            let later = sent.get(&(a.publisher, *top)).map(|s| s.at);
            return Err(format!(
                "sub{sub}: publisher {} on t/{}: {} (sent at {:?}) arrived after {} (sent at {later:?}) (arrival {i}, dup {})",
                a.publisher, a.topic, a.seq, s.at, *top, a.dup
            ));
        }
        *top = a.seq;
    }
    Ok(())
}

/// Checks 1 and 2 over everything received so far; `Err` names the first problem.
pub(crate) fn judge(o: &Oracle, final_: bool) -> Result<(), String> {
    for (sub, arrivals) in &o.arrivals {
        let since = if o.unrouted.contains(sub) {
            Duration::MAX
        } else {
            o.subacked.get(sub).copied().unwrap_or_default()
        };
        judge_arrivals(*sub, arrivals, &o.sent, since)?;
    }
    if final_ {
        let m = missing(o);
        if !m.is_empty() {
            return Err(format!(
                "{} acknowledged publishes missing at subscribers (subscriber, (publisher, seq)), first {:?}",
                m.len(),
                &m[..m.len().min(5)]
            ));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Faults: which are in force, for the mover's judgement.

#[derive(Default, Clone, Copy, PartialEq, Debug)]
pub(crate) struct FaultClock {
    /// Partitions (isolations, cut links) begun so far.
    pub(crate) partitions: u64,
    pub(crate) in_force: bool,
    /// When the last partition was taken back (virtual time).
    pub(crate) healed_at: Option<Duration>,
}

/// How long after a partition a move is still excused: the nodes' QUIC connections may be
/// closed by then (idle timeout 3 s) and redialled with back-off, and what a node sends
/// on a link that is down is dropped (docs/clustering.md: no durable outbox), a handed-over
/// session included.
pub(crate) const SETTLE: Duration = Duration::from_secs(5);

impl FaultClock {
    /// No partition in force at `before` nor since, and none taken back within `SETTLE`
    /// before it.
    pub(crate) fn calm_through(before: &FaultClock, after: &FaultClock, started: Duration) -> bool {
        !before.in_force
            && before == after
            && before.healed_at.is_none_or(|h| started >= h + SETTLE)
    }
}

/// The clock, and the faults so far as the harness prints them (for failure reports from
/// the clients' side).
#[derive(Default)]
pub(crate) struct FaultLog {
    pub(crate) clock: FaultClock,
    pub(crate) log: Vec<String>,
    /// Nodes killed so far (by index), with when.
    pub(crate) kills: Vec<(usize, Duration)>,
}

impl FaultLog {
    /// Whether `node` was killed at or after `since`.
    pub(crate) fn killed_since(&self, node: usize, since: Duration) -> bool {
        self.kills.iter().any(|&(n, at)| n == node && at >= since)
    }
}

pub(crate) type Faults = Arc<Mutex<FaultLog>>;

/// Whether `f` cuts a node off from the others: a partition, or a kill (a dead node hears
/// nothing, and comes back behind).
pub(crate) fn is_partition(f: &Fault) -> bool {
    matches!(
        f,
        Fault::Isolate(_) | Fault::Link(..) | Fault::Split(_) | Fault::OneWay(..) | Fault::Kill(_)
    )
}

#[test]
pub(crate) fn checker_reports_loss_reordering_and_double_delivery() {
    let sent = |topic, qos, at| Sent {
        topic,
        qos,
        at: ms(at),
    };
    let got = |publisher, seq, topic, dup| Arrival {
        publisher,
        seq,
        topic,
        dup,
    };
    let mut o = Oracle::default();
    o.subacked.insert(0, ms(5));
    o.sent.insert((0, 1), sent(0, QoS::AtLeastOnce, 10));
    o.sent.insert((0, 2), sent(0, QoS::AtLeastOnce, 11));
    o.sent.insert((1, 1), sent(1, QoS::ExactlyOnce, 12));
    for key in [(0, 1), (0, 2), (1, 1)] {
        o.settled.insert(key, true);
    }
    // In order, a QoS 1 redelivery after a reconnect: fine.
    o.arrivals.insert(
        0,
        vec![
            got(0, 1, 0, false),
            got(0, 2, 0, false),
            got(0, 2, 0, true),
            got(1, 1, 1, false),
        ],
    );
    assert_eq!(judge(&o, true), Ok(()));

    // Lost: a confirmed message missing.
    let mut lost = Oracle {
        sent: o.sent.clone(),
        settled: o.settled.clone(),
        subacked: o.subacked.clone(),
        ..Oracle::default()
    };
    lost.arrivals
        .insert(0, vec![got(0, 1, 0, false), got(1, 1, 1, false)]);
    assert!(judge(&lost, true).unwrap_err().contains("missing"));
    // ... unless it was not confirmed, or sent before the SUBACK.
    lost.settled.insert((0, 2), false);
    assert_eq!(judge(&lost, true), Ok(()));
    lost.settled.insert((0, 2), true);
    lost.subacked.insert(0, ms(11));
    assert_eq!(judge(&lost, true), Ok(()));

    // Reordered within one publisher and topic.
    let mut reordered = Oracle {
        sent: o.sent.clone(),
        ..Oracle::default()
    };
    reordered
        .arrivals
        .insert(0, vec![got(0, 2, 0, false), got(0, 1, 0, false)]);
    assert!(judge(&reordered, false)
        .unwrap_err()
        .contains("1 (sent at 10ms) arrived after 2"));
    // ... unless the earlier one was sent before the subscriber's window: sent again after
    // a reconnect, it reaches a late subscriber after later ones. Not judged while the
    // window has not started either.
    reordered.subacked.insert(0, ms(10));
    assert_eq!(judge(&reordered, false), Ok(()));
    reordered.subacked.insert(0, ms(5));
    reordered.unrouted.insert(0);
    assert_eq!(judge(&reordered, false), Ok(()));
    reordered.unrouted.clear();
    assert!(judge(&reordered, false).is_err());

    // A QoS 2 message twice.
    let mut twice = Oracle {
        sent: o.sent.clone(),
        ..Oracle::default()
    };
    twice
        .arrivals
        .insert(0, vec![got(1, 1, 1, false), got(1, 1, 1, true)]);
    assert!(judge(&twice, false).unwrap_err().contains("twice"));
}
