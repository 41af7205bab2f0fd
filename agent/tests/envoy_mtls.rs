//! Mutual TLS between two real sidecars: two pods (network namespaces joined by a veth pair,
//! each with Istio's capture rules), each with its own `pasa-agent` serving its own workload
//! certificate over SDS (`--cert-dir`, certificates signed by a fake of Istio's CA with SPIFFE
//! URI SANs) and its own Envoy. Over SotW and then Delta:
//!
//! - auto mTLS (no DestinationRule; the server's endpoint labelled `security.istio.io/tlsMode:
//!   istio`, as Istio's injector labels it): the client's plain request is carried over mTLS
//!   (both Envoys count the handshake) and reaches the server's app through its PERMISSIVE
//!   inbound listener;
//! - `ISTIO_MUTUAL` set by a DestinationRule pins the server to its service's SPIFFE identity:
//!   one naming another identity makes the same request fail, the service's own works;
//! - PeerAuthentication, through the store: a plaintext request from outside the mesh (the
//!   client pod's traffic that its sidecar does not capture) reaches the server under the default
//!   PERMISSIVE mode, is refused once the namespace's policy is STRICT while mesh traffic still
//!   flows, and reaches it again when a workload policy sets the port PERMISSIVE; a workload
//!   policy setting the port DISABLE makes the client's sidecar send mesh traffic there in
//!   plaintext (the endpoint no longer says mutual TLS), which the server takes;
//! - the mesh config's trust domain: the server refuses the client's identity once the mesh
//!   names another trust domain, and accepts it again as an alias;
//! - AuthorizationPolicy, through the store: a DENY rule on a path answers 403 for that path
//!   only, also when dot segments spell it (paths are normalized first, as istiod has it); an
//!   ALLOW rule naming another principal refuses the client (403), one naming the client's
//!   SPIFFE identity lets it through; a CUSTOM rule on a path asks the external
//!   authorizer the mesh config names (an HTTP authorizer in the server's pod), which refuses
//!   requests without its header and lets those with it through, while other paths are never
//!   sent to it;
//! - RequestAuthentication, through the store (keys behind a `jwksUri`, in the store as PCP
//!   fetches them; a P-256 key the test signs tokens with): a bad token is refused (401), a request without one or with a valid one passes; with
//!   an AuthorizationPolicy requiring the token's principal, only the valid token passes.
//!
//! - EnvoyFilter, through the store: a Lua filter the server's EnvoyFilter inserts before the
//!   router of its inbound HTTP chains, a virtual host the client's EnvoyFilter merges a
//!   response header into, and an extension config (served over ECDS) an HTTP filter names,
//!   each add their header to real responses; deleting them takes the headers away.
//!
//! - WasmPlugin and TrafficExtension, through the store: a WasmPlugin whose module (a proxy-Wasm
//!   module the test assembles) is a file in the server's pod, served to its Envoy over ECDS,
//!   and a Lua TrafficExtension on the client's outbound side, each add their header to real
//!   responses; the same module over HTTP is fetched by the agent and checked against its
//!   SHA-256; one whose checksum is wrong fails closed (403); the same module as an image of a
//!   private repository of a **fake** registry fails closed until the store holds its pull
//!   secret (`ImagePullSecret`), then runs; deleting them takes the headers away.
//!
//! - Telemetry, through the store: a mesh-wide Telemetry logging to a file access log provider
//!   of the mesh config makes both Envoys write a line for a real request to that file (the
//!   server's as SERVER, the client's as CLIENT), Envoy's gRPC and OpenTelemetry log services
//!   beside it accepted; deleting it stops the logging. A mesh-wide
//!   Telemetry tracing every request to the mesh config's Zipkin provider (a collector in the
//!   server's pod) makes both Envoys report their span of one trace, the client's CLIENT span
//!   and the server's SERVER span, named by their service clusters and carrying Istio's and the
//!   Telemetry's tags.
//!
//! Needs what `envoy_sidecar.rs` needs; says loudly when it skipped.

mod common;

use common::envoy::{Envoy, Netns, agent_bootstrap};
use common::registry;
use common::sidecar;
use common::store::StoreServer;
use common::traffic::{Backend, request, until};
use serde_json::{Value, json};

const CLIENT_NODE: &str = "sidecar~10.10.0.1~client-1.shop~shop.svc.cluster.local";
const SERVER_NODE: &str = "sidecar~10.10.0.2~server-1.shop~shop.svc.cluster.local";
const SERVER_VIP: &str = "10.96.7.3";
const AUTHZ_VIP: &str = "10.96.7.4";
const GREETER_VIP: &str = "10.96.7.5";
const SECURE_VIP: &str = "10.96.7.6";
const SECURE_HOST: &str = "secure.shop.example";

fn mesh() -> Vec<Value> {
    vec![
        json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
               "metadata": {"name": "server", "namespace": "shop"},
               "spec": {"addresses": [SERVER_VIP],
                        "ports": [{"name": "http", "port": 80, "targetPort": 8000}],
                        // The label Istio's injector sets: auto mTLS reaches it over mTLS.
                        "endpoints": [{"address": "10.10.0.2",
                                       "labels": {"app": "server", "security.istio.io/tlsMode": "istio"},
                                       "serviceAccount": "server"}]}}),
        // The external authorizer, in the server's pod, outside the mesh.
        json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
               "metadata": {"name": "ext-authz", "namespace": "shop"},
               "spec": {"addresses": [AUTHZ_VIP],
                        "ports": [{"name": "http", "port": 9000, "targetPort": 9000}],
                        "endpoints": [{"address": "10.10.0.2", "labels": {"app": "ext-authz"}}]}}),
        json!({"apiVersion": "pasa.io/v1alpha1", "kind": "MeshConfig",
               "metadata": {"name": "mesh", "namespace": "istio-system"},
               "spec": {"extensionProviders": [{"name": "ext-authz", "envoyExtAuthzHttp": {
                   "service": "ext-authz.shop.svc.cluster.local", "port": 9000,
                   "pathPrefix": "/authz", "includeRequestHeadersInCheck": ["x-ext-authz"]}}]}}),
        // An HTTPS service outside the mesh (on the client pod's loopback, where no sidecar
        // takes it in), reached by TLS origination.
        json!({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
               "metadata": {"name": "secure", "namespace": "shop"},
               "spec": {"hosts": [SECURE_HOST], "addresses": [SECURE_VIP],
                        "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
                        "location": "MESH_EXTERNAL", "resolution": "STATIC",
                        "endpoints": [{"address": "127.0.0.1", "ports": {"http": 9443}}]}}),
        // A gRPC service of the server's pod.
        json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
               "metadata": {"name": "greeter", "namespace": "shop"},
               "spec": {"addresses": [GREETER_VIP],
                        "ports": [{"name": "grpc", "port": 7070, "targetPort": 7070}],
                        "endpoints": [{"address": "10.10.0.2",
                                       "labels": {"app": "server", "security.istio.io/tlsMode": "istio"},
                                       "serviceAccount": "server"}]}}),
    ]
}

/// The mesh config of [`mesh`].
fn mesh_config() -> Value {
    mesh()
        .into_iter()
        .find(|r| r["kind"] == "MeshConfig")
        .expect("the mesh config")
}

/// The server's DestinationRule: ISTIO_MUTUAL, pinned to `san` when given (else to the
/// service's own identities).
fn mutual(san: Option<&str>) -> Value {
    let mut tls = json!({"mode": "ISTIO_MUTUAL"});
    if let Some(san) = san {
        tls["subjectAltNames"] = json!([san]);
    }
    json!({"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
           "metadata": {"name": "server", "namespace": "shop"},
           "spec": {"host": "server", "trafficPolicy": {"tls": tls}}})
}

