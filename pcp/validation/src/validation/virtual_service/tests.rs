use serde_json::{Value, json};

use super::*;

fn check(spec: Value) -> Report {
    let doc = json!({
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": "vs", "namespace": "default"},
        "spec": spec,
    });
    let obj = Object::from_json(&doc, "default", pasa_istio::generated::is_generated_object)
        .expect("structurally valid");
    let mut report = Report::default();
    validate(&obj, &mut report);
    report
}

fn fields(problems: &[super::super::Problem]) -> Vec<&str> {
    problems.iter().map(|p| p.field.as_str()).collect()
}

fn route_to(host: &str) -> Value {
    json!([{"destination": {"host": host}}])
}

#[test]
fn errors_name_the_field() {
    let r = check(json!({
        "hosts": ["foo.bar"],
        "http": [{
            "route": [
                {"destination": {"host": "a.b", "subset": "Bad_Subset"}, "weight": -1},
                {"destination": {"host": "*"}}
            ],
            "retries": {"attempts": 1, "retryOn": "5xx,bogus"},
            "timeout": "0.0005s"
        }]
    }));
    assert_eq!(
        fields(&r.errors),
        [
            "spec.http[0].retries.retryOn",
            "spec.http[0].route[0].destination.subset",
            "spec.http[0].route[0].weight",
            "spec.http[0].route[1].destination.host",
            "spec.http[0].timeout",
        ]
    );
    assert!(r.warnings.is_empty());
}

#[test]
fn parse_errors_stop_validation() {
    let r = check(json!({"hosts": ["foo.bar"], "http": [{"route": route_to("a.b"), "bogus": 1}]}));
    assert_eq!(fields(&r.errors), ["spec.http[0].bogus"]);
}

#[test]
fn delegates_have_no_hosts_gateways_tls_or_tcp() {
    let r = check(json!({
        "gateways": ["ns/gw"],
        "http": [{"route": route_to("a.b"), "delegate": {"name": "x"}}],
        "tcp": [{"route": route_to("a.b")}]
    }));
    assert_eq!(
        fields(&r.errors),
        ["spec.gateways", "spec.tcp", "spec.http[0].delegate"]
    );
    // A root route delegates and does nothing else.
    let r = check(json!({
        "hosts": ["foo.bar"],
        "http": [{"delegate": {"name": "child"}, "route": route_to("a.b")}]
    }));
    assert_eq!(fields(&r.errors), ["spec.http[0].route"]);
    let r = check(json!({"hosts": ["foo.bar"], "http": [{"delegate": {"name": "child"}}]}));
    assert!(r.is_valid(), "{r:?}");
}

#[test]
fn hosts_wildcards_and_duplicates() {
    let mesh = check(json!({"hosts": ["*"], "http": [{"route": route_to("a.b")}]}));
    assert_eq!(fields(&mesh.errors), ["spec.hosts[0]"]);
    let gw =
        check(json!({"hosts": ["*"], "gateways": ["ns/gw"], "http": [{"route": route_to("a.b")}]}));
    assert!(gw.is_valid());
    let dup = check(json!({"hosts": ["a.foo.bar", "*.bar"], "http": [{"route": route_to("a.b")}]}));
    assert_eq!(fields(&dup.errors), ["spec.hosts[1]"]);
    let ip = check(json!({"hosts": ["10.0.0.1"], "http": [{"route": route_to("a.b")}]}));
    assert!(ip.is_valid(), "{ip:?}");
}

#[test]
fn gateway_names() {
    let r = check(json!({
        "hosts": ["foo.bar"],
        "gateways": ["gw.ns", "b@d/also-bad"],
        "http": [{"route": route_to("a.b")}]
    }));
    // Like istiod, checking stops at the first name without a namespace.
    assert!(r.is_valid());
    assert_eq!(fields(&r.warnings), ["spec.gateways[0]"]);
    assert!(r.warnings[0].message.contains("\"ns/gw\""));
    let r = check(json!({
        "hosts": ["foo.bar"],
        "gateways": ["ns/gw", "-ns/*"],
        "http": [{"route": route_to("a.b")}]
    }));
    assert_eq!(r.errors.len(), 2, "{r:?}");
}

#[test]
fn jwt_claims_need_a_gateway() {
    let spec = |gateways: Value| {
        json!({
            "hosts": ["foo.bar"],
            "gateways": gateways,
            "http": [{
                "match": [{"headers": {"@request.auth.claims.group": {"exact": "a"}}}],
                "route": route_to("a.b")
            }]
        })
    };
    let r = check(spec(json!(["mesh", "ns/gw"])));
    assert_eq!(
        fields(&r.errors),
        ["spec.http[0].match[0].headers[@request.auth.claims.group]"]
    );
    assert!(check(spec(json!(["ns/gw"]))).is_valid());
}

