//! TrafficExtensions, and WasmPlugins read as TrafficExtensions (as istiod reads them), on what
//! the other builders built for Envoy.
//!
//! **Which.** Those of the proxy's config namespace and of the root namespace, without a
//! selector or with one the proxy's labels match (attached by `targetRefs`: waypoints' and
//! Kubernetes gateways', not here), a Wasm one with a module URL, a Lua one with code of at
//! most 64 KiB. Per phase, by `priority` (highest first; unset lowest), ties in the proxy's
//! namespace before the root namespace's, oldest first.
//!
//! **Where.** Each HTTP connection manager (a sidecar's inbound side is SERVER, its outbound
//! side and a router CLIENT, as for Telemetry; `match` may narrow both side and port) gets the
//! HTTP extensions (Wasm `type` unset or `HTTP`, and Lua) in istiod's places: `AUTHN` after the
//! external authorizers of CUSTOM policies and before the JWT filter, `AUTHZ` before the RBAC
//! filters, `STATS` then unset after them, before the connection manager's own filters.
//! Network Wasm extensions go before the connection manager, and in TCP chains before the TCP
//! proxy (`AUTHN` and `AUTHZ` before the network RBAC filters).
//!
//! **How.** A Lua extension is inline. A Wasm one is named by `config_discovery` and served over
//! ECDS (`extensions.istio.io/trafficextension/<namespace>.<name>`), its listeners waiting for
//! it: an HTTP or network Wasm filter whose VM (V8) loads the module, with the plugin's
//! configuration as JSON, its root ID, environment and failure policy. A `file://` module is
//! loaded from the pod's file system; a module elsewhere (`http(s)://`, `oci://`, an image
//! reference) comes from a [`ModuleSource`] (see `crate::wasm`): sent as istiod sends it for the
//! proxy's pilot-agent to fetch, or fetched by the agent (the resource waiting meanwhile). A
//! module that cannot be had makes the filter what pilot-agent sends when a fetch fails, an
//! RBAC filter letting everything through (`FAIL_OPEN`) or nothing (otherwise).

use std::collections::BTreeMap;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{
    AsyncDataSource, DataSource, ExtensionConfigSource, HttpUri, RemoteDataSource,
    TypedExtensionConfig, async_data_source, data_source, http_uri,
};
use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
use envoy_types::pb::envoy::config::rbac::v3::Rbac as RbacRules;
use envoy_types::pb::envoy::extensions::filters::http::lua::v3::Lua;
use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use envoy_types::pb::envoy::extensions::filters::http::wasm::v3::Wasm as HttpWasm;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, http_filter,
};
use envoy_types::pb::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;
use envoy_types::pb::envoy::extensions::filters::network::wasm::v3::Wasm as NetworkWasm;
use envoy_types::pb::envoy::extensions::wasm::v3::{
    EnvironmentVariables, FailurePolicy, PluginConfig, VmConfig, plugin_config,
};
use envoy_types::pb::google::protobuf::{Any, Duration, StringValue};
use envoy_types::util::pack_any;
use pasa_istio::authorization_policy::applies_to_workload;
use pasa_istio::extensions::{ImagePullSecret, TrafficExtension};
use pasa_istio::node::ProxyType;
use prost::{Message, Name};

use super::filters::{HCM, TCP_PROXY};
use super::names;
use super::patched::{self, Type};
use super::telemetry::Side;
use crate::model::proxy::Proxy;
use crate::model::registry::{Config, Registry};
use crate::resource::{Generated, Resource};

/// The prefix of an extension's ECDS resource (and filter) name.
pub const RESOURCE_PREFIX: &str = "extensions.istio.io/trafficextension/";
const RUNTIME: &str = "envoy.wasm.runtime.v8";
/// The VM variable a module's pull secret reaches pilot-agent in (redacted in config dumps).
pub const PULL_SECRET_ENV: &str = "ISTIO_META_WASM_IMAGE_PULL_SECRET";
/// The largest Lua script istiod takes.
const MAX_LUA_BYTES: usize = 64 * 1024;
const HTTP_EXT_AUTHZ: &str = "envoy.filters.http.ext_authz";
const HTTP_JWT: &str = "envoy.filters.http.jwt_authn";
const HTTP_RBAC: &str = "envoy.filters.http.rbac";
const NETWORK_EXT_AUTHZ: &str = "envoy.filters.network.ext_authz";

