//! `translate`: the agent's translation of one proxy's scope. A cache of S services (each with E
//! endpoints in three versions, pods with Istio's sidecar, a DestinationRule with three subsets,
//! and for a share of them a VirtualService splitting between two subsets) is translated for a
//! sidecar, then changed one object at a time (a DestinationRule, a VirtualService, a service's
//! endpoints) to measure the incremental work, each time including the encoding into the
//! snapshot ADS serves.
//!
//! With `--clusters` and `--networks` (see [`crate::clusters`]) each service runs in every
//! cluster, its endpoints dealt to the clusters in turn, and the proxy is in the first cluster
//! and network: with several networks its EDS reaches the other networks' endpoints through
//! their gateways (split horizon), and an endpoint change rewrites one cluster's object.
//!
//! With `--proxy router` the proxy is an ingress gateway: one Gateway selects it (HTTP on 80 and
//! HTTPS on 443 for `*.example.com`), and every routed service has a VirtualService bound to that
//! Gateway for `svc-<i>.example.com` (instead of a mesh one).

use std::time::Instant;

use anyhow::ensure;
use pasa_agent::ads::Snapshot;
use pasa_agent::cache::{Cache, Key};
use pasa_agent::identity::IdentityArgs;
use pasa_agent::model::proxy::{Generator, Proxy, ProxyBuild};
use pasa_agent::resource::Generated;
use pasa_agent::translate::Translator;
use pasa_proto::store::v1::Resource;
use pasa_proto::watch::{self, Action};
use serde_json::{Value, json};

use crate::clusters::{ClusterArgs, Topology};
use crate::stats::{peak_rss_mib, percentile, round2};

#[derive(Debug, Clone, clap::Args)]
pub struct TranslateArgs {
    /// Services in the proxy's scope.
    #[arg(long, default_value_t = 1000)]
    pub services: usize,
    /// Endpoints per service.
    #[arg(long, default_value_t = 6)]
    pub endpoints: usize,
    /// Share of services with a VirtualService (0..=1).
    #[arg(long, default_value_t = 0.5)]
    pub routed: f64,
    /// Changes measured per kind.
    #[arg(long, default_value_t = 50)]
    pub changes: usize,
    /// Generator: envoy or grpc.
    #[arg(long, default_value = "envoy")]
    pub generator: String,
    /// The proxy translated for: sidecar, or router (an ingress gateway).
    #[arg(long, default_value = "sidecar")]
    pub proxy: String,
    /// Translations from scratch measured (each by a new translator); the median is reported,
    /// with the first (cold) one.
    #[arg(long, default_value_t = 5)]
    pub full_runs: usize,
    /// Translate for Istio's proxy (`pasa-agent --proxy-build istio`), with the standard
    /// install's mesh config (`defaultProviders.metrics: [prometheus]`): Istio's metrics and
    /// metadata exchange filters on every listener and outbound cluster.
    #[arg(long)]
    pub istio_proxy: bool,
    /// The kinds of change measured (for profiling one of them): destination_rule,
    /// virtual_service, endpoints. All when not given.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    #[command(flatten)]
    pub clusters: ClusterArgs,
}

const NAMESPACES: usize = 20;

/// A resource as the store keeps it, written at `revision`.
pub(crate) fn resource(kind: &str, ns: &str, name: &str, spec: Value, revision: u64) -> Resource {
    Resource {
        api_version: "networking.istio.io/v1".into(),
        kind: kind.into(),
        namespace: ns.into(),
        name: name.into(),
        spec_json: spec.to_string(),
        create_revision: revision,
        mod_revision: revision,
        version: 1,
        ..Default::default()
    }
}

/// Service `i` with `endpoints` endpoints of pods without a sidecar, in one cluster.
pub(crate) fn service(i: usize, endpoints: usize, revision: u64) -> Resource {
    let single = Placement {
        topology: &Topology::default(),
        cluster: 0,
        injected: false,
    };
    service_in(i, endpoints, single, false, revision)
}

/// Which cluster's object of a service is written, and what its pods are.
#[derive(Clone, Copy)]
struct Placement<'a> {
    topology: &'a Topology,
    /// The cluster whose object it is.
    cluster: usize,
    /// Its pods run Istio's sidecar (`security.istio.io/tlsMode: istio`): they take Istio
    /// mutual TLS, which traffic through another network's gateway needs.
    injected: bool,
}

