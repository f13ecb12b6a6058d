//! The session as a value and back: [`Session::snapshot`] and [`Session::restore`], with
//! monotonic deadlines turned into wall-clock times and back at the boundary.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::num::NonZeroU16;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use starling_codec::{LastWill, PacketId, QoS, VAR_INT_MAX};

use super::{Inflight, Pending, PendingSubscribe, Phase, Rare, Session, Stage, Will};
use crate::state::{
    DeliveryState, DetachedState, ExpiryState, InflightPhase, InflightState, MessageState,
    PendingFilter, PendingSubscribeState, PendingUnsubscribeState, SessionState, SubscriptionState,
    WillState, SESSION_STATE_VERSION,
};
use crate::{
    Expiry, Instant, Message, PacketIdList, RestoreError, SessionLimits, SubscribeRequest,
};

impl Session {
    /// The session's state at `now`, as a value to store or to move to another node; the
    /// broker passes the wall-clock time `wall` of the same moment (its runtime's, as for
    /// `now`: the session reads no clock). Deadlines (session expiry, will delay, message
    /// expiry) are written as wall-clock times, from `deadline - now` added to `wall`.
    ///
    /// A detached session is taken as it is. An attached one is taken as it would be after
    /// losing its connection at `now` ([`DetachReason::ConnectionLost`](crate::DetachReason)):
    /// its expiry and its will delay start at `now`, and its will is kept (with delay 0 it is
    /// due at `now`; with session expiry 0 the session expires at `now`), so that a
    /// restored copy publishes the will and ends as that detach would have, at its first
    /// [`Session::handle_timeout`]. The session itself is unchanged.
    ///
    /// Effects not yet drained are not part of the state: take it after handling them
    /// (a routed QoS 2 message must be safe before a state that holds its packet identifier,
    /// and so will not route its resend, is).
    pub fn snapshot(&self, now: Instant, wall: SystemTime) -> SessionState {
        self.state(now, wall, true)
    }

    fn state(&self, now: Instant, wall: SystemTime, deliveries: bool) -> SessionState {
        let clock = WallClock { now, wall };
        let detached = match &self.phase {
            Phase::New | Phase::Ended => None,
            Phase::Detached { expires_at } => {
                let will_at = self.rare().will_at;
                Some(self.detached_state(&clock, *expires_at, will_at, deliveries))
            }
            Phase::Attached(_) => {
                // What `detach_with` would set.
                let expires_at = if self.expiry_secs == u32::MAX {
                    None
                } else {
                    now.checked_add(Duration::from_secs(u64::from(self.expiry_secs)))
                };
                let will_at = self.will.as_ref().and_then(|w| now.checked_add(w.delay));
                Some(self.detached_state(&clock, expires_at, will_at, deliveries))
            }
        };
        SessionState {
            version: SESSION_STATE_VERSION,
            client_id: self.client_id.to_string(),
            // Never 0 (it starts at 1 and wraps to 1); 1 would be tried next after 0 anyway.
            next_packet_id: NonZeroU16::new(self.next_packet_id).unwrap_or(NonZeroU16::MIN),
            detached,
        }
    }

    /// [`Session::snapshot`] without the deliveries (in flight and queued) and the inbound
    /// QoS 2 identifiers, which a store keeps in records of their own: what changes on
    /// CONNECT, SUBSCRIBE, UNSUBSCRIBE and detach, at the cost of the subscriptions, not of
    /// the queue.
    pub fn snapshot_meta(&self, now: Instant, wall: SystemTime) -> SessionState {
        self.state(now, wall, false)
    }

    /// The store keys of the deliveries: in flight in send order (the order a state lists
    /// them), then queued in queue order; `None` for one not stored. They are not part of
    /// the [`SessionState`]: a store keeps them as its records' keys.
    pub fn store_keys(&self) -> (Vec<Option<u64>>, Vec<Option<u64>>) {
        let mut flights: Vec<&Inflight> = self.inflight.values().collect();
        flights.sort_unstable_by_key(|f| f.seq);
        (
            flights.into_iter().map(|f| f.out.stored).collect(),
            self.queue.iter().map(|p| p.stored).collect(),
        )
    }

    /// The stages of the stored QoS 1 deliveries in flight, which the session does not
    /// report as they are sent (see [`StoreChange::Stage`](crate::StoreChange)): for the
    /// broker to write when the connection goes, so that a later restart resends them
    /// under their packet ids, with DUP.
    pub fn qos1_stages(&self) -> Vec<crate::StoreChange> {
        self.inflight
            .iter()
            .filter(|(_, f)| f.stage == Stage::Qos1)
            .filter_map(|(&packet_id, f)| {
                f.out.stored.map(|seq| crate::StoreChange::Stage {
                    seq,
                    packet_id,
                    phase: InflightPhase::AwaitingPuback,
                })
            })
            .collect()
    }

