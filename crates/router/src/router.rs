//! The subscription trie: filters by level, each holding plain, exclusive, limited and shared
//! subscriptions.

use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

use crate::shared::{mix, PublishContext, SharedGroup, SharedStrategy};
use crate::topic::{parse_subscription, split_level, Extension, TopicLimits};
use crate::{FixedState, Map, RouterError};

/// The router's validated configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouterConfig {
    pub limits: TopicLimits,
    /// Cap on subscriptions across all subscribers; past it new subscriptions are refused with
    /// [`RouterError::SubscriptionsFull`] (replacing an existing one is still allowed).
    pub subscriptions_max: usize,
    pub shared_strategy: SharedStrategy,
    /// Seed of the trie's hash maps. Iteration order, and so the order of deliveries, is a
    /// function of this seed and the operations applied. Peers choose topic levels; a seed
    /// they cannot learn makes colliding keys harder to craft (foldhash's fixed state is fast,
    /// not a keyed PRF, so this is hardening rather than a guarantee).
    pub hash_seed: u64,
}

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            limits: TopicLimits::default(),
            subscriptions_max: 10_000_000,
            shared_strategy: SharedStrategy::default(),
            hash_seed: 0,
        }
    }
}

/// One subscription a publish is to be delivered to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery<S, T> {
    pub subscriber: S,
    pub options: T,
    pub kind: DeliveryKind,
}

/// Which kind of subscription produced a [`Delivery`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryKind {
    Plain,
    Exclusive,
    Limited,
    /// The member picked for a shared subscription. `group` and `filter` name the group for
    /// [`Router::pick_shared`]. `accepted` is `false` when no member passed the caller's
    /// predicate: the subscriber is then the strategy's first choice, for the caller to queue
    /// (persistent session) or drop.
    Shared {
        group: Arc<str>,
        filter: Arc<str>,
        accepted: bool,
    },
}

/// The subscriptions of one topic filter.
#[derive(Debug, Clone)]
struct Entries<S, T> {
    plain: Map<S, T>,
    exclusive: Option<(S, T)>,
    /// `$limit/N/` subscribers; each was admitted against its own `N`.
    limited: Map<S, T>,
    shared: Map<Arc<str>, SharedGroup<S, T>>,
}

impl<S: Clone + Eq + Hash, T: Clone> Entries<S, T> {
    fn new(hasher: FixedState) -> Self {
        Self {
            plain: Map::with_hasher(hasher),
            exclusive: None,
            limited: Map::with_hasher(hasher),
            shared: Map::with_hasher(hasher),
        }
    }

    fn is_empty(&self) -> bool {
        self.plain.is_empty()
            && self.exclusive.is_none()
            && self.limited.is_empty()
            && self.shared.is_empty()
    }

    fn get(&self, subscriber: &S, extension: Extension<'_>) -> Option<&T> {
        match extension {
            Extension::Plain => self.plain.get(subscriber),
            Extension::Exclusive => self
                .exclusive
                .as_ref()
                .filter(|(h, _)| h == subscriber)
                .map(|(_, t)| t),
            Extension::Limit { .. } => self.limited.get(subscriber),
            Extension::Shared { group } => self.shared.get(group)?.get(subscriber),
        }
    }

    /// Whether `subscriber` may take this subscription, given who holds it already.
    fn admits(&self, subscriber: &S, extension: Extension<'_>) -> Result<(), RouterError> {
        match extension {
            Extension::Exclusive => match &self.exclusive {
                Some((holder, _)) if holder != subscriber => Err(RouterError::ExclusiveHeld),
                _ => Ok(()),
            },
            Extension::Limit { max } => {
                let current = self.limited.len();
                if !self.limited.contains_key(subscriber) && current >= max as usize {
                    Err(RouterError::LimitReached { current, max })
                } else {
                    Ok(())
                }
            }
            Extension::Plain | Extension::Shared { .. } => Ok(()),
        }
    }

    /// Inserts after [`Entries::admits`] said yes (`checked`), or after another router's
    /// admission: an `$exclusive/` slot then passes to `subscriber`.
    fn insert(
        &mut self,
        subscriber: S,
        extension: Extension<'_>,
        filter: &str,
        options: T,
        hasher: FixedState,
        checked: bool,
    ) -> Option<T> {
        match extension {
            Extension::Plain => self.plain.insert(subscriber, options),
            Extension::Exclusive => match &mut self.exclusive {
                Some((holder, held)) if *holder == subscriber => {
                    Some(std::mem::replace(held, options))
                }
                Some(slot) => {
                    assert!(!checked, "admits() refused other holders");
                    *slot = (subscriber, options);
                    None
                }
                None => {
                    self.exclusive = Some((subscriber, options));
                    None
                }
            },
            Extension::Limit { .. } => self.limited.insert(subscriber, options),
            Extension::Shared { group } => {
                if let Some(g) = self.shared.get_mut(group) {
                    return g.insert(subscriber, options);
                }
                let name: Arc<str> = group.into();
                let mut g = SharedGroup::new(name.clone(), filter.into(), hasher);
                g.insert(subscriber, options);
                self.shared.insert(name, g);
                None
            }
        }
    }

