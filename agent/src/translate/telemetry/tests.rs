//! Access logs from the Telemetry API and the mesh config, through the translator.

use envoy_types::pb::envoy::config::accesslog::v3::{AccessLog, access_log};
use envoy_types::pb::envoy::config::listener::v3::{Listener, filter};
use envoy_types::pb::envoy::extensions::access_loggers::file::v3::{
    FileAccessLog, file_access_log::AccessLogFormat,
};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use pasa_proto::store::v1::Resource as StoreResource;
use prost::Message;
use serde_json::{Value, json};

use crate::testing::resource;
use crate::translate::tests::{
    hcm_in, reviews_service, reviews_workload as workload, translate_for as translate,
};

fn telemetry(ns: &str, name: &str, spec: Value, revision: u64) -> StoreResource {
    resource("Telemetry", ns, name, spec, revision)
}

fn mesh(spec: Value) -> StoreResource {
    resource("MeshConfig", "istio-system", "mesh", spec, 1)
}

/// The access logs of the first connection manager of `l`'s chain `chain` (any chain when
/// empty), as (path, format text or JSON keys).
fn hcm_logs(l: &Listener, chain: &str) -> Vec<(String, String)> {
    described(&hcm_in(l, chain).access_log)
}

fn described(logs: &[AccessLog]) -> Vec<(String, String)> {
    logs.iter()
        .map(|l| {
            let Some(access_log::ConfigType::TypedConfig(any)) = &l.config_type else {
                panic!("typed")
            };
            let file = FileAccessLog::decode(any.value.as_slice()).unwrap();
            let Some(AccessLogFormat::LogFormat(format)) = file.access_log_format else {
                panic!("a log format")
            };
            use envoy_types::pb::envoy::config::core::v3::data_source::Specifier;
            use envoy_types::pb::envoy::config::core::v3::substitution_format_string::Format;
            let shown = match format.format {
                Some(Format::TextFormatSource(d)) => match d.specifier {
                    Some(Specifier::InlineString(s)) => s,
                    other => format!("{other:?}"),
                },
                Some(Format::JsonFormat(s)) => {
                    let mut keys: Vec<String> = s.fields.keys().cloned().collect();
                    keys.sort();
                    format!("json:{}", keys.join(","))
                }
                other => format!("{other:?}"),
            };
            (file.path, shown)
        })
        .collect()
}

#[test]
fn without_telemetry_the_mesh_configs_access_log_file_applies() {
    let out = translate(workload(), vec![reviews_service()]);
    assert!(hcm_logs(&out.listeners["virtualInbound"], "0.0.0.0_9080").is_empty());
    let out = translate(
        workload(),
        vec![
            reviews_service(),
            mesh(json!({"accessLogFile": "/dev/stdout", "accessLogEncoding": "JSON"})),
        ],
    );
    let logs = hcm_logs(&out.listeners["virtualInbound"], "0.0.0.0_9080");
    assert_eq!(logs.len(), 1);
    assert_eq!(logs[0].0, "/dev/stdout");
    assert!(logs[0].1.starts_with("json:authority,"), "{logs:?}");
    // The virtual listeners log connections no chain took.
    let outbound = &out.listeners["virtualOutbound"];
    assert_eq!(outbound.access_log.len(), 1);
    // TCP proxies too, but for the chain refusing traffic to the listener's own port (as from
    // istiod).
    let tcp_logs = |chain: &str| {
        let f = outbound
            .filter_chains
            .iter()
            .filter(|c| c.name == chain)
            .flat_map(|c| &c.filters)
            .find(|f| f.name.ends_with("tcp_proxy"))
            .unwrap_or_else(|| panic!("a TCP proxy in {chain}"));
        let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else {
            panic!()
        };
        TcpProxy::decode(any.value.as_slice())
            .unwrap()
            .access_log
            .len()
    };
    assert_eq!(
        tcp_logs(crate::translate::names::VIRTUAL_OUTBOUND_CATCH_ALL_TCP),
        1
    );
    assert_eq!(
        tcp_logs(crate::translate::names::VIRTUAL_OUTBOUND_BLACKHOLE),
        0
    );
}

#[test]
fn the_builtin_envoy_provider_takes_the_mesh_format_and_modes_pick_the_side() {
    let root = telemetry(
        "istio-system",
        "mesh-default",
        json!({"accessLogging": [{"providers": [{"name": "envoy"}]}]}),
        5,
    );
    let mesh = mesh(json!({"accessLogFormat": "%REQ(:METHOD)% %RESPONSE_CODE%"}));
    let out = translate(
        workload(),
        vec![reviews_service(), root.clone(), mesh.clone()],
    );
    let logs = hcm_logs(&out.listeners["virtualInbound"], "0.0.0.0_9080");
    assert_eq!(
        logs,
        [(
            "/dev/stdout".to_string(),
            "%REQ(:METHOD)% %RESPONSE_CODE%\n".to_string()
        )]
    );
    // The workload's own Telemetry logs only its client side.
    let client_only = telemetry(
        "default",
        "reviews",
        json!({"selector": {"matchLabels": {"app": "reviews"}},
               "accessLogging": [{"match": {"mode": "CLIENT"}, "providers": [{"name": "envoy"}]},
                                 {"match": {"mode": "SERVER"}, "disabled": true}]}),
        6,
    );
    let out = translate(workload(), vec![reviews_service(), root, mesh, client_only]);
    assert!(hcm_logs(&out.listeners["virtualInbound"], "0.0.0.0_9080").is_empty());
    let outbound = out
        .listeners
        .values()
        .find(|l| l.name == "0.0.0.0_9080")
        .expect("the outbound listener of port 9080");
    assert_eq!(hcm_logs(outbound, "").len(), 1);
}

