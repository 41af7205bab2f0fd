//! The write path on the fake in-memory backend: atomic batches, every error reported with its
//! field, optimistic concurrency, dry runs, deletes, and lists at past revisions.

use std::collections::BTreeMap;
use std::sync::Arc;

use pasa_proto::store::v1::{
    ApplyDocument, ApplyOutcome, DeleteRequest, ErrorCode, ObjectRef, Resource,
};
use pasa_store::backend::memory::FakeMemoryBackend;
use pasa_store::metrics::Metrics;
use pasa_store::selector::{Rule, Selector};
use pasa_store::{Store, StoreConfig, StoreError};
use serde_json::{Value, json};

fn open(backend: &FakeMemoryBackend, config: StoreConfig) -> Store {
    Store::open(Arc::new(backend.clone()), config, Metrics::new()).expect("open")
}

fn vs(name: &str, host: &str) -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
           "metadata": {"name": name, "namespace": "app"}, "spec": {"hosts": [host]}})
}

fn docs(values: &[Value]) -> Vec<ApplyDocument> {
    values
        .iter()
        .map(|v| ApplyDocument {
            json: v.to_string(),
            expected_mod_revision: None,
        })
        .collect()
}

fn with_expected(v: &Value, expected: u64) -> ApplyDocument {
    ApplyDocument {
        json: v.to_string(),
        expected_mod_revision: Some(expected),
    }
}

#[tokio::test]
async fn a_batch_with_a_bad_document_writes_nothing_and_names_every_problem() {
    let store = open(&FakeMemoryBackend::default(), StoreConfig::default());
    let batch = vec![
        vs("good", "good"),
        json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
               "metadata": {"name": "BAD"}, "spec": {"hosts": ["x.*.com"]}}),
        vs("good", "other"),
        json!({"kind": "Pod", "metadata": {"name": "p"}}),
    ];
    let mut d = docs(&batch);
    d.push(ApplyDocument {
        json: "{not json".into(),
        expected_mod_revision: None,
    });
    let r = store.apply(d, false).await.unwrap();
    let errors: Vec<(u32, String, i32)> = r
        .errors
        .iter()
        .map(|e| (e.index, e.field.clone(), e.code))
        .collect();
    assert_eq!(
        errors,
        [
            (1, "metadata.name".to_string(), ErrorCode::Invalid as i32),
            (2, "".to_string(), ErrorCode::Duplicate as i32),
            (3, "apiVersion".to_string(), ErrorCode::Invalid as i32),
            (3, "kind".to_string(), ErrorCode::Invalid as i32),
            (4, "".to_string(), ErrorCode::Invalid as i32),
        ],
        "{:?}",
        r.errors
    );
    assert_eq!(r.errors[1].duplicate_of, Some(0));
    assert!(r.results.is_empty());
    assert_eq!(store.revision(), 0, "nothing written");
    // The host error is reported once the name is fixed.
    let r = store
        .apply(
            docs(&[
                json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
                "metadata": {"name": "ok"}, "spec": {"hosts": ["x.*.com"]}}),
            ]),
            false,
        )
        .await
        .unwrap();
    assert_eq!(r.errors[0].field, "spec.hosts[0]");
    assert_eq!(store.revision(), 0);
}