/// Service `i`'s object in the cluster of `at`: of its `endpoints` endpoints, those dealt to
/// the cluster (endpoint `e` to cluster `e mod clusters`), and with `extra` one more (a pod
/// started there).
fn service_in(
    i: usize,
    endpoints: usize,
    at: Placement<'_>,
    extra: bool,
    revision: u64,
) -> Resource {
    let (topology, c) = (at.topology, at.cluster);
    let clusters = topology.clusters();
    let dealt = (0..endpoints).filter(|e| e % clusters == c);
    let eps: Vec<Value> = dealt
        .chain(extra.then_some(endpoints + c))
        .map(|e| {
            let mut labels =
                json!({"app": format!("svc-{i}"), "version": format!("v{}", e % 3 + 1)});
            if at.injected {
                labels["security.istio.io/tlsMode"] = json!("istio");
            }
            json!({"address": format!("10.{}.{}.{}", i / 250 % 250, i % 250, e + 1),
                   "labels": labels, "locality": format!("region/zone-{}", e % 2)})
        })
        .collect();
    // Each cluster gives the service addresses of its own.
    let vip = if c == 0 { 96 } else { 100 + c };
    let name = format!("svc-{i}");
    let mut spec = json!({"addresses": [format!("10.{vip}.{}.{}", i / 250, i % 250)],
                          "ports": [{"name": "http", "port": 8080}, {"name": "grpc", "port": 9090}],
                          "endpoints": eps});
    topology.place(&mut spec, &name, c);
    resource(
        "ServiceEndpoints",
        &format!("ns-{}", i % NAMESPACES),
        &topology.object_name(&name, c),
        spec,
        revision,
    )
}

pub(crate) fn rule(i: usize, lb: &str, revision: u64) -> Resource {
    resource(
        "DestinationRule",
        &format!("ns-{}", i % NAMESPACES),
        &format!("svc-{i}"),
        json!({"host": format!("svc-{i}"), "trafficPolicy": {"loadBalancer": {"simple": lb}},
               "subsets": [{"name": "v1", "labels": {"version": "v1"}},
                           {"name": "v2", "labels": {"version": "v2"}},
                           {"name": "v3", "labels": {"version": "v3"}}]}),
        revision,
    )
}

pub(crate) fn split(i: usize, v1: u32, router: bool, revision: u64) -> Resource {
    let host = format!("svc-{i}");
    let route = json!([
        {"destination": {"host": host, "subset": "v1"}, "weight": v1},
        {"destination": {"host": host, "subset": "v2"}, "weight": 100 - v1}]);
    let spec = if router {
        json!({"hosts": [format!("{host}.example.com")], "gateways": ["istio-system/ingress"],
               "http": [{"match": [{"uri": {"prefix": "/"}}], "route": route}]})
    } else {
        json!({"hosts": [host], "http": [{"route": route}]})
    };
    resource(
        "VirtualService",
        &format!("ns-{}", i % NAMESPACES),
        &host,
        spec,
        revision,
    )
}

/// The ingress Gateway of `--proxy router`.
fn ingress(revision: u64) -> Resource {
    resource(
        "Gateway",
        "istio-system",
        "ingress",
        json!({"selector": {"istio": "ingressgateway"}, "servers": [
            {"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*/*.example.com"]},
            {"port": {"number": 443, "name": "https", "protocol": "HTTPS"}, "hosts": ["*/*.example.com"],
             "tls": {"mode": "SIMPLE", "credentialName": "example-com"}}]}),
        revision,
    )
}

/// How many endpoints of `generated`'s load assignments are network gateways of `topology`:
/// another network's endpoints, reached through its gateway. Counted in the encoded form, as
/// the `istio.stats` check is (decoding would add the typed resources to the peak RSS this mode
/// reports): a socket address is a string field, its length before it.
fn through_gateways(generated: &Generated, topology: &Topology) -> usize {
    let patterns: Vec<Vec<u8>> = topology
        .gateway_services()
        .iter()
        .filter_map(|(_, spec)| spec["networkGateways"][0]["address"].as_str())
        .filter_map(|a| Some([&[u8::try_from(a.len()).ok()?], a.as_bytes()].concat()))
        .collect();
    generated
        .endpoints
        .values()
        .map(|r| {
            let body = &r.body.value;
            patterns
                .iter()
                .map(|p| body.windows(p.len()).filter(|w| w == p).count())
                .sum::<usize>()
        })
        .sum()
}

