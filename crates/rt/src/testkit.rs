//! The behavioural suite every backend must pass: the actix backend runs it in
//! `crates/rt/tests/behaviour.rs`, the madsim backend in `sim/tests/rt_behaviour.rs`.
//!
//! Each function panics on failure. Durations are short and tolerances wide because on the
//! actix backend they are real time.

use std::task::{Context, Poll};
use std::time::Duration;

use futures::stream;
use tokio::sync::{mpsc, oneshot};

use crate::{
    start, start_watched, start_with, time, Actor, ActorId, Ctx, Exit, Options, Reply, TrySendError,
};

/// The names of all suite functions, so that each backend can check it runs them all.
pub const ALL: &[&str] = &[
    "request_reply",
    "per_sender_ordering",
    "back_pressure_when_mailbox_full",
    "urgent_lane_overtakes_normal",
    "timers_fire_once_periodically_and_cancel",
    "input_stream_consumed_beside_mailbox",
    "own_input_alternates_with_mailbox",
    "stop_runs_stopped_hook_and_reports_exit",
    "idle_actor_stops_when_last_address_dropped",
    "supervisor_learns_child_stop_and_panic",
    "parent_stop_stops_children",
    "send_to_stopped_actor_fails",
    "blocking_pool_refuses_when_full_and_survives_a_panic",
];

// ---------------------------------------------------------------------------------------

enum RecMsg {
    Rec(u32, u32),
    Block(oneshot::Sender<()>, oneshot::Receiver<()>),
    Get(Reply<Vec<(u32, u32)>>),
}

/// Records what it receives; can be told to block until released.
struct Recorder {
    seen: Vec<(u32, u32)>,
}

impl Actor for Recorder {
    type Msg = RecMsg;
    async fn handle(&mut self, msg: RecMsg, _ctx: &mut Ctx<Self>) {
        match msg {
            RecMsg::Rec(a, b) => self.seen.push((a, b)),
            RecMsg::Block(entered, gate) => {
                let _ = entered.send(());
                let _ = gate.await;
            }
            RecMsg::Get(r) => {
                let _ = r.send(std::mem::take(&mut self.seen));
            }
        }
    }
}

pub async fn request_reply() {
    let a = start(Recorder { seen: vec![] });
    a.send(RecMsg::Rec(1, 2)).await.unwrap();
    let got = a.ask(RecMsg::Get).await.unwrap();
    assert_eq!(got, vec![(1, 2)]);
}

pub async fn per_sender_ordering() {
    const SENDERS: u32 = 4;
    const EACH: u32 = 300;
    // A small mailbox so that senders keep meeting a full queue and waiting.
    let a = start_with(Recorder { seen: vec![] }, Options::default().capacity(4));
    let mut joins = Vec::new();
    for s in 0..SENDERS {
        let a = a.clone();
        joins.push(crate::spawn(async move {
            for i in 0..EACH {
                a.send(RecMsg::Rec(s, i)).await.unwrap();
            }
        }));
    }
    for j in joins {
        j.await.unwrap();
    }
    let got = a.ask(RecMsg::Get).await.unwrap();
    assert_eq!(
        got.len(),
        (SENDERS * EACH) as usize,
        "lost or duplicated messages"
    );
    for s in 0..SENDERS {
        let seq: Vec<u32> = got
            .iter()
            .filter(|(x, _)| *x == s)
            .map(|(_, i)| *i)
            .collect();
        assert_eq!(
            seq,
            (0..EACH).collect::<Vec<_>>(),
            "sender {s} out of order"
        );
    }
}

async fn blocked_recorder(cap: usize) -> (crate::Addr<RecMsg>, oneshot::Sender<()>) {
    let a = start_with(Recorder { seen: vec![] }, Options::default().capacity(cap));
    let (entered_tx, entered_rx) = oneshot::channel();
    let (gate_tx, gate_rx) = oneshot::channel();
    a.send(RecMsg::Block(entered_tx, gate_rx)).await.unwrap();
    entered_rx.await.unwrap();
    (a, gate_tx)
}