#[tokio::test]
async fn revisions_outcomes_and_dry_runs() {
    let store = open(&FakeMemoryBackend::default(), StoreConfig::default());
    let r = store
        .apply(docs(&[vs("a", "a"), vs("b", "b"), vs("c", "c")]), false)
        .await
        .unwrap();
    let revs: Vec<u64> = r.results.iter().map(|x| x.revision).collect();
    assert_eq!(revs, [1, 2, 3], "a batch takes consecutive revisions");
    assert_eq!(r.revision, 3);

    let dry = store
        .apply(docs(&[vs("a", "a2"), vs("d", "d")]), true)
        .await
        .unwrap();
    let outcomes: Vec<i32> = dry.results.iter().map(|x| x.outcome).collect();
    assert_eq!(
        outcomes,
        [
            ApplyOutcome::Configured as i32,
            ApplyOutcome::Created as i32
        ]
    );
    assert_eq!(store.revision(), 3, "a dry run writes nothing");

    let r = store
        .apply(docs(&[vs("a", "a"), vs("b", "b2")]), false)
        .await
        .unwrap();
    assert_eq!(r.results[0].outcome, ApplyOutcome::Unchanged as i32);
    assert_eq!(r.results[0].revision, 1);
    assert_eq!(r.results[1].outcome, ApplyOutcome::Configured as i32);
    assert_eq!(r.results[1].revision, 4);
    let key = pasa_store::record::ObjectKey {
        kind: pasa_proto::Kind::VirtualService,
        namespace: "app".into(),
        name: "b".into(),
    };
    let (b, _) = store.get(&key);
    let b = b.unwrap();
    assert_eq!((b.create_revision, b.mod_revision, b.version), (2, 4, 2));
    assert_eq!(
        b.index.as_ref().unwrap().hosts,
        ["b2.app.svc.cluster.local"]
    );
}

#[tokio::test]
async fn expected_revisions_guard_concurrent_writers() {
    let store = open(&FakeMemoryBackend::default(), StoreConfig::default());
    // Create-only.
    let r = store
        .apply(vec![with_expected(&vs("a", "a"), 0)], false)
        .await
        .unwrap();
    assert!(r.errors.is_empty());
    let r = store
        .apply(vec![with_expected(&vs("a", "x"), 0)], false)
        .await
        .unwrap();
    assert_eq!(r.errors[0].code, ErrorCode::Conflict as i32);
    assert!(
        r.errors[0]
            .message
            .contains("expected to not exist yet, but it is at 1"),
        "{:?}",
        r.errors
    );
    // Update from a stale read loses; from a fresh read wins.
    store.apply(docs(&[vs("a", "b")]), false).await.unwrap();
    let stale = store
        .apply(vec![with_expected(&vs("a", "c"), 1)], false)
        .await
        .unwrap();
    assert_eq!(stale.errors[0].code, ErrorCode::Conflict as i32);
    assert_eq!(stale.errors[0].field, "metadata.resourceVersion");
    let fresh = store
        .apply(vec![with_expected(&vs("a", "c"), 2)], false)
        .await
        .unwrap();
    assert!(fresh.errors.is_empty());
    assert_eq!(store.revision(), 3);
    // The whole batch fails with one conflict.
    let r = store
        .apply(
            vec![
                with_expected(&vs("a", "d"), 1),
                with_expected(&vs("n", "n"), 0),
            ],
            false,
        )
        .await
        .unwrap();
    assert_eq!(r.errors.len(), 1);
    assert_eq!(store.revision(), 3);
    // Deletes too.
    let del = |expected| DeleteRequest {
        refs: vec![ObjectRef {
            kind: "VirtualService".into(),
            namespace: "app".into(),
            name: "a".into(),
        }],
        expected_mod_revision: Some(expected),
        ignore_not_found: false,
    };
    let r = store.delete(del(2)).await.unwrap();
    assert_eq!(r.errors[0].code, ErrorCode::Conflict as i32);
    let r = store.delete(del(3)).await.unwrap();
    assert_eq!(r.deleted.len(), 1);
    assert_eq!(r.revision, 4);
}

