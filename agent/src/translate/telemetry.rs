//! Access logging, tracing ([`traces`]) and, for Istio's proxy, Istio's metrics and metadata
//! exchange ([`metrics`]), as istiod configures them from the Telemetry API and the mesh config,
//! on what the other builders built for Envoy (proxyless gRPC gets none, as from istiod).
//!
//! **Which Telemetries.** The root namespace's namespace-wide Telemetry (the oldest without a
//! selector or `targetRefs`), then the proxy's namespace's, then the Telemetries of its namespace
//! whose selector its labels match (oldest first); later ones override earlier ones. Their
//! `accessLogging` entries are merged per side as istiod merges them: the providers of the last
//! entry that names any (for the side: `match.mode` CLIENT, SERVER or CLIENT_AND_SERVER) are the
//! ones in use, an entry without providers meaning the ones before it (or the mesh's
//! `defaultProviders.accessLogging`), `disabled` turning a provider off and `filter.expression`
//! (CEL) choosing what it logs. Without any entry and without default providers, the mesh
//! config's `accessLogFile` (with `accessLogFormat` and `accessLogEncoding`) is the access log.
//!
//! **Providers.** A name is looked up, case-insensitively, among the mesh config's
//! `extensionProviders` and then Istio's built-in `envoy` (a file access log to `/dev/stdout`).
//! File access logs (`envoyFileAccessLog`: path, text format or JSON `labels`, `omitEmptyValues`)
//! are built; the built-in `envoy` without a format of its own takes the mesh config's. So are
//! Envoy's gRPC access log services (`envoyHttpAls`, `envoyTcpAls`) and OpenTelemetry
//! collectors (`envoyOtelAls`: the log's text as its body, `labels` as its attributes), their
//! collector the outbound cluster of the service they name. A provider that does not log, or
//! whose collector the proxy has no cluster for, is left out (and, as in istiod, does not count
//! as configured: the mesh config's own file may apply instead).
//!
//! **Where.** The side is the listener's: a sidecar's `virtualInbound` is SERVER, its other
//! listeners and every listener of a router CLIENT. Every HTTP connection manager and TCP proxy
//! gets the logs; `virtualInbound`, `virtualOutbound` and a router's listeners also get them at
//! the listener, for connections no filter chain took (response flag `NR`), unless the mesh
//! config sets `disableEnvoyListenerLog`.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use envoy_types::pb::envoy::config::accesslog::v3::{
    AccessLog, AccessLogFilter, AndFilter, ExtensionFilter, ResponseFlagFilter, access_log,
    access_log_filter::FilterSpecifier, extension_filter,
};
use envoy_types::pb::envoy::config::core::v3::ApiVersion;
use envoy_types::pb::envoy::config::core::v3::{
    DataSource, JsonFormatOptions, SubstitutionFormatString, TypedExtensionConfig,
    data_source::Specifier, substitution_format_string::Format,
};
use envoy_types::pb::envoy::config::listener::v3::{Listener, filter};
use envoy_types::pb::envoy::extensions::access_loggers::file::v3::{
    FileAccessLog, file_access_log::AccessLogFormat,
};
use envoy_types::pb::envoy::extensions::access_loggers::filters::cel::v3::ExpressionFilter;
use envoy_types::pb::envoy::extensions::access_loggers::grpc::v3::{
    CommonGrpcAccessLogConfig, HttpGrpcAccessLogConfig, TcpGrpcAccessLogConfig,
};
use envoy_types::pb::envoy::extensions::access_loggers::open_telemetry::v3::OpenTelemetryAccessLogConfig;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use envoy_types::pb::google::protobuf::Any as prost_types_any_Any;
use envoy_types::pb::google::protobuf::Struct;
use envoy_types::pb::opentelemetry::proto::common::v1::{
    AnyValue, KeyValue, KeyValueList, any_value,
};
use envoy_types::util::pack_any;
use pasa_istio::authorization_policy::{applies_to_workload, target_refs};
use pasa_istio::mesh_config::{
    AccessLogProvider, BUILTIN_ACCESS_LOG_PROVIDER, MeshConfig, access_log_provider,
};
use pasa_istio::node::ProxyType;
use pasa_istio::telemetry::{AccessLogging, Metrics, Telemetry};
use prost::Message;
use serde_json::{Map, Value};

