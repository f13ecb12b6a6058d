//! The cluster's view of itself (statuses, leaders, a failure's diagnosis) and the
//! chaos phase.

#[allow(unused_imports)]
use super::*;

pub(crate) async fn statuses(setup: &Setup) -> Vec<ClusterStatus> {
    let mut out = Vec::new();
    let members: Vec<usize> = lock(&setup.members).iter().copied().collect();
    for node in members {
        let Some(a) = setup.admin(node) else { continue };
        if let Ok(Ok(Some(s))) = timeout(Duration::from_secs(1), a.cluster_status()).await {
            out.push(s);
        }
    }
    out
}

/// What each node says of itself, for a failure report: its raft view, its forwarding and
/// drop counters, and the state of the subscribers' sessions on it.
pub(crate) async fn diagnose(setup: &Setup) -> String {
    let mut out = String::new();
    let all = setup.variant.nodes + setup.variant.joiners;
    let mut ids: Vec<String> = (0..setup.variant.nodes - 1 + setup.variant.joiners.min(1))
        .map(|k| format!("sub{k}"))
        .collect();
    ids.push(MOVER.to_owned());
    for node in 0..all {
        let Some(a) = setup.admin(node) else { continue };
        let status = timeout(Duration::from_secs(1), a.cluster_status()).await;
        let m = a.metrics();
        out.push_str(&format!(
            "  node{}: {:?}\n    forwarded {} received {} forward timeouts {} link holds {} dropped queue {} mailbox {} other {} sent to clients {}\n",
            node + 1,
            status.map(|s| s.ok().flatten().map(|s| (s.role, s.term, s.leader, s.commit, s.applied, s.routes, s.routes_converged))),
            m.cluster_forwarded,
            m.cluster_received,
            m.cluster_forward_timeouts,
            m.cluster_link_holds,
            m.dropped_queue_full,
            m.dropped_mailbox_full,
            m.dropped_other,
            m.messages_sent,
        ));
        for id in &ids {
            if let Some(c) = a.client(id).await {
                out.push_str(&format!(
                    "    {id}: connected {} subscriptions {} inflight {} queued {}\n",
                    c.connected, c.subscriptions, c.inflight, c.mqueue_len
                ));
            }
        }
    }
    out
}

/// The missing messages by subscriber and publisher: how many, and the first and last seq.
pub(crate) fn missing_summary(o: &Oracle) -> String {
    let mut by: BTreeMap<(usize, usize), (usize, u64, u64)> = BTreeMap::new();
    for (sub, (publisher, seq)) in missing(o) {
        let e = by.entry((sub, publisher)).or_insert((0, u64::MAX, 0));
        e.0 += 1;
        e.1 = e.1.min(seq);
        e.2 = e.2.max(seq);
    }
    by.iter()
        .map(|((sub, p), (n, lo, hi))| {
            let at = |seq: &u64| o.sent.get(&(*p, *seq)).map(|s| s.at);
            format!(
                "  sub{sub} misses {n} of pub{p}'s, seq {lo} (sent at {:?}) ..= {hi} (at {:?})\n",
                at(lo),
                at(hi)
            )
        })
        .collect()
}

/// The leader every one of `nodes` names, if all do and it says it leads.
pub(crate) fn agreed_leader(all: &[ClusterStatus], nodes: usize) -> Option<u64> {
    if all.len() != nodes {
        return None;
    }
    let named: BTreeSet<Option<u64>> = all.iter().map(|s| s.leader).collect();
    let leading: Vec<u64> = all
        .iter()
        .filter(|s| s.role == "leader")
        .map(|s| s.node)
        .collect();
    match (named.len(), named.first(), leading.as_slice()) {
        (1, Some(Some(l)), [me]) if l == me => Some(*l),
        _ => None,
    }
}

/// The node (index) that says it leads with the highest term, if any.
pub(crate) fn claimed_leader(all: &[ClusterStatus]) -> Option<usize> {
    all.iter()
        .filter(|s| s.role == "leader")
        .max_by_key(|s| s.term)
        .map(|s| s.node as usize - 1)
}