pub fn run(args: &TranslateArgs) -> anyhow::Result<Value> {
    ensure!(args.services > 0, "--services must be at least 1");
    ensure!(
        (0.0..=1.0).contains(&args.routed),
        "--routed is a share, 0..=1"
    );
    let generator = match args.generator.as_str() {
        "envoy" => Generator::Envoy,
        "grpc" => Generator::Grpc,
        other => anyhow::bail!("--generator {other:?}: use envoy or grpc"),
    };
    let router = match args.proxy.as_str() {
        "sidecar" => false,
        "router" => true,
        other => anyhow::bail!("--proxy {other:?}: use sidecar or router"),
    };
    let topology = Topology::new(args.clusters)?;
    ensure!(
        args.endpoints + topology.clusters() < 255,
        "--endpoints + --clusters must be under 255 (a service's endpoints share a /24)"
    );
    let routed = (args.services as f64 * args.routed).round() as usize;
    let mut revision = 0u64;
    let mut next = || {
        revision += 1;
        revision
    };
    let mut objects = Vec::new();
    for (name, spec) in topology.gateway_services() {
        objects.push(resource(
            "ServiceEndpoints",
            "istio-system",
            &name,
            spec,
            next(),
        ));
    }
    // The sidecar's mesh is one of sidecars: their pods take Istio mutual TLS, which traffic
    // to another network's endpoints needs (through its gateway).
    let placed = |cluster| Placement {
        topology: &topology,
        cluster,
        injected: true,
    };
    for i in 0..args.services {
        for c in 0..topology.clusters() {
            objects.push(service_in(i, args.endpoints, placed(c), false, next()));
        }
        objects.push(rule(i, "ROUND_ROBIN", next()));
        if i < routed {
            objects.push(split(i, 80, router, next()));
        }
    }
    if router {
        objects.push(ingress(next()));
    }
    if args.istio_proxy {
        objects.push(resource(
            "MeshConfig",
            "istio-system",
            "mesh",
            json!({"defaultProviders": {"metrics": ["prometheus"]}}),
            next(),
        ));
    }
    // Revisions 1..=n were used by the objects.
    let loaded_at = objects.len() as u64;
    let (node_id, labels) = if router {
        (
            "router~10.200.0.2~ingress-1.istio-system~istio-system.svc.cluster.local",
            "istio=ingressgateway",
        )
    } else {
        ("sidecar~10.200.0.1~bench-1.ns-0~ns-0.svc.cluster.local", "")
    };
    let identity = IdentityArgs {
        node_id: node_id.into(),
        labels: labels.into(),
        service_account: "default".into(),
        cluster_id: topology.cluster_id(0),
        network: topology.network(0),
        ..Default::default()
    }
    .resolve()?;
    ensure!(args.full_runs > 0, "--full-runs must be at least 1");
    let mut proxy = Proxy::from_identity(&identity, Default::default());
    if args.istio_proxy {
        proxy.build = ProxyBuild::Istio;
    }
    let mut cache = Cache::from_resources(objects.clone(), loaded_at);

    // As the agent serves: the translator encodes what it rebuilt, the snapshot shares it.
    let mut full_samples = Vec::with_capacity(args.full_runs);
    let mut from_scratch = || {
        let mut translator = Translator::new(proxy.clone());
        let started = Instant::now();
        let resources = translator.generate(&cache, generator);
        let _snapshot = Snapshot::from_generated(&resources);
        full_samples.push(started.elapsed().as_secs_f64() * 1e3);
        (translator, resources)
    };
    let (mut translator, resources) =
        (1..args.full_runs).fold(from_scratch(), |_, _| from_scratch());
    let full = percentile(&full_samples, 50.0);
    let cold = full_samples[0];
    let counts = [
        resources.clusters.len(),
        resources.endpoints.len(),
        resources.listeners.len(),
        resources.routes.len(),
    ];
    // The load assignments' encoded size: what split horizon changes (another network's
    // endpoints become its gateway).
    let eds_bytes: usize = resources
        .endpoints
        .values()
        .map(|r| r.body.value.len())
        .sum();
    let through_gateways = through_gateways(&resources, &topology);
    println!(
        "full translation of {} services in {} clusters on {} networks ({} objects): p50 \
         {full:.1} ms of {} (first {cold:.1} ms), encoded; clusters {}, endpoints {} ({:.1} KiB, \
         {through_gateways} endpoints are network gateways), listeners {}, routes {}",
        args.services,
        topology.clusters(),
        topology.networks(),
        objects.len(),
        args.full_runs,
        counts[0],
        counts[1],
        eds_bytes as f64 / 1024.0,
        counts[2],
        counts[3]
    );

    // The listeners Istio's stats filter is on (a check that `--istio-proxy` measured it).
    let with_stats = resources
        .listeners
        .values()
        .filter(|l| {
            l.body
                .value
                .windows(b"istio.stats".len())
                .any(|w| w == b"istio.stats")
        })
        .count();
    if args.istio_proxy {
        println!("istio.stats on {with_stats} of {} listeners", counts[2]);
    }
    let mut summary = json!({
        "mode": "translate",
        "istio_proxy": args.istio_proxy,
        "listeners_with_istio_stats": with_stats,
        "services": args.services,
        "kubernetes_clusters": topology.clusters(),
        "networks": topology.networks(),
        "objects": objects.len(),
        "generator": args.generator,
        "proxy": args.proxy,
        "clusters": counts[0],
        "endpoints": counts[1],
        "listeners": counts[2],
        "routes": counts[3],
        "eds_bytes": eds_bytes,
        "endpoints_through_gateways": through_gateways,
        "full_ms": round2(full),
        "full_first_ms": round2(cold),
    });
    type Change<'a> = &'a dyn Fn(usize, u64) -> Resource;
    let kinds: [(&str, Change); 3] = [
        ("destination_rule", &|i, r| rule(i, "LEAST_REQUEST", r)),
        ("virtual_service", &|i, r| split(i, 50, router, r)),
        // One pod more in one cluster, each change in the next cluster.
        ("endpoints", &|i, r| {
            service_in(i, args.endpoints, placed(i % topology.clusters()), true, r)
        }),
    ];
    for name in &args.only {
        ensure!(
            kinds.iter().any(|(kind, _)| kind == name),
            "--only: unknown change kind {name:?} (destination_rule, virtual_service, endpoints)"
        );
    }
    for (name, change) in kinds {
        if !args.only.is_empty() && !args.only.iter().any(|o| o == name) {
            continue;
        }
        let mut samples = Vec::with_capacity(args.changes);
        let mut rebuilt = 0;
        let mut listeners_rebuilt = 0;
        let mut routes_rebuilt = 0;
        let mut virtual_hosts = 0;
        for c in 0..args.changes {
            let i = (c * 7919) % routed.max(1);
            // As the agent's store watch delivers it: one event applied to the cache.
            let rev = next();
            let mut modified = change(i, rev);
            // As the store writes a modification: the object keeps its creation revision.
            if let Some(existing) = Key::of(&modified).and_then(|key| cache.get(&key)) {
                modified.create_revision = existing.create_revision;
            }
            cache.apply(watch::Change {
                action: Action::Modified,
                resource: modified,
                revision: rev,
                committed: None,
            });
            let started = Instant::now();
            let resources = translator.generate(&cache, generator);
            let _snapshot = Snapshot::from_generated(&resources);
            samples.push(started.elapsed().as_secs_f64() * 1e3);
            let counts = translator.rebuilt();
            rebuilt += counts.services;
            listeners_rebuilt += usize::from(counts.listeners);
            routes_rebuilt += counts.routes;
            virtual_hosts += counts.virtual_hosts;
        }
        let p50 = percentile(&samples, 50.0);
        let p99 = percentile(&samples, 99.0);
        println!(
            "one {name} changed: p50 {p50:.2} ms, p99 {p99:.2} ms (translate + encode), \
             services rebuilt per change: {:.1}, route configurations per change: {:.1} \
             ({:.1} virtual hosts encoded), listeners rebuilt in {} of {} changes",
            rebuilt as f64 / args.changes as f64,
            routes_rebuilt as f64 / args.changes as f64,
            virtual_hosts as f64 / args.changes as f64,
            listeners_rebuilt,
            args.changes
        );
        summary[format!("{name}_p50_ms")] = json!(round2(p50));
        summary[format!("{name}_p99_ms")] = json!(round2(p99));
    }
    if let Some(rss) = peak_rss_mib() {
        summary["peak_rss_mib"] = json!(round2(rss));
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(clusters: usize, networks: usize) -> TranslateArgs {
        TranslateArgs {
            services: 6,
            endpoints: 6,
            routed: 0.5,
            changes: 3,
            generator: "envoy".into(),
            proxy: "sidecar".into(),
            full_runs: 1,
            istio_proxy: false,
            only: Vec::new(),
            clusters: ClusterArgs { clusters, networks },
        }
    }

    /// On one network every endpoint is sent as it is; on two, the other network's are
    /// reached through its gateway (split horizon).
    #[test]
    fn another_networks_endpoints_are_reached_through_its_gateway() {
        let one = run(&args(3, 1)).unwrap();
        let two = run(&args(3, 2)).unwrap();
        assert_eq!(one["endpoints_through_gateways"], 0, "{one}");
        assert!(
            two["endpoints_through_gateways"].as_u64().unwrap() > 0,
            "{two}"
        );
        assert_eq!(
            (&one["kubernetes_clusters"], &two["networks"]),
            (&json!(3), &json!(2))
        );
    }
}