pub async fn back_pressure_when_mailbox_full() {
    let (a, gate) = blocked_recorder(4).await;
    for i in 0..4 {
        a.try_send(RecMsg::Rec(0, i)).unwrap();
    }
    match a.try_send(RecMsg::Rec(0, 4)) {
        Err(TrySendError::Full(RecMsg::Rec(0, 4))) => {}
        _ => panic!("a full mailbox must refuse try_send and hand the message back"),
    }
    assert_eq!(a.queued(), 4);
    // `send` waits while the mailbox is full...
    let a2 = a.clone();
    let waiting = crate::spawn(async move { a2.send(RecMsg::Rec(0, 4)).await.is_ok() });
    time::sleep(Duration::from_millis(30)).await;
    assert!(!waiting.is_finished(), "send completed on a full mailbox");
    // ...and completes once the actor makes room.
    gate.send(()).unwrap();
    assert!(waiting.await.unwrap());
    let got = a.ask(RecMsg::Get).await.unwrap();
    assert_eq!(got, (0..5).map(|i| (0, i)).collect::<Vec<_>>());
}

pub async fn urgent_lane_overtakes_normal() {
    let (a, gate) = blocked_recorder(8).await;
    for i in 0..3 {
        a.try_send(RecMsg::Rec(0, i)).unwrap();
    }
    a.try_send_urgent(RecMsg::Rec(1, 0)).unwrap();
    gate.send(()).unwrap();
    let got = a.ask(RecMsg::Get).await.unwrap();
    assert_eq!(got, vec![(1, 0), (0, 0), (0, 1), (0, 2)]);
}

// ---------------------------------------------------------------------------------------

enum TMsg {
    Once,
    Tick,
    Cancelled,
    StopTicking,
    Get(Reply<(Vec<Duration>, u32, bool)>),
}

struct TimerActor {
    t0: time::Instant,
    once_at: Vec<Duration>,
    ticks: u32,
    cancelled_fired: bool,
    ticker: Option<crate::TimerId>,
}

impl Actor for TimerActor {
    type Msg = TMsg;
    async fn started(&mut self, ctx: &mut Ctx<Self>) {
        ctx.after(Duration::from_millis(30), TMsg::Once);
        self.ticker = Some(ctx.every(Duration::from_millis(20), || TMsg::Tick));
        let c = ctx.after(Duration::from_millis(10), TMsg::Cancelled);
        assert!(ctx.cancel(c));
        assert!(!ctx.cancel(c), "a timer cancels once");
    }
    async fn handle(&mut self, msg: TMsg, ctx: &mut Ctx<Self>) {
        match msg {
            TMsg::Once => self.once_at.push(time::now() - self.t0),
            TMsg::Tick => self.ticks += 1,
            TMsg::Cancelled => self.cancelled_fired = true,
            TMsg::StopTicking => {
                if let Some(t) = self.ticker.take() {
                    assert!(ctx.cancel(t));
                }
            }
            TMsg::Get(r) => {
                let _ = r.send((self.once_at.clone(), self.ticks, self.cancelled_fired));
            }
        }
    }
}

pub async fn timers_fire_once_periodically_and_cancel() {
    let a = start(TimerActor {
        t0: time::now(),
        once_at: vec![],
        ticks: 0,
        cancelled_fired: false,
        ticker: None,
    });
    time::sleep(Duration::from_millis(110)).await;
    a.send(TMsg::StopTicking).await.unwrap();
    let (once, ticks, cancelled) = a.ask(TMsg::Get).await.unwrap();
    assert_eq!(once.len(), 1, "a one-shot timer fires once");
    assert!(
        once[0] >= Duration::from_millis(30),
        "fired early: {:?}",
        once[0]
    );
    assert!(
        (3..=6).contains(&ticks),
        "20 ms ticks over 110 ms: got {ticks}"
    );
    assert!(!cancelled, "a cancelled timer fired");
    time::sleep(Duration::from_millis(60)).await;
    let (_, after, _) = a.ask(TMsg::Get).await.unwrap();
    assert_eq!(after, ticks, "a cancelled periodic timer kept firing");
}

// ---------------------------------------------------------------------------------------

enum SMsg {
    Item(u32),
    End,
    Get(Reply<(Vec<u32>, bool)>),
}

struct StreamActor {
    items: Vec<u32>,
    ended: bool,
}

impl Actor for StreamActor {
    type Msg = SMsg;
    async fn started(&mut self, ctx: &mut Ctx<Self>) {
        ctx.add_stream(
            stream::iter((0..100).map(SMsg::Item)),
            Some(Box::new(|| SMsg::End)),
        );
    }
    async fn handle(&mut self, msg: SMsg, _ctx: &mut Ctx<Self>) {
        match msg {
            SMsg::Item(i) => self.items.push(i),
            SMsg::End => self.ended = true,
            SMsg::Get(r) => {
                let _ = r.send((self.items.clone(), self.ended));
            }
        }
    }
}

