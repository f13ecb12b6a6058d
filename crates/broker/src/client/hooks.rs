//! The client actor's side of the hook chain (`starling-hooks`): lifecycle events, and
//! waiting for later authorization verdicts in order.
//!
//! A PUBLISH or SUBSCRIBE whose verdict is neither remembered nor ready is not fed to the
//! session: it and everything after it wait in the held packets (what passes a
//! back-pressure hold, the acknowledgements of the client's own deliveries and PINGREQ,
//! still goes), reading stops past the held bound, and the verdict's future runs apart
//! (`spawn_then`) under `auth.verdict_timeout_ms`. Its answer comes back as
//! [`ClientMsg::Verdict`]; the packets are then fed in the order they came, the one that
//! waited answered from the verdict (or, past the deadline, `auth.timeout_verdict`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use starling_codec::{Connect, Packet, QoS, ReasonCode};
use starling_hooks::{
    DisconnectReason, DropReason as EventDrop, Event, EventKind, Subject, Verdict, What,
};
use starling_rt::{time, Ctx};
use starling_session::{Attached, DeliveryOptions, DropReason, Instant, Message};
use tracing::{debug, Instrument};

use super::Client;
use crate::gate::Asked;
use crate::metrics::add;
use crate::msg::{AuthzKind, ClientMsg, RouterMsg};

impl Client {
    /// Whether some event provider wants `kind`.
    #[inline]
    pub(super) fn wanted(&self, kind: EventKind) -> bool {
        self.gate.chain().wants(kind)
    }

    /// Makes the event (only if some provider wants its kind) and passes it on.
    #[inline]
    pub(super) fn emit(&self, kind: EventKind, what: impl FnOnce() -> What) {
        if self.wanted(kind) {
            self.emit_now(what());
        }
    }

    fn emit_now(&self, what: What) {
        let event = Event {
            who: Subject {
                node: self.shared.node.clone(),
                client_id: self.session.client_id().clone(),
                username: self.gate.username().cloned(),
            },
            what,
        };
        self.gate.chain().emit(&event);
    }

    /// connack, session created or resumed, connected: the session took the connection.
    pub(super) fn attached_events(&self, connect: &Connect, peer: SocketAddr, a: Attached) {
        let r = &self.shared.metrics.rmqtt;
        r.connack(ReasonCode::Success, connect.username.is_none());
        add(&r.client_connected, 1);
        add(
            if a.session_present {
                &r.session_resumed
            } else {
                &r.session_created
            },
            1,
        );
        self.emit(EventKind::ClientConnack, || What::ClientConnack {
            peer,
            code: ReasonCode::Success,
        });
        if a.session_present {
            self.emit(EventKind::SessionResumed, || What::SessionResumed);
        } else {
            self.emit(EventKind::SessionCreated, || What::SessionCreated);
        }
        self.emit(EventKind::ClientConnected, || What::ClientConnected {
            peer,
            protocol: connect.protocol,
            keep_alive: a.keep_alive_secs,
            clean_start: connect.clean_start,
        });
    }

    pub(super) fn dropped_event(&self, reason: DropReason, qos: QoS) {
        self.emit(EventKind::MessageDropped, || What::MessageDropped {
            topic: None,
            qos,
            reason: match reason {
                DropReason::QueueFull => EventDrop::QueueFull,
                DropReason::Expired => EventDrop::Expired,
                DropReason::TooLarge => EventDrop::TooLarge,
                DropReason::Offline => EventDrop::Offline,
                DropReason::SessionEnded => EventDrop::SessionEnded,
                DropReason::PayloadFormatInvalid => EventDrop::PayloadFormatInvalid,
                DropReason::NotAuthorized => EventDrop::NotAuthorized,
                _ => EventDrop::Other,
            },
        });
    }

    /// Hands a routed message to the session unless authorization withholds its topic from
    /// this client (a subscription may match topics it may not read).
    pub(super) fn deliver(
        &mut self,
        now: Instant,
        m: &Arc<Message>,
        o: &DeliveryOptions,
        ctx: &Ctx<Self>,
    ) {
        let (ok, asked) = self.gate.may_read(&m.topic);
        if let Some(asked) = asked {
            // Not waited for: the verdict decides the next deliveries on this topic.
            self.run_verdict(0, asked, ctx);
        }
        if ok {
            self.session.deliver(now, m, o);
        } else {
            add(&self.shared.metrics.dropped_acl, 1);
            self.emit(EventKind::MessageDropped, || What::MessageDropped {
                topic: Some(m.topic.clone()),
                qos: m.qos,
                reason: EventDrop::NotAuthorized,
            });
        }
    }

