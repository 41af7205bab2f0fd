//! The baselines the seed compares PASA with, on the same fixture and in the same run:
//! - **(a) brute force**: which watchers a changed object concerns, by evaluating every
//!   watcher's selector instead of the rule index, on the store's live watchers (a sample of the
//!   S2 batch, extrapolated to all of it);
//! - **(b) central push**: one process computing the full xDS of every proxy the S2 batch
//!   affects, as istiod does: full translations of a sample of workloads' proxies by the
//!   project's own translator, extrapolated to every affected proxy and divided over this
//!   machine's cores;
//! - **(c) quoted**: the figures of the article the seed comes from, and published istiod and
//!   Consul figures, as they were published.

use std::time::Instant;

use anyhow::ensure;
use pasa_proto::store::v1::ApplyDocument;
use pasa_store::Store;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use serde_json::{Value, json};

use super::mesh::Mesh;
use super::single::{scope_cache, translate};
use super::{Subscriptions, keys_of, proxy_of};
use crate::stats::{mean, percentile, round2};

/// Objects of the batch matched both ways, at most.
const MATCH_SAMPLE: usize = 50;
/// Workloads whose proxies are translated for the central-push estimate.
const PUSH_SAMPLE: usize = 24;

/// (a): the index against brute force on the live watchers, for the S2 batch.
pub fn brute_force(store: &Store, documents: &[ApplyDocument]) -> anyhow::Result<Value> {
    let keys = documents
        .iter()
        .take(MATCH_SAMPLE)
        .map(keys_of)
        .collect::<anyhow::Result<Vec<_>>>()?;
    let (index_s, brute_s, watchers) = store.with_hub(|hub| {
        let started = Instant::now();
        let indexed: Vec<_> = keys.iter().map(|(_, k)| hub.subscribers_of(k)).collect();
        let index_s = started.elapsed().as_secs_f64();
        let started = Instant::now();
        let brute: Vec<_> = keys
            .iter()
            .map(|(_, k)| hub.subscribers_of_brute_force(k))
            .collect();
        let brute_s = started.elapsed().as_secs_f64();
        (index_s, brute_s, (indexed == brute, hub.watcher_count()))
    });
    let (agree, watchers) = watchers;
    ensure!(
        agree,
        "the rule index and brute force disagree on the S2 batch"
    );
    let scale = documents.len() as f64 / keys.len().max(1) as f64;
    let (index_ms, brute_ms) = (index_s * scale * 1e3, brute_s * scale * 1e3);
    println!(
        "baseline (a): matching the {} changed objects of S2 against {watchers} watchers: rule \
         index {index_ms:.1} ms, brute force {brute_ms:.0} ms ({:.0}× slower; {} of them timed, \
         scaled to all)",
        documents.len(),
        brute_ms / index_ms.max(1e-9),
        keys.len()
    );
    Ok(
        json!({"objects": documents.len(), "timed": keys.len(), "watchers": watchers,
              "index_ms": round2(index_ms), "brute_force_ms": round2(brute_ms),
              "brute_over_index": round2(brute_ms / index_ms.max(1e-9))}),
    )
}

/// (b): what a central control plane would compute for the S2 batch: every affected proxy's
/// full xDS. `affected` is how many proxies S2 reached; `pasa_ms` PASA's composed figure.
pub async fn central_push(
    store: &Store,
    mesh: &Mesh,
    subscriptions: &Subscriptions,
    (affected, pasa_ms, seed): (u64, Option<f64>, u64),
) -> anyhow::Result<Value> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x0bad_5eed);
    let sample: Vec<_> = mesh
        .workloads
        .choose_multiple(&mut rng, PUSH_SAMPLE.min(mesh.workloads.len()))
        .collect();
    let (mut ms, mut bytes) = (Vec::new(), Vec::new());
    for w in &sample {
        let Some(pod) = w.pods.first() else { continue };
        let Some(subscription) = subscriptions.of(w, pod) else {
            continue;
        };
        let cache = scope_cache(store, subscription).await?;
        let proxy = proxy_of(&mesh.topology, w, pod)?;
        let t = translate(&proxy, cache, mesh, &w.calls, (3, 0))?;
        ms.push(percentile(&t.full_ms, 50.0));
        bytes.push(t.encoded_bytes as f64);
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let cpu_s = mean(&ms) * affected as f64 / 1e3;
    let wall_s = cpu_s / cores;
    let pushed_gib = mean(&bytes) * affected as f64 / (1024.0 * 1024.0 * 1024.0);
    let ratio = pasa_ms.map(|p| wall_s * 1e3 / p.max(1e-9));
    println!(
        "baseline (b): central push of the S2 batch: {affected} proxies × {:.1} ms full \
         translation (mean of {} sampled proxies, this translator) = {cpu_s:.0} s of CPU, \
         {wall_s:.0} s on {cores} cores, {pushed_gib:.2} GiB of xDS encoded (extrapolated, not \
         run){}",
        mean(&ms),
        ms.len(),
        match (pasa_ms, ratio) {
            (Some(p), Some(r)) =>
                format!("; PASA's composed push completion {p:.0} ms is {r:.0}× sooner"),
            _ => String::new(),
        }
    );
    Ok(
        json!({"affected_proxies": affected, "sampled_proxies": ms.len(),
              "full_translation_ms_mean": round2(mean(&ms)),
              "cpu_s": round2(cpu_s), "wall_s_on_this_machine": round2(wall_s), "cores": cores,
              "encoded_xds_gib": round2(pushed_gib),
              "pasa_push_completion_ms": pasa_ms.map(round2),
              "central_over_pasa": ratio.map(round2),
              "method": "extrapolated: sampled proxies' full translations × affected proxies ÷ cores"}),
    )
}

/// (c): published figures, quoted.
pub fn quoted() -> Value {
    json!({
        "article_2000_services_100k_pods_500_drs": {
            "istiod": {"push_completion_s": 120, "control_plane_memory_gib": 28},
            "pasa": {"push_completion_s": 15, "control_plane_memory_gib": 4},
        },
        "istiod_at_20k_to_30k_sidecars_memory_gb": [32, 43],
        "consul_local_xds": {"instances": 172_000, "one_change_s": "< 1"},
    })
}
