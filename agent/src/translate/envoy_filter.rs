//! EnvoyFilter: the patches of the EnvoyFilters that apply to this proxy, applied to what the
//! other translators built, as istiod applies them.
//!
//! **Which.** The EnvoyFilters of the root namespace and of the proxy's config namespace whose
//! `workloadSelector` the proxy's labels match (no selector: all of that namespace, or of the
//! mesh for the root namespace), ordered as istiod orders them: by `priority`, then the root
//! namespace's first, then the oldest, then by `name.namespace`. A patch whose `match.proxy`
//! does not match (the proxy's Istio version, the string-valued node metadata the agent knows of
//! it) is dropped. EnvoyFilters attached by `targetRefs` apply to Gateway API gateways and
//! waypoints, which PASA does not run: none applies here.
//!
//! **Where.** Listeners, their listener filters, filter chains, network filters and the HTTP
//! filters of each connection manager; route configurations, served by RDS or inline in a
//! connection manager, with their virtual hosts and routes; clusters. The context of each is
//! istiod's: a router's are `GATEWAY`; a sidecar's `virtualInbound` listener (with its inline
//! route configurations) and `inbound|` clusters are `SIDECAR_INBOUND`, the rest
//! `SIDECAR_OUTBOUND`. `EXTENSION_CONFIG` patches that `ADD` are served over ECDS, whatever
//! their context, as istiod serves them. `BOOTSTRAP` patches are validated and not applied,
//! as under istiod (no bootstrap it serves takes them).
//!
//! **How.** Each patch's `value` is read once per EnvoyFilter revision as the Envoy message its
//! `applyTo` names (protobuf JSON, unknown fields ignored and durations also written as Go writes
//! them, `500ms`, as istiod reads it; one that does not
//! read is skipped and logged, as istiod skips it). The Envoy API's descriptors this needs are
//! those of the patched messages and of the `@type`s in the values, and of what they import
//! ([`pasa_envoy_json::pool_for`]): held while an EnvoyFilter applies, dropped when none does,
//! so a proxy no EnvoyFilter applies to never holds any. `MERGE`
//! follows istiod's merge (see [`pasa_envoy_json::merge`]), including its merge of a filter's or
//! transport socket's typed config of the same type. Patched resources are remembered with what
//! they were patched from: a resource the translators did not build again is not patched again
//! while the patches stay the same.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::listener::v3::{
    Filter, FilterChain, Listener, ListenerFilter, filter, listener_filter,
};
use envoy_types::pb::envoy::config::route::v3::{
    Route, RouteConfiguration, VirtualHost, route::Action,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, http_connection_manager::RouteSpecifier, http_filter,
};
use envoy_types::pb::google::protobuf::Any;
use pasa_envoy_json::merge::{self, Lists};
use pasa_istio::authorization_policy::applies_to_workload;
use pasa_istio::destination_rule::WorkloadSelector;
use pasa_istio::envoy_filter::{
    ApplyTo, EnvoyConfigObjectMatch, EnvoyFilter, Operation, PatchContext, RouteAction,
};
use pasa_istio::node::ProxyType;
use prost::{Message, Name};
use prost_reflect::DescriptorPool;
use rustc_hash::FxHashMap;

use super::filters::HCM;
use super::names;
use super::patched::{self, Type};
use crate::model::proxy::{Proxy, ProxyBuild};
use crate::model::registry::{Config, Registry};
use crate::resource::{Generated, Resource};

/// The Istio version the agent reports for its proxy (`ISTIO_VERSION`), matched by
/// `match.proxy.proxyVersion`.
const PROXY_VERSION: &str = crate::model::proxy::ISTIO_VERSION;

/// Proxy versions istiod matches by prefix instead of as a regular expression.
const WELL_KNOWN_VERSIONS: [(&str, &str); 8] = [
    (r"^1\.16.*", "1.16"),
    (r"^1\.17.*", "1.17"),
    (r"^1\.18.*", "1.18"),
    (r"^1\.19.*", "1.19"),
    (r"^1\.20.*", "1.20"),
    (r"^1\.21.*", "1.21"),
    (r"^1\.22.*", "1.22"),
    (r"^1\.23.*", "1.23"),
];

/// istiod does not compile a longer proxy version expression: such a patch matches no proxy.
const MAX_PROXY_VERSION_LEN: usize = 1024;

/// One patch, read.
#[derive(Debug)]
struct Patch {
    /// `namespace/name` of its EnvoyFilter.
    key: String,
    apply_to: ApplyTo,
    operation: Operation,
    matching: EnvoyConfigObjectMatch,
    /// The value, encoded as the message `apply_to` names.
    value: Vec<u8>,
}

impl Patch {
    fn in_context(&self, context: PatchContext) -> bool {
        self.matching.context == context || self.matching.context == PatchContext::Any
    }

    fn merges(&self) -> bool {
        matches!(
            self.operation,
            Operation::Merge | Operation::MergeAndReplaceList
        )
    }

    fn lists(&self) -> Lists {
        if self.operation == Operation::MergeAndReplaceList {
            Lists::Replace
        } else {
            Lists::Append
        }
    }

    fn value<M: Message + Default>(&self) -> M {
        M::decode(self.value.as_slice()).unwrap_or_default()
    }