    /// Gives a restored session's deliveries their store keys, as [`Session::store_keys`]
    /// lists them. Extra keys are ignored; a delivery without one is not stored.
    pub fn set_store_keys(
        &mut self,
        inflight: impl IntoIterator<Item = Option<u64>>,
        queue: impl IntoIterator<Item = Option<u64>>,
    ) {
        let mut flights: Vec<&mut Inflight> = self.inflight.values_mut().collect();
        flights.sort_unstable_by_key(|f| f.seq);
        for (f, key) in flights.into_iter().zip(inflight) {
            f.out.stored = key;
        }
        for (p, key) in self.queue.iter_mut().zip(queue) {
            p.stored = key;
        }
    }

    fn detached_state(
        &self,
        clock: &WallClock,
        expires_at: Option<Instant>,
        will_at: Option<Instant>,
        deliveries: bool,
    ) -> DetachedState {
        let rare = self.rare();
        let mut inflight: Vec<(&PacketId, &Inflight)> = if deliveries {
            self.inflight.iter().collect()
        } else {
            Vec::new()
        };
        inflight.sort_unstable_by_key(|(_, f)| f.seq);
        DetachedState {
            expiry_interval_secs: self.expiry_secs,
            expires_at: expires_at.and_then(|t| clock.to_wall(t)),
            will: self.will.as_ref().map(|w| WillState {
                topic: w.will.topic.clone(),
                payload: w.will.payload.clone(),
                qos: w.will.qos,
                retain: w.will.retain,
                properties: w.will.properties.clone(),
                due_at: will_at.and_then(|t| clock.to_wall(t)),
            }),
            subscriptions: self
                .subscriptions
                .iter()
                .map(|(filter, (options, id))| SubscriptionState {
                    filter: filter.clone(),
                    options: *options,
                    subscription_id: *id,
                })
                .collect(),
            inflight: inflight
                .into_iter()
                .map(|(id, f)| InflightState {
                    packet_id: *id,
                    phase: f.stage.phase(),
                    delivery: delivery_state(&f.out, clock),
                })
                .collect(),
            queue: if deliveries {
                self.queue
                    .iter()
                    .map(|p| delivery_state(p, clock))
                    .collect()
            } else {
                Vec::new()
            },
            inbound_qos2: if deliveries {
                rare.inbound_qos2.iter().copied().collect()
            } else {
                Vec::new()
            },
            pending_subscribes: rare
                .pending_subscribes
                .iter()
                .map(|(id, p)| PendingSubscribeState {
                    packet_id: *id,
                    filters: pending_filters(p),
                })
                .collect(),
            pending_unsubscribes: rare
                .pending_unsubscribes
                .iter()
                .map(|(id, filters)| PendingUnsubscribeState {
                    packet_id: *id,
                    filters: filters.clone(),
                })
                .collect(),
            unheard: self.unheard,
        }
    }

    /// A detached session from a [`SessionState`] (from [`Session::snapshot`], perhaps on
    /// another node or before a restart), under the broker's `limits`, at `now`, whose
    /// wall-clock time is `wall`: a deadline `w` of the state falls at `now + (w - wall)`,
    /// one already past at `now` or earlier. A deadline beyond the range of [`Instant`]
    /// means never.
    ///
    /// Nothing is queued. Drive it like any session: arm its timer with
    /// [`Session::poll_timeout`], which may already have passed (a will or an expiry that
    /// fell due while the state was stored), and attach the client's next connection.
    ///
    /// # Errors
    /// A state no session can be in ([`RestoreError`]): another version, a packet
    /// identifier twice in a list, more in flight, queued or awaiting PUBREL than `limits`
    /// allow, a delivery in flight whose QoS is not its phase's, two subscriptions to one
    /// filter, a Subscription Identifier out of range.
    pub fn restore(
        state: SessionState,
        limits: impl Into<Arc<SessionLimits>>,
        now: Instant,
        wall: SystemTime,
    ) -> Result<Session, RestoreError> {
        if state.version != SESSION_STATE_VERSION {
            return Err(RestoreError::UnsupportedVersion {
                found: state.version,
                supported: SESSION_STATE_VERSION,
            });
        }
        let clock = WallClock { now, wall };
        let mut s = Session::new(Arc::from(state.client_id), limits);
        s.next_packet_id = state.next_packet_id.get();
        if let Some(d) = state.detached {
            s.restore_detached(d, &clock)?;
        }
        s.check_invariants();
        Ok(s)
    }

