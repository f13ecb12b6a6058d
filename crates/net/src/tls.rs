//! TLS material: PEM loading, a small CA for node certificates, and rustls configurations.
//!
//! Every rustls configuration here is built with the ring [`CryptoProvider`] passed explicitly,
//! so nothing depends on (or races to install) a process-wide default provider.

use std::{path::Path, sync::Arc};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::{
    crypto::CryptoProvider, server::WebPkiClientVerifier, version, RootCertStore,
    SupportedProtocolVersion,
};
use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};

use crate::NetError;

/// ALPN protocol id for raft traffic between cluster nodes.
pub const ALPN_RAFT: &[u8] = b"starling-raft";
/// ALPN protocol id for MQTT (over QUIC or TLS).
pub const ALPN_MQTT: &[u8] = b"mqtt";

/// The crypto provider used for every TLS configuration in Starling: ring.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads every certificate in a PEM file, in file order (leaf first for a chain).
///
/// # Errors
/// [`NetError::Pem`] if the file cannot be read or parsed, [`NetError::NoCertificate`] if it
/// holds no `CERTIFICATE` section.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, NetError> {
    let pem_err = |source| NetError::Pem {
        path: path.to_owned(),
        source,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(pem_err)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem_err)?;
    if certs.is_empty() {
        return Err(NetError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// Reads the first private key (PKCS#8, PKCS#1 or SEC1) in a PEM file.
///
/// # Errors
/// [`NetError::Pem`] if the file cannot be read, cannot be parsed, or holds no key
/// (`NoItemsFound`).
pub fn load_private_key(path: &Path) -> Result<PrivateKeyDer<'static>, NetError> {
    PrivateKeyDer::from_pem_file(path).map_err(|source| NetError::Pem {
        path: path.to_owned(),
        source,
    })
}

fn parse_certs(pem: &str) -> Result<Vec<CertificateDer<'static>>, NetError> {
    let pem_err = |source| NetError::PemText {
        what: "certificate",
        source,
    };
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem_err)?;
    if certs.is_empty() {
        return Err(pem_err(rustls_pki_types::pem::Error::NoItemsFound));
    }
    Ok(certs)
}

/// A certificate chain and its private key: what a node presents in a TLS handshake.
#[derive(Debug)]
pub struct Identity {
    cert_chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Self {
            cert_chain: self.cert_chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

impl Identity {
    /// An identity from DER values; `cert_chain` starts with the leaf.
    pub fn new(cert_chain: Vec<CertificateDer<'static>>, key: PrivateKeyDer<'static>) -> Self {
        Self { cert_chain, key }
    }

    /// Loads the chain from `cert_path` and the key from `key_path` (both PEM).
    ///
    /// # Errors
    /// As [`load_certs`] and [`load_private_key`]; the error names the failing file.
    pub fn from_pem_files(cert_path: &Path, key_path: &Path) -> Result<Self, NetError> {
        Ok(Self::new(
            load_certs(cert_path)?,
            load_private_key(key_path)?,
        ))
    }

    /// Parses PEM text: a certificate chain and a private key.
    ///
    /// # Errors
    /// [`NetError::PemText`] when either part is missing or malformed.
    pub fn from_pem(cert_chain_pem: &str, key_pem: &str) -> Result<Self, NetError> {
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|source| {
            NetError::PemText {
                what: "private key",
                source,
            }
        })?;
        Ok(Self::new(parse_certs(cert_chain_pem)?, key))
    }

    /// The certificate chain, leaf first.
    pub fn cert_chain(&self) -> &[CertificateDer<'static>] {
        &self.cert_chain
    }
}

/// A certificate authority that signs node certificates (backs `starling cert`).
///
/// Keys are Ed25519: its signatures have a fixed length, so handshakes have the same packet
/// sizes whatever the random bytes, which keeps simulations deterministic in their schedule.
pub struct CertAuthority {
    cert: CertificateDer<'static>,
    cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for CertAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The signing key stays out of logs.
        f.debug_struct("CertAuthority").finish_non_exhaustive()
    }
}

