//! Actors: one task each, one message enum, a bounded mailbox, timers, an input stream and
//! supervision. The loop below is the same on both backends; only `spawn_actor` differs.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Weak;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use tokio::sync::oneshot;

use crate::mailbox::{self, Closed, Receiver, Recv, Sender, Stoppable, TrySendError, WeakSender};
use crate::time::{self, Instant};

/// The reply half of a request: put it in the message, the actor answers on it.
pub type Reply<T> = oneshot::Sender<T>;

/// Identity of one actor for its lifetime (unique within a runtime).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ActorId(pub u64);

impl fmt::Display for ActorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// How an actor ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exit {
    /// It called `ctx.stop()`, or someone called `addr.stop()`, or its parent stopped.
    Stopped,
    /// Every address was dropped, its mailbox was empty and it had no input stream.
    Idle,
    /// A hook or handler panicked; the message is the panic's.
    Panicked(String),
}

/// An actor: state owned by one task and changed only by its own messages.
///
/// Handlers are async so that an actor can await I/O (a socket write, a disk sync). While a
/// handler runs, the mailbox fills, and senders meet back-pressure: that is the point.
pub trait Actor: Send + Sized + 'static {
    /// The one message type this actor accepts.
    type Msg: Send + 'static;

    /// Runs once, before the first message.
    fn started(&mut self, ctx: &mut Ctx<Self>) -> impl Future<Output = ()> + Send {
        let _ = ctx;
        async {}
    }

    /// Handles one message.
    fn handle(&mut self, msg: Self::Msg, ctx: &mut Ctx<Self>) -> impl Future<Output = ()> + Send;

    /// Runs once after the last message, unless the actor panicked.
    fn stopped(&mut self, ctx: &mut Ctx<Self>) -> impl Future<Output = ()> + Send {
        let _ = ctx;
        async {}
    }

    /// Input the actor owns and polls itself, beside the mailbox: a socket it also writes
    /// to. Polled between turns, in the same alternation with the mailbox as an input stream
    /// (after it, if there is one); `Ready(msg)` is the next turn. Return `Pending` (with
    /// `cx`'s waker registered) while there is nothing, for good if need be. Unlike
    /// [`Ctx::add_stream`] it costs no allocation and leaves the actor direct access to its
    /// source; unlike it, it does not keep an actor without addresses alive.
    fn poll_input(&mut self, cx: &mut Context<'_>) -> Poll<Self::Msg> {
        let _ = cx;
        Poll::Pending
    }

    /// A deadline the actor keeps itself, beside its [`Ctx`] timers: asked before every
    /// wait, and once it has passed, [`Actor::on_deadline`] gives the message to handle.
    /// For a deadline that moves on most turns (a connection's keep alive): a timer would be
    /// cancelled and set again each time, and an idle actor would keep a timer entry on the
    /// heap for it.
    fn deadline(&self) -> Option<Instant> {
        None
    }

    /// The message for a passed [`Actor::deadline`]. Handling it must move the deadline
    /// on (or clear it), or the actor is asked again at once.
    fn on_deadline(&mut self) -> Option<Self::Msg> {
        None
    }

    /// Whether the handler's future runs in the actor's task rather than boxed per turn.
    /// Boxed (the default), an idle actor's task holds only its wait, not room for its
    /// largest turn: what many idle connections want. In place, a turn costs no
    /// allocation: what a few busy actors want (a router shard, whose turn of a kilobyte
    /// and more was a large allocation per message, and glibc consolidated its free
    /// lists on each: 4 % of a fan-in's broker CPU).
    const TURNS_IN_PLACE: bool = false;
}

