//! Istio's traffic-simulation cases (the conformance corpus, `simulation/`) through the agent's
//! translator and simulator. The folder is walked at run time; every case file must parse and
//! every case's configuration convert into store resources, and each file must keep at least
//! [`MIN_PASSING`] passing checks. Per file it prints `<file>: N passed, M failed, K skipped`, and
//! one line per failing check (expected against got); `known_bug` cases are counted apart too.
//!
//! A check is one call, the inbound-cluster check of a case, or one route-table case.
//!
//! The corpus lives beside the project (`../shared/conformance`, or `PASA_CONFORMANCE_DIR` naming
//! the conformance folder); without it the test says SKIPPED and passes.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::corpus::{self, Case, check, istiod_like};
use pasa_agent::cache::Cache;
use pasa_agent::model::proxy::Generator;
use pasa_agent::resource::Resources;
use pasa_agent::simulate::simulate;
use pasa_agent::translate::Translator;

/// The passing checks each file must keep. Raise a floor when translation gets better; a file not
/// listed has floor 0.
const MIN_PASSING: &[(&str, usize)] = &[
    ("gateway-conflicts.yaml", 10),
    ("gateway-disable-port-translation.yaml", 4),
    ("gateway-http.yaml", 12),
    ("gateway-ingress.yaml", 8),
    ("gateway-services.yaml", 12),
    ("gateway-target-port.yaml", 3),
    ("serviceentry-addresses.yaml", 9),
    ("serviceentry-duplicated-hostname.yaml", 2),
    ("sidecar-externalname-services.yaml", 14),
    ("sidecar-headless-services.yaml", 7),
    ("sidecar-inbound-clusters.yaml", 14),
    ("sidecar-inbound-tls-modes.yaml", 15),
    ("sidecar-inbound.yaml", 69),
    ("sidecar-loop.yaml", 2),
    ("sidecar-passthrough.yaml", 210),
    ("sidecar-peer-authentication.yaml", 50),
    ("sidecar-routes-httproute.yaml", 18),
    ("sidecar-routes.yaml", 30),
];

/// Files not run (their configuration is still converted), with the reason.
const SKIPPED_FILES: &[(&str, &str)] = &[];

fn skipped_file(file: &str) -> Option<&'static str> {
    SKIPPED_FILES
        .iter()
        .find(|(f, _)| *f == file)
        .map(|(_, reason)| *reason)
}

/// Cases not run (their configuration is still converted), by file and case name, with the
/// reason.
const SKIPS: &[(&str, &str, &str)] = &[(
    "gateway-conflicts.yaml",
    "duplicate tls gateway",
    "a deliberate divergence: istiod gives the second Gateway's HTTPS server on 443 a filter \
     chain matching exactly what the first one's matches (the simulation's MultipleFilterChain), \
     and real Envoy refuses the whole listener for it (\"filter chain '' has the same matching \
     rules defined as ''\"), so port 443 stops updating; the agent keeps the first chain \
     (envoy_accepts.rs checks every case against real Envoy)",
)];

/// The mesh's DNS suffix, for the index keys of converted resources.
const DOMAIN_SUFFIX: &str = "cluster.local";

#[derive(Debug, Default)]
struct Tally {
    passed: usize,
    failed: usize,
    skipped: usize,
    known_bug_passed: usize,
    known_bug_failed: usize,
}

impl Tally {
    fn record(&mut self, what: &str, diffs: &[String], known_bug: bool) {
        match (diffs.is_empty(), known_bug) {
            (true, false) => self.passed += 1,
            (true, true) => {
                self.passed += 1;
                self.known_bug_passed += 1;
            }
            (false, kb) => {
                self.failed += 1;
                self.known_bug_failed += usize::from(kb);
                println!("  FAIL {what}: {}", diffs.join("; "));
            }
        }
    }
}

/// How many checks a case holds.
fn checks(case: &Case) -> usize {
    if case.is_route_table() {
        return 1;
    }
    case.calls.as_ref().map_or(0, Vec::len) + usize::from(case.inbound_clusters.is_some())
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned()
}

