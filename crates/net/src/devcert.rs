//! Self-signed development certificates for a first run without real ones (backs
//! `starling cert dev`).

use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::{ClientAuth, NetError, TlsFiles};

/// The PEM files written by [`write_dev_certificates`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevCertFiles {
    /// The development CA certificate: what clients trust (`mosquitto_sub --cafile`).
    pub ca_cert: PathBuf,
    /// The CA's private key (owner-only permissions), to issue more certificates later.
    pub ca_key: PathBuf,
    /// The server certificate.
    pub server_cert: PathBuf,
    /// The server's private key (owner-only permissions).
    pub server_key: PathBuf,
}

impl DevCertFiles {
    /// The server side of these files as a TLS listener's settings (no client certificates).
    pub fn tls_files(&self) -> TlsFiles {
        TlsFiles {
            cert: self.server_cert.clone(),
            key: self.server_key.clone(),
            client_auth: ClientAuth::None,
        }
    }
}

/// Generates a development CA and a server certificate signed by it, valid for `localhost`,
/// `127.0.0.1`, `::1` and each of `extra_names` (DNS names or IP addresses), and writes them
/// to `dir` (created if missing) as `ca.pem`, `ca.key`, `server.pem`, `server.key`.
///
/// Keys are ECDSA P-256, which every TLS client takes, browsers included (they refuse
/// Ed25519 certificates). Existing files are never overwritten.
///
/// # Errors
/// [`NetError::WriteFile`] naming the file (`AlreadyExists` if it is there already),
/// [`NetError::CertGen`] for an invalid name.
pub fn write_dev_certificates(dir: &Path, extra_names: &[&str]) -> Result<DevCertFiles, NetError> {
    let files = DevCertFiles {
        ca_cert: dir.join("ca.pem"),
        ca_key: dir.join("ca.key"),
        server_cert: dir.join("server.pem"),
        server_key: dir.join("server.key"),
    };
    // Refuse before generating anything, so a second run leaves the first run's files whole.
    for path in [
        &files.ca_cert,
        &files.ca_key,
        &files.server_cert,
        &files.server_key,
    ] {
        if path.exists() {
            return Err(NetError::WriteFile {
                path: path.clone(),
                source: std::io::ErrorKind::AlreadyExists.into(),
            });
        }
    }

    let alg = &rcgen::PKCS_ECDSA_P256_SHA256;
    let mut ca_params = CertificateParams::default();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "Starling development CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate_for(alg)?;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let ca_cert_pem = ca_cert.pem();
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = Issuer::new(ca_params, ca_key);

    let mut names: Vec<String> = ["localhost", "127.0.0.1", "::1"]
        .into_iter()
        .chain(extra_names.iter().copied())
        .map(str::to_owned)
        .collect();
    names.dedup();
    let mut params = CertificateParams::new(names)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "Starling development server");
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate_for(alg)?;
    let cert = params.signed_by(&key, &issuer)?;

    fs::create_dir_all(dir).map_err(|source| NetError::WriteFile {
        path: dir.to_owned(),
        source,
    })?;
    write_new(&files.ca_cert, &ca_cert_pem, false)?;
    write_new(&files.ca_key, &ca_key_pem, true)?;
    write_new(&files.server_cert, &cert.pem(), false)?;
    write_new(&files.server_key, &key.serialize_pem(), true)?;
    Ok(files)
}

/// Writes `text` to a file that must not exist yet; `secret` files are owner-only on Unix.
fn write_new(path: &Path, text: &str, secret: bool) -> Result<(), NetError> {
    let err = |source| NetError::WriteFile {
        path: path.to_owned(),
        source,
    };
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(if secret { 0o600 } else { 0o644 });
    }
    #[cfg(not(unix))]
    let _ = secret;
    let mut file = options.open(path).map_err(err)?;
    file.write_all(text.as_bytes()).map_err(err)?;
    file.sync_all().map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "starling-net-devcert-{name}-{}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn dev_certificates_load_as_a_tls_listener_and_are_not_overwritten() {
        let dir = temp_dir("load");
        let files = write_dev_certificates(&dir, &["broker.local"]).unwrap();
        files.tls_files().load().unwrap();
        crate::load_certs(&files.ca_cert).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&files.server_key)
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o077, 0, "key readable by others: {mode:o}");
        }
        let err = write_dev_certificates(&dir, &[]).unwrap_err();
        assert!(
            matches!(&err, NetError::WriteFile { path, source }
                if path.ends_with("ca.pem") && source.kind() == std::io::ErrorKind::AlreadyExists),
            "{err}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