/// How to start an actor.
#[derive(Clone, Debug)]
pub struct Options {
    /// Bound of the normal lane: a full mailbox makes `send` wait and `try_send` fail.
    pub mailbox_capacity: usize,
    /// Bound of the urgent lane, served before the normal one.
    pub urgent_capacity: usize,
    /// Actors with equal keys run on the same worker (production backend); default: the id.
    pub placement: Option<u64>,
    /// Run on this worker (modulo their number), overriding `placement`: for actors that
    /// should each have a thread of their own, such as the router's shards.
    pub worker: Option<usize>,
    /// Run on a thread that no other actor shares (production backend), overriding both:
    /// for an actor whose answers must not wait behind the workers' run queues, such as
    /// the raft driver, whose peers take a late answer for a dead node.
    pub own_thread: bool,
    /// A static name for tracing spans.
    pub name: &'static str,
    /// Give back the mailbox's queue buffers each time the actor finds it empty and waits,
    /// for actors counted in millions that are mostly idle (every connection's): an idle
    /// client that once took a delivery would otherwise keep its lane's buffer (4 slots at
    /// least) for good. The price is an allocation per burst of mail; actors that are few
    /// and busy (the router's shards, whose lanes hold thousands) keep theirs.
    pub release_idle_queues: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            mailbox_capacity: 64,
            urgent_capacity: 16,
            placement: None,
            worker: None,
            own_thread: false,
            name: "actor",
            release_idle_queues: false,
        }
    }
}

impl Options {
    pub fn named(name: &'static str) -> Self {
        Options {
            name,
            ..Options::default()
        }
    }

    pub fn capacity(mut self, n: usize) -> Self {
        self.mailbox_capacity = n;
        self
    }

    /// See [`Options::release_idle_queues`].
    pub fn release_idle_queues(mut self) -> Self {
        self.release_idle_queues = true;
        self
    }

    pub fn placement(mut self, key: u64) -> Self {
        self.placement = Some(key);
        self
    }

    pub fn on_worker(mut self, worker: usize) -> Self {
        self.worker = Some(worker);
        self
    }

    pub fn own_thread(mut self) -> Self {
        self.own_thread = true;
        self
    }
}

/// Why a request got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AskError {
    #[error("the actor has stopped")]
    Stopped,
    #[error("the actor dropped the request without answering")]
    NoReply,
}

/// A strong address: it keeps the actor's mailbox open.
pub struct Addr<M> {
    tx: Sender<M>,
    id: ActorId,
}

impl<M> Clone for Addr<M> {
    fn clone(&self) -> Self {
        Addr {
            tx: self.tx.clone(),
            id: self.id,
        }
    }
}

impl<M> fmt::Debug for Addr<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Addr").field(&self.id).finish()
    }
}

impl<M> PartialEq for Addr<M> {
    fn eq(&self, other: &Self) -> bool {
        self.tx.same_mailbox(&other.tx)
    }
}

impl<M: Send + 'static> Addr<M> {
    pub fn id(&self) -> ActorId {
        self.id
    }

    /// Enqueues `msg`, waiting while the mailbox is full. Fails only if the actor stopped.
    pub async fn send(&self, msg: M) -> Result<(), Closed<M>> {
        self.tx.send(msg).await
    }

    /// Enqueues `msg` if there is room right now.
    pub fn try_send(&self, msg: M) -> Result<(), TrySendError<M>> {
        self.tx.try_send(msg)
    }

    /// Enqueues `msg` on the urgent lane, handled before any normal message.
    pub fn try_send_urgent(&self, msg: M) -> Result<(), TrySendError<M>> {
        self.tx.try_send_urgent(msg)
    }

    /// Sends a request built around a reply channel and waits for the answer.
    pub async fn ask<R>(&self, make: impl FnOnce(Reply<R>) -> M) -> Result<R, AskError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(make(tx))
            .await
            .map_err(|_| AskError::Stopped)?;
        rx.await.map_err(|_| AskError::NoReply)
    }

    /// Asks the actor to stop after the handler it is running, dropping queued messages.
    pub fn stop(&self) {
        self.tx.request_stop();
    }

    /// True once the actor has stopped.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Messages waiting in the mailbox.
    pub fn queued(&self) -> usize {
        self.tx.len()
    }

    pub fn downgrade(&self) -> WeakAddr<M> {
        WeakAddr {
            tx: self.tx.downgrade(),
            id: self.id,
        }
    }
}

/// An address that does not keep the actor alive: for back-references (child to parent, a
/// registry to its members), so that two actors never keep each other running.
pub struct WeakAddr<M> {
    tx: WeakSender<M>,
    id: ActorId,
}

impl<M> Clone for WeakAddr<M> {
    fn clone(&self) -> Self {
        WeakAddr {
            tx: self.tx.clone(),
            id: self.id,
        }
    }
}

impl<M> fmt::Debug for WeakAddr<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("WeakAddr").field(&self.id).finish()
    }
}

