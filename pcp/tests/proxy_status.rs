//! The real `pasactl proxy-status` against a real `pasa-pcp`, fed by a fake agent reporter (a
//! gRPC client sending the reports an agent would): the table, the detail page with the NACK, JSON
//! output, an unknown proxy (exit 1), and `--proxy-status-expiry`. The same command over real
//! agents is tested in the agent's `proxy_status` test.

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
        }),
        ..Default::default()
    }
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
    let pcp = Pcp::start_args(&["--data-dir", data, "--proxy-status-expiry", "1s"]);

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
            "NAME", "TYPE", "CDS", "LDS", "EDS", "RDS", "REVISION", "LAG", "DEGRADED", "VERSION"
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
