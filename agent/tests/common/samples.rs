//! Istio's samples (Bookinfo, helloworld, httpbin of the conformance corpus) as store
//! resources. Kubernetes objects become the store's `ServiceEndpoints`: each Service gets a
//! virtual IP `10.96.0.<n>` and one endpoint `10.1.<n>.<m>` per Deployment its selector matches,
//! with the Deployment's pod labels (numbered in file order, so snapshots are stable).

use std::path::{Path, PathBuf};

use pasa_proto::store::v1::Resource;
use serde_json::{Value, json};

/// The conformance folder, when it has `samples/`; says loudly that it skipped otherwise.
pub fn corpus() -> Option<PathBuf> {
    pasa_testing::conformance_dir("samples")
}

/// Istio resources and Kubernetes Services (with Deployments as endpoints) as store resources.
pub fn to_store(docs: &[Value]) -> Vec<Resource> {
    let mut out = Vec::new();
    let deployments: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "Deployment").collect();
    let mut services = 0;
    for doc in docs {
        let kind = doc["kind"].as_str().unwrap_or_default();
        let meta = &doc["metadata"];
        let namespace = meta["namespace"].as_str().unwrap_or("default").to_string();
        let name = meta["name"].as_str().unwrap_or_default().to_string();
        let spec = match kind {
            "VirtualService"
            | "DestinationRule"
            | "ServiceEntry"
            | "Gateway"
            | "Sidecar"
            | "WorkloadEntry"
            | "ServiceEndpoints"
            | "PeerAuthentication"
            | "AuthorizationPolicy"
            | "RequestAuthentication"
            | "EnvoyFilter"
            | "MeshConfig" => doc["spec"].clone(),
            "Service" => {
                services += 1;
                let selector = doc["spec"]["selector"]
                    .as_object()
                    .cloned()
                    .unwrap_or_default();
                let endpoints: Vec<Value> = deployments
                    .iter()
                    .filter_map(|d| {
                        let labels = &d["spec"]["template"]["metadata"]["labels"];
                        selector
                            .iter()
                            .all(|(k, v)| &labels[k] == v)
                            .then(|| labels.clone())
                    })
                    .enumerate()
                    .map(|(i, labels)| {
                        json!({"address": format!("10.1.{services}.{}", i + 1), "labels": labels})
                    })
                    .collect();
                let ports: Vec<Value> = doc["spec"]["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|p| {
                        let mut p = p.clone();
                        if let Some(m) = p.as_object_mut() {
                            m.remove("nodePort");
                        }
                        p
                    })
                    .collect();
                json!({"addresses": [format!("10.96.0.{services}")], "ports": ports,
                       "selector": selector, "endpoints": endpoints})
            }
            _ => continue,
        };
        let kind = if kind == "Service" {
            "ServiceEndpoints"
        } else {
            kind
        };
        let revision = out.len() as u64 + 1;
        // The object's labels and annotations, as the store keeps them.
        let strings = |field: &str| {
            meta[field]
                .as_object()
                .into_iter()
                .flatten()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        };
        out.push(Resource {
            labels: strings("labels"),
            annotations: strings("annotations"),
            api_version: doc["apiVersion"].as_str().unwrap_or_default().to_string(),
            kind: kind.to_string(),
            namespace,
            name,
            spec_json: spec.to_string(),
            create_revision: revision,
            mod_revision: revision,
            version: 1,
            ..Default::default()
        });
    }
    out
}

/// Every sample file under `samples`, sorted.
pub fn files(samples: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![samples.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The proxy of `node_id` with `labels` (`k=v,...`) and Istio's default mesh settings.
pub fn proxy(node_id: &str, labels: &str) -> pasa_agent::model::proxy::Proxy {
    let identity = pasa_agent::identity::IdentityArgs {
        node_id: node_id.into(),
        labels: labels.into(),
        service_account: "default".into(),
        cluster_id: "Kubernetes".into(),
        ..Default::default()
    }
    .resolve()
    .expect("identity");
    pasa_agent::model::proxy::Proxy::from_identity(&identity, Default::default())
}
