//! The workload certificate by CSR to Istio's CA (`--ca-address`), with the real binary and a
//! fake CA (TLS on loopback, real X.509, SPIFFE URI SANs):
//!
//! - the agent authenticates with the pod's token and cluster ID, and serves `default` (the
//!   signed chain, with a key of its own making whose public half the certificate carries) and
//!   `ROOTCA` (the chain's root) over SDS;
//! - it renews before expiry with a new key, and the renewal is pushed;
//! - a refused request is counted and retried, and the token is read again for each request.

mod common;

use std::time::Instant;

use common::agent::{Agent, WAIT};
use common::ca::FakeCa;
use common::store::StoreServer;
use common::{FakeSotwClient, SDS, kind_of};
use envoy_types::pb::envoy::config::core::v3::{DataSource, Node, data_source::Specifier};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{Secret, secret};
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
use prost::Message;

const NODE: &str = "sidecar~10.10.0.1~web-1.shop~shop.svc.cluster.local";
const WEB: &str = "spiffe://cluster.local/ns/shop/sa/web";

fn inline(source: Option<&DataSource>) -> String {
    match source.and_then(|s| s.specifier.as_ref()) {
        Some(Specifier::InlineBytes(bytes)) => String::from_utf8(bytes.clone()).expect("PEM"),
        other => panic!("not inline bytes: {other:?}"),
    }
}

/// The workload certificate's chain and key, and the root, of an SDS response holding both.
struct Served {
    version: String,
    chain: String,
    key: String,
    root: String,
}

fn served(response: &DiscoveryResponse) -> Option<Served> {
    let mut chain_key = None;
    let mut root = None;
    for any in &response.resources {
        let secret = Secret::decode(any.value.as_slice()).expect("a secret");
        match (secret.name.as_str(), secret.r#type) {
            ("default", Some(secret::Type::TlsCertificate(tls))) => {
                chain_key = Some((
                    inline(tls.certificate_chain.as_ref()),
                    inline(tls.private_key.as_ref()),
                ));
            }
            ("ROOTCA", Some(secret::Type::ValidationContext(v))) => {
                root = Some(inline(v.trusted_ca.as_ref()));
            }
            (name, other) => panic!("unexpected secret {name}: {other:?}"),
        }
    }
    let ((chain, key), root) = (chain_key?, root?);
    Some(Served {
        version: response.version_info.clone(),
        chain,
        key,
        root,
    })
}

/// Asks for `default` and `ROOTCA` and waits for a response with both (ACKing each).
async fn next_certificate(envoy: &mut FakeSotwClient, after: Option<&str>) -> Served {
    let names = ["default", "ROOTCA"];
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(Instant::now() < deadline, "no workload certificate served");
        let response = envoy.recv().await;
        assert_eq!(kind_of(&response.type_url), SDS);
        envoy.ack(&response, &names).await;
        if let Some(served) = served(&response)
            && Some(served.version.as_str()) != after
        {
            return served;
        }
    }
}

/// The URI SANs and the public key of the first certificate of `pem`.
fn leaf(pem: &str) -> (Vec<String>, Vec<u8>) {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).expect("PEM");
    let cert = block.parse_x509().expect("X.509");
    let sans = cert
        .subject_alternative_name()
        .expect("SAN extension")
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::URI(uri) => Some(uri.to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    (sans, cert.public_key().raw.to_vec())
}

fn public_key_of(key_pem: &str) -> Vec<u8> {
    use rcgen::PublicKeyData as _;
    rcgen::KeyPair::from_pem(key_pem)
        .expect("the served key parses")
        .subject_public_key_info()
}

fn node() -> Node {
    Node {
        id: NODE.into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workload_certificate_comes_from_istios_ca_and_is_renewed() {
    let data = tempfile::tempdir().expect("temporary directory");
    let store = StoreServer::start(&data.path().join("db"), 0).await;
    let ca = FakeCa::start(&[("token-web", WEB)]).await;
    let mut args = ca.agent_args(&data.path().join("ca"), "token-web");
    args.extend(
        [
            "--service-account",
            "web",
            "--cluster-id",
            "east",
            "--secret-ttl",
            "3s",
        ]
        .map(String::from),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = Agent::start_in(NODE, store.addr, &data.path().join("agent"), &args);

    let mut envoy = FakeSotwClient::connect(&agent.uds, node()).await;
    envoy.request(SDS, &["default", "ROOTCA"], "", "").await;
    let first = next_certificate(&mut envoy, None).await;
    let (sans, public_key) = leaf(&first.chain);
    assert_eq!(sans, [WEB], "signed for the caller's identity");
    assert_eq!(
        public_key,
        public_key_of(&first.key),
        "the certificate carries the public half of the served key"
    );
    assert_eq!(first.root, ca.root_pem, "ROOTCA is the chain's root");
    assert!(
        first.chain.ends_with(&ca.root_pem),
        "default holds the whole chain, root last"
    );
    let seen = ca.seen();
    assert_eq!(seen[0].authorization, "Bearer token-web");
    assert_eq!(seen[0].cluster_id, "east");
    assert_eq!(seen[0].validity_seconds, 3);

    // Half of the 3 s life later, a new key and a new certificate are pushed.
    let renewed_at = Instant::now();
    let second = next_certificate(&mut envoy, Some(&first.version)).await;
    println!(
        "renewed after {} ms of a 3 s certificate",
        renewed_at.elapsed().as_millis()
    );
    assert_ne!(second.key, first.key, "a new key for each certificate");
    assert_eq!(leaf(&second.chain).1, public_key_of(&second.key));
    assert!(ca.seen().len() >= 2);

    let (_, metrics) = agent.get("/metrics").await;
    assert!(
        metrics.contains("pasa_agent_ca_requests_total "),
        "{metrics}"
    );
    assert!(metrics.contains("pasa_agent_ca_request_failures_total 0"));
    assert!(metrics.contains("pasa_agent_workload_cert_expiry_timestamp_seconds "));
    agent.terminate();
    store.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_is_counted_and_retried_with_the_token_read_again() {
    let data = tempfile::tempdir().expect("temporary directory");
    let store = StoreServer::start(&data.path().join("db"), 0).await;
    let ca = FakeCa::start(&[("token-web", WEB)]).await;
    let ca_dir = data.path().join("ca");
    let mut args = ca.agent_args(&ca_dir, "an-old-token");
    args.extend(["--service-account", "web"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = Agent::start_in(NODE, store.addr, &data.path().join("agent"), &args);
    agent
        .until("/metrics", "a refused certificate request", |_, m| {
            m.contains("pasa_agent_ca_request_failures_total 1")
        })
        .await;
    let seen = ca.seen();
    assert_eq!(seen[0].authorization, "Bearer an-old-token");
    assert!(seen[0].signed_for.is_none());

    // The kubelet rotates the projected token: the next attempt uses it and succeeds.
    std::fs::write(ca_dir.join("istio-token"), "token-web\n").expect("rotate the token");
    let mut envoy = FakeSotwClient::connect(&agent.uds, node()).await;
    envoy.request(SDS, &["default", "ROOTCA"], "", "").await;
    let served = next_certificate(&mut envoy, None).await;
    assert_eq!(leaf(&served.chain).0, [WEB]);
    assert!(ca.seen().last().is_some_and(|s| s.signed_for.is_some()));
    agent.terminate();
    store.stop().await;
}
