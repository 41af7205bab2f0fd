//! The real `pasa-agent` binary, started on a socket in a temporary directory, and a small HTTP
//! client for its admin endpoint.

use std::io::BufReader;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Failure guard only: waits end as soon as what they wait for happens.
pub const WAIT: Duration = Duration::from_secs(20);

pub const NODE_ID: &str = "sidecar~10.0.0.1~cart-1.shop~shop.svc.cluster.local";

/// A running `pasa-agent`, killed when dropped.
pub struct Agent {
    process: pasa_testing::Process,
    pub uds: PathBuf,
    pub admin: SocketAddr,
}

impl Agent {
    /// Starts the agent for `NODE_ID` following `server`, with its socket in `dir` and its
    /// cache in `cache_dir`, and waits for its ready line.
    pub fn start(server: SocketAddr, dir: &Path, cache_dir: &Path) -> Agent {
        Agent::start_as(NODE_ID, server, dir, cache_dir)
    }

    /// [`Agent::start`] for another proxy.
    pub fn start_as(node_id: &str, server: SocketAddr, dir: &Path, cache_dir: &Path) -> Agent {
        Agent::start_with(node_id, server, dir, cache_dir, &[])
    }

    /// [`Agent::start_as`] with extra arguments.
    pub fn start_with(
        node_id: &str,
        server: SocketAddr,
        dir: &Path,
        cache_dir: &Path,
        extra: &[&str],
    ) -> Agent {
        let uds = dir.join("xds.sock");
        let mut child = Command::new(env!("CARGO_BIN_EXE_pasa-agent"))
            .arg("--server")
            .arg(server.to_string())
            .arg("--node-id")
            .arg(node_id)
            .arg("--uds")
            .arg(&uds)
            .arg("--cache-dir")
            .arg(cache_dir)
            .args(["--admin", "127.0.0.1:0"])
            .args(extra)
            // `PASA_TEST_AGENT_LOG` (e.g. `pasa_agent=debug`) to see an agent's log in a test.
            .env(
                "RUST_LOG",
                std::env::var("PASA_TEST_AGENT_LOG").unwrap_or_else(|_| "error".into()),
            )
            .stdout(Stdio::piped())
            .spawn()
            .expect("start pasa-agent");
        let stdout = child.stdout.take().expect("stdout");
        let lines = line_channel(BufReader::new(stdout));
        loop {
            let Ok(line) = lines.recv_timeout(WAIT) else {
                let _ = child.kill();
                let _ = child.wait();
                panic!("pasa-agent printed no ready line within {WAIT:?}");
            };
            if let Some((path, admin)) = pasa_agent::run::parse_ready_line(&line) {
                assert_eq!(path, uds);
                return Agent {
                    process: pasa_testing::Process::new("pasa-agent", child),
                    uds,
                    admin,
                };
            }
        }
    }

    /// [`Agent::start_with`] with its socket in `dir` (made if missing) and its cache in
    /// `dir/cache`.
    pub fn start_in(node_id: &str, server: SocketAddr, dir: &Path, extra: &[&str]) -> Agent {
        std::fs::create_dir_all(dir).expect("the agent's directory");
        Agent::start_with(node_id, server, dir, &dir.join("cache"), extra)
    }

    /// GET `path` on the admin endpoint: status code and body.
    pub async fn get(&self, path: &str) -> (u16, String) {
        http_get(self.admin, path).await
    }

    /// POST `body` (JSON) to `path` on the admin endpoint: status code and body.
    pub async fn post(&self, path: &str, body: &str) -> (u16, String) {
        http_request(self.admin, "POST", path, body).await
    }

    /// Polls `path` until `ok` holds for its body (guarded by `WAIT`); returns the body.
    pub async fn until(&self, path: &str, what: &str, ok: impl Fn(u16, &str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let (code, body) = self.get(path).await;
            if ok(code, &body) {
                return body;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}; last {path}: {code} {body}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The agent's exit status once it has exited by itself, waiting at most `deadline`.
    pub fn exited_within(&mut self, deadline: Duration) -> Option<std::process::ExitStatus> {
        self.process.exited_within(deadline)
    }

    /// SIGTERM, then the exit status must be a success.
    pub fn terminate(self) {
        self.process.terminate();
    }
}

pub use pasa_testing::line_channel;

/// Runs `pasa-agent` with `args` until it exits by itself (guarded by `WAIT`, then killed):
/// its exit status and what it wrote on stderr.
pub fn run_to_exit(args: &[&str]) -> (std::process::ExitStatus, String) {
    use std::io::Read as _;
    let mut child = Command::new(env!("CARGO_BIN_EXE_pasa-agent"))
        .args(args)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start pasa-agent");
    let mut stderr = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let mut process = pasa_testing::Process::new("pasa-agent", child);
    let exited = process.exited_within(WAIT);
    drop(process);
    let text = reader.join().expect("the stderr reader");
    let status = exited
        .unwrap_or_else(|| panic!("pasa-agent did not exit within {WAIT:?}; it said:\n{text}"));
    (status, text)
}

/// A minimal HTTP/1.1 GET: status code and body.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    http_request(addr, "GET", path, "").await
}

/// A minimal HTTP/1.1 request with a JSON body: status code and body.
pub async fn http_request(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut conn = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the admin endpoint");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(request.as_bytes()).await.expect("request");
    let mut raw = String::new();
    conn.read_to_string(&mut raw).await.expect("response");
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status code");
    (code, body.to_string())
}

/// The names of the resources of `kind` (`CDS`, `LDS`, ...) in a `/config_dump` body, as served
/// to Envoy.
pub fn served(dump: &str, kind: &str) -> Vec<String> {
    let dump: serde_json::Value = serde_json::from_str(dump).expect("/config_dump is JSON");
    dump["generators"]["envoy"][kind]
        .as_array()
        .map(|list| {
            list.iter()
                .filter_map(|c| c["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}
