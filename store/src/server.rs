//! Running a store server: command-line options shared by `pasa-store` and the embedded store of
//! `pasa-pcp`, logging, the gRPC and admin listeners, and graceful shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::access::{Access, ServerTls, TlsArgs};
use crate::backend::Backend;
use crate::backend::sled::SledBackend;
use crate::backend::tikv::{DEFAULT_KEY_PREFIX, TikvBackend};
use crate::metrics::Metrics;
use pasa_proto::store::v1::store_server::{Store as StoreApi, StoreServer};
use pasa_runtime::admin::{self, Readiness};
use pasa_runtime::drain::{self, stopped};

use crate::service::{Admission, StoreService};
use crate::store::{Store, StoreConfig};

/// The storage engine under a store.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// Embedded, on this machine's disk (`--data-dir`).
    Sled,
    /// A TiKV cluster, reached through PD (`--pd`); several store replicas may share it.
    Tikv,
}

/// Options of a store: its engine and its tunables.
#[derive(clap::Args, Debug, Clone)]
pub struct StoreArgs {
    /// Storage engine.
    #[arg(long, env = "PASA_BACKEND", value_enum, default_value = "sled")]
    pub backend: BackendKind,
    /// Directory of the embedded sled database (`--backend sled`).
    #[arg(long, env = "PASA_DATA_DIR", default_value = "./pasa-data")]
    pub data_dir: PathBuf,
    /// PD endpoints of the TiKV cluster (`--backend tikv`), comma-separated host:port.
    #[arg(long, env = "PASA_PD", value_delimiter = ',')]
    pub pd: Vec<String>,
    /// Prefix of every key this store keeps in TiKV, so that clusters can be shared.
    #[arg(long, env = "PASA_KEY_PREFIX", default_value = DEFAULT_KEY_PREFIX)]
    pub key_prefix: String,
    /// How long connecting to PD, and any one TiKV call, may take before it fails
    /// (`500ms`, `5s`).
    #[arg(long, default_value = "5s", value_parser = pasa_proto::duration::parse)]
    pub tikv_timeout: Duration,
    /// `host:port` other replicas of a shared (TiKV) store reach this server's API on, so that
    /// `proxy-status` asked of one answers for all (in Kubernetes: `$(POD_IP):7400`). Default:
    /// the gRPC listen address.
    #[arg(long, env = "PASA_ADVERTISE")]
    pub advertise: Option<String>,
    /// Kubernetes cluster domain, for resolving short host names.
    #[arg(long, default_value = pasa_istio::host::DEFAULT_DOMAIN_SUFFIX)]
    pub domain_suffix: String,
    /// Change-log entries kept behind the current revision; older ones are compacted.
    #[arg(long, default_value_t = 100_000)]
    pub log_retention: u64,
    /// Messages a watcher may have queued before it is cut off as a slow consumer.
    #[arg(long, default_value_t = 1024)]
    pub watch_queue: usize,
    /// Seconds between progress markers to watchers.
    #[arg(long, default_value_t = 10)]
    pub progress_interval_secs: u64,
    /// How long a proxy stays listed by `pasactl proxy-status` after its agent stopped
    /// reporting (`500ms`, `30s`, `5m`, `1h`); vanished agents expire.
    #[arg(long, env = "PASA_PROXY_STATUS_EXPIRY", default_value = "5m", value_parser = pasa_proto::duration::parse)]
    pub proxy_status_expiry: Duration,
    /// Log as JSON lines.
    #[arg(long)]
    pub log_json: bool,
}

impl StoreArgs {
    pub fn config(&self) -> StoreConfig {
        StoreConfig {
            domain_suffix: self.domain_suffix.clone(),
            log_retention: self.log_retention,
            watch_queue: self.watch_queue,
            progress_interval: Duration::from_secs(self.progress_interval_secs.max(1)),
            proxy_status_expiry: self.proxy_status_expiry,
            ..StoreConfig::default()
        }
    }

