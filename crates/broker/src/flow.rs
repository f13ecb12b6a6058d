//! Back-pressure between clients, by messages: a subscriber whose queue backs up holds back
//! the publishers that feed it QoS 1/2 messages, until it has drained; a QoS 0 publisher
//! only when most of a publish's deliveries find no room ([`Qos0Tally`]).
//!
//! Without it, a flood of QoS 1 publishes into one subscriber is accepted at the rate the
//! publishers send, and all but what the subscriber's window lets through is dropped at its
//! full queue: QoS 1 in name only. With it (`mqtt.backpressure`, on by default):
//!
//! - Each shard keeps a [`Backlog`] per subscriber it delivers to: what it handed to the
//!   subscriber's mailbox, what the subscriber reported taken from it, the subscriber's
//!   session queue as last reported, and what is still pending in the shard. Their sum is
//!   what waits for the subscriber; past [`SessionLimits::backlog_high`] the subscriber is
//!   backlogged, until it is down to [`SessionLimits::backlog_low`].
//! - The subscriber's actor reports to each shard ([`Reporter`], `RouterMsg::Flow`): every
//!   [`Reporter::quantum`] deliveries taken, on every turn that changed something while
//!   that shard watches it (told by `ClientMsg::Watch`), and to every shard whenever its
//!   session starts or stops refusing new messages or its queue crosses the high or low mark.
//! - A QoS 1/2 publish routed to a backlogged subscriber makes the shard send its publisher
//!   `ClientMsg::Hold` (once per publisher and release epoch, see [`Holds`]); the
//!   publisher's actor then stops taking PUBLISH (and everything ordered after one) from
//!   its socket, while acknowledgements of its own deliveries still pass, so two clients
//!   feeding each other cannot deadlock. When the subscriber that sent the Hold drains,
//!   goes offline or ends, the shard sends the publisher `ClientMsg::Release`. A shard
//!   never waits on a client: a control message that finds no room waits in the shard's
//!   outbox, in order, and is retried.
//! - Stalls are judged by the shard, whose actor runs whatever the subscriber's does: a
//!   subscriber that takes nothing in for `backpressure_stall_secs` while holding, or stays
//!   backlogged for `backpressure_max_secs` without draining, is stuck: it releases its
//!   publishers and holds no one until it drains, and only `backpressure_stalls_max` times
//!   per `backpressure_window_secs` (see [`StallRules`]).
//!
//! Nothing is shared between the actors but their mailboxes. An offline session is never
//! backlogged: its queue fills and drops by its policy.

use std::sync::Arc;
use std::time::Duration;

use starling_rt::{ActorId, WeakAddr};
use starling_session::{Instant, SessionLimits};

use crate::msg::ClientMsg;
pub(crate) use crate::msg::FlowReport;

/// How a stalled subscriber is told apart from a slow one (`mqtt.backpressure_*`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct StallRules {
    /// Taking nothing in for this long while holding publishers back is a stall.
    pub stall: Duration,
    /// Backlogged this long without draining is a stall too.
    pub max: Duration,
    /// Stalls allowed per window; past them it holds no one back until the window ends.
    pub stalls_max: u32,
    pub window: Duration,
    /// Backlogged from this many waiting (half the queue bound)...
    pub high: usize,
    /// ... until down to this many (a quarter).
    pub low: usize,
}

impl StallRules {
    pub(crate) fn new(m: &starling_config::MqttConfig, limits: &SessionLimits) -> Self {
        Self {
            stall: Duration::from_secs(u64::from(m.backpressure_stall_secs)),
            max: Duration::from_secs(u64::from(m.backpressure_max_secs)),
            stalls_max: m.backpressure_stalls_max,
            window: Duration::from_secs(u64::from(m.backpressure_window_secs)),
            high: limits.backlog_high(),
            low: limits.backlog_low(),
        }
    }
}

/// A publisher a shard holds back for one subscriber: its id, address and release epoch, and
/// whether this subscriber's shard sent it the Hold (a shard sends one per publisher and
/// epoch, whichever subscriber asks first: the publisher heeds its latest Hold only, so
/// more would be traffic for nothing; only the one that sent it sends the Release).
pub(crate) type Holder = (ActorId, WeakAddr<ClientMsg>, u32, bool);

/// A publish's QoS 0 deliveries to subscribers that could hold it back, and how many of
/// them found no room at a backlogged subscriber (`mqtt.backpressure_qos0`). QoS 0 may be
/// dropped, so a single slow subscriber among many does not hold its publisher; when most
/// of a publish's deliveries are dropped, though, routing it mostly makes work to throw
/// away, and that work is taken from the subscribers that must drain: the publisher is held
/// until the first of them drains.
#[derive(Default)]
pub(crate) struct Qos0Tally {
    total: u32,
    backlogged: u32,
    first: Option<Arc<str>>,
}

