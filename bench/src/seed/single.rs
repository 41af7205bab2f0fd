//! A1: one agent, the one with the widest scope in the mesh (an aggregator calling about 200
//! services). Two measurements on the same scope:
//! - **translation**, by the agent's own translator on exactly the objects the store sends that
//!   agent (its subscription's list), in a process of its own as an agent translates (this
//!   program's hidden `translate-scope`; a test harness, which cannot run it, translates in its
//!   own process and the report says so): a full translation from scratch, then one
//!   DestinationRule, VirtualService or endpoint change at a time (p50/p99, encoded as served);
//! - **the real process**: `pasa-agent` for that pod on the store's gRPC server, with an ADS
//!   client asking as Envoy asks, saving its cache as an injected agent does: its RSS and CPU idle and while changes are written, and the
//!   mean of its own `pasa_agent_translation_seconds`.
//!
//! The central-push baseline reuses the translation figures (see [`central_push`]).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use pasa_agent::ads::Snapshot;
use pasa_agent::cache::{Cache, Key};
use pasa_agent::identity::IdentityArgs;
use pasa_agent::model::proxy::{Generator, Proxy};
use pasa_agent::translate::Translator;
use pasa_proto::Kind;
use pasa_proto::store::v1::{ListResponse, Resource, Subscription};
use pasa_proto::watch::{Action, Change};
use pasa_store::Store;
use pasa_store::selector::Selector;
use prost::Message;
use serde_json::{Value, json};

use super::agents::{self, Fleet};
use super::mesh::{Mesh, Workload};
use super::xds_client::Watched;
use super::{Subscriptions, identity_of, manifest, proxy_of};
use crate::stats::{percentile, round2};

/// Full translations from scratch timed.
const FULL_RUNS: usize = 20;
/// Changes of each kind timed in process.
const CHANGES: usize = 50;
/// Changes of each kind written to the real agent.
const LIVE_CHANGES: usize = 10;
/// Between two changes written to the real agent.
const LIVE_INTERVAL: Duration = Duration::from_millis(200);
/// After the last change, until the real agent's RSS is read again: well past the quiet
/// after which it returns the memory a burst freed.
const SETTLE: Duration = Duration::from_secs(2);

/// The kinds of change A1 times.
const KINDS: [&str; 3] = ["destination_rule", "virtual_service", "endpoints"];

/// The workload A1 measures: the one calling the most services.
pub fn widest(mesh: &Mesh) -> &Workload {
    mesh.workloads
        .iter()
        .max_by_key(|w| (w.calls.len(), std::cmp::Reverse(w.app.clone())))
        .unwrap_or(&mesh.workloads[0])
}

/// One change of `kind` to service `j`'s object in `cache`, the `n`-th of its kind.
fn changed(cache: &Cache, mesh: &Mesh, kind: &str, j: usize, n: usize) -> anyhow::Result<Resource> {
    let w = &mesh.workloads[j];
    let key = Key {
        kind: object_kind(kind),
        namespace: w.namespace.clone(),
        name: w.app.clone(),
    };
    let current = cache
        .get(&key)
        .with_context(|| format!("{key:?} is not in the agent's scope"))?;
    let mut spec: Value = serde_json::from_str(&current.spec_json)?;
    match kind {
        "destination_rule" => {
            spec["trafficPolicy"]["connectionPool"]["tcp"]["maxConnections"] = json!(1001 + n);
        }
        "virtual_service" => {
            let canary = 1 + n % 49;
            spec["http"][1]["route"][0]["weight"] = json!(100 - canary);
            spec["http"][1]["route"][1]["weight"] = json!(canary);
        }
        _ => {
            spec["endpoints"][0]["address"] = json!(format!("10.251.{}.{}", n / 250, n % 250 + 1));
        }
    }
    let mut resource = (**current).clone();
    resource.spec_json = spec.to_string();
    Ok(resource)
}

/// Translation figures of one proxy's scope: what A1 reports and the central-push baseline
/// extrapolates from.
pub struct Translation {
    pub services: usize,
    pub objects: usize,
    pub full_ms: Vec<f64>,
    pub change_ms: BTreeMap<String, Vec<f64>>,
    /// Encoded size of one full set of the proxy's xDS resources.
    pub encoded_bytes: usize,
}