/// The two pods, joined by a veth pair; the services' virtual IPs routed towards the server.
fn network() -> (Netns, Netns) {
    let (client, server) = sidecar::joined("10.10.0.1", "10.10.0.2");
    sidecar::capture(&client);
    sidecar::capture(&server);
    (client, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_between_two_sidecars() {
    if sidecar::skip_without_capture("mutual_tls_between_two_sidecars") {
        return;
    }
    let data = tempfile::tempdir().expect("temporary directory");
    let store = StoreServer::start(&data.path().join("db"), 0).await;
    store.apply(&mesh()).await;
    let ca = sidecar::ca();
    let (client_dir, server_dir) = (data.path().join("client"), data.path().join("server"));
    let client_agent = sidecar::agent_with_certificate(
        &store,
        &client_dir,
        CLIENT_NODE,
        "app=client",
        &ca,
        "client",
    );
    let server_agent = sidecar::agent_with_certificate(
        &store,
        &server_dir,
        SERVER_NODE,
        "app=server",
        &ca,
        "server",
    );

    for delta in [false, true] {
        let protocol = if delta { "Delta" } else { "SotW" };
        let (client_ns, server_ns) = network();
        let _app = Backend::start(&server_ns, "server-app", "0.0.0.0:8000", None);
        let _authz = Backend::start(&server_ns, "ext-authz", "0.0.0.0:9000", None);
        let _zipkin = Backend::start(&server_ns, "zipkin", "0.0.0.0:9411", None);
        let _greeter = Backend::grpc(&server_ns, "greeter", "0.0.0.0", 7070);
        let (secure_cert, secure_key) = secure_certificate(data.path(), &ca);
        let _secure = Backend::start(
            &client_ns,
            "secure",
            "127.0.0.1:9443",
            Some((&secure_cert, &secure_key)),
        );
        let server = Envoy::start_in(
            server_ns,
            agent_bootstrap(&server_agent, SERVER_NODE, "app=server", delta),
            Some(sidecar::PROXY_GID),
        )
        .await;
        let client = Envoy::start_in(
            client_ns,
            agent_bootstrap(&client_agent, CLIENT_NODE, "app=client", delta),
            Some(sidecar::PROXY_GID),
        )
        .await;

        let url = format!("http://{SERVER_VIP}/hello");
        let host = ["--host", "server.shop.svc.cluster.local"];
        let a = until(&client.netns, &url, &host, "the request over mTLS", |a| {
            a.status == 200
        });
        assert_eq!(
            a.backend.as_deref(),
            Some("server-app"),
            "{protocol}: {a:?}"
        );
        // Cluster stats go by the cluster's name and `;`, as istiod names them.
        let cluster = "cluster.outbound|80||server.shop.svc.cluster.local;";
        let client_stats = client.stats().await;
        let server_stats = server.stats().await;
        let handshakes = |stats: &std::collections::BTreeMap<String, u64>, key: &str| {
            stats.get(key).copied().unwrap_or(0)
        };
        assert!(
            handshakes(&client_stats, &format!("{cluster}.ssl.handshake")) >= 1,
            "{protocol}: the client's Envoy made no TLS handshake: {:?}",
            client_stats
                .iter()
                .filter(|(k, _)| k.contains("ssl"))
                .collect::<Vec<_>>()
        );
        assert!(
            handshakes(&server_stats, "listener.0.0.0.0_15006.ssl.handshake") >= 1,
            "{protocol}: the server's inbound listener made no TLS handshake: {:?}",
            server_stats
                .iter()
                .filter(|(k, _)| k.contains("ssl"))
                .collect::<Vec<_>>()
        );
        // The server's Envoy tells the app who called: the client's own SPIFFE identity.
        let xfcc = a
            .echoed
            .get("x-forwarded-client-cert")
            .cloned()
            .unwrap_or_default();
        assert!(
            xfcc.contains("URI=spiffe://cluster.local/ns/shop/sa/client"),
            "{protocol}: X-Forwarded-Client-Cert names the client: {xfcc:?}"
        );
        println!("{protocol}: auto mTLS carried the client's plain request to the server's app");

        // The server must be who its service says: another identity is refused.
        store
            .apply(&[mutual(Some(
                "spiffe://cluster.local/ns/shop/sa/someone-else",
            ))])
            .await;
        let a = until(
            &client.netns,
            &url,
            &host,
            "the pinned identity refused",
            |a| a.status == 503,
        );
        assert_ne!(
            a.backend.as_deref(),
            Some("server-app"),
            "{protocol}: {a:?}"
        );
        let client_stats = client.stats().await;
        assert!(
            handshakes(&client_stats, &format!("{cluster}.ssl.fail_verify_san")) >= 1,
            "{protocol}: refused for its SAN: {:?}",
            client_stats
                .iter()
                .filter(|(k, _)| k.contains("ssl"))
                .collect::<Vec<_>>()
        );
        store.apply(&[mutual(None)]).await;
        let a = until(
            &client.netns,
            &url,
            &host,
            "the service's identity again",
            |a| a.status == 200,
        );
        assert_eq!(
            a.backend.as_deref(),
            Some("server-app"),
            "{protocol}: {a:?}"
        );
        println!("{protocol}: the server's SPIFFE identity is checked");

        let plain = request(&client.netns, &url, &host);
        assert_eq!(plain.status, 200, "{protocol}: {plain:?}");

        grpc_between_sidecars(&client.netns, protocol).await;
        tls_origination(&store, &client.netns, data.path(), protocol).await;

        peer_authentication(&store, &client.netns, protocol).await;
        trust_domains(&store, &client.netns, protocol).await;
        authorization_policy(&store, &client.netns, protocol).await;
        request_authentication(&store, &client.netns, protocol).await;
        envoy_filter(&store, &client.netns, protocol).await;
        traffic_extensions(&store, &client.netns, data.path(), protocol).await;
        access_logging(&store, &client, &data.path().join("access"), protocol).await;
        tracing(&store, &client.netns, protocol).await;

        for (who, envoy) in [("client", &client), ("server", &server)] {
            let rejected = envoy.rejected().await;
            assert!(
                rejected.is_empty(),
                "{protocol}: the {who}'s Envoy rejected updates: {rejected:?}\n{}",
                envoy.rejection_log().join("\n")
            );
        }
    }
    client_agent.terminate();
    server_agent.terminate();
    store.stop().await;
}

/// A namespace's PeerAuthentication named `default`, in `mode`.
/// A plain gRPC call from the client's app to the server's, through both sidecars: HTTP/2 all
/// the way (the client's cluster offers `h2` in its mutual TLS, the server's inbound connection
/// manager and cluster speak HTTP/2), so the gRPC app answers.
async fn grpc_between_sidecars(client: &Netns, protocol: &str) {
    let target = format!("{GREETER_VIP}:7070");
    let mut calls: Vec<Value> = Vec::new();
    for _ in 0..50 {
        let out = client
            .command("python3")
            .arg(common::traffic::e2e("grpc_call.py"))
            .args([target.as_str(), "greeter.shop.svc.cluster.local:7070", "5"])
            .output()
            .expect("run the gRPC client");
        calls = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if calls.len() == 5 && calls.iter().all(|c| c["backend"] == "greeter") {
            println!("{protocol}: gRPC between the sidecars, HTTP/2 end to end");
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("{protocol}: gRPC between the sidecars: {calls:?}");
}

/// The HTTPS backend's certificate for [`SECURE_HOST`], signed by the test's CA: (certificate,
/// key) files under `dir`.
fn secure_certificate(
    dir: &std::path::Path,
    ca: &rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let key = rcgen::KeyPair::generate().expect("a key");
    let cert = rcgen::CertificateParams::new(vec![SECURE_HOST.to_string()])
        .expect("params")
        .signed_by(&key, ca)
        .expect("a certificate");
    let (cert_file, key_file) = (dir.join("secure.pem"), dir.join("secure-key.pem"));
    std::fs::write(&cert_file, cert.pem()).expect("write");
    std::fs::write(&key_file, key.serialize_pem()).expect("write");
    std::fs::write(dir.join("secure-ca.pem"), ca.pem()).expect("write");
    (cert_file, key_file)
}

/// A DestinationRule originating TLS (SIMPLE) to the HTTPS service: the client's sidecar
/// verifies the server, against the system's roots when the rule names no CA (the test's CA is
/// not one of them: refused), against the CA file it names (served by the agent over SDS, as
/// istio-agent serves it), which lets the request through; pinned to a name the certificate
/// does not carry it is refused; without `sni` the request's host is sent and verified (auto
/// SNI and SAN validation, as istiod sets them); the CA file replaced is served again without a
/// change of config. Leaves no rule.
async fn tls_origination(
    store: &StoreServer,
    client: &Netns,
    dir: &std::path::Path,
    protocol: &str,
) {
    let url = format!("http://{SECURE_VIP}/hello");
    let host = ["--host", SECURE_HOST];
    // Waits until a request answers `status`: 200 reaching the server, else refused before it.
    let expect = |what: &str, status: u16| {
        let a = until(client, &url, &host, what, |a| a.status == status);
        assert_eq!(
            a.backend.as_deref() == Some("secure"),
            status == 200,
            "{protocol}: {what}: {a:?}"
        );
    };
    // The rule's traffic policy is `policy`, then `expect(what, status)`.
    let step = async |policy: Value, what: &str, status: u16| {
        store
            .apply(&[
                json!({"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
                   "metadata": {"name": "secure", "namespace": "shop"},
                   "spec": {"host": SECURE_HOST, "trafficPolicy": policy}}),
            ])
            .await;
        expect(what, status);
    };
    let ca = dir.join("secure-ca.pem");
    let ca_file = ca.to_string_lossy();
    step(
        json!({"tls": {"mode": "SIMPLE", "sni": SECURE_HOST}}),
        "a server no system root vouches for",
        503,
    )
    .await;
    step(
        json!({"tls": {"mode": "SIMPLE", "sni": SECURE_HOST, "caCertificates": ca_file}}),
        "the server its CA vouches for",
        200,
    )
    .await;
    step(
        json!({"tls": {"mode": "SIMPLE", "sni": SECURE_HOST, "caCertificates": ca_file,
                       "subjectAltNames": ["other.example.com"]}}),
        "a server of a name its certificate does not carry",
        503,
    )
    .await;
    // No SNI nor names: Envoy sends the request's host and verifies the certificate for it.
    step(
        json!({"tls": {"mode": "SIMPLE", "caCertificates": ca_file}}),
        "the server of the request's host",
        200,
    )
    .await;
    // The CA file replaced in the pod (as a mounted Secret is): the agent reads it again and
    // Envoy gets it without a change of config; a CA that did not sign the server refuses it.
    // (One request per connection: a new CA applies to new connections.)
    step(
        json!({"tls": {"mode": "SIMPLE", "caCertificates": ca_file},
               "connectionPool": {"http": {"maxRequestsPerConnection": 1}}}),
        "the server its CA vouches for, a connection each",
        200,
    )
    .await;
    let trusted = std::fs::read(&ca).expect("the CA file");
    let stranger =
        rcgen::generate_simple_self_signed(vec!["stranger.example".to_string()]).expect("a CA");
    std::fs::write(&ca, stranger.cert.pem()).expect("write");
    expect("the server the new CA does not vouch for", 503);
    std::fs::write(&ca, trusted).expect("write");
    expect("the server the CA vouches for again", 200);
    store.delete("DestinationRule", "shop", "secure").await;
    println!(
        "{protocol}: TLS origination verifies the server, against the CA file it names (read \
         again as it changes), for the names the rule pins or else the request's host"
    );
}

fn namespace_policy(mode: &str) -> Value {
    json!({"apiVersion": "security.istio.io/v1", "kind": "PeerAuthentication",
           "metadata": {"name": "default", "namespace": "shop"},
           "spec": {"mtls": {"mode": mode}}})
}

/// The inbound modes PeerAuthentication sets, seen by plaintext from outside the mesh (run as the
/// proxy's group, the client pod's request skips its sidecar) and by mesh traffic. Leaves the
/// namespace PERMISSIVE, no workload policy, and the server's DestinationRule ISTIO_MUTUAL.
async fn peer_authentication(store: &StoreServer, client: &Netns, protocol: &str) {
    let direct = "http://10.10.0.2:8000/hello";
    let bypass = ["--gid", "1337"];
    let a = until(client, direct, &bypass, "plaintext under PERMISSIVE", |a| {
        a.status == 200
    });
    assert_eq!(
        a.backend.as_deref(),
        Some("server-app"),
        "{protocol}: {a:?}"
    );
    assert!(
        !a.echoed.contains_key("x-forwarded-client-cert"),
        "{protocol}: plaintext carries no client certificate: {a:?}"
    );

    store.apply(&[namespace_policy("STRICT")]).await;
    let a = until(
        client,
        direct,
        &bypass,
        "plaintext refused under STRICT",
        |a| a.status == 0,
    );
    println!("{protocol}: STRICT refuses plaintext: {:?}", a.error);
    let mesh = request(
        client,
        &format!("http://{SERVER_VIP}/hello"),
        &["--host", "server.shop.svc.cluster.local"],
    );
    assert_eq!(
        mesh.status, 200,
        "{protocol}: mesh traffic under STRICT: {mesh:?}"
    );

    // A workload policy opens its port again; its unset mode inherits STRICT elsewhere.
    store
        .apply(&[
            json!({"apiVersion": "security.istio.io/v1", "kind": "PeerAuthentication",
            "metadata": {"name": "server", "namespace": "shop"},
            "spec": {"selector": {"matchLabels": {"app": "server"}},
                     "portLevelMtls": {"8000": {"mode": "PERMISSIVE"}}}}),
        ])
        .await;
    let a = until(client, direct, &bypass, "the port PERMISSIVE again", |a| {
        a.status == 200
    });
    assert_eq!(
        a.backend.as_deref(),
        Some("server-app"),
        "{protocol}: {a:?}"
    );
    // DISABLE on the port: the server takes only plaintext there, and the client's sidecar,
    // told so by the endpoint (no longer marked for mutual TLS), sends it plaintext under auto
    // mTLS (without the DestinationRule, which would ask for mutual TLS whatever the server
    // says): mesh traffic still flows, without a client certificate.
    store.delete("DestinationRule", "shop", "server").await;
    store
        .apply(&[
            json!({"apiVersion": "security.istio.io/v1", "kind": "PeerAuthentication",
            "metadata": {"name": "server", "namespace": "shop"},
            "spec": {"selector": {"matchLabels": {"app": "server"}},
                     "portLevelMtls": {"8000": {"mode": "DISABLE"}}}}),
        ])
        .await;
    let a = until(
        client,
        &format!("http://{SERVER_VIP}/hello"),
        &["--host", "server.shop.svc.cluster.local"],
        "mesh traffic in plaintext to a DISABLE port",
        |a| a.status == 200 && !a.echoed.contains_key("x-forwarded-client-cert"),
    );
    assert_eq!(
        a.backend.as_deref(),
        Some("server-app"),
        "{protocol}: {a:?}"
    );
    store.delete("PeerAuthentication", "shop", "server").await;
    store
        .apply(&[namespace_policy("PERMISSIVE"), mutual(None)])
        .await;
    println!("{protocol}: PeerAuthentication sets the inbound modes, per namespace and per port");
}

/// The server's Envoy accepts mutual TLS only from SPIFFE identities of the mesh's trust
/// domains, as istiod's: once the mesh config names another trust domain, the client (of
/// `cluster.local`) is refused; naming `cluster.local` an alias lets it in again. Leaves the
/// mesh config as it was.
async fn trust_domains(store: &StoreServer, client: &Netns, protocol: &str) {
    let url = format!("http://{SERVER_VIP}/hello");
    let host = ["--host", "server.shop.svc.cluster.local"];
    let original = mesh_config();
    let with = |extra: Value| {
        let mut config = original.clone();
        for (k, v) in extra.as_object().expect("fields") {
            config["spec"][k] = v.clone();
        }
        config
    };
    // The client pins the server's own identity, whatever the mesh's trust domain: a refusal
    // is the server's.
    store
        .apply(&[
            mutual(Some("spiffe://cluster.local/ns/shop/sa/server")),
            with(json!({"trustDomain": "example.org"})),
        ])
        .await;
    let refused = until(client, &url, &host, "another trust domain", |a| {
        a.status != 200
    });
    assert_ne!(
        refused.backend.as_deref(),
        Some("server-app"),
        "{protocol}: {refused:?}"
    );
    store
        .apply(&[with(
            json!({"trustDomain": "example.org", "trustDomainAliases": ["cluster.local"]}),
        )])
        .await;
    until(client, &url, &host, "an alias of the trust domain", |a| {
        a.status == 200
    });
    store.apply(&[original, mutual(None)]).await;
    until(client, &url, &host, "the mesh config as it was", |a| {
        a.status == 200
    });
    println!("{protocol}: mutual TLS accepts only the mesh's trust domains");
}

/// An AuthorizationPolicy of the server's workload.
fn server_policy(name: &str, spec: Value) -> Value {
    let mut spec = spec;
    spec["selector"] = json!({"matchLabels": {"app": "server"}});
    json!({"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
           "metadata": {"name": name, "namespace": "shop"}, "spec": spec})
}

/// The server's Envoy enforces its AuthorizationPolicies on mesh traffic from the client (over
/// mTLS, so the client's SPIFFE identity is the principal). Leaves no policy behind.
async fn authorization_policy(store: &StoreServer, client: &Netns, protocol: &str) {
    let url = |path: &str| format!("http://{SERVER_VIP}{path}");
    let host = ["--host", "server.shop.svc.cluster.local"];
    store
        .apply(&[server_policy(
            "deny-admin",
            json!({"action": "DENY", "rules": [{"to": [{"operation": {"paths": ["/admin"]}}]}]}),
        )])
        .await;
    let a = until(client, &url("/admin"), &host, "DENY on /admin", |a| {
        a.status == 403
    });
    assert!(
        a.body.as_deref().is_some_and(|b| b.contains("RBAC")),
        "{protocol}: {a:?}"
    );
    let other = request(client, &url("/hello"), &host);
    assert_eq!(other.status, 200, "{protocol}: other paths pass: {other:?}");
    // Paths are normalized before the policy sees them: a dot segment does not get around it.
    let around = request(client, &url("/hello/../admin"), &host);
    assert_eq!(
        around.status, 403,
        "{protocol}: /hello/../admin is /admin: {around:?}"
    );

    let allow_only = |principal: &str| {
        server_policy(
            "allow-one",
            json!({"rules": [{"from": [{"source": {"principals": [principal]}}]}]}),
        )
    };
    store
        .apply(&[allow_only("cluster.local/ns/shop/sa/someone-else")])
        .await;
    until(
        client,
        &url("/hello"),
        &host,
        "ALLOW for another principal",
        |a| a.status == 403,
    );
    store
        .apply(&[allow_only("cluster.local/ns/shop/sa/client")])
        .await;
    let a = until(client, &url("/hello"), &host, "ALLOW for the client", |a| {
        a.status == 200
    });
    assert_eq!(
        a.backend.as_deref(),
        Some("server-app"),
        "{protocol}: {a:?}"
    );
    let denied = request(client, &url("/admin"), &host);
    assert_eq!(
        denied.status, 403,
        "{protocol}: DENY still applies: {denied:?}"
    );

    store
        .delete("AuthorizationPolicy", "shop", "allow-one")
        .await;
    store
        .delete("AuthorizationPolicy", "shop", "deny-admin")
        .await;
    until(client, &url("/admin"), &host, "no policy left", |a| {
        a.status == 200
    });
    println!("{protocol}: AuthorizationPolicy DENY and ALLOW enforced by the server's Envoy");

    // CUSTOM: /guarded is checked by the mesh's external authorizer.
    store
        .apply(&[server_policy(
            "ext-check",
            json!({"action": "CUSTOM", "provider": {"name": "ext-authz"},
                   "rules": [{"to": [{"operation": {"paths": ["/guarded"]}}]}]}),
        )])
        .await;
    until(
        client,
        &url("/guarded"),
        &host,
        "CUSTOM refuses without the header",
        |a| a.status == 403,
    );
    let allowed = [host[0], host[1], "--header", "x-ext-authz:allow"];
    let a = request(client, &url("/guarded"), &allowed);
    assert_eq!(
        a.status, 200,
        "{protocol}: the authorizer lets it through: {a:?}"
    );
    assert_eq!(
        a.backend.as_deref(),
        Some("server-app"),
        "{protocol}: {a:?}"
    );
    let other = request(client, &url("/hello"), &host);
    assert_eq!(
        other.status, 200,
        "{protocol}: paths no CUSTOM rule names are not sent to the authorizer: {other:?}"
    );
    store
        .delete("AuthorizationPolicy", "shop", "ext-check")
        .await;
    until(
        client,
        &url("/guarded"),
        &host,
        "no CUSTOM policy left",
        |a| a.status == 200,
    );
    println!("{protocol}: CUSTOM AuthorizationPolicy checked by the mesh's external authorizer");
}

/// An EnvoyFilter of `shop` selecting `app`.
fn filter_of(name: &str, app: &str, patches: Value) -> Value {
    json!({"apiVersion": "networking.istio.io/v1alpha3", "kind": "EnvoyFilter",
           "metadata": {"name": name, "namespace": "shop"},
           "spec": {"workloadSelector": {"labels": {"app": app}}, "configPatches": patches}})
}

/// EnvoyFilters patch what each sidecar's agent builds: the server's inbound HTTP filters get a
/// Lua filter, the client's outbound virtual host of the server a response header. Leaves no
/// EnvoyFilter behind.
async fn envoy_filter(store: &StoreServer, client: &Netns, protocol: &str) {
    let url = format!("http://{SERVER_VIP}/hello");
    let host = ["--host", "server.shop.svc.cluster.local"];
    let lua = filter_of(
        "server-lua",
        "server",
        json!([{"applyTo": "HTTP_FILTER",
            "match": {"context": "SIDECAR_INBOUND", "listener": {"filterChain": {"filter": {
                "name": "envoy.filters.network.http_connection_manager",
                "subFilter": {"name": "envoy.filters.http.router"}}}}},
            "patch": {"operation": "INSERT_BEFORE", "value": {
                "name": "envoy.lua",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                    "inlineCode": "function envoy_on_response(h) h:headers():add('x-server-lua', 'patched') end"}}}}]),
    );
    let vhost = filter_of(
        "client-vhost",
        "client",
        json!([{"applyTo": "VIRTUAL_HOST",
            "match": {"context": "SIDECAR_OUTBOUND", "routeConfiguration": {
                "portNumber": 80, "vhost": {"name": "server.shop.svc.cluster.local:80"}}},
            "patch": {"operation": "MERGE", "value": {"response_headers_to_add": [
                {"header": {"key": "x-client-vhost", "value": "patched"}}]}}}]),
    );
    // An extension config served over ECDS, named by an HTTP filter of the server's inbound
    // side, as EnvoyFilters add ECDS filters.
    let ecds = filter_of(
        "server-ecds",
        "server",
        json!([{"applyTo": "EXTENSION_CONFIG",
                "patch": {"operation": "ADD", "value": {
                    "name": "shop-ecds-lua",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                        "inlineCode": "function envoy_on_response(h) h:headers():add('x-server-ecds', 'served') end"}}}},
               {"applyTo": "HTTP_FILTER",
                "match": {"context": "SIDECAR_INBOUND", "listener": {"filterChain": {"filter": {
                    "name": "envoy.filters.network.http_connection_manager",
                    "subFilter": {"name": "envoy.filters.http.router"}}}}},
                "patch": {"operation": "INSERT_BEFORE", "value": {
                    "name": "shop-ecds-lua",
                    "config_discovery": {
                        "config_source": {"ads": {}, "initial_fetch_timeout": "0s"},
                        "type_urls": ["type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua"]}}}}]),
    );
    store.apply(&[lua, vhost, ecds]).await;
    let a = until(client, &url, &host, "the EnvoyFilters' headers", |a| {
        a.status == 200
            && a.headers.get("x-server-lua").map(String::as_str) == Some("patched")
            && a.headers.get("x-client-vhost").map(String::as_str) == Some("patched")
            && a.headers.get("x-server-ecds").map(String::as_str) == Some("served")
    });
    assert_eq!(
        a.backend.as_deref(),
        Some("server-app"),
        "{protocol}: {a:?}"
    );
    store.delete("EnvoyFilter", "shop", "server-lua").await;
    store.delete("EnvoyFilter", "shop", "client-vhost").await;
    store.delete("EnvoyFilter", "shop", "server-ecds").await;
    until(client, &url, &host, "no EnvoyFilter left", |a| {
        a.status == 200
            && !a.headers.contains_key("x-server-lua")
            && !a.headers.contains_key("x-client-vhost")
            && !a.headers.contains_key("x-server-ecds")
    });
    println!(
        "{protocol}: EnvoyFilters' Lua filter, virtual host header and ECDS extension config \
         shown on real responses"
    );
}

/// A proxy-Wasm module (ABI 0.2.1) adding `x-wasm-plugin: yes` to every response.
const HEADER_PLUGIN: &str = r#"
(module
  (import "env" "proxy_add_header_map_value"
    (func $add (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "x-wasm-pluginyes")
  (global $heap (mut i32) (i32.const 1024))
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "proxy_on_memory_allocate") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $n)))
    (local.get $p))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
  ;; Response headers are map 2.
  (func (export "proxy_on_response_headers") (param i32 i32 i32) (result i32)
    (drop (call $add (i32.const 2) (i32.const 16) (i32.const 13) (i32.const 29) (i32.const 3)))
    (i32.const 0)))
