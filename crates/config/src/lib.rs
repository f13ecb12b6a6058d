//! Starling's configuration: one TOML file, validated once at start into typed structs with finite defaults.
//!
//! [`Config::load`] reads a file, [`Config::from_str`] parses text; both check every key
//! (unknown keys get a "did you mean"), every value's type and range, and the rules that
//! span keys (unique listener addresses, TLS material), and return the typed [`Config`]
//! plus [`Warning`]s for things that do not stop the broker (a TLS listener without a
//! certificate is disabled). Errors name the key and the problem:
//! `mqtt.max_packet_size: 0 is not allowed (must be between 2 and 268435455)`.
//!
//! Relative paths in a loaded file are resolved against the file's directory, so a config
//! works the same from any working directory.

mod error;
mod keys;
mod model;
mod validate;

pub use error::{ConfigError, Warning};
pub use model::{
    AclDefault, AuthConfig, BackpressureHolders, ClientIdPolicy, ClusterConfig, ClusterReads,
    Config, DropPolicy, FsyncPolicy, HttpConfig, ListenerConfig, ListenerKind, LogConfig,
    MqttConfig, NodeConfig, QuicConfig, RouterSettings, ShardCount, SharedStrategy, StorageConfig,
    StuckPolicy, TimeoutVerdict, TlsConfig, WsConfig,
};

/// Every key the file format accepts, as dotted paths with `listeners[]` for the array
/// (`listeners[].tls.cert_file`): for documentation checks and tooling.
pub fn all_keys() -> Vec<String> {
    keys::all_keys()
}