pub async fn input_stream_consumed_beside_mailbox() {
    let a = start(StreamActor {
        items: vec![],
        ended: false,
    });
    // Ask until the stream is drained: mail and input interleave fairly, so the first answer
    // may come before the end.
    for _ in 0..1000 {
        let (items, ended) = a.ask(SMsg::Get).await.unwrap();
        assert!(
            items.iter().copied().eq(0..items.len() as u32),
            "input out of order"
        );
        if ended {
            assert_eq!(items.len(), 100);
            return;
        }
        time::sleep(Duration::from_millis(1)).await;
    }
    panic!("the input stream never ended");
}

// ---------------------------------------------------------------------------------------

enum OMsg {
    Item(u32),
    Mail(u32),
    Block(oneshot::Sender<()>, oneshot::Receiver<()>),
    Get(Reply<Vec<(bool, u32)>>),
}

/// Reads its own channel through `poll_input`; logs (is_input, n) per turn.
struct OwnInput {
    rx: mpsc::UnboundedReceiver<u32>,
    log: Vec<(bool, u32)>,
}

impl Actor for OwnInput {
    type Msg = OMsg;
    async fn handle(&mut self, msg: OMsg, _ctx: &mut Ctx<Self>) {
        match msg {
            OMsg::Item(i) => self.log.push((true, i)),
            OMsg::Mail(i) => self.log.push((false, i)),
            OMsg::Block(entered, gate) => {
                let _ = entered.send(());
                let _ = gate.await;
            }
            OMsg::Get(r) => {
                let _ = r.send(self.log.clone());
            }
        }
    }
    fn poll_input(&mut self, cx: &mut Context<'_>) -> Poll<OMsg> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(i)) => Poll::Ready(OMsg::Item(i)),
            _ => Poll::Pending,
        }
    }
}

