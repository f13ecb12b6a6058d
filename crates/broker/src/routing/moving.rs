//! Sessions moving between nodes, as one shard sees them: which copy of a publish reaches a
//! session that is being handed over, so that none is lost and none arrives twice.
//!
//! A session moves from node A to node B when B claims its client id. The routes of its
//! subscriptions move from A to B through the raft log, and every node applies that at its
//! own pace, so for a while a publish may be routed to A, to B, or to both. The cut is a
//! log entry of its own ([`starling_cluster::Command::Moved`], index M), which B proposes
//! once the session is installed and the routes of its subscriptions hold B. Every batch
//! of forwarded publishes carries the index of the routes it was routed under (`routed
//! at`), and both nodes judge a copy by it:
//! - a copy routed before M is the old node's: A relays it to B, marked for the session
//!   (the session's subscriptions stay installed on A as a relay, and keep A in their
//!   routes, until well after M); B takes it only from A;
//! - a copy routed at M or later is the new node's: B delivers it directly, A drops its own.
//!
//! Routed before M, a publish went to A (A's routes held the session's filters until after
//! M); routed at M or later, it went to B (B's routes were committed before M). So each
//! publish reaches the session exactly once, whichever node it came from, and however far
//! behind that node was. Until a shard has applied M it cannot judge a copy routed under a
//! later index than its own: the shard keeps such a batch back until its own routes catch
//! up ([`Moves::waits_for`]).
//!
//! A session may come back to a node it left, and leave again: each shard keeps, per
//! moving session, the stretches of the log during which its node held the session (from
//! the cut that brought it to the cut that took it away), and a copy routed within one of
//! them is this node's, wherever the session is now; a copy routed in another node's
//! stretch is that node's to deliver. A copy of the stretch still open is delivered here.
//! A copy of a stretch that ended is relayed to where the session went from that
//! stretch, and on down the chain of its later moves, even if the session is back here
//! now: what this node relayed there before is still on its way back, and a short cut
//! would overtake it ([`Moves::verdict`]). Only within [`ORDER_HOLD`] of a move's cut,
//! as order is kept: a copy later than that goes straight to where the session is.
//!
//! Order across the cut: a copy relayed through A takes one hop more than a later copy of
//! the same publisher that took the direct way to B. So for [`ORDER_HOLD`] after B learnt
//! the cut, B holds back a direct copy for the session (routed at M or later) that came on
//! another node's link (node, shard, incarnation) on a topic, until A says it relayed all
//! that link sent it on that topic before the cut: A knows it once that link's first copy
//! routed at M or later reaches it (links are ordered, and A is still in the routes of the
//! session's filters as its relay), and answers with a *release* behind its relays
//! ([`Moves::mark`], [`Moves::release`]). A's own link needs none: its relays and its
//! direct copies travel on it in order. B's own publishes went to A before the cut and
//! come back relayed: B keeps a later one on that topic back, and asks A, on the same link
//! as those copies, for the release of its own link ([`Moves::ask`]), which A answers at
//! once. A releases a link for each move away from it that a copy is past, not only its
//! last: the session may have come back to A since, and B still holds copies back.
//!
//! A session that moves on from B to C while B still holds copies back keeps B's hold: B
//! then relays what it held (or, routed past C's cut, drops it and sends C that link's
//! release), still behind A's relays of the link's earlier copies, which come down the
//! chain through B. For the same reason B answers C's request for its own link's release
//! only once B's own hold on that link and topic is over. And a session that comes back
//! to a node it left takes a direct copy routed in its earlier stay there (one that came
//! late, or was held) only once its subscriptions are installed again
//! ([`Moves::arriving`]): before, its slot is still the destination the session that left
//! had.
//!
//! Plain data, no clock of its own: the shard passes the time in.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use starling_session::Instant;

mod record;

/// How long a known cut is kept after it was learnt at least: the order across the move
/// is kept within it. Past it, the judgement goes once every other member said that
/// nothing it routed to this node before the cut is still on its way ([`Moves::through`]):
/// the old node's relay with it, and with that the old node's routes for the session's
/// filters.
pub(crate) const CUT_GRACE: Duration = Duration::from_secs(30);

/// Judgements one shard keeps past their grace at most, waiting for a member that says
/// nothing (down, or cut off from this node, with copies for it parked): past it, the
/// oldest go, and a copy routed before their cut that still comes is lost.
pub(crate) const HELD_MAX: usize = 10_000;

