//! Real traffic for the real-Envoy tests: the HTTP and TLS backends (`e2e/http_backend.py`) and
//! the client (`e2e/http_client.py`), both run inside a network namespace the test made.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use std::time::{Duration, Instant};

use super::envoy::{Netns, WAIT};

/// A file of `agent/tests/e2e`.
pub fn e2e(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/e2e")
        .join(file)
}

/// One answer of `http_client.py`.
#[derive(Debug, serde::Deserialize)]
pub struct Answer {
    pub status: u16,
    #[serde(default)]
    pub backend: Option<String>,
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub body: Option<String>,
    #[serde(default)]
    pub location: Option<String>,
    /// The request headers the backend saw.
    #[serde(default)]
    pub echoed: std::collections::BTreeMap<String, String>,
    /// The response's headers, by lower-case name.
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    /// Why no answer came (connection refused, reset, ...).
    #[serde(default)]
    pub error: Option<String>,
    pub ms: u64,
}

/// Runs `http_client.py` in `netns` with `args`.
pub fn client(netns: &Netns, args: &[&str]) -> Vec<Answer> {
    let out = netns
        .command("python3")
        .arg(e2e("http_client.py"))
        .args(args)
        .output()
        .expect("run the HTTP client");
    assert!(
        out.status.success(),
        "http_client.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "http_client.py {args:?} printed no answers ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// A backend answering as `name` on `address` (TLS with `tls`'s certificate and key), in
/// `netns`; stopped (its stdin closed) when dropped.
pub struct Backend(Child);

impl Backend {
    pub fn start(netns: &Netns, name: &str, address: &str, tls: Option<(&Path, &Path)>) -> Backend {
        let mut command = netns.command("python3");
        command.arg(e2e("http_backend.py")).args([name, address]);
        if let Some((cert, key)) = tls {
            command.arg("--tls").arg(cert).arg(key);
        }
        Backend::spawn(command, &format!("backend {name} on {address}"))
    }

    /// Runs `command` (a backend that prints a line starting with `ready` once it serves, and
    /// stops when its stdin closes), waiting for that line.
    /// A gRPC backend (`e2e/grpc_backend.py`) answering `/pasa.e2e.Echo/Who` with `name`, on
    /// `host`:`port` in `netns`.
    pub fn grpc(netns: &Netns, name: &str, host: &str, port: u16) -> Backend {
        let mut command = netns.command("python3");
        command
            .arg(e2e("grpc_backend.py"))
            .args([name, &port.to_string(), host]);
        Backend::spawn(command, &format!("gRPC backend {name} on {host}:{port}"))
    }

    pub fn spawn(mut command: std::process::Command, what: &str) -> Backend {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {what}: {e}"));
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .unwrap_or_else(|e| panic!("{what}: no ready line: {e}"));
        assert!(line.starts_with("ready"), "{what}: {line:?}");
        Backend(child)
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One request to `url` from `ns` (3 s timeout).
pub fn request(ns: &Netns, url: &str, extra: &[&str]) -> Answer {
    let mut args = vec![url, "1", "--timeout", "3"];
    args.extend_from_slice(extra);
    client(ns, &args).remove(0)
}

/// Polls `url` until `ok` holds for its answer (bounded by the envoy module's `WAIT`).
pub fn until(
    ns: &Netns,
    url: &str,
    extra: &[&str],
    what: &str,
    ok: impl Fn(&Answer) -> bool,
) -> Answer {
    let deadline = Instant::now() + WAIT;
    loop {
        let answer = request(ns, url, extra);
        if ok(&answer) {
            return answer;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {answer:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
