//! The server's TLS identity: a certificate and key from files, made
//! (self-signed) on first use when there are none, and the certificate's
//! fingerprint, which clients pin on first use as ssh does host keys.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// What the server serves TLS with.
pub struct Identity {
    pub config: Arc<rustls::ServerConfig>,
    /// `sha256:` and the hex SHA-256 of the certificate, as clients show it.
    pub fingerprint: String,
    /// Whether it was made just now.
    pub made: bool,
}

/// Loads the certificate chain at `cert` and the key at `key`; if neither
/// file exists, makes a self-signed pair there first.
pub fn load_or_make(cert: &Path, key: &Path) -> Result<Identity, String> {
    let made = !cert.exists() && !key.exists();
    if made {
        make(cert, key)?;
    }
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|i| i.collect::<Result<_, _>>())
        .map_err(|e| format!("{}: {e}", cert.display()))?;
    let first = chain.first().ok_or_else(|| format!("{}: no certificate in it", cert.display()))?;
    let fingerprint = ferry_sock::tls::fingerprint(first);
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{}: {e}", key.display()))?;
    let config = config(chain, key).map_err(|e| format!("{}: {e}", cert.display()))?;
    Ok(Identity { config, fingerprint, made })
}

/// What the server serves TLS with, for a certificate chain and its key.
pub(crate) fn config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<rustls::ServerConfig>, String> {
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| e.to_string())?;
    // The record layer is ours after the handshake (ferry_sock::tls).
    config.enable_secret_extraction = true;
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}

fn make(cert: &Path, key: &Path) -> Result<(), String> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string();
    let names = if host.is_empty() { vec!["ferry".to_string()] } else { vec!["ferry".to_string(), host] };
    let pair = rcgen::generate_simple_self_signed(names).map_err(|e| format!("cannot make a TLS certificate: {e}"))?;
    for p in [cert, key] {
        if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| format!("{}: {e}", dir.display()))?;
        }
    }
    let write = |p: &Path, text: String, mode: u32| {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(p)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(|e| format!("{}: {e}", p.display()))
    };
    write(key, pair.key_pair.serialize_pem(), 0o600)?;
    write(cert, pair.cert.pem(), 0o644)
}
