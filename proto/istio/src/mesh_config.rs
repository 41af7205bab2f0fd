//! The parts of Istio's `MeshConfig` (the `mesh` key of the `istio` ConfigMap in the root
//! namespace) that translation reads: the trust domain and its aliases, and the extension
//! providers CUSTOM AuthorizationPolicies delegate to. Every other field is kept as it was
//! written (MeshConfig is large, and grows with each Istio release): reading it never fails on a
//! field PASA does not use.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::common::Duration;
use super::proxy_config::MeshProxyConfig;

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

/// An access log provider of the mesh config: a file (its `envoyFileAccessLog` settings: `path`,
/// `logFormat`, `omitEmptyValues`, as written), Envoy's gRPC access log services for HTTP and
/// TCP, or an OpenTelemetry collector.
#[derive(Debug, Clone, PartialEq)]
pub enum AccessLogProvider {
    File(Value),
    HttpGrpc(GrpcLogProvider),
    TcpGrpc(GrpcLogProvider),
    OpenTelemetry(OtelLogProvider),
}

/// Envoy's gRPC access log service (`envoyHttpAls`, `envoyTcpAls`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GrpcLogProvider {
    #[serde(default)]
    pub service: String,
    #[serde(default)]
    pub port: u32,
    #[serde(default)]
    pub log_name: String,
    #[serde(default)]
    pub filter_state_objects_to_log: Vec<String>,
    #[serde(default)]
    pub additional_request_headers_to_log: Vec<String>,
    #[serde(default)]
    pub additional_response_headers_to_log: Vec<String>,
    #[serde(default)]
    pub additional_response_trailers_to_log: Vec<String>,
}

/// An OpenTelemetry (OTLP/gRPC) log collector (`envoyOtelAls`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OtelLogProvider {
    #[serde(default)]
    pub service: String,
    #[serde(default)]
    pub port: u32,
    #[serde(default)]
    pub log_name: String,
    #[serde(default)]
    pub log_format: Option<OtelLogFormat>,
}

/// The body (`text`) and attributes (`labels`) of an OpenTelemetry log record.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OtelLogFormat {
    #[serde(default)]
    pub text: String,
    #[serde(default)]
    pub labels: Option<Map<String, Value>>,
}

/// The provider `name` (matched as istiod matches it, ignoring case) as an access log: its name
/// as configured, and what it logs to or why it cannot be read; `None` when `mesh` defines no
/// such provider or one that does not log. Istio's built-in `envoy` provider (a file access
/// log to `/dev/stdout`) is one unless the mesh config defines a provider of that name.
pub fn access_log_provider(
    mesh: Option<&MeshConfig>,
    name: &str,
) -> Option<(String, Result<AccessLogProvider, String>)> {
    let Some(p) = mesh.and_then(|m| m.provider(name)) else {
        return name
            .eq_ignore_ascii_case(BUILTIN_ACCESS_LOG_PROVIDER)
            .then(|| {
                (
                    BUILTIN_ACCESS_LOG_PROVIDER.to_string(),
                    Ok(AccessLogProvider::File(
                        serde_json::json!({"path": "/dev/stdout"}),
                    )),
                )
            });
    };
    let (kind, v) = p.settings(&[
        "envoyFileAccessLog",
        "envoyHttpAls",
        "envoyTcpAls",
        "envoyOtelAls",
    ])?;
    let provider = match kind {
        "envoyFileAccessLog" => Ok(AccessLogProvider::File(v.clone())),
        "envoyHttpAls" => read_settings(kind, v).map(AccessLogProvider::HttpGrpc),
        "envoyTcpAls" => read_settings(kind, v).map(AccessLogProvider::TcpGrpc),
        _ => read_settings(kind, v).map(AccessLogProvider::OpenTelemetry),
    };
    Some((p.name.clone(), provider))
}

/// Istio's built-in metrics provider: Prometheus, there whatever `extensionProviders` says
/// (unless it defines a provider of that name).
pub const BUILTIN_METRICS_PROVIDER: &str = "prometheus";

