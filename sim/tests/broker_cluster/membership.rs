//! The membership variant's operator: during the chaos phase it adds the first node that
//! waits (`bootstrap = false`) to the cluster and puts a subscriber on it, then adds the
//! second and has it leave again, as `starling cluster join` and `leave` would (through the
//! nodes' admin handles), retrying what a fault made fail; a node that left stops, as the
//! daemon does. After the heal the suite checks that every member agrees on who the
//! members are and that each is a voter, and that the node that left has stopped.

#[allow(unused_imports)]
use super::*;

use starling_broker::MembershipError;

/// How long the operator keeps retrying one change before the run fails.
const CHANGE_DEADLINE: Duration = Duration::from_secs(180);

/// Adds node `idx` (index) through whichever member takes it, retrying until it is a voter.
async fn join(setup: &Setup, idx: usize) {
    let id = idx as u64 + 1;
    let me = loop {
        if let Some(Ok(Some(s))) = match setup.admin(idx) {
            Some(a) => timeout(Duration::from_secs(1), a.cluster_status())
                .await
                .ok(),
            None => None,
        } {
            break s.this;
        }
        sleep(ms(200)).await;
    };
    let deadline = Instant::now() + CHANGE_DEADLINE;
    let mut ask = 0usize;
    loop {
        check!(
            Instant::now() < deadline,
            "node{id} not added within {CHANGE_DEADLINE:?}"
        );
        let members: Vec<usize> = lock(&setup.members).iter().copied().collect();
        let at = members[ask % members.len()];
        let Some(a) = setup.admin(at) else {
            ask += 1;
            continue;
        };
        // Longer than the leader's catch-up wait (30 s): a refusal or a failure comes back.
        match timeout(
            Duration::from_secs(40),
            a.cluster_add_member(id, me.clone()),
        )
        .await
        {
            Ok(Ok(())) => {
                lock(&setup.members).insert(idx);
                println!("[sim] node{id} added at {:?}", elapsed());
                return;
            }
            // The joiner leads: only a voter can, so an earlier attempt whose outcome
            // was unknown (timed out as leadership moved) went through. Asking the
            // members again would go on for ever: each names the joiner, which the loop
            // does not ask (seed 74, once the move's judgement was stored first).
            Ok(Err(MembershipError::NotLeader {
                leader: Some(l), ..
            })) if l == id => {
                lock(&setup.members).insert(idx);
                println!("[sim] node{id} added at {:?} (it leads)", elapsed());
                return;
            }
            Ok(Err(MembershipError::NotLeader {
                leader: Some(l), ..
            })) if members.contains(&(l as usize - 1)) => {
                ask = members
                    .iter()
                    .position(|m| *m == l as usize - 1)
                    .unwrap_or(0);
                continue;
            }
            Ok(Err(MembershipError::Refused(why))) => {
                check!(false, "adding node{id} refused: {why}");
            }
            _ => ask += 1,
        }
        sleep(ms(500)).await;
    }
}

/// Has node `idx` leave, retrying until it says it has.
async fn leave(setup: &Setup, idx: usize) {
    let id = idx as u64 + 1;
    let deadline = Instant::now() + CHANGE_DEADLINE;
    loop {
        check!(
            Instant::now() < deadline,
            "node{id} did not leave within {CHANGE_DEADLINE:?}"
        );
        // Its leave went through but the answer was lost (it was killed as its `Leave`
        // committed, and stopped at its restart on finding it had left): it says so by
        // stopping, and asking it again would go on for ever (seed 247).
        if lock(&setup.left).contains(&idx) {
            lock(&setup.members).remove(&idx);
            println!("[sim] node{id} left (found stopped) at {:?}", elapsed());
            return;
        }
        // Killed (and not started again yet): asked again once it runs.
        let Some(a) = setup.admin(idx) else {
            sleep(ms(200)).await;
            continue;
        };
        match timeout(
            Duration::from_secs(40),
            a.cluster_leave(Duration::from_secs(5)),
        )
        .await
        {
            Ok(Ok(_)) => {
                lock(&setup.members).remove(&idx);
                println!("[sim] node{id} left at {:?}", elapsed());
                return;
            }
            Ok(Err(MembershipError::Refused(why))) => {
                check!(false, "node{id}'s leave refused: {why}");
            }
            _ => sleep(ms(500)).await,
        }
    }
}

