//! The ADS server over a real Unix socket, driven by the fake in-process clients of `common`.

mod common;

use common::*;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
use pasa_agent::ads::{Protocol, ServeError, SyncState, bind_unix};
use pasa_agent::model::proxy::Generator;

/// Two clusters with endpoints, one listener, one route config.
fn base() -> pasa_agent::ads::Snapshot {
    snapshot(&[
        (CDS, "c1", "1"),
        (CDS, "c2", "1"),
        (EDS, "c1", "1"),
        (EDS, "c2", "1"),
        (LDS, "l1", "1"),
        (RDS, "r1", "1"),
    ])
}

/// A SotW client that subscribed to everything in `base()` and ACKed it.
async fn synced_sotw(h: &Harness) -> FakeSotwClient {
    let mut c = h.sotw().await;
    for (kind, names) in [
        (CDS, &[][..]),
        (EDS, &["c1", "c2"][..]),
        (LDS, &[][..]),
        (RDS, &["r1"][..]),
    ] {
        c.request(kind, names, "", "").await;
        let r = c.recv().await;
        assert_eq!(kind_of(&r.type_url), kind);
        c.ack(&r, names).await;
    }
    c
}

#[tokio::test]
async fn sotw_initial_push_answers_each_type() {
    let h = Harness::start(base());
    let mut c = h.sotw().await;
    c.request(CDS, &[], "", "").await;
    let r = c.recv().await;
    assert_eq!(kind_of(&r.type_url), CDS);
    assert_eq!(names(&r), ["c1", "c2"]);
    assert!(!r.version_info.is_empty() && !r.nonce.is_empty());
    c.ack(&r, &[]).await;

    c.request(EDS, &["c2"], "", "").await;
    let r = c.recv().await;
    assert_eq!(kind_of(&r.type_url), EDS);
    assert_eq!(names(&r), ["c2"]);
    c.ack(&r, &["c2"]).await;

    let status = h
        .status
        .wait_for(|all| all.len() == 1 && all[0].state(EDS) == SyncState::Synced)
        .await;
    assert_eq!(status[0].protocol, Protocol::Sotw);
    assert_eq!(status[0].state(CDS), SyncState::Synced);
    assert_eq!(status[0].state(LDS), SyncState::NotSent);
    assert!(status[0].node_id.starts_with("sidecar~"));
    h.stop().await;
}

#[tokio::test]
async fn sotw_snapshot_change_pushes_cds_eds_lds_rds_in_order() {
    let h = Harness::start(pasa_agent::ads::Snapshot::new());
    let mut c = h.sotw().await;
    // Subscribe in the "wrong" order; the server must still push in dependency order.
    for (kind, names) in [
        (RDS, &["r1"][..]),
        (LDS, &[][..]),
        (EDS, &["c1", "c2"][..]),
        (CDS, &[][..]),
    ] {
        c.request(kind, names, "", "").await;
        let r = c.recv().await;
        assert!(r.resources.is_empty());
        c.ack(&r, names).await;
    }
    h.publish(base());
    let mut order = Vec::new();
    for _ in 0..4 {
        let r = c.recv().await;
        order.push(kind_of(&r.type_url));
    }
    assert_eq!(order, [CDS, EDS, LDS, RDS]);
    h.stop().await;
}

#[tokio::test]
async fn sotw_ack_then_change_pushes_only_the_changed_type() {
    let h = Harness::start(base());
    let mut c = synced_sotw(&h).await;

    let mut next = base();
    next.insert(EDS, "c2", "2", endpoints("c2")).unwrap();
    h.publish(next.clone());
    let r = c.recv().await;
    assert_eq!(kind_of(&r.type_url), EDS);
    assert_eq!(
        names(&r),
        ["c1", "c2"],
        "SotW sends the whole subscribed set"
    );
    c.ack(&r, &["c1", "c2"]).await;

    // Publishing an equal snapshot pushes nothing; the next push is the next real change (LDS).
    h.publish(next.clone());
    next.insert(LDS, "l2", "1", listener("l2")).unwrap();
    h.publish(next);
    let r = c.recv().await;
    assert_eq!(kind_of(&r.type_url), LDS);
    assert_eq!(names(&r), ["l1", "l2"]);
    h.stop().await;
}

