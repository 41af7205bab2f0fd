//! HTTP and HTTPS GETs with the system's root certificates, for what PASA fetches from outside
//! the mesh: JWT issuers' key sets (PCP) and Wasm modules (the agent).

use std::time::Duration;

use http_body_util::{BodyExt, Limited};

/// An HTTP and HTTPS client, made once for all fetches.
pub type Client = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    http_body_util::Empty<bytes::Bytes>,
>;

/// A client trusting the system's roots. Without them (a bare image), plain HTTP still works
/// and HTTPS fails with the verification error, naming the URL.
pub fn client() -> Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let builder = match hyper_rustls::HttpsConnectorBuilder::new().with_native_roots() {
        Ok(builder) => builder,
        Err(e) => {
            tracing::warn!(error = %e, "no system root certificates: HTTPS fetches cannot be verified");
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(
                rustls::ClientConfig::builder()
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth(),
            )
        }
    };
    let connector = builder.https_or_http().enable_http1().build();
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build(connector)
}

/// The body at `url`, at most `max_bytes`, within `timeout`; or why not, naming the URL.
pub async fn get(
    client: &Client,
    url: &str,
    timeout: Duration,
    max_bytes: usize,
) -> Result<Vec<u8>, String> {
    let uri: hyper::Uri = url.parse().map_err(|e| format!("{url:?}: {e}"))?;
    tokio::time::timeout(timeout, async {
        let response = client
            .get(uri)
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("GET {url}: {status}"));
        }
        let body = Limited::new(response.into_body(), max_bytes)
            .collect()
            .await
            .map_err(|e| format!("GET {url}: {e} (at most {max_bytes} bytes)"))?
            .to_bytes();
        Ok(body.to_vec())
    })
    .await
    .map_err(|_| format!("GET {url}: no answer within {timeout:?}"))?
}
