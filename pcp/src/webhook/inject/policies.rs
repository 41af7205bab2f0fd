//! The config PASA's agent does not apply everything of yet ([`UNENFORCED_KINDS`]): which of it
//! would apply to a pod, so that such a pod stays with istiod, and the warnings that say why.

use std::collections::BTreeMap;

use serde_json::Value;

use super::sidecar;
use super::stored_mesh_config;

/// The kinds of which PASA's agent does not apply everything yet (WasmPlugin and
/// TrafficExtension whose Wasm module the pod's proxy would not get; Telemetry with metrics for
/// upstream Envoy (the standalone mode), or tracing providers other than Zipkin, Datadog,
/// SkyWalking and OpenTelemetry ones; EnvoyFilter patches naming types the pod's proxy lacks;
/// RequestAuthentication whose keys are neither inline nor fetched
/// into the store yet; AuthorizationPolicy with action CUSTOM whose provider the stored mesh
/// config does not define): a pod one of those applies to stays with istiod, so that moving to
/// PASA never drops a policy, a patch or an extension. The webhook reads them with the mesh
/// config, the key sets and the pull secrets ([`pasa_proto::Kind::MeshConfig`],
/// [`pasa_proto::Kind::JsonWebKeySet`], [`pasa_proto::Kind::ImagePullSecret`]).
pub const UNENFORCED_KINDS: [pasa_proto::Kind; 9] = [
    pasa_proto::Kind::MeshConfig,
    pasa_proto::Kind::JsonWebKeySet,
    pasa_proto::Kind::ImagePullSecret,
    pasa_proto::Kind::AuthorizationPolicy,
    pasa_proto::Kind::RequestAuthentication,
    pasa_proto::Kind::EnvoyFilter,
    pasa_proto::Kind::Telemetry,
    pasa_proto::Kind::WasmPlugin,
    pasa_proto::Kind::TrafficExtension,
];