impl<M: Send + 'static> WeakAddr<M> {
    pub fn id(&self) -> ActorId {
        self.id
    }

    pub fn upgrade(&self) -> Option<Addr<M>> {
        self.tx.upgrade().map(|tx| Addr { tx, id: self.id })
    }

    /// Enqueues `msg` if there is room right now and the actor is alive; `Closed` where
    /// [`WeakAddr::upgrade`] would give `None`. Cheaper than `upgrade` then `try_send`.
    pub fn try_send(&self, msg: M) -> Result<(), TrySendError<M>> {
        self.tx.try_send(msg)
    }

    /// [`WeakAddr::try_send`] on the urgent lane, handled before any normal message: for
    /// control messages that must not wait behind a flood.
    pub fn try_send_urgent(&self, msg: M) -> Result<(), TrySendError<M>> {
        self.tx.try_send_urgent(msg)
    }

    pub fn stop(&self) {
        self.tx.request_stop();
    }
}

/// Resolves to the actor's [`Exit`] once it has ended.
pub struct ExitWatch {
    rx: oneshot::Receiver<Exit>,
}

impl Future for ExitWatch {
    type Output = Exit;
    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Exit> {
        // If the task was dropped without reporting (its node was killed, its worker stopped)
        // the actor is gone all the same.
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or(Exit::Stopped))
    }
}

type Make<M> = Box<dyn FnMut() -> M + Send>;

enum Timer<M> {
    Once(M),
    Every(Duration, Make<M>),
}

/// Handle of a timer, for [`Ctx::cancel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TimerId(u64);

/// An actor's timers, ordered by (deadline, id).
///
/// A sorted `VecDeque` rather than a `BTreeMap`: most actors hold zero to two timers (a
/// client's keep alive), and a B-tree allocates a whole node (~0.6 KB here) for the first
/// one, which every idle connection would pay. Inserts land near the back (later
/// deadlines), due timers leave from the front; a cancel scans, which is cheap for the
/// few timers an actor holds. The storage is released when the last timer goes.
struct Timers<M> {
    next: u64,
    /// Boxed, and dropped when empty: most actors (every connection's) have no timer, and an
    /// idle one should carry no queue header.
    #[allow(clippy::box_collection)]
    queue: Option<Box<TimerQueue<M>>>,
}

/// Due time, id (ties in order of setting), timer.
type TimerQueue<M> = VecDeque<(Instant, u64, Timer<M>)>;

impl<M> Timers<M> {
    fn new() -> Self {
        Timers {
            next: 0,
            queue: None,
        }
    }

    fn insert(&mut self, at: Instant, t: Timer<M>) -> TimerId {
        let id = self.next;
        self.next += 1;
        self.put(at, id, t);
        TimerId(id)
    }

    fn put(&mut self, at: Instant, id: u64, t: Timer<M>) {
        // One slot at first: the common single timer costs no more than itself.
        let q = self
            .queue
            .get_or_insert_with(|| Box::new(VecDeque::with_capacity(1)));
        let i = q.partition_point(|(a, i, _)| (*a, *i) < (at, id));
        q.insert(i, (at, id, t));
    }

    fn cancel(&mut self, id: TimerId) -> bool {
        let Some(q) = self.queue.as_mut() else {
            return false;
        };
        match q.iter().position(|(_, i, _)| *i == id.0) {
            Some(i) => {
                q.remove(i);
                self.release_if_empty();
                true
            }
            None => false,
        }
    }

