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
//!
//! This module picks the EnvoyFilters that apply and holds the memo; a patch as read is in
//! [`patch`], where a patch's `match` selects in [`matching`], and the patches applied to each
//! kind of resource in [`patcher`].

use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use pasa_istio::authorization_policy::applies_to_workload;
use pasa_istio::destination_rule::WorkloadSelector;
use pasa_istio::envoy_filter::{
    ApplyTo, EnvoyConfigObjectMatch, EnvoyFilter, Operation, PatchContext,
};
use pasa_istio::node::ProxyType;
use prost::Message;
use prost_reflect::DescriptorPool;
use rustc_hash::FxHashMap;

use super::patched::{self, Type};
use crate::model::proxy::Proxy;
use crate::model::registry::{Config, Registry};
use crate::resource::{Generated, Resource};

mod matching;
mod patch;
mod patcher;
use patch::{Patch, Read, read, types_of};
use patcher::{Patcher, Targets};

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

#[cfg(test)]
mod tests;
