//! Tracing, as istiod configures it on every HTTP connection manager from the Telemetry API and
//! the mesh config.
//!
//! **Which settings.** The Telemetries that apply (see [`super::applying`]) contribute their
//! `tracing` entries in order, each for the side its `match.mode` names (both without one): the
//! first provider an entry names replaces the side's provider (the mesh config's
//! `defaultProviders.tracing`, its first, to start with), and `disableSpanReporting`,
//! `randomSamplingPercentage`, `customTags`, `useRequestIdForTraceSampling`, `enableIstioTags`
//! replace what came before when set. A side left without a provider traces nothing. Without
//! any entry and without default providers, the mesh config decides alone (`enableTracing`,
//! true by default): the connection manager traces with its bootstrap's tracer, sampling and
//! tags from `defaultConfig.tracing`.
//!
//! **Providers.** Zipkin, Datadog, SkyWalking and OpenTelemetry (OTLP over gRPC or HTTP, with
//! resource detectors and Dynatrace's sampler), their collector the outbound cluster of the
//! service they name. A provider that cannot be built (unknown service, a kind that does not
//! trace, Lightstep) leaves the side untraced, as istiod does; so does a collector whose
//! cluster the proxy does not have (istiod would send it, and Envoy would refuse the
//! listener).
//!
//! **Sampling and tags.** A provider's own sampler gets every request (100%); otherwise the
//! Telemetry's percentage, else `defaultConfig.tracing.sampling`, else istiod's default of 1%.
//! Istio's tags (canonical service and revision, mesh, namespace, cluster, and the dry-run
//! authorization results) unless turned off, then the Telemetry's custom tags or, without
//! them, `defaultConfig.tracing.customTags`; sorted by name.
//!
//! Features istiod gates on the proxy's Istio version follow the version the agent's proxies
//! claim ([`crate::model::proxy::ISTIO_VERSION`]): Zipkin's collector as cluster and endpoint
//! (not an HTTP service, so without timeout and headers), formatter tags and
//! `disableContextPropagation` are for newer proxies. Header values named by `envName` are read
//! from the agent's environment (istiod reads its own).

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::core::v3::{
    GrpcService, HeaderValue, HeaderValueOption, HttpService, HttpUri, TypedExtensionConfig,
    header_value_option::HeaderAppendAction, http_uri,
};
use envoy_types::pb::envoy::config::trace::v3::{
    DatadogConfig, OpenTelemetryConfig, SkyWalkingConfig, ZipkinConfig, tracing,
    zipkin_config::{CollectorEndpointVersion, TraceContextOption},
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, RequestIdExtension, http_connection_manager::Tracing,
};
use envoy_types::pb::envoy::extensions::request_id::uuid::v3::UuidRequestIdConfig;
use envoy_types::pb::envoy::extensions::tracers::opentelemetry::resource_detectors::v3::{
    DynatraceResourceDetectorConfig, EnvironmentResourceDetectorConfig,
};
use envoy_types::pb::envoy::extensions::tracers::opentelemetry::samplers::v3::DynatraceSamplerConfig;
use envoy_types::pb::envoy::r#type::metadata::v3::{
    MetadataKey, MetadataKind, metadata_key::PathSegment, metadata_key::path_segment, metadata_kind,
};
use envoy_types::pb::envoy::r#type::tracing::v3::{CustomTag, custom_tag};
use envoy_types::pb::envoy::r#type::v3::Percent;
use envoy_types::pb::google::protobuf::{Any, BoolValue, Duration, UInt32Value};
use envoy_types::util::pack_any;
use pasa_istio::mesh_config::{
    ExtensionProvider, HttpHeader, MeshConfig, OpenTelemetryProvider, TracingProvider,
};
use pasa_istio::node::ProxyType;
use pasa_istio::proxy_config::ProxyTracing;
use pasa_istio::telemetry::{CustomTag as TelemetryTag, NamedTag, Telemetry};

use super::Side;
use crate::model::proxy::{ISTIO_VERSION, Proxy};
use crate::model::registry::Config;
use crate::translate::authz::{SHADOW_ALLOW_PREFIX, SHADOW_DENY_PREFIX};
use crate::translate::builders::duration;
use crate::translate::providers::{self, Collectors, ProviderServiceError};

