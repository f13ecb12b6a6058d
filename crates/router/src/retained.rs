//! The retained-message index: one message per topic name, looked up by topic filter.

use crate::topic::{split_level, validate_topic_filter, validate_topic_name, TopicLimits};
use crate::{FixedState, Map, RouterError};

/// The retained index's validated configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetainedConfig {
    pub limits: TopicLimits,
    /// Cap on retained topics; past it new topics are refused with
    /// [`RouterError::RetainedFull`] (replacing or removing is still allowed).
    pub retained_max: usize,
    /// Cap on the sum of the sizes the caller gave for the stored messages, in bytes.
    pub retained_bytes_max: usize,
    /// Seed of the index's hash maps (see [`crate::RouterConfig::hash_seed`]).
    pub hash_seed: u64,
}

impl Default for RetainedConfig {
    fn default() -> Self {
        Self {
            limits: TopicLimits::default(),
            retained_max: 1_000_000,
            retained_bytes_max: 1 << 30,
            hash_seed: 0,
        }
    }
}

#[derive(Debug, Clone)]
struct Stored<M> {
    topic: Box<str>,
    size_bytes: usize,
    message: M,
}

#[derive(Debug, Clone)]
struct Node<M> {
    children: Map<Box<str>, Node<M>>,
    value: Option<Box<Stored<M>>>,
}

impl<M> Node<M> {
    fn new(hasher: FixedState) -> Self {
        Self {
            children: Map::with_hasher(hasher),
            value: None,
        }
    }

    fn is_empty(&self) -> bool {
        self.children.is_empty() && self.value.is_none()
    }
}

/// Retained messages by topic name, generic over the message type `M`.
///
/// Whether a publish stores or clears (MQTT 5 §3.3.1.3: an empty retained payload removes
/// the topic's message) is the caller's call: [`RetainedIndex::retain`] stores,
/// [`RetainedIndex::remove`] clears.
#[derive(Debug, Clone)]
pub struct RetainedIndex<M> {
    root: Node<M>,
    config: RetainedConfig,
    hasher: FixedState,
    count: usize,
    bytes: usize,
    nodes: usize,
}

impl<M> RetainedIndex<M> {
    pub fn new(config: RetainedConfig) -> Self {
        let hasher = FixedState::with_seed(config.hash_seed);
        Self {
            root: Node::new(hasher),
            config,
            hasher,
            count: 0,
            bytes: 0,
            nodes: 0,
        }
    }

    pub fn config(&self) -> &RetainedConfig {
        &self.config
    }

    /// Number of retained topics.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Sum of the sizes given for the stored messages, in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Number of trie nodes below the root; zero when the index is empty.
    pub fn node_count(&self) -> usize {
        self.nodes
    }

    /// Stores `message` as the retained message of `topic`, accounting it as `size_bytes`
    /// (the caller's measure, e.g. payload plus properties). Returns the message it replaces.
    ///
    /// Errors: `topic` is not a valid topic name; [`RouterError::RetainedFull`] for a new
    /// topic when [`RetainedConfig::retained_max`] topics are stored;
    /// [`RouterError::RetainedBytesFull`] when the byte total would pass its cap. A refusal
    /// changes nothing.
    pub fn retain(
        &mut self,
        topic: &str,
        message: M,
        size_bytes: usize,
    ) -> Result<Option<M>, RouterError> {
        validate_topic_name(topic, &self.config.limits)?;
        let old_size = self.find(topic).map(|s| s.size_bytes);
        if old_size.is_none() && self.count >= self.config.retained_max {
            return Err(RouterError::RetainedFull {
                max: self.config.retained_max,
            });
        }
        let bytes = (self.bytes - old_size.unwrap_or(0)).saturating_add(size_bytes);
        if bytes > self.config.retained_bytes_max {
            return Err(RouterError::RetainedBytesFull {
                bytes,
                max: self.config.retained_bytes_max,
            });
        }

        let hasher = self.hasher;
        let nodes = &mut self.nodes;
        let mut node = &mut self.root;
        let mut rest = Some(topic);
        while let Some(r) = rest {
            let (level, next) = split_level(r);
            rest = next;
            node = node.children.entry_ref(level).or_insert_with(|| {
                *nodes += 1;
                Node::new(hasher)
            });
        }
        let stored = Box::new(Stored {
            topic: topic.into(),
            size_bytes,
            message,
        });
        let old = node.value.replace(stored).map(|s| s.message);
        if old.is_none() {
            self.count += 1;
        }
        self.bytes = bytes;
        Ok(old)
    }