impl Qos0Tally {
    pub(crate) fn count(&mut self, backlogged: bool, subscriber: &Arc<str>) {
        self.total += 1;
        if backlogged {
            self.backlogged += 1;
            if self.first.is_none() {
                self.first = Some(subscriber.clone());
            }
        }
    }

    /// The subscriber to hold the publisher for, when more than half are backlogged.
    pub(crate) fn overloaded(self) -> Option<Arc<str>> {
        (self.backlogged * 2 > self.total)
            .then_some(self.first)
            .flatten()
    }
}

/// What a shard does after its [`Backlog`] changed.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    /// Release these publishers.
    pub release: Vec<Holder>,
    /// Tell the subscriber whether this shard watches it now.
    pub watch: Option<bool>,
    /// It stalled (count it; with `backpressure_stuck_policy = "disconnect"` tell it).
    pub stalled: bool,
    /// Check it again at this time (the check's epoch is [`Backlog::epoch`]).
    pub check_at: Option<Instant>,
}

/// One subscriber as one shard sees it. Sans-IO: time comes in as arguments, what to send
/// comes out as an [`Outcome`].
#[derive(Debug)]
pub(crate) struct Backlog {
    handed: u64,
    taken: u64,
    queued: usize,
    saturated: bool,
    may_hold: bool,
    online: bool,
    backlogged: bool,
    stuck: bool,
    /// When this backlogged stretch began, and when the subscriber last made progress.
    since: Instant,
    progress_at: Instant,
    /// Numbers the backlogged stretches: a check belongs to one.
    epoch: u64,
    window_start: Option<Instant>,
    stalls: u32,
    holding: Vec<Holder>,
}

impl Backlog {
    pub(crate) fn new(now: Instant, may_hold: bool) -> Self {
        Self {
            handed: 0,
            taken: 0,
            queued: 0,
            saturated: false,
            may_hold,
            online: true,
            backlogged: false,
            stuck: false,
            since: now,
            progress_at: now,
            epoch: 0,
            window_start: None,
            stalls: 0,
            holding: Vec::new(),
        }
    }

    pub(crate) fn saturated(&self) -> bool {
        self.saturated
    }

    /// Whether it holds its publishers (and the links of other nodes) back now.
    pub(crate) fn backlogged(&self) -> bool {
        self.backlogged
    }

    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// `n` deliveries went into the subscriber's mailbox.
    pub(crate) fn handed(&mut self, n: usize) {
        self.handed += n as u64;
    }

    /// What waits for the subscriber, with `pending` still in the shard.
    pub(crate) fn waiting(&self, pending: usize) -> usize {
        let in_transit = usize::try_from(self.handed.saturating_sub(self.taken)).unwrap_or(0);
        self.queued + in_transit + pending
    }

    /// At routing time, for a QoS 1/2 delivery whose publisher may be held: whether the
    /// subscriber holds its publishers back now. A stretch that begins here asks for a
    /// watch and a check.
    /// `now` is read only when a stretch begins: this runs per delivery.
    pub(crate) fn judge(
        &mut self,
        now: impl FnOnce() -> Instant,
        pending: usize,
        rules: &StallRules,
    ) -> (bool, Option<Outcome>) {
        if !self.may_hold || self.stuck || !self.online {
            return (false, None);
        }
        let mut out = None;
        if !self.backlogged && self.waiting(pending) >= rules.high {
            let now = now();
            self.backlogged = true;
            self.epoch += 1;
            self.since = now;
            self.progress_at = now;
            out = Some(Outcome {
                watch: Some(true),
                check_at: Some(now + rules.stall.min(rules.max)),
                ..Outcome::default()
            });
        }
        (self.backlogged, out)
    }

    /// Records a publisher held for this subscriber; false if it already is, in the
    /// publisher's current epoch (a Hold of an earlier epoch was lifted since: it is sent
    /// again).
    pub(crate) fn hold(&mut self, holder: Holder) -> bool {
        match self.holding.iter_mut().find(|h| h.0 == holder.0) {
            Some(h) if h.2 == holder.2 => false,
            Some(h) => {
                *h = holder;
                true
            }
            None => {
                self.holding.push(holder);
                true
            }
        }
    }

    /// Whether it holds publisher `id` in its release epoch `epoch` already.
    pub(crate) fn is_holding(&self, id: ActorId, epoch: u32) -> bool {
        self.holding.iter().any(|h| h.0 == id && h.2 == epoch)
    }

