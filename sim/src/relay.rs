//! A small distributed app for testing the seams themselves: on every node, one sender
//! actor per peer streams numbered messages over the transport seam (TCP) and resends what
//! was not acknowledged after each reconnect; the receiving node delivers each stream in
//! order, once per incarnation. An [`Oracle`] outside the simulated nodes records every
//! delivery and acknowledgement and checks:
//!
//! - order: within one (sender incarnation, receiver incarnation) the delivered sequence
//!   numbers are consecutive: no gap, no duplicate, no reordering;
//! - no gap across a receiver crash: a new receiver incarnation starts at or below the
//!   highest number ever delivered plus one;
//! - no false acknowledgement: an acknowledged number was delivered;
//! - liveness: after the heal, every live sender's stream is completely acknowledged.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream;
use starling_net::Stream;
use starling_rt::{start, start_with, Actor, Addr, Ctx, Options, Reply};
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};

use crate::check;
use crate::cluster::node_ip;

pub const PORT: u16 = 7000;

/// (sender node, sender incarnation, receiver node)
type Link = (usize, u32, usize);

/// The test's view from outside the simulated world.
#[derive(Default)]
pub struct Oracle {
    incarnations: BTreeMap<usize, u32>,
    /// (link, receiver incarnation) → last delivered
    last: BTreeMap<(Link, u32), u64>,
    /// link → highest delivered over all receiver incarnations
    high: BTreeMap<Link, u64>,
    /// link → acknowledged count
    acked: BTreeMap<Link, u64>,
    pub deliveries: u64,
    /// A deliberately false invariant for the harness's self-test: fail at this delivery.
    pub tripwire: Option<u64>,
}

pub type SharedOracle = Arc<Mutex<Oracle>>;

impl Oracle {
    pub fn shared() -> SharedOracle {
        Arc::new(Mutex::new(Oracle::default()))
    }

    fn new_incarnation(&mut self, node: usize) -> u32 {
        let e = self.incarnations.entry(node).or_insert(0);
        *e += 1;
        *e
    }

    fn delivered(&mut self, link: Link, rx_inc: u32, seq: u64) {
        self.deliveries += 1;
        if let Some(t) = self.tripwire {
            check!(
                self.deliveries < t,
                "tripwire: delivery {} ({link:?} seq {seq})",
                self.deliveries
            );
        }
        match self.last.get(&(link, rx_inc)) {
            Some(&last) => check!(
                seq == last + 1,
                "link {link:?} receiver incarnation {rx_inc}: delivered {seq} after {last}"
            ),
            None => {
                let limit = self.high.get(&link).map_or(0, |h| h + 1);
                check!(
                    seq <= limit,
                    "link {link:?}: new receiver incarnation {rx_inc} starts at {seq}, past {limit}: a gap"
                );
            }
        }
        self.last.insert((link, rx_inc), seq);
        let h = self.high.entry(link).or_insert(seq);
        *h = (*h).max(seq);
    }

    fn acknowledged(&mut self, link: Link, count: u64) {
        let delivered = self.high.get(&link).map_or(0, |h| h + 1);
        check!(
            count <= delivered,
            "link {link:?}: {count} acknowledged but only {delivered} delivered"
        );
        let a = self.acked.entry(link).or_insert(0);
        *a = (*a).max(count);
    }

    /// True once every current sender incarnation has all `total` messages acknowledged.
    pub fn complete(&self, nodes: usize, total: u64) -> bool {
        self.pending(nodes, total).is_empty()
    }

    /// Links of current incarnations still short of `total`, with their count.
    pub fn pending(&self, nodes: usize, total: u64) -> Vec<(Link, u64)> {
        let mut v = Vec::new();
        for src in 0..nodes {
            let Some(&inc) = self.incarnations.get(&src) else {
                v.push(((src, 0, src), 0));
                continue;
            };
            for dst in (0..nodes).filter(|d| *d != src) {
                let got = self.acked.get(&(src, inc, dst)).copied().unwrap_or(0);
                if got < total {
                    v.push(((src, inc, dst), got));
                }
            }
        }
        v
    }
}

fn lock(o: &SharedOracle) -> std::sync::MutexGuard<'_, Oracle> {
    o.lock().unwrap_or_else(|e| e.into_inner())
}

// ----------------------------------------------------------------------------- receiver

enum InboxMsg {
    /// A message arrived; the reply is the cumulative acknowledgement (count delivered).
    Arrived(usize, u32, u64, Reply<u64>),
}

/// Per-node receiver state: the next expected number of each sender incarnation.
struct Inbox {
    me: usize,
    incarnation: u32,
    expected: BTreeMap<(usize, u32), u64>,
    oracle: SharedOracle,
}

impl Actor for Inbox {
    type Msg = InboxMsg;
    async fn handle(&mut self, msg: InboxMsg, _ctx: &mut Ctx<Self>) {
        let InboxMsg::Arrived(src, src_inc, seq, reply) = msg;
        let next = self.expected.entry((src, src_inc)).or_insert(seq);
        if seq == *next {
            lock(&self.oracle).delivered((src, src_inc, self.me), self.incarnation, seq);
            *next += 1;
        }
        // Anything else is a resend of something already delivered (the sender resends from
        // its first unacknowledged message after a reconnect) or, which the oracle would
        // catch, a gap.
        let _ = reply.send(*next);
    }
}

enum ConnMsg {
    Frame(usize, u32, u64),
    Closed,
}

/// One accepted connection: reads frames, hands them to the inbox, writes acknowledgements.
struct Conn {
    inbox: Addr<InboxMsg>,
    write: WriteHalf<Stream>,
    read: Option<ReadHalf<Stream>>,
}

