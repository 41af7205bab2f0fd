//! `kube-sync`: the Kubernetes syncer at mesh scale. A **fake** Kubernetes API server (pasa-kube's,
//! in this process) holds a cluster of S Services with P pods in EndpointSlices of at most N
//! endpoints; the real syncer (kube's watchers and reflectors) follows it into the real store on
//! sled. Measured: the first complete sync (time, objects and bytes written), then C pod label
//! changes one at a time (the API server's event → the store's durable write of the slice's
//! part, and the bytes written per change against what one object per Service would rewrite),
//! then a restart of the syncer (time until it has compared everything, and what it wrote).
//! Written through the store directly, not PCP's validation: the syncer's own cost and the
//! store's, not admission's (measured by `write` and the webhook tests).
//!
//! With `--clusters N` there are N fake API servers: PCP's own cluster and N − 1 remote ones,
//! each with every Service and its share of the pods (and, with `--networks`, its network and an
//! east-west gateway Service). Each cluster has a syncer of its own, set up as PCP's
//! remote-cluster controller sets one up (a remote reads the registry alone and writes under its
//! own names), all running at once into one store as PCP's leader runs them; every figure is
//! also given per cluster.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use pasa_istio::service_endpoints::{DEFAULT_GATEWAY_PORT, SLICE_NAME_SUFFIX, remote_slice_name};
use pasa_kube::convert::StoreKey;
use pasa_kube::fake_apiserver::FakeApiServer;
use pasa_kube::metrics::SyncMetrics;
use pasa_kube::selectors::DiscoverySelectors;
use pasa_kube::syncer::{Reads, SyncConfig, SyncStatus, Syncer, Target, WriteError};
use pasa_proto::store::v1::ApplyDocument;
use pasa_store::Store;
use serde_json::{Value, json};

use crate::clusters::{ClusterArgs, GATEWAY_SERVICE, Topology};
use crate::stats::{peak_rss_mib, percentile, reset_peak_rss, round2, rss_mib};

const NAMESPACES: usize = 50;
const NODES: usize = 20;
/// Each cluster's system namespace, where its east-west gateway runs.
const SYSTEM_NAMESPACE: &str = "istio-system";
/// The label naming a namespace's, a pod's or a gateway's network.
const NETWORK_LABEL: &str = "topology.istio.io/network";

#[derive(Debug, Clone, clap::Args)]
pub struct KubeSyncArgs {
    /// Services in the cluster.
    #[arg(long, default_value_t = 2000)]
    pub services: usize,
    /// Pods, spread evenly over the services.
    #[arg(long, default_value_t = 100_000)]
    pub pods: usize,
    /// Endpoints per EndpointSlice, at most (Kubernetes' default: 100).
    #[arg(long, default_value_t = 100)]
    pub slice_size: usize,
    /// Pod label changes timed one at a time after the first sync.
    #[arg(long, default_value_t = 200)]
    pub changes: usize,
    #[command(flatten)]
    pub topology: ClusterArgs,
}

/// The store behind the syncer, counting what it is asked to write.
#[derive(Clone)]
struct CountingStore {
    store: Store,
    counts: Arc<Mutex<Counts>>,
}

#[derive(Default, Clone)]
struct Counts {
    deletes: u64,
    /// What was written, per cluster (the `pasa.io/cluster` label of the object).
    clusters: BTreeMap<String, Tally>,
    /// When each key was last written, its size and its cluster.
    last: BTreeMap<String, Written>,
}

#[derive(Default, Clone, Copy)]
struct Tally {
    applies: u64,
    bytes: u64,
    /// Objects written that are network gateways (`spec.networkGateways`).
    network_gateways: u64,
}

#[derive(Clone)]
struct Written {
    at: Instant,
    size: usize,
    cluster: String,
}

impl Counts {
    fn of(&self, cluster: &str) -> Tally {
        self.clusters.get(cluster).copied().unwrap_or_default()
    }

