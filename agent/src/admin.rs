//! The admin HTTP endpoint (plain HTTP, meant for loopback): `/healthz`, `/readyz`,
//! `/sync_status`, `/config_dump`, `/metrics` and `/simulate` (where a request would go through
//! the served configuration; see [`simulate`]).
//!
//! **Readiness.** `/readyz` answers 200 once at least one xDS client is connected and every
//! connected client has ACKed each type it subscribed to at least once (and, for the Envoy the
//! agent runs, Envoy says it is ready); otherwise 503. Either way it says each part's state, a
//! line each (`xds:`, `store:`, `envoy:`), so that a failing probe names what is missing. That is what a kubelet readiness probe on the agent's container needs in a pod whose
//! proxy connects at start (Envoy): the pod receives traffic only once its proxy holds its
//! configuration, as with Istio's own sidecar readiness. A later NACK does not make the agent
//! unready (the client keeps the last good configuration; `/sync_status` shows the NACK), and
//! neither does serving the saved cache while the store is away (degraded is still serving). For
//! a proxyless gRPC application that opens its xDS channel only on its first call, probe
//! `/healthz` instead, or the pod would never become ready.
//!
//! **Resources as JSON.** `/config_dump` gives each resource as base64 of its protobuf encoding
//! (`?format=debug` gives a readable text dump instead). Protobuf JSON would need descriptors of
//! the Envoy API at run time: the `.proto` files ship inside the envoy-types crate and compile
//! quickly with protox into a pool that prost-reflect can print (Any resolved by type URL), but a
//! build script can only find another crate's sources by running `cargo metadata` or guessing
//! the registry's layout, and the pool adds about a megabyte to a binary that runs in every pod.
//! Protobuf JSON is rendered by the tool that reads this dump: `pasactl proxy-config -o json`.
//!
//! **Secrets.** SDS secrets appear under `SDS` with their name, version and certificates; a
//! private key is never shown: it is replaced by `[redacted]` in both forms, as in Envoy's own
//! config dump; so is a Wasm module's pull secret in an ECDS resource (as istiod's debug
//! endpoints hide it).

pub mod simulate;

use std::fmt::Write as _;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine as _;
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use envoy_types::pb::google::protobuf::Any;
use prometheus_client::registry::Registry;
use prost::Message;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::ads::{ConnectionStatus, SnapshotPublisher, StatusRegistry, TypeStatus};
use crate::credentials;
use crate::follow::Link;
use crate::metrics::Metrics;
use crate::resource::TypeKind;
use crate::translate::extensions;

/// What the admin endpoint reads.
#[derive(Clone)]
pub struct AdminState {
    pub registry: Arc<Registry>,
    pub status: StatusRegistry,
    pub publisher: Arc<SnapshotPublisher>,
    pub link: watch::Receiver<Link>,
    pub metrics: Arc<Metrics>,
    /// The store address followed, for `/sync_status`.
    pub server: String,
    /// The admin endpoint of the Envoy the agent runs (`--envoy`), whose readiness
    /// `/healthz/ready` includes.
    pub envoy_admin: Option<crate::bootstrap::AdminAddress>,
}

/// Serves the admin endpoint on a bound listener until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AdminState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/healthz/ready", get(healthz_ready))
        .route("/sync_status", get(sync_status))
        .route("/config_dump", get(config_dump))
        .route("/metrics", get(metrics))
        .route("/simulate", get(simulate::get).post(simulate::post))
        .with_state(state);
    pasa_runtime::admin::serve(listener, app, shutdown).await
}

/// Why the agent is not ready.
#[derive(Debug, thiserror::Error)]
pub enum NotReady {
    #[error("no xDS client is connected yet")]
    NoClient,
    #[error("{who} has not been sent anything yet")]
    NothingSent { who: String },
    #[error("{who} has not ACKed {kind} yet")]
    NotAcked { who: String, kind: TypeKind },
    /// The Envoy the agent runs is not (as [`crate::envoy::ready`] says).
    #[error("{0}")]
    Envoy(String),
}