    fn release_if_empty(&mut self) {
        if self.queue.as_ref().is_some_and(|q| q.is_empty()) {
            self.queue = None;
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.queue.as_ref()?.front().map(|(at, _, _)| *at)
    }

    fn pop_due(&mut self, now: Instant) -> Option<M> {
        let q = self.queue.as_mut()?;
        if q.front()?.0 > now {
            return None;
        }
        let (at, id, timer) = q.pop_front()?;
        match timer {
            Timer::Once(m) => {
                self.release_if_empty();
                Some(m)
            }
            Timer::Every(period, mut make) => {
                let m = make();
                // A late turn does not make a burst of catch-up ticks.
                let mut next = at + period;
                if next <= now {
                    next = now + period;
                }
                self.put(next, id, Timer::Every(period, make));
                Some(m)
            }
        }
    }
}

struct Input<M> {
    stream: Pin<Box<dyn Stream<Item = M> + Send>>,
    on_end: Option<Box<dyn FnOnce() -> M + Send>>,
}

/// An actor's view of its own runtime: its address, timers, input, children and stop.
pub struct Ctx<A: Actor> {
    id: ActorId,
    name: &'static str,
    me: WeakSender<A::Msg>,
    stopping: bool,
    timers: Timers<A::Msg>,
    /// Boxed: most actors (every connection's, which polls its socket itself) have none.
    input: Option<Box<Input<A::Msg>>>,
    /// Boxed: most actors (every connection's) have no children.
    children: Option<Box<Children>>,
}

#[derive(Default)]
struct Children {
    list: Vec<Weak<dyn Stoppable>>,
    pruned_at: usize,
}

impl<A: Actor> Ctx<A> {
    pub fn id(&self) -> ActorId {
        self.id
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    /// A strong address of this actor. Store it in another actor only if that one should keep
    /// this one alive; otherwise store [`Ctx::weak_addr`].
    pub fn addr(&self) -> Addr<A::Msg> {
        Addr {
            tx: self.me.revive(),
            id: self.id,
        }
    }

    /// Messages waiting in this actor's mailbox (both lanes): zero means the current turn is
    /// the last of a burst, the moment to write what the burst produced.
    pub fn queued(&self) -> usize {
        self.me.len()
    }

    pub fn weak_addr(&self) -> WeakAddr<A::Msg> {
        WeakAddr {
            tx: self.me.clone(),
            id: self.id,
        }
    }

    /// Stops after the current handler; queued messages are dropped.
    pub fn stop(&mut self) {
        self.stopping = true;
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping
    }

    /// Delivers `msg` to this actor after `delay`.
    pub fn after(&mut self, delay: Duration, msg: A::Msg) -> TimerId {
        self.timers.insert(time::now() + delay, Timer::Once(msg))
    }

    /// Delivers `make()` to this actor every `period`, the first time after one period.
    pub fn every(
        &mut self,
        period: Duration,
        make: impl FnMut() -> A::Msg + Send + 'static,
    ) -> TimerId {
        assert!(!period.is_zero(), "a periodic timer needs a period");
        self.timers
            .insert(time::now() + period, Timer::Every(period, Box::new(make)))
    }

    /// Cancels a timer; false if it already fired (one-shot) or was cancelled.
    pub fn cancel(&mut self, id: TimerId) -> bool {
        self.timers.cancel(id)
    }

    /// Consumes `stream` beside the mailbox (a socket's frames); `on_end` is delivered when
    /// it ends. One input at a time: a new one replaces the old. While an input is attached,
    /// the actor does not stop for lack of addresses.
    pub fn add_stream<S>(&mut self, stream: S, on_end: Option<Box<dyn FnOnce() -> A::Msg + Send>>)
    where
        S: Stream<Item = A::Msg> + Send + 'static,
    {
        self.input = Some(Box::new(Input {
            stream: Box::pin(stream),
            on_end,
        }));
    }

    /// Runs `fut` as its own task and delivers `to_msg(output)` to this actor, unless it
    /// stopped meanwhile.
    pub fn spawn_then<F, T>(&self, fut: F, to_msg: impl FnOnce(T) -> A::Msg + Send + 'static)
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let me = self.me.clone();
        crate::spawn(async move {
            let out = fut.await;
            if let Some(tx) = me.upgrade() {
                let _ = tx.send(to_msg(out)).await;
            }
        });
    }

    /// Starts a supervised child. When it ends, `on_exit(child id, exit)` is delivered to
    /// this actor; when this actor stops, the child is stopped. A parent with live children
    /// stays alive (each child's exit report holds an address of it).
    pub fn spawn_child<C: Actor>(
        &mut self,
        child: C,
        opts: Options,
        on_exit: impl FnOnce(ActorId, Exit) -> A::Msg + Send + 'static,
    ) -> Addr<C::Msg> {
        let parent = self.addr();
        let addr = spawn_actor(child, opts, move |id, exit| async move {
            let _ = parent.send(on_exit(id, exit)).await;
        });
        // Weak: a finished child's mailbox must not be pinned by its parent.
        let children = self.children.get_or_insert_with(Box::default);
        children.list.push(addr.tx.stop_handle());
        // Finished children's entries are dropped once the list has doubled.
        if children.list.len() >= 2 * children.pruned_at.max(8) {
            children.list.retain(|w| w.strong_count() > 0);
            children.pruned_at = children.list.len();
        }
        addr
    }
}

/// Starts `actor` with default options.
pub fn start<A: Actor>(actor: A) -> Addr<A::Msg> {
    start_with(actor, Options::default())
}

/// Starts `actor` with `opts`.
pub fn start_with<A: Actor>(actor: A, opts: Options) -> Addr<A::Msg> {
    spawn_actor(actor, opts, |_, _| async {})
}

/// Starts `actor` and returns a future of its exit.
pub fn start_watched<A: Actor>(actor: A, opts: Options) -> (Addr<A::Msg>, ExitWatch) {
    let (tx, rx) = oneshot::channel();
    let addr = spawn_actor(actor, opts, move |_, exit| async move {
        let _ = tx.send(exit);
    });
    (addr, ExitWatch { rx })
}

fn next_id() -> ActorId {
    #[cfg(madsim)]
    {
        // A process-wide counter would differ between two runs of one seed in one process.
        ActorId(crate::rng::seed())
    }
    #[cfg(not(madsim))]
    {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(1);
        ActorId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

fn spawn_actor<A, F, Fut>(actor: A, opts: Options, after: F) -> Addr<A::Msg>
where
    A: Actor,
    F: FnOnce(ActorId, Exit) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mailbox::mailbox(
        opts.mailbox_capacity,
        opts.urgent_capacity,
        opts.release_idle_queues,
    );
    let id = next_id();
    let ctx = Ctx {
        id,
        name: opts.name,
        me: rx.weak_sender(),
        stopping: false,
        timers: Timers::new(),
        input: None,
        children: None,
    };
    let place = match opts.worker {
        _ if opts.own_thread => crate::backend::Place::Own,
        Some(w) => crate::backend::Place::Worker(w),
        None => crate::backend::Place::Key(opts.placement.unwrap_or(id.0)),
    };
    let cpu = crate::backend::CpuSlot::new(place, opts.name);
    // Boxed before the task is made: an async block keeps a moved-in value's slot for its
    // whole life, so an actor passed by value would take its size two or three times over
    // in every task (4.1 KB for an idle client actor of 1.2 KB).
    let cell = Box::new(Cell { actor, ctx });
    // Two spawns, not one future choosing between the two runs: it would hold room for
    // the larger, the in-place one, whichever ran.
    if A::TURNS_IN_PLACE {
        crate::backend::spawn_actor(place, async move {
            let exit = run::<A, InPlace>(cell, rx, cpu).await;
            after(id, exit).await;
        });
    } else {
        crate::backend::spawn_actor(place, async move {
            let exit = run::<A, Boxed>(cell, rx, cpu).await;
            after(id, exit).await;
        });
    }
    Addr { tx, id }
}

enum Event<M> {
    Mail(Recv<M>),
    Input(Option<M>),
    /// From [`Actor::poll_input`].
    Own(M),
    Timer,
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic".to_string()
    }
}

/// A turn, its panic caught. Not an `async fn`: one awaiting its argument would hold the
/// future twice, as the argument and as the awaited (a client actor's turn was 2.6 KB,
/// allocated and copied per turn, twice what it runs).
fn guarded<F: Future<Output = ()>>(f: F) -> impl Future<Output = Result<(), String>> {
    AssertUnwindSafe(f)
        .catch_unwind()
        .map(|r| r.map_err(panic_message))
}

pin_project_lite::pin_project! {
    /// The wait between turns on the mailbox, the input and the next deadline: what an idle
    /// actor's task holds for its whole life, so it is a plain struct rather than an `async
    /// fn` around `poll_fn` (which kept its arguments twice, once as the function's and once
    /// as the closure's).
    struct NextEvent<'a, A: Actor, T> {
        actor: &'a mut A,
        rx: &'a Receiver<A::Msg>,
        input: Option<&'a mut Input<A::Msg>>,
        #[pin]
        timer: Option<T>,
        watch_mailbox: bool,
        input_first: bool,
    }
}

/// Polled by hand rather than with `select!` over three futures: the macro keeps each
/// future twice (the local and its own copy). Polling in a fixed order keeps the simulation
/// deterministic; alternating which of mailbox and input goes first keeps it fair, so
/// neither a flood of mail nor a flood of input starves the other.
fn next_event<'a, A: Actor>(
    actor: &'a mut A,
    rx: &'a Receiver<A::Msg>,
    input: Option<&'a mut Input<A::Msg>>,
    deadline: Option<Instant>,
    watch_mailbox: bool,
    input_first: bool,
) -> NextEvent<'a, A, impl Future<Output = ()>> {
    NextEvent {
        actor,
        rx,
        input,
        timer: deadline.map(time::sleep_until),
        watch_mailbox,
        input_first,
    }
}

