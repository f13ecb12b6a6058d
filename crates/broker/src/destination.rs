//! Where a shard delivers: a [`Destination`] per subscriber, holding the deliveries routed
//! to it and not yet handed over.
//!
//! Two kinds: a local session (its client actor) and a remote node (the cluster forwards a
//! publish once per node that has subscribers for it; that node delivers to them). A bridge
//! is the kind to come. A local session's pending list applies the session's queue policy
//! ([`QueueFullPolicy::victim`]), so that what is dropped where its queue is full does not
//! depend on which queue it was. A remote node serves many sessions with policies of their
//! own, so its list keeps each message with the key of the acknowledgement waiting for it
//! and, when full, drops its oldest QoS 0 message, or else the new one (see
//! `routing::remote`).

use std::collections::VecDeque;
use std::sync::Arc;

use starling_codec::QoS;
use starling_rt::{ActorId, TrySendError, WeakAddr};
use starling_session::{DeliveryOptions, Message, QueueFullPolicy, WallClock};

use crate::flow::{Backlog, Holder};
use crate::forward;
use crate::msg::{ClientMsg, Delivery, BATCH_MAX};

/// Whether a delivery goes out at QoS 0.
pub(crate) fn is_qos0(m: &Message, o: &DeliveryOptions) -> bool {
    m.qos.min(o.qos) == QoS::AtMostOnce
}

/// Deliveries waiting for their destination, oldest first, with the count of QoS 0 ones
/// (a full list looks for one to evict only when there is one). A deque: a batch is taken
/// from the front and, when the destination has no room, put back there, each in the time
/// of the batch, not of the whole list (a list of a thousand behind a busy client, moved
/// twice per flush, took four fifths of a shard's time in a fan-out).
/// What became of a delivery offered to a full or not full [`Pending`] list.
#[must_use]
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// In the list; `evicted` is the store key of an older delivery the policy dropped to
    /// make room, when it had a record (which must go too, or a restart brings it back).
    Taken { evicted: Option<u64> },
    /// The new delivery is the one dropped.
    Refused,
}

#[derive(Default)]
pub(crate) struct Pending {
    items: VecDeque<Delivery>,
    qos0: usize,
    /// The size of the last batch taken: the room a new list starts with, so that a steady
    /// stream does not regrow it by doubling every batch.
    last_batch: u16,
}

impl Pending {
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Appends a delivery to a list bounded by `bound`; when full, `policy` picks the
    /// victim.
    pub(crate) fn push(&mut self, d: Delivery, bound: usize, policy: QueueFullPolicy) -> Pushed {
        let mut evicted = None;
        if self.items.len() >= bound {
            let items = &self.items;
            let victim = policy.victim(items.len(), self.qos0, || {
                items.iter().position(|(m, o)| is_qos0(m, o))
            });
            let Some(i) = victim else {
                return Pushed::Refused;
            };
            if let Some((m, o)) = self.items.remove(i) {
                self.qos0 -= usize::from(is_qos0(&m, &o));
                evicted = o.stored.get();
            }
        }
        self.qos0 += usize::from(is_qos0(&d.0, &d.1));
        if self.items.capacity() == 0 {
            self.items.reserve(usize::from(self.last_batch).max(1));
        }
        self.items.push_back(d);
        debug_assert_eq!(
            self.qos0,
            self.items.iter().filter(|(m, o)| is_qos0(m, o)).count()
        );
        Pushed::Taken { evicted }
    }

    /// Takes up to `max` of the oldest.
    fn take(&mut self, max: usize) -> Vec<Delivery> {
        let batch: Vec<Delivery> = if self.items.len() <= max {
            // The common case: all of it, in one move (a deque's storage becomes the batch).
            Vec::from(std::mem::take(&mut self.items))
        } else {
            self.items.drain(..max).collect()
        };
        self.qos0 -= batch.iter().filter(|(m, o)| is_qos0(m, o)).count();
        self.last_batch = u16::try_from(batch.len().min(BATCH_MAX)).unwrap_or(u16::MAX);
        batch
    }

