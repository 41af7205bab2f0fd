//! On-demand scope (issue: no Sidecar resource needed): an agent whose Envoy asks for virtual
//! hosts and clusters as its application calls them (VHDS and on-demand CDS over delta ADS)
//! learns its scope from those requests, and widens its store subscription to exactly what is
//! called. The design is in `docs/on-demand.md`.
//!
//! This module holds the first step every request takes: what a `Host` header, as Envoy sends
//! it (`<route config>/<host as sent>`: with or without a port, short or long, an address), may
//! name. A virtual host of the eager configuration lists every spelling istiod accepts for its
//! service (`translate::route::alt_hosts`: the full name, the absolute name, the short forms
//! valid from the proxy's namespace, `*.`-forms for headless services, addresses, each with its
//! port); [`Lookup::of`] goes the other way, to the hosts that could have that spelling. The
//! hosts are candidates: which of them exist, and which of those the proxy may see, the store
//! and the proxy's scope decide.
//!
//! The hosts a proxy has learned narrow its scope (`Proxy::learned`,
//! `SidecarScope::narrowed`): its translation and its store subscription then hold those hosts,
//! what their VirtualServices route to, and its own inbound side and policies, nothing else. A
//! learned host's virtual host and clusters are built exactly as the eager scope builds them
//! (tested below).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::cache::{CacheError, write_atomically};

/// The file in `--cache-dir` holding the hosts an on-demand proxy has learned.
pub const LEARNED_FILE: &str = "learned-hosts.json";

/// The hosts an on-demand proxy has learned, each with when it was last asked for (seconds since
/// the Unix epoch). Kept beside the cache, so that a restarted agent starts with them (not from
/// zero); those unused for the idle time are forgotten.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Learned {
    hosts: BTreeMap<String, u64>,
}

impl Learned {
    /// Notes that `hosts` were asked for at `now`; whether any was not known before.
    pub fn learn(&mut self, hosts: impl IntoIterator<Item = String>, now: SystemTime) -> bool {
        let at = seconds(now);
        let mut new = false;
        for host in hosts {
            new |= self.hosts.insert(host, at).is_none();
        }
        new
    }

    /// Notes that those of `hosts` already learned were used at `now` (others are not learned
    /// by being used).
    pub fn touch<'a>(&mut self, hosts: impl IntoIterator<Item = &'a str>, now: SystemTime) {
        let at = seconds(now);
        for host in hosts {
            if let Some(last) = self.hosts.get_mut(host) {
                *last = (*last).max(at);
            }
        }
    }

    /// Forgets the hosts last asked for more than `idle` before `now`, and returns them.
    pub fn forget_idle(&mut self, now: SystemTime, idle: Duration) -> Vec<String> {
        let oldest = seconds(now).saturating_sub(idle.as_secs());
        let gone: Vec<String> = self
            .hosts
            .iter()
            .filter(|(_, at)| **at < oldest)
            .map(|(h, _)| h.clone())
            .collect();
        for host in &gone {
            self.hosts.remove(host);
        }
        gone
    }

    /// How many hosts are learned.
    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    /// The hosts learned, for the proxy's scope.
    pub fn hosts(&self) -> BTreeSet<String> {
        self.hosts.keys().cloned().collect()
    }

    /// Writes them to `dir` atomically.
    pub fn save(&self, dir: &Path) -> Result<(), CacheError> {
        let path = dir.join(LEARNED_FILE);
        let tmp = dir.join(format!("{LEARNED_FILE}.tmp"));
        std::fs::create_dir_all(dir).map_err(|source| CacheError::Write {
            path: path.clone(),
            source,
        })?;
        write_atomically(&path, &tmp, |out| {
            serde_json::to_writer(out, self).map_err(std::io::Error::other)
        })
    }

    /// What `dir` holds; nothing learned when it holds no file.
    pub fn load(dir: &Path) -> Result<Learned, CacheError> {
        let path = dir.join(LEARNED_FILE);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Learned::default()),
            Err(source) => return Err(CacheError::Read { path, source }),
        };
        serde_json::from_slice(&bytes).map_err(|source| CacheError::Learned { path, source })
    }
}