use super::filters::{HCM, TCP_PROXY};
use super::names;
use super::patched::{self, Type};
use super::providers::{self, Collectors};
use super::route::FAULT_FILTER;
use crate::model::proxy::Proxy;
use crate::model::registry::{Config, Registry};
use crate::resource::{Generated, Resource};
pub(super) use metrics::exchange_upstream;
use metrics::{Class, IstioFilters};

/// istiod's default text format.
const DEFAULT_TEXT_FORMAT: &str = "[%START_TIME%] \"%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% \
%PROTOCOL%\" %RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS% \
\"%UPSTREAM_TRANSPORT_FAILURE_REASON%\" %BYTES_RECEIVED% %BYTES_SENT% %DURATION% \
%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% \"%REQ(X-FORWARDED-FOR)%\" \"%REQ(USER-AGENT)%\" \
\"%REQ(X-REQUEST-ID)%\" \"%REQ(:AUTHORITY)%\" \"%UPSTREAM_HOST%\" %UPSTREAM_CLUSTER_RAW% \
%UPSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_REMOTE_ADDRESS% \
%REQUESTED_SERVER_NAME% %ROUTE_NAME%\n";

/// istiod's default JSON format: field and command operator.
const DEFAULT_JSON_FORMAT: [(&str, &str); 24] = [
    ("start_time", "%START_TIME%"),
    ("route_name", "%ROUTE_NAME%"),
    ("method", "%REQ(:METHOD)%"),
    ("path", "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%"),
    ("protocol", "%PROTOCOL%"),
    ("response_code", "%RESPONSE_CODE%"),
    ("response_flags", "%RESPONSE_FLAGS%"),
    ("response_code_details", "%RESPONSE_CODE_DETAILS%"),
    (
        "connection_termination_details",
        "%CONNECTION_TERMINATION_DETAILS%",
    ),
    ("bytes_received", "%BYTES_RECEIVED%"),
    ("bytes_sent", "%BYTES_SENT%"),
    ("duration", "%DURATION%"),
    (
        "upstream_service_time",
        "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%",
    ),
    ("x_forwarded_for", "%REQ(X-FORWARDED-FOR)%"),
    ("user_agent", "%REQ(USER-AGENT)%"),
    ("request_id", "%REQ(X-REQUEST-ID)%"),
    ("authority", "%REQ(:AUTHORITY)%"),
    ("upstream_host", "%UPSTREAM_HOST%"),
    ("upstream_cluster", "%UPSTREAM_CLUSTER_RAW%"),
    ("upstream_local_address", "%UPSTREAM_LOCAL_ADDRESS%"),
    ("downstream_local_address", "%DOWNSTREAM_LOCAL_ADDRESS%"),
    ("downstream_remote_address", "%DOWNSTREAM_REMOTE_ADDRESS%"),
    ("requested_server_name", "%REQUESTED_SERVER_NAME%"),
    (
        "upstream_transport_failure_reason",
        "%UPSTREAM_TRANSPORT_FAILURE_REASON%",
    ),
];

const FILE_ACCESS_LOG: &str = "envoy.access_loggers.file";
const HTTP_GRPC_ACCESS_LOG: &str = "envoy.access_loggers.http_grpc";
const TCP_GRPC_ACCESS_LOG: &str = "envoy.tcp_grpc_access_log";
const OTEL_ACCESS_LOG: &str = "envoy.access_loggers.open_telemetry";
/// The filter state the log services are sent: the peers' metadata Istio's proxies exchange.
const PEER_STATE: [&str; 2] = ["upstream_peer", "downstream_peer"];
/// ... and, for OpenTelemetry, their older keys too.
const WASM_PEER_STATE: [&str; 4] = [
    "wasm.upstream_peer",
    "wasm.upstream_peer_id",
    "wasm.downstream_peer",
    "wasm.downstream_peer_id",
];
const CEL_FILTER: &str = "envoy.access_loggers.extension_filters.cel";
const REQ_WITHOUT_QUERY: &str = "%REQ_WITHOUT_QUERY";

/// Which side of the traffic a listener serves (also for the extensions that pick a side, and
/// the metrics' modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Side {
    Client,
    Server,
}

