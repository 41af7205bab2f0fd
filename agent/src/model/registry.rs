//! The cache's raw resources, parsed into the typed Istio models once per change, and the service
//! registry built from them: one [`Service`] per host of every ServiceEntry and per
//! ServiceEndpoints (a Kubernetes Service), with its endpoints — its own and those of the parts
//! (EndpointSlices) that name it.
//!
//! A resource that does not parse is left out and logged with the field at fault; the store
//! validated it, so this only happens when the agent is older than the config.
//!
//! This module holds the registry's types and its queries; each resource is parsed in
//! [`parse`], services are built from ServiceEntries in [`service_entry`] and from Kubernetes
//! Services and their EndpointSlices in [`kubernetes`], their endpoints sharing what repeats
//! through [`interned`].

use std::collections::{BTreeMap, BTreeSet};
use std::hash::Hash;
use std::sync::Arc;

use pasa_istio::common::Protocol;
use pasa_istio::destination_rule::DestinationRule;
use pasa_istio::gateway::Gateway;
pub use pasa_istio::persistent_session::PersistentSession;
use pasa_istio::sidecar::Sidecar;
use pasa_istio::virtual_service::VirtualService;
use pasa_proto::Kind;
use pasa_proto::store::v1::Resource;

use crate::cache::{Cache, Change, Key};
use pasa_istio::authorization_policy::AuthorizationPolicy;
use pasa_istio::peer_authentication::PeerAuthentication;

mod interned;
mod kubernetes;
mod parse;
mod service_entry;
use kubernetes::merge_clusters;
pub use kubernetes::{ClusterService, Part};
use parse::{Parsed, parse};
use pasa_istio::service_endpoints::NetworkGateway;
pub use service_entry::legacy_auto_addresses;

/// Name, namespace and the store's bookkeeping of a parsed resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// Store revision of the creation: the older of two conflicting resources wins, as in Istio.
    pub created: u64,
    /// Store revision of the last change.
    pub revision: u64,
}

impl Meta {
    /// Istio's order among resources that conflict: the oldest first, then by name, then by
    /// namespace (resources created together keep a stable order).
    pub fn age_key(&self) -> (u64, &str, &str) {
        (self.created, &self.name, &self.namespace)
    }
}

/// A parsed resource.
#[derive(Debug, Clone, PartialEq)]
pub struct Config<T> {
    pub meta: Meta,
    pub spec: T,
}

/// How a service's endpoints are found (the cluster type follows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// Endpoints listed (EDS).
    ClientSideLb,
    /// No endpoints: traffic goes where the caller sent it (original destination).
    Passthrough,
    /// Endpoint addresses (or the host) resolved by DNS, all addresses used.
    Dns,
    /// Resolved by DNS, first address used.
    DnsRoundRobin,
    /// Resolved per request (wildcard hosts).
    DynamicDns,
}

/// A port of a service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    pub name: String,
    pub number: u32,
    /// `None`: unknown (Istio sniffs it); treated as TCP by the translation.
    pub protocol: Option<Protocol>,
    /// Where the service's host is reached when it stands for its own endpoint (a DNS
    /// ServiceEntry without endpoints, a Kubernetes ExternalName service): a ServiceEntry
    /// port's `targetPort`, else the port.
    pub target_port: u32,
}

impl ServicePort {
    /// HTTP of some version, routed by HTTP routes.
    pub fn is_http(&self) -> bool {
        self.protocol.is_some_and(Protocol::is_http)
    }
}

/// An endpoint's labels. The endpoints of one workload version carry the same ones, so a
/// service's endpoints share one copy of each distinct set.
pub type Labels = Arc<BTreeMap<String, String>>;

/// Where an endpoint receives, by service port number; shared like [`Labels`].
pub type EndpointPorts = Arc<BTreeMap<u32, u32>>;

/// One endpoint of a service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// An IP, a DNS name (DNS resolution) or `unix://path`.
    pub address: String,
    /// Where the endpoint receives, by service port number.
    pub ports: EndpointPorts,
    pub labels: Labels,
    /// `region/zone/subzone`. This and the strings below are shared by the endpoints of a
    /// service that have the same.
    pub locality: Arc<str>,
    /// Load-balancing weight (at least 1).
    pub weight: u32,
    pub network: Arc<str>,
    /// The cluster whose registry reported it (istiod's cluster ID); empty: not said, which
    /// every proxy takes as its own cluster's.
    pub cluster: Arc<str>,
    pub service_account: Arc<str>,
    /// The name of the workload it belongs to, as Istio's telemetry names it (empty: unknown):
    /// a pod's `service.istio.io/workload-name` label (which the syncer sets), a WorkloadEntry's
    /// auto-registration group, that label, or its name; `<ServiceEntry>-<i>` for a
    /// ServiceEntry's i-th endpoint.
    pub workload: Arc<str>,
    pub health: Health,
}