    /// The value merged into `target` (left as it is when the merge fails).
    fn merge_into<M: Message + Name + Default>(&self, pool: &DescriptorPool, target: &mut M) {
        match merge::merge(
            pool,
            &M::full_name(),
            &target.encode_to_vec(),
            &self.value,
            self.lists(),
        ) {
            Ok(bytes) => match M::decode(bytes.as_slice()) {
                Ok(merged) => *target = merged,
                Err(e) => {
                    tracing::warn!(envoy_filter = %self.key, "merged value does not decode: {e}")
                }
            },
            Err(e) => tracing::warn!(envoy_filter = %self.key, "merge failed: {e}"),
        }
    }

    /// Whether this `ADD` patch adds a listener or cluster in `context`: one without a context
    /// adds only outbound and on gateways.
    fn adds_in(&self, context: PatchContext) -> bool {
        self.operation == Operation::Add
            && self.in_context(context)
            && !(self.matching.context == PatchContext::Any
                && context == PatchContext::SidecarInbound)
    }
}

/// The Envoy message a patch of `apply_to` holds.
fn message_of(apply_to: ApplyTo) -> Option<String> {
    Some(match apply_to {
        ApplyTo::Listener => Listener::full_name(),
        ApplyTo::ListenerFilter => ListenerFilter::full_name(),
        ApplyTo::FilterChain => FilterChain::full_name(),
        ApplyTo::NetworkFilter => Filter::full_name(),
        ApplyTo::HttpFilter => HttpFilter::full_name(),
        ApplyTo::RouteConfiguration => RouteConfiguration::full_name(),
        ApplyTo::VirtualHost => VirtualHost::full_name(),
        ApplyTo::HttpRoute => Route::full_name(),
        ApplyTo::Cluster => Cluster::full_name(),
        ApplyTo::ExtensionConfig => {
            envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig::full_name()
        }
        // Not applied by the agent (see the module's notes).
        ApplyTo::Bootstrap | ApplyTo::Invalid | ApplyTo::Unknown(_) => {
            return None;
        }
    })
}

/// The patches of one EnvoyFilter revision, read (those whose value did not read are left out).
#[derive(Debug)]
struct Read {
    revision: u64,
    patches: Vec<Arc<Patch>>,
}

/// The Envoy messages reading `filter` needs: those its patches' `applyTo` name, and the
/// `@type`s in their values.
fn types_of(filter: &Config<EnvoyFilter>, out: &mut BTreeSet<String>) {
    for cp in filter.spec.config_patches.iter().flatten() {
        if let Some(message) = message_of(cp.apply_to) {
            out.insert(message);
        }
        if let Some(value) = cp.patch.as_ref().and_then(|p| p.value.as_ref()) {
            for v in value.values() {
                out.extend(
                    pasa_envoy_json::type_names(v)
                        .into_iter()
                        .map(str::to_string),
                );
            }
        }
    }
}

/// The patches of `filter` (whose `namespace/name` is `key`), read with `pool`; for upstream
/// Envoy (`build`), without those naming Istio's proxy's own types (Envoy would refuse them).
fn read(key: &str, filter: &Config<EnvoyFilter>, pool: &DescriptorPool, build: ProxyBuild) -> Read {
    let mut patches = Vec::new();
    for (i, cp) in filter.spec.config_patches.iter().enumerate() {
        let Some(cp) = cp else { continue };
        let Some(patch) = &cp.patch else { continue };
        let Some(message) = message_of(cp.apply_to) else {
            continue;
        };
        let value = match &patch.value {
            Some(v) => {
                let what = format!("EnvoyFilter {key} configPatches[{i}].patch.value");
                let istio_only = v
                    .values()
                    .flat_map(|v| {
                        let mut names = pasa_envoy_json::type_names(v);
                        names.extend(pasa_envoy_json::typed_struct_type_names(v));
                        names
                    })
                    .find(|t| pasa_proto::istio_proxy::defines(t));
                if let (Some(t), ProxyBuild::Envoy) = (istio_only, build) {
                    tracing::warn!(
                        envoy_filter = %key,
                        "patch skipped: {what} names {t}, a type of Istio's proxy, which upstream \
                         Envoy does not have"
                    );
                    continue;
                }
                match pasa_envoy_json::encode(
                    pool,
                    &what,
                    &message,
                    &serde_json::Value::Object(v.clone()),
                ) {
                    Ok(bytes) => bytes,
                    Err(e) => {
                        tracing::warn!(envoy_filter = %key, "patch skipped: {e}");
                        continue;
                    }
                }
            }
            None => Vec::new(),
        };
        let mut operation = patch.operation;
        let positional = matches!(
            cp.apply_to,
            ApplyTo::HttpFilter
                | ApplyTo::NetworkFilter
                | ApplyTo::HttpRoute
                | ApplyTo::ListenerFilter
        );
        if !positional
            && matches!(
                operation,
                Operation::InsertAfter | Operation::InsertBefore | Operation::InsertFirst
            )
        {
            operation = Operation::Add;
        }
        patches.push(Arc::new(Patch {
            key: key.to_string(),
            apply_to: cp.apply_to,
            operation,
            matching: cp.match_.clone().unwrap_or_default(),
            value,
        }));
    }
    Read {
        revision: filter.meta.revision,
        patches,
    }
}