    /// The subscriber's report.
    pub(crate) fn report(
        &mut self,
        now: Instant,
        r: FlowReport,
        pending: usize,
        rules: &StallRules,
    ) -> Outcome {
        let progressed = r.progressed || r.taken > self.taken || r.queued < self.queued;
        self.taken = self.taken.max(r.taken);
        self.queued = r.queued;
        self.saturated = r.saturated;
        if progressed {
            self.progress_at = now;
        }
        let mut out = Outcome::default();
        if self.waiting(pending) > rules.low {
            return out;
        }
        // Drained.
        let watched = self.backlogged || self.stuck;
        if self.backlogged {
            self.backlogged = false;
            out.release = std::mem::take(&mut self.holding);
        }
        if self.stuck && !self.over_budget(now, rules) {
            // Stalls left in the window: it holds publishers back again next time.
            self.stuck = false;
        }
        if watched && !self.stuck {
            out.watch = Some(false);
        }
        out
    }

    /// The check armed in stretch `epoch` is due.
    pub(crate) fn check(&mut self, now: Instant, epoch: u64, rules: &StallRules) -> Outcome {
        let mut out = Outcome::default();
        if epoch != self.epoch || !self.backlogged {
            // From a stretch that ended; the current one has its own check.
            return out;
        }
        let stall_at = self.progress_at + rules.stall;
        let max_at = self.since + rules.max;
        if now < stall_at && now < max_at {
            out.check_at = Some(stall_at.min(max_at));
            return out;
        }
        self.stall(now, rules, &mut out);
        out
    }

    fn stall(&mut self, now: Instant, rules: &StallRules, out: &mut Outcome) {
        self.backlogged = false;
        self.stuck = true;
        let expired = self
            .window_start
            .is_none_or(|w| now.saturating_duration_since(w) >= rules.window);
        if expired {
            self.window_start = Some(now);
            self.stalls = 0;
        }
        self.stalls += 1;
        out.release = std::mem::take(&mut self.holding);
        // Still watched: its reports tell when it has drained and may hold again.
        out.stalled = true;
    }

    /// Whether it spent its stalls for the window: it then holds no one back until the
    /// window ends, drained or not.
    fn over_budget(&mut self, now: Instant, rules: &StallRules) -> bool {
        if self
            .window_start
            .is_some_and(|w| now.saturating_duration_since(w) >= rules.window)
        {
            self.window_start = None;
            self.stalls = 0;
        }
        self.stalls >= rules.stalls_max
    }

    /// The subscriber attached (`online`) or detached; `may_hold` is its identity's right
    /// to hold (`mqtt.backpressure_holders`). Offline, it holds no one. `forgive`: its
    /// stall record starts over (it was disconnected for stalling).
    pub(crate) fn presence(&mut self, online: bool, may_hold: bool, forgive: bool) -> Outcome {
        self.online = online;
        self.may_hold = may_hold;
        let mut out = Outcome::default();
        if !online || !may_hold {
            if self.backlogged || self.stuck {
                out.watch = Some(false);
            }
            self.backlogged = false;
            out.release = std::mem::take(&mut self.holding);
        }
        if !online && forgive {
            self.stuck = false;
            self.stalls = 0;
            self.window_start = None;
        }
        out
    }

    /// The subscriber is gone: everyone it held goes.
    pub(crate) fn end(&mut self) -> Vec<Holder> {
        self.backlogged = false;
        std::mem::take(&mut self.holding)
    }
}

/// A publisher's side: held back for the subscriber of the latest Hold, until that one
/// releases it. Holds of other subscribers that came before are forgotten: when released,
/// its next publish to one still backlogged is held again at once (the publish carries the
/// epoch, which a release advances, so that subscriber's shard sends a new Hold). Waiting
/// for every subscriber that ever held it would pace a fan-out publisher by its slowest
/// subscriber's whole drain while the others sat idle.
#[derive(Debug, Default)]
pub(crate) struct Holds {
    by: Option<(u16, ActorId)>,
    epoch: u32,
}

impl Holds {
    pub(crate) fn is_held(&self) -> bool {
        self.by.is_some()
    }

    /// The epoch its publishes carry.
    pub(crate) fn epoch(&self) -> u32 {
        self.epoch
    }

    pub(crate) fn hold(&mut self, shard: u16, subscriber: ActorId) {
        self.by = Some((shard, subscriber));
    }

    pub(crate) fn release(&mut self, shard: u16, subscriber: ActorId) {
        if self.by == Some((shard, subscriber)) {
            self.by = None;
            self.epoch = self.epoch.wrapping_add(1);
        }
    }
}