impl<A: Actor, T: Future<Output = ()>> Future for NextEvent<'_, A, T> {
    type Output = Event<A::Msg>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Event<A::Msg>> {
        let this = self.project();
        let watch_mailbox = *this.watch_mailbox;
        let rx = &**this.rx;
        let mail = |cx: &mut Context<'_>| {
            if watch_mailbox {
                rx.poll_recv(Some(cx.waker())).map(Event::Mail)
            } else {
                None
            }
        };
        let input = this.input;
        let actor = &mut **this.actor;
        let mut inp = |cx: &mut Context<'_>| {
            if let Some(i) = input.as_mut() {
                if let Poll::Ready(m) = i.stream.poll_next_unpin(cx) {
                    return Some(Event::Input(m));
                }
            }
            match actor.poll_input(cx) {
                Poll::Ready(m) => Some(Event::Own(m)),
                Poll::Pending => None,
            }
        };
        let first = if *this.input_first {
            inp(cx).or_else(|| mail(cx))
        } else {
            mail(cx).or_else(|| inp(cx))
        };
        if let Some(ev) = first {
            return Poll::Ready(ev);
        }
        if let Some(t) = this.timer.as_pin_mut() {
            if t.poll(cx).is_ready() {
                return Poll::Ready(Event::Timer);
            }
        }
        Poll::Pending
    }
}

