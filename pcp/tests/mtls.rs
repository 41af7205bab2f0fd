//! PCP's API over mutual TLS (`--grpc-tls-cert`, `--grpc-tls-key`, `--grpc-client-ca`,
//! `--grpc-operator`), with its embedded store and in front of a remote store it reaches over
//! mutual TLS itself (`--store-ca`, `--store-cert`, `--store-key`); `pasactl --ca --cert --key`.
//! PCP relays whom it serves, so the store applies the same rules to an agent behind PCP as to
//! one that reaches it directly.

mod common;

use std::path::{Path, PathBuf};

use common::{Pcp, examples, pasactl};
use pasa_proto::client::{ClientTls, connect_with};
use pasa_proto::store::v1::{Rule, SubscriberIdentity, Subscription};
use pasa_proto::watch::{Watch, WatchError, WatchEvent, WatchStart};
use pasa_testing::pki::FakeCa;

const OPERATOR: &str = "spiffe://cluster.local/ns/pasa-system/sa/admin";
const PCP: &str = "spiffe://cluster.local/ns/pasa-system/sa/pasa-pcp";
const SHOP: &str = "spiffe://cluster.local/ns/shop/sa/web";

struct Pki {
    ca: FakeCa,
    dir: PathBuf,
}

impl Pki {
    fn new(dir: &Path) -> Pki {
        let ca = FakeCa::new("cluster.local");
        ca.write(dir);
        Pki {
            ca,
            dir: dir.to_path_buf(),
        }
    }

    fn ca(&self) -> String {
        path(&self.dir.join("ca.pem"))
    }

    /// Certificate and key files for `uri` (and loopback as a server name).
    fn issue(&self, name: &str, uri: &str) -> (String, String) {
        let (cert, key) = self
            .ca
            .issue(Some(uri), &["127.0.0.1"])
            .write(&self.dir, name);
        (path(&cert), path(&key))
    }

    fn client(&self, name: &str, uri: &str) -> ClientTls {
        let (cert, key) = self.issue(name, uri);
        ClientTls::from_files(Path::new(&self.ca()), Path::new(&cert), Path::new(&key)).unwrap()
    }

    /// pasactl's credentials as `uri`: CA, certificate and key paths.
    fn ctl_as(&self, uri: &str) -> Creds {
        let name = uri.rsplit('/').next().unwrap();
        let (cert, key) = self.issue(&format!("ctl-{name}"), uri);
        Creds {
            ca: self.ca(),
            cert,
            key,
        }
    }
}

/// pasactl's TLS files.
#[derive(Clone)]
struct Creds {
    ca: String,
    cert: String,
    key: String,
}

/// `pasactl --server ADDR --ca --cert --key` with `args`.
fn ctl(addr: &str, creds: &Creds, args: &[&str]) -> std::process::Output {
    std::process::Command::new(pasactl())
        .args([
            "--server",
            addr,
            "--ca",
            &creds.ca,
            "--cert",
            &creds.cert,
            "--key",
            &creds.key,
        ])
        .args(args)
        .output()
        .expect("run pasactl")
}

