//! `ProxyConfig` (`networking.istio.io` v1beta1): proxy settings of the workloads it selects
//! (its namespace's, or the whole mesh's from the root namespace): Envoy's worker threads, its
//! environment, the proxy image's flavour.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::destination_rule::WorkloadSelector;

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