#[tokio::test]
async fn sotw_removals_wait_until_references_are_replaced() {
    let h = Harness::start(base());
    let mut c = synced_sotw(&h).await;

    // c1 goes away (its route is replaced), r1 is replaced by r2 on the listener.
    let next = snapshot(&[
        (CDS, "c2", "1"),
        (CDS, "c3", "1"),
        (EDS, "c2", "1"),
        (LDS, "l1", "2"),
        (RDS, "r1", "1"),
        (RDS, "r2", "1"),
    ]);
    h.publish(next);
    let mut pushes = Vec::new();
    for _ in 0..4 {
        let r = c.recv().await;
        pushes.push((kind_of(&r.type_url), names(&r)));
    }
    assert_eq!(
        pushes,
        [
            // Additions first; the cluster about to go is still there.
            (CDS, vec!["c1".into(), "c2".into(), "c3".into()]),
            (LDS, vec!["l1".to_string()]),
            // Then removals, referenced types after what references them.
            (CDS, vec!["c2".into(), "c3".into()]),
            (EDS, vec!["c2".to_string()]),
        ]
    );
    h.stop().await;
}

#[tokio::test]
async fn sotw_nack_keeps_last_good_is_stale_and_not_pushed_again() {
    let h = Harness::start(base());
    let mut c = synced_sotw(&h).await;
    let good = h.status.connections()[0].types[&CDS].acked_version.clone();
    let good = good.expect("CDS was ACKed");

    let mut bad = base();
    bad.insert(CDS, "c2", "bad", cluster("c2")).unwrap();
    h.publish(bad.clone());
    let r = c.recv().await;
    assert_eq!(kind_of(&r.type_url), CDS);
    c.nack(&r, &good, &[]).await;

    let status = h
        .status
        .wait_for(|all| {
            all[0]
                .types
                .get(&CDS)
                .is_some_and(|t| t.last_nack.is_some())
        })
        .await;
    let cds = &status[0].types[&CDS];
    assert_eq!(cds.state(), SyncState::Stale);
    assert_eq!(cds.acked_version.as_deref(), Some(good.as_str()));
    let nack = cds.last_nack.as_ref().unwrap();
    assert_eq!(nack.version, r.version_info);
    assert!(nack.error.contains("fake client rejects"));

    // Another change elsewhere: only that type goes out, the rejected CDS is not pushed again.
    bad.insert(EDS, "c1", "2", endpoints("c1")).unwrap();
    h.publish(bad.clone());
    let r = c.recv().await;
    assert_eq!(kind_of(&r.type_url), EDS);
    c.ack(&r, &["c1", "c2"]).await;

    // A new CDS version after the NACK is pushed, and its ACK clears the staleness.
    bad.insert(CDS, "c2", "fixed", cluster("c2")).unwrap();
    h.publish(bad);
    let r = c.recv().await;
    assert_eq!(kind_of(&r.type_url), CDS);
    assert_ne!(r.version_info, nack.version);
    c.ack(&r, &[]).await;
    let status = h
        .status
        .wait_for(|all| all[0].state(CDS) == SyncState::Synced)
        .await;
    assert_eq!(status[0].types[&CDS].last_nack, None);
    h.stop().await;
}

#[tokio::test]
async fn sotw_names_change_on_the_last_nonce_is_answered() {
    let h = Harness::start(base());
    let mut c = h.sotw().await;
    c.request(EDS, &["c1"], "", "").await;
    let r = c.recv().await;
    assert_eq!(names(&r), ["c1"]);
    // Same nonce, more names: an ACK that also changes the subscription.
    c.ack(&r, &["c1", "c2"]).await;
    let r2 = c.recv().await;
    assert_eq!(kind_of(&r2.type_url), EDS);
    assert_eq!(names(&r2), ["c1", "c2"]);
    // And fewer names on the newest nonce.
    c.ack(&r2, &["c2"]).await;
    let r3 = c.recv().await;
    assert_eq!(names(&r3), ["c2"]);
    h.stop().await;
}