/// The resources among `policies` (of [`UNENFORCED_KINDS`], from the pod's namespace and the
/// root namespace) that the agent would not apply but that would apply to `pod`'s sidecar in
/// `namespace`, as `Kind namespace/name`: those of the root namespace without selector (the
/// mesh), of the pod's namespace without selector (the namespace), or of either with a selector
/// the pod's labels match. Resources attached by `targetRef(s)` apply to Services' waypoints and
/// gateways, not to sidecars. EnvoyFilters are applied (their `BOOTSTRAP` patches are inert, as
/// under istiod). AuthorizationPolicies are enforced, CUSTOM ones when the mesh config
/// among `policies` (`mesh` in the root namespace) defines their provider as an external
/// authorizer. A resource that cannot be read counts as applying.
pub fn unenforced_policies(
    pod: &Value,
    namespace: &str,
    root_namespace: &str,
    policies: &[pasa_proto::store::v1::Resource],
) -> Vec<String> {
    // Next to Istio's proxy, the agent sends Istio's metrics filters; upstream Envoy has none.
    let istio_proxy = sidecar::mode(pod).0 == sidecar::Mode::NextToIstio;
    use pasa_istio::authorization_policy::{
        Action, AuthorizationPolicy, PolicyTargetReference, WorkloadPolicy, applies_to_workload,
        target_refs,
    };
    use pasa_proto::Kind;
    let owned =
        |refs: Vec<&PolicyTargetReference>| -> Targets { refs.into_iter().cloned().collect() };
    use pasa_istio::destination_rule::WorkloadSelector;
    use pasa_istio::extensions::{TrafficExtension, WasmPlugin};
    use pasa_istio::parse_spec_json;
    use pasa_istio::request_authentication::{KeySetSource, RequestAuthentication};
    use pasa_istio::telemetry::Telemetry;
    let labels: BTreeMap<String, String> = pod
        .pointer("/metadata/labels")
        .and_then(|l| serde_json::from_value(l.clone()).ok())
        .unwrap_or_default();
    // The JWT key sets PCP fetched.
    let key_sets: Vec<&str> = policies
        .iter()
        .filter(|p| p.kind == Kind::JsonWebKeySet.as_str() && p.namespace == root_namespace)
        .map(|p| p.name.as_str())
        .collect();
    // The pull secrets the syncer carried: (namespace, name).
    let pull_secrets: Vec<(&str, &str)> = policies
        .iter()
        .filter(|p| p.kind == Kind::ImagePullSecret.as_str())
        .map(|p| (p.namespace.as_str(), p.name.as_str()))
        .collect();
    // Whether the pod's proxy gets a module: a file in the pod, or one fetched (next to
    // Istio's proxy by its pilot-agent, alone by the agent) with its pull secret, if it names
    // one, in the store (without it, its filter would fail open or closed where istiod's
    // proxies run the module).
    let module_loads = |namespace: &str, url: &str, pull_secret: &str| {
        url.starts_with("file://")
            || pull_secret.is_empty()
            || pull_secrets.contains(&(namespace, pull_secret))
    };
    let mesh = stored_mesh_config(policies, root_namespace);
    // The external authorizers the agents know of.
    let authorizers: Vec<String> = mesh
        .iter()
        .flat_map(|m| &m.extension_providers)
        .filter(|p| p.envoy_ext_authz_http.is_some() || p.envoy_ext_authz_grpc.is_some())
        .map(|p| p.name.clone())
        .collect();
    // How a resource picks workloads: its selector, whether it is attached by targetRef(s); None
    // when it does not concern sidecars at all.
    let attachment =
        |p: &pasa_proto::store::v1::Resource| -> Option<(Option<WorkloadSelector>, Targets)> {
            let unreadable = Some((None, Vec::new()));
            match p.kind.parse::<Kind>() {
                Ok(Kind::AuthorizationPolicy) => {
                    match parse_spec_json::<AuthorizationPolicy>(&p.spec_json) {
                        // ALLOW, DENY and AUDIT are enforced by the agent, and CUSTOM with a
                        // provider the mesh config defines.
                        Ok(ap)
                            if ap.action != Action::Custom
                                || ap
                                    .provider
                                    .as_ref()
                                    .is_some_and(|p| authorizers.contains(&p.name)) =>
                        {
                            None
                        }
                        Ok(ap) => Some((ap.selector.clone(), owned(ap.targets()))),
                        Err(_) => unreadable,
                    }
                }
                // Enforced when every JWT rule's keys are inline or in the store.
                Ok(Kind::RequestAuthentication) => {
                    match parse_spec_json::<RequestAuthentication>(&p.spec_json) {
                        Ok(ra)
                            if ra.jwt_rules.iter().flatten().all(|r| {
                                KeySetSource::of(r)
                                    .is_none_or(|s| key_sets.contains(&s.object_name().as_str()))
                            }) =>
                        {
                            None
                        }
                        Ok(ra) => Some((ra.selector.clone(), owned(ra.targets()))),
                        Err(_) => unreadable,
                    }
                }
                // Enforced when it traces only to tracers the agent builds, and, for upstream
                // Envoy, without metrics.
                Ok(Kind::Telemetry) => match parse_spec_json::<Telemetry>(&p.spec_json) {
                    Ok(t) if applied_telemetry(&t, mesh.as_ref(), istio_proxy) => None,
                    Ok(t) => Some((
                        t.selector.clone(),
                        owned(target_refs(t.target_ref.as_ref(), &t.target_refs)),
                    )),
                    Err(_) => unreadable,
                },
                // Applied when the pod's proxy gets the module (see `module_loads`), and Lua
                // always.
                Ok(Kind::WasmPlugin) => match parse_spec_json::<WasmPlugin>(&p.spec_json) {
                    Ok(w) if module_loads(&p.namespace, &w.url, &w.image_pull_secret) => None,
                    Ok(w) => Some((
                        w.selector.clone(),
                        owned(target_refs(w.target_ref.as_ref(), &w.target_refs)),
                    )),
                    Err(_) => unreadable,
                },
                Ok(Kind::TrafficExtension) => {
                    match parse_spec_json::<TrafficExtension>(&p.spec_json) {
                        Ok(t)
                            if t.wasm.as_ref().is_none_or(|w| {
                                module_loads(&p.namespace, &w.url, &w.image_pull_secret)
                            }) =>
                        {
                            None
                        }
                        Ok(t) => Some((t.selector, t.target_refs)),
                        Err(_) => unreadable,
                    }
                }
                Ok(Kind::EnvoyFilter) => envoy_filter_attachment(&p.spec_json, istio_proxy),
                _ => None,
            }
        };
    policies
        .iter()
        .filter(|p| {
            attachment(p).is_some_and(|(selector, targets)| {
                applies_to_workload(
                    &p.namespace,
                    selector.as_ref(),
                    &targets.iter().collect::<Vec<_>>(),
                    root_namespace,
                    namespace,
                    &labels,
                )
            })
        })
        .map(|p| format!("{} {}/{}", p.kind, p.namespace, p.name))
        .collect()
}

