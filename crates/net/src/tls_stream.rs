//! TLS over byte streams: a server-side acceptor whose certificate can be swapped while it
//! runs, certificate files for listeners, and a client-side connector.

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, PoisonError, RwLock},
};

use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::{load_certs, ClientTls, Identity, NetError, ServerTls, TlsVersions};

/// Whether, and against which CA file, a TLS listener verifies client certificates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientAuth {
    /// Clients are not asked for a certificate.
    None,
    /// Clients may present a certificate; one that does not chain to the CAs in this PEM
    /// file fails the handshake, no certificate at all is accepted.
    Optional(PathBuf),
    /// Every client must present a certificate chaining to the CAs in this PEM file.
    Required(PathBuf),
}

/// A TLS listener's certificate material as PEM files, re-read by [`TlsFiles::load`] at start
/// and on each reload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server certificate chain, leaf first.
    pub cert: PathBuf,
    /// The server's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// Client-certificate verification.
    pub client_auth: ClientAuth,
}

impl TlsFiles {
    /// Reads the files and checks that they form a usable server configuration.
    ///
    /// # Errors
    /// [`NetError::Pem`] or [`NetError::NoCertificate`] naming the file that did not load,
    /// [`NetError::TlsIdentity`] naming both files when the key does not match the
    /// certificate, CA errors when the client CA file holds no usable certificate.
    pub fn load(&self) -> Result<ServerTls, NetError> {
        let identity = Identity::from_pem_files(&self.cert, &self.key)?;
        let tls = ServerTls::new(identity);
        let tls = match &self.client_auth {
            ClientAuth::None => tls,
            ClientAuth::Optional(ca) => tls.optional_client_cert(load_certs(ca)?),
            ClientAuth::Required(ca) => tls.require_client_cert(load_certs(ca)?),
        };
        // Build once now so a key that does not match its certificate is reported with the
        // file names, at load time rather than at the first handshake.
        tls.rustls_config(TlsVersions::Tls12And13)
            .map_err(|e| match e {
                NetError::Tls(source) => NetError::TlsIdentity {
                    cert: self.cert.clone(),
                    key: self.key.clone(),
                    source,
                },
                other => other,
            })?;
        Ok(tls)
    }
}

/// Server-side TLS for byte streams (TLS 1.2 and 1.3), with a configuration that can be
/// replaced while connections run.
///
/// Clones share the configuration: [`TlsAcceptor::reload`] on any clone applies to the next
/// handshake on all of them. Established connections keep the configuration they were
/// accepted with.
#[derive(Debug, Clone)]
pub struct TlsAcceptor {
    // A lock rather than a message: the value is one immutable `Arc` read once per handshake
    // and swapped on a rare operator reload; readers never hold the lock across an await.
    config: Arc<RwLock<Arc<rustls::ServerConfig>>>,
}

/// A TLS stream accepted by a [`TlsAcceptor`] on top of `IO`.
pub type ServerTlsStream<IO> = tokio_rustls::server::TlsStream<IO>;
/// A TLS stream opened by [`tls_connect`] on top of `IO`.
pub type ClientTlsStream<IO> = tokio_rustls::client::TlsStream<IO>;

impl TlsAcceptor {
    /// An acceptor presenting `tls`'s identity, accepting TLS 1.2 and 1.3.
    ///
    /// # Errors
    /// As [`ServerTls::rustls_config`].
    pub fn new(tls: &ServerTls) -> Result<Self, NetError> {
        let config = tls.rustls_config(TlsVersions::Tls12And13)?;
        Ok(Self {
            config: Arc::new(RwLock::new(config)),
        })
    }

    /// Replaces the configuration for handshakes that start from now on.
    ///
    /// # Errors
    /// As [`ServerTls::rustls_config`]; on error the previous configuration stays in force.
    pub fn reload(&self, tls: &ServerTls) -> Result<(), NetError> {
        let config = tls.rustls_config(TlsVersions::Tls12And13)?;
        // Poisoning cannot leave the slot half-written: it holds a single `Arc`.
        *self.config.write().unwrap_or_else(PoisonError::into_inner) = config;
        Ok(())
    }