/// A subscriber's side: what it took from each shard and what it told each.
#[derive(Debug)]
pub(crate) struct Reporter {
    taken: Vec<u64>,
    reported: Vec<u64>,
    watched: Vec<bool>,
    /// Shards that found it stalled and have not seen it drain since.
    stuck: Vec<bool>,
    /// Shards it sent a subscription to: the ones that know it, to tell of its presence
    /// and its end.
    known: Vec<bool>,
    queued: usize,
    saturated: bool,
    progressed: bool,
    quantum: u64,
    /// Its queue alone is over the high mark (until down to the low one): every shard is
    /// told when this flips, since each sees only its own part of what fills the queue.
    full: bool,
    high: usize,
    low: usize,
}

impl Reporter {
    /// For `shards` shards. A report is due every [`Reporter::quantum`] deliveries taken
    /// from a shard although nothing else changed, so that a shard's count of what is in
    /// the subscriber's mailbox is never off by more than that.
    pub(crate) fn new(shards: usize, rules: &StallRules) -> Self {
        let quantum = Self::quantum(rules);
        Self {
            full: false,
            high: rules.high,
            low: rules.low,
            taken: vec![0; shards],
            reported: vec![0; shards],
            watched: vec![false; shards],
            stuck: vec![false; shards],
            known: vec![false; shards],
            queued: 0,
            saturated: false,
            progressed: false,
            quantum: quantum.max(1) as u64,
        }
    }

    /// The quantum for a session queue bound: half the low mark, at least one batch.
    fn quantum(rules: &StallRules) -> usize {
        (rules.low / 2).max(crate::msg::BATCH_MAX)
    }

    pub(crate) fn taken(&mut self, shard: usize, n: usize) {
        if let Some(t) = self.taken.get_mut(shard) {
            *t += n as u64;
        }
    }

    /// It sent a subscription to `shard`.
    pub(crate) fn met(&mut self, shard: usize) {
        if let Some(k) = self.known.get_mut(shard) {
            *k = true;
        }
    }

    /// The shards that know it (see [`Reporter::met`]).
    pub(crate) fn known(&self) -> &[bool] {
        &self.known
    }

    pub(crate) fn progressed(&mut self) {
        self.progressed = true;
    }

    /// `shard` watches it (a backlogged stretch began) or stops (it drained, and any
    /// stall there is forgiven).
    pub(crate) fn watch(&mut self, shard: usize, on: bool) {
        if let Some(w) = self.watched.get_mut(shard) {
            *w = on;
        }
        if !on {
            if let Some(s) = self.stuck.get_mut(shard) {
                *s = false;
            }
        }
    }

    /// `shard` found it stalled: what that shard sends is no longer kept past the bound.
    pub(crate) fn stalled(&mut self, shard: usize) {
        if let Some(s) = self.stuck.get_mut(shard) {
            *s = true;
        }
    }

    /// Whether a QoS 1/2 delivery from `shard` arriving at a session with `queued`
    /// messages is kept past the queue bound, as held back. While the queue is over the
    /// high mark its publishers are being held, but what a shard routed before it learned
    /// (its view of this queue lags by the messages ahead in its mailbox, and other shards
    /// fill the queue too) was acknowledged already: it is kept, up to the hard bound,
    /// rather than dropped. Not from a shard that found it stalled: a stalled subscriber's
    /// queue drops by its policy.
    pub(crate) fn absorbs(&self, shard: usize, queued: usize) -> bool {
        let full = if self.full {
            queued > self.low
        } else {
            queued >= self.high
        };
        full && !self.stuck.get(shard).copied().unwrap_or(true)
    }

    /// The reports due after a turn that left the session with `queued` messages and
    /// `saturated` as given, one per shard that needs one.
    pub(crate) fn due(&mut self, queued: usize, saturated: bool) -> Vec<(usize, FlowReport)> {
        let queue_moved = queued != self.queued;
        let full = if self.full {
            queued > self.low
        } else {
            queued >= self.high
        };
        let flipped = saturated != self.saturated || full != self.full;
        self.full = full;
        let progressed = std::mem::take(&mut self.progressed);
        let mut out = Vec::new();
        for s in 0..self.taken.len() {
            let fresh = self.taken[s] - self.reported[s];
            let watched_change = self.watched[s] && (fresh > 0 || queue_moved || progressed);
            if flipped || watched_change || fresh >= self.quantum {
                self.reported[s] = self.taken[s];
                out.push((
                    s,
                    FlowReport {
                        taken: self.taken[s],
                        queued,
                        saturated,
                        progressed,
                    },
                ));
            }
        }
        self.queued = queued;
        self.saturated = saturated;
        out
    }
}

#[cfg(test)]
#[path = "flow_tests.rs"]
mod tests;
