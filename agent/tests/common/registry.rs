//! A **fake** OCI registry on loopback (plain HTTP, as a registry on a node may be): bearer
//! tokens from its token service (anonymous for every repository but those under `private/`,
//! which it hands out to [`LOGIN`] only), blobs redirected to storage, as registries do.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use pasa_istio::digest::sha256_hex as sha256;
use pasa_istio::extensions::ImagePullSecret;
use serde_json::json;

pub const TOKEN: &str = "anonymous-token";
/// The token for the private repository, handed out to `LOGIN` only.
pub const PRIVATE_TOKEN: &str = "private-token";
pub const LOGIN: (&str, &str) = ("puller", "s3cret");

/// A gzip'd tar holding `module` as `plugin.wasm`.
pub fn plugin_layer(module: &[u8]) -> Vec<u8> {
    let mut tar = vec![0u8; 512];
    let name = b"./plugin.wasm";
    tar[..name.len()].copy_from_slice(name);
    tar[124..135].copy_from_slice(format!("{:011o}", module.len()).as_bytes());
    tar[257..262].copy_from_slice(b"ustar");
    tar.extend(module);
    tar.resize(512 + 512 + 1024, 0);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, &tar).unwrap();
    gz.finish().unwrap()
}

/// The fake registry's content: manifests by `repository:tag`, blobs by digest.
#[derive(Default)]
pub struct Content {
    manifests: HashMap<String, (String, Vec<u8>)>,
    blobs: HashMap<String, Vec<u8>>,
}

impl Content {
    pub fn blob(&mut self, bytes: Vec<u8>) -> String {
        let digest = format!("sha256:{}", sha256(&bytes));
        self.blobs.insert(digest.clone(), bytes);
        digest
    }

    /// An image `repository:tag` of `media_type` whose layers are `layers` (type, bytes);
    /// its manifest's digest.
    pub fn image(
        &mut self,
        repository: &str,
        tag: &str,
        media_type: &str,
        layers: Vec<(&str, Vec<u8>)>,
    ) -> String {
        let config = self.blob(b"{}".to_vec());
        let layers: Vec<_> = layers
            .into_iter()
            .map(|(kind, bytes)| {
                let size = bytes.len();
                json!({"mediaType": kind, "digest": self.blob(bytes), "size": size})
            })
            .collect();
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2, "mediaType": media_type,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": config, "size": 2},
            "layers": layers}))
        .unwrap();
        let digest = sha256(&manifest);
        self.manifests.insert(
            format!("{repository}:{tag}"),
            (media_type.to_string(), manifest),
        );
        digest
    }
}

type Shared = Arc<(Content, String)>;

/// Whether the request carries the token for `namespace`'s repositories.
fn authorized(headers: &HeaderMap, namespace: &str) -> bool {
    let token = if namespace == "private" {
        PRIVATE_TOKEN
    } else {
        TOKEN
    };
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        == Some(&format!("Bearer {token}"))
}

/// The token service: anonymous tokens for public repositories, the private one for `LOGIN`.
async fn token(uri: axum::http::Uri, headers: HeaderMap) -> Response {
    use base64::Engine;
    if !uri
        .query()
        .is_some_and(|q| q.contains("scope=repository:private/"))
    {
        return json!({"token": TOKEN}).to_string().into_response();
    }
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", LOGIN.0, LOGIN.1))
    );
    if headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        == Some(&basic)
    {
        json!({"access_token": PRIVATE_TOKEN})
            .to_string()
            .into_response()
    } else {
        StatusCode::UNAUTHORIZED.into_response()
    }
}

/// A pull secret whose Docker config gives `entry` for the registry at `host`.
pub fn pull_secret(host: &str, entry: serde_json::Value) -> ImagePullSecret {
    ImagePullSecret {
        docker_config_json: json!({"auths": {host: entry}}).to_string(),
    }
}

async fn manifest(
    State(shared): State<Shared>,
    Path((namespace, name, tag)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let (content, base) = shared.as_ref();
    if !authorized(&headers, &namespace) {
        let challenge = format!(
            "Bearer realm=\"{base}/token\",service=\"fake\",scope=\"repository:{namespace}/{name}:pull\""
        );
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, challenge)],
        )
            .into_response();
    }
    match content.manifests.get(&format!("{namespace}/{name}:{tag}")) {
        Some((kind, body)) => {
            ([(header::CONTENT_TYPE, kind.clone())], body.clone()).into_response()
        }
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// Blobs are redirected to storage, as registries do.
async fn blob(
    Path((namespace, _, digest)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    if !authorized(&headers, &namespace) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    (
        StatusCode::TEMPORARY_REDIRECT,
        [(header::LOCATION, format!("/storage/{digest}"))],
    )
        .into_response()
}

async fn storage(State(shared): State<Shared>, Path(digest): Path<String>) -> Response {
    match shared.0.blobs.get(&digest) {
        Some(bytes) => bytes.clone().into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// A registry serving `content` until the test ends or the task is aborted: its address and
/// task.
pub async fn serve(content: Content) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shared: Shared = Arc::new((content, format!("http://{addr}")));
    let app = axum::Router::new()
        .route("/v2/{namespace}/{name}/manifests/{tag}", get(manifest))
        .route("/v2/{namespace}/{name}/blobs/{digest}", get(blob))
        .route("/storage/{digest}", get(storage))
        .route("/token", get(token))
        .with_state(shared);
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, task)
}