impl Side {
    /// The side of the listener `name` of a router (`router`) or a sidecar: a sidecar's
    /// `virtualInbound` is SERVER, its other listeners and every listener of a router CLIENT.
    pub(super) fn of_listener(router: bool, name: &str) -> Side {
        Class::of_listener(router, name).side()
    }

    fn matches(self, mode: Option<&str>) -> bool {
        match mode {
            None | Some("CLIENT_AND_SERVER") => true,
            Some("CLIENT") => self == Side::Client,
            Some("SERVER") => self == Side::Server,
            Some(_) => false,
        }
    }
}

/// The access logs of each side.
#[derive(Debug, Default, PartialEq)]
struct Logs {
    client: Vec<AccessLog>,
    server: Vec<AccessLog>,
    /// Also at the listener (with the `NR` filter).
    at_listener: bool,
}

impl Logs {
    fn of(&self, side: Side) -> &[AccessLog] {
        match side {
            Side::Client => &self.client,
            Side::Server => &self.server,
        }
    }

    fn fingerprint(&self, h: &mut impl Hasher) {
        for l in self.client.iter().chain(&self.server) {
            l.encode_to_vec().hash(h);
        }
        self.client.len().hash(h);
        self.at_listener.hash(h);
    }
}

/// The Telemetries that apply to `proxy`, in istiod's order (later override earlier).
fn applying<'a>(proxy: &Proxy, registry: &'a Registry) -> Vec<&'a Config<Telemetry>> {
    let root = proxy.mesh.root_namespace.as_str();
    let mut all: Vec<&Config<Telemetry>> = registry.telemetries().collect();
    all.sort_by(|a, b| a.meta.age_key().cmp(&b.meta.age_key()));
    let wide = |ns: &str| {
        all.iter()
            .copied()
            .find(|t| t.meta.namespace == ns && !targeted(&t.spec) && selector_empty(&t.spec))
    };
    let mut out = Vec::new();
    out.extend(wide(root));
    if proxy.config_namespace != root {
        out.extend(wide(&proxy.config_namespace));
    }
    // Then those of its namespace that pick workloads, by selector or targetRefs.
    out.extend(all.iter().copied().filter(|t| {
        t.meta.namespace == proxy.config_namespace
            && (targeted(&t.spec) || !selector_empty(&t.spec))
            && applies_to_workload(
                &t.meta.namespace,
                t.spec.selector.as_ref(),
                &target_refs(t.spec.target_ref.as_ref(), &t.spec.target_refs),
                root,
                &proxy.config_namespace,
                &proxy.labels,
            )
    }));
    out
}

fn targeted(t: &Telemetry) -> bool {
    t.target_ref.is_some() || !t.target_refs.is_empty()
}

fn selector_empty(t: &Telemetry) -> bool {
    t.selector
        .as_ref()
        .is_none_or(|s| s.match_labels.is_empty())
}

fn provider_names(entry: &AccessLogging) -> Vec<String> {
    entry
        .providers
        .iter()
        .flatten()
        .map(|p| p.name.clone())
        .collect()
}

/// istiod's merge of the access logging entries for one side: provider → (its CEL filter,
/// disabled).
fn merge(
    per_telemetry: &[Vec<&AccessLogging>],
    defaults: &[String],
    side: Side,
) -> BTreeMap<String, (Option<String>, bool)> {
    let mut out = BTreeMap::new();
    if per_telemetry.is_empty() {
        for p in defaults {
            out.insert(p.clone(), (None, false));
        }
        return out;
    }
    // The providers in use: those the entries (of this side) of the last Telemetry that names
    // any name together.
    let mut in_scope: BTreeSet<String> = defaults.iter().cloned().collect();
    let mut filters: BTreeMap<String, Option<String>> = BTreeMap::new();
    for entries in per_telemetry {
        let mut named = BTreeSet::new();
        for e in entries {
            if !side.matches(e.match_.as_ref().and_then(|m| m.mode.as_deref())) {
                continue;
            }
            for p in provider_names(e) {
                filters.insert(p.clone(), e.filter.as_ref().map(|f| f.expression.clone()));
                named.insert(p);
            }
        }
        if !named.is_empty() {
            in_scope = named;
        }
    }
    let mut parent: Vec<String> = defaults.to_vec();
    for e in per_telemetry.iter().flatten() {
        let mut names = provider_names(e);
        if names.is_empty() {
            names = parent.clone();
        }
        parent = names.clone();
        for p in names {
            if !in_scope.contains(&p)
                || !side.matches(e.match_.as_ref().and_then(|m| m.mode.as_deref()))
            {
                continue;
            }
            if e.disabled == Some(true) {
                out.insert(p, (None, true));
                continue;
            }
            out.insert(p.clone(), (filters.get(&p).cloned().flatten(), false));
        }
    }
    out
}

