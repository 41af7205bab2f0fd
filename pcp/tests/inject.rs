//! The injecting webhook's patches applied (RFC 6902, the `json-patch` crate) to real pod
//! manifests: the Bookinfo Deployments of the conformance corpus' samples, each as its pod
//! template makes a pod, as they are (standalone mode) and as Istio's injector leaves them (an
//! `istio-proxy` native sidecar after `istio-init`: next to Istio). The patched pods are checked
//! semantically; a second injection changes nothing.

use std::collections::BTreeMap;

use pasa_pcp::webhook::inject::sidecar::{
    AGENT_CONTAINER, INIT_CONTAINER, InjectConfig, SCOPE_ANNOTATION, XDS_ADDRESS,
};
use pasa_pcp::webhook::inject::{Injector, STATUS_ANNOTATION, Selection};
use pasa_pcp::webhook::review::{self, AdmissionRequest};
use serde_json::{Value, json};

/// The pods Bookinfo's Deployments make, opted in by annotation, in namespace `bookinfo`.
fn bookinfo_pods() -> Vec<(String, Value)> {
    let Some(dir) = pasa_testing::conformance_dir("samples") else {
        return Vec::new();
    };
    let docs = pasa_testing::yaml_docs(&dir.join("samples/bookinfo/platform/bookinfo.yaml"));
    let pods: Vec<(String, Value)> = docs
        .iter()
        .filter(|d| d["kind"] == "Deployment")
        .map(|d| {
            let name = d["metadata"]["name"].as_str().unwrap().to_string();
            let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": d["spec"]["template"]["metadata"].clone(),
                "spec": d["spec"]["template"]["spec"].clone()});
            pod["metadata"]["generateName"] = json!(format!("{name}-"));
            pod["metadata"]["annotations"] = json!({"pasa.io/enabled": "true"});
            (name, pod)
        })
        .collect();
    assert_eq!(pods.len(), 6, "Bookinfo has six Deployments");
    pods
}

/// `pod` as Istio's injector leaves it: `istio-init`, then `istio-proxy` as a native sidecar,
/// its status annotation and a ProxyConfig annotation of the user's.
fn istio_injected(mut pod: Value) -> Value {
    pod["metadata"]["annotations"]["sidecar.istio.io/status"] =
        json!(r#"{"initContainers":["istio-init","istio-proxy"],"volumes":["istio-envoy"]}"#);
    pod["metadata"]["annotations"]["proxy.istio.io/config"] =
        json!("holdApplicationUntilProxyStarts: true\n");
    pod["spec"]["initContainers"] = json!([
        {"name": "istio-init", "image": "docker.io/istio/proxyv2:1.30.0", "args": ["istio-iptables"]},
        {"name": "istio-proxy", "image": "docker.io/istio/proxyv2:1.30.0", "restartPolicy": "Always",
         "args": ["proxy", "sidecar"],
         "env": [{"name": "PILOT_CERT_PROVIDER", "value": "istiod"}],
         "startupProbe": {"httpGet": {"path": "/healthz/ready", "port": 15021}}},
    ]);
    let mut volumes = pod["spec"]["volumes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    volumes.push(json!({"name": "istio-envoy", "emptyDir": {"medium": "Memory"}}));
    pod["spec"]["volumes"] = Value::Array(volumes);
    pod
}

fn injector() -> Injector {
    injector_with(InjectConfig::default())
}

fn injector_with(config: InjectConfig) -> Injector {
    Injector::new(
        config,
        Selection::new(["istio-system", "pasa-system"]),
        None,
    )
}

fn request(pod: &Value) -> AdmissionRequest {
    let body = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "namespace": "bookinfo", "operation": "CREATE", "object": pod}});
    review::parse(body.to_string().as_bytes()).expect("an AdmissionReview")
}

