//! The production runtime's scheduling classes (Linux): the system thread, which runs the
//! plain I/O tasks, is in `SCHED_BATCH`; the workers, an own-thread actor (the raft driver's
//! case) and a blocking pool's threads keep the normal class (see `sched.rs`).
#![cfg(target_os = "linux")]

use starling_rt::blocking::BlockingPool;
use starling_rt::{start_with, Actor, Ctx, Options, Reply, Runtime};

const SCHED_OTHER: u32 = 0;
const SCHED_BATCH: u32 = 3;

/// The calling thread's policy, field 41 of its `stat` (after the parenthesised name, which
/// may hold spaces, field 3 comes first).
fn policy() -> u32 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("proc is mounted");
    let after = &stat[stat.rfind(')').expect("a name in parentheses") + 2..];
    after
        .split(' ')
        .nth(41 - 3)
        .expect("a policy field")
        .parse()
        .expect("a number")
}

struct Probe;

impl Actor for Probe {
    type Msg = Reply<u32>;

    async fn handle(&mut self, r: Reply<u32>, _ctx: &mut Ctx<Self>) {
        let _ = r.send(policy());
    }
}

#[test]
fn the_system_thread_is_batch_and_the_runtimes_other_threads_are_not() {
    let before = policy();
    Runtime::new(2).block_on(async move {
        if before != SCHED_OTHER {
            // Started in another class on purpose (chrt): the runtime leaves it be.
            assert_eq!(policy(), before);
            return;
        }
        assert_eq!(policy(), SCHED_BATCH, "the system thread");
        let task = starling_rt::spawn(async { policy() })
            .await
            .expect("joined");
        assert_eq!(task, SCHED_BATCH, "a plain task, on the system thread");
        for w in 0..2 {
            let a = start_with(Probe, Options::named("worker").on_worker(w));
            let p = a.ask(|r| r).await.expect("answers");
            assert_eq!(p, SCHED_OTHER, "worker {w}");
        }
        let own = start_with(Probe, Options::named("own").own_thread());
        let p = own.ask(|r| r).await.expect("answers");
        assert_eq!(p, SCHED_OTHER, "an own-thread actor");
        let pool = BlockingPool::new("sched", 1, 1);
        let p = pool.try_run(policy).expect("room").await.expect("ran");
        assert_eq!(p, SCHED_OTHER, "a blocking pool thread");
    });
}
