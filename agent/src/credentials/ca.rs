//! The workload certificate by CSR to Istio's CA (`--ca-address`), as pilot-agent gets it.
//!
//! The agent generates the workload's private key in memory (ECDSA P-256, as pilot-agent does
//! with `ECC_SIGNATURE_ALGORITHM=ECDSA`; `ring` generates no RSA keys), asks Istio's CA to sign
//! a CSR for `spiffe://<trust domain>/ns/<namespace>/sa/<service account>` over TLS
//! (`istio.v1.auth.IstioCertificateService/CreateCertificate`, istiod's port 15012), and serves
//! what comes back over SDS as `default` (the signed chain, with the key) and `ROOTCA` (the last
//! certificate of the chain, the root).
//!
//! - **Authentication**, as pilot-agent does it: the pod's projected service-account token
//!   (audience `istio-ca`) as `authorization: Bearer …`, read afresh for every request since the
//!   kubelet rotates it, and the cluster's name in the `ClusterID` header. istiod takes the
//!   identity from the token, not from the CSR.
//! - **Trust**: the CA's certificate is verified against `--ca-root-cert` (the mesh root, which
//!   Istio mounts from the `istio-ca-root-cert` ConfigMap) and the name `--ca-server-name`
//!   (istiod's certificate names `istiod.istio-system.svc`). Both are read again for every
//!   connection, so a rotated root is picked up.
//! - **Renewal**: a new key and a new certificate once `--secret-grace-period-ratio` of the
//!   certificate's life is left (istiod's default ratio 0.5, with the same ±1% jitter so that a
//!   fleet does not renew at one moment). A failed request is retried with backoff (1 s doubling
//!   to 60 s, jittered); the certificate in hand is served until then.
//! - **The private key never leaves the pod**: it is kept in memory and sent only to the pod's
//!   own Envoy, over the agent's Unix socket. Nothing is written to disk.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use pasa_proto::istio_ca::IstioCertificateRequest;
use pasa_proto::istio_ca::istio_certificate_service_client::IstioCertificateServiceClient;
use pasa_runtime::backoff::Backoff;
use tokio::sync::watch;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

use super::{ca_secret, tls_secret};
use crate::identity::Identity;
use crate::metrics::Metrics;
use crate::model::secrets::{ROOT_CA, WORKLOAD_CERTIFICATE};

/// The options of the CA client.
#[derive(clap::Args, Debug, Clone)]
pub struct CaArgs {
    /// Istio's CA, `host:port` (istiod's `IstioCertificateService`, e.g.
    /// `istiod.istio-system.svc:15012`): the workload certificate (`default`, `ROOTCA`) is
    /// requested from it by CSR, renewed before it expires, and served over SDS on the agent's
    /// socket. Not with --cert-dir.
    #[arg(long, env = "CA_ADDR", conflicts_with = "cert_dir")]
    pub ca_address: Option<String>,
    /// The root the CA's own certificate is verified with (Istio mounts the
    /// `istio-ca-root-cert` ConfigMap here).
    #[arg(
        long,
        env = "PASA_CA_ROOT_CERT",
        default_value = "/var/run/secrets/istio/root-cert.pem"
    )]
    pub ca_root_cert: PathBuf,
    /// The name the CA's certificate must carry [default: the host of --ca-address].
    #[arg(long, env = "PASA_CA_SERVER_NAME")]
    pub ca_server_name: Option<String>,
    /// The pod's projected service-account token, sent as the bearer credential.
    #[arg(
        long,
        env = "PASA_CA_TOKEN",
        default_value = "/var/run/secrets/tokens/istio-token"
    )]
    pub ca_token: PathBuf,
    /// The mesh's trust domain (the certificate's SPIFFE identity).
    #[arg(long, env = "TRUST_DOMAIN", default_value = "cluster.local")]
    pub trust_domain: String,
    /// The lifetime asked for (the CA may give less).
    #[arg(long, env = "SECRET_TTL", default_value = "24h", value_parser = pasa_proto::duration::parse)]
    pub secret_ttl: Duration,
    /// Renew once this share of the certificate's life is left.
    #[arg(long, env = "SECRET_GRACE_PERIOD_RATIO", default_value_t = 0.5, value_parser = grace_ratio)]
    pub secret_grace_period_ratio: f64,
}

/// A `--secret-grace-period-ratio` that is not a ratio.
#[derive(Debug, thiserror::Error)]
#[error("{text:?} is not a ratio between 0 and 1")]
pub struct NotARatio {
    text: String,
}