/// Injects `pod`: the patched pod and the metric result.
fn inject(injector: &Injector, pod: &Value) -> (Value, &'static str, Vec<String>) {
    let answer = injector.review(&request(pod));
    assert!(answer.verdict.allowed);
    let mut patched = pod.clone();
    if let Some(ops) = &answer.verdict.patch {
        let patch: json_patch::Patch = serde_json::from_slice(ops).unwrap();
        json_patch::patch(&mut patched, &patch)
            .unwrap_or_else(|e| panic!("the patch applies: {e}\n{}", String::from_utf8_lossy(ops)));
    }
    let warnings = answer.verdict.warnings.unwrap_or_default();
    (patched, answer.result, warnings)
}

fn names(list: &Value) -> Vec<&str> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect()
}

fn env(container: &Value) -> BTreeMap<&str, &Value> {
    container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| (e["name"].as_str().unwrap(), e))
        .collect()
}

fn container<'a>(pod: &'a Value, list: &str, name: &str) -> &'a Value {
    pod["spec"][list]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {list}"))
}

/// What both modes give every pod: the pod's own containers untouched, every mount naming a
/// volume of the pod, identity from the downward API, and the status annotation.
fn check_common(original: &Value, pod: &Value, what: &str) {
    assert_eq!(
        pod["spec"]["containers"], original["spec"]["containers"],
        "{what}: the app's containers are untouched"
    );
    let volumes = names(&pod["spec"]["volumes"]);
    for list in ["initContainers", "containers"] {
        for c in pod["spec"][list].as_array().into_iter().flatten() {
            for m in c["volumeMounts"].as_array().into_iter().flatten() {
                let name = m["name"].as_str().unwrap();
                assert!(
                    volumes.contains(&name),
                    "{what}: mount {name} has no volume"
                );
            }
        }
    }
    let agent = container(pod, "initContainers", AGENT_CONTAINER);
    assert_eq!(agent["restartPolicy"], "Always", "{what}: a native sidecar");
    assert_eq!(agent["securityContext"]["runAsUser"], 1337);
    let env = env(agent);
    for (name, path) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
        ("INSTANCE_IP", "status.podIP"),
        ("SERVICE_ACCOUNT", "spec.serviceAccountName"),
    ] {
        assert_eq!(
            env[name]["valueFrom"]["fieldRef"]["fieldPath"], path,
            "{what}: {name}"
        );
    }
    assert_eq!(
        env["PASA_NODE_ID"]["value"],
        "sidecar~$(INSTANCE_IP)~$(POD_NAME).$(POD_NAMESPACE)~$(POD_NAMESPACE).svc.cluster.local"
    );
    assert_eq!(env["PASA_LABELS_FILE"]["value"], "/etc/pasa/podinfo/labels");
    let podinfo = pod["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "pasa-podinfo")
        .unwrap();
    assert_eq!(
        podinfo["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"],
        "metadata.labels"
    );
    let status: Value = serde_json::from_str(
        pod["metadata"]["annotations"][STATUS_ANNOTATION]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert!(
        status["initContainers"]
            .as_array()
            .unwrap()
            .contains(&json!(AGENT_CONTAINER))
    );
}

#[test]
fn bookinfo_pods_next_to_istio() {
    let injector = injector();
    for (name, pod) in bookinfo_pods() {
        let pod = istio_injected(pod);
        let (patched, result, warnings) = inject(&injector, &pod);
        assert_eq!(result, "injected_next_to_istio", "{name}");
        assert!(warnings.is_empty(), "{name}: {warnings:?}");
        check_common(&pod, &patched, &name);
        // The agent runs just before istio-proxy, after istio-init.
        assert_eq!(
            names(&patched["spec"]["initContainers"]),
            ["istio-init", AGENT_CONTAINER, "istio-proxy"],
            "{name}"
        );
        let agent = container(&patched, "initContainers", AGENT_CONTAINER);
        assert_eq!(env(agent)["PASA_XDS_LISTEN"]["value"], XDS_ADDRESS);
        assert!(
            !env(agent).contains_key("CA_ADDR"),
            "pilot-agent keeps the certificates"
        );
        // pilot-agent's xDS goes to the agent; certificates still from istiod; the user's
        // ProxyConfig kept.
        let config: Value = serde_json::from_str(
            patched["metadata"]["annotations"]["proxy.istio.io/config"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            config,
            json!({"holdApplicationUntilProxyStarts": true, "discoveryAddress": XDS_ADDRESS,
                   "controlPlaneAuthPolicy": "NONE"})
        );
        let proxy = container(&patched, "initContainers", "istio-proxy");
        assert_eq!(
            env(proxy)["CA_ADDR"]["value"],
            "istiod.istio-system.svc:15012"
        );
        assert_eq!(env(proxy)["PILOT_CERT_PROVIDER"]["value"], "istiod");
        // The pod's and Istio's volumes stay; PASA's are added after them.
        let mut expected = names(&pod["spec"]["volumes"]);
        expected.extend(["pasa-run", "pasa-cache", "pasa-podinfo"]);
        assert_eq!(names(&patched["spec"]["volumes"]), expected, "{name}");
        assert_eq!(
            agent["resources"],
            json!({"requests": {"cpu": "10m", "memory": "40Mi"}, "limits": {"memory": "128Mi"}})
        );

        // Injecting twice changes nothing.
        let (again, result, _) = inject(&injector, &patched);
        assert_eq!(result, "already_injected");
        assert_eq!(again, patched);
    }
}

/// With `--inject-store-tls`, agents of both modes trust the mesh root for the store and present
/// a certificate from istiod's CA: next to Istio, the agent asks for one of its own.
#[test]
fn agents_reach_the_store_over_mutual_tls_when_asked() {
    let injector = injector_with(InjectConfig {
        store_tls: true,
        ..Default::default()
    });
    for (name, pod) in bookinfo_pods() {
        for pod in [istio_injected(pod.clone()), pod] {
            let (patched, _, _) = inject(&injector, &pod);
            check_common(&pod, &patched, &name);
            let agent = container(&patched, "initContainers", AGENT_CONTAINER);
            let env = env(agent);
            assert_eq!(
                env["PASA_STORE_CA"]["value"],
                "/var/run/secrets/istio/root-cert.pem"
            );
            assert_eq!(env["CA_ADDR"]["value"], "istiod.istio-system.svc:15012");
            let mounts: Vec<&str> = agent["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|m| m["mountPath"].as_str())
                .collect();
            assert!(mounts.contains(&"/var/run/secrets/istio"), "{mounts:?}");
            assert!(mounts.contains(&"/var/run/secrets/tokens"), "{mounts:?}");
        }
    }
}

/// istiod's `PILOT_ENABLE_PERSISTENT_SESSION_FILTER`, given to PCP, reaches the agents it
/// injects (they build the stateful session filter); without it, they are not told.
#[test]
fn agents_get_the_persistent_session_filter_when_pcp_has_it() {
    for on in [false, true] {
        let injector = injector_with(InjectConfig {
            persistent_session_filter: on,
            ..Default::default()
        });
        for (name, pod) in bookinfo_pods() {
            for pod in [istio_injected(pod.clone()), pod] {
                let (patched, _, _) = inject(&injector, &pod);
                let agent = container(&patched, "initContainers", AGENT_CONTAINER);
                let value = env(agent)
                    .get("PILOT_ENABLE_PERSISTENT_SESSION_FILTER")
                    .map(|e| e["value"].clone());
                assert_eq!(value, on.then(|| "true".into()), "{name}");
            }
        }
    }
}

/// The scope: PCP's `--inject-scope` unless the pod's `pasa.io/scope` says; a value that is
/// neither is warned about and the default holds.
#[test]
fn agents_learn_their_scope_on_demand_when_the_pod_or_the_mesh_says() {
    for default in [false, true] {
        let injector = injector_with(InjectConfig {
            on_demand: default,
            ..Default::default()
        });
        for (annotation, expected) in [
            (None, default),
            (Some("on-demand"), true),
            (Some("eager"), false),
            (Some("lazy"), default),
        ] {
            for (name, mut pod) in bookinfo_pods() {
                if let Some(value) = annotation {
                    pod["metadata"]["annotations"][SCOPE_ANNOTATION] = value.into();
                }
                let (patched, _, warnings) = inject(&injector, &pod);
                let agent = container(&patched, "initContainers", AGENT_CONTAINER);
                let scope = env(agent).get("PASA_SCOPE").map(|e| e["value"].clone());
                assert_eq!(
                    scope,
                    expected.then(|| "on-demand".into()),
                    "{name} {annotation:?}"
                );
                let warned = warnings.iter().any(|w| w.contains(SCOPE_ANNOTATION));
                assert_eq!(warned, annotation == Some("lazy"), "{name}: {warnings:?}");
            }
        }
    }
}

#[test]
fn bookinfo_pods_standalone() {
    let injector = injector();
    for (name, pod) in bookinfo_pods() {
        let (patched, result, _) = inject(&injector, &pod);
        assert_eq!(result, "injected_standalone", "{name}");
        check_common(&pod, &patched, &name);
        assert_eq!(
            names(&patched["spec"]["initContainers"]),
            [INIT_CONTAINER, AGENT_CONTAINER],
            "{name}"
        );
        let init = container(&patched, "initContainers", INIT_CONTAINER);
        assert_eq!(
            init["securityContext"]["capabilities"]["add"],
            json!(["NET_ADMIN", "NET_RAW"])
        );
        let agent = container(&patched, "initContainers", AGENT_CONTAINER);
        let env = env(agent);
        assert_eq!(env["PASA_ENVOY_BINARY"]["value"], "/usr/local/bin/envoy");
        assert_eq!(env["CA_ADDR"]["value"], "istiod.istio-system.svc:15012");
        assert_eq!(agent["startupProbe"]["httpGet"]["port"], 15021);
        // Istio's injector, should it run later, leaves the pod alone.
        assert_eq!(
            patched["metadata"]["labels"]["sidecar.istio.io/inject"],
            "false"
        );
        assert_eq!(
            patched["metadata"]["annotations"]["sidecar.istio.io/inject"],
            "false"
        );
        // The CA client's token and root, where the agent looks by default.
        let volumes = &patched["spec"]["volumes"];
        let token = volumes
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "pasa-istio-token")
            .unwrap();
        assert_eq!(
            token["projected"]["sources"][0]["serviceAccountToken"]["audience"],
            "istio-ca"
        );
        let mounts: Vec<&str> = agent["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["mountPath"].as_str().unwrap())
            .collect();
        assert!(mounts.contains(&"/var/run/secrets/tokens"));
        assert!(mounts.contains(&"/var/run/secrets/istio"));

        let (again, result, _) = inject(&injector, &patched);
        assert_eq!(result, "already_injected");
        assert_eq!(again, patched);
    }
}

#[test]
fn resources_come_from_annotations() {
    let injector = injector();
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "annotations": {"pasa.io/enabled": "true",
            "pasa.io/proxyCPU": "50m", "pasa.io/proxyMemoryLimit": "256Mi",
            "pasa.io/proxyMemory": "lots"}},
        "spec": {"containers": [{"name": "app", "image": "app"}]}});
    let (patched, _, warnings) = inject(&injector, &pod);
    let agent = container(&patched, "initContainers", AGENT_CONTAINER);
    assert_eq!(
        agent["resources"],
        json!({"requests": {"cpu": "50m"}, "limits": {"memory": "256Mi"}})
    );
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].contains("pasa.io/proxyMemory"), "{warnings:?}");
}

