//! Starling's transport seam: TCP byte streams, QUIC endpoints and TLS material; the only crate that opens sockets.
//!
//! Everything here builds and behaves the same for callers in production and under
//! `--cfg madsim`, where tokio's networking, time and tasks are the simulator's and QUIC runs
//! through the shim in `sim`.
//!
//! - TCP: [`listen`] / [`Listener::accept`] / [`connect`] give a [`Stream`]
//!   (`AsyncRead + AsyncWrite`). Flush after writing: the simulated TCP sends only on flush.
//! - QUIC: [`QuicEndpoint`] (server, client or both), [`QuicConnection`], and bidirectional
//!   streams [`QuicSend`] / [`QuicRecv`].
//! - TLS: [`Identity`], [`CertAuthority`] (Ed25519 CA and node certificates), [`ServerTls`] and
//!   [`ClientTls`] building rustls configurations with the ring provider.
//! - MQTT listeners of every kind (tcp, tls, ws, wss, quic): [`MqttListener::accept`] then
//!   [`PendingConnection::handshake`] give an [`AnyStream`] and its [`ConnInfo`], under
//!   per-listener [`HandshakeLimits`], optional PROXY protocol ([`ProxyProtocol`]) and
//!   [`ListenerCounters`]; [`TlsReloader`] swaps certificates without dropping connections.
//! - Pieces for clients and tests: [`tls_connect`], [`ws_connect`], [`QuicBiStream::connect`];
//!   [`write_dev_certificates`] for a first run without certificates.
//!
//! A cluster node with one mutual-TLS QUIC endpoint that both accepts and dials; the same code
//! runs in production and on a simulated node:
//!
//! ```no_run
//! # async fn node() -> Result<(), starling_net::NetError> {
//! use starling_net::{CertAuthority, ClientTls, QuicConfig, QuicEndpoint, ServerTls, ALPN_RAFT};
//!
//! let ca = CertAuthority::generate("starling cluster CA")?; // once, by `starling cert`
//! let me = ca.issue("node-1", &["node-1"])?.identity();
//! let server = ServerTls::new(me.clone())
//!     .require_client_cert(vec![ca.cert_der()])
//!     .alpn(&[ALPN_RAFT]);
//! let client = ClientTls::new(vec![ca.cert_der()]).identity(me).alpn(&[ALPN_RAFT]);
//! let seed = [7u8; 32]; // from the runtime's seeded RNG
//! let endpoint = QuicEndpoint::new(
//!     "0.0.0.0:7946".parse().unwrap(),
//!     Some(&server),
//!     Some(&client),
//!     &QuicConfig::new(seed),
//! )
//! .await?;
//! let peer = endpoint.connect("192.0.2.2:7946".parse().unwrap(), "node-2").await?;
//! let (_send, _recv) = peer.open_bi().await?;
//! # Ok(()) }
//! ```

// This crate is the transport seam: it alone talks to sockets, quinn's runtime and the
// simulator, so it may use the clock and spawn APIs banned elsewhere.
#![allow(clippy::disallowed_methods)]

mod capped;
mod devcert;
mod error;
mod listener;
pub mod proxy;
mod quic;
#[cfg(madsim)]
mod sim;
mod tcp;
mod tls;
mod tls_stream;
mod ws;

pub use capped::CapRelease;
pub use devcert::{write_dev_certificates, DevCertFiles};
pub use error::NetError;
pub use listener::{
    AnyStream, ConnInfo, CounterSnapshot, HandshakeLimits, ListenerCounters, ListenerKind,
    ListenerSettings, MqttListener, PendingConnection, TlsReloader, Transport,
};
pub use proxy::{ProxyError, ProxyHeader, ProxyProtocol};
pub use quic::{
    QuicBiStream, QuicConfig, QuicConnection, QuicEndpoint, QuicIncoming, QuicRecv, QuicSend,
};
pub use tcp::{connect, listen, Listener, Stream};
pub use tls::{
    crypto_provider, load_certs, load_private_key, CertAuthority, ClientTls, Identity, IssuedCert,
    ServerTls, TlsVersions, ALPN_MQTT, ALPN_RAFT,
};
pub use tls_stream::{
    common_name, tls_connect, ClientAuth, ClientTlsStream, ServerTlsStream, TlsAcceptor, TlsFiles,
};
pub use ws::{ws_connect, WsConfig, WsRefusal, WsStream, WS_PATH_DEFAULT};

/// Re-exported so callers can name certificate types without their own dependency.
pub use rustls_pki_types::{CertificateDer, PrivateKeyDer};
