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

/// Why a GET got no answer, or (for [`get`]) no body; each names the URL.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{url:?}: {source}")]
    Url {
        url: String,
        #[source]
        source: hyper::http::uri::InvalidUri,
    },
    #[error("GET {url}: {source}")]
    Request {
        url: String,
        #[source]
        source: hyper::http::Error,
    },
    #[error("GET {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("GET {url}: {source} (at most {max_bytes} bytes)")]
    Body {
        url: String,
        max_bytes: usize,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("GET {url}: no answer within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    #[error("GET {url}: {status}")]
    Status {
        url: String,
        status: hyper::StatusCode,
    },
}

/// What a GET was answered.
#[derive(Debug)]
pub struct Answer {
    pub status: hyper::StatusCode,
    pub headers: hyper::HeaderMap,
    pub body: Vec<u8>,
}

/// GETs `url` with `headers`: the answer, whatever its status (its body at most `max_bytes`),
/// within `timeout`; or why none came, naming the URL.
pub async fn request(
    client: &Client,
    url: &str,
    headers: &[(&str, &str)],
    timeout: Duration,
    max_bytes: usize,
) -> Result<Answer, FetchError> {
    let uri: hyper::Uri = url.parse().map_err(|source| FetchError::Url {
        url: url.to_string(),
        source,
    })?;
    let mut builder = hyper::Request::get(uri);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let request = builder
        .body(http_body_util::Empty::new())
        .map_err(|source| FetchError::Request {
            url: url.to_string(),
            source,
        })?;
    tokio::time::timeout(timeout, async {
        let response = client
            .request(request)
            .await
            .map_err(|source| FetchError::Connect {
                url: url.to_string(),
                source,
            })?;
        let (parts, body) = response.into_parts();
        let body = Limited::new(body, max_bytes)
            .collect()
            .await
            .map_err(|source| FetchError::Body {
                url: url.to_string(),
                max_bytes,
                source,
            })?
            .to_bytes();
        Ok(Answer {
            status: parts.status,
            headers: parts.headers,
            body: body.to_vec(),
        })
    })
    .await
    .map_err(|_| FetchError::Timeout {
        url: url.to_string(),
        timeout,
    })?
}

/// The body at `url`, at most `max_bytes`, within `timeout`; or why not (a status other than a
/// success among them), naming the URL.
pub async fn get(
    client: &Client,
    url: &str,
    timeout: Duration,
    max_bytes: usize,
) -> Result<Vec<u8>, FetchError> {
    let answer = request(client, url, &[], timeout, max_bytes).await?;
    if !answer.status.is_success() {
        return Err(FetchError::Status {
            url: url.to_string(),
            status: answer.status,
        });
    }
    Ok(answer.body)
}