fn grace_ratio(text: &str) -> Result<f64, NotARatio> {
    match text.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(NotARatio {
            text: text.to_string(),
        }),
    }
}

/// Why the certificate a CA signed cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum SignedCertError {
    #[error("a signed certificate that is not PEM ({0})")]
    NotPem(#[source] x509_parser::nom::Err<x509_parser::error::PEMError>),
    #[error("a signed certificate that does not parse ({0})")]
    Unparsable(#[source] x509_parser::nom::Err<x509_parser::error::X509Error>),
}

/// Why no certificate was issued.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error(
        "cannot read the CA's root certificate {path}: {source} (--ca-root-cert: the mesh root, \
         mounted from the istio-ca-root-cert ConfigMap)"
    )]
    RootCert {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "cannot read the service-account token {path}: {source} (--ca-token: the pod's \
         projected token with audience istio-ca)"
    )]
    Token {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the service-account token {path} is empty")]
    EmptyToken { path: PathBuf },
    #[error("--ca-address {address:?}: {problem}")]
    Address { address: String, problem: String },
    #[error("cannot reach Istio's CA at {address}: {source}")]
    Connect {
        address: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("Istio's CA at {address} refused the certificate request: {code:?}: {message}")]
    Refused {
        address: String,
        code: tonic::Code,
        message: String,
    },
    #[error("Istio's CA at {address} answered with {problem}")]
    BadAnswer { address: String, problem: String },
    #[error("Istio's CA at {address} answered with {source}")]
    SignedCert {
        address: String,
        #[source]
        source: SignedCertError,
    },
    #[error("cannot build the certificate request: {0}")]
    Csr(#[from] rcgen::Error),
}

/// A certificate the CA issued, as served.
#[derive(Debug, Clone)]
pub struct Issued {
    /// `default` and `ROOTCA`.
    pub secrets: BTreeMap<String, Secret>,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl Issued {
    /// When to ask for the next one: once `grace` of the certificate's life is left, moved by
    /// `jitter` (a share of the life, -0.01..0.01 in use) so that a fleet spreads its renewals.
    pub fn renew_at(&self, grace: f64, jitter: f64) -> SystemTime {
        let life = self
            .not_after
            .duration_since(self.not_before)
            .unwrap_or_default();
        let grace = (grace + jitter).clamp(0.0, 1.0);
        self.not_after
            .checked_sub(life.mul_f64(grace))
            .unwrap_or(self.not_before)
    }
}

/// Requests workload certificates from Istio's CA for one identity.
#[derive(Debug, Clone)]
pub struct CaClient {
    address: String,
    server_name: String,
    root_cert: PathBuf,
    token: PathBuf,
    cluster_id: String,
    spiffe: String,
    ttl: Duration,
    grace: f64,
}

impl CaClient {
    /// The client `args` ask for, if any (`--ca-address`).
    pub fn new(args: &CaArgs, identity: &Identity) -> Result<Option<CaClient>, CaError> {
        let Some(address) = args.ca_address.clone() else {
            return Ok(None);
        };
        let bad = |problem: &str| CaError::Address {
            address: address.clone(),
            problem: problem.to_owned(),
        };
        let host = match address.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            _ => return Err(bad("give host:port, e.g. istiod.istio-system.svc:15012")),
        };
        if address.contains("://") {
            return Err(bad("give host:port without a scheme"));
        }
        Ok(Some(CaClient {
            server_name: args.ca_server_name.clone().unwrap_or(host),
            address,
            root_cert: args.ca_root_cert.clone(),
            token: args.ca_token.clone(),
            cluster_id: identity.cluster_id.clone(),
            spiffe: format!(
                "spiffe://{}/ns/{}/sa/{}",
                args.trust_domain, identity.namespace, identity.service_account
            ),
            ttl: args.secret_ttl,
            grace: args.secret_grace_period_ratio,
        }))
    }

    /// The identity the certificate is asked for.
    pub fn spiffe_id(&self) -> &str {
        &self.spiffe
    }

    /// A new key, a CSR for it, the CA's answer.
    pub async fn issue(&self) -> Result<Issued, CaError> {
        let key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::default();
        params.subject_alt_names = vec![rcgen::SanType::URI(rcgen::string::Ia5String::try_from(
            self.spiffe.clone(),
        )?)];
        let csr = params.serialize_request(&key)?.pem()?;

        let token = std::fs::read_to_string(&self.token).map_err(|source| CaError::Token {
            path: self.token.clone(),
            source,
        })?;
        let token = token.trim();
        if token.is_empty() {
            return Err(CaError::EmptyToken {
                path: self.token.clone(),
            });
        }
        let root = std::fs::read(&self.root_cert).map_err(|source| CaError::RootCert {
            path: self.root_cert.clone(),
            source,
        })?;
        let connect = |source| CaError::Connect {
            address: self.address.clone(),
            source,
        };
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(root))
            .domain_name(self.server_name.clone());
        let channel = Endpoint::from_shared(format!("https://{}", self.address))
            .map_err(connect)?
            .tls_config(tls)
            .map_err(connect)?
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(30))
            .connect()
            .await
            .map_err(connect)?;

        let mut request = tonic::Request::new(IstioCertificateRequest {
            csr,
            validity_duration: i64::try_from(self.ttl.as_secs()).unwrap_or(i64::MAX),
            metadata: None,
        });
        let header = |value: String, what: &str| {
            value.parse().map_err(|_| CaError::Address {
                address: self.address.clone(),
                problem: format!("the {what} cannot be sent as a gRPC header"),
            })
        };
        request
            .metadata_mut()
            .insert("authorization", header(format!("Bearer {token}"), "token")?);
        request
            .metadata_mut()
            .insert("clusterid", header(self.cluster_id.clone(), "cluster ID")?);
        let chain = IstioCertificateServiceClient::new(channel)
            .create_certificate(request)
            .await
            .map_err(|status| CaError::Refused {
                address: self.address.clone(),
                code: status.code(),
                message: status.message().to_owned(),
            })?
            .into_inner()
            .cert_chain;
        self.served(chain, key.serialize_pem())
    }

    /// The secrets of a CA answer: `default` is the whole chain (as pilot-agent serves it),
    /// `ROOTCA` its last certificate.
    fn served(&self, chain: Vec<String>, key: String) -> Result<Issued, CaError> {
        let bad = |problem: String| CaError::BadAnswer {
            address: self.address.clone(),
            problem,
        };
        let (Some(leaf), Some(root)) = (chain.first(), chain.last()) else {
            return Err(bad("an empty certificate chain".into()));
        };
        if chain.len() < 2 {
            return Err(bad(
                "a chain of one certificate (the signed certificate and, last, the root are \
                 expected)"
                    .into(),
            ));
        }
        let (not_before, not_after) = validity(leaf).map_err(|source| CaError::SignedCert {
            address: self.address.clone(),
            source,
        })?;
        let mut pem = String::new();
        for cert in &chain {
            pem.push_str(cert);
            if !cert.ends_with('\n') {
                pem.push('\n');
            }
        }
        let mut secrets = BTreeMap::new();
        secrets.insert(
            WORKLOAD_CERTIFICATE.to_string(),
            tls_secret(
                WORKLOAD_CERTIFICATE.to_string(),
                pem.into_bytes(),
                key.into_bytes(),
            ),
        );
        secrets.insert(
            ROOT_CA.to_string(),
            ca_secret(ROOT_CA.to_string(), root.clone().into_bytes()),
        );
        Ok(Issued {
            secrets,
            not_before,
            not_after,
        })
    }
}

