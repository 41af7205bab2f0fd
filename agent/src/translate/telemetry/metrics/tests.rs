//! The filters are compared with istiod's, byte for byte: the expected encodings below are what
//! istiod's own builders (`pilot/pkg/model/telemetry.go`, `pilot/pkg/xds/filters`, Istio 1.28)
//! produce for the same mesh config and Telemetries, recorded as base64 of the `Any` each
//! filter's typed config is (istiod encodes deterministically: map keys in order).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use pasa_istio::mesh_config::MeshConfig;
use pasa_istio::telemetry::Telemetry;

use super::*;

fn b64(any: &Any) -> String {
    STANDARD.encode(any.encode_to_vec())
}

/// A mesh config (JSON `null`: none), the specs of the Telemetries that apply (in istiod's
/// order), and istiod's `istio.stats` configurations for sidecar inbound, sidecar outbound and
/// gateway listeners.
struct Case {
    name: &'static str,
    mesh: &'static str,
    telemetries: &'static str,
    want: [&'static [&'static str]; 3],
}

const CASES: [Case; 8] = [
    Case {
        name: "default",
        mesh: r#"{"defaultProviders": {"metrics": ["prometheus"]}}"#,
        telemetries: r#"[]"#,
        want: [
            &["CiZ0eXBlLmdvb2dsZWFwaXMuY29tL3N0YXRzLlBsdWdpbkNvbmZpZxICMAE="],
            &["CiZ0eXBlLmdvb2dsZWFwaXMuY29tL3N0YXRzLlBsdWdpbkNvbmZpZw=="],
            &["CiZ0eXBlLmdvb2dsZWFwaXMuY29tL3N0YXRzLlBsdWdpbkNvbmZpZxICMAE="],
        ],
    },
    Case {
        name: "none",
        mesh: r#"null"#,
        telemetries: r#"[]"#,
        want: [&[], &[], &[]],
    },
    Case {
        name: "overrides",
        mesh: r#"null"#,
        telemetries: r#"[{"metrics": [{"providers": [{"name": "prometheus"}], "reportingInterval": "15s", "overrides": [{"match": {"metric": "REQUEST_COUNT", "mode": "CLIENT"}, "disabled": true}, {"match": {"metric": "REQUEST_COUNT"}, "tagOverrides": {"add": {"value": "bar"}, "remove": {"operation": "REMOVE"}}}, {"match": {"customMetric": "my_metric"}, "tagOverrides": {"x": {"value": "y"}}}]}]}]"#,
        want: [
            &[
                "CiZ0eXBlLmdvb2dsZWFwaXMuY29tL3N0YXRzLlBsdWdpbkNvbmZpZxJBMAE6AggPQiQKCgoDYWRkEgNiYXISDnJlcXVlc3RzX3RvdGFsGgZyZW1vdmVCEwoGCgF4EgF5EglteV9tZXRyaWM=",
            ],
            &[
                "CiZ0eXBlLmdvb2dsZWFwaXMuY29tL3N0YXRzLlBsdWdpbkNvbmZpZxJBOgIID0ImCgoKA2FkZBIDYmFyEg5yZXF1ZXN0c190b3RhbBoGcmVtb3ZlKAFCEwoGCgF4EgF5EglteV9tZXRyaWM=",
            ],
            &[
                "CiZ0eXBlLmdvb2dsZWFwaXMuY29tL3N0YXRzLlBsdWdpbkNvbmZpZxJDMAE6AggPQiYKCgoDYWRkEgNiYXISDnJlcXVlc3RzX3RvdGFsGgZyZW1vdmUoAUITCgYKAXgSAXkSCW15X21ldHJpYw==",
            ],
        ],
    },
    Case {
        name: "disable all",
        mesh: r#"{"defaultProviders": {"metrics": ["prometheus"]}}"#,
        telemetries: r#"[{"metrics": [{"overrides": [{"disabled": true}]}]}, {"selector": {"matchLabels": {"app": "test"}}, "metrics": [{"overrides": [{"match": {"mode": "SERVER", "metric": "ALL_METRICS"}, "tagOverrides": {"a": {"value": "b"}}}]}]}]"#,
        want: [
            &[
                "CiZ0eXBlLmdvb2dsZWFwaXMuY29tL3N0YXRzLlBsdWdpbkNvbmZpZxLRAjABQiAKBgoBYRIBYhIWcmVxdWVzdF9tZXNzYWdlc190b3RhbEIhCgYKAWESAWISF3Jlc3BvbnNlX21lc3NhZ2VzX3RvdGFsQhgKBgoBYRIBYhIOcmVxdWVzdHNfdG90YWxCJwoGCgFhEgFiEh1yZXF1ZXN0X2R1cmF0aW9uX21pbGxpc2Vjb25kc0IXCgYKAWESAWISDXJlcXVlc3RfYnl0ZXNCGAoGCgFhEgFiEg5yZXNwb25zZV9ieXRlc0ImCgYKAWESAWISHHRjcF9jb25uZWN0aW9uc19jbG9zZWRfdG90YWxCJgoGCgFhEgFiEhx0Y3BfY29ubmVjdGlvbnNfb3BlbmVkX3RvdGFsQiIKBgoBYRIBYhIYdGNwX3JlY2VpdmVkX2J5dGVzX3RvdGFsQh4KBgoBYRIBYhIUdGNwX3NlbnRfYnl0ZXNfdG90YWw=",
            ],
            &[],
            &[],
        ],
    },
    Case {
        name: "providers",
        mesh: r#"{"defaultProviders": {"metrics": ["prometheus"]}, "extensionProviders": [{"name": "custom-prom", "prometheus": {}}, {"name": "sd", "stackdriver": {}}]}"#,
        telemetries: r#"[{"metrics": [{"providers": [{"name": "custom-prom"}, {"name": "sd"}, {"name": "prometheus"}], "overrides": [{"match": {"metric": "REQUEST_SIZE"}, "disabled": true}]}]}, {"metrics": [{"providers": [{"name": "custom-prom"}]}, {"overrides": [{"match": {"metric": "RESPONSE_SIZE", "mode": "SERVER"}, "disabled": false, "tagOverrides": {"t": {"operation": "UPSERT", "value": "v"}}}]}]}]"#,
        want: [
            &[
                "CiZ0eXBlLmdvb2dsZWFwaXMuY29tL3N0YXRzLlBsdWdpbkNvbmZpZxIvMAFCERINcmVxdWVzdF9ieXRlcygBQhgKBgoBdBIBdhIOcmVzcG9uc2VfYnl0ZXM=",
            ],
            &[
                "CiZ0eXBlLmdvb2dsZWFwaXMuY29tL3N0YXRzLlBsdWdpbkNvbmZpZxITQhESDXJlcXVlc3RfYnl0ZXMoAQ==",
            ],
            &[
                "CiZ0eXBlLmdvb2dsZWFwaXMuY29tL3N0YXRzLlBsdWdpbkNvbmZpZxIVMAFCERINcmVxdWVzdF9ieXRlcygB",
            ],
        ],
    },
    Case {
        name: "interval client off",
        mesh: r#"null"#,
        telemetries: r#"[{"metrics": [{"providers": [{"name": "prometheus"}], "reportingInterval": "10s", "overrides": [{"match": {"mode": "CLIENT"}, "disabled": true}]}]}]"#,
        want: [
            &["CiZ0eXBlLmdvb2dsZWFwaXMuY29tL3N0YXRzLlBsdWdpbkNvbmZpZxIGMAE6AggK"],
            &[],
            &[],
        ],
    },
    Case {
        name: "renamed",
        mesh: r#"{"defaultProviders": {"metrics": ["prometheus"]}, "extensionProviders": [{"name": "prometheus", "stackdriver": {}}]}"#,
        telemetries: r#"[]"#,
        want: [&[], &[], &[]],
    },
    Case {
        name: "case",
        mesh: r#"null"#,
        telemetries: r#"[{"metrics": [{"providers": [{"name": "Prometheus"}], "overrides": [{"match": {"metric": "GRPC_REQUEST_MESSAGES", "mode": "SERVER"}, "tagOverrides": {"request_protocol": {"operation": "REMOVE"}, "destination_port": {"value": "string(destination.port)"}}}]}]}]"#,
        want: [
            &[
                "CiZ0eXBlLmdvb2dsZWFwaXMuY29tL3N0YXRzLlBsdWdpbkNvbmZpZxJcMAFCWAosChBkZXN0aW5hdGlvbl9wb3J0EhhzdHJpbmcoZGVzdGluYXRpb24ucG9ydCkSFnJlcXVlc3RfbWVzc2FnZXNfdG90YWwaEHJlcXVlc3RfcHJvdG9jb2w=",
            ],
            &["CiZ0eXBlLmdvb2dsZWFwaXMuY29tL3N0YXRzLlBsdWdpbkNvbmZpZw=="],
            &["CiZ0eXBlLmdvb2dsZWFwaXMuY29tL3N0YXRzLlBsdWdpbkNvbmZpZxICMAE="],
        ],
    },
];

