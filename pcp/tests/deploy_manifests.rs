//! Every manifest in `deploy/` is a valid Kubernetes object: each YAML file is checked offline
//! against the Kubernetes 1.37 schemas by `kubernetes-validate --strict` (unknown fields are
//! errors), installed from `deploy/requirements.txt` (CI's `.ci/run` installs it). Without it the
//! test says loudly that it skipped, unless `PASA_E2E_REQUIRED` is set (as in CI), in which case
//! it fails.

use std::path::{Path, PathBuf};
use std::process::Command;

const FIX: &str = "pip install -r deploy/requirements.txt";

/// The YAML files under `dir`, sorted, at any depth.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("reading deploy/") {
            let path = entry.expect("a deploy/ entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The files a kustomization's `resources:` lists (one `- name` per line).
fn kustomized(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).expect("reading a kustomization");
    let mut listed = Vec::new();
    let mut in_resources = false;
    for line in text.lines() {
        if !line.starts_with([' ', '-']) {
            in_resources = line.trim_end() == "resources:";
        } else if in_resources && let Some(item) = line.trim_start().strip_prefix("- ") {
            listed.push(item.trim().to_string());
        }
    }
    listed
}

/// Custom resources the Kubernetes schemas do not cover, each with why it is in deploy/: their
/// files get a structural check instead.
const CUSTOM_RESOURCES: &[(&str, &str, &str)] = &[
    (
        "cert-manager.io/v1",
        "Issuer",
        "cert-manager makes the webhook certificate (optional)",
    ),
    (
        "cert-manager.io/v1",
        "Certificate",
        "cert-manager makes the webhook certificate (optional)",
    ),
    (
        "pingcap.com/v1alpha1",
        "TidbCluster",
        "the TiDB operator runs PD and TiKV for the distributed profile",
    ),
];

/// A listed custom resource with a name, a namespace and a spec; else why not.
fn custom_resource(file: &Path) -> Result<String, String> {
    let doc: serde_json::Value = serde_saphyr::from_str(&std::fs::read_to_string(file).unwrap())
        .map_err(|e| e.to_string())?;
    let api_version = doc["apiVersion"].as_str().unwrap_or_default();
    let kind = doc["kind"].as_str().unwrap_or_default();
    let Some((_, _, why)) = CUSTOM_RESOURCES
        .iter()
        .find(|(v, k, _)| *v == api_version && *k == kind)
    else {
        return Err(format!(
            "{api_version} {kind}: a kind Kubernetes has no schema for, and not a listed custom \
             resource"
        ));
    };
    for field in ["name", "namespace"] {
        if doc["metadata"][field].as_str().is_none_or(str::is_empty) {
            return Err(format!("{kind}: metadata.{field} is required"));
        }
    }
    if !doc["spec"].is_object() {
        return Err(format!("{kind}: spec must be a mapping"));
    }
    Ok(format!("{kind}, {why}"))
}