#[test]
fn pods_pasa_cannot_take_stay_with_istiod_with_a_warning() {
    let injector = injector();
    // The istio mode asked for, but Istio's injector has not run.
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "annotations": {"pasa.io/enabled": "true", "pasa.io/mode": "istio"}},
        "spec": {"containers": [{"name": "app", "image": "app"}]}});
    let (patched, result, warnings) = inject(&injector, &pod);
    assert_eq!((result, &patched), ("cannot_inject", &pod));
    assert!(warnings[0].contains("istio-proxy"), "{warnings:?}");
    // A ProxyConfig annotation that is not an object.
    let mut with_istio = istio_injected(pod);
    with_istio["metadata"]["annotations"]["proxy.istio.io/config"] = json!("[1, 2]");
    let (_, result, warnings) = inject(&injector, &with_istio);
    assert_eq!(result, "cannot_inject");
    assert!(
        warnings[0].contains("proxy.istio.io/config"),
        "{warnings:?}"
    );
    // Not a pod, or not a creation: allowed untouched.
    let mut update = request(&with_istio);
    update.operation = kube::core::admission::Operation::Update;
    let answer = injector.review(&update);
    assert!(answer.verdict.allowed && answer.verdict.patch.is_none());
}

/// Every injected Bookinfo pod, in both modes, is a valid Pod for Kubernetes 1.37
/// (`kubernetes-validate --strict`: unknown fields are errors), as the deploy/ manifests are.
#[test]
fn injected_pods_match_the_kubernetes_schema() {
    const FIX: &str = "python3 -m pip install -r deploy/requirements.txt";
    if let Err(e) = std::process::Command::new("kubernetes-validate")
        .arg("--version")
        .output()
    {
        assert!(
            std::env::var_os("PASA_E2E_REQUIRED").is_none(),
            "kubernetes-validate is not installed ({e}); run `{FIX}`"
        );
        eprintln!("SKIPPED: injected pods not validated: kubernetes-validate ({e}); run `{FIX}`");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for store_tls in [false, true] {
        let injector = injector_with(InjectConfig {
            store_tls,
            ..Default::default()
        });
        for (name, pod) in bookinfo_pods() {
            for (mode, pod) in [("istio", istio_injected(pod.clone())), ("standalone", pod)] {
                let (mut patched, _, _) = inject(&injector, &pod);
                patched["metadata"]["name"] = json!(format!("{name}-x"));
                let file = dir.path().join(format!("{name}-{mode}-{store_tls}.json"));
                std::fs::write(&file, patched.to_string()).unwrap();
                files.push(file);
            }
        }
    }
    let out = std::process::Command::new("kubernetes-validate")
        .args(["--strict", "--quiet", "--kubernetes-version", "1.37.0"])
        .args(&files)
        .output()
        .expect("running kubernetes-validate");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && !said.contains("Couldn't find schema"),
        "injected pods are not valid Pods:\n{said}"
    );
    println!("{} injected Bookinfo pods valid", files.len());
}