fn filters(mesh: &str, telemetries: &str) -> IstioFilters {
    let mesh: Option<MeshConfig> = serde_json::from_str(mesh).unwrap();
    let telemetries: Vec<Telemetry> = serde_json::from_str(telemetries).unwrap();
    let entries: Vec<&Metrics> = telemetries
        .iter()
        .flat_map(|t| t.metrics.iter().flatten())
        .collect();
    let settings = mesh
        .as_ref()
        .map_or_else(MeshProxyConfig::defaults, MeshConfig::default_config);
    IstioFilters::new(ProxyBuild::Istio, &settings, mesh.as_ref(), &entries).unwrap()
}

#[test]
fn stats_configurations_are_istiods() {
    for case in &CASES {
        let filters = filters(case.mesh, case.telemetries);
        for (class, want) in [
            Class::SidecarInbound,
            Class::SidecarOutbound,
            Class::Gateway,
        ]
        .into_iter()
        .zip(case.want)
        {
            let got: Vec<String> = filters.stats(class).iter().map(b64).collect();
            assert_eq!(got, want, "{}: {class:?}", case.name);
        }
    }
    println!("istio.stats: {} cases as istiod", CASES.len());
}

#[test]
fn merged_overrides_read_as_istio_stats_takes_them() {
    // The overrides case, decoded: CLIENT's request count dropped (with the tags both modes
    // got), a custom metric tagged, and the reporting interval.
    let filters = filters(CASES[2].mesh, CASES[2].telemetries);
    let outbound =
        PluginConfig::decode(filters.stats(Class::SidecarOutbound)[0].value.as_slice()).unwrap();
    assert!(!outbound.disable_host_header_fallback);
    assert_eq!(outbound.tcp_reporting_duration.map(|d| d.seconds), Some(15));
    let requests = &outbound.metrics[0];
    assert_eq!(requests.name, "requests_total");
    assert!(requests.drop);
    assert_eq!(
        requests.dimensions.get("add").map(String::as_str),
        Some("bar")
    );
    assert_eq!(requests.tags_to_remove, ["remove"]);
    assert_eq!(outbound.metrics[1].name, "my_metric");
    let inbound =
        PluginConfig::decode(filters.stats(Class::SidecarInbound)[0].value.as_slice()).unwrap();
    assert!(inbound.disable_host_header_fallback);
    assert!(!inbound.metrics[0].drop);
}

