//! The ACL: ordered allow/deny rules over who (user, client id, address) may publish or
//! subscribe to which topics; the first matching rule decides, else the default.

use std::borrow::Cow;
use std::net::IpAddr;
use std::path::Path;
use std::str::FromStr;

use ipnet::IpNet;
use serde::Deserialize;

use crate::error::{AclProblem, AuthError};
use crate::topic::{filter_is_subset, filter_matches_topic, filters_overlap, validate_filter};

/// The outcome of an ACL check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    /// The operation is permitted.
    Allow,
    /// The operation is refused (PUBACK/SUBACK reason 0x87 Not authorized in MQTT 5).
    Deny,
}

/// The operation being checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// PUBLISH to a topic name (also a will's topic at CONNECT).
    Publish,
    /// SUBSCRIBE to a topic filter, without any `$share/{group}/` prefix.
    Subscribe,
}

/// What a SUBSCRIBE may receive, by the rules that apply to its client
/// ([`Acl::subscribe_scope`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every topic the filter matches may be read: its deliveries need no check.
    All,
    /// Some topics the filter matches may be read and some may not: the SUBSCRIBE is
    /// granted and each delivery is checked with [`Acl::check_read`].
    Partial,
    /// No topic the filter matches may be read: the SUBSCRIBE is refused.
    Nothing,
}

/// The client an operation comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientInfo<'a> {
    /// The authenticated username; `None` for an anonymous client.
    pub username: Option<&'a str>,
    /// The client identifier (possibly assigned by the broker).
    pub client_id: &'a str,
    /// The peer address (after PROXY protocol or `X-Forwarded-For`, where configured).
    pub addr: IpAddr,
}

/// A parsed ACL: rules in file order and the decision when none matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    rules: Vec<Rule>,
    default: Decision,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    permission: Decision,
    action: RuleAction,
    topics: Vec<TopicPattern>,
    user: Option<String>,
    client_id: Option<String>,
    ip: Option<IpNet>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum RuleAction {
    Publish,
    Subscribe,
    All,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct TopicPattern {
    /// `eq` form: compare the topic or filter literally instead of as a filter.
    literal: bool,
    text: String,
    has_placeholders: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAcl {
    #[serde(default)]
    rules: Vec<RawRule>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    permission: Decision,
    action: RuleAction,
    topics: Vec<String>,
    user: Option<String>,
    clientid: Option<String>,
    ipaddr: Option<String>,
}

/// Written in a rule's `user` to mean any client, named or anonymous: the same as leaving
/// `user` out, for files that want to say so.
const ALL_USERS: &str = "$all";

impl Acl {
    /// An ACL with no rules: every check returns `default`.
    pub fn empty(default: Decision) -> Self {
        Self {
            rules: Vec::new(),
            default,
        }
    }

    /// Reads and parses the ACL file at `path` (see [`FromStr`] for the format); errors
    /// carry the path.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, AuthError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| AuthError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        parse(&text).map_err(|e| match e {
            AuthError::AclSyntax { message, .. } => AuthError::AclSyntax {
                path: Some(path.to_path_buf()),
                message,
            },
            AuthError::AclRule { index, problem, .. } => AuthError::AclRule {
                path: Some(path.to_path_buf()),
                index,
                problem,
            },
            other => other,
        })
    }

    /// Replaces the decision used when no rule matches (parsed ACLs start with
    /// [`Decision::Allow`], the broker's `auth.acl_default` default).
    pub fn with_default(mut self, default: Decision) -> Self {
        self.default = default;
        self
    }

    /// The decision used when no rule matches.
    pub fn default_decision(&self) -> Decision {
        self.default
    }

    /// The number of rules.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Whether the ACL has no rules.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Decides whether `client` may perform `action` on `topic`: a topic name for
    /// [`Action::Publish`], a filter for [`Action::Subscribe`] (strip `$share/{group}/`
    /// first). The first rule whose action, user, client id and address all match, and one
    /// of whose topic patterns matches, decides; otherwise the default.
    ///
    /// A publish matches a pattern that matches the topic name; a subscribe matches a
    /// pattern that covers every topic the requested filter could match
    /// ([`filter_is_subset`]). `eq` patterns compare literally.
    pub fn check(&self, client: &ClientInfo<'_>, action: Action, topic: &str) -> Decision {
        self.rule_decision(client, action, topic)
            .unwrap_or(self.default)
    }

    /// As [`Acl::check`], but `None` where no rule matches (the default is not applied):
    /// for a chain of deciders in which the next one decides what no rule does.
    pub fn rule_decision(
        &self,
        client: &ClientInfo<'_>,
        action: Action,
        topic: &str,
    ) -> Option<Decision> {
        self.rules
            .iter()
            .find(|rule| rule.matches(client, action, topic))
            .map(|rule| rule.permission)
    }
}

