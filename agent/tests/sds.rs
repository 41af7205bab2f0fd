//! SDS with the real binary: an ingress gateway's `credentialName` is served from a mounted
//! Secret in `--credential-dir`, on the same ADS stream as the rest of its configuration (SotW
//! and Delta). A secret the agent does not have is left out of the answer without ending the
//! stream; rotating the mounted files pushes a new version; `/config_dump` never shows the key.

mod common;

use std::path::{Path, PathBuf};

use base64::Engine as _;
use common::agent::{Agent, served};
use common::store::StoreServer;
use common::{CDS, FakeDeltaClient, FakeSotwClient, LDS, SDS, kind_of, names};
use envoy_types::pb::envoy::config::core::v3::{DataSource, Node, data_source::Specifier};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{Secret, secret};
use envoy_types::pb::google::protobuf::Any;
use prost::Message;
use serde_json::{Value, json};

const ROUTER: &str = "router~10.1.0.9~istio-ingressgateway-5d4c8f7b9-qx2lm.istio-system~istio-system.svc.cluster.local";
const LABELS: &str = "istio=ingressgateway,app=istio-ingressgateway";
const WEB_CERT: &str = "kubernetes://web-cert";
const WEB_CA: &str = "kubernetes://web-cert-cacert";

/// An HTTPS ingress Gateway terminating TLS with the `web-cert` credential.
fn gateway() -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "Gateway",
           "metadata": {"name": "web", "namespace": "istio-system"},
           "spec": {"selector": {"istio": "ingressgateway"},
                    "servers": [{"port": {"number": 443, "name": "https", "protocol": "HTTPS"},
                                 "hosts": ["*"],
                                 "tls": {"mode": "SIMPLE", "credentialName": "web-cert"}}]}})
}

/// A self-signed certificate and its key, PEM.
struct Pem {
    chain: String,
    key: String,
}

fn self_signed(host: &str) -> Pem {
    let certified = rcgen::generate_simple_self_signed(vec![host.to_string()]).unwrap();
    Pem {
        chain: certified.cert.pem(),
        key: certified.signing_key.serialize_pem(),
    }
}

/// Mounts `pem` (and `ca`) as Kubernetes mounts a Secret volume: the files in a timestamped
/// directory, `..data` pointing at it, each key a symlink through `..data`. Mounting again swaps
/// `..data` atomically, as the kubelet does on a Secret update.
fn mount(secret_dir: &Path, generation: u32, pem: &Pem, ca: &str) {
    std::fs::create_dir_all(secret_dir).unwrap();
    let data = format!("..2025_01_01_00_00_0{generation}");
    let data_dir = secret_dir.join(&data);
    std::fs::create_dir(&data_dir).unwrap();
    std::fs::write(data_dir.join("tls.crt"), &pem.chain).unwrap();
    std::fs::write(data_dir.join("tls.key"), &pem.key).unwrap();
    std::fs::write(data_dir.join("ca.crt"), ca).unwrap();
    let staged = secret_dir.join("..data_tmp");
    std::os::unix::fs::symlink(&data, &staged).unwrap();
    std::fs::rename(&staged, secret_dir.join("..data")).unwrap();
    for key in ["tls.crt", "tls.key", "ca.crt"] {
        let link = secret_dir.join(key);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(PathBuf::from("..data").join(key), &link).unwrap();
        }
    }
}

fn router_node() -> Node {
    Node {
        id: ROUTER.into(),
        ..Default::default()
    }
}

fn start(store: &StoreServer, run: &Path, cache: &Path, credentials: &Path) -> Agent {
    let dir = credentials.to_str().unwrap();
    Agent::start_with(
        ROUTER,
        store.addr,
        run,
        cache,
        &[
            "--labels",
            LABELS,
            "--credential-dir",
            dir,
            "--credential-poll",
            "100ms",
        ],
    )
}