"#;

/// A WasmPlugin on the server (its module a file in the pod, served over ECDS) and a Lua
/// TrafficExtension on the client add their headers to real responses; deleting them takes the
/// headers away.
async fn traffic_extensions(
    store: &StoreServer,
    client: &Netns,
    dir: &std::path::Path,
    protocol: &str,
) {
    let module = dir.join("header-plugin.wasm");
    std::fs::write(
        &module,
        wat::parse_str(HEADER_PLUGIN).expect("the module assembles"),
    )
    .expect("write the module");
    let plugin = json!({"apiVersion": "extensions.istio.io/v1alpha1", "kind": "WasmPlugin",
        "metadata": {"name": "header", "namespace": "shop"},
        "spec": {"selector": {"matchLabels": {"app": "server"}},
                 "url": format!("file://{}", module.display()),
                 "phase": "STATS", "failStrategy": "FAIL_CLOSE"}});
    let lua = json!({"apiVersion": "extensions.istio.io/v1alpha1", "kind": "TrafficExtension",
        "metadata": {"name": "client-lua", "namespace": "shop"},
        "spec": {"selector": {"matchLabels": {"app": "client"}},
                 "match": [{"mode": "CLIENT"}],
                 "lua": {"inlineCode":
                     "function envoy_on_response(h) h:headers():add('x-client-lua', 'yes') end"}}});
    store.apply(&[plugin, lua]).await;
    let url = format!("http://{SERVER_VIP}/hello");
    let host = ["--host", "server.shop.svc.cluster.local"];
    let a = until(client, &url, &host, "the extensions' headers", |a| {
        a.status == 200
            && a.headers.get("x-wasm-plugin").map(String::as_str) == Some("yes")
            && a.headers.get("x-client-lua").map(String::as_str) == Some("yes")
    });
    assert_eq!(
        a.backend.as_deref(),
        Some("server-app"),
        "{protocol}: {a:?}"
    );
    println!("{protocol}: a WasmPlugin's module from the pod's files runs in the server's Envoy");

    // The same module over HTTP, fetched by the agent and checked against its SHA-256.
    let bytes = std::fs::read(&module).expect("the module");
    let served = serve_once_per_request(bytes.clone()).await;
    let sum = pasa_istio::digest::sha256_hex(&bytes);
    let fetched = |name: &str, sha256: &str| {
        json!({"apiVersion": "extensions.istio.io/v1alpha1", "kind": "WasmPlugin",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"selector": {"matchLabels": {"app": "server"}},
                     "url": format!("http://{served}/{name}.wasm"), "sha256": sha256,
                     "failStrategy": "FAIL_CLOSE"}})
    };
    store.delete("WasmPlugin", "shop", "header").await;
    until(client, &url, &host, "the file's module gone", |a| {
        a.status == 200 && !a.headers.contains_key("x-wasm-plugin")
    });
    store.apply(&[fetched("fetched", &sum)]).await;
    until(client, &url, &host, "the fetched module's header", |a| {
        a.status == 200 && a.headers.get("x-wasm-plugin").map(String::as_str) == Some("yes")
    });
    // A module whose checksum is not the one given fails closed: every request refused.
    store.apply(&[fetched("bad-sum", &"0".repeat(64))]).await;
    let refused = until(client, &url, &host, "the bad module failing closed", |a| {
        a.status == 403
    });
    assert_ne!(
        refused.backend.as_deref(),
        Some("server-app"),
        "{protocol}: {refused:?}"
    );
    store.delete("WasmPlugin", "shop", "bad-sum").await;
    store.delete("WasmPlugin", "shop", "fetched").await;

    // The module as a private image: without its pull secret in the store the filter fails
    // closed; with it, the agent signs in to the registry and the module runs.
    let mut content = registry::Content::default();
    content.image(
        "private/header",
        "1",
        "application/vnd.oci.image.manifest.v1+json",
        vec![(
            "application/vnd.oci.image.layer.v1.tar+gzip",
            registry::plugin_layer(&bytes),
        )],
    );
    let (registry_at, _registry) = registry::serve(content).await;
    store
        .apply(&[
            json!({"apiVersion": "extensions.istio.io/v1alpha1", "kind": "WasmPlugin",
            "metadata": {"name": "private", "namespace": "shop"},
            "spec": {"selector": {"matchLabels": {"app": "server"}},
                     "url": format!("oci://{registry_at}/private/header:1"),
                     "imagePullSecret": "registry-creds", "failStrategy": "FAIL_CLOSE"}}),
        ])
        .await;
    until(
        client,
        &url,
        &host,
        "the private module refused without its secret",
        |a| a.status == 403,
    );
    let docker_config = json!({"auths": {registry_at.to_string():
        {"username": registry::LOGIN.0, "password": registry::LOGIN.1}}});
    store
        .apply(&[
            json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ImagePullSecret",
            "metadata": {"name": "registry-creds", "namespace": "shop"},
            "spec": {"dockerConfigJson": docker_config.to_string()}}),
        ])
        .await;
    until(client, &url, &host, "the private module's header", |a| {
        a.status == 200 && a.headers.get("x-wasm-plugin").map(String::as_str) == Some("yes")
    });
    store.delete("WasmPlugin", "shop", "private").await;
    store
        .delete("ImagePullSecret", "shop", "registry-creds")
        .await;
    store.delete("TrafficExtension", "shop", "client-lua").await;
    until(client, &url, &host, "no extension left", |a| {
        a.status == 200
            && !a.headers.contains_key("x-wasm-plugin")
            && !a.headers.contains_key("x-client-lua")
    });
    println!(
        "{protocol}: WasmPlugins over ECDS (a module from the pod's files, one the agent fetched \
         over HTTP, one failing closed on its checksum, one pulled from a private registry with \
         its pull secret) and a Lua TrafficExtension, on real responses"
    );
}