    fn total(&self) -> Tally {
        self.clusters
            .values()
            .fold(Tally::default(), |sum, t| Tally {
                applies: sum.applies + t.applies,
                bytes: sum.bytes + t.bytes,
                network_gateways: sum.network_gateways + t.network_gateways,
            })
    }
}

impl CountingStore {
    /// What has been written so far (without the keys' last writes).
    fn counts(&self) -> Counts {
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        Counts {
            deletes: counts.deletes,
            clusters: counts.clusters.clone(),
            last: BTreeMap::new(),
        }
    }
}

impl Target for CountingStore {
    async fn clusters(&self) -> Result<std::collections::BTreeSet<String>, WriteError> {
        let selector = pasa_store::selector::Selector::everything();
        let (resources, _) = self
            .store
            .list(&selector, 0)
            .await
            .map_err(|e| WriteError::Unavailable(e.to_string()))?;
        Ok(resources
            .iter()
            .filter_map(|r| r.labels.get(pasa_kube::convert::CLUSTER_LABEL).cloned())
            .collect())
    }

    async fn owned(&self, cluster: &str) -> Result<Vec<Value>, WriteError> {
        let selector = pasa_store::selector::Selector::everything();
        let (resources, _) = self
            .store
            .list(&selector, 0)
            .await
            .map_err(|e| WriteError::Unavailable(e.to_string()))?;
        Ok(resources
            .iter()
            .filter(|r| {
                r.labels
                    .get(pasa_kube::convert::CLUSTER_LABEL)
                    .map(String::as_str)
                    == Some(cluster)
            })
            .map(|r| pasa_proto::object::manifest(r))
            .collect())
    }

    async fn apply(
        &self,
        doc: Value,
        _generated: bool,
        create_only: bool,
    ) -> Result<(), WriteError> {
        let name = format!(
            "{}/{}",
            doc["metadata"]["namespace"].as_str().unwrap_or_default(),
            doc["metadata"]["name"].as_str().unwrap_or_default()
        );
        let cluster = doc["metadata"]["labels"][pasa_kube::convert::CLUSTER_LABEL]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let gateway = doc["spec"]["networkGateways"]
            .as_array()
            .is_some_and(|g| !g.is_empty());
        let json = doc.to_string();
        let size = json.len();
        let response = self
            .store
            .apply(
                vec![ApplyDocument {
                    json,
                    expected_mod_revision: create_only.then_some(0),
                }],
                false,
            )
            .await
            .map_err(|e| WriteError::Unavailable(e.to_string()))?;
        if let Some(e) = response.errors.first() {
            return Err(WriteError::Refused(format!("{}: {}", e.field, e.message)));
        }
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let tally = counts.clusters.entry(cluster.clone()).or_default();
        tally.applies += 1;
        tally.bytes += size as u64;
        tally.network_gateways += u64::from(gateway);
        counts.last.insert(
            name,
            Written {
                at: Instant::now(),
                size,
                cluster,
            },
        );
        Ok(())
    }

    async fn delete(&self, key: &StoreKey) -> Result<(), WriteError> {
        let request = key.delete_request();
        self.store
            .delete(request)
            .await
            .map_err(|e| WriteError::Unavailable(e.to_string()))?;
        self.counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .deletes += 1;
        Ok(())
    }
}

fn pod(ns: &str, name: &str, service: usize, version: &str, node: usize) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns,
                     "labels": {"app": format!("svc-{service}"), "version": version}},
        "spec": {"serviceAccountName": format!("svc-{service}"), "nodeName": format!("node-{node}"),
                 "containers": [{"name": "app", "image": "app:1"}]},
        "status": {"phase": "Running"},
    })
}

/// A pod of the generated cluster: its namespace, name, service (number) and EndpointSlice.
struct PodRef {
    namespace: String,
    name: String,
    service: usize,
    slice: String,
}

