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

/// How the command line named an agent.
#[derive(Debug, PartialEq, Eq)]
pub enum AgentRef<'a> {
    /// Its admin address, `host:port`.
    Address(&'a str),
    /// Its proxy: `pod.namespace`, a pod name or a node ID, as `proxy-status` lists it.
    Proxy(&'a str),
}

/// Reads an agent argument: an admin address (`host:port` or `http://host:port`), else the name
/// of its proxy.
pub fn agent_ref(arg: &str) -> Result<AgentRef<'_>, UsageError> {
    if arg.starts_with("http://") {
        return authority(arg).map(AgentRef::Address);
    }
    match arg.rsplit_once(':') {
        Some((host, port)) if port.parse::<u16>().is_ok() && !arg.contains('~') => {
            if host.is_empty() {
                return Err(UsageError(format!(
                    "agent {arg:?}: give the agent's admin address as host:port"
                )));
            }
            authority(arg).map(AgentRef::Address)
        }
        _ => Ok(AgentRef::Proxy(arg)),
    }
}

/// The admin address of the agent named on the command line: given as an address, or looked up
/// by its proxy's name in what agents report to the store at `server` (`pasactl proxy-status`).
pub async fn resolve_agent(server: &crate::cli::Server, arg: &str) -> anyhow::Result<String> {
    match agent_ref(arg)? {
        AgentRef::Address(address) => Ok(address.to_owned()),
        AgentRef::Proxy(name) => {
            let answer = super::proxy_status::list(server, name, "")
                .await
                .map_err(|e| {
                    anyhow::anyhow!("looking up agent {name:?} in the store's proxy status: {e:#}")
                })?;
            let entry = super::proxy_status::the_one(&answer, name, server)?;
            let address = entry
                .status
                .as_ref()
                .map(|s| s.admin_address.clone())
                .unwrap_or_default();
            anyhow::ensure!(
                !address.is_empty(),
                "the agent of {name:?} did not report its admin address; pass it (host:port)"
            );
            Ok(address)
        }
    }
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
    fn an_agent_is_named_by_its_admin_address_or_its_proxy() {
        assert_eq!(
            agent_ref("http://127.0.0.1:15000").unwrap(),
            AgentRef::Address("127.0.0.1:15000")
        );
        assert_eq!(
            agent_ref("[::1]:15000").unwrap(),
            AgentRef::Address("[::1]:15000")
        );
        assert_eq!(
            agent_ref("productpage-v1.default").unwrap(),
            AgentRef::Proxy("productpage-v1.default")
        );
        let node = "sidecar~10.0.0.1~web-1.shop~shop.svc.cluster.local";
        assert_eq!(agent_ref(node).unwrap(), AgentRef::Proxy(node));
        assert!(agent_ref(":15000").is_err());
    }
}