/// istiod's sampling percentage when nothing sets one (`PILOT_TRACE_SAMPLING`'s default).
const DEFAULT_SAMPLING: f64 = 1.0;
const ZIPKIN: &str = "envoy.tracers.zipkin";
const DATADOG: &str = "envoy.tracers.datadog";
const SKYWALKING: &str = "envoy.tracers.skywalking";
const OPENTELEMETRY: &str = "envoy.tracers.opentelemetry";
const HTTP_RBAC: &str = "envoy.filters.http.rbac";

/// What one side's connection managers get: their tracing (none: not traced), and whether the
/// request ID decides sampling (the UUID request ID extension's setting).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct SideTraces {
    pub tracing: Option<Tracing>,
    pub use_request_id_for_trace_sampling: bool,
}

impl Default for SideTraces {
    fn default() -> Self {
        SideTraces {
            tracing: None,
            use_request_id_for_trace_sampling: true,
        }
    }
}

impl SideTraces {
    /// Sets `hcm`'s tracing and request ID extension.
    pub(super) fn put(&self, hcm: &mut HttpConnectionManager) {
        hcm.tracing = self.tracing.clone();
        hcm.request_id_extension = Some(RequestIdExtension {
            typed_config: Some(pack_any(UuidRequestIdConfig {
                use_request_id_for_trace_sampling: Some(BoolValue {
                    value: self.use_request_id_for_trace_sampling,
                }),
                ..Default::default()
            })),
        });
    }
}

/// Both sides' tracing.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Traces {
    client: SideTraces,
    server: SideTraces,
}

impl Traces {
    pub(super) fn of(&self, side: Side) -> &SideTraces {
        match side {
            Side::Client => &self.client,
            Side::Server => &self.server,
        }
    }

    pub(super) fn fingerprint(&self, h: &mut impl std::hash::Hasher) {
        use prost::Message;
        for side in [&self.client, &self.server] {
            if let Some(t) = &side.tracing {
                h.write(&t.encode_to_vec());
            }
            h.write_u8(u8::from(side.use_request_id_for_trace_sampling));
        }
    }
}

/// One side's merged Telemetry tracing settings (istiod's `TracingSpec`).
#[derive(Debug, Clone)]
struct Spec<'a> {
    provider: Option<&'a ExtensionProvider>,
    disabled: bool,
    random_sampling_percentage: Option<f64>,
    custom_tags: Option<&'a BTreeMap<String, Option<TelemetryTag>>>,
    use_request_id_for_trace_sampling: bool,
    enable_istio_tags: bool,
}

/// What the tracing of `proxy` is built from: the mesh config, the Telemetries that apply, and
/// where collectors can be.
pub(super) struct Inputs<'a> {
    pub proxy: &'a Proxy,
    /// The proxy's settings (see [`Proxy::settings`]).
    pub settings: &'a pasa_istio::proxy_config::MeshProxyConfig,
    pub mesh: Option<&'a MeshConfig>,
    pub telemetries: &'a [&'a Config<Telemetry>],
    pub collectors: &'a Collectors<'a>,
}

impl Inputs<'_> {
    fn collector(&self, service: &str, port: u32) -> Result<(String, String), TracingError> {
        self.collectors
            .find(service, port)
            .map_err(TracingError::Collector)
    }
}

/// Why a tracing provider is not configured (istiod's words).
#[derive(Debug, thiserror::Error)]
enum TracingError {
    #[error("provider {0} does not support tracing")]
    NotTracing(String),
    /// The provider's settings, as the mesh config reads them.
    #[error("{0}")]
    Settings(String),
    #[error("could not find cluster for tracing provider: {0}")]
    Collector(#[source] ProviderServiceError),
    #[error(
        "dynatrace sampler could not get http settings. considering setting the http_service \
         field on the dynatrace sampler"
    )]
    SamplerHttp,
    #[error("could not find cluster for dynatrace sampler: {0}")]
    SamplerCollector(#[source] ProviderServiceError),
}

