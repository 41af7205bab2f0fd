//! The store API over mutual TLS: `pasa-store` started with `--grpc-tls-cert`, `--grpc-tls-key`,
//! `--grpc-client-ca` and `--grpc-operator`, and clients holding certificates of a fake CA.
//! What a client may do is decided by its certificate's identity, never by the node ID it
//! claims.

mod common;

use std::path::Path;

use pasa_proto::client::{ClientTls, connect_with};
use pasa_proto::store::v1::store_client::StoreClient;
use pasa_proto::store::v1::{
    ApplyRequest, ListProxyStatusRequest, ListRequest, Rule, StatusRequest, SubscriberIdentity,
    Subscription,
};
use pasa_proto::watch::{Watch, WatchError, WatchEvent, WatchStart};
use pasa_testing::pki::FakeCa;
use serde_json::json;
use tonic::Code;
use tonic::transport::Channel;

const OPERATOR: &str = "spiffe://cluster.local/ns/pasa-system/sa/pasa-pcp";
const STORE: &str = "spiffe://cluster.local/ns/pasa-system/sa/pasa-store";

/// A client certificate of `ca` for `uri`, as a client's TLS settings.
fn client_tls(ca: &FakeCa, dir: &Path, name: &str, uri: &str) -> ClientTls {
    let (cert, key) = ca.issue(Some(uri), &[]).write(dir, name);
    ClientTls::from_files(&dir.join("ca.pem"), &cert, &key).expect("client TLS")
}

async fn client(addr: &str, tls: &ClientTls) -> StoreClient<Channel> {
    connect_with(addr, Some(tls)).await.expect("connect")
}

/// `pasa-store` serving mutual TLS with a certificate of `ca` for 127.0.0.1, its files in `dir`
/// (`ca.pem` written there): the process, its gRPC and admin addresses, and its certificate's
/// and key's files.
async fn secured_store(
    ca: &FakeCa,
    dir: &Path,
) -> (
    tokio::process::Child,
    String,
    std::net::SocketAddr,
    (std::path::PathBuf, std::path::PathBuf),
) {
    ca.write(dir);
    let (cert, key) = ca
        .issue(Some(STORE), &["127.0.0.1", "localhost"])
        .write(dir, "store");
    let data = dir.join("data");
    let (child, addr, admin) = common::start_process_with_admin([
        "--data-dir".as_ref(),
        data.as_os_str(),
        "--grpc-tls-cert".as_ref(),
        cert.as_os_str(),
        "--grpc-tls-key".as_ref(),
        key.as_os_str(),
        "--grpc-client-ca".as_ref(),
        dir.join("ca.pem").as_os_str(),
        "--grpc-operator".as_ref(),
        OPERATOR.as_ref(),
    ])
    .await;
    (child, addr, admin, (cert, key))
}

/// Whether the server at `addr` answers a status request made with `tls`.
async fn answers(addr: &str, tls: Option<&ClientTls>) -> bool {
    match connect_with(addr, tls).await {
        Ok(mut client) => client.status(StatusRequest {}).await.is_ok(),
        Err(_) => false,
    }
}

fn scope(namespaces: &[&str]) -> Subscription {
    Subscription {
        rules: vec![
            Rule {
                kinds: vec!["Sidecar".into(), "AuthorizationPolicy".into()],
                namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            },
            Rule {
                kinds: vec!["ServiceEntry".into()],
                ..Default::default()
            },
        ],
    }
}

fn as_node(node: &str, subscription: Subscription) -> WatchStart {
    WatchStart {
        subscription,
        from_revision: 0,
        identity: Some(SubscriberIdentity {
            node_id: node.into(),
            ..Default::default()
        }),
    }
}

