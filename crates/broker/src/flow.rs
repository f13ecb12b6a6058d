//! Back-pressure between clients: a subscriber whose queue backs up holds back the
//! publishers that feed it QoS 1/2 messages, until it has drained.
//!
//! Without it, a flood of QoS 1 publishes into one subscriber is accepted at the rate the
//! publishers send, and all but what the subscriber's window lets through is dropped at its
//! full queue: QoS 1 in name only. With it (`mqtt.backpressure`, on by default) the router
//! marks each publisher that fed a backlogged subscriber; the publisher's actor then stops
//! taking PUBLISH (and everything ordered after one) from its socket, while acknowledgements
//! of its own deliveries still pass, so two clients feeding each other cannot deadlock. The
//! publisher's unacknowledged messages wait on its side (its own window and TCP), not in the
//! broker. An offline session is never backlogged: its queue fills and drops by its policy.
//!
//! Each client has at most one [`Flow`], made when it first subscribes or publishes at
//! QoS 1/2; idle connections that do neither carry none.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use starling_rt::time::{self, Instant};

/// One client's side of the back-pressure, shared with the router.
#[derive(Debug, Default)]
pub(crate) struct Flow {
    /// As a subscriber: its session refuses new messages, so the router drops them.
    saturated: AtomicBool,
    /// As a subscriber: publishers feeding it QoS 1/2 messages are held back.
    backlogged: AtomicBool,
    /// As a subscriber: the publishers waiting for `backlogged` to clear.
    waiters: Mutex<Vec<Waker>>,
    /// As a subscriber: deliveries the router handed to its actor, and those the actor has
    /// taken in. The difference is what is on its way (in the mailbox), which the router
    /// and the client both count as backlog: the client's queue alone shows a flood only
    /// after the client's next turn, too late for what was routed meanwhile.
    handed: AtomicU64,
    taken: AtomicU64,
    /// As a subscriber: its session's queue length after its last turn.
    queued: AtomicUsize,
    /// As a subscriber: backlogged for longer than `mqtt.backpressure_max_secs` without
    /// draining; it holds no one back until it drains.
    stuck: AtomicBool,
    /// As a subscriber: a check of how long it has been backlogged is scheduled.
    check_armed: AtomicBool,
    /// As a subscriber: backlogged stretches ended so far; a check belongs to one stretch.
    stretch: AtomicU64,
    /// As a publisher: the subscriber it waits on, and since when.
    held_by: Mutex<Option<Held>>,
    /// As a publisher: `held_by` is set (written under its lock). Read without the lock on
    /// every look for input and every publish, where a lock would be paid per message.
    maybe_held: AtomicBool,
    /// As a subscriber: may not hold anyone back (`mqtt.backpressure_holders`).
    excluded: AtomicBool,
    /// As a subscriber: when it last took something in, and its stalls in this window.
    /// Locked only while it is backlogged or stuck.
    progress: Mutex<Progress>,
    rules: StallRules,
}

/// How a stalled subscriber is told apart from a slow one (`mqtt.backpressure_*`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct StallRules {
    /// Taking nothing in for this long while holding publishers back is a stall.
    pub stall: Duration,
    /// Stalls allowed per window; past them it holds no one back until the window ends.
    pub stalls_max: u32,
    pub window: Duration,
}

impl StallRules {
    pub(crate) fn from_config(m: &starling_config::MqttConfig) -> Self {
        Self {
            stall: Duration::from_secs(u64::from(m.backpressure_stall_secs)),
            stalls_max: m.backpressure_stalls_max,
            window: Duration::from_secs(u64::from(m.backpressure_window_secs)),
        }
    }
}

impl Default for StallRules {
    fn default() -> Self {
        Self {
            stall: Duration::from_secs(2),
            stalls_max: 2,
            window: Duration::from_secs(60),
        }
    }
}

/// A sleep of the runtime's, boxed: its type has no name.
type StallTimer = Pin<Box<dyn Future<Output = ()> + Send>>;

