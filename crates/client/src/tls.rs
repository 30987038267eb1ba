//! Whether a connection uses TLS, and whom it trusts.
//!
//! Off loopback TLS is the default (`Options::tls`; `FERRY_TLS=0` turns it
//! off, `=1` on for any address, through `Options::tls_from_env`); on loopback a server that requires it says so
//! (`ENOPROTOOPT`) and the client connects again with it — never the other
//! way: a client that asked for TLS does not fall back to plaintext.
//!
//! Trust, as ssh trusts host keys: the first certificate a server shows is
//! stored under `$XDG_CONFIG_HOME/ferry/known_servers` (`HOST:PORT
//! sha256:…`) and every later connection must show the same, or is refused
//! loudly. `FERRY_TLS_FINGERPRINT=sha256:…` pins one certificate instead;
//! `FERRY_TLS_CA=FILE` verifies the server against those CA certificates
//! and its name, as a browser would.

use std::io::Write;
use std::net::ToSocketAddrs;
use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use crate::error::{Error, Result};

/// Whether to use TLS with the server at `addr` (`HOST:PORT`), and
/// whether that was asked for (`Options::tls`) rather than chosen.
pub(crate) fn wanted(addr: &str, option: Option<bool>) -> (bool, bool) {
    if addr.starts_with("unix:") {
        return (false, false);
    }
    match option {
        Some(t) => (t, true),
        None => (!is_loopback(addr), false),
    }
}

/// Whom a client's TLS trusts (see the module's comment).
#[derive(Clone, Debug, Default)]
pub struct Trust {
    /// CA certificates (PEM) to verify servers against, with their names.
    pub ca: Option<PathBuf>,
    /// The one certificate (`sha256:…`) to accept.
    pub fingerprint: Option<String>,
    /// Where first-seen certificates are kept; `None`: trusted for the
    /// process only (said on stderr).
    pub known_servers: Option<PathBuf>,
}

/// Whether every address `addr` names is on this host's loopback.
pub(crate) fn is_loopback(addr: &str) -> bool {
    match addr.to_socket_addrs() {
        Ok(mut all) => all.all(|a| a.ip().is_loopback()),
        Err(_) => false,
    }
}

/// The server name TLS is asked for: the host part of `addr`.
pub(crate) fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Where first-seen certificates are kept.
pub fn known_servers_file() -> Option<PathBuf> {
    crate::token::config_dir().map(|d| d.join("known_servers"))
}

/// The client configuration for `addr`.
pub(crate) fn config(addr: &str, trust: &Trust) -> Result<Arc<rustls::ClientConfig>> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| Error::Protocol(format!("TLS: {e}")))?;
    let mut config = match &trust.ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            use rustls::pki_types::pem::PemObject;
            let certs = CertificateDer::pem_file_iter(ca)
                .and_then(|i| i.collect::<std::result::Result<Vec<_>, _>>())
                .map_err(|e| Error::Protocol(format!("TLS CA {}: {e}", ca.display())))?;
            for c in certs {
                roots.add(c).map_err(|e| Error::Protocol(format!("TLS CA {}: {e}", ca.display())))?;
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Pinned {
                addr: addr.to_string(),
                expect: trust.fingerprint.clone(),
                file: trust.known_servers.clone(),
                provider: provider(),
            }))
            .with_no_client_auth(),
    };
    config.enable_secret_extraction = true;
    config.resumption = rustls::client::Resumption::disabled();
    Ok(Arc::new(config))
}

/// Trust on first use, or one pinned certificate.
#[derive(Debug)]
struct Pinned {
    addr: String,
    expect: Option<String>,
    file: Option<PathBuf>,
    provider: Arc<CryptoProvider>,
}

fn refuse(msg: String) -> rustls::Error {
    rustls::Error::General(msg)
}

impl Pinned {
    fn known(&self) -> Option<String> {
        let text = std::fs::read_to_string(self.file.as_ref()?).ok()?;
        text.lines().find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some(self.addr.as_str())).then(|| w.next().unwrap_or_default().to_string())
        })
    }

    fn store(&self, fp: &str) -> std::io::Result<PathBuf> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let file = self.file.clone().ok_or_else(|| std::io::Error::other("no HOME or XDG_CONFIG_HOME"))?;
        if let Some(dir) = file.parent() {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        }
        let mut f = std::fs::OpenOptions::new().append(true).create(true).mode(0o600).open(&file)?;
        writeln!(f, "{} {fp}", self.addr)?;
        Ok(file)
    }
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let fp = ferry_sock::tls::fingerprint(end_entity);
        if let Some(want) = &self.expect {
            return match *want == fp {
                true => Ok(ServerCertVerified::assertion()),
                false => Err(refuse(format!(
                    "the TLS certificate of {} is {fp}, not the {want} FERRY_TLS_FINGERPRINT names",
                    self.addr
                ))),
            };
        }
        match self.known() {
            Some(k) if k == fp => Ok(ServerCertVerified::assertion()),
            Some(k) => Err(refuse(format!(
                "the TLS certificate of {} CHANGED: it was {k}, it is now {fp}. Someone may be in between; if the \
                 server's certificate was replaced on purpose, remove its line from {}",
                self.addr,
                self.file.as_ref().map_or_else(String::new, |f| f.display().to_string())
            ))),
            None => {
                match self.store(&fp) {
                    Ok(file) => eprintln!(
                        "ferry: {}: first TLS connection; its certificate {fp} is trusted from now on (kept in {})",
                        self.addr,
                        file.display()
                    ),
                    Err(e) => eprintln!(
                        "ferry: {}: first TLS connection; its certificate {fp} is trusted for now (not kept: {e})",
                        self.addr
                    ),
                }
                Ok(ServerCertVerified::assertion())
            }
        }
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        Err(refuse("TLS 1.2 is not spoken here".into()))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}
