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

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Waker};

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
    /// As a publisher: the subscriber it waits on.
    held_by: Mutex<Option<Arc<Flow>>>,
    /// As a publisher: `held_by` is set (written under its lock). Read without the lock on
    /// every look for input and every publish, where a lock would be paid per message.
    maybe_held: AtomicBool,
}

/// Poison carries no meaning here (every critical section leaves the data consistent).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Flow {
    pub(crate) fn saturated(&self) -> bool {
        self.saturated.load(Ordering::Relaxed)
    }

    pub(crate) fn backlogged(&self) -> bool {
        self.backlogged.load(Ordering::Acquire)
    }

    pub(crate) fn is_stuck(&self) -> bool {
        self.stuck.load(Ordering::Acquire)
    }

    /// Whether publishers feeding it are to be held back now: backlogged, and not stuck.
    pub(crate) fn holds(&self) -> bool {
        self.backlogged() && !self.stuck.load(Ordering::Acquire)
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
        self.stuck.store(true, Ordering::Release);
        let waiters = std::mem::take(&mut *lock(&self.waiters));
        for w in waiters {
            w.wake();
        }
        true
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

    /// The subscriber's state after a turn. Clearing `backlogged` wakes every publisher
    /// that waited on it.
    pub(crate) fn update(&self, saturated: bool, backlogged: bool, queued: usize) {
        self.saturated.store(saturated, Ordering::Relaxed);
        self.queued.store(queued, Ordering::Relaxed);
        let was = self.backlogged.swap(backlogged, Ordering::AcqRel);
        if !backlogged && (was || self.check_armed.load(Ordering::Acquire)) {
            // Drained: the stretch ends (its check, if armed, finds it over), and it holds
            // publishers back again next time.
            self.stretch.fetch_add(1, Ordering::AcqRel);
            self.check_armed.store(false, Ordering::Release);
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
        *held_by = Some(subscriber.clone());
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
            .is_some_and(|subscriber| subscriber.holds())
    }

    /// Publisher: whether its publishes are held back now. When they are, the task of `cx`
    /// is woken once the subscriber it waits on drains.
    pub(crate) fn poll_held(&self, cx: &Context<'_>) -> bool {
        if !self.maybe_held.load(Ordering::Acquire) {
            return false;
        }
        let mut held_by = lock(&self.held_by);
        let Some(subscriber) = held_by.as_ref() else {
            return false;
        };
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
        self.update(false, false, 0);
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

    /// A waker that counts its wakes.
    fn counting_waker() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        (count.clone(), Waker::from(count))
    }

    #[test]
    fn a_publisher_is_held_while_its_subscriber_is_backlogged_and_woken_once_it_drains() {
        let (count, waker) = counting_waker();
        let cx = Context::from_waker(&waker);
        let (publisher, subscriber) = (Flow::default(), Arc::new(Flow::default()));
        assert!(!publisher.poll_held(&cx), "nothing holds it");

        subscriber.update(false, true, 0);
        publisher.hold_for(&subscriber);
        assert!(publisher.poll_held(&cx));
        assert!(publisher.poll_held(&cx), "polled again: still held");
        assert_eq!(lock(&subscriber.waiters).len(), 1, "one waker per task");
        assert_eq!(count.0.load(Ordering::SeqCst), 0);

        subscriber.update(false, false, 0);
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "woken when it drained");
        assert!(!publisher.poll_held(&cx));
        assert!(lock(&publisher.held_by).is_none(), "forgotten once clear");
    }

    #[test]
    fn a_subscriber_backlogged_past_its_check_lets_its_publishers_go_until_it_drains() {
        let (count, waker) = counting_waker();
        let cx = Context::from_waker(&waker);
        let (publisher, subscriber) = (Flow::default(), Arc::new(Flow::default()));
        subscriber.update(false, true, 40);
        let first = subscriber.arm_check().expect("armed");
        assert_eq!(subscriber.arm_check(), None, "armed once per stretch");
        publisher.hold_for(&subscriber);
        assert!(publisher.poll_held(&cx));
        assert!(
            subscriber.check(first),
            "still backlogged when the check fires"
        );
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            1,
            "its publishers are woken"
        );
        assert!(!publisher.poll_held(&cx), "and no longer held");
        assert!(!subscriber.holds());
        assert_eq!(subscriber.arm_check(), None, "stuck: nothing to check");
        // Drained, then backlogged again: it holds publishers back again.
        subscriber.update(false, false, 0);
        subscriber.update(false, true, 40);
        assert!(subscriber.holds());
        let second = subscriber.arm_check().expect("armed again");
        subscriber.update(false, false, 0);
        subscriber.update(false, true, 40);
        let third = subscriber.arm_check().expect("a new stretch");
        assert!(
            !subscriber.check(second),
            "that stretch ended: its check is void"
        );
        assert!(subscriber.holds(), "the new stretch still holds");
        assert!(subscriber.check(third));
    }

    #[test]
    fn what_is_on_its_way_counts_as_waiting() {
        let f = Flow::default();
        f.update(false, false, 3);
        f.handed(64);
        f.taken(60);
        assert_eq!((f.in_transit(), f.waiting()), (4, 7));
        // The subscriber may take a batch before the router has counted it as handed.
        f.taken(10);
        assert_eq!(f.in_transit(), 0);
        f.handed(10);
        assert_eq!(f.in_transit(), 4, "the four still in the mailbox");
    }

    #[test]
    fn a_subscriber_that_goes_away_releases_its_publishers() {
        let (count, waker) = counting_waker();
        let cx = Context::from_waker(&waker);
        let (publisher, subscriber) = (Flow::default(), Arc::new(Flow::default()));
        subscriber.update(true, true, 0);
        publisher.hold_for(&subscriber);
        assert!(publisher.poll_held(&cx));
        subscriber.release();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(!subscriber.saturated());
        assert!(!publisher.poll_held(&cx));
    }
}
