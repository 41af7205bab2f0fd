//! `ProxyConfig` (`networking.istio.io` v1beta1): proxy settings of the workloads it selects
//! (its namespace's, or the whole mesh's from the root namespace): Envoy's worker threads, its
//! environment, the proxy image's flavour.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::destination_rule::WorkloadSelector;
use crate::label_selector::selects;

/// The `spec` of a ProxyConfig.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProxyConfig {
    #[serde(default)]
    pub selector: Option<WorkloadSelector>,
    /// Envoy's worker threads; 0 means one per core.
    #[serde(default)]
    pub concurrency: Option<i32>,
    #[serde(default)]
    pub environment_variables: BTreeMap<String, String>,
    #[serde(default)]
    pub image: Option<ProxyImage>,
}

/// The proxy image's flavour (`default`, `debug`, `distroless`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProxyImage {
    #[serde(default)]
    pub image_type: String,
}

impl ProxyConfig {
    /// The proxy settings this ProxyConfig gives, as istiod reads one: its concurrency, its
    /// environment variables as `proxyMetadata`, its image.
    pub fn settings(&self) -> MeshProxyConfig {
        let mut map = Map::new();
        if let Some(c) = self.concurrency {
            map.insert("concurrency".into(), Value::from(c));
        }
        if !self.environment_variables.is_empty() {
            map.insert(
                "proxyMetadata".into(),
                serde_json::to_value(&self.environment_variables).unwrap_or_default(),
            );
        }
        if let Some(image) = &self.image {
            map.insert(
                "image".into(),
                serde_json::json!({"imageType": image.image_type}),
            );
        }
        MeshProxyConfig(map)
    }
}

/// A proxy's settings: Istio's `meshconfig.ProxyConfig`, as the mesh config's `defaultConfig`,
/// a pod's `proxy.istio.io/config` annotation and pilot-agent's `PROXY_CONFIG` environment
/// variable give them. Kept as written (JSON field names; top-level proto names such as
/// `proxy_metadata` are renamed, as Istio's decoder accepts both), so that a field PASA does not
/// read survives every merge.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MeshProxyConfig(Map<String, Value>);

/// Fields of one `oneof`: setting one clears the others.
const ONEOFS: [[&str; 2]; 1] = [["serviceCluster", "tracingServiceName"]];

/// The `proxyHeaders` fields an overlay that leaves them unset keeps from below (istiod's
/// correction after merging).
const KEPT_PROXY_HEADERS: [&str; 5] = [
    "forwardedClientCert",
    "requestId",
    "attemptCount",
    "server",
    "envoyDebugHeaders",
];

impl MeshProxyConfig {
    /// Istio's defaults for a proxy's settings (`mesh.DefaultProxyConfig`), under everything.
    pub fn defaults() -> MeshProxyConfig {
        MeshProxyConfig::from_map(
            serde_json::json!({
                "configPath": "./etc/istio/proxy",
                "binaryPath": "/usr/local/bin/envoy",
                "serviceCluster": "istio-proxy",
                "drainDuration": "45s",
                "terminationDrainDuration": "5s",
                "discoveryAddress": "istiod.istio-system.svc:15012",
                "proxyAdminPort": 15000,
                "controlPlaneAuthPolicy": "MUTUAL_TLS",
                "statNameLength": 189,
                "statusPort": 15020,
            })
            .as_object()
            .cloned()
            .unwrap_or_default(),
        )
    }

    /// Settings as written in an object, top-level proto field names renamed to JSON names.
    pub fn from_map(map: Map<String, Value>) -> MeshProxyConfig {
        MeshProxyConfig(
            map.into_iter()
                .map(|(k, v)| (super::json_name(&k), v))
                .collect(),
        )
    }