/// An HTTP server on loopback answering every GET with `body`, until the test ends.
async fn serve_once_per_request(body: Vec<u8>) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut request = [0u8; 4096];
                let _ = stream.read(&mut request).await;
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(&body).await;
            });
        }
    });
    addr
}

/// A mesh-wide Telemetry logs every request of both sidecars to a file access log provider of
/// the mesh config (in a file per protocol run, as JSON). Leaves the mesh config as it was.
async fn access_logging(store: &StoreServer, envoy: &Envoy, dir: &std::path::Path, protocol: &str) {
    let client = &envoy.netns;
    std::fs::create_dir_all(dir).expect("the access log folder");
    let file = dir.join(format!("{protocol}.log"));
    let mut with_provider = mesh_config();
    with_provider["spec"]["extensionProviders"]
        .as_array_mut()
        .expect("providers")
        .extend([
            json!({"name": "file-log", "envoyFileAccessLog": {
                "path": file.to_string_lossy(),
                "logFormat": {"labels": {"path": "%REQ(:PATH)%", "code": "%RESPONSE_CODE%",
                                          "cluster": "%UPSTREAM_CLUSTER_RAW%"}}}}),
            // Log services: Envoy must accept them (nothing listens there).
            json!({"name": "http-als", "envoyHttpAls": {
                "service": "als.istio-system.svc.cluster.local", "port": 9412}}),
            json!({"name": "tcp-als", "envoyTcpAls": {
                "service": "als.istio-system.svc.cluster.local", "port": 9412}}),
            json!({"name": "otel-als", "envoyOtelAls": {
                "service": "als.istio-system.svc.cluster.local", "port": 9412,
                "logFormat": {"labels": {"path": "%REQ(:PATH)%"}}}}),
        ]);
    let als = json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
        "metadata": {"name": "als", "namespace": "istio-system"},
        "spec": {"addresses": ["10.96.7.6"],
                 "ports": [{"name": "grpc-als", "port": 9412, "targetPort": 9412}],
                 "endpoints": [{"address": "10.10.0.2", "labels": {"app": "als"}}]}});
    let telemetry = json!({"apiVersion": "telemetry.istio.io/v1", "kind": "Telemetry",
        "metadata": {"name": "mesh-default", "namespace": "istio-system"},
        "spec": {"accessLogging": [{"providers": [
            {"name": "file-log"}, {"name": "http-als"}, {"name": "tcp-als"},
            {"name": "otel-als"}]}]}});
    store.apply(&[als, with_provider, telemetry]).await;
    let url = format!("http://{SERVER_VIP}/logged");
    let host = ["--host", "server.shop.svc.cluster.local"];
    let logged = || -> Vec<serde_json::Value> {
        std::fs::read_to_string(&file)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .filter(|l: &serde_json::Value| l["path"] == "/logged")
            .collect()
    };
    // Envoy writes its access logs every second: ask until both sides' lines are there.
    until(
        client,
        &url,
        &host,
        "both sidecars' access log lines",
        |a| {
            a.status == 200 && {
                let lines = logged();
                lines
                    .iter()
                    .any(|l| l["cluster"] == "outbound|80||server.shop.svc.cluster.local")
                    && lines.iter().any(|l| l["cluster"] == "inbound|8000||")
            }
        },
    );
    assert!(
        logged().iter().all(|l| l["code"] == 200),
        "{protocol}: {:?}",
        logged()
    );
    // The log services are in what the client's Envoy took.
    let dump = envoy.config_dump().await.to_string();
    for logger in [
        "envoy.access_loggers.http_grpc",
        "envoy.tcp_grpc_access_log",
        "envoy.access_loggers.open_telemetry",
    ] {
        assert!(
            dump.contains(logger),
            "{protocol}: {logger} not in the client's config"
        );
    }
    store
        .delete("Telemetry", "istio-system", "mesh-default")
        .await;
    store
        .delete("ServiceEndpoints", "istio-system", "als")
        .await;
    store.apply(&mesh()).await;
    println!(
        "{protocol}: a mesh-wide Telemetry's file access log written by both real Envoys \
         (beside gRPC and OpenTelemetry log services)"
    );
}

