//! The registry's part in a session's move from another node: the session the previous
//! owner hands over for this node's claim, kept when it comes before the claim's answer,
//! installed for the CONNECT that waits for it, and taken in place of a fresh session when
//! it comes after that CONNECT went on without it.

use std::sync::Arc;

use starling_rt::{time, ActorId, Ctx};
use tracing::debug;

use super::{Entry, Registry, EARLY_MAX, HANDOVER_TICK, HANDOVER_WAIT, HANDOVER_WAIT_MAX};
use crate::metrics::add;
use crate::msg::{ClientMsg, ClusterMsg, HandOff, NewConn, RegistryMsg};

/// A CONNECT waiting for the session its client held on another node.
pub(super) struct Awaited {
    /// This node's claim of the client id.
    pub(super) epoch: u64,
    pub(super) conn: Box<NewConn>,
    /// The node that held the session, asked again while nothing of it comes.
    pub(super) from: Option<u64>,
    /// When the claim was answered here, and when a part of the session last came.
    pub(super) since: time::Instant,
    pub(super) heard: time::Instant,
}

/// What a CONNECT waiting for its session does at a tick.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Due {
    Wait,
    /// Ask the previous node again: nothing came for a tick, or for two once a part came
    /// (the session is on its way: a copy sent again would only slow the link).
    Ask,
    /// Go on afresh: nothing came for [`HANDOVER_WAIT`], or it has waited
    /// [`HANDOVER_WAIT_MAX`] in all.
    GiveUp,
}

pub(super) fn due(since: time::Instant, heard: time::Instant, now: time::Instant) -> Due {
    let quiet = now.saturating_duration_since(heard);
    if quiet >= HANDOVER_WAIT || now.saturating_duration_since(since) >= HANDOVER_WAIT_MAX {
        Due::GiveUp
    } else if quiet >= HANDOVER_TICK * if heard > since { 2 } else { 1 } {
        Due::Ask
    } else {
        Due::Wait
    }
}

/// A late session's adoption under way: the fresh session was asked to give way.
#[derive(Default)]
pub(super) struct Adopting {
    /// The latest CONNECT for the client id that came meanwhile.
    pub(super) conn: Option<Box<NewConn>>,
    /// Another node's claim (its epoch and node) applied meanwhile: acted on once the
    /// adoption is over.
    pub(super) taken: Option<(u64, u64)>,
    /// The fresh session ended on its own meanwhile (its expiry fell due): its `Retire`
    /// (actor and attach count), acted on once it answered.
    pub(super) retired: Option<(ActorId, u32)>,
}

impl Registry {
    /// The session the previous node handed over for this node's claim `epoch`: it gets a
    /// client actor, detached, routed here (off this turn), then the waiting CONNECT
    /// resumes it. Answers the CONNECT to go on with at once (afresh), if any.
    pub(super) fn handed_over(
        &mut self,
        client_id: Arc<str>,
        epoch: u64,
        handoff: Option<Box<HandOff>>,
        ctx: &mut Ctx<Self>,
    ) -> Option<(Arc<str>, Box<NewConn>)> {
        if self
            .handovers
            .get(&client_id)
            .is_none_or(|w| w.epoch != epoch)
        {
            let answered = self.claimed.get(&client_id).is_some_and(|&c| c >= epoch);
            match handoff {
                // Before this node's claim was answered here: kept for its CONNECT.
                Some(h) if !answered => self.keep_early(client_id, epoch, h),
                // Too late: the CONNECT went on afresh under this claim.
                Some(h) if self.claimed.get(&client_id) == Some(&epoch) => {
                    self.adopt_late(client_id, epoch, h, ctx)
                }
                // For another claim, or nothing.
                _ => {
                    debug!(client_id = %client_id, epoch, "a handed-over session nobody waits for; dropped");
                }
            }
            return None;
        }
        let Awaited { conn, .. } = self.handovers.remove(&client_id)?;
        let Some(h) = handoff else {
            return Some((client_id, conn));
        };
        self.install(client_id.clone(), epoch, h, Some(conn), ctx)
            .map(|conn| (client_id, conn))
    }

