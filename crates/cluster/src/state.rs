//! The replicated cluster state and its deterministic `apply`: no clock, no randomness, no
//! I/O, ordered maps only (a snapshot's bytes are the same on every replica).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::command::{Answer, Command, Member, NodeId, Output, Owner, Query, RetainedMsg, Summary};

/// What an applied command changed, for the node's own replicas (its forwarding table, its
/// retained index, its sessions). Emitted in apply order; not part of the state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Member {
        node: NodeId,
        member: Option<Member>,
    },
    /// `client_id` is now owned by `owner` (`None`: by nobody).
    Owner {
        client_id: String,
        owner: Option<Owner>,
    },
    /// The nodes with subscribers for `filter` now (empty: none).
    Route { filter: String, nodes: Vec<NodeId> },
    Retained {
        topic: String,
        message: Option<RetainedMsg>,
    },
    /// The cut of a move: `node` installed the session of `client_id` that its claim
    /// `epoch` took over (see [`Command::Moved`]).
    Moved {
        client_id: String,
        node: NodeId,
        epoch: u64,
    },
}

/// The whole replicated state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterState {
    members: BTreeMap<NodeId, Member>,
    owners: BTreeMap<String, Owner>,
    /// The last epoch handed out; the next claim gets one more.
    epoch: u64,
    /// filter → nodes with subscribers for it. No empty sets.
    routes: BTreeMap<String, BTreeSet<NodeId>>,
    retained: BTreeMap<String, RetainedMsg>,
    /// The last retained version handed out.
    retained_version: u64,
    applied: u64,
    /// Who holds each filter's `$exclusive/` and `$limit/N/` subscriptions, cluster-wide.
    holds: BTreeMap<String, Holds>,
    /// Nodes whose `Leave` was applied and that have not joined again. A snapshot must say
    /// who left, not only who is a member: a node restarted on one taken after a `Leave`
    /// (or sent one) would otherwise never learn that the node departed, and as leader
    /// would keep it in raft's configuration for good. One id per node that ever left.
    /// Outside the layout of format 1: the state machine's snapshot writes it after the rest.
    #[serde(skip)]
    pub(crate) departed: BTreeSet<NodeId>,
}

/// A client holding a `$exclusive/` or `$limit/N/` subscription, and its node.
pub type Holder<'a> = (&'a str, NodeId);

/// The holders of one filter: client id → its node. No empty entries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Holds {
    exclusive: Option<(String, NodeId)>,
    limited: BTreeMap<String, NodeId>,
}

impl Holds {
    fn is_empty(&self) -> bool {
        self.exclusive.is_none() && self.limited.is_empty()
    }

    fn drop_node(&mut self, node: NodeId) {
        if self.exclusive.as_ref().is_some_and(|(_, n)| *n == node) {
            self.exclusive = None;
        }
        self.limited.retain(|_, n| *n != node);
    }
}

impl ClusterState {
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies `command`, committed at log `index`, appending what it changed to `changes`.
    pub fn apply(&mut self, index: u64, command: Command, changes: &mut Vec<Change>) -> Output {
        debug_assert!(index > self.applied || index == 0, "applied out of order");
        self.applied = self.applied.max(index);
        let out = self.apply_one(command, changes);
        self.check();
        out
    }