pub(crate) async fn wait_leader(setup: &Setup, within: Duration) -> Option<u64> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let members = lock(&setup.members).len();
        if let Some(l) = agreed_leader(&statuses(setup).await, members) {
            return Some(l);
        }
        sleep(ms(100)).await;
    }
    None
}

/// The leader of a three-node cluster, waited for 30 s (a check fails without one), and its
/// two followers, as indexes: the scenarios that cut the followers from each other keep
/// raft going between the leader and each.
pub(crate) async fn leader_and_followers(setup: &Setup) -> (usize, usize, usize) {
    let leader = wait_leader(setup, Duration::from_secs(30)).await;
    check!(leader.is_some(), "no leader 30 s after start");
    let l = leader.map_or(0, |l| l as usize - 1);
    (l, (l + 1) % 3, (l + 2) % 3)
}

/// One fault for a cluster of `nodes` whose leader is `leader` (index), if known; an
/// overloaded node among the kinds if `overload`, and from five nodes on a two-node
/// minority cut off from the rest, the leader in it half the time (without these, the
/// draws are those the three-node corpus's seeds were found with).
pub(crate) fn draw(
    nodes: usize,
    variant: &Variant,
    leader: Option<usize>,
    leader_weight: u32,
) -> Fault {
    let overload = variant.overload;
    let mut r = thread_rng();
    let a = r.gen_range(0..nodes);
    let b = (a + r.gen_range(1..nodes)) % nodes;
    let split = nodes >= 5;
    let kinds = 4 + u32::from(overload) + u32::from(split);
    // A kill weighs as much as all the others together: it is what the variant is for.
    if variant.kills && r.gen_bool(0.5) {
        return Fault::Kill(match leader {
            Some(l) if r.gen_bool(0.3) => l,
            _ => a,
        });
    }
    let pick = r.gen_range(0..kinds + leader_weight);
    match pick {
        0 => Fault::Isolate(a),
        1 => Fault::Link(a, b),
        2 => Fault::OneWay(a, b),
        3 => {
            let lo = r.gen_range(1..50);
            Fault::Delay(ms(lo), ms(lo + r.gen_range(1..300)))
        }
        4 if overload => Fault::Overload {
            node: a,
            busy: ms(r.gen_range(50..400)),
            idle: ms(r.gen_range(10..100)),
        },
        p if split && p == 4 + u32::from(overload) => {
            let first = match leader {
                Some(l) if r.gen_bool(0.5) => l,
                _ => a,
            };
            let second = (first + r.gen_range(1..nodes)) % nodes;
            Fault::Split(vec![first, second])
        }
        _ => Fault::Isolate(leader.unwrap_or(a)),
    }
}

/// The chaos phase: one fault at a time, each held a while and reverted, until
/// `knobs.chaos` is over; then every fault removed.
pub(crate) async fn chaos(
    cluster: &Cluster,
    setup: &Setup,
    knobs: &Knobs,
    ck: &ClusterKnobs,
    faults: &Faults,
    nemesis: &mut Nemesis,
) {
    let end = Instant::now() + knobs.chaos;
    if !setup.variant.faults {
        sleep(knobs.chaos).await;
        return;
    }
    let every = knobs.fault_every.as_millis() as u64;
    while Instant::now() < end {
        let leader = claimed_leader(&statuses(setup).await);
        let v = &setup.variant;
        let mut fault = draw(v.nodes + v.joiners, v, leader, ck.leader_weight);
        if matches!(fault, Fault::Kill(n) if lock(&setup.left).contains(&n)) {
            // A node that left stopped, as the daemon does: not one to kill and restart.
            fault = Fault::Delay(ms(1), ms(50));
        }
        let lasted = ms(thread_rng().gen_range(every / 2..every * 2 + 1));
        let calm = ms(thread_rng().gen_range(0..every + 1));
        nemesis.history.push(Record {
            at: elapsed(),
            fault: fault.clone(),
            lasted,
        });
        {
            let mut f = lock(faults);
            f.log
                .push(format!("  at {:?}: {fault} for {lasted:?}", elapsed()));
            if is_partition(&fault) {
                f.clock.partitions += 1;
                f.clock.in_force = true;
            }
        }
        Nemesis::apply(cluster, &fault);
        if let Fault::Kill(n) = fault {
            // Dead: what its store had not synced is gone when it comes back.
            setup.crash_disk(n);
            lock(faults).kills.push((n, elapsed()));
        }
        Nemesis::hold(cluster, &fault, lasted).await;
        Nemesis::revert(cluster, &fault, knobs);
        if is_partition(&fault) {
            let mut f = lock(faults);
            f.clock.in_force = false;
            f.clock.healed_at = Some(elapsed());
        }
        sleep(calm).await;
    }
    Nemesis::heal(cluster, knobs);
}