    /// Opens the store on the chosen engine.
    pub fn open(&self, metrics: Metrics) -> anyhow::Result<Store> {
        let backend: Arc<dyn Backend> = match self.backend {
            BackendKind::Sled => {
                std::fs::create_dir_all(&self.data_dir).with_context(|| {
                    format!("creating data directory {}", self.data_dir.display())
                })?;
                Arc::new(
                    SledBackend::open(&self.data_dir).with_context(|| {
                        format!("opening the store in {}", self.data_dir.display())
                    })?,
                )
            }
            BackendKind::Tikv => {
                if self.pd.is_empty() {
                    anyhow::bail!("--backend tikv needs --pd HOST:PORT[,HOST:PORT…]");
                }
                let backend = TikvBackend::connect(&self.pd, &self.key_prefix, self.tikv_timeout)
                    .map_err(|e| anyhow::anyhow!("{e}: {}", error_chain(&e)))?;
                tracing::info!(pd = %self.pd.join(","), prefix = %self.key_prefix, "connected to TiKV");
                Arc::new(backend)
            }
        };
        let store = Store::open(backend, self.config(), metrics).context("loading the store")?;
        if let Some(address) = &self.advertise {
            store.advertise(address.clone());
        }
        Ok(store)
    }
}

/// The causes under an error, joined, for one readable line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut parts = Vec::new();
    let mut cause = e.source();
    while let Some(c) = cause {
        parts.push(c.to_string());
        cause = c.source();
    }
    parts.join(": ")
}

/// Everything a store server process takes on its command line.
#[derive(clap::Args, Debug, Clone)]
pub struct ServerArgs {
    /// gRPC address of the store API.
    #[arg(long, env = "PASA_LISTEN", default_value = "127.0.0.1:7400")]
    pub listen: SocketAddr,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "PASA_ADMIN", default_value = "127.0.0.1:7401")]
    pub admin: SocketAddr,
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// The mesh's root namespace: its policies apply to every workload, so every agent may
    /// read them.
    #[arg(long, env = "PASA_ROOT_NAMESPACE", default_value = "istio-system")]
    pub root_namespace: String,
    /// The mesh's trust domain: over mutual TLS, workload identities of another are refused.
    #[arg(long, env = "PASA_TRUST_DOMAIN", default_value = "cluster.local")]
    pub trust_domain: String,
    /// Trust domains taken as the mesh's own (the mesh config's `trustDomainAliases`); repeat
    /// the flag or separate them with commas.
    #[arg(
        long = "trust-domain-alias",
        env = "PASA_TRUST_DOMAIN_ALIASES",
        value_delimiter = ','
    )]
    pub trust_domain_aliases: Vec<String>,
}

impl ServerArgs {
    /// Sets up logging, opens the embedded store and serves it until Ctrl-C or SIGTERM.
    pub async fn run(self, name: &str) -> anyhow::Result<()> {
        self.run_admitting(name, None).await
    }

    /// [`ServerArgs::run`], checking every batch written with `admission` first (the
    /// standalone `pasa-store`'s Istio validation).
    pub async fn run_admitting(
        self,
        name: &str,
        admission: Option<Arc<dyn Admission>>,
    ) -> anyhow::Result<()> {
        pasa_runtime::logs::init(self.store.log_json);
        let (access, tls) = self.tls.load(&self.root_namespace)?;
        let access = access.with_trust_domain(&self.trust_domain, &self.trust_domain_aliases);
        let store = self.store.open(Metrics::new())?;
        let mut bound = bind(store, self.listen, self.admin)
            .await?
            .secured(access, tls);
        bound.admission = admission;
        bound.run(name, pasa_runtime::signal::shutdown()).await
    }
}

/// Reads the gRPC and admin addresses back from a ready line printed by [`Bound::run`].
pub fn parse_ready_line(line: &str) -> Option<(SocketAddr, SocketAddr)> {
    let (_, rest) = line.split_once(" serving pasa.store.v1 on ")?;
    let (grpc, admin) = rest.split_once(", admin on ")?;
    Some((grpc.trim().parse().ok()?, admin.trim().parse().ok()?))
}

/// Both listeners of a store server, bound and not yet serving.
pub struct Bound {
    store: Store,
    listeners: Listeners,
    access: Access,
    /// What batches are checked by before they are written (see [`StoreService::with_admission`]).
    admission: Option<Arc<dyn Admission>>,
}