/// What proxies are told of an endpoint's health, as istiod tells them: a Kubernetes endpoint is
/// healthy when ready and unhealthy when not (a proxy sends it nothing, but counts it); one of a
/// ServiceEntry or WorkloadEntry is of unknown health, which proxies take as healthy. An
/// endpoint shutting down but kept for persistent sessions (or labelled `istio.io/draining`) is
/// draining: only a session already on it reaches it, and only services with cookie sessions
/// are sent it (see [`PersistentSession`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Health {
    #[default]
    Unknown,
    Healthy,
    Unhealthy,
    Draining,
}

/// Istio's label naming a workload (see [`Instance::workload`]).
pub const WORKLOAD_NAME_LABEL: &str = "service.istio.io/workload-name";

/// Istio's label saying whether a workload takes Istio mutual TLS (`istio`) or not.
pub const TLS_MODE_LABEL: &str = "security.istio.io/tlsMode";

/// A service of the registry: one host of a ServiceEntry, or a Kubernetes Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    /// The FQDN (or wildcard) clients call.
    pub hostname: String,
    pub namespace: String,
    /// Virtual IPs (or CIDRs, for a ServiceEntry); empty when there is none.
    pub addresses: Vec<String>,
    pub ports: Vec<ServicePort>,
    pub resolution: Resolution,
    /// Outside the mesh (`MESH_EXTERNAL`): no Istio mTLS.
    pub external: bool,
    /// `exportTo` as written (empty: everywhere).
    pub export_to: Vec<String>,
    pub endpoints: Vec<Instance>,
    /// A Kubernetes Service (not a ServiceEntry).
    pub kubernetes: bool,
    /// A Kubernetes `ExternalName` service: its DNS target.
    pub external_name: Option<String>,
    /// The identities the service states for itself (a ServiceEntry's `subjectAltNames`).
    pub subject_alt_names: Vec<String>,
    /// The persistent sessions its labels ask for.
    pub persistent_session: Option<PersistentSession>,
    /// A Kubernetes Service's preference for near endpoints.
    pub traffic_distribution: Option<pasa_istio::service_endpoints::TrafficDistribution>,
    /// When its resource was created (older wins on conflicts).
    pub created: u64,
    /// Store revision of the newest input (the resource, and the WorkloadEntries it selects):
    /// what it was built from changed when this did.
    pub revision: u64,
    /// The resource it comes from.
    pub source: Key,
}

impl Service {
    pub fn port(&self, number: u32) -> Option<&ServicePort> {
        self.ports.iter().find(|p| p.number == number)
    }

    /// The SPIFFE identities of the service's endpoints
    /// (`spiffe://<trust_domain>/ns/<ns>/sa/<sa>`, or the identity an endpoint states) and
    /// those the service states, each also in every trust domain of `aliases`, as istiod
    /// expands them; sorted, each once: who a client may accept as the service.
    pub fn identities(&self, trust_domain: &str, aliases: &[String]) -> Vec<String> {
        let accounts: BTreeSet<&str> = self
            .endpoints
            .iter()
            .map(|e| &*e.service_account)
            .filter(|sa| !sa.is_empty())
            .collect();

        let mut ids: Vec<String> = accounts
            .into_iter()
            .map(|sa| {
                if sa.starts_with("spiffe://") {
                    sa.to_string()
                } else {
                    format!("spiffe://{trust_domain}/ns/{}/sa/{sa}", self.namespace)
                }
            })
            .collect();
        // The names it states, as they are.
        ids.extend(self.subject_alt_names.iter().cloned());
        let expanded: Vec<String> = ids
            .iter()
            .filter_map(|id| {
                let rest = id.strip_prefix("spiffe://")?;
                let (_, path) = rest.split_once('/')?;
                path.starts_with("ns/").then_some(path)
            })
            .flat_map(|path| {
                aliases
                    .iter()
                    .map(move |td| format!("spiffe://{td}/{path}"))
            })
            .collect();
        ids.extend(expanded);
        ids.sort();
        ids.dedup();
        ids
    }
}

/// Every kind translation reads, parsed.
///
/// Kept current incrementally: [`Registry::update`] diffs the cache against the clone it read
/// last (see [`Cache::changes_since`]), parses only what changed, and rebuilds the services of
/// the changed ServiceEntries and ServiceEndpoints (and of the ServiceEntries that may select a
/// changed WorkloadEntry). A service that did not change stays the same `Arc`, which is how the
/// translator tells what it can reuse.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    entries: BTreeMap<Key, Entry>,
    /// The cache the registry was last brought up to date with.
    seen: Option<Cache>,
    /// The services each ServiceEntry or ServiceEndpoints declares.
    by_source: BTreeMap<Key, Vec<Arc<Service>>>,
    /// The sources declaring each host.
    host_sources: BTreeMap<String, BTreeSet<Key>>,
    /// The objects that make each Kubernetes Service (its object in each cluster and the parts
    /// of its endpoints), by the service's key (its own name in its namespace).
    members: BTreeMap<Key, BTreeSet<Key>>,
    /// Services by host, the oldest first.
    services: BTreeMap<String, Vec<Arc<Service>>>,
    /// The cluster of the proxy the registry is for: a service several clusters have is given
    /// this cluster's addresses (istiod's `ClusterVIPs`). Empty: the primary cluster's.
    cluster: String,
    /// The network gateways each Service is, with the cluster it is in, by object.
    network_gateways: BTreeMap<Key, (String, Vec<NetworkGateway>)>,
}