/// One cluster of the run: its fake API server, what it holds, and how its syncer is set up.
struct Cluster {
    id: String,
    network: String,
    fake: FakeApiServer,
    config: SyncConfig,
    pods: Vec<PodRef>,
    slices: usize,
}

impl Cluster {
    /// The store key of the part `slice` of this cluster is written as.
    fn part_key(&self, namespace: &str, slice: &str) -> String {
        let name = if self.config.remote {
            remote_slice_name(slice, &self.id)
        } else {
            format!("{slice}{SLICE_NAME_SUFFIX}")
        };
        format!("{namespace}/{name}")
    }

    fn role(&self) -> &'static str {
        if self.config.remote {
            "remote"
        } else {
            "PCP's own"
        }
    }
}

/// Cluster `c` of `topology` on a fake API server of its own: every service, with its share of
/// each service's pods (dealt to the clusters in turn); with several networks, its system
/// namespace says its network and it has an east-west gateway Service. `next_pod` numbers pods
/// across clusters, so that no two share an address.
async fn build_cluster(
    args: &KubeSyncArgs,
    topology: &Topology,
    c: usize,
    next_pod: &mut usize,
) -> Cluster {
    let id = topology.cluster_id(c);
    let network = topology.network(c);
    let clusters = topology.clusters();
    let fake = FakeApiServer::start().await;
    let network_label = [(NETWORK_LABEL, network.as_str())];
    fake.put_namespace(
        SYSTEM_NAMESPACE,
        if network.is_empty() {
            &[]
        } else {
            &network_label
        },
    );
    for n in 0..NAMESPACES {
        fake.put_namespace(&format!("ns-{n}"), &[]);
    }
    for n in 0..NODES {
        fake.put(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": format!("node-{n}"), "labels": {
                "topology.kubernetes.io/region": format!("region-{}", c + 1),
                "topology.kubernetes.io/zone": format!("zone-{}", n % 3)}}}));
    }
    if !network.is_empty() {
        fake.put(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": GATEWAY_SERVICE, "namespace": SYSTEM_NAMESPACE,
                         "labels": {NETWORK_LABEL: network, "istio": "eastwestgateway"}},
            "spec": {"type": "LoadBalancer", "clusterIP": format!("10.{}.255.1", 96 + c),
                     "selector": {"istio": "eastwestgateway"},
                     "ports": [{"name": "tls", "port": DEFAULT_GATEWAY_PORT,
                                "targetPort": DEFAULT_GATEWAY_PORT}]},
            "status": {"loadBalancer": {"ingress": [{"ip": format!("10.90.0.{}", c + 1)}]}}}));
    }
    let mut pods = Vec::new();
    let mut slices = 0usize;
    for s in 0..args.services {
        let ns = format!("ns-{}", s % NAMESPACES);
        let service = format!("svc-{s}");
        fake.put(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": service, "namespace": ns},
            "spec": {"clusterIP": format!("10.{}.{}.{}", 96 + c, s / 250, s % 250 + 1),
                     "selector": {"app": service},
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}));
        let in_service = args.pods / args.services + usize::from(s < args.pods % args.services);
        let count = in_service / clusters + usize::from(c < in_service % clusters);
        let names: Vec<String> = (0..count).map(|i| format!("{service}-{i}")).collect();
        for (chunk_no, chunk) in names.chunks(args.slice_size).enumerate() {
            let slice = format!("{service}-{chunk_no}");
            let mut endpoints = Vec::with_capacity(chunk.len());
            for name in chunk {
                let i = *next_pod;
                *next_pod += 1;
                let node = i % NODES;
                fake.put(pod(&ns, name, s, "v1", node));
                endpoints.push(json!({
                    "addresses": [format!("10.{}.{}.{}", 1 + i / 65536, (i / 256) % 256, i % 256)],
                    "conditions": {"ready": true}, "nodeName": format!("node-{node}"),
                    "targetRef": {"kind": "Pod", "name": name, "namespace": ns}}));
                pods.push(PodRef {
                    namespace: ns.clone(),
                    name: name.clone(),
                    service: s,
                    slice: slice.clone(),
                });
            }
            fake.put(
                json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": slice, "namespace": ns,
                             "labels": {"kubernetes.io/service-name": service}},
                "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}],
                "endpoints": endpoints}),
            );
            slices += 1;
        }
    }
    // As PCP's remote-cluster controller sets up a remote's syncer: the registry alone, under
    // the remote's own names.
    let remote = c > 0;
    let config = SyncConfig {
        cluster_id: id.clone(),
        discovery: DiscoverySelectors::all(),
        ingress: pasa_kube::ingress::Settings::default(),
        gateway_api: pasa_kube::gateway_api::Settings::default(),
        send_unhealthy_endpoints: true,
        api_server: format!("http://{}", fake.addr),
        reads: if remote {
            Reads::Registry
        } else {
            Reads::Everything
        },
        remote,
        system_namespace: SYSTEM_NAMESPACE.into(),
        mesh_networks: None,
    };
    Cluster {
        id,
        network,
        fake,
        config,
        pods,
        slices,
    }
}

