//! `write`: sustained durable write throughput. Applies R VirtualServices in batches of B to a
//! [`Store`] on sled, from C concurrent tasks; each apply returns only after its batch is flushed
//! to disk, so the rate measured is the durable one.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, bail, ensure};
use pasa_proto::store::v1::{ApplyDocument, ApplyOutcome};
use pasa_store::Store;
use serde_json::{Value, json};

use crate::stats::{peak_rss_mib, percentile, round2};

/// Namespaces the documents are spread over.
const NAMESPACES: usize = 50;

#[derive(Debug, Clone, clap::Args)]
pub struct WriteArgs {
    /// VirtualServices to write.
    #[arg(long, default_value_t = 100_000)]
    pub resources: usize,
    /// Documents per apply.
    #[arg(long, default_value_t = 100)]
    pub batch: usize,
    /// Database directory [default: a fresh temporary directory, removed afterwards].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Concurrent writers sharing the batches.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
}

/// VirtualService number `i` as a manifest.
fn document(i: usize) -> ApplyDocument {
    let host = format!("svc-{i}");
    let doc = json!({
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": format!("vs-{i}"), "namespace": format!("ns-{}", i % NAMESPACES)},
        "spec": {
            "hosts": [host],
            "http": [{"route": [{"destination": {"host": host}}]}],
        },
    });
    ApplyDocument {
        json: doc.to_string(),
        expected_mod_revision: None,
    }
}

/// Outcome counts over every applied document.
#[derive(Default, Debug, Clone, Copy)]
struct Outcomes {
    created: u64,
    configured: u64,
    unchanged: u64,
}

/// What one writer task measured.
#[derive(Default)]
struct TaskResult {
    latencies_ms: Vec<f64>,
    outcomes: Outcomes,
}

/// Runs the scenario, printing progress lines; returns the JSON summary.
pub fn run(args: &WriteArgs) -> anyhow::Result<Value> {
    ensure!(args.resources > 0, "--resources must be at least 1");
    ensure!(args.batch > 0, "--batch must be at least 1");
    ensure!(args.concurrency > 0, "--concurrency must be at least 1");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the Tokio runtime")?;
    runtime.block_on(run_async(args))
}

async fn run_async(args: &WriteArgs) -> anyhow::Result<Value> {
    // Kept until the end: dropping it removes a temporary database.
    let embedded = crate::embedded::open(args.data_dir.as_deref(), "pasa-bench-", args.batch)?;
    let (store, dir) = (embedded.store.clone(), embedded.dir.clone());
    let start_revision = store.revision();

    let generating = Instant::now();
    let batches: Vec<Vec<ApplyDocument>> = (0..args.resources)
        .collect::<Vec<_>>()
        .chunks(args.batch)
        .map(|chunk| chunk.iter().map(|&i| document(i)).collect())
        .collect();
    let batch_count = batches.len();
    println!(
        "generated {} VirtualServices in {} batches of up to {} in {:.2}s; writing to {} with {} writer(s)",
        args.resources,
        batch_count,
        args.batch,
        generating.elapsed().as_secs_f64(),
        dir.display(),
        args.concurrency
    );

    let queue = Arc::new(Mutex::new(batches.into_iter()));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(args.concurrency);
    for _ in 0..args.concurrency {
        let store = store.clone();
        let queue = Arc::clone(&queue);
        tasks.push(tokio::spawn(async move { writer(store, queue).await }));
    }
    let mut latencies_ms = Vec::with_capacity(batch_count);
    let mut outcomes = Outcomes::default();
    for task in tasks {
        let result = task.await.context("a writer task panicked")??;
        latencies_ms.extend(result.latencies_ms);
        outcomes.created += result.outcomes.created;
        outcomes.configured += result.outcomes.configured;
        outcomes.unchanged += result.outcomes.unchanged;
    }
    let seconds = started.elapsed().as_secs_f64();
    let end_revision = store.revision();
    tokio::task::spawn_blocking(move || store.shutdown())
        .await
        .context("store shutdown panicked")?;

    let applied = outcomes.created + outcomes.configured + outcomes.unchanged;
    ensure!(
        applied == args.resources as u64,
        "{applied} documents acknowledged, expected {}",
        args.resources
    );
    let rate = args.resources as f64 / seconds;
    let p50 = round2(percentile(&latencies_ms, 50.0));
    let p99 = round2(percentile(&latencies_ms, 99.0));
    let peak_rss = peak_rss_mib();
    println!(
        "wrote {} resources in {seconds:.2}s: {rate:.0} resources/s ({} created, {} configured, {} unchanged; revision {start_revision} -> {end_revision})",
        args.resources, outcomes.created, outcomes.configured, outcomes.unchanged
    );
    println!("batch latency: p50 {p50:.2} ms, p99 {p99:.2} ms over {batch_count} batches");
    match peak_rss {
        Some(mib) => println!("peak RSS: {mib:.2} MiB"),
        None => println!("peak RSS: unknown"),
    }
    Ok(json!({
        "mode": "write",
        "resources": args.resources,
        "batch": args.batch,
        "concurrency": args.concurrency,
        "seconds": round2(seconds),
        "resources_per_sec": round2(rate),
        "batch_p50_ms": p50,
        "batch_p99_ms": p99,
        "created": outcomes.created,
        "configured": outcomes.configured,
        "unchanged": outcomes.unchanged,
        "peak_rss_mib": peak_rss,
    }))
}

/// Applies batches from the shared queue until it is empty.
async fn writer(
    store: Store,
    queue: Arc<Mutex<std::vec::IntoIter<Vec<ApplyDocument>>>>,
) -> anyhow::Result<TaskResult> {
    let mut result = TaskResult::default();
    loop {
        let next = queue.lock().unwrap_or_else(|p| p.into_inner()).next();
        let Some(docs) = next else {
            return Ok(result);
        };
        let size = docs.len();
        let t = Instant::now();
        let response = store.apply(docs, false).await.context("apply failed")?;
        result.latencies_ms.push(t.elapsed().as_secs_f64() * 1e3);
        if let Some(e) = response.errors.first() {
            bail!(
                "apply rejected {} document(s); first: document {} field {:?}: {}",
                response.errors.len(),
                e.index,
                e.field,
                e.message
            );
        }
        ensure!(
            response.results.len() == size,
            "apply answered {} results for {size} documents",
            response.results.len()
        );
        for r in &response.results {
            match ApplyOutcome::try_from(r.outcome) {
                Ok(ApplyOutcome::Created) => result.outcomes.created += 1,
                Ok(ApplyOutcome::Configured) => result.outcomes.configured += 1,
                Ok(ApplyOutcome::Unchanged) => result.outcomes.unchanged += 1,
                _ => bail!("apply answered an unknown outcome {}", r.outcome),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_write_run() {
        let dir = tempfile::tempdir().unwrap();
        let args = WriteArgs {
            resources: 300,
            batch: 100,
            data_dir: Some(dir.path().join("db")),
            concurrency: 2,
        };
        let report = run(&args).unwrap();
        assert_eq!(report["mode"], "write");
        assert_eq!(report["resources"], 300);
        assert_eq!(report["created"], 300);
        assert!(report["resources_per_sec"].as_f64().unwrap() > 0.0);
        // The same documents again change nothing.
        let again = run(&args).unwrap();
        assert_eq!(again["unchanged"], 300);
    }
}