    fn restore_detached(
        &mut self,
        d: DetachedState,
        clock: &WallClock,
    ) -> Result<(), RestoreError> {
        let limits = Arc::clone(&self.limits);
        // The bounds `check_invariants` asserts.
        check_len(
            d.inflight.len(),
            usize::from(limits.inflight_max.max(1)),
            |len, max| RestoreError::InflightOverLimit { len, max },
        )?;
        check_len(d.queue.len(), limits.mqueue_len_hard(), |len, max| {
            RestoreError::QueueOverLimit { len, max }
        })?;
        check_len(
            d.inbound_qos2.len(),
            usize::from(limits.receive_max.max(1)),
            |len, max| RestoreError::InboundQos2OverLimit { len, max },
        )?;

        for sub in d.subscriptions {
            check_subscription_id(sub.subscription_id)?;
            if self.subscriptions.contains_key(&sub.filter) {
                return Err(RestoreError::DuplicateSubscription { filter: sub.filter });
            }
            self.subscriptions
                .insert(sub.filter, (sub.options, sub.subscription_id));
        }

        // Renumbered in send order: only their order matters.
        for (seq, f) in (0u64..).zip(d.inflight) {
            let stage = match f.phase {
                InflightPhase::AwaitingPuback => Stage::Qos1,
                InflightPhase::AwaitingPubrec => Stage::Qos2Published,
                InflightPhase::AwaitingPubcomp => Stage::Qos2Released,
            };
            if f.delivery.qos != f.phase.qos() {
                return Err(RestoreError::InflightPhaseMismatch {
                    packet_id: f.packet_id.get(),
                    qos: f.delivery.qos,
                    phase: f.phase,
                });
            }
            let inflight = Inflight {
                seq,
                out: pending(f.delivery, clock)?,
                stage,
                // Read only while attached, and every attach that keeps the state resends
                // (or releases) each delivery, which sets it.
                sent_at: clock.now,
            };
            if self.inflight.insert(f.packet_id, inflight).is_some() {
                return Err(duplicate(PacketIdList::Inflight, f.packet_id));
            }
        }
        self.next_seq = self.inflight.len() as u64;

        let mut queue = VecDeque::with_capacity(d.queue.len());
        for q in d.queue {
            queue.push_back(pending(q, clock)?);
        }
        self.queued_qos0 = queue.iter().filter(|p| p.qos == QoS::AtMostOnce).count() as u32;
        self.queue = queue;

        let mut rare = Rare {
            will_at: None,
            inbound_qos2: BTreeSet::new(),
            pending_subscribes: BTreeMap::new(),
            pending_unsubscribes: BTreeMap::new(),
        };
        for id in d.inbound_qos2 {
            if !rare.inbound_qos2.insert(id) {
                return Err(duplicate(PacketIdList::InboundQos2, id));
            }
        }
        for p in d.pending_subscribes {
            let pending = pending_subscribe(p.filters)?;
            if rare
                .pending_subscribes
                .insert(p.packet_id, pending)
                .is_some()
            {
                return Err(duplicate(PacketIdList::PendingSubscribes, p.packet_id));
            }
        }
        for p in d.pending_unsubscribes {
            if rare
                .pending_unsubscribes
                .insert(p.packet_id, p.filters)
                .is_some()
            {
                return Err(duplicate(PacketIdList::PendingUnsubscribes, p.packet_id));
            }
        }

        if let Some(w) = d.will {
            rare.will_at = w.due_at.and_then(|t| clock.to_instant(t));
            self.will = Some(Box::new(Will {
                // As `attach` reads it.
                delay: Duration::from_secs(u64::from(
                    w.properties.will_delay_interval.unwrap_or(0),
                )),
                will: LastWill {
                    topic: w.topic,
                    payload: w.payload,
                    qos: w.qos,
                    retain: w.retain,
                    properties: w.properties,
                },
            }));
        }
        if !rare.is_empty() {
            self.rare = Some(Box::new(rare));
        }
        self.expiry_secs = d.expiry_interval_secs;
        self.unheard = d.unheard;
        self.phase = Phase::Detached {
            expires_at: d.expires_at.and_then(|t| clock.to_instant(t)),
        };
        Ok(())
    }
}

/// One moment on both clocks: the monotonic one the session runs on and the wall clock a
/// state is written in.
#[derive(Debug, Clone, Copy)]
pub struct WallClock {
    /// The monotonic reading.
    pub now: Instant,
    /// The wall-clock time it stands for.
    pub wall: SystemTime,
}

impl WallClock {
    /// The wall-clock time of `t`; `None` past the range of [`SystemTime`].
    pub fn to_wall(&self, t: Instant) -> Option<SystemTime> {
        if t >= self.now {
            self.wall.checked_add(t - self.now)
        } else {
            self.wall.checked_sub(self.now - t)
        }
    }