#[test]
fn tls_routes_match_sni_within_hosts() {
    let spec = |sni: &str| {
        json!({
            "hosts": ["*.foo.bar"],
            "tls": [{"match": [{"sniHosts": [sni]}], "route": route_to("a.b")}]
        })
    };
    assert!(check(spec("a.foo.bar")).is_valid());
    assert!(check(spec("*.a.foo.bar")).is_valid());
    assert_eq!(
        fields(&check(spec("*.bar")).errors),
        ["spec.tls[0].match[0].sniHosts[0]"]
    );
    assert_eq!(
        fields(&check(spec("other.com")).errors),
        ["spec.tls[0].match[0].sniHosts[0]"]
    );
    let ip = check(spec("1.2.3.4"));
    assert!(ip.is_valid());
    assert_eq!(fields(&ip.warnings), ["spec.tls[0].match[0].sniHosts[0]"]);
    assert!(host_subset_of("a.b.c", "*.c"));
    assert!(!host_subset_of("*.c", "a.c"));
    assert!(!host_subset_of("*.c", "*.b.c"));
    assert!(host_subset_of("*.b.c", "*"));
}

#[test]
fn auto_passthrough_sni_names() {
    assert!(
        validate_gateway_bound_domain(
            true,
            "outbound_.15010_._.istiod.istio-system.svc.cluster.local"
        )
        .is_ok()
    );
    assert!(validate_gateway_bound_domain(true, "outbound_.x_._.istiod.svc").is_err());
    assert!(validate_gateway_bound_domain(true, "outbound_.80_._.123").is_err());
    assert!(validate_gateway_bound_domain(true, "outbound_.80").is_err());
    assert!(validate_gateway_bound_domain(false, "outbound_.80_._.a.b").is_err());
}

#[test]
fn weights() {
    let r = check(json!({
        "hosts": ["foo.bar"],
        "tcp": [{"route": [{"destination": {"host": "a.b"}}, {"destination": {"host": "c.d"}}]}]
    }));
    assert_eq!(fields(&r.errors), ["spec.tcp[0].route"]);
    // istiod sums weights in 32 bits; a total that wraps to zero is refused too.
    let r = check(json!({
        "hosts": ["foo.bar"],
        "tcp": [{"route": [
            {"destination": {"host": "a.b"}, "weight": 2147483647},
            {"destination": {"host": "c.d"}, "weight": 2147483647},
            {"destination": {"host": "e.f"}, "weight": 2}
        ]}]
    }));
    assert_eq!(fields(&r.errors), ["spec.tcp[0].route"]);
}

#[test]
fn authority_is_rewritten_in_one_place() {
    let r = check(json!({
        "hosts": ["foo.bar"],
        "http": [{
            "headers": {"request": {"set": {"Host": "a"}, "add": {":authority": "b"}}},
            "route": route_to("a.b")
        }]
    }));
    assert_eq!(fields(&r.errors), ["spec.http[0].headers"]);
}

#[test]
fn unreachable_rules_and_overlapping_matches_warn() {
    let r = check(json!({
        "hosts": ["foo.bar"],
        "http": [
            {"name": "catch-all", "route": route_to("a.b")},
            {"route": route_to("a.b")},
            {"match": [{"uri": {"prefix": "/x"}}], "route": route_to("a.b")}
        ]
    }));
    assert!(r.is_valid());
    assert_eq!(fields(&r.warnings), ["spec.http[1]", "spec.http[2]"]);

    let r = check(json!({
        "hosts": ["foo.bar"],
        "http": [
            {"name": "a", "match": [{"name": "m", "uri": {"exact": "/x"}}], "route": route_to("a.b")},
            {"match": [{"uri": {"exact": "/x"}}], "route": route_to("a.b")},
            {"route": route_to("a.b")}
        ]
    }));
    assert_eq!(
        fields(&r.warnings),
        ["spec.http[1].match[0]", "spec.http[1]"]
    );
    assert!(r.warnings[0].message.contains("rule #1 match #0"), "{r:?}");
    assert!(r.warnings[0].message.contains("in rule \"a\""), "{r:?}");

    // A shorter prefix with the same (default GET) method covers a longer one.
    let r = check(json!({
        "hosts": ["foo.bar"],
        "http": [
            {"match": [{"uri": {"prefix": "/api"}}], "route": route_to("a.b")},
            {"match": [{"uri": {"prefix": "/api/v1"}, "method": {"exact": "GET"}}], "route": route_to("a.b")},
            {"match": [{"uri": {"prefix": "/api/v2"}, "method": {"exact": "POST"}}], "route": route_to("a.b")},
            {"match": [{"uri": {"prefix": "/api/v3"}, "headers": {"x": {"exact": "1"}}}], "route": route_to("a.b")}
        ]
    }));
    assert_eq!(fields(&r.warnings), ["spec.http[1].match[0]"]);

    let r = check(json!({
        "hosts": ["foo.bar"],
        "tcp": [
            {"match": [{"port": 80}], "route": route_to("a.b")},
            {"match": [{"port": 80}], "route": route_to("a.b")}
        ]
    }));
    assert_eq!(fields(&r.warnings), ["spec.tcp[1].match[0]", "spec.tcp[1]"]);
}

