//! A client's side of back-pressure and of the node's session gauges: what it reports to
//! the shards of its backlog, and the holdings it last added to the gauges. Nothing in it
//! is shared with another actor.

use starling_rt::{Ctx, TrySendError};
use starling_session::Session;

use super::Client;
use crate::flow::{Holds, Reporter};
use crate::msg::{Publisher, RouterMsg};

/// What a session holds, as the node's gauges count it (`message_queues`,
/// `out_inflights`, `in_inflights`): kept as last reported (in the flow box), so that the
/// gauges move once per burst, not once per turn (two atomic operations a gauge, on every
/// delivery and every acknowledgement of a fan-out otherwise).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Occupancy {
    queued: u32,
    /// Bounded by the 16-bit packet ids, as is `inbound`.
    out: u16,
    inbound: u16,
}

/// A change of a session's holdings this large is reported even within a burst.
const OCCUPANCY_STEP: u32 = 16;

impl Occupancy {
    fn of(s: &Session) -> Self {
        let narrow = |n: usize| u16::try_from(n).unwrap_or(u16::MAX);
        Self {
            queued: u32::try_from(s.queue_len()).unwrap_or(u32::MAX),
            out: narrow(s.inflight_len()),
            inbound: narrow(s.inbound_qos2_len()),
        }
    }

    /// Whether `self` is at least [`OCCUPANCY_STEP`] away from `other` in some count.
    fn far_from(&self, other: &Self) -> bool {
        self.queued.abs_diff(other.queued) >= OCCUPANCY_STEP
            || u32::from(self.out.abs_diff(other.out)) >= OCCUPANCY_STEP
            || u32::from(self.inbound.abs_diff(other.inbound)) >= OCCUPANCY_STEP
    }
}

/// A client's side of back-pressure: nothing in it is shared.
pub(super) struct ClientFlow {
    /// This client as a publisher that may be held back.
    pub(super) me: Publisher,
    pub(super) holds: Holds,
    /// As a subscriber, once it has subscribed.
    pub(super) reporter: Option<Reporter>,
    /// The session's holdings as last added to the node's gauges: here, since a session
    /// that holds messages has subscribed or published at QoS 1/2 (or came restored with
    /// them, and gets this box then), so an idle connection pays nothing for it.
    pub(super) occupancy: Occupancy,
}

impl Client {
    /// The client's back-pressure state, made at its first need.
    pub(super) fn flow_mut(&mut self, ctx: &Ctx<Self>) -> &mut ClientFlow {
        self.flow.get_or_insert_with(|| {
            Box::new(ClientFlow {
                me: Publisher {
                    id: ctx.id(),
                    addr: ctx.weak_addr(),
                    epoch: 0,
                },
                holds: Holds::default(),
                reporter: None,
                occupancy: Occupancy::default(),
            })
        })
    }

    /// Moves the node's gauges to the session's holdings now: at the end of a burst
    /// (`settled`), or within one once they moved far; `None` takes them all back (the
    /// actor stops).
    pub(super) fn report_occupancy(&mut self, settled: Option<bool>, ctx: &Ctx<Self>) {
        let was = self
            .flow
            .as_ref()
            .map_or_else(Occupancy::default, |f| f.occupancy);
        let now = match settled {
            None => Occupancy::default(),
            Some(_) => Occupancy::of(&self.session),
        };
        if now == was || settled.is_some_and(|s| !s && !now.far_from(&was)) {
            return;
        }
        self.flow_mut(ctx).occupancy = now;
        let m = &self.shared.metrics;
        let d = |a: u32, b: u32| i64::from(a) - i64::from(b);
        m.message_queues.shift(d(now.queued, was.queued));
        m.out_inflights.shift(d(now.out.into(), was.out.into()));
        m.in_inflights
            .shift(d(now.inbound.into(), was.inbound.into()));
    }

    /// Tells the shards what they need to know of this subscriber's backlog (see
    /// [`Reporter::due`]); waits for room, as a shard never waits on a client.
    pub(super) async fn report_flow(&mut self, ctx: &mut Ctx<Self>) {
        let (queued, saturated) = (self.session.queue_len(), self.session.refuses_new());
        let Some(r) = self.flow.as_mut().and_then(|f| f.reporter.as_mut()) else {
            return;
        };
        let due = r.due(queued, saturated);
        for (shard, report) in due {
            let msg = RouterMsg::Flow {
                client_id: self.session.client_id().clone(),
                actor: ctx.id(),
                report,
            };
            // On the urgent lane: behind the publishes in the shard's mailbox it would come
            // too late to tell the shard that this queue fills (they are routed on the
            // stale view). A full urgent lane is waited on in the normal one.
            let shard = self.shards.get(shard);
            if let Err(TrySendError::Full(msg)) = shard.try_send_urgent(msg) {
                let _ = Box::pin(shard.send(msg)).await;
            }
        }
    }
}
