//! O1: the on-demand scope with real agents and real Envoys (see `docs/on-demand.md`). For a
//! few sampled workloads (the widest, the aggregator A1 measures, then workloads at the
//! quantiles of the mesh's call counts), the workload's real `pasa-agent` runs its real Envoy,
//! once in each scope, following the seed's store over loopback gRPC. Envoy runs in a network
//! namespace of its own where the application's traffic to the services' addresses is captured
//! as Istio's init container captures it (iptables `REDIRECT` to 15001; the application runs as
//! `nobody`, and Envoy's own connections are left alone), and where every pod
//! address is local, so that one backend answers for every endpoint. The application is
//! `pasa-bench probe-calls` in that namespace: it calls each service its workload calls, by
//! the name an application uses (`<service>.<namespace>`), twice.
//!
//! A request is timed from its sending to the moment Envoy opens its connection to one of the
//! called service's endpoints: Envoy's routing of it, and on demand everything before (the
//! agent learning the host, its store subscription widened and answered, the translation, the
//! clusters, endpoints and virtual host sent to Envoy). What the backend answers does not
//! matter (it closes the connection: Envoy's mutual TLS to it cannot succeed).
//!
//! Then, with every call made, the agent's and Envoy's resident memory, Envoy's own count of
//! allocated memory and of clusters, and the agent's subscription and generated clusters.

use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use pasa_agent::run::Scope;
use serde_json::{Value, json};

use super::agents::{agent_command, free_ports, scrape};
use super::mesh::{self, Mesh, Workload};
use super::scopes::name;
use super::subscriptions::identity_of;
use crate::agent::{envoy_in_netns, netns_pid, ready, usage, workload_certs};
use crate::stats::{percentile, round2};

/// How long a call may wait for Envoy to reach the service (the agent waits at most 5 s for
/// the store's answer to a host it learns).
const CALL_DEADLINE: Duration = Duration::from_secs(8);
/// How long an agent and its Envoy may take to be ready: an eager one translates, and its
/// Envoy takes, the whole mesh (16 s for the seed's).
const READY_DEADLINE: Duration = Duration::from_secs(180);
/// The port every pod serves on (the services' `targetPort`).
const POD_PORT: u16 = 8080;
/// The user the application runs as (`nobody`): only its traffic is captured.
const APPLICATION_UID: &str = "65534";

/// The workloads O1 runs: the widest, then those at the quantiles `k / n` of the call counts.
fn sample(mesh: &Mesh, n: usize) -> Vec<&Workload> {
    let mut by_calls: Vec<&Workload> = mesh.workloads.iter().collect();
    by_calls.sort_by_key(|w| (w.calls.len(), w.app.clone()));
    let mut out = vec![super::single::widest(mesh)];
    for k in 1..n {
        let w = by_calls[(by_calls.len() - 1) * k / n];
        if !out.iter().any(|o| o.app == w.app) {
            out.push(w);
        }
    }
    out.truncate(n);
    out
}

/// A network namespace with the outbound capture; deleted when dropped.
struct Netns(String);