/// Whether the connected clients hold their configuration; the reason when not.
pub fn readiness(connections: &[ConnectionStatus]) -> Result<(), NotReady> {
    if connections.is_empty() {
        return Err(NotReady::NoClient);
    }
    for conn in connections {
        let who = if conn.node_id.is_empty() {
            format!("connection {}", conn.id)
        } else {
            format!("connection {} ({})", conn.id, conn.node_id)
        };
        if conn.generator.is_none() || conn.types.is_empty() {
            return Err(NotReady::NothingSent { who });
        }
        if let Some((kind, _)) = conn.types.iter().find(|(_, t)| t.acked_version.is_none()) {
            return Err(NotReady::NotAcked { who, kind: *kind });
        }
    }
    Ok(())
}

/// `/readyz`: ready when the clients hold their configuration and, for the Envoy the agent
/// runs, Envoy says it is ready; a line per part either way, so that a probe's failure says
/// which part is missing. The store's link is told, not required: an agent serving its saved
/// cache while the store is away still serves.
async fn readyz(State(state): State<AdminState>) -> Response {
    let xds = readiness(&state.status.connections());
    let envoy = match &state.envoy_admin {
        Some(admin) => Some(crate::envoy::ready(admin).await),
        None => None,
    };
    let ready = xds.is_ok() && envoy.as_ref().is_none_or(Result::is_ok);
    let mut body = String::from(if ready { "ready\n" } else { "not ready\n" });
    fn line<E: std::fmt::Display>(part: Result<(), E>, ok: &str) -> String {
        part.map_or_else(|why| why.to_string(), |()| ok.into())
    }
    let _ = writeln!(
        body,
        "xds: {}",
        line(xds, "every client holds its configuration")
    );
    let store = match &*state.link.borrow() {
        Link::Connecting => "connecting".to_string(),
        Link::Synced => format!("synced ({})", state.server),
        Link::Degraded(reason) => format!("degraded: {reason}"),
    };
    let _ = writeln!(body, "store: {store}");
    if let Some(envoy) = envoy {
        let _ = writeln!(body, "envoy: {}", line(envoy, "ready"));
    }
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, body).into_response()
}

/// 200 `ready`, or 503 with the reason.
fn ready_answer(ready: Result<(), NotReady>) -> Response {
    match ready {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")).into_response(),
    }
}

/// pilot-agent's readiness (what Envoy's 15021 listener asks): the agent's clients hold their
/// configuration and, for the Envoy the agent runs, Envoy itself says it is ready.
async fn healthz_ready(State(state): State<AdminState>) -> Response {
    let mut ready = readiness(&state.status.connections());
    if ready.is_ok()
        && let Some(admin) = &state.envoy_admin
    {
        ready = crate::envoy::ready(admin).await.map_err(NotReady::Envoy);
    }
    ready_answer(ready)
}

/// `/config_dump?source=envoy`: what the Envoy the agent runs holds (its own admin
/// `/config_dump?include_eds`, private keys redacted by Envoy), for `pasactl proxy-config
/// --source envoy POD`: Envoy's admin endpoint is the pod's own (localhost), the agent's is the
/// one reported.
async fn envoy_config_dump(admin: Option<&crate::bootstrap::AdminAddress>) -> Response {
    let Some(admin) = admin else {
        return (
            StatusCode::NOT_FOUND,
            "this agent runs no Envoy (--envoy): read the config dump from Envoy's own admin \
             endpoint\n",
        )
            .into_response();
    };
    match crate::envoy::config_dump(admin).await {
        Ok((200, body)) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Ok((code, body)) => (
            StatusCode::BAD_GATEWAY,
            format!(
                "Envoy's admin endpoint {admin} answered {code}: {}\n",
                body.trim()
            ),
        )
            .into_response(),
        Err(e) => (
            StatusCode::BAD_GATEWAY,
            format!("Envoy's admin endpoint {admin} does not answer: {e}\n"),
        )
            .into_response(),
    }
}

