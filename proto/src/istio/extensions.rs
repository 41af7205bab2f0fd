//! `extensions.istio.io` v1alpha1: `WasmPlugin` (a Wasm module in the HTTP or network filter
//! chain of the workloads it selects) and `TrafficExtension` (the same for a Wasm module or an
//! inline Lua script).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::authorization_policy::PolicyTargetReference;
use super::common::PortSelector;
use super::destination_rule::WorkloadSelector;

/// The `spec` of a WasmPlugin.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WasmPlugin {
    #[serde(default)]
    pub selector: Option<WorkloadSelector>,
    #[serde(default)]
    pub target_ref: Option<PolicyTargetReference>,
    #[serde(default)]
    pub target_refs: Vec<PolicyTargetReference>,
    /// Where the module is: `oci://`, `https://`, `http://`, `file://`, or an image reference.
    #[serde(default)]
    pub url: String,
    #[serde(default)]
    pub sha256: String,
    /// `UNSPECIFIED_POLICY`, `IfNotPresent`, `Always`.
    #[serde(default)]
    pub image_pull_policy: Option<String>,
    #[serde(default)]
    pub image_pull_secret: String,
    #[serde(default)]
    pub verification_key: String,
    /// The plugin's configuration, passed to it as JSON.
    #[serde(default)]
    pub plugin_config: Option<Value>,
    #[serde(default)]
    pub plugin_name: String,
    /// `UNSPECIFIED_PHASE`, `AUTHN`, `AUTHZ`, `STATS`.
    #[serde(default)]
    pub phase: Option<String>,
    #[serde(default)]
    pub priority: Option<i32>,
    /// `FAIL_CLOSE`, `FAIL_OPEN`, `FAIL_RELOAD`.
    #[serde(default)]
    pub fail_strategy: Option<String>,
    #[serde(default)]
    pub vm_config: Option<VmConfig>,
    #[serde(default, rename = "match")]
    pub match_: Vec<Option<TrafficSelector>>,
    /// `UNSPECIFIED_PLUGIN_TYPE`, `HTTP`, `NETWORK`.
    #[serde(default, rename = "type")]
    pub type_: Option<String>,
}

/// The spec of a TrafficExtension: exactly one of `wasm` and `lua`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TrafficExtension {
    #[serde(default)]
    pub selector: Option<WorkloadSelector>,
    #[serde(default)]
    pub target_refs: Vec<PolicyTargetReference>,
    /// `UNSPECIFIED`, `AUTHN`, `AUTHZ`, `STATS`.
    #[serde(default)]
    pub phase: Option<String>,
    #[serde(default)]
    pub priority: Option<i32>,
    #[serde(default, rename = "match")]
    pub match_: Vec<Option<TrafficSelector>>,
    #[serde(default)]
    pub wasm: Option<WasmConfig>,
    #[serde(default)]
    pub lua: Option<LuaConfig>,
}

/// A TrafficExtension's Wasm module: WasmPlugin's module fields.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WasmConfig {
    #[serde(default)]
    pub url: String,
    #[serde(default)]
    pub sha256: String,
    #[serde(default)]
    pub image_pull_policy: Option<String>,
    #[serde(default)]
    pub image_pull_secret: String,
    #[serde(default)]
    pub verification_key: String,
    #[serde(default)]
    pub plugin_config: Option<Value>,
    #[serde(default)]
    pub plugin_name: String,
    #[serde(default)]
    pub fail_strategy: Option<String>,
    #[serde(default)]
    pub vm_config: Option<VmConfig>,
    #[serde(default, rename = "type")]
    pub type_: Option<String>,
}

/// An inline Lua script.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LuaConfig {
    #[serde(default)]
    pub inline_code: String,
}

/// The Wasm VM's environment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    /// A null entry is kept so that validation can name it.
    #[serde(default)]
    pub env: Vec<Option<EnvVar>>,
}

/// One environment variable: a value inline, or the host's variable of that name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EnvVar {
    #[serde(default)]
    pub name: String,
    /// `INLINE` (default) or `HOST`.
    #[serde(default)]
    pub value_from: Option<String>,
    #[serde(default)]
    pub value: String,
}

/// Which traffic an extension runs on: the side (`mode`) and the ports.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TrafficSelector {
    /// `UNDEFINED`, `CLIENT`, `SERVER`, `CLIENT_AND_SERVER`.
    #[serde(default)]
    pub mode: Option<String>,
    /// A null entry is kept so that validation can name it.
    #[serde(default)]
    pub ports: Vec<Option<PortSelector>>,
}

/// What istiod appends to a WasmPlugin's name when it reads it as a TrafficExtension (`~` is no
/// Kubernetes name character, so no real TrafficExtension collides).
pub const WASM_PLUGIN_MARKER: &str = "~istio-translated-wasmplugin";

impl WasmPlugin {
    /// The TrafficExtension istiod reads this WasmPlugin as (named with
    /// [`WASM_PLUGIN_MARKER`]): the deprecated `targetRef` folded into `targetRefs`, the module
    /// fields under `wasm`.
    pub fn to_traffic_extension(&self) -> TrafficExtension {
        let mut target_refs = self.target_refs.clone();
        if target_refs.is_empty() {
            target_refs.extend(self.target_ref.clone());
        }
        TrafficExtension {
            selector: self.selector.clone(),
            target_refs,
            // The two enums share their numbers; only the unset name differs.
            phase: self.phase.clone().filter(|p| p != "UNSPECIFIED_PHASE"),
            priority: self.priority,
            match_: self.match_.clone(),
            wasm: Some(WasmConfig {
                url: self.url.clone(),
                sha256: self.sha256.clone(),
                image_pull_policy: self.image_pull_policy.clone(),
                image_pull_secret: self.image_pull_secret.clone(),
                verification_key: self.verification_key.clone(),
                plugin_config: self.plugin_config.clone(),
                plugin_name: self.plugin_name.clone(),
                fail_strategy: self.fail_strategy.clone(),
                vm_config: self.vm_config.clone(),
                type_: self.type_.clone(),
            }),
            lua: None,
        }
    }
}