    /// Puts a batch that could not be handed over back in front, order kept.
    fn put_back(&mut self, batch: Vec<Delivery>) {
        self.qos0 += batch.iter().filter(|(m, o)| is_qos0(m, o)).count();
        if self.items.is_empty() {
            self.items = VecDeque::from(batch);
            return;
        }
        for d in batch.into_iter().rev() {
            self.items.push_front(d);
        }
    }

    fn clear(&mut self) {
        self.items.clear();
        self.qos0 = 0;
    }

    /// Takes every message out, oldest first.
    pub(crate) fn drain_messages(&mut self) -> Vec<Arc<Message>> {
        self.qos0 = 0;
        self.items.drain(..).map(|(m, _)| m).collect()
    }
}

/// What became of a flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flushed {
    /// Everything was handed over.
    Done,
    /// The destination had no room: the rest waits for the next flush.
    Blocked,
    /// The destination is gone; what was pending is dropped.
    Gone,
}

/// A subscriber as a shard sees it.
pub(crate) enum Destination {
    /// A session on this node: its client actor.
    Local(LocalSession),
    /// Another node of the cluster, for the filters its subscribers hold.
    Remote(RemoteNode),
}

/// One message for another node: the message, the key of the answer waiting for it, the
/// shared group it goes to there (see [`SharedTo`]), and the log index of the routes it
/// was routed under (`routing::moving`).
pub(crate) type Pending1 = (Arc<Message>, Option<u64>, Option<SharedTo>, u64);

pub(crate) use crate::msg::SharedTo;

pub(crate) struct RemoteNode {
    pub node: u64,
    pub links: starling_raft::DataLinks,
    /// This shard's incarnation (drawn at its start): the node numbers its batches per
    /// incarnation, so a restarted node's batch 1 is not taken for an old one.
    pub inc: u64,
    /// Messages not yet handed to the link, oldest first, each with the key of the
    /// publisher's acknowledgement that waits for it (QoS 1/2 with a waiting publisher),
    /// and the shared group this node was picked for (`None`: its plain subscribers).
    pub pending: VecDeque<Pending1>,
    /// The number of the next batch sent.
    pub next_seq: u64,
    /// Batches sent and not yet acknowledged by the node, oldest first, numbered without a
    /// gap: each is kept until then, to be sent again if the node asks.
    pub unacked: VecDeque<Unacked>,
    /// The messages of `unacked`: with `pending`, the window that holds publishers back
    /// (`routing::link`).
    pub unacked_messages: usize,
    /// Batches to send again, before anything new: the next one's number and the last.
    pub resend: Option<(u64, u64)>,
    /// When the last go-back began, and from which batch: a request for batches that it
    /// already covers is not served twice within `RESEND_DAMP`.
    pub resent: Option<(starling_rt::time::Instant, u64)>,
    /// When the node last answered (an acknowledgement or a request).
    pub heard: starling_rt::time::Instant,
    /// Publishers held back because the window is full.
    pub holding: Vec<Holder>,
    /// Keys of messages that could not be sent at all, settled at the next check.
    pub lost: Vec<u64>,
    /// The messages of `unacked`'s parked batches (see [`Park`]): out of the window,
    /// bounded by the outbox's share.
    pub parked_messages: usize,
    /// Batches an earlier run of this node parked for it, sent again one at a time, in
    /// parking order, ahead of anything new (`routing::remote`).
    pub replay: VecDeque<Replay>,
    /// Replayed batches given up on (their frame is not one this build reads), by
    /// (incarnation, batch): their rows go.
    pub replay_gone: Vec<(u64, u64)>,
    /// Batch frames handed to the link since the shard last reported them.
    pub sent: Sent,
    /// Batches of `unacked` parked before they were ever sent (`Unacked::held`): while
    /// any is, nothing newer goes either.
    pub held_batches: usize,
}

/// Batch frames sent (first sends, resends and replays) and their bytes.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Sent {
    pub batches: u64,
    pub bytes: u64,
}