/// A mesh-wide Telemetry traces every request to the mesh config's Zipkin provider: both
/// Envoys report their span of the same trace. Leaves the mesh config as it was.
async fn tracing(store: &StoreServer, client: &Netns, protocol: &str) {
    let mut with_provider = mesh_config();
    with_provider["spec"]["extensionProviders"]
        .as_array_mut()
        .expect("providers")
        .push(json!({"name": "zipkin", "zipkin": {
            "service": "zipkin.istio-system.svc.cluster.local", "port": 9411}}));
    // The collector, in the server's pod; its port is not HTTP, so that the server's sidecar
    // does not trace the spans it is sent.
    let collector = json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
        "metadata": {"name": "zipkin", "namespace": "istio-system"},
        "spec": {"addresses": ["10.96.7.5"],
                 "ports": [{"name": "tcp-zipkin", "port": 9411, "targetPort": 9411}],
                 "endpoints": [{"address": "10.10.0.2", "labels": {"app": "zipkin"}}]}});
    let telemetry = json!({"apiVersion": "telemetry.istio.io/v1", "kind": "Telemetry",
        "metadata": {"name": "mesh-default", "namespace": "istio-system"},
        "spec": {"tracing": [{"providers": [{"name": "zipkin"}],
                              "randomSamplingPercentage": 100.0,
                              "customTags": {"team": {"literal": {"value": "shop"}}}}]}});
    store.apply(&[collector, with_provider, telemetry]).await;
    let url = format!("http://{SERVER_VIP}/traced");
    let host = ["--host", "server.shop.svc.cluster.local"];
    // What the collector was sent, asked outside the client's capture (as the proxy's group).
    let gid = sidecar::PROXY_GID.to_string();
    let spans = || -> Vec<Value> {
        let a = request(
            client,
            "http://10.10.0.2:9411/api/v2/spans",
            &["--gid", &gid],
        );
        a.body
            .as_deref()
            .and_then(|b| serde_json::from_str::<Value>(b).ok())
            .and_then(|v| v["spans"].as_array().cloned())
            .unwrap_or_default()
    };
    // The client's CLIENT span and the server's SERVER span of one request to `/traced`.
    let pair = |spans: &[Value]| -> Option<(Value, Value)> {
        let of = |kind: &str, service: &str| -> Vec<&Value> {
            spans
                .iter()
                .filter(|s| {
                    s["kind"] == kind
                        && s["localEndpoint"]["serviceName"] == service
                        && s["tags"]["http.url"]
                            .as_str()
                            .is_some_and(|u| u.ends_with("/traced"))
                })
                .collect()
        };
        let servers = of("SERVER", "server.shop");
        of("CLIENT", "client.shop").into_iter().find_map(|c| {
            servers
                .iter()
                .find(|s| s["traceId"] == c["traceId"])
                .map(|s| (c.clone(), (*s).clone()))
        })
    };
    // Envoy sends its spans in batches (every 5 s, or 5 spans): ask until both are there.
    let a = until(
        client,
        &url,
        &host,
        "both sidecars' spans of a trace",
        |a| a.status == 200 && pair(&spans()).is_some(),
    );
    assert_eq!(
        a.echoed.get("x-b3-sampled").map(String::as_str),
        Some("1"),
        "{protocol}: the app sees the sampled trace: {a:?}"
    );
    let spans = spans();
    let (client_span, server_span) = pair(&spans).expect("seen above");
    for span in [client_span, server_span] {
        assert_eq!(span["tags"]["team"], "shop", "{protocol}: {span}");
        assert_eq!(
            span["tags"]["istio.namespace"], "shop",
            "{protocol}: {span}"
        );
        assert_eq!(
            span["tags"]["istio.canonical_revision"], "latest",
            "{protocol}: {span}"
        );
    }
    store
        .delete("Telemetry", "istio-system", "mesh-default")
        .await;
    store
        .delete("ServiceEndpoints", "istio-system", "zipkin")
        .await;
    store.apply(&mesh()).await;
    println!(
        "{protocol}: a mesh-wide Telemetry's Zipkin tracing: both real Envoys reported their span \
         of one trace ({} spans collected)",
        spans.len()
    );
}