#[derive(Debug, Clone)]
struct Entry {
    source: Arc<Resource>,
    parsed: Parsed,
}

impl Registry {
    /// An empty registry for a proxy of `cluster` (see [`Registry::cluster`]).
    pub fn for_cluster(cluster: &str) -> Registry {
        Registry {
            cluster: cluster.to_string(),
            ..Registry::default()
        }
    }

    /// The network gateways the Kubernetes Services of the store are (labelled
    /// `topology.istio.io/network`), each with the cluster it is in.
    pub fn network_gateways(&self) -> impl Iterator<Item = (&str, &NetworkGateway)> {
        self.network_gateways
            .values()
            .flat_map(|(cluster, gateways)| gateways.iter().map(move |g| (cluster.as_str(), g)))
    }

    /// Where the Kubernetes Service of `host` is reached from outside `cluster` (its load
    /// balancer's addresses there): how the mesh's networks name gateways by service.
    pub fn external_addresses(&self, host: &str, cluster: &str) -> Vec<&str> {
        let mut labels = host.splitn(3, '.');
        let (Some(name), Some(namespace)) = (labels.next(), labels.next()) else {
            return Vec::new();
        };
        let key = Key {
            kind: Kind::ServiceEndpoints,
            namespace: namespace.to_string(),
            name: name.to_string(),
        };
        self.members
            .get(&key)
            .into_iter()
            .flatten()
            .filter_map(|m| match self.entries.get(m).map(|e| &e.parsed) {
                Some(Parsed::ServiceEndpoints(one)) if one.cluster == cluster => Some(one),
                _ => None,
            })
            .flat_map(|one| one.external_addresses.iter().map(String::as_str))
            .collect()
    }

    /// Brings the registry up to date with `cache`; parses only what changed. Returns the keys
    /// that changed (added, modified or removed).
    pub fn update(&mut self, cache: &Cache, domain_suffix: &str) -> BTreeSet<Key> {
        let changed: BTreeSet<Key> = match &self.seen {
            Some(seen) => cache.changes_since(seen).map(Change::into_key).collect(),
            None => cache
                .iter()
                .map(|(k, _)| k.clone())
                .chain(self.entries.keys().cloned())
                .collect(),
        };
        let mut sources = BTreeSet::new();
        for key in &changed {
            if key.kind == Kind::ServiceEntry {
                sources.insert(key.clone());
            }
            let old = match cache.get(key) {
                Some(resource) => self.entries.insert(
                    key.clone(),
                    Entry {
                        source: Arc::clone(resource),
                        parsed: parse(resource, domain_suffix),
                    },
                ),
                None => self.entries.remove(key),
            };
            // A cluster's Service or a part changed: its service (the one it was of before, and
            // the one it is of now) is built again.
            if let Some(service) = old.and_then(|e| service_of(&e.parsed, &key.namespace)) {
                if let Some(members) = self.members.get_mut(&service) {
                    members.remove(key);
                    if members.is_empty() {
                        self.members.remove(&service);
                    }
                }
                sources.insert(service);
            }
            self.network_gateways.remove(key);
            if let Some(entry) = self.entries.get(key) {
                if let Some(service) = service_of(&entry.parsed, &key.namespace) {
                    self.members
                        .entry(service.clone())
                        .or_default()
                        .insert(key.clone());
                    sources.insert(service);
                }
                if let Parsed::ServiceEndpoints(one) = &entry.parsed
                    && !one.network_gateways.is_empty()
                {
                    self.network_gateways.insert(
                        key.clone(),
                        (one.cluster.clone(), one.network_gateways.clone()),
                    );
                }
            }
        }
        // The ServiceEntries of a changed WorkloadEntry's namespace that select workloads may
        // select it.
        for key in changed.iter().filter(|k| k.kind == Kind::WorkloadEntry) {
            sources.extend(self.selecting_entries(&key.namespace));
        }
        self.seen = Some(cache.clone());
        if !sources.is_empty() {
            self.rebuild_sources(&sources);
        }
        changed
    }

