//! A **fake** Kubernetes API server, for tests only: plain HTTP on loopback, one resource
//! (`/api/v1/namespaces`), list and watch as the real one answers them: a list carries the
//! collection's `resourceVersion`; a watch from a resource version replays what changed after it,
//! sends a BOOKMARK when asked for them, then streams changes as newline-delimited JSON; a watch
//! from a version compacted away gets an ERROR event with status 410 (Expired). Tests change
//! objects, compact the history and cut open watches through its methods.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::response::Response;
use axum::routing::get;
use serde_json::{Value, json};
use tokio::sync::{broadcast, watch};

#[derive(Default)]
struct History {
    revision: u64,
    objects: BTreeMap<String, Value>,
    /// (revision, event type, object) after `oldest`.
    log: Vec<(u64, &'static str, Value)>,
    oldest: u64,
}

struct Shared {
    history: Mutex<History>,
    live: broadcast::Sender<(u64, &'static str, Value)>,
    /// Bumped to end every open watch.
    cuts: watch::Sender<u64>,
    lists: AtomicUsize,
    watches: AtomicUsize,
}

pub struct FakeApiServer {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn namespace(name: &str, labels: &BTreeMap<String, String>, revision: u64) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "uid": format!("uid-{name}"),
            "labels": labels,
            "resourceVersion": revision.to_string(),
        },
    })
}

impl FakeApiServer {
    pub async fn start() -> FakeApiServer {
        let (live, _) = broadcast::channel(1024);
        let shared = Arc::new(Shared {
            history: Mutex::new(History::default()),
            live,
            cuts: watch::channel(0).0,
            lists: AtomicUsize::new(0),
            watches: AtomicUsize::new(0),
        });
        let app = Router::new()
            .route("/api/v1/namespaces", get(namespaces))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        FakeApiServer { addr, shared, task }
    }

    /// Creates or changes the namespace `name` with `labels`.
    pub fn put(&self, name: &str, labels: &[(&str, &str)]) {
        let labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut h = self.shared.history.lock().unwrap();
        h.revision += 1;
        let object = namespace(name, &labels, h.revision);
        let kind = if h.objects.insert(name.into(), object.clone()).is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        let event = (h.revision, kind, object);
        h.log.push(event.clone());
        let _ = self.shared.live.send(event);
    }

    /// Deletes the namespace `name`.
    pub fn delete(&self, name: &str) {
        let mut h = self.shared.history.lock().unwrap();
        let Some(mut object) = h.objects.remove(name) else {
            return;
        };
        h.revision += 1;
        object["metadata"]["resourceVersion"] = json!(h.revision.to_string());
        let event = (h.revision, "DELETED", object);
        h.log.push(event.clone());
        let _ = self.shared.live.send(event);
    }

    /// Forgets the history: a watch from any earlier version now gets 410 Gone.
    pub fn compact(&self) {
        let mut h = self.shared.history.lock().unwrap();
        h.oldest = h.revision;
        h.log.clear();
    }

    /// Ends every open watch, as an API server restart or a timeout does.
    pub fn cut_watches(&self) {
        self.shared.cuts.send_modify(|n| *n += 1);
    }

    pub fn lists(&self) -> usize {
        self.shared.lists.load(Ordering::SeqCst)
    }

    pub fn watches(&self) -> usize {
        self.shared.watches.load(Ordering::SeqCst)
    }
}

async fn namespaces(
    State(shared): State<Arc<Shared>>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    if query.get("watch").map(String::as_str) != Some("true") {
        shared.lists.fetch_add(1, Ordering::SeqCst);
        let h = shared.history.lock().unwrap();
        let list = json!({
            "apiVersion": "v1",
            "kind": "NamespaceList",
            "metadata": {"resourceVersion": h.revision.to_string()},
            "items": h.objects.values().collect::<Vec<_>>(),
        });
        return Response::builder()
            .header("content-type", "application/json")
            .body(Body::from(list.to_string()))
            .unwrap();
    }
    shared.watches.fetch_add(1, Ordering::SeqCst);
    let from: u64 = query
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let bookmarks = query.get("allowWatchBookmarks").map(String::as_str) == Some("true");
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<String, std::io::Error>>(64);
    let line = |v: Value| Ok(format!("{v}\n"));
    let mut first: Vec<Result<String, std::io::Error>> = Vec::new();
    let (mut live, mut cuts) = {
        let h = shared.history.lock().unwrap();
        if from < h.oldest {
            first.push(line(json!({
                "type": "ERROR",
                "object": {
                    "apiVersion": "v1",
                    "kind": "Status",
                    "status": "Failure",
                    "reason": "Expired",
                    "code": 410,
                    "message": format!("too old resource version: {from} ({})", h.oldest),
                },
            })));
            (None, None)
        } else {
            for (revision, kind, object) in &h.log {
                if *revision > from {
                    first.push(line(json!({"type": kind, "object": object})));
                }
            }
            if bookmarks {
                first.push(line(json!({
                    "type": "BOOKMARK",
                    "object": {
                        "apiVersion": "v1",
                        "kind": "Namespace",
                        "metadata": {"resourceVersion": h.revision.to_string()},
                    },
                })));
            }
            let mut cuts = shared.cuts.subscribe();
            cuts.mark_unchanged();
            (Some(shared.live.subscribe()), Some(cuts))
        }
    };
    tokio::spawn(async move {
        for l in first {
            if tx.send(l).await.is_err() {
                return;
            }
        }
        let (Some(live), Some(cuts)) = (live.as_mut(), cuts.as_mut()) else {
            return;
        };
        loop {
            tokio::select! {
                // A cut made before a change ends the watch before that change is sent on it.
                biased;
                _ = cuts.changed() => return,
                event = live.recv() => match event {
                    Ok((_, kind, object)) => {
                        if tx.send(line(json!({"type": kind, "object": object}))).await.is_err() {
                            return;
                        }
                    }
                    Err(_) => return,
                },
            }
        }
    });
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from_stream(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ))
        .unwrap()
}
