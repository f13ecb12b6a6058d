//! A bounded, two-lane, multi-producer single-consumer mailbox.
//!
//! Why our own and not `tokio::sync::mpsc`: a tokio bounded channel allocates a 32-slot block
//! when it is created, whatever its capacity (~0.7 KB + 32 × message size); with one mailbox
//! per connection that alone breaks a 2 KB-per-idle-connection budget. Here the queues are
//! `VecDeque`s that allocate on the first message and the whole mailbox is one small `Arc`.
//! It also gives us the urgent lane (raft heartbeats ahead of application work) and a stop
//! signal, and its behaviour is identical under actix and madsim.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};

/// Why a message could not be enqueued without waiting.
#[derive(PartialEq, Eq)]
pub enum TrySendError<M> {
    /// The normal lane holds `capacity` messages; the message is handed back.
    Full(M),
    /// The actor has stopped; the message is handed back.
    Closed(M),
}

impl<M> TrySendError<M> {
    /// The message that was not delivered.
    pub fn into_inner(self) -> M {
        match self {
            TrySendError::Full(m) | TrySendError::Closed(m) => m,
        }
    }
}

/// The actor stopped before the message could be enqueued; the message is handed back.
#[derive(PartialEq, Eq)]
pub struct Closed<M>(pub M);

// By hand, so that messages need not be `Debug` for `unwrap()` on a send.
impl<M> std::fmt::Debug for Closed<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Closed(..)")
    }
}

impl<M> std::fmt::Display for Closed<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the actor has stopped")
    }
}

impl<M> std::error::Error for Closed<M> {}

impl<M> std::fmt::Debug for TrySendError<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TrySendError::Full(_) => f.write_str("Full(..)"),
            TrySendError::Closed(_) => f.write_str("Closed(..)"),
        }
    }
}

impl<M> std::fmt::Display for TrySendError<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TrySendError::Full(_) => f.write_str("the mailbox is full"),
            TrySendError::Closed(_) => f.write_str("the actor has stopped"),
        }
    }
}

impl<M> std::error::Error for TrySendError<M> {}

struct State<M> {
    urgent: VecDeque<M>,
    normal: VecDeque<M>,
    // u32 rather than usize: one of these per actor, a million idle connections.
    capacity: u32,
    urgent_capacity: u32,
    rx_waker: Option<Waker>,
    /// Senders parked on a full normal lane. All are woken when a slot frees: waking only one
    /// would lose the wake-up if that sender's future was dropped meanwhile.
    tx_wakers: Vec<Waker>,
    senders: u32,
    /// The receiver is gone: every send fails from now on.
    closed: bool,
    /// Someone asked the actor to stop; the receiver sees it before any queued message.
    stop_requested: bool,
    /// The lanes' buffers are given back when the receiver finds them empty and waits
    /// (`Options::release_idle_queues`).
    release_idle: bool,
}

pub(crate) struct Shared<M> {
    state: Mutex<State<M>>,
}

impl<M> Shared<M> {
    /// Enqueues without waiting on one lane, waking the receiver outside the lock. `weak`:
    /// the caller holds no strong sender, so an actor whose last address is gone (on its way
    /// out) counts as closed.
    fn try_push(&self, msg: M, urgent: bool, weak: bool) -> Result<(), TrySendError<M>> {
        let waker = {
            let mut st = self.lock();
            if st.closed || (weak && st.senders == 0) {
                return Err(TrySendError::Closed(msg));
            }
            let (len, cap) = if urgent {
                (st.urgent.len(), st.urgent_capacity as usize)
            } else {
                (st.normal.len(), st.capacity as usize)
            };
            if len >= cap {
                return Err(TrySendError::Full(msg));
            }
            if urgent {
                st.urgent.push_back(msg);
            } else {
                st.normal.push_back(msg);
            }
            st.rx_waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, State<M>> {
        // A panic while holding this lock can only come from a waker's wake(); the queue
        // itself stays consistent, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Creates a mailbox whose normal lane holds at most `capacity` messages and whose urgent lane
/// holds at most `urgent_capacity`.
/// `release_idle`: see `Options::release_idle_queues`.
pub(crate) fn mailbox<M>(
    capacity: usize,
    urgent_capacity: usize,
    release_idle: bool,
) -> (Sender<M>, Receiver<M>) {
    assert!(
        capacity > 0,
        "a mailbox needs room for at least one message"
    );
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            urgent: VecDeque::new(),
            normal: VecDeque::new(),
            capacity: u32::try_from(capacity).unwrap_or(u32::MAX),
            urgent_capacity: u32::try_from(urgent_capacity.max(1)).unwrap_or(u32::MAX),
            rx_waker: None,
            tx_wakers: Vec::new(),
            senders: 1,
            closed: false,
            stop_requested: false,
            release_idle,
        }),
    });
    (
        Sender {
            shared: shared.clone(),
        },
        Receiver { shared },
    )
}

