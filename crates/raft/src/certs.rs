//! Cluster certificates on disk: a CA and one certificate per node, named as the QUIC
//! transport expects (common name and DNS name `node-<id>`). Backs the `cert` example (the
//! `starling cert` command).
//!
//! Files in one directory: `ca.pem`, `ca.key`, `node-<id>.pem`, `node-<id>.key`. Keys are
//! written owner-only (0600 on Unix). Copy `ca.pem` and a node's own pair to each node;
//! `ca.key` belongs on no node (keep it offline to issue more).

use std::path::{Path, PathBuf};

use starling_net::{CertAuthority, Identity};

use crate::error::{io_err, Result};
use crate::quic::{node_name, NodeTls};

/// Paths of the files for node `id` in `dir`: (certificate, key).
pub fn node_files(dir: &Path, id: u64) -> (PathBuf, PathBuf) {
    let n = node_name(id);
    (dir.join(format!("{n}.pem")), dir.join(format!("{n}.key")))
}

/// Creates `dir/ca.pem` and `dir/ca.key` unless they exist, and returns the CA (loaded from
/// the files when they do).
pub fn ensure_ca(dir: &Path) -> Result<CertAuthority> {
    let (cert, key) = (dir.join("ca.pem"), dir.join("ca.key"));
    if cert.exists() && key.exists() {
        return Ok(CertAuthority::from_pem_files(&cert, &key)?);
    }
    std::fs::create_dir_all(dir).map_err(io_err("create dir", &dir.display().to_string()))?;
    let ca = CertAuthority::generate("starling cluster CA")?;
    write(&cert, ca.cert_pem(), false)?;
    write(&key, &ca.key_pem(), true)?;
    Ok(ca)
}

/// Issues node `id`'s certificate (names: `node-<id>` plus `extra_names`, DNS names or IP
/// addresses) with the CA in `dir` (created if missing), replacing any previous one.
/// Returns the certificate's path.
pub fn issue_node(dir: &Path, id: u64, extra_names: &[&str]) -> Result<PathBuf> {
    let ca = ensure_ca(dir)?;
    let name = node_name(id);
    let mut names = vec![name.as_str()];
    names.extend_from_slice(extra_names);
    let issued = ca.issue(&name, &names)?;
    let (cert, key) = node_files(dir, id);
    write(&cert, &issued.cert_pem, false)?;
    write(&key, &issued.key_pem, true)?;
    Ok(cert)
}

/// Loads node `id`'s TLS material from `dir` (its pair and `ca.pem`).
pub fn load_node_tls(dir: &Path, id: u64) -> Result<NodeTls> {
    let (cert, key) = node_files(dir, id);
    let identity = Identity::from_pem_files(&cert, &key)?;
    let ca = starling_net::load_certs(&dir.join("ca.pem"))?.swap_remove(0);
    Ok(NodeTls { identity, ca })
}

fn write(path: &Path, text: &str, secret: bool) -> Result<()> {
    let file = path.display().to_string();
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = secret;
    let mut f = opts.open(path).map_err(io_err("create", &file))?;
    std::io::Write::write_all(&mut f, text.as_bytes()).map_err(io_err("write", &file))?;
    f.sync_all().map_err(io_err("sync", &file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_node_certificates_load_and_share_one_ca() {
        let dir = std::env::temp_dir().join(format!("starling-certs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        issue_node(&dir, 1, &["127.0.0.1"]).unwrap();
        let ca_before = std::fs::read(dir.join("ca.pem")).unwrap();
        issue_node(&dir, 2, &[]).unwrap();
        assert_eq!(std::fs::read(dir.join("ca.pem")).unwrap(), ca_before);
        let a = load_node_tls(&dir, 1).unwrap();
        let b = load_node_tls(&dir, 2).unwrap();
        assert_eq!(a.ca, b.ca);
        let cn = starling_net::common_name(&a.identity.cert_chain()[0]).unwrap();
        assert_eq!(crate::quic::parse_node_name(&cn), Some(1));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.join("node-1.key"))
                .unwrap()
                .permissions();
            assert_eq!(mode.mode() & 0o777, 0o600);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