#[test]
fn metadata_exchange_alpn_and_grpc_stats_are_istiods() {
    let typed = |f: HttpFilter| match f.config_type {
        Some(http_filter::ConfigType::TypedConfig(any)) => b64(&any),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        typed(peer_metadata(Class::SidecarInbound, false)),
        "Cix0eXBlLmdvb2dsZWFwaXMuY29tL3VkcGEudHlwZS52MS5UeXBlZFN0cnVjdBLFAQo2dHlwZS5nb29nbGVhcGlzLmNvbS9pby5pc3Rpby5odHRwLnBlZXJfbWV0YWRhdGEuQ29uZmlnEooBClEKFGRvd25zdHJlYW1fZGlzY292ZXJ5EjkyNwoXKhUKEwoNaXN0aW9faGVhZGVycxICKgAKHCoaChgKEndvcmtsb2FkX2Rpc2NvdmVyeRICKgAKNQoWZG93bnN0cmVhbV9wcm9wYWdhdGlvbhIbMhkKFyoVChMKDWlzdGlvX2hlYWRlcnMSAioA"
    );
    let outbound = "Cix0eXBlLmdvb2dsZWFwaXMuY29tL3VkcGEudHlwZS52MS5UeXBlZFN0cnVjdBLBAQo2dHlwZS5nb29nbGVhcGlzLmNvbS9pby5pc3Rpby5odHRwLnBlZXJfbWV0YWRhdGEuQ29uZmlnEoYBCk8KEnVwc3RyZWFtX2Rpc2NvdmVyeRI5MjcKFyoVChMKDWlzdGlvX2hlYWRlcnMSAioAChwqGgoYChJ3b3JrbG9hZF9kaXNjb3ZlcnkSAioACjMKFHVwc3RyZWFtX3Byb3BhZ2F0aW9uEhsyGQoXKhUKEwoNaXN0aW9faGVhZGVycxICKgA=";
    assert_eq!(
        typed(peer_metadata(Class::SidecarOutbound, false)),
        outbound
    );
    assert_eq!(typed(peer_metadata(Class::Gateway, false)), outbound);
    assert_eq!(
        typed(peer_metadata(Class::SidecarOutbound, true)),
        "Cix0eXBlLmdvb2dsZWFwaXMuY29tL3VkcGEudHlwZS52MS5UeXBlZFN0cnVjdBLfAQo2dHlwZS5nb29nbGVhcGlzLmNvbS9pby5pc3Rpby5odHRwLnBlZXJfbWV0YWRhdGEuQ29uZmlnEqQBCk8KEnVwc3RyZWFtX2Rpc2NvdmVyeRI5MjcKFyoVChMKDWlzdGlvX2hlYWRlcnMSAioAChwqGgoYChJ3b3JrbG9hZF9kaXNjb3ZlcnkSAioAClEKFHVwc3RyZWFtX3Byb3BhZ2F0aW9uEjkyNwo1KjMKMQoNaXN0aW9faGVhZGVycxIgKh4KHAoWc2tpcF9leHRlcm5hbF9jbHVzdGVycxICIAE="
    );
    let tcp = "Cix0eXBlLmdvb2dsZWFwaXMuY29tL3VkcGEudHlwZS52MS5UeXBlZFN0cnVjdBKFAQpGdHlwZS5nb29nbGVhcGlzLmNvbS9lbnZveS50Y3AubWV0YWRhdGFleGNoYW5nZS5jb25maWcuTWV0YWRhdGFFeGNoYW5nZRI7ChYKEGVuYWJsZV9kaXNjb3ZlcnkSAiABCiEKCHByb3RvY29sEhUaE2lzdGlvLXBlZXItZXhjaGFuZ2U=";
    assert_eq!(b64(&filters::tcp_metadata_exchange()), tcp);
    assert_eq!(
        typed(alpn()),
        "Ck10eXBlLmdvb2dsZWFwaXMuY29tL2lzdGlvLmVudm95LmNvbmZpZy5maWx0ZXIuaHR0cC5hbHBuLnYyYWxwaGExLkZpbHRlckNvbmZpZxJhCiESDmlzdGlvLWh0dHAvMS4wEgVpc3RpbxIIaHR0cC8xLjAKIwgBEg5pc3Rpby1odHRwLzEuMRIFaXN0aW8SCGh0dHAvMS4xChcIAhIIaXN0aW8taDISBWlzdGlvEgJoMg=="
    );
    assert_eq!(
        typed(grpc_stats()),
        "Ckx0eXBlLmdvb2dsZWFwaXMuY29tL2Vudm95LmV4dGVuc2lvbnMuZmlsdGVycy5odHRwLmdycGNfc3RhdHMudjMuRmlsdGVyQ29uZmlnEgQIARoA"
    );
    // The upstream side, after the filters the cluster has.
    let mut encoded = Cluster {
        name: "PassthroughCluster".into(),
        filters: vec![ClusterFilter {
            name: "first".into(),
            ..Default::default()
        }],
        ..Default::default()
    }
    .encode_to_vec();
    assert!(exchange_upstream(
        ProxyBuild::Istio,
        "PassthroughCluster",
        &mut encoded
    ));
    let cluster = Cluster::decode(encoded.as_slice()).unwrap();
    assert_eq!(cluster.name, "PassthroughCluster");
    assert_eq!(cluster.filters[0].name, "first");
    assert_eq!(cluster.filters[1].name, MX_FILTER);
    assert_eq!(b64(cluster.filters[1].typed_config.as_ref().unwrap()), tcp);
}

