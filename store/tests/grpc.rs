//! The store API over real gRPC on loopback: bookinfo samples, watches by host, namespace and
//! gateway with exactly the expected events, subscription changes mid-stream, resume after a
//! restart, compaction, historical lists, and a slow consumer.

mod common;

use common::*;
use pasa_proto::store::v1::{
    CancelReason, DeleteRequest, ListRequest, ObjectRef, Rule, Subscription, watch_response,
};
use pasa_store::StoreConfig;
use pasa_testing::yaml_docs;
use serde_json::json;

fn host_rule(host: &str) -> Rule {
    Rule {
        hosts: vec![host.into()],
        ..Default::default()
    }
}

const REVIEWS: &str = "reviews.default.svc.cluster.local";
const RATINGS: &str = "ratings.default.svc.cluster.local";

fn bookinfo(dir: &std::path::Path) -> Vec<serde_json::Value> {
    let net = dir.join("samples/bookinfo/networking");
    let mut docs = yaml_docs(&net.join("bookinfo-gateway.yaml"));
    docs.extend(yaml_docs(&net.join("destination-rule-all.yaml")));
    docs.extend(yaml_docs(&net.join("virtual-service-all-v1.yaml")));
    docs.extend(services_as_service_endpoints(&yaml_docs(
        &dir.join("samples/bookinfo/platform/bookinfo.yaml"),
    )));
    docs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookinfo_watches_see_exactly_their_slice() {
    let Some(corpus) = conformance_dir() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path(), StoreConfig::default()).await;
    let mut client = server.client().await;

    let mut by_host = Watch::open(&mut client, vec![host_rule(REVIEWS)], 0).await;
    let mut by_ns = Watch::open(
        &mut client,
        vec![Rule {
            kinds: vec!["DestinationRule".into()],
            namespaces: vec!["default".into()],
            ..Default::default()
        }],
        0,
    )
    .await;
    let mut by_gateway = Watch::open(
        &mut client,
        vec![Rule {
            gateways: vec!["default/bookinfo-gateway".into()],
            ..Default::default()
        }],
        0,
    )
    .await;
    for w in [&mut by_host, &mut by_ns, &mut by_gateway] {
        let (events, _) = w.until_synced().await;
        assert!(events.is_empty());
    }

    let r = apply_ok(&mut client, bookinfo(&corpus)).await;
    assert_eq!(r.results.len(), 14, "{:?}", r.results);
    fence(&mut client, "f1").await;
    // The bookinfo Gateway and its VirtualService are for host `*`, which covers reviews, as it
    // does in Istio.
    assert_eq!(
        summary(&by_host.until_fence("f1").await),
        set(&[
            "ADDED DestinationRule/default/reviews",
            "ADDED Gateway/default/bookinfo-gateway",
            "ADDED ServiceEndpoints/default/reviews",
            "ADDED VirtualService/default/bookinfo",
            "ADDED VirtualService/default/reviews",
        ])
    );
    assert_eq!(
        summary(&by_ns.until_fence("f1").await),
        set(&[
            "ADDED DestinationRule/default/details",
            "ADDED DestinationRule/default/productpage",
            "ADDED DestinationRule/default/ratings",
            "ADDED DestinationRule/default/reviews",
        ])
    );
    assert_eq!(
        summary(&by_gateway.until_fence("f1").await),
        set(&[
            "ADDED Gateway/default/bookinfo-gateway",
            "ADDED VirtualService/default/bookinfo",
        ])
    );

    // A change to the reviews route reaches only the host watcher; re-applying the same thing
    // changes nothing and reaches nobody.
    let split =
        yaml_docs(&corpus.join("samples/bookinfo/networking/virtual-service-reviews-80-20.yaml"));
    apply_ok(&mut client, split.clone()).await;
    let again = apply_ok(&mut client, split).await;
    assert_eq!(again.results[0].outcome, 3, "unchanged");
    client
        .delete(DeleteRequest {
            refs: vec![ObjectRef {
                kind: "dr".into(),
                namespace: "default".into(),
                name: "reviews".into(),
            }],
            ..Default::default()
        })
        .await
        .unwrap();
    fence(&mut client, "f2").await;
    assert_eq!(
        summary(&by_host.until_fence("f2").await),
        set(&[
            "DELETED DestinationRule/default/reviews",
            "MODIFIED VirtualService/default/reviews"
        ])
    );
    assert_eq!(
        summary(&by_ns.until_fence("f2").await),
        set(&["DELETED DestinationRule/default/reviews"])
    );
    assert!(by_gateway.until_fence("f2").await.is_empty());

    // A late watcher gets the same slice as a snapshot.
    let mut late = Watch::open(&mut client, vec![host_rule(REVIEWS)], 0).await;
    let (snapshot, revision) = late.until_synced().await;
    assert_eq!(
        summary(&snapshot),
        set(&[
            "ADDED Gateway/default/bookinfo-gateway",
            "ADDED ServiceEndpoints/default/reviews",
            "ADDED VirtualService/default/bookinfo",
            "ADDED VirtualService/default/reviews",
        ])
    );
    assert_eq!(revision, server.store.revision());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscription_change_mid_stream() {
    let Some(corpus) = conformance_dir() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path(), StoreConfig::default()).await;
    let mut client = server.client().await;
    apply_ok(&mut client, bookinfo(&corpus)).await;

    let mut w = Watch::open(&mut client, vec![host_rule(REVIEWS)], 0).await;
    let (snapshot, _) = w.until_synced().await;
    assert_eq!(
        snapshot.len(),
        5,
        "reviews' three objects and the `*` gateway and its route"
    );
    // Move from reviews to ratings: reviews objects leave, ratings objects arrive, what both
    // match (the `*` gateway and route) stays without a word.
    // The answer ends with SYNCED (no fence needed to know it is complete).
    w.update(vec![host_rule(RATINGS)]).await;
    assert_eq!(
        summary(&w.until_synced().await.0),
        set(&[
            "ADDED DestinationRule/default/ratings",
            "ADDED ServiceEndpoints/default/ratings",
            "ADDED VirtualService/default/ratings",
            "DELETED DestinationRule/default/reviews",
            "DELETED ServiceEndpoints/default/reviews",
            "DELETED VirtualService/default/reviews",
        ])
    );
    // The old slice is no longer followed, the new one is.
    apply_ok(
        &mut client,
        yaml_docs(&corpus.join("samples/bookinfo/networking/virtual-service-reviews-v3.yaml")),
    )
    .await;
    apply_ok(
        &mut client,
        yaml_docs(
            &corpus.join("samples/bookinfo/networking/virtual-service-ratings-test-abort.yaml"),
        ),
    )
    .await;
    fence(&mut client, "f2").await;
    assert_eq!(
        summary(&w.until_fence("f2").await),
        set(&["MODIFIED VirtualService/default/ratings"])
    );
    // A wildcard subscription widens to every service of the namespace; no re-sends of what is
    // kept (ratings).
    w.update(vec![host_rule("*.default.svc.cluster.local")])
        .await;
    let widened = summary(&w.until_synced().await.0);
    assert!(
        widened.iter().all(|e| e.starts_with("ADDED ")),
        "{widened:?}"
    );
    assert!(
        !widened.iter().any(|e| e.contains("/ratings")),
        "{widened:?}"
    );
    assert!(
        !widened.iter().any(|e| e.contains("bookinfo")),
        "{widened:?}"
    );
    assert!(widened.contains("ADDED VirtualService/default/reviews"));
    // reviews, details, productpage: their VirtualService, DestinationRule, ServiceEndpoints.
    assert_eq!(widened.len(), 9, "{widened:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_after_restart_from_a_revision() {
    let dir = tempfile::tempdir().unwrap();
    let vs = |name: &str, host: &str| {
        json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
               "metadata": {"name": name, "namespace": "shop"},
               "spec": {"hosts": [host], "http": [{"route": [{"destination": {"host": host}}]}]}})
    };
    let server = TestServer::start(dir.path(), StoreConfig::default()).await;
    let mut client = server.client().await;
    apply_ok(&mut client, vec![vs("cart", "cart"), vs("pay", "pay")]).await;
    let rule = Rule {
        namespaces: vec!["shop".into()],
        ..Default::default()
    };
    let mut w = Watch::open(&mut client, vec![rule.clone()], 0).await;
    let (snapshot, seen) = w.until_synced().await;
    assert_eq!(snapshot.len(), 2);
    // A graceful stop tells the watcher where to resume.
    server.stop().await;
    match w.next().await.response {
        Some(watch_response::Response::Cancelled(c)) => {
            assert_eq!(c.reason, CancelReason::Shutdown as i32);
            assert_eq!(c.resume_revision, seen + 1);
        }
        other => panic!("expected a shutdown notice, got {other:?}"),
    }

    // While the watcher is away: changes after a restart.
    let server = TestServer::start(dir.path(), StoreConfig::default()).await;
    let mut client = server.client().await;
    assert_eq!(server.store.revision(), seen, "revision survives a restart");
    apply_ok(&mut client, vec![vs("cart", "cart-v2")]).await;
    apply_ok(&mut client, vec![vs("ship", "ship")]).await;
    client
        .delete(DeleteRequest {
            refs: vec![ObjectRef {
                kind: "vs".into(),
                namespace: "shop".into(),
                name: "pay".into(),
            }],
            ..Default::default()
        })
        .await
        .unwrap();
    apply_ok(
        &mut client,
        vec![
            json!({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
        "metadata": {"name": "elsewhere", "namespace": "other"}}),
        ],
    )
    .await;

    let mut resumed = Watch::open(&mut client, vec![rule], seen + 1).await;
    let (replayed, head) = resumed.until_synced().await;
    let got: Vec<(String, u64)> = replayed
        .iter()
        .map(|e| {
            let t = pasa_proto::store::v1::EventType::try_from(e.r#type).unwrap();
            (
                format!("{} {}", t.as_str_name(), e.resource.as_ref().unwrap().name),
                e.revision,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("EVENT_TYPE_MODIFIED cart".to_string(), seen + 1),
            ("EVENT_TYPE_ADDED ship".to_string(), seen + 2),
            ("EVENT_TYPE_DELETED pay".to_string(), seen + 3),
        ]
    );
    assert_eq!(head, seen + 4);
    // And it is live again.
    apply_ok(&mut client, vec![vs("pay", "pay")]).await;
    fence(&mut client, "f1").await;
    assert_eq!(
        summary(&resumed.until_fence("f1").await),
        set(&["ADDED VirtualService/shop/pay"])
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compacted_revision_means_relist() {
    let dir = tempfile::tempdir().unwrap();
    let config = StoreConfig {
        log_retention: 10,
        ..StoreConfig::default()
    };
    let server = TestServer::start(dir.path(), config).await;
    let mut client = server.client().await;
    let se = |i: u32| {
        json!({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
               "metadata": {"name": format!("ext-{}", i % 7), "namespace": "egress"},
               "spec": {"hosts": [format!("api{i}.example.com")], "resolution": "DNS"}})
    };
    for i in 0..60 {
        apply_ok(&mut client, vec![se(i)]).await;
    }
    let status = client
        .status(pasa_proto::store::v1::StatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.revision, 60);
    assert!(
        status.compact_revision >= 40 && status.compact_revision <= 50,
        "{status:?}"
    );

    // Watching from a compacted revision is refused with the compact revision.
    let mut w = Watch::open_raw(
        &mut client,
        Subscription {
            rules: vec![Rule::default()],
        },
        3,
    )
    .await;
    match w.next().await.response {
        Some(watch_response::Response::Cancelled(c)) => {
            assert_eq!(c.reason, CancelReason::Compacted as i32);
            // Compaction runs after the writer answers, so it may have moved on since.
            assert!((40..=50).contains(&c.compact_revision), "{c:?}");
        }
        other => panic!("expected COMPACTED, got {other:?}"),
    }
    // Listing at a compacted revision is refused too.
    let err = client
        .list(ListRequest {
            selector: None,
            revision: 5,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::OutOfRange, "{err}");
    assert!(err.message().contains("compacted"), "{err}");

    // Relist, then watch from the list's revision + 1: nothing missed, nothing twice.
    let list = client
        .list(ListRequest {
            selector: None,
            revision: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.resources.len(), 7);
    assert_eq!(list.revision, 60);
    let mut w = Watch::open(&mut client, vec![Rule::default()], list.revision + 1).await;
    let (replayed, head) = w.until_synced().await;
    assert!(replayed.is_empty());
    assert_eq!(head, 60);
    apply_ok(&mut client, vec![se(60)]).await;
    let next = w.next().await;
    match next.response {
        Some(watch_response::Response::Events(b)) => {
            assert_eq!(b.events.len(), 1);
            assert_eq!(b.events[0].revision, 61);
        }
        other => panic!("expected the next event, got {other:?}"),
    }

    // A list at a retained past revision shows the state as it was then.
    let then = client
        .list(ListRequest {
            selector: Some(Subscription {
                rules: vec![Rule {
                    hosts: vec!["api50.example.com".into()],
                    ..Default::default()
                }],
            }),
            revision: 51,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(then.revision, 51);
    assert_eq!(then.resources.len(), 1, "{:?}", then.resources);
    assert_eq!(then.resources[0].name, "ext-1");
    assert_eq!(then.resources[0].mod_revision, 51);
    let now = client
        .list(ListRequest {
            selector: Some(Subscription {
                rules: vec![Rule {
                    hosts: vec!["api50.example.com".into()],
                    ..Default::default()
                }],
            }),
            revision: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(now.resources.is_empty(), "ext-1 has moved on to api57");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_watchers_get_progress_and_metrics_show_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let config = StoreConfig {
        progress_interval: std::time::Duration::from_millis(100),
        ..StoreConfig::default()
    };
    let server = TestServer::start(dir.path(), config).await;
    let mut client = server.client().await;
    apply_ok(
        &mut client,
        vec![
            json!({"apiVersion": "networking.istio.io/v1", "kind": "Gateway",
            "metadata": {"name": "ingress", "namespace": "istio-system"},
            "spec": {"servers": [{"hosts": ["*.example.com"]}]}}),
        ],
    )
    .await;
    let mut w = Watch::open(
        &mut client,
        vec![Rule {
            namespaces: vec!["nothing-here".into()],
            ..Default::default()
        }],
        0,
    )
    .await;
    let (_, synced) = w.until_synced().await;
    apply_ok(
        &mut client,
        vec![
            json!({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
            "metadata": {"name": "default", "namespace": "elsewhere"}}),
        ],
    )
    .await;
    // Nothing matches, but progress tells the watcher it is current past the new revision.
    loop {
        match w.next().await.response {
            Some(watch_response::Response::Progress(p)) if p.revision == synced + 1 => break,
            Some(watch_response::Response::Progress(_)) => {}
            other => panic!("expected only progress, got {other:?}"),
        }
    }

    let metrics = common::http_get(server.admin, "/metrics").await;
    for line in [
        "pasa_store_revision 2",
        "pasa_store_objects{kind=\"Gateway\"} 1",
        "pasa_store_objects{kind=\"Sidecar\"} 1",
        "pasa_store_subscriptions 1",
        "pasa_store_written_resources_total 2",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} missing in:\n{metrics}"
        );
    }
    assert!(metrics.contains("pasa_store_write_duration_seconds_count{op=\"Apply\"} 2"));
    assert!(metrics.contains("pasa_store_match_duration_seconds_count 2"));
    let ready = common::http_get(server.admin, "/readyz").await;
    assert!(
        ready.starts_with("HTTP/1.1 200") && ready.ends_with("\r\n\r\nready\nserving: yes\n"),
        "{ready}"
    );
    assert!(
        common::http_get(server.admin, "/healthz")
            .await
            .ends_with("ok\n")
    );
    server.stop().await;
}

/// The standalone `pasa-store` admits what PCP admits: written to directly, a VirtualService
/// with a negative weight and a DestinationRule with an unknown load balancer are refused with
/// their fields named, and nothing is stored; a batch PCP relays (marked admitted, with its own
/// rules for what it generates) is not checked again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_server_refuses_what_pcp_would_refuse() {
    let dir = tempfile::tempdir().unwrap();
    let (_child, addr) =
        start_process([std::ffi::OsStr::new("--data-dir"), dir.path().as_os_str()]).await;
    let mut client =
        pasa_proto::store::v1::store_client::StoreClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
    let vs = json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": "reviews", "namespace": "default"},
        "spec": {"hosts": ["reviews"], "http": [{"route": [
            {"destination": {"host": "reviews", "subset": "v1"}, "weight": -10},
            {"destination": {"host": "reviews", "subset": "v2"}, "weight": 110}]}]}});
    let dr = json!({"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
        "metadata": {"name": "reviews", "namespace": "default"},
        "spec": {"host": "reviews", "trafficPolicy": {"loadBalancer": {"simple": "FASTEST"}}}});
    let refused = apply(&mut client, vec![vs, dr]).await;
    let named: Vec<(u32, &str)> = refused
        .errors
        .iter()
        .map(|e| (e.index, e.field.as_str()))
        .collect();
    assert!(
        named.contains(&(0, "spec.http[0].route[0].weight")),
        "{:?}",
        refused.errors
    );
    assert!(
        named.contains(&(1, "spec.trafficPolicy.loadBalancer.simple")),
        "{:?}",
        refused.errors
    );
    let stored = client
        .list(ListRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(stored.resources.is_empty(), "{:?}", stored.resources);
    assert_eq!(stored.revision, 0, "nothing was written");

    // What PCP's syncer generates from the Gateway API (istiod's names and annotations) is not
    // a user's to write, and PCP relays it admitted.
    let generated = json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": "shop~edge~istio-autogenerated-k8s-gateway~http~a.example.com",
                     "namespace": "shop",
                     "annotations": {"internal.istio.io/parents": "HTTPRoute/web.shop",
                                     "internal.istio.io/route-semantics": "gateway"}},
        "spec": {"hosts": ["a.example.com"],
                 "gateways": ["shop/edge~istio-autogenerated-k8s-gateway~http"],
                 "http": [{"route": [{"destination": {}}]}]}});
    let batch = || pasa_proto::store::v1::ApplyRequest {
        documents: vec![doc(&generated)],
        dry_run: false,
    };
    let by_a_user = client.apply(batch()).await.unwrap().into_inner();
    assert!(
        by_a_user.errors.iter().any(|e| e.field == "metadata.name"),
        "{:?}",
        by_a_user.errors
    );
    let relayed = client
        .apply(pasa_store::service::admitted(batch()))
        .await
        .unwrap()
        .into_inner();
    assert!(relayed.errors.is_empty(), "{:?}", relayed.errors);
}
