//! The `pasa-agent` binary's `/simulate`: a real store on loopback holding one service, the agent
//! following it, and calls walked through what the agent serves.

mod common;

use common::agent::Agent;
use common::store::StoreServer;
use serde_json::{Value, json};

const REVIEWS: &str = r#"{"apiVersion":"pasa.io/v1alpha1","kind":"ServiceEndpoints",
  "metadata":{"name":"reviews","namespace":"default"},
  "spec":{"addresses":["10.96.0.20"],"ports":[{"name":"http","port":9080}],
          "endpoints":[{"address":"10.0.0.1","labels":{"version":"v1"}}]}}"#;

fn outcome(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulates_calls_on_the_served_configuration() {
    let data = tempfile::tempdir().unwrap();
    let run = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let store = StoreServer::start(data.path(), 0).await;
    store.apply(&[serde_json::from_str(REVIEWS).unwrap()]).await;
    let agent = Agent::start(store.addr, run.path(), cache.path());

    // An outbound HTTP call to reviews:9080, once the agent has translated the service.
    let call = json!({"address": "10.96.0.20", "port": 9080, "protocol": "http",
                      "host": "reviews.default.svc.cluster.local"})
    .to_string();
    let mut answer = (0, String::new());
    let deadline = tokio::time::Instant::now() + common::agent::WAIT;
    while tokio::time::Instant::now() < deadline {
        answer = agent.post("/simulate", &call).await;
        if answer.0 == 200 && outcome(&answer.1)["cluster"] != Value::Null {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let (code, body) = answer;
    assert_eq!(code, 200, "{body}");
    let got = outcome(&body);
    assert_eq!(
        got,
        json!({
            "listener": "0.0.0.0_9080",
            "route_config": "9080",
            "virtual_host": "reviews.default.svc.cluster.local:9080",
            "route": "default",
            "cluster": "outbound|9080||reviews.default.svc.cluster.local",
        }),
        "{body}"
    );

    // The same call from query parameters.
    let (code, body) = agent
        .get("/simulate?address=10.96.0.20&port=9080&protocol=http&host=reviews.default.svc.cluster.local")
        .await;
    assert_eq!((code, outcome(&body)), (200, got), "{body}");

    // A port no service uses: passed through by virtualOutbound, as istiod's configuration does.
    let (code, body) = agent
        .post("/simulate", r#"{"port": 9999, "protocol": "http"}"#)
        .await;
    assert_eq!(code, 200, "{body}");
    let got = outcome(&body);
    assert_eq!(got["listener"], "virtualOutbound", "{body}");
    assert_eq!(got["cluster"], "PassthroughCluster", "{body}");
    assert_eq!(got.get("error"), None, "{body}");

    // Bad calls are 400 with the reason.
    for (call, says) in [
        (
            r#"{"port": 9080, "protocl": "http"}"#,
            "unknown field `protocl`",
        ),
        (
            r#"{"port": 9080, "protocol": "http", "alpn": "h2"}"#,
            "set tls to tls or mtls",
        ),
        (
            r#"{"port": 9080, "address": "reviews"}"#,
            "not an IP address",
        ),
        ("[1, 2]", "invalid call"),
    ] {
        let (code, body) = agent.post("/simulate", call).await;
        assert_eq!(code, 400, "{call}: {body}");
        assert!(body.contains(says), "{call}: {body}");
    }

    // Nothing is generated for proxyless gRPC until such a client connects.
    let (code, body) = agent
        .post("/simulate?generator=grpc", r#"{"port": 9080}"#)
        .await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("gRPC client"), "{body}");

    agent.terminate();
    store.stop().await;
}
