//! A **fake** Kubernetes API server, for tests and `pasa-bench` only (feature
//! `fake-apiserver`, never in PASA's binaries): plain HTTP on loopback, the resources the
//! tests name (namespaces, services, pods, nodes, EndpointSlices, leases, Istio kinds), list and
//! watch as the real one answers them: one resource version counter for everything (as etcd
//! has), a list carries the collection's `resourceVersion`; a watch from a resource version
//! replays what changed after it, sends a BOOKMARK when asked for them, then streams changes as
//! newline-delimited JSON; a watch from a version compacted away gets an ERROR event with status
//! 410 (Expired). Namespaced collections are served across namespaces (`/api/v1/services`) and
//! per namespace (`/api/v1/namespaces/NS/services`). Objects can be read one by one, created
//! (POST) and replaced (PUT, with optimistic concurrency on `metadata.resourceVersion`), which is
//! what a Lease needs. Tests change objects, compact the history and cut open watches through
//! its methods.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::{broadcast, watch};

/// A collection: the API path prefix (`api/v1`, `apis/GROUP/VERSION`) and plural name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Collection {
    prefix: String,
    plural: String,
}

/// Where the objects of `apiVersion` and `kind` are served, and whether they are namespaced.
fn collection_of(api_version: &str, kind: &str) -> (Collection, bool) {
    let prefix = if api_version.contains('/') {
        format!("apis/{api_version}")
    } else {
        format!("api/{api_version}")
    };
    let plural = match kind {
        "EndpointSlice" => "endpointslices",
        "Namespace" => "namespaces",
        "Node" => "nodes",
        "Pod" => "pods",
        "Service" => "services",
        "Lease" => "leases",
        "VirtualService" => "virtualservices",
        "DestinationRule" => "destinationrules",
        "ServiceEntry" => "serviceentries",
        "WorkloadEntry" => "workloadentries",
        "Sidecar" => "sidecars",
        "Gateway" => "gateways",
        "PeerAuthentication" => "peerauthentications",
        "AuthorizationPolicy" => "authorizationpolicies",
        "RequestAuthentication" => "requestauthentications",
        "EnvoyFilter" => "envoyfilters",
        "WorkloadGroup" => "workloadgroups",
        "ProxyConfig" => "proxyconfigs",
        "Telemetry" => "telemetries",
        "WasmPlugin" => "wasmplugins",
        "TrafficExtension" => "trafficextensions",
        "Ingress" => "ingresses",
        "IngressClass" => "ingressclasses",
        "Secret" => "secrets",
        "ConfigMap" => "configmaps",
        "GatewayClass" => "gatewayclasses",
        "HTTPRoute" => "httproutes",
        "GRPCRoute" => "grpcroutes",
        "TCPRoute" => "tcproutes",
        "TLSRoute" => "tlsroutes",
        "ReferenceGrant" => "referencegrants",
        "BackendTLSPolicy" => "backendtlspolicies",
        "ListenerSet" => "listenersets",
        "XBackendTrafficPolicy" => "xbackendtrafficpolicies",
        "XBackend" => "xbackends",
        "InferencePool" => "inferencepools",
        other => panic!("the fake API server does not serve {other}"),
    }
    .to_string();
    let namespaced = !matches!(kind, "Namespace" | "Node" | "IngressClass" | "GatewayClass");
    (Collection { prefix, plural }, namespaced)
}

/// The `apiVersion` of a collection's objects.
fn api_version_of(collection: &Collection) -> &str {
    let p = collection.prefix.as_str();
    p.strip_prefix("apis/")
        .or_else(|| p.strip_prefix("api/"))
        .unwrap_or(p)
}

/// (collection, namespace, name).
type ObjectKey = (Collection, String, String);

#[derive(Default)]
struct History {
    revision: u64,
    objects: BTreeMap<ObjectKey, Value>,
    /// (revision, event type, object, collection) after `oldest`.
    log: Vec<Event>,
    oldest: u64,
}

#[derive(Clone)]
struct Event {
    revision: u64,
    kind: &'static str,
    object: Value,
    collection: Collection,
}