/// A strong handle: while one exists, the mailbox is open.
pub(crate) struct Sender<M> {
    shared: Arc<Shared<M>>,
}

impl<M> Clone for Sender<M> {
    fn clone(&self) -> Self {
        self.shared.lock().senders += 1;
        Sender {
            shared: self.shared.clone(),
        }
    }
}

impl<M> Drop for Sender<M> {
    fn drop(&mut self) {
        let waker = {
            let mut st = self.shared.lock();
            st.senders -= 1;
            if st.senders == 0 {
                st.rx_waker.take()
            } else {
                None
            }
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<M> Sender<M> {
    pub(crate) fn downgrade(&self) -> WeakSender<M> {
        WeakSender {
            shared: self.shared.clone(),
        }
    }

    pub(crate) fn try_send(&self, msg: M) -> Result<(), TrySendError<M>> {
        self.shared.try_push(msg, false, false)
    }

    /// The urgent lane is served before the normal lane and has its own bound, so control
    /// traffic is neither stuck behind nor refused because of a flood of normal messages.
    pub(crate) fn try_send_urgent(&self, msg: M) -> Result<(), TrySendError<M>> {
        self.shared.try_push(msg, true, false)
    }

    /// Waits for room in the normal lane. Messages from one sender are enqueued in the order
    /// their `send` calls complete, so a sender that awaits each send keeps its order.
    pub(crate) async fn send(&self, msg: M) -> Result<(), Closed<M>> {
        let mut msg = Some(msg);
        poll_fn(|cx| {
            let waker = {
                let mut st = self.shared.lock();
                if st.closed {
                    // `msg` is only taken on the paths that return Ready.
                    return Poll::Ready(Err(Closed(msg.take().expect("polled after completion"))));
                }
                if st.normal.len() >= st.capacity as usize {
                    // A sender polled again while still blocked (a select! loop, a spurious
                    // wake) must not add its waker twice: the list would grow with polls.
                    if !st.tx_wakers.iter().any(|w| w.will_wake(cx.waker())) {
                        st.tx_wakers.push(cx.waker().clone());
                    }
                    return Poll::Pending;
                }
                st.normal
                    .push_back(msg.take().expect("polled after completion"));
                st.rx_waker.take()
            };
            if let Some(w) = waker {
                w.wake();
            }
            Poll::Ready(Ok(()))
        })
        .await
    }

    pub(crate) fn request_stop(&self) {
        self.shared.request_stop();
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.shared.lock().closed
    }

    pub(crate) fn len(&self) -> usize {
        let st = self.shared.lock();
        st.normal.len() + st.urgent.len()
    }

    /// A stop switch that does not keep the mailbox allocated.
    pub(crate) fn stop_handle(&self) -> std::sync::Weak<dyn Stoppable>
    where
        M: Send + 'static,
    {
        let strong: Arc<dyn Stoppable> = self.shared.clone();
        Arc::downgrade(&strong)
    }

    pub(crate) fn same_mailbox(&self, other: &Sender<M>) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}

impl<M> Shared<M> {
    fn request_stop(&self) {
        let waker = {
            let mut st = self.lock();
            st.stop_requested = true;
            st.rx_waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// Something whose stop can be requested without knowing its message type.
pub(crate) trait Stoppable: Send + Sync {
    fn request_stop(&self);
}

impl<M: Send> Stoppable for Shared<M> {
    fn request_stop(&self) {
        Shared::request_stop(self)
    }
}

/// A handle that does not keep the mailbox open.
pub(crate) struct WeakSender<M> {
    shared: Arc<Shared<M>>,
}

impl<M> Clone for WeakSender<M> {
    fn clone(&self) -> Self {
        WeakSender {
            shared: self.shared.clone(),
        }
    }
}

impl<M> WeakSender<M> {
    /// A strong sender, unless the receiver is gone or every strong sender was dropped (an
    /// actor whose last address went away is on its way out and must not be revived).
    pub(crate) fn upgrade(&self) -> Option<Sender<M>> {
        let mut st = self.shared.lock();
        if st.closed || st.senders == 0 {
            return None;
        }
        st.senders += 1;
        drop(st);
        Some(Sender {
            shared: self.shared.clone(),
        })
    }

    /// Enqueues `msg` if the actor is alive (as [`WeakSender::upgrade`] would say) and its
    /// normal lane has room, under one lock: a fan-out to many actors pays one lock per
    /// message instead of three (upgrade, push, drop).
    pub(crate) fn try_send(&self, msg: M) -> Result<(), TrySendError<M>> {
        self.shared.try_push(msg, false, true)
    }

    /// [`WeakSender::try_send`] on the urgent lane.
    pub(crate) fn try_send_urgent(&self, msg: M) -> Result<(), TrySendError<M>> {
        self.shared.try_push(msg, true, true)
    }

    /// Messages waiting in both lanes.
    pub(crate) fn len(&self) -> usize {
        let st = self.shared.lock();
        st.normal.len() + st.urgent.len()
    }

    /// A strong sender even if none is left; only the actor itself may do this (it is alive).
    pub(crate) fn revive(&self) -> Sender<M> {
        self.shared.lock().senders += 1;
        Sender {
            shared: self.shared.clone(),
        }
    }

    pub(crate) fn request_stop(&self) {
        self.shared.request_stop();
    }
}

/// What the receiver got.
pub(crate) enum Recv<M> {
    Msg(M),
    /// A stop was requested; queued messages are dropped.
    Stop,
    /// Every strong sender is gone and the queue is empty.
    Idle,
}

pub(crate) struct Receiver<M> {
    shared: Arc<Shared<M>>,
}

impl<M> Receiver<M> {
    /// Non-blocking: `None` when there is nothing to do right now.
    pub(crate) fn poll_recv(&self, waker: Option<&Waker>) -> Option<Recv<M>> {
        // Buffers given back are freed after the lock is let go.
        let mut spare = None;
        let (out, wake) = {
            let mut st = self.shared.lock();
            if st.stop_requested {
                return Some(Recv::Stop);
            }
            let m = match st.urgent.pop_front() {
                Some(m) => Some(m),
                None => st.normal.pop_front(),
            };
            match m {
                Some(m) => {
                    let wake = if st.normal.len() < st.capacity as usize {
                        std::mem::take(&mut st.tx_wakers)
                    } else {
                        Vec::new()
                    };
                    (Some(Recv::Msg(m)), wake)
                }
                None if st.senders == 0 => (Some(Recv::Idle), Vec::new()),
                None => {
                    if let Some(w) = waker {
                        match &st.rx_waker {
                            Some(old) if old.will_wake(w) => {}
                            _ => st.rx_waker = Some(w.clone()),
                        }
                        if st.release_idle && (st.urgent.capacity() > 0 || st.normal.capacity() > 0)
                        {
                            spare = Some((
                                std::mem::take(&mut st.urgent),
                                std::mem::take(&mut st.normal),
                            ));
                        }
                    }
                    (None, Vec::new())
                }
            }
        };
        drop(spare);
        for w in wake {
            w.wake();
        }
        out
    }

    pub(crate) fn weak_sender(&self) -> WeakSender<M> {
        WeakSender {
            shared: self.shared.clone(),
        }
    }
}

impl<M> Drop for Receiver<M> {
    fn drop(&mut self) {
        let (queued, wakers) = {
            let mut st = self.shared.lock();
            st.closed = true;
            let st = &mut *st;
            let queued = (
                std::mem::take(&mut st.urgent),
                std::mem::take(&mut st.normal),
            );
            (queued, std::mem::take(&mut st.tx_wakers))
        };
        // Dropped outside the lock: a message may hold a reply channel or another address.
        drop(queued);
        for w in wakers {
            w.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Capacity of the lanes after one message went through and the receiver waited.
    fn capacity_after_a_wait(release: bool) -> usize {
        let (tx, rx) = mailbox::<u64>(64, 16, release);
        tx.try_send(1).unwrap();
        assert!(matches!(
            rx.poll_recv(Some(Waker::noop())),
            Some(Recv::Msg(1))
        ));
        assert!(rx.poll_recv(Some(Waker::noop())).is_none());
        let st = rx.shared.lock();
        st.normal.capacity() + st.urgent.capacity()
    }

    #[test]
    fn an_idle_lean_mailbox_holds_no_queue_buffer_and_a_default_one_keeps_it() {
        assert_eq!(capacity_after_a_wait(true), 0);
        assert!(capacity_after_a_wait(false) > 0);
    }

    /// Given back only on a wait: a poll without a waker (a look, not a wait) and a poll
    /// that finds mail leave the buffer.
    #[test]
    fn a_lean_mailbox_keeps_its_buffer_while_mail_is_waiting() {
        let (tx, rx) = mailbox::<u64>(64, 16, true);
        tx.try_send(1).unwrap();
        tx.try_send(2).unwrap();
        assert!(matches!(
            rx.poll_recv(Some(Waker::noop())),
            Some(Recv::Msg(1))
        ));
        assert!(rx.shared.lock().normal.capacity() > 0);
        assert!(matches!(rx.poll_recv(None), Some(Recv::Msg(2))));
        assert!(rx.poll_recv(None).is_none());
        assert!(rx.shared.lock().normal.capacity() > 0);
        // Mail after a release is taken as before.
        assert!(rx.poll_recv(Some(Waker::noop())).is_none());
        tx.try_send(3).unwrap();
        assert!(matches!(
            rx.poll_recv(Some(Waker::noop())),
            Some(Recv::Msg(3))
        ));
    }
}