/// Whether the patch's `match.proxy` matches this proxy.
fn proxy_matches(proxy: &Proxy, matching: &EnvoyConfigObjectMatch) -> bool {
    let Some(wanted) = &matching.proxy else {
        return true;
    };
    let version = wanted.proxy_version.as_str();
    if !version.is_empty() {
        if let Some((_, prefix)) = WELL_KNOWN_VERSIONS.iter().find(|(re, _)| *re == version) {
            if !PROXY_VERSION.starts_with(prefix) {
                return false;
            }
        } else if version.len() > MAX_PROXY_VERSION_LEN {
            return false;
        } else if let Ok(re) = regex::Regex::new(version)
            && !re.is_match(PROXY_VERSION)
        {
            return false;
        }
    }
    wanted
        .metadata
        .iter()
        // A key the node does not carry reads as empty, as istiod reads it.
        .all(|(k, v)| node_metadata(proxy, k).unwrap_or_default() == *v)
}

/// The string-valued node metadata the agent knows of its proxy (what its bootstrap writes), of
/// the keys [`pasa_istio::envoy_filter::AGENT_KNOWN_METADATA`] lists (the injector keeps
/// pods that patches match on other keys with istiod).
fn node_metadata(proxy: &Proxy, key: &str) -> Option<String> {
    Some(match key {
        "ISTIO_VERSION" => PROXY_VERSION.to_string(),
        "NAMESPACE" => proxy.namespace.clone(),
        "CLUSTER_ID" => proxy.cluster_id.clone(),
        "NETWORK" if !proxy.network.is_empty() => proxy.network.clone(),
        "INTERCEPTION_MODE" => "REDIRECT".to_string(),
        "INSTANCE_IPS" => proxy.ips.first()?.to_string(),
        _ => return None,
    })
}

/// The patches that apply to a proxy, in istiod's order, by what they apply to.
#[derive(Debug, Default)]
pub(crate) struct Patches {
    by_kind: FxHashMap<ApplyTo, Vec<Arc<Patch>>>,
    /// The descriptors of the messages they patch and hold.
    pool: Option<DescriptorPool>,
    /// Changes whenever the patches do.
    fingerprint: u64,
}

impl Patches {
    fn of(&self, apply_to: ApplyTo) -> &[Arc<Patch>] {
        self.by_kind
            .get(&apply_to)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    fn is_empty(&self) -> bool {
        self.by_kind.is_empty()
    }
}

/// The EnvoyFilters that apply to `proxy`, in istiod's order.
fn applying<'a>(proxy: &Proxy, registry: &'a Registry) -> Vec<&'a Arc<Config<EnvoyFilter>>> {
    let root = proxy.mesh.root_namespace.as_str();
    let mut filters: Vec<&Arc<Config<EnvoyFilter>>> = registry
        .envoy_filters()
        .filter(|f| {
            let selector = f.spec.workload_selector.as_ref().map(|s| WorkloadSelector {
                match_labels: s.labels.clone(),
            });
            applies_to_workload(
                &f.meta.namespace,
                selector.as_ref(),
                &f.spec.target_refs.iter().collect::<Vec<_>>(),
                root,
                &proxy.config_namespace,
                &proxy.labels,
            )
        })
        .collect();
    filters.sort_by(|a, b| {
        a.spec
            .priority
            .cmp(&b.spec.priority)
            .then_with(|| (b.meta.namespace == root).cmp(&(a.meta.namespace == root)))
            .then_with(|| a.meta.created.cmp(&b.meta.created))
            // istiod compares `name.namespace` as one string.
            .then_with(|| {
                format!("{}.{}", a.meta.name, a.meta.namespace)
                    .cmp(&format!("{}.{}", b.meta.name, b.meta.namespace))
            })
    });
    filters
}

/// What patching remembers across generations.
#[derive(Debug, Default)]
pub(crate) struct Memo {
    /// Read patches, by EnvoyFilter `namespace/name`.
    read: FxHashMap<String, Read>,
    /// The descriptors reading and merging them needs (of `types`), while any applies.
    pool: Option<DescriptorPool>,
    types: BTreeSet<String>,
    /// Patched resources.
    patched: patched::Memo,
}

