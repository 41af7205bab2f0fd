//! The real `pasactl proxy-status` against a real `pasa-pcp`, fed by a fake agent reporter (a
//! gRPC client sending the reports an agent would): the table, the detail page with the NACK, JSON
//! output, an unknown proxy (exit 1), `--proxy-status-expiry`, and istiod's `/debug/syncz` on
//! PCP's admin endpoint. The same command over real agents is tested in the agent's
//! `proxy_status` test.

mod common;

use std::time::{Duration, Instant};

use common::{Pcp, WAIT};
use pasa_proto::store::v1::{
    NackInfo, ProxyStatus, ProxyType, ReportStatusRequest, SyncState, TypeSyncStatus, XdsSyncStatus,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// Sends status reports as an agent would, on one stream, until dropped.
struct FakeAgentReporter {
    _tx: mpsc::Sender<ReportStatusRequest>,
    call: tokio::task::JoinHandle<()>,
}

impl FakeAgentReporter {
    async fn start(server: &str, status: ProxyStatus) -> FakeAgentReporter {
        let channel = pasa_proto::client::endpoint(server)
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = pasa_proto::client::store_client(channel);
        let (tx, rx) = mpsc::channel(4);
        tx.send(ReportStatusRequest {
            status: Some(status),
        })
        .await
        .unwrap();
        let call = tokio::spawn(async move {
            let _ = client.report_status(ReceiverStream::new(rx)).await;
        });
        FakeAgentReporter { _tx: tx, call }
    }
}

impl Drop for FakeAgentReporter {
    fn drop(&mut self) {
        self.call.abort();
    }
}

fn t(state: SyncState, sent: &str, acked: &str) -> Option<TypeSyncStatus> {
    Some(TypeSyncStatus {
        state: state as i32,
        version_sent: sent.into(),
        version_acked: acked.into(),
        last_nack: None,
    })
}

fn status(pod: &str, ns: &str, proxy_type: ProxyType, lds: Option<TypeSyncStatus>) -> ProxyStatus {
    let kind = if proxy_type == ProxyType::Router {
        "router"
    } else {
        "sidecar"
    };
    ProxyStatus {
        node_id: format!("{kind}~10.0.0.1~{pod}.{ns}~{ns}.svc.cluster.local"),
        pod_name: pod.into(),
        namespace: ns.into(),
        proxy_type: proxy_type as i32,
        agent_version: "0.1.0".into(),
        admin_address: "10.0.0.1:15000".into(),
        applied_revision: 0,
        heartbeat_interval_ms: 30_000,
        xds: Some(XdsSyncStatus {
            cds: t(SyncState::Synced, "c1", "c1"),
            lds,
            eds: t(SyncState::Synced, "e1", "e1"),
            rds: t(SyncState::NotSent, "", ""),
            ecds: t(SyncState::Synced, "x1", "x1"),
        }),
        ..Default::default()
    }
}

/// Asks PCP for `istio.io/debug/syncz` over ADS, as `istioctl proxy-status --xds-address`
/// does (node metadata `GENERATOR=event`), and renders each `ClientConfig` as istioctl's table
/// row: proxy, cluster, control plane ID (from the response's identifier), version, and each
/// type's status. An unknown debug type is refused, naming where PASA shows it.
async fn istioctl_rows(server: &str) -> Vec<String> {
    use envoy_types::pb::envoy::config::core::v3::Node;
    use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
    use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
    use envoy_types::pb::envoy::service::status::v3::{ClientConfig, ConfigStatus};
    use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
    use prost::Message;

    let channel = pasa_proto::client::endpoint(server)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    let node = Node {
        id: "istioctl~0.0.0.0~istioctl.istio-system~istio-system.svc.cluster.local".into(),
        metadata: Some(Struct {
            fields: [(
                "GENERATOR".to_string(),
                Value {
                    kind: Some(Kind::StringValue("event".into())),
                },
            )]
            .into_iter()
            .collect(),
        }),
        ..Default::default()
    };
    // As istioctl's client sends it: a nonce of its own on the request.
    let ask = |type_url: &str| DiscoveryRequest {
        node: Some(node.clone()),
        type_url: type_url.into(),
        response_nonce: "2026-12-04 04:51:47.266 +0000 UTC".into(),
        ..Default::default()
    };
    let mut answers = client
        .stream_aggregated_resources(tokio_stream::iter([ask("istio.io/debug/syncz")]))
        .await
        .unwrap()
        .into_inner();
    let response = answers.message().await.unwrap().expect("an answer");
    let control_plane: serde_json::Value =
        serde_json::from_str(&response.control_plane.unwrap().identifier).unwrap();
    let short = |t: &str| match t.rsplit('.').next().unwrap_or_default() {
        "Cluster" => "CDS",
        "Listener" => "LDS",
        "ClusterLoadAssignment" => "EDS",
        "RouteConfiguration" => "RDS",
        "TypedExtensionConfig" => "ECDS",
        other => panic!("unexpected type {other}"),
    };
    let rows = response
        .resources
        .iter()
        .map(|any| {
            assert_eq!(
                any.type_url,
                "type.googleapis.com/envoy.service.status.v3.ClientConfig"
            );
            let config = ClientConfig::decode(any.value.as_slice()).unwrap();
            let node = config.node.unwrap();
            let meta = |k: &str| match &node.metadata.as_ref().unwrap().fields[k].kind {
                Some(Kind::StringValue(v)) => v.clone(),
                other => panic!("{k}: {other:?}"),
            };
            let types: Vec<String> = config
                .generic_xds_configs
                .iter()
                .map(|c| {
                    let status = ConfigStatus::try_from(c.config_status).unwrap();
                    format!("{}={}", short(&c.type_url), status.as_str_name())
                })
                .collect();
            format!(
                "{} {} {} {} {}",
                node.id,
                meta("CLUSTER_ID"),
                control_plane["ID"].as_str().unwrap(),
                meta("ISTIO_VERSION"),
                types.join(" ")
            )
        })
        .collect();
    let refused = client
        .stream_aggregated_resources(tokio_stream::iter([ask("istio.io/debug/config_dump")]))
        .await
        .unwrap()
        .into_inner()
        .message()
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unimplemented);
    assert!(
        refused.message().contains("pasactl proxy-config"),
        "{refused}"
    );
    rows
}