/// The tracing of each side of `inputs.proxy`.
pub(super) fn traces(inputs: &Inputs<'_>) -> Traces {
    let default_mesh = MeshConfig::default();
    let mesh = inputs.mesh.unwrap_or(&default_mesh);
    let proxy_tracing = inputs.settings.tracing();
    let entries: Vec<_> = inputs
        .telemetries
        .iter()
        .flat_map(|t| t.spec.tracing.iter().flatten())
        .collect();
    let defaults = mesh.default_tracing_providers();
    if entries.is_empty() && defaults.is_empty() {
        let side = legacy(mesh, &proxy_tracing, inputs.proxy);
        return Traces {
            client: side.clone(),
            server: side,
        };
    }
    let start = Spec {
        provider: defaults.first().and_then(|name| mesh.provider(name)),
        disabled: false,
        random_sampling_percentage: None,
        custom_tags: None,
        use_request_id_for_trace_sampling: true,
        enable_istio_tags: true,
    };
    let (mut client, mut server) = (start.clone(), start);
    for entry in entries {
        // A mode other than CLIENT or SERVER is both sides (access logging differs: there an
        // undefined mode is neither).
        let mode = entry.match_.as_ref().and_then(|m| m.mode.as_deref());
        let mut specs: Vec<&mut Spec<'_>> = Vec::with_capacity(2);
        if mode != Some("SERVER") {
            specs.push(&mut client);
        }
        if mode != Some("CLIENT") {
            specs.push(&mut server);
        }
        let first = entry.providers.iter().flatten().next();
        for spec in specs {
            if let Some(p) = first {
                spec.provider = mesh.provider(&p.name);
            }
            if let Some(v) = entry.disable_span_reporting {
                spec.disabled = v;
            }
            if !entry.custom_tags.is_empty() {
                spec.custom_tags = Some(&entry.custom_tags);
            }
            if let Some(v) = entry.random_sampling_percentage {
                spec.random_sampling_percentage = Some(v);
            }
            if let Some(v) = entry.use_request_id_for_trace_sampling {
                spec.use_request_id_for_trace_sampling = v;
            }
            if let Some(v) = entry.enable_istio_tags {
                spec.enable_istio_tags = v;
            }
        }
    }
    Traces {
        client: built(&client, &proxy_tracing, inputs),
        server: built(&server, &proxy_tracing, inputs),
    }
}

/// Without Telemetry tracing: the mesh config's own (the bootstrap's tracer).
fn legacy(mesh: &MeshConfig, proxy_tracing: &ProxyTracing, proxy: &Proxy) -> SideTraces {
    if !mesh.enable_tracing() {
        return SideTraces::default();
    }
    let mut tracing = Tracing::default();
    sampling(&mut tracing, proxy_sampling(proxy_tracing));
    let mut tags = Vec::new();
    if proxy_tracing.enable_istio_tags != Some(false) {
        tags.extend(istio_tags(proxy));
    }
    tags.extend(proxy_config_tags(proxy_tracing));
    tags.sort_by(|a, b| a.tag.cmp(&b.tag));
    tracing.custom_tags = tags;
    if proxy_tracing.max_path_tag_length != 0 {
        tracing.max_path_tag_length = Some(UInt32Value {
            value: proxy_tracing.max_path_tag_length,
        });
    }
    SideTraces {
        tracing: Some(tracing),
        use_request_id_for_trace_sampling: true,
    }
}

/// One side's tracing from its merged settings.
fn built(spec: &Spec<'_>, proxy_tracing: &ProxyTracing, inputs: &Inputs<'_>) -> SideTraces {
    let Some(provider) = spec.provider.filter(|_| !spec.disabled) else {
        return SideTraces::default();
    };
    let (mut tracing, custom_sampler) = match provider_tracing(provider, inputs) {
        Ok(built) => built,
        Err(e) => {
            ::tracing::warn!(provider = %provider.name, "tracing not configured: {e}");
            return SideTraces::default();
        }
    };
    let percent = if custom_sampler {
        100.0
    } else {
        spec.random_sampling_percentage
            .unwrap_or_else(|| proxy_sampling(proxy_tracing))
    };
    sampling(&mut tracing, percent);
    let mut tags = Vec::new();
    if spec.enable_istio_tags {
        tags.extend(istio_tags(inputs.proxy));
    }
    match spec.custom_tags {
        Some(custom) => tags.extend(telemetry_tags(custom)),
        None => tags.extend(proxy_config_tags(proxy_tracing)),
    }
    tags.sort_by(|a, b| a.tag.cmp(&b.tag));
    tracing.custom_tags = tags;
    if tracing.max_path_tag_length.is_none() && proxy_tracing.max_path_tag_length != 0 {
        tracing.max_path_tag_length = Some(UInt32Value {
            value: proxy_tracing.max_path_tag_length,
        });
    }
    SideTraces {
        tracing: Some(tracing),
        use_request_id_for_trace_sampling: spec.use_request_id_for_trace_sampling,
    }
}