#[tokio::test]
async fn sotw_reconnect_with_known_versions_gets_only_what_it_lacks() {
    let h = Harness::start(base());
    let mut first = h.sotw().await;
    first.request(CDS, &[], "", "").await;
    let cds = first.recv().await;
    first.ack(&cds, &[]).await;
    first.request(LDS, &[], "", "").await;
    let lds = first.recv().await;
    first.ack(&lds, &[]).await;
    drop(first);
    h.status.wait_for(|all| all.is_empty()).await;

    let mut next = base();
    next.insert(LDS, "l1", "2", listener("l1")).unwrap();
    h.publish(next);

    let mut again = h.sotw().await;
    again.request(CDS, &[], &cds.version_info, "").await;
    again.request(LDS, &[], &lds.version_info, "").await;
    // CDS is current on the client: the first (and only) response is LDS.
    let r = again.recv().await;
    assert_eq!(kind_of(&r.type_url), LDS);
    assert_ne!(r.version_info, lds.version_info);
    let status = h.status.connections();
    assert_eq!(status[0].state(CDS), SyncState::Synced);
    h.stop().await;
}

/// VHDS is delta only (Envoy refuses it otherwise): a state-of-the-world stream asking for it
/// is ended, saying so.
#[tokio::test]
async fn sotw_vhds_is_refused() {
    let h = Harness::start(base());
    let mut c = h.sotw().await;
    c.request_url(pasa_agent::resource::TypeKind::VirtualHost.type_url())
        .await;
    let err = c.recv_error().await;
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("delta ADS only"),
        "{}",
        err.message()
    );
    h.stop().await;
}

#[tokio::test]
async fn sotw_unknown_type_is_refused() {
    let h = Harness::start(base());
    let mut c = h.sotw().await;
    c.request_url("type.googleapis.com/envoy.service.runtime.v3.Runtime")
        .await;
    let err = c.recv_error().await;
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("runtime.v3.Runtime"),
        "{}",
        err.message()
    );
    h.stop().await;
}

#[tokio::test]
async fn delta_subscribe_changes_and_removals() {
    let h = Harness::start(base());
    let mut c = h.delta().await;
    c.subscribe(CDS, &[], &[]).await; // legacy wildcard
    let r = c.recv().await;
    assert_eq!(kind_of(&r.type_url), CDS);
    assert_eq!(
        delta_names(&r),
        [("c1".into(), "1".into()), ("c2".into(), "1".into())]
    );
    c.ack(&r).await;
    c.subscribe(EDS, &["c1"], &[]).await;
    let r = c.recv().await;
    assert_eq!(delta_names(&r), [("c1".into(), "1".into())]);
    c.ack(&r).await;

    // c2 changes, c1 goes away (cluster and endpoints), c3 is new.
    let next = snapshot(&[(CDS, "c2", "2"), (CDS, "c3", "1"), (EDS, "c2", "1")]);
    h.publish(next);
    let r = c.recv().await;
    assert_eq!(kind_of(&r.type_url), CDS);
    assert_eq!(
        delta_names(&r),
        [("c2".into(), "2".into()), ("c3".into(), "1".into())]
    );
    assert!(
        r.removed_resources.is_empty(),
        "removals come after updates"
    );
    c.ack(&r).await;
    let r = c.recv().await;
    assert_eq!(kind_of(&r.type_url), CDS);
    assert!(r.resources.is_empty());
    assert_eq!(r.removed_resources, ["c1"]);
    let r = c.recv().await;
    assert_eq!(kind_of(&r.type_url), EDS);
    assert_eq!(r.removed_resources, ["c1"]);

    // Named subscription changes are answered with just the difference.
    c.subscribe(EDS, &["c2"], &["c1"]).await;
    let r = c.recv().await;
    assert_eq!(delta_names(&r), [("c2".into(), "1".into())]);
    assert!(r.removed_resources.is_empty());
    let status = h.status.connections();
    assert_eq!(status[0].protocol, Protocol::Delta);
    h.stop().await;
}

