//! The parts of Istio's `MeshConfig` (the `mesh` key of the `istio` ConfigMap in the root
//! namespace) that translation reads: the trust domain and its aliases, and the extension
//! providers CUSTOM AuthorizationPolicies delegate to. Every other field is kept as it was
//! written (MeshConfig is large, and grows with each Istio release): reading it never fails on a
//! field PASA does not use.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::common::Duration;

/// The name the mesh config is kept under, in the mesh's root namespace.
pub const MESH_CONFIG_NAME: &str = "mesh";

/// A MeshConfig.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MeshConfig {
    #[serde(default)]
    pub root_namespace: Option<String>,
    #[serde(default)]
    pub trust_domain: Option<String>,
    /// Trust domains whose identities are taken as the mesh's own.
    #[serde(default)]
    pub trust_domain_aliases: Vec<String>,
    #[serde(default)]
    pub extension_providers: Vec<ExtensionProvider>,
    /// Everything else, as written.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// Istio's built-in access log provider: a file access log to `/dev/stdout`, there whatever
/// `extensionProviders` says (unless it defines a provider of that name).
pub const BUILTIN_ACCESS_LOG_PROVIDER: &str = "envoy";

/// The provider `name` (matched as istiod matches it, ignoring case) as a file access log: its
/// name as configured and its `envoyFileAccessLog` settings (`path`, `logFormat`,
/// `omitEmptyValues`); `None` when `mesh` defines no such provider or one of another kind.
/// Istio's built-in `envoy` provider is one.
pub fn file_access_log_provider(mesh: Option<&MeshConfig>, name: &str) -> Option<(String, Value)> {
    let configured = mesh
        .into_iter()
        .flat_map(|m| &m.extension_providers)
        .find(|p| p.name.eq_ignore_ascii_case(name));
    match configured {
        Some(p) => Some((p.name.clone(), p.other.get("envoyFileAccessLog")?.clone())),
        None => name
            .eq_ignore_ascii_case(BUILTIN_ACCESS_LOG_PROVIDER)
            .then(|| {
                (
                    BUILTIN_ACCESS_LOG_PROVIDER.to_string(),
                    serde_json::json!({"path": "/dev/stdout"}),
                )
            }),
    }
}

impl MeshConfig {
    /// `defaultProviders.accessLogging`: the providers Telemetry access logging without its own
    /// uses.
    pub fn default_access_log_providers(&self) -> Vec<String> {
        self.other
            .get("defaultProviders")
            .and_then(|d| d.get("accessLogging"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect()
    }
}

/// A provider of the mesh, by name: an external authorizer (HTTP or gRPC), or one of the
/// tracing, logging and metrics providers (kept as written).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExtensionProvider {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub envoy_ext_authz_http: Option<ExtAuthzHttp>,
    #[serde(default)]
    pub envoy_ext_authz_grpc: Option<ExtAuthzGrpc>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// An external authorizer spoken to over HTTP.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExtAuthzHttp {
    /// The authorizer's service: `<hostname>` or `<namespace>/<hostname>`.
    #[serde(default)]
    pub service: String,
    #[serde(default)]
    pub port: u32,
    #[serde(default)]
    pub timeout: Option<Duration>,
    #[serde(default)]
    pub path_prefix: String,
    #[serde(default)]
    pub fail_open: bool,
    #[serde(default)]
    pub clear_route_cache: bool,
    /// The HTTP status sent when the authorizer cannot be reached (`"403"`).
    #[serde(default)]
    pub status_on_error: String,
    /// Deprecated: `includeRequestHeadersInCheck` is used when set.
    #[serde(default)]
    pub include_headers_in_check: Vec<String>,
    #[serde(default)]
    pub include_request_headers_in_check: Vec<String>,
    #[serde(default)]
    pub include_additional_headers_in_check: BTreeMap<String, String>,
    #[serde(default)]
    pub include_request_body_in_check: Option<RequestBody>,
    #[serde(default)]
    pub headers_to_upstream_on_allow: Vec<String>,
    #[serde(default)]
    pub headers_to_downstream_on_deny: Vec<String>,
    #[serde(default)]
    pub headers_to_downstream_on_allow: Vec<String>,
}

/// An external authorizer spoken to over gRPC (Envoy's `envoy.service.auth.v3.Authorization`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExtAuthzGrpc {
    #[serde(default)]
    pub service: String,
    #[serde(default)]
    pub port: u32,
    #[serde(default)]
    pub timeout: Option<Duration>,
    #[serde(default)]
    pub fail_open: bool,
    #[serde(default)]
    pub clear_route_cache: bool,
    #[serde(default)]
    pub status_on_error: String,
    #[serde(default)]
    pub include_request_body_in_check: Option<RequestBody>,
}

/// How much of the request body the authorizer is sent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RequestBody {
    #[serde(default)]
    pub max_request_bytes: u32,
    #[serde(default)]
    pub allow_partial_message: bool,
    #[serde(default)]
    pub pack_as_bytes: bool,
}