    fn apply_one(&mut self, command: Command, changes: &mut Vec<Change>) -> Output {
        match command {
            Command::Join { node, member } => {
                if node == 0 {
                    return Output::Refused("node id 0".into());
                }
                self.departed.remove(&node);
                if self.members.get(&node) != Some(&member) {
                    self.members.insert(node, member.clone());
                    changes.push(Change::Member {
                        node,
                        member: Some(member),
                    });
                }
                Output::Done
            }
            Command::Leave { node } => {
                if self.members.remove(&node).is_none() {
                    return Output::Done;
                }
                self.departed.insert(node);
                changes.push(Change::Member { node, member: None });
                self.drop_routes_of(node, changes);
                let gone: Vec<String> = self
                    .owners
                    .iter()
                    .filter(|(_, o)| o.node == node)
                    .map(|(c, _)| c.clone())
                    .collect();
                for client_id in gone {
                    self.owners.remove(&client_id);
                    changes.push(Change::Owner {
                        client_id,
                        owner: None,
                    });
                }
                self.drop_holds(node);
                Output::Done
            }
            Command::Hold {
                filter,
                client_id,
                node,
                limit,
            } => {
                if !self.members.contains_key(&node) {
                    return Output::Refused(format!("node {node} is not a member"));
                }
                let h = self.holds.entry(filter.clone()).or_default();
                let granted = match limit {
                    None => match &h.exclusive {
                        Some((c, _)) if *c != client_id => false,
                        _ => {
                            h.exclusive = Some((client_id, node));
                            true
                        }
                    },
                    Some(max) => {
                        if h.limited.contains_key(&client_id) || h.limited.len() < max as usize {
                            h.limited.insert(client_id, node);
                            true
                        } else {
                            false
                        }
                    }
                };
                if h.is_empty() {
                    self.holds.remove(&filter);
                }
                Output::Held(granted)
            }
            Command::Unhold {
                filter,
                client_id,
                node,
                exclusive,
            } => {
                if let Some(h) = self.holds.get_mut(&filter) {
                    if exclusive {
                        if h.exclusive.as_ref() == Some(&(client_id, node)) {
                            h.exclusive = None;
                        }
                    } else if h.limited.get(&client_id) == Some(&node) {
                        h.limited.remove(&client_id);
                    }
                    if h.is_empty() {
                        self.holds.remove(&filter);
                    }
                }
                Output::Done
            }
            Command::DropHolds { node } => {
                self.drop_holds(node);
                Output::Done
            }
            Command::Moved {
                client_id,
                node,
                epoch,
            } => {
                if !self.members.contains_key(&node) {
                    return Output::Refused(format!("node {node} is not a member"));
                }
                changes.push(Change::Moved {
                    client_id,
                    node,
                    epoch,
                });
                Output::Done
            }
            Command::Claim { client_id, node } => {
                if !self.members.contains_key(&node) {
                    return Output::Refused(format!("node {node} is not a member"));
                }
                self.epoch += 1;
                let owner = Owner {
                    node,
                    epoch: self.epoch,
                };
                let previous = self.owners.insert(client_id.clone(), owner);
                changes.push(Change::Owner {
                    client_id,
                    owner: Some(owner),
                });
                Output::Claimed { owner, previous }
            }
            Command::Release { client_id, owner } => {
                if self.owners.get(&client_id) != Some(&owner) {
                    return Output::Released(false);
                }
                self.owners.remove(&client_id);
                changes.push(Change::Owner {
                    client_id,
                    owner: None,
                });
                Output::Released(true)
            }
            Command::Routes { node, add, remove } => {
                if !self.members.contains_key(&node) {
                    return Output::Refused(format!("node {node} is not a member"));
                }
                for filter in remove {
                    self.unroute(&filter, node, changes);
                }
                for filter in add {
                    self.route(filter, node, changes);
                }
                Output::Done
            }
            Command::ResetRoutes { node, filters } => {
                if !self.members.contains_key(&node) {
                    return Output::Refused(format!("node {node} is not a member"));
                }
                let keep: BTreeSet<String> = filters.into_iter().collect();
                let stale: Vec<String> = self
                    .routes
                    .iter()
                    .filter(|(f, nodes)| nodes.contains(&node) && !keep.contains(*f))
                    .map(|(f, _)| f.clone())
                    .collect();
                for filter in stale {
                    self.unroute(&filter, node, changes);
                }
                for filter in keep {
                    self.route(filter, node, changes);
                }
                Output::Done
            }
            Command::Retain { topic, message } => {
                self.retained_version += 1;
                let changed = match &message {
                    Some(m) => self.retained.insert(topic.clone(), m.clone()).as_ref() != Some(m),
                    None => self.retained.remove(&topic).is_some(),
                };
                if changed {
                    changes.push(Change::Retained { topic, message });
                }
                Output::Retained {
                    version: self.retained_version,
                }
            }
            Command::Batch(commands) => Output::Batch(
                commands
                    .into_iter()
                    .map(|c| match c {
                        // One level: a batch of batches has no use and would let an entry
                        // nest without bound.
                        Command::Batch(_) => Output::Refused("nested batch".into()),
                        c => self.apply_one(c, changes),
                    })
                    .collect(),
            ),
        }
    }

    fn route(&mut self, filter: String, node: NodeId, changes: &mut Vec<Change>) {
        let nodes = self.routes.entry(filter.clone()).or_default();
        if nodes.insert(node) {
            let nodes = nodes.iter().copied().collect();
            changes.push(Change::Route { filter, nodes });
        }
    }

    fn unroute(&mut self, filter: &str, node: NodeId, changes: &mut Vec<Change>) {
        let Some(nodes) = self.routes.get_mut(filter) else {
            return;
        };
        if !nodes.remove(&node) {
            return;
        }
        let left: Vec<NodeId> = nodes.iter().copied().collect();
        if left.is_empty() {
            self.routes.remove(filter);
        }
        changes.push(Change::Route {
            filter: filter.to_owned(),
            nodes: left,
        });
    }