fn link_json(link: &Link, server: &str) -> Value {
    let (state, reason) = match link {
        Link::Connecting => ("Connecting", None),
        Link::Synced => ("Synced", None),
        Link::Degraded(reason) => ("Degraded", Some(reason.as_str())),
    };
    json!({ "server": server, "state": state, "reason": reason })
}

fn type_json(status: Option<&TypeStatus>) -> Value {
    let Some(t) = status else {
        return json!({ "state": "NOT SENT" });
    };
    json!({
        "state": t.state().to_string(),
        "version_sent": t.sent_version,
        "nonce_sent": t.sent_nonce,
        "version_acked": t.acked_version,
        "last_nack": t.last_nack.as_ref().map(|n| json!({
            "version": n.version,
            "nonce": n.nonce,
            "error": n.error,
        })),
    })
}

/// The `/sync_status` document.
pub fn sync_status_json(
    link: &Link,
    server: &str,
    revision: i64,
    connections: &[ConnectionStatus],
) -> Value {
    let connections: Vec<Value> = connections
        .iter()
        .map(|c| {
            let types: serde_json::Map<String, Value> = TypeKind::PUSH_ORDER
                .into_iter()
                .map(|kind| (kind.short_name().to_owned(), type_json(c.types.get(&kind))))
                .collect();
            json!({
                "id": c.id,
                "node": c.node_id,
                "protocol": c.protocol.to_string(),
                "generator": c.generator.map(|g| g.name()),
                "types": types,
            })
        })
        .collect();
    json!({
        "store": link_json(link, server),
        "revision": revision,
        "connections": connections,
    })
}

async fn sync_status(State(state): State<AdminState>) -> Response {
    let link = state.link.borrow().clone();
    let body = sync_status_json(
        &link,
        &state.server,
        state.metrics.store_revision.get(),
        &state.status.connections(),
    );
    json_response(&body)
}

async fn config_dump(State(state): State<AdminState>, uri: Uri) -> Response {
    let asks = |param: &str| {
        uri.query()
            .is_some_and(|q| q.split('&').any(|p| p == param))
    };
    if asks("source=envoy") {
        return envoy_config_dump(state.envoy_admin.as_ref()).await;
    }
    let debug = asks("format=debug");
    let snapshots = state.publisher.snapshots();
    if debug {
        let mut text = String::new();
        for (generator, snapshot) in snapshots.iter() {
            for kind in TypeKind::PUSH_ORDER {
                for (name, resource) in snapshot.resources(kind) {
                    let _ = writeln!(
                        text,
                        "# {} {kind} {name} (version {})\n{}\n",
                        generator.name(),
                        resource.version,
                        debug_text(kind, &resource.body)
                    );
                }
            }
        }
        return ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response();
    }
    let base64 = base64::engine::general_purpose::STANDARD;
    let mut generators = serde_json::Map::new();
    for (generator, snapshot) in snapshots.iter() {
        let mut types = serde_json::Map::new();
        for kind in TypeKind::PUSH_ORDER {
            let resources: Vec<Value> = snapshot
                .resources(kind)
                .iter()
                .map(|(name, r)| {
                    json!({
                        "name": name,
                        "version": r.version,
                        "type_url": r.body.type_url,
                        "resource": base64.encode(&shown(kind, &r.body).value),
                    })
                })
                .collect();
            types.insert(kind.short_name().to_owned(), Value::Array(resources));
        }
        generators.insert(generator.name().to_owned(), Value::Object(types));
    }
    json_response(&json!({
        "revision": state.metrics.store_revision.get(),
        "encoding": "base64 of the protobuf encoding; ?format=debug for text",
        "generators": generators,
    }))
}

