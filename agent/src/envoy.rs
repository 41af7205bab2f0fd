//! Envoy as the agent's child, as pilot-agent runs it (`pasa-agent --envoy PATH`): the agent
//! writes the bootstrap ([`crate::bootstrap`]), starts Envoy on it, answers readiness for both
//! (`/healthz/ready`: Envoy's admin `/ready` says LIVE and the agent's clients hold their
//! configuration), and on SIGTERM drains as pilot-agent does: Envoy's listeners drain gracefully
//! (`/drain_listeners?graceful`), the agent waits `--drain-duration`, then Envoy is asked to quit
//! (`/quitquitquit`) and its exit status becomes the agent's.
//!
//! **Envoy's failure is the agent's.** As with pilot-agent, an Envoy that cannot be started (no
//! such binary, not executable) or that exits when not asked to ends the agent at once, non-zero,
//! with the binary's path and the OS error or Envoy's exit status logged: a pod whose proxy is
//! gone must not look healthy, and its restart policy starts both again.

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use crate::bootstrap::AdminAddress;

/// How long Envoy may take to quit once asked, before it is killed.
const QUIT_DEADLINE: Duration = Duration::from_secs(5);

/// What it takes to run Envoy.
#[derive(Debug, Clone)]
pub struct EnvoyRun {
    pub binary: PathBuf,
    /// The bootstrap file (written by the agent before the first start).
    pub config: PathBuf,
    pub admin: AdminAddress,
    pub log_level: String,
    pub concurrency: u32,
    /// How long listeners drain on shutdown before Envoy is asked to quit.
    pub drain: Duration,
}

/// Why Envoy could not be run.
#[derive(Debug, thiserror::Error)]
pub enum EnvoyError {
    #[error("cannot start Envoy {binary} (is --envoy the path of Envoy's binary?)")]
    Spawn {
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot wait for Envoy {binary}")]
    Wait {
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "Envoy {binary} exited with {status} while the agent was running; the agent stops with \
         it (Envoy's own log above says why)"
    )]
    Exited { binary: PathBuf, status: ExitStatus },
    #[error("Envoy exited with {0} on shutdown")]
    Failed(ExitStatus),
}

impl EnvoyError {
    /// The agent's exit code when Envoy ended it: Envoy's own when it has a non-zero one, else 1.
    pub fn exit_code(&self) -> u8 {
        let status = match self {
            EnvoyError::Exited { status, .. } | EnvoyError::Failed(status) => Some(status),
            EnvoyError::Spawn { .. } | EnvoyError::Wait { .. } => None,
        };
        status
            .and_then(ExitStatus::code)
            .and_then(|c| u8::try_from(c).ok())
            .filter(|c| *c != 0)
            .unwrap_or(1)
    }
}

impl EnvoyRun {
    /// Envoy's exit status, or why it could not be waited for.
    fn exited(&self, waited: std::io::Result<ExitStatus>) -> Result<ExitStatus, EnvoyError> {
        waited.map_err(|source| EnvoyError::Wait {
            binary: self.binary.clone(),
            source,
        })
    }
}

/// Runs Envoy until `stop` turns true, then drains and stops it; `Ok` when Envoy exited cleanly
/// at the end. An Envoy that cannot be started, or that exits before `stop`, ends this at once
/// with the reason, logged here (see the module doc).
pub async fn supervise(run: EnvoyRun, mut stop: watch::Receiver<bool>) -> Result<(), EnvoyError> {
    let spawned = tokio::process::Command::new(&run.binary)
        .arg("-c")
        .arg(&run.config)
        .args(["--log-level", &run.log_level])
        .args(["--concurrency", &run.concurrency.to_string()])
        .args(["--drain-time-s", &run.drain.as_secs().max(1).to_string()])
        .args(["--drain-strategy", "immediate", "--disable-hot-restart"])
        .kill_on_drop(true)
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(source) => {
            tracing::error!(binary = %run.binary.display(), error = %source, "Envoy did not start (is --envoy the path of Envoy's binary?)");
            return Err(EnvoyError::Spawn {
                binary: run.binary.clone(),
                source,
            });
        }
    };
    tracing::info!(pid = child.id(), binary = %run.binary.display(), config = %run.config.display(), "Envoy started");
    let exited = tokio::select! {
        exited = child.wait() => Some(exited),
        _ = stop.wait_for(|s| *s) => None,
    };
    let Some(exited) = exited else {
        return drain_and_quit(&run, &mut child).await;
    };
    let status = match exited {
        Ok(status) => status,
        Err(source) => {
            tracing::error!(binary = %run.binary.display(), error = %source, "lost track of Envoy");
            return Err(EnvoyError::Wait {
                binary: run.binary.clone(),
                source,
            });
        }
    };
    if *stop.borrow() {
        return finished(status);
    }
    let e = EnvoyError::Exited {
        binary: run.binary.clone(),
        status,
    };
    tracing::error!(binary = %run.binary.display(), %status, "Envoy exited; the agent stops with it");
    Err(e)
}