#[test]
fn every_deploy_manifest_matches_the_kubernetes_schemas() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let files = yaml_files(&deploy);
    assert!(
        !files.is_empty(),
        "no manifests found in {}",
        deploy.display()
    );
    if let Err(e) = Command::new("kubernetes-validate")
        .arg("--version")
        .output()
    {
        if std::env::var_os("PASA_E2E_REQUIRED").is_some() {
            panic!("kubernetes-validate is not installed ({e}); run `{FIX}`");
        }
        eprintln!(
            "SKIPPED: the deploy/ manifests were not validated: kubernetes-validate ({e}); run `{FIX}`"
        );
        return;
    }
    let mut failed = Vec::new();
    for file in &files {
        let out = Command::new("kubernetes-validate")
            .args(["--strict", "--quiet"])
            .arg(file)
            .output()
            .expect("running kubernetes-validate");
        let shown = file.strip_prefix(&deploy).unwrap_or(file).display();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if file.file_name().is_some_and(|n| n == "kustomization.yaml") {
            // Not a Kubernetes object (kustomize reads it): what it lists must be there.
            let missing = kustomized(file)
                .into_iter()
                .filter(|r| !file.parent().unwrap().join(r).exists())
                .collect::<Vec<_>>();
            if missing.is_empty() {
                println!("{shown}: lists only files that exist");
            } else {
                failed.push(format!("{shown}: lists missing files {missing:?}"));
            }
            continue;
        }
        // kubernetes-validate passes a kind it has no schema for with a warning: a misspelt
        // kind or group would slip through. Only the custom resources listed are let through,
        // with their structure checked.
        if said.contains("Couldn't find schema") {
            match custom_resource(file) {
                Ok(kind) => println!("{shown}: valid ({kind}: structure checked)"),
                Err(why) => {
                    println!("{shown}: INVALID");
                    failed.push(format!("{shown}: {why}\n{said}"));
                }
            }
        } else if out.status.success() {
            println!("{shown}: valid");
        } else {
            println!("{shown}: INVALID");
            failed.push(format!("{shown}:\n{said}"));
        }
    }
    println!(
        "deploy/: {} of {} files valid",
        files.len() - failed.len(),
        files.len()
    );
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// The names `pasa_…` in `text`.
fn metric_names(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("pasa_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

/// The Grafana dashboard and the alert rules use only metrics the components export (those
/// deploy/README.md's table documents; a histogram's `_bucket`, `_sum`, `_count` series count as
/// the histogram), every panel queries something, and every alert has a severity and a summary.
#[test]
fn the_dashboard_and_alerts_use_exported_metrics() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let readme = std::fs::read_to_string(deploy.join("README.md")).unwrap();
    let documented: std::collections::BTreeSet<String> = readme
        .lines()
        .filter(|l| l.starts_with("| `pasa_"))
        .flat_map(|l| metric_names(l.split(" | ").next().unwrap_or_default()))
        .collect();
    assert!(documented.len() > 20, "{documented:?}");
    let known = |name: &str| {
        documented.contains(name)
            || ["_bucket", "_sum", "_count"]
                .iter()
                .any(|s| name.strip_suffix(s).is_some_and(|b| documented.contains(b)))
    };

    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(deploy.join("monitoring/pasa-dashboard.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut ids = std::collections::BTreeSet::new();
    let mut queries = 0;
    for panel in panels {
        assert!(
            ids.insert(panel["id"].as_u64().unwrap()),
            "duplicate id in {panel}"
        );
        assert!(panel["gridPos"].is_object(), "{panel}");
        if panel["type"] == "row" {
            continue;
        }
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{}", panel["title"]);
        for t in targets {
            let expr = t["expr"].as_str().unwrap();
            let names = metric_names(expr);
            assert!(!names.is_empty(), "{}: {expr}", panel["title"]);
            for name in names {
                assert!(
                    known(&name),
                    "{}: {name} is not an exported metric",
                    panel["title"]
                );
            }
            queries += 1;
        }
    }

    let config: serde_json::Value = serde_saphyr::from_str(
        &std::fs::read_to_string(deploy.join("monitoring/prometheus-rules.yaml")).unwrap(),
    )
    .unwrap();
    let rules_text = config["data"]["pasa.rules.yaml"]
        .as_str()
        .expect("the rule file");
    let rules: serde_json::Value = serde_saphyr::from_str(rules_text).unwrap();
    let mut alerts = 0;
    for group in rules["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            let name = rule["alert"].as_str().expect("alert");
            let expr = rule["expr"].as_str().expect("expr");
            assert!(
                matches!(
                    rule["labels"]["severity"].as_str(),
                    Some("warning" | "critical")
                ),
                "{name}: severity"
            );
            assert!(
                rule["annotations"]["summary"].is_string(),
                "{name}: summary"
            );
            for metric in metric_names(expr) {
                assert!(known(&metric), "{name}: {metric} is not an exported metric");
            }
            alerts += 1;
        }
    }
    println!(
        "dashboard: {} panels, {queries} queries; {alerts} alerts; all on the {} documented metrics",
        panels.len(),
        documented.len()
    );
}

/// The arguments of `container` in a workload manifest, with `$(VAR)` references to the pod's
/// environment replaced by a sample value.
fn container_args(doc: &serde_json::Value) -> Vec<(String, Vec<String>)> {
    doc["spec"]["template"]["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let image = c["image"].as_str().unwrap_or_default().to_string();
            let args = c["args"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|a| a.as_str())
                .map(|a| a.replace("$(POD_IP)", "10.0.0.1"))
                .collect();
            (image, args)
        })
        .collect()
}

#[test]
fn the_binaries_accept_the_arguments_the_manifests_give_them() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let binaries = [
        ("pasa-pcp:", PathBuf::from(env!("CARGO_BIN_EXE_pasa-pcp"))),
        (
            "pasa-store:",
            pasa_testing::workspace_binary("pasa-store", "pasa-store"),
        ),
    ];
    let mut checked = 0;
    for file in yaml_files(&deploy) {
        let Ok(doc) =
            serde_saphyr::from_str::<serde_json::Value>(&std::fs::read_to_string(&file).unwrap())
        else {
            continue;
        };
        if !matches!(doc["kind"].as_str(), Some("Deployment" | "StatefulSet")) {
            continue;
        }
        for (image, args) in container_args(&doc) {
            let Some((_, binary)) = binaries
                .iter()
                .find(|(prefix, _)| image.starts_with(prefix))
            else {
                continue;
            };
            // Parsed as the container would run them; `--help` then stops before anything starts.
            let out = Command::new(binary)
                .args(&args)
                .arg("--help")
                .output()
                .expect("running the binary");
            assert!(
                out.status.success(),
                "{}: {image} refuses its arguments {args:?}:\n{}",
                file.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            checked += 1;
        }
    }
    println!("deploy/: {checked} containers' arguments accepted");
    assert!(checked >= 3, "the pcp and store workloads were found");
}

/// The validating webhook is sent, and PCP's ClusterRole may read, every Istio kind the store
/// keeps, at every version the store accepts.
#[test]
fn the_webhook_and_the_cluster_role_cover_every_istio_kind() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let read = |file: &str| -> serde_json::Value {
        serde_saphyr::from_str(&std::fs::read_to_string(deploy.join(file)).unwrap()).unwrap()
    };
    let webhook = read("validating-webhook.yaml");
    let role = read("base/clusterrole.yaml");
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect()
    };
    for kind in pasa_proto::Kind::ALL {
        if kind.group() == pasa_proto::kind::PASA_GROUP {
            continue;
        }
        let covers = |rules: &serde_json::Value, versions: bool| {
            rules.as_array().into_iter().flatten().any(|r| {
                strings(&r["apiGroups"]).contains(&kind.group().to_string())
                    && strings(&r["resources"]).contains(&kind.plural().to_string())
                    && (!versions
                        || kind
                            .versions()
                            .iter()
                            .all(|v| strings(&r["apiVersions"]).contains(&v.to_string())))
            })
        };
        assert!(
            covers(&webhook["webhooks"][0]["rules"], true),
            "the validating webhook is not sent {kind} at every version"
        );
        assert!(
            covers(&role["rules"], false),
            "PCP's ClusterRole cannot read {kind}"
        );
    }
}