/// Where an extension's Wasm module is, for the ECDS resource that loads it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ModuleCode {
    /// A file Envoy reads.
    Local(String),
    /// Where istiod says it is: the proxy's pilot-agent fetches it (and sends Envoy the file).
    Remote,
    /// Being fetched: the resource waits (and so do the listeners naming it).
    Pending,
    /// Not to be had (why): the filter fails open or closed, as pilot-agent's does.
    Failed(String),
}

/// Where the Wasm modules of extensions come from when they are not files in the pod.
pub trait ModuleSource: Send + Sync + std::fmt::Debug {
    /// The module at `url` (with scheme), whose SHA-256 is `sha256` when not empty, pulled
    /// with the registry credentials of `secret`.
    fn module(&self, url: &str, sha256: &str, secret: PullSecret<'_>) -> ModuleCode;
}

/// The registry credentials an extension's `imagePullSecret` names (a `kubernetes.io/
/// dockerconfigjson` Secret of the extension's namespace, carried into the store by the syncer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullSecret<'a> {
    /// The extension names none.
    Unnamed,
    /// It names `<namespace>/<name>`, which the store does not hold.
    Missing(&'a str, &'a str),
    Found(&'a ImagePullSecret),
}

impl PullSecret<'_> {
    /// Why a module cannot be pulled with it, if it cannot.
    pub fn missing(&self) -> Option<String> {
        match self {
            PullSecret::Missing(namespace, name) => Some(format!(
                "imagePullSecret {namespace}/{name} is not in the store (it must be a \
                 kubernetes.io/dockerconfigjson Secret of the extension's namespace)"
            )),
            _ => None,
        }
    }
}

/// The phases, in the order of their places in a filter chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Phase {
    Authn,
    Authz,
    Stats,
    Unspecified,
}

impl Phase {
    fn of(name: Option<&str>) -> Phase {
        match name {
            Some("AUTHN") => Phase::Authn,
            Some("AUTHZ") => Phase::Authz,
            Some("STATS") => Phase::Stats,
            _ => Phase::Unspecified,
        }
    }
}

/// One extension that applies to the proxy, ready to insert.
#[derive(Debug, Clone)]
struct Extension<'a> {
    resource_name: String,
    phase: Phase,
    config: &'a Config<TrafficExtension>,
    /// A network (L4) Wasm filter rather than an HTTP one.
    network: bool,
}