#[tokio::test]
async fn deletes_are_atomic_and_report_missing_objects() {
    let store = open(&FakeMemoryBackend::default(), StoreConfig::default());
    store
        .apply(docs(&[vs("a", "a"), vs("b", "b")]), false)
        .await
        .unwrap();
    let refs = |names: &[&str]| {
        names
            .iter()
            .map(|n| ObjectRef {
                kind: "vs".into(),
                namespace: "app".into(),
                name: n.to_string(),
            })
            .collect()
    };
    let r = store
        .delete(DeleteRequest {
            refs: refs(&["a", "missing"]),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(r.errors.len(), 1);
    assert_eq!(r.errors[0].code, ErrorCode::NotFound as i32);
    assert!(
        r.errors[0]
            .message
            .contains("virtualservice/app/missing not found")
    );
    assert_eq!(store.revision(), 2, "nothing deleted");
    let r = store
        .delete(DeleteRequest {
            refs: refs(&["a", "missing", "b"]),
            ignore_not_found: true,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(r.deleted.len(), 2);
    assert_eq!(store.revision(), 4);
    assert_eq!(
        store.status().objects.iter().map(|(_, n)| n).sum::<u64>(),
        0
    );
}

#[tokio::test]
async fn batch_size_is_limited() {
    let config = StoreConfig {
        max_batch: 2,
        ..StoreConfig::default()
    };
    let store = open(&FakeMemoryBackend::default(), config);
    let err = store
        .apply(docs(&[vs("a", "a"), vs("b", "b"), vs("c", "c")]), false)
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::BatchTooLarge { size: 3, limit: 2 }),
        "{err}"
    );
}

/// A list at any retained past revision equals the state recorded right after that revision,
/// for random creates, updates and deletes, whole and through a host selector.
#[tokio::test]
async fn lists_at_past_revisions_match_recorded_states() {
    let backend = FakeMemoryBackend::default();
    let store = open(&backend, StoreConfig::default());
    let mut states: Vec<BTreeMap<String, String>> = vec![BTreeMap::new()];
    let mut current: BTreeMap<String, String> = BTreeMap::new();
    let mut seed: u64 = 7;
    let mut next = |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    for _ in 0..150 {
        let name = format!("o{}", next(12));
        if next(4) == 0 {
            let r = store
                .delete(DeleteRequest {
                    refs: vec![ObjectRef {
                        kind: "vs".into(),
                        namespace: "app".into(),
                        name: name.clone(),
                    }],
                    ignore_not_found: true,
                    ..Default::default()
                })
                .await
                .unwrap();
            if !r.deleted.is_empty() {
                current.remove(&name);
                states.push(current.clone());
            }
        } else {
            let host = format!("h{}", next(5));
            let r = store.apply(docs(&[vs(&name, &host)]), false).await.unwrap();
            if r.results[0].outcome != ApplyOutcome::Unchanged as i32 {
                current.insert(name, host);
                states.push(current.clone());
            }
        }
    }
    assert_eq!(store.revision() as usize, states.len() - 1);
    let h2 = Selector {
        rules: vec![Rule {
            hosts: vec!["h2.app.svc.cluster.local".into()],
            ..Default::default()
        }],
    };
    let summarize = |rs: Vec<Arc<Resource>>| -> BTreeMap<String, String> {
        rs.iter()
            .map(|r| {
                let v: Value = serde_json::from_str(&r.spec_json).unwrap();
                (r.name.clone(), v["hosts"][0].as_str().unwrap().to_string())
            })
            .collect()
    };
    for (revision, state) in states.iter().enumerate().skip(1) {
        let (all, at) = store
            .list(&Selector::everything(), revision as u64)
            .await
            .unwrap();
        assert_eq!(at, revision as u64);
        assert_eq!(&summarize(all), state, "everything at revision {revision}");
        let (some, _) = store.list(&h2, revision as u64).await.unwrap();
        let want: BTreeMap<String, String> = state
            .iter()
            .filter(|(_, h)| h.as_str() == "h2")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        assert_eq!(summarize(some), want, "host h2 at revision {revision}");
    }
    let err = store
        .list(&Selector::everything(), store.revision() + 1)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::FutureRevision { .. }), "{err}");

    // Reopening the same data gives the same state and revision.
    let head = store.revision();
    store.shutdown();
    let reopened = open(&backend, StoreConfig::default());
    assert_eq!(reopened.revision(), head);
    let (all, _) = reopened.list(&Selector::everything(), 0).await.unwrap();
    assert_eq!(&summarize(all), states.last().unwrap());
}