/// What the webhook warns of as it moves `pod` to PASA, knowing `policies` (those of
/// [`UNENFORCED_KINDS`], with the mesh config of `root_namespace`): a standalone pod runs
/// upstream Envoy, which has no `istio.stats`, so it does not report Istio's standard metrics
/// that the mesh config's `defaultProviders.metrics` gives every pod of istiod.
pub fn move_warnings(
    pod: &Value,
    root_namespace: &str,
    policies: &[pasa_proto::store::v1::Resource],
) -> Vec<String> {
    use pasa_istio::mesh_config::is_prometheus;
    if sidecar::mode(pod).0 != sidecar::Mode::Standalone {
        return Vec::new();
    }
    let Some(mesh) = stored_mesh_config(policies, root_namespace) else {
        return Vec::new();
    };
    let prometheus: Vec<String> = mesh
        .default_metrics_providers()
        .into_iter()
        .filter(|p| is_prometheus(Some(&mesh), p))
        .collect();
    if prometheus.is_empty() {
        return Vec::new();
    }
    vec![format!(
        "moved to PASA in the standalone mode, whose Envoy has no istio.stats: Istio's standard \
         metrics (istio_requests_total and the others) that the mesh config's \
         defaultProviders.metrics ({}) asks for are not reported for this pod; pods whose \
         metrics matter belong next to Istio's proxy (pasa.io/mode: istio)",
        prometheus.join(", ")
    )]
}

/// The `targetRef(s)` a policy attaches by.
type Targets = Vec<pasa_istio::authorization_policy::PolicyTargetReference>;

/// Whether the agent applies all of `t` as istiod does: metrics only for Istio's proxy
/// (`istio_proxy`: upstream Envoy has no `istio.stats`); access logging to providers
/// whose settings read (those named, or the mesh's default ones for an entry that names none;
/// providers that do not log are skipped by both); tracing to providers that are tracers the
/// agent builds (the first named, or the mesh's first default one).
fn applied_telemetry(
    t: &pasa_istio::telemetry::Telemetry,
    mesh: Option<&pasa_istio::mesh_config::MeshConfig>,
    istio_proxy: bool,
) -> bool {
    use pasa_istio::mesh_config::{MeshConfig, access_log_provider};
    let defaults = mesh
        .map(MeshConfig::default_access_log_providers)
        .unwrap_or_default();
    let default_tracer = mesh
        .map(MeshConfig::default_tracing_providers)
        .unwrap_or_default()
        .into_iter()
        .next();
    let tracer = |name: &str| {
        mesh.and_then(|m| m.provider(name))
            .and_then(|p| p.tracing())
            .is_some_and(|built| built.is_ok())
    };
    (istio_proxy || t.metrics.is_empty())
        && t.tracing
            .iter()
            .flatten()
            .all(|entry| match entry.providers.iter().flatten().next() {
                Some(p) => tracer(&p.name),
                None => default_tracer.as_deref().is_none_or(tracer),
            })
        && t.access_logging.iter().flatten().all(|entry| {
            let named: Vec<&str> = entry
                .providers
                .iter()
                .flatten()
                .map(|p| p.name.as_str())
                .collect();
            let names = if named.is_empty() {
                defaults.iter().map(String::as_str).collect()
            } else {
                named
            };
            names
                .into_iter()
                .all(|n| !matches!(access_log_provider(mesh, n), Some((_, Err(_)))))
        })
}