fn translate(
    case: &Case,
    resources: Vec<pasa_proto::store::v1::Resource>,
) -> Result<Resources, String> {
    let proxy = corpus::proxy(case)?;
    let revision = resources.iter().map(|r| r.mod_revision).max().unwrap_or(0);
    let cache = Cache::from_resources(resources, revision);
    Ok(Translator::new(proxy)
        .update(&cache, Generator::Envoy)
        .expect("decodes what it encoded"))
}

/// Runs every check of a case against the generated resources.
fn run_case(case: &Case, label: &str, generated: &Resources, tally: &mut Tally) {
    if let Some(route_config) = &case.route_config {
        let want = case.virtual_hosts.clone().unwrap_or_default();
        let diffs = check::route_tables(route_config, &want, generated);
        tally.record(label, &diffs, false);
        return;
    }
    if let Some(want) = &case.inbound_clusters {
        let diffs = check::inbound_clusters(want, generated);
        tally.record(&format!("{label} inbound clusters"), &diffs, false);
    }
    for (i, c) in case.calls.iter().flatten().enumerate() {
        let diffs = match simulate(generated, &c.call) {
            Ok(outcome) => check::call(&c.expect, &outcome),
            Err(e) => vec![format!(
                "the simulator refused the call or the resources: {e}"
            )],
        };
        tally.record(
            &format!("{label} call #{i} {:?}", c.name),
            &diffs,
            c.expect.known_bug.is_some(),
        );
    }
}

#[test]
fn istio_traffic_simulation_corpus() {
    let Some(dir) = corpus::simulation_dir() else {
        println!(
            "SKIPPED: the conformance corpus was not found (../shared/conformance or PASA_CONFORMANCE_DIR); \
             no traffic simulation case ran"
        );
        eprintln!("SKIPPED: traffic simulation conformance corpus not found");
        return;
    };
    let files = pasa_testing::yaml_files(&dir);
    assert!(!files.is_empty(), "{} holds no case file", dir.display());
    // Problems with the corpus or its conversion: these fail the test.
    let mut broken = Vec::new();
    let mut passing: BTreeMap<String, usize> = BTreeMap::new();
    let mut used_skips = 0;
    for path in files {
        let file = file_name(&path);
        let cases = match corpus::load(&path) {
            Ok(cases) => cases,
            Err(e) => {
                broken.push(format!("{file}: {e}"));
                continue;
            }
        };
        let file_skip = skipped_file(&file);
        let mut tally = Tally::default();
        for (ci, case) in cases.iter().enumerate() {
            let label = format!("{file} #{ci} {:?}", case.name);
            // Conversion runs for skipped cases too: the whole corpus must stay readable.
            let resources = match corpus::resources(case, DOMAIN_SUFFIX) {
                Ok(resources) => resources,
                Err(e) => {
                    broken.push(format!("{label}: {e}"));
                    continue;
                }
            };
            if file_skip.is_some() {
                tally.skipped += checks(case);
                continue;
            }
            if let Some((_, _, reason)) = SKIPS
                .iter()
                .find(|(f, name, _)| *f == file && *name == case.name)
            {
                used_skips += 1;
                tally.skipped += checks(case);
                println!("  skip {label}: {reason}");
                continue;
            }
            match translate(case, resources) {
                Ok(generated) => run_case(case, &label, &generated, &mut tally),
                Err(e) => broken.push(format!("{label}: {e}")),
            }
        }
        let reason = file_skip.map(|r| format!(" ({r})")).unwrap_or_default();
        println!(
            "{file}: {} passed, {} failed, {} skipped{reason}",
            tally.passed, tally.failed, tally.skipped
        );
        if tally.known_bug_passed + tally.known_bug_failed > 0 {
            println!(
                "  {file} known_bug cases: {} passed, {} failed (counted above too)",
                tally.known_bug_passed, tally.known_bug_failed
            );
        }
        passing.insert(file, tally.passed);
    }
    if used_skips != SKIPS.len() {
        println!(
            "note: {} of the {} case skips matched no case; remove stale entries from SKIPS",
            SKIPS.len() - used_skips,
            SKIPS.len()
        );
    }

    for b in &broken {
        println!("BROKEN {b}");
    }
    assert!(
        broken.is_empty(),
        "{} case file(s) or case(s) could not be read or converted; see BROKEN lines above",
        broken.len()
    );
    let below: Vec<String> = MIN_PASSING
        .iter()
        .filter_map(|(file, floor)| {
            let got = passing.get(*file).copied().unwrap_or(0);
            (got < *floor).then(|| format!("{file}: {got} passing, floor {floor}"))
        })
        .collect();
    assert!(
        below.is_empty(),
        "passing checks fell below the floor: {}",
        below.join("; ")
    );
}