/// The access logs configured by the mesh config and `telemetries` (those that apply), or
/// nothing when none is.
fn logs(
    mesh_config: Option<&MeshConfig>,
    telemetries: &[&Config<Telemetry>],
    collectors: &Collectors<'_>,
) -> Logs {
    let empty = Map::new();
    let mesh = mesh_config.map_or(&empty, |m| &m.other);
    let at_listener = mesh.get("disableEnvoyListenerLog").and_then(Value::as_bool) != Some(true);
    let per_telemetry: Vec<Vec<&AccessLogging>> = telemetries
        .iter()
        .map(|t| t.spec.access_logging.iter().flatten().collect::<Vec<_>>())
        .filter(|entries| !entries.is_empty())
        .collect();
    let defaults = mesh_config
        .map(MeshConfig::default_access_log_providers)
        .unwrap_or_default();
    // istiod's fallback, for a side nothing else configures: the mesh config's own access log
    // file.
    let legacy = mesh
        .get("accessLogFile")
        .and_then(Value::as_str)
        .filter(|p| !p.is_empty())
        .map(|path| mesh_file_log(path, mesh));
    let mut out = Logs {
        at_listener,
        ..Default::default()
    };
    for side in [Side::Client, Side::Server] {
        let mut built: Vec<(String, AccessLog)> = Vec::new();
        let mut configured = 0;
        let merged = if per_telemetry.is_empty() && defaults.is_empty() {
            BTreeMap::new()
        } else {
            merge(&per_telemetry, &defaults, side)
        };
        for (name, (filter, disabled)) in merged {
            let Some((canonical, provider)) = access_log_provider(mesh_config, &name) else {
                continue;
            };
            let log = provider.and_then(|p| provider_log(&canonical, p, mesh, collectors));
            let mut log = match log {
                Ok(log) => log,
                Err(e) => {
                    tracing::warn!(provider = %canonical, "access log not configured: {e}");
                    continue;
                }
            };
            // A provider turned off still counts as configured: no fallback then.
            configured += 1;
            if disabled {
                continue;
            }
            log.filter = filter.map(cel_filter);
            built.push((canonical, log));
        }
        built.sort_by(|a, b| a.0.cmp(&b.0));
        let mut logs: Vec<AccessLog> = built.into_iter().map(|(_, l)| l).collect();
        if configured == 0 {
            logs.extend(legacy.clone());
        }
        match side {
            Side::Client => out.client = logs,
            Side::Server => out.server = logs,
        }
    }
    out
}