/// Whether a patch value names an `@type` the agent cannot send the pod's proxy: one the
/// Envoy API and Istio's proxy's own filters do not define (the agent cannot read it, where
/// istiod would pass it on), or one of Istio's proxy's own when the pod runs upstream Envoy
/// (not `istio_proxy`). The descriptors are loaded once, on the first value that names a type.
fn names_unknown_types(value: &Value, istio_proxy: bool) -> bool {
    let istios = |t: &&str| !istio_proxy && pasa_proto::istio_proxy::defines(t);
    // What TypedStructs configure is passed on as written, as by istiod.
    if pasa_envoy_json::typed_struct_type_names(value)
        .iter()
        .any(istios)
    {
        return true;
    }
    let types = pasa_envoy_json::type_names(value);
    if types.is_empty() {
        return false;
    }
    match pasa_envoy_json::pool() {
        Ok(pool) => types
            .iter()
            .any(|t| pool.get_message_by_name(t).is_none() || istios(t)),
        Err(_) => true,
    }
}

/// How an EnvoyFilter picks workloads (`workloadSelector.labels`, `targetRefs`), or None when
/// the agent applies every patch it has for sidecars: all but those whose value names a type
/// the pod's proxy cannot get from the agent (see [`names_unknown_types`]), and those matching
/// node metadata the agent does not know (patches for gateways or waypoints do not count, nor
/// `BOOTSTRAP` patches, which istiod applies nowhere either).
fn envoy_filter_attachment(
    spec_json: &str,
    istio_proxy: bool,
) -> Option<(
    Option<pasa_istio::destination_rule::WorkloadSelector>,
    Targets,
)> {
    use pasa_istio::envoy_filter::{
        AGENT_KNOWN_METADATA, ApplyTo, EnvoyConfigObjectPatch, EnvoyFilter, PatchContext,
    };
    let Ok(spec) = pasa_istio::parse_spec_json::<EnvoyFilter>(spec_json) else {
        return Some((None, Vec::new()));
    };
    let unapplied = |p: &EnvoyConfigObjectPatch| {
        let matching = p.match_.as_ref();
        let context = matching.map(|m| m.context).unwrap_or_default();
        let unknown_metadata = matching
            .and_then(|m| m.proxy.as_ref())
            .is_some_and(|proxy| {
                proxy
                    .metadata
                    .keys()
                    .any(|k| !AGENT_KNOWN_METADATA.contains(&k.as_str()))
            });
        let unknown_types = p
            .patch
            .as_ref()
            .and_then(|patch| patch.value.as_ref())
            .is_some_and(|v| v.values().any(|v| names_unknown_types(v, istio_proxy)));
        // `BOOTSTRAP` patches are inert under istiod too (no bootstrap it serves takes them).
        !matches!(context, PatchContext::Gateway | PatchContext::Waypoint)
            && p.apply_to != ApplyTo::Bootstrap
            && (unknown_types || unknown_metadata)
    };
    if !spec.config_patches.iter().flatten().any(unapplied) {
        return None;
    }
    let selector = spec
        .workload_selector
        .map(|s| pasa_istio::destination_rule::WorkloadSelector {
            match_labels: s.labels,
        });
    Some((selector, spec.target_refs))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn policies_that_would_apply_keep_a_pod_with_istiod() {
        use pasa_proto::store::v1::Resource;
        let policy = |kind: &str, ns: &str, name: &str, spec: Value| Resource {
            kind: kind.into(),
            namespace: ns.into(),
            name: name.into(),
            spec_json: spec.to_string(),
            ..Default::default()
        };
        let pod = json!({"metadata": {"labels": {"app": "reviews", "version": "v1"}}});
        let policies = [
            policy(
                "AuthorizationPolicy",
                "bookinfo",
                "for-reviews",
                json!({"selector": {"matchLabels": {"app": "reviews"}}, "action": "CUSTOM",
                       "provider": {"name": "opa"}, "rules": [{}]}),
            ),
            policy(
                "AuthorizationPolicy",
                "bookinfo",
                "for-ratings",
                json!({"selector": {"matchLabels": {"app": "ratings"}}, "action": "CUSTOM"}),
            ),
            policy(
                "RequestAuthentication",
                "bookinfo",
                "namespace-wide",
                json!({"jwtRules": [{"issuer": "a"}]}),
            ),
            policy(
                "AuthorizationPolicy",
                "bookinfo",
                "on-a-service",
                json!({"targetRefs": [{"kind": "Service", "name": "reviews"}], "action": "CUSTOM"}),
            ),
            policy(
                "RequestAuthentication",
                "istio-system",
                "mesh-wide",
                json!({"jwtRules": [{"issuer": "a"}]}),
            ),
            // Enforced by the agent.
            policy(
                "AuthorizationPolicy",
                "istio-system",
                "enforced",
                json!({"action": "DENY", "rules": [{}]}),
            ),
            policy(
                "AuthorizationPolicy",
                "other",
                "elsewhere",
                json!({"action": "CUSTOM"}),
            ),
            policy(
                "EnvoyFilter",
                "bookinfo",
                "bootstrap-patch",
                // Inert under istiod too: no reason to stay.
                json!({"workloadSelector": {"labels": {"app": "reviews"}},
                       "configPatches": [{"applyTo": "BOOTSTRAP", "match": {"context": "SIDECAR_INBOUND"}}]}),
            ),
            // Served over ECDS by the agent.
            policy(
                "EnvoyFilter",
                "bookinfo",
                "extension-config",
                json!({"configPatches": [{"applyTo": "EXTENSION_CONFIG",
                       "patch": {"operation": "ADD", "value": {"name": "x"}}}]}),
            ),
            // Node metadata the agent does not know of its proxy.
            policy(
                "EnvoyFilter",
                "bookinfo",
                "by-workload-name",
                json!({"configPatches": [{"applyTo": "CLUSTER",
                       "match": {"proxy": {"metadata": {"WORKLOAD_NAME": "reviews-v1"}}},
                       "patch": {"operation": "REMOVE"}}]}),
            ),
            // Istio's own extension type: upstream Envoy does not have it.
            policy(
                "EnvoyFilter",
                "bookinfo",
                "istio-stats",
                json!({"configPatches": [{"applyTo": "HTTP_FILTER",
                       "patch": {"operation": "INSERT_BEFORE", "value": {"name": "istio.stats",
                           "typed_config": {"@type": "type.googleapis.com/stats.PluginConfig"}}}}]}),
            ),
            // A TypedStruct is passed on as written; what it configures may be Istio's own.
            policy(
                "EnvoyFilter",
                "bookinfo",
                "istio-peer-metadata",
                json!({"configPatches": [{"applyTo": "HTTP_FILTER",
                       "patch": {"operation": "INSERT_FIRST", "value": {"name": "mx",
                           "typed_config": {"@type": "type.googleapis.com/udpa.type.v1.TypedStruct",
                               "type_url": "type.googleapis.com/io.istio.http.peer_metadata.Config",
                               "value": {}}}}}]}),
            ),
            policy(
                "EnvoyFilter",
                "bookinfo",
                "lua-typed-struct",
                json!({"configPatches": [{"applyTo": "HTTP_FILTER",
                       "patch": {"operation": "INSERT_FIRST", "value": {"name": "lua",
                           "typed_config": {"@type": "type.googleapis.com/xds.type.v3.TypedStruct",
                               "type_url": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                               "value": {"inline_code": "function envoy_on_request(h) end"}}}}}]}),
            ),
            // Applied by the agent.
            policy(
                "EnvoyFilter",
                "bookinfo",
                "lua",
                json!({"workloadSelector": {"labels": {"app": "reviews"}},
                       "configPatches": [{"applyTo": "HTTP_FILTER", "match": {"context": "SIDECAR_INBOUND"},
                           "patch": {"operation": "INSERT_BEFORE", "value": {"name": "envoy.lua",
                               "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua"}}}}]}),
            ),
            policy(
                "EnvoyFilter",
                "istio-system",
                "gateways-only",
                json!({"configPatches": [{"applyTo": "BOOTSTRAP", "match": {"context": "GATEWAY"}}]}),
            ),
            // Access logs to a file: applied by the agent.
            policy(
                "Telemetry",
                "istio-system",
                "mesh-default",
                json!({"accessLogging": [{"providers": [{"name": "envoy"}]}]}),
            ),
            // Tracing to a tracer the agent builds (or to none): applied.
            policy(
                "Telemetry",
                "bookinfo",
                "sampling",
                json!({"tracing": [{"randomSamplingPercentage": 10.0}]}),
            ),
            policy(
                "Telemetry",
                "bookinfo",
                "zipkin",
                json!({"tracing": [{"providers": [{"name": "Zipkin"}]}]}),
            ),
            // Lightstep (deprecated) and metrics: not applied.
            policy(
                "Telemetry",
                "bookinfo",
                "lightstep",
                json!({"tracing": [{"providers": [{"name": "ls"}]}]}),
            ),
            policy(
                "Telemetry",
                "bookinfo",
                "metrics",
                json!({"metrics": [{"providers": [{"name": "prometheus"}]}]}),
            ),
            policy(
                "WasmPlugin",
                "bookinfo",
                "for-ratings",
                json!({"selector": {"matchLabels": {"app": "ratings"}}, "url": "oci://x/y"}),
            ),
            // Lua, a module in the pod's files, and modules fetched (HTTP(S), OCI): applied. A
            // private image is not pulled.
            policy(
                "TrafficExtension",
                "bookinfo",
                "lua",
                json!({"lua": {"inlineCode": "x"}}),
            ),
            policy(
                "WasmPlugin",
                "bookinfo",
                "local-module",
                json!({"url": "file:///opt/plugin.wasm"}),
            ),
            policy(
                "TrafficExtension",
                "bookinfo",
                "http-module",
                json!({"wasm": {"url": "https://example.com/plugin.wasm"}}),
            ),
            policy(
                "TrafficExtension",
                "bookinfo",
                "oci-module",
                json!({"wasm": {"url": "registry.example.com/plugin:1"}}),
            ),
            policy(
                "WasmPlugin",
                "bookinfo",
                "private-image",
                json!({"url": "oci://registry.example.com/private:1", "imagePullSecret": "creds"}),
            ),
            // Its pull secret in the store (of the plugin's namespace): applied.
            policy(
                "WasmPlugin",
                "bookinfo",
                "private-image-with-secret",
                json!({"url": "oci://registry.example.com/private:1", "imagePullSecret": "stored"}),
            ),
            policy(
                "ImagePullSecret",
                "bookinfo",
                "stored",
                json!({"dockerConfigJson": "{\"auths\": {}}"}),
            ),
            // A secret of the same name in another namespace is not the plugin's.
            policy(
                "ImagePullSecret",
                "istio-system",
                "creds",
                json!({"dockerConfigJson": "{\"auths\": {}}"}),
            ),
            // The mesh config defines `ext`: CUSTOM policies delegating to it are enforced.
            // Keys fetched into the store: enforced by the agent.
            policy(
                "RequestAuthentication",
                "bookinfo",
                "fetched-keys",
                json!({"jwtRules": [{"issuer": "b", "jwksUri": "https://b.example.com/keys"}]}),
            ),
            policy(
                "JsonWebKeySet",
                "istio-system",
                &pasa_istio::request_authentication::KeySetSource::Uri(
                    "https://b.example.com/keys".into(),
                )
                .object_name(),
                json!({"jwksUri": "https://b.example.com/keys", "jwks": "{\"keys\":[]}"}),
            ),
            // Keys inline: enforced by the agent.
            policy(
                "RequestAuthentication",
                "bookinfo",
                "inline-keys",
                json!({"jwtRules": [{"issuer": "a", "jwks": "{\"keys\":[]}"}]}),
            ),
            policy(
                "MeshConfig",
                "istio-system",
                "mesh",
                json!({"extensionProviders": [
                    {"name": "ext", "envoyExtAuthzHttp": {"service": "authz.foo.svc.cluster.local", "port": 80}},
                    {"name": "zipkin", "zipkin": {"service": "zipkin.istio-system.svc.cluster.local", "port": 9411}},
                    {"name": "ls", "lightstep": {"service": "ls.foo.svc.cluster.local", "port": 8080}}]}),
            ),
            policy(
                "AuthorizationPolicy",
                "bookinfo",
                "custom-known",
                json!({"action": "CUSTOM", "provider": {"name": "ext"}, "rules": [{}]}),
            ),
        ];
        assert_eq!(
            unenforced_policies(&pod, "bookinfo", "istio-system", &policies),
            [
                "AuthorizationPolicy bookinfo/for-reviews",
                "RequestAuthentication bookinfo/namespace-wide",
                "RequestAuthentication istio-system/mesh-wide",
                "EnvoyFilter bookinfo/by-workload-name",
                "EnvoyFilter bookinfo/istio-stats",
                "EnvoyFilter bookinfo/istio-peer-metadata",
                "Telemetry bookinfo/lightstep",
                "Telemetry bookinfo/metrics",
                "WasmPlugin bookinfo/private-image",
            ]
        );
        assert!(unenforced_policies(&pod, "bookinfo", "istio-system", &policies[1..2]).is_empty());
        // Next to Istio's proxy, metrics are applied (with Istio's own filters).
        let mut next_to_istio = pod.clone();
        next_to_istio["spec"] = json!({"containers": [{"name": "istio-proxy"}, {"name": "app"}]});
        let kept = unenforced_policies(&next_to_istio, "bookinfo", "istio-system", &policies);
        assert!(kept.contains(&"Telemetry bookinfo/lightstep".to_string()));
        assert!(!kept.contains(&"Telemetry bookinfo/metrics".to_string()));
        // A standalone pod is warned that it loses the mesh's default metrics.
        let mesh_defaults = policy(
            "MeshConfig",
            "istio-system",
            "mesh",
            json!({"defaultProviders": {"metrics": ["prometheus"]}}),
        );
        let warned = move_warnings(&pod, "istio-system", std::slice::from_ref(&mesh_defaults));
        assert_eq!(warned.len(), 1);
        assert!(warned[0].contains("istio_requests_total"), "{warned:?}");
        assert!(move_warnings(&next_to_istio, "istio-system", &[mesh_defaults]).is_empty());
        assert!(move_warnings(&pod, "istio-system", &[]).is_empty());
        // ... and so are patches of Istio's own filters.
        assert!(!kept.contains(&"EnvoyFilter bookinfo/istio-stats".to_string()));
        assert!(!kept.contains(&"EnvoyFilter bookinfo/istio-peer-metadata".to_string()));
    }
}
