//! `/simulate`: walks a request through the resources the agent serves right now (see
//! [`crate::simulate`]) and answers where it went.
//!
//! - `POST /simulate[?generator=envoy|grpc]` with one call as a JSON object (the fields of
//!   [`Call`], all optional: `address`, `port`, `path`, `protocol`, `tls`, `alpn`, `host`, `sni`,
//!   `headers` as name → list of values, `mode`, `mtls_secret_config_name`);
//! - `GET /simulate?port=9080&host=reviews&protocol=http[&generator=grpc]`: the same call from
//!   query parameters (one per field; `header=name:value`, repeatable), for curl.
//!
//! Answers: 200 with the outcome as JSON (the names of the listener, filter chain, route
//! configuration, virtual host, route and cluster the call went through, and `error` when it did
//! not get through — a routing failure is still a 200); 400 for a call that cannot be made
//! (unknown field, ALPN without TLS, address not an IP); 503 while nothing has been generated for
//! the generator; 500 when the served resources cannot be read. Errors come as one line of text.
//!
//! The simulation reads the published snapshot, decoded back into typed resources per request:
//! exactly what the clients are sent, at the cost of a decode, which suits a debugging aid.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};

use super::AdminState;
use crate::ads::{SnapshotError, Snapshots};
use crate::model::proxy::Generator;
use crate::simulate::{Call, Outcome, SimulateError, simulate};

/// Why `/simulate` gave no outcome.
#[derive(Debug, thiserror::Error)]
pub enum SimulateRequestError {
    #[error(
        "invalid call: {0}; send one JSON object with the call's fields (address, port, path, protocol, tls, alpn, host, sni, headers, mode)"
    )]
    Body(#[source] serde_json::Error),
    #[error("invalid call: {0}")]
    Query(String),
    #[error("unknown generator {0:?}; use envoy or grpc")]
    Generator(String),
    #[error("{0}")]
    Call(#[source] SimulateError),
    #[error(
        "nothing has been generated for the {generator} generator yet; wait until the agent has synced with the store{hint}"
    )]
    NotGenerated {
        generator: &'static str,
        hint: &'static str,
    },
    #[error("cannot read the served resources: {0}")]
    Snapshot(#[source] SnapshotError),
    #[error("cannot simulate on the served resources: {0}")]
    Resources(#[source] SimulateError),
}

impl SimulateRequestError {
    /// The HTTP status the error is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Body(_) | Self::Query(_) | Self::Generator(_) | Self::Call(_) => {
                StatusCode::BAD_REQUEST
            }
            Self::NotGenerated { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::Snapshot(_) | Self::Resources(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

pub(super) async fn post(State(state): State<AdminState>, uri: Uri, body: Bytes) -> Response {
    let answer = post_call(uri.query().unwrap_or_default(), &body)
        .and_then(|(generator, call)| run(&state.publisher.snapshots(), generator, &call));
    respond(answer)
}

pub(super) async fn get(State(state): State<AdminState>, uri: Uri) -> Response {
    let answer = query_call(uri.query().unwrap_or_default())
        .and_then(|(generator, call)| run(&state.publisher.snapshots(), generator, &call));
    respond(answer)
}

fn respond(answer: Result<Outcome, SimulateRequestError>) -> Response {
    match answer {
        Ok(outcome) => match serde_json::to_string_pretty(&outcome) {
            Ok(text) => (
                [(axum::http::header::CONTENT_TYPE, "application/json")],
                text + "\n",
            )
                .into_response(),
            Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "cannot encode JSON\n").into_response(),
        },
        Err(e) => (e.status(), format!("{e}\n")).into_response(),
    }
}

/// Simulates `call` on the snapshot served to `generator`'s clients.
pub fn run(
    snapshots: &Snapshots,
    generator: Generator,
    call: &Call,
) -> Result<Outcome, SimulateRequestError> {
    let Some(snapshot) = snapshots.get(generator) else {
        return Err(SimulateRequestError::NotGenerated {
            generator: generator.name(),
            hint: match generator {
                Generator::Envoy => "",
                Generator::Grpc => " (the gRPC translation runs once a gRPC client has connected)",
            },
        });
    };
    let resources = snapshot
        .to_resources()
        .map_err(SimulateRequestError::Snapshot)?;
    simulate(&resources, call).map_err(|e| match e {
        SimulateError::AlpnWithoutTls { .. } | SimulateError::Address { .. } => {
            SimulateRequestError::Call(e)
        }
        other => SimulateRequestError::Resources(other),
    })
}

/// The generator named by the `generator` query parameter (default Envoy's).
fn generator(name: Option<&str>) -> Result<Generator, SimulateRequestError> {
    match name {
        None | Some("envoy") => Ok(Generator::Envoy),
        Some("grpc") => Ok(Generator::Grpc),
        Some(other) => Err(SimulateRequestError::Generator(other.to_string())),
    }
}

/// A POST: the generator from the query, the call from the JSON body.
pub fn post_call(query: &str, body: &[u8]) -> Result<(Generator, Call), SimulateRequestError> {
    let mut name = None;
    for (key, value) in params(query)? {
        if key != "generator" {
            return Err(SimulateRequestError::Query(format!(
                "unknown query parameter {key:?}; a POST takes only generator, the call goes in the body"
            )));
        }
        name = Some(value);
    }
    let generator = generator(name.as_deref())?;
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        body
    };
    let call = serde_json::from_slice(body).map_err(SimulateRequestError::Body)?;
    Ok((generator, call))
}

/// A GET: the generator and the call from query parameters.
pub fn query_call(query: &str) -> Result<(Generator, Call), SimulateRequestError> {
    let mut name = None;
    let mut fields = Map::new();
    let mut headers = Map::new();
    for (key, value) in params(query)? {
        match key.as_str() {
            "generator" => name = Some(value),
            "port" => {
                let port: u16 = value.parse().map_err(|_| {
                    SimulateRequestError::Query(format!("port {value:?} is not a port number"))
                })?;
                fields.insert(key, port.into());
            }
            "header" => {
                let Some((header, v)) = value.split_once(':') else {
                    return Err(SimulateRequestError::Query(format!(
                        "header {value:?}: write it as name:value"
                    )));
                };
                let values = headers
                    .entry(header.trim().to_string())
                    .or_insert_with(|| Value::Array(Vec::new()));
                if let Value::Array(list) = values {
                    list.push(v.trim().into());
                }
            }
            _ => {
                fields.insert(key, value.into());
            }
        }
    }
    if !headers.is_empty() {
        fields.insert("headers".into(), Value::Object(headers));
    }
    let generator = generator(name.as_deref())?;
    let call = serde_json::from_value(Value::Object(fields))
        .map_err(|e| SimulateRequestError::Query(e.to_string()))?;
    Ok((generator, call))
}

/// The `key=value` pairs of a query string, percent-decoded (`+` is a space).
fn params(query: &str) -> Result<Vec<(String, String)>, SimulateRequestError> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            Ok((decode(key)?, decode(value)?))
        })
        .collect()
}