impl Memo {
    /// The patches that apply to `proxy` now.
    fn patches(&mut self, proxy: &Proxy, registry: &Registry) -> Patches {
        let filters = applying(proxy, registry);
        if filters.is_empty() {
            // Nothing applies: nothing is kept, the descriptors included.
            *self = Memo::default();
            return Patches::default();
        }
        // Each with its key, `namespace/name`.
        let filters: Vec<(String, &Arc<Config<EnvoyFilter>>)> = filters
            .into_iter()
            .map(|f| (format!("{}/{}", f.meta.namespace, f.meta.name), f))
            .collect();
        let stale: Vec<&(String, &Arc<Config<EnvoyFilter>>)> = filters
            .iter()
            .filter(|(key, f)| {
                self.read
                    .get(key)
                    .is_none_or(|r| r.revision != f.meta.revision)
            })
            .collect();
        let mut wanted = self.types.clone();
        for (_, f) in &stale {
            types_of(f, &mut wanted);
        }
        if wanted != self.types || self.pool.is_none() {
            match pasa_envoy_json::pool_for(wanted.iter().map(String::as_str)) {
                Ok(pool) => {
                    self.pool = Some(pool);
                    self.types = wanted;
                }
                Err(e) => {
                    tracing::warn!("EnvoyFilters not applied: {e}");
                    return Patches::default();
                }
            }
        }
        let Some(pool) = self.pool.clone() else {
            return Patches::default();
        };
        for (key, f) in stale {
            self.read
                .insert(key.clone(), read(key, f, &pool, proxy.build));
        }
        let mut out = Patches {
            pool: Some(pool),
            ..Default::default()
        };
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for (key, f) in &filters {
            key.hash(&mut h);
            f.meta.revision.hash(&mut h);
            for p in &self.read[key].patches {
                if proxy_matches(proxy, &p.matching) {
                    out.by_kind
                        .entry(p.apply_to)
                        .or_default()
                        .push(Arc::clone(p));
                }
            }
        }
        let applying: rustc_hash::FxHashSet<&String> = filters.iter().map(|(k, _)| k).collect();
        self.read.retain(|k, _| applying.contains(k));
        out.fingerprint = h.finish();
        out
    }

    /// Applies the EnvoyFilters that apply to `proxy` to `generated`.
    pub(crate) fn apply(&mut self, proxy: &Proxy, registry: &Registry, generated: &mut Generated) {
        let patches = self.patches(proxy, registry);
        self.patched.begin(patches.fingerprint);
        if patches.is_empty() {
            self.patched.clear();
            return;
        }
        let router = proxy.kind == ProxyType::Router;
        let Some(pool) = &patches.pool else { return };
        let patcher = Patcher {
            patches: &patches,
            router,
            pool,
            targets: Targets {
                proxy,
                registry,
                by_port: std::cell::OnceCell::new(),
            },
        };
        self.patched
            .each(Type::Listener, &mut generated.listeners, |_, r| {
                patcher.listener_resource(r)
            });
        self.patched
            .each(Type::Route, &mut generated.routes, |_, r| {
                let mut rc = RouteConfiguration::decode(r.body.value.as_slice()).ok()?;
                let context = if router {
                    PatchContext::Gateway
                } else {
                    PatchContext::SidecarOutbound
                };
                patcher.route_configuration(context, &mut rc);
                Some(Resource::pack(&rc))
            });
        self.patched
            .each(Type::Cluster, &mut generated.clusters, |_, r| {
                let mut c = Cluster::decode(r.body.value.as_slice()).ok()?;
                patcher.cluster(&mut c).then(|| Resource::pack(&c))
            });
        // What ADD patches add.
        let contexts: &[PatchContext] = if router {
            &[PatchContext::Gateway]
        } else {
            &[PatchContext::SidecarOutbound, PatchContext::SidecarInbound]
        };
        for p in patches.of(ApplyTo::Listener) {
            if contexts.iter().any(|c| p.adds_in(*c)) {
                let l: Listener = p.value();
                if !l.name.is_empty() {
                    generated
                        .listeners
                        .insert(l.name.clone(), Resource::pack(&l));
                }
            }
        }
        for p in patches.of(ApplyTo::Cluster) {
            if contexts.iter().any(|c| p.adds_in(*c)) {
                let c: Cluster = p.value();
                generated
                    .clusters
                    .insert(c.name.clone(), Resource::pack(&c));
            }
        }
        // ECDS resources, whatever the patch's context (as istiod serves them): Envoy asks for
        // those its filters name by `config_discovery`.
        for p in patches.of(ApplyTo::ExtensionConfig) {
            if p.operation == Operation::Add {
                let ec: envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig = p.value();
                if !ec.name.is_empty() {
                    generated
                        .extension_configs
                        .insert(ec.name.clone(), Resource::pack(&ec));
                }
            }
        }
    }
}

/// Applies patches to decoded resources.
struct Patcher<'a> {
    patches: &'a Patches,
    router: bool,
    pool: &'a DescriptorPool,
    targets: Targets<'a>,
}

/// The ports of services the proxy is an endpoint of, by the port it receives them on: for a
/// router, the service ports a listener port serves (istiod's gateway port map, for route
/// configuration matches by port); for a sidecar, the services an inbound port serves (for
/// cluster matches by service). Worked out only when a patch asks.
struct Targets<'a> {
    proxy: &'a Proxy,
    registry: &'a Registry,
    by_port: std::cell::OnceCell<BTreeMap<u32, Vec<crate::model::gateway::ServiceTarget>>>,
}

impl Targets<'_> {
    fn on(&self, port: u32) -> &[crate::model::gateway::ServiceTarget] {
        self.by_port
            .get_or_init(|| {
                let mut out: BTreeMap<u32, Vec<_>> = BTreeMap::new();
                for t in crate::model::gateway::service_targets(self.proxy, self.registry) {
                    out.entry(t.target_port).or_default().push(t);
                }
                out
            })
            .get(&port)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }
}