/// Hands a batch's `frame` to `node`'s link, counting it in `sent` if it went.
fn send_frame(
    links: &starling_raft::DataLinks,
    node: u64,
    sent: &mut Sent,
    frame: Vec<u8>,
) -> Result<(), starling_raft::DataSendError> {
    let bytes = frame.len() as u64;
    links.try_send(node, frame)?;
    sent.batches += 1;
    sent.bytes += bytes;
    Ok(())
}

/// A batch parked by an earlier run of this node, sent again as it was first sent (its
/// shard, incarnation and number), so that the node skips what it took of it before.
pub(crate) struct Replay {
    pub batch: starling_store::OutboxBatch,
    /// When it was last sent: it goes again after a quiet second.
    pub sent: Option<starling_rt::time::Instant>,
    /// Acknowledged: its row's drop is on its way to the store, and nothing goes after it
    /// until that is committed (`routing::remote`).
    pub dropping: bool,
}

/// Where a sent batch stands with the outbox: a batch its node has not acknowledged within
/// the forward timeout is parked, written to the store, and its publishers are answered
/// once that is durable; it stays here, out of the window, and is sent again until the
/// node acknowledges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Park {
    /// In the window.
    No,
    /// Its write is on its way to the store; its publishers still wait.
    Writing,
    /// Durable in the outbox; its publishers were told it is safe.
    Parked,
    /// The store did not take it, or there is no store and it is kept in memory (see
    /// `give_up_late`); its publishers were told it is not confirmed.
    Unbacked,
}

/// The messages of a batch, each with the shared group or moving session it is for.
pub(crate) type Batched = Vec<(Arc<Message>, Option<SharedTo>)>;

/// A batch sent to another node and not yet acknowledged by it.
pub(crate) struct Unacked {
    pub seq: u64,
    /// When it was first sent: its publishers' answers wait for it from then.
    pub sent_at: starling_rt::time::Instant,
    /// When it was last sent (probes go after a quiet second).
    pub last_sent: starling_rt::time::Instant,
    /// The publishers' acknowledgements that wait for it.
    pub keys: Vec<u64>,
    /// What it holds, to send again.
    pub messages: Batched,
    /// The log index of the routes they were routed under.
    pub routed_at: u64,
    pub park: Park,
    /// Parked as it was made, and not sent until its outbox row is durable: it holds a
    /// copy this node forwards on from another node's batch (`routing::remote`), and the
    /// writes committed before that row (a gated QoS 2 publisher's among them) must be
    /// durable before anything of it leaves.
    pub held: bool,
}

impl RemoteNode {
    pub(crate) fn new(node: u64, links: starling_raft::DataLinks, inc: u64) -> Self {
        RemoteNode {
            node,
            links,
            inc,
            pending: VecDeque::new(),
            next_seq: 1,
            unacked: VecDeque::new(),
            unacked_messages: 0,
            resend: None,
            resent: None,
            heard: starling_rt::time::now(),
            holding: Vec::new(),
            lost: Vec::new(),
            parked_messages: 0,
            replay: VecDeque::new(),
            replay_gone: Vec::new(),
            sent: Sent::default(),
            held_batches: 0,
        }
    }

    /// Messages parked for the node: written to the outbox (or on their way there) in this
    /// run, and those an earlier run parked that are still to be acknowledged.
    pub(crate) fn outbox_messages(&self) -> usize {
        let replayed: usize = self
            .replay
            .iter()
            .filter(|r| !r.dropping)
            .map(|r| r.batch.messages as usize)
            .sum();
        let parked: usize = if self.parked_messages == 0 {
            0
        } else {
            self.unacked
                .iter()
                .filter(|u| matches!(u.park, Park::Writing | Park::Parked))
                .map(|u| u.messages.len())
                .sum()
        };
        parked + replayed
    }