impl Extension<'_> {
    fn spec(&self) -> &TrafficExtension {
        &self.config.spec
    }

    /// Whether it runs on `side`'s traffic to `port` (0: unknown, matched only without ports).
    fn matches(&self, side: Side, port: u32) -> bool {
        let selectors: Vec<_> = self.spec().match_.iter().flatten().collect();
        selectors.is_empty()
            || selectors.iter().any(|s| {
                let mode = match s.mode.as_deref() {
                    None | Some("UNDEFINED" | "CLIENT_AND_SERVER") => true,
                    Some("CLIENT") => side == Side::Client,
                    Some("SERVER") => side == Side::Server,
                    Some(_) => false,
                };
                let ports: Vec<u32> = s
                    .ports
                    .iter()
                    .flatten()
                    .map(|p| p.number)
                    .filter(|n| *n != 0)
                    .collect();
                mode && (ports.is_empty() || ports.contains(&port))
            })
    }

    /// The filter a connection manager gets: Lua inline, Wasm by ECDS.
    fn http_filter(&self) -> HttpFilter {
        let config_type = match &self.spec().lua {
            Some(lua) => http_filter::ConfigType::TypedConfig(pack_any(Lua {
                default_source_code: Some(DataSource {
                    specifier: Some(data_source::Specifier::InlineString(
                        lua.inline_code.clone(),
                    )),
                    ..Default::default()
                }),
                ..Default::default()
            })),
            None => http_filter::ConfigType::ConfigDiscovery(discovery(&[
                HttpWasm::type_url(),
                HttpRbac::type_url(),
            ])),
        };
        HttpFilter {
            name: self.resource_name.clone(),
            config_type: Some(config_type),
            ..Default::default()
        }
    }

    fn network_filter(&self) -> Filter {
        Filter {
            name: self.resource_name.clone(),
            config_type: Some(filter::ConfigType::ConfigDiscovery(discovery(&[
                NetworkWasm::type_url(),
                NetworkRbac::type_url(),
            ]))),
        }
    }

    /// Its Wasm module's URL as istiod reads it: `oci://` when it has no scheme.
    fn module_url(&self) -> Option<String> {
        let url = &self.spec().wasm.as_ref()?.url;
        Some(if url.contains("://") {
            url.clone()
        } else {
            format!("oci://{url}")
        })
    }

    /// The registry credentials its module is pulled with.
    fn pull_secret<'r>(&'r self, registry: &'r Registry) -> PullSecret<'r> {
        let Some(name) = self
            .spec()
            .wasm
            .as_ref()
            .map(|w| w.image_pull_secret.as_str())
            .filter(|n| !n.is_empty())
        else {
            return PullSecret::Unnamed;
        };
        let namespace = self.config.meta.namespace.as_str();
        match registry.image_pull_secret(namespace, name) {
            Some(secret) => PullSecret::Found(secret),
            None => PullSecret::Missing(namespace, name),
        }
    }

    /// Where its Wasm module is.
    fn code(
        &self,
        modules: Option<&dyn ModuleSource>,
        secret: PullSecret<'_>,
    ) -> Option<ModuleCode> {
        let wasm = self.spec().wasm.as_ref()?;
        let url = self.module_url()?;
        Some(match url.strip_prefix("file://") {
            Some(path) => ModuleCode::Local(path.to_string()),
            None => match modules {
                Some(m) => m.module(&url, &wasm.sha256, secret),
                None => ModuleCode::Failed(format!("{url}: no module fetcher")),
            },
        })
    }

    /// The ECDS resource of a Wasm extension whose module is at `code` (none while it is
    /// fetched).
    fn extension_config(
        &self,
        code: &ModuleCode,
        secret: PullSecret<'_>,
    ) -> Option<TypedExtensionConfig> {
        let wasm = self.spec().wasm.as_ref()?;
        let namespaced = format!("{}.{}", self.config.meta.namespace, self.config.meta.name);
        let fail_open = wasm.fail_strategy.as_deref() == Some("FAIL_OPEN");
        let source = match code {
            ModuleCode::Pending => return None,
            ModuleCode::Local(path) => Some(AsyncDataSource {
                specifier: Some(async_data_source::Specifier::Local(DataSource {
                    specifier: Some(data_source::Specifier::Filename(path.clone())),
                    ..Default::default()
                })),
            }),
            ModuleCode::Remote => Some(AsyncDataSource {
                specifier: Some(async_data_source::Specifier::Remote(RemoteDataSource {
                    http_uri: Some(HttpUri {
                        uri: self.module_url().unwrap_or_default(),
                        // pilot-agent fetches it: no cluster needed.
                        http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster("_".into())),
                        timeout: Some(Duration {
                            seconds: 30,
                            nanos: 0,
                        }),
                    }),
                    sha256: wasm.sha256.clone(),
                    ..Default::default()
                })),
            }),
            ModuleCode::Failed(e) => {
                ::tracing::warn!(extension = %self.resource_name, "Wasm module not loaded: {e}");
                None
            }
        };
        let typed_config = match source {
            Some(code) => {
                let config = PluginConfig {
                    name: namespaced,
                    root_id: wasm.plugin_name.clone(),
                    configuration: Some(configuration(wasm.plugin_config.as_ref())),
                    failure_policy: match wasm.fail_strategy.as_deref() {
                        Some("FAIL_OPEN") => FailurePolicy::FailOpen,
                        Some("FAIL_CLOSE") => FailurePolicy::FailClosed,
                        Some("FAIL_RELOAD") => FailurePolicy::FailReload,
                        _ => FailurePolicy::Unspecified,
                    } as i32,
                    vm: Some(plugin_config::Vm::VmConfig(VmConfig {
                        runtime: RUNTIME.into(),
                        environment_variables: environment(
                            wasm,
                            self.config.meta.revision,
                            matches!(
                                code.specifier,
                                Some(async_data_source::Specifier::Remote(_))
                            )
                            .then_some(secret),
                        ),
                        code: Some(code),
                        ..Default::default()
                    })),
                    ..Default::default()
                };
                if self.network {
                    pack_any(NetworkWasm {
                        config: Some(config),
                    })
                } else {
                    pack_any(HttpWasm {
                        config: Some(config),
                    })
                }
            }
            None => {
                // pilot-agent's filter for a module it could not fetch.
                let rules = (!fail_open).then(RbacRules::default);
                let prefix = if fail_open {
                    "wasm-default-allow"
                } else {
                    "wasm-default-deny"
                };
                if self.network {
                    pack_any(NetworkRbac {
                        rules,
                        stat_prefix: prefix.into(),
                        ..Default::default()
                    })
                } else {
                    pack_any(HttpRbac {
                        rules,
                        ..Default::default()
                    })
                }
            }
        };
        Some(TypedExtensionConfig {
            name: self.resource_name.clone(),
            typed_config: Some(typed_config),
        })
    }
}

