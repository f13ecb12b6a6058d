//! Handed-over sessions are encoded off the cluster actor's turn. A session may be up to
//! 256 MiB: a fraction of a second to encode in a release build, seconds in a debug build
//! on a loaded machine, and the actor answers nothing else meanwhile (claims, routes,
//! raft's commits, other sessions asked for again). One worker thread encodes them in the
//! order they came; past what the pool admits, the rest wait here, in order, so that none
//! is refused (its session would be lost).

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;

use starling_rt::blocking::{BlockingPool, JobLost};

use crate::msg::HandOff;

/// Sessions encoding at once at most: the pool's one thread and its queue. Only this
/// module submits to the pool, and a job frees its place before its result goes out, so
/// below this count the pool always admits.
const IN_FLIGHT: usize = 4;

/// A handed-over session's frame at most (cut in parts of `SESSION_PART_BYTES`): half of
/// what a receiving node holds of sessions being put together, so that two fit.
const HANDOFF_BYTES_MAX: usize = crate::cluster::parts::PARTS_BYTES_MAX / 2;

/// A session to hand over: to node `to`, for its claim `epoch` of `client_id`.
pub(super) struct ToEncode {
    pub to: u64,
    pub client_id: Arc<str>,
    pub epoch: u64,
    pub handoff: Option<Box<HandOff>>,
}

/// A session's frames, encoded (`Err`: the job was lost, the encoding panicked).
pub(super) type Encoded = (u64, Arc<str>, u64, Result<Vec<Vec<u8>>, JobLost>);

pub(super) struct Encoder {
    pool: BlockingPool,
    in_flight: usize,
    waiting: VecDeque<ToEncode>,
}

impl Encoder {
    pub(super) fn new() -> Self {
        Encoder {
            pool: BlockingPool::new("starling-handover", 1, IN_FLIGHT - 1),
            in_flight: 0,
            waiting: VecDeque::new(),
        }
    }

    /// Starts encoding `s` (the job to await), or keeps it until one finishes.
    pub(super) fn submit(
        &mut self,
        s: ToEncode,
        node: u64,
    ) -> Option<impl Future<Output = Encoded> + Send + 'static> {
        if self.in_flight >= IN_FLIGHT {
            self.waiting.push_back(s);
            return None;
        }
        self.in_flight += 1;
        let ToEncode {
            to,
            client_id,
            epoch,
            handoff,
        } = s;
        let id = client_id.clone();
        let job = self.pool.try_run(move || frames(node, &id, epoch, handoff));
        Some(async move {
            let frames = match job {
                Ok(job) => job.await,
                // Not reached (see `IN_FLIGHT`); were it, the session is gone with the
                // closure, and the new node is told there is none rather than left waiting.
                Err(_) => Err(JobLost),
            };
            (to, client_id, epoch, frames)
        })
    }

    /// One encoding finished: the next one waiting, started.
    pub(super) fn finished(
        &mut self,
        node: u64,
    ) -> Option<impl Future<Output = Encoded> + Send + 'static> {
        self.in_flight = self.in_flight.saturating_sub(1);
        let next = self.waiting.pop_front()?;
        self.submit(next, node)
    }
}

/// The frames that carry `client_id`'s session for claim `epoch`: itself, or its parts.
/// One too large is not sent: the new node is told there is none, rather than left
/// waiting.
pub(super) fn frames(
    node: u64,
    client_id: &str,
    epoch: u64,
    handoff: Option<Box<HandOff>>,
) -> Vec<Vec<u8>> {
    let frames = crate::forward::encode_session_parts(client_id, epoch, handoff);
    let bytes: usize = frames.iter().map(Vec::len).sum();
    if bytes <= HANDOFF_BYTES_MAX {
        return frames;
    }
    tracing::warn!(
        node_id = node,
        %client_id,
        bytes,
        "session too large to hand over; the new node starts it afresh"
    );
    crate::forward::encode_session_parts(client_id, epoch, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(i: u64) -> ToEncode {
        ToEncode {
            to: 2,
            client_id: Arc::from(format!("c{i}")),
            epoch: i,
            handoff: None,
        }
    }

    /// Past what the pool admits, sessions wait and start in order as others finish; none
    /// is refused.
    #[tokio::test]
    async fn sessions_past_the_pool_wait_and_every_one_is_encoded_in_order() {
        type Job = std::pin::Pin<Box<dyn Future<Output = Encoded> + Send>>;
        let mut e = Encoder::new();
        let mut started: VecDeque<Job> = VecDeque::new();
        for i in 0..10 {
            if let Some(job) = e.submit(session(i), 1) {
                started.push_back(Box::pin(job));
            }
        }
        assert_eq!(started.len(), IN_FLIGHT);
        let mut done = Vec::new();
        while let Some(job) = started.pop_front() {
            let (to, client_id, epoch, frames) = job.await;
            assert_eq!(to, 2);
            assert_eq!(&*client_id, format!("c{epoch}"));
            assert_eq!(frames.expect("encoded").len(), 1);
            done.push(epoch);
            if let Some(job) = e.finished(1) {
                started.push_back(Box::pin(job));
            }
        }
        assert_eq!(done, (0..10).collect::<Vec<_>>());
    }
}