    /// A tick of the wait of the CONNECT for the session of `client_id` (this node's claim
    /// `epoch`): it waits on, asks the previous node again, or goes on afresh.
    pub(super) async fn handover_tick(
        &mut self,
        client_id: Arc<str>,
        epoch: u64,
        ctx: &mut Ctx<Self>,
    ) {
        let Some(w) = self.handovers.get(&client_id).filter(|w| w.epoch == epoch) else {
            return;
        };
        match due(w.since, w.heard, time::now()) {
            Due::Wait => {}
            Due::Ask => {
                if let (Some(cluster), Some(from)) = (self.cluster.clone(), w.from) {
                    debug!(client_id = %client_id, epoch, from, "the session has not come yet; asking again");
                    let msg = ClusterMsg::WantSession {
                        from,
                        client_id: client_id.clone(),
                        epoch,
                    };
                    let _ = cluster.send(msg).await;
                }
            }
            Due::GiveUp => {
                if let Some(Awaited { conn, .. }) = self.handovers.remove(&client_id) {
                    debug!(client_id = %client_id, epoch, "no session from the previous node in time; starting afresh");
                    add(&self.shared.metrics.cluster_handover_timeouts, 1);
                    self.connect_here(client_id, conn, ctx).await;
                }
                return;
            }
        }
        ctx.after(
            HANDOVER_TICK,
            RegistryMsg::HandoverTick { client_id, epoch },
        );
    }