/// A packed ECDS resource fit to show: the pull secret in its VM's environment replaced by
/// `redaction` (as istiod's debug endpoints redact it). Anything else is shown as it is.
pub fn redacted(body: &Any, redaction: &str) -> Any {
    fn vm_env(config: &mut Option<PluginConfig>) -> Option<&mut EnvironmentVariables> {
        match config.as_mut()?.vm.as_mut()? {
            plugin_config::Vm::VmConfig(vm) => vm.environment_variables.as_mut(),
        }
    }
    fn hide<M: Message + Default>(
        any: &mut Any,
        config: impl FnOnce(&mut M) -> &mut Option<PluginConfig>,
        redaction: &str,
    ) {
        let Ok(mut message) = M::decode(any.value.as_slice()) else {
            return;
        };
        if let Some(value) = vm_env(config(&mut message))
            .and_then(|env| env.key_values.get_mut(PULL_SECRET_ENV))
            .filter(|v| !v.is_empty())
        {
            *value = redaction.to_string();
            any.value = message.encode_to_vec();
        }
    }
    let Ok(mut ext) = TypedExtensionConfig::decode(body.value.as_slice()) else {
        return body.clone();
    };
    let Some(typed) = ext.typed_config.as_mut() else {
        return body.clone();
    };
    if typed.type_url == HttpWasm::type_url() {
        hide::<HttpWasm>(typed, |w| &mut w.config, redaction);
    } else if typed.type_url == NetworkWasm::type_url() {
        hide::<NetworkWasm>(typed, |w| &mut w.config, redaction);
    } else {
        return body.clone();
    }
    Any {
        type_url: body.type_url.clone(),
        value: ext.encode_to_vec(),
    }
}

/// Over ADS, the listener waiting for its extensions (they may be what secures it).
fn discovery(type_urls: &[String]) -> ExtensionConfigSource {
    ExtensionConfigSource {
        config_source: Some(super::builders::ads()),
        type_urls: type_urls.to_vec(),
        ..Default::default()
    }
}

/// The plugin's configuration: its JSON as a string value, or an empty `Any` (istiod's).
fn configuration(config: Option<&serde_json::Value>) -> Any {
    match config.filter(|c| c.as_object().is_some_and(|o| !o.is_empty())) {
        Some(c) => pack_any(StringValue {
            value: c.to_string(),
        }),
        None => Any::default(),
    }
}

/// The VM's environment: inline values, and the names of the host's variables it may read;
/// for a module pilot-agent fetches (`for_pilot_agent`: with the pull secret), istiod's hints
/// to it: the resource version, the pull policy, and the pull secret's Docker config (empty
/// when the store has not got it, for pilot-agent to refuse the fetch, as istiod sends it).
/// pilot-agent takes them out before the resource reaches Envoy.
fn environment(
    wasm: &pasa_istio::extensions::WasmConfig,
    revision: u64,
    for_pilot_agent: Option<PullSecret<'_>>,
) -> Option<EnvironmentVariables> {
    let mut out = EnvironmentVariables::default();
    for v in wasm.vm_config.iter().flat_map(|v| v.env.iter().flatten()) {
        match v.value_from.as_deref() {
            Some("HOST") => out.host_env_keys.push(v.name.clone()),
            _ => {
                out.key_values.insert(v.name.clone(), v.value.clone());
            }
        }
    }
    if let Some(secret) = for_pilot_agent {
        out.key_values.insert(
            "ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION".into(),
            revision.to_string(),
        );
        if let Some(policy) = wasm
            .image_pull_policy
            .as_deref()
            .filter(|p| *p != "UNSPECIFIED_POLICY")
        {
            out.key_values
                .insert("ISTIO_META_WASM_IMAGE_PULL_POLICY".into(), policy.into());
        }
        match secret {
            PullSecret::Unnamed => {}
            PullSecret::Missing(..) => {
                out.key_values.insert(PULL_SECRET_ENV.into(), String::new());
            }
            PullSecret::Found(s) => {
                out.key_values
                    .insert(PULL_SECRET_ENV.into(), s.docker_config_json.clone());
            }
        }
    }
    (!out.key_values.is_empty() || !out.host_env_keys.is_empty()).then_some(out)
}

