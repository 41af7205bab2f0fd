//! S4: real agents. `--agents` pods that call the hottest service each get a real `pasa-agent`
//! process following the seed's store over loopback gRPC (the store's own server, in this
//! process), and an ADS client on the agent's socket that asks as Envoy asks (see
//! [`xds_client`](super::xds_client)). Once every client holds the hot service's route, one
//! VirtualService change moves its canary weight; each client is timed from just before the
//! write to holding the new weight, and every agent's own `pasa_agent_propagation_seconds`
//! (commit → the client's ACK) is read from its `/metrics`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use envoy_types::pb::envoy::config::core::v3::Node;
use pasa_agent::identity::IdentityArgs;
use pasa_store::Store;
use serde_json::{Value, json};

use super::mesh::{Mesh, Pod, Workload};
use super::xds_client::{self, RouteState, Watched};
use super::{identity_of, manifest};
use crate::clusters::Topology;
use crate::stats::{cdf, mean, percentile, round2, rss_mib_of};

/// How long an agent and its client may take to hold the first route, and then the new one.
const PATIENCE: Duration = Duration::from_secs(120);

/// One running agent and what its client holds.
struct Running {
    child: Child,
    admin: SocketAddr,
    log: PathBuf,
    state: Arc<Mutex<RouteState>>,
}

/// Whether the agents save their cache (`--cache-dir`), as injected agents do: A1 measures the
/// agent as deployed; S4's thousand agents on two cores leave it off, so the disk is not part of
/// the one change's latency.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Cache {
    Off,
    PerAgent,
}

/// The agents of S4; stopped (SIGTERM, then SIGKILL for stragglers) when dropped.
pub struct Fleet {
    agents: Vec<Running>,
    clients: Vec<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Fleet {
    /// Starts a real agent for each of `pods` (of a mesh on `topology`), and beside each an
    /// ADS client watching `watched`.
    pub fn launch(
        binary: &Path,
        server: &str,
        (topology, pods): (&Topology, &[(&Workload, &Pod)]),
        watched: &Watched,
        cache: Cache,
    ) -> anyhow::Result<Fleet> {
        let dir = tempfile::Builder::new()
            .prefix("pasa-bench-agents-")
            .tempdir()?;
        let root = dir.path().to_path_buf();
        let ports = free_ports(pods.len())?;
        let mut fleet = Fleet {
            agents: Vec::with_capacity(pods.len()),
            clients: Vec::with_capacity(pods.len()),
            _dir: dir,
        };
        for (i, ((w, pod), admin)) in pods.iter().zip(ports).enumerate() {
            let home = root.join(format!("a{i}"));
            std::fs::create_dir_all(&home)?;
            let uds = home.join("xds.sock");
            let node_id = pod.node_id(&w.namespace);
            let log_path = home.join("agent.log");
            let cache_dir = (cache == Cache::PerAgent).then(|| home.join("cache"));
            let child = agent_command(
                binary,
                server,
                &identity_of(topology, w, pod),
                (&uds, admin, cache_dir.as_deref()),
                &log_path,
            )?
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
            let state = Arc::new(Mutex::new(RouteState::default()));
            let node = Node {
                id: node_id,
                ..Default::default()
            };
            fleet.clients.push(tokio::spawn(xds_client::run(
                uds,
                node,
                watched.clone(),
                Arc::clone(&state),
                PATIENCE,
            )));
            fleet.agents.push(Running {
                child,
                admin,
                log: log_path,
                state,
            });
        }
        Ok(fleet)
    }

    /// The agents' process ids and admin addresses.
    pub fn agents(&self) -> impl Iterator<Item = (u32, SocketAddr)> + '_ {
        self.agents.iter().map(|a| (a.child.id(), a.admin))
    }

