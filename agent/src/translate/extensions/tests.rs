//! TrafficExtensions and WasmPlugins, through the translator.

use envoy_types::pb::envoy::config::core::v3::{
    TypedExtensionConfig, async_data_source, data_source,
};
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use envoy_types::pb::envoy::extensions::filters::http::wasm::v3::Wasm as HttpWasm;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter;
use envoy_types::pb::envoy::extensions::wasm::v3::plugin_config;
use envoy_types::pb::google::protobuf::StringValue;
use pasa_proto::store::v1::Resource as StoreResource;
use prost::Message;
use serde_json::{Value, json};

use crate::model::proxy::Generator;
use crate::testing::resource;
use crate::translate::Translator;
use crate::translate::tests::{hcm_in, reviews_service, reviews_workload as workload};

fn wasm_plugin(ns: &str, name: &str, spec: Value, revision: u64) -> StoreResource {
    resource("WasmPlugin", ns, name, spec, revision)
}

fn generated(resources: Vec<StoreResource>) -> crate::resource::Resources {
    Translator::new(workload())
        .update(
            &crate::cache::Cache::from_resources(resources, 10),
            Generator::Envoy,
        )
        .expect("decodes")
}

/// The HTTP filter names of the connection manager of `l`'s chain `chain` (any when empty).
fn http_filters(l: &Listener, chain: &str) -> Vec<String> {
    hcm_in(l, chain)
        .http_filters
        .into_iter()
        .map(|f| f.name)
        .collect()
}

fn inbound(out: &crate::resource::Resources) -> Vec<String> {
    http_filters(&out.listeners["virtualInbound"], "0.0.0.0_9080")
}

fn outbound(out: &crate::resource::Resources) -> Vec<String> {
    http_filters(&out.listeners["0.0.0.0_9080"], "")
}

const PLUGIN: &str =
    "extensions.istio.io/trafficextension/default.auth~istio-translated-wasmplugin";

fn allow_policy() -> StoreResource {
    resource(
        "AuthorizationPolicy",
        "default",
        "allow",
        json!({"selector": {"matchLabels": {"app": "reviews"}}, "action": "ALLOW",
               "rules": [{"to": [{"operation": {"methods": ["GET"]}}]}]}),
        4,
    )
}

