//! `translate`: the agent's translation of one proxy's scope. A cache of S services (each with E
//! endpoints in three versions, a DestinationRule with three subsets, and for a share of them a
//! VirtualService splitting between two subsets) is translated for a sidecar, then changed one
//! object at a time (a DestinationRule, a VirtualService, a service's endpoints) to measure the
//! incremental work, each time including the encoding into the snapshot ADS serves.
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
use pasa_agent::translate::Translator;
use pasa_proto::store::v1::Resource;
use pasa_proto::watch::{self, Action};
use serde_json::{Value, json};

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

pub(crate) fn service(i: usize, endpoints: usize, revision: u64) -> Resource {
    let eps: Vec<Value> = (0..endpoints)
        .map(|e| {
            json!({"address": format!("10.{}.{}.{}", i / 250 % 250, i % 250, e + 1),
                   "labels": {"app": format!("svc-{i}"), "version": format!("v{}", e % 3 + 1)},
                   "locality": format!("region/zone-{}", e % 2)})
        })
        .collect();
    resource(
        "ServiceEndpoints",
        &format!("ns-{}", i % NAMESPACES),
        &format!("svc-{i}"),
        json!({"addresses": [format!("10.96.{}.{}", i / 250, i % 250)],
               "ports": [{"name": "http", "port": 8080}, {"name": "grpc", "port": 9090}],
               "endpoints": eps}),
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
    let routed = (args.services as f64 * args.routed).round() as usize;
    let mut revision = 0u64;
    let mut next = || {
        revision += 1;
        revision
    };
    let mut objects = Vec::new();
    for i in 0..args.services {
        objects.push(service(i, args.endpoints, next()));
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
        cluster_id: "Kubernetes".into(),
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
    println!(
        "full translation of {} services ({} objects): p50 {full:.1} ms of {} (first {cold:.1} ms), \
         encoded; clusters {}, endpoints {}, listeners {}, routes {}",
        args.services,
        objects.len(),
        args.full_runs,
        counts[0],
        counts[1],
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
        "objects": objects.len(),
        "generator": args.generator,
        "proxy": args.proxy,
        "clusters": counts[0],
        "endpoints": counts[1],
        "listeners": counts[2],
        "routes": counts[3],
        "full_ms": round2(full),
        "full_first_ms": round2(cold),
    });
    type Change<'a> = &'a dyn Fn(usize, u64) -> Resource;
    let kinds: [(&str, Change); 3] = [
        ("destination_rule", &|i, r| rule(i, "LEAST_REQUEST", r)),
        ("virtual_service", &|i, r| split(i, 50, router, r)),
        ("endpoints", &|i, r| service(i, args.endpoints + 1, r)),
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