pub async fn own_input_alternates_with_mailbox() {
    const N: u32 = 40;
    let (tx, rx) = mpsc::unbounded_channel();
    let a = start(OwnInput { rx, log: vec![] });
    // Both sources are full before the actor looks at either.
    let (entered_tx, entered) = oneshot::channel();
    let (release, gate) = oneshot::channel();
    a.send(OMsg::Block(entered_tx, gate)).await.unwrap();
    entered.await.unwrap();
    for i in 0..N {
        tx.send(i).unwrap();
        a.send(OMsg::Mail(i)).await.unwrap();
    }
    release.send(()).unwrap();
    let mut log = Vec::new();
    for _ in 0..1000 {
        log = a.ask(OMsg::Get).await.unwrap();
        if log.len() == 2 * N as usize {
            break;
        }
        time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(log.len(), 2 * N as usize, "not everything arrived: {log:?}");
    for kind in [true, false] {
        let seq: Vec<u32> = log.iter().filter(|e| e.0 == kind).map(|e| e.1).collect();
        assert!(seq.iter().copied().eq(0..N), "out of order: {seq:?}");
    }
    // Fair: neither source waits for the other to drain.
    let first: Vec<bool> = log.iter().take(N as usize).map(|e| e.0).collect();
    let inputs = first.iter().filter(|&&k| k).count();
    assert!(
        (N as usize / 4..=3 * N as usize / 4).contains(&inputs),
        "unfair: {inputs} inputs among the first {N} turns: {log:?}"
    );
    // Input keeps flowing into a live actor afterwards.
    tx.send(N).unwrap();
    for _ in 0..1000 {
        if a.ask(OMsg::Get).await.unwrap().last() == Some(&(true, N)) {
            return;
        }
        time::sleep(Duration::from_millis(1)).await;
    }
    panic!("later input never arrived");
}

// ---------------------------------------------------------------------------------------

enum LMsg {
    StopSelf,
    Panic,
    Ping(Reply<()>),
}

struct Life {
    on_stop: Option<oneshot::Sender<()>>,
}

impl Actor for Life {
    type Msg = LMsg;
    async fn handle(&mut self, msg: LMsg, ctx: &mut Ctx<Self>) {
        match msg {
            LMsg::StopSelf => ctx.stop(),
            LMsg::Panic => panic!("boom"),
            LMsg::Ping(r) => {
                let _ = r.send(());
            }
        }
    }
    async fn stopped(&mut self, _ctx: &mut Ctx<Self>) {
        if let Some(t) = self.on_stop.take() {
            let _ = t.send(());
        }
    }
}

pub async fn stop_runs_stopped_hook_and_reports_exit() {
    let (tx, rx) = oneshot::channel();
    let (a, exit) = start_watched(Life { on_stop: Some(tx) }, Options::default());
    a.ask(LMsg::Ping).await.unwrap();
    a.stop();
    assert_eq!(exit.await, Exit::Stopped);
    rx.await.expect("stopped hook did not run");
    assert!(a.is_closed());
}

pub async fn idle_actor_stops_when_last_address_dropped() {
    let (a, exit) = start_watched(Life { on_stop: None }, Options::default());
    a.ask(LMsg::Ping).await.unwrap();
    drop(a);
    assert_eq!(exit.await, Exit::Idle);
}

pub async fn send_to_stopped_actor_fails() {
    let (a, exit) = start_watched(Life { on_stop: None }, Options::default());
    a.send(LMsg::StopSelf).await.unwrap();
    assert_eq!(exit.await, Exit::Stopped);
    assert!(a.send(LMsg::StopSelf).await.is_err());
    assert!(matches!(
        a.try_send(LMsg::StopSelf),
        Err(TrySendError::Closed(_))
    ));
    assert_eq!(a.ask(LMsg::Ping).await, Err(crate::AskError::Stopped));
}

/// The pool admits `threads + queue` unfinished jobs and refuses the next at once; a job
/// that panics ends in `JobLost` and frees its place. The held jobs wait on a flag set
/// before the test first yields: on threads they spin until then, under madsim they have
/// not started yet (their tasks run only when the test yields).
pub async fn blocking_pool_refuses_when_full_and_survives_a_panic() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use crate::blocking::{BlockingPool, JobLost, PoolFull};

    let pool = BlockingPool::new("testkit", 1, 1);
    let gate = Arc::new(AtomicBool::new(false));
    let held = |n: u32| {
        let gate = gate.clone();
        move || {
            let t0 = std::time::Instant::now();
            while !gate.load(Ordering::Acquire) {
                assert!(t0.elapsed() < Duration::from_secs(10), "gate never opened");
                std::thread::sleep(Duration::from_millis(1));
            }
            n
        }
    };
    let a = pool.try_run(held(1)).expect("a thread is free");
    let b = pool.try_run(held(2)).expect("the queue has room");
    assert_eq!(pool.in_flight(), 2);
    assert_eq!(
        pool.try_run(|| 3).map(|_| ()),
        Err(PoolFull { capacity: 2 })
    );
    gate.store(true, Ordering::Release);
    assert_eq!(a.await, Ok(1));
    assert_eq!(b.await, Ok(2));

    let lost = pool.try_run(|| -> u32 { panic!("job panics on purpose") });
    assert_eq!(lost.expect("room again").await, Err(JobLost));
    // The place of a finished job is freed just after its result is sent.
    let t0 = time::now();
    while pool.in_flight() > 0 {
        assert!(
            time::now() - t0 < Duration::from_secs(5),
            "place never freed"
        );
        time::sleep(Duration::from_millis(1)).await;
    }
    let c = pool.try_run(|| 4).expect("the panic freed its place");
    assert_eq!(c.await, Ok(4));
}

enum PMsg {
    Spawn(Reply<(crate::Addr<LMsg>, crate::Addr<LMsg>)>),
    SpawnWatched(oneshot::Sender<()>, Reply<crate::Addr<LMsg>>),
    ChildExit(ActorId, Exit),
    Exits(Reply<Vec<(ActorId, Exit)>>),
}

struct Parent {
    exits: Vec<(ActorId, Exit)>,
}

impl Actor for Parent {
    type Msg = PMsg;
    async fn handle(&mut self, msg: PMsg, ctx: &mut Ctx<Self>) {
        match msg {
            PMsg::Spawn(r) => {
                let a =
                    ctx.spawn_child(Life { on_stop: None }, Options::default(), PMsg::ChildExit);
                let b =
                    ctx.spawn_child(Life { on_stop: None }, Options::default(), PMsg::ChildExit);
                let _ = r.send((a, b));
            }
            PMsg::SpawnWatched(on_stop, r) => {
                let c = ctx.spawn_child(
                    Life {
                        on_stop: Some(on_stop),
                    },
                    Options::default(),
                    PMsg::ChildExit,
                );
                let _ = r.send(c);
            }
            PMsg::ChildExit(id, e) => self.exits.push((id, e)),
            PMsg::Exits(r) => {
                let _ = r.send(self.exits.clone());
            }
        }
    }
}

