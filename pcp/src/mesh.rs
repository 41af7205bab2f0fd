//! Istio's mesh config, published into the store for the agents: `--mesh-config FILE` (the
//! `mesh` key of the `istio` ConfigMap, mounted, or any YAML file) is written as the
//! `MeshConfig` object `mesh` of the mesh's root namespace at start, and again whenever the
//! file's content changes (a mounted ConfigMap is updated in place). What is written goes
//! through validation like every other write; a file that cannot be read or is refused is
//! logged with why, and what was published before stays.
//!
//! Who owns the stored mesh config: what PCP published from a file is annotated
//! [`PUBLISHED_FROM`] with the file's path, and belongs to the flag: a PCP started without
//! `--mesh-config` removes it ([`retire`]; the agents then use Istio's defaults, as istiod
//! does without a mesh config). One applied by hand (`pasactl apply`) is the user's and stays.
//! Either way PCP says at start which mesh config is in effect and where it came from.

use std::path::PathBuf;
use std::time::Duration;

use pasa_istio::mesh_config::MESH_CONFIG_NAME;
use pasa_proto::Kind;
use pasa_proto::store::v1::{ApplyDocument, ApplyRequest, DeleteRequest, GetRequest, ObjectRef};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::metrics::Origin;
use crate::write::WriteService;

/// The annotation on a mesh config PCP published from a file: the file's path.
pub const PUBLISHED_FROM: &str = "pasa.io/mesh-config-file";

/// How often the file is read again.
const POLL: Duration = Duration::from_secs(10);

/// Why the `--mesh-config` file cannot be published; each names the flag and the file.
#[derive(Debug, thiserror::Error)]
pub enum MeshConfigError {
    #[error("--mesh-config {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--mesh-config {}: {source}", .path.display())]
    Yaml {
        path: PathBuf,
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    #[error(
        "--mesh-config {}: not a mapping (give the `mesh` key of the istio ConfigMap, a YAML \
         mapping)",
        .path.display()
    )]
    NotMapping { path: PathBuf },
}

/// Reads `path` as a mesh config (a YAML mapping; empty is `{}`); the error names the flag and
/// the file.
pub fn read(path: &std::path::Path) -> Result<Value, MeshConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| MeshConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let spec: Value = if text.trim().is_empty() {
        json!({})
    } else {
        serde_saphyr::from_str(&text).map_err(|source| MeshConfigError::Yaml {
            path: path.to_path_buf(),
            source: Box::new(source),
        })?
    };
    if !spec.is_object() {
        return Err(MeshConfigError::NotMapping {
            path: path.to_path_buf(),
        });
    }
    Ok(spec)
}

/// Reads `path` as a mesh config, as the object to publish in `root_namespace`.
pub fn object(path: &std::path::Path, root_namespace: &str) -> Result<Value, MeshConfigError> {
    let spec = read(path)?;
    Ok(json!({
        "apiVersion": "pasa.io/v1alpha1",
        "kind": "MeshConfig",
        "metadata": {"name": MESH_CONFIG_NAME, "namespace": root_namespace,
                     "annotations": {PUBLISHED_FROM: path.display().to_string()}},
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

/// For a PCP started without `--mesh-config`: removes the mesh config an earlier PCP published
/// from a file (its flag is gone, so is what it published), and says which mesh config the
/// agents now read. A store that cannot be reached is logged; nothing else is done then.
pub async fn retire(root_namespace: String, service: WriteService) {
    let at = ObjectRef {
        kind: Kind::MeshConfig.as_str().to_string(),
        namespace: root_namespace.clone(),
        name: MESH_CONFIG_NAME.to_string(),
    };
    let request = GetRequest {
        r#ref: Some(at.clone()),
    };
    let stored = service
        .upstream()
        .call(&request, |mut store, request| async move {
            store.get(request).await
        })
        .await;
    let resource = match stored {
        Ok(answer) => answer.into_inner().resource,
        Err(status) if status.code() == tonic::Code::NotFound => None,
        Err(status) => {
            tracing::warn!(error = %status.message(), "cannot tell which mesh config is in effect");
            return;
        }
    };
    let Some(resource) = resource else {
        tracing::info!(
            "no mesh config in the store: agents use Istio's defaults (publish one with \
             --mesh-config, or apply a MeshConfig `mesh` in {root_namespace} with pasactl)"
        );
        return;
    };
    let Some(file) = resource.annotations.get(PUBLISHED_FROM) else {
        tracing::info!(
            revision = resource.mod_revision,
            "the mesh config in effect is the one applied to the store by hand \
             (MeshConfig {root_namespace}/{MESH_CONFIG_NAME}): `pasactl get meshconfig \
             {MESH_CONFIG_NAME} -n {root_namespace} -o yaml` shows it"
        );
        return;
    };
    // Only what was read: a mesh config applied by hand since is left alone.
    let request = DeleteRequest {
        refs: vec![at],
        expected_mod_revision: Some(resource.mod_revision),
        ignore_not_found: true,
    };
    let deleted = service
        .upstream()
        .call(&request, |mut store, request| async move {
            store.delete(request).await
        })
        .await;
    match deleted {
        Ok(answer) if answer.get_ref().errors.is_empty() => tracing::warn!(
            file = %file,
            "removed the mesh config an earlier PCP published from {file}: this one runs \
             without --mesh-config, so agents now use Istio's defaults (pass --mesh-config to \
             publish one again)"
        ),
        Ok(answer) => {
            let errors: Vec<String> = answer
                .get_ref()
                .errors
                .iter()
                .map(|e| e.message.clone())
                .collect();
            tracing::warn!(errors = %errors.join("; "), "could not remove the mesh config published from {file}");
        }
        Err(status) => {
            tracing::warn!(error = %status.message(), "could not remove the mesh config published from {file}")
        }
    }
}