    /// The ServiceEntries of `namespace` with a workload selector.
    fn selecting_entries(&self, namespace: &str) -> Vec<Key> {
        let from = Key {
            kind: Kind::ServiceEntry,
            namespace: namespace.into(),
            name: String::new(),
        };
        self.entries
            .range(from..)
            .take_while(|(k, _)| k.kind == Kind::ServiceEntry && k.namespace == namespace)
            .filter(|(_, e)| {
                matches!(&e.parsed, Parsed::ServiceEntry(se) if se.spec.workload_selector.is_some())
            })
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Builds again the services `sources` declare, and the host lists they are in.
    fn rebuild_sources(&mut self, sources: &BTreeSet<Key>) {
        let mut hosts = BTreeSet::new();
        for key in sources {
            if let Some(old) = self.by_source.remove(key) {
                for s in &old {
                    if let Some(declaring) = self.host_sources.get_mut(&s.hostname) {
                        declaring.remove(key);
                    }
                    hosts.insert(s.hostname.clone());
                }
            }
            let built: Vec<Arc<Service>> = match self.entries.get(key).map(|e| &e.parsed) {
                Some(Parsed::ServiceEntry(se)) => self
                    .services_of_entry(se)
                    .into_iter()
                    .map(Arc::new)
                    .collect(),
                _ if key.kind == Kind::ServiceEndpoints => {
                    self.kubernetes_service(key).into_iter().collect()
                }
                _ => continue,
            };
            for s in &built {
                self.host_sources
                    .entry(s.hostname.clone())
                    .or_default()
                    .insert(key.clone());
                hosts.insert(s.hostname.clone());
            }
            self.by_source.insert(key.clone(), built);
        }
        for host in hosts {
            let mut list: Vec<Arc<Service>> = Vec::new();
            for key in self.host_sources.get(&host).into_iter().flatten() {
                let declared = self.by_source.get(key).into_iter().flatten();
                list.extend(declared.filter(|s| s.hostname == host).cloned());
            }
            if list.is_empty() {
                self.host_sources.remove(&host);
                self.services.remove(&host);
            } else {
                list.sort_by(|a, b| (a.created, &a.source).cmp(&(b.created, &b.source)));
                self.services.insert(host, list);
            }
        }
    }

    /// The Kubernetes Service of `key` (its namespace and name), from its objects in every
    /// cluster and the parts of its endpoints; none while no cluster has its Service object.
    fn kubernetes_service(&self, key: &Key) -> Option<Arc<Service>> {
        let mut services = Vec::new();
        let mut parts = Vec::new();
        for member in self.members.get(key).into_iter().flatten() {
            match self.entries.get(member).map(|e| &e.parsed) {
                // What only states network gateways (a Gateway API Gateway's) is no service.
                Some(Parsed::ServiceEndpoints(one)) if one.is_gateways_only() => {}
                Some(Parsed::ServiceEndpoints(one)) => services.push((member, &**one)),
                Some(Parsed::EndpointsPart(part)) => parts.push(&**part),
                _ => {}
            }
        }
        // The primary first: the object that keeps the Service's own name (PCP's own cluster's),
        // then by cluster.
        services
            .sort_by(|a, b| (a.0 != key, &a.1.cluster, a.0).cmp(&(b.0 != key, &b.1.cluster, b.0)));
        let services: Vec<&ClusterService> = services.into_iter().map(|(_, s)| s).collect();
        merge_clusters(&services, &parts, &self.cluster)
    }

    /// Services by host; several when several resources declare one host (the oldest first).
    pub fn services(&self) -> &BTreeMap<String, Vec<Arc<Service>>> {
        &self.services
    }

    pub fn virtual_services(&self) -> impl Iterator<Item = &Arc<Config<VirtualService>>> {
        self.entries.values().filter_map(|e| match &e.parsed {
            Parsed::VirtualService(c) => Some(c),
            _ => None,
        })
    }

    pub fn destination_rules(&self) -> impl Iterator<Item = &Arc<Config<DestinationRule>>> {
        self.entries.values().filter_map(|e| match &e.parsed {
            Parsed::DestinationRule(c) => Some(c),
            _ => None,
        })
    }

    pub fn sidecars(&self) -> impl Iterator<Item = &Arc<Config<Sidecar>>> {
        self.entries.values().filter_map(|e| match &e.parsed {
            Parsed::Sidecar(c) => Some(c),
            _ => None,
        })
    }

    /// The Telemetries (a range of the entries).
    pub fn telemetries(&self) -> impl Iterator<Item = &Config<pasa_istio::telemetry::Telemetry>> {
        let from = Key {
            kind: Kind::Telemetry,
            namespace: String::new(),
            name: String::new(),
        };
        self.entries
            .range(from..)
            .take_while(|(k, _)| k.kind == Kind::Telemetry)
            .filter_map(|(_, e)| match &e.parsed {
                Parsed::Telemetry(c) => Some(c.as_ref()),
                _ => None,
            })
    }

    /// The TrafficExtensions, and the WasmPlugins read as TrafficExtensions (ranges of the
    /// entries: a proxy with none pays nothing per update).
    pub fn traffic_extensions(
        &self,
    ) -> impl Iterator<Item = &Config<pasa_istio::extensions::TrafficExtension>> {
        [Kind::TrafficExtension, Kind::WasmPlugin]
            .into_iter()
            .flat_map(move |kind| {
                let from = Key {
                    kind,
                    namespace: String::new(),
                    name: String::new(),
                };
                self.entries
                    .range(from..)
                    .take_while(move |(k, _)| k.kind == kind)
                    .filter_map(|(_, e)| match &e.parsed {
                        Parsed::TrafficExtension(c) => Some(c.as_ref()),
                        _ => None,
                    })
            })
    }

    /// The EnvoyFilters (a range of the entries: a proxy with none pays nothing per update).
    pub fn envoy_filters(
        &self,
    ) -> impl Iterator<Item = &Arc<Config<pasa_istio::envoy_filter::EnvoyFilter>>> {
        let from = Key {
            kind: Kind::EnvoyFilter,
            namespace: String::new(),
            name: String::new(),
        };
        self.entries
            .range(from..)
            .take_while(|(k, _)| k.kind == Kind::EnvoyFilter)
            .filter_map(|(_, e)| match &e.parsed {
                Parsed::EnvoyFilter(c) => Some(c),
                _ => None,
            })
    }

    pub fn peer_authentications(&self) -> impl Iterator<Item = &Config<PeerAuthentication>> {
        self.peer_authentication_configs().map(Arc::as_ref)
    }

    /// [`Registry::peer_authentications`], shared.
    pub fn peer_authentication_configs(
        &self,
    ) -> impl Iterator<Item = &Arc<Config<PeerAuthentication>>> {
        self.entries.values().filter_map(|e| match &e.parsed {
            Parsed::PeerAuthentication(c) => Some(c),
            _ => None,
        })
    }

    /// The AuthorizationPolicies that apply to a sidecar of `namespace` with `labels`: those of
    /// the root namespace (the mesh's, or with a selector the labels match, in any namespace)
    /// and those of its own namespace (all of it, or selected). Policies attached by
    /// `targetRef(s)` apply to waypoints and gateways, not to sidecars.
    pub fn authorization_policies_for<'a>(
        &'a self,
        root_namespace: &'a str,
        namespace: &'a str,
        labels: &'a BTreeMap<String, String>,
    ) -> impl Iterator<Item = &'a Config<AuthorizationPolicy>> {
        self.applying(root_namespace, namespace, labels, |p| match p {
            Parsed::AuthorizationPolicy(c) => Some(c),
            _ => None,
        })
    }

    /// The RequestAuthentications that apply to a sidecar of `namespace` with `labels`, chosen as
    /// AuthorizationPolicies are (see [`Registry::authorization_policies_for`]).
    pub fn request_authentications_for<'a>(
        &'a self,
        root_namespace: &'a str,
        namespace: &'a str,
        labels: &'a BTreeMap<String, String>,
    ) -> impl Iterator<Item = &'a pasa_istio::request_authentication::RequestAuthentication> {
        self.applying(root_namespace, namespace, labels, |p| match p {
            Parsed::RequestAuthentication(c) => Some(c),
            _ => None,
        })
        .map(|c| &c.spec)
    }

    /// The security policies `pick` finds that apply to a proxy of `namespace` with `labels`.
    fn applying<'a, T: pasa_istio::authorization_policy::WorkloadPolicy + 'a>(
        &'a self,
        root_namespace: &'a str,
        namespace: &'a str,
        labels: &'a BTreeMap<String, String>,
        pick: impl Fn(&'a Parsed) -> Option<&'a Arc<Config<T>>> + 'a,
    ) -> impl Iterator<Item = &'a Config<T>> {
        self.entries
            .values()
            .filter_map(move |e| pick(&e.parsed))
            .filter(move |c| {
                pasa_istio::authorization_policy::applies_to_workload(
                    &c.meta.namespace,
                    c.spec.workload_selector(),
                    &c.spec.targets(),
                    root_namespace,
                    namespace,
                    labels,
                )
            })
            .map(|c| c.as_ref())
    }

    /// The keys PCP fetched for `source`, kept in `root_namespace`, if the store has them.
    pub fn key_set(
        &self,
        root_namespace: &str,
        source: &pasa_istio::request_authentication::KeySetSource,
    ) -> Option<&str> {
        let key = Key {
            kind: Kind::JsonWebKeySet,
            namespace: root_namespace.to_string(),
            name: source.object_name(),
        };
        match &self.entries.get(&key)?.parsed {
            Parsed::JsonWebKeySet(c) if c.spec.source() == *source => Some(c.spec.jwks.as_str()),
            _ => None,
        }
    }

    /// The registry credentials of the pull Secret `name` of `namespace`, if the store has them.
    pub fn image_pull_secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<&pasa_istio::extensions::ImagePullSecret> {
        let key = Key {
            kind: Kind::ImagePullSecret,
            namespace: namespace.to_string(),
            name: name.to_string(),
        };
        match &self.entries.get(&key)?.parsed {
            Parsed::ImagePullSecret(c) => Some(&c.spec),
            _ => None,
        }
    }

    /// The mesh config of the mesh whose root namespace is `root_namespace` (`mesh` there), if
    /// the store has one.
    pub fn mesh_config(
        &self,
        root_namespace: &str,
    ) -> Option<&pasa_istio::mesh_config::MeshConfig> {
        let key = Key {
            kind: Kind::MeshConfig,
            namespace: root_namespace.to_string(),
            name: pasa_istio::mesh_config::MESH_CONFIG_NAME.to_string(),
        };
        match &self.entries.get(&key)?.parsed {
            Parsed::MeshConfig(c) => Some(&c.spec),
            _ => None,
        }
    }

    /// The resource as the store handed it over (its labels, for instance), by key.
    pub fn resource(&self, key: &Key) -> Option<&Resource> {
        self.entries.get(key).map(|e| e.source.as_ref())
    }

    pub fn gateways(&self) -> impl Iterator<Item = &Arc<Config<Gateway>>> {
        self.entries.values().filter_map(|e| match &e.parsed {
            Parsed::Gateway(c) => Some(c),
            _ => None,
        })
    }
}