/// The first thing a watch says after its snapshot began, or why it was refused.
async fn first_answer(client: &mut StoreClient<Channel>, start: WatchStart) -> Result<u64, String> {
    let mut watch = Watch::open(client, start)
        .await
        .map_err(|e| e.to_string())?;
    loop {
        match tokio::time::timeout(common::WAIT, watch.next())
            .await
            .expect("an answer in time")
        {
            Ok(WatchEvent::InitDone { revision, .. }) => return Ok(revision),
            Ok(_) => {}
            Err(WatchError::Refused(status)) => {
                assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
                return Err(status.message().to_string());
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identities_decide_what_clients_may_read_and_write() {
    let dir = tempfile::tempdir().unwrap();
    let ca = FakeCa::new("cluster.local");
    let (mut child, addr, admin, _) = secured_store(&ca, dir.path()).await;

    // Plaintext, or a certificate of another CA, does not get in at all.
    assert!(
        !answers(&addr, None).await,
        "a plaintext client got an answer"
    );
    let stranger_ca = FakeCa::new("elsewhere");
    let stranger_dir = dir.path().join("stranger");
    std::fs::create_dir_all(&stranger_dir).unwrap();
    let (s_cert, s_key) = stranger_ca
        .issue(Some(OPERATOR), &[])
        .write(&stranger_dir, "op");
    let stranger = ClientTls::from_files(&dir.path().join("ca.pem"), &s_cert, &s_key).unwrap();
    assert!(
        !answers(&addr, Some(&stranger)).await,
        "a certificate of another CA got an answer"
    );

    // The operator writes.
    let operator = client_tls(&ca, dir.path(), "operator", OPERATOR);
    let mut op = client(&addr, &operator).await;
    let docs = [
        json!({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
               "metadata": {"name": "default", "namespace": "shop"},
               "spec": {"egress": [{"hosts": ["./*"]}]}}),
        json!({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
               "metadata": {"name": "default", "namespace": "bank"},
               "spec": {"egress": [{"hosts": ["./*"]}]}}),
    ];
    let applied = op
        .apply(ApplyRequest {
            documents: docs.iter().map(common::doc).collect(),
            dry_run: false,
        })
        .await
        .expect("the operator may write")
        .into_inner();
    assert!(applied.errors.is_empty(), "{:?}", applied.errors);

    // A workload of `shop` watches as a proxy of `shop`, and sees shop's Sidecar.
    let shop = client_tls(
        &ca,
        dir.path(),
        "shop",
        "spiffe://cluster.local/ns/shop/sa/web",
    );
    let mut web = client(&addr, &shop).await;
    let node = "sidecar~10.0.0.7~web-1.shop~shop.svc.cluster.local";
    let revision = first_answer(&mut web, as_node(node, scope(&["shop", "istio-system"])))
        .await
        .expect("shop may watch as shop");
    assert!(revision >= 2);

    // Claiming to be a proxy of `bank` does not give shop's certificate bank's policies.
    let bank_node = "sidecar~10.0.0.8~teller-1.bank~bank.svc.cluster.local";
    let refused = first_answer(
        &mut web,
        as_node(bank_node, scope(&["bank", "istio-system"])),
    )
    .await
    .expect_err("shop may not watch as bank");
    assert!(
        refused.starts_with("identity.node_id: names namespace \"bank\", not the caller's"),
        "{refused}"
    );
    assert!(
        refused.contains("spiffe://cluster.local/ns/shop/sa/web"),
        "{refused}"
    );
    // Nor does asking for bank's policies as itself.
    let refused = first_answer(&mut web, as_node(node, scope(&["shop", "bank"])))
        .await
        .expect_err("shop may not read bank's policies");
    assert!(
        refused.starts_with("subscription.rules[0].namespaces: "),
        "{refused}"
    );
    let list = web
        .list(ListRequest {
            selector: Some(scope(&["bank"])),
            revision: 0,
        })
        .await
        .expect_err("shop may not list bank's policies");
    assert_eq!(list.code(), Code::PermissionDenied);

    // A workload writes nothing and lists no other proxies.
    let write = web
        .apply(ApplyRequest {
            documents: vec![common::doc(&docs[1])],
            dry_run: false,
        })
        .await
        .expect_err("a workload may not write");
    assert_eq!(write.code(), Code::PermissionDenied);
    assert!(
        write.message().contains("may not write"),
        "{}",
        write.message()
    );
    let proxies =
        pasa_proto::client::list_proxy_status(&mut web, ListProxyStatusRequest::default())
            .await
            .expect_err("a workload may not list every proxy");
    assert_eq!(proxies.code(), Code::PermissionDenied);
    // The operator may.
    pasa_proto::client::list_proxy_status(&mut op, ListProxyStatusRequest::default())
        .await
        .expect("the operator lists proxies");

    // A certificate whose identity is neither an operator nor a workload gets nothing.
    let odd = client_tls(&ca, dir.path(), "odd", "https://example.com/someone");
    let status = client(&addr, &odd)
        .await
        .status(StatusRequest {})
        .await
        .expect_err("an unknown identity is refused");
    assert_eq!(status.code(), Code::PermissionDenied);

    // So is a workload of another trust domain, whatever its namespace.
    let foreign = client_tls(
        &ca,
        dir.path(),
        "foreign",
        "spiffe://other.org/ns/shop/sa/web",
    );
    let status = client(&addr, &foreign)
        .await
        .status(StatusRequest {})
        .await
        .expect_err("another trust domain is refused");
    assert!(
        status
            .message()
            .contains("is not of this mesh's trust domain or its aliases (cluster.local)"),
        "{}",
        status.message()
    );

    // Every refusal was counted.
    let metrics = common::http_get(admin, "/metrics").await;
    for (method, reason) in [
        ("Watch", "identity"),
        ("Watch", "namespace"),
        ("List", "namespace"),
        ("Apply", "write"),
        ("ListProxyStatus", "proxy_status"),
    ] {
        let line =
            format!("pasa_store_api_denied_total{{method=\"{method}\",reason=\"{reason}\"}} 1");
        assert!(metrics.contains(&line), "no {line} in\n{metrics}");
    }
    child.kill().await.unwrap();
}

/// The server's certificate is read again when its files change: after a rotation to a
/// certificate of another CA, clients trusting only that CA get in, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_server_certificate_is_used_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ca = FakeCa::new("cluster.local");
    let (_child, addr, _, (cert, key)) = secured_store(&ca, dir.path()).await;
    // Clients keep their certificates of the first CA; they trust the server's new CA only.
    let rotated_ca = FakeCa::new("rotated");
    let rotated_dir = dir.path().join("rotated");
    std::fs::create_dir_all(&rotated_dir).unwrap();
    let rotated_ca_file = rotated_ca.write(&rotated_dir);
    let (op_cert, op_key) = ca.issue(Some(OPERATOR), &[]).write(dir.path(), "operator");
    let trusting_rotated = ClientTls::from_files(&rotated_ca_file, &op_cert, &op_key).unwrap();
    assert!(
        !answers(&addr, Some(&trusting_rotated)).await,
        "the server presented the new CA's certificate before the rotation"
    );
    let issued = rotated_ca.issue(Some(STORE), &["127.0.0.1"]);
    std::fs::write(&key, &issued.key).unwrap();
    std::fs::write(&cert, &issued.cert).unwrap();
    let deadline = std::time::Instant::now() + common::WAIT;
    while !answers(&addr, Some(&trusting_rotated)).await {
        assert!(
            std::time::Instant::now() < deadline,
            "the rotated certificate was never used"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