    fn current(&self) -> Arc<rustls::ServerConfig> {
        self.config
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Runs the server handshake on `io` with the current configuration. No timeout is
    /// applied here: listeners wrap this in their handshake timeout.
    ///
    /// # Errors
    /// [`NetError::TlsHandshake`] naming `peer`.
    pub async fn accept<IO>(
        &self,
        io: IO,
        peer: SocketAddr,
    ) -> Result<ServerTlsStream<IO>, NetError>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        tokio_rustls::TlsAcceptor::from(self.current())
            .accept(io)
            .await
            .map_err(|source| NetError::TlsHandshake { peer, source })
    }
}

/// The common name (CN) in the subject of `cert`, if it has one in UTF-8 or ASCII form.
///
/// Call it only on a certificate the handshake verified: otherwise the name is whatever the
/// client wrote.
pub fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let cn = parsed.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_owned)
}

/// The CN of the leaf certificate a TLS client presented, if any.
pub(crate) fn client_cn<IO>(stream: &ServerTlsStream<IO>) -> Option<String> {
    let (_, conn) = stream.get_ref();
    common_name(conn.peer_certificates()?.first()?)
}

/// Runs a TLS client handshake (TLS 1.2 or 1.3) on `io`, checking the server's certificate
/// against `server_name` (a DNS name or an IP address). For clients and tests.
///
/// # Errors
/// [`NetError::InvalidServerName`], configuration errors from [`ClientTls::rustls_config`],
/// [`NetError::TlsHandshake`] naming `peer`.
pub async fn tls_connect<IO>(
    io: IO,
    tls: &ClientTls,
    server_name: &str,
    peer: SocketAddr,
) -> Result<ClientTlsStream<IO>, NetError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let name =
        ServerName::try_from(server_name.to_owned()).map_err(|_| NetError::InvalidServerName {
            name: server_name.to_owned(),
        })?;
    let config = tls.rustls_config(TlsVersions::Tls12And13)?;
    tokio_rustls::TlsConnector::from(config)
        .connect(name, io)
        .await
        .map_err(|source| NetError::TlsHandshake { peer, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CertAuthority;

    #[test]
    fn common_name_is_read_from_an_issued_certificate() {
        let ca = CertAuthority::generate("ca").unwrap();
        let leaf = ca.issue("device-42", &["device-42"]).unwrap().identity();
        assert_eq!(
            common_name(&leaf.cert_chain()[0]).as_deref(),
            Some("device-42")
        );
        assert_eq!(common_name(&CertificateDer::from(vec![1, 2, 3])), None);
    }

    #[test]
    fn tls_files_errors_name_the_file_that_did_not_load() {
        let dir =
            std::env::temp_dir().join(format!("starling-net-tlsfiles-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let dev = crate::write_dev_certificates(&dir, &[]).unwrap();
        let good = dev.tls_files();
        good.load().unwrap();

        let missing = TlsFiles {
            cert: dir.join("absent.pem"),
            ..good.clone()
        };
        let err = missing.load().unwrap_err();
        assert!(err.to_string().contains("absent.pem"), "{err}");

        // A key file holding only a certificate: no key in it.
        let no_key = TlsFiles {
            key: dev.server_cert.clone(),
            ..good.clone()
        };
        let err = no_key.load().unwrap_err();
        assert!(
            matches!(&err, NetError::Pem { path, .. } if *path == dev.server_cert),
            "{err}"
        );

        // The CA's key with the server's certificate: both files named.
        let mismatch = TlsFiles {
            key: dev.ca_key.clone(),
            ..good.clone()
        };
        let err = mismatch.load().unwrap_err();
        assert!(matches!(err, NetError::TlsIdentity { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("server.pem") && text.contains("ca.key"),
            "{text}"
        );

        let bad_ca = TlsFiles {
            client_auth: ClientAuth::Required(dev.server_key.clone()),
            ..good
        };
        let err = bad_ca.load().unwrap_err();
        assert!(err.to_string().contains("server.key"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