/// Starts a syncer per cluster, all at once into `target`, as PCP's leader runs them.
fn start_syncers(clusters: &[Cluster], target: &CountingStore) -> Vec<Syncer> {
    clusters
        .iter()
        .map(|c| {
            Syncer::start(
                c.fake.client(),
                c.config.clone(),
                target.clone(),
                Arc::new(SyncMetrics::default()),
            )
        })
        .collect()
}

/// Waits (at most `limit`) until every syncer has synced: each one's status then, and its
/// seconds since `started`.
async fn all_synced(
    syncers: &[Syncer],
    started: Instant,
    limit: Duration,
    what: &str,
) -> anyhow::Result<Vec<(SyncStatus, f64)>> {
    let waits: Vec<_> = syncers
        .iter()
        .map(|syncer| {
            let mut status = syncer.status();
            tokio::spawn(tokio::time::timeout(limit, async move {
                loop {
                    // The status at each change, until synced.
                    let now = status.borrow_and_update().clone();
                    if now.synced {
                        return anyhow::Ok((now, started.elapsed().as_secs_f64()));
                    }
                    status.changed().await.context("a syncer stopped")?;
                }
            }))
        })
        .collect();
    let mut done = Vec::with_capacity(waits.len());
    for wait in waits {
        done.push(
            wait.await?
                .with_context(|| format!("timed out waiting for {what}"))??,
        );
    }
    Ok(done)
}

pub fn run(args: &KubeSyncArgs) -> anyhow::Result<Value> {
    anyhow::ensure!(
        args.services > 0 && args.slice_size > 0,
        "--services and --slice-size must be > 0"
    );
    let topology = Topology::new(args.topology)?;
    anyhow::ensure!(
        args.pods >= args.services * topology.clusters(),
        "--pods must be at least --services × --clusters ({}), so that each service has a pod in every cluster",
        args.services * topology.clusters()
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run_async(args, &topology))
}

