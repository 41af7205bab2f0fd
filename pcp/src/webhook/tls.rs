//! The webhook's serving certificate: loaded from `--tls-cert`/`--tls-key`, or, in development,
//! issued at start by a freshly made CA whose certificate is written out for clients (the API
//! server's `caBundle`, curl's `--cacert`).

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {message}")]
    Read { path: String, message: String },
    #[error("{path}: no certificate found (expected PEM \"CERTIFICATE\" blocks)")]
    NoCertificate { path: String },
    #[error("the certificate and key do not make a usable TLS configuration: {0}")]
    Config(#[source] rustls::Error),
    #[error("cannot generate the development certificate: {0}")]
    Generate(#[source] rcgen::Error),
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// A ready server configuration, and where its CA certificate was written when generated.
pub struct ServingCert {
    pub config: Arc<ServerConfig>,
    pub generated_ca: Option<PathBuf>,
    /// The certificate and key files it was loaded from, to reload when they are rotated.
    pub files: Option<(PathBuf, PathBuf)>,
}

/// When a certificate or key file was last changed (`None` if it cannot be read).
pub fn modified(
    files: &(PathBuf, PathBuf),
) -> Option<(std::time::SystemTime, std::time::SystemTime)> {
    let time = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    Some((time(&files.0)?, time(&files.1)?))
}

/// The process-wide crypto provider (ring); harmless when already installed.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<ServerConfig>, TlsError> {
    install_crypto_provider();
    let mut config = ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(TlsError::Config)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Loads a PEM certificate chain and private key.
pub fn load(cert: &Path, key: &Path) -> Result<ServingCert, TlsError> {
    let read_err = |path: &Path, e: &dyn std::fmt::Display| TlsError::Read {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| read_err(cert, &e))?
        .collect::<Result<_, _>>()
        .map_err(|e| read_err(cert, &e))?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: cert.display().to_string(),
        });
    }
    let key_path = key;
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| read_err(key, &e))?;
    Ok(ServingCert {
        config: server_config(chain, key_der)?,
        generated_ca: None,
        files: Some((cert.to_path_buf(), key_path.to_path_buf())),
    })
}

/// The development CA's identity; the same on every start, so that a CA certificate handed out
/// earlier keeps verifying the certificates a restarted PCP issues with the same CA key.
fn development_ca_params() -> Result<CertificateParams, TlsError> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(TlsError::Generate)?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "PASA webhook development CA");
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    Ok(params)
}

fn write_file(path: &Path, text: &str, private: bool) -> Result<(), TlsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    if private {
        options.mode(0o600);
    }
    options
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|source| TlsError::Write {
            path: path.display().to_string(),
            source,
        })
}

/// Issues a serving certificate for `localhost`, the loopback addresses and the listen address,
/// signed by a development CA kept in `dir` (`ca.crt`, `ca.key`; made on first use and reused
/// after, so clients keep trusting it across restarts), writes `tls.crt` and `tls.key` beside it
/// (keys readable by the owner only), and returns the serving configuration.
pub fn generate(dir: &Path, listen: SocketAddr) -> Result<ServingCert, TlsError> {
    std::fs::create_dir_all(dir).map_err(|source| TlsError::Write {
        path: dir.display().to_string(),
        source,
    })?;
    let (ca_path, ca_key_path) = (dir.join("ca.crt"), dir.join("ca.key"));
    let ca_params = development_ca_params()?;
    let existing_key = match (ca_path.exists(), std::fs::read_to_string(&ca_key_path)) {
        (true, Ok(pem)) => KeyPair::from_pem(&pem).ok(),
        _ => None,
    };
    let ca_key = match existing_key {
        Some(key) => key,
        None => {
            let key = KeyPair::generate().map_err(TlsError::Generate)?;
            let ca_cert = ca_params.self_signed(&key).map_err(TlsError::Generate)?;
            write_file(&ca_key_path, &key.serialize_pem(), true)?;
            write_file(&ca_path, &ca_cert.pem(), false)?;
            key
        }
    };
    let issuer = Issuer::new(ca_params, ca_key);

    let mut names = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    let ip = listen.ip();
    if !ip.is_unspecified() && !ip.is_loopback() {
        names.push(ip.to_string());
    }
    if let Ok(host) = std::env::var("HOSTNAME")
        && !host.is_empty()
        && host.parse::<IpAddr>().is_err()
    {
        names.push(host);
    }
    let mut params = CertificateParams::new(names).map_err(TlsError::Generate)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "pasa-pcp webhook");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().map_err(TlsError::Generate)?;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(TlsError::Generate)?;
    write_file(&dir.join("tls.crt"), &cert.pem(), false)?;
    write_file(&dir.join("tls.key"), &key.serialize_pem(), true)?;

    let key_der = PrivateKeyDer::try_from(key.serialize_der()).map_err(|e| TlsError::Read {
        path: "generated key".to_string(),
        message: e.to_string(),
    })?;
    Ok(ServingCert {
        config: server_config(vec![cert.der().clone()], key_der)?,
        generated_ca: Some(ca_path),
        files: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_files_load_back_and_the_ca_is_kept() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let served = generate(dir.path(), "127.0.0.1:0".parse().unwrap()).unwrap();
        assert_eq!(
            served.generated_ca.as_deref(),
            Some(dir.path().join("ca.crt").as_path())
        );
        load(&dir.path().join("tls.crt"), &dir.path().join("tls.key")).unwrap();
        for key in ["tls.key", "ca.key"] {
            let mode = std::fs::metadata(dir.path().join(key))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o077, 0, "{key} is private");
        }
        let ca = std::fs::read(dir.path().join("ca.crt")).unwrap();
        let first_leaf = std::fs::read(dir.path().join("tls.crt")).unwrap();
        generate(dir.path(), "127.0.0.1:0".parse().unwrap()).unwrap();
        assert_eq!(
            std::fs::read(dir.path().join("ca.crt")).unwrap(),
            ca,
            "CA reused"
        );
        assert_ne!(
            std::fs::read(dir.path().join("tls.crt")).unwrap(),
            first_leaf,
            "a fresh serving certificate"
        );
    }

    #[test]
    fn missing_files_are_named() {
        let e = load(
            Path::new("/nonexistent/tls.crt"),
            Path::new("/nonexistent/tls.key"),
        )
        .err()
        .unwrap();
        assert!(e.to_string().contains("/nonexistent/tls.crt"), "{e}");
    }
}