/// Waits until the agent serves the gateway's HTTPS listener and `secrets`.
async fn until_served(agent: &Agent, secrets: &[&str]) -> String {
    agent
        .until(
            "/config_dump",
            "the HTTPS listener and its secret",
            |_, b| {
                served(b, "LDS").iter().any(|l| l.ends_with("_443"))
                    && secrets
                        .iter()
                        .all(|s| served(b, "SDS").iter().any(|n| n == s))
            },
        )
        .await
}

fn secret_of(any: &Any) -> Secret {
    assert_eq!(kind_of(&any.type_url), SDS);
    Secret::decode(any.value.as_slice()).unwrap()
}

fn inline(source: Option<&DataSource>) -> Vec<u8> {
    match source.and_then(|s| s.specifier.as_ref()) {
        Some(Specifier::InlineBytes(bytes)) => bytes.clone(),
        Some(Specifier::InlineString(text)) => text.clone().into_bytes(),
        other => panic!("not inline: {other:?}"),
    }
}

/// The certificate chain and the private key of a TLS secret.
fn chain_and_key(secret: &Secret) -> (Vec<u8>, Vec<u8>) {
    match &secret.r#type {
        Some(secret::Type::TlsCertificate(tls)) => (
            inline(tls.certificate_chain.as_ref()),
            inline(tls.private_key.as_ref()),
        ),
        other => panic!("{} is not a TLS certificate: {other:?}", secret.name),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_gets_its_credential_over_sotw_and_rotations_reach_it() {
    let (data, run, cache, credentials) = (tempdir(), tempdir(), tempdir(), tempdir());
    let first = self_signed("web.example.com");
    mount(&credentials.path().join("web-cert"), 1, &first, "CA");
    let store = StoreServer::start(data.path(), 0).await;
    store.apply(&[gateway()]).await;
    let agent = start(&store, run.path(), cache.path(), credentials.path());
    until_served(&agent, &[WEB_CERT, WEB_CA]).await;

    let mut envoy = FakeSotwClient::connect(&agent.uds, router_node()).await;
    envoy.request(CDS, &[], "", "").await;
    let cds = envoy.recv().await;
    assert_eq!(kind_of(&cds.type_url), CDS);
    envoy.ack(&cds, &[]).await;
    envoy.request(LDS, &[], "", "").await;
    let lds = envoy.recv().await;
    assert_eq!(kind_of(&lds.type_url), LDS);
    let https = lds
        .resources
        .iter()
        .find(|l| {
            l.value
                .windows(WEB_CERT.len())
                .any(|w| w == WEB_CERT.as_bytes())
        })
        .expect("the HTTPS listener names the credential over SDS");
    assert!(common::name_of(https).ends_with("_443"));

    // Envoy asks for what the listener names, and for a secret nobody mounted: it gets the one
    // that exists, and the stream stays.
    let asked = [WEB_CERT, "kubernetes://nobody-mounted-this"];
    envoy.request(SDS, &asked, "", "").await;
    let sds = envoy.recv().await;
    assert_eq!(kind_of(&sds.type_url), SDS);
    assert_eq!(names(&sds), [WEB_CERT]);
    let (chain, key) = chain_and_key(&secret_of(&sds.resources[0]));
    assert_eq!(chain, first.chain.as_bytes());
    assert_eq!(key, first.key.as_bytes());
    envoy.ack(&sds, &asked).await;
    envoy.ack(&lds, &[]).await;
    agent
        .until("/sync_status", "SDS and LDS synced", |_, b| {
            let doc: Value = serde_json::from_str(b).unwrap();
            let types = &doc["connections"][0]["types"];
            ["SDS", "LDS", "CDS"]
                .iter()
                .all(|t| types[t]["state"] == "SYNCED")
        })
        .await;

    // The kubelet swaps the mounted Secret: a new version of the secret is pushed.
    let second = self_signed("web.example.com");
    mount(&credentials.path().join("web-cert"), 2, &second, "CA");
    let rotated = envoy.recv().await;
    assert_eq!(kind_of(&rotated.type_url), SDS);
    assert_ne!(rotated.version_info, sds.version_info);
    assert_eq!(names(&rotated), [WEB_CERT]);
    let (chain, key) = chain_and_key(&secret_of(&rotated.resources[0]));
    assert_eq!(chain, second.chain.as_bytes());
    assert_eq!(key, second.key.as_bytes());
    envoy.ack(&rotated, &asked).await;

    // The dump shows the secrets, never a private key.
    let dump = until_served(&agent, &[WEB_CERT]).await;
    assert_no_key(&dump, &second);
    let (_, debug) = agent.get("/config_dump?format=debug").await;
    assert!(debug.contains(WEB_CERT), "{debug}");
    assert!(debug.contains("[redacted]"), "{debug}");
    assert!(
        !debug.contains(&format!("{:?}", second.key.as_bytes())),
        "the debug dump shows the private key"
    );
    agent.terminate();
    store.stop().await;
}

/// The `/config_dump` JSON names the secret and carries its chain but not its key.
fn assert_no_key(dump: &str, pem: &Pem) {
    let doc: Value = serde_json::from_str(dump).unwrap();
    let secrets = doc["generators"]["envoy"]["SDS"].as_array().unwrap();
    let base64 = base64::engine::general_purpose::STANDARD;
    let mut seen = false;
    for entry in secrets {
        let bytes = base64.decode(entry["resource"].as_str().unwrap()).unwrap();
        assert!(
            !bytes
                .windows(pem.key.len())
                .any(|w| w == pem.key.as_bytes()),
            "/config_dump shows the private key of {}",
            entry["name"]
        );
        let secret = Secret::decode(bytes.as_slice()).unwrap();
        if secret.name == WEB_CERT {
            let (chain, key) = chain_and_key(&secret);
            assert_eq!(chain, pem.chain.as_bytes());
            assert_eq!(key, b"[redacted]");
            seen = true;
        }
    }
    assert!(seen, "{WEB_CERT} is in /config_dump: {secrets:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_subscribers_get_the_credential_and_its_ca() {
    let (data, run, cache, credentials) = (tempdir(), tempdir(), tempdir(), tempdir());
    let pem = self_signed("web.example.com");
    mount(&credentials.path().join("web-cert"), 1, &pem, "THE-CA");
    let store = StoreServer::start(data.path(), 0).await;
    store.apply(&[gateway()]).await;
    let agent = start(&store, run.path(), cache.path(), credentials.path());
    until_served(&agent, &[WEB_CERT, WEB_CA]).await;

    let mut envoy = FakeDeltaClient::connect(&agent.uds, router_node()).await;
    envoy
        .subscribe(SDS, &[WEB_CERT, WEB_CA, "kubernetes://absent"], &[])
        .await;
    let sds = envoy.recv().await;
    assert_eq!(kind_of(&sds.type_url), SDS);
    let got: Vec<String> = common::delta_names(&sds)
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(got, [WEB_CERT, WEB_CA]);
    for resource in &sds.resources {
        let secret = secret_of(resource.resource.as_ref().unwrap());
        assert_eq!(secret.name, resource.name);
        match &secret.r#type {
            Some(secret::Type::ValidationContext(v)) => {
                assert_eq!(inline(v.trusted_ca.as_ref()), b"THE-CA");
            }
            _ => assert_eq!(chain_and_key(&secret).1, pem.key.as_bytes()),
        }
    }
    envoy.ack(&sds).await;

    // The stream goes on: the gateway's listeners come on it as usual.
    envoy.subscribe(LDS, &[], &[]).await;
    let lds = envoy.recv().await;
    assert_eq!(kind_of(&lds.type_url), LDS);
    assert!(
        common::delta_names(&lds)
            .iter()
            .any(|(name, _)| name.ends_with("_443"))
    );
    envoy.ack(&lds).await;

    // A credential unmounted goes away on the client.
    std::fs::remove_dir_all(credentials.path().join("web-cert")).unwrap();
    let removed = envoy.recv().await;
    assert_eq!(kind_of(&removed.type_url), SDS);
    let mut gone = removed.removed_resources.clone();
    gone.sort();
    assert_eq!(gone, [WEB_CERT, WEB_CA]);
    agent.terminate();
    store.stop().await;
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}