    /// Without an outbox: gives up the batches at the front of the window that the node
    /// did not acknowledge within `timeout`, and answers with their publishers' keys. A
    /// parked batch (a copy forwarded on from another node's batch is parked whatever the
    /// outbox's bound) is never given up, and the link cannot skip it: what is behind it
    /// waits with it.
    ///
    /// Without a store a copy forwarded on is not parked: its batch was acknowledged once
    /// it was queued here (`kept` tells its key), so it is kept in memory instead, sent
    /// again until the node takes it, out of the window (as `Park::Unbacked`, bounded like
    /// the outbox). What is late behind it is kept the same way (giving it up would leave
    /// a gap the link cannot skip), and its publishers hear it is not confirmed.
    pub(crate) fn give_up_late(
        &mut self,
        now: starling_rt::time::Instant,
        timeout: std::time::Duration,
        kept: impl Fn(u64) -> bool,
    ) -> Vec<u64> {
        let mut keys = Vec::new();
        let mut i = 0;
        while let Some(u) = self.unacked.get_mut(i) {
            if now.saturating_duration_since(u.sent_at) < timeout {
                break;
            }
            match u.park {
                Park::No => {}
                Park::Unbacked => {
                    i += 1;
                    continue;
                }
                Park::Writing | Park::Parked => break,
            }
            let n = u.messages.len();
            self.unacked_messages -= n;
            if i == 0 && !u.keys.iter().any(|k| kept(*k)) {
                tracing::debug!(
                    node = self.node,
                    seq = u.seq,
                    "forwarded batch not acknowledged in time"
                );
                if let Some(u) = self.unacked.pop_front() {
                    keys.extend(u.keys);
                }
                continue;
            }
            tracing::debug!(
                node = self.node,
                seq = u.seq,
                "forwarded batch not acknowledged in time: kept in memory"
            );
            u.park = Park::Unbacked;
            self.parked_messages += n;
            let (stay, settle): (Vec<u64>, Vec<u64>) = u.keys.iter().partition(|k| kept(**k));
            u.keys = stay;
            keys.extend(settle);
            i += 1;
        }
        keys
    }

    /// The oldest routes' index of a copy held for the node: not yet sent, sent and not
    /// acknowledged (parked or not), or parked by an earlier run. `None`: none.
    pub(crate) fn oldest_routed_at(&self) -> Option<u64> {
        let pending = self.pending.iter().map(|p| p.3);
        let unacked = self.unacked.iter().map(|u| u.routed_at);
        let replay = self
            .replay
            .iter()
            .filter(|r| !r.dropping)
            .map(|r| crate::forward::frame_routed_at(&r.batch.frame));
        pending.chain(unacked).chain(replay).min()
    }

    /// Whether what waits may wait for more in the middle of a burst: it does not fill a
    /// frame, and nothing is to be sent again first.
    pub(crate) fn may_wait_for_more(&self) -> bool {
        self.pending.len() < FORWARD_BATCH_MAX && self.resend.is_none() && self.replay.is_empty()
    }

    /// The next batch of what waits, within its first `free` messages: the routes' index
    /// its messages were routed under and how many it takes. A batch says which routes
    /// its messages were routed under, so one that changed in the middle of what waits
    /// cuts it there.
    pub(crate) fn next_batch(&self, free: usize) -> (u64, usize) {
        let routed_at = self.pending.front().map_or(0, |p| p.3);
        let n = self
            .pending
            .iter()
            .take(free.min(FORWARD_BATCH_MAX))
            .take_while(|p| p.3 == routed_at)
            .count();
        (routed_at, n)
    }

    /// Takes the first `n` waiting messages as a batch: the keys of the answers that wait
    /// for them, and the messages with their marks.
    pub(crate) fn take_batch(&mut self, n: usize) -> (Vec<u64>, Batched) {
        let mut keys = Vec::new();
        let messages = self
            .pending
            .drain(..n)
            .map(|(m, k, g, _)| {
                keys.extend(k);
                (m, g)
            })
            .collect();
        (keys, messages)
    }