    /// A retained PUBLISH, as MQTT rules it (MQTT 5 §3.3.1.3): an empty payload removes the
    /// topic's retained message (and is not stored); any other payload replaces it, as
    /// [`RetainedIndex::retain`] does. Returns the message it replaces or removes.
    ///
    /// Errors: those of [`RetainedIndex::retain`], for a non-empty payload only.
    pub fn publish(
        &mut self,
        topic: &str,
        message: M,
        payload_empty: bool,
        size_bytes: usize,
    ) -> Result<Option<M>, RouterError> {
        if payload_empty {
            return Ok(self.remove(topic));
        }
        self.retain(topic, message, size_bytes)
    }

    /// Removes the retained message of `topic`, returning it; `None` if there was none
    /// (including for strings that are not valid topic names). Frees nodes left empty.
    pub fn remove(&mut self, topic: &str) -> Option<M> {
        let stored = remove_at(&mut self.root, topic, &mut self.nodes)?;
        self.count -= 1;
        self.bytes -= stored.size_bytes;
        Some(stored.message)
    }

    /// The retained message of `topic`.
    pub fn get(&self, topic: &str) -> Option<&M> {
        self.find(topic).map(|s| &s.message)
    }

    fn find(&self, topic: &str) -> Option<&Stored<M>> {
        let mut node = &self.root;
        let mut rest = Some(topic);
        while let Some(r) = rest {
            let (level, next) = split_level(r);
            rest = next;
            node = node.children.get(level)?;
        }
        node.value.as_deref()
    }

    /// The retained messages whose topic matches the topic filter `filter` (plain: without
    /// `$share/` or other extension prefix; MQTT 5 §3.8.4 sends no retained messages for
    /// shared subscriptions). Wildcards do not match a first level starting with `$`
    /// (MQTT 5 §4.7.2); `a/#` matches `a`. The iterator is lazy: it walks only the matching
    /// part of the trie; its order is deterministic given the seed and operations so far.
    ///
    /// Errors: `filter` is not a valid topic filter.
    pub fn matching<'a>(&'a self, filter: &'a str) -> Result<RetainedMatches<'a, M>, RouterError> {
        validate_topic_filter(filter, &self.config.limits)?;
        Ok(RetainedMatches {
            stack: vec![Task::Match {
                node: &self.root,
                rest: Some(filter),
                root: true,
            }],
        })
    }
}

fn remove_at<M>(node: &mut Node<M>, rest: &str, nodes: &mut usize) -> Option<Box<Stored<M>>> {
    let (level, next) = split_level(rest);
    let child = node.children.get_mut(level)?;
    let stored = match next {
        None => child.value.take()?,
        Some(next) => remove_at(child, next, nodes)?,
    };
    if child.is_empty() {
        node.children.remove(level);
        *nodes -= 1;
    }
    Some(stored)
}

type Children<'a, M> = hashbrown::hash_map::Iter<'a, Box<str>, Node<M>>;

/// Pending work of a [`RetainedMatches`] walk.
enum Task<'a, M> {
    /// Match the filter levels `rest` (`None`: all consumed) from `node`.
    Match {
        node: &'a Node<M>,
        rest: Option<&'a str>,
        root: bool,
    },
    /// `+`: match `rest` from each remaining child.
    Plus {
        children: Children<'a, M>,
        rest: Option<&'a str>,
        skip_dollar: bool,
    },
    /// `#`: yield each remaining child and all its descendants.
    Subtree {
        children: Children<'a, M>,
        skip_dollar: bool,
    },
}