/// The simulator alone, on resources shaped like istiod's, against the corpus's own
/// expectations: the capture-port loop cases and the inbound cases with mutual TLS disabled.
#[test]
fn the_simulator_agrees_with_the_corpus_on_istiod_shaped_resources() {
    let Some(dir) = corpus::simulation_dir() else {
        println!(
            "SKIPPED: the conformance corpus was not found; the simulator self-check did not run"
        );
        return;
    };
    let resources = istiod_like::sidecar_with_mtls_disabled();
    let picked = [
        (
            "sidecar-loop.yaml",
            "traffic sent directly to the capture ports",
        ),
        ("sidecar-inbound.yaml", "Disable"),
    ];
    let mut ran = 0;
    for (file, name) in picked {
        let cases = corpus::load(&dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        let case = cases
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("{file} has no case {name:?}"));
        for (i, c) in case.calls.iter().flatten().enumerate() {
            let outcome = simulate(&resources, &c.call)
                .unwrap_or_else(|e| panic!("{file} {name:?} call #{i}: {e}"));
            let diffs = check::call(&c.expect, &outcome);
            assert!(
                diffs.is_empty(),
                "{file} {name:?} call #{i} {:?}: {}",
                c.name,
                diffs.join("; ")
            );
            ran += 1;
        }
    }
    assert!(ran >= 20, "only {ran} calls checked");
}

/// The conversion of Kubernetes objects: a Service with its EndpointSlice and the Pod behind it
/// becomes one `ServiceEndpoints`; headless and ExternalName Services keep no address.
#[test]
fn kubernetes_services_become_service_endpoints() {
    use pasa_istio::service_endpoints::{ServiceEndpoints, TargetPort};

    let kube = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop, annotations: {networking.istio.io/exportTo: ".,istio-system"}}
spec:
  clusterIP: 10.0.0.5
  selector: {app: web}
  ports:
  - {name: http, port: 80, targetPort: web, appProtocol: http}
  - {name: tcp, port: 90, targetPort: 9090}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-x, namespace: shop, labels: {kubernetes.io/service-name: web}}
endpoints:
- addresses: [10.1.0.1]
- addresses: [10.1.0.2]
  conditions: {ready: false}