/// What the proxy has learned, as translation takes it: `number` grows with every change of
/// `hosts`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Generation {
    pub number: u64,
    pub hosts: std::sync::Arc<BTreeSet<String>>,
}

/// Resolves when the value `watched` follows changes: what an on-demand proxy learned, or the
/// names it settled. Never for the eager scope (`None`), nor once the sender is gone (`watched`
/// is then `None`).
pub async fn changed<T>(watched: &mut Option<tokio::sync::watch::Receiver<T>>) {
    if let Some(rx) = watched {
        if rx.changed().await.is_ok() {
            return;
        }
        *watched = None;
    }
    std::future::pending().await
}

/// The host a VHDS name (`<route config>/<host as sent>`) asks for.
pub fn asked_host(name: &str) -> Option<&str> {
    name.rsplit_once('/').map(|(_, host)| host)
}

fn seconds(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// What a host, as a client spelt it, may name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    /// The hosts (fully qualified, as services and ServiceEntries name them) the spelling may
    /// stand for, most specific first: the name as written, then completed by each suffix of
    /// the proxy's DNS domain (as a resolver's search path completes it), then the same for
    /// the name without its first label (a pod of a headless service, `*.`-domains). For an
    /// address, the address itself.
    pub hosts: Vec<String>,
    /// The address, when the spelling is one (a service's virtual IP).
    pub address: Option<IpAddr>,
    /// The port, when the spelling has one.
    pub port: Option<u16>,
}

impl Lookup {
    /// What `spelt` (a `Host`/`:authority` value) may name for a proxy whose DNS domain is
    /// `dns_domain` (`<namespace>.svc.<cluster domain>`); `None` for what no virtual host
    /// domain can be (empty, a bad port, characters no host has).
    pub fn of(spelt: &str, dns_domain: &str) -> Option<Lookup> {
        let (name, port) = split_port(spelt.trim())?;
        if let Ok(address) = name.parse::<IpAddr>() {
            // The store indexes services by their addresses too: one is asked for as a host,
            // and stands for the services it belongs to (`SidecarScope::narrowed`).
            return Some(Lookup {
                hosts: vec![address.to_string()],
                address: Some(address),
                port,
            });
        }
        let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
        {
            return None;
        }
        let mut hosts = Vec::new();
        let mut add = |host: String| {
            if !hosts.contains(&host) {
                hosts.push(host);
            }
        };
        let suffixes = search_path(dns_domain);
        for base in std::iter::once(name.as_str()).chain(name.split_once('.').map(|(_, rest)| rest))
        {
            add(base.to_string());
            for suffix in &suffixes {
                add(format!("{base}.{suffix}"));
            }
        }
        Some(Lookup {
            hosts,
            address: None,
            port,
        })
    }
}

/// `host` and its port: `name:port`, `[v6]:port`, `[v6]`, a bare v6 address, or a name.
pub fn split_port(spelt: &str) -> Option<(&str, Option<u16>)> {
    if let Some(rest) = spelt.strip_prefix('[') {
        let (address, after) = rest.split_once(']')?;
        return match after.strip_prefix(':') {
            Some(port) => Some((address, Some(port.parse().ok()?))),
            None if after.is_empty() => Some((address, None)),
            None => None,
        };
    }
    if spelt.parse::<std::net::Ipv6Addr>().is_ok() {
        return Some((spelt, None));
    }
    match spelt.rsplit_once(':') {
        Some((name, port)) => Some((name, Some(port.parse().ok()?))),
        None => Some((spelt, None)),
    }
}

