//! The agent's Wasm module fetcher against a fake OCI registry (on loopback, plain HTTP, as a
//! registry on a node may be): it asks for an anonymous bearer token as the registry
//! challenges, follows the blob redirect to storage, and takes the module out of each of
//! Istio's image formats (a Docker image and an OCI image whose last layer holds
//! `plugin.wasm`, an OCI artifact with a Wasm layer); a digest other than the one the
//! extension pins fails; a module once fetched is kept by checksum for a restarted agent.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use pasa_agent::translate::extensions::{ModuleCode, ModuleSource};
use pasa_agent::wasm::Fetcher;
use pasa_proto::digest::sha256_hex as sha256;
use serde_json::json;

const MODULE: &[u8] = b"\0asm\x01\0\0\0 a module's bytes";
const TOKEN: &str = "anonymous-token";

/// A gzip'd tar holding `plugin.wasm`.
fn plugin_layer() -> Vec<u8> {
    let mut tar = vec![0u8; 512];
    let name = b"./plugin.wasm";
    tar[..name.len()].copy_from_slice(name);
    tar[124..135].copy_from_slice(format!("{:011o}", MODULE.len()).as_bytes());
    tar[257..262].copy_from_slice(b"ustar");
    tar.extend(MODULE);
    tar.resize(512 + 512 + 1024, 0);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, &tar).unwrap();
    gz.finish().unwrap()
}

/// The fake registry's content: manifests by `repository:tag`, blobs by digest.
#[derive(Default)]
struct Content {
    manifests: HashMap<String, (String, Vec<u8>)>,
    blobs: HashMap<String, Vec<u8>>,
}

impl Content {
    fn blob(&mut self, bytes: Vec<u8>) -> String {
        let digest = format!("sha256:{}", sha256(&bytes));
        self.blobs.insert(digest.clone(), bytes);
        digest
    }

    /// An image `repository:tag` of `media_type` whose layers are `layers` (type, bytes);
    /// its manifest's digest.
    fn image(
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

fn authorized(headers: &HeaderMap) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        == Some(&format!("Bearer {TOKEN}"))
}

async fn manifest(
    State(shared): State<Shared>,
    Path((namespace, name, tag)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let (content, base) = shared.as_ref();
    if !authorized(&headers) {
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
    Path((_, _, digest)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    if !authorized(&headers) {
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

/// Asks `fetcher` for `url` until it is no longer being fetched (bounded).
async fn fetched(fetcher: &Arc<Fetcher>, url: &str, sha256: &str) -> ModuleCode {
    let mut done = fetcher.done();
    for _ in 0..50 {
        match fetcher.module(url, sha256) {
            ModuleCode::Pending => {
                let _ = tokio::time::timeout(Duration::from_secs(1), done.changed()).await;
            }
            other => return other,
        }
    }
    panic!("{url} still being fetched")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modules_are_pulled_from_an_oci_registry_in_istios_image_formats() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut content = Content::default();
    let docker = content.image(
        "plugins/header",
        "docker",
        "application/vnd.docker.distribution.manifest.v2+json",
        vec![(
            "application/vnd.docker.image.rootfs.diff.tar.gzip",
            plugin_layer(),
        )],
    );
    content.image(
        "plugins/header",
        "oci",
        "application/vnd.oci.image.manifest.v1+json",
        vec![(
            "application/vnd.oci.image.layer.v1.tar+gzip",
            plugin_layer(),
        )],
    );
    content.image(
        "plugins/header",
        "artifact",
        "application/vnd.oci.image.manifest.v1+json",
        vec![
            ("application/vnd.module.wasm.config.v1+json", b"{}".to_vec()),
            (
                "application/vnd.module.wasm.content.layer.v1+wasm",
                MODULE.to_vec(),
            ),
        ],
    );
    let shared: Shared = Arc::new((content, format!("http://{addr}")));
    let app = axum::Router::new()
        .route("/v2/{namespace}/{name}/manifests/{tag}", get(manifest))
        .route("/v2/{namespace}/{name}/blobs/{digest}", get(blob))
        .route("/storage/{digest}", get(storage))
        .route(
            "/token",
            get(|| async { json!({"token": TOKEN}).to_string() }),
        )
        .with_state(shared);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let dir = tempfile::tempdir().unwrap();
    let fetcher = Fetcher::new(dir.path().to_path_buf(), tokio::runtime::Handle::current());
    for tag in ["docker", "oci", "artifact"] {
        let url = format!("oci://{addr}/plugins/header:{tag}");
        match fetched(&fetcher, &url, "").await {
            ModuleCode::Local(path) => {
                assert_eq!(std::fs::read(&path).unwrap(), MODULE, "{tag}");
                println!("{tag}: pulled into {path}");
            }
            other => panic!("{tag}: {other:?}"),
        }
    }
    // Pinned to the image's digest: pulled; to another: refused.
    let url = format!("oci://{addr}/plugins/header:docker");
    let fresh = Fetcher::new(dir.path().join("pinned"), tokio::runtime::Handle::current());
    assert!(matches!(
        fetched(&fresh, &url, &docker).await,
        ModuleCode::Local(_)
    ));
    // (A module kept under the pinned digest would be the one pinned: ask where none is.)
    let other = format!("{addr}/plugins/header:oci");
    let empty = Fetcher::new(dir.path().join("empty"), tokio::runtime::Handle::current());
    match fetched(&empty, &other, &docker).await {
        ModuleCode::Failed(e) => assert!(e.contains("expects"), "{e}"),
        other => panic!("{other:?}"),
    }
    // A restarted agent has the pinned module without the registry.
    server.abort();
    let restarted = Fetcher::new(dir.path().join("pinned"), tokio::runtime::Handle::current());
    assert!(matches!(
        restarted.module(&url, &docker),
        ModuleCode::Local(_)
    ));
    let missing = format!("oci://{addr}/plugins/header:missing");
    assert!(matches!(
        fetched(&restarted, &missing, "").await,
        ModuleCode::Failed(_)
    ));
}