fn path(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A watch as the proxy `node` of `shop`'s policies: its first complete answer, or the refusal.
async fn watch_as(addr: &str, tls: &ClientTls, node: &str) -> Result<u64, String> {
    let mut client = connect_with(addr, Some(tls)).await.unwrap();
    let start = WatchStart {
        subscription: Subscription {
            rules: vec![Rule {
                kinds: vec!["Sidecar".into(), "AuthorizationPolicy".into()],
                namespaces: vec!["shop".into(), "istio-system".into()],
                ..Default::default()
            }],
        },
        from_revision: 0,
        identity: Some(SubscriberIdentity {
            node_id: node.into(),
            ..Default::default()
        }),
    };
    let mut watch = Watch::open(&mut client, start)
        .await
        .map_err(|e| e.to_string())?;
    loop {
        match tokio::time::timeout(common::WAIT, watch.next())
            .await
            .expect("an answer in time")
        {
            Ok(WatchEvent::InitDone { revision, .. }) => return Ok(revision),
            Ok(_) => {}
            Err(WatchError::Refused(status)) => return Err(status.message().to_string()),
            Err(e) => panic!("unexpected {e}"),
        }
    }
}

const SHOP_NODE: &str = "sidecar~10.0.0.7~web-1.shop~shop.svc.cluster.local";
const BANK_NODE: &str = "sidecar~10.0.0.8~teller-1.bank~bank.svc.cluster.local";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pcp_serves_mutual_tls_and_relays_whom_it_serves() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let (cert, key) = pki.issue("pcp", PCP);
    let data = dir.path().join("data");
    let pcp = Pcp::start_args(&[
        "--data-dir",
        &path(&data),
        "--grpc-tls-cert",
        &cert,
        "--grpc-tls-key",
        &key,
        "--grpc-client-ca",
        &pki.ca(),
        "--grpc-operator",
        OPERATOR,
    ]);
    let addr = pcp.addr.clone();
    let shop_dir = path(&examples().join("shop"));

    // pasactl as an operator writes; without its certificate it gets nowhere.
    let (operator, workload) = (pki.ctl_as(OPERATOR), pki.ctl_as(SHOP));
    let commands = {
        let addr = addr.clone();
        let shop_dir = shop_dir.clone();
        tokio::task::spawn_blocking(move || {
            let applied = ctl(&addr, &operator, &["apply", "-f", &shop_dir]);
            assert!(applied.status.success(), "{}", stderr(&applied));
            let plain = std::process::Command::new(pasactl())
                .args(["--server", &addr, "status"])
                .output()
                .unwrap();
            assert!(!plain.status.success(), "plaintext pasactl got in");
            // A workload's certificate may not write, nor list every proxy.
            let refused = ctl(&addr, &workload, &["apply", "-f", &shop_dir]);
            assert!(!refused.status.success());
            assert!(
                stderr(&refused).contains("spiffe://cluster.local/ns/shop/sa/web may not write"),
                "{}",
                stderr(&refused)
            );
            let refused = ctl(&addr, &workload, &["proxy-status"]);
            assert!(!refused.status.success());
            assert!(
                stderr(&refused).contains("may not list proxy status"),
                "{}",
                stderr(&refused)
            );
            // A missing file is named.
            let missing = std::process::Command::new(pasactl())
                .args([
                    "--server",
                    &addr,
                    "--ca",
                    "/nonexistent/ca.pem",
                    "--cert",
                    "x",
                    "--key",
                    "y",
                    "status",
                ])
                .output()
                .unwrap();
            assert!(
                stderr(&missing).contains("/nonexistent/ca.pem"),
                "{}",
                stderr(&missing)
            );
        })
    };
    commands.await.unwrap();

    // A workload of shop watches through PCP as shop; as bank it is refused by the (embedded)
    // store, to which PCP relayed whom it serves.
    let shop = pki.client("web", SHOP);
    watch_as(&addr, &shop, SHOP_NODE)
        .await
        .expect("shop as shop");
    let refused = watch_as(&addr, &shop, BANK_NODE).await.unwrap_err();
    assert!(
        refused.starts_with("identity.node_id: names namespace \"bank\""),
        "{refused}"
    );
    // istiod's debug types answer operators and the root namespace only.
    let debug = |tls: ClientTls| {
        let addr = addr.clone();
        async move {
            use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
            use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
            let channel = pasa_proto::client::channel(&addr, Some(&tls))
                .await
                .unwrap();
            let ask = DiscoveryRequest {
                type_url: "istio.io/debug/syncz".into(),
                ..Default::default()
            };
            let answer = AggregatedDiscoveryServiceClient::new(channel)
                .stream_aggregated_resources(tokio_stream::iter([ask]))
                .await;
            match answer {
                Ok(mut stream) => stream.get_mut().message().await.map(|_| ()),
                Err(status) => Err(status),
            }
        }
    };
    let refused = debug(shop.clone()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    debug(pki.client("istiod", "spiffe://cluster.local/ns/istio-system/sa/istiod"))
        .await
        .expect("the root namespace may ask");
    let metrics = pcp.metrics();
    for (method, reason) in [
        ("Apply", "write"),
        ("ListProxyStatus", "proxy_status"),
        ("Watch", "identity"),
        ("DebugXds", "debug"),
    ] {
        let line =
            format!("pasa_store_api_denied_total{{method=\"{method}\",reason=\"{reason}\"}} 1");
        assert!(metrics.contains(&line), "no {line} in\n{metrics}");
    }
    pcp.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pcp_reaches_a_remote_store_over_mutual_tls() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    // The store, in this process, trusting PCP as an operator.
    let (store_cert, store_key) = pki.issue(
        "store",
        "spiffe://cluster.local/ns/pasa-system/sa/pasa-store",
    );
    let (access, tls) = pasa_store::access::TlsArgs {
        grpc_tls_cert: Some(store_cert.into()),
        grpc_tls_key: Some(store_key.into()),
        grpc_client_ca: Some(pki.ca().into()),
        grpc_operator: vec![PCP.into()],
    }
    .load("istio-system")
    .unwrap();
    let backend = pasa_store::backend::sled::SledBackend::open(&dir.path().join("store")).unwrap();
    let store = pasa_store::Store::open(
        std::sync::Arc::new(backend),
        pasa_store::StoreConfig::default(),
        pasa_store::metrics::Metrics::new(),
    )
    .unwrap();
    let bound = pasa_store::server::bind(
        store,
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap()
    .secured(access, tls);
    let store_addr = bound.grpc_addr().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(bound.run("test-store", async move {
        let _ = stopped.await;
    }));

    // PCP in front of it, itself serving mutual TLS.
    let (cert, key) = pki.issue("pcp", PCP);
    let pcp = Pcp::start_args(&[
        "--store",
        &store_addr,
        "--store-ca",
        &pki.ca(),
        "--store-cert",
        &cert,
        "--store-key",
        &key,
        "--grpc-tls-cert",
        &cert,
        "--grpc-tls-key",
        &key,
        "--grpc-client-ca",
        &pki.ca(),
        "--grpc-operator",
        OPERATOR,
    ]);
    let addr = pcp.addr.clone();
    let shop_dir = path(&examples().join("shop"));
    let operator = pki.ctl_as(OPERATOR);
    let applied =
        tokio::task::spawn_blocking(move || ctl(&addr, &operator, &["apply", "-f", &shop_dir]))
            .await
            .unwrap();
    assert!(applied.status.success(), "{}", stderr(&applied));

    // The remote store decides for the workload PCP relays.
    let shop = pki.client("web", SHOP);
    let revision = watch_as(&pcp.addr, &shop, SHOP_NODE)
        .await
        .expect("shop as shop");
    assert!(revision > 0);
    let refused = watch_as(&pcp.addr, &shop, BANK_NODE).await.unwrap_err();
    assert!(
        refused.starts_with("identity.node_id: names namespace \"bank\""),
        "{refused}"
    );
    pcp.terminate();
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}