impl Translation {
    fn to_json(&self) -> Value {
        json!({"services": self.services, "objects": self.objects, "full_ms": self.full_ms,
               "change_ms": self.change_ms, "encoded_bytes": self.encoded_bytes})
    }

    fn from_json(value: &Value) -> anyhow::Result<Translation> {
        let count = |field: &str| {
            value[field]
                .as_u64()
                .map(|n| n as usize)
                .with_context(|| format!("{field} is not a count"))
        };
        let samples = |v: &Value| -> Vec<f64> {
            v.as_array()
                .map(|a| a.iter().filter_map(Value::as_f64).collect())
                .unwrap_or_default()
        };
        let change_ms = value["change_ms"]
            .as_object()
            .context("change_ms is not an object")?
            .iter()
            .map(|(kind, v)| (kind.clone(), samples(v)))
            .collect();
        Ok(Translation {
            services: count("services")?,
            objects: count("objects")?,
            full_ms: samples(&value["full_ms"]),
            change_ms,
            encoded_bytes: count("encoded_bytes")?,
        })
    }
}

/// The cache `proxy`'s agent holds: what the store lists for its subscription.
pub async fn scope_cache(store: &Store, subscription: &Subscription) -> anyhow::Result<Cache> {
    let selector = Selector::from_pb(subscription).context("a derived subscription")?;
    let (listed, revision) = store.list(&selector, 0).await?;
    Ok(Cache::from_resources(
        listed.iter().map(|r| (**r).clone()),
        revision,
    ))
}

/// The changes A1 times, `changes` of each kind in turn: the `n`-th changes the object of
/// service `calls[n % calls.len()]`, on top of the changes before it.
fn planned_changes(
    cache: &Cache,
    mesh: &Mesh,
    calls: &[usize],
    changes: usize,
) -> anyhow::Result<Vec<Resource>> {
    let mut cache = cache.clone();
    let mut revision = cache.revision();
    let mut planned = Vec::with_capacity(changes * KINDS.len());
    for kind in KINDS {
        for n in 0..changes {
            let resource = changed(&cache, mesh, kind, calls[n % calls.len()], n)?;
            revision += 1;
            cache.apply(Change {
                action: Action::Modified,
                revision,
                resource: resource.clone(),
                committed: None,
            });
            planned.push(resource);
        }
    }
    Ok(planned)
}

/// The kind of object a change of one of [`KINDS`] changes.
fn object_kind(kind: &str) -> Kind {
    match kind {
        "destination_rule" => Kind::DestinationRule,
        "virtual_service" => Kind::VirtualService,
        _ => Kind::ServiceEndpoints,
    }
}

/// Which of [`KINDS`] a planned change is.
fn kind_of_change(resource: &Resource) -> &'static str {
    let changed = Kind::from_kind_field(&resource.kind);
    KINDS
        .into_iter()
        .find(|&kind| changed == Some(object_kind(kind)))
        .unwrap_or("endpoints")
}

/// Times full translations (and, with `changes`, one change at a time) of `proxy`'s `cache`,
/// in this process (the central-push baseline: one process translating for many proxies). On a
/// thread of its own, which gets an allocator arena of its own.
pub fn translate(
    proxy: &Proxy,
    cache: Cache,
    mesh: &Mesh,
    calls: &[usize],
    (full_runs, changes): (usize, usize),
) -> anyhow::Result<Translation> {
    let planned = planned_changes(&cache, mesh, calls, changes)?;
    std::thread::scope(|s| {
        s.spawn(|| Ok(translate_here(proxy, cache, &planned, full_runs)))
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the translation panicked")))
    })
}

