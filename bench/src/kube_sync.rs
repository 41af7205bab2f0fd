//! `kube-sync`: the Kubernetes syncer at mesh scale. A **fake** Kubernetes API server (pasa-kube's,
//! in this process) holds a cluster of S Services with P pods in EndpointSlices of at most N
//! endpoints; the real syncer (kube's watchers and reflectors) follows it into the real store on
//! sled. Measured: the first complete sync (time, objects and bytes written), then C pod label
//! changes one at a time (the API server's event → the store's durable write of the slice's
//! part, and the bytes written per change against what one object per Service would rewrite),
//! then a restart of the syncer (time until it has compared everything, and what it wrote).
//! Written through the store directly, not PCP's validation: the syncer's own cost and the
//! store's, not admission's (measured by `write` and the webhook tests).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use pasa_kube::convert::StoreKey;
use pasa_kube::fake_apiserver::FakeApiServer;
use pasa_kube::metrics::SyncMetrics;
use pasa_kube::selectors::DiscoverySelectors;
use pasa_kube::syncer::{SyncConfig, SyncStatus, Syncer, Target, WriteError};
use pasa_proto::store::v1::ApplyDocument;
use pasa_store::Store;
use serde_json::{Value, json};

use crate::stats::{peak_rss_mib, percentile, reset_peak_rss, round2, rss_mib};

const NAMESPACES: usize = 50;
const NODES: usize = 20;

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
}

/// The store behind the syncer, counting what it is asked to write.
#[derive(Clone)]
struct CountingStore {
    store: Store,
    counts: Arc<Mutex<Counts>>,
}