/// Standalone, kubelet's probes of the app go to the agent's status port, the originals to the
/// agent, in the form the agent reads (checked with its own parser, then run against an app).
#[tokio::test]
async fn app_probes_move_to_the_agent_in_standalone_mode() {
    // The app: answers 200 on every path.
    let app = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let app_port = app.local_addr().unwrap().port();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut conn, _)) = app.accept().await {
            let mut buf = [0u8; 1024];
            let _ = conn.read(&mut buf).await;
            let _ = conn
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                .await;
        }
    });
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "web", "annotations": {"pasa.io/enabled": "true"}},
    "spec": {"containers": [
        {"name": "web", "image": "web", "ports": [{"name": "http", "containerPort": app_port}],
         "readinessProbe": {"httpGet": {"path": "/ready", "port": "http",
             "httpHeaders": [{"name": "X-Probe", "value": "1"}]}, "periodSeconds": 3, "timeoutSeconds": 2},
         "livenessProbe": {"tcpSocket": {"port": app_port}, "failureThreshold": 5},
         "startupProbe": {"httpGet": {"path": "/", "port": 8443, "scheme": "HTTPS"}}},
        {"name": "side", "image": "side",
         "livenessProbe": {"exec": {"command": ["true"]}},
         "readinessProbe": {"grpc": {"port": 9000}}},
    ]}});
    let (patched, result, warnings) = inject(&injector(), &pod);
    assert_eq!(result, "injected_standalone");
    let web = &patched["spec"]["containers"][0];
    assert_eq!(
        web["readinessProbe"],
        json!({"httpGet": {"path": "/app-health/web/readyz", "port": 15020, "scheme": "HTTP"},
               "periodSeconds": 3, "timeoutSeconds": 2})
    );
    assert_eq!(
        web["livenessProbe"],
        json!({"httpGet": {"path": "/app-health/web/livez", "port": 15020, "scheme": "HTTP"},
               "failureThreshold": 5})
    );
    // Left to kubelet, with a word: HTTPS and gRPC; exec needs nothing.
    assert_eq!(
        web["startupProbe"],
        pod["spec"]["containers"][0]["startupProbe"]
    );
    assert_eq!(
        patched["spec"]["containers"][1],
        pod["spec"]["containers"][1]
    );
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings[0].contains("HTTPS") && warnings[1].contains("gRPC"),
        "{warnings:?}"
    );

    let agent = container(&patched, "initContainers", AGENT_CONTAINER);
    let env = env(agent);
    assert_eq!(env["PASA_STATUS_LISTEN"]["value"], "0.0.0.0:15020");
    let probers = env["PASA_APP_PROBERS"]["value"].as_str().unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(probers).unwrap(),
        json!({
            "/app-health/web/readyz": {"httpGet": {"path": "/ready", "port": app_port,
                "httpHeaders": [{"name": "X-Probe", "value": "1"}]}, "timeoutSeconds": 2},
            "/app-health/web/livez": {"tcpSocket": {"port": app_port}},
        })
    );
    // The agent reads them, and runs them against the app.
    let agent_probers =
        pasa_agent::probes::AppProbers::parse(probers, "127.0.0.1".parse().unwrap()).unwrap();
    assert_eq!(
        agent_probers.run("/app-health/web/readyz").await,
        Some(Ok(()))
    );
    assert_eq!(
        agent_probers.run("/app-health/web/livez").await,
        Some(Ok(()))
    );

    // Opted out: the probes stay.
    let mut kept = pod.clone();
    kept["metadata"]["annotations"]["pasa.io/rewriteAppProbers"] = json!("false");
    let (patched, _, _) = inject(&injector(), &kept);
    assert_eq!(patched["spec"]["containers"], kept["spec"]["containers"]);
}