#[tokio::test]
async fn delta_reconnect_with_initial_resource_versions() {
    let h = Harness::start(base());
    let mut c = h.delta().await;
    c.send(
        envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest {
            type_url: CDS.type_url().into(),
            resource_names_subscribe: vec!["*".into()],
            initial_resource_versions: [
                ("c1".to_string(), "1".to_string()),   // current
                ("c2".to_string(), "0".to_string()),   // outdated
                ("gone".to_string(), "1".to_string()), // deleted meanwhile
            ]
            .into_iter()
            .collect(),
            ..Default::default()
        },
    )
    .await;
    let r = c.recv().await;
    assert_eq!(delta_names(&r), [("c2".into(), "1".into())]);
    assert_eq!(r.removed_resources, ["gone"]);
    h.stop().await;
}

#[tokio::test]
async fn delta_nack_is_recorded_and_not_pushed_again() {
    let h = Harness::start(base());
    let mut c = h.delta().await;
    c.subscribe(LDS, &["*"], &[]).await;
    let r = c.recv().await;
    c.ack(&r).await;
    let mut next = base();
    next.insert(LDS, "l1", "bad", listener("l1")).unwrap();
    h.publish(next.clone());
    let r = c.recv().await;
    c.send(
        envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest {
            type_url: r.type_url.clone(),
            response_nonce: r.nonce.clone(),
            error_detail: Some(envoy_types::pb::google::rpc::Status {
                code: 3,
                message: "fake client rejects l1".into(),
                details: Vec::new(),
            }),
            ..Default::default()
        },
    )
    .await;
    let status = h
        .status
        .wait_for(|all| {
            all[0]
                .types
                .get(&LDS)
                .is_some_and(|t| t.last_nack.is_some())
        })
        .await;
    assert_eq!(status[0].state(LDS), SyncState::Stale);
    // Unrelated change: nothing for LDS; then a fixed listener is pushed.
    next.insert(LDS, "l2", "1", listener("l2")).unwrap();
    h.publish(next);
    let r = c.recv().await;
    assert_eq!(delta_names(&r), [("l2".into(), "1".into())]);
    h.stop().await;
}

#[tokio::test]
async fn delta_unknown_type_is_refused() {
    let h = Harness::start(base());
    let mut c = h.delta().await;
    c.send(
        envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest {
            type_url: "type.googleapis.com/envoy.service.runtime.v3.Runtime".into(),
            ..Default::default()
        },
    )
    .await;
    let err = c.recv_error().await;
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("Runtime"));
    h.stop().await;
}

#[tokio::test]
async fn two_connections_at_once_both_get_pushes() {
    let h = Harness::start(base());
    let mut sotw = synced_sotw(&h).await;
    let mut delta = h.delta().await;
    delta.subscribe(CDS, &["*"], &[]).await;
    let r = delta.recv().await;
    delta.ack(&r).await;
    h.status.wait_for(|all| all.len() == 2).await;

    let mut next = base();
    next.insert(CDS, "c1", "2", cluster("c1")).unwrap();
    h.publish(next);
    let s = sotw.recv().await;
    assert_eq!(kind_of(&s.type_url), CDS);
    let d = delta.recv().await;
    assert_eq!(delta_names(&d), [("c1".into(), "2".into())]);
    h.stop().await;
}

#[tokio::test]
async fn shutdown_ends_streams_and_removes_the_socket() {
    let h = Harness::start(base());
    let mut c = synced_sotw(&h).await;
    let path = h.path.clone();
    h.stop().await;
    // The stream ends (cleanly or with an error), it does not hang.
    let _ = c.closed().await;
    assert!(!path.exists());
}

#[tokio::test]
async fn bind_replaces_a_stale_socket_but_not_other_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("xds.sock");
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists(), "a stale socket file is left behind");
    drop(bind_unix(&path).unwrap());

    let file = dir.path().join("not-a-socket");
    std::fs::write(&file, b"keep me").unwrap();
    assert!(matches!(
        bind_unix(&file),
        Err(ServeError::NotASocket { .. })
    ));
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
}