/// The extensions that apply to `proxy`, in istiod's order.
fn applying<'a>(proxy: &Proxy, registry: &'a Registry) -> Vec<Extension<'a>> {
    let root = proxy.mesh.root_namespace.as_str();
    let mut namespaces = vec![proxy.config_namespace.as_str()];
    if proxy.config_namespace != root {
        namespaces.push(root);
    }
    let mut out = Vec::new();
    for ns in namespaces {
        let mut here: Vec<&Config<TrafficExtension>> = registry
            .traffic_extensions()
            .filter(|c| c.meta.namespace == ns)
            .filter(|c| {
                applies_to_workload(
                    &c.meta.namespace,
                    c.spec.selector.as_ref(),
                    &c.spec.target_refs.iter().collect::<Vec<_>>(),
                    root,
                    &proxy.config_namespace,
                    &proxy.labels,
                )
            })
            .filter(|c| usable(c))
            .collect();
        here.sort_by(|a, b| a.meta.age_key().cmp(&b.meta.age_key()));
        out.extend(here.into_iter().map(|config| {
            Extension {
                resource_name: format!(
                    "{RESOURCE_PREFIX}{}.{}",
                    config.meta.namespace, config.meta.name
                ),
                phase: Phase::of(config.spec.phase.as_deref()),
                network: config
                    .spec
                    .wasm
                    .as_ref()
                    .is_some_and(|w| w.type_.as_deref() == Some("NETWORK")),
                config,
            }
        }));
    }
    out.sort_by_key(|e| std::cmp::Reverse(e.spec().priority.unwrap_or(i32::MIN)));
    out
}

/// Whether istiod keeps the extension: a Wasm module URL, or Lua code of allowed size.
fn usable(c: &Config<TrafficExtension>) -> bool {
    match (&c.spec.wasm, &c.spec.lua) {
        (Some(w), _) => !w.url.is_empty(),
        (None, Some(l)) => !l.inline_code.is_empty() && l.inline_code.len() <= MAX_LUA_BYTES,
        (None, None) => false,
    }
}

/// The place of each phase among `names` (an HTTP filter chain): after CUSTOM's authorizers,
/// after the JWT filter, after the RBAC filters.
fn http_places(names: &[&str]) -> [usize; 3] {
    let authn = names
        .iter()
        .rposition(|n| *n == HTTP_EXT_AUTHZ)
        .map_or(0, |i| i + 1);
    let authz = names
        .iter()
        .position(|n| *n == HTTP_JWT)
        .map_or(authn, |i| i + 1)
        .max(authn);
    let stats = (authz..names.len())
        .find(|&i| names[i] != HTTP_RBAC)
        .unwrap_or(names.len());
    [authn, authz, stats]
}

/// Inserts `exts` (in order) into `list` at each phase's place (`places`: AUTHN, AUTHZ, and
/// STATS with unset).
fn insert<T>(list: &mut Vec<T>, places: [usize; 3], exts: Vec<(Phase, T)>) {
    let mut by_place: BTreeMap<usize, Vec<T>> = BTreeMap::new();
    let mut sorted = exts;
    // Stable: within a phase, the given order.
    sorted.sort_by_key(|(p, _)| *p);
    for (phase, item) in sorted {
        let at = match phase {
            Phase::Authn => places[0],
            Phase::Authz => places[1],
            Phase::Stats | Phase::Unspecified => places[2],
        };
        by_place.entry(at).or_default().push(item);
    }
    // From the back, so the earlier places stay where they were.
    for (at, items) in by_place.into_iter().rev() {
        list.splice(at..at, items);
    }
}

