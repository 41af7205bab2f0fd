//! Running `pasa-agent`: its command line, and the wiring of identity, the saved cache, the store
//! watch, scope, translation, the ADS server on a Unix socket and the admin endpoint, with
//! graceful shutdown.
//!
//! The flow: resolve the identity → the proxy → load the cache saved in `--cache-dir`, if any,
//! and serve its translation at once (degraded until the store is synced) → follow the store
//! with the proxy's scope, recomputed after every cache change → after every complete cache
//! change translate for each generator the clients want and publish.
//!
//! The command line (the agent's flags, the Envoy it may run, the mesh settings) is in [`args`].

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use pasa_proto::store::v1::SubscriberIdentity;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::admin::{self, AdminState};
use crate::ads::{AdsService, Origin, Snapshot, SnapshotPublisher, StatusRegistry};
use crate::cache::Cache;
use crate::credentials::CredentialWatch;
use crate::credentials::ca::CaClient;
use crate::follow::{FollowConfig, Link, follow};
use crate::identity::Identity;
use crate::metrics::{Metrics, ResourceLabels};
use crate::model::proxy::{Generator, Proxy, ProxyBuild};
use crate::report::{self, Reporter, Sources};
use crate::resource::Generated;
use crate::resource::TypeKind;
use crate::subscription;
use crate::supervisor::{Part, Supervisor};
use crate::translate::Translator;
use crate::translate::extensions::ModuleSource;
use crate::worker::{self, Asks};
use pasa_runtime::drain::stopped;

mod args;
mod learning;
pub use args::{
    AgentArgs, AgentCommand, EnvoyRunArgs, MeshArgs, OutboundTrafficPolicy, ProxyBuildArg, Scope,
};

/// The exit code of a usage error (as clap uses for its own).
const USAGE: u8 = 2;

/// `pasa-agent`'s main: parses the command line (usage errors exit with 2, with the reason),
/// runs until SIGTERM or Ctrl-C, and exits 1 with the reason when it cannot run.
pub async fn main() -> ExitCode {
    let args = <AgentArgs as clap::Parser>::parse();
    if let Some(AgentCommand::Bootstrap(bootstrap)) = &args.command {
        return match bootstrap.render() {
            Ok(json) => {
                println!("{json}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("pasa-agent bootstrap: error: {e}");
                ExitCode::from(USAGE)
            }
        };
    }
    let identity = match args.identity.resolve() {
        Ok(identity) => identity,
        Err(e) => {
            eprintln!("pasa-agent: error: {e}");
            return ExitCode::from(USAGE);
        }
    };
    pasa_runtime::logs::init(args.log_json);
    match run(args, identity, pasa_runtime::signal::shutdown()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "pasa-agent stopped");
            eprintln!("pasa-agent: error: {e:#}");
            // The exit status of the Envoy it ran is the agent's.
            match e.downcast_ref::<crate::envoy::EnvoyError>() {
                Some(envoy) => ExitCode::from(envoy.exit_code()),
                None => ExitCode::FAILURE,
            }
        }
    }
}

/// The line printed on stdout once the socket and the admin endpoint are up.
pub fn ready_line(uds: &Path, admin: SocketAddr) -> String {
    format!(
        "pasa-agent: serving xDS on unix://{}, admin on http://{admin}",
        uds.display()
    )
}

/// Reads the socket path and the admin address back from the ready line.
pub fn parse_ready_line(line: &str) -> Option<(PathBuf, SocketAddr)> {
    let rest = line.strip_prefix("pasa-agent: serving xDS on unix://")?;
    let (uds, admin) = rest.rsplit_once(", admin on http://")?;
    Some((PathBuf::from(uds), admin.trim().parse().ok()?))
}