/// Whether the provider `name` (matched as istiod matches it, ignoring case) is a Prometheus
/// metrics provider: one of `mesh`'s with `prometheus` settings, or Istio's built-in
/// `prometheus` when `mesh` defines no provider of that name.
pub fn is_prometheus(mesh: Option<&MeshConfig>, name: &str) -> bool {
    match mesh.and_then(|m| m.provider(name)) {
        Some(p) => p.other.contains_key("prometheus"),
        None => name.eq_ignore_ascii_case(BUILTIN_METRICS_PROVIDER),
    }
}

impl MeshConfig {
    /// The mesh's networks (`meshNetworks`), if it states them; a value that does not read as
    /// Istio's `MeshNetworks` is none (validation refuses it before it is stored).
    pub fn mesh_networks(&self) -> Option<crate::mesh_networks::MeshNetworks> {
        serde_json::from_value(self.other.get("meshNetworks")?.clone()).ok()
    }

    /// `defaultProviders.accessLogging`: the providers Telemetry access logging without its own
    /// uses.
    pub fn default_access_log_providers(&self) -> Vec<String> {
        self.default_providers("accessLogging")
    }

    /// `defaultProviders.tracing`: the providers Telemetry tracing without its own uses (istiod
    /// uses the first).
    pub fn default_tracing_providers(&self) -> Vec<String> {
        self.default_providers("tracing")
    }

    /// `defaultProviders.metrics`: the providers Telemetry metrics without their own use (Istio's
    /// standard install names `prometheus`).
    pub fn default_metrics_providers(&self) -> Vec<String> {
        self.default_providers("metrics")
    }

    /// `defaultConfig`: the settings of proxies that bring none of their own, over Istio's
    /// defaults (see [`MeshProxyConfig::defaults`]); a field that cannot be read is left out.
    pub fn default_config(&self) -> MeshProxyConfig {
        let mut config = MeshProxyConfig::defaults();
        if let Some(Value::Object(written)) = self.other.get("defaultConfig") {
            config.overlay(&MeshProxyConfig::from_map(written.clone()));
        }
        config
    }

    fn default_providers(&self, signal: &str) -> Vec<String> {
        self.other
            .get("defaultProviders")
            .and_then(|d| d.get(signal))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect()
    }

    /// A duration field (`dnsRefreshRate`, `protocolDetectionTimeout`, ...) in nanoseconds, when
    /// it is set, reads and is positive.
    pub fn positive_duration_nanos(&self, field: &str) -> Option<i64> {
        self.other
            .get(field)
            .and_then(Value::as_str)
            .and_then(|t| pasa_proto::duration::parse_go(t).ok())
            .filter(|n| *n > 0.0)
            .map(|n| n as i64)
    }

    /// `enableTracing`: whether a proxy no Telemetry configures tracing for still traces (with
    /// the tracer of its bootstrap); true unless the mesh config says otherwise, as istiod's
    /// default.
    pub fn enable_tracing(&self) -> bool {
        self.other.get("enableTracing").and_then(Value::as_bool) != Some(false)
    }

    /// The extension provider `name`, matched as istiod matches it (ignoring case).
    pub fn provider(&self, name: &str) -> Option<&ExtensionProvider> {
        self.extension_providers
            .iter()
            .find(|p| p.name.eq_ignore_ascii_case(name))
    }
}

/// A tracing provider of the mesh config, as its extension provider describes it.
#[derive(Debug, Clone, PartialEq)]
pub enum TracingProvider {
    Zipkin(ZipkinProvider),
    Datadog(DatadogProvider),
    Skywalking(SkywalkingProvider),
    OpenTelemetry(Box<OpenTelemetryProvider>),
}

/// A Zipkin collector.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ZipkinProvider {
    #[serde(default)]
    pub service: String,
    #[serde(default)]
    pub port: u32,
    #[serde(default)]
    pub max_tag_length: u32,
    #[serde(default, rename = "enable64bitTraceId")]
    pub enable_64bit_trace_id: bool,
    /// The collector's path; `/api/v2/spans` when empty.
    #[serde(default)]
    pub path: String,
    /// `USE_B3` (the default) or `USE_B3_WITH_W3C_PROPAGATION`.
    #[serde(default)]
    pub trace_context_option: Option<String>,
    #[serde(default)]
    pub timeout: Option<Duration>,
    #[serde(default)]
    pub headers: Vec<HttpHeader>,
}