/// A bound gRPC listener and admin listener.
/// Adds gRPC services to the server's routes.
pub type AddServices = Box<dyn FnOnce(tonic::service::Routes) -> tonic::service::Routes + Send>;

pub struct Listeners {
    grpc: tokio::net::TcpListener,
    admin: tokio::net::TcpListener,
    pub grpc_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    /// Routes the admin endpoint serves besides /metrics, /healthz and /readyz.
    admin_routes: Option<axum::Router>,
    /// Adds the gRPC services served beside the store API.
    grpc_routes: Option<AddServices>,
    /// Mutual TLS of the gRPC API, and the access rules whose metrics to export.
    tls: Option<ServerTls>,
    access: Option<Access>,
    /// What `/readyz` answers: the servers' state, and the parts the owner reports into.
    readiness: Readiness,
}

impl Listeners {
    /// Serves more gRPC services beside the store API (PCP's answers to istiod's debug
    /// types): `add` adds them to the routes.
    pub fn with_grpc_services(
        mut self,
        add: impl FnOnce(tonic::service::Routes) -> tonic::service::Routes + Send + 'static,
    ) -> Listeners {
        self.grpc_routes = Some(Box::new(add));
        self
    }

    /// Serves the gRPC API over mutual TLS when `tls` is given, and exports `access`'s metrics.
    pub fn secured(mut self, access: &Access, tls: Option<ServerTls>) -> Listeners {
        self.access = Some(access.clone());
        self.tls = tls;
        self
    }

    /// Answers `/readyz` from `readiness`, into which the owner reports its own parts (PCP's
    /// Kubernetes syncer); the servers' own state is set here.
    pub fn with_readiness(mut self, readiness: Readiness) -> Listeners {
        self.readiness = readiness;
        self
    }

    /// Adds routes to the admin endpoint (PCP's istiod-compatible debug pages).
    pub fn with_admin_routes(mut self, routes: axum::Router) -> Listeners {
        self.admin_routes = Some(routes);
        self
    }

    /// Binds the gRPC and admin listeners (port 0 picks a free port).
    pub async fn bind(listen: SocketAddr, admin: SocketAddr) -> anyhow::Result<Listeners> {
        let grpc = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding the gRPC listener on {listen}"))?;
        let admin_listener = tokio::net::TcpListener::bind(admin)
            .await
            .with_context(|| format!("binding the admin listener on {admin}"))?;
        Ok(Listeners {
            grpc_addr: grpc.local_addr()?,
            admin_addr: admin_listener.local_addr()?,
            grpc,
            admin: admin_listener,
            admin_routes: None,
            grpc_routes: None,
            tls: None,
            access: None,
            readiness: Readiness::default(),
        })
    }

    /// Serves `service` (the store API, or a front of it) and the admin endpoint until
    /// `shutdown` resolves. With an embedded `store`, runs its background work, exports its
    /// metrics, and on shutdown ends every watch, drains queued writes and flushes to disk.
    /// Once serving, prints the ready line on stdout:
    /// `<name> serving pasa.store.v1 on ADDR, admin on ADDR`.
    pub async fn serve<S: StoreApi>(
        self,
        name: &str,
        service: StoreServer<S>,
        store: Option<Store>,
        mut registry: Registry,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let Listeners {
            grpc: grpc_listener,
            admin: admin_listener,
            grpc_addr,
            admin_addr,
            admin_routes,
            grpc_routes,
            tls,
            access,
            readiness: ready,
        } = self;
        if let Some(access) = &access {
            access.register(&mut registry);
        }
        match &tls {
            Some(_) => {
                tracing::info!(listen = %grpc_addr, "the gRPC API requires mutual TLS; access is decided by the client certificate's identity")
            }
            None => {
                tracing::warn!(listen = %grpc_addr, "the gRPC API is PLAINTEXT: callers are not \
                verified and may read and write everything; give --grpc-tls-cert, --grpc-tls-key \
                and --grpc-client-ca to require mutual TLS")
            }
        }
        if let Some(store) = &store {
            store.metrics().register(&mut registry);
            if store.shared() && store.advertised().is_none() {
                if grpc_addr.ip().is_unspecified() {
                    tracing::warn!(listen = %grpc_addr, "the store is shared, but listens on every \
                        address and has no --advertise: other replicas cannot ask it for \
                        proxy status");
                } else {
                    store.advertise(grpc_addr.to_string());
                }
            }
        }
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut router = admin::router(Arc::new(registry), ready.clone());
        if let Some(routes) = admin_routes {
            router = router.merge(routes);
        }
        let admin_server = admin::serve(admin_listener, router, stopped(stop_rx.clone()));
        let background = store.as_ref().map(Store::spawn_background);
        let mut routes = tonic::service::Routes::new(service);
        if let Some(add) = grpc_routes {
            routes = add(routes);
        }
        let server = tonic::transport::Server::builder().add_routes(routes);
        let grpc = match tls {
            None => tokio::spawn(server.serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(grpc_listener),
                stopped(stop_rx),
            )),
            Some(tls) => tokio::spawn(
                server.serve_with_incoming_shutdown(tls.incoming(grpc_listener)?, stopped(stop_rx)),
            ),
        };
        let admin = tokio::spawn(admin_server);
        ready.set(true);
        println!("{name} serving pasa.store.v1 on {grpc_addr}, admin on {admin_addr}");
        tracing::info!(grpc = %grpc_addr, admin = %admin_addr, "serving");

