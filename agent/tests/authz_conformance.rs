//! istiod's AuthorizationPolicy builder golden files (the conformance corpus,
//! `translation/authz/`) through the agent's RBAC builder: for each case of `cases.yaml`, the
//! policies in, the list of Envoy filters out, compared as data (protobuf JSON) with istiod's.
//! Prints the pass count per folder; cases in [`SKIPS`] are not run, each with its reason.

use pasa_agent::translate::authz::custom::{self, ExtAuthzProviders};
use pasa_agent::translate::authz::{self, AppliedPolicy, TrustDomains};
use pasa_agent::translate::providers::KnownService;
use pasa_istio::authorization_policy::{AuthorizationPolicy, DRY_RUN_ANNOTATION, go_bool};
use serde_json::{Value, json};

/// Cases not run, by name, with the reason.
const SKIPS: &[(&str, &str)] = &[];

/// Why a case is not run, if it is not.
fn skipped(case: &Value) -> Option<String> {
    let name = case["name"].as_str().unwrap_or_default();
    SKIPS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, why)| (*why).to_string())
}

struct Loaded {
    namespace: String,
    name: String,
    dry_run: bool,
    spec: AuthorizationPolicy,
}

fn policies(path: &std::path::Path) -> Vec<Loaded> {
    pasa_testing::yaml_docs(path)
        .into_iter()
        .filter(|d| d.is_object())
        .map(|d| Loaded {
            namespace: d["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .into(),
            name: d["metadata"]["name"].as_str().unwrap_or_default().into(),
            dry_run: d["metadata"]["annotations"][DRY_RUN_ANNOTATION]
                .as_str()
                .and_then(go_bool)
                .unwrap_or(false),
            spec: pasa_istio::parse_spec(&d["spec"])
                .unwrap_or_else(|e| panic!("{}: {e}", path.display())),
        })
        .collect()
}

fn filter_json(name: &str, any: &envoy_types::pb::google::protobuf::Any) -> Value {
    let mut typed = pasactl::envoy_json::to_json(name, any).unwrap_or_else(|e| panic!("{e}"));
    typed
        .as_object_mut()
        .expect("a message")
        .insert("@type".into(), json!(any.type_url));
    json!({"name": name, "typedConfig": typed})
}

fn http_json(
    filters: &[envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter],
) -> Vec<Value> {
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType;
    filters
        .iter()
        .map(|f| match &f.config_type {
            Some(ConfigType::TypedConfig(any)) => filter_json(&f.name, any),
            _ => json!({"name": f.name}),
        })
        .collect()
}

fn tcp_json(filters: &[envoy_types::pb::envoy::config::listener::v3::Filter]) -> Vec<Value> {
    use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType;
    filters
        .iter()
        .map(|f| match &f.config_type {
            Some(ConfigType::TypedConfig(any)) => filter_json(&f.name, any),
            _ => json!({"name": f.name}),
        })
        .collect()
}

#[test]
fn istio_authz_builder_golden_files() {
    let Some(dir) = pasa_testing::conformance_dir("translation/authz") else {
        return;
    };
    let dir = dir.join("translation/authz");
    let cases = &pasa_testing::yaml_docs(&dir.join("cases.yaml"))[0];
    let mut failures = Vec::new();
    for (kind, for_tcp) in [("http", false), ("tcp", true)] {
        let (mut passed, mut failed, mut skipped_count) = (0, 0, 0);
        for case in cases[kind].as_array().into_iter().flatten() {
            let name = case["name"].as_str().unwrap_or_default();
            if let Some(why) = skipped(case) {
                skipped_count += 1;
                println!("  skip {kind}/{name}: {why}");
                continue;
            }
            let trust = match case["trust_domain"].as_str() {
                Some(td) => {
                    let mut all = vec![td.to_string()];
                    all.extend(
                        case["trust_domain_aliases"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(Value::as_str)
                            .map(str::to_string),
                    );
                    TrustDomains(all)
                }
                None => TrustDomains::default(),
            };
            let loaded = policies(&dir.join(case["input"].as_str().unwrap()));
            let applied: Vec<AppliedPolicy<'_>> = loaded
                .iter()
                .map(|p| AppliedPolicy {
                    namespace: &p.namespace,
                    name: &p.name,
                    dry_run: p.dry_run,
                    spec: &p.spec,
                })
                .collect();
            // The CUSTOM builder: the named mesh config's providers, against the registry's
            // services.
            let custom = case["custom_builder"].as_bool() == Some(true);
            let providers = if custom {
                let mesh = &cases["mesh_configs"][case["mesh_config"].as_str().unwrap_or_default()]
                    ["meshConfig"];
                let mesh = serde_json::from_value(mesh.clone())
                    .unwrap_or_else(|e| panic!("{name}: mesh config: {e}"));
                let services: Vec<KnownService<'_>> = cases["defaults"]["services"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|s| KnownService {
                        namespace: s["namespace"].as_str().unwrap_or_default(),
                        hostname: s["hostname"].as_str().unwrap_or_default(),
                    })
                    .collect();
                ExtAuthzProviders::resolve(&mesh, &services)
            } else {
                ExtAuthzProviders::default()
            };
            let got: Vec<Value> = match (for_tcp, custom) {
                (true, true) => tcp_json(&custom::tcp_filters(&applied, &providers, &trust)),
                (false, true) => http_json(&custom::http_filters(&applied, &providers, &trust)),
                (true, false) => tcp_json(&authz::tcp_filters(&applied, &trust)),
                (false, false) => http_json(&authz::http_filters(&applied, &trust)),
            };
            let want: Vec<Value> = case["want"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|f| pasa_testing::yaml_docs(&dir.join(f.as_str().unwrap())).remove(0))
                .collect();
            if got == want {
                passed += 1;
            } else {
                failed += 1;
                failures.push(format!(
                    "{kind}/{name}: got\n{}\nwant\n{}",
                    serde_json::to_string_pretty(&got).unwrap(),
                    serde_json::to_string_pretty(&want).unwrap()
                ));
            }
        }
        println!(
            "translation/authz {kind}: {passed} passed, {failed} failed, {skipped_count} skipped"
        );
    }
    for f in &failures {
        println!("FAIL {f}");
    }
    assert!(
        failures.is_empty(),
        "{} case(s) failed; see FAIL lines",
        failures.len()
    );
}