    /// Reads settings as pilot-agent does (JSON or YAML, an object); blank text is none.
    pub fn parse(text: &str) -> Result<MeshProxyConfig, String> {
        if text.trim().is_empty() {
            return Ok(MeshProxyConfig::default());
        }
        match serde_saphyr::from_str::<Value>(text) {
            Ok(Value::Object(map)) => Ok(MeshProxyConfig::from_map(map)),
            Ok(_) => Err("not a ProxyConfig: expected an object of its fields".into()),
            Err(e) => Err(format!("not a ProxyConfig (JSON or YAML): {e}")),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn as_map(&self) -> &Map<String, Value> {
        &self.0
    }

    /// Puts `over` on these settings as Istio merges proxy configs: every field `over` sets
    /// replaces this one's whole (lists and messages too; a `null` sets nothing), but
    /// `proxyMetadata` gains `over`'s entries, and `proxyHeaders` keeps the header settings
    /// `over`'s leaves out.
    pub fn overlay(&mut self, over: &MeshProxyConfig) {
        for (key, value) in &over.0 {
            if value.is_null() {
                continue;
            }
            let value = match (key.as_str(), self.0.get(key), value) {
                ("proxyMetadata", Some(Value::Object(below)), Value::Object(above)) => {
                    let mut merged = below.clone();
                    merged.extend(above.iter().map(|(k, v)| (k.clone(), v.clone())));
                    Value::Object(merged)
                }
                ("proxyHeaders", Some(Value::Object(below)), Value::Object(above)) => {
                    let mut merged = above.clone();
                    for field in KEPT_PROXY_HEADERS {
                        if let (None, Some(kept)) = (above.get(field), below.get(field)) {
                            merged.insert(field.into(), kept.clone());
                        }
                    }
                    Value::Object(merged)
                }
                _ => value.clone(),
            };
            for oneof in ONEOFS {
                if oneof.contains(&key.as_str()) {
                    for other in oneof.iter().filter(|o| **o != key) {
                        self.0.remove(*other);
                    }
                }
            }
            self.0.insert(key.clone(), value);
        }
    }

    /// `concurrency`: Envoy's worker threads (0: one per core); `None` when unset or unreadable.
    pub fn concurrency(&self) -> Option<u32> {
        self.0
            .get("concurrency")
            .and_then(Value::as_u64)
            .and_then(|c| u32::try_from(c).ok())
    }

    /// `terminationDrainDuration`: how long Envoy drains on shutdown.
    pub fn termination_drain_duration(&self) -> Option<std::time::Duration> {
        let text = self.0.get("terminationDrainDuration")?.as_str()?;
        let nanos = pasa_proto::duration::parse_go(text).ok()?;
        (nanos >= 0.0).then(|| std::time::Duration::from_nanos(nanos as u64))
    }

    /// `proxyMetadata`: the variables the proxy's agent runs with (Istio's injection sets them
    /// in its container's environment).
    pub fn proxy_metadata(&self) -> BTreeMap<String, String> {
        self.0
            .get("proxyMetadata")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
            .collect()
    }

    /// `tracing`: the proxy's own tracing settings (sampling, custom tags, tag lengths), for
    /// what Telemetry leaves unset.
    pub fn tracing(&self) -> ProxyTracing {
        self.0
            .get("tracing")
            .and_then(|t| serde_json::from_value(t.clone()).ok())
            .unwrap_or_default()
    }

    /// Whether `proxyHeaders.metadataExchangeHeaders.mode` is `IN_MESH`: the proxy sends
    /// Istio's metadata exchange headers only to destinations inside the mesh.
    pub fn metadata_exchange_in_mesh_only(&self) -> bool {
        self.0
            .get("proxyHeaders")
            .and_then(|d| d.pointer("/metadataExchangeHeaders/mode"))
            .and_then(Value::as_str)
            == Some("IN_MESH")
    }

    /// As JSON, as Istio's injection writes `PROXY_CONFIG`.
    pub fn to_json(&self) -> String {
        Value::Object(self.0.clone()).to_string()
    }
}

/// One stored ProxyConfig, for [`effective`]: its namespace and spec.
pub struct NamespacedProxyConfig<'a> {
    pub namespace: &'a str,
    pub spec: &'a ProxyConfig,
}

/// The settings a workload in `namespace` with `labels` runs with, as istiod's injection works
/// them out: Istio's defaults, under the mesh config's `defaultConfig`, under the root
/// namespace's ProxyConfig without selector, under its own namespace's, under the pod's
/// `proxy.istio.io/config` annotation, under the first ProxyConfig of its namespace whose
/// selector its labels match. `configs` are in creation order (where a namespace has several
/// of a kind, the oldest counts).
pub fn effective(
    mesh_default: &MeshProxyConfig,
    configs: &[NamespacedProxyConfig<'_>],
    root_namespace: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    annotation: Option<&MeshProxyConfig>,
) -> MeshProxyConfig {
    let mut settings = MeshProxyConfig::defaults();
    settings.overlay(mesh_default);
    let unselected = |ns: &str| {
        configs
            .iter()
            .find(|c| c.namespace == ns && c.spec.selector.is_none())
            .map(|c| c.spec.settings())
    };
    if !root_namespace.is_empty()
        && let Some(root) = unselected(root_namespace)
    {
        settings.overlay(&root);
    }
    if namespace != root_namespace
        && let Some(own) = unselected(namespace)
    {
        settings.overlay(&own);
    }
    if let Some(annotated) = annotation {
        settings.overlay(annotated);
    }
    let workload = configs.iter().find(|c| {
        c.namespace == namespace
            && c.spec.selector.as_ref().is_some_and(|s| {
                // Unlike other selectors, an empty one here selects nothing (nor is it
                // namespace-wide: that is a ProxyConfig without selector).
                !s.match_labels.is_empty() && selects(&s.match_labels, labels)
            })
    });
    if let Some(workload) = workload {
        settings.overlay(&workload.spec.settings());
    }
    settings
}

/// `ProxyConfig.tracing`: what a proxy's tracing takes from the mesh config's `defaultConfig`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyTracing {
    /// Percent of requests traced; 0 (unset) means the control plane's default.
    #[serde(default)]
    pub sampling: f64,
    /// As a Telemetry's (without formatters).
    #[serde(default)]
    pub custom_tags: BTreeMap<String, Option<super::telemetry::CustomTag>>,
    #[serde(default)]
    pub max_path_tag_length: u32,
    /// Whether Istio's own tags (canonical service, namespace, ...) are added; unset means yes.
    #[serde(default)]
    pub enable_istio_tags: Option<bool>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh_config::MeshConfig;

    fn config(value: Value) -> ProxyConfig {
        serde_json::from_value(value).unwrap()
    }

    /// Istio's own answers, recorded by running its `ProxyConfigs.EffectiveProxyConfig` by
    /// hand on the same inputs and printing them with its JSON marshaller.
    const ISTIOD: [&str; 4] = [
        r#"{"configPath":"./etc/istio/proxy","binaryPath":"/usr/local/bin/envoy","tracingServiceName":"CANONICAL_NAME_ONLY","drainDuration":"45s","discoveryAddress":"istiod.istio-system.svc:15012","proxyAdminPort":15000,"controlPlaneAuthPolicy":"MUTUAL_TLS","statNameLength":189,"concurrency":5,"tracing":{"zipkin":{"address":"z:9411"}},"proxyMetadata":{"A":"ns","B":"2","C":"mesh","D":"ann"},"statusPort":15020,"terminationDrainDuration":"5s","image":{"imageType":"distroless"},"proxyHeaders":{"requestId":{"disabled":true},"server":{"disabled":true},"attemptCount":{"disabled":true}}}"#,
        r#"{"configPath":"./etc/istio/proxy","binaryPath":"/usr/local/bin/envoy","tracingServiceName":"CANONICAL_NAME_ONLY","drainDuration":"45s","discoveryAddress":"istiod.istio-system.svc:15012","proxyAdminPort":15000,"controlPlaneAuthPolicy":"MUTUAL_TLS","statNameLength":189,"concurrency":4,"tracing":{"zipkin":{"address":"z:9411"}},"proxyMetadata":{"A":"ns","B":"2","C":"mesh","D":"ann"},"statusPort":15020,"terminationDrainDuration":"5s","proxyHeaders":{"requestId":{"disabled":true},"server":{"disabled":true},"attemptCount":{"disabled":true}}}"#,
        r#"{"configPath":"./etc/istio/proxy","binaryPath":"/usr/local/bin/envoy","serviceCluster":"istio-proxy","drainDuration":"45s","discoveryAddress":"istiod.istio-system.svc:15012","proxyAdminPort":15000,"controlPlaneAuthPolicy":"MUTUAL_TLS","statNameLength":189,"concurrency":3,"tracing":{"sampling":10},"proxyMetadata":{"A":"1","B":"2","C":"mesh"},"statusPort":15020,"terminationDrainDuration":"5s","proxyHeaders":{"requestId":{"disabled":true},"server":{"disabled":true}}}"#,
        r#"{"configPath":"./etc/istio/proxy","binaryPath":"/usr/local/bin/envoy","serviceCluster":"istio-proxy","drainDuration":"45s","discoveryAddress":"istiod.istio-system.svc:15012","proxyAdminPort":15000,"controlPlaneAuthPolicy":"MUTUAL_TLS","statNameLength":189,"concurrency":3,"tracing":{"sampling":10},"proxyMetadata":{"A":"1","B":"2","C":"mesh"},"statusPort":15020,"terminationDrainDuration":"5s","proxyHeaders":{"requestId":{"disabled":true},"server":{"disabled":true}}}"#,
    ];

    #[test]
    fn settings_merge_as_istiod_merges_them() {
        let mesh: MeshConfig = serde_json::from_value(serde_json::json!({"defaultConfig": {
            "tracing": {"sampling": 10},
            "proxyMetadata": {"A": "1", "C": "mesh"},
            "proxyHeaders": {"server": {"disabled": true}, "requestId": {"disabled": true}},
        }}))
        .unwrap();
        let root =
            config(serde_json::json!({"concurrency": 3, "environmentVariables": {"B": "2"}}));
        let namespace = config(serde_json::json!({"environmentVariables": {"A": "ns"}}));
        let oldest = config(
            serde_json::json!({"selector": {"matchLabels": {"app": "web"}},
            "concurrency": 5, "image": {"imageType": "distroless"}}),
        );
        let newer = config(
            serde_json::json!({"selector": {"matchLabels": {"app": "web"}},
            "concurrency": 7}),
        );
        let configs = [
            NamespacedProxyConfig {
                namespace: "istio-system",
                spec: &root,
            },
            NamespacedProxyConfig {
                namespace: "shop",
                spec: &namespace,
            },
            NamespacedProxyConfig {
                namespace: "shop",
                spec: &oldest,
            },
            NamespacedProxyConfig {
                namespace: "shop",
                spec: &newer,
            },
        ];
        // YAML, with a proto field name and one field of a oneof.
        let annotation = MeshProxyConfig::parse(
            "concurrency: 4\nproxyHeaders:\n  attemptCount:\n    disabled: true\ntracing:\n  \
             zipkin:\n    address: z:9411\nproxy_metadata:\n  D: ann\n\
             tracingServiceName: CANONICAL_NAME_ONLY\n",
        )
        .unwrap();
        let labels = |app: &str| BTreeMap::from([("app".to_string(), app.to_string())]);
        let cases = [
            ("shop", labels("web"), Some(&annotation)),
            ("shop", labels("db"), Some(&annotation)),
            ("istio-system", labels("web"), None),
            ("other", BTreeMap::new(), None),
        ];
        for (i, (namespace, labels, annotation)) in cases.iter().enumerate() {
            let got = effective(
                &mesh.default_config(),
                &configs,
                "istio-system",
                namespace,
                labels,
                *annotation,
            );
            let want: Value = serde_json::from_str(ISTIOD[i]).unwrap();
            assert_eq!(Value::Object(got.as_map().clone()), want, "case {i}");
        }
    }

    #[test]
    fn a_selector_without_labels_selects_no_workload() {
        let empty = config(serde_json::json!({"selector": {"matchLabels": {}}, "concurrency": 9}));
        let configs = [NamespacedProxyConfig {
            namespace: "shop",
            spec: &empty,
        }];
        let labels = BTreeMap::from([("app".to_string(), "web".to_string())]);
        let got = effective(
            &MeshProxyConfig::default(),
            &configs,
            "istio-system",
            "shop",
            &labels,
            None,
        );
        assert_eq!(got.concurrency(), MeshProxyConfig::defaults().concurrency());
    }

    #[test]
    fn what_the_agent_reads_of_them() {
        let s = MeshProxyConfig::parse(
            r#"{"concurrency": 0, "terminationDrainDuration": "1.5s",
                "proxyHeaders": {"metadataExchangeHeaders": {"mode": "IN_MESH"}},
                "tracing": {"sampling": 2.5}}"#,
        )
        .unwrap();
        assert_eq!(s.concurrency(), Some(0));
        assert_eq!(
            s.termination_drain_duration(),
            Some(std::time::Duration::from_millis(1500))
        );
        assert!(s.metadata_exchange_in_mesh_only());
        assert_eq!(s.tracing().sampling, 2.5);
        assert_eq!(MeshProxyConfig::defaults().concurrency(), None);
        assert!(MeshProxyConfig::parse("  ").unwrap().is_empty());
        let err = MeshProxyConfig::parse("- a\n- b").unwrap_err();
        assert!(err.contains("expected an object"), "{err}");
        assert!(MeshProxyConfig::parse("{").is_err());
    }
}
