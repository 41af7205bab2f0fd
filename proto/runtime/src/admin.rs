//! The admin endpoint's common part: `/metrics` (Prometheus text from a registry), `/healthz`
//! and `/readyz`. The store and PCP serve [`router`] as it is; the agent serves routes of its
//! own (readiness from its xDS clients, `/config_dump`, …) with the same [`metrics`] encoder.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::registry::Registry;

/// Whether the process is ready to serve; flipped by its owner, read by `/readyz`.
#[derive(Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }

    pub fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
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
                if state.ready.get() {
                    (StatusCode::OK, "ready\n")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
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

        let _ = stop.send(());
        server.await.unwrap().unwrap();
    }
}