impl Acl {
    /// Decides a SUBSCRIBE to `filter` (without any `$share/{group}/` prefix) by what it
    /// could deliver: rules are read in order, as [`Acl::check_read`] reads them for each
    /// topic. A rule whose pattern covers the whole filter decides the rest of it; one whose
    /// pattern only overlaps it decides part of it and the reading goes on. So a `deny`
    /// over `private/alice/#` makes a subscription to `#` [`Scope::Partial`]: granted, and
    /// alice's topics are withheld at delivery.
    pub fn subscribe_scope(&self, client: &ClientInfo<'_>, filter: &str) -> Scope {
        self.scope(client, filter).1
    }

    /// As [`Acl::subscribe_scope`], but `None` where no rule covers or overlaps any part of
    /// `filter` (the default alone would decide). What rules leave uncovered of a filter
    /// they partly decide still falls to the default.
    pub fn subscribe_rule_scope(&self, client: &ClientInfo<'_>, filter: &str) -> Option<Scope> {
        match self.scope(client, filter) {
            (false, _) => None,
            (true, scope) => Some(scope),
        }
    }

    /// Whether some rule touched `filter`, and its scope.
    fn scope(&self, client: &ClientInfo<'_>, filter: &str) -> (bool, Scope) {
        let (mut allow, mut deny) = (false, false);
        let mut touched = false;
        let mut mark = |d: Decision| match d {
            Decision::Allow => allow = true,
            Decision::Deny => deny = true,
        };
        let mut covered = false;
        'rules: for rule in self
            .rules
            .iter()
            .filter(|r| r.applies(client, Action::Subscribe))
        {
            for p in &rule.topics {
                let Some(pattern) = p.substitute(client) else {
                    continue;
                };
                let (covers, overlaps) = if p.literal {
                    // `eq` speaks of one filter literally, and of a topic only when the
                    // text is a topic name.
                    let same = pattern == filter;
                    let name = !pattern.contains(['+', '#']);
                    (
                        same,
                        same || (name && filter_matches_topic(filter, &pattern)),
                    )
                } else {
                    (
                        filter_is_subset(filter, &pattern),
                        filters_overlap(filter, &pattern),
                    )
                };
                if covers {
                    mark(rule.permission);
                    covered = true;
                    touched = true;
                    break 'rules;
                }
                if overlaps {
                    mark(rule.permission);
                    touched = true;
                }
            }
        }
        if !covered {
            mark(self.default);
        }
        let scope = match (allow, deny) {
            (true, false) => Scope::All,
            (true, true) => Scope::Partial,
            _ => Scope::Nothing,
        };
        (touched, scope)
    }

    /// Whether `client` may receive a message published to the topic name `topic`: the
    /// first rule for subscribe (or all) whose pattern matches the topic decides, else the
    /// default. Checked at delivery for subscriptions of [`Scope::Partial`].
    pub fn check_read(&self, client: &ClientInfo<'_>, topic: &str) -> Decision {
        self.read_rule_decision(client, topic)
            .unwrap_or(self.default)
    }

    /// As [`Acl::check_read`], but `None` where no rule matches.
    pub fn read_rule_decision(&self, client: &ClientInfo<'_>, topic: &str) -> Option<Decision> {
        self.rules
            .iter()
            .filter(|r| r.applies(client, Action::Subscribe))
            .find(|r| {
                r.topics.iter().any(|p| match p.substitute(client) {
                    Some(pattern) if p.literal => pattern == topic,
                    Some(pattern) => filter_matches_topic(&pattern, topic),
                    None => false,
                })
            })
            .map(|r| r.permission)
    }

    /// Whether some topic could be denied to `client` at delivery: the default denies, or
    /// a deny rule for subscribe applies to it. When not, its deliveries need no check.
    pub fn may_deny_reads(&self, client: &ClientInfo<'_>) -> bool {
        self.default == Decision::Deny
            || self
                .rules
                .iter()
                .any(|r| r.permission == Decision::Deny && r.applies(client, Action::Subscribe))
    }
}

/// Parses an ACL file:
///
/// ```toml
/// [[rules]]
/// permission = "allow"           # or "deny"
/// action = "publish"             # or "subscribe", "all"
/// topics = ["sensors/%u/#", "eq alerts/#"]
/// user = "alice"                 # optional; "$all" or absent = anyone
/// clientid = "dev-1"             # optional
/// ipaddr = "10.0.0.0/8"          # optional; an address or CIDR block
/// ```
///
/// `%u` and `%c` in a pattern stand for the username and client id; a pattern with `%u`
/// never matches an anonymous client, nor one whose substituted value contains `/`, `+`
/// or `#` (which would widen the pattern). `eq ` before a pattern compares it literally.
impl FromStr for Acl {
    type Err = AuthError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse(s)
    }
}