    fn drop_routes_of(&mut self, node: NodeId, changes: &mut Vec<Change>) {
        let filters: Vec<String> = self
            .routes
            .iter()
            .filter(|(_, n)| n.contains(&node))
            .map(|(f, _)| f.clone())
            .collect();
        for f in filters {
            self.unroute(&f, node, changes);
        }
    }

    fn drop_holds(&mut self, node: NodeId) {
        for h in self.holds.values_mut() {
            h.drop_node(node);
        }
        self.holds.retain(|_, h| !h.is_empty());
    }

    /// The clients holding `filter`'s exclusive subscription (at most one) and its limited
    /// ones, each with its node.
    pub fn holders(&self, filter: &str) -> (Option<Holder<'_>>, Vec<Holder<'_>>) {
        match self.holds.get(filter) {
            None => (None, Vec::new()),
            Some(h) => (
                h.exclusive.as_ref().map(|(c, n)| (c.as_str(), *n)),
                h.limited.iter().map(|(c, n)| (c.as_str(), *n)).collect(),
            ),
        }
    }

    fn check(&self) {
        debug_assert!(
            self.holds.values().all(|h| !h.is_empty()),
            "an empty hold entry"
        );
        debug_assert!(
            self.routes.values().all(|n| !n.is_empty()),
            "empty route set"
        );
        debug_assert!(
            self.owners.values().all(|o| o.epoch <= self.epoch),
            "an epoch from the future"
        );
    }

    /// Answers `query` from this replica (as fresh as its last applied entry).
    pub fn query(&self, query: &Query, matches: impl Fn(&str, &str) -> bool) -> Answer {
        match query {
            Query::Owner(c) => Answer::Owner(self.owners.get(c).copied()),
            Query::Owners(cs) => {
                Answer::Owners(cs.iter().map(|c| self.owners.get(c).copied()).collect())
            }
            Query::Members => {
                Answer::Members(self.members.iter().map(|(n, m)| (*n, m.clone())).collect())
            }
            Query::Routes => Answer::Routes(
                self.routes
                    .iter()
                    .map(|(f, n)| (f.clone(), n.iter().copied().collect()))
                    .collect(),
            ),
            Query::Retained { filter, limit } => Answer::Retained(
                self.retained
                    .iter()
                    .filter(|(t, _)| matches(filter, t))
                    .take(*limit as usize)
                    .map(|(t, m)| (t.clone(), m.clone()))
                    .collect(),
            ),
            Query::Summary => Answer::Summary(self.summary()),
        }
    }

    pub fn summary(&self) -> Summary {
        Summary {
            members: self.members.len() as u64,
            owners: self.owners.len() as u64,
            routes: self.routes.len() as u64,
            retained: self.retained.len() as u64,
            applied: self.applied,
        }
    }

    pub fn members(&self) -> &BTreeMap<NodeId, Member> {
        &self.members
    }

    /// Nodes that left (their `Leave` applied) and have not joined again.
    pub fn departed(&self) -> &BTreeSet<NodeId> {
        &self.departed
    }

    pub fn owner(&self, client_id: &str) -> Option<Owner> {
        self.owners.get(client_id).copied()
    }

    pub fn routes(&self) -> impl Iterator<Item = (&str, &BTreeSet<NodeId>)> {
        self.routes.iter().map(|(f, n)| (f.as_str(), n))
    }

    pub fn retained(&self) -> impl Iterator<Item = (&str, &RetainedMsg)> {
        self.retained.iter().map(|(t, m)| (t.as_str(), m))
    }

    /// Everything this state holds, as changes from an empty state: what a node's replicas
    /// rebuild from after a snapshot replaced the state. A node that left comes as a
    /// member record removed.
    pub fn as_changes(&self) -> Vec<Change> {
        let mut out = Vec::new();
        for (node, m) in &self.members {
            out.push(Change::Member {
                node: *node,
                member: Some(m.clone()),
            });
        }
        for node in &self.departed {
            out.push(Change::Member {
                node: *node,
                member: None,
            });
        }
        for (c, o) in &self.owners {
            out.push(Change::Owner {
                client_id: c.clone(),
                owner: Some(*o),
            });
        }
        for (f, n) in &self.routes {
            out.push(Change::Route {
                filter: f.clone(),
                nodes: n.iter().copied().collect(),
            });
        }
        for (t, m) in &self.retained {
            out.push(Change::Retained {
                topic: t.clone(),
                message: Some(m.clone()),
            });
        }
        out
    }
}