#[test]
fn providers_of_the_mesh_config_and_filters_are_built() {
    let mesh = mesh(json!({"extensionProviders": [
        {"name": "json-log", "envoyFileAccessLog": {"path": "/var/log/access.json",
            "logFormat": {"labels": {"code": "%RESPONSE_CODE%", "path": "%REQ_WITHOUT_QUERY(:PATH)%"}}}}]}));
    let ns = telemetry(
        "default",
        "errors",
        json!({"accessLogging": [{"providers": [{"name": "json-log"}],
                                  "filter": {"expression": "response.code >= 400"}}]}),
        5,
    );
    let out = translate(workload(), vec![reviews_service(), mesh, ns]);
    let hcm = hcm_in(&out.listeners["virtualInbound"], "0.0.0.0_9080");
    assert_eq!(
        described(&hcm.access_log),
        [(
            "/var/log/access.json".to_string(),
            "json:code,path".to_string()
        )]
    );
    assert!(hcm.access_log[0].filter.is_some(), "the CEL filter");
    let Some(access_log::ConfigType::TypedConfig(any)) = &hcm.access_log[0].config_type else {
        panic!()
    };
    let file = FileAccessLog::decode(any.value.as_slice()).unwrap();
    let Some(AccessLogFormat::LogFormat(format)) = file.access_log_format else {
        panic!()
    };
    assert_eq!(
        format.formatters.len(),
        1,
        "REQ_WITHOUT_QUERY needs its formatter"
    );
}

#[test]
fn one_telemetrys_entries_add_up_and_an_unconfigured_side_falls_back_to_the_mesh_file() {
    let mesh = mesh(
        json!({"accessLogFile": "/var/log/mesh.log", "extensionProviders": [
        {"name": "second", "envoyFileAccessLog": {"path": "/var/log/second.log"}}]}),
    );
    let two = telemetry(
        "istio-system",
        "two",
        json!({"accessLogging": [{"providers": [{"name": "envoy"}]},
                                 {"providers": [{"name": "second"}]}]}),
        5,
    );
    let out = translate(workload(), vec![reviews_service(), mesh.clone(), two]);
    let paths: Vec<String> = hcm_logs(&out.listeners["virtualInbound"], "0.0.0.0_9080")
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    assert_eq!(
        paths,
        ["/dev/stdout", "/var/log/second.log"],
        "both, by provider name"
    );
    // Only the server side configured: the client side takes the mesh's file.
    let server_only = telemetry(
        "istio-system",
        "server",
        json!({"accessLogging": [{"match": {"mode": "SERVER"}, "providers": [{"name": "second"}]}]}),
        6,
    );
    let out = translate(workload(), vec![reviews_service(), mesh, server_only]);
    let server: Vec<String> = hcm_logs(&out.listeners["virtualInbound"], "0.0.0.0_9080")
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    assert_eq!(server, ["/var/log/second.log"]);
    let outbound = out
        .listeners
        .values()
        .find(|l| l.name == "0.0.0.0_9080")
        .expect("the outbound listener of port 9080");
    let client: Vec<String> = hcm_logs(outbound, "").into_iter().map(|(p, _)| p).collect();
    assert_eq!(client, ["/var/log/mesh.log"]);
}

mod tracing {
    use envoy_types::pb::envoy::config::trace::v3::{
        DatadogConfig, OpenTelemetryConfig, ZipkinConfig,
    };
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::Tracing;
    use envoy_types::pb::envoy::extensions::request_id::uuid::v3::UuidRequestIdConfig;
    use envoy_types::pb::envoy::r#type::tracing::v3::custom_tag;

    use super::*;

    /// The collectors of the mesh: a Zipkin, an OpenTelemetry collector.
    fn collectors() -> Vec<StoreResource> {
        vec![
            resource(
                "ServiceEndpoints",
                "istio-system",
                "zipkin",
                json!({"addresses": ["10.96.0.90"], "ports": [{"name": "http", "port": 9411}],
                       "endpoints": [{"address": "10.0.9.1"}]}),
                3,
            ),
            resource(
                "ServiceEndpoints",
                "observability",
                "otel",
                json!({"addresses": ["10.96.0.91"],
                       "ports": [{"name": "grpc", "port": 4317}, {"name": "http", "port": 4318}],
                       "endpoints": [{"address": "10.0.9.2"}]}),
                3,
            ),
        ]
    }

