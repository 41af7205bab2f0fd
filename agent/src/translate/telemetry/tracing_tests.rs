//! Tracing from the Telemetry API and the mesh config's providers, through the translator.

use envoy_types::pb::envoy::config::listener::v3::Listener;
use pasa_proto::store::v1::Resource as StoreResource;
use prost::Message;
use serde_json::{Value, json};
use envoy_types::pb::envoy::config::trace::v3::{
    DatadogConfig, OpenTelemetryConfig, ZipkinConfig,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::Tracing;
use envoy_types::pb::envoy::extensions::request_id::uuid::v3::UuidRequestIdConfig;
use envoy_types::pb::envoy::r#type::tracing::v3::custom_tag;

use crate::testing::resource;
use crate::translate::tests::{
    hcm_in, reviews_service, reviews_workload as workload, translate_for as translate,
};

use super::tests::{mesh, telemetry};

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
    let Some(envoy_types::pb::envoy::config::trace::v3::tracing::http::ConfigType::TypedConfig(
        any,
    )) = &p.config_type
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
