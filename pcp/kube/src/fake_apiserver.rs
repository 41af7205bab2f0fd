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
//!
//! It refuses what the real one refuses, since a kinder fake hides exactly the defects a real
//! cluster shows first: a resource it does not serve (a CRD not installed, a group nobody
//! serves) is 404; with roles loaded ([`FakeApiServer::enforce_rbac`]) a service account may do
//! only what RBAC grants it (403 otherwise, in the API server's words); an object is created
//! only in a namespace that exists; bodies over 3 MiB and objects over 1.5 MiB are refused;
//! lists come in pages when asked, whose `continue` tokens expire with the history; label and
//! field selectors select what lists and watches return (an object that stops matching is
//! DELETED from a watch, one that starts ADDED), and a selector it cannot read is 400. A fake
//! can be started on a given address ([`FakeApiServer::start_at`]): a cluster that comes up
//! after its clients first tried it.

mod rbac;
mod selector;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::{broadcast, watch};

/// A collection: the API path prefix (`api/v1`, `apis/GROUP/VERSION`) and plural name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Collection {
    prefix: String,
    plural: String,
}

/// The kinds the fake serves: (kind, API group, plural). A collection of any other (group,
/// plural) is answered 404, as a real API server answers a resource it does not serve (a CRD
/// not installed, or a group nobody serves, such as PASA's store-only kinds).
const SERVED: &[(&str, &str, &str)] = &[
    ("EndpointSlice", "discovery.k8s.io", "endpointslices"),
    ("Namespace", "", "namespaces"),
    ("Node", "", "nodes"),
    ("Pod", "", "pods"),
    ("Service", "", "services"),
    ("Secret", "", "secrets"),
    ("ConfigMap", "", "configmaps"),
    ("Lease", "coordination.k8s.io", "leases"),
    ("VirtualService", "networking.istio.io", "virtualservices"),
    ("DestinationRule", "networking.istio.io", "destinationrules"),
    ("ServiceEntry", "networking.istio.io", "serviceentries"),
    ("WorkloadEntry", "networking.istio.io", "workloadentries"),
    ("Sidecar", "networking.istio.io", "sidecars"),
    ("Gateway", "networking.istio.io", "gateways"),
    ("EnvoyFilter", "networking.istio.io", "envoyfilters"),
    ("WorkloadGroup", "networking.istio.io", "workloadgroups"),
    ("ProxyConfig", "networking.istio.io", "proxyconfigs"),
    (
        "PeerAuthentication",
        "security.istio.io",
        "peerauthentications",
    ),
    (
        "AuthorizationPolicy",
        "security.istio.io",
        "authorizationpolicies",
    ),
    (
        "RequestAuthentication",
        "security.istio.io",
        "requestauthentications",
    ),
    ("Telemetry", "telemetry.istio.io", "telemetries"),
    ("WasmPlugin", "extensions.istio.io", "wasmplugins"),
    (
        "TrafficExtension",
        "extensions.istio.io",
        "trafficextensions",
    ),
    ("Ingress", "networking.k8s.io", "ingresses"),
    ("IngressClass", "networking.k8s.io", "ingressclasses"),
    (
        "GatewayClass",
        "gateway.networking.k8s.io",
        "gatewayclasses",
    ),
    ("Gateway", "gateway.networking.k8s.io", "gateways"),
    ("HTTPRoute", "gateway.networking.k8s.io", "httproutes"),
    ("GRPCRoute", "gateway.networking.k8s.io", "grpcroutes"),
    ("TCPRoute", "gateway.networking.k8s.io", "tcproutes"),
    ("TLSRoute", "gateway.networking.k8s.io", "tlsroutes"),
    (
        "ReferenceGrant",
        "gateway.networking.k8s.io",
        "referencegrants",
    ),
    (
        "BackendTLSPolicy",
        "gateway.networking.k8s.io",
        "backendtlspolicies",
    ),
    ("ListenerSet", "gateway.networking.k8s.io", "listenersets"),
    (
        "XBackendTrafficPolicy",
        "gateway.networking.x-k8s.io",
        "xbackendtrafficpolicies",
    ),
    ("XBackend", "gateway.networking.x-k8s.io", "xbackends"),
    (
        "InferencePool",
        "inference.networking.k8s.io",
        "inferencepools",
    ),
];