/// Runs the agent for `identity` until `shutdown` resolves.
pub async fn run(
    args: AgentArgs,
    identity: Identity,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    // The store servers and the app's probes are read before anything is bound: a bad value
    // stops the agent at once.
    let servers = pasa_proto::client::Servers::parse(&args.server)
        .map_err(|e| anyhow::anyhow!("--server {e}"))?;
    let probers = match args.status_listen {
        None => None,
        Some(_) => Some(crate::probes::AppProbers::parse(
            args.app_probers.as_deref().unwrap_or("{}"),
            identity.node.ip,
        )?),
    };
    let mut proxy = Proxy::from_identity(&identity, args.mesh.settings());
    proxy.build = match args.proxy_build {
        ProxyBuildArg::Envoy => ProxyBuild::Envoy,
        ProxyBuildArg::Istio => ProxyBuild::Istio,
    };
    proxy.flags.persistent_session_filter = args.persistent_session_filter;
    let metrics = Arc::new(Metrics::default());
    // An on-demand proxy starts with what it learned before (not from zero).
    let on_demand = args.scope == Scope::OnDemand;
    let learned = on_demand.then(|| load_learned(args.cache_dir.as_deref()));
    if let Some(learned) = &learned {
        proxy.learned = Some(Arc::new(learned.hosts()));
        tracing::info!(
            hosts = learned.len(),
            "on-demand scope: the proxy's services are learned from its requests"
        );
    }
    let (generation_tx, generation_rx) = watch::channel(crate::on_demand::Generation {
        number: 0,
        hosts: proxy.learned.clone().unwrap_or_default(),
    });
    let (published_tx, published_rx) = watch::channel(0u64);
    let publisher = Arc::new(SnapshotPublisher::new());
    let status = StatusRegistry::new();
    // Where Wasm modules come from; `fetched` moves when the agent fetched one.
    let (never_fetched, _) = watch::channel(0);
    let (modules, fetched): (Arc<dyn ModuleSource>, watch::Receiver<u64>) =
        if args.wasm_fetcher == "pilot-agent" {
            (Arc::new(crate::wasm::PilotAgent), never_fetched.subscribe())
        } else {
            let dir = args
                .cache_dir
                .clone()
                .unwrap_or_else(|| std::env::temp_dir().join("pasa-agent"))
                .join("wasm");
            let fetcher = crate::wasm::Fetcher::new(dir, tokio::runtime::Handle::current());
            let done = fetcher.done();
            (Arc::new(fetcher), done)
        };
    let mut serving = Serving {
        translator: Translator::new(proxy.clone()).with_modules(modules),
        publisher: Arc::clone(&publisher),
        metrics: Arc::clone(&metrics),
        translated: Default::default(),
        modules: fetched.clone(),
        held: 0,
        learned: on_demand.then(|| generation_rx.clone()),
        learned_served: 0,
        published_learned: published_tx,
    };

    // The mounted credentials first, so the first snapshots carry the secrets they reference.
    // A certificate from the CA comes later (Envoy waits for it: its listeners warm on it).
    let ca = CaClient::new(&args.credentials.ca, &identity)?;
    let (issued_tx, issued_rx) = watch::channel(BTreeMap::new());
    let servers = servers.with_tls(
        args.credentials
            .store_tls(ca.is_some().then(|| issued_rx.clone()))?,
    );
    // The pod's files whose secrets Envoy asks for: read again with the credentials.
    let file_names = crate::credentials::FileNames::default();
    let mut credentials = CredentialWatch::new(
        &args.credentials,
        &identity.namespace,
        ca.is_some().then_some(issued_rx),
        Arc::clone(&file_names),
        Arc::clone(&publisher),
    );
    if let Some(watch) = &mut credentials {
        watch.refresh();
    }

    // The saved cache is served at once, marked degraded until the store is synced.
    let saved = load_saved(args.cache_dir.as_deref());
    let initial_link = match &saved {
        Some(cache) => Link::Degraded(format!(
            "serving the cache saved at revision {} until the store is synced",
            cache.revision()
        )),
        None => Link::Connecting,
    };
    let mut wanted = publisher.wanted();
    let mut complete: Option<Arc<Cache>> = None;
    // Translations and pushes come in bursts of transient messages: once one is over, the
    // memory they freed goes back to the system instead of staying resident in every pod.
    let trimming = tokio::spawn(pasa_runtime::memory::release_after_bursts(
        publisher.subscribe(),
        RELEASE_AFTER_QUIET,
    ));
    if let Some(cache) = &saved {
        let cache = Arc::new(cache.clone());
        serving.translate(&cache, &wanted.borrow_and_update(), Instant::now(), false);
        complete = Some(cache);
    }
    let cache = saved.unwrap_or_default();
    // The revision of the configuration served, for status reports.
    let (applied_tx, applied_rx) = watch::channel(complete.as_ref().map_or(0, |c| c.revision()));
    let (link_tx, link) = watch::channel(initial_link);
    metrics.degraded.set(i64::from(is_degraded(&link.borrow())));

    // Listeners first: the ready line promises they are up. What can fail (a port in use) is
    // bound before the socket clients connect to, so a failed start leaves no socket behind.
    let (stop_tx, stop_rx) = watch::channel(false);
    let Listeners {
        admin: admin_listener,
        xds_tcp: tcp_listener,
        status: status_listener,
    } = Listeners::bind(&args).await?;
    let admin_addr = admin_listener.local_addr()?;
    // The socket last: an agent already serving it is not displaced (the bind is refused), and
    // the file this process makes goes when `socket_file` is dropped, however `run` ends.
    let uds = args.uds.clone();
    let crate::ads::BoundSocket {
        listener,
        file: socket_file,
    } = tokio::task::spawn_blocking(move || crate::ads::bind_unix(&uds))
        .await
        .context("binding the ADS socket")??;
    let mut service = AdsService::new(&publisher, status.clone())
        .with_metrics(Arc::clone(&metrics))
        .with_build(proxy.build)
        .with_dns_domain(&proxy.dns_domain);
    // The names Envoy asks for go to the learner; what it settled comes back to the streams.
    let (asks_tx, asks_rx) = tokio::sync::mpsc::unbounded_channel();
    let (settled_tx, settled_rx) = watch::channel(Arc::new(std::collections::BTreeSet::new()));
    if on_demand {
        service = service.with_on_demand(crate::ads::OnDemandLink {
            asks: asks_tx,
            settled: settled_rx,
        });
    }
    if args.credentials.serves_workload_certificate() {
        // Envoy's SDS server is the agent (not an istio-agent): it serves the pod's files too,
        // read at once when first asked for, then kept by the credential watch (which reports
        // a file it cannot read, once while that lasts).
        service =
            service.with_file_secrets(crate::ads::FileSecrets(Arc::new(move |name: &str| {
                let secret = crate::credentials::file_secret(name).ok()??;
                if let Ok(mut names) = file_names.lock() {
                    names.insert(name.to_string());
                }
                Some(crate::resource::Resource::pack(&secret))
            })));
    }
    // Every part but Envoy, by name: one that ends before the agent stops ends the agent.
    let mut parts = Supervisor::default();
    let ads_stop = stopped(stop_rx.clone());
    let tcp_service = service.clone();
    let tcp_stop = stopped(stop_rx.clone());
    parts.spawn(Part::Ads, async move {
        let unix = crate::ads::serve_listener(listener, service, ads_stop);
        match tcp_listener {
            None => unix.await,
            Some(tcp) => {
                let (unix, tcp) =
                    tokio::join!(unix, crate::ads::serve_tcp(tcp, tcp_service, tcp_stop));
                unix.and(tcp)
            }
        }
    });
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let (leaving_tx, leaving_rx) = watch::channel(false);
    let report_sources = Sources {
        connections: status.subscribe(),
        link: link.clone(),
        applied: applied_rx,
        leaving: leaving_rx,
        learned: on_demand.then(|| generation_rx.clone()),
    };
    let reporter = Reporter::new(&identity, admin_addr, args.report.status_heartbeat);
    parts.spawn_infallible(
        Part::Report,
        report::report(
            servers.clone(),
            reporter,
            args.report.clone(),
            report_sources,
            stop_rx.clone(),
        ),
    );
    let admin_state = AdminState {
        registry: Arc::new(registry),
        status,
        publisher: Arc::clone(&publisher),
        link: link.clone(),
        metrics: Arc::clone(&metrics),
        server: args.server.clone(),
        envoy_admin: args
            .envoy_run
            .binary
            .is_some()
            .then(|| args.envoy.envoy_admin.clone()),
    };
    if let Some(watch) = credentials {
        parts.spawn_infallible(Part::Credentials, watch.run(stop_rx.clone()));
    }
    if let Some(client) = ca {
        parts.spawn_infallible(
            Part::CertificateRenewal,
            crate::credentials::ca::renew(client, issued_tx, Arc::clone(&metrics), stop_rx.clone()),
        );
    }
    parts.spawn(
        Part::Admin,
        admin::serve(admin_listener, admin_state, stopped(stop_rx.clone())),
    );
    // The app's probes, run against the pod's own address.
    if let (Some(listener), Some(probers)) = (status_listener, probers) {
        parts.spawn(
            Part::AppProbes,
            pasa_runtime::admin::serve(listener, probers.router(), stopped(stop_rx.clone())),
        );
    }
    if let Some(learned) = learned {
        let learning = learning::Learning {
            asks: asks_rx,
            generation: generation_tx,
            published: published_rx,
            settled: settled_tx,
            learned,
            dns_domain: proxy.dns_domain.clone(),
            cache_dir: args.cache_dir.clone(),
            metrics: Arc::clone(&metrics),
            idle: args.on_demand_idle,
            envoy_admin: args.envoy.envoy_admin.clone(),
            pinned: Default::default(),
        };
        parts.spawn_infallible(Part::Learning, learning.run(stopped(stop_rx.clone())));
    }
    // Envoy as the agent's child, once the socket and the admin endpoint it needs are up.
    let (envoy_stop_tx, envoy_stop) = watch::channel(false);
    let mut envoy_task = start_envoy(&args, &identity, admin_addr, envoy_stop)?;
    println!("{}", ready_line(&args.uds, admin_addr));
    tracing::info!(uds = %args.uds.display(), admin = %admin_addr, node = %identity.node, "serving");

    // The store watch, with the scope of what the cache holds now.
    let (scope_tx, scope_rx) = watch::channel(subscription::subscription(&proxy, &cache));
    let (cache_tx, caches) = watch::channel(Arc::new(cache.clone()));
    let config = FollowConfig {
        servers: servers.clone(),
        subscription: scope_rx,
        identity: SubscriberIdentity {
            node_id: identity.node.to_string(),
            metadata: Default::default(),
        },
        cache_dir: args.cache_dir.clone(),
        metrics: Some(Arc::clone(&metrics)),
        saved: None,
        liveness: args.store_liveness,
    };
    parts.spawn_infallible(
        Part::StoreWatch,
        follow(config, cache, cache_tx, link_tx, stop_rx),
    );
    let (jobs, translation_task) =
        start_translations(serving, args.translation_budget, scope_tx, applied_tx);
    parts.spawn(Part::Translator, translation_task);

    let inputs = Inputs {
        caches,
        fetched,
        wanted,
        link,
        complete,
        learned: on_demand.then_some(generation_rx),
    };
    let (envoy_ended, part_ended) = match follow_changes(
        inputs,
        &jobs,
        &metrics,
        &mut parts,
        &mut envoy_task,
        shutdown,
    )
    .await
    {
        Stop::Asked => (None, None),
        Stop::Envoy(e) => {
            envoy_task = None;
            (Some(e), None)
        }
        Stop::Part(e) => (None, Some(e)),
    };
    // Envoy first, while it is still served: drain its listeners, wait, stop it.
    // A clean stop says goodbye to the store's proxy status; an Envoy that died does not.
    leaving_tx.send_replace(envoy_ended.is_none() && part_ended.is_none());
    let mut envoy_result = match envoy_ended {
        Some(e) => Err(e),
        None => Ok(()),
    };
    if let Some(task) = envoy_task {
        let _ = envoy_stop_tx.send(true);
        envoy_result = match task.await {
            Ok(result) => result.map_err(anyhow::Error::from),
            Err(e) => Err(anyhow::anyhow!("the Envoy supervisor failed: {e}")),
        };
    }
    tracing::info!("shutting down: closing ADS streams, stopping the store watch");
    drop(jobs);
    trimming.abort();
    let _ = stop_tx.send(true);
    let drained = pasa_runtime::drain::within_deadline(
        "ADS streams, the store watch or admin requests",
        parts.join_all(),
    )
    .await;
    // The socket file goes however this ends (it is dropped on every return).
    drop(socket_file);
    if let Some(e) = part_ended {
        return Err(e);
    }
    if let Some(stopped) = drained {
        stopped?;
    }
    tracing::info!("stopped");
    envoy_result
}