/// Times `proxy`'s translations as its agent would: in a process of its own (this program's
/// hidden `translate-scope`), with the allocator settings an agent runs with. A process holding
/// 100k subscribers' heap is not what an agent's translator runs in: its first translation
/// there is several times slower than in an agent.
fn translate_apart(
    program: &std::path::Path,
    identity: &IdentityArgs,
    cache: &Cache,
    planned: &[Resource],
    full_runs: usize,
    keep: Option<&std::path::Path>,
) -> anyhow::Result<Translation> {
    let temporary;
    let dir = match keep {
        Some(dir) => dir,
        None => {
            temporary = tempfile::tempdir()?;
            temporary.path()
        }
    };
    cache.save(dir)?;
    let changes = ListResponse {
        resources: planned.to_vec(),
        revision: cache.revision(),
    };
    std::fs::write(dir.join(CHANGES_FILE), changes.encode_to_vec())?;
    // The network is said only when there is one (an empty flag value is no network).
    let network: Vec<&str> = if identity.network.is_empty() {
        Vec::new()
    } else {
        vec!["--network", &identity.network]
    };
    if keep.is_some() {
        println!(
            "A1: its scope and changes are kept in {} (an agent's --cache-dir as well): pasa-bench \
             translate-scope --dir {0} --node-id '{}' --labels {} --service-account {} \
             --cluster-id {} {}",
            dir.display(),
            identity.node_id,
            identity.labels,
            identity.service_account,
            identity.cluster_id,
            network.join(" ")
        );
    }
    let output = std::process::Command::new(program)
        .arg("translate-scope")
        .arg("--dir")
        .arg(dir)
        .args(["--full-runs", &full_runs.to_string()])
        .args(["--node-id", &identity.node_id])
        .args(["--labels", &identity.labels])
        .args(["--service-account", &identity.service_account])
        .args(["--cluster-id", &identity.cluster_id])
        .args(&network)
        .env("MALLOC_ARENA_MAX", crate::agent::malloc_arena_max())
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("cannot start the translation process")?;
    anyhow::ensure!(
        output.status.success(),
        "the translation process failed: {}",
        output.status
    );
    let value: Value = serde_json::from_slice(&output.stdout)
        .context("the translation process did not answer in JSON")?;
    Translation::from_json(&value)
}

/// This program, when it is `pasa-bench` (not a test harness, which cannot run
/// `translate-scope` or `probe-calls`).
pub(super) fn this_program() -> Option<std::path::PathBuf> {
    std::env::current_exe()
        .ok()
        .filter(|exe| exe.file_stem().is_some_and(|stem| stem == "pasa-bench"))
}

/// Beside the saved cache: the changes to time, in order.
const CHANGES_FILE: &str = "changes.pb";

/// Times one agent's translations in a process of its own: what `pasa-bench seed` runs for A1.
#[derive(clap::Args)]
pub struct ScopeArgs {
    /// Where the scope's cache and the changes to time were saved.
    #[arg(long)]
    dir: std::path::PathBuf,
    /// Translations from scratch timed.
    #[arg(long, default_value_t = FULL_RUNS)]
    full_runs: usize,
    #[command(flatten)]
    identity: IdentityArgs,
}

/// `pasa-bench translate-scope`: the figures, as JSON.
pub fn translate_scope(args: &ScopeArgs) -> anyhow::Result<Value> {
    let cache = Cache::load(&args.dir)?
        .with_context(|| format!("no saved cache in {}", args.dir.display()))?;
    let changes = ListResponse::decode(std::fs::read(args.dir.join(CHANGES_FILE))?.as_slice())?;
    let proxy = Proxy::from_identity(&args.identity.resolve()?, Default::default());
    Ok(translate_here(&proxy, cache, &changes.resources, args.full_runs).to_json())
}

fn translate_here(
    proxy: &Proxy,
    mut cache: Cache,
    planned: &[Resource],
    full_runs: usize,
) -> Translation {
    // Services, not their objects: a service has one per cluster it runs in.
    let services = cache
        .of_kind(Kind::ServiceEndpoints)
        .map(|r| {
            let spec: serde_json::Value = serde_json::from_str(&r.spec_json).unwrap_or_default();
            let service = spec["service"].as_str().filter(|s| !s.is_empty());
            (r.namespace.as_str(), service.unwrap_or(&r.name).to_string())
        })
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    let objects = cache.len();
    let mut full_ms = Vec::with_capacity(full_runs);
    let mut translator = Translator::new(proxy.clone());
    let mut encoded_bytes = 0;
    for _ in 0..full_runs.max(1) {
        translator = Translator::new(proxy.clone());
        let started = Instant::now();
        let resources = translator.generate(&cache, Generator::Envoy);
        let snapshot = Snapshot::from_generated(&resources);
        full_ms.push(started.elapsed().as_secs_f64() * 1e3);
        encoded_bytes = pasa_agent::resource::TypeKind::PUSH_ORDER
            .iter()
            .flat_map(|&k| snapshot.resources(k).values())
            .map(|r| r.body.value.len())
            .sum();
    }
    let mut change_ms: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (revision, resource) in (cache.revision() + 1..).zip(planned) {
        let kind = kind_of_change(resource);
        cache.apply(Change {
            action: Action::Modified,
            revision,
            resource: resource.clone(),
            committed: None,
        });
        let started = Instant::now();
        let resources = translator.generate(&cache, Generator::Envoy);
        let _snapshot = Snapshot::from_generated(&resources);
        change_ms
            .entry(kind.to_string())
            .or_default()
            .push(started.elapsed().as_secs_f64() * 1e3);
    }
    Translation {
        services,
        objects,
        full_ms,
        change_ms,
        encoded_bytes,
    }
}

