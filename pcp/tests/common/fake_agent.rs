//! `FakeAgentAdmin`: a stand-in for a pasa-agent's admin endpoint that answers `POST /simulate`
//! with canned outcomes and records the calls it was sent. It does no simulation; the real agent
//! is exercised where its binary is available.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

/// `(query, call)` of every request received, in order.
pub type Received = Arc<Mutex<Vec<(String, Value)>>>;

/// A canned answer: routed for port 9080, stopped with `NoRoute` for 9081, 503 for 9082, and 400
/// for a call with an ALPN but no TLS (as the agent answers).
pub struct FakeAgentAdmin {
    pub addr: SocketAddr,
    pub received: Received,
    task: tokio::task::JoinHandle<()>,
}

impl FakeAgentAdmin {
    pub async fn start() -> FakeAgentAdmin {
        let received: Received = Arc::new(Mutex::new(Vec::new()));
        let app = Router::new()
            .route("/simulate", post(answer))
            .with_state(Arc::clone(&received));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        FakeAgentAdmin {
            addr,
            received,
            task,
        }
    }
}

impl Drop for FakeAgentAdmin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(State(received): State<Received>, uri: Uri, body: Bytes) -> Response {
    let call: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    received
        .lock()
        .unwrap()
        .push((uri.query().unwrap_or_default().to_string(), call.clone()));
    if call["alpn"].is_string() && call["tls"] == "plaintext" {
        return (
            StatusCode::BAD_REQUEST,
            "invalid call: ALPN \"h2\" is only offered in a TLS handshake; set tls to tls or mtls, or drop alpn\n",
        )
            .into_response();
    }
    let outcome = match call["port"].as_u64() {
        Some(9080) => json!({
            "listener": "0.0.0.0_9080",
            "route_config": "9080",
            "virtual_host": "reviews.default.svc.cluster.local:9080",
            "route": "default",
            "cluster": "outbound|9080||reviews.default.svc.cluster.local",
        }),
        Some(9081) => json!({
            "error": "NoRoute",
            "listener": "0.0.0.0_9081",
            "route_config": "9081",
            "virtual_host": "reviews.default.svc.cluster.local:9081",
        }),
        _ => {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                "nothing has been generated for the envoy generator yet\n",
            )
                .into_response();
        }
    };
    (
        [(header::CONTENT_TYPE, "application/json")],
        outcome.to_string(),
    )
        .into_response()
}