/// The agent's TCP listeners, bound before its socket (see [`run`]).
struct Listeners {
    /// `--admin`.
    admin: tokio::net::TcpListener,
    /// `--xds-listen`.
    xds_tcp: Option<tokio::net::TcpListener>,
    /// `--status-listen`.
    status: Option<tokio::net::TcpListener>,
}

impl Listeners {
    async fn bind(args: &AgentArgs) -> anyhow::Result<Listeners> {
        let admin_wanted = args.admin.unwrap_or(if args.envoy_run.binary.is_some() {
            SocketAddr::from(([127, 0, 0, 1], 15020))
        } else {
            SocketAddr::from(([127, 0, 0, 1], 15000))
        });
        let admin = tokio::net::TcpListener::bind(admin_wanted)
            .await
            .with_context(|| {
                format!(
                    "binding the admin listener on {admin_wanted} (--admin; is another agent using it?)"
                )
            })?;
        let xds_tcp = match args.xds_listen {
            None => None,
            Some(addr) => {
                Some(tokio::net::TcpListener::bind(addr).await.with_context(|| {
                    format!("binding the ADS listener on {addr} (--xds-listen)")
                })?)
            }
        };
        let status = match args.status_listen {
            None => None,
            Some(addr) => Some(tokio::net::TcpListener::bind(addr).await.with_context(|| {
                format!("binding the status listener on {addr} (--status-listen)")
            })?),
        };
        Ok(Listeners {
            admin,
            xds_tcp,
            status,
        })
    }
}

