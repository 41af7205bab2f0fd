//! The patches applied to decoded resources ([`Patcher`]): listeners, their listener filters,
//! filter chains, network filters and connection managers' HTTP filters; route configurations,
//! virtual hosts and routes; clusters. Each list is patched in istiod's order (see [`ordered`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::listener::v3::{
    Filter, FilterChain, Listener, ListenerFilter, filter, listener_filter,
};
use envoy_types::pb::envoy::config::route::v3::{Route, RouteConfiguration, VirtualHost};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, http_connection_manager::RouteSpecifier, http_filter,
};
use envoy_types::pb::google::protobuf::Any;
use pasa_envoy_json::merge::{self};
use pasa_istio::envoy_filter::{ApplyTo, Operation, PatchContext};
use prost::Message;
use prost_reflect::DescriptorPool;

use crate::model::proxy::Proxy;
use crate::model::registry::Registry;
use crate::resource::Resource;

use super::super::filters::HCM;
use super::super::names;
use super::Patches;
use super::matching::{
    chain_matches, cluster_matches, listener_matches, route_configuration_matches, route_match,
    route_matches, virtual_host_matches,
};
use super::patch::Patch;

/// Applies patches to decoded resources.
pub(super) struct Patcher<'a> {
    pub(super) patches: &'a Patches,
    pub(super) router: bool,
    pub(super) pool: &'a DescriptorPool,
    pub(super) targets: Targets<'a>,
}

/// The ports of services the proxy is an endpoint of, by the port it receives them on: for a
/// router, the service ports a listener port serves (istiod's gateway port map, for route
/// configuration matches by port); for a sidecar, the services an inbound port serves (for
/// cluster matches by service). Worked out only when a patch asks.
pub(super) struct Targets<'a> {
    pub(super) proxy: &'a Proxy,
    pub(super) registry: &'a Registry,
    pub(super) by_port:
        std::cell::OnceCell<BTreeMap<u32, Vec<crate::model::gateway::ServiceTarget>>>,
}

impl Targets<'_> {
    pub(super) fn on(&self, port: u32) -> &[crate::model::gateway::ServiceTarget] {
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
    pub(super) fn listener_resource(&self, r: &Resource) -> Option<Arc<Resource>> {
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

    pub(super) fn route_configuration(&self, context: PatchContext, rc: &mut RouteConfiguration) {
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
    pub(super) fn cluster(&self, c: &mut Cluster) -> bool {
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
