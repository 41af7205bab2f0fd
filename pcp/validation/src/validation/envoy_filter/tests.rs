//! Rules of istiod's EnvoyFilter validation (and of its CRD) that Istio's table does not cover.

use pasa_proto::Object;
use serde_json::{Value, json};

use crate::validation::{Report, validate};

fn check(spec: Value) -> Report {
    let obj = Object::from_json(
        &json!({
            "apiVersion": "networking.istio.io/v1alpha3", "kind": "EnvoyFilter",
            "metadata": {"name": "f", "namespace": "bar"}, "spec": spec}),
        "default",
        pasa_istio::generated::is_generated_object,
    )
    .expect("a sound object");
    validate(&obj)
}

fn errors(report: &Report) -> Vec<String> {
    report.errors.iter().map(ToString::to_string).collect()
}

fn warnings(report: &Report) -> Vec<String> {
    report.warnings.iter().map(ToString::to_string).collect()
}

fn has(list: &[String], needle: &str) -> bool {
    list.iter().any(|p| p.contains(needle))
}

/// One patch of `apply_to` adding `value`.
fn adding(apply_to: &str, value: Value) -> Value {
    json!({"configPatches": [{"applyTo": apply_to, "patch": {"operation": "ADD", "value": value}}]})
}

#[test]
fn every_envoy_filter_gets_the_generic_warning() {
    let r = check(json!({}));
    assert!(r.is_valid());
    assert!(has(
        &warnings(&r),
        "EnvoyFilter exposes internal implementation details"
    ));
}

#[test]
fn a_null_patch_is_refused() {
    let r = check(json!({"configPatches": [null]}));
    assert_eq!(
        errors(&r),
        ["spec.configPatches[0]: Envoy filter: null config patch"]
    );
}

#[test]
fn a_selector_istiod_refuses_ends_the_check() {
    let r = check(json!({
        "workloadSelector": {"labels": {"app": "*"}},
        "configPatches": [{"applyTo": "INVALID"}]
    }));
    assert!(has(&errors(&r), "wildcard is not supported in selector"));
    assert!(!has(&errors(&r), "missing applyTo"));
    assert!(r.warnings.is_empty());
}

#[test]
fn waypoint_patches_are_left_to_the_crd() {
    let r = check(json!({"configPatches": [{
        "applyTo": "INVALID",
        "match": {"context": "WAYPOINT", "waypoint": {"portNumber": 8080}}
    }]}));
    assert!(r.is_valid(), "{:?}", r.errors);

    let r = check(json!({"configPatches": [{
        "applyTo": "HTTP_FILTER",
        "match": {"context": "WAYPOINT"},
        "patch": {"operation": "REMOVE"}
    }]}));
    assert!(has(
        &errors(&r),
        "only support waypointMatch when context is WAYPOINT"
    ));

    let r = check(json!({"configPatches": [{
        "applyTo": "HTTP_FILTER",
        "match": {"context": "WAYPOINT", "waypoint": {"portNumber": 0}},
        "patch": {"operation": "REMOVE"}
    }]}));
    assert!(has(
        &errors(&r),
        "waypoint.portNumber: port must be between 1-65535"
    ));
}

#[test]
fn the_crd_rules_on_attachment_and_enums() {
    let r = check(json!({
        "workloadSelector": {"labels": {"app": "a"}},
        "targetRefs": [{"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": "gw",
                        "namespace": "other"}, {"kind": "", "name": ""}]
    }));
    let e = errors(&r);
    assert!(has(
        &e,
        "spec: only one of targetRefs or workloadSelector can be set"
    ));
    assert!(has(
        &e,
        "spec.targetRefs[0].namespace: cross namespace referencing"
    ));
    assert!(has(&e, "spec.targetRefs[1].kind: kind is required"));
    assert!(has(&e, "spec.targetRefs[1].name: name is required"));

    let r = check(json!({"configPatches": [{"applyTo": 42, "patch": {"operation": "REMOVE"}}]}));
    assert!(has(
        &errors(&r),
        "spec.configPatches[0].applyTo: unknown applyTo 42"
    ));
}

#[test]
fn filter_matches_on_listeners_and_chains_have_no_effect() {
    let r = check(json!({"configPatches": [{
        "applyTo": "FILTER_CHAIN",
        "match": {"listener": {"filterChain": {"filter": {"name": "envoy.filters.network.tcp_proxy"}}}},
        "patch": {"operation": "REMOVE"}
    }]}));
    assert!(r.is_valid());
    assert!(has(
        &warnings(&r),
        "filter match has no effect when used with FILTER_CHAIN"
    ));
}

