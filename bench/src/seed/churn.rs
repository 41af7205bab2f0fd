//! S3: endpoint churn. Pods come and go as in a rolling deployment: at `--churn-rate` changes a
//! second for `--churn-secs`, one service's `ServiceEndpoints` in one cluster is rewritten with
//! one of that cluster's pods' address changed (each change its own write, as the Kubernetes
//! syncer writes them; the cluster drawn among all the mesh's), then `--burst` such changes are
//! written at once. Each delivered event is timed from the store's
//! commit (the time it carries) to the subscriber reading it, and checked against the oracle:
//! the change's object matched against every distinct subscription beforehand.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use pasa_proto::store::v1::{ApplyDocument, EventType, Subscription};
use pasa_store::Store;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use super::mesh::Mesh;
use super::subscribers::{Progress, Seen, Subscriber};
use super::{distinct_selectors, keys_of, manifest, until_delivered};
use crate::clusters::Topology;
use crate::stats::{cdf, percentile, round2};

/// How S3 runs.
#[derive(Debug, Clone, Copy)]
pub struct ChurnShape {
    pub rate: u32,
    pub secs: u64,
    pub burst: usize,
    pub seed: u64,
}

/// Which phase a change was written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Steady,
    Burst,
}

/// The object one change rewrites: a service's (by index) in a cluster.
type Target = (usize, usize);

/// What S3 wrote: per revision, the change's object and phase; per object, which distinct
/// subscriptions should hear of it.
pub struct Churn {
    changes: BTreeMap<u64, (Target, Phase)>,
    expected: HashMap<Target, HashMap<*const Subscription, bool>>,
    /// Per distinct subscription, the revisions it should hear of.
    due: HashMap<*const Subscription, Vec<u64>>,
    steady_s: f64,
    burst_apply_ms: f64,
    broken: usize,
}

/// The changes to write: (the object, a service's ServiceEndpoints in one cluster, with one
/// pod's address changed), each change building on the object's previous one.
fn plan(mesh: &Mesh, count: usize, seed: u64) -> anyhow::Result<Vec<(Target, ApplyDocument)>> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x005e_edc4_u64);
    let clusters = mesh.topology.clusters();
    let mut specs: HashMap<Target, Value> = HashMap::new();
    let endpoints: BTreeMap<String, &pasa_proto::store::v1::Resource> = mesh
        .objects
        .iter()
        .filter(|r| r.kind == "ServiceEndpoints")
        .map(|r| (format!("{}/{}", r.namespace, r.name), r))
        .collect();
    let mut out = Vec::with_capacity(count);
    for n in 0..count {
        let i = rng.random_range(0..mesh.workloads.len());
        // Every service runs in every cluster (one cluster draws nothing: the same changes as
        // a single-cluster mesh always had).
        let c = if clusters > 1 {
            rng.random_range(0..clusters)
        } else {
            0
        };
        let w = &mesh.workloads[i];
        let name = mesh.topology.object_name(&w.app, c);
        let base = endpoints
            .get(&format!("{}/{name}", w.namespace))
            .with_context(|| format!("no ServiceEndpoints {name} for {}", w.host))?;
        let spec = match specs.entry((i, c)) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(serde_json::from_str(&base.spec_json)?)
            }
        };
        let pods = spec["endpoints"].as_array_mut().context("endpoints")?;
        ensure!(
            !pods.is_empty(),
            "ServiceEndpoints {name} has no endpoints to change"
        );
        let k = rng.random_range(0..pods.len());
        // A pod replaced: a fresh address no other pod has.
        pods[k]["address"] = json!(format!("10.250.{}.{}", n / 250, n % 250 + 1));
        let mut resource = (*base).clone();
        resource.spec_json = spec.to_string();
        out.push(((i, c), manifest(&resource)));
    }
    Ok(out)
}