#[test]
fn redirects_report_the_first_problem() {
    let r = check(json!({
        "hosts": ["foo.bar"],
        "http": [{"redirect": {"uri": "/a", "prefixRewrite": "/b", "redirectCode": 200}}]
    }));
    assert_eq!(fields(&r.errors), ["spec.http[0].redirect"]);
    let r = check(json!({
        "hosts": ["foo.bar"],
        "http": [{"match": [{"uri": {}}], "redirect": {"prefixRewrite": "/b"}}]
    }));
    assert!(!r.is_valid());
    let r = check(json!({
        "hosts": ["foo.bar"],
        "http": [{"redirect": {"port": 70000}}]
    }));
    assert!(!r.is_valid());
    let r = check(json!({
        "hosts": ["foo.bar"],
        "http": [{"redirect": {"derivePort": "FROM_REQUEST_PORT"}}]
    }));
    assert!(r.is_valid(), "{r:?}");
}

#[test]
fn large_direct_responses() {
    let body = |n: usize| {
        json!({
            "hosts": ["foo.bar"],
            "http": [{"directResponse": {"status": 200, "body": {"string": "a".repeat(n)}}}]
        })
    };
    let r = check(body(100 * 1024 + 1));
    assert!(r.is_valid());
    assert_eq!(fields(&r.warnings), ["spec.http[0].directResponse.body"]);
    assert!(!check(body(1024 * 1024 + 1)).is_valid());
}

#[test]
fn match_conditions() {
    let r = check(json!({
        "hosts": ["foo.bar"],
        "http": [{
            "match": [{
                "uri": {"prefix": ""},
                "method": {"prefix": ""},
                "authority": {"regex": "("},
                "withoutHeaders": {"x-a": {"regex": "*"}, "x-b": {"regex": "*a"}},
                "queryParams": {"q": {"regex": ""}},
                "port": 70000,
                "sourceNamespace": "Not_A_Namespace",
                "sourceLabels": {"app": "bad value"}
            }],
            "route": route_to("a.b")
        }]
    }));
    assert_eq!(
        fields(&r.errors),
        [
            "spec.http[0].match[0].withoutHeaders[x-b]",
            "spec.http[0].match[0].method",
            "spec.http[0].match[0].authority",
            "spec.http[0].match[0].queryParams[q]",
            "spec.http[0].match[0].port",
            "spec.http[0].match[0].sourceLabels[app]",
            "spec.http[0].match[0].sourceNamespace",
        ]
    );
}

#[test]
fn delegation_chains() {
    let cases = [
        (
            json!({"hosts": ["foo.bar"], "gateways": ["test-gateway"], "http": [{"delegate": {"name": "test", "namespace": "test"}}]}),
            true,
        ),
        (
            json!({"hosts": ["foo.bar"], "http": [{"delegate": {"name": "test", "namespace": "test"}}]}),
            true,
        ),
        (
            json!({"hosts": ["foo.bar"], "http": [{"delegate": {"name": "test"}, "route": route_to("foo.baz")}]}),
            false,
        ),
        (
            json!({"hosts": ["foo.bar"], "http": [{"delegate": {"name": "test"}, "redirect": {"uri": "/"}}]}),
            false,
        ),
        (json!({"hosts": [], "http": [{}]}), false),
        (
            json!({"hosts": [], "http": [{"delegate": {"name": "test", "namespace": "test"}}]}),
            false,
        ),
        (
            json!({"hosts": [], "tcp": [{"route": route_to("foo.baz")}]}),
            false,
        ),
        (
            json!({"hosts": [], "gateways": ["test"], "http": [{"route": route_to("foo.baz")}]}),
            false,
        ),
        (
            json!({"http": [{"match": [{"sourceNamespace": "test"}], "route": route_to("foo.baz")}]}),
            true,
        ),
    ];
    for (spec, valid) in cases {
        let r = check(spec.clone());
        assert_eq!(r.is_valid(), valid, "{spec}: {r:?}");
    }
}

#[test]
fn enum_numbers_the_api_does_not_name() {
    let r = check(json!({
        "hosts": ["foo.bar"],
        "http": [
            {"redirect": {"derivePort": 7}},
            {"redirect": {"derivePort": 1}},
            {"corsPolicy": {"unmatchedPreflights": 9}, "route": route_to("a.b")}
        ]
    }));
    assert_eq!(
        fields(&r.errors),
        [
            "spec.http[0].redirect.derivePort",
            "spec.http[2].corsPolicy.unmatchedPreflights"
        ]
    );
}