    fn providers(extra: Value) -> StoreResource {
        let mut spec = json!({"extensionProviders": [
            {"name": "zipkin", "zipkin": {"service": "zipkin.istio-system.svc.cluster.local",
                                          "port": 9411, "maxTagLength": 99}},
            {"name": "otel", "opentelemetry": {"service": "otel.observability.svc.cluster.local",
                                               "port": 4318,
                                               "http": {"path": "/v1/traces", "timeout": "3s",
                                                        "headers": [{"name": "x-token", "value": "t"}]},
                                               "resourceDetectors": {"environment": {}}}},
            {"name": "datadog", "datadog": {"service": "otel.observability.svc.cluster.local",
                                            "port": 4317}},
            {"name": "logs", "envoyFileAccessLog": {"path": "/dev/stdout"}},
            {"name": "nowhere", "zipkin": {"service": "missing.example.com", "port": 9411}}]});
        for (k, v) in extra.as_object().into_iter().flatten() {
            spec[k] = v.clone();
        }
        mesh(spec)
    }

    /// The tracing and the request ID setting of the connection manager of `l` (chain `chain`,
    /// any when empty).
    fn traced(l: &Listener, chain: &str) -> (Option<Tracing>, Option<bool>) {
        let hcm = hcm_in(l, chain);
        let request_id = hcm.request_id_extension.map(|r| {
            UuidRequestIdConfig::decode(r.typed_config.unwrap().value.as_slice())
                .unwrap()
                .use_request_id_for_trace_sampling
                .unwrap()
                .value
        });
        (hcm.tracing, request_id)
    }

    fn inbound(out: &crate::resource::Resources) -> (Option<Tracing>, Option<bool>) {
        traced(&out.listeners["virtualInbound"], "0.0.0.0_9080")
    }

    fn outbound(out: &crate::resource::Resources) -> (Option<Tracing>, Option<bool>) {
        traced(&out.listeners["0.0.0.0_9080"], "")
    }

    fn tags(t: &Tracing) -> Vec<String> {
        t.custom_tags.iter().map(|t| t.tag.clone()).collect()
    }

    fn provider<M: Message + Default>(t: &Tracing, name: &str) -> M {
        let p = t.provider.as_ref().expect("a provider");
        assert_eq!(p.name, name);
        let Some(
            envoy_types::pb::envoy::config::trace::v3::tracing::http::ConfigType::TypedConfig(any),
        ) = &p.config_type
        else {
            panic!("typed")
        };
        M::decode(any.value.as_slice()).unwrap()
    }

    #[test]
    fn without_telemetry_the_mesh_config_traces_with_the_bootstraps_tracer() {
        let mut workload = workload();
        workload
            .labels
            .insert("service.istio.io/canonical-name".into(), "reviews".into());
        workload.mesh_id = "prod".into();
        let out = translate(workload.clone(), vec![reviews_service()]);
        for (tracing, request_id) in [inbound(&out), outbound(&out)] {
            let t = tracing.expect("istiod's default: enableTracing");
            assert!(t.provider.is_none(), "the bootstrap's tracer");
            assert_eq!(t.random_sampling.unwrap().value, 1.0);
            assert_eq!(t.client_sampling.unwrap().value, 100.0);
            assert_eq!(t.overall_sampling.unwrap().value, 100.0);
            assert_eq!(
                tags(&t),
                [
                    "istio.authorization.dry_run.allow_policy.name",
                    "istio.authorization.dry_run.allow_policy.result",
                    "istio.authorization.dry_run.deny_policy.name",
                    "istio.authorization.dry_run.deny_policy.result",
                    "istio.canonical_revision",
                    "istio.canonical_service",
                    "istio.cluster_id",
                    "istio.mesh_id",
                    "istio.namespace",
                ]
            );
            let literal = |name: &str| {
                t.custom_tags
                    .iter()
                    .find(|c| c.tag == name)
                    .and_then(|c| match &c.r#type {
                        Some(custom_tag::Type::Literal(l)) => Some(l.value.clone()),
                        _ => None,
                    })
            };
            assert_eq!(
                literal("istio.canonical_service").as_deref(),
                Some("reviews")
            );
            assert_eq!(
                literal("istio.canonical_revision").as_deref(),
                Some("latest")
            );
            assert_eq!(literal("istio.mesh_id").as_deref(), Some("prod"));
            assert_eq!(request_id, Some(true));
        }
        // The proxy's own settings: sampling, custom tags, no Istio tags.
        let out = translate(
            workload.clone(),
            vec![
                reviews_service(),
                mesh(json!({"defaultConfig": {"tracing": {
                    "sampling": 25.5, "enableIstioTags": false, "maxPathTagLength": 64,
                    "customTags": {"env": {"environment": {"name": "POD", "defaultValue": "x"}},
                                   "user": {"header": {"name": "x-user"}}}}}})),
            ],
        );
        let t = outbound(&out).0.unwrap();
        assert_eq!(t.random_sampling.unwrap().value, 25.5);
        assert_eq!(tags(&t), ["env", "user"]);
        assert_eq!(t.max_path_tag_length.unwrap().value, 64);
        // A proxy with settings of its own (`PROXY_CONFIG`) takes them, not the mesh's, as
        // istiod does for a node that has them.
        let mut own = workload.clone();
        own.proxy_config = Some(
            pasa_istio::proxy_config::MeshProxyConfig::parse(r#"{"tracing": {"sampling": 3}}"#)
                .unwrap(),
        );
        let out = translate(
            own,
            vec![
                reviews_service(),
                mesh(json!({"defaultConfig": {"tracing": {"sampling": 25.5}}})),
            ],
        );
        let t = outbound(&out).0.unwrap();
        assert_eq!(t.random_sampling.unwrap().value, 3.0);
        assert!(
            tags(&t).iter().any(|t| t == "istio.canonical_service"),
            "{:?}",
            tags(&t)
        );
        // Turned off: no tracing, the request ID extension still there.
        let out = translate(
            workload,
            vec![reviews_service(), mesh(json!({"enableTracing": false}))],
        );
        assert_eq!(outbound(&out), (None, Some(true)));
    }