/// Where the objects of `apiVersion` and `kind` are served, and whether they are namespaced.
fn collection_of(api_version: &str, kind: &str) -> (Collection, bool) {
    let (group, prefix) = match api_version.rsplit_once('/') {
        Some((group, _)) => (group, format!("apis/{api_version}")),
        None => ("", format!("api/{api_version}")),
    };
    let Some((_, _, plural)) = SERVED.iter().find(|(k, g, _)| *k == kind && *g == group) else {
        panic!("the fake API server does not serve {kind} of {api_version}")
    };
    let namespaced = !matches!(kind, "Namespace" | "Node" | "IngressClass" | "GatewayClass");
    (
        Collection {
            prefix,
            plural: plural.to_string(),
        },
        namespaced,
    )
}

/// The API group of a collection (`""` for the core group).
fn group_of(collection: &Collection) -> &str {
    let version = api_version_of(collection);
    version.rsplit_once('/').map_or("", |(group, _)| group)
}

/// Whether the fake serves a collection at all (any version of a served group and plural).
fn served(collection: &Collection) -> bool {
    let group = group_of(collection);
    SERVED
        .iter()
        .any(|(_, g, p)| *g == group && *p == collection.plural)
}

/// The `apiVersion` of a collection's objects.
fn api_version_of(collection: &Collection) -> &str {
    let p = collection.prefix.as_str();
    p.strip_prefix("apis/")
        .or_else(|| p.strip_prefix("api/"))
        .unwrap_or(p)
}

/// The RBAC manifests PASA ships, in `deploy/base`: the syncer's ClusterRole and the Lease's
/// Role, with their bindings to PCP's service account `pasa-system/pasa-pcp`.
pub fn shipped_rbac() -> Vec<Value> {
    let base = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/base");
    [
        "clusterrole.yaml",
        "clusterrolebinding.yaml",
        "role.yaml",
        "rolebinding.yaml",
    ]
    .iter()
    .map(|file| {
        let path = base.join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    })
    .collect()
}

/// The RBAC `deploy/remote` ships for a remote cluster: what PCP's reader ServiceAccount
/// (`istio-system/istio-reader-service-account`) may do there.
pub fn shipped_remote_rbac() -> Vec<Value> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/remote");
    ["clusterrole.yaml", "clusterrolebinding.yaml"]
        .iter()
        .map(|file| {
            let path = dir.join(file);
            let text = std::fs::read_to_string(&path).unwrap();
            serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        })
        .collect()
}

/// [`shipped_rbac`] less `resource` (a plural) in its ClusterRole: a cluster whose
/// administrator left a kind out.
pub fn shipped_rbac_without(resource: &str) -> Vec<Value> {
    let mut rbac = shipped_rbac();
    for manifest in rbac.iter_mut().filter(|m| m["kind"] == "ClusterRole") {
        for rule in manifest["rules"].as_array_mut().into_iter().flatten() {
            if let Some(resources) = rule["resources"].as_array_mut() {
                resources.retain(|r| r != resource);
            }
        }
    }
    rbac
}