    /// What the client of agent `i` holds.
    pub fn state(&self, i: usize) -> Option<std::sync::MutexGuard<'_, RouteState>> {
        self.agents.get(i)?.state.lock().ok()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for c in &self.clients {
            c.abort();
        }
        for a in &self.agents {
            let _ = Command::new("kill")
                .args(["-TERM", &a.child.id().to_string()])
                .status();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for a in &mut self.agents {
            while Instant::now() < deadline && matches!(a.child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            if matches!(a.child.try_wait(), Ok(None)) {
                let _ = a.child.kill();
            }
            let _ = a.child.wait();
        }
    }
}

/// The command starting a real agent of `identity` (a pod's: see `identity_of`), following
/// `server`, serving ADS on `uds` and its admin endpoint on `admin`, saving its cache in
/// `cache_dir` if given, logging to `log`, with malloc set as deployed.
pub fn agent_command(
    binary: &Path,
    server: &str,
    identity: &IdentityArgs,
    (uds, admin, cache_dir): (&Path, SocketAddr, Option<&Path>),
    log: &Path,
) -> anyhow::Result<Command> {
    let log = std::fs::File::create(log)?;
    let mut command = Command::new(binary);
    if let Some(dir) = cache_dir {
        command.arg("--cache-dir").arg(dir);
    }
    // The network is said only when there is one (an empty flag value is no network).
    if !identity.network.is_empty() {
        command.args(["--network", &identity.network]);
    }
    command
        .args(["--server", server, "--node-id", &identity.node_id])
        .args(["--labels", &identity.labels])
        .args(["--service-account", &identity.service_account])
        .args(["--cluster-id", &identity.cluster_id])
        .arg("--uds")
        .arg(uds)
        .args(["--admin", &admin.to_string()])
        .env(
            "RUST_LOG",
            std::env::var("PASA_BENCH_AGENT_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .env("MALLOC_ARENA_MAX", crate::agent::malloc_arena_max())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    Ok(command)
}

/// Loopback ports nobody listens on, one per agent, for their admin endpoints.
pub fn free_ports(n: usize) -> anyhow::Result<Vec<SocketAddr>> {
    let held = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .context("cannot find free loopback ports for the agents")?;
    held.iter()
        .map(|l| l.local_addr().context("a free port"))
        .collect()
}

/// The pods S4 runs agents for: those of workloads calling `hot`, in the mesh's order.
fn pods_calling(mesh: &Mesh, hot: usize, n: usize) -> Vec<(&Workload, &Pod)> {
    mesh.pods()
        .filter(|(w, _)| w.calls.binary_search(&hot).is_ok())
        .take(n)
        .collect()
}

/// The store's own gRPC server on a loopback port, in this process, for the real agents.
pub struct Served {
    pub addr: String,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Served {
    /// Serves the store API over `store` without taking its lifecycle: stopping the server
    /// leaves the store running (the seed shuts it down itself, in S6).
    pub async fn start(store: &Store) -> anyhow::Result<Served> {
        let listeners =
            pasa_store::server::Listeners::bind("127.0.0.1:0".parse()?, "127.0.0.1:0".parse()?)
                .await?;
        let addr = listeners.grpc_addr.to_string();
        let service = pasa_store::service::StoreService::new(store.clone()).into_server();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(listeners.serve(
            "pasa-bench-store",
            service,
            None,
            Default::default(),
            async move {
                let _ = stopped.await;
            },
        ));
        Ok(Served { addr, stop, task })
    }

    /// Stops the server (the store goes on).
    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        self.task.await.context("the store server task")?
    }
}

/// S4's figures.
pub async fn run(mesh: &Mesh, count: usize, binary: &Path, server: &str) -> anyhow::Result<Value> {
    let hot = 0;
    let target = &mesh.workloads[hot];
    // Each agent is a process of its own: run as many as this machine's memory holds.
    let fits = crate::stats::meminfo_mib("MemAvailable:").map_or(count, |mib| {
        ((mib - HEADROOM_MIB).max(0.0) / AGENT_BUDGET_MIB) as usize
    });
    let requested = count;
    let count = if fits < count {
        println!(
            "S4: {count} agents asked for, but only {fits} fit in the memory available (about \
             {AGENT_BUDGET_MIB} MiB each, {HEADROOM_MIB} MiB kept free): running {fits}"
        );
        ensure!(
            fits > 0,
            "S4: not even one agent fits in the memory available"
        );
        fits
    } else {
        count
    };
    let pods = pods_calling(mesh, hot, count);
    ensure!(
        pods.len() == count,
        "S4: only {} pods call {}; fewer --agents",
        pods.len(),
        target.host
    );
    let mut figures = measure(mesh, &pods, target, server, binary).await?;
    figures["agents_requested"] = json!(requested);
    Ok(figures)
}

/// What one agent of S4 costs the machine, with a margin: its resident memory is 15–20 MiB, of
/// which about 9 MiB is the binary's text, shared by all of them; 870 agents raised the
/// machine's used memory by about 6 MiB each, kernel and socket buffers included.
const AGENT_BUDGET_MIB: f64 = 12.0;
/// Memory S4 leaves free for the store, its subscribers and the system.
const HEADROOM_MIB: f64 = 2048.0;

async fn measure(
    mesh: &Mesh,
    pods: &[(&Workload, &Pod)],
    target: &Workload,
    server: &str,
    binary: &Path,
) -> anyhow::Result<Value> {
    let route = mesh
        .objects
        .iter()
        .find(|r| {
            r.kind == "VirtualService" && r.namespace == target.namespace && r.name == target.app
        })
        .context("the hot service's mesh route")?;
    let mut spec: Value = serde_json::from_str(&route.spec_json)?;
    let old = spec["http"][1]["route"][1]["weight"]
        .as_u64()
        .context("the canary weight")? as u32;
    let new = if old <= 50 { old + 30 } else { old - 30 };
    let watched = Watched {
        host: target.host.clone(),
        subset: "v2".into(),
    };

    let starting = Instant::now();
    let fleet = Fleet::launch(binary, server, (&mesh.topology, pods), &watched, Cache::Off)?;
    let holding = |weight: u32| {
        fleet
            .agents
            .iter()
            .filter(|a| a.state.lock().is_ok_and(|s| s.weight == Some(weight)))
            .count()
    };
    let ready = crate::seed::bar("S4: agents' clients holding the route", fleet.agents.len());
    wait_until("S4: every client holds the hot route", &fleet, || {
        let n = holding(old);
        ready.set_position(n as u64);
        n == fleet.agents.len()
    })
    .await?;
    ready.finish_and_clear();
    let ready_s = starting.elapsed().as_secs_f64();
    let rss: Vec<f64> = fleet
        .agents
        .iter()
        .filter_map(|a| rss_mib_of(a.child.id()))
        .collect();
    println!(
        "S4: {} real agents started, each with an ADS client holding {}'s route, in {ready_s:.1}s; \
         agent RSS mean {:.1} MiB, max {:.1} MiB",
        fleet.agents.len(),
        target.host,
        mean(&rss),
        percentile(&rss, 100.0)
    );

    // The change: the canary weight moves.
    spec["http"][1]["route"][0]["weight"] = json!(100 - new);
    spec["http"][1]["route"][1]["weight"] = json!(new);
    let mut changed = (*route).clone();
    changed.spec_json = spec.to_string();
    let mut client =
        pasa_proto::store::v1::store_client::StoreClient::connect(format!("http://{server}"))
            .await?;
    // Each agent's RDS histograms before the change: the change's are the ones after.
    let mut before = Vec::with_capacity(fleet.agents.len());
    for a in &fleet.agents {
        before.push(AgentTimes::read(&scrape(a.admin).await?));
    }
    let written = Instant::now();
    crate::agent::apply_documents(&mut client, vec![manifest(&changed)], "S4's change").await?;
    wait_until("S4: every client holds the new route", &fleet, || {
        holding(new) == fleet.agents.len()
    })
    .await?;
    let latencies: Vec<f64> = fleet
        .agents
        .iter()
        .filter_map(|a| a.state.lock().ok()?.held_since(new))
        .map(|at| at.duration_since(written).as_secs_f64() * 1e3)
        .collect();
    // Each agent's own figures for the change: from the commit to its client's ACK of the RDS
    // push, and the agent's share of it, from the event's arrival to that ACK. The client holds
    // the route before it ACKs it, so wait (once, bounded) for the agents to time it.
    let mut times = AgentTimes::default();
    let mut observed = 0u64;
    let deadline = Instant::now() + Duration::from_secs(10);
    for (a, earlier) in fleet.agents.iter().zip(&before) {
        let change = loop {
            let change = AgentTimes::read(&scrape(a.admin).await?).since(earlier);
            if change.observed() || Instant::now() >= deadline {
                break change;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        observed += u64::from(change.observed());
        times.add(&change);
    }
    let (metric_p50, metric_p99) = (
        bucket_quantile(&times.propagation, 0.50),
        bucket_quantile(&times.propagation, 0.99),
    );
    let (agent_p50, agent_p99) = (
        bucket_quantile(&times.push_to_ack, 0.50),
        bucket_quantile(&times.push_to_ack, 0.99),
    );
    let buckets = times.propagation;
    let rss_after: Vec<f64> = fleet
        .agents
        .iter()
        .filter_map(|a| rss_mib_of(a.child.id()))
        .collect();
    let (p50, p99, max) = (
        percentile(&latencies, 50.0),
        percentile(&latencies, 99.0),
        percentile(&latencies, 100.0),
    );
    println!(
        "S4: one VirtualService change ({}: canary {old} → {new}): write → every client holds the \
         new route p50 {p50:.1} ms, p99 {p99:.1} ms, max {max:.1} ms; the agents' \
         pasa_agent_propagation_seconds{{type=\"RDS\"}} p50 ≤ {} ms, p99 ≤ {} ms, of which \
         the agent's own share (pasa_agent_xds_push_to_ack_seconds: the event's arrival → the \
         client's ACK) p50 ≤ {} ms, p99 ≤ {} ms ({} agents read)",
        target.app,
        fmt_ms(metric_p50),
        fmt_ms(metric_p99),
        fmt_ms(agent_p50),
        fmt_ms(agent_p99),
        observed
    );
    drop(fleet);
    Ok(json!({
        "agents": pods.len(), "ready_s": round2(ready_s),
        "changed": format!("VirtualService {}/{}", target.namespace, target.app),
        "write_to_client_ms": {"p50": round2(p50), "p99": round2(p99), "max": round2(max),
                               "clients": latencies.len(), "cdf": cdf(&latencies)},
        "propagation_metric_ms": {"p50_at_most": metric_p50.map(|s| round2(s * 1e3)),
                                  "p99_at_most": metric_p99.map(|s| round2(s * 1e3)),
                                  "agents_observed": observed,
                                  "buckets": buckets.iter()
                                      .map(|(le, n)| if le.is_finite() { json!([le, n]) }
                                                     else { json!(["+Inf", n]) })
                                      .collect::<Vec<_>>()},
        "push_to_ack_metric_ms": {"p50_at_most": agent_p50.map(|s| round2(s * 1e3)),
                                  "p99_at_most": agent_p99.map(|s| round2(s * 1e3))},
        "agent_rss_mib": {"mean": round2(mean(&rss)), "max": round2(percentile(&rss, 100.0)),
                          "mean_after_change": round2(mean(&rss_after))},
        "goal": {"p99_ms": 50},
    }))
}

/// An agent's RDS timing histograms (cumulative buckets), as read from its `/metrics` or as the
/// difference of two reads, or summed over agents.
#[derive(Debug, Default)]
struct AgentTimes {
    /// `pasa_agent_propagation_seconds`: the store's commit → the client's ACK.
    propagation: Vec<(f64, u64)>,
    /// `pasa_agent_xds_push_to_ack_seconds`: the event reaching the agent → the client's ACK.
    push_to_ack: Vec<(f64, u64)>,
}

impl AgentTimes {
    fn read(metrics: &str) -> AgentTimes {
        AgentTimes {
            propagation: histogram(metrics, "pasa_agent_propagation_seconds", "RDS"),
            push_to_ack: histogram(metrics, "pasa_agent_xds_push_to_ack_seconds", "RDS"),
        }
    }

    /// What was observed since `earlier`.
    fn since(&self, earlier: &AgentTimes) -> AgentTimes {
        let delta = |now: &[(f64, u64)], was: &[(f64, u64)]| {
            now.iter()
                .map(|&(le, n)| {
                    let was = was.iter().find(|b| b.0 == le).map_or(0, |b| b.1);
                    (le, n.saturating_sub(was))
                })
                .collect()
        };
        AgentTimes {
            propagation: delta(&self.propagation, &earlier.propagation),
            push_to_ack: delta(&self.push_to_ack, &earlier.push_to_ack),
        }
    }

    fn observed(&self) -> bool {
        self.propagation.last().is_some_and(|b| b.1 > 0)
    }

    fn add(&mut self, other: &AgentTimes) {
        let sum = |into: &mut Vec<(f64, u64)>, from: &[(f64, u64)]| {
            for &(le, n) in from {
                match into.iter_mut().find(|(b, _)| *b == le) {
                    Some(slot) => slot.1 += n,
                    None => into.push((le, n)),
                }
            }
            into.sort_by(|a, b| a.0.total_cmp(&b.0));
        };
        sum(&mut self.propagation, &other.propagation);
        sum(&mut self.push_to_ack, &other.push_to_ack);
    }
}

fn fmt_ms(seconds: Option<f64>) -> String {
    seconds.map_or("unknown".into(), |s| format!("{:.0}", s * 1e3))
}

/// Waits until `done`, for at most [`PATIENCE`]; an agent that exited, or a client whose
/// stream ended, fails the wait at once with what it said.
pub async fn wait_until(what: &str, fleet: &Fleet, done: impl Fn() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        for (i, a) in fleet.agents.iter().enumerate() {
            if let Some(ended) = a.state.lock().ok().and_then(|s| s.ended.clone()) {
                anyhow::bail!("{what}: the client of agent {i} stopped: {ended}");
            }
        }
        if Instant::now() >= deadline {
            let lagging = fleet
                .agents
                .iter()
                .position(|a| {
                    !a.state
                        .lock()
                        .is_ok_and(|s| s.ended.is_none() && s.weight.is_some())
                })
                .unwrap_or(0);
            let a = &fleet.agents[lagging];
            let state = a.state.lock().map(|s| format!("{s:?}")).unwrap_or_default();
            let log = std::fs::read_to_string(&a.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            anyhow::bail!(
                "{what}: not done after {PATIENCE:?}; agent {lagging}'s client: {state}; its \
                 log ends:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

/// An agent's `/metrics`.
pub async fn scrape(admin: SocketAddr) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let get = async {
        let mut conn = tokio::net::TcpStream::connect(admin).await?;
        conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
            .await?;
        let mut raw = String::new();
        conn.read_to_string(&mut raw).await?;
        anyhow::Ok(raw)
    };
    tokio::time::timeout(Duration::from_secs(10), get)
        .await
        .with_context(|| format!("the agent's /metrics on {admin} did not answer in 10 s"))?
}

/// The value of sample `name` (with its labels, if it has any: `name{a="b"}`) in an agent's
/// `/metrics`.
pub fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(name)?
            .strip_prefix(' ')?
            .trim()
            .parse::<f64>()
            .ok()
    })
}

/// The cumulative buckets `(le, count)` of histogram `name` for xDS type `kind`.
pub fn histogram(text: &str, name: &str, kind: &str) -> Vec<(f64, u64)> {
    let prefix = format!("{name}_bucket{{le=\"");
    let label = format!("type=\"{kind}\"}}");
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(&prefix)?;
            let (le, rest) = rest.split_once('"')?;
            let (labels, value) = rest.split_once(' ')?;
            if !labels.ends_with(&label) {
                return None;
            }
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, value.trim().parse().ok()?))
        })
        .collect()
}

/// The upper bound of the bucket holding quantile `q` of cumulative buckets; `None` without
/// observations.
pub fn bucket_quantile(buckets: &[(f64, u64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total == 0 {
        return None;
    }
    let rank = (q * total as f64).ceil() as u64;
    buckets
        .iter()
        .find(|(_, n)| *n >= rank)
        .map(|(le, _)| *le)
        .filter(|le| le.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_is_read_per_type_and_its_quantiles_are_bucket_bounds() {
        let text = "\
pasa_agent_propagation_seconds_bucket{le=\"0.001\",type=\"RDS\"} 0
pasa_agent_propagation_seconds_bucket{le=\"0.002\",type=\"RDS\"} 90
pasa_agent_propagation_seconds_bucket{le=\"0.004\",type=\"RDS\"} 100
pasa_agent_propagation_seconds_bucket{le=\"+Inf\",type=\"RDS\"} 100
pasa_agent_propagation_seconds_bucket{le=\"0.001\",type=\"CDS\"} 7
";
        let b = histogram(text, "pasa_agent_propagation_seconds", "RDS");
        assert_eq!(b.len(), 4);
        assert_eq!(bucket_quantile(&b, 0.5), Some(0.002));
        assert_eq!(bucket_quantile(&b, 0.99), Some(0.004));
        assert_eq!(bucket_quantile(&[], 0.5), None);
    }
}