/// A stored resource of `kind` in `namespace`, created at `revision`.
fn stored(
    kind: &str,
    namespace: &str,
    name: &str,
    revision: u64,
    spec: Value,
) -> pasa_proto::store::v1::Resource {
    pasa_proto::store::v1::Resource {
        kind: kind.into(),
        namespace: namespace.into(),
        name: name.into(),
        spec_json: spec.to_string(),
        create_revision: revision,
        ..Default::default()
    }
}

fn agent_settings(pod: &Value) -> Value {
    let agent = container(pod, "initContainers", AGENT_CONTAINER);
    let text = env(agent)["PROXY_CONFIG"]["value"]
        .as_str()
        .unwrap()
        .to_string();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn proxy_settings_reach_the_agent_as_istios_injection_gives_them() {
    let resources = [
        stored(
            "MeshConfig",
            "istio-system",
            "mesh",
            1,
            json!({"defaultConfig": {
            "tracing": {"sampling": 5}, "proxyMetadata": {"ISTIO_META_FROM_MESH": "m"}}}),
        ),
        stored(
            "ProxyConfig",
            "istio-system",
            "mesh-wide",
            2,
            json!({"concurrency": 1}),
        ),
        stored(
            "ProxyConfig",
            "bookinfo",
            "namespace",
            3,
            json!({"environmentVariables": {"ISTIO_META_CLUSTER_ID": "east"}}),
        ),
        stored(
            "ProxyConfig",
            "bookinfo",
            "ratings-newer",
            5,
            json!({"selector": {"matchLabels": {"app": "ratings"}}, "concurrency": 6}),
        ),
        stored(
            "ProxyConfig",
            "bookinfo",
            "ratings",
            4,
            json!({"selector": {"matchLabels": {"app": "ratings"}}, "concurrency": 4}),
        ),
    ];
    let settings =
        pasa_pcp::webhook::inject::StoredSettings::from_resources(&resources, "istio-system");
    let pod = |app: &str, annotation: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": format!("{app}-"), "labels": {"app": app},
                "annotations": {"pasa.io/enabled": "true", "proxy.istio.io/config": annotation}},
            "spec": {"containers": [{"name": app, "image": "example/app"}]}})
    };
    let injected = |pod: &Value| {
        let answer = injector().review_with(&request(pod), &settings);
        assert_eq!(
            answer.result, "injected_standalone",
            "{:?}",
            answer.verdict.warnings
        );
        let mut patched = pod.clone();
        let ops: json_patch::Patch =
            serde_json::from_slice(answer.verdict.patch.as_deref().unwrap()).unwrap();
        json_patch::patch(&mut patched, &ops).unwrap();
        patched
    };

    // Standalone: the mesh's defaults, the root namespace's and the namespace's ProxyConfigs,
    // the annotation, and the oldest ProxyConfig selecting the pod, in that order.
    let ratings = injected(&pod(
        "ratings",
        "terminationDrainDuration: 20s\nconcurrency: 2\n",
    ));
    let got = agent_settings(&ratings);
    assert_eq!(got["concurrency"], 4, "{got}");
    assert_eq!(got["terminationDrainDuration"], "20s");
    assert_eq!(got["tracing"], json!({"sampling": 5}));
    assert_eq!(
        got["proxyMetadata"],
        json!({"ISTIO_META_FROM_MESH": "m", "ISTIO_META_CLUSTER_ID": "east"})
    );
    assert_eq!(
        got["drainDuration"], "45s",
        "Istio's defaults under all: {got}"
    );
    let agent = container(&ratings, "initContainers", AGENT_CONTAINER);
    let vars = env(agent);
    // proxyMetadata as the agent's environment, over the injector's own value.
    assert_eq!(vars["ISTIO_META_CLUSTER_ID"]["value"], "east");
    assert_eq!(vars["ISTIO_META_FROM_MESH"]["value"], "m");
    let names: Vec<&str> = agent["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert_eq!(
        names
            .iter()
            .filter(|n| **n == "ISTIO_META_CLUSTER_ID")
            .count(),
        1,
        "one variable of a name: {names:?}"
    );
    assert_eq!(
        vars["ISTIO_CPU_LIMIT"]["valueFrom"]["resourceFieldRef"]["resource"],
        "limits.cpu"
    );
    // No ProxyConfig selects productpage: its annotation's concurrency wins over the root's.
    let productpage = agent_settings(&injected(&pod("productpage", "concurrency: 2")));
    assert_eq!(productpage["concurrency"], 2);
    let details = agent_settings(&injected(&pod("details", "")));
    assert_eq!(details["concurrency"], 1);

    // An annotation that is no ProxyConfig keeps the pod with istiod, saying why.
    let answer = injector().review_with(&request(&pod("ratings", "[1, 2]")), &settings);
    assert_eq!(answer.result, "cannot_inject");
    assert!(
        answer.verdict.warnings.as_ref().unwrap()[0]
            .contains("metadata.annotations[proxy.istio.io/config]"),
        "{:?}",
        answer.verdict.warnings
    );

    // Next to Istio: what Istio's injection gave istio-proxy, under the pod's annotation; the
    // store's settings are Istio's injector's business there.
    let mut next = istio_injected(pod("ratings", "tracing:\n  sampling: 50\n"));
    next["spec"]["initContainers"][1]["env"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "PROXY_CONFIG", "value": r#"{"concurrency":2,"tracing":{"sampling":1},"proxyMetadata":{"A":"1"}}"#}));
    next["metadata"]["annotations"]["proxy.istio.io/config"] = json!("tracing:\n  sampling: 50\n");
    let answer = injector().review_with(&request(&next), &settings);
    assert_eq!(answer.result, "injected_next_to_istio");
    let mut patched = next.clone();
    let ops: json_patch::Patch =
        serde_json::from_slice(answer.verdict.patch.as_deref().unwrap()).unwrap();
    json_patch::patch(&mut patched, &ops).unwrap();
    assert_eq!(
        agent_settings(&patched),
        json!({"concurrency": 2, "tracing": {"sampling": 50}, "proxyMetadata": {"A": "1"}})
    );
}