#[derive(Default)]
struct Counts {
    applies: u64,
    deletes: u64,
    bytes: u64,
    /// When each key was last written, and its size.
    last: BTreeMap<String, (Instant, usize)>,
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
        counts.applies += 1;
        counts.bytes += size as u64;
        counts.last.insert(name, (Instant::now(), size));
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

/// Waits (at most `limit`) until the syncer's status satisfies `done`.
async fn until(
    syncer: &Syncer,
    limit: Duration,
    what: &str,
    done: impl Fn(&SyncStatus) -> bool,
) -> anyhow::Result<SyncStatus> {
    let mut status = syncer.status();
    tokio::time::timeout(limit, async {
        loop {
            let now = status.borrow_and_update().clone();
            if done(&now) {
                return Ok(now);
            }
            status.changed().await.context("the syncer stopped")?;
        }
    })
    .await
    .with_context(|| format!("timed out waiting for {what}"))?
}

pub fn run(args: &KubeSyncArgs) -> anyhow::Result<Value> {
    anyhow::ensure!(
        args.services > 0 && args.slice_size > 0,
        "--services and --slice-size must be > 0"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run_async(args))
}

async fn run_async(args: &KubeSyncArgs) -> anyhow::Result<Value> {
    let fake = FakeApiServer::start().await;
    let built = Instant::now();
    for n in 0..NAMESPACES {
        fake.put_namespace(&format!("ns-{n}"), &[]);
    }
    for n in 0..NODES {
        fake.put(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": format!("node-{n}"), "labels": {
                "topology.kubernetes.io/region": "region-1",
                "topology.kubernetes.io/zone": format!("zone-{}", n % 3)}}}));
    }
    // Each pod's (namespace, name, service, slice); pods of a service in slices of slice_size.
    let mut pods: Vec<(String, String, usize, String)> = Vec::with_capacity(args.pods);
    let mut slices = 0usize;
    for s in 0..args.services {
        let ns = format!("ns-{}", s % NAMESPACES);
        let service = format!("svc-{s}");
        fake.put(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": service, "namespace": ns},
            "spec": {"clusterIP": format!("10.96.{}.{}", s / 250, s % 250 + 1),
                     "selector": {"app": service},
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}));
        let count = args.pods / args.services + usize::from(s < args.pods % args.services);
        let names: Vec<String> = (0..count).map(|i| format!("{service}-{i}")).collect();
        for (chunk_no, chunk) in names.chunks(args.slice_size).enumerate() {
            let slice = format!("{service}-{chunk_no}");
            let mut endpoints = Vec::with_capacity(chunk.len());
            for name in chunk {
                let i = pods.len();
                let node = i % NODES;
                fake.put(pod(&ns, name, s, "v1", node));
                endpoints.push(json!({
                    "addresses": [format!("10.{}.{}.{}", 1 + i / 65536, (i / 256) % 256, i % 256)],
                    "conditions": {"ready": true}, "nodeName": format!("node-{node}"),
                    "targetRef": {"kind": "Pod", "name": name, "namespace": ns}}));
                pods.push((ns.clone(), name.clone(), s, slice.clone()));
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
    println!(
        "kube-sync: the fake API server holds {} services, {} pods, {slices} EndpointSlices, {NODES} nodes (built in {:.1}s)",
        args.services,
        pods.len(),
        built.elapsed().as_secs_f64()
    );

    let embedded = crate::embedded::open(None, "pasa-bench-kube-sync", 1000)?;
    let target = CountingStore {
        store: embedded.store.clone(),
        counts: Arc::new(Mutex::new(Counts::default())),
    };
    let config = SyncConfig {
        cluster_id: "Kubernetes".into(),
        discovery: DiscoverySelectors::all(),
        ingress: pasa_kube::ingress::Settings::default(),
        gateway_api: pasa_kube::gateway_api::Settings::default(),
        send_unhealthy_endpoints: true,
        api_server: format!("http://{}", fake.addr),
        reads: pasa_kube::syncer::Reads::Everything,
        remote: false,
        system_namespace: "istio-system".into(),
        mesh_networks: None,
    };
    // The process before the syncer starts: the fake's cluster and the empty store. What the
    // sync adds on top is the syncer's (its reflectors, its written copy), the store's, and the
    // fake's list answers while they are sent.
    let rss_before = rss_mib().unwrap_or(0.0);
    let peak_resettable = reset_peak_rss();
    let started = Instant::now();
    let syncer = Syncer::start(
        fake.client(),
        config.clone(),
        target.clone(),
        Arc::new(SyncMetrics::default()),
    );
    let first = until(&syncer, Duration::from_secs(600), "the first sync", |s| {
        s.synced
    })
    .await?;
    let sync_s = started.elapsed().as_secs_f64();
    let (applied, bytes) = {
        let c = target.counts.lock().unwrap_or_else(|p| p.into_inner());
        (c.applies, c.bytes)
    };
    let rss_synced = peak_rss_mib().unwrap_or(0.0);
    let rss_settled = rss_mib().unwrap_or(0.0);
    println!(
        "kube-sync: first sync {sync_s:.1}s: {applied} objects written ({} refused), {:.1} MiB; RSS {rss_before:.0} MiB before (the fake's cluster), peak {rss_synced:.0} MiB{} during the sync, {rss_settled:.0} MiB after it",
        first.refused,
        bytes as f64 / (1 << 20) as f64,
        if peak_resettable {
            ""
        } else {
            " (peak of the whole run)"
        }
    );

    // One pod's labels at a time: the API server's event → the durable write of its slice's part.
    let mut latencies = Vec::with_capacity(args.changes);
    let mut written = Vec::with_capacity(args.changes);
    let mut whole_service = Vec::with_capacity(args.changes);
    let per_part: BTreeMap<String, usize> = {
        let c = target.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.last
            .iter()
            .map(|(k, (_, size))| (k.clone(), *size))
            .collect()
    };
    let stride = (pods.len() / args.changes.max(1)).max(1);
    for k in 0..args.changes.min(pods.len()) {
        let (ns, name, service, slice) = &pods[(k * stride) % pods.len()];
        let key = format!(
            "{ns}/{slice}{}",
            pasa_istio::service_endpoints::SLICE_NAME_SUFFIX
        );
        let before = target
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .applies;
        let sent = Instant::now();
        fake.put(pod(
            ns,
            name,
            *service,
            &format!("v{}", k + 2),
            (k * stride) % NODES,
        ));
        let wrote = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                {
                    let c = target.counts.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some((at, size)) = c.last.get(&key)
                        && *at > sent
                    {
                        return (*at, *size, c.applies - before);
                    }
                }
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        })
        .await
        .with_context(|| format!("the change of pod {ns}/{name} was not written"))?;
        latencies.push(wrote.0.duration_since(sent).as_secs_f64() * 1000.0);
        written.push(wrote.1 as f64);
        anyhow::ensure!(wrote.2 == 1, "a pod's change wrote {} objects", wrote.2);
        // What one object per Service would have rewritten: every part of the service.
        let prefix = format!("{ns}/svc-{service}-");
        whole_service.push(
            per_part
                .iter()
                .filter(|(k, _)| k.starts_with(&prefix))
                .map(|(_, size)| *size as f64)
                .sum::<f64>(),
        );
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    println!(
        "kube-sync: {} pod label changes, each 1 part written: API event → durable store write p50 {:.1} ms, p99 {:.1} ms; {:.1} KiB written per change, against {:.1} KiB for the whole service",
        latencies.len(),
        percentile(&latencies, 50.0),
        percentile(&latencies, 99.0),
        mean(&written) / 1024.0,
        mean(&whole_service) / 1024.0
    );

    // A restart with nothing changed.
    drop(syncer);
    let before = {
        let c = target.counts.lock().unwrap_or_else(|p| p.into_inner());
        (c.applies, c.deletes)
    };
    let restarted = Instant::now();
    let syncer = Syncer::start(
        fake.client(),
        config,
        target.clone(),
        Arc::new(SyncMetrics::default()),
    );
    until(
        &syncer,
        Duration::from_secs(600),
        "the sync after a restart",
        |s| s.synced,
    )
    .await?;
    let restart_s = restarted.elapsed().as_secs_f64();
    let after = {
        let c = target.counts.lock().unwrap_or_else(|p| p.into_inner());
        (c.applies, c.deletes)
    };
    let rewritten = (after.0 - before.0, after.1 - before.1);
    println!(
        "kube-sync: restart: compared in {restart_s:.1}s, {} written, {} deleted",
        rewritten.0, rewritten.1
    );
    drop(syncer);
    embedded.store.shutdown();

    Ok(json!({
        "mode": "kube-sync",
        "parameters": {"services": args.services, "pods": pods.len(), "slice_size": args.slice_size,
                       "slices": slices, "changes": latencies.len()},
        "first_sync": {"seconds": round2(sync_s), "objects_written": applied,
                       "mib_written": round2(bytes as f64 / (1 << 20) as f64),
                       "refused": first.refused,
                       "rss_mib": {"before": round2(rss_before), "peak": round2(rss_synced),
                                   "after": round2(rss_settled)}},
        "pod_change": {"event_to_write_ms": {"p50": round2(percentile(&latencies, 50.0)),
                                            "p99": round2(percentile(&latencies, 99.0))},
                       "kib_written": round2(mean(&written) / 1024.0),
                       "kib_one_object_per_service": round2(mean(&whole_service) / 1024.0)},
        "restart": {"seconds": round2(restart_s), "written": rewritten.0, "deleted": rewritten.1},
    }))
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
}