/// A subscription's filter as the routes name it (`routing/remote.rs` `route_of`): a shared
/// one with its group (`$queue/` as the group `$queue`), the others without their
/// `$exclusive/` or `$limit/{N}/` prefix.
fn routed_filter(f: &str) -> String {
    if let Some(rest) = f.strip_prefix("$queue/") {
        return format!("$share/$queue/{rest}");
    }
    if f.starts_with("$share/") {
        return f.to_owned();
    }
    if let Some(rest) = f.strip_prefix("$limit/") {
        return rest.split_once('/').map_or("", |(_, f)| f).to_owned();
    }
    f.strip_prefix("$exclusive/").unwrap_or(f).to_owned()
}

/// Check 7: every member's replicated routes are the truth: each filter with exactly the
/// members that have a local subscriber for it. `Err` with the first difference.
pub(crate) async fn routes_agree(setup: &Setup) -> Result<(), String> {
    let members: Vec<usize> = lock(&setup.members).iter().copied().collect();
    let mut truth: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    for &m in &members {
        let Some(a) = setup.admin(m) else {
            return Err(format!("node{} has no admin", m + 1));
        };
        let Ok(subs) = timeout(Duration::from_secs(5), a.subscriptions()).await else {
            return Err(format!("node{} does not list its subscriptions", m + 1));
        };
        for c in subs.iter() {
            for (filter, _, _) in &c.filters {
                truth
                    .entry(routed_filter(filter))
                    .or_default()
                    .insert(m as u64 + 1);
            }
        }
    }
    for &m in &members {
        let Some(a) = setup.admin(m) else { continue };
        let Ok(routes) = timeout(Duration::from_secs(5), a.cluster_routes()).await else {
            return Err(format!("node{} does not list its routes", m + 1));
        };
        let seen: BTreeMap<String, BTreeSet<u64>> = routes
            .into_iter()
            .map(|(f, nodes)| (f, nodes.into_iter().collect()))
            .collect();
        if seen != truth {
            return Err(format!(
                "node{} routes {seen:?}, the members' subscriptions say {truth:?}",
                m + 1
            ));
        }
    }
    Ok(())
}

/// Waits until node `at` (index) routes `filter` to every node (index) of `to`: 20 s at
/// most.
pub(crate) async fn wait_routed(setup: &Setup, at: usize, filter: &str, to: &[usize]) {
    let admin = setup.admin(at).expect("the routing node runs");
    let ids: Vec<u64> = to.iter().map(|n| *n as u64 + 1).collect();
    let by = Instant::now() + Duration::from_secs(20);
    let routes_all = |routes: &[(String, Vec<u64>)]| {
        routes
            .iter()
            .any(|(f, nodes)| f == filter && ids.iter().all(|i| nodes.contains(i)))
    };
    while !routes_all(&admin.cluster_routes().await) {
        check!(
            Instant::now() < by,
            "node{} did not route {filter} to nodes {ids:?} within 20 s",
            at + 1
        );
        sleep(ms(10)).await;
    }
}

/// Waits until node `node` (index) has stored a session handed over to it (asked of its
/// actors every millisecond): 30 s at most.
pub(crate) async fn wait_session_stored(setup: &Setup, node: usize) {
    let admin = setup.admin(node).expect("the node runs");
    let by = Instant::now() + Duration::from_secs(30);
    while admin.metrics().cluster_sessions_stored == 0 {
        check!(
            Instant::now() < by,
            "node{} did not store the session handed over to it within 30 s",
            node + 1
        );
        sleep(ms(1)).await;
    }
}