/// A socket someone answers on is not taken over; and a socket file is removed only by the
/// one who made it, not after another process replaced it.
#[tokio::test]
async fn bind_refuses_a_served_socket_and_removes_only_its_own_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("xds.sock");
    let first = bind_unix(&path).unwrap();
    let err = bind_unix(&path).unwrap_err();
    assert!(matches!(err, ServeError::InUse { .. }), "{err}");
    assert!(
        err.to_string().contains(&format!(
            "{} is in use: another agent serves it",
            path.display()
        )),
        "{err}"
    );
    // The first one still takes connections on its file.
    let connecting = tokio::net::UnixStream::connect(&path);
    let (accepted, connected) = tokio::join!(first.listener.accept(), connecting);
    accepted.unwrap();
    connected.unwrap();

    // Another process replaced the file (as an older agent would have): the first one's end
    // leaves the other's socket in place.
    std::fs::remove_file(&path).unwrap();
    let other = std::os::unix::net::UnixListener::bind(&path).unwrap();
    drop(first);
    assert!(path.exists(), "another process's socket is left alone");
    drop(other);
}

#[tokio::test]
async fn each_client_gets_the_snapshot_of_its_generator() {
    let h = Harness::start(base());
    // A gRPC client waits until the agent has translated for gRPC: nothing is answered before.
    let mut grpc = h.sotw_as(grpc_node()).await;
    grpc.request(LDS, &["hello.default.svc.cluster.local:7070"], "", "")
        .await;
    let mut wanted = h.publisher.wanted();
    tokio::time::timeout(GUARD, wanted.wait_for(|w| w.contains(&Generator::Grpc)))
        .await
        .expect("the gRPC generator becomes wanted")
        .unwrap();
    h.publisher.publish(
        Generator::Grpc,
        snapshot(&[(LDS, "hello.default.svc.cluster.local:7070", "1")]),
    );
    let r = grpc.recv().await;
    assert_eq!(names(&r), ["hello.default.svc.cluster.local:7070"]);
    grpc.ack(&r, &["hello.default.svc.cluster.local:7070"])
        .await;

    let mut envoy = h.sotw().await;
    envoy.request(LDS, &[], "", "").await;
    let r = envoy.recv().await;
    assert_eq!(names(&r), ["l1"]);
    envoy.ack(&r, &[]).await;

    let status = h
        .status
        .wait_for(|all| all.len() == 2 && all.iter().all(|c| c.state(LDS) == SyncState::Synced))
        .await;
    let generators: Vec<_> = status.iter().map(|c| c.generator).collect();
    assert_eq!(generators, [Some(Generator::Grpc), Some(Generator::Envoy)]);

    // A new Envoy snapshot reaches only the Envoy client.
    let mut next = base();
    next.insert(LDS, "l2", "1", listener("l2")).unwrap();
    h.publish(next);
    let r = envoy.recv().await;
    assert_eq!(names(&r), ["l1", "l2"]);
    h.publisher.publish(
        Generator::Grpc,
        snapshot(&[(LDS, "hello.default.svc.cluster.local:7070", "2")]),
    );
    let r = grpc.recv().await;
    assert_eq!(names(&r), ["hello.default.svc.cluster.local:7070"]);
    h.stop().await;
}

#[tokio::test]
async fn a_pushed_change_is_timed_until_its_ack_and_nacks_are_counted() {
    let h = Harness::start(base());
    let mut c = synced_sotw(&h).await;
    let mut next = base();
    next.insert(CDS, "c1", "2", cluster("c1")).unwrap();
    h.publish(next.clone().with_origin(pasa_agent::ads::Origin::now(None)));
    let r = c.recv().await;
    c.ack(&r, &[]).await;
    // c1 changed: Envoy rebuilds the cluster and it warms until its endpoints come again.
    let eds = c.recv().await;
    assert_eq!(kind_of(&eds.type_url), EDS);
    assert_eq!(names(&eds), ["c1", "c2"]);
    c.ack(&eds, &["c1", "c2"]).await;
    h.status
        .wait_for(|all| all[0].types[&CDS].acked_version.as_deref() == Some(&r.version_info))
        .await;
    next.insert(CDS, "c2", "2", cluster("c2")).unwrap();
    h.publish(next.with_origin(pasa_agent::ads::Origin::now(None)));
    let r = c.recv().await;
    c.nack(&r, "", &[]).await;
    h.status
        .wait_for(|all| all[0].types[&CDS].last_nack.is_some())
        .await;

    let mut registry = prometheus_client::registry::Registry::default();
    h.metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("pasa_agent_xds_push_to_ack_seconds_count{type=\"CDS\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("pasa_agent_xds_nacks_total{type=\"CDS\"} 1"),
        "{text}"
    );
    assert!(text.contains("pasa_agent_xds_connections 1"), "{text}");
    h.stop().await;
}