/// Envoy as the agent's child (`--envoy`), on the bootstrap the agent writes beside its socket;
/// `None` without `--envoy`.
fn start_envoy(
    args: &AgentArgs,
    identity: &Identity,
    admin_addr: SocketAddr,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<Option<tokio::task::JoinHandle<Result<(), crate::envoy::EnvoyError>>>> {
    let Some(binary) = &args.envoy_run.binary else {
        return Ok(None);
    };
    let mut envoy = args.envoy.clone();
    if args.scope == Scope::OnDemand && !envoy.delta_xds {
        // Envoy takes route configurations served by VHDS over delta ADS only.
        tracing::info!("on-demand scope: Envoy's bootstrap asks with the Delta protocol");
        envoy.delta_xds = true;
    }
    if args.credentials.serves_workload_certificate() {
        // The agent serves the workload certificate itself.
        envoy.sds_uds = args.uds.clone();
    }
    let config = crate::envoy::bootstrap_path(&args.uds);
    let bootstrap = crate::bootstrap::bootstrap(&crate::bootstrap::BootstrapInput {
        identity,
        xds_uds: &args.uds,
        agent_admin: admin_addr,
        envoy: &envoy,
    });
    std::fs::write(&config, bootstrap.to_string())
        .with_context(|| format!("writing Envoy's bootstrap {}", config.display()))?;
    let run = crate::envoy::EnvoyRun {
        binary: binary.clone(),
        config,
        admin: envoy.envoy_admin.clone(),
        log_level: args.envoy_run.envoy_log_level.clone(),
        concurrency: args.envoy_run.concurrency(&identity.proxy_config),
        drain: args.envoy_run.drain(&identity.proxy_config),
    };
    Ok(Some(tokio::spawn(crate::envoy::supervise(run, stop))))
}

/// What the agent's loop reads.
struct Inputs {
    /// The store watch's cache, as it changes.
    caches: watch::Receiver<Arc<Cache>>,
    /// Moves when a Wasm module was fetched (or failed to be).
    fetched: watch::Receiver<u64>,
    /// The generators the clients want.
    wanted: watch::Receiver<std::collections::BTreeSet<Generator>>,
    /// The store's link.
    link: watch::Receiver<Link>,
    /// The last complete cache (the saved one at start).
    complete: Option<Arc<Cache>>,
    /// What an on-demand proxy has learned.
    learned: Option<watch::Receiver<crate::on_demand::Generation>>,
}

/// Why the agent's loop ended.
enum Stop {
    /// The stop signal.
    Asked,
    /// The Envoy the agent runs could not start or exited.
    Envoy(anyhow::Error),
    /// Another part ended.
    Part(anyhow::Error),
}

/// The agent's loop: each change (the store's cache, a Wasm module fetched, a generator newly
/// wanted, the store's link) becomes a translation asked of the translator, until the stop
/// signal, or Envoy or another part ends.
async fn follow_changes(
    inputs: Inputs,
    jobs: &Asks<Job>,
    metrics: &Metrics,
    parts: &mut Supervisor,
    envoy_task: &mut Option<tokio::task::JoinHandle<Result<(), crate::envoy::EnvoyError>>>,
    shutdown: impl Future<Output = ()>,
) -> Stop {
    tokio::pin!(shutdown);
    let Inputs {
        mut caches,
        mut fetched,
        mut wanted,
        mut link,
        mut complete,
        mut learned,
    } = inputs;
    loop {
        tokio::select! {
            () = &mut shutdown => return Stop::Asked,
            e = parts.ended() => {
                tracing::error!(error = %format!("{e:#}"), "stopping the agent: a part of it ended");
                return Stop::Part(e);
            }
            ended = envoy_exit(envoy_task) => {
                return Stop::Envoy(match ended {
                    Ok(Ok(())) => anyhow::anyhow!("Envoy ended while the agent was running"),
                    Ok(Err(e)) => anyhow::Error::from(e),
                    Err(e) => anyhow::anyhow!("the Envoy supervisor failed: {e}"),
                });
            }
            Ok(()) = caches.changed() => {
                let received = Instant::now();
                let cache = Arc::clone(&caches.borrow_and_update());
                // A snapshot still arriving is not translated: clients keep what they have.
                if cache.snapshot_pending() {
                    continue;
                }
                let following = !is_degraded(&link.borrow());
                // The scope follows what translation just read (no second parse of the cache).
                jobs.ask(Job {
                    cache: Arc::clone(&cache),
                    wanted: wanted.borrow_and_update().clone(),
                    received,
                    following,
                    follows_scope: true,
                });
                complete = Some(cache);
            }
            Ok(()) = fetched.changed() => {
                // A Wasm module came (or did not): its ECDS resource is built again.
                fetched.borrow_and_update();
                if let Some(cache) = &complete {
                    let following = !is_degraded(&link.borrow());
                    jobs.ask(Job::again(cache, wanted.borrow().clone(), following, false));
                }
            }
            changed = wanted.changed() => {
                if changed.is_err() {
                    continue;
                }
                let wanted = wanted.borrow_and_update().clone();
                if let Some(cache) = &complete {
                    let following = !is_degraded(&link.borrow());
                    jobs.ask(Job::again(cache, wanted, following, false));
                }
            }
            () = crate::on_demand::changed(&mut learned) => {
                // Hosts learned: the narrowed scope is translated (it widens the store
                // subscription; the store's answer is translated and served in turn).
                if let Some(cache) = &complete {
                    let following = !is_degraded(&link.borrow());
                    jobs.ask(Job::again(cache, wanted.borrow().clone(), following, true));
                }
            }
            changed = link.changed() => {
                if changed.is_ok() {
                    let degraded = is_degraded(&link.borrow_and_update());
                    metrics.degraded.set(i64::from(degraded));
                    // The widened scope will not come while the store is away: serve what is
                    // known rather than nothing new.
                    if degraded && let Some(cache) = &complete {
                        jobs.ask(Job::again(cache, wanted.borrow().clone(), false, false));
                    }
                }
            }
        }
    }
}

/// Resolves when the Envoy supervisor ends (never without one).
async fn envoy_exit(
    task: &mut Option<tokio::task::JoinHandle<Result<(), crate::envoy::EnvoyError>>>,
) -> Result<Result<(), crate::envoy::EnvoyError>, tokio::task::JoinError> {
    match task {
        Some(task) => task.await,
        None => std::future::pending().await,
    }
}

/// A translation the agent's loop asks for.
#[derive(Clone)]
struct Job {
    cache: Arc<Cache>,
    wanted: std::collections::BTreeSet<Generator>,
    /// When the change reached the agent.
    received: Instant,
    /// Whether the store is followed (see [`Serving::translate`]).
    following: bool,
    /// Whether the subscription the translation's scope needs goes to the store watch, and the
    /// cache's revision becomes the one applied (a change of the cache; not a new generator
    /// wanted, nor the store going away).
    follows_scope: bool,
}

impl Job {
    /// Translating `cache` again, now, for a reason other than its own change.
    fn again(
        cache: &Arc<Cache>,
        wanted: std::collections::BTreeSet<Generator>,
        following: bool,
        follows_scope: bool,
    ) -> Job {
        Job {
            cache: Arc::clone(cache),
            wanted,
            received: Instant::now(),
            following,
            follows_scope,
        }
    }
}

/// Starts translation on its own thread, off the async runtime: while a large scope
/// translates, the agent keeps serving ADS (the last config published), its admin endpoint and
/// the store watch. Asks coalesce: a translation in progress finishes, then the newest ask is
/// taken and the ones in between are skipped. A translation past `budget` is logged and
/// counted.
fn start_translations(
    mut serving: Serving,
    budget: Duration,
    scope_tx: watch::Sender<pasa_proto::store::v1::Subscription>,
    applied_tx: watch::Sender<u64>,
) -> (Asks<Job>, tokio::task::JoinHandle<()>) {
    worker::spawn(move |job: Job| {
        let started = Instant::now();
        let needs = serving.translate(&job.cache, &job.wanted, job.received, job.following);
        let took = started.elapsed();
        if took > budget {
            serving.metrics.translations_over_budget.inc();
            tracing::warn!(
                took_ms = took.as_millis() as u64,
                budget_ms = budget.as_millis() as u64,
                revision = job.cache.revision(),
                "translation took longer than its budget; clients kept the previous config \
                 until it was done"
            );
        }
        if job.follows_scope {
            serving
                .metrics
                .subscription_rules
                .set(gauge(needs.rules.len() as u64));
            scope_tx.send_if_modified(|current| {
                let changed = *current != needs;
                if changed {
                    *current = needs;
                }
                changed
            });
            applied_tx.send_if_modified(|applied| {
                let changed = *applied != job.cache.revision();
                *applied = job.cache.revision();
                changed
            });
        }
    })
}

/// Translation and publishing, for each generator the clients want.
struct Serving {
    translator: Translator,
    publisher: Arc<SnapshotPublisher>,
    metrics: Arc<Metrics>,
    /// The cache each generator was last translated from, and how many Wasm module fetches
    /// had ended then.
    translated: std::collections::BTreeMap<Generator, (Arc<Cache>, u64)>,
    /// How many Wasm module fetches have ended: a cache already translated is translated again
    /// once a module came.
    modules: watch::Receiver<u64>,
    /// Translations in a row not published because their scope had not arrived yet.
    held: u32,
    /// What an on-demand proxy has learned (`None` for the eager scope).
    learned: Option<watch::Receiver<crate::on_demand::Generation>>,
    /// The generation of it the translator builds for.
    learned_served: u64,
    /// The newest generation a published snapshot was built with, to the learner.
    published_learned: watch::Sender<u64>,
}

/// How many translations in a row may wait for a widened scope before one is served anyway (a
/// scope that keeps widening must not starve clients of every change).
const MAX_HELD: u32 = 8;

/// How long nothing new is served before the memory a burst freed is returned to the system:
/// short enough that changes coming a few times a second do not pile up what each one freed (the
/// seed's widest agent peaked at 35.1 MiB with 1 s, 33.8 with 100 ms, under a change every 200
/// ms), long enough that a burst of events is returned once, after its last push.
const RELEASE_AFTER_QUIET: Duration = Duration::from_millis(100);

impl Serving {
    /// Translates `cache` for each generator in `wanted` not yet translated from it, and
    /// publishes the snapshots, marked with `received` (when the change reached the agent).
    /// Returns the subscription the translation's scope needs.
    ///
    /// While the store is followed (`following`: the agent is not degraded), a translation whose
    /// scope is wider than what the cache holds the answer to is not published: it would name
    /// clusters the store has not sent yet (a gateway's new route before its destination's
    /// service), and clients would see "cluster not found" until the next push. The caller widens
    /// the subscription; the store's answer brings a cache that answers it, and that one is
    /// published.
    fn translate(
        &mut self,
        cache: &Arc<Cache>,
        wanted: &std::collections::BTreeSet<Generator>,
        received: Instant,
        following: bool,
    ) -> pasa_proto::store::v1::Subscription {
        let mut generated = Vec::new();
        if let Some(learned) = &self.learned {
            let generation = learned.borrow().clone();
            if generation.number != self.learned_served {
                self.translator.set_learned(generation.hosts);
                self.learned_served = generation.number;
                // Every generator is translated again, whatever cache it was translated from.
                self.translated.clear();
                // Hosts just learned widen the subscription: until the store has answered it,
                // a translation would be held (below), and costs as much as the whole learned
                // scope does. The scope alone says whether the cache answers.
                if following && self.held < MAX_HELD {
                    let needs = self.translator.subscription_over(cache);
                    if !cache.answers(&needs) {
                        self.held += 1;
                        return needs;
                    }
                }
            }
        }
        // Read before translating: a module that comes meanwhile brings another translation.
        let fetched = *self.modules.borrow();
        for &generator in wanted {
            if self
                .translated
                .get(&generator)
                .is_some_and(|(done, then)| Arc::ptr_eq(done, cache) && *then == fetched)
            {
                continue;
            }
            let started = Instant::now();
            let resources = self.translator.generate(cache, generator);
            self.metrics
                .translation
                .observe(started.elapsed().as_secs_f64());
            generated.push((generator, resources));
        }
        let needs = self.translator.subscription();
        if generated.is_empty() {
            return needs;
        }
        if following && !cache.answers(&needs) && self.held < MAX_HELD {
            self.held += 1;
            tracing::debug!(
                revision = cache.revision(),
                "scope widened: waiting for the store's answer before publishing"
            );
            return needs;
        }
        if self.held >= MAX_HELD {
            tracing::warn!(
                held = self.held,
                "the scope kept widening; publishing without waiting for it"
            );
        }
        self.held = 0;
        for (generator, resources) in generated {
            self.count(generator, &resources);
            let committed = cache.first_commit_after(
                self.translated
                    .get(&generator)
                    .map_or(0, |(previous, _)| previous.revision()),
            );
            let snapshot = Snapshot::from_generated(&resources).with_origin(Origin {
                received,
                committed,
            });
            self.publisher.publish(generator, snapshot);
            self.translated
                .insert(generator, (Arc::clone(cache), fetched));
            tracing::debug!(
                generator = generator.name(),
                revision = cache.revision(),
                "published"
            );
        }
        self.metrics.store_revision.set(gauge(cache.revision()));
        self.published_learned.send_if_modified(|published| {
            let newer = *published < self.learned_served;
            *published = (*published).max(self.learned_served);
            newer
        });
        needs
    }

    fn count(&self, generator: Generator, resources: &Generated) {
        for (kind, count) in [
            (TypeKind::Cluster, resources.clusters.len()),
            (TypeKind::Endpoint, resources.endpoints.len()),
            (TypeKind::Listener, resources.listeners.len()),
            (TypeKind::Route, resources.routes.len()),
        ] {
            self.metrics
                .resources
                .get_or_create(&ResourceLabels {
                    r#type: kind,
                    generator,
                })
                .set(gauge(count as u64));
        }
    }
}

fn gauge(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn is_degraded(link: &Link) -> bool {
    matches!(link, Link::Degraded(_))
}

/// The hosts an on-demand proxy learned before, kept in `dir`; none without one, or when the
/// file is damaged (reported: they are learned again).
fn load_learned(dir: Option<&Path>) -> crate::on_demand::Learned {
    let Some(dir) = dir else {
        return Default::default();
    };
    crate::on_demand::Learned::load(dir).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "ignoring the learned hosts; learning them again");
        Default::default()
    })
}

/// The cache saved in `dir`, if any. A damaged or unreadable one is reported and ignored: the
/// agent then starts from the store.
fn load_saved(dir: Option<&Path>) -> Option<Cache> {
    let dir = dir?;
    match Cache::load(dir) {
        Ok(Some(cache)) => {
            tracing::info!(
                revision = cache.revision(),
                objects = cache.len(),
                "loaded the saved cache"
            );
            Some(cache)
        }
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(error = %e, "ignoring the saved cache; starting from the store");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_line_round_trip() {
        let line = ready_line(
            Path::new("/run/pasa/xds.sock"),
            "127.0.0.1:15000".parse().unwrap(),
        );
        assert_eq!(
            line,
            "pasa-agent: serving xDS on unix:///run/pasa/xds.sock, admin on http://127.0.0.1:15000"
        );
        let (uds, admin) = parse_ready_line(&line).unwrap();
        assert_eq!(uds, Path::new("/run/pasa/xds.sock"));
        assert_eq!(admin.port(), 15000);
        assert!(parse_ready_line("something else").is_none());
    }
}