impl Netns {
    fn capture(name: String) -> anyhow::Result<Netns> {
        let run = |args: &[&str]| -> anyhow::Result<()> {
            let status = Command::new(args[0]).args(&args[1..]).status();
            ensure!(
                status.as_ref().is_ok_and(|s| s.success()),
                "`{}` failed ({status:?}): O1 needs root, `ip netns` and iptables",
                args.join(" ")
            );
            Ok(())
        };
        run(&["ip", "netns", "add", &name])?;
        let ns = Netns(name);
        let inside = |args: &[&str]| {
            let mut all = vec!["ip", "netns", "exec", ns.0.as_str()];
            all.extend_from_slice(args);
            run(&all)
        };
        inside(&["ip", "link", "set", "lo", "up"])?;
        // Every pod and service address is this namespace's own.
        inside(&["ip", "route", "add", "local", "10.0.0.0/8", "dev", "lo"])?;
        // The application's calls to the services' addresses go to Envoy, as Istio captures
        // them; Envoy's own connections are not captured (Istio leaves out the proxy's user),
        // so what it passes through reaches its original destination.
        inside(&[
            "iptables",
            "-t",
            "nat",
            "-A",
            "OUTPUT",
            "-p",
            "tcp",
            "-d",
            "10.96.0.0/16",
            "-m",
            "owner",
            "--uid-owner",
            APPLICATION_UID,
            "-j",
            "REDIRECT",
            "--to-ports",
            "15001",
        ])?;
        Ok(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// The agent (and through it its Envoy); stopped when dropped.
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

/// O1's figures: each sampled workload in each scope, and the calls of all of them per scope.
pub async fn run(
    mesh: &Mesh,
    n: usize,
    binary: &Path,
    envoy: &Path,
    server: &str,
) -> anyhow::Result<Value> {
    let Some(program) = super::single::this_program() else {
        println!("O1: skipped (not run as pasa-bench)");
        return Ok(Value::Null);
    };
    let mut runs = Vec::new();
    let mut calls: [(Vec<f64>, Vec<f64>); 2] = Default::default();
    for (k, w) in sample(mesh, n).into_iter().enumerate() {
        for (s, scope) in [Scope::Eager, Scope::OnDemand].into_iter().enumerate() {
            let (figures, first, warm) = one(mesh, w, scope, (binary, envoy, &program), server, k)
                .await
                .with_context(|| format!("O1: {} in the {} scope", w.app, name(scope)))?;
            calls[s].0.extend(first);
            calls[s].1.extend(warm);
            runs.push(figures);
        }
    }
    let mut out = serde_json::Map::new();
    for (scope, (first, warm)) in [Scope::Eager, Scope::OnDemand].into_iter().zip(&calls) {
        println!(
            "O1 {}: {} first calls p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; the second call \
             p50 {:.1} ms, p99 {:.1} ms",
            name(scope),
            first.len(),
            percentile(first, 50.0),
            percentile(first, 99.0),
            percentile(first, 100.0),
            percentile(warm, 50.0),
            percentile(warm, 99.0),
        );
        out.insert(
            name(scope).into(),
            json!({"calls": first.len(), "first_call_ms": quantiles(first),
                   "second_call_ms": quantiles(warm)}),
        );
    }
    out.insert("runs".into(), Value::Array(runs));
    out.insert("goal".into(), json!({"on_demand_first_call_p99_ms": 30}));
    Ok(Value::Object(out))
}

fn quantiles(samples: &[f64]) -> Value {
    json!({"p50": round2(percentile(samples, 50.0)), "p99": round2(percentile(samples, 99.0)),
           "max": round2(percentile(samples, 100.0))})
}

/// One workload's agent and Envoy in one scope: its calls' times (first and second) and
/// what the agent and Envoy hold after them.
async fn one(
    mesh: &Mesh,
    w: &Workload,
    scope: Scope,
    (binary, envoy, program): (&Path, &Path, &Path),
    server: &str,
    k: usize,
) -> anyhow::Result<(Value, Vec<f64>, Vec<f64>)> {
    let pod = w
        .pods
        .iter()
        .find(|p| p.cluster == 0)
        .context("a pod in the first cluster")?;
    let dir = tempfile::tempdir()?;
    let identity = identity_of(&mesh.topology, w, pod);
    let spiffe = format!("spiffe://cluster.local/ns/{}/sa/{}", w.namespace, w.app);
    let certs = workload_certs(dir.path(), &spiffe)?;
    let netns = Netns::capture(format!("pasa-bench-o1-{}-{k}", std::process::id()))?;
    let admin = free_ports(1)?[0];
    let envoy_admin = dir.path().join("envoy-admin.sock");
    let mut command = agent_command(
        binary,
        server,
        &identity,
        (&dir.path().join("xds.sock"), admin, None),
        &dir.path().join("agent.log"),
    )?;
    command
        .args(["--scope", name(scope)])
        .arg("--cert-dir")
        .arg(&certs)
        .arg("--envoy")
        .arg(envoy_in_netns(dir.path(), envoy, &netns.0)?)
        .arg("--envoy-admin")
        .arg(format!("unix:{}", envoy_admin.display()));
    let mut agent = Agent(command.spawn().context("starting the agent")?);
    let started = Instant::now();
    // Ready once Envoy is; an agent that ends, or is not ready in time, says why in its log.
    loop {
        if let Some(status) = agent.0.try_wait()? {
            bail!(
                "the agent ended ({status}) before it was ready; {}",
                log_tail(&dir.path().join("agent.log"))
            );
        }
        if ready(&admin.to_string(), Duration::from_millis(500))
            .await
            .is_ok()
        {
            break;
        }
        ensure!(
            started.elapsed() < READY_DEADLINE,
            "the agent and its Envoy were not ready within {READY_DEADLINE:?}; {}",
            log_tail(&dir.path().join("agent.log"))
        );
    }
    let to_ready = started.elapsed();

    // The application: each called service, by `<service>.<namespace>`, on its port 80.
    let lines: Vec<String> = w
        .calls
        .iter()
        .map(|&j| {
            let c = &mesh.workloads[j];
            let ips: Vec<&str> = c.pods.iter().map(|p| p.ip.as_str()).collect();
            format!(
                "{}.{} {} {}",
                c.app,
                c.namespace,
                mesh::service_address(j, 0),
                ips.join(",")
            )
        })
        .collect();
    let mut probe = Command::new("ip")
        .args(["netns", "exec", &netns.0, "setpriv"])
        .arg(format!("--reuid={APPLICATION_UID}"))
        .arg(format!("--regid={APPLICATION_UID}"))
        .arg("--clear-groups")
        .arg(program)
        .arg("probe-calls")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running probe-calls in the namespace (setpriv)")?;
    probe
        .stdin
        .take()
        .context("probe-calls' input")?
        .write_all(lines.join("\n").as_bytes())?;
    let output = probe.wait_with_output()?;
    ensure!(
        output.status.success(),
        "probe-calls failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let probed: Value = serde_json::from_slice(
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .as_bytes(),
    )
    .context("probe-calls did not answer in JSON")?;
    let times = |what: &str| -> Vec<f64> {
        probed[what]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_f64).collect())
            .unwrap_or_default()
    };
    let (first, warm) = (times("first_ms"), times("second_ms"));
    let unanswered = probed["unanswered"].as_array().map_or(0, Vec::len);

    // What each holds once the application has called everything.
    let ticks = crate::agent::clock_ticks();
    let agent_usage = usage(agent.0.id(), ticks)?;
    let envoy_usage = netns_pid(&netns.0).and_then(|pid| usage(pid, ticks).ok());
    let metrics = scrape(admin).await?;
    let stats = envoy_stats(&envoy_admin).await.unwrap_or_default();
    let sample = |name: &str| super::agents::sample(&metrics, name);
    // Envoy's stats read `name: value`.
    let envoy = |name: &str| {
        stats.lines().find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix(": ")?
                .trim()
                .parse::<f64>()
                .ok()
        })
    };
    let count = |value: Option<f64>| value.map(|v| v as u64);
    let mean_ms = |histogram: &str| {
        let sum = sample(&format!("{histogram}_sum"))?;
        let count = sample(&format!("{histogram}_count"))?;
        (count > 0.0).then(|| round2(sum / count * 1e3))
    };
    let figures = json!({
        "workload": w.app, "scope": name(scope), "calls": w.calls.len(),
        "ready_ms": to_ready.as_millis() as u64,
        "first_call_ms": quantiles(&first), "second_call_ms": quantiles(&warm),
        "unanswered": probed["unanswered"],
        "agent_rss_mib": round2(agent_usage.rss), "agent_own_mib": round2(agent_usage.anon),
        "envoy_rss_mib": envoy_usage.map(|u| round2(u.rss)),
        "envoy_allocated_mib": envoy("server.memory_allocated")
            .map(|b| round2(b / (1024.0 * 1024.0))),
        "envoy_clusters": count(envoy("cluster_manager.active_clusters")),
        "subscription_rules": count(sample("pasa_agent_subscription_rules")),
        "clusters_generated": count(sample(
            "pasa_agent_resources{type=\"CDS\",generator=\"envoy\"}")),
        "hosts_learned": count(sample("pasa_agent_on_demand_hosts")),
        "agent_resolution_mean_ms": mean_ms("pasa_agent_on_demand_resolution_seconds"),
        "agent_translations": count(sample("pasa_agent_translation_seconds_count")),
        "agent_translation_mean_ms": mean_ms("pasa_agent_translation_seconds"),
    });
    println!(
        "O1: {} ({} calls) {}: ready in {} ms; first call p50 {:.1} ms, p99 {:.1} ms, second \
         p50 {:.1} ms; {unanswered} unanswered; agent RSS {:.1} MiB, Envoy RSS {} MiB ({} \
         clusters); {} subscription rules",
        w.app,
        w.calls.len(),
        name(scope),
        to_ready.as_millis(),
        percentile(&first, 50.0),
        percentile(&first, 99.0),
        percentile(&warm, 50.0),
        agent_usage.rss,
        figures["envoy_rss_mib"],
        figures["envoy_clusters"],
        figures["subscription_rules"],
    );
    drop(agent);
    drop(netns);
    if std::env::var_os("PASA_BENCH_AGENT_LOG").is_some() {
        // Asked for: the agent's log is kept.
        println!(
            "O1: the agent's log is in {}",
            dir.keep().join("agent.log").display()
        );
    }
    Ok((figures, first, warm))
}