/// A resource as it may be shown: a secret's private key redacted.
fn shown(kind: TypeKind, body: &Any) -> std::borrow::Cow<'_, Any> {
    match kind {
        TypeKind::Secret => std::borrow::Cow::Owned(credentials::redacted(body)),
        TypeKind::ExtensionConfig => {
            std::borrow::Cow::Owned(extensions::redacted(body, credentials::REDACTED))
        }
        _ => std::borrow::Cow::Borrowed(body),
    }
}

/// A resource decoded and printed with its Debug form (nested Any stay encoded; a secret's
/// private key redacted).
fn debug_text(kind: TypeKind, body: &Any) -> String {
    fn show<M: Message + Default + std::fmt::Debug>(bytes: &[u8]) -> String {
        match M::decode(bytes) {
            Ok(message) => format!("{message:#?}"),
            Err(e) => format!("<cannot decode: {e}>"),
        }
    }
    let bytes = body.value.as_slice();
    match kind {
        TypeKind::Cluster => show::<Cluster>(bytes),
        TypeKind::Endpoint => show::<ClusterLoadAssignment>(bytes),
        TypeKind::Listener => show::<Listener>(bytes),
        TypeKind::Route => show::<RouteConfiguration>(bytes),
        TypeKind::Secret => show::<Secret>(&credentials::redacted(body).value),
        TypeKind::ExtensionConfig => {
            show::<envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig>(
                &extensions::redacted(body, credentials::REDACTED).value,
            )
        }
        TypeKind::VirtualHost => {
            show::<envoy_types::pb::envoy::config::route::v3::VirtualHost>(bytes)
        }
    }
}

fn json_response(body: &Value) -> Response {
    match serde_json::to_string_pretty(body) {
        Ok(text) => ([(header::CONTENT_TYPE, "application/json")], text + "\n").into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "cannot encode JSON\n").into_response(),
    }
}

async fn metrics(State(state): State<AdminState>) -> Response {
    pasa_runtime::admin::metrics(&state.registry)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::ads::Protocol;
    use crate::model::proxy::Generator;

    fn conn(types: &[(TypeKind, Option<&str>)]) -> ConnectionStatus {
        ConnectionStatus {
            id: 7,
            node_id: "sidecar~10.0.0.1~a.default~default.svc.cluster.local".into(),
            protocol: Protocol::Sotw,
            generator: Some(Generator::Envoy),
            types: types
                .iter()
                .map(|(kind, acked)| {
                    let status = TypeStatus {
                        sent_version: Some("v".into()),
                        acked_version: acked.map(str::to_owned),
                        acked_latest: acked.is_some(),
                        ..Default::default()
                    };
                    (*kind, status)
                })
                .collect::<BTreeMap<_, _>>(),
        }
    }

    #[test]
    fn ready_once_every_subscribed_type_was_acked() {
        let e = readiness(&[]).unwrap_err().to_string();
        assert!(e.contains("no xDS client"), "{e}");
        let e = readiness(&[conn(&[])]).unwrap_err().to_string();
        assert!(e.contains("not been sent anything"), "{e}");
        let e = readiness(&[conn(&[
            (TypeKind::Cluster, Some("v")),
            (TypeKind::Listener, None),
        ])])
        .unwrap_err()
        .to_string();
        assert!(e.contains("has not ACKed LDS"), "{e}");
        readiness(&[conn(&[(TypeKind::Cluster, Some("v"))])]).unwrap();
    }

    #[test]
    fn sync_status_shows_link_revision_and_types() {
        let doc = sync_status_json(
            &Link::Degraded("store away".into()),
            "127.0.0.1:7400",
            12,
            &[conn(&[(TypeKind::Cluster, Some("v"))])],
        );
        assert_eq!(doc["store"]["state"], "Degraded");
        assert_eq!(doc["store"]["reason"], "store away");
        assert_eq!(doc["revision"], 12);
        let c = &doc["connections"][0];
        assert_eq!(c["generator"], "envoy");
        assert_eq!(c["protocol"], "SotW");
        assert_eq!(c["types"]["CDS"]["state"], "SYNCED");
        assert_eq!(c["types"]["RDS"]["state"], "NOT SENT");
    }
}