ports:
- {name: http, port: 8080}
- {name: tcp, port: 9090}
---
apiVersion: v1
kind: Pod
metadata: {name: web-1, namespace: shop, labels: {app: web, version: v1}}
status: {podIP: 10.1.0.1}
---
apiVersion: v1
kind: Service
metadata: {name: headless, creationTimestamp: "2010-01-01T00:00:00Z"}
spec: {clusterIP: None, ports: [{name: http, port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: alias}
spec: {type: ExternalName, externalName: web.shop.svc.cluster.local}
"#;
    let case: Case = serde_saphyr::from_str(&format!(
        "name: t\nproxy: {{type: sidecar, namespace: default, config_namespace: default, ip: 1.1.1.1, dns_domain: default.svc.cluster.local}}\nconfig: |\n  apiVersion: networking.istio.io/v1\n  kind: Sidecar\n  metadata: {{name: s, creationTimestamp: \"2000-01-01T00:00:00Z\"}}\nkube: {kube:?}\nsource: {{test: t, line: 1}}\n"
    ))
    .unwrap();
    let resources = corpus::resources(&case, DOMAIN_SUFFIX).unwrap();
    let order: Vec<(&str, u64, u64)> = resources
        .iter()
        .map(|r| (r.name.as_str(), r.create_revision, r.mod_revision))
        .collect();
    // Undated objects first, in document order, then by creation time; the undated ones were
    // created together (one creation revision), as in the original harness.
    assert_eq!(
        order,
        [
            ("web", 1, 1),
            ("alias", 1, 2),
            ("s", 3, 3),
            ("headless", 4, 4)
        ]
    );
    let spec = |name: &str| -> ServiceEndpoints {
        let r = resources.iter().find(|r| r.name == name).unwrap();
        assert_eq!(r.kind, "ServiceEndpoints");
        serde_json::from_str(&r.spec_json).unwrap()
    };
    let web = spec("web");
    assert_eq!(web.addresses, ["10.0.0.5"]);
    assert_eq!(web.export_to, [".", "istio-system"]);
    assert_eq!(
        web.ports[0].target_port,
        Some(TargetPort::Name("web".into()))
    );
    assert_eq!(web.endpoints.len(), 1, "the unready address is left out");
    let ep = &web.endpoints[0];
    assert_eq!(ep.address, "10.1.0.1");
    assert_eq!(ep.labels.get("version").map(String::as_str), Some("v1"));
    assert_eq!(web.ports[0].endpoint_port(ep), Some(8080));
    assert_eq!(web.ports[1].endpoint_port(ep), Some(9090));
    let web_resource = resources.iter().find(|r| r.name == "web").unwrap();
    assert_eq!(web_resource.namespace, "shop");
    // Found by its host, and by its virtual IP (as an on-demand proxy asks for an address).
    assert_eq!(
        web_resource.index.as_ref().map(|i| i.hosts.clone()),
        Some(vec![
            "10.0.0.5".to_string(),
            "web.shop.svc.cluster.local".to_string()
        ])
    );
    assert!(spec("headless").addresses.is_empty());
    let alias = spec("alias");
    assert!(alias.addresses.is_empty());
    assert_eq!(alias.external_name, "web.shop.svc.cluster.local");

    let mut bad = case.clone();
    bad.config =
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: Bad_Name}\n"
            .into();
    let e = corpus::resources(&bad, DOMAIN_SUFFIX).unwrap_err();
    assert!(
        e.contains("config document 1") && e.contains("metadata.name"),
        "{e}"
    );
    bad.config = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n".into();
    let e = corpus::resources(&bad, DOMAIN_SUFFIX).unwrap_err();
    assert!(e.contains("\"ConfigMap\""), "{e}");
}

/// The passing cases each multi-network file must keep (see [`MIN_PASSING`]).
const MULTINETWORK_MIN_PASSING: &[(&str, usize)] = &[
    ("eds-mtls-filter.yaml", 49),
    ("eds-network-filter.yaml", 101),
    ("locality-failover-priority.yaml", 6),
    ("locality-lb-setting.yaml", 11),
];