async fn run_async(args: &KubeSyncArgs, topology: &Topology) -> anyhow::Result<Value> {
    let built = Instant::now();
    let mut clusters = Vec::with_capacity(topology.clusters());
    let mut next_pod = 0;
    for c in 0..topology.clusters() {
        clusters.push(build_cluster(args, topology, c, &mut next_pod).await);
    }
    let slices: usize = clusters.iter().map(|c| c.slices).sum();
    println!(
        "kube-sync: {} fake API server{} hold{} {} services, {next_pod} pods, {slices} EndpointSlices, {NODES} nodes each{} (built in {:.1}s)",
        clusters.len(),
        if clusters.len() == 1 { "" } else { "s" },
        if clusters.len() == 1 { "s" } else { "" },
        args.services,
        if topology.networks() > 1 {
            format!(
                "; {} networks, an east-west gateway per cluster",
                topology.networks()
            )
        } else {
            String::new()
        },
        built.elapsed().as_secs_f64()
    );

    let embedded = crate::embedded::open(None, "pasa-bench-kube-sync", 1000)?;
    let target = CountingStore {
        store: embedded.store.clone(),
        counts: Arc::new(Mutex::new(Counts::default())),
    };
    // The process before the syncers start: the fakes' clusters and the empty store. What the
    // sync adds on top is the syncers' (their reflectors, their written copies), the store's,
    // and the fakes' list answers while they are sent.
    let rss_before = rss_mib().unwrap_or(0.0);
    let peak_resettable = reset_peak_rss();
    let started = Instant::now();
    let syncers = start_syncers(&clusters, &target);
    let first = all_synced(
        &syncers,
        started,
        Duration::from_secs(600),
        "the first sync",
    )
    .await?;
    let sync_s = started.elapsed().as_secs_f64();
    let after_sync = target.counts();
    let refused: u64 = first.iter().map(|(s, _)| s.refused).sum();
    let rss_synced = peak_rss_mib().unwrap_or(0.0);
    let rss_settled = rss_mib().unwrap_or(0.0);
    println!(
        "kube-sync: first sync {sync_s:.1}s: {} objects written ({refused} refused), {:.1} MiB; RSS {rss_before:.0} MiB before (the fakes' clusters), peak {rss_synced:.0} MiB{} during the sync, {rss_settled:.0} MiB after it",
        after_sync.total().applies,
        after_sync.total().bytes as f64 / (1 << 20) as f64,
        if peak_resettable {
            ""
        } else {
            " (peak of the whole run)"
        }
    );

    // One pod's labels at a time, the clusters in turn: the API server's event → the durable
    // write of its slice's part.
    let per_part: BTreeMap<String, (usize, String)> = {
        let c = target.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.last
            .iter()
            .map(|(k, w)| (k.clone(), (w.size, w.cluster.clone())))
            .collect()
    };
    let mut changes: Vec<Changes> = clusters.iter().map(|_| Changes::default()).collect();
    let per_cluster = args.changes.div_ceil(clusters.len());
    for k in 0..args.changes {
        let (c, nth) = (k % clusters.len(), k / clusters.len());
        let cluster = &clusters[c];
        let stride = (cluster.pods.len() / per_cluster.max(1)).max(1);
        let pod_ref = &cluster.pods[(nth * stride) % cluster.pods.len()];
        let key = cluster.part_key(&pod_ref.namespace, &pod_ref.slice);
        let before = target.counts().total().applies;
        let sent = Instant::now();
        cluster.fake.put(pod(
            &pod_ref.namespace,
            &pod_ref.name,
            pod_ref.service,
            &format!("v{}", k + 2),
            (nth * stride) % NODES,
        ));
        let wrote = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                {
                    let counts = target.counts.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(w) = counts.last.get(&key)
                        && w.at > sent
                    {
                        return (w.at, w.size, counts.total().applies - before);
                    }
                }
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        })
        .await
        .with_context(|| {
            format!(
                "the change of pod {}/{} in {} was not written",
                pod_ref.namespace, pod_ref.name, cluster.id
            )
        })?;
        anyhow::ensure!(wrote.2 == 1, "a pod's change wrote {} objects", wrote.2);
        // What one object per Service would have rewritten: every part of the service in
        // the cluster.
        let prefix = format!("{}/svc-{}-", pod_ref.namespace, pod_ref.service);
        let whole_service = per_part
            .iter()
            .filter(|(k, (_, of))| k.starts_with(&prefix) && *of == cluster.id)
            .map(|(_, (size, _))| *size as f64)
            .sum::<f64>();
        let changes = &mut changes[c];
        changes
            .latencies
            .push(wrote.0.duration_since(sent).as_secs_f64() * 1000.0);
        changes.written.push(wrote.1 as f64);
        changes.whole_service.push(whole_service);
    }
    let all_changes = Changes::concat(&changes);
    println!(
        "kube-sync: {} pod label changes, each 1 part written: API event → durable store write p50 {:.1} ms, p99 {:.1} ms; {:.1} KiB written per change, against {:.1} KiB for the whole service",
        all_changes.latencies.len(),
        percentile(&all_changes.latencies, 50.0),
        percentile(&all_changes.latencies, 99.0),
        mean(&all_changes.written) / 1024.0,
        mean(&all_changes.whole_service) / 1024.0
    );

    // A restart of every syncer with nothing changed.
    drop(syncers);
    let before = target.counts();
    let restarted = Instant::now();
    let syncers = start_syncers(&clusters, &target);
    let again = all_synced(
        &syncers,
        restarted,
        Duration::from_secs(600),
        "the sync after a restart",
    )
    .await?;
    let restart_s = restarted.elapsed().as_secs_f64();
    let after = target.counts();
    let rewritten = (
        after.total().applies - before.total().applies,
        after.deletes - before.deletes,
    );
    println!(
        "kube-sync: restart: compared in {restart_s:.1}s, {} written, {} deleted",
        rewritten.0, rewritten.1
    );
    drop(syncers);
    embedded.store.shutdown();

    let mut per_cluster_reports = Vec::with_capacity(clusters.len());
    for (i, cluster) in clusters.iter().enumerate() {
        let synced = after_sync.of(&cluster.id);
        let restart_written = after.of(&cluster.id).applies - before.of(&cluster.id).applies;
        let changes = &changes[i];
        if clusters.len() > 1 {
            println!(
                "kube-sync:   {} ({}{}): {} pods, {} slices: synced in {:.1}s, {} objects ({} network gateway{}), {:.1} MiB; pod change p50 {:.1} ms, p99 {:.1} ms; restart {:.1}s, {restart_written} written",
                cluster.id,
                cluster.role(),
                if cluster.network.is_empty() {
                    String::new()
                } else {
                    format!(", {}", cluster.network)
                },
                cluster.pods.len(),
                cluster.slices,
                first[i].1,
                synced.applies,
                synced.network_gateways,
                if synced.network_gateways == 1 {
                    ""
                } else {
                    "s"
                },
                synced.bytes as f64 / (1 << 20) as f64,
                percentile(&changes.latencies, 50.0),
                percentile(&changes.latencies, 99.0),
                again[i].1,
            );
        }
        per_cluster_reports.push(json!({
            "id": cluster.id, "remote": cluster.config.remote, "network": cluster.network,
            "pods": cluster.pods.len(), "slices": cluster.slices,
            "first_sync": {"seconds": round2(first[i].1), "objects_written": synced.applies,
                           "network_gateways": synced.network_gateways,
                           "mib_written": round2(synced.bytes as f64 / (1 << 20) as f64),
                           "refused": first[i].0.refused},
            "pod_change": {"count": changes.latencies.len(),
                           "event_to_write_ms": {"p50": round2(percentile(&changes.latencies, 50.0)),
                                                 "p99": round2(percentile(&changes.latencies, 99.0))}},
            "restart": {"seconds": round2(again[i].1), "written": restart_written},
        }));
    }

    Ok(json!({
        "mode": "kube-sync",
        "parameters": {"services": args.services, "pods": next_pod, "slice_size": args.slice_size,
                       "slices": slices, "changes": all_changes.latencies.len(),
                       "clusters": topology.clusters(), "networks": topology.networks()},
        "first_sync": {"seconds": round2(sync_s), "objects_written": after_sync.total().applies,
                       "mib_written": round2(after_sync.total().bytes as f64 / (1 << 20) as f64),
                       "refused": refused,
                       "rss_mib": {"before": round2(rss_before), "peak": round2(rss_synced),
                                   "after": round2(rss_settled)}},
        "pod_change": {"event_to_write_ms": {"p50": round2(percentile(&all_changes.latencies, 50.0)),
                                            "p99": round2(percentile(&all_changes.latencies, 99.0))},
                       "kib_written": round2(mean(&all_changes.written) / 1024.0),
                       "kib_one_object_per_service": round2(mean(&all_changes.whole_service) / 1024.0)},
        "restart": {"seconds": round2(restart_s), "written": rewritten.0, "deleted": rewritten.1},
        "clusters": per_cluster_reports,
    }))
}