struct Held {
    subscriber: Arc<Flow>,
    since: Instant,
    /// Wakes the held publisher when the subscriber would count as stalled, had it taken
    /// nothing in by then: the subscriber (whose actor may be stuck) will not.
    timer: Option<(Instant, StallTimer)>,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("since", &self.since)
            .field("timer", &self.timer.as_ref().map(|t| t.0))
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct Progress {
    /// Last time it acknowledged something or its queue moved, while backlogged.
    at: Option<Instant>,
    window_start: Option<Instant>,
    stalls: u32,
}

/// Poison carries no meaning here (every critical section leaves the data consistent).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Flow {
    pub(crate) fn new(rules: StallRules) -> Self {
        Self {
            rules,
            ..Self::default()
        }
    }

    pub(crate) fn saturated(&self) -> bool {
        self.saturated.load(Ordering::Relaxed)
    }

    pub(crate) fn backlogged(&self) -> bool {
        self.backlogged.load(Ordering::Acquire)
    }

    pub(crate) fn is_stuck(&self) -> bool {
        self.stuck.load(Ordering::Acquire)
    }

    /// Whether publishers feeding it are to be held back now: backlogged, not stuck, and
    /// allowed to hold anyone.
    pub(crate) fn holds(&self) -> bool {
        self.backlogged() && !self.stuck.load(Ordering::Acquire) && self.may_hold()
    }

    /// Whether it may hold publishers back at all (see `mqtt.backpressure_holders`).
    pub(crate) fn may_hold(&self) -> bool {
        !self.excluded.load(Ordering::Relaxed)
    }

    /// Subscriber, at attach: whether its identity may hold publishers back.
    pub(crate) fn set_may_hold(&self, may: bool) {
        self.excluded.store(!may, Ordering::Relaxed);
    }

    /// Subscriber: it stops holding its publishers back, and they go. True if it was not
    /// stuck already (a stall to count). Counted against its budget for the window.
    pub(crate) fn stall(&self, now: Instant) -> bool {
        if self.stuck.swap(true, Ordering::AcqRel) {
            return false;
        }
        {
            let mut p = lock(&self.progress);
            let expired = p
                .window_start
                .is_none_or(|w| now.saturating_duration_since(w) >= self.rules.window);
            if expired {
                p.window_start = Some(now);
                p.stalls = 0;
            }
            p.stalls += 1;
        }
        let waiters = std::mem::take(&mut *lock(&self.waiters));
        for w in waiters {
            w.wake();
        }
        true
    }

    /// Whether it spent its stalls for the window: it then holds no one back until the
    /// window ends, drained or not.
    fn over_budget(&self, now: Instant) -> bool {
        let mut p = lock(&self.progress);
        if p.window_start
            .is_some_and(|w| now.saturating_duration_since(w) >= self.rules.window)
        {
            p.window_start = None;
            p.stalls = 0;
        }
        p.stalls >= self.rules.stalls_max
    }

    /// When it counts as stalled if it takes nothing in until then, for a publisher held
    /// since `since`.
    fn stall_deadline(&self, since: Instant) -> Instant {
        let at = lock(&self.progress).at.map_or(since, |at| at.max(since));
        at + self.rules.stall
    }

    /// Subscriber, disconnected for stalling: its record starts over with its next
    /// connection (an offline session holds no one back anyway).
    pub(crate) fn forgive(&self) {
        *lock(&self.progress) = Progress::default();
        self.stuck.store(false, Ordering::Release);
    }

    /// Subscriber, after a turn: the stretch to schedule a check of its backlog for (once
    /// per backlogged stretch).
    pub(crate) fn arm_check(&self) -> Option<u64> {
        (self.holds() && !self.check_armed.swap(true, Ordering::AcqRel))
            .then(|| self.stretch.load(Ordering::Acquire))
    }

    /// Subscriber, when the check armed in `stretch` fires: still in that backlogged
    /// stretch means it did not drain for that long: it stops holding its publishers back,
    /// and they go.
    pub(crate) fn check(&self, stretch: u64) -> bool {
        if stretch != self.stretch.load(Ordering::Acquire) {
            // From a stretch that ended; the current one has its own check.
            return false;
        }
        self.check_armed.store(false, Ordering::Release);
        if !self.backlogged() {
            return false;
        }
        self.stall(time::now())
    }