/// istiod's expectations for endpoints across clusters and networks (`multinetwork/`): split
/// horizon, the mutual TLS filter of SNI-DNAT clusters, failover priorities and the locality
/// setting in force. Per file it prints `<file>: N passed, M failed, K skipped`.
#[test]
fn multinetwork_corpus() {
    use common::corpus::multinetwork::{self as mn, EdsFile, FailoverCase, SettingCase};
    let Some(dir) = mn::dir() else { return };
    let mut shortfalls = Vec::new();
    for path in mn::files(&dir) {
        let file = file_name(&path);
        let text = std::fs::read_to_string(&path).expect("readable");
        let mut tally = Tally::default();
        if file.starts_with("eds-") {
            let eds: EdsFile = serde_saphyr::from_str(&text)
                .unwrap_or_else(|e| panic!("{file}: not an EDS case file: {e}"));
            for case in &eds.cases {
                if let Some(reason) = mn::skip_reason(case) {
                    println!("  SKIP {}: {reason}", case.name);
                    tally.skipped += 1;
                    continue;
                }
                let env = &eds.environments[&case.environment];
                let diffs = mn::eds_resources(env, &case.config)
                    .and_then(|r| Ok((r, mn::eds_proxy(case)?)))
                    .and_then(|(r, p)| mn::load_assignment(p, r, &case.cluster))
                    .map_or_else(|e| vec![e], |got| mn::compare(&case.expect, &got));
                tally.record(&case.name, &diffs, false);
            }
        } else if file.starts_with("locality-failover") {
            #[derive(serde::Deserialize)]
            struct Cases {
                cases: Vec<FailoverCase>,
            }
            let cases: Cases = serde_saphyr::from_str(&text)
                .unwrap_or_else(|e| panic!("{file}: not a failover case file: {e}"));
            for case in &cases.cases {
                if let Some(reason) = mn::failover_skip_reason(case) {
                    println!("  SKIP {}: {reason}", case.name);
                    tally.skipped += 1;
                    continue;
                }
                let diffs = mn::run_failover(case).unwrap_or_else(|e| vec![e]);
                tally.record(&case.name, &diffs, false);
            }
        } else if file.starts_with("locality-lb-setting") {
            #[derive(serde::Deserialize)]
            struct Cases {
                cases: Vec<SettingCase>,
            }
            let cases: Cases = serde_saphyr::from_str(&text)
                .unwrap_or_else(|e| panic!("{file}: not a setting case file: {e}"));
            for case in &cases.cases {
                let diffs = mn::run_setting(case).unwrap_or_else(|e| vec![e]);
                tally.record(&case.name, &diffs, false);
            }
        } else {
            panic!("{file}: a multinetwork file of no known kind");
        }
        println!(
            "{file}: {} passed, {} failed, {} skipped",
            tally.passed, tally.failed, tally.skipped
        );
        let floor = MULTINETWORK_MIN_PASSING
            .iter()
            .find(|(f, _)| *f == file)
            .map_or(0, |(_, n)| *n);
        if tally.passed < floor {
            shortfalls.push(format!("{file}: {} passed, floor {floor}", tally.passed));
        }
    }
    assert!(shortfalls.is_empty(), "below the floor: {shortfalls:?}");
}