    /// Where the link stands, as a batch sent now tells the node.
    fn pos(&self) -> forward::LinkPos {
        forward::LinkPos {
            inc: self.inc,
            base: self.unacked.front().map_or(self.next_seq, |u| u.seq),
            top: self.next_seq.saturating_sub(1),
        }
    }

    /// Sends the oldest batch an earlier run parked, unless it went less than a second
    /// ago. Its frame says the sender holds nothing before it, so the node takes it if it
    /// did not before, and acknowledges it again if it did. `Err`: no room on the link.
    fn send_replay(&mut self) -> Result<(), ()> {
        let now = starling_rt::time::now();
        let Some(r) = self.replay.front_mut() else {
            return Ok(());
        };
        if r.dropping
            || r.sent
                .is_some_and(|t| now.saturating_duration_since(t) < REPLAY_AGAIN)
        {
            return Ok(());
        }
        let b = &r.batch;
        let pos = forward::LinkPos {
            inc: b.inc,
            base: b.seq,
            top: b.seq,
        };
        let clock = WallClock {
            now: starling_rt::time::now(),
            wall: starling_rt::time::wall(),
        };
        let Some(frame) = forward::reposition(&b.frame, pos, &clock) else {
            // Another build's frame: it can never go.
            tracing::warn!(
                node = self.node,
                batch = b.seq,
                "a parked batch this build cannot read: dropped"
            );
            self.replay_gone.push((b.inc, b.seq));
            self.replay.pop_front();
            return Ok(());
        };
        match send_frame(&self.links, self.node, &mut self.sent, frame) {
            Ok(()) => {
                r.sent = Some(now);
                Ok(())
            }
            Err(starling_raft::DataSendError::Full(_)) => Err(()),
            // Not a peer yet (one that joined after this node's config was written is
            // added as the log is applied again) or any more: tried again at the next
            // check, never dropped, as its publishers were told it is safe.
            Err(starling_raft::DataSendError::Closed) => Ok(()),
        }
    }

    /// Sends again what `resend` names, in order. `Err`: no room on the link.
    fn send_again(&mut self, shard: u16) -> Result<(), ()> {
        let (now, wall) = (starling_rt::time::now(), starling_rt::time::wall());
        // Nothing from the first held batch on goes, whatever was asked: its row's
        // answer may come after a later one's (the store's answers may overtake each
        // other when the shard's urgent lane is full).
        let held = match self.held_batches {
            0 => None,
            _ => self.unacked.iter().find(|u| u.held).map(|u| u.seq),
        };
        while let Some((from, last)) = self.resend {
            let pos = self.pos();
            let at = from.max(pos.base);
            if at > last || at >= self.next_seq {
                self.resend = None;
                break;
            }
            let i = (at - pos.base) as usize;
            let u = &self.unacked[i];
            debug_assert_eq!(
                u.seq, at,
                "unacknowledged batches are numbered without a gap"
            );
            if held.is_some_and(|h| at >= h) {
                // Sent in order with the rest once the held batch may go (`parked`).
                break;
            }
            // The last batch sent again asks the node to say what it still misses: a
            // one-batch resend is the quiet link's probe, and the tail of a go-back may
            // be lost as well.
            let probe = at == last;
            let frame = forward::encode_publish(
                shard,
                pos,
                (at, probe),
                u.routed_at,
                u.messages.iter().map(|(m, g)| (m, g.as_ref())),
                &WallClock { now, wall },
            );
            match send_frame(&self.links, self.node, &mut self.sent, frame) {
                Ok(()) => {
                    self.unacked[i].last_sent = now;
                    self.resend = Some((at + 1, last));
                }
                Err(starling_raft::DataSendError::Full(_)) => return Err(()),
                // Not a peer any more: the timeout settles what waits.
                Err(starling_raft::DataSendError::Closed) => self.resend = None,
            }
        }
        Ok(())
    }
}

