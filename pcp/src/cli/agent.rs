//! Reaching a pasa-agent's admin endpoint (plain HTTP/1.1 on its `--admin` address), for the
//! commands that ask an agent what it serves: `proxy-config` and `x simulate`.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, StatusCode};
use hyper_util::rt::TokioIo;

use crate::cli::UsageError;

/// How long connecting to the agent may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the agent may take to answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// The admin address used when none is given.
pub const DEFAULT_ADMIN: &str = "127.0.0.1:15000";

/// The admin address of the agent named on the command line. Today an agent is named by its
/// admin address (`host:port` or `http://host:port`); naming it `name.namespace` needs the
/// store's record of each agent's admin address, and is refused with a message saying so.
pub fn resolve_agent(arg: &str) -> Result<String, UsageError> {
    let address = authority(arg)?;
    let host = match address.rsplit_once(':') {
        Some((host, port)) if port.parse::<u16>().is_ok() => host,
        _ => {
            return Err(UsageError(format!(
                "agent {arg:?}: naming an agent needs the store's proxy status; pass its admin address (host:port)"
            )));
        }
    };
    if host.is_empty() {
        return Err(UsageError(format!(
            "agent {arg:?}: give the agent's admin address as host:port"
        )));
    }
    Ok(address.to_string())
}

/// `host:port` from `host:port` or `http://host:port[/]`.
pub fn authority(agent: &str) -> Result<&str, UsageError> {
    let rest = agent.strip_prefix("http://").unwrap_or(agent);
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() || rest.contains('/') || rest.contains("://") {
        return Err(UsageError(format!(
            "--agent {agent:?}: give the agent's admin address as host:port or http://host:port"
        )));
    }
    Ok(rest)
}

/// GETs `path` from the agent's admin endpoint: status and body.
pub async fn get(agent: &str, path: &str) -> anyhow::Result<(StatusCode, Bytes)> {
    request(agent, Method::GET, path, None).await
}

/// POSTs JSON to the agent's admin endpoint: status and body.
pub async fn post(agent: &str, path: &str, body: Vec<u8>) -> anyhow::Result<(StatusCode, Bytes)> {
    request(agent, Method::POST, path, Some(body)).await
}

async fn request(
    agent: &str,
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
) -> anyhow::Result<(StatusCode, Bytes)> {
    let authority = authority(agent)?;
    let unreachable = |why: String| {
        anyhow::anyhow!(
            "cannot reach the agent's admin endpoint at {agent}: {why} (is pasa-agent running? set --agent or PASA_AGENT_ADMIN to its --admin address)"
        )
    };
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(authority))
        .await
        .map_err(|_| unreachable(format!("no connection within {CONNECT_TIMEOUT:?}")))?
        .map_err(|e| unreachable(e.to_string()))?;
    let exchange = async {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let connection = tokio::spawn(conn);
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, authority);
        if body.is_some() {
            request = request.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        let request = request.body(Full::new(Bytes::from(body.unwrap_or_default())))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| anyhow::anyhow!("the agent at {agent} did not answer: {e}"))?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| anyhow::anyhow!("reading the agent's answer from {agent}: {e}"))?
            .to_bytes();
        connection.abort();
        anyhow::Ok((status, bytes))
    };
    tokio::time::timeout(ANSWER_TIMEOUT, exchange)
        .await
        .map_err(|_| {
            anyhow::anyhow!("the agent at {agent} did not answer within {ANSWER_TIMEOUT:?}")
        })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_address_takes_a_url() {
        assert_eq!(
            authority("http://127.0.0.1:15000/").unwrap(),
            "127.0.0.1:15000"
        );
        assert_eq!(authority("localhost:15000").unwrap(), "localhost:15000");
        assert!(authority("https://x:1").is_err());
        assert!(authority("x:1/simulate").is_err());
    }

    #[test]
    fn an_agent_is_named_by_its_admin_address_for_now() {
        assert_eq!(
            resolve_agent("http://127.0.0.1:15000").unwrap(),
            "127.0.0.1:15000"
        );
        assert_eq!(resolve_agent("[::1]:15000").unwrap(), "[::1]:15000");
        let e = resolve_agent("productpage-v1.default").unwrap_err();
        assert!(
            e.0.contains("naming an agent needs the store's proxy status; pass its admin address"),
            "{e}"
        );
        assert!(resolve_agent(":15000").is_err());
    }
}
