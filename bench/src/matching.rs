//! `match`: event fan-out cost. Registers N sidecar subscriptions and M objects in a [`Hub`],
//! then times "which subscribers does this object concern" by the rule index and by evaluating
//! every subscription, checking that both give the same answer.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{Context, bail, ensure};
use pasa_proto::Kind;
use pasa_store::hub::Hub;
use pasa_store::index::ObjectKeys;
use pasa_store::metrics::Metrics;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::fixture::Mesh;
use crate::stats::{peak_rss_mib, percentile, round2};

/// Queue capacity of each registered watcher (nothing is committed, so nothing is queued).
const QUEUE: usize = 16;
/// Samples checked (and timed) against the brute-force evaluator at most.
const MAX_BRUTE_FORCE: usize = 200;

/// Indexed timings of the samples of one kind.
#[derive(Default)]
struct KindStats {
    us: Vec<f64>,
    matches: u64,
}

#[derive(Debug, Clone, clap::Args)]
pub struct MatchArgs {
    /// Registered subscriptions (sidecars).
    #[arg(long)]
    pub subscriptions: usize,
    /// Stored objects.
    #[arg(long)]
    pub objects: usize,
    /// Objects to match (drawn at random, with replacement).
    #[arg(long, default_value_t = 2000)]
    pub samples: usize,
    /// Namespaces of the mesh [default: subscriptions / 100, at least 1].
    #[arg(long)]
    pub namespaces: Option<usize>,
    /// Seed of the generated mesh and samples.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
}

/// Runs the scenario, printing progress lines; returns the JSON summary.
pub fn run(args: &MatchArgs) -> anyhow::Result<Value> {
    ensure!(args.subscriptions > 0, "--subscriptions must be at least 1");
    ensure!(args.objects > 0, "--objects must be at least 1");
    ensure!(args.samples > 0, "--samples must be at least 1");
    let namespaces = args.namespaces.unwrap_or(args.subscriptions / 100).max(1);
    let mut rng = StdRng::seed_from_u64(args.seed);

    let started = Instant::now();
    let mesh = Mesh::generate(args.objects, namespaces, &mut rng);
    let generated = started.elapsed();

    let mut hub = Hub::new(Metrics::new());
    let registering = Instant::now();
    let mut handles = Vec::with_capacity(args.subscriptions);
    for i in 0..args.subscriptions {
        handles.push(hub.register(mesh.subscriber(i, &mut rng), QUEUE));
    }
    let registered = registering.elapsed();

    let samples = (0..args.samples)
        .map(|_| {
            let r = &mesh.objects[rng.random_range(0..mesh.objects.len())];
            ObjectKeys::of(r)
                .with_context(|| format!("generated object of unknown kind {}", r.kind))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let loading = Instant::now();
    for r in mesh.objects {
        hub.load(r);
    }
    let loaded = loading.elapsed();
    let setup = started.elapsed();
    ensure!(
        hub.object_count() == args.objects as u64,
        "the hub holds {} objects, expected {}",
        hub.object_count(),
        args.objects
    );
    println!(
        "setup: {} namespaces, {} subscriptions, {} objects in {:.2}s (mesh {:.2}s, register {:.2}s, load {:.2}s)",
        namespaces,
        args.subscriptions,
        args.objects,
        setup.as_secs_f64(),
        generated.as_secs_f64(),
        registered.as_secs_f64(),
        loaded.as_secs_f64()
    );

    let checked = samples.len().min(MAX_BRUTE_FORCE);
    let mut indexed_us = Vec::with_capacity(samples.len());
    let mut brute_us = Vec::with_capacity(checked);
    let mut matches = 0u64;
    let mut by_kind: BTreeMap<Kind, KindStats> = BTreeMap::new();
    // Indexed first, brute force after: a brute-force pass walks every subscription and would
    // leave the next indexed call with a cold cache.
    let mut answers = Vec::with_capacity(checked);
    for (i, keys) in samples.iter().enumerate() {
        let t = Instant::now();
        let fast = hub.subscribers_of(keys);
        let us = t.elapsed().as_secs_f64() * 1e6;
        indexed_us.push(us);
        matches += fast.len();
        let stats = by_kind.entry(keys.kind).or_default();
        stats.us.push(us);
        stats.matches += fast.len();
        if i < checked {
            answers.push(fast);
        }
    }
    for (keys, fast) in samples.iter().zip(&answers) {
        let t = Instant::now();
        let slow = hub.subscribers_of_brute_force(keys);
        brute_us.push(t.elapsed().as_secs_f64() * 1e6);
        if *fast != slow {
            bail!(
                "index and brute force disagree on {} in {} (hosts {:?}, gateways {:?}): {} vs {} subscribers",
                keys.kind,
                keys.namespace,
                keys.hosts,
                keys.gateways,
                fast.len(),
                slow.len()
            );
        }
    }
    drop(handles);

    let indexed_p50 = round2(percentile(&indexed_us, 50.0));
    let indexed_p99 = round2(percentile(&indexed_us, 99.0));
    let brute_p50 = round2(percentile(&brute_us, 50.0));
    let brute_p99 = round2(percentile(&brute_us, 99.0));
    let speedup = round2(percentile(&brute_us, 50.0) / percentile(&indexed_us, 50.0).max(1e-3));
    let avg_matches = round2(matches as f64 / samples.len() as f64);
    let peak_rss = peak_rss_mib();
    println!(
        "indexed:     p50 {indexed_p50:.2} µs, p99 {indexed_p99:.2} µs over {} samples",
        samples.len()
    );
    for (kind, stats) in &by_kind {
        println!(
            "  {:<16} p50 {:>8.2} µs, p99 {:>8.2} µs, {:>8.1} subscribers on average over {} samples",
            kind.as_str(),
            percentile(&stats.us, 50.0),
            percentile(&stats.us, 99.0),
            stats.matches as f64 / stats.us.len() as f64,
            stats.us.len()
        );
    }
    println!(
        "brute force: p50 {brute_p50:.2} µs, p99 {brute_p99:.2} µs over {checked} samples (same answers)"
    );
    println!(
        "speedup at p50: {speedup:.2}x; {avg_matches:.2} matching subscribers per object on average"
    );
    match peak_rss {
        Some(mib) => println!("peak RSS: {mib:.2} MiB"),
        None => println!("peak RSS: unknown"),
    }
    Ok(json!({
        "mode": "match",
        "seed": args.seed,
        "subscriptions": args.subscriptions,
        "objects": args.objects,
        "namespaces": namespaces,
        "samples": samples.len(),
        "bruteforce_samples": checked,
        "setup_secs": round2(setup.as_secs_f64()),
        "indexed_p50_us": indexed_p50,
        "indexed_p99_us": indexed_p99,
        "bruteforce_p50_us": brute_p50,
        "bruteforce_p99_us": brute_p99,
        "speedup": speedup,
        "avg_matches": avg_matches,
        "peak_rss_mib": peak_rss,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_mesh_index_agrees_with_brute_force() {
        let args = MatchArgs {
            subscriptions: 200,
            objects: 100,
            samples: 300,
            namespaces: None,
            seed: 42,
        };
        let report = run(&args).unwrap();
        assert_eq!(report["mode"], "match");
        assert_eq!(report["subscriptions"], 200);
        assert_eq!(report["samples"], 300);
        assert_eq!(report["bruteforce_samples"], 200);
        assert!(report["avg_matches"].as_f64().unwrap() > 0.0);
    }
}