    #[test]
    fn telemetry_tracing_picks_a_provider_per_side_and_overrides_in_order() {
        let mut resources = collectors();
        resources.extend([
            reviews_service(),
            providers(json!({})),
            telemetry(
                "istio-system",
                "mesh-default",
                json!({"tracing": [{"providers": [{"name": "zipkin"}],
                                    "randomSamplingPercentage": 10.0,
                                    "customTags": {"team": {"literal": {"value": "books"}}}}]}),
                5,
            ),
            telemetry(
                "default",
                "reviews",
                json!({"selector": {"matchLabels": {"app": "reviews"}},
                       "tracing": [{"match": {"mode": "SERVER"}, "disableSpanReporting": true},
                                   {"match": {"mode": "CLIENT"},
                                    "useRequestIdForTraceSampling": false,
                                    "enableIstioTags": false}]}),
                6,
            ),
        ]);
        let out = translate(workload(), resources.clone());
        let (server, request_id) = inbound(&out);
        assert_eq!((server, request_id), (None, Some(true)), "SERVER is off");
        let (client, request_id) = outbound(&out);
        let client = client.expect("CLIENT traces");
        assert_eq!(request_id, Some(false));
        assert_eq!(client.random_sampling.unwrap().value, 10.0);
        assert_eq!(tags(&client), ["team"], "Istio's tags turned off");
        assert_eq!(client.max_path_tag_length.unwrap().value, 99);
        assert!(client.spawn_upstream_span.is_none(), "a sidecar's own span");
        let zipkin: ZipkinConfig = provider(&client, "envoy.tracers.zipkin");
        assert_eq!(
            zipkin.collector_cluster,
            "outbound|9411||zipkin.istio-system.svc.cluster.local"
        );
        assert_eq!(zipkin.collector_endpoint, "/api/v2/spans");
        assert_eq!(
            zipkin.collector_hostname,
            "zipkin.istio-system.svc.cluster.local"
        );
        assert!(zipkin.trace_id_128bit);

        // A provider that does not trace, one whose service is unknown, one the mesh config
        // does not define: not traced.
        for name in ["logs", "nowhere", "undefined"] {
            let mut resources = resources.clone();
            resources.push(telemetry(
                "default",
                "reviews",
                json!({"selector": {"matchLabels": {"app": "reviews"}},
                       "tracing": [{"providers": [{"name": name}]}]}),
                7,
            ));
            let out = translate(workload(), resources);
            assert_eq!(outbound(&out), (None, Some(true)), "{name}");
        }
    }

    #[test]
    fn default_providers_opentelemetry_and_datadog_are_built_as_istiod_builds_them() {
        let mut resources = collectors();
        resources.extend([
            reviews_service(),
            providers(json!({"defaultProviders": {"tracing": ["otel"]}})),
        ]);
        let mut workload = workload();
        workload.service_cluster = "reviews.default".into();
        let out = translate(workload.clone(), resources.clone());
        let t = outbound(&out).0.expect("the default provider traces");
        assert_eq!(t.random_sampling.unwrap().value, 1.0);
        let otel: OpenTelemetryConfig = provider(&t, "envoy.tracers.opentelemetry");
        assert_eq!(otel.service_name, "reviews.default");
        let http = otel.http_service.expect("OTLP over HTTP");
        let uri = http.http_uri.unwrap();
        assert_eq!(uri.uri, "otel.observability.svc.cluster.local/v1/traces");
        assert_eq!(uri.timeout.unwrap().seconds, 3);
        assert_eq!(
            http.request_headers_to_add[0]
                .header
                .as_ref()
                .unwrap()
                .value,
            "t"
        );
        assert_eq!(otel.resource_detectors.len(), 1);

        resources.push(telemetry(
            "default",
            "ns-wide",
            json!({"tracing": [{"providers": [{"name": "DataDog"}]}]}),
            7,
        ));
        let out = translate(workload, resources);
        let t = outbound(&out).0.expect("Datadog, named ignoring case");
        let dd: DatadogConfig = provider(&t, "envoy.tracers.datadog");
        assert_eq!(dd.service_name, "reviews.default");
        assert_eq!(
            dd.collector_cluster,
            "outbound|4317||otel.observability.svc.cluster.local"
        );
    }