/// The access log of the provider `name`.
fn provider_log(
    name: &str,
    provider: AccessLogProvider,
    mesh: &Map<String, Value>,
    collectors: &Collectors<'_>,
) -> Result<AccessLog, String> {
    let grpc = |service: &str, port: u32, log_name: &str, default_name: &str, state: &[&str]| {
        let (hostname, cluster) = collectors
            .find(service, port)
            .map_err(|e| format!("could not find cluster for the log service: {e}"))?;
        Ok::<_, String>(CommonGrpcAccessLogConfig {
            log_name: if log_name.is_empty() {
                default_name
            } else {
                log_name
            }
            .to_string(),
            grpc_service: Some(providers::envoy_grpc(cluster, hostname)),
            transport_api_version: ApiVersion::V3 as i32,
            filter_state_objects_to_log: state.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        })
    };
    let typed = |name: &str, config: prost_types_any_Any| AccessLog {
        name: name.to_string(),
        config_type: Some(access_log::ConfigType::TypedConfig(config)),
        ..Default::default()
    };
    fn state(objects: &[String]) -> Vec<&str> {
        if objects.is_empty() {
            PEER_STATE.to_vec()
        } else {
            objects.iter().map(String::as_str).collect()
        }
    }
    Ok(match provider {
        AccessLogProvider::File(file) => {
            if name == BUILTIN_ACCESS_LOG_PROVIDER
                && file.get("logFormat").is_none()
                && file.get("omitEmptyValues").and_then(Value::as_bool) != Some(true)
            {
                mesh_file_log(
                    file.get("path")
                        .and_then(Value::as_str)
                        .unwrap_or("/dev/stdout"),
                    mesh,
                )
            } else {
                provider_file_log(&file)
            }
        }
        AccessLogProvider::HttpGrpc(g) => typed(
            HTTP_GRPC_ACCESS_LOG,
            pack_any(HttpGrpcAccessLogConfig {
                common_config: Some(grpc(
                    &g.service,
                    g.port,
                    &g.log_name,
                    "http_envoy_accesslog",
                    &state(&g.filter_state_objects_to_log),
                )?),
                additional_request_headers_to_log: g.additional_request_headers_to_log,
                additional_response_headers_to_log: g.additional_response_headers_to_log,
                additional_response_trailers_to_log: g.additional_response_trailers_to_log,
            }),
        ),
        AccessLogProvider::TcpGrpc(g) => typed(
            TCP_GRPC_ACCESS_LOG,
            pack_any(TcpGrpcAccessLogConfig {
                common_config: Some(grpc(
                    &g.service,
                    g.port,
                    &g.log_name,
                    "tcp_envoy_accesslog",
                    &state(&g.filter_state_objects_to_log),
                )?),
            }),
        ),
        AccessLogProvider::OpenTelemetry(o) => {
            let format = o.log_format.unwrap_or_default();
            let text = if format.text.is_empty() {
                DEFAULT_TEXT_FORMAT.to_string()
            } else {
                format.text
            };
            let labels = format.labels.unwrap_or_default();
            let needs_formatter = text.contains(REQ_WITHOUT_QUERY)
                || labels
                    .values()
                    .any(|v| v.as_str().is_some_and(|s| s.contains(REQ_WITHOUT_QUERY)));
            let mut state = PEER_STATE.to_vec();
            state.extend(WASM_PEER_STATE);
            typed(
                OTEL_ACCESS_LOG,
                // istiod's (deprecated in newer Envoys, read by all).
                #[allow(deprecated)]
                pack_any(OpenTelemetryAccessLogConfig {
                    common_config: Some(grpc(
                        &o.service,
                        o.port,
                        &o.log_name,
                        "otel_envoy_accesslog",
                        &state,
                    )?),
                    disable_builtin_labels: true,
                    body: Some(otel_string(text)),
                    // Sorted by key (a map in JSON), each value as its string.
                    attributes: (!labels.is_empty()).then(|| KeyValueList {
                        values: labels
                            .iter()
                            .collect::<BTreeMap<_, _>>()
                            .into_iter()
                            .map(|(k, v)| KeyValue {
                                key: k.clone(),
                                value: Some(otel_string(
                                    v.as_str().unwrap_or_default().to_string(),
                                )),
                                ..Default::default()
                            })
                            .collect(),
                    }),
                    formatters: formatters(needs_formatter),
                    ..Default::default()
                }),
            )
        }
    })
}

fn otel_string(s: String) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::StringValue(s)),
    }
}

fn file_log(path: &str, format: Option<SubstitutionFormatString>) -> AccessLog {
    AccessLog {
        name: FILE_ACCESS_LOG.into(),
        config_type: Some(access_log::ConfigType::TypedConfig(pack_any(
            FileAccessLog {
                path: path.to_string(),
                access_log_format: format.map(AccessLogFormat::LogFormat),
            },
        ))),
        ..Default::default()
    }
}

/// A text format with istiod's trailing newline, or istiod's default.
fn text_format(text: &str, omit_empty_values: bool) -> SubstitutionFormatString {
    let text = if text.is_empty() {
        DEFAULT_TEXT_FORMAT.to_string()
    } else if text.ends_with('\n') {
        text.to_string()
    } else {
        format!("{text}\n")
    };
    SubstitutionFormatString {
        formatters: formatters(text.contains(REQ_WITHOUT_QUERY)),
        format: Some(Format::TextFormatSource(DataSource {
            specifier: Some(Specifier::InlineString(text)),
            ..Default::default()
        })),
        omit_empty_values,
        ..Default::default()
    }
}