        shutdown.await;
        ready.set(false);
        let _ = stop_tx.send(true);
        if let Some(background) = background {
            background.abort();
        }
        if let Some(store) = store {
            // Ends every watch with a SHUTDOWN notice, drains queued writes and flushes to disk.
            tokio::task::spawn_blocking(move || store.shutdown())
                .await
                .context("store shutdown")?;
        }
        if let Some((grpc, admin)) =
            drain::within_deadline("requests", async { (grpc.await, admin.await) }).await
        {
            grpc.context("gRPC server task")?.context("gRPC server")?;
            admin
                .context("admin server task")?
                .context("admin server")?;
        }
        tracing::info!("stopped");
        Ok(())
    }
}

/// Binds the gRPC and admin listeners of a store server (port 0 picks a free port).
pub async fn bind(store: Store, listen: SocketAddr, admin: SocketAddr) -> anyhow::Result<Bound> {
    Ok(Bound {
        store,
        listeners: Listeners::bind(listen, admin).await?,
        access: Access::plaintext(),
        admission: None,
    })
}

/// Binds and serves until `shutdown` resolves; see [`Bound::run`].
pub async fn serve(
    name: &str,
    store: Store,
    listen: SocketAddr,
    admin: SocketAddr,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    bind(store, listen, admin).await?.run(name, shutdown).await
}

impl Bound {
    pub fn grpc_addr(&self) -> SocketAddr {
        self.listeners.grpc_addr
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.listeners.admin_addr
    }

    /// Serves over mutual TLS when `tls` is given, deciding access by `access`.
    pub fn secured(mut self, access: Access, tls: Option<ServerTls>) -> Bound {
        self.listeners = self.listeners.secured(&access, tls);
        self.access = access;
        self
    }

    /// Serves the store API over the store; see [`Listeners::serve`].
    pub async fn run(
        self,
        name: &str,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        // Replicas reach each other with the server's own certificate, an operator's.
        let peer_tls = self.listeners.tls.as_ref().map(ServerTls::client);
        let mut service =
            StoreService::new(self.store.clone()).with_access(self.access.clone(), peer_tls);
        if let Some(admission) = self.admission.clone() {
            service = service.with_admission(admission);
        }
        let service = service.into_server();
        self.listeners
            .serve(
                name,
                service,
                Some(self.store),
                Registry::default(),
                shutdown,
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_line_round_trip() {
        let line = "pasa-pcp serving pasa.store.v1 on 127.0.0.1:7400, admin on [::1]:7401";
        let (grpc, admin) = parse_ready_line(line).unwrap();
        assert_eq!(grpc.to_string(), "127.0.0.1:7400");
        assert_eq!(admin.to_string(), "[::1]:7401");
        assert!(parse_ready_line("something else").is_none());
    }
}