/// The percentage of `defaultConfig.tracing.sampling` (above 100 taken as 1, as istiod does),
/// else istiod's default.
fn proxy_sampling(proxy_tracing: &ProxyTracing) -> f64 {
    match proxy_tracing.sampling {
        0.0 => DEFAULT_SAMPLING,
        s if s > 100.0 => 1.0,
        s => s,
    }
}

fn sampling(tracing: &mut Tracing, random: f64) {
    tracing.client_sampling = Some(Percent { value: 100.0 });
    tracing.overall_sampling = Some(Percent { value: 100.0 });
    tracing.random_sampling = Some(Percent { value: random });
}

/// Whether the Istio version the agent's proxies claim is at least `1.minor`.
fn claims_at_least(minor: u32) -> bool {
    let mut parts = ISTIO_VERSION
        .split('.')
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, claimed) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    major > 1 || (major == 1 && claimed >= minor)
}

/// The connection manager's tracing for `provider` (without sampling and tags), and whether the
/// provider samples on its own.
fn provider_tracing(
    provider: &ExtensionProvider,
    inputs: &Inputs<'_>,
) -> Result<(Tracing, bool), TracingError> {
    let kind = provider
        .tracing()
        .ok_or_else(|| TracingError::NotTracing(provider.name.clone()))?
        .map_err(TracingError::Settings)?;
    let proxy = inputs.proxy;
    let collector = |service: &str, port: u32| inputs.collector(service, port);
    let mut spawn_upstream_span = proxy.kind == ProxyType::Router;
    let mut custom_sampler = false;
    let (name, max_tag_length, config): (&str, u32, Any) = match &kind {
        TracingProvider::Zipkin(z) => {
            let (hostname, cluster) = collector(&z.service, z.port)?;
            let endpoint = if z.path.is_empty() {
                "/api/v2/spans"
            } else {
                z.path.as_str()
            };
            let mut config = ZipkinConfig {
                collector_endpoint_version: CollectorEndpointVersion::HttpJson as i32,
                trace_id_128bit: !z.enable_64bit_trace_id,
                shared_span_context: Some(BoolValue { value: false }),
                ..Default::default()
            };
            if claims_at_least(29) {
                config.collector_service = Some(HttpService {
                    http_uri: Some(HttpUri {
                        uri: format!("http://{hostname}{endpoint}"),
                        http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster(cluster)),
                        timeout: Some(z.timeout.as_ref().map_or(
                            Duration {
                                seconds: 5,
                                nanos: 0,
                            },
                            duration,
                        )),
                    }),
                    request_headers_to_add: headers(&z.headers),
                    ..Default::default()
                });
            } else {
                config.collector_cluster = cluster;
                config.collector_endpoint = endpoint.to_string();
                config.collector_hostname = hostname;
            }
            if claims_at_least(28) {
                config.trace_context_option = match z.trace_context_option.as_deref() {
                    Some("USE_B3_WITH_W3C_PROPAGATION") => {
                        TraceContextOption::UseB3WithW3cPropagation
                    }
                    _ => TraceContextOption::UseB3,
                } as i32;
            }
            (ZIPKIN, z.max_tag_length, pack_any(config))
        }
        TracingProvider::Datadog(d) => {
            let (hostname, cluster) = collector(&d.service, d.port)?;
            let config = DatadogConfig {
                collector_cluster: cluster,
                service_name: proxy.service_cluster.clone(),
                collector_hostname: hostname,
                ..Default::default()
            };
            (DATADOG, d.max_tag_length, pack_any(config))
        }
        TracingProvider::Skywalking(s) => {
            let (hostname, cluster) = collector(&s.service, s.port)?;
            spawn_upstream_span = true;
            let config = SkyWalkingConfig {
                grpc_service: Some(providers::envoy_grpc(cluster, hostname)),
                ..Default::default()
            };
            (SKYWALKING, 0, pack_any(config))
        }
        TracingProvider::OpenTelemetry(o) => {
            let (hostname, cluster) = collector(&o.service, o.port)?;
            let (config, sampler) = opentelemetry(o, hostname, cluster, inputs)?;
            custom_sampler = sampler;
            (OPENTELEMETRY, o.max_tag_length, pack_any(config))
        }
    };
    let tracing = Tracing {
        provider: Some(envoy_types::pb::envoy::config::trace::v3::tracing::Http {
            name: name.to_string(),
            config_type: Some(tracing::http::ConfigType::TypedConfig(config)),
        }),
        spawn_upstream_span: spawn_upstream_span.then_some(BoolValue { value: true }),
        max_path_tag_length: (max_tag_length != 0).then_some(UInt32Value {
            value: max_tag_length,
        }),
        ..Default::default()
    };
    Ok((tracing, custom_sampler))
}