    fn remove(&mut self, subscriber: &S, extension: Extension<'_>) -> Option<T> {
        match extension {
            Extension::Plain => self.plain.remove(subscriber),
            Extension::Exclusive => match &self.exclusive {
                Some((holder, _)) if holder == subscriber => self.exclusive.take().map(|(_, t)| t),
                _ => None,
            },
            Extension::Limit { .. } => self.limited.remove(subscriber),
            Extension::Shared { group } => {
                let g = self.shared.get_mut(group)?;
                let old = g.remove(subscriber)?;
                if g.is_empty() {
                    self.shared.remove(group);
                }
                Some(old)
            }
        }
    }

    fn deliver(&mut self, picker: &mut Picker<'_, S>, out: &mut Vec<Delivery<S, T>>) {
        // Each of plain, exclusive and limited names a subscriber at most once; count those
        // that yield, so a caller merging one subscriber's overlaps knows when it need not.
        picker.sources += usize::from(!self.plain.is_empty())
            + usize::from(self.exclusive.is_some())
            + usize::from(!self.limited.is_empty());
        for (s, t) in &self.plain {
            out.push(Delivery {
                subscriber: s.clone(),
                options: t.clone(),
                kind: DeliveryKind::Plain,
            });
        }
        if let Some((s, t)) = &self.exclusive {
            out.push(Delivery {
                subscriber: s.clone(),
                options: t.clone(),
                kind: DeliveryKind::Exclusive,
            });
        }
        for (s, t) in &self.limited {
            out.push(Delivery {
                subscriber: s.clone(),
                options: t.clone(),
                kind: DeliveryKind::Limited,
            });
        }
        for g in self.shared.values_mut() {
            let draw = picker.next_draw();
            let Some(pick) = g.pick(
                picker.strategy,
                draw,
                picker.ctx.publisher_hash,
                &mut *picker.accept,
            ) else {
                continue; // empty groups are removed on leave; nothing to deliver anyway
            };
            let (s, t) = g.member(pick.index);
            out.push(Delivery {
                subscriber: s.clone(),
                options: t.clone(),
                kind: DeliveryKind::Shared {
                    group: g.name.clone(),
                    filter: g.filter.clone(),
                    accepted: pick.accepted,
                },
            });
        }
    }
}

/// Per-match state for shared groups.
struct Picker<'a, S> {
    strategy: SharedStrategy,
    ctx: &'a PublishContext,
    /// Shared groups picked so far in this match; gives each group its own random draw.
    groups: u64,
    /// Non-shared subscriber sets that yielded deliveries so far in this match.
    sources: usize,
    accept: &'a mut dyn FnMut(&S) -> bool,
}