#[test]
fn deprecated_names_are_read_by_their_place() {
    let r = check(json!({"configPatches": [{
        "applyTo": "HTTP_FILTER",
        "match": {"listener": {"filterChain": {"filter": {
            "name": "envoy.http_connection_manager",
            "subFilter": {"name": "envoy.ext_authz"}}}}},
        "patch": {"operation": "REMOVE"}
    }]}));
    let w = warnings(&r);
    assert!(has(
        &w,
        "using deprecated filter name \"envoy.http_connection_manager\"; use \
         \"envoy.filters.network.http_connection_manager\" instead"
    ));
    assert!(has(
        &w,
        "subFilter.name: using deprecated filter name \"envoy.ext_authz\"; use \
         \"envoy.filters.http.ext_authz\" instead"
    ));
}

#[test]
fn value_type_errors_name_the_field() {
    let r = check(adding(
        "CLUSTER",
        json!({"connect_timeout": 5, "lbPolicy": "FASTEST"}),
    ));
    let e = errors(&r);
    assert!(has(
        &e,
        "spec.configPatches[0].patch.value.connect_timeout: Envoy filter: json: cannot unmarshal \
         number into Go value of type string"
    ));
    assert!(has(
        &e,
        "value.lbPolicy: Envoy filter: unknown value \"\\\"FASTEST\\\"\" for enum \
         envoy.config.cluster.v3.Cluster.LbPolicy"
    ));

    let r = check(adding("CLUSTER", json!({"connect_timeout": "1d"})));
    assert!(has(&errors(&r), "bad Duration: time: unknown unit \"d\""));

    let r = check(adding("LISTENER", json!({"filter_chains": {"name": "x"}})));
    assert!(has(
        &errors(&r),
        "cannot unmarshal object into Go value of type []json.RawMessage"
    ));
}

#[test]
fn nested_known_messages_are_read_too() {
    let r = check(adding(
        "LISTENER",
        json!({"filter_chains": [{"filters": [{"name": 7}]}]}),
    ));
    assert!(has(
        &errors(&r),
        "value.filter_chains[0].filters[0].name: Envoy filter: json: cannot unmarshal number into \
         Go value of type string"
    ));
}

#[test]
fn unknown_fields_are_warnings() {
    let r = check(adding("CLUSTER", json!({"name": "c", "colour": "blue"})));
    assert!(r.is_valid());
    assert!(has(
        &warnings(&r),
        "value.colour: Envoy filter: unknown field \"colour\" in envoy.config.cluster.v3.Cluster"
    ));
}

#[test]
fn filters_without_typed_config_are_warned_about() {
    let r = check(adding(
        "NETWORK_FILTER",
        json!({"name": "envoy.filters.network.tcp_proxy"}),
    ));
    assert!(r.is_valid());
    assert!(has(
        &warnings(&r),
        "using deprecated types by name without typed_config; envoy.filters.network.tcp_proxy"
    ));
    let r = check(adding(
        "HTTP_FILTER",
        json!({"name": "ecds", "config_discovery": {"type_urls": ["x"]}}),
    ));
    assert!(!has(&warnings(&r), "without typed_config"));
}

#[test]
fn an_any_needs_a_type_istiod_can_resolve() {
    let r = check(adding(
        "NETWORK_FILTER",
        json!({"typed_config": {"stat_prefix": "x"}}),
    ));
    assert!(has(&errors(&r), "Any JSON doesn't have '@type'"));

    // Deep inside a filter's config, a removed v2 type is found too.
    let r = check(adding(
        "NETWORK_FILTER",
        json!({"name": "hcm", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "http_filters": [{"name": "lua", "typed_config": {
                "@type": "type.googleapis.com/envoy.config.filter.http.lua.v2.Lua"}}]}}),
    ));
    let e = errors(&r);
    assert!(has(
        &e,
        "referenced type unknown (hint: try using the v3 XDS API)"
    ));
    assert!(has(
        &e,
        "value.typed_config.http_filters[0].typed_config: referenced type unknown"
    ));

    // A wrapped well-known type carries its `value`.
    let r = check(adding(
        "EXTENSION_CONFIG",
        json!({"name": "w", "typed_config": {"@type": "type.googleapis.com/google.protobuf.StringValue"}}),
    ));
    assert!(has(&errors(&r), "Any JSON doesn't have 'value'"));
}

#[test]
fn a_value_is_checked_for_remove_too() {
    let r = check(json!({"configPatches": [{
        "applyTo": "CLUSTER",
        "patch": {"operation": "REMOVE", "value": {"name": false}}
    }]}));
    assert!(has(
        &errors(&r),
        "cannot unmarshal bool into Go value of type string"
    ));
}
