//! The admission webhook of a real `pasa-pcp`, over real HTTPS on loopback, with a client that
//! verifies the server certificate: AdmissionReview v1 and v1beta1 documents (fixtures written
//! from the Kubernetes API reference), CREATE / UPDATE / DELETE, unknown kinds, dry runs, no
//! side effects (nothing reviewed is written: the syncer writes what the API server stored), and
//! the HTTP-level errors. And large input, through the webhook and the gRPC API alike: checked off
//! the async workers (health and SIGTERM answered meanwhile), and refused past its size limits.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use common::Pcp;
use common::webhook_client::{Client, ca_of, env_values, patch_of};
use hyper::StatusCode;
use serde_json::Value;

fn fixture_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/admission")
        .join(name)
}

fn fixture(name: &str) -> Vec<u8> {
    let path = fixture_path(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// An HTTPS client that trusts only the CA in `ca`.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_over_verified_https() {
    let data = tempfile::tempdir().unwrap();
    let pcp = Pcp::start_with(data.path(), &["--webhook-listen", "127.0.0.1:0"]);
    let addr = pcp.webhook.expect("webhook ready line");
    assert!(
        pcp.ready_lines[0].contains("development CA certificate in"),
        "{:?}",
        pcp.ready_lines
    );
    let client = Client::new(addr, &ca_of(data.path()));

    // A client that does not trust this CA cannot talk to the webhook.
    let other = tempfile::tempdir().unwrap();
    pasa_pcp::webhook::tls::generate(other.path(), addr).unwrap();
    let stranger = Client::new(addr, &other.path().join("ca.crt"));
    let refused = stranger
        .post(
            Some("application/json"),
            fixture("create-virtualservice-v1.json"),
        )
        .await;
    assert!(
        refused.as_ref().is_err_and(|e| e.contains("TLS handshake")),
        "{refused:?}"
    );

    // CREATE, v1: allowed, answered in v1 with the request's uid; not written (no side effects).
    let r = client
        .review(fixture("create-virtualservice-v1.json"))
        .await;
    assert_eq!(r["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(r["kind"], "AdmissionReview");
    assert_eq!(r["response"]["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
    assert_eq!(r["response"]["allowed"], true, "{r}");
    let out = pcp.ctl(&["get", "vs", "reviews", "-n", "bookinfo"]);
    assert!(!out.status.success(), "the webhook writes nothing");
    // Routes to subsets no DestinationRule defines: warned, like istioctl analyze.
    let warnings = r["response"]["warnings"].to_string();
    assert!(warnings.contains("subset"), "{r}");

    // UPDATE, v1beta1, invalid: denied with the field path, answered in v1beta1.
    let r = client
        .review(fixture("update-destinationrule-invalid-v1beta1.json"))
        .await;
    assert_eq!(r["apiVersion"], "admission.k8s.io/v1beta1");
    assert_eq!(r["response"]["uid"], "b1c2d3e4-0000-4000-8000-000000000001");
    assert_eq!(r["response"]["allowed"], false);
    let message = r["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("spec.trafficPolicy.loadBalancer.simple"),
        "{message}"
    );
    assert_eq!(r["response"]["status"]["code"], 400);
    let out = pcp.ctl(&["get", "dr", "reviews", "-n", "bookinfo"]);
    assert!(!out.status.success(), "a denied object is not written");

    // A kind of the group that PASA does not know is rejected.
    let r = client.review(fixture("create-unknown-kind-v1.json")).await;
    assert_eq!(r["response"]["allowed"], false);
    assert!(
        r["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("unrecognized type"),
        "{r}"
    );

    // A security kind is reviewed like the networking ones: the field at fault is named.
    let r = client
        .review(fixture("create-peerauthentication-invalid-v1.json"))
        .await;
    assert_eq!(r["response"]["allowed"], false, "{r}");
    let message = r["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("spec.portLevelMtls") && message.contains("cannot have port level mTLS"),
        "{message}"
    );

    // A dry run is validated and allowed, but not written.
    let r = client
        .review(fixture("create-gateway-dry-run-v1.json"))
        .await;
    assert_eq!(r["response"]["allowed"], true, "{r}");
    let out = pcp.ctl(&["get", "gw", "bookinfo-gateway", "-n", "bookinfo"]);
    assert!(!out.status.success(), "a dry run is not written");

    // DELETE is allowed; what is stored stays until the syncer sees the deletion.
    pcp.ok(&[
        "apply",
        "-f",
        fixture_path("stored-virtualservice.yaml").to_str().unwrap(),
    ]);
    let r = client
        .review(fixture("delete-virtualservice-v1.json"))
        .await;
    assert_eq!(r["response"]["allowed"], true, "{r}");
    let out = pcp.ctl(&["get", "vs", "reviews", "-n", "bookinfo"]);
    assert!(out.status.success(), "the webhook deletes nothing");

    // HTTP-level errors.
    let body = fixture("create-virtualservice-v1.json");
    let (status, _) = client.post(Some("text/plain"), body.clone()).await.unwrap();
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let (status, _) = client.post(None, body).await.unwrap();
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let (status, _) = client
        .post(Some("application/json"), Vec::new())
        .await
        .unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let r = client.review(b"{\"apiVersion\": \"admission.k8s.io/v1\", \"kind\": \"AdmissionReview\", \"request\": {\"uid\": 7".to_vec()).await;
    assert_eq!(r["response"]["allowed"], false);
    assert!(
        r["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("not an AdmissionReview"),
        "{r}"
    );

    // /inject: a pod opted in gets a JSON Patch; one that is not is allowed untouched.
    let pod_review = |annotations: Value| {
        serde_json::to_vec(&serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "pod-1", "operation": "CREATE", "namespace": "bookinfo",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "object": {"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"generateName": "reviews-v1-", "annotations": annotations},
                    "spec": {"containers": [{"name": "reviews", "image": "reviews"}]}}},
        }))
        .unwrap()
    };
    let r = client
        .review_at(
            "/inject",
            pod_review(serde_json::json!({"pasa.io/enabled": "true"})),
        )
        .await;
    assert_eq!(r["response"]["uid"], "pod-1");
    assert_eq!(r["response"]["allowed"], true, "{r}");
    assert_eq!(r["response"]["patchType"], "JSONPatch", "{r}");
    let patch = patch_of(&r);
    assert!(
        patch.to_string().contains("\"name\":\"pasa-agent\""),
        "{patch}"
    );
    let r = client
        .review_at("/inject", pod_review(serde_json::json!({})))
        .await;
    assert_eq!(r["response"]["allowed"], true, "{r}");
    assert!(r["response"].get("patch").is_none(), "{r}");

    // Istio's injection path for a remote cluster's pods (its webhook configuration calls
    // /inject/cluster/<id>/net/<network>): their proxies get that cluster and network; a key
    // PASA does not take is warned of; a pod that is not annotated is not moved (PCP does not
    // know the remote namespace's labels), and the answer says so.
    let r = client
        .review_at(
            "/inject/cluster/east/net/n-east/dns/on",
            pod_review(serde_json::json!({"pasa.io/enabled": "true"})),
        )
        .await;
    assert_eq!(r["response"]["patchType"], "JSONPatch", "{r}");
    let patch = patch_of(&r);
    assert_eq!(
        env_values(&patch, "ISTIO_META_CLUSTER_ID"),
        ["east"],
        "{patch}"
    );
    assert_eq!(
        env_values(&patch, "ISTIO_META_NETWORK"),
        ["n-east"],
        "{patch}"
    );
    assert!(
        patch.as_array().unwrap().iter().any(|op| {
            op["path"] == "/metadata/labels/topology.istio.io~1network" && op["value"] == "n-east"
        }),
        "{patch}"
    );
    assert!(
        r["response"]["warnings"].to_string().contains("dns=on"),
        "{r}"
    );
    let r = client
        .review_at(
            "/inject/cluster/east/net/n-east",
            pod_review(serde_json::json!({})),
        )
        .await;
    assert!(r["response"].get("patch").is_none(), "{r}");
    assert!(
        r["response"]["warnings"]
            .to_string()
            .contains("namespace bookinfo in cluster east"),
        "{r}"
    );

    // A CUSTOM AuthorizationPolicy that selects the pod keeps it with istiod while no mesh config
    // in the store defines its provider, with a warning naming it; one for other pods does not.
    let policy = data.path().join("policy.yaml");
    let policy_for = |app: &str| {
        std::fs::write(
            &policy,
            format!(
                "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  \
                 name: only-{app}\n  namespace: bookinfo\nspec:\n  selector:\n    \
                 matchLabels: {{app: {app}}}\n  action: CUSTOM\n  provider: {{name: opa}}\n  \
                 rules:\n  - to:\n    - operation:\n        paths: [/admin]\n"
            ),
        )
        .unwrap();
        pcp.ok(&["apply", "-f", policy.to_str().unwrap()]);
    };
    let labelled_pod = serde_json::to_vec(&serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "pod-2", "operation": "CREATE", "namespace": "bookinfo",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "object": {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"generateName": "reviews-v1-", "labels": {"app": "reviews"},
                             "annotations": {"pasa.io/enabled": "true"}},
                "spec": {"containers": [{"name": "reviews", "image": "reviews"}]}}},
    }))
    .unwrap();
    policy_for("ratings");
    let r = client.review_at("/inject", labelled_pod.clone()).await;
    assert_eq!(r["response"]["patchType"], "JSONPatch", "{r}");
    policy_for("reviews");
    let r = client.review_at("/inject", labelled_pod.clone()).await;
    assert_eq!(r["response"]["allowed"], true, "{r}");
    assert!(r["response"].get("patch").is_none(), "{r}");
    let warnings = r["response"]["warnings"].to_string();
    assert!(
        warnings.contains("AuthorizationPolicy bookinfo/only-reviews")
            && warnings.contains("stays with istiod"),
        "{r}"
    );
    // Once the mesh config defines the provider, the agent enforces the policy: the pod moves.
    let mesh = data.path().join("mesh.yaml");
    std::fs::write(
        &mesh,
        "apiVersion: pasa.io/v1alpha1\nkind: MeshConfig\nmetadata:\n  name: mesh\n  \
         namespace: istio-system\nspec:\n  extensionProviders:\n  - name: opa\n    \
         envoyExtAuthzGrpc: {service: opa.opa.svc.cluster.local, port: 9191}\n",
    )
    .unwrap();
    pcp.ok(&["apply", "-f", mesh.to_str().unwrap()]);
    // ... with the settings a stored ProxyConfig gives it, as Istio's injection would.
    let proxy_config = data.path().join("proxy-config.yaml");
    std::fs::write(
        &proxy_config,
        "apiVersion: networking.istio.io/v1beta1\nkind: ProxyConfig\nmetadata:\n  \
         name: reviews\n  namespace: bookinfo\nspec:\n  selector:\n    \
         matchLabels: {app: reviews}\n  concurrency: 3\n",
    )
    .unwrap();
    pcp.ok(&["apply", "-f", proxy_config.to_str().unwrap()]);
    let r = client.review_at("/inject", labelled_pod).await;
    assert_eq!(r["response"]["patchType"], "JSONPatch", "{r}");
    let patch = patch_of(&r);
    let settings = patch
        .as_array()
        .unwrap()
        .iter()
        .find(|op| op["value"]["name"] == "pasa-agent")
        .and_then(|op| {
            op["value"]["env"]
                .as_array()?
                .iter()
                .find(|e| e["name"] == "PROXY_CONFIG")
        })
        .and_then(|e| serde_json::from_str::<Value>(e["value"].as_str()?).ok())
        .unwrap_or_else(|| panic!("no PROXY_CONFIG for the agent in {patch}"));
    assert_eq!(settings["concurrency"], 3, "{settings}");

    // What the webhook did is on the admin endpoint.
    let metrics = pcp.metrics();
    for line in [
        "pasa_pcp_webhook_requests_total{answer=\"Allowed\"} 10",
        "pasa_pcp_webhook_requests_total{answer=\"Denied\"} 4",
        "pasa_pcp_webhook_requests_total{answer=\"BadRequest\"} 3",
        "pasa_pcp_documents_total{origin=\"Webhook\",verdict=\"Rejected\"} 2",
        "pasa_pcp_injections_total{result=\"injected_standalone\"} 4",
        "pasa_pcp_injections_total{result=\"unenforced_policy\"} 1",
        "pasa_pcp_injections_total{result=\"not_selected\"} 2",
    ] {
        assert!(metrics.contains(line), "missing {line:?} in\n{metrics}");
    }

    // After a restart the development CA is the same: the client that trusted it still connects.
    pcp.terminate();
    let pcp = Pcp::start_with(data.path(), &["--webhook-listen", "127.0.0.1:0"]);
    let client = Client::new(pcp.webhook.expect("webhook"), &ca_of(data.path()));
    let r = client
        .review(fixture("create-gateway-dry-run-v1.json"))
        .await;
    assert_eq!(r["response"]["allowed"], true, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_with_a_given_certificate_and_no_store_writes() {
    let certs = tempfile::tempdir().unwrap();
    pasa_pcp::webhook::tls::generate(certs.path(), "127.0.0.1:0".parse().unwrap()).unwrap();
    let data = tempfile::tempdir().unwrap();
    let cert = certs.path().join("tls.crt");
    let key = certs.path().join("tls.key");
    let pcp = Pcp::start_with(
        data.path(),
        &[
            "--webhook-listen",
            "127.0.0.1:0",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    assert!(!pcp.ready_lines[0].contains("development CA"));
    let client = Client::new(pcp.webhook.unwrap(), &certs.path().join("ca.crt"));
    let r = client
        .review(fixture("create-virtualservice-v1.json"))
        .await;
    assert_eq!(r["response"]["allowed"], true, "{r}");
    let out = pcp.ctl(&["get", "vs", "reviews", "-n", "bookinfo"]);
    assert!(!out.status.success(), "the webhook writes nothing");
}

#[test]
fn webhook_flags_are_checked() {
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_pasa-pcp"))
            .args(args)
            .output()
            .expect("run pasa-pcp")
    };
    let out = run(&["--tls-cert", "a.crt", "--tls-key", "a.key"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--webhook-listen"));
    let out = run(&["--webhook-listen", "127.0.0.1:0", "--tls-cert", "a.crt"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tls-key"));
    let out = run(&["--store", "127.0.0.1:1", "--data-dir", "x"]);
    assert_eq!(out.status.code(), Some(2));
    let data = tempfile::tempdir().unwrap();
    let out = run(&[
        "--data-dir",
        data.path().to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--webhook-listen",
        "127.0.0.1:0",
        "--tls-cert",
        "/nonexistent/tls.crt",
        "--tls-key",
        "/nonexistent/tls.key",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/nonexistent/tls.crt"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A VirtualService of `hosts` distinct hosts, about 20 bytes of JSON each: the shape whose
/// duplicate-host check once compared every pair.
fn wide_virtual_service(name: &str, hosts: usize) -> pasa_proto::store::v1::ApplyDocument {
    let hosts: Vec<String> = (0..hosts).map(|i| format!("h{i}.example.com")).collect();
    let doc = serde_json::json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"hosts": hosts, "http": [{"route": [{"destination": {"host": "a"}}]}]}});
    pasa_proto::store::v1::ApplyDocument {
        json: doc.to_string(),
        expected_mod_revision: None,
    }
}

/// Eight VirtualServices of 60,000 hosts (about 10 MB, each document under 1.5 MiB), checked
/// but not written.
fn large_batch() -> pasa_proto::store::v1::ApplyRequest {
    pasa_proto::store::v1::ApplyRequest {
        documents: (0..8)
            .map(|i| wide_virtual_service(&format!("wide-{i}"), 60_000))
            .collect(),
        dry_run: true,
    }
}

async fn store_client(
    pcp: &Pcp,
) -> pasa_proto::store::v1::store_client::StoreClient<tonic::transport::Channel> {
    pasa_proto::store::v1::store_client::StoreClient::connect(format!("http://{}", pcp.addr))
        .await
        .expect("connect to PCP")
}

/// Longest a `/healthz` answer may take while PCP is busy checking documents: generous, for a
/// busy 2-core machine running other tests; a stalled runtime takes minutes on these batches.
const PROMPT: std::time::Duration = std::time::Duration::from_secs(5);

/// How long `GET /healthz` took to answer 200 (at most twice [`PROMPT`]).
async fn healthz(admin: SocketAddr) -> std::time::Duration {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let started = std::time::Instant::now();
    let answer = tokio::time::timeout(2 * PROMPT, async {
        let mut conn = tokio::net::TcpStream::connect(admin)
            .await
            .expect("connect");
        conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n")
            .await
            .expect("request");
        let mut text = String::new();
        conn.read_to_string(&mut text).await.expect("response");
        text
    })
    .await;
    let took = started.elapsed();
    match answer {
        Ok(text) => assert!(text.starts_with("HTTP/1.1 200"), "{text}"),
        Err(_) => panic!("/healthz did not answer within {:?}", 2 * PROMPT),
    }
    took
}

/// Starts two large batches at once (as many as the machine has cores, here), to be checked.
fn apply_large_batches(
    pcp: &Pcp,
) -> Vec<
    tokio::task::JoinHandle<
        Result<tonic::Response<pasa_proto::store::v1::ApplyResponse>, tonic::Status>,
    >,
> {
    let addr = pcp.addr.clone();
    (0..2)
        .map(|_| {
            let addr = addr.clone();
            tokio::spawn(async move {
                let mut client = pasa_proto::store::v1::store_client::StoreClient::connect(
                    format!("http://{addr}"),
                )
                .await
                .expect("connect to PCP");
                client.apply(large_batch()).await
            })
        })
        .collect()
}

/// Validation runs on a bounded blocking pool, not on the async workers: while two large
/// batches are checked, `/healthz` still answers promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_promptly_while_large_batches_are_checked() {
    let data = tempfile::tempdir().unwrap();
    let pcp = Pcp::start(data.path());
    let applies = apply_large_batches(&pcp);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
    let mut pace = tokio::time::interval(std::time::Duration::from_millis(100));
    let (mut asked, mut slowest) = (0, std::time::Duration::ZERO);
    while applies.iter().any(|a| !a.is_finished()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the batches were not checked in time"
        );
        pace.tick().await;
        slowest = slowest.max(healthz(pcp.admin).await);
        asked += 1;
    }
    for apply in applies {
        let answer = apply.await.unwrap().expect("apply").into_inner();
        assert!(answer.errors.is_empty(), "{:?}", answer.errors);
    }
    assert!(
        asked >= 3,
        "the batches were checked before /healthz could be asked while they were"
    );
    assert!(
        slowest < PROMPT,
        "/healthz took {slowest:?} while batches were checked"
    );
}

/// SIGTERM stops PCP within its drain deadline even while large batches are being checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_pcp_in_time_while_large_batches_are_checked() {
    let data = tempfile::tempdir().unwrap();
    let pcp = Pcp::start(data.path());
    let pid = pcp.pid;
    let applies = apply_large_batches(&pcp);
    // Checking has begun once PCP has read the batches: it answers /healthz meanwhile.
    healthz(pcp.admin).await;
    healthz(pcp.admin).await;
    let (stopped, stop) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        pcp.terminate();
        let _ = stopped.send(());
    });
    let bound = pasa_runtime::drain::DRAIN_DEADLINE + std::time::Duration::from_secs(5);
    if stop.recv_timeout(bound).is_err() {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
        panic!("pasa-pcp did not stop within {bound:?} of SIGTERM");
    }
    for apply in applies {
        let _ = apply.await;
    }
}

/// A document over 1.5 MiB (what Kubernetes stores of one object), a batch over the apply
/// limit and an AdmissionReview over the webhook's are refused, each saying which limit and what
/// to do; nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_documents_batches_and_reviews_are_refused_saying_why() {
    let data = tempfile::tempdir().unwrap();
    let pcp = Pcp::start_with(data.path(), &["--webhook-listen", "127.0.0.1:0"]);
    let mut client = store_client(&pcp).await;
    let bound = std::time::Duration::from_secs(120);

    let huge = pasa_proto::store::v1::ApplyRequest {
        documents: vec![wide_virtual_service("huge", 80_000)],
        dry_run: false,
    };
    let answer = tokio::time::timeout(bound, client.apply(huge))
        .await
        .expect("a huge document is refused in time")
        .expect("apply")
        .into_inner();
    assert_eq!(answer.errors.len(), 1, "{:?}", answer.errors);
    let message = &answer.errors[0].message;
    assert!(
        message.starts_with("VirtualService default/huge is 1.")
            && message.contains("Kubernetes stores at most 1.5 MiB"),
        "{message}"
    );

    let too_many = pasa_proto::store::v1::ApplyRequest {
        documents: (0..12)
            .map(|i| wide_virtual_service(&format!("part-{i}"), 70_000))
            .collect(),
        dry_run: false,
    };
    let refused = tokio::time::timeout(bound, client.apply(too_many))
        .await
        .expect("a batch over the limit is refused in time")
        .expect_err("a batch over the limit is refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().contains("at most 16.0 MiB")
            && refused.message().contains("split it into several applies"),
        "{}",
        refused.message()
    );

    let webhook = Client::new(pcp.webhook.expect("webhook"), &ca_of(data.path()));
    let oversized = vec![b' '; pasa_pcp::webhook::MAX_BODY + 1];
    let (status, body) = webhook
        .post(Some("application/json"), oversized)
        .await
        .expect("an answer");
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert!(body.contains("larger than 8 MiB"), "{body}");

    let stored = client
        .list(pasa_proto::store::v1::ListRequest::default())
        .await
        .expect("list")
        .into_inner();
    assert!(stored.resources.is_empty(), "nothing was written");
}
