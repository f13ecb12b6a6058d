//! The broker's one error type: what can stop it from starting, or refuse a certificate
//! reload.

use std::net::SocketAddr;

/// Why the broker could not start, or why a certificate reload was refused.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// A listener could not be bound (address in use, bad TLS material, ...).
    #[error("listener {kind} on {addr}: {source}")]
    Listener {
        /// The listener kind.
        kind: starling_config::ListenerKind,
        /// The configured address.
        addr: SocketAddr,
        /// What the transport said (boxed: it is large, and this error is rare).
        #[source]
        source: Box<starling_net::NetError>,
    },
    /// A TLS-bearing listener's certificate files did not load on reload; the listener
    /// keeps its previous certificate.
    #[error("reload of listener {kind} on {addr}: {source}")]
    TlsReload {
        /// The listener kind.
        kind: starling_config::ListenerKind,
        /// The bound address.
        addr: SocketAddr,
        /// What went wrong, naming the file.
        #[source]
        source: Box<starling_net::NetError>,
    },
    /// The durable store could not be opened: its directory could not be made, or the file
    /// is unreadable, damaged or of another format (the error names the file).
    #[error("store {path}: {source}", path = path.display())]
    Store {
        /// The store's file.
        path: std::path::PathBuf,
        #[source]
        source: Box<StoreOpenError>,
    },
    /// The password file or the ACL file did not load.
    #[error(transparent)]
    Auth(#[from] starling_auth::AuthError),
    /// The cluster could not start: its certificates, its raft log, or its endpoint (the
    /// message names the key or the file).
    #[error("cluster: {0}")]
    Cluster(String),
}

/// Why the store did not open.
#[derive(Debug, thiserror::Error)]
pub enum StoreOpenError {
    /// Its directory could not be created.
    #[error("cannot create its directory: {0}")]
    Dir(#[source] std::io::Error),
    /// The store refused the file.
    #[error(transparent)]
    Store(#[from] starling_store::StoreError),
}