/// A freshly issued node certificate and its key.
#[derive(Debug, Clone)]
pub struct IssuedCert {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The private key (PKCS#8), PEM. Write it with owner-only permissions.
    pub key_pem: String,
    identity: Identity,
}

impl IssuedCert {
    /// The certificate and key as a TLS identity (chain = the leaf alone; peers hold the CA).
    pub fn identity(&self) -> Identity {
        self.identity.clone()
    }
}

impl CertAuthority {
    /// Generates a new self-signed CA named `common_name`.
    ///
    /// # Errors
    /// [`NetError::CertGen`] if key generation or signing fails.
    pub fn generate(common_name: &str) -> Result<Self, NetError> {
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        // Path length 0: this CA signs node certificates only, never another CA.
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate_for(&rcgen::PKCS_ED25519)?;
        let cert = params.self_signed(&key)?;
        Ok(Self {
            cert: cert.der().clone(),
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// Loads an existing CA from its certificate and private key (PEM text).
    ///
    /// # Errors
    /// [`NetError::PemText`] or [`NetError::CertGen`] when either cannot be parsed.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, NetError> {
        let cert = parse_certs(cert_pem)?.swap_remove(0);
        let key = KeyPair::from_pem(key_pem)?;
        let issuer = Issuer::from_ca_cert_der(&cert, key)?;
        Ok(Self {
            cert,
            cert_pem: cert_pem.to_owned(),
            issuer,
        })
    }

    /// Loads an existing CA from PEM files.
    ///
    /// # Errors
    /// As [`CertAuthority::from_pem`], plus [`NetError::Pem`] naming an unreadable file.
    pub fn from_pem_files(cert_path: &Path, key_path: &Path) -> Result<Self, NetError> {
        let read = |path: &Path| {
            std::fs::read_to_string(path).map_err(|e| NetError::Pem {
                path: path.to_owned(),
                source: rustls_pki_types::pem::Error::Io(e),
            })
        };
        Self::from_pem(&read(cert_path)?, &read(key_path)?)
    }

    /// The CA certificate (DER): the trust anchor to give every node.
    pub fn cert_der(&self) -> CertificateDer<'static> {
        self.cert.clone()
    }

    /// The CA certificate, PEM (as generated, or as loaded).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA private key (PKCS#8), PEM. Write it with owner-only permissions.
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// Issues a node certificate for `common_name`, valid as both TLS server and TLS client
    /// (cluster links are mutual TLS), for each of `subject_alt_names` (DNS names, or IP
    /// addresses when they parse as one). Peers dial a node by one of these names.
    ///
    /// Validity is rcgen's default window (1975 to 4096): rotation is by re-issuing.
    ///
    /// # Errors
    /// [`NetError::CertGen`] on an invalid name or a signing failure.
    pub fn issue(
        &self,
        common_name: &str,
        subject_alt_names: &[&str],
    ) -> Result<IssuedCert, NetError> {
        let sans: Vec<String> = subject_alt_names.iter().map(|s| (*s).to_owned()).collect();
        let mut params = CertificateParams::new(sans)?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate_for(&rcgen::PKCS_ED25519)?;
        let cert = params.signed_by(&key, &self.issuer)?;
        let key_der = PrivateKeyDer::Pkcs8(key.serialize_der().into());
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            identity: Identity::new(vec![cert.der().clone()], key_der),
        })
    }
}

/// Which TLS versions a configuration accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsVersions {
    /// TLS 1.3 only: required by QUIC, and used between cluster nodes.
    Tls13,
    /// TLS 1.2 and 1.3: for MQTT clients over TCP that predate 1.3.
    Tls12And13,
}

impl TlsVersions {
    fn list(self) -> &'static [&'static SupportedProtocolVersion] {
        static TLS13: &[&SupportedProtocolVersion] = &[&version::TLS13];
        static TLS12_AND_13: &[&SupportedProtocolVersion] = &[&version::TLS13, &version::TLS12];
        match self {
            TlsVersions::Tls13 => TLS13,
            TlsVersions::Tls12And13 => TLS12_AND_13,
        }
    }
}