fn json_format(
    labels: Option<&Map<String, Value>>,
    omit_empty_values: bool,
) -> SubstitutionFormatString {
    let fields: Map<String, Value> = match labels.filter(|l| !l.is_empty()) {
        Some(l) => l.clone(),
        None => DEFAULT_JSON_FORMAT
            .iter()
            .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
            .collect(),
    };
    let needs = fields
        .values()
        .any(|v| v.as_str().is_some_and(|s| s.contains(REQ_WITHOUT_QUERY)));
    SubstitutionFormatString {
        formatters: formatters(needs),
        format: Some(Format::JsonFormat(
            Struct::decode(
                super::builders::json_struct(&fields)
                    .encode_to_vec()
                    .as_slice(),
            )
            .unwrap_or_default(),
        )),
        // istiod's: present, properties not sorted (the default).
        json_format_options: Some(JsonFormatOptions::default()),
        omit_empty_values,
        ..Default::default()
    }
}

fn formatters(req_without_query: bool) -> Vec<TypedExtensionConfig> {
    if !req_without_query {
        return Vec::new();
    }
    vec![TypedExtensionConfig {
        name: "envoy.formatter.req_without_query".into(),
        typed_config: Some(pack_any(
            envoy_types::pb::envoy::extensions::formatter::req_without_query::v3::ReqWithoutQuery::default(),
        )),
    }]
}

/// The mesh config's access log (`accessLogFormat`, `accessLogEncoding`) to `path`.
fn mesh_file_log(path: &str, mesh: &Map<String, Value>) -> AccessLog {
    let format = mesh
        .get("accessLogFormat")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let json = mesh.get("accessLogEncoding").and_then(Value::as_str) == Some("JSON");
    let format = if json {
        let parsed: Option<Map<String, Value>> = serde_json::from_str(format).ok();
        json_format(parsed.as_ref(), false)
    } else {
        text_format(format, false)
    };
    file_log(path, Some(format))
}

/// An `envoyFileAccessLog` provider's access log.
fn provider_file_log(file: &Value) -> AccessLog {
    let path = file
        .get("path")
        .and_then(Value::as_str)
        .filter(|p| !p.is_empty())
        .unwrap_or("/dev/stdout");
    let omit = file.get("omitEmptyValues").and_then(Value::as_bool) == Some(true);
    let format = match file.get("logFormat") {
        Some(f) if f.get("labels").is_some() => Some(json_format(f["labels"].as_object(), omit)),
        Some(f) if f.get("text").is_some() => {
            Some(text_format(f["text"].as_str().unwrap_or_default(), omit))
        }
        // A format of neither kind: none (Envoy's own), as from istiod.
        Some(_) => None,
        None => Some(text_format("", omit)),
    };
    file_log(path, format)
}

fn cel_filter(expression: String) -> AccessLogFilter {
    AccessLogFilter {
        filter_specifier: Some(FilterSpecifier::ExtensionFilter(ExtensionFilter {
            name: CEL_FILTER.into(),
            config_type: Some(extension_filter::ConfigType::TypedConfig(pack_any(
                ExpressionFilter {
                    expression,
                    ..Default::default()
                },
            ))),
        })),
    }
}

/// The listener's copy of a log: only for connections no filter chain took (`NR`), and with the
/// log's own filter.
fn at_listener(log: &AccessLog) -> AccessLog {
    let nr = AccessLogFilter {
        filter_specifier: Some(FilterSpecifier::ResponseFlagFilter(ResponseFlagFilter {
            flags: vec!["NR".into()],
        })),
    };
    let filter = match &log.filter {
        None => nr,
        Some(own) => AccessLogFilter {
            filter_specifier: Some(FilterSpecifier::AndFilter(AndFilter {
                filters: vec![nr, own.clone()],
            })),
        },
    };
    AccessLog {
        filter: Some(filter),
        ..log.clone()
    }
}

/// What telemetry remembers across generations.
#[derive(Debug, Default)]
pub(crate) struct Memo {
    changed: patched::Memo,
}