/// How long a cut that never becomes known is waited for (the new node could not commit
/// it, or it lies in a snapshot this node installed): the move's judgement stops then,
/// and copies go by the routes alone, as without a move.
pub(crate) const CUT_WAIT_MAX: Duration = Duration::from_secs(60);

/// How long after the new node learnt a move's cut it holds back a direct copy for the
/// session until the old node releases that copy's link and topic: about the relay's extra
/// hop when the old node is up; the bound when it is not (killed, cut off), past which
/// order may go but nothing is lost.
pub(crate) const ORDER_HOLD: Duration = Duration::from_secs(2);

/// How long after the old node learnt the cut it sends releases: longer than the new
/// node's hold, which starts when that node learns the cut (a little earlier or later).
const MARK_FOR: Duration = Duration::from_secs(8);

/// Releases one old node remembers having sent per move (then it sends one per copy).
const MARKED_MAX: usize = 4096;

/// Releases one new node keeps per move at most (links times topics, within the hold's
/// 2 s): past it, the session holds nothing back any more (its order may go, nothing is
/// lost), so a flood of distinct topics cannot grow the set without bound.
const RELEASED_MAX: usize = 65_536;

/// A relay whose session left this node for good: its client id, and the filters to take
/// down.
pub(crate) type RelayGone = (Arc<str>, Vec<String>);

/// A sending link, as both ends of a move see it: the node, its shard and incarnation.
pub(crate) type LinkKey = (u64, u16, u64);

/// One move's cut, as this shard knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// Not applied here yet, since `since`.
    Unknown { since: Instant },
    /// At this log index, learnt at `known`.
    At { index: u64, known: Instant },
}

impl Cut {
    /// Whether no copy routed before it can still come: `through` is the routes' index
    /// before which the other members have nothing on its way here.
    fn done(&self, now: Instant, through: u64) -> bool {
        match *self {
            Cut::Unknown { since } => now.saturating_duration_since(since) >= CUT_WAIT_MAX,
            Cut::At { known, .. } => {
                now.saturating_duration_since(known) >= CUT_GRACE && self.passed(through)
            }
        }
    }

    /// Whether it is known, and the other members are through with it: no copy routed
    /// before it is on its way here any more (its grace aside).
    fn passed(&self, through: u64) -> bool {
        matches!(*self, Cut::At { index, .. } if index <= through)
    }

    /// Past its grace, it waits for the other members alone: since when it was learnt.
    fn held(&self, now: Instant, through: u64) -> Option<Instant> {
        match *self {
            Cut::At { known, .. }
                if !self.passed(through) && now.saturating_duration_since(known) >= CUT_GRACE =>
            {
                Some(known)
            }
            _ => None,
        }
    }

    fn known(&self) -> bool {
        matches!(self, Cut::At { .. })
    }

    /// Whether a copy routed at `at` came before the cut (an unknown cut is later than any
    /// copy the shard lets through: see [`Moves::waits_for`]).
    fn after(&self, at: u64) -> bool {
        match *self {
            Cut::Unknown { .. } => true,
            Cut::At { index, .. } => at < index,
        }
    }
}

/// A move of the session, as one end of it: the claim's epoch and the move's cut.
#[derive(Debug, Clone, Copy)]
struct Move {
    epoch: u64,
    cut: Cut,
}

/// A stretch of the log during which this node held the session: from the cut that
/// brought it here (`None`: it was here before any move this shard judges) to the cut that
/// took it to `to` (`None`: it is still here).
#[derive(Debug, Clone, Copy)]
struct Stay {
    came: Option<Move>,
    /// Its subscriptions are installed again here (a copy relayed for it waits until then).
    installed: bool,
    left: Option<(u64, Move)>,
}

impl Stay {
    /// Whether a copy routed at `at` was routed while this node held the session.
    fn holds(&self, at: u64) -> bool {
        self.came.is_none_or(|c| !c.cut.after(at)) && self.left.is_none_or(|(_, l)| l.cut.after(at))
    }
}

#[derive(Debug, Clone, Default)]
struct Moving {
    /// Oldest first; only the last may be open.
    stays: Vec<Stay>,
    /// The subscriptions kept installed as the session's relay while it is away.
    filters: Vec<String>,
    /// The new node's side of order across the last move here (`handover_order`).
    order: Option<Order>,
    /// The old node's side: the links and topics it released, per move away (its claim's
    /// epoch), since the session last left.
    marked: HashSet<(u64, LinkKey, Arc<str>)>,
    /// Taken back from the store at this node's start (`record`): a relay's filters are
    /// not in the shard's router, but matched by [`Moves::restored_relays`].
    restored: bool,
    /// The session that left ended here: what is left is its relay.
    ended_here: bool,
}