    /// Installs a session handed over for the claim `epoch`: a client actor, detached,
    /// routed here (off this turn); then `conn`, or a CONNECT that comes meanwhile, resumes
    /// it. Answers `conn` back when the session cannot be restored (it then goes on
    /// afresh).
    fn install(
        &mut self,
        client_id: Arc<str>,
        epoch: u64,
        h: Box<HandOff>,
        conn: Option<Box<NewConn>>,
        ctx: &mut Ctx<Self>,
    ) -> Option<Box<NewConn>> {
        let h = *h;
        let from = h.from;
        let (now, wall) = (time::now(), time::wall());
        let session = match starling_session::Session::restore(
            h.state,
            self.shared.limits.clone(),
            now,
            wall,
        ) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(client_id = %client_id, error = %e, "handed-over session not restored; starting afresh");
                return conn;
            }
        };
        let addr = self.start_restored(session, h.owner.map(Arc::from), true, ctx);
        add(&self.shared.metrics.cluster_sessions_received, 1);
        self.resuming.insert(client_id.clone(), conn);
        let cluster = self.cluster.clone();
        let id = client_id.clone();
        ctx.spawn_then(
            async move {
                let ask = addr.ask(|reply| ClientMsg::Resubscribe {
                    moved: Some((epoch, from)),
                    reply,
                });
                // The move's cut goes in the log after the routes that hold this node for
                // the session's filters. Not held in time (no quorum): no cut, and the
                // shards stop waiting for it on their own (`routing::moving`).
                match (ask.await, cluster) {
                    (Ok(true), Some(cluster)) => {
                        let _ = cluster.send(ClusterMsg::Moved { client_id: id, epoch }).await;
                    }
                    (Ok(false), _) => {
                        tracing::warn!(client_id = %id, epoch, "the routes of a session moved here were not committed in time: its move has no cut");
                    }
                    _ => {}
                }
            },
            move |()| RegistryMsg::HandoverReady { client_id },
        );
        None
    }

    /// The session the previous node handed over after its CONNECT waited
    /// [`HANDOVER_WAIT`] and went on afresh: if the fresh session never held more than its
    /// name (detached, its client not heard from since it was told there was no session:
    /// `Session::give_way`), it gives way and this one takes its place, subscriptions and
    /// queued messages with it, so that the client's next CONNECT finds what it had.
    /// Otherwise the fresh session is the client's, and this one is dropped.
    fn adopt_late(
        &mut self,
        client_id: Arc<str>,
        epoch: u64,
        h: Box<HandOff>,
        ctx: &mut Ctx<Self>,
    ) {
        let busy = self.confirming.contains_key(&client_id)
            || self.claiming.contains_key(&client_id)
            || self.resuming.contains_key(&client_id)
            || self.adopting.contains_key(&client_id);
        let open = self
            .clients
            .get(&client_id)
            .is_some_and(|e| !e.addr.is_closed());
        let entry = if busy || !open {
            None
        } else {
            self.clients.remove(&client_id)
        };
        let Some(Entry {
            addr,
            attaches,
            owner,
        }) = entry
        else {
            debug!(client_id = %client_id, epoch, "a handed-over session came after its CONNECT went on afresh, and that session is in use; dropped");
            return;
        };
        self.sessions_mark();
        // CONNECTs for the id wait meanwhile: out of `clients`, the fresh session is not
        // attached to, nor taken for another node's claim.
        self.adopting.insert(client_id.clone(), Adopting::default());
        ctx.spawn_then(
            async move {
                let gave = addr.ask(ClientMsg::GiveWay).await.unwrap_or(false);
                (addr, gave)
            },
            move |(addr, gave)| RegistryMsg::GaveWay {
                client_id,
                epoch,
                handoff: h,
                addr,
                attaches,
                owner,
                gave,
            },
        );
    }

    /// The fresh session's answer to [`Registry::adopt_late`]; then what waited for it.
    pub(super) async fn gave_way(
        &mut self,
        client_id: Arc<str>,
        epoch: u64,
        h: Box<HandOff>,
        entry: Entry,
        gave: bool,
        ctx: &mut Ctx<Self>,
    ) {
        let a = self.adopting.remove(&client_id).unwrap_or_default();
        let mut conn = a.conn;
        let mine = self.claimed.get(&client_id) == Some(&epoch);
        let ended = a
            .retired
            .is_some_and(|r| r == (entry.addr.id(), entry.attaches));
        if !gave && ended {
            // Neither session is kept: the late one would take the place of a session that
            // ended on its own, and the claim goes with it as with any `Retire`.
            debug!(client_id = %client_id, epoch, "a handed-over session came late, and the fresh session ended meanwhile; both gone");
            entry.addr.stop();
            self.release_claim(client_id.clone());
        } else if !gave {
            debug!(client_id = %client_id, epoch, "a handed-over session came after its CONNECT went on afresh, and that session is its client's; dropped");
            self.clients.insert(client_id.clone(), entry);
            self.sessions_mark();
        } else if mine && a.taken.is_none() {
            debug!(client_id = %client_id, epoch, "a handed-over session that came after its CONNECT went on afresh takes the fresh session's place");
            add(&self.shared.metrics.cluster_sessions_late, 1);
            conn = self.install(client_id.clone(), epoch, h, conn, ctx);
        } else {
            // Claimed by another node meanwhile: the fresh session has ended, and the
            // claim below finds none here.
            debug!(client_id = %client_id, epoch, "a handed-over session that came late was claimed away meanwhile; dropped");
        }
        if let Some((epoch, node)) = a.taken {
            self.taken_over(&client_id, epoch, node);
        }
        if let Some(conn) = conn {
            Box::pin(self.connect(client_id, conn, ctx)).await;
        }
    }

    /// Keeps a session that arrived before its claim's answer, forgetting those kept longer
    /// than a CONNECT would wait for them.
    fn keep_early(&mut self, client_id: Arc<str>, epoch: u64, handoff: Box<HandOff>) {
        let now = time::now();
        self.early
            .retain(|_, (_, _, at)| now.saturating_duration_since(*at) < HANDOVER_WAIT);
        if self.early.len() >= EARLY_MAX {
            debug!(client_id = %client_id, epoch, "a handed-over session came early and there is no room to keep it; dropped");
            return;
        }
        debug!(client_id = %client_id, epoch, "a handed-over session came before its claim's answer; kept");
        self.early.insert(client_id, (epoch, handoff, now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connect_waits_while_its_session_keeps_coming() {
        let t0 = starling_rt::time::now();
        let s = |n: u64| std::time::Duration::from_millis(n);
        // Nothing comes: asked again at each tick, given up after the wait.
        assert_eq!(due(t0, t0, t0 + s(999)), Due::Wait);
        assert_eq!(due(t0, t0, t0 + HANDOVER_TICK), Due::Ask);
        assert_eq!(due(t0, t0, t0 + s(2000)), Due::Ask);
        assert_eq!(due(t0, t0, t0 + HANDOVER_WAIT), Due::GiveUp);
        // A part came at 2.5 s: waited on past 3 s, asked again after two ticks of quiet.
        let heard = t0 + s(2500);
        assert_eq!(due(t0, heard, t0 + s(3000)), Due::Wait);
        assert_eq!(due(t0, heard, t0 + s(4000)), Due::Wait);
        assert_eq!(due(t0, heard, t0 + s(4500)), Due::Ask);
        assert_eq!(due(t0, heard, t0 + s(5500)), Due::GiveUp);
        // However steadily parts come, not past the longest wait.
        let heard = t0 + HANDOVER_WAIT_MAX - s(1);
        assert_eq!(due(t0, heard, t0 + HANDOVER_WAIT_MAX - s(1)), Due::Wait);
        assert_eq!(due(t0, heard, t0 + HANDOVER_WAIT_MAX), Due::GiveUp);
    }
}
