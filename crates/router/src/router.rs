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
    /// Of `filters`, those with a wildcard (which a sharded node holds on every shard).
    wild_filters: usize,
    nodes: usize,
}

/// Where a topic filter lives in the trie: the levels of its path (`None`: the root) and
/// whether it ends in `#`.
#[derive(Debug, Clone, Copy)]
struct FilterPath<'a> {
    levels: Option<&'a str>,
    multi: bool,
    /// Whether the filter has a wildcard (`#`, or a `+` level).
    wild: bool,
}

impl<'a> FilterPath<'a> {
    fn of(filter: &'a str) -> Self {
        if filter == "#" {
            Self {
                levels: None,
                multi: true,
                wild: true,
            }
        } else if let Some(prefix) = filter.strip_suffix("/#") {
            // `/#` keeps one empty level: the prefix "" is a level, not the root.
            Self {
                levels: Some(prefix),
                multi: true,
                wild: true,
            }
        } else {
            Self {
                levels: Some(filter),
                multi: false,
                wild: filter.split('/').any(|l| l == "+"),
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

    /// Of [`Router::filter_count`], the filters with a wildcard.
    pub fn wildcard_filter_count(&self) -> usize {
        self.counts.wild_filters
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
    ///
    /// Returns what [`Router::subscribe`] does, and the holder whose `$exclusive/`
    /// subscription this one took the place of, if any: it no longer has it (its removal,
    /// when it comes, finds nothing).
    pub fn subscribe_admitted(
        &mut self,
        subscriber: S,
        filter: &str,
        options: T,
    ) -> Result<(Option<T>, Option<S>), RouterError> {
        let parsed = parse_subscription(filter, &self.config.limits)?;
        let evicted = match parsed.extension {
            Extension::Exclusive => self
                .entries(FilterPath::of(parsed.filter))
                .and_then(|e| e.exclusive.as_ref())
                .map(|(holder, _)| holder.clone())
                .filter(|holder| *holder != subscriber),
            _ => None,
        };
        let old = self.insert_subscription(subscriber, filter, options, false)?;
        Ok((old, evicted))
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
            counts.wild_filters += usize::from(path.wild);
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
            counts.wild_filters -= usize::from(path.wild);
        }
        return Some(old);
    };
    let (level, next) = split_level(rest);
    let path = FilterPath {
        levels: next,
        ..path
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
#[path = "router_tests.rs"]
mod tests;