/// What the session's new node holds back for order, and what its old node released.
#[derive(Debug, Clone, Default)]
struct Order {
    /// The node it came from (its own link needs no release).
    from: u64,
    /// Its subscriptions but shared ones, as handed over: a copy matching only one made
    /// after the move was never relayed.
    filters: Vec<String>,
    released: HashMap<LinkKey, HashSet<Arc<str>>>,
    /// How many (link, topic) pairs `released` holds.
    count: usize,
    /// The topics this node asked the old node to release its own link for.
    asked: HashSet<Arc<str>>,
}

impl Order {
    /// The order of a session that came from node `from`, held on `filters`, nothing
    /// released yet.
    fn from(from: u64, filters: Vec<String>) -> Self {
        Order {
            from,
            filters,
            released: HashMap::new(),
            count: 0,
            asked: HashSet::new(),
        }
    }
}

/// What a release that came means to this shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Release {
    /// The session here may take that link's copies on that topic now.
    Taken,
    /// The session's new node (`.0`, claim's epoch `.1`) asks, on its own link, for that
    /// link's release: all it sent here before is relayed, so it is answered at once.
    Asked(u64, u64),
    /// For no move this shard knows of.
    Unknown,
}

impl Moving {
    fn here(&self) -> bool {
        self.stays.last().is_some_and(|s| s.left.is_none())
    }

    /// Came here, its subscriptions not installed yet: a copy delivered to it now would go
    /// to the destination its relay kept here, not to the session arriving.
    fn arriving(&self) -> bool {
        self.stays
            .last()
            .is_some_and(|s| s.left.is_none() && s.came.is_some() && !s.installed)
    }
}

/// How a copy for a moving session came to this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    /// Routed here by its publisher's node.
    Direct,
    /// Relayed by another node, for the stay here that the claim of this epoch began.
    Relayed(u64),
    /// Routed to the session here before it left, and still here: the last stay's.
    Held,
}

/// What becomes of one copy of a publish for a moving session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The session here takes it.
    Deliver,
    /// Another copy reaches the session: this one is dropped for it.
    Skip,
    /// Sent on to the session's new node (`.0`), marked for it and its claim there (`.1`).
    Relay(u64, u64),
}

/// The moving sessions of one shard, by client id.
#[derive(Debug, Default)]
pub(crate) struct Moves {
    by_client: HashMap<Arc<str>, Moving>,
    /// How many sessions have an `order` (kept exact: [`Moves::may_hold`] is asked per
    /// forwarded batch).
    ordering: usize,
    /// The routes' index before which every other member has nothing on its way to this
    /// node any more (`RouterMsg::Through`): a cut no later than it is done with, once its
    /// grace is over.
    through: u64,
    /// Sessions whose judgement changed since it was last stored (`record`).
    dirty: HashSet<Arc<str>>,
    /// What [`Moves::waits_for`] and [`Moves::restored_relays`] ask per forwarded batch or
    /// copy, counted again after a change (`stale`): a shard may keep thousands of moves
    /// while a member lags, and they are asked far more often than moves change.
    counts: Counts,
    stale: bool,
}

#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    /// Cuts not learnt yet.
    unknown: usize,
    /// One past the highest cut of a restored relay: a copy routed at or after it is none
    /// of theirs (`u64::MAX` while one's cut is unknown; 0: none).
    restored_below: u64,
    /// Sessions that came here and have not installed their subscriptions yet.
    arriving: usize,
}

impl Moves {
    pub(crate) fn is_empty(&self) -> bool {
        self.by_client.is_empty()
    }

    /// Every other member has nothing it routed here before `at` on its way any more
    /// (`u64::MAX`: judgements end with their grace, whatever comes after).
    pub(crate) fn through(&mut self, at: u64) {
        self.through = at;
    }