/// A P-256 key: its JSON Web Key Set, and ES256 tokens it signs.
struct TokenIssuer {
    key: ring::signature::EcdsaKeyPair,
    rng: ring::rand::SystemRandom,
}

const ISSUER: &str = "testing@secure.istio.io";

impl TokenIssuer {
    fn new() -> TokenIssuer {
        use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        TokenIssuer { key, rng }
    }

    fn b64(bytes: &[u8]) -> String {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    }

    /// The public key as a JSON Web Key Set.
    fn jwks(&self) -> String {
        use ring::signature::KeyPair;
        // Uncompressed point: 0x04, then x and y.
        let point = self.key.public_key().as_ref();
        json!({"keys": [{"kty": "EC", "crv": "P-256", "alg": "ES256", "kid": "test",
                         "x": Self::b64(&point[1..33]), "y": Self::b64(&point[33..65])}]})
        .to_string()
    }

    /// A token of `subject`, valid for an hour.
    fn token(&self, subject: &str) -> String {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let header = Self::b64(
            json!({"alg": "ES256", "kid": "test", "typ": "JWT"})
                .to_string()
                .as_bytes(),
        );
        let claims = Self::b64(
            json!({"iss": ISSUER, "sub": subject, "iat": now, "exp": now + 3600})
                .to_string()
                .as_bytes(),
        );
        let signed = format!("{header}.{claims}");
        let signature = self.key.sign(&self.rng, signed.as_bytes()).unwrap();
        format!("{signed}.{}", Self::b64(signature.as_ref()))
    }
}

