//! The namespace follower against a **fake** Kubernetes API server (`pasa_kube::fake_apiserver`), driven by the
//! real `kube` client: the first list, then additions, label changes and deletions; a watch cut
//! short resumes without listing again; a watch from a compacted version (410 Gone) lists again,
//! and a deletion made meanwhile is seen.

use std::collections::BTreeMap;
use std::time::Duration;

use pasa_kube::fake_apiserver::FakeApiServer;
use pasa_kube::namespaces::Namespaces;

/// Waits (at most 10 s, woken by each applied event) until `done` holds.
async fn until(namespaces: &Namespaces, what: &str, done: impl Fn(&Namespaces) -> bool) {
    let mut applied = namespaces.applied();
    let waited = tokio::time::timeout(Duration::from_secs(10), async {
        while !done(namespaces) {
            applied.changed().await.expect("the follower stopped");
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "timed out waiting until {what}; have {:?}",
        namespaces.names()
    );
}

/// Waits (at most 10 s) for the follower's first complete list.
async fn first_list(namespaces: &Namespaces) {
    tokio::time::timeout(Duration::from_secs(10), namespaces.ready())
        .await
        .expect("the first list in time")
        .unwrap();
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test]
async fn namespaces_are_listed_then_followed() {
    let fake = FakeApiServer::start().await;
    fake.put_namespace("default", &[]);
    fake.put_namespace("bookinfo", &[("pasa.io/injection", "enabled")]);
    let namespaces = Namespaces::follow(fake.client());
    first_list(&namespaces).await;
    assert_eq!(namespaces.names(), ["bookinfo", "default"]);
    assert_eq!(
        namespaces.labels("bookinfo"),
        Some(labels(&[("pasa.io/injection", "enabled")]))
    );
    assert_eq!(namespaces.labels("nowhere"), None);

    fake.put_namespace("default", &[("pasa.io/injection", "enabled")]);
    fake.put_namespace("shop", &[]);
    fake.delete_namespace("bookinfo");
    until(
        &namespaces,
        "default is labelled, shop added, bookinfo gone",
        |n| {
            n.labels("default") == Some(labels(&[("pasa.io/injection", "enabled")]))
                && n.names() == ["default", "shop"]
        },
    )
    .await;
    assert_eq!(fake.lists(), 1, "one list; the rest came by watch");

    // A watch cut short resumes from its version: no second list.
    let watches = fake.watches();
    fake.cut_watches();
    fake.put_namespace("late", &[]);
    until(&namespaces, "late is seen after the cut", |n| {
        n.labels("late").is_some()
    })
    .await;
    assert!(fake.watches() > watches, "watched again");
    assert_eq!(fake.lists(), 1, "resumed, not listed again");
}

#[tokio::test]
async fn a_compacted_version_is_listed_again() {
    let fake = FakeApiServer::start().await;
    fake.put_namespace("default", &[]);
    fake.put_namespace("gone-while-away", &[]);
    let namespaces = Namespaces::follow(fake.client());
    first_list(&namespaces).await;
    assert_eq!(namespaces.names(), ["default", "gone-while-away"]);

    // The watch ends and the history it would resume from is compacted: 410 Gone, then a list.
    fake.delete_namespace("gone-while-away");
    fake.put_namespace("new", &[]);
    fake.compact();
    fake.cut_watches();
    until(&namespaces, "the relist shows the deletion", |n| {
        n.names() == ["default", "new"]
    })
    .await;
    assert!(fake.lists() >= 2, "listed again after 410 Gone");
}
