//! `Options::own_thread` on the actix backend: the actor runs on a thread no worker shares,
//! and answers while every worker is stuck in a long turn (the raft driver's case: a
//! follower's workers busy with clients must not delay its answers to the leader).

use std::thread::ThreadId;
use std::time::Duration;

use starling_rt::{start_with, time, Actor, Ctx, Options, Reply, Runtime};

enum Msg {
    Where(Reply<ThreadId>),
    /// Holds its thread for this long, as a turn over a large batch would.
    Busy(Duration, Reply<()>),
}

struct Probe;

impl Actor for Probe {
    type Msg = Msg;

    async fn handle(&mut self, msg: Msg, _ctx: &mut Ctx<Self>) {
        match msg {
            Msg::Where(r) => {
                let _ = r.send(std::thread::current().id());
            }
            Msg::Busy(d, r) => {
                std::thread::sleep(d);
                let _ = r.send(());
            }
        }
    }
}

#[test]
fn an_own_thread_actor_answers_while_every_worker_is_busy() {
    Runtime::new(2).block_on(async {
        let workers: Vec<_> = (0..2)
            .map(|w| start_with(Probe, Options::named("worker").on_worker(w)))
            .collect();
        let own = start_with(Probe, Options::named("own").own_thread());
        let mut seen = Vec::new();
        for w in &workers {
            seen.push(w.ask(Msg::Where).await.expect("worker answers"));
        }
        let own_thread = own.ask(Msg::Where).await.expect("own answers");
        assert_ne!(seen[0], seen[1], "two workers, two threads");
        assert!(!seen.contains(&own_thread), "a thread of its own");
        assert_ne!(own_thread, std::thread::current().id());

        // Both workers stuck for a second: the own-thread actor still answers at once.
        let busy: Vec<_> = workers
            .iter()
            .map(|w| {
                let w = w.clone();
                starling_rt::spawn(
                    async move { w.ask(|r| Msg::Busy(Duration::from_secs(1), r)).await },
                )
            })
            .collect();
        time::sleep(Duration::from_millis(100)).await;
        let asked = time::now();
        own.ask(Msg::Where).await.expect("own answers");
        assert!(
            asked.elapsed() < Duration::from_millis(500),
            "answered after {:?}, behind the workers",
            asked.elapsed()
        );
        for b in busy {
            b.await.expect("joined").expect("busy answered");
        }
    });
}