fn parse(text: &str) -> Result<Acl, AuthError> {
    let raw: RawAcl =
        serde_path_to_error::deserialize(toml::Deserializer::new(text)).map_err(|e| {
            let key = e.path().to_string();
            let inner = e.into_inner();
            let message = if key == "." {
                inner.to_string()
            } else {
                format!("{key}: {}", inner.message())
            };
            AuthError::AclSyntax {
                path: None,
                message,
            }
        })?;
    let rules = raw
        .rules
        .into_iter()
        .enumerate()
        .map(|(index, r)| {
            Rule::from_raw(r).map_err(|problem| AuthError::AclRule {
                path: None,
                index,
                problem,
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(Acl {
        rules,
        default: Decision::Allow,
    })
}

impl Rule {
    fn from_raw(raw: RawRule) -> Result<Self, AclProblem> {
        if raw.topics.is_empty() {
            return Err(AclProblem::NoTopics);
        }
        let topics = raw
            .topics
            .iter()
            .enumerate()
            .map(|(i, t)| TopicPattern::parse(t).map_err(|reason| bad_topic(i, t, reason)))
            .collect::<Result<_, _>>()?;
        let user = match raw.user {
            Some(u) if u.is_empty() => return Err(AclProblem::EmptyMatcher { field: "user" }),
            Some(u) if u == ALL_USERS => None,
            other => other,
        };
        if raw.clientid.as_deref() == Some("") {
            return Err(AclProblem::EmptyMatcher { field: "clientid" });
        }
        let ip = raw.ipaddr.map(|s| parse_ip(&s)).transpose()?;
        Ok(Self {
            permission: raw.permission,
            action: raw.action,
            topics,
            user,
            client_id: raw.clientid,
            ip,
        })
    }

    fn matches(&self, client: &ClientInfo<'_>, action: Action, topic: &str) -> bool {
        self.applies(client, action) && self.topics.iter().any(|p| p.matches(client, action, topic))
    }

    /// Whether the rule speaks of this client and action, whatever the topic.
    fn applies(&self, client: &ClientInfo<'_>, action: Action) -> bool {
        let action_ok = matches!(
            (self.action, action),
            (RuleAction::All, _)
                | (RuleAction::Publish, Action::Publish)
                | (RuleAction::Subscribe, Action::Subscribe)
        );
        action_ok
            && self
                .user
                .as_deref()
                .is_none_or(|u| client.username == Some(u))
            && self
                .client_id
                .as_deref()
                .is_none_or(|c| client.client_id == c)
            // A v4 peer on a dual-stack socket shows up as ::ffff:a.b.c.d; compare it as v4.
            && self.ip.is_none_or(|net| net.contains(&client.addr.to_canonical()))
    }
}

fn bad_topic(index: usize, pattern: &str, reason: &'static str) -> AclProblem {
    AclProblem::BadTopic {
        topic: index,
        pattern: pattern.to_owned(),
        reason,
    }
}

fn parse_ip(s: &str) -> Result<IpNet, AclProblem> {
    s.parse::<IpNet>()
        .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| AclProblem::BadIpAddr {
            value: s.to_owned(),
        })
}

impl TopicPattern {
    fn parse(raw: &str) -> Result<Self, &'static str> {
        let (literal, text) = match raw.strip_prefix("eq ") {
            Some(rest) => (true, rest),
            None => (false, raw),
        };
        if literal {
            if text.is_empty() {
                return Err("empty");
            }
        } else {
            validate_filter(text)?;
        }
        Ok(Self {
            literal,
            text: text.to_owned(),
            has_placeholders: text.contains("%u") || text.contains("%c"),
        })
    }

    fn matches(&self, client: &ClientInfo<'_>, action: Action, topic: &str) -> bool {
        let Some(pattern) = self.substitute(client) else {
            return false;
        };
        if self.literal {
            return pattern == topic;
        }
        match action {
            Action::Publish => filter_matches_topic(&pattern, topic),
            Action::Subscribe => filter_is_subset(topic, &pattern),
        }
    }

    /// The pattern with `%u` and `%c` replaced; `None` when it cannot apply to this client.
    fn substitute(&self, client: &ClientInfo<'_>) -> Option<Cow<'_, str>> {
        if !self.has_placeholders {
            return Some(Cow::Borrowed(&self.text));
        }
        let mut out = self.text.clone();
        if out.contains("%u") {
            out = out.replace("%u", safe_value(client.username?)?);
        }
        if out.contains("%c") {
            out = out.replace("%c", safe_value(client.client_id)?);
        }
        Some(Cow::Owned(out))
    }
}

/// A username or client id may only stand in for a placeholder if it cannot change the
/// shape of the pattern: `/` would add levels, `+` and `#` would add wildcards (a user
/// named `#` must not gain `users/#`).
fn safe_value(value: &str) -> Option<&str> {
    (!value.is_empty() && !value.contains(['/', '+', '#'])).then_some(value)
}