/// The last lines of the agent's log, for an error.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    format!(
        "the agent's log ends:\n{}",
        lines[lines.len().saturating_sub(20)..].join("\n")
    )
}

/// Envoy's memory and cluster count, from its admin endpoint on a Unix socket.
async fn envoy_stats(socket: &Path) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::UnixStream::connect(socket).await?;
    conn.write_all(
        b"GET /stats?filter=server.memory_allocated%7Ccluster_manager.active_clusters \
          HTTP/1.1\r\nHost: envoy\r\nConnection: close\r\n\r\n",
    )
    .await?;
    let mut raw = String::new();
    tokio::time::timeout(Duration::from_secs(10), conn.read_to_string(&mut raw)).await??;
    Ok(raw)
}

/// `pasa-bench probe-calls`: the application O1 runs in Envoy's network namespace. It reads
/// its targets from its input, a line each: `<host> <service address> <endpoint addresses,
/// comma-separated>`.
#[derive(clap::Args)]
pub struct ProbeArgs {}

/// Calls each target twice and times each call until Envoy connects to one of its endpoints.
pub fn probe_calls(_: &ProbeArgs) -> anyhow::Result<Value> {
    let listener = TcpListener::bind(("0.0.0.0", POD_PORT))
        .with_context(|| format!("cannot serve the pods' port {POD_PORT}"))?;
    let (accepted, accepts) = mpsc::channel::<(IpAddr, Instant)>();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            if let Ok(local) = conn.local_addr()
                && accepted.send((local.ip(), Instant::now())).is_err()
            {
                return;
            }
        }
    });
    let text = std::io::read_to_string(std::io::stdin())?;
    let (mut first, mut second, mut unanswered) = (Vec::new(), Vec::new(), Vec::new());
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut fields = line.split_whitespace();
        let (Some(host), Some(address), Some(ips)) = (fields.next(), fields.next(), fields.next())
        else {
            bail!("a target line is `<host> <address> <endpoints>`: {line:?}");
        };
        let address: IpAddr = address.parse().context("a service address")?;
        let ips: Vec<IpAddr> = ips.split(',').filter_map(|ip| ip.parse().ok()).collect();
        for (which, times) in [("first", &mut first), ("second", &mut second)] {
            // What an earlier call's retries brought is not this call's.
            std::thread::sleep(Duration::from_millis(50));
            while accepts.try_recv().is_ok() {}
            match call(host, SocketAddr::new(address, 80), &ips, &accepts)? {
                Ok(took) => times.push(took.as_secs_f64() * 1e3),
                Err(answer) => unanswered.push(json!({"host": host, "call": which,
                                                      "answer": answer})),
            }
        }
    }
    Ok(json!({"first_ms": first, "second_ms": second, "unanswered": unanswered}))
}