impl Patcher<'_> {
    fn listener_context(&self, listener: &Listener) -> PatchContext {
        if self.router {
            PatchContext::Gateway
        } else if listener.name == names::VIRTUAL_INBOUND {
            PatchContext::SidecarInbound
        } else {
            PatchContext::SidecarOutbound
        }
    }

    /// A listener resource patched (`None`: removed).
    fn listener_resource(&self, r: &Resource) -> Option<Arc<Resource>> {
        let mut l = Listener::decode(r.body.value.as_slice()).ok()?;
        let context = self.listener_context(&l);
        self.listener(context, &mut l).then(|| Resource::pack(&l))
    }

    /// Patches `l`; false when a patch removed it.
    fn listener(&self, context: PatchContext, l: &mut Listener) -> bool {
        for p in self.patches.of(ApplyTo::Listener) {
            if !p.in_context(context) || !listener_matches(l, p) {
                continue;
            }
            if p.operation == Operation::Remove {
                return false;
            }
            if p.merges() {
                p.merge_into(self.pool, l);
            }
        }
        self.listener_filters(context, l);
        self.filter_chains(context, l);
        true
    }

    fn listener_filters(&self, context: PatchContext, l: &mut Listener) {
        for p in self.patches.of(ApplyTo::ListenerFilter) {
            if !p.in_context(context) || !listener_matches(l, p) {
                continue;
            }
            let name = p
                .matching
                .listener()
                .map(|m| m.listener_filter.as_str())
                .unwrap_or_default();
            let selects = |f: &ListenerFilter| name.is_empty() || f.name == name;
            if p.operation == Operation::Merge {
                if name.is_empty() {
                    continue;
                }
                let patch: ListenerFilter = p.value();
                for f in l.listener_filters.iter_mut().filter(|f| selects(f)) {
                    let Some(listener_filter::ConfigType::TypedConfig(typed)) = &f.config_type
                    else {
                        continue;
                    };
                    if let Some(listener_filter::ConfigType::TypedConfig(extra)) =
                        &patch.config_type
                        && let Ok(merged) = merge::merge_any(self.pool, typed, extra)
                    {
                        f.config_type = Some(listener_filter::ConfigType::TypedConfig(merged));
                    }
                }
                continue;
            }
            ordered(
                &mut l.listener_filters,
                p.operation,
                !name.is_empty(),
                || p.value(),
                selects,
            );
        }
    }

    fn filter_chains(&self, context: PatchContext, l: &mut Listener) {
        let mut chains = std::mem::take(&mut l.filter_chains);
        for fc in &mut chains {
            if !fc.filters.is_empty() {
                self.filter_chain(context, l, fc);
            }
        }
        if let Some(mut fc) = l.default_filter_chain.take()
            && !fc.filters.is_empty()
        {
            self.filter_chain(context, l, &mut fc);
            if !fc.filters.is_empty() {
                l.default_filter_chain = Some(fc);
            }
        }
        for p in self.patches.of(ApplyTo::FilterChain) {
            if p.operation == Operation::Add && p.in_context(context) && listener_matches(l, p) {
                chains.push(p.value());
            }
        }
        chains.retain(|fc| !fc.filters.is_empty());
        l.filter_chains = chains;
    }

    /// Patches a filter chain of `l`; a removed one is left without filters.
    fn filter_chain(&self, context: PatchContext, l: &Listener, fc: &mut FilterChain) {
        for p in self.patches.of(ApplyTo::FilterChain) {
            if !p.in_context(context) || !listener_matches(l, p) || !chain_matches(l, fc, p) {
                continue;
            }
            if p.operation == Operation::Remove {
                fc.filters.clear();
                return;
            }
            if p.merges() {
                let patch: FilterChain = p.value();
                match (&patch.transport_socket, &mut fc.transport_socket) {
                    (Some(theirs), Some(ours)) if theirs.name == ours.name => {
                        merge_typed_socket(self.pool, ours, theirs);
                    }
                    // Another socket: the value is merged whole (its socket replaces ours).
                    _ => p.merge_into(self.pool, fc),
                }
            }
        }
        self.network_filters(context, l, fc);
    }

    fn network_filters(&self, context: PatchContext, l: &Listener, fc: &mut FilterChain) {
        for p in self.patches.of(ApplyTo::NetworkFilter) {
            if !p.in_context(context) || !listener_matches(l, p) || !chain_matches(l, fc, p) {
                continue;
            }
            let name = filter_name(p).unwrap_or_default();
            if p.operation != Operation::Merge {
                ordered(
                    &mut fc.filters,
                    p.operation,
                    filter_name(p).is_some(),
                    || p.value(),
                    |f| f.name == name,
                );
            }
        }
        let mut filters = std::mem::take(&mut fc.filters);
        for f in &mut filters {
            self.network_filter(context, l, fc, f);
        }
        fc.filters = filters;
    }

    fn network_filter(
        &self,
        context: PatchContext,
        l: &Listener,
        fc: &FilterChain,
        f: &mut Filter,
    ) {
        for p in self.patches.of(ApplyTo::NetworkFilter) {
            if p.operation != Operation::Merge
                || !p.in_context(context)
                || !listener_matches(l, p)
                || !chain_matches(l, fc, p)
                || filter_name(p).is_some_and(|n| n != f.name)
            {
                continue;
            }
            let Some(filter::ConfigType::TypedConfig(typed)) = &f.config_type else {
                continue;
            };
            let patch: Filter = p.value();
            let merged = match &patch.config_type {
                Some(filter::ConfigType::TypedConfig(extra)) => {
                    merge::merge_any(self.pool, typed, extra).ok()
                }
                _ => None,
            };
            if !patch.name.is_empty() {
                f.name = patch.name;
            }
            if let Some(merged) = merged {
                f.config_type = Some(filter::ConfigType::TypedConfig(merged));
            }
        }
        if f.name == HCM {
            self.connection_manager(context, l, fc, f);
        }
    }

    /// The HTTP filters of a connection manager, and its inline route configuration.
    fn connection_manager(
        &self,
        context: PatchContext,
        l: &Listener,
        fc: &FilterChain,
        f: &mut Filter,
    ) {
        let Some(filter::ConfigType::TypedConfig(typed)) = &f.config_type else {
            return;
        };
        let Ok(mut hcm) = HttpConnectionManager::decode(typed.value.as_slice()) else {
            return;
        };
        let selects_hcm = |p: &Patch| {
            p.in_context(context)
                && listener_matches(l, p)
                && chain_matches(l, fc, p)
                && filter_name(p).is_none_or(|n| n == f.name)
        };
        for p in self.patches.of(ApplyTo::HttpFilter) {
            if !selects_hcm(p) || p.operation == Operation::Merge {
                continue;
            }
            let name = sub_filter_name(p).unwrap_or_default();
            ordered(
                &mut hcm.http_filters,
                p.operation,
                sub_filter_name(p).is_some(),
                || p.value(),
                |h| h.name == name,
            );
        }
        for h in &mut hcm.http_filters {
            for p in self.patches.of(ApplyTo::HttpFilter) {
                if p.operation != Operation::Merge
                    || !selects_hcm(p)
                    || sub_filter_name(p).is_some_and(|n| n != h.name)
                {
                    continue;
                }
                let Some(http_filter::ConfigType::TypedConfig(typed)) = &h.config_type else {
                    continue;
                };
                let patch: HttpFilter = p.value();
                let merged = match &patch.config_type {
                    Some(http_filter::ConfigType::TypedConfig(extra)) => {
                        merge::merge_any(self.pool, typed, extra).ok()
                    }
                    _ => None,
                };
                if !patch.name.is_empty() {
                    h.name = patch.name;
                }
                if let Some(merged) = merged {
                    h.config_type = Some(http_filter::ConfigType::TypedConfig(merged));
                }
            }
        }
        if let Some(RouteSpecifier::RouteConfig(rc)) = &mut hcm.route_specifier {
            self.route_configuration(context, rc);
        }
        f.config_type = Some(filter::ConfigType::TypedConfig(Any {
            type_url: typed.type_url.clone(),
            value: hcm.encode_to_vec(),
        }));
    }

    fn route_configuration(&self, context: PatchContext, rc: &mut RouteConfiguration) {
        for p in self.patches.of(ApplyTo::RouteConfiguration) {
            if p.merges()
                && p.in_context(context)
                && route_configuration_matches(context, &rc.name, p, &self.targets)
            {
                p.merge_into(self.pool, rc);
            }
        }
        let name = rc.name.clone();
        let selects_rc = |p: &Patch| {
            p.in_context(context) && route_configuration_matches(context, &name, p, &self.targets)
        };
        let mut hosts = std::mem::take(&mut rc.virtual_hosts);
        let mut removed = vec![false; hosts.len()];
        for (i, vh) in hosts.iter_mut().enumerate() {
            for p in self.patches.of(ApplyTo::VirtualHost) {
                if !selects_rc(p) || !virtual_host_matches(vh, p) {
                    continue;
                }
                match p.operation {
                    Operation::Remove => {
                        removed[i] = true;
                        break;
                    }
                    Operation::Replace => *vh = p.value(),
                    _ if p.merges() => p.merge_into(self.pool, vh),
                    _ => {}
                }
            }
            if !removed[i] {
                self.routes(vh, &selects_rc);
            }
        }
        let mut kept: Vec<VirtualHost> = hosts
            .into_iter()
            .zip(removed)
            .filter(|(_, r)| !r)
            .map(|(vh, _)| vh)
            .collect();
        for p in self.patches.of(ApplyTo::VirtualHost) {
            if p.operation == Operation::Add && selects_rc(p) {
                kept.push(p.value());
            }
        }
        rc.virtual_hosts = kept;
    }

    fn routes(&self, vh: &mut VirtualHost, selects_rc: &dyn Fn(&Patch) -> bool) {
        let selects = |p: &Patch| selects_rc(p) && virtual_host_matches(vh, p);
        let patches: Vec<&Arc<Patch>> = self
            .patches
            .of(ApplyTo::HttpRoute)
            .iter()
            .filter(|p| selects(p))
            .collect();
        if patches.is_empty() {
            return;
        }
        // Each route, with the patches that select it.
        let mut routes: Vec<Option<Route>> = std::mem::take(&mut vh.routes)
            .into_iter()
            .map(Some)
            .collect();
        for slot in &mut routes {
            for p in &patches {
                let Some(r) = slot.as_mut() else { break };
                if !route_matches(r, p) {
                    continue;
                }
                if p.operation == Operation::Remove {
                    *slot = None;
                } else if p.merges() {
                    p.merge_into(self.pool, r);
                }
            }
        }
        let mut routes: Vec<Route> = routes.into_iter().flatten().collect();
        for p in &patches {
            let named = route_match(p).is_some();
            match p.operation {
                Operation::Add => routes.push(p.value()),
                Operation::InsertFirst if !named || routes.iter().any(|r| route_matches(r, p)) => {
                    routes.insert(0, p.value());
                }
                Operation::InsertBefore | Operation::InsertAfter => {
                    ordered(
                        &mut routes,
                        p.operation,
                        named,
                        || p.value(),
                        |r| route_matches(r, p),
                    );
                }
                _ => {}
            }
        }
        vh.routes = routes;
    }

    /// Patches a cluster; false when a patch removed it.
    fn cluster(&self, c: &mut Cluster) -> bool {
        let context = if self.router {
            PatchContext::Gateway
        } else if c.name.starts_with("inbound|") || c.name == names::INBOUND_PASSTHROUGH_CLUSTER {
            PatchContext::SidecarInbound
        } else {
            PatchContext::SidecarOutbound
        };
        for p in self.patches.of(ApplyTo::Cluster) {
            if !p.in_context(context) || !cluster_matches(c, p, &self.targets) {
                continue;
            }
            if p.operation == Operation::Remove {
                return false;
            }
            if !p.merges() {
                continue;
            }
            let patch: Cluster = p.value();
            let Some(theirs) = &patch.transport_socket else {
                p.merge_into(self.pool, c);
                continue;
            };
            if !c.transport_socket_matches.is_empty() {
                // A deep merge needs a socket of that name; without one the patch is dropped
                // (a cluster cannot have both a socket and socket matches).
                if let Some(ours) = c
                    .transport_socket_matches
                    .iter_mut()
                    .filter_map(|m| m.transport_socket.as_mut())
                    .find(|s| s.name == theirs.name)
                {
                    merge_typed_socket(self.pool, ours, theirs);
                }
            } else {
                match &mut c.transport_socket {
                    Some(ours) if ours.name == theirs.name => {
                        merge_typed_socket(self.pool, ours, theirs)
                    }
                    _ => c.transport_socket = patch.transport_socket.clone(),
                }
            }
        }
        true
    }
}