    #[test]
    fn a_collector_the_proxy_has_no_cluster_for_is_not_sent_to_envoy() {
        let mut resources = collectors();
        resources.extend([
            reviews_service(),
            providers(json!({"defaultProviders": {"tracing": ["zipkin"]}})),
            // The workload's Sidecar imports its own namespace only.
            resource(
                "Sidecar",
                "default",
                "default",
                json!({"egress": [{"hosts": ["./*"]}]}),
                8,
            ),
        ]);
        let out = translate(workload(), resources);
        assert_eq!(outbound(&out), (None, Some(true)));
    }

    #[test]
    fn a_routers_spans_are_parents_of_its_upstream_spans() {
        let mut resources = collectors();
        resources.extend([
            crate::translate::tests::http_gateway("istio-system", "gw", 8080),
            resource(
                "VirtualService",
                "istio-system",
                "zipkin",
                json!({"hosts": ["*"], "gateways": ["gw"],
                       "http": [{"route": [{"destination": {"host": "zipkin"}}]}]}),
                4,
            ),
            providers(json!({"defaultProviders": {"tracing": ["zipkin"]}})),
        ]);
        let out = translate(crate::testing::router("10.0.0.50"), resources);
        let l = out
            .listeners
            .values()
            .find(|l| l.name.ends_with("8080"))
            .expect("the gateway's listener");
        let t = traced(l, "").0.expect("the gateway traces");
        assert_eq!(t.spawn_upstream_span.map(|b| b.value), Some(true));
    }
}

#[test]
fn grpc_and_opentelemetry_log_services_are_built_with_their_collectors() {
    use envoy_types::pb::envoy::extensions::access_loggers::grpc::v3::{
        HttpGrpcAccessLogConfig, TcpGrpcAccessLogConfig,
    };
    use envoy_types::pb::envoy::extensions::access_loggers::open_telemetry::v3::OpenTelemetryAccessLogConfig;
    let collector = resource(
        "ServiceEndpoints",
        "observability",
        "als",
        json!({"addresses": ["10.96.0.92"], "ports": [{"name": "grpc", "port": 9000}],
               "endpoints": [{"address": "10.0.9.3"}]}),
        3,
    );
    let mesh = mesh(json!({
        "accessLogFile": "/dev/stdout",
        "extensionProviders": [
            {"name": "http-als", "envoyHttpAls": {"service": "als.observability.svc.cluster.local",
                                                  "port": 9000,
                                                  "additionalRequestHeadersToLog": ["x-user"]}},
            {"name": "tcp-als", "envoyTcpAls": {"service": "observability/als.observability.svc.cluster.local",
                                                "port": 9000, "logName": "tcp"}},
            {"name": "otel", "envoyOtelAls": {"service": "als.observability.svc.cluster.local",
                                              "port": 9000,
                                              "logFormat": {"text": "%REQ_WITHOUT_QUERY(:PATH)%",
                                                            "labels": {"b": "%RESPONSE_CODE%", "a": "x"}}}},
            {"name": "nowhere", "envoyHttpAls": {"service": "missing.example.com", "port": 9000}}]}));
    let all = telemetry(
        "istio-system",
        "mesh-default",
        json!({"accessLogging": [{"providers": [{"name": "http-als"}, {"name": "tcp-als"},
                                                {"name": "otel"}]}]}),
        5,
    );
    let out = translate(
        workload(),
        vec![reviews_service(), collector.clone(), mesh.clone(), all],
    );
    let logs = hcm_in(&out.listeners["virtualInbound"], "0.0.0.0_9080").access_log;
    let names: Vec<&str> = logs.iter().map(|l| l.name.as_str()).collect();
    // By provider name.
    assert_eq!(
        names,
        [
            "envoy.access_loggers.http_grpc",
            "envoy.access_loggers.open_telemetry",
            "envoy.tcp_grpc_access_log"
        ]
    );
    let typed = |i: usize| {
        let Some(access_log::ConfigType::TypedConfig(any)) = &logs[i].config_type else {
            panic!()
        };
        any.value.clone()
    };
    let http = HttpGrpcAccessLogConfig::decode(typed(0).as_slice()).unwrap();
    let common = http.common_config.unwrap();
    assert_eq!(common.log_name, "http_envoy_accesslog");
    assert_eq!(
        common.filter_state_objects_to_log,
        ["upstream_peer", "downstream_peer"]
    );
    assert_eq!(http.additional_request_headers_to_log, ["x-user"]);
    let Some(envoy_types::pb::envoy::config::core::v3::grpc_service::TargetSpecifier::EnvoyGrpc(g)) =
        common.grpc_service.unwrap().target_specifier
    else {
        panic!()
    };
    assert_eq!(
        g.cluster_name,
        "outbound|9000||als.observability.svc.cluster.local"
    );
    assert_eq!(g.authority, "als.observability.svc.cluster.local");
    #[allow(deprecated)]
    let otel = OpenTelemetryAccessLogConfig::decode(typed(1).as_slice()).unwrap();
    assert!(otel.disable_builtin_labels);
    let keys: Vec<String> = otel
        .attributes
        .unwrap()
        .values
        .into_iter()
        .map(|kv| kv.key)
        .collect();
    assert_eq!(keys, ["a", "b"]);
    assert_eq!(otel.formatters.len(), 1, "REQ_WITHOUT_QUERY's formatter");
    let tcp = TcpGrpcAccessLogConfig::decode(typed(2).as_slice()).unwrap();
    assert_eq!(tcp.common_config.unwrap().log_name, "tcp");

    // A collector the proxy does not know does not count: the mesh config's file applies.
    let nowhere = telemetry(
        "istio-system",
        "mesh-default",
        json!({"accessLogging": [{"providers": [{"name": "nowhere"}]}]}),
        5,
    );
    let out = translate(
        workload(),
        vec![reviews_service(), collector, mesh, nowhere],
    );
    let logs = hcm_logs(&out.listeners["virtualInbound"], "0.0.0.0_9080");
    assert_eq!(logs.len(), 1);
    assert_eq!(logs[0].0, "/dev/stdout");
}