/// One call: the time from sending it until Envoy connects to one of `ips`, if it does within
/// [`CALL_DEADLINE`]; else the first line of what Envoy answered, if anything.
fn call(
    host: &str,
    to: SocketAddr,
    ips: &[IpAddr],
    accepts: &mpsc::Receiver<(IpAddr, Instant)>,
) -> anyhow::Result<Result<Duration, String>> {
    let mut conn = TcpStream::connect_timeout(&to, CALL_DEADLINE)
        .with_context(|| format!("connecting to {to} (captured to Envoy)"))?;
    let sent = Instant::now();
    conn.write_all(
        format!("GET / HTTP/1.1\r\nHost: {host}\r\nUser-Agent: probe\r\n\r\n").as_bytes(),
    )?;
    let deadline = sent + CALL_DEADLINE;
    let reached =
        |(ip, at): (IpAddr, Instant)| (ips.contains(&ip) && at >= sent).then(|| at - sent);
    conn.set_nonblocking(true)?;
    let mut answer = [0u8; 512];
    let answered = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match accepts.recv_timeout(left.min(Duration::from_millis(20))) {
            Ok(accept) => match reached(accept) {
                Some(took) => return Ok(Ok(took)),
                None => continue,
            },
            Err(mpsc::RecvTimeoutError::Timeout) if !left.is_zero() => {
                // Envoy answered without reaching the service (a 503, a 404)?
                use std::io::Read;
                match conn.read(&mut answer) {
                    Ok(n) if n > 0 => break n,
                    Ok(_) => break 0,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    Err(_) => break 0,
                }
            }
            Err(_) => break 0,
        }
    };
    // An accept that came with the answer is still this call's.
    if let Some(took) = accepts.try_iter().find_map(reached) {
        return Ok(Ok(took));
    }
    let answer = String::from_utf8_lossy(&answer[..answered]);
    // The status line and Envoy's reason, its local reply's body.
    let status = answer.lines().next().unwrap_or("no answer");
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b.trim());
    Ok(Err(format!("{status}: {body}")))
}