/// What PCP's syncer reads from a remote cluster: (API group, resource). deploy/remote grants
/// its reader exactly get, list and watch of these.
const REMOTE_READS: &[(&str, &str)] = &[
    ("", "namespaces"),
    ("", "pods"),
    ("", "services"),
    ("", "nodes"),
    ("discovery.k8s.io", "endpointslices"),
];

/// deploy/remote: the reader ServiceAccount of a remote cluster, its token Secret and its RBAC,
/// which grants get, list and watch of what the syncer reads from a remote and nothing else (no
/// wildcard, no Secrets, no Istio kinds, no writes), to that ServiceAccount only. Checked by
/// reading the rules, and by the fake API server authorising requests with them.
#[tokio::test]
async fn the_remote_reader_may_read_what_the_syncer_reads_and_nothing_more() {
    use serde_json::Value;
    let remote = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/remote");
    let listed = kustomized(&remote.join("kustomization.yaml"));
    let manifests: Vec<Value> = listed
        .iter()
        .map(|file| {
            let text = std::fs::read_to_string(remote.join(file)).unwrap();
            serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"))
        })
        .collect();
    let of_kind =
        |kind: &str| -> Vec<&Value> { manifests.iter().filter(|m| m["kind"] == kind).collect() };
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .map(|s| s.as_str().expect("a string").to_string())
            .collect()
    };
    let [account] = of_kind("ServiceAccount")[..] else {
        panic!("deploy/remote has one ServiceAccount")
    };
    let (namespace, name) = (
        account["metadata"]["namespace"].as_str().unwrap(),
        account["metadata"]["name"].as_str().unwrap(),
    );
    assert_eq!(
        (namespace, name),
        ("istio-system", "istio-reader-service-account")
    );
    assert!(
        of_kind("Role").is_empty() && of_kind("RoleBinding").is_empty(),
        "no namespaced grants"
    );
    let [role] = of_kind("ClusterRole")[..] else {
        panic!("deploy/remote has one ClusterRole")
    };
    for rule in role["rules"].as_array().expect("rules") {
        assert!(rule.get("resourceNames").is_none() && rule.get("nonResourceURLs").is_none());
        assert_eq!(strings(&rule["verbs"]), ["get", "list", "watch"], "{rule}");
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                assert!(
                    REMOTE_READS.contains(&(group.as_str(), resource.as_str())),
                    "the remote reader may read {resource} of group {group:?}, which the \
                     syncer does not read from a remote"
                );
            }
        }
    }
    let [binding] = of_kind("ClusterRoleBinding")[..] else {
        panic!("deploy/remote has one ClusterRoleBinding")
    };
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(
        binding["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": name, "namespace": namespace}])
    );
    let [token] = of_kind("Secret")[..] else {
        panic!("deploy/remote has the reader's token Secret")
    };
    assert_eq!(token["type"], "kubernetes.io/service-account-token");
    assert_eq!(token["metadata"]["namespace"], namespace);
    assert_eq!(
        token["metadata"]["annotations"]["kubernetes.io/service-account.name"],
        name
    );
    assert_eq!(manifests.len(), 4, "nothing else in {listed:?}");

    // The API server's view: the reader lists and watches each, and is refused anything else.
    let api = pasa_kube::fake_apiserver::FakeApiServer::start().await;
    api.enforce_rbac(&manifests);
    let reader = api.client_as(namespace, name);
    let url = |group: &str, resource: &str| match group {
        "" => format!("/api/v1/{resource}"),
        group => format!("/apis/{group}/v1/{resource}"),
    };
    // The status the API server answers with (a watch's, once its stream begins).
    let status = |path: String, watch: bool| {
        let reader = reader.clone();
        async move {
            let path = if watch {
                format!("{path}?watch=true")
            } else {
                path
            };
            let request = http::Request::get(&path)
                .body(kube::client::Body::from(Vec::new()))
                .unwrap();
            let response = reader
                .send(request)
                .await
                .unwrap_or_else(|e| panic!("{path}: {e}"));
            response.status().as_u16()
        }
    };
    for (group, resource) in REMOTE_READS {
        assert_eq!(
            status(url(group, resource), false).await,
            200,
            "list {resource}"
        );
    }
    assert_eq!(status(url("", "pods"), true).await, 200, "watch pods");
    for (group, resource) in [
        ("", "secrets"),
        ("", "configmaps"),
        ("networking.istio.io", "virtualservices"),
        ("coordination.k8s.io", "leases"),
    ] {
        assert_eq!(
            status(url(group, resource), false).await,
            403,
            "list {resource}"
        );
    }
    let create = http::Request::post("/api/v1/namespaces")
        .body(br#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"x"}}"#.to_vec())
        .unwrap();
    let created = reader.request_text(create).await;
    assert!(
        matches!(&created, Err(kube::Error::Api(s)) if s.code == 403),
        "the reader writes nothing: {created:?}"
    );
}