/// A ClusterRole that lets service account `namespace/name` get, list and watch `resource`
/// of `group`, and its binding: what an administrator grants to mend [`shipped_rbac_without`].
pub fn grant_reading(namespace: &str, name: &str, group: &str, resource: &str) -> Vec<Value> {
    let role = format!("read-{resource}");
    vec![
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": role},
               "rules": [{"apiGroups": [group], "resources": [resource],
                          "verbs": ["get", "list", "watch"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": role},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": role},
               "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]}),
    ]
}

/// A kubeconfig (YAML) whose current context reaches a fake at `addr` as cluster `cluster`,
/// with the token of PCP's service account (what `istioctl create-remote-secret` writes for a
/// remote cluster, but plain HTTP).
pub fn kubeconfig(addr: SocketAddr, cluster: &str) -> String {
    kubeconfig_of(addr, cluster, ("pasa-system", "pasa-pcp"))
}

/// [`kubeconfig`] with the token of service account `namespace/name` (the reader of
/// [`shipped_remote_rbac`], as `pasactl x create-remote-secret` writes it).
pub fn kubeconfig_of(addr: SocketAddr, cluster: &str, (namespace, name): (&str, &str)) -> String {
    let token = rbac::token_of(namespace, name);
    json!({
        "apiVersion": "v1", "kind": "Config", "current-context": cluster,
        "clusters": [{"name": cluster, "cluster": {"server": format!("http://{addr}")}}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": cluster}}],
        "users": [{"name": cluster, "user": {"token": token}}],
    })
    .to_string()
}

/// The largest request body the API server reads (3 MiB).
const MAX_REQUEST_BYTES: usize = 3 * 1024 * 1024;
/// The largest object etcd stores (1.5 MiB).
const MAX_OBJECT_BYTES: usize = 3 * 512 * 1024;

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
    /// What a MODIFIED object was before (a watch with a selector tells one that stops, or
    /// starts, matching as DELETED, or ADDED).
    previous: Option<Value>,
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
    /// Roles and bindings, once enforced: requests are then authorised as RBAC does.
    rbac: Mutex<Option<rbac::Rbac>>,
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
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        FakeApiServer::serve_on(listener)
    }

    /// A fake serving on `addr` (a cluster that comes up where its clients expected it).
    pub async fn start_at(addr: SocketAddr) -> FakeApiServer {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        FakeApiServer::serve_on(listener)
    }

    fn serve_on(listener: tokio::net::TcpListener) -> FakeApiServer {
        let (live, _) = broadcast::channel(4096);
        let shared = Arc::new(Shared {
            history: Mutex::new(History::default()),
            live,
            cuts: watch::channel(0).0,
            lists: Mutex::new(BTreeMap::new()),
            watches: AtomicUsize::new(0),
            unserved: Mutex::new(Vec::new()),
            rbac: Mutex::new(None),
        });
        let app = Router::new().fallback(serve).with_state(shared.clone());
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

    /// A client of this server that authenticates as the service account `namespace/name`
    /// (what a pod of that account, or a kubeconfig with its token, presents).
    pub fn client_as(&self, namespace: &str, name: &str) -> kube::Client {
        let mut config = kube::Config::new(format!("http://{}", self.addr).parse().unwrap());
        config.auth_info =
            serde_json::from_value(json!({"token": rbac::token_of(namespace, name)})).unwrap();
        kube::Client::try_from(config).unwrap()
    }

    /// The bearer token of the service account `namespace/name` (for a kubeconfig's user).
    pub fn token_for(namespace: &str, name: &str) -> String {
        rbac::token_of(namespace, name)
    }

    /// Authorises every request from now on as Kubernetes' RBAC does, with the Roles,
    /// ClusterRoles and their bindings among `manifests` (more calls add more): a service
    /// account ([`FakeApiServer::client_as`]) may do only what a role bound to it allows, and an
    /// anonymous client ([`FakeApiServer::client`]) nothing.
    pub fn enforce_rbac(&self, manifests: &[Value]) {
        let mut rbac = self.shared.rbac.lock().unwrap();
        rbac.get_or_insert_with(Default::default).load(manifests);
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
    let previous = h.objects.insert(key.clone(), object.clone());
    let kind = if previous.is_some() {
        "MODIFIED"
    } else {
        "ADDED"
    };
    let event = Event {
        revision: h.revision,
        kind,
        object: object.clone(),
        collection: key.0,
        previous,
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
        previous: None,
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
    /// The request's label and field selectors.
    selector: selector::Selector,
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
            selector: Default::default(),
        },
        ["namespaces", ns, plural] => Target {
            collection: collection(plural),
            namespace: Some(ns.to_string()),
            name: None,
            selector: Default::default(),
        },
        ["namespaces", ns, plural, name] => Target {
            collection: collection(plural),
            namespace: Some(ns.to_string()),
            name: Some(name.to_string()),
            selector: Default::default(),
        },
        [plural, name] => Target {
            collection: collection(plural),
            namespace: None,
            name: Some(name.to_string()),
            selector: Default::default(),
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
    headers: HeaderMap,
    Query(query): Query<BTreeMap<String, String>>,
    body: Bytes,
) -> Response {
    let Some(mut target) = parse_path(uri.path()) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("no route {}", uri.path()),
        );
    };
    target.selector = match selector::Selector::parse(
        query.get("labelSelector"),
        query.get("fieldSelector"),
        &target.collection.plural,
    ) {
        Ok(selector) => selector,
        Err(message) => return status(StatusCode::BAD_REQUEST, "BadRequest", message),
    };
    // Authorisation comes first: a resource nobody serves is refused 403 as well, as the real
    // API server refuses it to a caller whose roles do not name it.
    if let Some(rbac) = shared.rbac.lock().unwrap().as_ref() {
        let watching = query.get("watch").map(String::as_str) == Some("true");
        let verb = match (&method, &target.name) {
            (&Method::GET, None) if watching => "watch",
            (&Method::GET, None) => "list",
            (&Method::GET, Some(_)) => "get",
            (&Method::POST, _) => "create",
            (&Method::PUT, _) => "update",
            (&Method::DELETE, _) => "delete",
            _ => "unknown",
        };
        let attributes = rbac::Attributes {
            verb,
            group: group_of(&target.collection),
            resource: &target.collection.plural,
            namespace: target.namespace.as_deref(),
            name: target.name.as_deref(),
        };
        let authorization = headers.get("authorization").and_then(|v| v.to_str().ok());
        let subject = rbac::subject_of(authorization);
        if !rbac.allows(subject.as_ref(), &attributes) {
            let message = rbac::forbidden_message(subject.as_ref(), &attributes);
            return status(StatusCode::FORBIDDEN, "Forbidden", message);
        }
    }
    if !served(&target.collection) {
        let message = format!(
            "the server could not find the requested resource ({})",
            uri.path()
        );
        return status(StatusCode::NOT_FOUND, "NotFound", message);
    }
    if shared.unserved.lock().unwrap().contains(&target.collection) {
        let message = format!("{} is not served", uri.path());
        return status(StatusCode::NOT_FOUND, "NotFound", message);
    }
    match (method, &target.name) {
        (Method::GET, None) if query.get("watch").map(String::as_str) == Some("true") => {
            watch_collection(shared, target, &query)
        }
        (Method::GET, None) => list(&shared, &target, &query),
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
            // The API server's limits: a request body, and what etcd stores of one object.
            if body.len() > MAX_REQUEST_BYTES {
                let message = format!("Request entity too large: limit is {MAX_REQUEST_BYTES}");
                return status(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "RequestEntityTooLarge",
                    message,
                );
            }
            if body.len() > MAX_OBJECT_BYTES {
                let message = "etcdserver: request is too large".to_string();
                return status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", message);
            }
            let Ok(mut object) = serde_json::from_slice::<Value>(&body) else {
                return status(StatusCode::BAD_REQUEST, "BadRequest", "not JSON".into());
            };
            // The namespace is the path's, as the API server has it.
            if let Some(ns) = &target.namespace {
                object["metadata"]["namespace"] = json!(ns);
            }
            let key = key_of(&object);
            let mut h = shared.history.lock().unwrap();
            // An object is created only in a namespace that exists, as the API server has it.
            let namespace_key = |ns: &str| {
                let (collection, _) = collection_of("v1", "Namespace");
                (collection, String::new(), ns.to_string())
            };
            if !key.1.is_empty() && !h.objects.contains_key(&namespace_key(&key.1)) {
                return status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("namespaces \"{}\" not found", key.1),
                );
            }
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

/// Whether an object of `collection` belongs to what `target` names and selects.
fn in_target(target: &Target, collection: &Collection, object: &Value) -> bool {
    in_collection(target, collection, object) && target.selector.matches(object)
}

/// Whether an object of `collection` belongs to what `target` names (selectors aside).
fn in_collection(target: &Target, collection: &Collection, object: &Value) -> bool {
    *collection == target.collection
        && target
            .namespace
            .as_deref()
            .is_none_or(|ns| object["metadata"]["namespace"].as_str() == Some(ns))
}

/// What a watch of `target` tells of `event`: its type as the watch sees it (an object that
/// starts matching the selector is ADDED, one that stops DELETED), or nothing.
fn seen(target: &Target, event: &Event) -> Option<&'static str> {
    if !in_collection(target, &event.collection, &event.object) {
        return None;
    }
    let now = target.selector.matches(&event.object);
    let before = event
        .previous
        .as_ref()
        .is_some_and(|p| target.selector.matches(p));
    match (event.kind, before, now) {
        ("MODIFIED", true, true) => Some("MODIFIED"),
        ("MODIFIED", false, true) => Some("ADDED"),
        ("MODIFIED", true, false) => Some("DELETED"),
        ("MODIFIED", false, false) => None,
        (kind, _, true) => Some(kind),
        _ => None,
    }
}

/// A list, in pages of `limit` objects when asked (kube's watcher asks for 500): each page but
/// the last carries a `continue` token, which expires (410) once the history it was taken at
/// is compacted, as the real API server's do.
fn list(shared: &Shared, target: &Target, query: &BTreeMap<String, String>) -> Response {
    let h = shared.history.lock().unwrap();
    let limit = query
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let (revision, offset) = match query.get("continue").filter(|c| !c.is_empty()) {
        None => {
            *shared
                .lists
                .lock()
                .unwrap()
                .entry(target.collection.plural.clone())
                .or_default() += 1;
            (h.revision, 0)
        }
        Some(token) => {
            let parsed = token
                .split_once('/')
                .and_then(|(r, o)| Some((r.parse::<u64>().ok()?, o.parse::<usize>().ok()?)));
            match parsed {
                Some((revision, _)) if revision < h.oldest => {
                    let message = "The provided continue parameter is too old to display a \
                                   consistent list result. You can start a new list without \
                                   the continue parameter.";
                    return status(StatusCode::GONE, "Expired", message.into());
                }
                Some(at) => at,
                None => {
                    let message = format!("invalid continue token {token:?}");
                    return status(StatusCode::BAD_REQUEST, "BadRequest", message);
                }
            }
        }
    };
    let matching = h
        .objects
        .iter()
        .filter(|((c, _, _), o)| in_target(target, c, o))
        .map(|(_, o)| o);
    let items: Vec<&Value> = matching
        .skip(offset)
        .take(limit.unwrap_or(usize::MAX))
        .collect();
    let end = offset + items.len();
    let more = h
        .objects
        .iter()
        .filter(|((c, _, _), o)| in_target(target, c, o))
        .nth(end)
        .is_some();
    let mut metadata = json!({"resourceVersion": revision.to_string()});
    if more {
        metadata["continue"] = json!(format!("{revision}/{end}"));
    }
    json_response(
        StatusCode::OK,
        &json!({
            "apiVersion": "v1",
            "kind": "List",
            "metadata": metadata,
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
                if e.revision <= from {
                    continue;
                }
                if let Some(kind) = seen(&target, e) {
                    first.push(line(json!({"type": kind, "object": e.object})));
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
                        let Some(kind) = seen(&target, &e) else {
                            continue;
                        };
                        if tx.send(line(json!({"type": kind, "object": e.object}))).await.is_err() {
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
