//! Helpers for the store's integration tests: an in-process server on loopback, a watch client,
//! documents, and the conformance corpus.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use pasa_proto::store::v1::store_client::StoreClient;
use pasa_proto::store::v1::{
    ApplyDocument, ApplyRequest, ApplyResponse, Event, EventType, Rule, Subscription, WatchCreate,
    WatchRequest, WatchResponse, WatchUpdate, watch_request, watch_response,
};
use pasa_store::backend::sled::SledBackend;
use pasa_store::metrics::Metrics;
use pasa_store::{Store, StoreConfig};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tonic::transport::Channel;

/// How long a test waits for something the server must send.
pub const WAIT: Duration = Duration::from_secs(20);

pub struct TestServer {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub store: Store,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl TestServer {
    /// A sled-backed store in `dir`, served on a free loopback port.
    pub async fn start(dir: &Path, config: StoreConfig) -> TestServer {
        let backend = SledBackend::open(dir).expect("open sled");
        let store = Store::open(Arc::new(backend), config, Metrics::new()).expect("open store");
        let bound = pasa_store::server::bind(
            store.clone(),
            "127.0.0.1:0".parse().unwrap(),
            "127.0.0.1:0".parse().unwrap(),
        )
        .await
        .expect("bind");
        let (addr, admin) = (bound.grpc_addr(), bound.admin_addr());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(bound.run("test-store", async move {
            let _ = stopped.await;
        }));
        TestServer {
            addr,
            admin,
            store,
            stop: Some(stop),
            task,
        }
    }

    pub async fn client(&self) -> StoreClient<Channel> {
        StoreClient::connect(format!("http://{}", self.addr))
            .await
            .expect("connect")
    }

    /// Graceful stop: watches end, writes drain, sled flushes.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.await.expect("server task").expect("server");
    }
}

/// Starts the `pasa-store` binary on free loopback ports with `args`, and waits for its ready
/// line: the process (killed when dropped) and its gRPC address.
pub async fn start_process<I, S>(args: I) -> (tokio::process::Child, String)
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let (child, addr, _) = start_process_with_admin(args).await;
    (child, addr)
}

/// [`start_process`], also answering the admin address.
pub async fn start_process_with_admin<I, S>(args: I) -> (tokio::process::Child, String, SocketAddr)
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_pasa-store"))
        .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start pasa-store");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let line = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .expect("ready line in time")
        .expect("read stdout")
        .expect("a ready line");
    let (addr, admin) = pasa_store::server::parse_ready_line(&line)
        .unwrap_or_else(|| panic!("unexpected ready line {line:?}"));
    (child, addr.to_string(), admin)
}

/// A plain HTTP/1.1 GET; returns the whole response.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out
}

/// A watch stream with a fence rule (namespace `fence`) added to every subscription, so a test
/// can prove that nothing else arrived: write a fence object and read up to it.
pub struct Watch {
    tx: mpsc::Sender<WatchRequest>,
    stream: tonic::Streaming<WatchResponse>,
    pub last_revision: u64,
}

pub fn fenced(mut rules: Vec<Rule>) -> Subscription {
    rules.push(Rule {
        namespaces: vec!["fence".into()],
        ..Default::default()
    });
    Subscription { rules }
}

impl Watch {
    pub async fn open(client: &mut StoreClient<Channel>, rules: Vec<Rule>, from: u64) -> Watch {
        Self::open_raw(client, fenced(rules), from).await
    }

    pub async fn open_raw(
        client: &mut StoreClient<Channel>,
        subscription: Subscription,
        from: u64,
    ) -> Watch {
        let (tx, rx) = mpsc::channel(4);
        tx.send(WatchRequest {
            request: Some(watch_request::Request::Create(WatchCreate {
                subscription: Some(subscription),
                from_revision: from,
                identity: None,
            })),
        })
        .await
        .unwrap();
        let stream = client
            .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .expect("watch")
            .into_inner();
        Watch {
            tx,
            stream,
            last_revision: 0,
        }
    }

    pub async fn next(&mut self) -> WatchResponse {
        let msg = tokio::time::timeout(WAIT, self.stream.message())
            .await
            .expect("timed out waiting for a watch message")
            .expect("watch stream error")
            .expect("watch stream ended");
        match &msg.response {
            Some(watch_response::Response::Events(b)) => {
                for e in &b.events {
                    self.last_revision = self.last_revision.max(e.revision);
                }
            }
            Some(watch_response::Response::Synced(s)) => self.last_revision = s.revision,
            Some(watch_response::Response::Progress(p)) => self.last_revision = p.revision,
            _ => {}
        }
        msg
    }