#[test]
fn a_wasm_plugin_goes_in_its_phases_place_and_is_served_over_ecds() {
    let out = generated(vec![
        reviews_service(),
        allow_policy(),
        wasm_plugin(
            "default",
            "auth",
            json!({"selector": {"matchLabels": {"app": "reviews"}}, "phase": "AUTHZ",
                   "url": "file:///opt/plugins/auth.wasm", "pluginName": "root",
                   "pluginConfig": {"header": "x-auth"}, "failStrategy": "FAIL_OPEN",
                   "vmConfig": {"env": [{"name": "MODE", "value": "strict"},
                                        {"name": "POD_NAME", "valueFrom": "HOST"}]}}),
            5,
        ),
    ]);
    let filters = inbound(&out);
    let at = filters.iter().position(|f| f == PLUGIN).expect("inbound");
    let rbac = filters
        .iter()
        .position(|f| f == "envoy.filters.http.rbac")
        .expect("the ALLOW policy's");
    assert!(at < rbac, "AUTHZ before the RBAC filters: {filters:?}");
    // Both sides without `match`.
    let filters = outbound(&out);
    assert_eq!(filters[0], PLUGIN, "{filters:?}");

    let ecds: &TypedExtensionConfig = &out.extension_configs[PLUGIN];
    let wasm = HttpWasm::decode(ecds.typed_config.as_ref().unwrap().value.as_slice()).unwrap();
    let config = wasm.config.unwrap();
    assert_eq!(config.name, "default.auth~istio-translated-wasmplugin");
    assert_eq!(config.root_id, "root");
    let json = StringValue::decode(config.configuration.unwrap().value.as_slice()).unwrap();
    assert_eq!(json.value, r#"{"header":"x-auth"}"#);
    let Some(plugin_config::Vm::VmConfig(vm)) = config.vm else {
        panic!()
    };
    assert_eq!(vm.runtime, "envoy.wasm.runtime.v8");
    let Some(async_data_source::Specifier::Local(local)) = vm.code.unwrap().specifier else {
        panic!("a local module")
    };
    assert_eq!(
        local.specifier,
        Some(data_source::Specifier::Filename(
            "/opt/plugins/auth.wasm".into()
        ))
    );
    let env = vm.environment_variables.unwrap();
    assert_eq!(env.key_values["MODE"], "strict");
    assert_eq!(env.host_env_keys, ["POD_NAME"]);
}

#[test]
fn match_priority_and_phases_order_the_extensions() {
    let plugin = |name: &str, spec: Value| wasm_plugin("default", name, spec, 5);
    let url = "file:///p.wasm";
    let out = generated(vec![
        reviews_service(),
        allow_policy(),
        plugin("low", json!({"url": url, "priority": 5})),
        plugin("high", json!({"url": url, "priority": 10})),
        plugin("authn", json!({"url": url, "phase": "AUTHN"})),
        plugin("stats", json!({"url": url, "phase": "STATS"})),
        plugin(
            "server-9080",
            json!({"url": url, "match": [{"mode": "SERVER", "ports": [{"number": 9080}]}]}),
        ),
        plugin(
            "server-other",
            json!({"url": url, "match": [{"mode": "SERVER", "ports": [{"number": 1}]}]}),
        ),
        // Another workload's.
        plugin(
            "ratings",
            json!({"url": url, "selector": {"matchLabels": {"app": "ratings"}}}),
        ),
    ]);
    let short = |names: Vec<String>| -> Vec<String> {
        names
            .into_iter()
            .map(|n| {
                n.strip_prefix("extensions.istio.io/trafficextension/default.")
                    .map_or(n.clone(), |s| {
                        s.trim_end_matches("~istio-translated-wasmplugin")
                            .to_string()
                    })
            })
            .collect()
    };
    assert_eq!(
        short(inbound(&out)),
        [
            "authn",
            "envoy.filters.http.rbac",
            "stats",
            "high",
            "low",
            "server-9080",
            "envoy.filters.http.grpc_stats",
            "envoy.filters.http.fault",
            "envoy.filters.http.cors",
            "envoy.filters.http.router"
        ]
    );
    assert_eq!(
        short(outbound(&out)),
        [
            "authn",
            "stats",
            "high",
            "low",
            "envoy.filters.http.grpc_stats",
            "envoy.filters.http.fault",
            "envoy.filters.http.cors",
            "envoy.filters.http.router"
        ]
    );
}

#[test]
fn a_module_the_agent_does_not_have_fails_open_or_closed_as_pilot_agent_does() {
    for (strategy, denies) in [("FAIL_OPEN", false), ("FAIL_CLOSE", true)] {
        let out = generated(vec![
            reviews_service(),
            wasm_plugin(
                "default",
                "auth",
                json!({"url": "oci://ghcr.io/example/auth:1", "failStrategy": strategy}),
                5,
            ),
        ]);
        let ecds = &out.extension_configs[PLUGIN];
        let rbac = HttpRbac::decode(ecds.typed_config.as_ref().unwrap().value.as_slice())
            .expect("an RBAC filter");
        assert_eq!(rbac.rules.is_some(), denies, "{strategy}");
    }
}

#[test]
fn a_lua_traffic_extension_is_inline() {
    let out = generated(vec![
        reviews_service(),
        resource(
            "TrafficExtension",
            "istio-system",
            "lua",
            json!({"lua": {"inlineCode": "function envoy_on_request(h) end"}}),
            5,
        ),
    ]);
    let name = "extensions.istio.io/trafficextension/istio-system.lua";
    let hcm = hcm_in(&out.listeners["0.0.0.0_9080"], "");
    let lua = hcm.http_filters.iter().find(|f| f.name == name).unwrap();
    assert!(matches!(
        &lua.config_type,
        Some(http_filter::ConfigType::TypedConfig(a)) if a.type_url.ends_with("lua.v3.Lua")
    ));
    assert!(
        out.extension_configs.is_empty(),
        "Lua is not served over ECDS"
    );
}

#[test]
fn next_to_istio_the_module_is_sent_as_istiod_sends_it_for_pilot_agent_to_fetch() {
    let docker_config = r#"{"auths":{"registry.example.com":{"auth":"dTpw"}}}"#;
    let plugin = wasm_plugin(
        "default",
        "auth",
        json!({"url": "registry.example.com/auth:1", "sha256": "abc",
               "imagePullPolicy": "Always", "imagePullSecret": "creds"}),
        5,
    );
    let secret = resource(
        "ImagePullSecret",
        "default",
        "creds",
        json!({"dockerConfigJson": docker_config}),
        6,
    );
    // With the pull secret in the store, and without it (pilot-agent then refuses the fetch).
    for (resources, sent) in [
        (vec![plugin.clone(), secret], docker_config),
        (vec![plugin], ""),
    ] {
        let mut translator =
            Translator::new(workload()).with_modules(std::sync::Arc::new(crate::wasm::PilotAgent));
        let out = translator
            .update(
                &crate::cache::Cache::from_resources(
                    [vec![reviews_service()], resources].concat(),
                    10,
                ),
                Generator::Envoy,
            )
            .unwrap();
        let ecds = &out.extension_configs[PLUGIN];
        let vm = |ecds: &TypedExtensionConfig| {
            let wasm =
                HttpWasm::decode(ecds.typed_config.as_ref().unwrap().value.as_slice()).unwrap();
            let Some(plugin_config::Vm::VmConfig(vm)) = wasm.config.unwrap().vm else {
                panic!()
            };
            vm
        };
        let vm_config = vm(ecds);
        let Some(async_data_source::Specifier::Remote(remote)) = vm_config.code.unwrap().specifier
        else {
            panic!("a remote module")
        };
        let uri = remote.http_uri.unwrap();
        assert_eq!(uri.uri, "oci://registry.example.com/auth:1");
        assert_eq!(remote.sha256, "abc");
        let env = vm_config.environment_variables.unwrap().key_values;
        assert_eq!(env["ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION"], "5");
        assert_eq!(env["ISTIO_META_WASM_IMAGE_PULL_POLICY"], "Always");
        assert_eq!(env[super::PULL_SECRET_ENV], sent);
        // Shown to a person, the secret is hidden.
        let shown = super::redacted(&envoy_types::util::pack_any(ecds.clone()), "[redacted]");
        let shown = TypedExtensionConfig::decode(shown.value.as_slice()).unwrap();
        let env = vm(&shown).environment_variables.unwrap().key_values;
        let hidden = if sent.is_empty() { "" } else { "[redacted]" };
        assert_eq!(env[super::PULL_SECRET_ENV], hidden);
        assert_eq!(env["ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION"], "5");
    }
}

/// A module being fetched: its resource waits, its filter is in place.
#[derive(Debug)]
struct Fetching;

impl super::ModuleSource for Fetching {
    fn module(&self, _: &str, _: &str, _: super::PullSecret<'_>) -> super::ModuleCode {
        super::ModuleCode::Pending
    }
}

#[test]
fn while_its_module_is_fetched_an_extensions_resource_waits() {
    let mut translator = Translator::new(workload()).with_modules(std::sync::Arc::new(Fetching));
    let out = translator
        .update(
            &crate::cache::Cache::from_resources(
                vec![
                    reviews_service(),
                    wasm_plugin("default", "auth", json!({"url": "https://e.com/a.wasm"}), 5),
                ],
                10,
            ),
            Generator::Envoy,
        )
        .unwrap();
    assert!(out.extension_configs.is_empty());
    assert!(outbound(&out).contains(&PLUGIN.to_string()));
}