/// Writes the churn, then the burst, and waits until every expected event is in (or nothing
/// more arrives for [`QUIET`]).
pub async fn run(
    store: &Store,
    mesh: &Mesh,
    subscribers: &[Subscriber],
    progress: &Progress,
    shape: ChurnShape,
) -> anyhow::Result<Churn> {
    let steady = shape.rate as usize * shape.secs as usize;
    // Fresh addresses come from 10.250.0.1–10.250.255.250.
    ensure!(
        steady + shape.burst <= 256 * 250,
        "S3: at most {} endpoint changes (--churn-rate × --churn-secs + --burst)",
        256 * 250
    );
    let planned = plan(mesh, steady + shape.burst, shape.seed)?;
    // The oracle, per service changed: its object's keys against each distinct subscription.
    let distinct = distinct_selectors(subscribers)?;
    let mut expected: HashMap<Target, HashMap<*const Subscription, bool>> = HashMap::new();
    for (i, doc) in &planned {
        if expected.contains_key(i) {
            continue;
        }
        let (_, keys) = keys_of(doc)?;
        let matches = distinct
            .iter()
            .map(|(&ptr, selector)| (ptr, selector.matches(&keys)))
            .collect();
        expected.insert(*i, matches);
    }
    let fan_out = |i: Target| -> usize {
        subscribers
            .iter()
            .filter(|s| expected[&i][&Arc::as_ptr(&s.subscription)])
            .count()
    };
    let mut per_service: HashMap<Target, usize> = HashMap::new();
    let mut expected_events = 0usize;
    for (i, _) in &planned {
        let n = *per_service.entry(*i).or_insert_with(|| fan_out(*i));
        expected_events += n;
    }

    let baseline = progress.events.load(Ordering::Relaxed);
    let broken = progress.broken.load(Ordering::Relaxed);
    let mut planned = planned.into_iter();
    let write = |(i, doc): (Target, ApplyDocument), phase: Phase| {
        let store = store.clone();
        tokio::spawn(async move {
            let reply = store.apply(vec![doc], false).await?;
            ensure!(reply.errors.is_empty(), "churn refused: {:?}", reply.errors);
            anyhow::Ok((reply.revision, (i, phase)))
        })
    };
    // Steady churn: one write per tick, each on its own so a slow one does not hold the rate.
    let started = Instant::now();
    let mut writes = Vec::with_capacity(steady + shape.burst);
    if steady > 0 {
        let mut ticks =
            tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(shape.rate.max(1))));
        let churning = crate::seed::bar("S3: endpoint churn", steady);
        for change in planned.by_ref().take(steady) {
            ticks.tick().await;
            writes.push(write(change, Phase::Steady));
            churning.inc(1);
        }
        churning.finish_and_clear();
    }
    let mut changes = BTreeMap::new();
    for w in writes.drain(..) {
        let (revision, change) = w.await.context("a churn write")??;
        changes.insert(revision, change);
    }
    let steady_s = started.elapsed().as_secs_f64();
    // The burst: every change at once.
    let bursting = Instant::now();
    writes.extend(planned.map(|change| write(change, Phase::Burst)));
    for w in writes {
        let (revision, change) = w.await.context("a burst write")??;
        changes.insert(revision, change);
    }
    let burst_apply_ms = bursting.elapsed().as_secs_f64() * 1e3;

    until_delivered("churn", progress, baseline, expected_events).await?;
    let mut due: HashMap<*const Subscription, Vec<u64>> = HashMap::new();
    for &ptr in distinct.keys() {
        let revisions = changes
            .iter()
            .filter(|(_, (target, _))| expected[target][&ptr])
            .map(|(&revision, _)| revision)
            .collect();
        due.insert(ptr, revisions);
    }
    Ok(Churn {
        changes,
        expected,
        due,
        steady_s,
        burst_apply_ms,
        broken: progress.broken.load(Ordering::Relaxed) - broken,
    })
}

/// What the subscribers received of the churn, against the oracle.
#[derive(Default)]
pub struct ChurnTally {
    /// Commit → subscriber, in ms, per delivered event, by phase.
    steady: Vec<f64>,
    burst: Vec<f64>,
    /// Per change: commit → the last subscriber to read it, in ms.
    last: HashMap<u64, f64>,
    delivered: u64,
    wrong: u64,
    missed: u64,
    duplicates: u64,
    wrong_type: u64,
    no_commit_time: u64,
}

