//! The registry credentials of Wasm modules' pull secrets. A WasmPlugin's `imagePullSecret` (a
//! TrafficExtension's `wasm.imagePullSecret`) names a Secret of the extension's namespace;
//! istiod reads it when it is of type `kubernetes.io/dockerconfigjson` and hands its Docker
//! config to the proxies the extension applies to. The syncer carries exactly those Secrets'
//! Docker configs into the store, as `ImagePullSecret` objects of the Secret's namespace and
//! name, for the agents: a Secret no extension names, or of another type, is not carried.
//!
//! Who may read them is the store's decision ([`pasa_proto::Kind::NAMESPACE_SCOPED`]): under
//! mutual TLS, workloads of the Secret's namespace only (and, for the mesh's root namespace,
//! every workload, as its extensions may apply to any).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::reflector::{ObjectRef, Store};
use pasa_proto::Kind;
use serde_json::{Value, json};

use crate::convert::{CLUSTER_LABEL, StoreKey, document};

/// The Secret type whose Docker config istiod reads for a module.
pub const DOCKER_CONFIG_TYPE: &str = "kubernetes.io/dockerconfigjson";
/// The key of that Secret holding the Docker config.
pub const DOCKER_CONFIG_KEY: &str = ".dockerconfigjson";

/// The Wasm extensions' kinds, as the syncer follows them.
pub type Extensions = BTreeMap<Kind, (ApiResource, Store<DynamicObject>)>;

/// The pull secrets the extensions of `namespace`s `selected` name: (namespace, name).
pub fn named(configs: &Extensions, selected: impl Fn(&str) -> bool) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (kind, pointer) in [
        (Kind::WasmPlugin, "/spec/imagePullSecret"),
        (Kind::TrafficExtension, "/spec/wasm/imagePullSecret"),
    ] {
        let Some((_, store)) = configs.get(&kind) else {
            continue;
        };
        for ext in store.state() {
            let namespace = ext.namespace().unwrap_or_default();
            if let Some(name) = ext.data.pointer(pointer).and_then(Value::as_str)
                && !name.is_empty()
                && selected(&namespace)
            {
                out.insert((namespace, name.to_string()));
            }
        }
    }
    out
}

/// The `ImagePullSecret` objects for the Secrets `named`, by key: those of the Docker config
/// type holding a Docker config, labelled as `cluster`'s.
pub fn derive(
    named: &BTreeSet<(String, String)>,
    secrets: &Store<Secret>,
    cluster: &str,
) -> BTreeMap<StoreKey, Value> {
    let mut out = BTreeMap::new();
    for (namespace, name) in named {
        let Some(secret) = secrets.get(&ObjectRef::new(name).within(namespace)) else {
            tracing::debug!(%namespace, %name, "a Wasm module's pull secret is not in the cluster");
            continue;
        };
        if secret.type_.as_deref() != Some(DOCKER_CONFIG_TYPE) {
            tracing::warn!(%namespace, %name, "a Wasm module's pull secret is not of type \
                {DOCKER_CONFIG_TYPE}; not carried (istiod does not read it either)");
            continue;
        }
        let Some(config) = secret
            .data
            .as_ref()
            .and_then(|d| d.get(DOCKER_CONFIG_KEY))
            .and_then(|c| String::from_utf8(c.0.clone()).ok())
        else {
            tracing::warn!(%namespace, %name, "a Wasm module's pull secret has no \
                {DOCKER_CONFIG_KEY}; not carried");
            continue;
        };
        let key = StoreKey {
            kind: Kind::ImagePullSecret,
            namespace: namespace.clone(),
            name: name.clone(),
        };
        let labels = BTreeMap::from([(CLUSTER_LABEL.to_string(), cluster.to_string())]);
        let spec = serde_json::Map::from_iter([("dockerConfigJson".to_string(), json!(config))]);
        let doc = document(&key, labels, spec);
        out.insert(key, doc);
    }
    out
}