/// An actor and its context, on the heap once for the actor's life.
struct Cell<A: Actor> {
    actor: A,
    ctx: Ctx<A>,
}

/// How a turn's future is held: a type rather than a flag, because one generator with both
/// branches holds room for the larger (the in-place one) even where it never runs.
trait Turn {
    type Fut<F: Future + Send>: Future<Output = F::Output> + Send;
    fn wrap<F: Future + Send>(f: F) -> Self::Fut<F>;
}

/// On the heap, allocated per turn.
struct Boxed;

impl Turn for Boxed {
    type Fut<F: Future + Send> = Pin<Box<F>>;
    fn wrap<F: Future + Send>(f: F) -> Pin<Box<F>> {
        Box::pin(f)
    }
}

/// In the actor's task.
struct InPlace;

impl Turn for InPlace {
    type Fut<F: Future + Send> = F;
    fn wrap<F: Future + Send>(f: F) -> F {
        f
    }
}

async fn run<A: Actor, T: Turn>(
    mut cell: Box<Cell<A>>,
    rx: Receiver<A::Msg>,
    cpu: crate::backend::CpuSlot,
) -> Exit {
    let Cell { actor, ctx } = &mut *cell;
    // Boxed for the same reason as `handle` below.
    if let Err(p) = Box::pin(guarded(actor.started(ctx))).await {
        tracing::warn!(name = ctx.name, actor_id = %ctx.id, panic = %p, "actor panicked in started");
        stop_children(ctx);
        return Exit::Panicked(p);
    }
    let mut turn: u64 = 0;
    let mut watch_mailbox = true;
    let exit = loop {
        if ctx.stopping {
            break Exit::Stopped;
        }
        // Due timers first: a busy mailbox must not starve them. Scoped, so that `now` and
        // the actor's own deadline do not stay in this future across the wait.
        let ready = {
            let now = time::now();
            let own = actor.deadline();
            if let Some(m) = ctx.timers.pop_due(now) {
                Ok(m)
            } else if let Some(m) = own.filter(|d| *d <= now).and_then(|_| actor.on_deadline()) {
                Ok(m)
            } else {
                Err(
                    match (ctx.timers.next_deadline(), own.filter(|d| *d > now)) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    },
                )
            }
        };
        let msg = match ready {
            Ok(m) => m,
            Err(deadline) => {
                turn = turn.wrapping_add(1);
                let ev = next_event(
                    &mut *actor,
                    &rx,
                    ctx.input.as_deref_mut(),
                    deadline,
                    watch_mailbox,
                    turn.is_multiple_of(2),
                )
                .await;
                match ev {
                    Event::Timer => continue,
                    Event::Mail(Recv::Msg(m)) => m,
                    Event::Mail(Recv::Stop) => break Exit::Stopped,
                    Event::Mail(Recv::Idle) => {
                        if ctx.input.is_none() {
                            break Exit::Idle;
                        }
                        watch_mailbox = false;
                        continue;
                    }
                    Event::Input(Some(m)) | Event::Own(m) => {
                        // The handler may hand out a new address; look again afterwards.
                        watch_mailbox = true;
                        m
                    }
                    Event::Input(None) => {
                        let end = ctx.input.take().and_then(|i| i.on_end);
                        watch_mailbox = true;
                        match end {
                            Some(f) => f(),
                            None => continue,
                        }
                    }
                }
            }
        };
        // Boxed: a handler's future is as large as its largest state (hundreds of bytes
        // for a client actor, which boxes its rare heavy branches), and unboxed it would sit
        // inside this loop's future for the actor's whole life, idle or not; boxed, an idle
        // actor holds only the wait below. One allocation per turn, and turns carry
        // batches.
        // The simulated node's CPU, when a test gives it one: the turn waits for its thread
        // and takes its cost in simulated time (nothing at all otherwise).
        cpu.charge().await;
        if let Err(p) = T::wrap(guarded(actor.handle(msg, ctx))).await {
            tracing::warn!(name = ctx.name, actor_id = %ctx.id, panic = %p, "actor panicked");
            stop_children(ctx);
            return Exit::Panicked(p);
        }
    };
    if let Err(p) = Box::pin(guarded(actor.stopped(ctx))).await {
        stop_children(ctx);
        return Exit::Panicked(p);
    }
    stop_children(ctx);
    exit
}