/// The validity of the first certificate of `pem`.
fn validity(pem: &str) -> Result<(SystemTime, SystemTime), SignedCertError> {
    let (_, block) =
        x509_parser::pem::parse_x509_pem(pem.as_bytes()).map_err(SignedCertError::NotPem)?;
    let cert = block.parse_x509().map_err(SignedCertError::Unparsable)?;
    let at = |seconds: i64| {
        UNIX_EPOCH + Duration::from_secs(u64::try_from(seconds.max(0)).unwrap_or_default())
    };
    Ok((
        at(cert.validity().not_before.timestamp()),
        at(cert.validity().not_after.timestamp()),
    ))
}

/// A jitter of -0.01..=0.01 (Istio's ratio jitter), to spread a fleet's renewals.
fn jitter() -> f64 {
    (pasa_runtime::backoff::random_fraction() * 2.0 - 1.0) / 100.0
}

/// Keeps `issued` holding a valid certificate from the CA until `stop` turns true: the first
/// at once, each next one at renewal time.
pub async fn renew(
    client: CaClient,
    issued: watch::Sender<BTreeMap<String, Secret>>,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    // 1 s doubling to 60 s, jittered; a certificate starts over.
    let mut backoff = Backoff::new(
        Duration::from_secs(1),
        Duration::from_secs(60),
        Duration::ZERO,
    );
    loop {
        let answer = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            answer = client.issue() => answer,
        };
        let wait = match answer {
            Ok(certificate) => {
                backoff.reset();
                metrics.ca_requests.inc();
                let expiry = certificate
                    .not_after
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default();
                metrics
                    .workload_cert_expiry
                    .set(i64::try_from(expiry.as_secs()).unwrap_or(i64::MAX));
                let renew_at = certificate.renew_at(client.grace, jitter());
                let wait = renew_at
                    .duration_since(SystemTime::now())
                    .unwrap_or_default();
                tracing::info!(
                    identity = client.spiffe_id(),
                    expires_in_s = certificate
                        .not_after
                        .duration_since(SystemTime::now())
                        .unwrap_or_default()
                        .as_secs(),
                    renew_in_s = wait.as_secs(),
                    "workload certificate issued by Istio's CA"
                );
                issued.send_replace(certificate.secrets);
                wait
            }
            Err(e) => {
                metrics.ca_requests.inc();
                metrics.ca_request_failures.inc();
                let wait = backoff.failed();
                tracing::warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "no workload certificate");
                wait
            }
        };
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(address: &str) -> CaArgs {
        CaArgs {
            ca_address: Some(address.into()),
            ca_root_cert: "root.pem".into(),
            ca_server_name: None,
            ca_token: "token".into(),
            trust_domain: "example.org".into(),
            secret_ttl: Duration::from_secs(3600),
            secret_grace_period_ratio: 0.5,
        }
    }

    fn identity() -> Identity {
        crate::identity::IdentityArgs {
            node_id: "sidecar~10.0.0.1~web-1.shop~shop.svc.cluster.local".into(),
            service_account: "web".into(),
            cluster_id: "Kubernetes".into(),
            ..Default::default()
        }
        .resolve()
        .unwrap()
    }

    #[test]
    fn the_identity_and_the_server_name_come_from_the_pod_and_the_address() {
        let client = CaClient::new(&args("istiod.istio-system.svc:15012"), &identity())
            .unwrap()
            .unwrap();
        assert_eq!(client.spiffe_id(), "spiffe://example.org/ns/shop/sa/web");
        assert_eq!(client.server_name, "istiod.istio-system.svc");
        for bad in ["istiod", "https://istiod:15012", ":15012", "istiod:port"] {
            let e = CaClient::new(&args(bad), &identity())
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("--ca-address"), "{bad}: {e}");
        }
        let none = CaArgs {
            ca_address: None,
            ..args("x:1")
        };
        assert!(CaClient::new(&none, &identity()).unwrap().is_none());
    }

    #[test]
    fn renewal_comes_when_the_grace_share_of_the_life_is_left() {
        let not_before = UNIX_EPOCH + Duration::from_secs(1000);
        let issued = Issued {
            secrets: BTreeMap::new(),
            not_before,
            not_after: not_before + Duration::from_secs(100),
        };
        assert_eq!(
            issued.renew_at(0.5, 0.0),
            not_before + Duration::from_secs(50)
        );
        assert_eq!(
            issued.renew_at(0.2, 0.0),
            not_before + Duration::from_secs(80)
        );
        assert_eq!(issued.renew_at(0.995, 0.01), not_before);
        assert!(jitter().abs() <= 0.01);
    }

    #[test]
    fn an_answer_needs_the_signed_certificate_and_the_root() {
        let client = CaClient::new(&args("istiod:15012"), &identity())
            .unwrap()
            .unwrap();
        let ca = rcgen::generate_simple_self_signed(vec!["root".to_string()]).unwrap();
        let e = client
            .served(vec![ca.cert.pem()], "KEY".into())
            .unwrap_err()
            .to_string();
        assert!(e.contains("a chain of one certificate"), "{e}");
        let e = client
            .served(vec!["junk".into(), ca.cert.pem()], "KEY".into())
            .unwrap_err()
            .to_string();
        assert!(e.contains("not PEM"), "{e}");
        let issued = client
            .served(vec![ca.cert.pem(), ca.cert.pem()], "KEY".into())
            .unwrap();
        assert_eq!(
            issued.secrets.keys().collect::<Vec<_>>(),
            [&"ROOTCA".to_string(), &"default".to_string()]
        );
        assert!(issued.not_after > issued.not_before);
    }
}