/// The operator: node `nodes` joins and gets subscriber `sub` (on `late`), then node
/// `nodes + 1` joins and leaves. Marks the oracle when all of it is done.
pub(crate) async fn operator(
    setup: Arc<Setup>,
    oracle: Shared,
    late: madsim::runtime::NodeHandle,
    sub: usize,
    chaos: Duration,
) {
    let (stays, goes) = (setup.variant.nodes, setup.variant.nodes + 1);
    let (first, second) = {
        let mut r = thread_rng();
        (
            chaos.mul_f64(r.gen_range(0.0..0.3)),
            chaos.mul_f64(r.gen_range(0.0..0.3)),
        )
    };
    sleep(first).await;
    join(&setup, stays).await;
    lock(&oracle).unrouted.insert(sub);
    late.spawn(subscriber(sub, stays, setup.variant, oracle.clone()));
    applied_route(&setup, &oracle, sub, stays).await;
    join(&setup, goes).await;
    sleep(second).await;
    leave(&setup, goes).await;
    lock(&oracle).membership_done = true;
}

/// What a late subscriber may expect (docs/clustering.md, "Routes"): a publish on another
/// node reaches it once that node has applied the route entry for its filter, which a node
/// cut off does only after the heal, and which its SUBACK waits for only up to 3 s. So its
/// window starts when the publishers' node routes `t/#` to the subscriber's node (the
/// subscribers that start with the run subscribe before anything is published).
async fn applied_route(setup: &Setup, oracle: &Shared, sub: usize, node: usize) {
    while !lock(oracle).subacked.contains_key(&sub) {
        sleep(ms(10)).await;
    }
    let id = node as u64 + 1;
    loop {
        if let Some(a) = setup.admin(PUBLISHER_NODE) {
            let routes = a.cluster_routes().await;
            if routes
                .iter()
                .any(|(f, nodes)| f == "t/#" && nodes.contains(&id))
            {
                break;
            }
        }
        sleep(ms(10)).await;
    }
    let at = elapsed();
    println!("[sim] sub{sub} on node{} routed at {at:?}", node + 1);
    let mut o = lock(oracle);
    o.subacked.insert(sub, at);
    o.unrouted.remove(&sub);
}

/// After the heal: every member names the same members, all voters, and the node that left
/// says so. `Err` with what differs.
pub(crate) async fn agreed_members(setup: &Setup) -> Result<(), String> {
    let members: BTreeSet<usize> = lock(&setup.members).clone();
    let want: BTreeSet<u64> = members.iter().map(|m| *m as u64 + 1).collect();
    for &m in &members {
        let Some(a) = setup.admin(m) else {
            return Err(format!("node{} has no admin", m + 1));
        };
        let Ok(Ok(Some(s))) = timeout(Duration::from_secs(1), a.cluster_status()).await else {
            return Err(format!("node{} does not answer", m + 1));
        };
        let seen: BTreeSet<u64> = s.members.iter().map(|m| m.id).collect();
        let voters = s.members.iter().all(|m| m.voter);
        if seen != want || !voters {
            return Err(format!(
                "node{} sees members {seen:?} (voters all: {voters}), want {want:?}",
                m + 1
            ));
        }
    }
    let gone = setup.variant.nodes + 1;
    if !lock(&setup.left).contains(&gone) {
        return Err(format!("node{} has not stopped after it left", gone + 1));
    }
    Ok(())
}