/// The names of the network filters of `l`'s chain `chain`, and of its connection manager's
/// HTTP filters (empty without one).
fn chain_filters(l: &Listener, chain: &str) -> (Vec<String>, Vec<String>) {
    let c = l
        .filter_chains
        .iter()
        .chain(l.default_filter_chain.as_ref())
        .find(|c| c.name == chain)
        .unwrap_or_else(|| panic!("no chain {chain} in {}", l.name));
    let network = c.filters.iter().map(|f| f.name.clone()).collect();
    let http = if c
        .filters
        .iter()
        .any(|f| f.name.ends_with("http_connection_manager"))
    {
        hcm_in(l, chain)
            .http_filters
            .iter()
            .map(|f| f.name.clone())
            .collect()
    } else {
        Vec::new()
    };
    (network, http)
}

#[test]
fn istios_proxy_gets_istios_metrics_and_metadata_exchange_where_istiod_puts_them() {
    let db = resource(
        "ServiceEndpoints",
        "default",
        "db",
        json!({"addresses": ["10.96.0.30"], "ports": [{"name": "tcp", "port": 3306}],
               "endpoints": [{"address": "10.0.0.9", "labels": {"app": "db"}}]}),
        1,
    );
    let deny = resource(
        "AuthorizationPolicy",
        "default",
        "deny-admin",
        json!({"selector": {"matchLabels": {"app": "reviews"}}, "action": "DENY",
               "rules": [{"to": [{"operation": {"paths": ["/admin"]}}]}]}),
        2,
    );
    let resources = vec![
        reviews_service(),
        db,
        deny,
        mesh(json!({"defaultProviders": {"metrics": ["prometheus"]}})),
    ];
    let mut proxy = workload();
    proxy.build = crate::model::proxy::ProxyBuild::Istio;
    let out = translate(proxy, resources.clone());
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();

    // Inbound HTTP: the exchange first, on the connection and in it; the stats before the
    // router, after istiod's fixed filters.
    let inbound = &out.listeners["virtualInbound"];
    let (network, http) = chain_filters(inbound, "0.0.0.0_9080");
    assert_eq!(
        network,
        strings(&[
            "istio.metadata_exchange",
            "envoy.filters.network.http_connection_manager"
        ])
    );
    assert_eq!(
        http,
        strings(&[
            "istio.metadata_exchange",
            "envoy.filters.http.rbac",
            "envoy.filters.http.grpc_stats",
            "envoy.filters.http.fault",
            "envoy.filters.http.cors",
            "istio.stats",
            "envoy.filters.http.router"
        ])
    );
    // Every inbound chain starts with the exchange; those proxying TCP count it.
    for chain in inbound.filter_chains.iter() {
        assert_eq!(
            chain.filters[0].name, "istio.metadata_exchange",
            "{}",
            chain.name
        );
        let names: Vec<&str> = chain.filters.iter().map(|f| f.name.as_str()).collect();
        if names.last() == Some(&"envoy.filters.network.tcp_proxy") {
            assert_eq!(names[names.len() - 2], "istio.stats", "{}", chain.name);
        }
    }

    // Outbound HTTP: the exchange sends the proxy's metadata; ALPN tells the protocol.
    let (_, http) = chain_filters(&out.listeners["0.0.0.0_9080"], "");
    assert_eq!(
        http,
        strings(&[
            "istio.metadata_exchange",
            "envoy.filters.http.grpc_stats",
            "istio.alpn",
            "envoy.filters.http.fault",
            "envoy.filters.http.cors",
            "istio.stats",
            "envoy.filters.http.router"
        ])
    );
    // Outbound TCP and the passthrough: stats before the proxy, no exchange on the listener.
    let (network, _) = chain_filters(&out.listeners["10.96.0.30_3306"], "");
    assert_eq!(
        network,
        strings(&["istio.stats", "envoy.filters.network.tcp_proxy"])
    );
    for chain in ["virtualOutbound-catchall-tcp", "virtualOutbound-blackhole"] {
        let (network, _) = chain_filters(&out.listeners["virtualOutbound"], chain);
        assert_eq!(
            network,
            strings(&["istio.stats", "envoy.filters.network.tcp_proxy"]),
            "{chain}"
        );
    }

    // Upstream, the exchange ends the outbound clusters and the passthrough.
    let last_filter = |name: &str| out.clusters[name].filters.last().map(|f| f.name.clone());
    for name in [
        "outbound|9080||reviews.default.svc.cluster.local",
        "outbound|3306||db.default.svc.cluster.local",
        "PassthroughCluster",
    ] {
        assert_eq!(
            last_filter(name).as_deref(),
            Some("istio.metadata_exchange"),
            "{name}"
        );
    }
    for name in [
        "inbound|9080||",
        "BlackHoleCluster",
        "InboundPassthroughCluster",
    ] {
        assert_eq!(last_filter(name), None, "{name}");
    }

    // The services clusters are for, which Istio's stats label requests with.
    let services = |name: &str| -> Vec<(String, String, String)> {
        let istio = &out.clusters[name]
            .metadata
            .as_ref()
            .expect("metadata")
            .filter_metadata["istio"];
        use envoy_types::pb::google::protobuf::value::Kind;
        let Some(Kind::ListValue(list)) = &istio.fields["services"].kind else {
            panic!("a list")
        };
        list.values
            .iter()
            .map(|v| {
                let Some(Kind::StructValue(s)) = &v.kind else {
                    panic!("a struct")
                };
                let field = |f: &str| match &s.fields[f].kind {
                    Some(Kind::StringValue(v)) => v.clone(),
                    other => panic!("{other:?}"),
                };
                (field("host"), field("name"), field("namespace"))
            })
            .collect()
    };
    let reviews = vec![(
        "reviews.default.svc.cluster.local".to_string(),
        "reviews".to_string(),
        "default".to_string(),
    )];
    assert_eq!(
        services("outbound|9080||reviews.default.svc.cluster.local"),
        reviews
    );
    assert_eq!(services("inbound|9080||"), reviews);
    // Encoded alike each time (a resource's version is a digest of its encoding).
    let mut again = workload();
    again.build = crate::model::proxy::ProxyBuild::Istio;
    let twice = |p: crate::model::proxy::Proxy| {
        crate::translate::Translator::new(p).generate(
            &crate::translate::tests::cache(resources.clone()),
            crate::model::proxy::Generator::Envoy,
        )
    };
    let (a, b) = (twice(again.clone()), twice(again));
    for name in [
        "outbound|9080||reviews.default.svc.cluster.local",
        "inbound|9080||",
    ] {
        assert_eq!(a.clusters[name].version, b.clusters[name].version, "{name}");
    }

    // Istio's proxy offers the in-band exchange's ALPN, paired with its filter.
    assert_eq!(
        mutual_alpn(&out.clusters["outbound|3306||db.default.svc.cluster.local"]),
        ["istio-peer-exchange", "istio"]
    );

    // Upstream Envoy gets gRPC statistics and none of Istio's filters; it neither offers the
    // exchange's ALPN nor accepts it (a peer negotiating it would write its metadata in band).
    let out = translate(workload(), resources);
    assert_eq!(
        mutual_alpn(&out.clusters["outbound|3306||db.default.svc.cluster.local"]),
        ["istio"]
    );
    let mut mutual = 0;
    for chain in &out.listeners["virtualInbound"].filter_chains {
        if let Some(socket) = &chain.transport_socket {
            mutual += 1;
            use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType;
            use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext;
            let Some(ConfigType::TypedConfig(any)) = &socket.config_type else {
                panic!("typed")
            };
            let tls = DownstreamTlsContext::decode(any.value.as_slice()).unwrap();
            let alpn = tls.common_tls_context.unwrap().alpn_protocols;
            assert!(
                !alpn.contains(&"istio-peer-exchange".to_string()),
                "{}: {alpn:?}",
                chain.name
            );
        }
    }
    assert!(mutual > 0, "permissive inbound has mutual TLS chains");
    let (_, http) = chain_filters(&out.listeners["0.0.0.0_9080"], "");
    assert_eq!(
        http,
        strings(&[
            "envoy.filters.http.grpc_stats",
            "envoy.filters.http.fault",
            "envoy.filters.http.cors",
            "envoy.filters.http.router"
        ])
    );
    let dump = format!("{:?}", (&out.listeners, &out.clusters));
    assert!(!dump.contains("istio.stats") && !dump.contains("istio.metadata_exchange"));
}

