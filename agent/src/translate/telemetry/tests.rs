//! Access logs from the Telemetry API and the mesh config, through the translator (tracing is
//! tested in `tracing_tests`, Istio's metrics in `metrics_tests`).

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

pub(super) fn telemetry(ns: &str, name: &str, spec: Value, revision: u64) -> StoreResource {
    resource("Telemetry", ns, name, spec, revision)
}

pub(super) fn mesh(spec: Value) -> StoreResource {
    resource("MeshConfig", "istio-system", "mesh", spec, 1)
}

/// The access logs of the first connection manager of `l`'s chain `chain` (any chain when
/// empty), as (path, format text or JSON keys).
pub(super) fn hcm_logs(l: &Listener, chain: &str) -> Vec<(String, String)> {
    described(&hcm_in(l, chain).access_log)
}

pub(super) fn described(logs: &[AccessLog]) -> Vec<(String, String)> {
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