impl<S> Picker<'_, S> {
    fn next_draw(&mut self) -> u64 {
        self.groups += 1;
        // Golden-ratio increments then a finalizer: SplitMix64's stream from the caller's draw.
        mix(self
            .ctx
            .random
            .wrapping_add(self.groups.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
    }
}

/// A trie node: one topic-filter level.
#[derive(Debug, Clone)]
struct Node<S, T> {
    children: Map<Box<str>, Node<S, T>>,
    /// The `+` child, kept apart so literal lookups never see it.
    plus: Option<Box<Node<S, T>>>,
    /// Subscriptions whose filter ends at this node.
    exact: Option<Box<Entries<S, T>>>,
    /// Subscriptions whose filter is this node's path followed by `/#` (or `#` at the root).
    multi: Option<Box<Entries<S, T>>>,
}

impl<S, T> Node<S, T> {
    fn new(hasher: FixedState) -> Self {
        Self {
            children: Map::with_hasher(hasher),
            plus: None,
            exact: None,
            multi: None,
        }
    }

    fn is_empty(&self) -> bool {
        self.children.is_empty()
            && self.plus.is_none()
            && self.exact.is_none()
            && self.multi.is_none()
    }

    fn slot(&mut self, multi: bool) -> &mut Option<Box<Entries<S, T>>> {
        if multi {
            &mut self.multi
        } else {
            &mut self.exact
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    subscriptions: usize,
    filters: usize,
    nodes: usize,
}

/// Where a topic filter lives in the trie: the levels of its path (`None`: the root) and
/// whether it ends in `#`.
#[derive(Debug, Clone, Copy)]
struct FilterPath<'a> {
    levels: Option<&'a str>,
    multi: bool,
}

impl<'a> FilterPath<'a> {
    fn of(filter: &'a str) -> Self {
        if filter == "#" {
            Self {
                levels: None,
                multi: true,
            }
        } else if let Some(prefix) = filter.strip_suffix("/#") {
            // `/#` keeps one empty level: the prefix "" is a level, not the root.
            Self {
                levels: Some(prefix),
                multi: true,
            }
        } else {
            Self {
                levels: Some(filter),
                multi: false,
            }
        }
    }
}

/// The subscription router: a trie of topic filters.
///
/// `S` identifies a subscriber (a client-id key, cheap to clone and hash); `T` is the
/// per-subscription options data, cloned into each [`Delivery`].
///
/// A subscription is identified by its subscriber and its raw filter's extension and filter:
/// `a/b`, `$share/g/a/b`, `$exclusive/a/b` and `$limit/2/a/b` are four distinct
/// subscriptions of one subscriber; for `$limit` the `N` is not part of the identity.
///
/// Call order for a broker: [`Router::subscribe`] per SUBSCRIBE filter,
/// [`Router::unsubscribe`] per UNSUBSCRIBE filter and for each of a session's filters when the
/// session ends, [`Router::route`] per PUBLISH, [`Router::pick_shared`] when a delivery to a
/// shared member fails after routing.
#[derive(Debug, Clone)]
pub struct Router<S, T> {
    root: Node<S, T>,
    config: RouterConfig,
    hasher: FixedState,
    counts: Counts,
}

impl<S: Clone + Eq + Hash, T: Clone> Router<S, T> {
    pub fn new(config: RouterConfig) -> Self {
        let hasher = FixedState::with_seed(config.hash_seed);
        Self {
            root: Node::new(hasher),
            config,
            hasher,
            counts: Counts::default(),
        }
    }

    pub fn config(&self) -> &RouterConfig {
        &self.config
    }

    /// Number of subscriptions (each member of a shared group counts once).
    pub fn subscription_count(&self) -> usize {
        self.counts.subscriptions
    }

    /// Number of distinct topic filters (extension prefixes stripped) holding at least one
    /// subscription.
    pub fn filter_count(&self) -> usize {
        self.counts.filters
    }

    /// Number of trie nodes below the root; zero when there are no subscriptions.
    pub fn node_count(&self) -> usize {
        self.counts.nodes
    }

    /// A hash of a publisher's client id for [`PublishContext::publisher_hash`], stable for a
    /// given [`RouterConfig::hash_seed`].
    pub fn publisher_hash(&self, client_id: &str) -> u64 {
        self.hasher.hash_one(client_id)
    }

    /// Subscribes `subscriber` to the raw `filter` (extension prefix included) with `options`.
    ///
    /// Returns the options of the subscription this one replaces (same subscriber, same
    /// extension and filter), if any.
    ///
    /// Errors: the filter is malformed (see [`crate::parse_subscription`]);
    /// [`RouterError::ExclusiveHeld`] when another subscriber holds `$exclusive/f`;
    /// [`RouterError::LimitReached`] when `$limit/N/f` already has `N` or more other
    /// subscribers (counted across all `N`s used for `f`); [`RouterError::SubscriptionsFull`].
    /// A refused subscribe changes nothing.
    pub fn subscribe(
        &mut self,
        subscriber: S,
        filter: &str,
        options: T,
    ) -> Result<Option<T>, RouterError> {
        self.insert_subscription(subscriber, filter, options, true)
    }

    /// [`Router::subscribe`] for a subscription another router already admitted: the
    /// `$exclusive/` and `$limit/N/` checks are skipped, since the admitting router counted
    /// it (a node's shards hold a wildcard filter each, and its home shard decides, see
    /// [`crate::ShardMap`]). An `$exclusive/` slot held by someone else passes to
    /// `subscriber`: the home admitted it after the holder left, whose removal may still
    /// be on its way here. The node-wide cap still applies.
    pub fn subscribe_admitted(
        &mut self,
        subscriber: S,
        filter: &str,
        options: T,
    ) -> Result<Option<T>, RouterError> {
        self.insert_subscription(subscriber, filter, options, false)
    }

    fn insert_subscription(
        &mut self,
        subscriber: S,
        filter: &str,
        options: T,
        admit: bool,
    ) -> Result<Option<T>, RouterError> {
        let parsed = parse_subscription(filter, &self.config.limits)?;
        let path = FilterPath::of(parsed.filter);
        // Check before creating nodes, so that a refusal leaves no empty nodes behind.
        let existing = self.entries(path);
        let replaces = existing.is_some_and(|e| e.get(&subscriber, parsed.extension).is_some());
        if !replaces && self.counts.subscriptions >= self.config.subscriptions_max {
            return Err(RouterError::SubscriptionsFull {
                max: self.config.subscriptions_max,
            });
        }
        if let Some(e) = existing.filter(|_| admit) {
            e.admits(&subscriber, parsed.extension)?;
        }
        // An admitted `$exclusive/` replaces a holder whose removal has not arrived: one
        // subscription for another, the count unchanged.
        let evicts = !admit
            && parsed.extension == Extension::Exclusive
            && existing
                .and_then(|e| e.exclusive.as_ref())
                .is_some_and(|(holder, _)| *holder != subscriber);

        let hasher = self.hasher;
        let counts = &mut self.counts;
        let mut node = &mut self.root;
        let mut rest = path.levels;
        while let Some(r) = rest {
            let (level, next) = split_level(r);
            rest = next;
            node = if level == "+" {
                node.plus.get_or_insert_with(|| {
                    counts.nodes += 1;
                    Box::new(Node::new(hasher))
                })
            } else {
                node.children.entry_ref(level).or_insert_with(|| {
                    counts.nodes += 1;
                    Node::new(hasher)
                })
            };
        }
        let entries = node.slot(path.multi).get_or_insert_with(|| {
            counts.filters += 1;
            Box::new(Entries::new(hasher))
        });
        let old = entries.insert(
            subscriber,
            parsed.extension,
            parsed.filter,
            options,
            hasher,
            admit,
        );
        if old.is_none() && !evicts {
            counts.subscriptions += 1;
        }
        Ok(old)
    }

    /// Removes the subscription of `subscriber` to the raw `filter`, returning its options, or
    /// `Ok(None)` if there was none. Releases an `$exclusive` hold and a `$limit` place.
    /// Trie nodes left without subscriptions are freed.
    ///
    /// Errors: the filter is malformed.
    pub fn unsubscribe(&mut self, subscriber: &S, filter: &str) -> Result<Option<T>, RouterError> {
        let parsed = parse_subscription(filter, &self.config.limits)?;
        let path = FilterPath::of(parsed.filter);
        let old = remove_at(
            &mut self.root,
            path,
            subscriber,
            parsed.extension,
            &mut self.counts,
        );
        if old.is_some() {
            self.counts.subscriptions -= 1;
        }
        Ok(old)
    }

    /// The options of `subscriber`'s subscription to the raw `filter`, if it exists.
    ///
    /// Errors: the filter is malformed.
    pub fn get(&self, subscriber: &S, filter: &str) -> Result<Option<&T>, RouterError> {
        let parsed = parse_subscription(filter, &self.config.limits)?;
        Ok(self
            .entries(FilterPath::of(parsed.filter))
            .and_then(|e| e.get(subscriber, parsed.extension)))
    }

    /// The members of the shared group `group` on the topic `filter` (prefix stripped, as in
    /// [`DeliveryKind::Shared`]), in rotation order.
    pub fn shared_members(&self, group: &str, filter: &str) -> impl Iterator<Item = (&S, &T)> {
        self.entries(FilterPath::of(filter))
            .and_then(|e| e.shared.get(group))
            .into_iter()
            .flat_map(|g| g.members())
    }

    /// Appends to `out` one [`Delivery`] per subscription matching the topic name `topic`:
    /// every plain, exclusive and limited subscription, and one member per shared group.
    ///
    /// `accept` is asked about shared members only (e.g. "is this session connected and not
    /// over its inflight cap?"): the strategy's choice is delivered if accepted, else the next
    /// members in order are tried; if none is accepted the first choice is delivered with
    /// `accepted: false`. Pass `|_| true` to take the strategy's choice as is.
    ///
    /// `topic` must be a valid topic name ([`crate::validate_topic_name`]); anything else
    /// gives unspecified matches but no panic. Wildcards never match a first level starting
    /// with `$` (MQTT 5 §4.7.2). A subscriber with overlapping filters gets one delivery per
    /// matching subscription (MQTT 5 §3.3.4 lets the server choose; the caller may merge).
    /// Deliveries come in a deterministic order given the seed and the operations so far.
    ///
    /// Returns how many non-shared subscriber sets (the plain, exclusive or limited
    /// subscriptions of one filter) yielded deliveries: within one set a subscriber appears
    /// once, so with 0 or 1 the non-shared deliveries name distinct subscribers and there
    /// is nothing to merge.
    pub fn route(
        &mut self,
        topic: &str,
        ctx: &PublishContext,
        mut accept: impl FnMut(&S) -> bool,
        out: &mut Vec<Delivery<S, T>>,
    ) -> usize {
        let mut picker = Picker {
            strategy: self.config.shared_strategy,
            ctx,
            groups: 0,
            sources: 0,
            accept: &mut accept,
        };
        // MQTT 5 §4.7.2: `#` and `+` at the first level do not match `$` topics.
        let shield = topic.starts_with('$');
        walk(&mut self.root, Some(topic), shield, &mut picker, out);
        picker.sources
    }

    /// [`Router::route`] into a new vector, every shared choice taken.
    pub fn matches(&mut self, topic: &str, ctx: &PublishContext) -> Vec<Delivery<S, T>> {
        let mut out = Vec::new();
        let _ = self.route(topic, ctx, |_| true, &mut out);
        out
    }

    /// Picks again in the shared group `group` on topic filter `filter` (as reported in
    /// [`DeliveryKind::Shared`]), for when a delivery to the routed member failed. Members are
    /// tried in the strategy's order; returns the first that `accept` takes (the caller
    /// excludes the members that failed), or `None` if none does or the group is gone. The
    /// group's rotation or sticky member moves as for a routed publish.
    pub fn pick_shared(
        &mut self,
        group: &str,
        filter: &str,
        ctx: &PublishContext,
        mut accept: impl FnMut(&S) -> bool,
    ) -> Option<(S, T)> {
        let strategy = self.config.shared_strategy;
        let g = self
            .entries_mut(FilterPath::of(filter))?
            .shared
            .get_mut(group)?;
        let pick = g.pick(strategy, mix(ctx.random), ctx.publisher_hash, &mut accept)?;
        if !pick.accepted {
            return None;
        }
        Some(g.member(pick.index).clone())
    }

    fn entries(&self, path: FilterPath<'_>) -> Option<&Entries<S, T>> {
        let mut node = &self.root;
        let mut rest = path.levels;
        while let Some(r) = rest {
            let (level, next) = split_level(r);
            rest = next;
            node = if level == "+" {
                node.plus.as_deref()?
            } else {
                node.children.get(level)?
            };
        }
        if path.multi {
            node.multi.as_deref()
        } else {
            node.exact.as_deref()
        }
    }

    fn entries_mut(&mut self, path: FilterPath<'_>) -> Option<&mut Entries<S, T>> {
        let mut node = &mut self.root;
        let mut rest = path.levels;
        while let Some(r) = rest {
            let (level, next) = split_level(r);
            rest = next;
            node = if level == "+" {
                node.plus.as_deref_mut()?
            } else {
                node.children.get_mut(level)?
            };
        }
        node.slot(path.multi).as_deref_mut()
    }
}

/// Removes a subscription below `node`, freeing entries and nodes it leaves empty. Recursion
/// depth is bounded by the filter's levels, which the level cap bounds.
fn remove_at<S: Clone + Eq + Hash, T: Clone>(
    node: &mut Node<S, T>,
    path: FilterPath<'_>,
    subscriber: &S,
    extension: Extension<'_>,
    counts: &mut Counts,
) -> Option<T> {
    let Some(rest) = path.levels else {
        let slot = node.slot(path.multi);
        let entries = slot.as_mut()?;
        let old = entries.remove(subscriber, extension)?;
        if entries.is_empty() {
            *slot = None;
            counts.filters -= 1;
        }
        return Some(old);
    };
    let (level, next) = split_level(rest);
    let path = FilterPath {
        levels: next,
        multi: path.multi,
    };
    if level == "+" {
        let child = node.plus.as_deref_mut()?;
        let old = remove_at(child, path, subscriber, extension, counts)?;
        if child.is_empty() {
            node.plus = None;
            counts.nodes -= 1;
        }
        Some(old)
    } else {
        let child = node.children.get_mut(level)?;
        let old = remove_at(child, path, subscriber, extension, counts)?;
        if child.is_empty() {
            node.children.remove(level);
            counts.nodes -= 1;
        }
        Some(old)
    }
}

/// Collects deliveries for the topic levels `rest` (`None`: all levels consumed) below `node`.
/// `shield` is set at the root of a `$` topic, where wildcards do not match. The topic is
/// split lazily, one level per step, without allocating. Recursion depth is bounded by the
/// trie's depth, which the level cap bounds.
fn walk<S: Clone + Eq + Hash, T: Clone>(
    node: &mut Node<S, T>,
    rest: Option<&str>,
    shield: bool,
    picker: &mut Picker<'_, S>,
    out: &mut Vec<Delivery<S, T>>,
) {
    let Some(rest) = rest else {
        if let Some(e) = node.exact.as_deref_mut() {
            e.deliver(picker, out);
        }
        // `a/#` matches `a` (MQTT 5 §4.7.1.2).
        if let Some(e) = node.multi.as_deref_mut() {
            e.deliver(picker, out);
        }
        return;
    };
    if !shield {
        if let Some(e) = node.multi.as_deref_mut() {
            e.deliver(picker, out);
        }
    }
    let (level, next) = split_level(rest);
    if let Some(child) = node.children.get_mut(level) {
        walk(child, next, false, picker, out);
    }
    if !shield {
        if let Some(child) = node.plus.as_deref_mut() {
            walk(child, next, false, picker, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type R = Router<u32, &'static str>;

    fn router() -> R {
        Router::new(RouterConfig::default())
    }

    fn with_strategy(shared_strategy: SharedStrategy) -> R {
        Router::new(RouterConfig {
            shared_strategy,
            ..RouterConfig::default()
        })
    }

    fn subscribers(r: &mut R, topic: &str) -> Vec<u32> {
        let mut s: Vec<u32> = r
            .matches(topic, &PublishContext::default())
            .into_iter()
            .map(|d| d.subscriber)
            .collect();
        s.sort_unstable();
        s
    }

    fn shared_pick(r: &mut R, topic: &str, ctx: &PublishContext) -> u32 {
        let d = r.matches(topic, ctx);
        assert_eq!(d.len(), 1, "one shared group, one delivery");
        d[0].subscriber
    }

    #[test]
    fn plus_does_not_match_dollar_topics_at_first_level() {
        let mut r = router();
        r.subscribe(1, "+/x", "").unwrap();
        r.subscribe(2, "+", "").unwrap();
        assert_eq!(subscribers(&mut r, "$SYS/x"), Vec::<u32>::new());
        assert_eq!(subscribers(&mut r, "$SYS"), Vec::<u32>::new());
        assert_eq!(subscribers(&mut r, "SYS/x"), vec![1]);
    }

    #[test]
    fn hash_does_not_match_dollar_topics_at_first_level() {
        let mut r = router();
        r.subscribe(1, "#", "").unwrap();
        r.subscribe(2, "$share/g/#", "").unwrap();
        assert_eq!(subscribers(&mut r, "$SYS/broker/load"), Vec::<u32>::new());
        assert_eq!(subscribers(&mut r, "a"), vec![1, 2]);
    }

    #[test]
    fn dollar_filters_match_dollar_topics() {
        let mut r = router();
        r.subscribe(1, "$SYS/#", "").unwrap();
        r.subscribe(2, "$SYS/+", "").unwrap();
        assert_eq!(subscribers(&mut r, "$SYS/x"), vec![1, 2]);
        assert_eq!(subscribers(&mut r, "$SYS"), vec![1]);
    }

    #[test]
    fn wildcards_below_first_level_match_dollar_levels() {
        let mut r = router();
        r.subscribe(1, "a/+", "").unwrap();
        r.subscribe(2, "a/#", "").unwrap();
        assert_eq!(subscribers(&mut r, "a/$x"), vec![1, 2]);
    }

    #[test]
    fn hash_matches_parent_level() {
        let mut r = router();
        r.subscribe(1, "a/#", "").unwrap();
        r.subscribe(2, "a/b/#", "").unwrap();
        assert_eq!(subscribers(&mut r, "a"), vec![1]);
        assert_eq!(subscribers(&mut r, "a/b"), vec![1, 2]);
        assert_eq!(subscribers(&mut r, "a/b/c/d"), vec![1, 2]);
        assert_eq!(subscribers(&mut r, "b"), Vec::<u32>::new());
    }

    #[test]
    fn plus_matches_empty_level_but_not_missing_level() {
        let mut r = router();
        r.subscribe(1, "a/+", "").unwrap();
        r.subscribe(2, "+/+", "").unwrap();
        r.subscribe(3, "/#", "").unwrap();
        assert_eq!(subscribers(&mut r, "a/"), vec![1, 2]);
        assert_eq!(subscribers(&mut r, "a"), Vec::<u32>::new());
        assert_eq!(subscribers(&mut r, "/"), vec![2, 3]);
        assert_eq!(subscribers(&mut r, "/x/y"), vec![3]);
    }

    #[test]
    fn subscribe_replaces_same_subscriber_and_filter() {
        let mut r = router();
        assert_eq!(r.subscribe(1, "a/b", "qos0"), Ok(None));
        assert_eq!(r.subscribe(1, "a/b", "qos1"), Ok(Some("qos0")));
        assert_eq!(r.subscription_count(), 1);
        let d = r.matches("a/b", &PublishContext::default());
        assert_eq!(
            d,
            vec![Delivery {
                subscriber: 1,
                options: "qos1",
                kind: DeliveryKind::Plain
            }]
        );
    }

    #[test]
    fn extensions_on_one_filter_are_distinct_subscriptions() {
        let mut r = router();
        r.subscribe(1, "a", "plain").unwrap();
        r.subscribe(1, "$share/g/a", "shared").unwrap();
        r.subscribe(1, "$exclusive/a", "excl").unwrap();
        r.subscribe(1, "$limit/2/a", "lim").unwrap();
        assert_eq!(r.subscription_count(), 4);
        assert_eq!(r.filter_count(), 1);
        let mut kinds: Vec<&str> = r
            .matches("a", &PublishContext::default())
            .into_iter()
            .map(|d| d.options)
            .collect();
        kinds.sort_unstable();
        assert_eq!(kinds, vec!["excl", "lim", "plain", "shared"]);
        assert_eq!(r.unsubscribe(&1, "$share/g/a"), Ok(Some("shared")));
        assert_eq!(r.get(&1, "a"), Ok(Some(&"plain")));
        assert_eq!(r.get(&1, "$share/g/a"), Ok(None));
    }

    #[test]
    fn unsubscribe_prunes_empty_nodes() {
        let mut r = router();
        let filters = [
            "a/b/c",
            "a/+/c",
            "a/#",
            "#",
            "+",
            "/#",
            "$share/g/a/b",
            "$exclusive/x/y/z",
        ];
        for round in 0..3 {
            for (i, f) in filters.iter().enumerate() {
                r.subscribe(i as u32 + round, f, "").unwrap();
            }
            assert_eq!(r.filter_count(), filters.len());
            assert!(r.node_count() > 0);
            for (i, f) in filters.iter().enumerate() {
                assert_eq!(r.unsubscribe(&(i as u32 + round), f), Ok(Some("")));
            }
            assert_eq!(
                (r.subscription_count(), r.filter_count(), r.node_count()),
                (0, 0, 0)
            );
            assert!(r.root.is_empty());
        }
    }

    #[test]
    fn unsubscribe_of_unknown_subscription_returns_none() {
        let mut r = router();
        r.subscribe(1, "a/b", "").unwrap();
        assert_eq!(r.unsubscribe(&2, "a/b"), Ok(None));
        assert_eq!(r.unsubscribe(&1, "a/c"), Ok(None));
        assert_eq!(r.unsubscribe(&1, "a/b/c"), Ok(None));
        assert_eq!(r.unsubscribe(&1, "$share/g/a/b"), Ok(None));
        assert_eq!(
            r.unsubscribe(&1, "a/#/b"),
            Err(RouterError::HashNotLast { level: 1 })
        );
        assert_eq!(r.subscription_count(), 1);
    }

    #[test]
    fn exclusive_refuses_second_subscriber() {
        let mut r = router();
        assert_eq!(r.subscribe(1, "$exclusive/a/+", "first"), Ok(None));
        assert_eq!(
            r.subscribe(2, "$exclusive/a/+", "second"),
            Err(RouterError::ExclusiveHeld)
        );
        assert_eq!(r.subscription_count(), 1);
        assert_eq!(
            r.matches("a/b", &PublishContext::default()),
            vec![Delivery {
                subscriber: 1,
                options: "first",
                kind: DeliveryKind::Exclusive
            }]
        );
    }

    #[test]
    fn exclusive_holder_may_resubscribe() {
        let mut r = router();
        r.subscribe(1, "$exclusive/a", "old").unwrap();
        assert_eq!(r.subscribe(1, "$exclusive/a", "new"), Ok(Some("old")));
    }

    #[test]
    fn exclusive_released_by_unsubscribe() {
        let mut r = router();
        r.subscribe(1, "$exclusive/a", "").unwrap();
        assert_eq!(
            r.unsubscribe(&2, "$exclusive/a"),
            Ok(None),
            "only the holder releases"
        );
        assert_eq!(
            r.subscribe(2, "$exclusive/a", ""),
            Err(RouterError::ExclusiveHeld)
        );
        assert_eq!(r.unsubscribe(&1, "$exclusive/a"), Ok(Some("")));
        assert_eq!(r.subscribe(2, "$exclusive/a", ""), Ok(None));
    }

    #[test]
    fn refused_subscribe_leaves_trie_unchanged() {
        let mut r = router();
        r.subscribe(1, "$exclusive/a/b/c", "").unwrap();
        let nodes = r.node_count();
        assert!(r.subscribe(2, "$exclusive/a/b/c", "").is_err());
        assert!(r.subscribe(2, "a/#/c", "").is_err());
        assert_eq!(
            (r.node_count(), r.filter_count(), r.subscription_count()),
            (nodes, 1, 1)
        );
    }

    #[test]
    fn limit_refuses_subscriber_past_n() {
        let mut r = router();
        assert_eq!(r.subscribe(1, "$limit/2/a", ""), Ok(None));
        assert_eq!(r.subscribe(2, "$limit/2/a", ""), Ok(None));
        assert_eq!(
            r.subscribe(3, "$limit/2/a", ""),
            Err(RouterError::LimitReached { current: 2, max: 2 })
        );
        // A member re-subscribing is a replacement, not a new place.
        assert_eq!(r.subscribe(2, "$limit/2/a", "again"), Ok(Some("")));
        // A larger N admits against the same count.
        assert_eq!(r.subscribe(3, "$limit/3/a", ""), Ok(None));
        assert_eq!(subscribers(&mut r, "a"), vec![1, 2, 3]);
    }

    #[test]
    fn limit_place_freed_by_unsubscribe() {
        let mut r = router();
        r.subscribe(1, "$limit/1/a", "").unwrap();
        assert!(r.subscribe(2, "$limit/1/a", "").is_err());
        assert_eq!(
            r.unsubscribe(&1, "$limit/7/a"),
            Ok(Some("")),
            "N is not part of the identity"
        );
        assert_eq!(r.subscribe(2, "$limit/1/a", ""), Ok(None));
    }

    #[test]
    fn shared_round_robin_rotates_members() {
        let mut r = with_strategy(SharedStrategy::RoundRobin);
        for s in [1, 2, 3] {
            r.subscribe(s, "$share/g/a/+", "").unwrap();
        }
        let ctx = PublishContext::default();
        let picks: Vec<u32> = (0..6).map(|_| shared_pick(&mut r, "a/b", &ctx)).collect();
        assert_eq!(picks, vec![1, 2, 3, 1, 2, 3]);
    }

    #[test]
    fn shared_delivers_one_member_per_group() {
        let mut r = router();
        for s in [1, 2, 3] {
            r.subscribe(s, "$share/g1/a", "").unwrap();
        }
        for s in [4, 5] {
            r.subscribe(s, "$share/g2/a", "").unwrap();
            // Same group name, other filter: another shared subscription (MQTT 5 §4.8.2).
            r.subscribe(s, "$share/g2/+", "").unwrap();
        }
        r.subscribe(6, "a", "").unwrap();
        for _ in 0..5 {
            let d = r.matches("a", &PublishContext::default());
            let count =
                |pred: &dyn Fn(u32) -> bool| d.iter().filter(|d| pred(d.subscriber)).count();
            assert_eq!(d.len(), 4);
            assert_eq!(count(&|s| (1..=3).contains(&s)), 1);
            assert_eq!(count(&|s| (4..=5).contains(&s)), 2);
            assert_eq!(count(&|s| s == 6), 1);
        }
    }

    #[test]
    fn shared_random_follows_caller_draw() {
        let mut r = with_strategy(SharedStrategy::Random);
        for s in 0..4 {
            r.subscribe(s, "$share/g/a", "").unwrap();
        }
        let mut seen = [false; 4];
        for random in 0..64 {
            let ctx = PublishContext {
                random,
                publisher_hash: 0,
            };
            let first = shared_pick(&mut r, "a", &ctx);
            assert_eq!(
                shared_pick(&mut r, "a", &ctx),
                first,
                "same draw, same member"
            );
            seen[first as usize] = true;
        }
        assert_eq!(seen, [true; 4]);
    }

    #[test]
    fn shared_sticky_keeps_member_until_it_leaves() {
        let mut r = with_strategy(SharedStrategy::Sticky);
        for s in [1, 2, 3] {
            r.subscribe(s, "$share/g/a", "").unwrap();
        }
        let ctx = PublishContext::default();
        let first = shared_pick(&mut r, "a", &ctx);
        for _ in 0..5 {
            assert_eq!(shared_pick(&mut r, "a", &ctx), first);
        }
        r.unsubscribe(&first, "$share/g/a").unwrap();
        let second = shared_pick(&mut r, "a", &ctx);
        assert_ne!(second, first);
        for _ in 0..5 {
            assert_eq!(shared_pick(&mut r, "a", &ctx), second);
        }
    }

    #[test]
    fn shared_publisher_hash_keeps_publisher_on_one_member() {
        let mut r = with_strategy(SharedStrategy::PublisherHash);
        for s in 0..8 {
            r.subscribe(s, "$share/g/a", "").unwrap();
        }
        let mut seen = std::collections::BTreeSet::new();
        for publisher in ["alice", "bob", "carol", "dave", "erin", "frank"] {
            let ctx = PublishContext {
                random: 0,
                publisher_hash: r.publisher_hash(publisher),
            };
            let member = shared_pick(&mut r, "a", &ctx);
            for _ in 0..3 {
                assert_eq!(shared_pick(&mut r, "a", &ctx), member);
            }
            seen.insert(member);
        }
        assert!(seen.len() > 1, "publishers spread over members");
    }

    #[test]
    fn shared_skips_members_the_caller_refuses() {
        let mut r = router();
        for s in [1, 2, 3] {
            r.subscribe(s, "$share/g/a", "").unwrap();
        }
        let online = |s: &u32| *s != 2;
        let mut out = Vec::new();
        for _ in 0..4 {
            r.route("a", &PublishContext::default(), online, &mut out);
        }
        let picks: Vec<u32> = out.iter().map(|d| d.subscriber).collect();
        assert_eq!(picks, vec![1, 3, 1, 3]);
        assert!(out
            .iter()
            .all(|d| matches!(d.kind, DeliveryKind::Shared { accepted: true, .. })));
    }

    #[test]
    fn shared_with_no_accepted_member_delivers_first_choice_flagged() {
        let mut r = router();
        r.subscribe(1, "$share/g/a/#", "").unwrap();
        let mut out = Vec::new();
        r.route("a/b", &PublishContext::default(), |_| false, &mut out);
        assert_eq!(
            out,
            vec![Delivery {
                subscriber: 1,
                options: "",
                kind: DeliveryKind::Shared {
                    group: "g".into(),
                    filter: "a/#".into(),
                    accepted: false
                },
            }]
        );
    }

    #[test]
    fn pick_shared_finds_another_member_after_failed_delivery() {
        let mut r = router();
        for s in [1, 2] {
            r.subscribe(s, "$share/g/a/+", "").unwrap();
        }
        let d = r.matches("a/b", &PublishContext::default()).remove(0);
        let DeliveryKind::Shared { group, filter, .. } = d.kind else {
            panic!("expected a shared delivery, got {:?}", d.kind);
        };
        let failed = d.subscriber;
        let other = r.pick_shared(&group, &filter, &PublishContext::default(), |s| {
            *s != failed
        });
        assert_eq!(other.map(|(s, _)| s), Some(3 - failed));
        assert_eq!(
            r.pick_shared(&group, &filter, &PublishContext::default(), |_| false),
            None
        );
        assert_eq!(
            r.pick_shared("nope", &filter, &PublishContext::default(), |_| true),
            None
        );
    }

    #[test]
    fn queue_is_an_alias_of_share_group_queue() {
        let mut r = router();
        r.subscribe(1, "$queue/a", "").unwrap();
        assert_eq!(r.subscribe(1, "$share/$queue/a", "x"), Ok(Some("")));
        assert_eq!(r.shared_members(crate::QUEUE_GROUP, "a").count(), 1);
    }

    #[test]
    fn subscription_cap_refuses_new_but_allows_replace() {
        let mut r: R = Router::new(RouterConfig {
            subscriptions_max: 2,
            ..RouterConfig::default()
        });
        r.subscribe(1, "a", "").unwrap();
        r.subscribe(2, "a", "").unwrap();
        assert_eq!(
            r.subscribe(3, "a", ""),
            Err(RouterError::SubscriptionsFull { max: 2 })
        );
        assert_eq!(r.subscribe(2, "a", "x"), Ok(Some("")));
        r.unsubscribe(&1, "a").unwrap();
        assert_eq!(r.subscribe(3, "a", ""), Ok(None));
    }

    #[test]
    fn same_operations_and_seed_give_same_delivery_order() {
        let build = || {
            let mut r = router();
            for s in 0..200u32 {
                r.subscribe(s, ["a/+", "#", "a/b", "$share/g/a/b"][s as usize % 4], "")
                    .unwrap();
            }
            r
        };
        let (mut a, mut b) = (build(), build());
        for _ in 0..3 {
            assert_eq!(
                a.matches("a/b", &PublishContext::default()),
                b.matches("a/b", &PublishContext::default())
            );
        }
    }

    #[test]
    fn topic_with_too_many_levels_routes_without_panic() {
        let mut r = router();
        r.subscribe(1, "#", "").unwrap();
        let deep = "x/".repeat(10_000);
        assert_eq!(subscribers(&mut r, &deep), vec![1]);
    }

    #[test]
    fn an_admitted_exclusive_takes_the_slot_and_keeps_the_count() {
        let mut r = router();
        r.subscribe(1, "$exclusive/a/#", "one").unwrap();
        assert_eq!(
            r.subscribe(2, "$exclusive/a/#", "two"),
            Err(RouterError::ExclusiveHeld)
        );
        // Admitted elsewhere after 1 left; 1's removal has not arrived here yet.
        assert_eq!(r.subscribe_admitted(2, "$exclusive/a/#", "two"), Ok(None));
        assert_eq!(r.subscription_count(), 1);
        assert_eq!(subscribers(&mut r, "a/x"), vec![2]);
        // 1's late removal leaves 2 in place.
        assert_eq!(r.unsubscribe(&1, "$exclusive/a/#"), Ok(None));
        assert_eq!(subscribers(&mut r, "a/x"), vec![2]);
        assert_eq!(r.unsubscribe(&2, "$exclusive/a/#"), Ok(Some("two")));
        assert_eq!(r.subscription_count(), 0);
    }

    #[test]
    fn an_admitted_limit_is_installed_past_its_count() {
        let mut r = router();
        r.subscribe(1, "$limit/1/a/+", "one").unwrap();
        assert!(r.subscribe(2, "$limit/1/a/+", "two").is_err());
        assert_eq!(r.subscribe_admitted(2, "$limit/1/a/+", "two"), Ok(None));
        assert_eq!(subscribers(&mut r, "a/x"), vec![1, 2]);
    }
}