impl Actor for Conn {
    type Msg = ConnMsg;
    async fn started(&mut self, ctx: &mut Ctx<Self>) {
        let Some(read) = self.read.take() else { return };
        let frames = stream::unfold((read, None), |(mut r, hello)| async move {
            let (src, inc) = match hello {
                Some(h) => h,
                None => {
                    let src = r.read_u32().await.ok()? as usize;
                    let inc = r.read_u32().await.ok()?;
                    (src, inc)
                }
            };
            let seq = r.read_u64().await.ok()?;
            Some((ConnMsg::Frame(src, inc, seq), (r, Some((src, inc)))))
        });
        ctx.add_stream(frames, Some(Box::new(|| ConnMsg::Closed)));
    }

    async fn handle(&mut self, msg: ConnMsg, ctx: &mut Ctx<Self>) {
        match msg {
            ConnMsg::Frame(src, inc, seq) => {
                let Ok(ack) = self
                    .inbox
                    .ask(|r| InboxMsg::Arrived(src, inc, seq, r))
                    .await
                else {
                    return ctx.stop();
                };
                // Simulated TCP sends only on flush.
                if self.write.write_u64(ack).await.is_err() || self.write.flush().await.is_err() {
                    ctx.stop();
                }
            }
            ConnMsg::Closed => ctx.stop(),
        }
    }
}

// ------------------------------------------------------------------------------- sender

enum SendMsg {
    Tick,
    Connected(Option<Stream>),
    Ack(u64),
    Disconnected,
}

/// Streams `total` numbered messages to one peer, at most one new message per tick.
struct Sender {
    me: usize,
    incarnation: u32,
    peer: usize,
    total: u64,
    /// Count acknowledged: the first unacknowledged number.
    acked: u64,
    /// Next number to transmit on the current connection.
    sent: u64,
    /// Highest number ever handed out (new messages are released one per tick).
    released: u64,
    conn: Option<WriteHalf<Stream>>,
    connecting: bool,
    oracle: SharedOracle,
}

const WINDOW: u64 = 16;

impl Sender {
    fn drop_conn(&mut self) {
        self.conn = None;
    }

    async fn pump(&mut self) {
        let Some(w) = self.conn.as_mut() else { return };
        let upto = self.released.min(self.acked + WINDOW);
        if self.sent >= upto {
            return;
        }
        let frames: Vec<u8> = (self.sent..upto).flat_map(|s| s.to_be_bytes()).collect();
        // One write per batch, and simulated TCP sends only on flush.
        if w.write_all(&frames).await.is_err() || w.flush().await.is_err() {
            return self.drop_conn();
        }
        self.sent = upto;
    }
}

impl Actor for Sender {
    type Msg = SendMsg;
    async fn started(&mut self, ctx: &mut Ctx<Self>) {
        ctx.every(Duration::from_millis(20), || SendMsg::Tick);
    }

    async fn handle(&mut self, msg: SendMsg, ctx: &mut Ctx<Self>) {
        match msg {
            SendMsg::Tick => {
                self.released = (self.released + 1).min(self.total);
                if self.conn.is_none() && !self.connecting {
                    self.connecting = true;
                    let addr = SocketAddr::new(node_ip(self.peer), PORT);
                    ctx.spawn_then(
                        async move {
                            starling_rt::time::timeout(
                                Duration::from_secs(1),
                                starling_net::connect(addr),
                            )
                            .await
                            .and_then(|r| r.ok())
                        },
                        SendMsg::Connected,
                    );
                }
                self.pump().await;
            }
            SendMsg::Connected(stream) => {
                self.connecting = false;
                let Some(stream) = stream else { return };
                let (read, mut write) = tokio::io::split(stream);
                let hello = async {
                    write.write_u32(self.me as u32).await?;
                    write.write_u32(self.incarnation).await?;
                    write.flush().await
                };
                if hello.await.is_err() {
                    return;
                }
                self.conn = Some(write);
                // Resend everything not yet acknowledged, in order.
                self.sent = self.acked;
                let acks = stream::unfold(read, |mut r| async move {
                    let a = r.read_u64().await.ok()?;
                    Some((SendMsg::Ack(a), r))
                });
                ctx.add_stream(acks, Some(Box::new(|| SendMsg::Disconnected)));
                self.pump().await;
            }
            SendMsg::Ack(count) => {
                if count > self.acked {
                    self.acked = count;
                    lock(&self.oracle).acknowledged((self.me, self.incarnation, self.peer), count);
                }
                self.pump().await;
            }
            SendMsg::Disconnected => self.drop_conn(),
        }
    }
}

/// A node's main task: its inbox, a sender per peer, and the accept loop.
pub async fn node_main(me: usize, nodes: usize, total: u64, oracle: SharedOracle) {
    let incarnation = lock(&oracle).new_incarnation(me);
    let inbox = start(Inbox {
        me,
        incarnation,
        expected: BTreeMap::new(),
        oracle: oracle.clone(),
    });
    let _senders: Vec<Addr<SendMsg>> = (0..nodes)
        .filter(|p| *p != me)
        .map(|peer| {
            start_with(
                Sender {
                    me,
                    incarnation,
                    peer,
                    total,
                    acked: 0,
                    sent: 0,
                    released: 0,
                    conn: None,
                    connecting: false,
                    oracle: oracle.clone(),
                },
                Options::named("relay-sender"),
            )
        })
        .collect();
    let listener = starling_net::listen(SocketAddr::new(node_ip(me), PORT))
        .await
        .expect("bind relay port");
    loop {
        let Ok((stream, _peer)) = listener.accept().await else {
            continue;
        };
        let (read, write) = tokio::io::split(stream);
        start_with(
            Conn {
                inbox: inbox.clone(),
                write,
                read: Some(read),
            },
            Options::named("relay-conn"),
        );
    }
}