    /// Router: marks the subscriber backlogged ahead of its own next update, from what the
    /// router knows is on its way to it. The subscriber's update clears it.
    pub(crate) fn set_backlogged(&self) {
        self.backlogged.store(true, Ordering::Release);
    }

    /// Router: `n` deliveries went into the subscriber's mailbox.
    pub(crate) fn handed(&self, n: usize) {
        self.handed.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Subscriber: `n` deliveries came out of its mailbox.
    pub(crate) fn taken(&self, n: usize) {
        self.taken.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Deliveries in the subscriber's mailbox, not yet in its session.
    pub(crate) fn in_transit(&self) -> usize {
        let taken = self.taken.load(Ordering::Relaxed);
        let handed = self.handed.load(Ordering::Relaxed);
        usize::try_from(handed.saturating_sub(taken)).unwrap_or(usize::MAX)
    }

    /// Messages waiting for the subscriber: queued in its session, and on their way.
    pub(crate) fn waiting(&self) -> usize {
        self.queued.load(Ordering::Relaxed) + self.in_transit()
    }

    /// The subscriber's state after a turn; `progressed`: it acknowledged something.
    /// Clearing `backlogged` wakes every publisher that waited on it. `now` is read only
    /// while the subscriber is backlogged or stuck: most turns of most clients are neither.
    pub(crate) fn update(
        &self,
        saturated: bool,
        backlogged: bool,
        queued: usize,
        progressed: bool,
        now: impl Fn() -> Instant,
    ) {
        self.saturated.store(saturated, Ordering::Relaxed);
        let before = self.queued.swap(queued, Ordering::Relaxed);
        let was = self.backlogged.swap(backlogged, Ordering::AcqRel);
        if backlogged && (!was || progressed || queued < before) {
            lock(&self.progress).at = Some(now());
        }
        if !backlogged && (was || self.check_armed.load(Ordering::Acquire)) {
            // Drained: the stretch ends (its check, if armed, finds it over).
            self.stretch.fetch_add(1, Ordering::AcqRel);
            self.check_armed.store(false, Ordering::Release);
        }
        if !backlogged && self.stuck.load(Ordering::Acquire) && !self.over_budget(now()) {
            // Drained, and stalls left in the window: it holds publishers back again next
            // time.
            self.stuck.store(false, Ordering::Release);
        }
        if was && !backlogged {
            let waiters = std::mem::take(&mut *lock(&self.waiters));
            for w in waiters {
                w.wake();
            }
        }
    }

    /// Router: this publisher fed `subscriber` while it was backlogged.
    pub(crate) fn hold_for(&self, subscriber: &Arc<Flow>) {
        let mut held_by = lock(&self.held_by);
        if held_by
            .as_ref()
            .is_some_and(|h| Arc::ptr_eq(&h.subscriber, subscriber))
        {
            // Still the same wait: its start stands (a stall is judged from it).
            return;
        }
        *held_by = Some(Held {
            subscriber: subscriber.clone(),
            since: time::now(),
            timer: None,
        });
        self.maybe_held.store(true, Ordering::Release);
    }

    /// Publisher, in the middle of a turn: whether it has been held back since the turn
    /// began (no waker: the turn ends, and the next look for input registers one).
    pub(crate) fn is_held(&self) -> bool {
        if !self.maybe_held.load(Ordering::Acquire) {
            return false;
        }
        lock(&self.held_by)
            .as_ref()
            .is_some_and(|h| h.subscriber.holds())
    }

    /// Publisher: whether its publishes are held back now. When they are, the task of `cx`
    /// is woken once the subscriber it waits on drains. A subscriber found stalled (see
    /// [`StallRules`]) stops holding, and `stalls` counts it: judged here, on the held
    /// side, because a stalled subscriber's own actor may be stuck in a write.
    pub(crate) fn poll_held(&self, cx: &mut Context<'_>, stalls: &AtomicU64) -> bool {
        if !self.maybe_held.load(Ordering::Acquire) {
            return false;
        }
        let mut held_by = lock(&self.held_by);
        let Some(held) = held_by.as_mut() else {
            return false;
        };
        let subscriber = held.subscriber.clone();
        while subscriber.holds() {
            let deadline = subscriber.stall_deadline(held.since);
            let now = time::now();
            if now >= deadline {
                if subscriber.stall(now) {
                    stalls.fetch_add(1, Ordering::Relaxed);
                }
                break;
            }
            if held.timer.as_ref().is_none_or(|t| t.0 != deadline) {
                held.timer = Some((deadline, Box::pin(time::sleep_until(deadline))));
            }
            match held.timer.as_mut().map(|t| t.1.as_mut().poll(cx)) {
                Some(Poll::Pending) => break,
                // Due: look again (it may have moved meanwhile).
                _ => held.timer = None,
            }
        }
        if subscriber.holds() {
            {
                let mut waiters = lock(&subscriber.waiters);
                if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
                    waiters.push(cx.waker().clone());
                }
            }
            // Checked again after registering: a drain in between found no waker to wake.
            if subscriber.holds() {
                return true;
            }
        }
        *held_by = None;
        self.maybe_held.store(false, Ordering::Release);
        false
    }

    /// The client is gone or detached: nobody waits on it, and it waits on nobody.
    pub(crate) fn release(&self) {
        self.update(false, false, 0, false, time::now);
        let mut held_by = lock(&self.held_by);
        *held_by = None;
        self.maybe_held.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    static STALLS: AtomicU64 = AtomicU64::new(0);

    /// A waker that counts its wakes.
    fn counting_waker() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        (count.clone(), Waker::from(count))
    }

    #[tokio::test]
    async fn a_publisher_is_held_while_its_subscriber_is_backlogged_and_woken_once_it_drains() {
        let (count, waker) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        let (publisher, subscriber) = (Flow::default(), Arc::new(Flow::default()));
        assert!(!publisher.poll_held(&mut cx, &STALLS), "nothing holds it");

        subscriber.update(false, true, 0, false, time::now);
        publisher.hold_for(&subscriber);
        assert!(publisher.poll_held(&mut cx, &STALLS));
        assert!(
            publisher.poll_held(&mut cx, &STALLS),
            "polled again: still held"
        );
        assert_eq!(lock(&subscriber.waiters).len(), 1, "one waker per task");
        assert_eq!(count.0.load(Ordering::SeqCst), 0);

        subscriber.update(false, false, 0, false, time::now);
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "woken when it drained");
        assert!(!publisher.poll_held(&mut cx, &STALLS));
        assert!(lock(&publisher.held_by).is_none(), "forgotten once clear");
    }