    /// The session of `client_id` arrives here, taken over by this node's claim `epoch`.
    /// A relay kept from an earlier stay becomes its subscriptions again.
    pub(crate) fn came(&mut self, client_id: Arc<str>, epoch: u64, now: Instant) {
        self.stale = true;
        self.dirty.insert(client_id.clone());
        let m = self.by_client.entry(client_id).or_default();
        // Its subscriptions come back to the router with it.
        m.restored = false;
        if m.here() {
            // Claimed again before it left (a hand-over tried anew): the newer claim.
            m.stays.pop();
        }
        m.filters.clear();
        self.ordering -= usize::from(m.order.take().is_some());
        m.stays.push(Stay {
            came: Some(Move {
                epoch,
                cut: Cut::Unknown { since: now },
            }),
            installed: false,
            left: None,
        });
    }

    /// The session of `client_id` is being handed over to `to` for its claim `epoch`.
    pub(crate) fn went(&mut self, client_id: Arc<str>, to: u64, epoch: u64, now: Instant) {
        self.stale = true;
        self.dirty.insert(client_id.clone());
        let m = self.by_client.entry(client_id).or_default();
        if m.here() {
            // Here in this run: its relay is its subscriptions in the router.
            m.restored = false;
        }
        // The order across the move that brought it here stays (until its hold is over):
        // what this node relays on of a link's copies waits, as delivering them did, for
        // the old node's release, so a copy relayed down the chain stays ahead of later
        // ones.
        m.marked.clear();
        let left = Some((
            to,
            Move {
                epoch,
                cut: Cut::Unknown { since: now },
            },
        ));
        match m.stays.last_mut() {
            Some(s) if s.left.is_none() => s.left = left,
            // Handed over again before it came back (a newer claim): the newer move.
            Some(s) => {
                if s.left.is_some_and(|(_, l)| l.epoch < epoch) {
                    s.left = left;
                }
            }
            None => m.stays.push(Stay {
                came: None,
                installed: true,
                left,
            }),
        }
    }

    /// The subscriptions of `client_id`'s session that stay installed as its relay (its
    /// session ended here after `went`).
    pub(crate) fn relay_filters(&mut self, client_id: &str, filters: Vec<String>) {
        if let Some(m) = self.by_client.get_mut(client_id).filter(|m| !m.here()) {
            m.filters.extend(filters);
            m.ended_here = true;
            self.stale = true;
            self.dirty.insert(Arc::from(client_id));
        }
    }

    /// Sessions that left this node for which another member may still route a copy here
    /// (their cut not applied yet, or a member not through with it): what a node that
    /// leaves waits for, the grace aside.
    pub(crate) fn relays_awaited(&self) -> usize {
        let open = |m: &Moving| {
            !m.here()
                && m.stays
                    .last()
                    .and_then(|s| s.left)
                    .is_some_and(|(_, l)| !l.cut.passed(self.through))
        };
        self.by_client.values().filter(|m| open(m)).count()
    }

    /// Whether the session of `client_id` left this shard's node and is relayed.
    pub(crate) fn relays(&self, client_id: &str) -> bool {
        self.by_client
            .get(client_id)
            .is_some_and(|m| !m.stays.is_empty() && !m.here())
    }

    /// The session of `client_id` that came here installs its subscriptions: the first
    /// time, `filters` (the handed-over ones but shared, without their prefixes) are those
    /// its order across the move is kept on. Whether one had come.
    pub(crate) fn installed(
        &mut self,
        client_id: &str,
        filters: impl FnOnce() -> Vec<String>,
    ) -> bool {
        let Some(m) = self.by_client.get_mut(client_id) else {
            return false;
        };
        match m.stays.last_mut() {
            Some(s) if s.left.is_none() && s.came.is_some() => {
                if !s.installed {
                    if let Some(o) = m.order.as_mut() {
                        o.filters = filters();
                        self.dirty.insert(Arc::from(client_id));
                    }
                }
                s.installed = true;
                self.stale = true;
                true
            }
            _ => false,
        }
    }

    /// The session of `client_id`, which came here from node `from`, keeps its
    /// publishers' order across the move (on the filters it installs first).
    pub(crate) fn keep_order(&mut self, client_id: &str, from: u64) {
        if let Some(m) = self.by_client.get_mut(client_id).filter(|m| m.here()) {
            self.ordering += usize::from(m.order.is_none());
            m.order = Some(Order::from(from, Vec::new()));
            // Stored with the judgement: a restart within the hold holds again.
            self.dirty.insert(Arc::from(client_id));
        }
    }

    /// Whether some session here may hold a copy back for order now (cheap: no clock).
    pub(crate) fn may_hold(&self) -> bool {
        self.ordering > 0
    }