pub async fn supervisor_learns_child_stop_and_panic() {
    let p = start(Parent { exits: vec![] });
    let (a, b) = p.ask(PMsg::Spawn).await.unwrap();
    a.send(LMsg::StopSelf).await.unwrap();
    b.send(LMsg::Panic).await.unwrap();
    for _ in 0..1000 {
        let mut exits = p.ask(PMsg::Exits).await.unwrap();
        if exits.len() == 2 {
            exits.sort_by_key(|(id, _)| if *id == a.id() { 0 } else { 1 });
            assert_eq!(exits[0], (a.id(), Exit::Stopped));
            assert_eq!(exits[1], (b.id(), Exit::Panicked("boom".into())));
            return;
        }
        time::sleep(Duration::from_millis(1)).await;
    }
    panic!("the parent never learned of both exits");
}

pub async fn parent_stop_stops_children() {
    let (p, exit) = start_watched(Parent { exits: vec![] }, Options::default());
    let (tx, rx) = oneshot::channel();
    let c = p.ask(|r| PMsg::SpawnWatched(tx, r)).await.unwrap();
    c.ask(LMsg::Ping).await.unwrap();
    p.stop();
    assert_eq!(exit.await, Exit::Stopped);
    rx.await.expect("the child was not stopped with its parent");
}

// ---------------------------------------------------------------------------------------
// Cost measurements (not assertions): `cargo run --release -p starling-rt --example
// actor_cost` on actix, `cd sim && cargo run --release --example actor_cost` on madsim.

/// What [`measure_costs`] found.
#[derive(Debug, Clone)]
pub struct Costs {
    pub backend: &'static str,
    pub idle_actors: usize,
    /// Resident memory added per idle actor (bytes), from /proc/self/statm.
    pub idle_bytes_per_actor: f64,
    pub hops: u64,
    /// CPU time of the whole process per message hop (ns), from each thread's schedstat:
    /// real CPU time even under madsim, whose clocks are virtual.
    pub ns_per_hop: f64,
}

fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = s
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// CPU nanoseconds of the whole process: the sum of each thread's schedstat (utime and
/// stime tick in 10 ms, too coarse).
fn process_cpu_ns() -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_to_string(e.path().join("schedstat")).ok())
        .filter_map(|s| {
            s.split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
        })
        .sum()
}

struct Idle;
impl Actor for Idle {
    type Msg = ();
    async fn handle(&mut self, _msg: (), _ctx: &mut Ctx<Self>) {}
}

enum Ball {
    Meet(crate::Addr<Ball>),
    Serve(crate::Addr<Ball>, u64, Reply<()>),
    Hit(u64),
}

/// Bounces a counter back and forth with a peer; answers when it reaches zero.
struct Player {
    peer: Option<crate::Addr<Ball>>,
    done: Option<Reply<()>>,
}

impl Actor for Player {
    type Msg = Ball;
    async fn handle(&mut self, msg: Ball, _ctx: &mut Ctx<Self>) {
        let n = match msg {
            Ball::Meet(peer) => {
                self.peer = Some(peer);
                return;
            }
            Ball::Serve(peer, n, done) => {
                self.peer = Some(peer);
                self.done = Some(done);
                n
            }
            Ball::Hit(n) => n,
        };
        if n == 0 {
            if let Some(d) = self.done.take() {
                let _ = d.send(());
            }
            if let Some(p) = &self.peer {
                let _ = p.send(Ball::Hit(0)).await;
            }
            self.peer = None;
            return;
        }
        if let Some(p) = &self.peer {
            let _ = p.send(Ball::Hit(n - 1)).await;
        }
    }
}

/// Spawns `idle` idle actors and bounces `hops` messages between two actors.
pub async fn measure_costs(idle: usize, hops: u64) -> Costs {
    let before = rss_bytes();
    let addrs: Vec<_> = (0..idle).map(|_| start(Idle)).collect();
    // Let every actor run its start-up and park on its mailbox.
    time::sleep(Duration::from_millis(200)).await;
    let after = rss_bytes();
    drop(addrs);

    let a = start(Player {
        peer: None,
        done: None,
    });
    let b = start(Player {
        peer: None,
        done: None,
    });
    let (tx, rx) = oneshot::channel();
    b.send(Ball::Meet(a.clone())).await.unwrap();
    let cpu0 = process_cpu_ns();
    a.send(Ball::Serve(b.clone(), hops, tx)).await.unwrap();
    rx.await.unwrap();
    let cpu1 = process_cpu_ns();
    Costs {
        backend: crate::BACKEND,
        idle_actors: idle,
        idle_bytes_per_actor: after.saturating_sub(before) as f64 / idle as f64,
        hops,
        ns_per_hop: cpu1.saturating_sub(cpu0) as f64 / hops as f64,
    }
}
