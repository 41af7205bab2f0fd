//! Istio's mesh config, published into the store for the agents: `--mesh-config FILE` (the
//! `mesh` key of the `istio` ConfigMap, mounted, or any YAML file) is written as the
//! `MeshConfig` object `mesh` of the mesh's root namespace at start, and again whenever the
//! file's content changes (a mounted ConfigMap is updated in place). What is written goes
//! through validation like every other write; a file that cannot be read or is refused is
//! logged with why, and what was published before stays.

use std::path::PathBuf;
use std::time::Duration;

use pasa_proto::istio::mesh_config::MESH_CONFIG_NAME;
use pasa_proto::store::v1::{ApplyDocument, ApplyRequest};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::metrics::Origin;
use crate::write::WriteService;

/// How often the file is read again.
const POLL: Duration = Duration::from_secs(10);

/// Reads `path` as a mesh config (a YAML mapping; empty is `{}`); the error names the flag and
/// the file.
pub fn read(path: &std::path::Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--mesh-config {}: {e}", path.display()))?;
    let spec: Value = if text.trim().is_empty() {
        json!({})
    } else {
        serde_saphyr::from_str(&text)
            .map_err(|e| format!("--mesh-config {}: {e}", path.display()))?
    };
    if !spec.is_object() {
        return Err(format!("--mesh-config {}: not a mapping", path.display()));
    }
    Ok(spec)
}

/// Reads `path` as a mesh config, as the object to publish in `root_namespace`.
pub fn object(path: &std::path::Path, root_namespace: &str) -> Result<Value, String> {
    let spec = read(path)?;
    Ok(json!({
        "apiVersion": "pasa.io/v1alpha1",
        "kind": "MeshConfig",
        "metadata": {"name": MESH_CONFIG_NAME, "namespace": root_namespace},
        "spec": spec,
    }))
}

/// Publishes `path` until `stop` turns true.
pub async fn publish(
    path: PathBuf,
    root_namespace: String,
    service: WriteService,
    mut stop: watch::Receiver<bool>,
) {
    let mut published: Option<Value> = None;
    loop {
        match object(&path, &root_namespace) {
            Err(e) => {
                tracing::error!(error = %e, "the mesh config cannot be read; the one published before stays")
            }
            Ok(object) if published.as_ref() != Some(&object) => {
                let request = ApplyRequest {
                    documents: vec![ApplyDocument {
                        json: object.to_string(),
                        expected_mod_revision: None,
                    }],
                    dry_run: false,
                };
                match service.admit_and_apply(request, Origin::MeshConfig).await {
                    Ok(answer) if answer.errors.is_empty() => {
                        tracing::info!(file = %path.display(), namespace = %root_namespace, "mesh config published");
                        published = Some(object);
                    }
                    Ok(answer) => {
                        let errors: Vec<String> = answer
                            .errors
                            .iter()
                            .map(|e| format!("{}: {}", e.field, e.message))
                            .collect();
                        tracing::error!(file = %path.display(), errors = %errors.join("; "), "the mesh config was refused; the one published before stays");
                        // Not tried again until the file changes.
                        published = Some(object);
                    }
                    Err(status) => {
                        tracing::warn!(error = %status.message(), "the mesh config could not be written; trying again")
                    }
                }
            }
            Ok(_) => {}
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            () = tokio::time::sleep(POLL) => {}
        }
    }
}