    /// The will, if it may be published now; one whose verdict comes later is published
    /// by a task of its own once allowed (the session may be ending, and nothing of this
    /// client comes after its will).
    pub(super) fn will(&mut self, m: Arc<Message>) -> Option<Arc<Message>> {
        let lastwill = &self.shared.metrics.rmqtt.messages_publish_lastwill;
        match self.gate.will(&m) {
            Verdict::Now(ok) => ok.then(|| {
                add(lastwill, 1);
                m
            }),
            Verdict::Later(v) => {
                let deadline = self.verdict_timeout();
                let on_timeout = self.shared.config.auth.timeout_verdict
                    == starling_config::TimeoutVerdict::Allow;
                let shard = self.shards.for_publish(&m.topic).clone();
                let shared = self.shared.clone();
                let task = async move {
                    let ok = match time::timeout(deadline, v).await {
                        Some(ok) => ok,
                        None => {
                            add(&shared.metrics.verdict_timeouts, 1);
                            on_timeout
                        }
                    };
                    if ok {
                        add(&shared.metrics.rmqtt.messages_publish_lastwill, 1);
                        let _ = shard.send(RouterMsg::Publish(m, None, None)).await;
                    }
                };
                starling_rt::spawn(task.instrument(tracing::Span::current()));
                None
            }
        }
    }

    pub(super) fn verdict_timeout(&self) -> Duration {
        Duration::from_millis(u64::from(self.shared.config.auth.verdict_timeout_ms))
    }

    /// Starts waiting for `asked`: the caller holds the packet that needs it, and what
    /// follows.
    pub(super) fn wait_for(&mut self, asked: Asked, ctx: &Ctx<Self>) {
        self.wait_seq = self.wait_seq.wrapping_add(1);
        self.waiting = true;
        debug!(topic = %asked.topic, kind = ?asked.kind, "waiting for a verdict");
        self.run_verdict(self.wait_seq, asked, ctx);
    }

    fn run_verdict(&self, seq: u32, asked: Asked, ctx: &Ctx<Self>) {
        let Asked {
            kind,
            topic,
            verdict,
        } = asked;
        let deadline = self.verdict_timeout();
        let attach = self.attaches;
        ctx.spawn_then(time::timeout(deadline, verdict), move |verdict| {
            ClientMsg::Verdict {
                attach,
                seq,
                kind,
                topic,
                verdict,
            }
        });
    }

    /// A later verdict came (`None`: its deadline passed). The held packets then go from
    /// `poll_input`, in order.
    pub(super) fn on_verdict(
        &mut self,
        seq: u32,
        kind: AuthzKind,
        topic: Arc<str>,
        verdict: Option<bool>,
    ) {
        let current = kind != AuthzKind::Read && self.waiting && seq == self.wait_seq;
        if current || verdict.is_some() || kind == AuthzKind::Read {
            // A verdict for a wait of this connection that is over is still worth
            // remembering; its timeout is not (it would decide the next packet).
            self.gate.verdict(kind, topic, verdict);
        }
        if current {
            self.waiting = false;
        }
    }

    /// Feeds one packet to the session; `false` if it broke the protocol. A PUBACK or
    /// PUBCOMP that acknowledges a delivery in flight adds one to `acks`, which the caller
    /// counts once per input batch (one shared add per batch, not per acknowledgement).
    pub(super) fn feed(&mut self, p: Packet, acks: &mut u32) -> bool {
        let r = &self.shared.metrics.rmqtt;
        let mut acked = false;
        match &p {
            Packet::Disconnect(d) => {
                self.closing = Some(DisconnectReason::Client(d.reason_code));
            }
            Packet::Puback(a) | Packet::Pubcomp(a) => {
                let want = match p {
                    Packet::Puback(_) => QoS::AtLeastOnce,
                    _ => QoS::ExactlyOnce,
                };
                // Only what acknowledges a delivery in flight counts (a stray
                // acknowledgement is ignored by the session): one lookup per ack.
                if let Some((m, qos)) = self.session.inflight_message(a.packet_id) {
                    acked = qos == want;
                    if acked && self.wanted(EventKind::MessageAcked) {
                        let what = What::MessageAcked {
                            topic: m.topic.clone(),
                            qos,
                            packet_id: a.packet_id,
                        };
                        self.emit_now(what);
                    }
                }
            }
            Packet::Subscribe(s) => add(&r.client_subscribe, s.filters.len() as u64),
            Packet::Unsubscribe(u) => add(&r.client_unsubscribe, u.filters.len() as u64),
            _ => {}
        }
        let unheard = self.session.is_unheard();
        // The packet's moment is when its bytes reached the host, where the transport
        // knows: a PUBLISH's `received_at`, and the SUBSCRIBE's `since` (below), order two
        // clients' packets as they came, whichever thread got to its bytes first.
        let at = self.packet_time();
        let result = self.session.handle_packet(at, p, &mut self.gate);
        self.gate.fed();
        if unheard && !self.session.is_unheard() {
            // Its stored meta says it was told it had no session: once per such session,
            // the record learns the client went on from there.
            self.meta_changed(false);
        }
        // A PUBCOMP for a message not yet released is a protocol error, not an ack.
        if acked && result.is_ok() {
            *acks += 1;
        }
        match result {
            Ok(()) => true,
            Err(e) => {
                self.closing = Some(DisconnectReason::Server(e.reason_code()));
                false
            }
        }
    }
}