/// The key of the Kubernetes Service a parsed object is part of (its object in some cluster,
/// or a part of its endpoints).
fn service_of(parsed: &Parsed, namespace: &str) -> Option<Key> {
    match parsed {
        Parsed::ServiceEndpoints(one) => Some(one.service_key(namespace)),
        Parsed::EndpointsPart(part) => Some(part.service_key(namespace)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use pasa_istio::workload_entry;

    use super::*;

    fn endpoints_resource(spec: serde_json::Value) -> Resource {
        Resource {
            kind: "ServiceEndpoints".into(),
            namespace: "default".into(),
            name: "reviews".into(),
            spec_json: spec.to_string(),
            create_revision: 1,
            mod_revision: 1,
            ..Default::default()
        }
    }

    /// The endpoints of one workload version share one copy of their labels and ports; the
    /// parsed spec is not kept beside the service built from it.
    #[test]
    fn endpoints_share_their_label_sets_and_port_maps() {
        let resource = endpoints_resource(serde_json::json!({
            "addresses": ["10.96.0.12"],
            "ports": [{"name": "http", "port": 9080}],
            "endpoints": [
                {"address": "10.0.0.1", "labels": {"app": "reviews", "version": "v1"}},
                {"address": "10.0.0.2", "labels": {"app": "reviews", "version": "v1"}},
                {"address": "10.0.0.3", "labels": {"app": "reviews", "version": "v2"}},
            ]
        }));
        let Parsed::ServiceEndpoints(one) = parse(&resource, "cluster.local") else {
            panic!("a ServiceEndpoints parses into its service");
        };
        let service = &one.service;
        let [a, b, c] = &service.endpoints[..] else {
            panic!("three endpoints: {:?}", service.endpoints);
        };
        assert_eq!(service.hostname, "reviews.default.svc.cluster.local");
        assert!(Arc::ptr_eq(&a.labels, &b.labels));
        assert!(!Arc::ptr_eq(&a.labels, &c.labels));
        assert_eq!(c.labels["version"], "v2");
        assert!(Arc::ptr_eq(&a.ports, &c.ports));
        assert_eq!(a.ports[&9080], 9080);
        assert_eq!(
            (a.address.as_str(), b.address.as_str()),
            ("10.0.0.1", "10.0.0.2")
        );
    }

    fn apply(cache: &mut Cache, action: pasa_proto::watch::Action, r: Resource) {
        let revision = r.mod_revision;
        cache.apply(pasa_proto::watch::Change {
            action,
            resource: r,
            revision,
            committed: None,
        });
    }

    fn put(cache: &mut Cache, name: &str, spec: serde_json::Value, revision: u64) {
        let r = crate::testing::resource("ServiceEndpoints", "default", name, spec, revision);
        apply(cache, pasa_proto::watch::Action::Added, r);
    }

    fn reviews(registry: &Registry) -> Option<Arc<Service>> {
        let host = "reviews.default.svc.cluster.local";
        registry
            .services()
            .get(host)
            .map(|list| Arc::clone(&list[0]))
    }

    /// A WorkloadEntry whose health is checked is an endpoint only while known healthy, as
    /// istiod serves it; its change of health is its ServiceEntry's change.
    #[test]
    fn health_checked_workload_entries_are_endpoints_only_while_healthy() {
        use workload_entry::{HEALTH_CHECKS_ANNOTATION, HEALTHY_ANNOTATION};
        let mut cache = Cache::default();
        let se = crate::testing::resource(
            "ServiceEntry",
            "vms",
            "vm",
            serde_json::json!({"hosts": ["vm.example.com"], "resolution": "STATIC",
                "ports": [{"name": "http", "number": 80}],
                "workloadSelector": {"labels": {"app": "vm"}}}),
            1,
        );
        apply(&mut cache, pasa_proto::watch::Action::Added, se);
        let entry = |name: &str, ip: &str, annotations: &[(&str, &str)], revision: u64| {
            let mut r = crate::testing::resource(
                "WorkloadEntry",
                "vms",
                name,
                serde_json::json!({"address": ip, "labels": {"app": "vm"}}),
                revision,
            );
            r.annotations = annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            r
        };
        let added = pasa_proto::watch::Action::Added;
        apply(&mut cache, added, entry("vm-1", "10.1.0.1", &[], 2));
        let checked = (HEALTH_CHECKS_ANNOTATION, "true");
        let healthy = [checked, (HEALTHY_ANNOTATION, "true")];
        apply(&mut cache, added, entry("vm-2", "10.1.0.2", &healthy, 3));
        apply(&mut cache, added, entry("vm-3", "10.1.0.3", &[checked], 4));
        let mut registry = Registry::default();
        registry.update(&cache, "cluster.local");
        let served = |registry: &Registry| {
            let service = Arc::clone(&registry.services()["vm.example.com"][0]);
            let addresses: Vec<String> = service
                .endpoints
                .iter()
                .map(|e| e.address.clone())
                .collect();
            (addresses, service.revision)
        };
        assert_eq!(
            served(&registry),
            (vec!["10.1.0.1".into(), "10.1.0.2".into()], 4)
        );
        // vm-2 fails its probe, vm-3 passes its first.
        let modified = pasa_proto::watch::Action::Modified;
        let unhealthy = [checked, (HEALTHY_ANNOTATION, "false")];
        apply(
            &mut cache,
            modified,
            entry("vm-2", "10.1.0.2", &unhealthy, 5),
        );
        apply(&mut cache, modified, entry("vm-3", "10.1.0.3", &healthy, 6));
        registry.update(&cache, "cluster.local");
        assert_eq!(
            served(&registry),
            (vec!["10.1.0.1".into(), "10.1.0.3".into()], 6)
        );
    }

    /// A service whose endpoints come in parts (EndpointSlices) is the service one object listing
    /// the same endpoints in the same order makes; parts that come before their service, change,
    /// move to another service or go are followed.
    #[test]
    fn parts_of_a_services_endpoints_are_merged_into_it() {
        let ports = serde_json::json!([
            {"name": "http", "port": 9080, "targetPort": "web"},
            {"name": "tcp", "port": 9090, "targetPort": 19090},
        ]);
        let a = serde_json::json!({"address": "10.0.0.1", "labels": {"version": "v1"},
            "locality": "r/z", "serviceAccount": "reviews", "ports": {"web": 8080}});
        let b = serde_json::json!({"address": "10.0.0.2", "labels": {"version": "v2"},
            "ports": {"web": 8080}});
        let c = serde_json::json!({"address": "10.0.0.3", "labels": {"version": "v2"},
            "ports": {"web": 8080}});
        let mut whole = Cache::default();
        put(
            &mut whole,
            "reviews",
            serde_json::json!({"addresses": ["10.96.0.12"], "ports": ports,
                "endpoints": [a.clone(), b.clone(), c.clone()]}),
            1,
        );
        let mut one = Registry::default();
        one.update(&whole, "cluster.local");
        let expected = reviews(&one).expect("the service");

        let mut split = Cache::default();
        // A part first: nothing until its service comes.
        put(
            &mut split,
            "reviews-b.endpointslice",
            serde_json::json!({"service": "reviews", "endpointPorts": {"http": 8080},
                "endpoints": [b, c]}),
            2,
        );
        let mut parts = Registry::default();
        parts.update(&split, "cluster.local");
        assert!(reviews(&parts).is_none());
        put(
            &mut split,
            "reviews",
            serde_json::json!({"addresses": ["10.96.0.12"], "ports": ports, "endpoints": [a]}),
            3,
        );
        parts.update(&split, "cluster.local");
        let merged = reviews(&parts).expect("the merged service");
        assert_eq!(merged.endpoints, expected.endpoints);
        assert_eq!(merged.endpoints[2].ports[&9080], 8080);
        assert_eq!(merged.endpoints[2].ports[&9090], 19090);
        assert_eq!(merged.revision, 3);

        // The part changes: one endpoint goes.
        put(
            &mut split,
            "reviews-b.endpointslice",
            serde_json::json!({"service": "reviews", "endpointPorts": {"http": 8080},
                "endpoints": [{"address": "10.0.0.2", "labels": {"version": "v2"}}]}),
            4,
        );
        parts.update(&split, "cluster.local");
        let merged = reviews(&parts).unwrap();
        let addresses: Vec<&str> = merged.endpoints.iter().map(|e| &*e.address).collect();
        assert_eq!(addresses, ["10.0.0.1", "10.0.0.2"]);
        assert_eq!(merged.revision, 4);

        // It moves to another service, then goes.
        put(
            &mut split,
            "reviews-b.endpointslice",
            serde_json::json!({"service": "ratings", "endpoints": [{"address": "10.0.0.2"}]}),
            5,
        );
        parts.update(&split, "cluster.local");
        assert_eq!(reviews(&parts).unwrap().endpoints.len(), 1);
        let gone = crate::testing::resource(
            "ServiceEndpoints",
            "default",
            "reviews-b.endpointslice",
            serde_json::json!({}),
            6,
        );
        apply(&mut split, pasa_proto::watch::Action::Deleted, gone);
        parts.update(&split, "cluster.local");
        assert_eq!(reviews(&parts).unwrap().endpoints.len(), 1);
        assert_eq!(parts.members.len(), 1);
    }

    /// A Service several clusters have is one service: each cluster's endpoints (in cluster
    /// order, each cluster's own before its parts'), the proxy's cluster's addresses, and the
    /// cluster of each endpoint; it stays while any cluster has it.
    #[test]
    fn clusters_of_a_service_are_merged() {
        let ports = serde_json::json!([{"name": "http", "port": 9080}]);
        let mut cache = Cache::default();
        put(
            &mut cache,
            "reviews",
            serde_json::json!({"cluster": "c1", "addresses": ["10.96.0.1"], "ports": ports,
                "endpoints": [{"address": "10.0.0.1"}]}),
            1,
        );
        put(
            &mut cache,
            "reviews.c2.cluster",
            serde_json::json!({"service": "reviews", "cluster": "c2", "addresses": ["10.97.0.1"],
                "ports": ports, "endpoints": [{"address": "10.1.0.1"}]}),
            2,
        );
        put(
            &mut cache,
            "reviews-abc.c2.endpointslice",
            serde_json::json!({"service": "reviews", "cluster": "c2",
                "endpoints": [{"address": "10.1.0.2"}]}),
            3,
        );
        let seen = |registry: &Registry| {
            let service = reviews(registry).expect("the merged service");
            let endpoints: Vec<(String, String)> = service
                .endpoints
                .iter()
                .map(|e| (e.address.clone(), e.cluster.to_string()))
                .collect();
            (service.addresses.clone(), endpoints, service.revision)
        };
        let everywhere = vec![
            ("10.0.0.1".to_string(), "c1".to_string()),
            ("10.1.0.1".to_string(), "c2".to_string()),
            ("10.1.0.2".to_string(), "c2".to_string()),
        ];
        let mut c2 = Registry::for_cluster("c2");
        c2.update(&cache, "cluster.local");
        assert_eq!(
            seen(&c2),
            (vec!["10.97.0.1".to_string()], everywhere.clone(), 3)
        );
        let mut c1 = Registry::for_cluster("c1");
        c1.update(&cache, "cluster.local");
        assert_eq!(seen(&c1).0, ["10.96.0.1"]);
        // A proxy of a cluster without the Service sees the primary's addresses.
        let mut c3 = Registry::for_cluster("c3");
        c3.update(&cache, "cluster.local");
        assert_eq!(seen(&c3).0, ["10.96.0.1"]);
        assert_eq!(c3.services().len(), 1);

        // PCP's own cluster loses the Service: the other cluster's is the service now.
        let gone = crate::testing::resource(
            "ServiceEndpoints",
            "default",
            "reviews",
            serde_json::json!({}),
            4,
        );
        apply(&mut cache, pasa_proto::watch::Action::Deleted, gone);
        c1.update(&cache, "cluster.local");
        assert_eq!(
            seen(&c1),
            (vec!["10.97.0.1".to_string()], everywhere[1..].to_vec(), 3)
        );
    }

    /// An object that only states network gateways (a Gateway API Gateway's) is no service;
    /// its gateways are the registry's, with its cluster.
    #[test]
    fn gateways_only_objects_are_gateways_not_services() {
        let mut cache = Cache::default();
        let r = crate::testing::resource(
            "ServiceEndpoints",
            "istio-system",
            "eastwest~istio-autogenerated-k8s-gateway~network",
            serde_json::json!({"cluster": "c2", "networkGateways": [
                {"network": "n2", "address": "35.1.2.3", "port": 15443}]}),
            1,
        );
        apply(&mut cache, pasa_proto::watch::Action::Added, r);
        let mut registry = Registry::default();
        registry.update(&cache, "cluster.local");
        assert!(registry.services().is_empty());
        let gateways: Vec<(&str, &str)> = registry
            .network_gateways()
            .map(|(cluster, g)| (cluster, g.address.as_str()))
            .collect();
        assert_eq!(gateways, [("c2", "35.1.2.3")]);
    }
}
