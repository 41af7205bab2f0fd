//! The admin endpoint's common part: `/metrics` (Prometheus text from a registry), `/healthz`
//! and `/readyz`. The store and PCP serve [`router`] as it is; the agent serves routes of its
//! own (readiness from its xDS clients, `/config_dump`, …) with the same [`metrics`] encoder.
//!
//! Readiness is per part: the process is ready once it serves and every part it registered
//! (PCP's Kubernetes syncer, …) says it is; `/readyz`'s body names each part and what it
//! waits for, so that `kubectl describe` and a curl tell why a replica is not ready.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::registry::Registry;

/// Whether the process is ready to serve: its servers are up ([`Readiness::set`], flipped by
/// the server) and every part that reported ([`Readiness::report`]) is ready. Read by `/readyz`.
#[derive(Clone, Default)]
pub struct Readiness(Arc<ReadinessParts>);

#[derive(Default)]
struct ReadinessParts {
    serving: AtomicBool,
    /// Each part: ready or not, and what it says (what it waits for, or what it does).
    parts: Mutex<BTreeMap<&'static str, (bool, String)>>,
}

impl Readiness {
    /// Whether the process's servers are up.
    pub fn set(&self, ready: bool) {
        self.0.serving.store(ready, Ordering::SeqCst);
    }

    /// Ready: serving, and every part ready.
    pub fn get(&self) -> bool {
        self.state().0
    }

    /// What the part `part` is: ready or not, and `detail` (why not, or what it does).
    pub fn report(&self, part: &'static str, ready: bool, detail: impl Into<String>) {
        if let Ok(mut parts) = self.0.parts.lock() {
            parts.insert(part, (ready, detail.into()));
        }
    }

    /// Whether ready, and a line per part (`serving` first).
    pub fn state(&self) -> (bool, String) {
        let serving = self.0.serving.load(Ordering::SeqCst);
        let mut ready = serving;
        let mut body = format!(
            "serving: {}\n",
            if serving {
                "yes"
            } else {
                "no (starting or stopping)"
            }
        );
        if let Ok(parts) = self.0.parts.lock() {
            for (part, (ok, detail)) in parts.iter() {
                ready &= *ok;
                body.push_str(&format!("{part}: {detail}\n"));
            }
        }
        (ready, body)
    }
}

/// The registry's metrics as the Prometheus (OpenMetrics) text format.
pub fn metrics(registry: &Registry) -> Response {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            "failed to encode metrics\n",
        )
            .into_response(),
    }
}

#[derive(Clone)]
struct Common {
    registry: Arc<Registry>,
    ready: Readiness,
}

/// `/metrics` over `registry`, `/healthz` (always ok while the process answers) and `/readyz`
/// (as `ready` says).
pub fn router(registry: Arc<Registry>, ready: Readiness) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(state): State<Common>| async move { metrics(&state.registry) }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(|State(state): State<Common>| async move {
                let (ready, parts) = state.ready.state();
                if ready {
                    (StatusCode::OK, format!("ready\n{parts}"))
                } else {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("not ready\n{parts}"),
                    )
                }
            }),
        )
        .with_state(Common { registry, ready })
}

/// Serves `app` on a bound listener until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use prometheus_client::metrics::counter::Counter;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut text = String::new();
        conn.read_to_string(&mut text).await.unwrap();
        text
    }

    #[tokio::test]
    async fn metrics_health_and_readiness() {
        let mut registry = Registry::default();
        let writes = Counter::<u64>::default();
        registry.register("writes", "Writes made", writes.clone());
        writes.inc_by(3);
        let ready = Readiness::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(
            listener,
            router(Arc::new(registry), ready.clone()),
            async move {
                let _ = stopped.await;
            },
        ));

        let metrics = get(addr, "/metrics").await;
        assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
        assert!(
            metrics.contains("application/openmetrics-text"),
            "{metrics}"
        );
        assert!(metrics.contains("writes_total 3"), "{metrics}");
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        let not_yet = get(addr, "/readyz").await;
        assert!(not_yet.starts_with("HTTP/1.1 503"), "{not_yet}");
        ready.set(true);
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        // A part that is not ready makes the process not ready, and says why.
        ready.report("syncer", false, "waiting for pods (forbidden: …)");
        let waiting = get(addr, "/readyz").await;
        assert!(waiting.starts_with("HTTP/1.1 503"), "{waiting}");
        assert!(
            waiting.contains("syncer: waiting for pods (forbidden: …)"),
            "{waiting}"
        );
        ready.report("syncer", true, "standing by");
        let ready_now = get(addr, "/readyz").await;
        assert!(ready_now.starts_with("HTTP/1.1 200"), "{ready_now}");
        assert!(ready_now.contains("syncer: standing by"), "{ready_now}");

        let _ = stop.send(());
        server.await.unwrap().unwrap();
    }
}