struct Shared {
    history: Mutex<History>,
    live: broadcast::Sender<Event>,
    /// Bumped to end every open watch.
    cuts: watch::Sender<u64>,
    lists: Mutex<BTreeMap<String, usize>>,
    watches: AtomicUsize,
    /// Collections answered 404, as for a CRD (or version) not installed.
    unserved: Mutex<Vec<Collection>>,
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

fn key_of(object: &Value) -> ObjectKey {
    let api_version = object["apiVersion"].as_str().expect("apiVersion");
    let kind = object["kind"].as_str().expect("kind");
    let (collection, namespaced) = collection_of(api_version, kind);
    let namespace = if namespaced {
        object["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string()
    } else {
        String::new()
    };
    let name = object["metadata"]["name"].as_str().expect("metadata.name");
    (collection, namespace, name.to_string())
}

impl FakeApiServer {
    pub async fn start() -> FakeApiServer {
        let (live, _) = broadcast::channel(4096);
        let shared = Arc::new(Shared {
            history: Mutex::new(History::default()),
            live,
            cuts: watch::channel(0).0,
            lists: Mutex::new(BTreeMap::new()),
            watches: AtomicUsize::new(0),
            unserved: Mutex::new(Vec::new()),
        });
        let app = Router::new().fallback(serve).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        FakeApiServer { addr, shared, task }
    }

    /// A client of this server, the real `kube` client.
    pub fn client(&self) -> kube::Client {
        let config = kube::Config::new(format!("http://{}", self.addr).parse().unwrap());
        kube::Client::try_from(config).unwrap()
    }

    /// Creates or replaces `object` (a complete object with apiVersion, kind and metadata); the
    /// server sets its uid and resourceVersion.
    pub fn put(&self, object: Value) {
        let mut h = self.shared.history.lock().unwrap();
        put_locked(&self.shared, &mut h, object);
    }

    /// Creates or changes the namespace `name` with `labels`.
    pub fn put_namespace(&self, name: &str, labels: &[(&str, &str)]) {
        let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
        self.put(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": labels},
        }));
    }

    /// Deletes an object (`namespace` is ignored for cluster-scoped kinds).
    pub fn delete(&self, api_version: &str, kind: &str, namespace: &str, name: &str) {
        let (collection, namespaced) = collection_of(api_version, kind);
        let namespace = if namespaced { namespace } else { "" };
        let key = (collection, namespace.to_string(), name.to_string());
        let mut h = self.shared.history.lock().unwrap();
        delete_locked(&self.shared, &mut h, &key);
    }

    /// Deletes the namespace `name`.
    pub fn delete_namespace(&self, name: &str) {
        self.delete("v1", "Namespace", "", name);
    }

