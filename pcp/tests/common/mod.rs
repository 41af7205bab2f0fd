//! Starting a real `pasa-pcp` binary on loopback for end-to-end tests, and reading its output.

#![allow(dead_code)]

pub mod fake_agent;
pub mod webhook_client;

use std::io::BufReader;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

pub const WAIT: Duration = Duration::from_secs(20);

pub fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

/// A running `pasa-pcp`, killed when dropped.
pub struct Pcp {
    process: pasa_testing::Process,
    /// Its process ID (for the signals a test sends it).
    pub pid: u32,
    /// gRPC address.
    pub addr: String,
    /// Admin address (/metrics, /healthz, /readyz).
    pub admin: SocketAddr,
    /// Webhook address, when started with one.
    pub webhook: Option<SocketAddr>,
    /// The ready lines it printed.
    pub ready_lines: Vec<String>,
}

impl Pcp {
    /// An embedded store in `data` on free loopback ports.
    pub fn start(data: &Path) -> Pcp {
        Pcp::start_with(data, &[])
    }

    /// Like [`Pcp::start`], with extra arguments (e.g. the webhook's).
    pub fn start_with(data: &Path, extra: &[&str]) -> Pcp {
        let data = data.to_str().expect("UTF-8 path");
        let mut args = vec!["--data-dir", data];
        args.extend_from_slice(extra);
        Pcp::start_args(&args)
    }

    /// On free loopback ports, with exactly these further arguments.
    pub fn start_args(args: &[&str]) -> Pcp {
        let mut child = pcp_command()
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .expect("start pasa-pcp");
        let stdout = child.stdout.take().expect("stdout");
        let lines = line_channel(BufReader::new(stdout));
        let mut ready_lines = Vec::new();
        let mut webhook = None;
        loop {
            let Ok(line) = lines.recv_timeout(WAIT) else {
                let _ = child.kill();
                let _ = child.wait();
                panic!("pasa-pcp printed no ready line within {WAIT:?}");
            };
            if let Some(addr) = pasa_pcp::server::parse_webhook_line(&line) {
                webhook = Some(addr);
            }
            ready_lines.push(line.clone());
            if let Some((addr, admin)) = pasa_store::server::parse_ready_line(&line) {
                return Pcp {
                    pid: child.id(),
                    process: pasa_testing::Process::new("pasa-pcp", child),
                    addr: addr.to_string(),
                    admin,
                    webhook,
                    ready_lines,
                };
            }
        }
    }

    pub fn ctl(&self, args: &[&str]) -> Output {
        Command::new(pasactl())
            .arg("--server")
            .arg(&self.addr)
            .args(args)
            .output()
            .expect("run pasactl")
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.ctl(args);
        assert!(
            out.status.success(),
            "pasactl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8")
    }

    /// The admin endpoint's `/metrics` text.
    pub fn metrics(&self) -> String {
        self.admin_get("/metrics")
    }

    /// The admin endpoint's whole answer (status line, headers, body) to `GET path`.
    pub fn admin_get(&self, path: &str) -> String {
        use std::io::{Read, Write};
        let mut conn = std::net::TcpStream::connect(self.admin).expect("connect admin");
        let request = format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
        conn.write_all(request.as_bytes()).expect("request");
        let mut text = String::new();
        conn.read_to_string(&mut text).expect("response");
        text
    }

    /// SIGTERM, then the exit status must be a success.
    pub fn terminate(self) {
        self.process.terminate();
    }
}

pub use pasa_testing::line_channel;

/// `pasa-pcp` on free loopback ports (`--listen` and `--admin`), to be given more arguments.
pub fn pcp_command() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pasa-pcp"));
    command.args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"]);
    command
}

/// The `pasactl` binary (built by `cargo test --workspace`).
pub fn pasactl() -> PathBuf {
    pasa_testing::workspace_binary("pasactl", "pasactl")
}