/// The server's Envoy checks JWTs of its RequestAuthentication, and an AuthorizationPolicy can
/// require the token's principal. Leaves no policy behind.
async fn request_authentication(store: &StoreServer, client: &Netns, protocol: &str) {
    let issuer = TokenIssuer::new();
    let url = format!("http://{SERVER_VIP}/hello");
    let host = ["--host", "server.shop.svc.cluster.local"];
    let bearer = |token: &str| format!("authorization:Bearer {token}");
    let with = |token: &str| {
        let header = bearer(token);
        request(client, &url, &[host[0], host[1], "--header", &header])
    };
    // The keys behind the rule's jwksUri, as PCP fetches them into the store for the agents.
    let uri = "https://keys.example.com/jwks.json";
    let source = pasa_istio::request_authentication::KeySetSource::Uri(uri.into());
    store
        .apply(&[
            json!({"apiVersion": "pasa.io/v1alpha1", "kind": "JsonWebKeySet",
                   "metadata": {"name": source.object_name(), "namespace": "istio-system"},
                   "spec": {"jwksUri": uri, "jwks": issuer.jwks()}}),
            json!({"apiVersion": "security.istio.io/v1", "kind": "RequestAuthentication",
                   "metadata": {"name": "jwt", "namespace": "shop"},
                   "spec": {"selector": {"matchLabels": {"app": "server"}},
                            "jwtRules": [{"issuer": ISSUER, "jwksUri": uri}]}}),
        ])
        .await;
    let bad = bearer("not.a.token");
    until(
        client,
        &url,
        &[host[0], host[1], "--header", &bad],
        "a bad token refused",
        |a| a.status == 401,
    );
    let none = request(client, &url, &host);
    assert_eq!(none.status, 200, "{protocol}: no token passes: {none:?}");
    let good = with(&issuer.token("alice"));
    assert_eq!(
        good.status, 200,
        "{protocol}: a valid token passes: {good:?}"
    );
    let stranger = TokenIssuer::new();
    let forged = with(&stranger.token("alice"));
    assert_eq!(
        forged.status, 401,
        "{protocol}: another key's token is refused: {forged:?}"
    );

    store
        .apply(&[server_policy(
            "require-alice",
            json!({"rules": [{"from": [{"source": {"requestPrincipals": [format!("{ISSUER}/alice")]}}]}]}),
        )])
        .await;
    until(client, &url, &host, "no token, no entry", |a| {
        a.status == 403
    });
    let alice = with(&issuer.token("alice"));
    assert_eq!(
        alice.status, 200,
        "{protocol}: alice's token passes: {alice:?}"
    );
    assert_eq!(
        alice.backend.as_deref(),
        Some("server-app"),
        "{protocol}: {alice:?}"
    );
    let bob = with(&issuer.token("bob"));
    assert_eq!(bob.status, 403, "{protocol}: bob is not alice: {bob:?}");

    store
        .delete("AuthorizationPolicy", "shop", "require-alice")
        .await;
    store.delete("RequestAuthentication", "shop", "jwt").await;
    until(
        client,
        &url,
        &[host[0], host[1], "--header", &bad],
        "no policy left",
        |a| a.status == 200,
    );
    println!(
        "{protocol}: RequestAuthentication's JWTs checked, and their principal required by an AuthorizationPolicy"
    );
}

