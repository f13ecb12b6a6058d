use std::{io, net::SocketAddr, path::PathBuf};

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