fn opentelemetry(
    o: &OpenTelemetryProvider,
    hostname: String,
    cluster: String,
    inputs: &Inputs<'_>,
) -> Result<(OpenTelemetryConfig, bool), TracingError> {
    let proxy = inputs.proxy;
    let semantic = o.service_attribute_enrichment.as_deref() == Some("OTEL_SEMANTIC_CONVENTIONS");
    let mut config = OpenTelemetryConfig {
        service_name: if semantic {
            otel_service_name(proxy)
        } else {
            proxy.service_cluster.clone()
        },
        ..Default::default()
    };
    match &o.http {
        Some(http) => {
            config.http_service = Some(HttpService {
                http_uri: Some(HttpUri {
                    uri: join_path(&hostname, &http.path),
                    http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster(cluster.clone())),
                    timeout: http.timeout.as_ref().map(duration),
                }),
                request_headers_to_add: headers(&http.headers),
                ..Default::default()
            })
        }
        None => {
            let grpc = o.grpc.as_ref();
            config.grpc_service = Some(GrpcService {
                timeout: grpc.and_then(|g| g.timeout.as_ref()).map(duration),
                initial_metadata: grpc
                    .map(|g| g.initial_metadata.as_slice())
                    .unwrap_or_default()
                    .iter()
                    .map(|h| HeaderValue {
                        key: h.name.clone(),
                        value: header_value(h),
                        ..Default::default()
                    })
                    .collect(),
                ..providers::envoy_grpc(cluster.clone(), hostname.clone())
            })
        }
    }
    let detectors = o.resource_detectors.as_ref();
    let environment = detectors.is_some_and(|d| d.environment.is_some()) || semantic;
    if environment {
        config.resource_detectors.push(TypedExtensionConfig {
            name: "envoy.tracers.opentelemetry.resource_detectors.environment".into(),
            typed_config: Some(pack_any(EnvironmentResourceDetectorConfig {})),
        });
    }
    if detectors.is_some_and(|d| d.dynatrace.is_some()) {
        config.resource_detectors.push(TypedExtensionConfig {
            name: "envoy.tracers.opentelemetry.resource_detectors.dynatrace".into(),
            typed_config: Some(pack_any(DynatraceResourceDetectorConfig {})),
        });
    }
    let Some(sampler) = &o.dynatrace_sampler else {
        return Ok((config, false));
    };
    config.sampler = Some(dynatrace_sampler(o, sampler, &hostname, &cluster, inputs)?);
    Ok((config, true))
}