/// The pod changes timed in one cluster.
#[derive(Default)]
struct Changes {
    /// API event → durable write, ms.
    latencies: Vec<f64>,
    /// Bytes of the part written.
    written: Vec<f64>,
    /// Bytes of every part of the pod's service in its cluster.
    whole_service: Vec<f64>,
}

impl Changes {
    fn concat(all: &[Changes]) -> Changes {
        let mut joined = Changes::default();
        for c in all {
            joined.latencies.extend(&c.latencies);
            joined.written.extend(&c.written);
            joined.whole_service.extend(&c.whole_service);
        }
        joined
    }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small cluster end to end: every Service and slice written once, each pod change writes
    /// one part (smaller than its whole service), and a restart writes nothing.
    #[test]
    fn smoke() {
        let report = run(&KubeSyncArgs {
            services: 5,
            pods: 250,
            slice_size: 20,
            changes: 5,
            topology: ClusterArgs::default(),
        })
        .unwrap();
        // 5 services of 50 pods, 3 slices each.
        assert_eq!(report["parameters"]["slices"], 15);
        assert_eq!(report["first_sync"]["objects_written"], 20);
        assert_eq!(report["first_sync"]["refused"], 0);
        assert_eq!(report["parameters"]["changes"], 5);
        let part = report["pod_change"]["kib_written"].as_f64().unwrap();
        let whole = report["pod_change"]["kib_one_object_per_service"]
            .as_f64()
            .unwrap();
        assert!(part > 0.0 && part < whole, "{report}");
        assert_eq!(report["restart"]["written"], 0);
        assert_eq!(report["restart"]["deleted"], 0);
    }

