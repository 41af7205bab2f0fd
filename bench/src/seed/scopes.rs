//! The eager scope against the on-demand scope on the same mesh (see `docs/on-demand.md`): what
//! each pod's subscription holds, and what the S2 batch sends it, under each. Most meshes write
//! no Sidecars (`--no-sidecars`): the eager scope is then the whole mesh, and on demand it is
//! what the workload calls, once it has called each.
//!
//! The subscribers of S1–S6 take one scope's subscriptions (`--scope`), so that scope is
//! measured as delivered. Both are also worked out here from the same store and the same
//! oracle the scenarios use: each distinct subscription's snapshot listed by the store's own
//! index (the objects and bytes of specs a subscriber of it receives on connecting), and its
//! selector evaluated on the keys of the batch's objects (the events it is sent). The figures
//! are per pod: the pods of a workload share its subscription.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context;
use pasa_agent::run::Scope;
use pasa_proto::store::v1::{ApplyDocument, Subscription};
use pasa_store::Store;
use pasa_store::selector::Selector;
use serde_json::{Value, json};

use super::keys_of;
use super::mesh::Mesh;
use super::subscriptions::Subscriptions;
use crate::stats::{percentile, sizes};

/// The name a scope goes by in the report, as the agent's `--scope` spells it.
pub fn name(scope: Scope) -> &'static str {
    match scope {
        Scope::Eager => "eager",
        Scope::OnDemand => "on-demand",
    }
}

/// What one distinct subscription holds and is sent.
struct Held {
    rules: usize,
    objects: usize,
    spec_bytes: usize,
    /// Events of the batch it matches.
    batch_events: usize,
}

/// Each scope's figures, per pod, and the on-demand scope's share of the eager one.
pub async fn compare(
    store: &Store,
    mesh: &Mesh,
    derived: &[(Scope, &Subscriptions)],
    batch: &[ApplyDocument],
) -> anyhow::Result<Value> {
    let keys = batch
        .iter()
        .map(keys_of)
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut out = serde_json::Map::new();
    for &(scope, subscriptions) in derived {
        let mut held: BTreeMap<*const Subscription, Held> = BTreeMap::new();
        let mut per_pod = Vec::with_capacity(mesh.pods().size_hint().0);
        for (w, pod) in mesh.pods() {
            let subscription = subscriptions
                .of(w, pod)
                .with_context(|| format!("no subscription for {}", pod.name))?;
            let ptr = Arc::as_ptr(subscription);
            if let std::collections::btree_map::Entry::Vacant(slot) = held.entry(ptr) {
                let selector = Selector::from_pb(subscription).context("a derived subscription")?;
                let (listed, _) = store.list(&selector, 0).await?;
                slot.insert(Held {
                    rules: subscription.rules.len(),
                    objects: listed.len(),
                    spec_bytes: listed.iter().map(|r| r.spec_json.len()).sum(),
                    batch_events: keys.iter().filter(|(_, k)| selector.matches(k)).count(),
                });
            }
            per_pod.push(ptr);
        }
        let samples = |f: &dyn Fn(&Held) -> usize| -> Vec<f64> {
            per_pod.iter().map(|p| f(&held[p]) as f64).collect()
        };
        let (rules, objects, bytes, events) = (
            samples(&|h| h.rules),
            samples(&|h| h.objects),
            samples(&|h| h.spec_bytes),
            samples(&|h| h.batch_events),
        );
        let deliveries = events.iter().sum::<f64>() as u64;
        let woken = events.iter().filter(|&&e| e > 0.0).count();
        println!(
            "scope {}: per pod, {:.0} subscription rules, {:.0} objects ({:.1} KiB of specs) at \
             p50, {:.0} ({:.1} KiB) at most; the S2 batch sends {deliveries} events and wakes \
             {woken} of {} subscribers",
            name(scope),
            percentile(&rules, 50.0),
            percentile(&objects, 50.0),
            percentile(&bytes, 50.0) / 1024.0,
            percentile(&objects, 100.0),
            percentile(&bytes, 100.0) / 1024.0,
            per_pod.len(),
        );
        out.insert(
            name(scope).into(),
            json!({"distinct_subscriptions": held.len(),
                   "subscription_rules": sizes(&rules),
                   "snapshot_objects": sizes(&objects),
                   "snapshot_spec_bytes": sizes(&bytes),
                   "snapshot_objects_total": objects.iter().sum::<f64>() as u64,
                   "s2_deliveries": deliveries, "s2_woken": woken}),
        );
    }
    let ratio = |what: &str, p: Option<&str>| {
        let of = |scope: Scope| {
            let v = &out.get(name(scope))?[what];
            p.map_or(v.as_f64(), |p| v[p].as_f64())
        };
        match (of(Scope::OnDemand), of(Scope::Eager)) {
            // Four decimals: the share is of the order of a hundredth.
            (Some(lazy), Some(eager)) if eager > 0.0 => Some((lazy / eager * 1e4).round() / 1e4),
            _ => None,
        }
    };
    let share = json!({
        "snapshot_objects_mean": ratio("snapshot_objects", Some("mean")),
        "snapshot_spec_bytes_mean": ratio("snapshot_spec_bytes", Some("mean")),
        "s2_deliveries": ratio("s2_deliveries", None),
        "s2_woken": ratio("s2_woken", None),
    });
    if let (Some(objects), Some(deliveries)) = (
        share["snapshot_objects_mean"].as_f64(),
        share["s2_deliveries"].as_f64(),
    ) {
        println!(
            "scopes: on demand, a pod's subscription holds {:.2} % of the eager one's objects, \
             and the S2 batch sends {:.2} % of the events",
            objects * 100.0,
            deliveries * 100.0
        );
    }
    out.insert("on_demand_over_eager".into(), share);
    Ok(Value::Object(out))
}