fn root_store(cas: &[CertificateDer<'static>]) -> Result<RootCertStore, NetError> {
    let mut roots = RootCertStore::empty();
    for ca in cas {
        roots.add(ca.clone()).map_err(NetError::TrustAnchor)?;
    }
    Ok(roots)
}

/// Server-side TLS settings: our identity, optional client-certificate verification, ALPN.
#[derive(Debug, Clone)]
pub struct ServerTls {
    identity: Identity,
    client_cas: Option<Vec<CertificateDer<'static>>>,
    /// With `client_cas`: a client may also present no certificate at all.
    client_cert_optional: bool,
    alpn: Vec<Vec<u8>>,
}

impl ServerTls {
    /// A server presenting `identity`, accepting any client (no client certificates).
    pub fn new(identity: Identity) -> Self {
        Self {
            identity,
            client_cas: None,
            client_cert_optional: false,
            alpn: Vec::new(),
        }
    }

    /// Requires every client to present a certificate chaining to one of `cas` (mutual TLS);
    /// other clients fail the handshake.
    pub fn require_client_cert(mut self, cas: Vec<CertificateDer<'static>>) -> Self {
        self.client_cas = Some(cas);
        self.client_cert_optional = false;
        self
    }

    /// Asks clients for a certificate chaining to one of `cas` but also accepts clients that
    /// present none; a client presenting a certificate that does not verify still fails.
    pub fn optional_client_cert(mut self, cas: Vec<CertificateDer<'static>>) -> Self {
        self.client_cas = Some(cas);
        self.client_cert_optional = true;
        self
    }

    /// Sets the ALPN protocols offered, in preference order (e.g. [`ALPN_RAFT`]). A client that
    /// offers ALPN but none of these fails the handshake.
    pub fn alpn(mut self, protocols: &[&[u8]]) -> Self {
        self.alpn = protocols.iter().map(|p| p.to_vec()).collect();
        self
    }

    /// Builds the rustls configuration (ring provider).
    ///
    /// # Errors
    /// [`NetError::Tls`] if the key does not suit the certificate,
    /// [`NetError::ClientVerifier`] or [`NetError::TrustAnchor`] for an unusable CA set.
    pub fn rustls_config(
        &self,
        versions: TlsVersions,
    ) -> Result<Arc<rustls::ServerConfig>, NetError> {
        let provider = crypto_provider();
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(versions.list())?;
        let builder = match &self.client_cas {
            None => builder.with_no_client_auth(),
            Some(cas) => {
                let verifier = WebPkiClientVerifier::builder_with_provider(
                    Arc::new(root_store(cas)?),
                    provider,
                );
                let verifier = if self.client_cert_optional {
                    verifier.allow_unauthenticated()
                } else {
                    verifier
                }
                .build()?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_single_cert(
            self.identity.cert_chain.clone(),
            self.identity.key.clone_key(),
        )?;
        config.alpn_protocols = self.alpn.clone();
        Ok(Arc::new(config))
    }
}

/// Client-side TLS settings: trusted CAs, an optional client certificate, ALPN.
#[derive(Debug, Clone)]
pub struct ClientTls {
    roots: Vec<CertificateDer<'static>>,
    identity: Option<Identity>,
    alpn: Vec<Vec<u8>>,
}

impl ClientTls {
    /// A client trusting servers whose certificates chain to one of `roots`.
    pub fn new(roots: Vec<CertificateDer<'static>>) -> Self {
        Self {
            roots,
            identity: None,
            alpn: Vec::new(),
        }
    }

    /// Presents `identity` when the server asks for a client certificate (mutual TLS).
    pub fn identity(mut self, identity: Identity) -> Self {
        self.identity = Some(identity);
        self
    }

    /// Sets the ALPN protocols offered, in preference order.
    pub fn alpn(mut self, protocols: &[&[u8]]) -> Self {
        self.alpn = protocols.iter().map(|p| p.to_vec()).collect();
        self
    }

    /// Builds the rustls configuration (ring provider).
    ///
    /// # Errors
    /// [`NetError::TrustAnchor`] for an unusable CA, [`NetError::Tls`] for a bad identity.
    pub fn rustls_config(
        &self,
        versions: TlsVersions,
    ) -> Result<Arc<rustls::ClientConfig>, NetError> {
        let builder = rustls::ClientConfig::builder_with_provider(crypto_provider())
            .with_protocol_versions(versions.list())?
            .with_root_certificates(root_store(&self.roots)?);
        let mut config = match &self.identity {
            None => builder.with_no_client_auth(),
            Some(id) => builder.with_client_auth_cert(id.cert_chain.clone(), id.key.clone_key())?,
        };
        config.alpn_protocols = self.alpn.clone();
        Ok(Arc::new(config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ca_pem_parses_back_to_the_same_certificate() {
        let ca = CertAuthority::generate("test-ca").unwrap();
        let parsed = parse_certs(ca.cert_pem()).unwrap();
        assert_eq!(parsed, vec![ca.cert_der()]);
    }

    #[test]
    fn ca_reloaded_from_pem_issues_certs_that_the_original_ca_validates() {
        let ca = CertAuthority::generate("test-ca").unwrap();
        let reloaded = CertAuthority::from_pem(ca.cert_pem(), &ca.key_pem()).unwrap();
        let node = reloaded.issue("node-1", &["node-1"]).unwrap();
        // A server config with the original CA as client CA accepts the chain shape; the real
        // signature check is exercised by the QUIC handshake tests.
        ServerTls::new(node.identity())
            .require_client_cert(vec![ca.cert_der()])
            .rustls_config(TlsVersions::Tls13)
            .unwrap();
        Identity::from_pem(&node.cert_pem, &node.key_pem).unwrap();
    }

    #[test]
    fn loading_a_missing_pem_file_names_the_file() {
        let err = load_certs(Path::new("no/such/dir/cert.pem")).unwrap_err();
        assert!(err.to_string().contains("no/such/dir/cert.pem"), "{err}");
    }
}