    /// Three clusters on two networks, each followed by its own syncer into one store: each
    /// writes its own Services, slices and east-west gateway (a remote under its own names: a
    /// change in a remote is awaited under them), and a restart writes nothing in any.
    #[test]
    fn clusters_are_synced_side_by_side() {
        let report = run(&KubeSyncArgs {
            services: 4,
            pods: 240,
            slice_size: 10,
            changes: 6,
            topology: ClusterArgs {
                clusters: 3,
                networks: 2,
            },
        })
        .unwrap();
        // Each service's 60 pods dealt to 3 clusters: 20 per cluster, 2 slices.
        assert_eq!(report["parameters"]["slices"], 24, "{report}");
        assert_eq!(report["first_sync"]["objects_written"], 3 * (4 + 8 + 1));
        let clusters = report["clusters"].as_array().unwrap();
        let ids: Vec<&str> = clusters.iter().map(|c| c["id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["cluster-1", "cluster-2", "cluster-3"]);
        for (c, cluster) in clusters.iter().enumerate() {
            assert_eq!(cluster["remote"], c > 0, "{cluster}");
            assert_eq!(cluster["pods"], 80, "{cluster}");
            assert_eq!(cluster["first_sync"]["objects_written"], 13, "{cluster}");
            assert_eq!(cluster["first_sync"]["network_gateways"], 1, "{cluster}");
            assert_eq!(cluster["first_sync"]["refused"], 0, "{cluster}");
            assert_eq!(cluster["pod_change"]["count"], 2, "{cluster}");
            assert_eq!(cluster["restart"]["written"], 0, "{cluster}");
        }
        assert_eq!(clusters[1]["network"], "network-2");
        assert_eq!(report["restart"]["deleted"], 0);
        assert!(
            run(&KubeSyncArgs {
                services: 4,
                pods: 8,
                slice_size: 10,
                changes: 1,
                topology: ClusterArgs {
                    clusters: 3,
                    networks: 1,
                },
            })
            .is_err()
        );
    }
}