    /// The instant of the wall-clock time `w`. One before the range of [`Instant`] (which
    /// may start at boot) is `now`: it has passed either way. One past it is `None`, never.
    pub fn to_instant(&self, w: SystemTime) -> Option<Instant> {
        match w.duration_since(self.wall) {
            Ok(ahead) => self.now.checked_add(ahead),
            Err(behind) => Some(self.now.checked_sub(behind.duration()).unwrap_or(self.now)),
        }
    }
}

fn delivery_state(p: &Pending, clock: &WallClock) -> DeliveryState {
    DeliveryState {
        message: message_state(&p.msg, clock),
        qos: p.qos,
        retain: p.retain,
        subscription_ids: p.sub_ids.clone(),
    }
}

fn message_state(m: &Message, clock: &WallClock) -> MessageState {
    MessageState {
        topic: m.topic.to_string(),
        payload: m.payload.clone(),
        qos: m.qos,
        retain: m.retain,
        properties: m.properties.clone(),
        expiry: m.expires_at.and_then(|e| {
            Some(ExpiryState {
                at: clock.to_wall(e.at)?,
                announced: e.announced,
            })
        }),
        publisher: m.publisher.as_deref().map(str::to_owned),
    }
}

fn message_of(m: MessageState, clock: &WallClock) -> Message {
    Message {
        topic: Arc::from(m.topic),
        payload: m.payload,
        qos: m.qos,
        retain: m.retain,
        properties: m.properties,
        expires_at: m.expiry.and_then(|e| {
            Some(Expiry {
                at: clock.to_instant(e.at)?,
                announced: e.announced,
            })
        }),
        publisher: m.publisher.map(Arc::from),
        shared_headers: Default::default(),
        received_at: None,
    }
}

impl Message {
    /// This message as it is stored: its expiry as a wall-clock time, `now` being `wall`.
    pub fn to_state(&self, now: Instant, wall: SystemTime) -> MessageState {
        message_state(self, &WallClock { now, wall })
    }

    /// A stored message back, `wall` being `now`: an expiry already past stays past.
    pub fn from_state(state: MessageState, now: Instant, wall: SystemTime) -> Message {
        message_of(state, &WallClock { now, wall })
    }
}

fn pending(d: DeliveryState, clock: &WallClock) -> Result<Pending, RestoreError> {
    for &id in &d.subscription_ids {
        check_subscription_id(Some(id))?;
    }
    let msg = message_of(d.message, clock);
    Ok(Pending {
        msg: Arc::new(msg),
        qos: d.qos,
        retain: d.retain,
        sub_ids: d.subscription_ids,
        stored: None,
        // Its receive time did not survive (`received_at` is `None`): untimed either way.
        from_retained: false,
    })
}

fn pending_filters(p: &PendingSubscribe) -> Vec<PendingFilter> {
    // Each undecided code stands for the next forwarded request (see `on_subscribe`).
    let mut forwarded = p.forwarded.iter();
    p.codes
        .iter()
        .filter_map(|code| match code {
            Some(code) => Some(PendingFilter::Decided(*code)),
            None => forwarded.next().map(|r| {
                PendingFilter::Forwarded(SubscriptionState {
                    filter: r.filter.clone(),
                    options: r.options,
                    subscription_id: r.subscription_id,
                })
            }),
        })
        .collect()
}

fn pending_subscribe(filters: Vec<PendingFilter>) -> Result<PendingSubscribe, RestoreError> {
    let mut codes = Vec::with_capacity(filters.len());
    let mut forwarded = Vec::new();
    for f in filters {
        match f {
            PendingFilter::Decided(code) => codes.push(Some(code)),
            PendingFilter::Forwarded(s) => {
                check_subscription_id(s.subscription_id)?;
                codes.push(None);
                forwarded.push(SubscribeRequest {
                    filter: s.filter,
                    options: s.options,
                    subscription_id: s.subscription_id,
                });
            }
        }
    }
    Ok(PendingSubscribe { codes, forwarded })
}

fn check_len(
    len: usize,
    max: usize,
    error: impl FnOnce(usize, usize) -> RestoreError,
) -> Result<(), RestoreError> {
    if len > max {
        Err(error(len, max))
    } else {
        Ok(())
    }
}

/// MQTT 5 §3.8.2.1.2: 1 to 268,435,455.
fn check_subscription_id(id: Option<u32>) -> Result<(), RestoreError> {
    match id {
        Some(id) if id == 0 || id > VAR_INT_MAX => Err(RestoreError::SubscriptionIdInvalid { id }),
        _ => Ok(()),
    }
}

fn duplicate(list: PacketIdList, id: PacketId) -> RestoreError {
    RestoreError::DuplicatePacketId {
        list,
        packet_id: id.get(),
    }
}