/// The ALPN an ISTIO_MUTUAL cluster offers (its `tlsMode-istio` transport socket's).
fn mutual_alpn(c: &envoy_types::pb::envoy::config::cluster::v3::Cluster) -> Vec<String> {
    use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType;
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;
    let socket = c
        .transport_socket_matches
        .iter()
        .find(|m| m.name == "tlsMode-istio")
        .and_then(|m| m.transport_socket.as_ref())
        .expect("an Istio mutual TLS socket");
    let Some(ConfigType::TypedConfig(any)) = &socket.config_type else {
        panic!("typed")
    };
    UpstreamTlsContext::decode(any.value.as_slice())
        .unwrap()
        .common_tls_context
        .unwrap()
        .alpn_protocols
}

#[test]
fn a_routers_istio_mutual_tcp_server_exchanges_metadata_on_istios_proxy_only() {
    let gateway = resource(
        "Gateway",
        "istio-system",
        "gw",
        json!({"selector": {"istio": "ingressgateway"}, "servers": [
            {"port": {"number": 8443, "name": "tls", "protocol": "TLS"}, "hosts": ["*"],
             "tls": {"mode": "ISTIO_MUTUAL"}}]}),
        1,
    );
    let route = resource(
        "VirtualService",
        "istio-system",
        "db",
        json!({"hosts": ["*"], "gateways": ["gw"],
               "tcp": [{"route": [{"destination": {"host": "reviews.default.svc.cluster.local",
                                                   "port": {"number": 9080}}}]}]}),
        2,
    );
    let resources = vec![
        reviews_service(),
        gateway,
        route,
        mesh(json!({"defaultProviders": {"metrics": ["prometheus"]}})),
    ];
    // As istiod: the exchange first and the stats before the proxy; ALPN offers the exchange
    // before HTTP's.
    let chain = |build| {
        let mut router = crate::testing::router("10.0.0.50");
        router.build = build;
        let out = translate(router, resources.clone());
        let l = &out.listeners["0.0.0.0_8443"];
        let c = &l.filter_chains[0];
        let names: Vec<String> = c.filters.iter().map(|f| f.name.clone()).collect();
        use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType;
        use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext;
        let Some(ConfigType::TypedConfig(any)) =
            &c.transport_socket.as_ref().expect("TLS").config_type
        else {
            panic!("typed")
        };
        let alpn = DownstreamTlsContext::decode(any.value.as_slice())
            .unwrap()
            .common_tls_context
            .unwrap()
            .alpn_protocols;
        (names, alpn)
    };
    let (names, alpn) = chain(crate::model::proxy::ProxyBuild::Istio);
    assert_eq!(
        names,
        [
            "istio.metadata_exchange",
            "istio.stats",
            "envoy.filters.network.tcp_proxy"
        ]
    );
    assert_eq!(alpn, ["istio-peer-exchange", "h2", "http/1.1"]);
    let (names, alpn) = chain(crate::model::proxy::ProxyBuild::Envoy);
    assert_eq!(names, ["envoy.filters.network.tcp_proxy"]);
    assert_eq!(alpn, ["h2", "http/1.1"]);
}