/// A Datadog agent.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DatadogProvider {
    #[serde(default)]
    pub service: String,
    #[serde(default)]
    pub port: u32,
    #[serde(default)]
    pub max_tag_length: u32,
}

/// A SkyWalking collector (gRPC).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SkywalkingProvider {
    #[serde(default)]
    pub service: String,
    #[serde(default)]
    pub port: u32,
}

/// An OpenTelemetry collector, spoken to over OTLP/gRPC or, with `http`, OTLP/HTTP.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OpenTelemetryProvider {
    #[serde(default)]
    pub service: String,
    #[serde(default)]
    pub port: u32,
    #[serde(default)]
    pub max_tag_length: u32,
    #[serde(default)]
    pub http: Option<OtlpHttp>,
    #[serde(default)]
    pub grpc: Option<OtlpGrpc>,
    #[serde(default)]
    pub resource_detectors: Option<ResourceDetectors>,
    /// A custom sampler (Dynatrace's), kept as written.
    #[serde(default)]
    pub dynatrace_sampler: Option<Value>,
    /// `OTEL_SEMANTIC_CONVENTIONS` names the span's service as OpenTelemetry's conventions do.
    #[serde(default)]
    pub service_attribute_enrichment: Option<String>,
}

/// OTLP over HTTP: the collector's path, timeout and headers.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OtlpHttp {
    #[serde(default)]
    pub path: String,
    #[serde(default)]
    pub timeout: Option<Duration>,
    #[serde(default)]
    pub headers: Vec<HttpHeader>,
}

/// OTLP over gRPC: the call's timeout and initial metadata.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OtlpGrpc {
    #[serde(default)]
    pub timeout: Option<Duration>,
    #[serde(default)]
    pub initial_metadata: Vec<HttpHeader>,
}

/// Which OpenTelemetry resource detectors run (present: on).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceDetectors {
    #[serde(default)]
    pub environment: Option<Value>,
    #[serde(default)]
    pub dynatrace: Option<Value>,
}

/// A header a provider sends: a literal `value`, or the value of the environment variable
/// `envName`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpHeader {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub value: Option<String>,
    #[serde(default)]
    pub env_name: Option<String>,
}

/// A provider's settings of `kind` as `T`, or why they do not read (naming the kind).
fn read_settings<T: serde::de::DeserializeOwned>(kind: &str, v: &Value) -> Result<T, String> {
    serde_json::from_value(v.clone()).map_err(|e| format!("{kind}: {e}"))
}

impl ExtensionProvider {
    /// The first of `kinds` the provider is, with its settings as written.
    fn settings(&self, kinds: &[&'static str]) -> Option<(&'static str, &Value)> {
        kinds
            .iter()
            .find_map(|k| self.other.get(*k).map(|v| (*k, v)))
    }

    /// The provider as a tracer: `None` when it is of a kind that does not trace, an error when
    /// it is a tracer PASA cannot build (Lightstep, deprecated in Istio) or its settings do not
    /// read.
    pub fn tracing(&self) -> Option<Result<TracingProvider, String>> {
        let (kind, v) = self.settings(&[
            "zipkin",
            "datadog",
            "skywalking",
            "opentelemetry",
            "lightstep",
        ])?;
        Some(match kind {
            "zipkin" => read_settings(kind, v).map(TracingProvider::Zipkin),
            "datadog" => read_settings(kind, v).map(TracingProvider::Datadog),
            "skywalking" => read_settings(kind, v).map(TracingProvider::Skywalking),
            "opentelemetry" => {
                read_settings(kind, v).map(|o| TracingProvider::OpenTelemetry(Box::new(o)))
            }
            _ => Err("the Lightstep provider is deprecated; use OpenTelemetry".into()),
        })
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
