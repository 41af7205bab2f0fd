//! An HTTPS client of PCP's admission webhook that verifies its certificate, for the tests
//! that post AdmissionReviews to a real `pasa-pcp`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::StatusCode;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;

pub struct Client {
    connector: tokio_rustls::TlsConnector,
    addr: SocketAddr,
}

impl Client {
    pub fn new(addr: SocketAddr, ca: &Path) -> Client {
        pasa_pcp::webhook::tls::install_crypto_provider();
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca).expect("read CA") {
            roots.add(cert.expect("CA certificate")).expect("add CA");
        }
        let config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        Client {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            addr,
        }
    }

    pub async fn post(
        &self,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> Result<(StatusCode, Vec<u8>), String> {
        self.post_to("/validate", content_type, body).await
    }

    pub async fn post_to(
        &self,
        path: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> Result<(StatusCode, Vec<u8>), String> {
        let tcp = tokio::net::TcpStream::connect(self.addr)
            .await
            .map_err(|e| e.to_string())?;
        let name = ServerName::try_from("localhost").expect("server name");
        let tls = self
            .connector
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS handshake: {e}"))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let mut request = hyper::Request::post(path).header("host", "localhost");
        if let Some(ct) = content_type {
            request = request.header("content-type", ct);
        }
        let request = request.body(Full::new(Bytes::from(body))).expect("request");
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes()
            .to_vec();
        Ok((status, body))
    }

    /// Posts an AdmissionReview and returns the review it answers with.
    pub async fn review(&self, body: Vec<u8>) -> Value {
        self.review_at("/validate", body).await
    }

    pub async fn review_at(&self, path: &str, body: Vec<u8>) -> Value {
        let (status, body) = self
            .post_to(path, Some("application/json"), body)
            .await
            .expect("request");
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        serde_json::from_slice(&body).expect("JSON response")
    }
}

/// The development CA PCP generated for its webhook under its data directory.
pub fn ca_of(data: &Path) -> PathBuf {
    data.join("webhook-tls/ca.crt")
}

/// The JSON Patch of an admission review's answer.
pub fn patch_of(review: &Value) -> Value {
    use base64::Engine;
    let text = base64::engine::general_purpose::STANDARD
        .decode(review["response"]["patch"].as_str().unwrap())
        .unwrap();
    serde_json::from_slice(&text).unwrap()
}

/// The values of the environment variable `name` anywhere in `value` (a patch, a pod).
pub fn env_values(value: &Value, name: &str) -> Vec<String> {
    let mut found = Vec::new();
    match value {
        Value::Object(map) => {
            if map.get("name").and_then(Value::as_str) == Some(name)
                && let Some(v) = map.get("value").and_then(Value::as_str)
            {
                found.push(v.to_string());
            }
            for v in map.values() {
                found.extend(env_values(v, name));
            }
        }
        Value::Array(items) => {
            for v in items {
                found.extend(env_values(v, name));
            }
        }
        _ => {}
    }
    found
}