/// Dynatrace's sampler: its own HTTP service, or the OTLP/HTTP exporter's collector and headers.
fn dynatrace_sampler(
    o: &OpenTelemetryProvider,
    sampler: &serde_json::Value,
    hostname: &str,
    cluster: &str,
    inputs: &Inputs<'_>,
) -> Result<TypedExtensionConfig, TracingError> {
    use serde_json::Value;
    let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let number = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    let read_headers = |v: Option<&Value>| -> Vec<HttpHeader> {
        v.and_then(|h| serde_json::from_value(h.clone()).ok())
            .unwrap_or_default()
    };
    let read_timeout = |v: Option<&Value>| {
        v.and_then(|t| serde_json::from_value::<pasa_istio::common::Duration>(t.clone()).ok())
            .as_ref()
            .map(duration)
    };
    let http_service = match sampler.get("httpService") {
        None => {
            let http = o.http.as_ref().ok_or(TracingError::SamplerHttp)?;
            HttpService {
                http_uri: Some(HttpUri {
                    uri: join_path(hostname, "api/v2/samplingConfiguration"),
                    http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster(
                        cluster.to_string(),
                    )),
                    timeout: http.timeout.as_ref().map(duration),
                }),
                request_headers_to_add: headers(&http.headers),
                ..Default::default()
            }
        }
        Some(api) => {
            let port = u32::try_from(number(api, "port")).unwrap_or(0);
            let (host, own_cluster) = inputs
                .collectors
                .find(&text(api, "service"), port)
                .map_err(TracingError::SamplerCollector)?;
            let http = api.get("http");
            HttpService {
                http_uri: Some(HttpUri {
                    uri: join_path(&host, &http.map(|h| text(h, "path")).unwrap_or_default()),
                    http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster(own_cluster)),
                    timeout: read_timeout(http.and_then(|h| h.get("timeout"))),
                }),
                request_headers_to_add: headers(&read_headers(http.and_then(|h| h.get("headers")))),
                ..Default::default()
            }
        }
    };
    Ok(TypedExtensionConfig {
        name: "envoy.tracers.opentelemetry.samplers.dynatrace".into(),
        typed_config: Some(pack_any(DynatraceSamplerConfig {
            tenant: text(sampler, "tenant"),
            cluster_id: i32::try_from(number(sampler, "clusterId")).unwrap_or(0),
            http_service: Some(http_service),
            root_spans_per_minute: u32::try_from(number(sampler, "rootSpansPerMinute"))
                .unwrap_or(0),
        })),
    })
}

/// Go's `url.JoinPath(host, path)` for a host without scheme: one slash between them, repeated
/// slashes collapsed, a trailing slash kept.
fn join_path(host: &str, path: &str) -> String {
    let mut parts: Vec<&str> = host.split('/').filter(|p| !p.is_empty()).collect();
    parts.extend(path.split('/').filter(|p| !p.is_empty()));
    let mut joined = parts.join("/");
    if path.ends_with('/') && !joined.ends_with('/') {
        joined.push('/');
    }
    joined
}

/// The OpenTelemetry service name of Kubernetes' semantic conventions: the
/// `app.kubernetes.io/instance` or `app.kubernetes.io/name` label, else the pod's name.
fn otel_service_name(proxy: &Proxy) -> String {
    ["app.kubernetes.io/instance", "app.kubernetes.io/name"]
        .iter()
        .find_map(|k| proxy.labels.get(*k).filter(|v| !v.is_empty()))
        .cloned()
        .or_else(|| Some(proxy.pod_name.clone()).filter(|n| !n.is_empty()))
        .unwrap_or_else(|| "unknown_service".into())
}

fn header_value(h: &HttpHeader) -> String {
    match (&h.value, &h.env_name) {
        (Some(v), _) => v.clone(),
        (None, Some(name)) => std::env::var(name).unwrap_or_default(),
        (None, None) => String::new(),
    }
}

fn headers(headers: &[HttpHeader]) -> Vec<HeaderValueOption> {
    headers
        .iter()
        .map(|h| HeaderValueOption {
            header: Some(HeaderValue {
                key: h.name.clone(),
                value: header_value(h),
                ..Default::default()
            }),
            append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
            ..Default::default()
        })
        .collect()
}

fn literal(tag: &str, value: &str) -> CustomTag {
    CustomTag {
        tag: tag.to_string(),
        r#type: Some(custom_tag::Type::Literal(custom_tag::Literal {
            value: value.to_string(),
        })),
    }
}