#[test]
fn proxyless_grpc_pods_move_to_pasa_as_other_pods_do() {
    // Servers and clients alike: PASA serves gRPC xDS servers' inbound listeners too.
    let mut pod = istio_injected(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "echo-", "labels": {"app": "echo"},
            "annotations": {"pasa.io/enabled": "true",
                "inject.istio.io/templates": "grpc-agent"}},
        "spec": {"containers": [{"name": "echo", "image": "example/echo"}]}}));
    let (_, result, warnings) = inject(&injector(), &pod);
    assert_eq!(result, "injected_next_to_istio");
    assert!(warnings.is_empty(), "{warnings:?}");
    pod["metadata"]["annotations"]["inject.istio.io/templates"] = json!("sidecar");
    assert_eq!(inject(&injector(), &pod).1, "injected_next_to_istio");
}

/// The network and cluster an injected pod is placed in, as Istio's injection places it: the
/// agent gets PCP's `--cluster-id` as `ISTIO_META_CLUSTER_ID` and the pod's network as
/// `ISTIO_META_NETWORK`, and the pod is labelled `topology.istio.io/network` with it. The
/// network is the pod's own label when it has one (which is kept), else `--network`; with
/// neither there is no network to name.
#[test]
fn injected_pods_are_placed_in_the_network_and_cluster_as_istio_places_them() {
    let app = |labels: Value| {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "app-", "labels": labels,
                "annotations": {"pasa.io/enabled": "true"}},
            "spec": {"containers": [{"name": "app", "image": "example/app"}]}})
    };
    let injector = |network: &str| {
        injector_with(InjectConfig {
            cluster_id: "east".into(),
            network: network.into(),
            ..Default::default()
        })
    };
    // (--network, the pod's labels, the network it ends up in).
    let cases = [
        ("net-east", json!({"app": "a"}), Some("net-east")),
        (
            "net-east",
            json!({"app": "a", "topology.istio.io/network": "net-own"}),
            Some("net-own"),
        ),
        (
            "",
            json!({"topology.istio.io/network": "net-own"}),
            Some("net-own"),
        ),
        ("", json!({"app": "a"}), None),
        // An empty label wins over the flag, and names no network (as istiod has it).
        ("net-east", json!({"topology.istio.io/network": ""}), None),
    ];
    for (flag, labels, expected) in cases {
        let standalone = app(labels.clone());
        for (mode, pod, result) in [
            ("standalone", standalone.clone(), "injected_standalone"),
            (
                "next to Istio",
                istio_injected(standalone),
                "injected_next_to_istio",
            ),
        ] {
            let what = format!("{mode}, --network {flag:?}, labels {labels}");
            let (patched, got, _) = inject(&injector(flag), &pod);
            assert_eq!(got, result, "{what}");
            let agent = container(&patched, "initContainers", AGENT_CONTAINER);
            let env = env(agent);
            assert_eq!(env["ISTIO_META_CLUSTER_ID"]["value"], "east", "{what}");
            assert_eq!(
                env.get("ISTIO_META_NETWORK").map(|e| &e["value"]),
                expected.map(|n| json!(n)).as_ref(),
                "{what}"
            );
            let label = &patched["metadata"]["labels"]["topology.istio.io/network"];
            match expected {
                Some(network) => assert_eq!(label, network, "{what}"),
                // An empty label stays as the pod had it; none is added.
                None => assert_eq!(label, &labels["topology.istio.io/network"], "{what}"),
            }
            // The pod's other labels are kept.
            assert_eq!(
                patched["metadata"]["labels"]["app"], labels["app"],
                "{what}"
            );
        }
    }
}
