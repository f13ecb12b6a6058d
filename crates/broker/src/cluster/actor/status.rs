//! The cluster's status as this node sees it: its view of the members and routes, with
//! raft's own status (asked off the actor's turn).

use std::collections::BTreeSet;

use starling_raft::Role;
use starling_rt::Reply;

use super::ClusterActor;
use crate::msg::{ClusterStatus, MemberStatus};

impl ClusterActor {
    pub(super) fn status(&self, reply: Reply<ClusterStatus>) {
        let members = self.members.clone();
        let node = self.node;
        let routes = self.routes.len();
        let routes_converged = self.book.converged();
        let raft = self.raft.clone();
        let this = self.me.clone();
        let left = *self.left.borrow();
        starling_rt::spawn(async move {
            let (st, leader_changes) = match raft {
                Some(r) => (
                    r.status().await.ok(),
                    r.metrics()
                        .leader_changes
                        .load(std::sync::atomic::Ordering::Relaxed),
                ),
                None => (None, 0),
            };
            let voters: BTreeSet<u64> = st
                .as_ref()
                .map(|s| s.voters.iter().copied().collect())
                .unwrap_or_default();
            let learners: BTreeSet<u64> = st
                .as_ref()
                .map(|s| s.learners.iter().copied().collect())
                .unwrap_or_default();
            let ids: BTreeSet<u64> = members
                .keys()
                .chain(&voters)
                .chain(&learners)
                .copied()
                .collect();
            let is_leader = st.as_ref().is_some_and(|s| s.role == Role::Leader);
            let members = ids
                .into_iter()
                .map(|id| {
                    let m = members.get(&id);
                    let progress = st.as_ref().and_then(|s| s.progress.get(&id));
                    MemberStatus {
                        id,
                        mqtt: m.map(|m| m.mqtt.clone()),
                        cluster: m.map(|m| m.cluster.clone()),
                        http: m.and_then(|m| m.http.clone()),
                        voter: voters.contains(&id),
                        // The leader's own entry: it hears itself.
                        active: is_leader
                            .then(|| id == node || progress.is_some_and(|p| p.recent_active)),
                        matched: progress.map(|p| p.matched),
                    }
                })
                .collect();
            let _ = reply.send(ClusterStatus {
                node,
                role: st
                    .as_ref()
                    .map_or("unknown", |s| role_name(s.role))
                    .to_owned(),
                term: st.as_ref().map_or(0, |s| s.term),
                leader: st.as_ref().and_then(|s| s.leader),
                commit: st.as_ref().map_or(0, |s| s.commit),
                applied: st.as_ref().map_or(0, |s| s.applied),
                members,
                routes,
                routes_converged,
                leader_changes,
                this,
                left,
            });
        });
    }
}

fn role_name(r: Role) -> &'static str {
    match r {
        Role::Leader => "leader",
        Role::Follower => "follower",
        Role::Candidate => "candidate",
        Role::PreCandidate => "pre_candidate",
    }
}