/// The count and sum of an agent's `pasa_agent_translation_seconds`.
fn translation_totals(metrics: &str) -> (f64, f64) {
    let sample = |name: &str| agents::sample(metrics, name).unwrap_or(0.0);
    (
        sample("pasa_agent_translation_seconds_count"),
        sample("pasa_agent_translation_seconds_sum"),
    )
}

fn quantiles(samples: &[f64]) -> Value {
    json!({"p50": round2(percentile(samples, 50.0)), "p99": round2(percentile(samples, 99.0))})
}

pub async fn run(
    store: &Store,
    mesh: &Mesh,
    subscriptions: &Subscriptions,
    binary: &std::path::Path,
    server: &str,
    idle: Duration,
    keep: Option<&std::path::Path>,
) -> anyhow::Result<(Value, Translation)> {
    let w = widest(mesh);
    let pod = w.pods.first().context("a pod of the widest workload")?;
    let subscription = subscriptions
        .of(w, pod)
        .with_context(|| format!("no subscription for {}", pod.name))?;
    let cache = scope_cache(store, subscription).await?;
    let (t, apart) = match this_program() {
        Some(program) => {
            let planned = planned_changes(&cache, mesh, &w.calls, CHANGES)?;
            let identity = identity_of(&mesh.topology, w, pod);
            let t = translate_apart(&program, &identity, &cache, &planned, FULL_RUNS, keep)?;
            (t, true)
        }
        None => {
            let proxy = proxy_of(&mesh.topology, w, pod)?;
            let t = translate(&proxy, cache.clone(), mesh, &w.calls, (FULL_RUNS, CHANGES))?;
            (t, false)
        }
    };
    let measured_in = if apart {
        "a process of its own, as an agent"
    } else {
        "the bench's own process"
    };
    println!(
        "A1: {} ({} services, {} objects in its scope): full translation p50 {:.1} ms, p99 {:.1} \
         ms of {} (the first, cold, {:.1} ms); one change p99: DestinationRule {:.2} ms, \
         VirtualService {:.2} ms, endpoints {:.2} ms (the agent's translator in {measured_in}, \
         encoded)",
        w.app,
        t.services,
        t.objects,
        percentile(&t.full_ms, 50.0),
        percentile(&t.full_ms, 99.0),
        t.full_ms.len(),
        t.full_ms.first().copied().unwrap_or_default(),
        percentile(&t.change_ms["destination_rule"], 99.0),
        percentile(&t.change_ms["virtual_service"], 99.0),
        percentile(&t.change_ms["endpoints"], 99.0),
    );

    // The real process.
    let watched_service = &mesh.workloads[*w.calls.first().context("the aggregator's calls")?];
    let watched = Watched {
        host: watched_service.host.clone(),
        subset: "v2".into(),
    };
    let fleet = Fleet::launch(
        binary,
        server,
        (&mesh.topology, &[(w, pod)]),
        &watched,
        agents::Cache::PerAgent,
    )?;
    agents::wait_until("A1: the agent's client holds its routes", &fleet, || {
        fleet.state(0).is_some_and(|s| s.weight.is_some())
    })
    .await?;
    let (pid, admin) = fleet.agents().next().context("the agent")?;
    let ticks = crate::agent::clock_ticks();
    let cpu0 = crate::agent::usage(pid, ticks)?.cpu_s;
    let idling = Instant::now();
    tokio::time::sleep(idle).await;
    let idle_usage = crate::agent::usage(pid, ticks)?;
    let (cpu1, rss_idle) = (idle_usage.cpu_s, idle_usage.rss);
    let idle_cpu = (cpu1 - cpu0) / idling.elapsed().as_secs_f64() * 100.0;
    let mut client =
        pasa_proto::store::v1::store_client::StoreClient::connect(format!("http://{server}"))
            .await?;
    // Until now the agent translated only to serve its client from scratch.
    let translations_before = translation_totals(&agents::scrape(admin).await?);
    // (The snapshot comes in several watch messages, so in several translations.)
    let startup_translation_ms = translations_before.1 * 1e3;
    // Its peak so far is its start's; from here on, the changes'.
    let rss_peak_start = idle_usage.peak;
    crate::agent::reset_peak(pid)?;
    let busy = Instant::now();
    let mut live = cache;
    let mut written = 0;
    for n in 0..LIVE_CHANGES {
        for kind in KINDS {
            let j = w.calls[(n * 7 + 3) % w.calls.len()];
            let resource = changed(&live, mesh, kind, j, CHANGES + n)?;
            let revision = crate::agent::apply_documents(
                &mut client,
                vec![manifest(&resource)],
                "A1's change",
            )
            .await?;
            live.apply(Change {
                action: Action::Modified,
                revision,
                resource,
                committed: None,
            });
            written += 1;
            tokio::time::sleep(LIVE_INTERVAL).await;
        }
    }
    let after = crate::agent::usage(pid, ticks)?;
    let (cpu2, rss_after) = (after.cpu_s, after.rss);
    let busy_s = busy.elapsed().as_secs_f64();
    let change_cpu = (cpu2 - cpu1) / busy_s * 100.0;
    // What the changes cost over what idling would have cost in the same time.
    let idle_share = (cpu1 - cpu0) / idling.elapsed().as_secs_f64() * busy_s;
    let cpu_per_change_ms = ((cpu2 - cpu1) - idle_share).max(0.0) / f64::from(written) * 1e3;
    let metrics = agents::scrape(admin).await?;
    let (count_after, sum_after) = translation_totals(&metrics);
    let translations = count_after - translations_before.0;
    let mean_translation_ms =
        (translations > 0.0).then(|| (sum_after - translations_before.1) / translations * 1e3);
    let propagation: BTreeMap<&str, Value> = ["CDS", "EDS", "RDS"]
        .into_iter()
        .map(|kind| {
            let b = agents::histogram(&metrics, "pasa_agent_propagation_seconds", kind);
            let at_most = |q| agents::bucket_quantile(&b, q).map(|s| round2(s * 1e3));
            (
                kind,
                json!({"p50_at_most_ms": at_most(0.5), "p99_at_most_ms": at_most(0.99),
                          "observed": b.last().map_or(0, |x| x.1)}),
            )
        })
        .collect();
    // Once the changes are over and the agent has returned what they freed (it does after 100 ms
    // with nothing new to serve).
    tokio::time::sleep(SETTLE).await;
    let settled = crate::agent::usage(pid, ticks)?;
    let (rss_settled, rss_peak_changes) = (settled.rss, settled.peak);
    drop(fleet);
    println!(
        "A1: the real agent: RSS {rss_idle:.1} MiB idle ({:.1} MiB its own, {:.1} MiB of mapped \
         files, mostly its binary's text, which the agents of a node share in the page cache), \
         {rss_after:.1} MiB right after {written} changes, {rss_settled:.1} MiB {} s later; peak \
         {rss_peak_start:.1} MiB while it started, {rss_peak_changes:.1} MiB from the changes on; CPU \
         {idle_cpu:.2}% idle over {:.0} s, {change_cpu:.2}% while changes came every {} ms ({cpu_per_change_ms:.1} ms of CPU per change); its mean \
         translation while they came {} ms over {translations} translations; when it started, \
         {startup_translation_ms:.1} ms in {} translations as its snapshot came in",
        idle_usage.anon,
        idle_usage.file,
        SETTLE.as_secs(),
        idle.as_secs_f64(),
        LIVE_INTERVAL.as_millis(),
        mean_translation_ms.map_or("unknown".into(), |m| format!("{m:.2}")),
        translations_before.0,
    );
    let figures = json!({
        "workload": w.app, "services": t.services, "objects": t.objects,
        "full_ms": {
            "p50": round2(percentile(&t.full_ms, 50.0)),
            "p99": round2(percentile(&t.full_ms, 99.0)),
            "first": t.full_ms.first().copied().map(round2),
            "measured_in": measured_in,
        },
        "change_ms": t.change_ms.iter().map(|(k, v)| (k.to_string(), quantiles(v)))
            .collect::<serde_json::Map<_, _>>(),
        "encoded_kib": round2(t.encoded_bytes as f64 / 1024.0),
        "process": {
            "rss_idle_mib": round2(rss_idle), "rss_after_changes_mib": round2(rss_after),
            "rss_settled_mib": round2(rss_settled),
            "rss_idle_anon_mib": round2(idle_usage.anon),
            "rss_idle_file_mib": round2(idle_usage.file),
            "rss_peak_start_mib": round2(rss_peak_start),
            "rss_peak_changes_mib": round2(rss_peak_changes),
            "cpu_idle_percent": round2(idle_cpu),
            "idle_s": idle.as_secs_f64(), "changes": written,
            "cpu_during_changes_percent": round2(change_cpu),
            "cpu_ms_per_change": round2(cpu_per_change_ms),
            "mean_translation_ms": mean_translation_ms.map(round2),
            "startup_translation_ms": round2(startup_translation_ms),
            "startup_translations": translations_before.0,
            "translations": translations,
            "propagation": propagation,
        },
        "goal": {"full_ms": 30, "change_ms": 2, "rss_mib": 30, "idle_cpu_percent": 0.5},
    });
    Ok((figures, t))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(kind: &str, name: &str, spec: Value, revision: u64) -> Resource {
        crate::translate::resource(kind, "default", name, spec, revision)
    }

    /// What `seed` hands the translation process (the saved scope, the changes, the proxy's
    /// identity) comes back as the figures of that scope, through their JSON.
    #[test]
    fn the_translation_process_times_the_saved_scope_and_its_changes() {
        let endpoints = |address: &str| {
            json!({"addresses": ["10.96.0.10"], "ports": [{"name": "http", "port": 80}],
                   "endpoints": [{"address": address, "labels": {"app": "reviews"},
                                  "ports": {"http": 9080}}]})
        };
        let rule = |max: u32| {
            json!({"host": "reviews.default.svc.cluster.local",
                   "trafficPolicy": {"connectionPool": {"tcp": {"maxConnections": max}}}})
        };
        let cache = Cache::from_resources(
            [
                resource("ServiceEndpoints", "reviews", endpoints("10.1.0.1"), 1),
                resource("DestinationRule", "reviews", rule(10), 2),
            ],
            2,
        );
        let planned = vec![
            resource("DestinationRule", "reviews", rule(11), 3),
            resource("ServiceEndpoints", "reviews", endpoints("10.1.0.2"), 4),
            resource("DestinationRule", "reviews", rule(12), 5),
        ];
        let dir = tempfile::tempdir().unwrap();
        cache.save(dir.path()).unwrap();
        let changes = ListResponse {
            resources: planned,
            revision: 2,
        };
        std::fs::write(dir.path().join(CHANGES_FILE), changes.encode_to_vec()).unwrap();
        let args = ScopeArgs {
            dir: dir.path().to_path_buf(),
            full_runs: 3,
            identity: IdentityArgs {
                node_id: "sidecar~10.1.0.9~client.default~default.svc.cluster.local".into(),
                labels: "app=client".into(),
                service_account: "client".into(),
                cluster_id: "Kubernetes".into(),
                ..Default::default()
            },
        };
        let t = Translation::from_json(&translate_scope(&args).unwrap()).unwrap();
        assert_eq!((t.services, t.objects, t.full_ms.len()), (1, 2, 3));
        assert_eq!(t.change_ms["destination_rule"].len(), 2);
        assert_eq!(t.change_ms["endpoints"].len(), 1);
        assert!(!t.change_ms.contains_key("virtual_service"));
        assert!(t.encoded_bytes > 0);

        let empty = tempfile::tempdir().unwrap();
        let missing = ScopeArgs {
            dir: empty.path().to_path_buf(),
            ..args
        };
        let err = translate_scope(&missing).unwrap_err().to_string();
        assert!(err.contains("no saved cache"), "{err}");
    }
}
