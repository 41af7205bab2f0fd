//! A fake of Istio's CA for the tests: `IstioCertificateService/CreateCertificate` over TLS on
//! loopback, as istiod answers it in outline. It authenticates the caller by a bearer token from
//! a fixed table (istiod asks Kubernetes to review the token), signs the CSR's public key for
//! the caller's SPIFFE identity (not the CSR's), for the lifetime asked for, and answers the
//! signed certificate and, last, its root. Real X.509 throughout; nothing else of istiod.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pasa_proto::istio_ca::istio_certificate_service_server::{
    IstioCertificateService, IstioCertificateServiceServer,
};
use pasa_proto::istio_ca::{IstioCertificateRequest, IstioCertificateResponse};
use tokio::sync::oneshot;
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status};

/// The name on the fake CA's own certificate, as on istiod's.
pub const SERVER_NAME: &str = "istiod.istio-system.svc";

/// What the fake CA saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    pub authorization: String,
    pub cluster_id: String,
    pub validity_seconds: i64,
    /// The identity it signed for, when it did.
    pub signed_for: Option<String>,
}

struct Service {
    root: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
    /// Bearer token → SPIFFE identity.
    tokens: BTreeMap<String, String>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

#[tonic::async_trait]
impl IstioCertificateService for Service {
    async fn create_certificate(
        &self,
        request: Request<IstioCertificateRequest>,
    ) -> Result<Response<IstioCertificateResponse>, Status> {
        let header = |name: &str| {
            request
                .metadata()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let mut seen = Seen {
            authorization: header("authorization"),
            cluster_id: header("clusterid"),
            validity_seconds: request.get_ref().validity_duration,
            signed_for: None,
        };
        let identity = seen
            .authorization
            .strip_prefix("Bearer ")
            .and_then(|token| self.tokens.get(token))
            .cloned();
        let Some(identity) = identity else {
            self.seen.lock().unwrap().push(seen);
            return Err(Status::unauthenticated("request authenticate failure"));
        };
        let mut csr = rcgen::CertificateSigningRequestParams::from_pem(&request.get_ref().csr)
            .map_err(|e| Status::invalid_argument(format!("CSR parse error ({e})")))?;
        csr.params.subject_alt_names = vec![rcgen::SanType::URI(
            rcgen::string::Ia5String::try_from(identity.clone()).expect("a URI"),
        )];
        let now = time::OffsetDateTime::now_utc();
        csr.params.not_before = now;
        csr.params.not_after =
            now + Duration::from_secs(u64::try_from(seen.validity_seconds.max(1)).unwrap_or(1));
        let cert = csr
            .signed_by(&self.root)
            .map_err(|e| Status::internal(format!("signing failed ({e})")))?;
        seen.signed_for = Some(identity);
        self.seen.lock().unwrap().push(seen);
        Ok(Response::new(IstioCertificateResponse {
            cert_chain: vec![cert.pem(), self.root.pem()],
        }))
    }
}

/// A running fake CA, stopped when dropped.
pub struct FakeCa {
    pub addr: SocketAddr,
    /// The root it signs with, PEM (what `--ca-root-cert` and the served `ROOTCA` hold).
    pub root_pem: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Option<oneshot::Sender<()>>,
}

impl FakeCa {
    /// Serves on loopback; `tokens` maps bearer tokens to the SPIFFE identity they prove.
    pub async fn start(tokens: &[(&str, &str)]) -> FakeCa {
        let root = super::sidecar::ca();
        let mut params = rcgen::CertificateParams::new(vec![SERVER_NAME.to_string()])
            .expect("the server's names");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, SERVER_NAME);
        let key = rcgen::KeyPair::generate().expect("a key");
        let server_cert = params
            .signed_by(&key, &root)
            .expect("the server's certificate");
        let identity = Identity::from_pem(server_cert.pem(), key.serialize_pem());
        let root_pem = root.pem();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let service = Service {
            root,
            tokens: tokens
                .iter()
                .map(|(t, id)| (t.to_string(), id.to_string()))
                .collect(),
            seen: Arc::clone(&seen),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake CA");
        let addr = listener.local_addr().expect("address");
        let (stop, stopped) = oneshot::channel::<()>();
        let server = Server::builder()
            .tls_config(ServerTlsConfig::new().identity(identity))
            .expect("the fake CA's TLS")
            .add_service(IstioCertificateServiceServer::new(service))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                async {
                    let _ = stopped.await;
                },
            );
        tokio::spawn(server);
        FakeCa {
            addr,
            root_pem,
            seen,
            stop: Some(stop),
        }
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The agent options that point at this CA, with the root and `token` written in `dir`.
    pub fn agent_args(&self, dir: &std::path::Path, token: &str) -> Vec<String> {
        std::fs::create_dir_all(dir).expect("mkdir");
        let root = dir.join("root-cert.pem");
        std::fs::write(&root, &self.root_pem).expect("write the root");
        let token_path = dir.join("istio-token");
        std::fs::write(&token_path, token).expect("write the token");
        vec![
            "--ca-address".into(),
            self.addr.to_string(),
            "--ca-server-name".into(),
            SERVER_NAME.into(),
            "--ca-root-cert".into(),
            root.display().to_string(),
            "--ca-token".into(),
            token_path.display().to_string(),
        ]
    }
}

impl Drop for FakeCa {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