/// Merges the typed config of a transport socket patch into a socket of the same name.
fn merge_typed_socket(
    pool: &DescriptorPool,
    ours: &mut envoy_types::pb::envoy::config::core::v3::TransportSocket,
    theirs: &envoy_types::pb::envoy::config::core::v3::TransportSocket,
) {
    use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType;
    if let (Some(ConfigType::TypedConfig(a)), Some(ConfigType::TypedConfig(b))) =
        (&ours.config_type, &theirs.config_type)
        && let Ok(merged) = merge::merge_any(pool, a, b)
    {
        ours.config_type = Some(ConfigType::TypedConfig(merged));
    }
}

/// Applies an ordered operation (`ADD`, `INSERT_FIRST`, `INSERT_BEFORE`, `INSERT_AFTER`,
/// `REPLACE`, `REMOVE`) to a list of filters or routes: `named` says the patch names the item it
/// is relative to, which `selects` finds. Without one, `INSERT_BEFORE` inserts first and
/// `INSERT_AFTER` last, and `REPLACE` and `REMOVE` do nothing.
fn ordered<T>(
    items: &mut Vec<T>,
    operation: Operation,
    named: bool,
    value: impl Fn() -> T,
    selects: impl Fn(&T) -> bool,
) {
    let first = || items.iter().position(&selects);
    match operation {
        Operation::Add => items.push(value()),
        Operation::InsertFirst => items.insert(0, value()),
        Operation::InsertBefore if !named => items.insert(0, value()),
        Operation::InsertAfter if !named => items.push(value()),
        Operation::InsertBefore => {
            if let Some(i) = first() {
                items.insert(i, value());
            }
        }
        Operation::InsertAfter => {
            if let Some(i) = first() {
                items.insert(i + 1, value());
            }
        }
        Operation::Replace if named => {
            if let Some(i) = first() {
                items[i] = value();
            }
        }
        Operation::Remove if named => items.retain(|i| !selects(i)),
        _ => {}
    }
}

