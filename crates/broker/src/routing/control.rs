//! A shard's back-pressure messages to its clients (see [`crate::flow`]): Hold, Release,
//! Watch and Stalled on the urgent lane, and the outbox for those that found no room.

use std::sync::Arc;

use starling_rt::{time, ActorId, Ctx, TrySendError, WeakAddr};
use tracing::debug;

use super::RouterActor;
use crate::destination::Destination;
use crate::flow::Outcome;
use crate::metrics::add;
use crate::msg::{ClientMsg, Publisher, RouterMsg};

impl RouterActor {
    /// Holds `from` back for `subscriber` (once per publisher and release epoch: see
    /// [`crate::flow`]); only the shard that sent the Hold sends its Release.
    pub(super) fn hold_for(&mut self, subscriber: &Arc<str>, from: &Publisher) {
        let Some(Destination::Local(client)) = self.destinations.get_mut(subscriber) else {
            return;
        };
        if client.backlog.is_holding(from.id, from.epoch) {
            return;
        }
        let send = self.sent_holds.get(&from.id) != Some(&from.epoch);
        client
            .backlog
            .hold((from.id, from.addr.clone(), from.epoch, send));
        if !send {
            return;
        }
        self.sent_holds.insert(from.id, from.epoch);
        add(&self.shared.metrics.backpressure_holds, 1);
        let me = client.addr.id();
        let shard = self.index as u16;
        self.control(
            &from.addr,
            ClientMsg::Hold {
                shard,
                subscriber: me,
            },
        );
    }

    /// Carries out what a subscriber's backlog asks for.
    pub(super) fn apply(&mut self, client_id: &Arc<str>, o: Outcome, ctx: &mut Ctx<Self>) {
        let Some(Destination::Local(client)) = self.destinations.get(client_id) else {
            return;
        };
        let (addr, epoch) = (client.addr.clone(), client.backlog.epoch());
        let shard = self.index as u16;
        self.release(o.release, addr.id());
        if let Some(on) = o.watch {
            self.control(&addr, ClientMsg::Watch { shard, on });
        }
        if o.stalled {
            add(&self.shared.metrics.backpressure_stalls, 1);
            debug!(client_id = %client_id, "stalled while holding publishers back: no longer holding");
            self.control(&addr, ClientMsg::Stalled { shard });
        }
        if let Some(at) = o.check_at {
            let client_id = client_id.clone();
            ctx.after(
                at.saturating_duration_since(time::now()),
                RouterMsg::FlowCheck { client_id, epoch },
            );
        }
    }

    /// Lets publishers held for `subscriber` go.
    pub(super) fn release(&mut self, holders: Vec<crate::flow::Holder>, subscriber: ActorId) {
        let shard = self.index as u16;
        for (id, addr, epoch, sent) in holders {
            if !sent {
                continue;
            }
            if self.sent_holds.get(&id) == Some(&epoch) {
                self.sent_holds.remove(&id);
            }
            self.control(&addr, ClientMsg::Release { shard, subscriber });
        }
    }

    /// Sends a control message on the urgent lane, after any still waiting for the same
    /// client (order kept); one that finds no room waits in the outbox.
    pub(super) fn control(&mut self, addr: &WeakAddr<ClientMsg>, msg: ClientMsg) {
        if self.outbox.iter().any(|(a, _)| a.id() == addr.id()) {
            self.outbox.push((addr.clone(), msg));
            return;
        }
        if let Err(TrySendError::Full(msg)) = addr.try_send_urgent(msg) {
            self.outbox.push((addr.clone(), msg));
        }
    }

    pub(super) fn send_outbox(&mut self) {
        let mut blocked: Vec<ActorId> = Vec::new();
        let mut kept = Vec::new();
        for (addr, msg) in std::mem::take(&mut self.outbox) {
            if blocked.contains(&addr.id()) {
                kept.push((addr, msg));
                continue;
            }
            if let Err(TrySendError::Full(msg)) = addr.try_send_urgent(msg) {
                blocked.push(addr.id());
                kept.push((addr, msg));
            }
        }
        self.outbox = kept;
    }
}