/// The subscriber key of node `node` in a shard's router: a client id cannot hold U+0000
/// (MQTT 1.5.4), so no client's key is ever the same.
pub(crate) fn remote_key(node: u64) -> std::sync::Arc<str> {
    std::sync::Arc::from(format!("\u{0}node-{node}"))
}

/// Deliveries per forwarded frame: a frame is one write on the peer's data stream.
const FORWARD_BATCH_MAX: usize = 256;

/// How long a replayed batch waits for its acknowledgement before it goes again.
pub(crate) const REPLAY_AGAIN: std::time::Duration = std::time::Duration::from_secs(1);

pub(crate) struct LocalSession {
    pub addr: WeakAddr<ClientMsg>,
    pub online: bool,
    pub pending: Pending,
    /// What waits for it and whom it holds back, as this shard sees it (see
    /// [`crate::flow`]).
    pub backlog: Backlog,
    /// Its session outlives its connection: QoS 1/2 deliveries are stored first.
    pub persistent: bool,
    /// Deliveries to it waiting for a commit (see `HeldDelivery`): later ones wait too.
    pub held: u32,
}

impl Destination {
    pub(crate) fn local(addr: WeakAddr<ClientMsg>, backlog: Backlog) -> Self {
        Destination::Local(LocalSession {
            addr,
            online: true,
            pending: Pending::default(),
            backlog,
            persistent: false,
            held: 0,
        })
    }

    /// Whether it takes deliveries now (a shared group prefers such members).
    pub(crate) fn online(&self) -> bool {
        match self {
            Destination::Local(l) => l.online,
            Destination::Remote(_) => true,
        }
    }

    /// The actor it is, for telling a newer registration from an older one.
    pub(crate) fn actor(&self) -> ActorId {
        match self {
            Destination::Local(l) => l.addr.id(),
            Destination::Remote(_) => ActorId(0),
        }
    }

    /// The publishers it holds back, released: it is gone.
    pub(crate) fn end(&mut self) -> Vec<Holder> {
        match self {
            Destination::Local(l) => l.backlog.end(),
            Destination::Remote(r) => std::mem::take(&mut r.holding),
        }
    }