fn filter_name(p: &Patch) -> Option<&str> {
    p.matching
        .listener()?
        .filter_chain
        .as_ref()?
        .filter
        .as_ref()
        .map(|f| f.name.as_str())
}

fn sub_filter_name(p: &Patch) -> Option<&str> {
    p.matching
        .listener()?
        .filter_chain
        .as_ref()?
        .filter
        .as_ref()?
        .sub_filter
        .as_ref()
        .map(|s| s.name.as_str())
}

fn is_virtual(l: &Listener) -> bool {
    l.name == names::VIRTUAL_INBOUND || l.name == names::VIRTUAL_OUTBOUND
}

fn listener_matches(l: &Listener, p: &Patch) -> bool {
    let Some(m) = p.matching.listener() else {
        return true;
    };
    if !m.name.is_empty() && m.name != l.name {
        return false;
    }
    // A virtual listener's ports are its filter chains' (see `chain_matches`).
    if p.apply_to != ApplyTo::Listener && is_virtual(l) {
        return true;
    }
    m.port_number == 0 || super::builders::listener_port(l) == Some(m.port_number)
}

fn chain_matches(l: &Listener, fc: &FilterChain, p: &Patch) -> bool {
    let Some(m) = p.matching.listener() else {
        return true;
    };
    let fcm = fc.filter_chain_match.as_ref();
    let destination_port = fcm.and_then(|f| f.destination_port.map(|p| p.value));
    if is_virtual(l) && m.port_number > 0 && destination_port != Some(m.port_number) {
        return false;
    }
    let Some(want) = &m.filter_chain else {
        return true;
    };
    if !want.name.is_empty() && want.name != fc.name {
        return false;
    }
    if !want.sni.is_empty() && !fcm.is_some_and(|f| f.server_names.contains(&want.sni)) {
        return false;
    }
    if !want.transport_protocol.is_empty()
        && fcm.is_none_or(|f| f.transport_protocol != want.transport_protocol)
    {
        return false;
    }
    if !want.application_protocols.is_empty() {
        let Some(f) = fcm else { return false };
        if !want
            .application_protocols
            .split(',')
            .all(|p| f.application_protocols.iter().any(|a| a == p))
        {
            return false;
        }
    }
    if !want.transport_socket.is_empty()
        && fc.transport_socket.as_ref().map(|t| t.name.as_str()) != Some(&want.transport_socket)
    {
        return false;
    }
    want.destination_port == 0 || destination_port == Some(want.destination_port)
}

