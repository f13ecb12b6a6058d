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
//! them is this node's, wherever the session is now. A copy this node owns is delivered
//! if the session is here, and relayed to where it went if not (down the chain, if it
//! moved on again); a copy routed in another node's stretch is that node's to deliver.
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
//! once.
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
    /// The old node's side: the links and topics it released since the session left.
    marked: HashSet<(LinkKey, Arc<str>)>,
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
    /// `topic`, is past the cut of the session's move away from here. Where to send that
    /// link's release for the topic (node, claim's epoch), unless sent before.
    pub(crate) fn mark(
        &mut self,
        client_id: &str,
        link: LinkKey,
        at: u64,
        topic: &Arc<str>,
        now: Instant,
    ) -> Option<(u64, u64)> {
        let m = self.by_client.get_mut(client_id)?;
        let (to, l) = m.stays.last()?.left?;
        let Cut::At { index, known } = l.cut else {
            return None;
        };
        if at < index || link.0 == to || now.saturating_duration_since(known) >= MARK_FOR {
            return None;
        }
        if m.marked.len() < MARKED_MAX && !m.marked.insert((link, topic.clone())) {
            return None;
        }
        Some((to, l.epoch))
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

    /// What becomes of a copy for `client_id` routed at `at`: `relayed` when it came marked
    /// for the session from a node that held it (judged there). `None`: the session is not
    /// moving, the copy goes as any other.
    pub(crate) fn verdict(&self, client_id: &str, at: u64, relayed: bool) -> Option<Verdict> {
        let m = self.by_client.get(client_id)?;
        if !relayed && !m.stays.iter().any(|s| s.holds(at)) {
            return Some(Verdict::Skip);
        }
        Some(match m.stays.last().and_then(|s| s.left) {
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
mod tests {
    use super::*;

    const A: u64 = 1;
    const B: u64 = 2;
    const C: u64 = 3;

    fn t0() -> Instant {
        starling_rt::time::now()
    }

    fn id() -> Arc<str> {
        Arc::from("c")
    }

    /// Where the copies of a publish routed at `at` that reached the nodes `reached` end:
    /// each judged on its node, relays followed.
    fn deliveries(nodes: &[(u64, &Moves)], at: u64, reached: &[u64]) -> Vec<u64> {
        let mut out = Vec::new();
        let mut copies: Vec<(u64, bool)> = reached.iter().map(|n| (*n, false)).collect();
        let mut hops = 0;
        while let Some((node, relayed)) = copies.pop() {
            hops += 1;
            assert!(hops < 100, "relayed in a circle");
            let Some((_, moves)) = nodes.iter().find(|(n, _)| *n == node) else {
                continue;
            };
            match moves.verdict("c", at, relayed) {
                None | Some(Verdict::Deliver) => out.push(node),
                Some(Verdict::Skip) => {}
                Some(Verdict::Relay(to, _)) => copies.push((to, true)),
            }
        }
        out
    }

    /// Every way a publish routed at `at` may have been routed (to the nodes in `must`,
    /// and maybe to those in `may`): it ends at `here`, once.
    fn once_at(nodes: &[(u64, &Moves)], at: u64, must: &[u64], may: &[u64], here: u64) {
        for pick in 0..(1u32 << may.len()) {
            let mut reached = must.to_vec();
            reached.extend(
                may.iter()
                    .enumerate()
                    .filter(|(i, _)| pick & (1 << i) != 0)
                    .map(|(_, n)| *n),
            );
            assert_eq!(
                deliveries(nodes, at, &reached),
                vec![here],
                "routed at {at} to {reached:?}"
            );
        }
    }

    /// Node `node` applies the cut of the move to `to` by claim `epoch` at `index`.
    fn cut(m: &mut Moves, node: u64, (to, epoch): (u64, u64), index: u64) {
        m.cut("c", (to, epoch), index, node, t0());
    }

    /// The session moves from A (its relay on `t/#`) to B by claim 7, installed there.
    fn moved(now: Instant) -> (Moves, Moves) {
        let (mut a, mut b) = (Moves::default(), Moves::default());
        a.went(id(), B, 7, now);
        a.relay_filters("c", vec!["t/#".into()]);
        b.came(id(), 7, now);
        assert!(b.installed("c", Vec::new));
        (a, b)
    }

    #[test]
    fn each_copy_reaches_the_session_once_across_a_move() {
        let now = t0();
        let (mut a, mut b) = moved(now);
        // Before the cut is known anywhere: a copy routed at or before both nodes' routes
        // (10) reached A (the routes before the cut hold A), maybe B too.
        once_at(&[(A, &a), (B, &b)], 10, &[A], &[B], B);
        assert!(
            a.waits_for(12, 10) && b.waits_for(12, 10),
            "later ones wait"
        );
        // The cut at 12: before it, A and maybe B; from it, B and maybe A.
        cut(&mut a, A, (B, 7), 12);
        cut(&mut b, B, (B, 7), 12);
        assert!(!a.waits_for(13, 10) && !b.waits_for(13, 10));
        for at in [3, 11] {
            once_at(&[(A, &a), (B, &b)], at, &[A], &[B], B);
        }
        for at in [12, 40] {
            once_at(&[(A, &a), (B, &b)], at, &[B], &[A], B);
        }
    }

    #[test]
    fn a_session_that_moves_on_before_its_first_cut_is_relayed_once_down_the_chain() {
        let now = t0();
        let (mut a, mut b, mut c) = (Moves::default(), Moves::default(), Moves::default());
        a.went(id(), B, 7, now);
        b.came(id(), 7, now);
        b.installed("c", Vec::new);
        // It leaves B for C before B's cut (12) is applied anywhere; C's cut is 15.
        b.went(id(), C, 9, now);
        c.came(id(), 9, now);
        c.installed("c", Vec::new);
        for (n, m) in [(A, &mut a), (B, &mut b), (C, &mut c)] {
            cut(m, n, (B, 7), 12);
            cut(m, n, (C, 9), 15);
        }
        let all = [(A, &a), (B, &b), (C, &c)];
        once_at(&all, 5, &[A], &[B, C], C);
        once_at(&all, 11, &[A], &[B, C], C);
        once_at(&all, 12, &[B], &[A, C], C);
        once_at(&all, 14, &[B], &[A, C], C);
        once_at(&all, 15, &[C], &[A, B], C);
        once_at(&all, 20, &[C], &[A, B], C);
    }

    /// A→B→A: a copy of A's first stay that reaches A late, after the session came back,
    /// is A's to deliver (B may never have had it); one of B's stay is B's to relay back.
    #[test]
    fn a_session_back_where_it_was_takes_the_copies_of_both_its_stays_there() {
        let now = t0();
        let (mut a, mut b) = (Moves::default(), Moves::default());
        a.went(id(), B, 7, now);
        a.relay_filters("c", vec!["t/#".into()]);
        b.came(id(), 7, now);
        b.installed("c", Vec::new);
        b.went(id(), A, 9, now);
        b.relay_filters("c", vec!["t/#".into()]);
        a.came(id(), 9, now);
        assert!(!a.relays("c") && b.relays("c"));
        assert!(
            !a.knows("c", 9),
            "not before its subscriptions are installed"
        );
        assert!(a.installed("c", Vec::new));
        assert!(a.knows("c", 9) && a.knows("c", 8) && !a.knows("c", 10));
        for (n, m) in [(A, &mut a), (B, &mut b)] {
            cut(m, n, (B, 7), 12);
            cut(m, n, (A, 9), 15);
        }
        let all = [(A, &a), (B, &b)];
        // A held it until 12 and from 15; B in between.
        once_at(&all, 5, &[A], &[B], A);
        once_at(&all, 11, &[A], &[B], A);
        once_at(&all, 12, &[B], &[A], A);
        once_at(&all, 14, &[B], &[A], A);
        once_at(&all, 15, &[A], &[B], A);
    }

    /// B holds a direct copy of C's link past the cut until A releases that link and
    /// topic; A releases each once, only past the cut, and none of B's link; B holds
    /// nothing of A's link, of a topic its handed-over filters do not match, nor once the
    /// hold's time is up.
    #[test]
    fn a_direct_copy_past_the_cut_waits_for_the_old_nodes_release_of_its_link_and_topic() {
        let now = t0();
        let (mut a, mut b) = (Moves::default(), Moves::default());
        let c_link: LinkKey = (C, 0, 42);
        let t: Arc<str> = Arc::from("t/1");
        a.went(id(), B, 7, now);
        a.relay_filters("c", vec!["t/#".into()]);
        b.came(id(), 7, now);
        b.keep_order("c", A);
        assert!(b.may_hold());
        assert!(b.installed("c", || vec!["t/#".into()]));
        // A later SUBSCRIBE of the session does not change what was handed over.
        assert!(b.installed("c", || vec!["u/#".into()]));
        assert!(!b.holds("c", c_link, 12, "t/1", now), "no cut known yet");
        cut(&mut a, A, (B, 7), 12);
        b.cut("c", (B, 7), 12, B, now);
        assert!(b.holds("c", c_link, 12, "t/1", now));
        assert!(b.holds("c", c_link, 30, "t/1", now));
        assert!(!b.holds("c", c_link, 11, "t/1", now), "before the cut: A's");
        assert!(
            !b.holds("c", (A, 0, 5), 12, "t/1", now),
            "A's link is in order"
        );
        assert!(!b.holds("c", c_link, 12, "u/1", now), "not handed over");
        assert!(
            !b.holds("c", c_link, 12, "t/1", now + ORDER_HOLD),
            "held for a while only"
        );
        // A: nothing for a copy before the cut, nor for B's own link; once per link and
        // topic past it.
        assert_eq!(a.mark("c", c_link, 11, &t, now), None);
        assert_eq!(a.mark("c", (B, 1, 9), 12, &t, now), None);
        assert_eq!(a.mark("c", c_link, 12, &t, now), Some((B, 7)));
        assert_eq!(a.mark("c", c_link, 13, &t, now), None, "once");
        assert_eq!(
            a.mark("c", c_link, 13, &Arc::from("t/2"), now),
            Some((B, 7))
        );
        assert_eq!(a.mark("c", (C, 1, 42), 12, &t, now), Some((B, 7)));
        let late = now + MARK_FOR + Duration::from_secs(1);
        assert_eq!(a.mark("c", (C, 0, 43), 12, &t, late), None, "too late");
        // The release frees that link and topic only, and only for this claim.
        assert_eq!(b.release("c", 6, c_link, t.clone()), Release::Unknown);
        assert!(b.holds("c", c_link, 12, "t/1", now), "another claim's");
        assert_eq!(b.release("c", 7, c_link, t.clone()), Release::Taken);
        assert!(!b.holds("c", c_link, 12, "t/1", now));
        assert!(b.holds("c", c_link, 12, "t/2", now));
        assert!(b.holds("c", (C, 1, 42), 12, "t/1", now));
        // B's own link: B asks A once per topic, and A answers it at once.
        let b_link: LinkKey = (B, 0, 9);
        assert!(b.holds("c", b_link, 12, "t/1", now));
        assert_eq!(b.ask("c", &t), Some((7, A)));
        assert_eq!(b.ask("c", &t), None, "once");
        assert_eq!(a.release("c", 7, b_link, t.clone()), Release::Asked(B, 7));
        assert_eq!(a.release("c", 7, c_link, t.clone()), Release::Unknown);
        assert_eq!(b.release("c", 7, b_link, t.clone()), Release::Taken);
        assert!(!b.holds("c", b_link, 12, "t/1", now));
        // Past its bound, the set of releases gives way: nothing is held any more.
        let mut d = Moves::default();
        d.came(id(), 7, now);
        d.keep_order("c", A);
        d.installed("c", || vec!["#".into()]);
        d.cut("c", (B, 7), 12, B, now);
        for i in 0..RELEASED_MAX {
            d.release("c", 7, c_link, Arc::from(format!("x/{i}")));
        }
        assert!(d.holds("c", c_link, 12, "y", now) && d.may_hold());
        d.release("c", 7, c_link, Arc::from("x/last"));
        assert!(!d.holds("c", c_link, 12, "y", now) && !d.may_hold());
        // The hold ends with its time, and with it the shard's cheap check.
        assert!(b.expire(now + ORDER_HOLD).0.is_empty());
        assert!(!b.may_hold());
    }

    /// Without `keep_order` (the `handover_order = false` case) nothing is held. With it, a
    /// session that moves on keeps its hold: what B holds back of another node's link it
    /// then relays, behind A's relays; A's release (for the claim that brought it to B)
    /// still frees it, C's request for its own link's release is still one, and the hold
    /// ends with its time.
    #[test]
    fn nothing_is_held_without_order_and_a_session_that_moves_on_keeps_its_hold() {
        let now = t0();
        let mut b = Moves::default();
        b.came(id(), 7, now);
        b.installed("c", || vec!["t/#".into()]);
        b.cut("c", (B, 7), 12, B, now);
        assert!(!b.may_hold() && !b.holds("c", (C, 0, 1), 12, "t/1", now));

        let (d_link, c_link): (LinkKey, LinkKey) = ((4, 0, 1), (C, 0, 1));
        let t: Arc<str> = Arc::from("t/1");
        let mut b = Moves::default();
        b.came(id(), 7, now);
        b.keep_order("c", A);
        b.installed("c", || vec!["t/#".into()]);
        b.cut("c", (B, 7), 12, B, now);
        b.went(id(), C, 9, now);
        assert!(b.may_hold() && b.holds("c", d_link, 12, "t/1", now));
        assert!(
            b.holds("c", d_link, u64::MAX, "t/1", now),
            "past C's cut too"
        );
        assert_eq!(b.verdict("c", 12, false), Some(Verdict::Relay(C, 9)));
        assert_eq!(
            b.release("c", 9, c_link, t.clone()),
            Release::Asked(C, 9),
            "C asks for its own link"
        );
        assert_eq!(b.release("c", 7, d_link, t.clone()), Release::Taken);
        assert!(!b.holds("c", d_link, 12, "t/1", now));
        assert!(b.holds("c", d_link, 12, "t/2", now), "another topic");
        assert!(!b.holds("c", d_link, 12, "t/2", now + ORDER_HOLD));
        b.expire(now + ORDER_HOLD);
        assert!(!b.may_hold());
    }

    /// A session that came is arriving until its subscriptions are installed (a direct copy
    /// for it waits meanwhile); one that left, or was here before any move, is not.
    #[test]
    fn a_session_that_came_is_arriving_until_it_installs_its_subscriptions() {
        let now = t0();
        let mut b = Moves::default();
        assert!(!b.any_arriving());
        b.came(id(), 7, now);
        assert!(b.any_arriving() && b.arriving("c"));
        b.installed("c", || vec!["t/#".into()]);
        assert!(!b.any_arriving() && !b.arriving("c"));
        b.went(id(), C, 9, now);
        b.came(id(), 11, now);
        assert!(b.any_arriving(), "back again, not installed yet");
        b.went(id(), A, 12, now);
        assert!(
            !b.any_arriving() && !b.arriving("c"),
            "gone before it installed"
        );
        let mut a = Moves::default();
        a.went(id(), B, 7, now);
        assert!(!a.any_arriving());
    }

    #[test]
    fn judgements_end_after_their_grace_and_give_back_the_relays_filters() {
        let now = t0();
        let mut a = Moves::default();
        a.through(u64::MAX);
        a.went(id(), B, 7, now);
        a.relay_filters("c", vec!["t/#".into(), "u".into()]);
        assert!(
            a.expire(now + CUT_GRACE).0.is_empty(),
            "unknown cuts wait longer"
        );
        a.cut("c", (B, 7), 12, A, now + Duration::from_secs(1));
        assert!(a.expire(now + CUT_GRACE).0.is_empty());
        let gone = a.expire(now + CUT_GRACE + Duration::from_secs(1));
        assert_eq!(
            gone.0,
            vec![(id(), vec!["t/#".to_string(), "u".to_string()])]
        );
        assert!(a.is_empty());
        // A cut never learnt stops being waited for.
        let mut b = Moves::default();
        b.came(id(), 7, now);
        assert_eq!(b.verdict("c", 1, false), Some(Verdict::Skip));
        assert!(b.expire(now + CUT_WAIT_MAX).0.is_empty());
        assert!(b.is_empty());
        assert_eq!(b.verdict("c", 1, false), None);
        // A session that came back keeps its relay's filters as its own: nothing to take
        // down when the judgement ends.
        let mut c = Moves::default();
        c.through(u64::MAX);
        c.went(id(), B, 7, now);
        c.relay_filters("c", vec!["t/#".into()]);
        c.came(id(), 9, now);
        c.cut("c", (B, 7), 12, A, now);
        c.cut("c", (A, 9), 15, A, now);
        assert!(c.expire(now + CUT_GRACE).0.is_empty());
        assert!(c.is_empty());
    }

    /// Past its grace, a move's judgement waits until the other members have nothing
    /// routed before its cut on its way: on the old node, a copy that comes that late is
    /// still relayed; on the new node, a direct copy routed before the cut is still
    /// skipped, so the session gets it once either way.
    #[test]
    fn judgements_past_their_grace_wait_until_the_other_members_are_through_with_the_cut() {
        let now = t0();
        let (mut a, mut b) = moved(now);
        cut(&mut a, A, (B, 7), 12);
        cut(&mut b, B, (B, 7), 12);
        // Long past the grace, one member still has copies routed before 12 on their way.
        let late = now + CUT_GRACE * 10;
        for m in [&mut a, &mut b] {
            m.through(12 - 1);
            assert_eq!(m.expire(late), (Vec::new(), 0));
        }
        let nodes = [(A, &a), (B, &b)];
        once_at(&nodes, 11, &[A], &[B], B);
        once_at(&nodes, 12, &[B], &[A], B);
        // Through with the cut: the relay goes, and its filters with it.
        a.through(12);
        b.through(12);
        assert_eq!(a.expire(late).0, vec![(id(), vec!["t/#".to_string()])]);
        assert_eq!(b.expire(late), (Vec::new(), 0));
        assert!(a.is_empty() && b.is_empty());
        // Within the grace, being through ends nothing.
        let mut c = Moves::default();
        c.through(u64::MAX);
        c.went(id(), B, 7, now);
        cut(&mut c, A, (B, 7), 12);
        assert!(c.expire(now + CUT_GRACE / 2).0.is_empty());
        assert!(!c.is_empty());
    }

    /// A node that leaves waits for the relays of the sessions that left it until their
    /// cut is applied and every other member is through with it, its grace aside; the new
    /// node relays nothing.
    #[test]
    fn a_relay_is_awaited_until_its_cut_is_known_and_the_members_are_through() {
        let now = t0();
        let (mut a, mut b) = moved(now);
        assert_eq!((a.relays_awaited(), b.relays_awaited()), (1, 0));
        cut(&mut a, A, (B, 7), 12);
        cut(&mut b, B, (B, 7), 12);
        a.through(11);
        assert_eq!(a.relays_awaited(), 1);
        a.through(12);
        assert_eq!((a.relays_awaited(), b.relays_awaited()), (0, 0));
        // Back on A: nothing relayed from there any more.
        let mut c = Moves::default();
        c.went(id(), B, 7, now);
        c.came(id(), 8, now);
        assert_eq!(c.relays_awaited(), 0);
    }

    /// A new session of the client id subscribes where the old one left and ended (its
    /// hand-over failed, or it started afresh): the old one's relay goes, and the new one
    /// takes every copy routed here. A session that came back by a hand-over, or one that
    /// has not ended here yet, keeps its judgement.
    #[test]
    fn a_new_session_where_one_left_ends_its_relay() {
        let now = t0();
        let mut a = Moves::default();
        a.went(id(), B, 7, now);
        assert_eq!(
            a.superseded("c"),
            None,
            "the one that left has not ended here yet"
        );
        a.relay_filters("c", vec!["t/#".into()]);
        cut(&mut a, A, (B, 7), 12);
        let _ = a.take_dirty();
        assert_eq!(a.superseded("c"), Some(vec!["t/#".to_string()]));
        assert!(a.is_empty());
        assert_eq!(a.verdict("c", 11, false), None);
        assert_eq!(a.take_dirty(), vec![(id(), None)]);
        // Back by a hand-over: its judgement stays.
        let mut b = Moves::default();
        b.went(id(), B, 7, now);
        b.relay_filters("c", vec!["t/#".into()]);
        b.came(id(), 9, now);
        assert_eq!(b.superseded("c"), None);
        assert!(!b.is_empty());
    }

    /// A shard keeps at most `HELD_MAX` judgements waiting past their grace: the oldest
    /// go first, counted.
    #[test]
    fn judgements_held_past_their_grace_are_bounded_oldest_first() {
        let now = t0();
        let mut a = Moves::default();
        let n = HELD_MAX + 3;
        for i in 0..n {
            let c: Arc<str> = Arc::from(format!("c{i}"));
            a.went(c.clone(), B, 7, now);
            a.relay_filters(&c, vec![format!("t/{i}")]);
            a.cut(&c, (B, 7), 12, A, now + Duration::from_millis(i as u64));
        }
        a.through(11);
        let (gone, cut_short) = a.expire(now + CUT_GRACE * 2);
        assert_eq!(cut_short, 3);
        let mut gone: Vec<String> = gone.into_iter().map(|(c, _)| c.to_string()).collect();
        gone.sort();
        assert_eq!(gone, vec!["c0", "c1", "c2"]);
        assert!(a.relays("c3") && !a.relays("c2"));
        assert_eq!(a.expire(now + CUT_GRACE * 2), (Vec::new(), 0));
    }
}