impl ChurnTally {
    pub fn add(&mut self, churn: &Churn, subscription: &Arc<Subscription>, seen: &Seen) {
        let ptr = Arc::as_ptr(subscription);
        let mut got: HashMap<u64, u32> = HashMap::new();
        for e in &seen.events {
            let Some(&(target, phase)) = churn.changes.get(&e.revision) else {
                continue;
            };
            self.delivered += 1;
            *got.entry(e.revision).or_default() += 1;
            if !churn.expected[&target][&ptr] {
                self.wrong += 1;
            }
            if e.r#type != EventType::Modified as i32 {
                self.wrong_type += 1;
            }
            let Some(lag) = e.lag_ms.map(f64::from) else {
                self.no_commit_time += 1;
                continue;
            };
            match phase {
                Phase::Steady => self.steady.push(lag),
                Phase::Burst => self.burst.push(lag),
            }
            let last = self.last.entry(e.revision).or_default();
            *last = last.max(lag);
        }
        self.duplicates += got
            .values()
            .map(|&n| u64::from(n.saturating_sub(1)))
            .sum::<u64>();
        self.missed += churn.due[&ptr]
            .iter()
            .filter(|revision| !got.contains_key(revision))
            .count() as u64;
    }

    /// Prints S3's lines and returns its figures.
    pub fn report(&self, churn: &Churn, shape: ChurnShape, topology: &Topology) -> Value {
        let figures = |samples: &[f64]| {
            json!({"p50": round2(percentile(samples, 50.0)),
                   "p99": round2(percentile(samples, 99.0)),
                   "max": round2(percentile(samples, 100.0)),
                   "events": samples.len(), "cdf": cdf(samples)})
        };
        let phase = |p: Phase| -> Vec<f64> {
            churn
                .changes
                .iter()
                .filter(|(_, (_, ph))| *ph == p)
                .filter_map(|(revision, _)| self.last.get(revision).copied())
                .collect()
        };
        let (steady, burst) = (figures(&self.steady), figures(&self.burst));
        let (steady_last, burst_last) = (
            figures(&phase(Phase::Steady)),
            figures(&phase(Phase::Burst)),
        );
        let changes = churn.changes.len();
        let mut by_cluster: BTreeMap<String, usize> = BTreeMap::new();
        for ((_, c), _) in churn.changes.values() {
            *by_cluster.entry(topology.cluster_id(*c)).or_default() += 1;
        }
        println!(
            "S3: {changes} endpoint changes ({} at {}/s over {:.1}s, then {} at once, written in \
             {:.0} ms): {} events delivered; commit → subscriber p50 {} ms, p99 {} ms while \
             churning, p50 {} ms, p99 {} ms in the burst; to the last subscriber of a change p99 \
             {} ms and {} ms; {} wrong, {} missed, {} duplicated, {} of the wrong type, {} without \
             a commit time, {} watches ended; changes by cluster {by_cluster:?}",
            changes - shape.burst.min(changes),
            shape.rate,
            churn.steady_s,
            shape.burst,
            churn.burst_apply_ms,
            self.delivered,
            steady["p50"],
            steady["p99"],
            burst["p50"],
            burst["p99"],
            steady_last["p99"],
            burst_last["p99"],
            self.wrong,
            self.missed,
            self.duplicates,
            self.wrong_type,
            self.no_commit_time,
            churn.broken
        );
        json!({"changes": changes, "changes_by_cluster": by_cluster,
               "rate_per_s": shape.rate, "churn_s": round2(churn.steady_s),
               "burst": shape.burst, "burst_apply_ms": round2(churn.burst_apply_ms),
               "delivered": self.delivered,
               "commit_to_subscriber_ms": {"churn": steady, "burst": burst},
               "commit_to_last_subscriber_ms": {"churn": steady_last, "burst": burst_last},
               "wrong": self.wrong, "missed": self.missed, "duplicates": self.duplicates,
               "wrong_type": self.wrong_type, "without_commit_time": self.no_commit_time,
               "watches_ended": churn.broken,
               "goal": {"commit_to_subscriber_p99_ms": 100, "wrong": 0, "missed": 0}})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clusters::ClusterArgs;
    use crate::seed::mesh::Shape;

    /// With several clusters the churn rewrites each cluster's objects, each change one pod of
    /// the cluster it is written for; with one, the object of the Service's own name.
    #[test]
    fn the_churn_changes_endpoints_in_every_cluster() {
        let mesh = |clusters| {
            Mesh::generate(Shape {
                services: 30,
                pods: 300,
                virtual_services: 1,
                seed: 3,
                topology: Topology::new(ClusterArgs {
                    clusters,
                    networks: 1,
                })
                .unwrap(),
                sidecars: true,
            })
        };
        let three = mesh(3);
        let planned = plan(&three, 60, 3).unwrap();
        let touched: std::collections::BTreeSet<usize> =
            planned.iter().map(|((_, c), _)| *c).collect();
        assert_eq!(touched.into_iter().collect::<Vec<_>>(), [0, 1, 2]);
        for ((i, c), doc) in &planned {
            let doc: Value = serde_json::from_str(&doc.json).unwrap();
            let w = &three.workloads[*i];
            assert_eq!(
                doc["metadata"]["name"],
                three.topology.object_name(&w.app, *c)
            );
            assert_eq!(doc["spec"]["cluster"], three.topology.cluster_id(*c));
        }
        let one = mesh(1);
        for ((i, c), doc) in plan(&one, 20, 3).unwrap() {
            let doc: Value = serde_json::from_str(&doc.json).unwrap();
            assert_eq!(c, 0);
            assert_eq!(doc["metadata"]["name"], one.workloads[i].app);
        }
    }
}