#[tokio::test]
async fn delta_a_changed_cluster_gets_its_unchanged_endpoints_again() {
    let h = Harness::start(base());
    let mut c = h.delta().await;
    c.subscribe(CDS, &[], &[]).await;
    let r = c.recv().await;
    c.ack(&r).await;
    c.subscribe(EDS, &["c1", "c2"], &[]).await;
    let r = c.recv().await;
    c.ack(&r).await;
    // c1's cluster changes, its endpoints do not: Envoy rebuilds c1 and waits for them.
    let mut next = base();
    next.insert(CDS, "c1", "2", cluster("c1")).unwrap();
    h.publish(next);
    let r = c.recv().await;
    assert_eq!(kind_of(&r.type_url), CDS);
    assert_eq!(delta_names(&r), [("c1".into(), "2".into())]);
    c.ack(&r).await;
    let r = c.recv().await;
    assert_eq!(kind_of(&r.type_url), EDS);
    assert_eq!(delta_names(&r), [("c1".into(), "1".into())]);
    h.stop().await;
}

#[tokio::test]
async fn sotw_unsubscribing_from_every_name_gets_no_response_and_is_in_sync() {
    let h = Harness::start(base());
    let mut c = synced_sotw(&h).await;
    // Envoy drops its last EDS watch (all clusters removed), on the nonce it last saw.
    c.request(EDS, &[], "", "").await;
    h.status
        .wait_for(|all| all[0].types[&EDS].acked_latest && all[0].types[&EDS].sent_nonce.is_none())
        .await;
    // Nothing was sent for it: the next response is the next snapshot's.
    let mut next = base();
    next.insert(LDS, "l2", "1", listener("l2")).unwrap();
    h.publish(next);
    let r = c.recv().await;
    assert_eq!(kind_of(&r.type_url), LDS);
    h.stop().await;
}

/// Ten clusters whose load assignments are about 100 KiB each: a push of their EDS is larger
/// than one part.
fn large() -> (pasa_agent::ads::Snapshot, Vec<String>) {
    let mut s = pasa_agent::ads::Snapshot::new();
    let names: Vec<String> = (0..10).map(|i| format!("c{i}")).collect();
    for name in &names {
        s.insert(CDS, name, "1", cluster(name)).unwrap();
        s.insert(EDS, name, "1", padded_endpoints(name, 100 * 1024, 'a'))
            .unwrap();
    }
    (s, names)
}

