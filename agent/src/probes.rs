//! The application's health probes, run by the agent for kubelet: where PASA's standalone
//! injection captures a pod's traffic, kubelet's plaintext probes of the app's ports would meet
//! Envoy's inbound listener (and fail under STRICT mTLS), so the injector points them at the
//! agent's status listener instead, as Istio points them at pilot-agent's, and hands the agent
//! the original probes in `PASA_APP_PROBERS`: a JSON map from the rewritten path
//! (`/app-health/<container>/livez|readyz|startupz`) to the probe (`httpGet` with path, port,
//! scheme HTTP and headers, or `tcpSocket` with port; `timeoutSeconds`). The agent runs the
//! original against the pod's own address — its user (1337) is spared by the capture — and
//! answers as kubelet judges: 2xx/3xx or a connection made is healthy.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One original probe.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AppProbe {
    #[serde(default)]
    pub http_get: Option<HttpGet>,
    #[serde(default)]
    pub tcp_socket: Option<TcpSocket>,
    /// Kubelet's default: 1 s.
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpGet {
    #[serde(default)]
    pub path: String,
    pub port: u16,
    /// Only HTTP: HTTPS probes are left to kubelet by the injector.
    #[serde(default)]
    pub scheme: Option<String>,
    #[serde(default)]
    pub http_headers: Vec<Header>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    pub name: String,
    pub value: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TcpSocket {
    pub port: u16,
}

/// Why `PASA_APP_PROBERS` cannot be run: each names the probe at fault.
#[derive(Debug, thiserror::Error)]
pub enum ProbersError {
    #[error("--app-probers: not a map of probes: {0}")]
    NotAMap(#[source] serde_json::Error),
    #[error("--app-probers: {path:?} is not an /app-health/ path")]
    Path { path: String },
    #[error("--app-probers {path}: scheme {scheme:?}: only HTTP probes are run by the agent")]
    Scheme { path: String, scheme: String },
    #[error("--app-probers {path}: exactly one of httpGet and tcpSocket")]
    NotOneAction { path: String },
}

/// Why a probe found the app unhealthy.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("port {port}: {source}")]
    Connection {
        port: u16,
        #[source]
        source: std::io::Error,
    },
    #[error("port {port}: not an HTTP answer: {line:?}")]
    NotHttp { port: u16, line: String },
    #[error("GET {path} on port {port}: HTTP {code}")]
    Status { path: String, port: u16, code: u16 },
    #[error("no probe")]
    NoProbe,
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// Two failures are alike when they say the same (an I/O error has no equality of its own).
impl PartialEq for ProbeError {
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}

/// The probes by rewritten path, and where the app listens.
#[derive(Debug, Clone)]
pub struct AppProbers {
    probes: BTreeMap<String, AppProbe>,
    host: IpAddr,
}

impl AppProbers {
    /// Reads `PASA_APP_PROBERS`; an error names the probe at fault.
    pub fn parse(json: &str, host: IpAddr) -> Result<AppProbers, ProbersError> {
        let probes: BTreeMap<String, AppProbe> =
            serde_json::from_str(json).map_err(ProbersError::NotAMap)?;
        for (path, probe) in &probes {
            let path = path.clone();
            if !path.starts_with("/app-health/") {
                return Err(ProbersError::Path { path });
            }
            match (&probe.http_get, &probe.tcp_socket) {
                (Some(http), None) => {
                    if http
                        .scheme
                        .as_deref()
                        .is_some_and(|s| !s.eq_ignore_ascii_case("http"))
                    {
                        return Err(ProbersError::Scheme {
                            path,
                            scheme: http.scheme.clone().unwrap_or_default(),
                        });
                    }
                }
                (None, Some(_)) => {}
                _ => {
                    return Err(ProbersError::NotOneAction { path });
                }
            }
        }
        Ok(AppProbers { probes, host })
    }

    /// The status listener's routes.
    pub fn router(self) -> Router {
        Router::new()
            .route("/app-health/{container}/{kind}", get(probe))
            .with_state(Arc::new(self))
    }

    /// Runs the probe registered for `path`: `None` when there is none.
    pub async fn run(&self, path: &str) -> Option<Result<(), ProbeError>> {
        let probe = self.probes.get(path)?;
        let timeout = Duration::from_secs(probe.timeout_seconds.unwrap_or(1).max(1));
        let attempt = async {
            if let Some(http) = &probe.http_get {
                http_probe(SocketAddr::new(self.host, http.port), http).await
            } else if let Some(tcp) = &probe.tcp_socket {
                tokio::net::TcpStream::connect(SocketAddr::new(self.host, tcp.port))
                    .await
                    .map(drop)
                    .map_err(|source| ProbeError::Connection {
                        port: tcp.port,
                        source,
                    })
            } else {
                Err(ProbeError::NoProbe)
            }
        };
        Some(match tokio::time::timeout(timeout, attempt).await {
            Ok(result) => result,
            Err(_) => Err(ProbeError::Timeout(timeout)),
        })
    }
}

async fn probe(
    State(probers): State<Arc<AppProbers>>,
    Path((container, kind)): Path<(String, String)>,
) -> (StatusCode, String) {
    let path = format!("/app-health/{container}/{kind}");
    match probers.run(&path).await {
        None => (StatusCode::NOT_FOUND, format!("no probe at {path}\n")),
        Some(Ok(())) => (StatusCode::OK, "ok\n".into()),
        Some(Err(why)) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

/// One HTTP/1.1 GET; healthy on a 2xx or 3xx status, as kubelet judges.
async fn http_probe(addr: SocketAddr, http: &HttpGet) -> Result<(), ProbeError> {
    let failed = |source| ProbeError::Connection {
        port: http.port,
        source,
    };
    let mut conn = tokio::net::TcpStream::connect(addr).await.map_err(failed)?;
    let path = if http.path.is_empty() {
        "/"
    } else {
        &http.path
    };
    let mut request =
        format!("GET {path} HTTP/1.1\r\nConnection: close\r\nUser-Agent: kube-probe/pasa\r\n");
    let mut has_host = false;
    for h in &http.http_headers {
        has_host |= h.name.eq_ignore_ascii_case("host");
        request.push_str(&format!("{}: {}\r\n", h.name, h.value));
    }
    if !has_host {
        request.push_str(&format!("Host: {addr}\r\n"));
    }
    request.push_str("\r\n");
    conn.write_all(request.as_bytes()).await.map_err(failed)?;
    // The status line is all that is judged.
    let mut head = [0u8; 64];
    let mut read = 0;
    while read < 12 {
        let n = conn.read(&mut head[read..]).await.map_err(failed)?;
        if n == 0 {
            break;
        }
        read += n;
    }
    let line = String::from_utf8_lossy(&head[..read]);
    let code: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| ProbeError::NotHttp {
            port: http.port,
            line: line.to_string(),
        })?;
    if (200..400).contains(&code) {
        Ok(())
    } else {
        Err(ProbeError::Status {
            path: path.to_string(),
            port: http.port,
            code,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An app on loopback answering `status` to every request.
    async fn app(status: u16) -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                let mut buf = [0u8; 1024];
                let _ = conn.read(&mut buf).await;
                let answer = format!("HTTP/1.1 {status} X\r\nContent-Length: 0\r\n\r\n");
                let _ = conn.write_all(answer.as_bytes()).await;
            }
        });
        port
    }

    fn probers(json: serde_json::Value) -> AppProbers {
        AppProbers::parse(&json.to_string(), "127.0.0.1".parse().unwrap()).unwrap()
    }

    #[tokio::test]
    async fn http_and_tcp_probes_are_judged_as_kubelet_does() {
        let healthy = app(204).await;
        let redirect = app(302).await;
        let failing = app(500).await;
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let p = probers(serde_json::json!({
            "/app-health/web/readyz": {"httpGet": {"path": "/ready", "port": healthy}},
            "/app-health/web/livez": {"httpGet": {"path": "/", "port": redirect, "scheme": "HTTP",
                "httpHeaders": [{"name": "X-Probe", "value": "1"}]}},
            "/app-health/web/startupz": {"httpGet": {"path": "/", "port": failing}},
            "/app-health/db/livez": {"tcpSocket": {"port": healthy}},
            "/app-health/db/readyz": {"tcpSocket": {"port": closed}, "timeoutSeconds": 2},
        }));
        assert_eq!(p.run("/app-health/web/readyz").await, Some(Ok(())));
        assert_eq!(p.run("/app-health/web/livez").await, Some(Ok(())));
        let failed = p
            .run("/app-health/web/startupz")
            .await
            .unwrap()
            .unwrap_err();
        assert!(failed.to_string().contains("HTTP 500"), "{failed}");
        assert_eq!(p.run("/app-health/db/livez").await, Some(Ok(())));
        assert!(p.run("/app-health/db/readyz").await.unwrap().is_err());
        assert_eq!(p.run("/app-health/other/livez").await, None);
    }

    #[test]
    fn bad_probe_maps_are_explained() {
        let host = "127.0.0.1".parse().unwrap();
        for (json, says) in [
            (
                r#"{"/x": {"tcpSocket": {"port": 1}}}"#,
                "not an /app-health/ path",
            ),
            (r#"{"/app-health/a/livez": {}}"#, "exactly one of"),
            (
                r#"{"/app-health/a/livez": {"httpGet": {"port": 1, "scheme": "HTTPS"}}}"#,
                "only HTTP",
            ),
            (r#"[1]"#, "not a map of probes"),
        ] {
            let e = AppProbers::parse(json, host).unwrap_err();
            assert!(e.to_string().contains(says), "{json}: {e}");
        }
    }
}