impl Memo {
    /// Puts the access logs, the tracing and the metrics of `proxy` on the listeners of
    /// `generated` (the clusters' upstream metadata exchange is added as they are built: see
    /// [`exchange_upstream`]).
    pub(crate) fn apply(&mut self, proxy: &Proxy, registry: &Registry, generated: &mut Generated) {
        let mesh = registry.mesh_config(&proxy.mesh.root_namespace);
        let telemetries = applying(proxy, registry);
        let collectors = Collectors::new(registry, &generated.clusters);
        let logs = logs(mesh, &telemetries, &collectors);
        let settings = proxy.settings(mesh);
        let traces = traces::traces(&traces::Inputs {
            proxy,
            settings: &settings,
            mesh,
            telemetries: &telemetries,
            collectors: &collectors,
        });
        let metric_entries: Vec<&Metrics> = telemetries
            .iter()
            .flat_map(|t| t.spec.metrics.iter().flatten())
            .collect();
        let istio = IstioFilters::new(proxy.build, &settings, mesh, &metric_entries);
        let mut fingerprint = std::collections::hash_map::DefaultHasher::new();
        logs.fingerprint(&mut fingerprint);
        traces.fingerprint(&mut fingerprint);
        if let Some(istio) = &istio {
            istio.fingerprint(&mut fingerprint);
        }
        self.changed.begin(fingerprint.finish());
        let router = proxy.kind == ProxyType::Router;
        self.changed
            .each(Type::Listener, &mut generated.listeners, |_, r| {
                let mut l = Listener::decode(r.body.value.as_slice()).ok()?;
                let class = Class::of_listener(router, &l.name);
                let side = class.side();
                let logs_here = logs.of(side);
                if !put(&mut l, class, logs_here, traces.of(side), istio.as_ref()) {
                    return Some(Arc::clone(r));
                }
                let virtual_listener =
                    l.name == names::VIRTUAL_INBOUND || l.name == names::VIRTUAL_OUTBOUND;
                if logs.at_listener && (router || virtual_listener) {
                    l.access_log.extend(logs_here.iter().map(at_listener));
                }
                Some(Resource::pack(&l))
            });
    }
}

/// Adds `logs` to every connection manager and TCP proxy of `l` (of `class`), sets the
/// connection managers' tracing and gRPC statistics, and, for Istio's proxy (`istio`), its
/// metrics and metadata exchange filters; whether it changed anything.
fn put(
    l: &mut Listener,
    class: Class,
    logs: &[AccessLog],
    traces: &traces::SideTraces,
    istio: Option<&IstioFilters>,
) -> bool {
    let mut changed = false;
    let chains = l
        .filter_chains
        .iter_mut()
        .chain(l.default_filter_chain.as_mut());
    for chain in chains {
        // istiod builds the chains refusing traffic to the virtual listeners' own ports without
        // access logs.
        let logged = chain.name != names::VIRTUAL_INBOUND_BLACKHOLE
            && chain.name != names::VIRTUAL_OUTBOUND_BLACKHOLE;
        for f in &mut chain.filters {
            let Some(filter::ConfigType::TypedConfig(any)) = &mut f.config_type else {
                continue;
            };
            if f.name == HCM {
                if let Ok(mut hcm) = HttpConnectionManager::decode(any.value.as_slice()) {
                    if logged {
                        hcm.access_log.extend(logs.iter().cloned());
                    }
                    traces.put(&mut hcm);
                    let fault = hcm
                        .http_filters
                        .iter()
                        .position(|f| f.name == FAULT_FILTER)
                        .unwrap_or(hcm.http_filters.len().saturating_sub(1));
                    hcm.http_filters.insert(fault, metrics::grpc_stats());
                    if let Some(istio) = istio {
                        istio.put_http(class, &mut hcm.http_filters);
                    }
                    any.value = hcm.encode_to_vec();
                    changed = true;
                }
            } else if f.name == TCP_PROXY
                && logged
                && !logs.is_empty()
                && let Ok(mut tcp) = TcpProxy::decode(any.value.as_slice())
            {
                tcp.access_log.extend(logs.iter().cloned());
                any.value = tcp.encode_to_vec();
                changed = true;
            }
        }
        if let Some(istio) = istio {
            if chain.filters.last().is_some_and(|f| f.name == TCP_PROXY) {
                istio.put_tcp(class, &mut chain.filters);
                changed = true;
            }
            if class == Class::SidecarInbound {
                chain.filters.insert(0, super::filters::tcp_listener_mx());
                changed = true;
            }
        }
    }
    changed
}

mod metrics;
mod traces;

#[cfg(test)]
mod metrics_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tracing_tests;
