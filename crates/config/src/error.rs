//! The crate's error enum and the warnings a valid config can still carry.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::model::ListenerKind;

/// Why a configuration was refused. Every variant after [`ConfigError::Syntax`] names the
/// key (`listeners[2].bind`, `mqtt.max_inflight`) in its message.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An error in the file at `path` (wraps every other variant in [`crate::Config::load`]).
    #[error("{path}: {source}")]
    InFile {
        path: PathBuf,
        #[source]
        source: Box<ConfigError>,
    },
    /// The text is not TOML; the message carries toml's line and column.
    #[error("TOML syntax: {message}")]
    Syntax { message: String },
    /// A key that no section defines; `parent` is the section (empty at the top level).
    #[error(
        "{}unknown key \"{key}\"{}",
        prefix(parent),
        suggestion.as_ref().map(|s| format!(" (did you mean \"{s}\"?)")).unwrap_or_default()
    )]
    UnknownKey {
        parent: String,
        key: String,
        suggestion: Option<String>,
    },
    /// The value has the wrong type or is not one of the allowed words (serde's message).
    #[error("{key}: {message}")]
    BadValue { key: String, message: String },
    /// A number outside its allowed range (inclusive).
    #[error("{key}: {value} is not allowed (must be between {min} and {max})")]
    OutOfRange {
        key: String,
        value: u64,
        min: u64,
        max: u64,
    },
    /// A number that must not exceed another key's value.
    #[error("{key}: {value} is greater than {other_key} ({other_value})")]
    GreaterThan {
        key: String,
        value: u64,
        other_key: String,
        other_value: u64,
    },
    /// A listener's `bind` that does not parse as `ip:port`.
    #[error("{key}: {value:?} is not a socket address (expected e.g. \"0.0.0.0:1883\" or \"[::]:1883\")")]
    NotSocketAddr { key: String, value: String },
    /// Two listeners on the same port and transport with overlapping addresses.
    #[error("{key}: {addr} is already used by listeners[{other}] ({other_addr})")]
    DuplicateBind {
        key: String,
        addr: SocketAddr,
        other: usize,
        other_addr: SocketAddr,
    },
    /// A listener key that does not apply to the listener's kind.
    #[error("{key}: only applies to {applies_to} listeners, not {kind}")]
    NotApplicable {
        key: String,
        kind: ListenerKind,
        applies_to: &'static str,
    },
    /// `log.level` is not a level or a list of `target=level` directives.
    #[error("{key}: {value:?} is not a log level (expected trace, debug, info, warn, error or off, or comma-separated target=level directives)")]
    BadLogLevel { key: String, value: String },
    /// Any other rule about one key.
    #[error("{key}: {problem}")]
    Invalid { key: String, problem: &'static str },
    /// After disabling listeners that cannot start, none is left.
    #[error("listeners: no listener can start (the file defines none, or every one is disabled; see the warnings)")]
    NoListeners,
}

fn prefix(parent: &str) -> String {
    if parent.is_empty() {
        String::new()
    } else {
        format!("{parent}: ")
    }
}

impl ConfigError {
    /// The dotted key the error is about, where there is one.
    pub fn key(&self) -> Option<&str> {
        match self {
            Self::InFile { source, .. } => source.key(),
            Self::BadValue { key, .. }
            | Self::OutOfRange { key, .. }
            | Self::GreaterThan { key, .. }
            | Self::NotSocketAddr { key, .. }
            | Self::DuplicateBind { key, .. }
            | Self::NotApplicable { key, .. }
            | Self::BadLogLevel { key, .. }
            | Self::Invalid { key, .. } => Some(key),
            Self::UnknownKey { .. } | Self::Io { .. } | Self::Syntax { .. } | Self::NoListeners => {
                None
            }
        }
    }
}

/// Something in a valid configuration that the operator should hear about at start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Warning {
    /// A tls, wss or quic listener without `tls.cert_file` and `tls.key_file`: it is left
    /// out of [`crate::Config::listeners`] and the broker starts without it.
    #[error("listeners[{index}]: {kind} listener on {bind} is disabled: it needs a certificate (set tls.cert_file and tls.key_file)")]
    ListenerNeedsCertificate {
        index: usize,
        kind: ListenerKind,
        bind: SocketAddr,
    },
    /// The HTTP API is served beyond loopback with no `http.bearer_token`: anyone who can
    /// reach it can list and kick clients and publish.
    #[error("http: the API on {bind} is open to anyone who can reach it: set http.bearer_token or bind to 127.0.0.1")]
    HttpWithoutToken { bind: SocketAddr },
}