/// Puts the extensions that match `side` on `chain`; whether anything changed.
fn put_chain(chain: &mut FilterChain, exts: &[Extension<'_>], side: Side, port: u32) -> bool {
    let here: Vec<&Extension<'_>> = exts.iter().filter(|e| e.matches(side, port)).collect();
    if here.is_empty() {
        return false;
    }
    let network: Vec<(Phase, Filter)> = here
        .iter()
        .filter(|e| e.network)
        .map(|e| (e.phase, e.network_filter()))
        .collect();
    let http: Vec<(Phase, HttpFilter)> = here
        .iter()
        .filter(|e| !e.network)
        .map(|e| (e.phase, e.http_filter()))
        .collect();
    let mut changed = false;
    let Some(last) = chain.filters.last_mut() else {
        return false;
    };
    if last.name == HCM {
        if !http.is_empty()
            && let Some(filter::ConfigType::TypedConfig(any)) = &mut last.config_type
            && let Ok(mut hcm) = HttpConnectionManager::decode(any.value.as_slice())
        {
            let names: Vec<&str> = hcm.http_filters.iter().map(|f| f.name.as_str()).collect();
            let places = http_places(&names);
            insert(&mut hcm.http_filters, places, http);
            any.value = hcm.encode_to_vec();
            changed = true;
        }
        if !network.is_empty() {
            // All before the connection manager, in phase order.
            let at = chain.filters.len() - 1;
            insert(&mut chain.filters, [at; 3], network);
            changed = true;
        }
    } else if last.name == TCP_PROXY && !network.is_empty() {
        let authz = chain
            .filters
            .iter()
            .rposition(|f| f.name == NETWORK_EXT_AUTHZ)
            .map_or(0, |i| i + 1);
        let proxy = chain.filters.len() - 1;
        insert(&mut chain.filters, [0, authz, proxy], network);
        changed = true;
    }
    changed
}

/// What extensions remember across generations.
#[derive(Debug, Default)]
pub(crate) struct Memo {
    changed: patched::Memo,
}

impl Memo {
    /// Puts the extensions that apply to `proxy` on the listeners of `generated`, and their
    /// Wasm filters in its ECDS resources.
    pub(crate) fn apply(
        &mut self,
        proxy: &Proxy,
        registry: &Registry,
        modules: Option<&dyn ModuleSource>,
        generated: &mut Generated,
    ) {
        let exts = applying(proxy, registry);
        if exts.is_empty() {
            self.changed.clear();
            return;
        }
        for e in &exts {
            let secret = e.pull_secret(registry);
            if let Some(code) = e.code(modules, secret)
                && let Some(config) = e.extension_config(&code, secret)
            {
                generated
                    .extension_configs
                    .insert(e.resource_name.clone(), Resource::pack(&config));
            }
        }
        // The listeners change with the extensions, not with their modules.
        let fingerprint = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            for e in &exts {
                e.resource_name.hash(&mut h);
                e.config.meta.revision.hash(&mut h);
                e.spec().priority.hash(&mut h);
            }
            h.finish()
        };
        self.changed.begin(fingerprint);
        let router = proxy.kind == ProxyType::Router;
        self.changed
            .each(Type::Listener, &mut generated.listeners, |_, r| {
                let mut l = Listener::decode(r.body.value.as_slice()).ok()?;
                let side = Side::of_listener(router, &l.name);
                let inbound = side == Side::Server;
                if !router && l.name == names::VIRTUAL_OUTBOUND {
                    // The catch-all: passthrough and blackhole, as istiod builds them.
                    return Some(Arc::clone(r));
                }
                let listener_port = super::builders::listener_port(&l).unwrap_or(0);
                let mut changed = false;
                for chain in l
                    .filter_chains
                    .iter_mut()
                    .chain(l.default_filter_chain.as_mut())
                {
                    if chain.name == names::VIRTUAL_INBOUND_BLACKHOLE {
                        continue;
                    }
                    let port = if inbound {
                        chain
                            .filter_chain_match
                            .as_ref()
                            .and_then(|m| m.destination_port)
                            .map_or(0, |p| p.value)
                    } else {
                        listener_port
                    };
                    changed |= put_chain(chain, &exts, side, port);
                }
                if changed {
                    Some(Resource::pack(&l))
                } else {
                    Some(Arc::clone(r))
                }
            });
    }
}

#[cfg(test)]
mod tests;