/// The suffixes a short name is completed with from a proxy in `dns_domain`, longest first:
/// `ns.svc.cluster.local`, `svc.cluster.local`, `cluster.local` (a pod's resolver search path).
fn search_path(dns_domain: &str) -> Vec<&str> {
    let mut suffixes = Vec::new();
    let mut rest = dns_domain;
    while let Some((_, tail)) = rest.split_once('.') {
        suffixes.push(rest);
        rest = tail;
    }
    suffixes
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::cache::Cache;
    use crate::model::proxy::Generator;
    use crate::testing::{resource, sidecar};
    use crate::translate::Translator;

    const DNS: &str = "default.svc.cluster.local";

    #[test]
    fn spellings_name_their_candidates() {
        let hosts = |spelt: &str| Lookup::of(spelt, DNS).unwrap().hosts;
        assert_eq!(
            hosts("reviews:9080"),
            [
                "reviews",
                "reviews.default.svc.cluster.local",
                "reviews.svc.cluster.local",
                "reviews.cluster.local",
            ]
        );
        assert!(hosts("reviews.bookinfo").contains(&"reviews.bookinfo.svc.cluster.local".into()));
        assert!(
            hosts("Reviews.Bookinfo.svc.").contains(&"reviews.bookinfo.svc.cluster.local".into())
        );
        // A pod of a headless service, by its own name.
        assert!(hosts("db-0.db").contains(&"db.default.svc.cluster.local".into()));
        let v6 = Lookup::of("[fd00::1]:80", DNS).unwrap();
        assert_eq!(
            (v6.address, v6.port),
            (Some("fd00::1".parse().unwrap()), Some(80))
        );
        assert_eq!(Lookup::of("fd00::1", DNS).unwrap().port, None);
        for bad in ["", "a:b", "[fd00::1", "a b", "host:99999"] {
            assert_eq!(Lookup::of(bad, DNS), None, "{bad:?}");
        }
    }

    /// Every domain of every virtual host the eager translator builds for a sidecar leads back
    /// to the virtual host's own service: its host among the candidates, or its address.
    #[test]
    fn every_eager_domain_leads_back_to_its_service() {
        let service = |ns: &str, name: &str, spec: serde_json::Value, rev: u64| {
            resource("ServiceEndpoints", ns, name, spec, rev)
        };
        let resources = vec![
            service(
                "default",
                "reviews",
                json!({"addresses": ["10.96.0.20"], "ports": [{"name": "http", "port": 9080}]}),
                1,
            ),
            service(
                "bookinfo",
                "ratings",
                json!({"addresses": ["10.96.0.21", "fd00::21"],
                       "ports": [{"name": "http", "port": 9080}, {"name": "http-alt", "port": 80}]}),
                2,
            ),
            service(
                "default",
                "db",
                json!({"ports": [{"name": "http", "port": 8080}],
                       "endpoints": [{"address": "10.0.0.40"}]}),
                3,
            ),
            resource(
                "ServiceEntry",
                "default",
                "api",
                json!({"hosts": ["api.example.com"], "addresses": ["240.0.0.7"],
                       "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
                       "resolution": "DNS"}),
                4,
            ),
        ];
        let cache = Cache::from_resources(resources, 10);
        let mut translator = Translator::new(sidecar("10.0.0.9"));
        let out = translator
            .update(&cache, Generator::Envoy)
            .expect("translates");
        let mut checked = 0;
        for config in out.routes.values() {
            for vh in &config.virtual_hosts {
                let Some((host, _port)) = vh.name.rsplit_once(':') else {
                    continue;
                };
                if !host.contains('.') {
                    continue;
                }
                for domain in &vh.domains {
                    let lookup = Lookup::of(domain.trim_start_matches("*."), DNS)
                        .unwrap_or_else(|| panic!("{domain:?} of {} reads", vh.name));
                    let by_name = lookup.hosts.iter().any(|h| h == host);
                    assert!(
                        by_name || lookup.address.is_some(),
                        "{domain:?} does not lead back to {host}: {lookup:?}"
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 20, "only {checked} domains checked");
    }

    /// The clusters a virtual host's routes send to.
    fn clusters_of(vh: &envoy_types::pb::envoy::config::route::v3::VirtualHost) -> Vec<String> {
        use envoy_types::pb::envoy::config::route::v3::route::Action;
        use envoy_types::pb::envoy::config::route::v3::route_action::ClusterSpecifier;
        let mut out = Vec::new();
        for route in &vh.routes {
            if let Some(Action::Route(action)) = &route.action {
                match &action.cluster_specifier {
                    Some(ClusterSpecifier::Cluster(c)) => out.push(c.clone()),
                    Some(ClusterSpecifier::WeightedClusters(w)) => {
                        out.extend(w.clusters.iter().map(|c| c.name.clone()))
                    }
                    _ => {}
                }
            }
        }
        out
    }

    /// An on-demand proxy that has learned the hosts one spelling of a virtual host may name
    /// builds that virtual host exactly as the eager proxy builds it (name, domains, routes:
    /// header matches, weights), and the clusters its routes send to; it builds fewer virtual
    /// hosts in all.
    #[test]
    fn a_learned_host_is_built_as_the_eager_scope_builds_it() {
        use envoy_types::pb::envoy::config::cluster::v3::Cluster;
        use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
        use prost::Message;
        let service = |ns: &str, name: &str, vip: &str, port: u32, rev: u64| {
            resource(
                "ServiceEndpoints",
                ns,
                name,
                json!({"addresses": [vip], "ports": [{"name": "http", "port": port}],
                       "endpoints": [{"address": format!("10.1.0.{rev}"), "labels": {"version": "v1"}},
                                     {"address": format!("10.2.0.{rev}"), "labels": {"version": "v2"}}]}),
                rev,
            )
        };
        let resources = vec![
            service("default", "reviews", "10.96.0.20", 9080, 1),
            service("bookinfo", "ratings", "10.96.0.21", 9080, 2),
            service("bookinfo", "details", "10.96.0.22", 9080, 3),
            service("shop", "web", "10.96.0.23", 80, 4),
            resource(
                "DestinationRule",
                "default",
                "reviews",
                json!({"host": "reviews", "subsets": [{"name": "v1", "labels": {"version": "v1"}},
                                                      {"name": "v2", "labels": {"version": "v2"}}]}),
                5,
            ),
            resource(
                "VirtualService",
                "default",
                "reviews",
                json!({"hosts": ["reviews"], "http": [
                    {"match": [{"headers": {"end-user": {"exact": "jason"}}}],
                     "route": [{"destination": {"host": "reviews", "subset": "v2"}}]},
                    {"route": [{"destination": {"host": "reviews", "subset": "v1"}, "weight": 80},
                               {"destination": {"host": "ratings.bookinfo.svc.cluster.local"},
                                "weight": 20}]}]}),
                6,
            ),
            resource(
                "VirtualService",
                "bookinfo",
                "ratings",
                json!({"hosts": ["ratings"], "http": [{"timeout": "3s",
                       "route": [{"destination": {"host": "details"}}]}]}),
                7,
            ),
            resource(
                "ServiceEntry",
                "default",
                "api",
                json!({"hosts": ["api.example.com"],
                       "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
                       "resolution": "DNS"}),
                8,
            ),
        ];
        let cache = Cache::from_resources(resources, 10);
        let proxy = sidecar("10.0.0.9");
        let eager = Translator::new(proxy.clone())
            .update(&cache, Generator::Envoy)
            .expect("translates");
        let eager_hosts: usize = eager.routes.values().map(|r| r.virtual_hosts.len()).sum();
        let (mut compared, mut other_ports, mut by_address) = (0, 0, 0);
        for (name, config) in &eager.routes {
            for vh in &config.virtual_hosts {
                if !vh.name.contains('.') {
                    continue; // allow_any, block_all: the eager config's catch-alls.
                }
                for spelt in vh.domains.iter().filter(|d| !d.starts_with('*')) {
                    let lookup = Lookup::of(spelt, DNS).expect("reads");
                    by_address += usize::from(lookup.address.is_some());
                    let learning = crate::model::proxy::Proxy {
                        learned: Some(std::sync::Arc::new(lookup.hosts.into_iter().collect())),
                        ..proxy.clone()
                    };
                    let lazy = Translator::new(learning).generate(&cache, Generator::Envoy);
                    // A port no learned service has gets no listener and no route
                    // configuration (a VirtualService's host has a virtual host on every HTTP
                    // port of the eager proxy); see docs/on-demand.md, "Ports".
                    let Some(config) = lazy.routes.get(name) else {
                        other_ports += 1;
                        continue;
                    };
                    // Served by VHDS: no virtual host inline, each a resource of its own.
                    let config = RouteConfiguration::decode(config.body.value.as_slice()).unwrap();
                    assert!(
                        config.vhds.is_some() && config.virtual_hosts.is_empty(),
                        "{name}"
                    );
                    let built = lazy
                        .virtual_hosts
                        .get(&format!("{name}/{}", vh.name))
                        .map(|r| VirtualHost::decode(r.body.value.as_slice()).unwrap());
                    // Named in its route configuration's namespace, as VHDS needs.
                    let served = VirtualHost {
                        name: format!("{name}/{}", vh.name),
                        ..vh.clone()
                    };
                    assert_eq!(
                        built,
                        Some(served),
                        "{spelt:?} in route configuration {name}"
                    );
                    for cluster in clusters_of(vh) {
                        let built = lazy
                            .clusters
                            .get(&cluster)
                            .map(|r| Cluster::decode(r.body.value.as_slice()).unwrap());
                        assert_eq!(
                            built.as_ref(),
                            eager.clusters.get(&cluster),
                            "{cluster} for {spelt:?}"
                        );
                    }
                    assert!(
                        lazy.virtual_hosts.len() < eager_hosts,
                        "{spelt:?}: nothing narrowed"
                    );
                    compared += 1;
                }
            }
        }
        assert!(
            compared >= 15 && other_ports > 0 && by_address > 0,
            "{compared} spellings compared ({by_address} addresses), {other_ports} on ports of \
             no learned service"
        );
    }

    /// Learned hosts come back after a restart; those idle too long are forgotten and asked for
    /// again when used; a damaged file is refused naming it.
    #[test]
    fn learned_hosts_are_kept_and_forgotten_when_idle() {
        let dir = tempfile::tempdir().unwrap();
        let start = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut learned = Learned::load(dir.path()).unwrap();
        assert!(learned.hosts().is_empty());
        assert!(learned.learn(["a.ns.svc.cluster.local".to_string()], start));
        assert!(learned.learn(["b.ns.svc.cluster.local".to_string()], start));
        let later = start + Duration::from_secs(600);
        assert!(!learned.learn(["b.ns.svc.cluster.local".to_string()], later));
        // Use of a host keeps it; use of one not learned does not learn it.
        learned.touch(["b.ns.svc.cluster.local", "c.ns.svc.cluster.local"], later);
        assert_eq!(learned.len(), 2);
        learned.save(dir.path()).unwrap();
        let mut back = Learned::load(dir.path()).unwrap();
        assert_eq!(back, learned);
        let gone = back.forget_idle(later + Duration::from_secs(60), Duration::from_secs(300));
        assert_eq!(gone, ["a.ns.svc.cluster.local"]);
        assert_eq!(
            back.hosts(),
            BTreeSet::from(["b.ns.svc.cluster.local".to_string()])
        );
        std::fs::write(dir.path().join(LEARNED_FILE), "{").unwrap();
        let err = Learned::load(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains(LEARNED_FILE) && err.contains("delete it"),
            "{err}"
        );
    }
}