/// A route configuration's port, from its name as istiod names it: `<port>` outbound,
/// `inbound|<port>||` inbound.
fn route_port(name: &str) -> u32 {
    if name.starts_with("inbound|") {
        return names::read_cluster(name).0;
    }
    name.parse().unwrap_or(0)
}

/// Whether the route configuration `name` is one `p` selects; on a gateway, a port matches the
/// route's listener port or a service port served on it.
fn route_configuration_matches(
    context: PatchContext,
    name: &str,
    p: &Patch,
    targets: &Targets<'_>,
) -> bool {
    let Some(m) = p.matching.route_configuration() else {
        return true;
    };
    if !m.name.is_empty() && m.name != name {
        return false;
    }
    if context != PatchContext::Gateway {
        return m.port_number == 0 || m.port_number == route_port(name);
    }
    let (port, port_name, gateway) = crate::model::gateway::read_route_name(name);
    (m.port_name.is_empty() || m.port_name == port_name)
        && (m.gateway.is_empty() || m.gateway == gateway)
        && (m.port_number == 0
            || match targets.on(port) {
                [] => m.port_number == port,
                served => served.iter().any(|t| t.port == m.port_number),
            })
}

fn virtual_host_matches(vh: &VirtualHost, p: &Patch) -> bool {
    let Some(m) = p
        .matching
        .route_configuration()
        .and_then(|r| r.vhost.as_ref())
    else {
        return true;
    };
    (m.name.is_empty() || m.name == vh.name)
        && (m.domain_name.is_empty() || vh.domains.contains(&m.domain_name))
}

fn route_match(p: &Patch) -> Option<&pasa_istio::envoy_filter::RouteMatch> {
    p.matching
        .route_configuration()?
        .vhost
        .as_ref()?
        .route
        .as_ref()
}

fn route_matches(r: &Route, p: &Patch) -> bool {
    let Some(m) = route_match(p) else {
        return true;
    };
    if !m.name.is_empty() && m.name != r.name {
        return false;
    }
    match m.action {
        RouteAction::Any | RouteAction::Unknown(_) => true,
        // A route of another action (or none) matches whatever action is asked for, as in
        // istiod.
        RouteAction::Route => !matches!(
            r.action,
            Some(Action::Redirect(_) | Action::DirectResponse(_))
        ),
        RouteAction::Redirect => {
            !matches!(r.action, Some(Action::Route(_) | Action::DirectResponse(_)))
        }
        RouteAction::DirectResponse => {
            !matches!(r.action, Some(Action::Route(_) | Action::Redirect(_)))
        }
    }
}

/// An inbound cluster (`inbound|<port>||`) is of the services the proxy serves on its port, as
/// istiod matches it by service.
fn cluster_matches(c: &Cluster, p: &Patch, targets: &Targets<'_>) -> bool {
    let Some(m) = p.matching.cluster() else {
        return true;
    };
    if !m.name.is_empty() {
        return m.name == c.name;
    }
    let (port, subset, host) = names::read_cluster(&c.name);
    let service_matches = || {
        if c.name.starts_with("inbound|") {
            targets.on(port).iter().any(|t| t.hostname == m.service)
        } else {
            m.service == host
        }
    };
    (m.subset.is_empty() || m.subset == subset)
        && (m.service.is_empty() || service_matches())
        && (m.port_number == 0 || m.port_number == port)
}

#[cfg(test)]
mod tests;