/// Two networks that reach each other only through an east-west gateway, as Istio's
/// multi-network meshes: network `n1` holds the client's pod and one server pod (cluster `c1`);
/// network `n2` (cluster `c2`) holds another server pod, a server endpoint without a sidecar,
/// and, at its edge, the gateway: a PASA router agent and real Envoy with an `AUTO_PASSTHROUGH`
/// server on 15443 that forwards Istio mutual TLS by its SNI, asking only for its own network's
/// endpoints (`REQUESTED_NETWORK_VIEW`). The client's pod has no route into `n2`.
///
/// The client's Envoy gets the local endpoint and the gateway (in place of the remote pod, the
/// non-mTLS endpoint left out) with istiod's weights; requests reach both server pods. With
/// outlier detection and `failoverPriority` on the network, traffic stays in `n1`, and when
/// the local pod fails, it fails over through the gateway to `n2`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_networks_through_an_east_west_gateway() {
    use common::sidecar::{agent_with_certificate_and, link};
    if sidecar::skip_without_capture("two_networks_through_an_east_west_gateway") {
        return;
    }
    const CLIENT: &str = "sidecar~10.10.0.1~client-1.shop~shop.svc.cluster.local";
    const LOCAL: &str = "sidecar~10.10.0.2~server-a.shop~shop.svc.cluster.local";
    const REMOTE: &str = "sidecar~10.20.0.2~server-b.shop~shop.svc.cluster.local";
    const GATEWAY: &str =
        "router~10.10.1.3~istio-eastwestgateway-1.istio-system~istio-system.svc.cluster.local";
    const VIP: &str = "10.96.8.1";
    let server = |name: &str, cluster: &str, endpoints: Value| {
        let mut spec = json!({"cluster": cluster, "addresses": [VIP],
            "ports": [{"name": "http", "port": 80, "targetPort": 8000}], "endpoints": endpoints});
        if name != "server" {
            spec["service"] = json!("server");
        }
        json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
               "metadata": {"name": name, "namespace": "shop"}, "spec": spec})
    };
    let pod = |address: &str, network: &str, sidecar: bool| {
        let mut labels = json!({"app": "server"});
        if sidecar {
            labels["security.istio.io/tlsMode"] = json!("istio");
        }
        json!({"address": address, "network": network, "labels": labels,
               "serviceAccount": "server"})
    };
    let config = vec![
        server("server", "c1", json!([pod("10.10.0.2", "n1", true)])),
        server(
            &pasa_istio::service_endpoints::remote_service_name("server", "c2"),
            "c2",
            json!([pod("10.20.0.2", "n2", true), pod("10.20.0.3", "n2", false)]),
        ),
        // The gateway into n2, as the syncer writes a Service labelled with its network.
        json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
               "metadata": {"name": "istio-eastwestgateway.c2.cluster",
                            "namespace": "istio-system"},
               "spec": {"service": "istio-eastwestgateway", "cluster": "c2",
                        "addresses": ["10.96.9.9"],
                        "ports": [{"name": "tls", "port": 15443}],
                        "networkGateways": [{"network": "n2", "address": "10.10.1.3",
                                             "port": 15443}]}}),
        json!({"apiVersion": "networking.istio.io/v1", "kind": "Gateway",
               "metadata": {"name": "cross-network", "namespace": "istio-system"},
               "spec": {"selector": {"istio": "eastwestgateway"}, "servers": [
                   {"port": {"number": 15443, "name": "tls", "protocol": "TLS"},
                    "tls": {"mode": "AUTO_PASSTHROUGH"}, "hosts": ["*.local"]}]}}),
    ];
    let data = tempfile::tempdir().expect("temporary directory");
    let store = StoreServer::start(&data.path().join("db"), 0).await;
    store.apply(&config).await;
    let ca = sidecar::ca();
    let n1 = ["--cluster-id", "c1", "--network", "n1"];
    let n2 = ["--cluster-id", "c2", "--network", "n2"];
    let dir = |name: &str| data.path().join(name);
    let client_agent = agent_with_certificate_and(
        &store,
        &dir("client"),
        (CLIENT, "app=client"),
        &ca,
        "client",
        &n1,
    );
    let local_agent = agent_with_certificate_and(
        &store,
        &dir("local"),
        (LOCAL, "app=server"),
        &ca,
        "server",
        &n1,
    );
    let remote_agent = agent_with_certificate_and(
        &store,
        &dir("remote"),
        (REMOTE, "app=server"),
        &ca,
        "server",
        &n2,
    );
    let gateway_labels = "istio=eastwestgateway";
    // Its own mesh clusters (auto mTLS) need its workload certificate, as any gateway's.
    let gateway_agent = agent_with_certificate_and(
        &store,
        &dir("gateway"),
        (GATEWAY, gateway_labels),
        &ca,
        "istio-eastwestgateway",
        &[&["--requested-network-view", "n2"][..], &n2].concat(),
    );

    // n1: the client, the local pod and the gateway's outer side; n2: behind the gateway.
    let (client_ns, local_ns, gateway_ns, remote_ns) = (
        Netns::create(),
        Netns::create(),
        Netns::create(),
        Netns::create(),
    );
    link((&client_ns, "10.10.0.1"), (&local_ns, "10.10.0.2"));
    link((&client_ns, "10.10.1.1"), (&gateway_ns, "10.10.1.3"));
    link((&gateway_ns, "10.20.0.1"), (&remote_ns, "10.20.0.2"));
    client_ns.run(&["ip", "route", "add", "10.96.0.0/16", "via", "10.10.0.2"]);
    for ns in [&client_ns, &local_ns, &remote_ns] {
        sidecar::capture(ns);
    }
    let local_app = Backend::start(&local_ns, "server-a", "0.0.0.0:8000", None);
    let _remote_app = Backend::start(&remote_ns, "server-b", "0.0.0.0:8000", None);
    let bootstrap = |agent, node, labels| agent_bootstrap(agent, node, labels, false);
    let gid = Some(sidecar::PROXY_GID);
    let _local = Envoy::start_in(local_ns, bootstrap(&local_agent, LOCAL, "app=server"), gid).await;
    let _remote = Envoy::start_in(
        remote_ns,
        bootstrap(&remote_agent, REMOTE, "app=server"),
        gid,
    )
    .await;
    let gateway = Envoy::start_in(
        gateway_ns,
        bootstrap(&gateway_agent, GATEWAY, gateway_labels),
        None,
    )
    .await;
    let client = Envoy::start_in(
        client_ns,
        bootstrap(&client_agent, CLIENT, "app=client"),
        gid,
    )
    .await;

    // The client's endpoints: the local pod, and the gateway standing for n2's mTLS pod.
    let cluster = "outbound|80||server.shop.svc.cluster.local";
    let line = |text: &str, host: &str, field: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{cluster}::{host}::{field}::")))
            .map(str::to_string)
    };
    let text = until_clusters(
        &client,
        cluster,
        "the client's Envoy has both endpoints",
        |text| {
            line(text, "10.10.1.3:15443", "weight").is_some()
                && line(text, "10.10.0.2:8000", "weight").is_some()
        },
    )
    .await;
    let hosts: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("{cluster}::")))
        .filter_map(|l| l.split("::").next())
        .filter(|h| h.parse::<std::net::SocketAddr>().is_ok())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(hosts, ["10.10.0.2:8000", "10.10.1.3:15443"], "{text}");
    // One gateway in n2 and in (n2, c2): the scale factor is 1, and so are the weights.
    assert_eq!(
        line(&text, "10.10.0.2:8000", "weight").as_deref(),
        Some("1")
    );
    assert_eq!(
        line(&text, "10.10.1.3:15443", "weight").as_deref(),
        Some("1")
    );
    // The gateway forwards only into n2, to its mTLS pod.
    gateway
        .until_hosts(
            "outbound_.80_._.server.shop.svc.cluster.local",
            "the gateway's endpoints",
            |h| h.keys().map(String::as_str).eq(["10.20.0.2:8000"]),
        )
        .await;

    let url = format!("http://{VIP}/hello");
    let host = ["--host", "server.shop.svc.cluster.local"];
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    for _ in 0..10 {
        for a in common::traffic::client(
            &client.netns,
            &[&url, "20", "--timeout", "3", host[0], host[1]],
        ) {
            assert_eq!(a.status, 200, "every request is answered: {a:?}");
            *seen.entry(a.backend.unwrap_or_default()).or_default() += 1;
        }
        if seen.len() == 2 {
            break;
        }
    }
    if seen.len() != 2 {
        let (_, text) = client.get("/clusters").await;
        let (_, through) = gateway.get("/clusters").await;
        panic!(
            "requests reach both networks: {seen:?}\nthe client's gateway host:\n{}\nthe gateway's:\n{}",
            text.lines()
                .filter(|l| l.contains("10.10.1.3"))
                .collect::<Vec<_>>()
                .join("\n"),
            through
                .lines()
                .filter(|l| l.starts_with("outbound_.80"))
                .collect::<Vec<_>>()
                .join("\n"),
        );
    }
    println!("split horizon: {seen:?} across the networks, n2 through the gateway");

    // Prefer the client's own network; leave a failing pod at once.
    store
        .apply(&[
            json!({"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
            "metadata": {"name": "server", "namespace": "shop"},
            "spec": {"host": "server", "trafficPolicy": {
                "loadBalancer": {"localityLbSetting": {"enabled": true,
                    "failoverPriority": ["topology.istio.io/network"]}},
                "outlierDetection": {"consecutive5xxErrors": 1, "interval": "1s",
                    "baseEjectionTime": "60s", "maxEjectionPercent": 100}}}}),
        ])
        .await;
    until_clusters(&client, cluster, "the gateway at priority 1", |text| {
        line(text, "10.10.1.3:15443", "priority").as_deref() == Some("1")
            && line(text, "10.10.0.2:8000", "priority").as_deref() == Some("0")
    })
    .await;
    let answers = common::traffic::client(
        &client.netns,
        &[&url, "20", "--timeout", "3", host[0], host[1]],
    );
    assert!(
        answers
            .iter()
            .all(|a| a.status == 200 && a.backend.as_deref() == Some("server-a")),
        "the local network first: {answers:?}"
    );
    // The local pod's app goes: its sidecar answers 503, outlier detection ejects it, and
    // traffic fails over through the gateway.
    drop(local_app);
    let a = until(
        &client.netns,
        &url,
        &host,
        "the failover through the gateway",
        |a| a.status == 200 && a.backend.as_deref() == Some("server-b"),
    );
    println!("failover: {a:?}");
    let answers = common::traffic::client(
        &client.netns,
        &[&url, "10", "--timeout", "3", host[0], host[1]],
    );
    assert!(
        answers
            .iter()
            .all(|a| a.status == 200 && a.backend.as_deref() == Some("server-b")),
        "n2 only, through the gateway: {answers:?}"
    );
    for (who, envoy) in [("client", &client), ("gateway", &gateway)] {
        let rejected = envoy.rejected().await;
        assert!(
            rejected.is_empty(),
            "the {who}'s Envoy rejected updates: {rejected:?}"
        );
    }
    for agent in [client_agent, local_agent, remote_agent, gateway_agent] {
        agent.terminate();
    }
    store.stop().await;
}

/// Polls `envoy`'s `/clusters` until `ok` holds for it (bounded by the agent's `WAIT`); returns
/// the text. A failure shows the lines of `cluster`.
async fn until_clusters(
    envoy: &Envoy,
    cluster: &str,
    what: &str,
    ok: impl Fn(&str) -> bool,
) -> String {
    let deadline = std::time::Instant::now() + common::agent::WAIT;
    loop {
        let (_, text) = envoy.get("/clusters").await;
        if ok(&text) {
            return text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}: {}",
            text.lines()
                .filter(|l| l.starts_with(cluster))
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