/// A load assignment of `cluster` carrying about `bytes` bytes (a long locality sub-zone).
fn padded_endpoints(
    cluster: &str,
    bytes: usize,
    fill: char,
) -> envoy_types::pb::google::protobuf::Any {
    use envoy_types::pb::envoy::config::core::v3::Locality;
    use envoy_types::pb::envoy::config::endpoint::v3::{
        ClusterLoadAssignment, LocalityLbEndpoints,
    };
    envoy_types::util::pack_any(ClusterLoadAssignment {
        cluster_name: cluster.into(),
        endpoints: vec![LocalityLbEndpoints {
            locality: Some(Locality {
                sub_zone: std::iter::repeat_n(fill, bytes).collect(),
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    })
}

/// Receives the EDS responses of one push in parts, until the union holds `names`.
async fn sotw_parts(c: &mut FakeSotwClient, all: &[String]) -> Vec<DiscoveryResponse> {
    let mut parts = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < all.len() {
        let r = c.recv().await;
        assert_eq!(kind_of(&r.type_url), EDS);
        let bytes: usize = r.resources.iter().map(|a| a.value.len()).sum();
        assert!(
            bytes <= pasa_agent::ads::PART_BYTES,
            "a part of {bytes} bytes"
        );
        for name in names(&r) {
            assert!(seen.insert(name.clone()), "{name} twice in one push");
        }
        parts.push(r);
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), all);
    parts
}

#[tokio::test]
async fn sotw_a_large_push_goes_in_parts_answered_by_its_last() {
    let (s, all) = large();
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    let h = Harness::start(s.clone());
    let mut c = h.sotw().await;
    c.request(EDS, &refs, "", "").await;
    let parts = sotw_parts(&mut c, &all).await;
    assert_eq!(parts.len(), 5, "two resources of 100 KiB per part");
    let last = parts.last().unwrap();
    let versions: std::collections::BTreeSet<&str> =
        parts.iter().map(|p| p.version_info.as_str()).collect();
    assert_eq!(
        versions.len(),
        5,
        "only the last part carries the push's version"
    );
    // Earlier parts answered: not in sync until the last is.
    for part in &parts[..4] {
        c.ack(part, &refs).await;
    }
    c.ack(last, &refs).await;
    let status = h
        .status
        .wait_for(|all| all[0].state(EDS) == SyncState::Synced)
        .await;
    assert_eq!(
        status[0].types[&EDS].acked_version.as_deref(),
        Some(last.version_info.as_str())
    );

    // A change: the whole set again, in parts; a NACK of the second part is the push's NACK,
    // though the last part is ACKed.
    let mut next = s.clone();
    next.insert(EDS, "c3", "2", padded_endpoints("c3", 100 * 1024, 'b'))
        .unwrap();
    h.publish(next.clone());
    let parts = sotw_parts(&mut c, &all).await;
    c.ack(&parts[0], &refs).await;
    c.nack(&parts[1], &last.version_info, &refs).await;
    for part in &parts[2..] {
        c.ack(part, &refs).await;
    }
    let status = h
        .status
        .wait_for(|all| all[0].types[&EDS].last_nack.is_some())
        .await;
    let eds = &status[0].types[&EDS];
    assert_eq!(eds.state(), SyncState::Stale);
    assert_eq!(
        eds.acked_version.as_deref(),
        Some(last.version_info.as_str())
    );
    let nack = eds.last_nack.as_ref().unwrap();
    assert_eq!(nack.version, parts.last().unwrap().version_info);
    assert!(nack.error.contains("fake client rejects"), "{nack:?}");
    drop(c);
    h.status.wait_for(|all| all.is_empty()).await;

    // A client cut off after an earlier part declares that part's version: it gets the whole
    // set again. One that had the last part declares the push's version and gets nothing.
    let mut again = h.sotw().await;
    again.request(EDS, &refs, &parts[2].version_info, "").await;
    let resent = sotw_parts(&mut again, &all).await;
    assert_eq!(
        resent.last().unwrap().version_info,
        parts.last().unwrap().version_info
    );
    drop(again);
    h.status.wait_for(|all| all.is_empty()).await;
    let mut holder = h.sotw().await;
    holder
        .request(EDS, &refs, &parts.last().unwrap().version_info, "")
        .await;
    holder.request(LDS, &[], "", "").await;
    let r = holder.recv().await;
    assert_eq!(kind_of(&r.type_url), LDS, "EDS was current on the client");
    h.stop().await;
}

#[tokio::test]
async fn delta_a_large_push_goes_in_parts() {
    let (s, all) = large();
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    let h = Harness::start(s.clone());
    let mut c = h.delta().await;
    c.subscribe(EDS, &refs, &[]).await;
    let mut seen = Vec::new();
    while seen.len() < all.len() {
        let r = c.recv().await;
        let bytes: usize = r
            .resources
            .iter()
            .map(|w| w.resource.as_ref().map_or(0, |a| a.value.len()))
            .sum();
        assert!(
            bytes <= pasa_agent::ads::PART_BYTES,
            "a part of {bytes} bytes"
        );
        seen.extend(delta_names(&r).into_iter().map(|(name, _)| name));
        c.ack(&r).await;
    }
    seen.sort();
    assert_eq!(seen, all);

    // c0 goes, the nine others change: the updates in parts, then the removal (removals of
    // endpoints wait until the clusters are replaced).
    let mut next = pasa_agent::ads::Snapshot::new();
    for name in &all[1..] {
        next.insert(CDS, name, "1", cluster(name)).unwrap();
        next.insert(EDS, name, "2", padded_endpoints(name, 100 * 1024, 'b'))
            .unwrap();
    }
    h.publish(next);
    let mut updated = Vec::new();
    for _ in 0..5 {
        let r = c.recv().await;
        assert_eq!(kind_of(&r.type_url), EDS);
        assert!(
            r.removed_resources.is_empty(),
            "removals come after updates"
        );
        updated.extend(delta_names(&r));
    }
    updated.sort();
    let expected: Vec<(String, String)> =
        all[1..].iter().map(|n| (n.clone(), "2".into())).collect();
    assert_eq!(updated, expected);
    let r = c.recv().await;
    assert!(r.resources.is_empty());
    assert_eq!(r.removed_resources, ["c0"]);
    h.stop().await;
}

/// The learner's side of an on-demand agent's link: the names asked, and the names settled.
type Learner = (
    tokio::sync::mpsc::UnboundedReceiver<Vec<String>>,
    tokio::sync::watch::Sender<std::sync::Arc<std::collections::BTreeSet<String>>>,
);

/// An on-demand agent (`--scope on-demand`) and its learner's side.
fn on_demand_harness() -> (Harness, Learner) {
    let (asks, asked) = tokio::sync::mpsc::unbounded_channel();
    let (settle, settled) = tokio::sync::watch::channel(Default::default());
    let mut on_demand = base();
    let config = envoy_types::pb::envoy::config::route::v3::RouteConfiguration {
        name: "80".into(),
        vhds: Some(Default::default()),
        ..Default::default()
    };
    let r = pasa_agent::resource::Resource::pack(&config);
    on_demand
        .insert(RDS, "80", r.version.clone(), r.body.clone())
        .unwrap();
    let link = pasa_agent::ads::OnDemandLink { asks, settled };
    (Harness::start_on_demand(on_demand, link), (asked, settle))
}

/// Only Envoy over Delta takes the on-demand scope: a state-of-the-world client, or a
/// proxyless gRPC one, is refused, told why and what to do; secrets are served to all.
#[tokio::test]
async fn an_on_demand_agent_refuses_clients_that_cannot_take_it() {
    let (h, _learner) = on_demand_harness();
    h.publisher.publish(Generator::Grpc, base());
    for node in [node(), grpc_node()] {
        let mut c = h.sotw_as(node).await;
        c.request(CDS, &[], "", "").await;
        let err = c.recv_error().await;
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        assert!(
            err.message().contains("--scope on-demand") && err.message().contains("DELTA_GRPC"),
            "{}",
            err.message()
        );
    }
    let mut c = h.sotw().await;
    c.request(SDS, &["s1"], "", "").await;
    assert_eq!(kind_of(&c.recv().await.type_url), SDS);
    h.stop().await;
}

/// A host Envoy asks for goes to the learner, and is not answered until it is settled (Envoy
/// holds the request meanwhile); then, nothing having come to match it, without a body.
#[tokio::test]
async fn an_on_demand_agent_answers_a_host_once_it_is_learned() {
    let (h, (mut asked, settle)) = on_demand_harness();
    let mut c = h.delta().await;
    c.subscribe(pasa_agent::resource::TypeKind::VirtualHost, &[], &[])
        .await;
    let r = c.recv().await;
    assert_eq!(
        delta_names(&r).len(),
        1,
        "the sentinel of route configuration 80"
    );
    c.ack(&r).await;
    c.subscribe(
        pasa_agent::resource::TypeKind::VirtualHost,
        &["80/web"],
        &[],
    )
    .await;
    let names = tokio::time::timeout(GUARD, asked.recv())
        .await
        .expect("asked in time");
    assert_eq!(names, Some(vec!["80/web".to_string()]));
    // Answered once settled, not before (the only answer is to the settled name).
    settle.send_replace(std::sync::Arc::new(["80/web".to_string()].into()));
    let r = c.recv().await;
    assert_eq!(
        kind_of(&r.type_url),
        pasa_agent::resource::TypeKind::VirtualHost
    );
    assert_eq!(r.resources.len(), 1);
    assert_eq!(r.resources[0].name, "80/web");
    assert!(r.resources[0].resource.is_none(), "no such host: {r:?}");
    h.stop().await;
}