fn stop_children<A: Actor>(ctx: &mut Ctx<A>) {
    for c in ctx.children.take().map(|c| c.list).unwrap_or_default() {
        if let Some(c) = c.upgrade() {
            c.request_stop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An actor whose turn keeps four kilobytes across an await.
    struct Big;

    impl Actor for Big {
        type Msg = ();

        async fn handle(&mut self, _: (), _: &mut Ctx<Self>) {
            let buf = [1u8; 4096];
            crate::yield_now().await;
            std::hint::black_box(&buf);
        }
    }

    fn run_future<T: Turn>() -> usize {
        let (_tx, rx) = mailbox::mailbox::<()>(4, 4, false);
        let ctx = Ctx {
            id: ActorId(1),
            name: "big",
            me: rx.weak_sender(),
            stopping: false,
            timers: Timers::new(),
            input: None,
            children: None,
        };
        let cell = Box::new(Cell { actor: Big, ctx });
        let cpu = crate::backend::CpuSlot::new(crate::backend::Place::Key(1), "big");
        std::mem::size_of_val(&run::<Big, T>(cell, rx, cpu))
    }

    #[test]
    fn a_boxed_turn_keeps_the_idle_task_small_and_an_in_place_one_does_not() {
        let boxed = run_future::<Boxed>();
        let in_place = run_future::<InPlace>();
        assert!(boxed < 1024, "the boxed run holds {boxed} bytes");
        assert!(
            in_place > 4096,
            "the in-place run holds its turn: {in_place} bytes"
        );
    }
    /// A boxed turn is allocated and copied whole every turn: catching its panic must not
    /// hold the handler's future twice (an `async fn` awaiting its argument does).
    #[test]
    fn a_guarded_turn_holds_its_handler_once() {
        let big = [7u8; 2048];
        let f = async move {
            std::future::ready(()).await;
            std::hint::black_box(&big);
        };
        let handler = std::mem::size_of_val(&f);
        let turn = std::mem::size_of_val(&guarded(f));
        assert!(handler >= 2048);
        assert!(
            turn <= handler + 64,
            "the guarded turn holds {turn} bytes for a {handler}-byte handler"
        );
    }
}