/// GET `path` on PCP's admin endpoint: status and body.
fn http_get(pcp: &Pcp, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(pcp.admin).unwrap();
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    conn.read_to_string(&mut response).unwrap();
    let code = response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `pasactl` until `ok` holds for its standard output (guarded by `WAIT`).
fn until(pcp: &Pcp, args: &[&str], ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let out = pcp.ok(args);
        if ok(&out) {
            return out;
        }
        assert!(Instant::now() < deadline, "timed out; last output:\n{out}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pasactl_proxy_status_lists_details_and_expires() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let pcp = Pcp::start_args(&[
        "--data-dir",
        data,
        "--proxy-status-expiry",
        "1s",
        "--identity",
        "pcp-test",
    ]);

    let gateway = FakeAgentReporter::start(
        &pcp.addr,
        status(
            "ingress-1",
            "istio-system",
            ProxyType::Router,
            t(SyncState::Synced, "l1", "l1"),
        ),
    )
    .await;
    let mut rejected = t(SyncState::Stale, "l2", "l1");
    if let Some(lds) = &mut rejected {
        lds.last_nack = Some(NackInfo {
            error: "Error adding/updating listener(s) 0.0.0.0_80: duplicate listener".into(),
            version: "l2".into(),
            time_unix_ms: 1,
        });
    }
    let web = FakeAgentReporter::start(
        &pcp.addr,
        status("web-1", "shop", ProxyType::Sidecar, rejected),
    )
    .await;

    let table = until(&pcp, &["proxy-status"], |t| t.lines().count() == 3);
    let lines: Vec<Vec<&str>> = table
        .lines()
        .map(|l| {
            l.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .collect()
        })
        .collect();
    assert_eq!(
        lines[0],
        [
            "NAME", "TYPE", "CDS", "LDS", "EDS", "RDS", "ECDS", "REVISION", "LAG", "DEGRADED",
            "VERSION"
        ]
    );
    assert_eq!(
        lines[1],
        [
            "ingress-1.istio-system",
            "router",
            "SYNCED",
            "SYNCED",
            "SYNCED",
            "NOT SENT",
            "SYNCED",
            "0",
            "0",
            "no",
            "0.1.0"
        ]
    );
    assert_eq!(lines[2][0..4], ["web-1.shop", "sidecar", "SYNCED", "STALE"]);

    // One namespace only.
    let shop = pcp.ok(&["proxy-status", "-n", "shop"]);
    assert_eq!(shop.lines().count(), 2, "{shop}");

    // The detail page names the NACK's error; JSON carries it too.
    let page = pcp.ok(&["proxy-status", "web-1.shop"]);
    assert!(
        page.contains("LAST NACK   LDS rejected version \"l2\""),
        "{page}"
    );
    assert!(page.contains("duplicate listener"), "{page}");
    assert!(
        page.contains("REVISION    applied 0, store 0 (lag 0)"),
        "{page}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&pcp.ok(&["proxy-status", "web-1", "-o", "json"])).unwrap();
    assert_eq!(json["xds"]["LDS"]["state"], "STALE");
    assert_eq!(
        json["xds"]["LDS"]["last_nack"]["error"],
        "Error adding/updating listener(s) 0.0.0.0_80: duplicate listener"
    );

    // istiod's /debug/syncz, as Kiali and scripts read it, from the same reports.
    let syncz = http_get(&pcp, "/debug/syncz");
    assert_eq!(syncz.0, 200, "{}", syncz.1);
    let entries: Vec<serde_json::Value> = serde_json::from_str(&syncz.1).unwrap();
    assert_eq!(entries.len(), 2, "{}", syncz.1);
    // Field for field as istiod writes an entry (its JSON names; empty fields left out).
    assert_eq!(
        entries[0],
        serde_json::json!({
            "cluster_id": "Kubernetes", "proxy": "ingress-1.istio-system", "proxy_type": "router",
            "proxy_version": "0.1.0", "istio_version": "0.1.0",
            "cluster_sent": "c1", "cluster_acked": "c1",
            "listener_sent": "l1", "listener_acked": "l1",
            "endpoint_sent": "e1", "endpoint_acked": "e1",
            "extensionconfig_sent": "x1", "extensionconfig_acked": "x1",
        })
    );
    // What Kiali makes of each pair (its rule: nothing sent is NOT_SENT, equal is Synced, no
    // acknowledgement Stale (Never Acknowledged), else Stale).
    let kiali = |e: &serde_json::Value, t: &str| {
        let field = |k: &str| e[format!("{t}_{k}")].as_str().unwrap_or("").to_string();
        match (field("sent"), field("acked")) {
            (s, _) if s.is_empty() => "NOT_SENT",
            (s, a) if s == a => "Synced",
            (_, a) if a.is_empty() => "Stale (Never Acknowledged)",
            _ => "Stale",
        }
    };
    let web_entry = &entries[1];
    assert_eq!(web_entry["proxy"], "web-1.shop");
    assert_eq!(
        ["cluster", "listener", "endpoint", "route"].map(|t| kiali(web_entry, t)),
        ["Synced", "Stale", "Synced", "NOT_SENT"]
    );
    let shop_only = http_get(&pcp, "/debug/syncz?namespace=shop").1;
    let shop_only: Vec<serde_json::Value> = serde_json::from_str(&shop_only).unwrap();
    assert_eq!(shop_only.len(), 1);

    // The xDS form `istioctl proxy-status` asks for, read as istioctl reads it.
    let rows = istioctl_rows(&pcp.addr).await;
    assert_eq!(
        rows,
        [
            // RDS, never asked for, is left out: istioctl shows it IGNORED.
            "ingress-1.istio-system Kubernetes pcp-test 0.1.0 CDS=SYNCED LDS=SYNCED EDS=SYNCED ECDS=SYNCED",
            "web-1.shop Kubernetes pcp-test 0.1.0 CDS=SYNCED LDS=STALE EDS=SYNCED ECDS=SYNCED",
        ]
    );

    // An unknown proxy is an error, exit 1.
    let out = pcp.ctl(&["proxy-status", "nope.shop"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no proxy \"nope.shop\""),
        "{}",
        text(&out.stderr)
    );

    // A reporter that goes away shows as lost contact, then expires.
    drop(web);
    until(&pcp, &["proxy-status"], |t| !t.contains("web-1.shop"));
    let left = pcp.ok(&["proxy-status"]);
    assert!(left.contains("ingress-1.istio-system"), "{left}");
    drop(gateway);
    pcp.terminate();
}