#[test]
fn a_sidecar_ingress_clusters_service_labels_are_of_the_service_its_port_serves() {
    let sidecar = resource(
        "Sidecar",
        "default",
        "reviews",
        json!({"workloadSelector": {"labels": {"app": "reviews"}}, "ingress": [
            {"port": {"number": 9080, "protocol": "HTTP", "name": "http"},
             "defaultEndpoint": "127.0.0.1:8080"},
            {"port": {"number": 7070, "protocol": "TCP", "name": "tcp"},
             "defaultEndpoint": "127.0.0.1:7070"}]}),
        2,
    );
    let mut proxy = workload();
    proxy.build = crate::model::proxy::ProxyBuild::Istio;
    let out = translate(proxy, vec![reviews_service(), sidecar]);
    let services = |name: &str| {
        out.clusters[name]
            .metadata
            .as_ref()
            .and_then(|m| m.filter_metadata.get("istio"))
            .map(|s| format!("{:?}", s.fields.get("services")))
    };
    // 9080 is reviews's port; nothing serves 7070 (istiod's stand-in service is labelled
    // nowhere).
    assert!(
        services("inbound|9080||").is_some_and(|s| s.contains("reviews.default.svc.cluster.local")),
        "{:?}",
        services("inbound|9080||")
    );
    assert_eq!(services("inbound|7070||"), None);
}
