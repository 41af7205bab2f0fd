//! The gRPC API's mutual TLS: the server's certificate and key, and the CA client certificates
//! must chain to, read from files and read again when they change (cert-manager, istio-csr and
//! mounted Secrets rotate them in place), so a rotation needs no restart. Connections are
//! accepted and their handshakes done here, each bounded in time; tonic serves the finished TLS
//! streams and exposes each one's verified client certificate to the access rules.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

/// How often the files are checked for a rotation.
const RELOAD_CHECK: Duration = Duration::from_secs(5);
/// How long a client may take over its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The files of a TLS server, and their content as first read.
pub struct ServerTls {
    files: [PathBuf; 3],
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
    pub client_ca: Vec<u8>,
}

impl ServerTls {
    /// Reads `cert`, `key` and `client_ca` (PEM); errors name the flag and the file, and say
    /// when they do not make a usable server.
    pub fn read(cert: &Path, key: &Path, client_ca: &Path) -> anyhow::Result<ServerTls> {
        let read = |flag: &str, path: &Path| {
            pasa_proto::client::read_pem(path).map_err(|e| anyhow::anyhow!("{flag}: {e}"))
        };
        let tls = ServerTls {
            files: [cert.into(), key.into(), client_ca.into()],
            cert: read("--grpc-tls-cert", cert)?,
            key: read("--grpc-tls-key", key)?,
            client_ca: read("--grpc-client-ca", client_ca)?,
        };
        config(&tls.cert, &tls.key, &tls.client_ca).with_context(|| {
            format!(
                "--grpc-tls-cert {}, --grpc-tls-key {}, --grpc-client-ca {}",
                cert.display(),
                key.display(),
                client_ca.display()
            )
        })?;
        Ok(tls)
    }

    /// The server's own certificate as a client's (read afresh at each connection), trusting
    /// the client CA: how store replicas reach each other.
    pub fn client(&self) -> pasa_proto::client::ClientTls {
        let [cert, key, _] = self.files.clone();
        pasa_proto::client::ClientTls::new(
            self.client_ca.clone(),
            Arc::new(move || {
                Ok((
                    pasa_proto::client::read_pem(&cert)?,
                    pasa_proto::client::read_pem(&key)?,
                ))
            }),
        )
    }

    /// The TLS connections `listener` accepts, handshakes done, with the certificate as the
    /// files hold it now; stops when the stream is dropped.
    pub fn incoming(
        self,
        listener: TcpListener,
    ) -> anyhow::Result<ReceiverStream<Result<TlsStream<TcpStream>, std::io::Error>>> {
        let first = config(&self.cert, &self.key, &self.client_ca)
            .context("the gRPC API's TLS settings")?;
        let (config_tx, config_rx) = watch::channel(first);
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(reload(self.files, config_tx));
        tokio::spawn(accept(listener, config_rx, tx));
        Ok(ReceiverStream::new(rx))
    }
}

/// Why the TLS files do not make a usable server.
#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    #[error("the certificate: {0}")]
    Cert(#[source] rustls::pki_types::pem::Error),
    #[error("the key: {0}")]
    Key(#[source] rustls::pki_types::pem::Error),
    #[error("the client CA: {0}")]
    ClientCaPem(#[source] rustls::pki_types::pem::Error),
    #[error("the client CA: {0}")]
    ClientCa(#[source] rustls::Error),
    #[error("the client CA: {0}")]
    Verifier(#[source] rustls::server::VerifierBuilderError),
    #[error("{0}")]
    CertAndKey(#[source] rustls::Error),
    /// A file could not be read again (its path and why, as [`pasa_proto::client::read_pem`]
    /// says).
    #[error("{0}")]
    Reread(String),
}

/// A server configuration: this certificate chain and key, client certificates required and
/// verified against `client_ca`, HTTP/2 only.
fn config(cert: &[u8], key: &[u8], client_ca: &[u8]) -> Result<Arc<ServerConfig>, TlsConfigError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<_, _>>()
        .map_err(TlsConfigError::Cert)?;
    let key = PrivateKeyDer::from_pem_slice(key).map_err(TlsConfigError::Key)?;
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(client_ca) {
        let ca = ca.map_err(TlsConfigError::ClientCaPem)?;
        roots.add(ca).map_err(TlsConfigError::ClientCa)?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
        .build()
        .map_err(TlsConfigError::Verifier)?;
    let mut config = ServerConfig::builder()
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(TlsConfigError::CertAndKey)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// Reads the files again whenever one of them changed, until nobody serves with them; a
/// rotation that cannot be used is logged, and the certificate in use stays.
async fn reload(files: [PathBuf; 3], config: watch::Sender<Arc<ServerConfig>>) {
    let modified = |files: &[PathBuf; 3]| -> Vec<Option<SystemTime>> {
        files
            .iter()
            .map(|f| std::fs::metadata(f).and_then(|m| m.modified()).ok())
            .collect()
    };
    let mut last = modified(&files);
    loop {
        tokio::select! {
            () = config.closed() => return,
            () = tokio::time::sleep(RELOAD_CHECK) => {}
        }
        let now = modified(&files);
        if now == last {
            continue;
        }
        last = now;
        let pem =
            |i: usize| pasa_proto::client::read_pem(&files[i]).map_err(TlsConfigError::Reread);
        let read = pem(0).and_then(|cert| self::config(&cert, &pem(1)?, &pem(2)?));
        match read {
            Ok(new) => {
                config.send_replace(new);
                tracing::info!(cert = %files[0].display(), "the gRPC API's certificate reloaded");
            }
            Err(e) => {
                tracing::error!(error = %e, "the gRPC API's rotated certificate cannot be used; the one in use stays")
            }
        }
    }
}

/// Accepts connections and hands over those whose handshake completes in time.
async fn accept(
    listener: TcpListener,
    config: watch::Receiver<Arc<ServerConfig>>,
    out: mpsc::Sender<Result<TlsStream<TcpStream>, std::io::Error>>,
) {
    loop {
        let accepted = tokio::select! {
            () = out.closed() => return,
            accepted = listener.accept() => accepted,
        };
        let (tcp, peer): (TcpStream, SocketAddr) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::debug!(error = %e, "accepting a connection failed");
                continue;
            }
        };
        let acceptor = TlsAcceptor::from(config.borrow().clone());
        let out = out.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => {
                    let _ = out.send(Ok(tls)).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "a TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "a TLS handshake did not complete in time"),
            }
        });
    }
}
