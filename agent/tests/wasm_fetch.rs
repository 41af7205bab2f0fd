//! The agent's Wasm module fetcher against a fake OCI registry (on loopback, plain HTTP, as a
//! registry on a node may be): it asks for an anonymous bearer token as the registry
//! challenges, follows the blob redirect to storage, and takes the module out of each of
//! Istio's image formats (a Docker image and an OCI image whose last layer holds
//! `plugin.wasm`, an OCI artifact with a Wasm layer); a digest other than the one the
//! extension pins fails; a module once fetched is kept by checksum for a restarted agent.
//! A private repository is pulled with the login of the extension's pull secret (the registry's
//! token service takes it), or with a registry token the secret gives; without the secret, with
//! a wrong password, or with a secret the store does not hold, the pull fails and says why.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::registry::{self, Content, LOGIN, PRIVATE_TOKEN, plugin_layer, pull_secret};
use pasa_agent::translate::extensions::{ModuleCode, ModuleSource, PullSecret};
use pasa_agent::wasm::Fetcher;
use serde_json::json;

const MODULE: &[u8] = b"\0asm\x01\0\0\0 a module's bytes";
/// Asks `fetcher` for `url` until it is no longer being fetched (bounded).
async fn fetched(fetcher: &Arc<Fetcher>, url: &str, sha256: &str) -> ModuleCode {
    fetched_with(fetcher, url, sha256, PullSecret::Unnamed).await
}

async fn fetched_with(
    fetcher: &Arc<Fetcher>,
    url: &str,
    sha256: &str,
    secret: PullSecret<'_>,
) -> ModuleCode {
    let mut done = fetcher.done();
    for _ in 0..50 {
        match fetcher.module(url, sha256, secret) {
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
    let mut content = Content::default();
    let docker = content.image(
        "plugins/header",
        "docker",
        "application/vnd.docker.distribution.manifest.v2+json",
        vec![(
            "application/vnd.docker.image.rootfs.diff.tar.gzip",
            plugin_layer(MODULE),
        )],
    );
    content.image(
        "plugins/header",
        "oci",
        "application/vnd.oci.image.manifest.v1+json",
        vec![(
            "application/vnd.oci.image.layer.v1.tar+gzip",
            plugin_layer(MODULE),
        )],
    );
    content.image(
        "private/header",
        "oci",
        "application/vnd.oci.image.manifest.v1+json",
        vec![(
            "application/vnd.oci.image.layer.v1.tar+gzip",
            plugin_layer(MODULE),
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
    let (addr, server) = registry::serve(content).await;
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
    // A private repository: pulled with the pull secret's login, or its registry token.
    let private = format!("oci://{addr}/private/header:oci");
    let host = addr.to_string();
    let right = pull_secret(&host, json!({"username": LOGIN.0, "password": LOGIN.1}));
    let wrong = pull_secret(&host, json!({"username": LOGIN.0, "password": "guess"}));
    let token = pull_secret(
        &format!("http://{host}/v2/"),
        json!({"registrytoken": PRIVATE_TOKEN}),
    );
    for (what, secret, outcome) in [
        ("no pull secret", PullSecret::Unnamed, Err("401")),
        (
            "a wrong password",
            PullSecret::Found(&wrong),
            Err("with the pull secret's login"),
        ),
        (
            "a secret not stored",
            PullSecret::Missing("shop", "creds"),
            Err("imagePullSecret shop/creds is not in the store"),
        ),
        ("the login", PullSecret::Found(&right), Ok(())),
        ("a registry token", PullSecret::Found(&token), Ok(())),
    ] {
        let fresh = Fetcher::new(
            dir.path().join(what.replace(' ', "-")),
            tokio::runtime::Handle::current(),
        );
        match (fetched_with(&fresh, &private, "", secret).await, outcome) {
            (ModuleCode::Local(path), Ok(())) => {
                assert_eq!(std::fs::read(&path).unwrap(), MODULE, "{what}");
                println!("private image with {what}: pulled");
            }
            (ModuleCode::Failed(e), Err(expected)) => {
                assert!(e.contains(expected), "{what}: {e}");
                println!("private image with {what}: refused ({e})");
            }
            (other, _) => panic!("{what}: {other:?}"),
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
        restarted.module(&url, &docker, PullSecret::Unnamed),
        ModuleCode::Local(_)
    ));
    let missing = format!("oci://{addr}/plugins/header:missing");
    assert!(matches!(
        fetched(&restarted, &missing, "").await,
        ModuleCode::Failed(_)
    ));
}
