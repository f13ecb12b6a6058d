use std::{io, net::SocketAddr, path::PathBuf, time::Duration};

use crate::{proxy::ProxyError, ws::WsRefusal};

/// Everything that can go wrong in the transport seam.
///
/// Variants name the event and carry the address or file involved, so a log line alone says
/// which listener, peer or PEM file failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetError {
    /// A TCP listener or UDP socket could not be bound.
    #[error("bind {addr}: {source}")]
    Bind {
        /// The address we tried to bind.
        addr: SocketAddr,
        /// The operating system's (or simulator's) reason.
        source: io::Error,
    },
    /// Accepting an inbound TCP connection failed.
    #[error("accept on {addr}: {source}")]
    Accept {
        /// The listener's local address.
        addr: SocketAddr,
        /// The reason.
        source: io::Error,
    },
    /// An outbound TCP connection could not be established.
    #[error("connect {addr}: {source}")]
    Connect {
        /// The peer we dialled.
        addr: SocketAddr,
        /// The reason.
        source: io::Error,
    },
    /// A socket option or address query failed on an established socket.
    #[error("socket: {0}")]
    Socket(#[source] io::Error),

    /// A PEM file could not be read or parsed.
    #[error("{}: {source}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What went wrong (missing file, no matching section, bad base64...).
        source: rustls_pki_types::pem::Error,
    },
    /// A PEM file parsed but held no certificate.
    #[error("{}: no certificate found", path.display())]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// In-memory PEM text (not from a file) could not be parsed.
    #[error("PEM {what}: {source}")]
    PemText {
        /// Which item was expected ("certificate", "private key").
        what: &'static str,
        /// The parse error.
        source: rustls_pki_types::pem::Error,
    },
    /// Generating or signing a certificate failed.
    #[error("certificate generation: {0}")]
    CertGen(#[from] rcgen::Error),
    /// A CA certificate could not be added to a trust store.
    #[error("trust anchor: {0}")]
    TrustAnchor(#[source] rustls::Error),
    /// rustls refused the configuration (key does not match the certificate, bad versions...).
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    /// The client-certificate verifier could not be built (e.g. an empty CA set).
    #[error("client certificate verifier: {0}")]
    ClientVerifier(#[from] rustls::server::VerifierBuilderError),
    /// The TLS configuration is unusable for QUIC (QUIC requires TLS 1.3 and an initial
    /// AES-128-GCM suite).
    #[error("TLS configuration unusable for QUIC: {0}")]
    QuicTls(#[from] quinn::crypto::rustls::NoInitialCipherSuite),

    /// A QUIC transport knob is out of range.
    #[error("QUIC config {knob}: {reason}")]
    QuicConfig {
        /// The offending field of [`crate::QuicConfig`].
        knob: &'static str,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A QUIC connection attempt could not be started (no client TLS on this endpoint,
    /// invalid server name, endpoint closed...).
    #[error("QUIC connect to {addr}: {source}")]
    QuicConnect {
        /// The peer we dialled.
        addr: SocketAddr,
        /// The reason.
        source: quinn::ConnectError,
    },
    /// A QUIC connection failed or was closed (handshake refused, idle timeout, peer close...).
    #[error("QUIC connection: {0}")]
    QuicConnection(#[from] quinn::ConnectionError),
    /// A QUIC stream was already finished or reset when we tried to finish it.
    #[error("QUIC stream: {0}")]
    QuicStreamClosed(#[from] quinn::ClosedStream),

    /// A certificate chain and private key loaded but do not form a usable identity (the key
    /// does not match the certificate, or its algorithm is unsupported).
    #[error("{} with {}: {source}", cert.display(), key.display())]
    TlsIdentity {
        /// The certificate file.
        cert: PathBuf,
        /// The private key file.
        key: PathBuf,
        /// rustls' reason.
        source: rustls::Error,
    },
    /// A file (a generated certificate or key) could not be written.
    #[error("write {}: {source}", path.display())]
    WriteFile {
        /// The file.
        path: PathBuf,
        /// The reason (`AlreadyExists` when we refused to overwrite it).
        source: io::Error,
    },
    /// The listener was closed; no more connections will arrive.
    #[error("listener {addr} closed")]
    ListenerClosed {
        /// The listener's address.
        addr: SocketAddr,
    },
    /// A listener's settings do not fit its kind (e.g. PROXY protocol on QUIC).
    #[error("listener config: {reason}")]
    ListenerConfig {
        /// What is wrong.
        reason: &'static str,
    },

    /// A connection's handshake (PROXY header, TLS, WebSocket upgrade, QUIC stream) did not
    /// finish in time.
    #[error("handshake with {peer} timed out after {after:?}")]
    HandshakeTimeout {
        /// The connection's address.
        peer: SocketAddr,
        /// The limit that expired.
        after: Duration,
    },
    /// A PROXY protocol header was malformed or too long.
    #[error("PROXY header from {peer}: {source}")]
    ProxyHeader {
        /// The socket's peer (the proxy).
        peer: SocketAddr,
        /// What was wrong.
        source: ProxyError,
    },
    /// The stream failed or ended before a complete PROXY header.
    #[error("reading PROXY header from {peer}: {source}")]
    ProxyIo {
        /// The socket's peer (the proxy).
        peer: SocketAddr,
        /// The reason (`UnexpectedEof` when the peer closed).
        source: io::Error,
    },
    /// A TLS handshake failed: a wrong or missing client certificate, no shared version or
    /// cipher suite, a peer that does not speak TLS, or an I/O error.
    #[error("TLS handshake with {peer}: {source}")]
    TlsHandshake {
        /// The peer.
        peer: SocketAddr,
        /// The reason (rustls errors arrive wrapped as `InvalidData`).
        source: io::Error,
    },
    /// A server name given to a TLS client is neither a DNS name nor an IP address.
    #[error("invalid TLS server name {name:?}")]
    InvalidServerName {
        /// The name.
        name: String,
    },
    /// A WebSocket upgrade was refused by our policy (wrong path, no `mqtt` subprotocol).
    #[error("WebSocket upgrade from {peer} refused: {reason}")]
    WsRefused {
        /// The client's address.
        peer: SocketAddr,
        /// Why.
        reason: WsRefusal,
    },
    /// A WebSocket handshake failed (not HTTP, bad upgrade request, I/O error), or a client
    /// upgrade was refused by the server.
    #[error("WebSocket handshake with {peer}: {source}")]
    WsHandshake {
        /// The peer.
        peer: SocketAddr,
        /// tungstenite's reason (boxed: it is large and this path is cold).
        source: Box<tokio_tungstenite::tungstenite::Error>,
    },
}

impl NetError {
    /// True when the error means the QUIC connection ended because nothing was heard from the
    /// peer within the idle timeout.
    pub fn is_timed_out(&self) -> bool {
        matches!(
            self,
            NetError::QuicConnection(quinn::ConnectionError::TimedOut)
        )
    }
}