/// The on-demand scope against the eager one over the corpus's sidecar cases: for each virtual
/// host of every port's route configuration the eager sidecar holds (catch-alls aside), and one
/// spelling of it (its first domain that is not an address), a sidecar that learned what that
/// spelling may name serves the same virtual host (named as its VHDS resource) and the same
/// clusters its routes send to, byte for byte. Per file it prints how many were compared, and
/// how many spellings name a port the learned services do not have (see docs/on-demand.md,
/// "Ports"); any difference fails.
#[test]
fn on_demand_answers_as_the_eager_scope_over_the_sidecar_cases() {
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::config::route::v3::{
        RouteConfiguration, VirtualHost, route, route_action,
    };
    use pasa_agent::on_demand::Lookup;
    use prost::Message;

    let Some(dir) = corpus::simulation_dir() else {
        println!("SKIPPED: the conformance corpus was not found; no on-demand equivalence ran");
        return;
    };
    // Virtual hosts not compared, by file, case and virtual host, with the reason.
    const NOT_COMPARED: &[(&str, &str, &str)] = &[(
        "sidecar-externalname-services.yaml",
        "concrete.default.svc.cluster.local:80",
        "the eager virtual host of a service lists the names of the ExternalName services that \
         alias it; learned from its own name, an alias is not known (the store indexes hosts, \
         not what an ExternalName names) until a request names the alias, which then brings \
         its target and the alias's domains",
    )];
    let mut differences = Vec::new();
    let mut total = 0;
    let mut not_compared = 0;
    for path in pasa_testing::yaml_files(&dir) {
        let file = file_name(&path);
        if !file.starts_with("sidecar-") || skipped_file(&file).is_some() {
            continue;
        }
        let cases = corpus::load(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
        let (mut compared, mut other_ports) = (0, 0);
        for case in &cases {
            let (Ok(resources), Ok(proxy)) =
                (corpus::resources(case, DOMAIN_SUFFIX), corpus::proxy(case))
            else {
                continue;
            };
            let revision = resources.iter().map(|r| r.mod_revision).max().unwrap_or(0);
            let cache = Cache::from_resources(resources, revision);
            let eager = Translator::new(proxy.clone())
                .update(&cache, Generator::Envoy)
                .expect("decodes what it encoded");
            for (name, config) in &eager.routes {
                if name.parse::<u16>().is_err() {
                    continue;
                }
                for vh in &config.virtual_hosts {
                    if vh.domains.iter().any(|d| d == "*") {
                        continue;
                    }
                    if let Some((_, _, reason)) = NOT_COMPARED
                        .iter()
                        .find(|(f, v, _)| *f == file && *v == vh.name)
                    {
                        not_compared += 1;
                        println!(
                            "  not compared {file} {:?} {}: {reason}",
                            case.name, vh.name
                        );
                        continue;
                    }
                    let Some(lookup) = vh
                        .domains
                        .iter()
                        .filter_map(|d| Lookup::of(d.trim_start_matches("*."), &proxy.dns_domain))
                        .find(|l| l.address.is_none())
                    else {
                        continue;
                    };
                    let learning = pasa_agent::model::proxy::Proxy {
                        learned: Some(std::sync::Arc::new(lookup.hosts.into_iter().collect())),
                        ..proxy.clone()
                    };
                    let lazy = Translator::new(learning).generate(&cache, Generator::Envoy);
                    let Some(served) = lazy.routes.get(name) else {
                        other_ports += 1;
                        continue;
                    };
                    let served = RouteConfiguration::decode(served.body.value.as_slice()).unwrap();
                    let want = VirtualHost {
                        name: format!("{name}/{}", vh.name),
                        ..vh.clone()
                    };
                    let got = lazy
                        .virtual_hosts
                        .get(&want.name)
                        .map(|r| VirtualHost::decode(r.body.value.as_slice()).unwrap());
                    let what = format!("{file} {:?} {name}/{}", case.name, vh.name);
                    if served.vhds.is_none() || got.as_ref() != Some(&want) {
                        differences.push(format!("{what}: the virtual host differs or is missing"));
                        continue;
                    }
                    let clusters = vh.routes.iter().filter_map(|r| match &r.action {
                        Some(route::Action::Route(a)) => a.cluster_specifier.as_ref(),
                        _ => None,
                    });
                    for specifier in clusters {
                        let names: Vec<&str> = match specifier {
                            route_action::ClusterSpecifier::Cluster(c) => vec![c.as_str()],
                            route_action::ClusterSpecifier::WeightedClusters(w) => {
                                w.clusters.iter().map(|c| c.name.as_str()).collect()
                            }
                            _ => Vec::new(),
                        };
                        for cluster in names {
                            let got = lazy
                                .clusters
                                .get(cluster)
                                .map(|r| Cluster::decode(r.body.value.as_slice()).unwrap());
                            if got.as_ref() != eager.clusters.get(cluster) {
                                differences.push(format!("{what}: cluster {cluster} differs"));
                            }
                        }
                    }
                    compared += 1;
                }
            }
        }
        total += compared;
        println!(
            "{file}: {compared} virtual hosts answered as the eager scope builds them, \
             {other_ports} on ports no learned service has"
        );
    }
    for d in &differences {
        println!("  DIFFERS {d}");
    }
    println!("{total} virtual hosts compared, {not_compared} not compared (see above)");
    assert!(
        differences.is_empty(),
        "{} differences; see DIFFERS lines",
        differences.len()
    );
    assert!(total > 50, "only {total} virtual hosts compared");
}