/// Iterator over `(topic, message)` pairs from [`RetainedIndex::matching`].
pub struct RetainedMatches<'a, M> {
    stack: Vec<Task<'a, M>>,
}

impl<'a, M> Iterator for RetainedMatches<'a, M> {
    type Item = (&'a str, &'a M);

    fn next(&mut self) -> Option<Self::Item> {
        while let Some(task) = self.stack.pop() {
            match task {
                Task::Match {
                    node, rest: None, ..
                } => {
                    if let Some(s) = node.value.as_deref() {
                        return Some((&s.topic, &s.message));
                    }
                }
                Task::Match {
                    node,
                    rest: Some(rest),
                    root,
                } => {
                    let (level, next) = split_level(rest);
                    match level {
                        "#" => {
                            self.stack.push(Task::Subtree {
                                children: node.children.iter(),
                                skip_dollar: root,
                            });
                            // `a/#` matches `a`; the root holds no message.
                            if let Some(s) = node.value.as_deref() {
                                return Some((&s.topic, &s.message));
                            }
                        }
                        "+" => self.stack.push(Task::Plus {
                            children: node.children.iter(),
                            rest: next,
                            skip_dollar: root,
                        }),
                        literal => {
                            if let Some(child) = node.children.get(literal) {
                                self.stack.push(Task::Match {
                                    node: child,
                                    rest: next,
                                    root: false,
                                });
                            }
                        }
                    }
                }
                Task::Plus {
                    mut children,
                    rest,
                    skip_dollar,
                } => {
                    if let Some((level, child)) = children.next() {
                        self.stack.push(Task::Plus {
                            children,
                            rest,
                            skip_dollar,
                        });
                        if !(skip_dollar && level.starts_with('$')) {
                            self.stack.push(Task::Match {
                                node: child,
                                rest,
                                root: false,
                            });
                        }
                    }
                }
                Task::Subtree {
                    mut children,
                    skip_dollar,
                } => {
                    if let Some((level, child)) = children.next() {
                        self.stack.push(Task::Subtree {
                            children,
                            skip_dollar,
                        });
                        if !(skip_dollar && level.starts_with('$')) {
                            self.stack.push(Task::Subtree {
                                children: child.children.iter(),
                                skip_dollar: false,
                            });
                            if let Some(s) = child.value.as_deref() {
                                return Some((&s.topic, &s.message));
                            }
                        }
                    }
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(topics: &[&'static str]) -> RetainedIndex<&'static str> {
        let mut r = RetainedIndex::new(RetainedConfig::default());
        for t in topics {
            r.retain(t, *t, 1).unwrap();
        }
        r
    }

    #[test]
    fn an_empty_retained_payload_removes_the_topic_and_is_not_stored() {
        let mut r = index(&["a/b"]);
        assert_eq!(r.publish("a/b", "", true, 0), Ok(Some("a/b")));
        assert_eq!(r.get("a/b"), None);
        assert_eq!(r.len(), 0);
        assert_eq!(r.publish("a/c", "", true, 0), Ok(None), "nothing to remove");
        assert_eq!(r.len(), 0, "and nothing stored");
        assert_eq!(r.publish("a/c", "m", false, 1), Ok(None));
        assert_eq!(r.get("a/c"), Some(&"m"));
    }

    fn matching(r: &RetainedIndex<&'static str>, filter: &str) -> Vec<&'static str> {
        let mut m: Vec<&str> = r
            .matching(filter)
            .unwrap()
            .map(|(topic, msg)| {
                assert_eq!(topic, *msg);
                *msg
            })
            .collect();
        m.sort_unstable();
        m
    }

    const TOPICS: &[&str] = &[
        "a", "a/b", "a/c", "a/b/c", "a/", "/", "$SYS/x", "$SYS", "b/$x",
    ];

    #[test]
    fn retained_matching_applies_plus_and_literals() {
        let r = index(TOPICS);
        assert_eq!(matching(&r, "a/+"), vec!["a/", "a/b", "a/c"]);
        assert_eq!(matching(&r, "+/+"), vec!["/", "a/", "a/b", "a/c", "b/$x"]);
        assert_eq!(matching(&r, "a/b/c"), vec!["a/b/c"]);
        assert_eq!(matching(&r, "a/x"), Vec::<&str>::new());
    }

    #[test]
    fn retained_hash_matches_parent_level() {
        let r = index(TOPICS);
        assert_eq!(matching(&r, "a/#"), vec!["a", "a/", "a/b", "a/b/c", "a/c"]);
        assert_eq!(matching(&r, "a/b/#"), vec!["a/b", "a/b/c"]);
    }

    #[test]
    fn retained_wildcards_skip_dollar_topics_at_first_level() {
        let r = index(TOPICS);
        assert_eq!(
            matching(&r, "#"),
            vec!["/", "a", "a/", "a/b", "a/b/c", "a/c", "b/$x"]
        );
        assert_eq!(matching(&r, "+"), vec!["a"]);
        assert_eq!(matching(&r, "$SYS/#"), vec!["$SYS", "$SYS/x"]);
    }

    #[test]
    fn retained_matching_refuses_invalid_filter() {
        let r = index(TOPICS);
        assert_eq!(
            r.matching("a/#/b").err(),
            Some(RouterError::HashNotLast { level: 1 })
        );
    }

    #[test]
    fn retained_refuses_new_topic_past_count_cap() {
        let mut r = RetainedIndex::new(RetainedConfig {
            retained_max: 2,
            ..RetainedConfig::default()
        });
        r.retain("a", 1, 10).unwrap();
        r.retain("b", 2, 10).unwrap();
        assert_eq!(
            r.retain("c", 3, 10),
            Err(RouterError::RetainedFull { max: 2 })
        );
        assert_eq!(
            r.retain("a", 4, 10),
            Ok(Some(1)),
            "replacing is allowed at the cap"
        );
        assert_eq!(r.node_count(), 2);
    }

    #[test]
    fn retained_refuses_past_byte_cap() {
        let mut r = RetainedIndex::new(RetainedConfig {
            retained_bytes_max: 100,
            ..RetainedConfig::default()
        });
        r.retain("a", 1, 60).unwrap();
        assert_eq!(
            r.retain("b", 2, 41),
            Err(RouterError::RetainedBytesFull {
                bytes: 101,
                max: 100
            })
        );
        assert_eq!(
            r.retain("a", 3, 100),
            Ok(Some(1)),
            "a replacement frees the old size"
        );
        assert_eq!(r.bytes(), 100);
    }

    #[test]
    fn retained_remove_prunes_nodes_and_accounts_bytes() {
        let mut r = RetainedIndex::new(RetainedConfig::default());
        r.retain("a/b/c", 1, 5).unwrap();
        r.retain("a/b", 2, 7).unwrap();
        assert_eq!(r.remove("a/b/c/d"), None);
        assert_eq!(r.remove("a/+"), None);
        assert_eq!(r.remove("a/b/c"), Some(1));
        assert_eq!((r.len(), r.bytes(), r.node_count()), (1, 7, 2));
        assert_eq!(r.remove("a/b"), Some(2));
        assert_eq!((r.len(), r.bytes(), r.node_count()), (0, 0, 0));
        assert!(r.root.is_empty());
    }

    #[test]
    fn retained_refuses_wildcard_topic() {
        let mut r = RetainedIndex::new(RetainedConfig::default());
        assert_eq!(
            r.retain("a/+", 1, 1),
            Err(RouterError::WildcardInTopicName { level: 1 })
        );
        assert!(r.is_empty());
    }
}