fn decode(text: &str) -> Result<String, SimulateRequestError> {
    let bad = || SimulateRequestError::Query(format!("{text:?} is not a valid query string part"));
    let mut bytes = Vec::with_capacity(text.len());
    let mut input = text.bytes();
    while let Some(b) = input.next() {
        match b {
            b'+' => bytes.push(b' '),
            b'%' => {
                let hex = [input.next().ok_or_else(bad)?, input.next().ok_or_else(bad)?];
                let hex = std::str::from_utf8(&hex).map_err(|_| bad())?;
                bytes.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
            }
            b => bytes.push(b),
        }
    }
    String::from_utf8(bytes).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ads::{Snapshot, SnapshotPublisher};
    use crate::resource::Resources;
    use crate::simulate::{Protocol, TlsMode, TrafficError};
    use envoy_types::pb::envoy::config::listener::v3::Listener;

    #[test]
    fn a_post_takes_the_call_from_the_body() {
        let (generator, call) = post_call(
            "generator=grpc",
            br#"{"port": 9080, "protocol": "http", "host": "reviews", "headers": {"x-a": ["1"]}}"#,
        )
        .unwrap();
        assert_eq!(generator, Generator::Grpc);
        assert_eq!(call.port, 9080);
        assert_eq!(call.protocol, Some(Protocol::Http));
        assert_eq!(call.headers["x-a"], ["1"]);
        let (generator, call) = post_call("", b"").unwrap();
        assert_eq!((generator, call), (Generator::Envoy, Call::default()));

        let e = post_call("", br#"{"prot": 1}"#).unwrap_err();
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        assert!(e.to_string().contains("unknown field `prot`"), "{e}");
        let e = post_call("generator=istio", b"{}").unwrap_err();
        assert!(e.to_string().contains("use envoy or grpc"), "{e}");
        let e = post_call("port=1", b"{}").unwrap_err();
        assert!(e.to_string().contains("only generator"), "{e}");
    }

    #[test]
    fn a_get_takes_the_call_from_the_query() {
        let (generator, call) = query_call(
            "address=10.0.0.1&port=443&tls=tls&sni=a%2Eexample.com&path=/x%20y&header=x-b:+2&header=x-b:3",
        )
        .unwrap();
        assert_eq!(generator, Generator::Envoy);
        assert_eq!(call.address, "10.0.0.1");
        assert_eq!(call.port, 443);
        assert_eq!(call.tls, TlsMode::Tls);
        assert_eq!(call.sni, "a.example.com");
        assert_eq!(call.path, "/x y");
        assert_eq!(call.headers["x-b"], ["2", "3"]);
        for (query, says) in [
            ("port=http", "not a port number"),
            ("protocol=udp", "unknown variant `udp`"),
            ("colour=red", "unknown field `colour`"),
            ("header=nocolon", "name:value"),
            ("path=%zz", "not a valid query"),
        ] {
            let e = query_call(query).unwrap_err();
            assert_eq!(e.status(), StatusCode::BAD_REQUEST, "{query}");
            assert!(e.to_string().contains(says), "{query}: {e}");
        }
    }

    #[test]
    fn runs_on_the_published_snapshot() {
        let publisher = SnapshotPublisher::new();
        let call = Call {
            port: 80,
            ..Default::default()
        };
        let e = run(&publisher.snapshots(), Generator::Grpc, &call).unwrap_err();
        assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(e.to_string().contains("gRPC client"), "{e}");

        let mut resources = Resources::default();
        let listener = Listener {
            name: "virtualOutbound".into(),
            ..Default::default()
        };
        resources.listeners.insert(listener.name.clone(), listener);
        publisher.publish(Generator::Envoy, Snapshot::from_resources(&resources));
        let outcome = run(&publisher.snapshots(), Generator::Envoy, &call).unwrap();
        assert_eq!(outcome.listener, "virtualOutbound");
        assert_eq!(outcome.error, Some(TrafficError::NoFilterChain));

        let bad = Call {
            alpn: "h2".into(),
            ..call
        };
        let e = run(&publisher.snapshots(), Generator::Envoy, &bad).unwrap_err();
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        assert!(e.to_string().contains("set tls to tls or mtls"), "{e}");
    }
}