    /// The object stored under that name, if any.
    pub fn get(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let (collection, namespaced) = collection_of(api_version, kind);
        let namespace = if namespaced { namespace } else { "" };
        let h = self.shared.history.lock().unwrap();
        h.objects
            .get(&(collection, namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// Answers 404 for the collection of `kind` at `api_version` from now on, as an API server
    /// without that CRD (or that version of it) does.
    pub fn unserve(&self, api_version: &str, kind: &str) {
        let (collection, _) = collection_of(api_version, kind);
        self.shared.unserved.lock().unwrap().push(collection);
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

    /// Lists served, of every collection.
    pub fn lists(&self) -> usize {
        self.shared.lists.lock().unwrap().values().sum()
    }

    /// Lists served of one collection (its plural name).
    pub fn lists_of(&self, plural: &str) -> usize {
        self.shared
            .lists
            .lock()
            .unwrap()
            .get(plural)
            .copied()
            .unwrap_or(0)
    }

    pub fn watches(&self) -> usize {
        self.shared.watches.load(Ordering::SeqCst)
    }
}

fn put_locked(shared: &Shared, h: &mut History, mut object: Value) -> Value {
    let key = key_of(&object);
    h.revision += 1;
    let uid = h
        .objects
        .get(&key)
        .map(|o| o["metadata"]["uid"].clone())
        .unwrap_or_else(|| json!(format!("uid-{}-{}-{}", key.0.plural, key.1, key.2)));
    let metadata = &mut object["metadata"];
    metadata["uid"] = uid;
    metadata["resourceVersion"] = json!(h.revision.to_string());
    if !key.1.is_empty() {
        metadata["namespace"] = json!(key.1);
    }
    let kind = if h.objects.insert(key.clone(), object.clone()).is_some() {
        "MODIFIED"
    } else {
        "ADDED"
    };
    let event = Event {
        revision: h.revision,
        kind,
        object: object.clone(),
        collection: key.0,
    };
    h.log.push(event.clone());
    let _ = shared.live.send(event);
    object
}

fn delete_locked(shared: &Shared, h: &mut History, key: &ObjectKey) -> Option<Value> {
    let mut object = h.objects.remove(key)?;
    h.revision += 1;
    object["metadata"]["resourceVersion"] = json!(h.revision.to_string());
    let event = Event {
        revision: h.revision,
        kind: "DELETED",
        object: object.clone(),
        collection: key.0.clone(),
    };
    h.log.push(event.clone());
    let _ = shared.live.send(event);
    Some(object)
}

/// What a request path names.
struct Target {
    collection: Collection,
    /// `None`: every namespace (or a cluster-scoped collection).
    namespace: Option<String>,
    name: Option<String>,
}

fn parse_path(path: &str) -> Option<Target> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (prefix, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => (format!("api/{version}"), rest),
        ["apis", group, version, rest @ ..] => (format!("apis/{group}/{version}"), rest),
        _ => return None,
    };
    let collection = |plural: &str| Collection {
        prefix: prefix.clone(),
        plural: plural.to_string(),
    };
    Some(match rest {
        [plural] => Target {
            collection: collection(plural),
            namespace: None,
            name: None,
        },
        ["namespaces", ns, plural] => Target {
            collection: collection(plural),
            namespace: Some(ns.to_string()),
            name: None,
        },
        ["namespaces", ns, plural, name] => Target {
            collection: collection(plural),
            namespace: Some(ns.to_string()),
            name: Some(name.to_string()),
        },
        [plural, name] => Target {
            collection: collection(plural),
            namespace: None,
            name: Some(name.to_string()),
        },
        _ => return None,
    })
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn status(code: StatusCode, reason: &str, message: String) -> Response {
    json_response(
        code,
        &json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                "reason": reason, "code": code.as_u16(), "message": message}),
    )
}

async fn serve(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    Query(query): Query<BTreeMap<String, String>>,
    body: Bytes,
) -> Response {
    let Some(target) = parse_path(uri.path()) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("no route {}", uri.path()),
        );
    };
    if shared.unserved.lock().unwrap().contains(&target.collection) {
        let message = format!("{} is not served", uri.path());
        return status(StatusCode::NOT_FOUND, "NotFound", message);
    }
    match (method, &target.name) {
        (Method::GET, None) if query.get("watch").map(String::as_str) == Some("true") => {
            watch_collection(shared, target, &query)
        }
        (Method::GET, None) => list(&shared, &target),
        (Method::GET, Some(name)) => {
            let h = shared.history.lock().unwrap();
            let key = (
                target.collection.clone(),
                target.namespace.clone().unwrap_or_default(),
                name.clone(),
            );
            match h.objects.get(&key) {
                Some(object) => json_response(StatusCode::OK, object),
                None => status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("{name} not found"),
                ),
            }
        }
        (Method::POST, None) | (Method::PUT, Some(_)) => {
            let Ok(mut object) = serde_json::from_slice::<Value>(&body) else {
                return status(StatusCode::BAD_REQUEST, "BadRequest", "not JSON".into());
            };
            // The namespace is the path's, as the API server has it.
            if let Some(ns) = &target.namespace {
                object["metadata"]["namespace"] = json!(ns);
            }
            let key = key_of(&object);
            let mut h = shared.history.lock().unwrap();
            let existing = h.objects.get(&key).cloned();
            match (&existing, target.name.is_some()) {
                (Some(_), false) => {
                    return status(
                        StatusCode::CONFLICT,
                        "AlreadyExists",
                        format!("{} exists", key.2),
                    );
                }
                (None, true) => {
                    return status(
                        StatusCode::NOT_FOUND,
                        "NotFound",
                        format!("{} not found", key.2),
                    );
                }
                (Some(old), true) => {
                    let asked = &object["metadata"]["resourceVersion"];
                    if asked != &old["metadata"]["resourceVersion"] {
                        return status(
                            StatusCode::CONFLICT,
                            "Conflict",
                            format!("the object {} has been modified", key.2),
                        );
                    }
                }
                (None, false) => {}
            }
            let stored = put_locked(&shared, &mut h, object);
            let code = if existing.is_some() {
                StatusCode::OK
            } else {
                StatusCode::CREATED
            };
            json_response(code, &stored)
        }
        (Method::DELETE, Some(name)) => {
            let key = (
                target.collection.clone(),
                target.namespace.clone().unwrap_or_default(),
                name.clone(),
            );
            let mut h = shared.history.lock().unwrap();
            match delete_locked(&shared, &mut h, &key) {
                Some(object) => json_response(StatusCode::OK, &object),
                None => status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("{name} not found"),
                ),
            }
        }
        (method, _) => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("{method} is not served here"),
        ),
    }
}

/// Whether an object of `collection` belongs to what `target` names.
fn in_target(target: &Target, collection: &Collection, object: &Value) -> bool {
    *collection == target.collection
        && target
            .namespace
            .as_deref()
            .is_none_or(|ns| object["metadata"]["namespace"].as_str() == Some(ns))
}

fn list(shared: &Shared, target: &Target) -> Response {
    *shared
        .lists
        .lock()
        .unwrap()
        .entry(target.collection.plural.clone())
        .or_default() += 1;
    let h = shared.history.lock().unwrap();
    let items: Vec<&Value> = h
        .objects
        .iter()
        .filter(|((c, _, _), o)| in_target(target, c, o))
        .map(|(_, o)| o)
        .collect();
    json_response(
        StatusCode::OK,
        &json!({
            "apiVersion": "v1",
            "kind": "List",
            "metadata": {"resourceVersion": h.revision.to_string()},
            "items": items,
        }),
    )
}

fn watch_collection(
    shared: Arc<Shared>,
    target: Target,
    query: &BTreeMap<String, String>,
) -> Response {
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
            for e in &h.log {
                if e.revision > from && in_target(&target, &e.collection, &e.object) {
                    first.push(line(json!({"type": e.kind, "object": e.object})));
                }
            }
            if bookmarks {
                first.push(line(json!({
                    "type": "BOOKMARK",
                    "object": {
                        "apiVersion": api_version_of(&target.collection),
                        "kind": target.collection.plural,
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
                    Ok(e) => {
                        if !in_target(&target, &e.collection, &e.object) {
                            continue;
                        }
                        if tx.send(line(json!({"type": e.kind, "object": e.object}))).await.is_err() {
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