    #[tokio::test]
    async fn a_subscriber_backlogged_past_its_check_lets_its_publishers_go_until_it_drains() {
        let (count, waker) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        let (publisher, subscriber) = (Flow::default(), Arc::new(Flow::default()));
        subscriber.update(false, true, 40, false, time::now);
        let first = subscriber.arm_check().expect("armed");
        assert_eq!(subscriber.arm_check(), None, "armed once per stretch");
        publisher.hold_for(&subscriber);
        assert!(publisher.poll_held(&mut cx, &STALLS));
        assert!(
            subscriber.check(first),
            "still backlogged when the check fires"
        );
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            1,
            "its publishers are woken"
        );
        assert!(!publisher.poll_held(&mut cx, &STALLS), "and no longer held");
        assert!(!subscriber.holds());
        assert_eq!(subscriber.arm_check(), None, "stuck: nothing to check");
        // Drained, then backlogged again: it holds publishers back again.
        subscriber.update(false, false, 0, false, time::now);
        subscriber.update(false, true, 40, false, time::now);
        assert!(subscriber.holds());
        let second = subscriber.arm_check().expect("armed again");
        subscriber.update(false, false, 0, false, time::now);
        subscriber.update(false, true, 40, false, time::now);
        let third = subscriber.arm_check().expect("a new stretch");
        assert!(
            !subscriber.check(second),
            "that stretch ended: its check is void"
        );
        assert!(subscriber.holds(), "the new stretch still holds");
        assert!(subscriber.check(third));
    }

    #[tokio::test]
    async fn what_is_on_its_way_counts_as_waiting() {
        let f = Flow::default();
        f.update(false, false, 3, false, time::now);
        f.handed(64);
        f.taken(60);
        assert_eq!((f.in_transit(), f.waiting()), (4, 7));
        // The subscriber may take a batch before the router has counted it as handed.
        f.taken(10);
        assert_eq!(f.in_transit(), 0);
        f.handed(10);
        assert_eq!(f.in_transit(), 4, "the four still in the mailbox");
    }

    #[tokio::test]
    async fn a_subscriber_that_goes_away_releases_its_publishers() {
        let (count, waker) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        let (publisher, subscriber) = (Flow::default(), Arc::new(Flow::default()));
        subscriber.update(true, true, 0, false, time::now);
        publisher.hold_for(&subscriber);
        assert!(publisher.poll_held(&mut cx, &STALLS));
        subscriber.release();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(!subscriber.saturated());
        assert!(!publisher.poll_held(&mut cx, &STALLS));
    }

    #[tokio::test]
    async fn a_subscriber_that_takes_nothing_in_is_stalled_by_the_publisher_it_holds() {
        let (count, waker) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        let stalls = AtomicU64::new(0);
        let instant = StallRules {
            stall: Duration::ZERO,
            ..StallRules::default()
        };
        let (publisher, subscriber) = (Flow::default(), Arc::new(Flow::new(instant)));
        subscriber.update(false, true, 40, false, time::now);
        publisher.hold_for(&subscriber);
        assert!(
            !publisher.poll_held(&mut cx, &stalls),
            "stalled: let go at once"
        );
        assert_eq!(stalls.load(Ordering::SeqCst), 1);
        assert!(subscriber.is_stuck() && !subscriber.holds());
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            0,
            "nothing registered to wake"
        );

        // A patient rule: progress within the stall time keeps the hold.
        let (publisher, subscriber) = (Flow::default(), Arc::new(Flow::default()));
        subscriber.update(false, true, 40, false, time::now);
        publisher.hold_for(&subscriber);
        assert!(publisher.poll_held(&mut cx, &stalls));
        subscriber.update(false, true, 40, true, time::now);
        assert!(
            publisher.poll_held(&mut cx, &stalls),
            "slow but moving: still held"
        );
        assert_eq!(stalls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_subscriber_that_stalls_too_often_holds_no_one_back_for_the_window() {
        let now = time::now();
        let rules = StallRules {
            stall: Duration::from_secs(2),
            stalls_max: 2,
            window: Duration::from_secs(60),
        };
        let subscriber = Flow::new(rules);
        for round in 0..2 {
            subscriber.update(false, true, 40, false, || now);
            assert!(
                subscriber.holds(),
                "round {round}: holds while within budget"
            );
            assert!(subscriber.stall(now));
            assert!(!subscriber.stall(now), "one stall per stretch");
            // Drains: the re-arm pattern.
            subscriber.update(false, false, 0, true, || now);
        }
        subscriber.update(false, true, 40, false, || now);
        assert!(
            !subscriber.holds(),
            "two stalls in the window: drained or not, it holds no one"
        );
        let later = now + Duration::from_secs(61);
        subscriber.update(false, false, 0, true, || later);
        subscriber.update(false, true, 40, false, || later);
        assert!(subscriber.holds(), "a new window: held again");
    }

    #[tokio::test]
    async fn an_excluded_subscriber_never_holds() {
        let subscriber = Flow::default();
        subscriber.set_may_hold(false);
        subscriber.update(false, true, 40, false, time::now);
        assert!(subscriber.backlogged() && !subscriber.holds());
    }
}