#[test]
fn only_outbound_clusters_exchange_upstream() {
    let adds = |build, name: &str| exchange_upstream(build, name, &mut Vec::new());
    for name in [
        "outbound|9080||reviews.default.svc.cluster.local",
        "outbound|9080|v1|reviews.default.svc.cluster.local",
        "outbound_.9080_.v1_.reviews.default.svc.cluster.local",
        "PassthroughCluster",
        "AllowAnyDynamicDNSCluster",
    ] {
        assert!(adds(ProxyBuild::Istio, name), "{name}");
        assert!(!adds(ProxyBuild::Envoy, name), "{name}");
    }
    for name in [
        "inbound|9080||",
        "InboundPassthroughCluster",
        "BlackHoleCluster",
        "prometheus_stats",
    ] {
        assert!(!adds(ProxyBuild::Istio, name), "{name}");
    }
}

#[test]
fn upstream_envoy_gets_none_of_istios_filters() {
    let mesh: MeshConfig =
        serde_json::from_str(r#"{"defaultProviders": {"metrics": ["prometheus"]}}"#).unwrap();
    assert!(
        IstioFilters::new(ProxyBuild::Envoy, &mesh.default_config(), Some(&mesh), &[]).is_none()
    );
}

#[test]
fn istios_filters_print_as_protobuf_json() {
    // What `pasactl proxy-config -o json` shows of them: the descriptors know Istio's types.
    let filters = filters(CASES[2].mesh, CASES[2].telemetries);
    let stats =
        pasa_envoy_json::to_json("istio.stats", &filters.stats(Class::SidecarInbound)[0]).unwrap();
    assert_eq!(
        stats,
        serde_json::json!({
            "disableHostHeaderFallback": true,
            "tcpReportingDuration": "15s",
            "metrics": [
                {"dimensions": {"add": "bar"}, "name": "requests_total", "tagsToRemove": ["remove"]},
                {"dimensions": {"x": "y"}, "name": "my_metric"}
            ]
        })
    );
    let Some(http_filter::ConfigType::TypedConfig(any)) = alpn().config_type else {
        panic!("typed")
    };
    let alpn = pasa_envoy_json::to_json("istio.alpn", &any).unwrap();
    assert_eq!(
        alpn["alpnOverride"][2],
        serde_json::json!({"upstreamProtocol": "HTTP2", "alpnOverride": ["istio-h2", "istio", "h2"]})
    );
    let mx = pasa_envoy_json::to_json("istio.metadata_exchange", &filters::tcp_metadata_exchange())
        .unwrap();
    assert_eq!(
        mx["value"],
        serde_json::json!({"protocol": "istio-peer-exchange", "enable_discovery": true})
    );
}