    /// Hands what is pending over, a batch at a time, as from `shard`; to another node,
    /// only what was queued before the message keyed `gate` (see `routing::remote::FwdGate`).
    pub(crate) fn flush(&mut self, shard: u16, gate: Option<u64>) -> Flushed {
        match self {
            Destination::Local(l) => {
                while !l.pending.is_empty() {
                    let batch = l.pending.take(BATCH_MAX);
                    let n = batch.len();
                    match l.addr.try_send(ClientMsg::Deliver(shard, batch)) {
                        Ok(()) => l.backlog.handed(n),
                        Err(TrySendError::Full(ClientMsg::Deliver(_, batch))) => {
                            l.pending.put_back(batch);
                            return Flushed::Blocked;
                        }
                        // Gone (its session ended): nothing to deliver to.
                        Err(_) => {
                            l.pending.clear();
                            return Flushed::Gone;
                        }
                    }
                }
                Flushed::Done
            }
            Destination::Remote(r) => {
                // What an earlier run parked goes first, one batch at a time; the link's
                // own batches wait until the node took all of it.
                if !r.replay.is_empty() {
                    return match r.send_replay() {
                        Ok(()) => Flushed::Done,
                        Err(()) => Flushed::Blocked,
                    };
                }
                // What the node asked for again goes first: it takes batches only in order.
                if r.send_again(shard).is_err() {
                    return Flushed::Blocked;
                }
                if r.held_batches > 0 {
                    // Sent once its row is durable (`routing::remote::parked`), and the
                    // link's batches go in order.
                    return Flushed::Done;
                }
                let (now, wall) = (starling_rt::time::now(), starling_rt::time::wall());
                let mut free = match gate {
                    Some(g) => r
                        .pending
                        .iter()
                        .position(|(_, k, _, _)| k.is_some_and(|k| k >= g))
                        .unwrap_or(r.pending.len()),
                    None => r.pending.len(),
                };
                while free > 0 {
                    let (routed_at, n) = r.next_batch(free);
                    let seq = r.next_seq;
                    let pos = forward::LinkPos {
                        top: seq,
                        ..r.pos()
                    };
                    let frame = forward::encode_publish(
                        shard,
                        pos,
                        (seq, false),
                        routed_at,
                        r.pending.iter().take(n).map(|(m, _, g, _)| (m, g.as_ref())),
                        &WallClock { now, wall },
                    );
                    match send_frame(&r.links, r.node, &mut r.sent, frame) {
                        Ok(()) => {
                            free -= n;
                            r.next_seq += 1;
                            let (keys, messages) = r.take_batch(n);
                            // Every batch, keys or not: the window counts its messages, and
                            // the node may ask for it again.
                            r.unacked.push_back(Unacked {
                                seq,
                                sent_at: now,
                                last_sent: now,
                                keys,
                                messages,
                                routed_at,
                                park: Park::No,
                                held: false,
                            });
                            r.unacked_messages += n;
                        }
                        Err(starling_raft::DataSendError::Full(_)) => return Flushed::Blocked,
                        // Not a peer of this node (or it is stopping): nothing to deliver
                        // to. What waits for it is settled by the caller's timeout check.
                        Err(starling_raft::DataSendError::Closed) => {
                            let keys = r.pending.drain(..).filter_map(|(_, k, _, _)| k);
                            r.lost.extend(keys);
                            return Flushed::Done;
                        }
                    }
                }
                Flushed::Done
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use starling_codec::Properties;
    use starling_session::StoreKey;
    use std::sync::Arc;

    fn d(qos: QoS, tag: u8) -> Delivery {
        let m = Message {
            topic: Arc::from("t"),
            payload: Bytes::from(vec![tag]),
            qos,
            retain: false,
            properties: Properties::default(),
            expires_at: None,
            publisher: None,
            shared_headers: Default::default(),
            received_at: None,
        };
        let o = DeliveryOptions {
            qos: QoS::ExactlyOnce,
            ..DeliveryOptions::default()
        };
        (Arc::new(m), o)
    }

    fn tags(p: &mut Pending) -> Vec<u8> {
        p.take(usize::MAX)
            .iter()
            .map(|(m, _)| m.payload[0])
            .collect()
    }

    #[test]
    fn a_full_list_applies_the_sessions_policy() {
        let fill = |policy| {
            let mut p = Pending::default();
            let mut stored = d(QoS::AtLeastOnce, 0);
            stored.1.stored = StoreKey::new(7);
            let none = Pushed::Taken { evicted: None };
            assert_eq!(p.push(stored, 2, policy), none);
            assert_eq!(p.push(d(QoS::AtMostOnce, 1), 2, policy), none);
            let kept = p.push(d(QoS::AtLeastOnce, 2), 2, policy);
            (kept, tags(&mut p))
        };
        assert_eq!(
            fill(QueueFullPolicy::DropNew),
            (Pushed::Refused, vec![0, 1])
        );
        assert_eq!(
            fill(QueueFullPolicy::DropOldestQos0),
            (Pushed::Taken { evicted: None }, vec![0, 2])
        );
        // The victim had a record: its key comes back, for the shard to drop it.
        assert_eq!(
            fill(QueueFullPolicy::DropOldest),
            (Pushed::Taken { evicted: Some(7) }, vec![1, 2])
        );
    }

    #[test]
    fn a_batch_put_back_keeps_order_and_the_qos0_count() {
        let mut p = Pending::default();
        for (i, q) in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::AtMostOnce]
            .into_iter()
            .enumerate()
        {
            let pushed = p.push(d(q, i as u8), 8, QueueFullPolicy::DropOldestQos0);
            assert_eq!(pushed, Pushed::Taken { evicted: None });
        }
        let first = p.take(2);
        assert_eq!(p.qos0, 1);
        p.put_back(first);
        assert_eq!(p.qos0, 2);
        assert_eq!(tags(&mut p), vec![0, 1, 2]);
    }
}