fn finished(status: ExitStatus) -> Result<(), EnvoyError> {
    if status.success() {
        Ok(())
    } else {
        Err(EnvoyError::Failed(status))
    }
}

/// pilot-agent's termination: drain the listeners gracefully, wait the drain duration (or
/// until Envoy is gone), ask Envoy to quit, and kill it if it does not.
async fn drain_and_quit(
    run: &EnvoyRun,
    child: &mut tokio::process::Child,
) -> Result<(), EnvoyError> {
    tracing::info!(drain = ?run.drain, "draining Envoy's listeners");
    if let Err(e) = admin_request(&run.admin, "POST", "/drain_listeners?graceful").await {
        tracing::warn!(error = %e, "Envoy's admin endpoint did not take the drain");
    }
    tokio::select! {
        exited = child.wait() => {
            return run.exited(exited).and_then(finished);
        }
        _ = tokio::time::sleep(run.drain) => {}
    }
    if let Err(e) = admin_request(&run.admin, "POST", "/quitquitquit").await {
        tracing::warn!(error = %e, "Envoy's admin endpoint did not take /quitquitquit");
    }
    match tokio::time::timeout(QUIT_DEADLINE, child.wait()).await {
        Ok(exited) => run.exited(exited).and_then(finished),
        Err(_) => {
            tracing::warn!("Envoy did not quit in time; killing it");
            let _ = child.kill().await;
            Ok(())
        }
    }
}

/// Whether Envoy's admin endpoint says it is ready (`/ready`: 200 `LIVE`); the reason when not.
pub async fn ready(admin: &AdminAddress) -> Result<(), String> {
    match admin_request(admin, "GET", "/ready").await {
        Ok((200, _)) => Ok(()),
        Ok((code, body)) => Err(format!("Envoy is not ready ({code}: {})", body.trim())),
        Err(e) => Err(format!(
            "Envoy's admin endpoint {admin} does not answer: {e}"
        )),
    }
}

/// One HTTP/1.1 request to Envoy's admin endpoint: status and body.
pub async fn admin_request(
    admin: &AdminAddress,
    method: &str,
    path: &str,
) -> std::io::Result<(u16, String)> {
    request_within(admin, method, path, Duration::from_secs(2)).await
}

/// What Envoy holds: its admin `/config_dump` with endpoints (large in a large mesh, hence
/// the longer deadline).
pub async fn config_dump(admin: &AdminAddress) -> std::io::Result<(u16, String)> {
    request_within(
        admin,
        "GET",
        "/config_dump?include_eds",
        Duration::from_secs(30),
    )
    .await
}

async fn request_within(
    admin: &AdminAddress,
    method: &str,
    path: &str,
    deadline: Duration,
) -> std::io::Result<(u16, String)> {
    let exchange = async {
        match admin {
            AdminAddress::Tcp(addr) => {
                exchange(tokio::net::TcpStream::connect(addr).await?, method, path).await
            }
            AdminAddress::Unix(socket) => {
                exchange(tokio::net::UnixStream::connect(socket).await?, method, path).await
            }
        }
    };
    tokio::time::timeout(deadline, exchange)
        .await
        .map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {deadline:?}"),
            )
        })?
}

/// One HTTP/1.1 request with `Connection: close` on `stream`: status and body.
pub async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    method: &str,
    path: &str,
) -> std::io::Result<(u16, String)> {
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: envoy-admin\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    parse_answer(&raw)
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "not an HTTP answer"))
}

/// Status and body of a whole HTTP/1.1 answer, chunked or not (Envoy chunks large admin
/// answers).
fn parse_answer(raw: &[u8]) -> Option<(u16, String)> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..split]).ok()?;
    let body = &raw[split + 4..];
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    let chunked = head.lines().any(|line| {
        line.split_once(':').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case("transfer-encoding")
                && value.trim().eq_ignore_ascii_case("chunked")
        })
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    Some((code, String::from_utf8_lossy(&body).into_owned()))
}

fn dechunk(mut rest: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n")?;
        let size = std::str::from_utf8(&rest[..line_end]).ok()?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        let after = &rest[line_end + 2..];
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(after.get(..size)?);
        rest = after.get(size..)?.strip_prefix(b"\r\n")?;
    }
}

/// Where the agent writes the bootstrap of the Envoy it runs: beside its socket, as
/// pilot-agent writes `envoy-rev.json` beside its own.
pub fn bootstrap_path(uds: &Path) -> PathBuf {
    uds.parent()
        .unwrap_or_else(|| Path::new("."))
        .join("envoy-rev.json")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_plain_and_chunked() {
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nLIVE\n";
        assert_eq!(parse_answer(plain), Some((200, "LIVE\n".into())));
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n3;x=y\r\n:1}\r\n0\r\n\r\n";
        assert_eq!(parse_answer(chunked), Some((200, "{\"a\":1}".into())));
        let cut = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\n{\"a\"";
        assert_eq!(parse_answer(cut), None);
        assert_eq!(parse_answer(b"garbage"), None);
    }
}