    /// Whether a direct copy for `client_id` that came on `link`, routed at `at`, on
    /// `topic`, waits for its old node's release (see the module's "Order across the
    /// cut").
    pub(crate) fn holds(
        &self,
        client_id: &str,
        link: LinkKey,
        at: u64,
        topic: &str,
        now: Instant,
    ) -> bool {
        let Some(m) = self.by_client.get(client_id) else {
            return false;
        };
        let (Some(o), Some(s)) = (&m.order, m.stays.last()) else {
            return false;
        };
        // Moved on since, too: the copy is then relayed (or dropped for the next node's
        // own, and that node told so), in order behind the old node's relays all the same.
        let Some(Move {
            cut: Cut::At { index, known },
            ..
        }) = s.came
        else {
            return false;
        };
        at >= index
            && now.saturating_duration_since(known) < ORDER_HOLD
            && link.0 != o.from
            && o.filters
                .iter()
                .any(|f| starling_router::filter_matches(f, topic))
            && !o.released.get(&link).is_some_and(|t| t.contains(topic))
    }

    /// A release of `link` on `topic` for `client_id`'s move by claim `epoch` came: on the
    /// new node, its old node relayed all that link sent it on the topic before the cut;
    /// on the old node, the new node asks for its own link's release.
    pub(crate) fn release(
        &mut self,
        client_id: &str,
        epoch: u64,
        link: LinkKey,
        topic: Arc<str>,
    ) -> Release {
        let Some(m) = self.by_client.get_mut(client_id) else {
            return Release::Unknown;
        };
        let Some(last) = m.stays.last() else {
            return Release::Unknown;
        };
        match (last.came, last.left) {
            (_, Some((to, l))) if to == link.0 && l.epoch == epoch => Release::Asked(to, epoch),
            // Also once it moved on: what this node holds back then is relayed.
            (Some(c), _) if c.epoch == epoch => {
                let Some(o) = m.order.as_mut() else {
                    return Release::Unknown;
                };
                if o.count >= RELEASED_MAX {
                    m.order = None;
                    self.ordering -= 1;
                } else {
                    o.count += usize::from(o.released.entry(link).or_default().insert(topic));
                }
                Release::Taken
            }
            _ => Release::Unknown,
        }
    }

    /// On the new node: whether to ask the old node for the release of this node's own
    /// `link` on `topic` for `client_id` (once per topic). The claim's epoch and the old
    /// node, if so.
    pub(crate) fn ask(&mut self, client_id: &str, topic: &Arc<str>) -> Option<(u64, u64)> {
        let m = self.by_client.get_mut(client_id)?;
        let epoch = m.stays.last()?.came?.epoch;
        let o = m.order.as_mut()?;
        o.asked.insert(topic.clone()).then_some((epoch, o.from))
    }

