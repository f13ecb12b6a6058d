//! The client actor's loop: its turns, and its socket as its own input
//! ([`Actor::poll_input`]), with the packets held back while the client is held (by a
//! subscriber, see [`crate::flow`], or while it waits for a verdict, see `hooks`).

use std::task::{Context, Poll};

use bytes::BytesMut;
use starling_codec::{decode, Packet};
use starling_rt::time::Instant;
use starling_rt::{Actor, Ctx};
use tracing::Instrument;

use super::{Client, HELD_MAX, HELD_RELEASE, INPUT_BATCH_MAX};
use crate::metrics::add;
use crate::msg::ClientMsg;

impl Actor for Client {
    type Msg = ClientMsg;

    async fn started(&mut self, ctx: &mut Ctx<Self>) {
        if let Some(nc) = self.first.take() {
            let span = tracing::debug_span!("client", client_id = %self.session.client_id());
            async {
                Box::pin(self.attach(nc, ctx)).await;
                self.after_turn(ctx).await;
            }
            .instrument(span)
            .await;
        }
        // A session restored from the store starts with what it holds.
        self.report_occupancy(Some(true), ctx);
    }

    async fn handle(&mut self, msg: ClientMsg, ctx: &mut Ctx<Self>) {
        let span = tracing::debug_span!("client", client_id = %self.session.client_id());
        self.turn(msg, ctx).instrument(span).await;
        self.report_occupancy(Some(ctx.queued() == 0), ctx);
    }

    /// What the session still holds leaves the node's gauges with the actor.
    async fn stopped(&mut self, ctx: &mut Ctx<Self>) {
        self.report_occupancy(None, ctx);
    }

    /// The session's next deadline (keep alive, resend, will delay, expiry): moved by
    /// nearly every packet, so it is the actor's own rather than a timer set again each
    /// turn.
    fn deadline(&self) -> Option<Instant> {
        self.session.poll_timeout()
    }

    fn on_deadline(&mut self) -> Option<ClientMsg> {
        Some(ClientMsg::Timeout)
    }

    /// Decoded packets of the attached connection, in batches: polled only between turns, so
    /// a busy client stops reading its socket (back-pressure to the peer), and its
    /// acknowledgements never queue behind routed messages in the mailbox.
    ///
    /// While the router holds this client's publishes back (see [`crate::flow`]), the
    /// acknowledgements of its own deliveries and PINGREQ still pass; a PUBLISH and whatever
    /// must stay behind it (PUBREL, SUBSCRIBE, DISCONNECT, ...) wait in `held`, in order,
    /// and past [`HELD_MAX`] of them nothing more is read.
    fn poll_input(&mut self, cx: &mut Context<'_>) -> Poll<ClientMsg> {
        let max = self.shared.limits.packet_size_max;
        let Some(c) = self.conn.as_mut() else {
            return Poll::Pending;
        };
        // Released by a message (or a verdict), which wakes the actor: no waker to keep
        // here.
        let holding = self.waiting || self.flow.as_ref().is_some_and(|f| f.holds.is_held());
        loop {
            if c.input_ended {
                if holding {
                    // What it sent before waits for its verdict (bounded by its deadline) or
                    // for its release (bounded by the stall rules: a Release message wakes
                    // the actor), rather than going round the hold again: handed over now,
                    // the turn would hold it again and this would spin.
                    return Poll::Pending;
                }
                // The peer is gone or broke the protocol: what it sent before goes now.
                if let Some(held) = c.held.take() {
                    return Poll::Ready(ClientMsg::Input(Vec::from(*held), None));
                }
                if std::mem::take(&mut c.end_owed) {
                    return Poll::Ready(ClientMsg::InputEnd);
                }
                return Poll::Pending;
            }
            if !holding && c.held.is_some() && std::mem::take(&mut c.releasing) {
                // Yield between released chunks (woken at once, behind the tasks already
                // ready, the router among them), so that the router may hold the client
                // again before the rest: every publisher of a drained subscriber is let go
                // at the same moment.
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            // Released a chunk at a time: the router may hold the client back again before
            // the rest.
            let mut batch = match c.held.as_mut() {
                Some(held) if !holding && held.len() > HELD_RELEASE => {
                    held.drain(..HELD_RELEASE).collect()
                }
                Some(_) if !holding => c.held.take().map_or_else(Vec::new, |h| Vec::from(*h)),
                _ => Vec::new(),
            };
            if !holding && c.held.is_some() {
                c.releasing = true;
                // More held packets come before anything read after them.
                return Poll::Ready(ClientMsg::Input(batch, None));
            }
            let mut error = None;
            while batch.len() < INPUT_BATCH_MAX {
                if c.held.as_ref().is_some_and(|h| h.len() >= HELD_MAX) {
                    break;
                }
                let before = c.input.len();
                match decode(&mut c.input, c.protocol, max) {
                    Ok(Some(p)) if holding && !passes_hold(&p) => {
                        c.held.get_or_insert_with(Box::default).push_back(p);
                    }
                    Ok(Some(p)) => {
                        if batch.capacity() == 0 {
                            // Sized once from the first packet's length: grown by doubling,
                            // a batch of large `Packet`s was copied over and over (4 % of a
                            // fan-in's instructions).
                            let used = (before - c.input.len()).max(1);
                            batch.reserve((before / used).clamp(1, INPUT_BATCH_MAX));
                        }
                        batch.push(p);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
            }
            if let Some(e) = error {
                // Nothing after a decode error is read: the connection is closing, and what
                // came before the bad packet is handled first, held or not.
                c.input_ended = true;
                if let Some(held) = c.held.take() {
                    batch.extend(*held);
                }
                return Poll::Ready(ClientMsg::Input(batch, Some(e)));
            }
            if !batch.is_empty() {
                return Poll::Ready(ClientMsg::Input(batch, None));
            }
            if c.held.as_ref().is_some_and(|h| h.len() >= HELD_MAX) {
                // Woken through the flow once released.
                return Poll::Pending;
            }
            match c.poll_fill(cx) {
                Poll::Pending => {
                    if c.input.is_empty() && c.input.capacity() > 0 {
                        c.input = BytesMut::new();
                    }
                    return Poll::Pending;
                }
                Poll::Ready(0) => {
                    c.input_ended = true;
                    c.end_owed = true;
                    c.eof = true;
                }
                Poll::Ready(n) => add(&self.shared.metrics.bytes_received, n as u64),
            }
        }
    }
}

/// Whether a packet may pass a held-back PUBLISH: it belongs to the other direction (our
/// deliveries' acknowledgements) or to no flow at all (PINGREQ). Letting these through is
/// what keeps two clients that publish to each other from holding each other forever.
pub(super) fn passes_hold(p: &Packet) -> bool {
    matches!(
        p,
        Packet::Puback(_) | Packet::Pubrec(_) | Packet::Pubcomp(_) | Packet::Pingreq
    )
}