/// Istio's own tags: the proxy's canonical service and revision, mesh, namespace and cluster,
/// and the dry-run authorization results the RBAC filters record.
fn istio_tags(proxy: &Proxy) -> Vec<CustomTag> {
    let or = |v: &str, default: &str| {
        if v.is_empty() {
            default.to_string()
        } else {
            v.to_string()
        }
    };
    let label = |k: &str| proxy.labels.get(k).map_or("", String::as_str);
    let mut tags = vec![
        literal(
            "istio.canonical_revision",
            &or(label("service.istio.io/canonical-revision"), "latest"),
        ),
        literal(
            "istio.canonical_service",
            &or(label("service.istio.io/canonical-name"), "unknown"),
        ),
        literal("istio.mesh_id", &or(&proxy.mesh_id, "unknown")),
        literal("istio.namespace", &or(&proxy.namespace, "default")),
        literal("istio.cluster_id", &or(&proxy.cluster_id, "unknown")),
    ];
    for (side, prefix) in [("allow", SHADOW_ALLOW_PREFIX), ("deny", SHADOW_DENY_PREFIX)] {
        for (what, key) in [
            ("name", "shadow_effective_policy_id"),
            ("result", "shadow_engine_result"),
        ] {
            tags.push(CustomTag {
                tag: format!("istio.authorization.dry_run.{side}_policy.{what}"),
                r#type: Some(custom_tag::Type::Metadata(custom_tag::Metadata {
                    kind: Some(MetadataKind {
                        kind: Some(metadata_kind::Kind::Request(
                            metadata_kind::Request::default(),
                        )),
                    }),
                    metadata_key: Some(MetadataKey {
                        key: HTTP_RBAC.into(),
                        path: vec![PathSegment {
                            segment: Some(path_segment::Segment::Key(format!("{prefix}{key}"))),
                        }],
                    }),
                    ..Default::default()
                })),
            });
        }
    }
    tags
}

/// A custom tag from the first of its sources that is set: an environment variable or a request
/// header (name, default value), a literal, or a formatter.
fn custom_tag(
    tag: &str,
    environment: Option<(&str, &str)>,
    header: Option<(&str, &str)>,
    literal: Option<&str>,
    formatter: Option<&str>,
) -> Option<CustomTag> {
    let r#type = if let Some((name, default_value)) = environment {
        custom_tag::Type::Environment(custom_tag::Environment {
            name: name.to_string(),
            default_value: default_value.to_string(),
        })
    } else if let Some((name, default_value)) = header {
        custom_tag::Type::RequestHeader(custom_tag::Header {
            name: name.to_string(),
            default_value: default_value.to_string(),
        })
    } else if let Some(value) = literal {
        custom_tag::Type::Literal(custom_tag::Literal {
            value: value.to_string(),
        })
    } else {
        custom_tag::Type::Value(formatter?.to_string())
    };
    Some(CustomTag {
        tag: tag.to_string(),
        r#type: Some(r#type),
    })
}

/// `defaultConfig.tracing.customTags`.
fn proxy_config_tags(proxy_tracing: &ProxyTracing) -> Vec<CustomTag> {
    telemetry_tags(&proxy_tracing.custom_tags)
}

/// A Telemetry's `customTags` (formatter tags only for proxies newer than the agent's claim).
fn telemetry_tags(tags: &BTreeMap<String, Option<TelemetryTag>>) -> Vec<CustomTag> {
    fn named(v: &NamedTag) -> (&str, &str) {
        (&v.name, &v.default_value)
    }
    tags.iter()
        .filter_map(|(tag, t)| {
            let t = t.as_ref()?;
            custom_tag(
                tag,
                t.environment.as_ref().map(named),
                t.header.as_ref().map(named),
                t.literal.as_ref().map(|v| v.value.as_str()),
                t.formatter
                    .as_ref()
                    .filter(|_| claims_at_least(29))
                    .map(|v| v.value.as_str()),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::join_path;

    #[test]
    fn paths_join_as_gos_url_join_path() {
        assert_eq!(join_path("otel.svc", "/v1/traces"), "otel.svc/v1/traces");
        assert_eq!(join_path("otel.svc", "v1/traces/"), "otel.svc/v1/traces/");
        assert_eq!(join_path("otel.svc", ""), "otel.svc");
        assert_eq!(
            join_path("dt.example.com", "api/v2/samplingConfiguration"),
            "dt.example.com/api/v2/samplingConfiguration"
        );
    }
}