    /// Events up to the SYNCED marker, and its revision.
    pub async fn until_synced(&mut self) -> (Vec<Event>, u64) {
        let mut events = Vec::new();
        loop {
            match self.next().await.response {
                Some(watch_response::Response::Events(b)) => events.extend(b.events),
                Some(watch_response::Response::Synced(s)) => return (events, s.revision),
                Some(watch_response::Response::Progress(_)) => {}
                other => panic!("unexpected before SYNCED: {other:?}"),
            }
        }
    }

    /// Events (fences excluded) up to the fence object `fence/<name>`.
    pub async fn until_fence(&mut self, name: &str) -> Vec<Event> {
        let mut events = Vec::new();
        loop {
            match self.next().await.response {
                Some(watch_response::Response::Events(b)) => {
                    for e in b.events {
                        let r = e.resource.as_ref().unwrap();
                        if r.namespace == "fence" {
                            if r.name == name {
                                return events;
                            }
                        } else {
                            events.push(e);
                        }
                    }
                }
                Some(
                    watch_response::Response::Progress(_) | watch_response::Response::Synced(_),
                ) => {}
                other => panic!("unexpected before fence {name}: {other:?}"),
            }
        }
    }

    pub async fn update(&self, rules: Vec<Rule>) {
        self.tx
            .send(WatchRequest {
                request: Some(watch_request::Request::Update(WatchUpdate {
                    subscription: Some(fenced(rules)),
                })),
            })
            .await
            .unwrap();
    }
}

/// Writes the fence object `fence/<name>`.
pub async fn fence(client: &mut StoreClient<Channel>, name: &str) {
    apply_ok(
        client,
        vec![
            json!({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
            "metadata": {"name": name, "namespace": "fence"}, "spec": {}}),
        ],
    )
    .await;
}

pub fn doc(v: &Value) -> ApplyDocument {
    ApplyDocument {
        json: v.to_string(),
        expected_mod_revision: None,
    }
}

pub async fn apply(client: &mut StoreClient<Channel>, docs: Vec<Value>) -> ApplyResponse {
    client
        .apply(ApplyRequest {
            documents: docs.iter().map(doc).collect(),
            dry_run: false,
        })
        .await
        .expect("apply rpc")
        .into_inner()
}

pub async fn apply_ok(client: &mut StoreClient<Channel>, docs: Vec<Value>) -> ApplyResponse {
    let r = apply(client, docs).await;
    assert!(r.errors.is_empty(), "apply errors: {:?}", r.errors);
    r
}

/// `(TYPE, kind/namespace/name)` of events, fences left out, as a sorted set.
pub fn summary(events: &[Event]) -> BTreeSet<String> {
    events
        .iter()
        .filter(|e| e.resource.as_ref().is_some_and(|r| r.namespace != "fence"))
        .map(|e| {
            let r = e.resource.as_ref().unwrap();
            let t = EventType::try_from(e.r#type).unwrap().as_str_name();
            format!(
                "{} {}/{}/{}",
                t.trim_start_matches("EVENT_TYPE_"),
                r.kind,
                r.namespace,
                r.name
            )
        })
        .collect()
}

pub fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// The conformance corpus, when it has `samples/`; says loudly that it skipped otherwise.
pub fn conformance_dir() -> Option<PathBuf> {
    pasa_testing::conformance_dir("samples")
}

/// The Kubernetes Services of a platform manifest as the store's ServiceEndpoints.
pub fn services_as_service_endpoints(docs: &[Value]) -> Vec<Value> {
    docs.iter()
        .filter(|d| d["kind"] == "Service")
        .map(|svc| {
            let ns = svc["metadata"]["namespace"].as_str().unwrap_or("default");
            json!({
                "apiVersion": "pasa.io/v1alpha1",
                "kind": "ServiceEndpoints",
                "metadata": {"name": svc["metadata"]["name"], "namespace": ns,
                             "labels": svc["metadata"]["labels"]},
                "spec": {"ports": svc["spec"]["ports"], "selector": svc["spec"]["selector"]}
            })
        })
        .collect()
}