    /// On the old node: a copy for `client_id` that came on `link`, routed at `at`, on
    /// `topic`. Where to send that link's release for the topic (node, claim's epoch), for
    /// the latest move away from here to each node whose cut the copy is past, unless sent
    /// before. Not only the last move counts: the session may have come back since, and
    /// the node it went to then still holds copies back for the release.
    pub(crate) fn mark(
        &mut self,
        client_id: &str,
        link: LinkKey,
        at: u64,
        topic: &Arc<str>,
        now: Instant,
    ) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        let Some(m) = self.by_client.get_mut(client_id) else {
            return out;
        };
        // Latest first, and only the latest move to each node: a node holds copies back
        // for the last move that brought the session to it alone, so one that came back
        // and left again many times costs a release per node, not per move.
        let mut seen: Vec<u64> = Vec::new();
        for (to, l) in m.stays.iter().rev().filter_map(|s| s.left) {
            if seen.contains(&to) {
                continue;
            }
            seen.push(to);
            let Cut::At { index, known } = l.cut else {
                continue;
            };
            if at < index || link.0 == to || now.saturating_duration_since(known) >= MARK_FOR {
                continue;
            }
            if m.marked.len() < MARKED_MAX && !m.marked.insert((l.epoch, link, topic.clone())) {
                continue;
            }
            out.push((to, l.epoch));
        }
        out
    }

    /// Whether the session of `client_id` came here by the claim `epoch` (or a later one)
    /// and installed its subscriptions, or left again: a copy relayed for that claim can
    /// be judged. One that comes first (the relay and the session travel apart) waits.
    pub(crate) fn knows(&self, client_id: &str, epoch: u64) -> bool {
        self.by_client.get(client_id).is_some_and(|m| {
            m.stays.iter().any(|s| {
                s.came.is_some_and(|c| c.epoch >= epoch && s.installed)
                    || s.left.is_some_and(|(_, l)| l.epoch > epoch)
            })
        })
    }

    /// The log applied the cut of `client_id`'s move to `node` by claim `epoch` at `index`.
    pub(crate) fn cut(
        &mut self,
        client_id: &str,
        (node, epoch): (u64, u64),
        index: u64,
        me: u64,
        now: Instant,
    ) {
        let Some(m) = self.by_client.get_mut(client_id) else {
            return;
        };
        self.stale = true;
        self.dirty.insert(Arc::from(client_id));
        let at = Cut::At { index, known: now };
        for s in &mut m.stays {
            if let Some(c) = s.came.as_mut().filter(|c| node == me && c.epoch == epoch) {
                c.cut = at;
            }
            if let Some((_, l)) = s
                .left
                .as_mut()
                .filter(|(to, l)| *to == node && l.epoch == epoch)
            {
                l.cut = at;
            }
        }
    }

    /// What becomes of a copy for `client_id` routed at `at`, that came `via`, now. `None`:
    /// the session is not moving, the copy goes as any other.
    ///
    /// A copy goes down the chain of the session's stays from the one it belongs to, and
    /// takes no short cut: one that belongs to a stretch this node held before the session
    /// left (or that was relayed for such a stretch) goes to where the session went from
    /// that stretch even if the session is back here now, because what this node relayed
    /// there before is still on its way back, and the later copy must stay behind it.
    pub(crate) fn verdict(
        &self,
        client_id: &str,
        at: u64,
        via: Via,
        now: Instant,
    ) -> Option<Verdict> {
        let m = self.by_client.get(client_id)?;
        let owner = match via {
            Via::Direct => {
                // The latest that holds it: a stay whose move away is not cut here (yet)
                // holds every copy after it, and a later stay's known cut is past that.
                let Some(s) = m.stays.iter().rev().find(|s| s.holds(at)) else {
                    return Some(Verdict::Skip);
                };
                Some(s)
            }
            Via::Relayed(epoch) => m
                .stays
                .iter()
                .find(|s| s.came.is_some_and(|c| c.epoch >= epoch)),
            Via::Held => None,
        };
        // Down the chain only through a move away learnt within the order's hold (or not
        // cut yet): past it, order across that move is not kept anyway, and a copy that
        // late would chase every move since, each node it passes holding its batch's
        // answer for the next one.
        let owner = owner.filter(|s| {
            s.left.is_some_and(|(_, l)| match l.cut {
                Cut::Unknown { .. } => true,
                Cut::At { known, .. } => now.saturating_duration_since(known) < ORDER_HOLD,
            })
        });
        Some(match owner.or(m.stays.last()).and_then(|s| s.left) {
            None => Verdict::Deliver,
            Some((to, l)) => Verdict::Relay(to, l.epoch),
        })
    }

    /// Whether some session came here and has not installed its subscriptions yet (cheap).
    pub(crate) fn any_arriving(&mut self) -> bool {
        self.counts().arriving > 0
    }

    /// Whether the session of `client_id` came here and has not installed its
    /// subscriptions yet: a direct copy for it waits, as a relayed one does.
    pub(crate) fn arriving(&self, client_id: &str) -> bool {
        self.by_client.get(client_id).is_some_and(Moving::arriving)
    }

    /// Whether a batch routed at `at` must wait until this shard applied the routes up to
    /// it (`routes_at` is where it stands): some move's cut is unknown here, and the batch
    /// may have been routed after it.
    pub(crate) fn waits_for(&mut self, at: u64, routes_at: u64) -> bool {
        at > routes_at && self.counts().unknown > 0
    }

    fn counts(&mut self) -> Counts {
        if self.stale {
            self.stale = false;
            let mut c = Counts::default();
            for m in self.by_client.values() {
                for s in &m.stays {
                    let cuts = s.came.map(|c| c.cut).into_iter();
                    let cuts = cuts.chain(s.left.map(|(_, l)| l.cut));
                    c.unknown += cuts.filter(|cut| !cut.known()).count();
                }
                c.arriving += usize::from(m.arriving());
                if m.restored && !m.here() {
                    for (_, l) in m.stays.iter().filter_map(|s| s.left) {
                        let below = match l.cut {
                            Cut::At { index, .. } => index,
                            Cut::Unknown { .. } => u64::MAX,
                        };
                        c.restored_below = c.restored_below.max(below);
                    }
                }
            }
            self.counts = c;
        }
        self.counts
    }

    /// Ends the judgements whose time is up; returns, per client id, the relay's filters to
    /// take down (its session left this node for good), and how many judgements ended
    /// before the other members said they were through with their cuts ([`HELD_MAX`]).
    pub(crate) fn expire(&mut self, now: Instant) -> (Vec<RelayGone>, usize) {
        let through = self.through;
        // Past the bound, the oldest of those held past their grace go as if through.
        let mut held: Vec<(Instant, Arc<str>)> = self
            .by_client
            .iter()
            .filter_map(|(client_id, m)| {
                let cuts = m.stays.iter().flat_map(|s| {
                    s.came
                        .map(|c| c.cut)
                        .into_iter()
                        .chain(s.left.map(|(_, l)| l.cut))
                });
                cuts.filter_map(|c| c.held(now, through))
                    .min()
                    .map(|known| (known, client_id.clone()))
            })
            .collect();
        let mut forced = HashSet::new();
        if held.len() > HELD_MAX {
            held.sort();
            let over = held.len() - HELD_MAX;
            forced.extend(held.into_iter().take(over).map(|(_, c)| c));
        }
        let cut_short = forced.len();
        let mut out = Vec::new();
        let dirty = &mut self.dirty;
        self.by_client.retain(|client_id, m| {
            let shape = |m: &Moving| (m.stays.len(), m.stays.first().map(|s| s.came.is_some()));
            let before = shape(m);
            let through = if forced.contains(client_id) {
                u64::MAX
            } else {
                through
            };
            // No copy of a stretch that ended long enough ago is on its way any more.
            m.stays
                .retain(|s| s.left.is_none_or(|(_, l)| !l.cut.done(now, through)));
            if let [only] = m.stays.as_mut_slice() {
                if only.came.is_some_and(|c| c.cut.done(now, through)) {
                    only.came = None;
                    only.installed = true;
                }
            }
            let held_until = m
                .stays
                .last()
                .and_then(|s| s.came)
                .and_then(|c| match c.cut {
                    Cut::At { known, .. } => Some(known + ORDER_HOLD),
                    Cut::Unknown { .. } => None,
                });
            if held_until.is_some_and(|t| now >= t) && m.order.take().is_some() {
                dirty.insert(client_id.clone());
            }
            let plain = matches!(m.stays.as_slice(), [s] if s.came.is_none() && s.left.is_none());
            // A restored relay has nothing in the router to take down.
            if m.stays.is_empty() && !m.restored {
                out.push((client_id.clone(), std::mem::take(&mut m.filters)));
            }
            let keep = !(m.stays.is_empty() || plain);
            if !keep || shape(m) != before {
                dirty.insert(client_id.clone());
            }
            keep
        });
        self.ordering = self
            .by_client
            .values()
            .filter(|m| m.order.is_some())
            .count();
        self.stale = true;
        (out, cut_short)
    }

    /// A session of `client_id` that did not come here by a hand-over subscribes, after
    /// the one that left ended here: a new one (the old one's hand-over failed, or its
    /// client started afresh). What this shard kept of the old one's moves goes: the new
    /// session takes every copy routed here for its client id. Returns the relay's
    /// filters still in the router, to take down; `None`: nothing kept.
    pub(crate) fn superseded(&mut self, client_id: &str) -> Option<Vec<String>> {
        let m = self.by_client.get(client_id)?;
        if m.here() || !m.ended_here {
            return None;
        }
        let m = self.by_client.remove(client_id)?;
        self.ordering -= usize::from(m.order.is_some());
        self.stale = true;
        self.dirty.insert(Arc::from(client_id));
        Some(if m.restored { Vec::new() } else { m.filters })
    }

    /// Forgets a session that ended here (not handed over).
    pub(crate) fn ended(&mut self, client_id: &str) {
        if self.by_client.get(client_id).is_some_and(Moving::here) {
            if let Some(m) = self.by_client.remove(client_id) {
                self.ordering -= usize::from(m.order.is_some());
                self.stale = true;
                self.dirty.insert(Arc::from(client_id));
            }
        }
    }
}

#[cfg(test)]
mod tests;
