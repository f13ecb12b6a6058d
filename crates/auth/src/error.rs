//! The crate's one error enum and the problems it carries.

use std::path::PathBuf;

/// Everything loading or managing the password and ACL files can fail with.
///
/// Peer input (a CONNECT's username and password, a PUBLISH topic) never produces an
/// error: it produces an [`crate::AuthResult`] or a [`crate::Decision`].
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A line of the password file is malformed; `line` counts from 1.
    #[error("{path}:{line}: {problem}")]
    PasswordLine {
        path: PathBuf,
        line: usize,
        problem: PasswordLineProblem,
    },
    /// A username given to the `passwd` helpers cannot be stored in the file.
    #[error("invalid username {username:?}: {reason}")]
    InvalidUsername {
        username: String,
        reason: &'static str,
    },
    /// Hashing a new password failed (argon2 parameter or salt error).
    #[error("hashing the password failed: {0}")]
    Hash(password_hash::Error),
    /// The ACL file is not valid TOML or does not have the ACL's shape.
    #[error("{}ACL syntax: {message}", path_prefix(.path))]
    AclSyntax {
        path: Option<PathBuf>,
        message: String,
    },
    /// One ACL rule is invalid; `index` counts from 0, as in `rules[index]`.
    #[error("{}rules[{index}]: {problem}", path_prefix(.path))]
    AclRule {
        path: Option<PathBuf>,
        index: usize,
        problem: AclProblem,
    },
}

fn path_prefix(path: &Option<PathBuf>) -> String {
    match path {
        Some(p) => format!("{}: ", p.display()),
        None => String::new(),
    }
}

/// What is wrong with one line of the password file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PasswordLineProblem {
    /// The line has no `:` between username and hash.
    #[error("expected `username:$argon2id$...`, found no ':'")]
    MissingColon,
    /// The username before the `:` is empty.
    #[error("empty username")]
    EmptyUsername,
    /// The same username appears on an earlier line.
    #[error("user {username:?} already defined on line {first_line}")]
    DuplicateUser { username: String, first_line: usize },
    /// The text after the `:` is not a PHC string.
    #[error("not a PHC hash string: {0}")]
    BadHash(password_hash::Error),
    /// The hash is a PHC string for another algorithm.
    #[error("hash algorithm is {found:?}, expected \"argon2id\"")]
    WrongAlgorithm { found: String },
}

/// What is wrong with one ACL rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AclProblem {
    /// The rule has an empty `topics` list, so it could never match.
    #[error("topics is empty")]
    NoTopics,
    /// A topic pattern is not a valid MQTT filter (or, in the `eq` form, is empty).
    #[error("topics[{topic}]: {pattern:?} is not a valid topic filter: {reason}")]
    BadTopic {
        topic: usize,
        pattern: String,
        reason: &'static str,
    },
    /// `ipaddr` is neither an IP address nor a CIDR block.
    #[error("ipaddr: {value:?} is not an IP address or CIDR block")]
    BadIpAddr { value: String },
    /// `user` or `clientid` is empty, which would match nobody by accident.
    #[error("{field}: must not be empty")]
    EmptyMatcher { field: &'static str },
}
