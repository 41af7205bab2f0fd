//! Running PCP: its command line, the embedded or remote store behind it, the gRPC API, the
//! admin endpoint and the admission webhook, and graceful shutdown of all of them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use pasa_runtime::drain::stopped;
use pasa_runtime::signal::shutdown;
use pasa_store::access::TlsArgs;
use pasa_store::server::{Listeners, StoreArgs};
use pasa_store::service::StoreService;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::kubernetes::KubeArgs;
use crate::metrics::Metrics;
use crate::webhook::inject::{InjectArgs, Injector};
use crate::webhook::{self, Webhook, tls};
use crate::write::{Upstream, WriteService};

/// The PASA control plane: validates Istio config and writes it into the store.
#[derive(clap::Parser, Debug)]
#[command(name = "pasa-pcp", version)]
pub struct PcpArgs {
    /// gRPC address of the API (store API with validated writes).
    #[arg(long, env = "PASA_LISTEN", default_value = "127.0.0.1:7400")]
    pub listen: SocketAddr,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "PASA_ADMIN", default_value = "127.0.0.1:7401")]
    pub admin: SocketAddr,
    /// Store servers to write to, instead of the embedded store (comma-separated host:port).
    #[arg(
        long,
        env = "PASA_STORE",
        value_delimiter = ',',
        conflicts_with = "data_dir"
    )]
    pub store: Vec<String>,
    /// CA certificate (PEM) the remote store's certificate must chain to; with --store-cert and
    /// --store-key, PCP reaches --store over mutual TLS.
    #[arg(long, env = "PASA_STORE_CA", requires_all = ["store", "store_cert", "store_key"])]
    pub store_ca: Option<PathBuf>,
    /// PCP's own client certificate towards --store (PEM chain; its URI SAN must be one of the
    /// store's --grpc-operator identities).
    #[arg(long, env = "PASA_STORE_CERT", requires = "store_ca")]
    pub store_cert: Option<PathBuf>,
    /// The private key of --store-cert.
    #[arg(long, env = "PASA_STORE_KEY", requires = "store_ca")]
    pub store_key: Option<PathBuf>,
    #[command(flatten)]
    pub embedded: StoreArgs,
    #[command(flatten)]
    pub grpc_tls: TlsArgs,
    /// HTTPS address of the validating admission webhook (POST /validate); off when not set.
    #[arg(long, env = "PASA_WEBHOOK_LISTEN")]
    pub webhook_listen: Option<SocketAddr>,
    /// PEM certificate chain of the webhook. Without --tls-cert/--tls-key, a development CA and
    /// certificate are generated at start and the CA's path is printed.
    #[arg(long, requires_all = ["webhook_listen", "tls_key"])]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of the webhook certificate.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// How often JWT issuers' key sets are fetched again (`20m`, `1h`); they are fetched at
    /// once when a RequestAuthentication names a new one.
    #[arg(long, env = "PASA_JWKS_REFRESH", default_value = "20m", value_parser = pasa_proto::duration::parse)]
    pub jwks_refresh: std::time::Duration,
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(flatten)]
    pub inject: InjectArgs,
}

impl PcpArgs {
    /// Serves until Ctrl-C or SIGTERM. Prints `pasa-pcp serving pasa.store.v1 on ADDR, admin on
    /// ADDR` once the API is up, and before it, with a webhook,
    /// `pasa-pcp webhook serving https://ADDR/validate` (plus the CA path when generated).
    pub async fn run(self) -> anyhow::Result<()> {
        pasa_runtime::logs::init(self.embedded.log_json);
        let metrics = Arc::new(Metrics::default());
        // Shutdown in order: the signal stops the webhook first (so nothing it admits is lost),
        // then the API and the store.
        let (stop_tx, stop_rx) = watch::channel(false);
        let signal_tx = stop_tx.clone();
        let signal = shutdown();
        tokio::spawn(async move {
            signal.await;
            let _ = signal_tx.send(true);
        });

        let (access, tls) = self.grpc_tls.load(&self.inject.root_namespace)?;
        // `--mesh-config`, read once now (a bad file stops PCP at start) for what is set up
        // from it at start; the publisher reads it again as it changes.
        let mesh = match &self.kube.mesh_config {
            Some(path) => Some(crate::mesh::read(path)?),
            None => None,
        };
        // The mesh config's trust domain aliases are the mesh's own identities too.
        let aliases: Vec<String> = mesh
            .as_ref()
            .and_then(|m| m.get("trustDomainAliases"))
            .and_then(serde_json::Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str().map(str::to_string))
            .collect();
        let access = access.with_trust_domain(&self.inject.trust_domain, &aliases);
        let store_tls = match (&self.store_ca, &self.store_cert, &self.store_key) {
            (Some(ca), Some(cert), Some(key)) => Some(
                pasa_proto::client::ClientTls::from_files(ca, cert, key)
                    .map_err(|e| anyhow::anyhow!("--store-ca/--store-cert/--store-key: {e}"))?,
            ),
            _ => None,
        };
        let (upstream, store) = if self.store.is_empty() {
            let store = self.embedded.open(pasa_store::metrics::Metrics::new())?;
            // PCP has checked each call already and relays whom for; replicas of a shared
            // store are reached with PCP's own certificate.
            let service = StoreService::new(store.clone()).with_access(
                access.behind(),
                tls.as_ref().map(pasa_store::access::ServerTls::client),
            );
            (Upstream::embedded(service), Some(store))
        } else {
            (
                Upstream::remote(&self.store, store_tls.as_ref()).await?,
                None,
            )
        };
        // Turns true when the API itself starts stopping (after the webhook drained): the
        // watches and status reports it forwards end then, not at the signal.
        let (api_stopping, api_stopping_rx) = watch::channel(false);
        let service = WriteService::new(
            upstream,
            metrics.clone(),
            &self.embedded.domain_suffix,
            api_stopping_rx,
        )
        .with_access(access.clone());
        match &self.kube.mesh_config {
            Some(path) => {
                tokio::spawn(crate::mesh::publish(
                    path.clone(),
                    self.inject.root_namespace.clone(),
                    service.clone(),
                    stop_rx.clone(),
                ));
            }
            // Decided before the API serves, so that what agents and users read from then on
            // is the mesh config in effect; bounded, as a remote store may be away.
            None => {
                let retire =
                    crate::mesh::retire(self.inject.root_namespace.clone(), service.clone());
                if tokio::time::timeout(std::time::Duration::from_secs(5), retire)
                    .await
                    .is_err()
                {
                    tracing::warn!(
                        "the store did not answer within 5 s: which mesh config is in effect was not checked"
                    );
                }
            }
        }
        tokio::spawn(crate::jwks::keep(
            service.clone(),
            self.inject.root_namespace.clone(),
            self.jwks_refresh,
            stop_rx.clone(),
        ));
        // The clusters PCP syncs, as the debug pages show them.
        let (clusters_tx, clusters) = watch::channel(crate::kubernetes::ClustersView::default());
        // istiod's debug pages, from the proxy status agents report.
        let listeners = Listeners::bind(self.listen, self.admin)
            .await?
            .secured(&access, tls)
            .with_admin_routes(crate::debug::routes(
                service.upstream().clone(),
                &self.kube.cluster_id,
                clusters.clone(),
            ))
            .with_grpc_services({
                let debug = crate::debug::DebugXds::new(
                    service.upstream().clone(),
                    &self.kube.cluster_id,
                    &self
                        .kube
                        .identity
                        .clone()
                        .unwrap_or_else(crate::kubernetes::default_identity),
                )
                .with_access(access.clone())
                .with_clusters(clusters);
                move |routes| routes.add_service(debug.into_server())
            });
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let readiness = pasa_runtime::admin::Readiness::default();
        let listeners = listeners.with_readiness(readiness.clone());
        let cluster = if self.kube.enabled() {
            Some(self.kube.client().await?)
        } else {
            None
        };
        let sync_task = match &cluster {
            Some((cluster, source)) => {
                let metrics = Arc::new(pasa_kube::metrics::SyncMetrics::default());
                metrics.register(&mut registry);
                let remote_metrics = Arc::new(pasa_kube::remote::RemoteMetrics::default());
                remote_metrics.register(&mut registry);
                let parts = crate::kubernetes::SyncerParts {
                    cluster: cluster.clone(),
                    source: source.clone(),
                    service: service.clone(),
                    metrics,
                    readiness: readiness.clone(),
                    mesh: mesh.as_ref(),
                    domain_suffix: &self.embedded.domain_suffix,
                    system_namespace: &self.inject.root_namespace,
                    remote_metrics,
                    clusters: clusters_tx.clone(),
                };
                Some(self.kube.start(parts, stop_rx.clone())?)
            }
            None => None,
        };
        // The injecting webhook reads namespaces' labels from the cluster when PCP has one,
        // and from each remote cluster registered with it.
        let namespaces = cluster
            .as_ref()
            .filter(|_| self.webhook_listen.is_some())
            .map(|(cluster, _)| {
                (
                    pasa_kube::namespaces::Namespaces::follow(cluster.client.clone()),
                    pasa_kube::remote::namespaces::RemoteNamespaces::follow(
                        self.kube.remote_sources(&cluster.client),
                        &self.kube.cluster_id,
                    ),
                )
            });

        let webhook_task = match self.webhook_listen {
            None => None,
            Some(addr) => Some(self.start_webhook(
                addr,
                &service,
                &metrics,
                namespaces,
                stopped(stop_rx.clone()),
            )?),
        };
        // The API stops once the webhook has drained, or at once if the webhook fails.
        let webhook_result = Arc::new(std::sync::Mutex::new(Ok(())));
        let result_slot = webhook_result.clone();
        let api_stop = async move {
            // The syncer stops writing (and gives its Lease up) before the API stops.
            let sync_stopped = async move {
                if let Some(task) = sync_task {
                    let _ = task.await;
                }
            };
            let Some(mut task) = webhook_task else {
                stopped(stop_rx).await;
                sync_stopped.await;
                let _ = api_stopping.send(true);
                return;
            };
            let outcome = tokio::select! {
                _ = stopped(stop_rx) => task.await,
                ended = &mut task => {
                    tracing::error!("the webhook server stopped; shutting down");
                    let _ = stop_tx.send(true);
                    ended
                }
            };
            let outcome = match outcome {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(anyhow::anyhow!("webhook server: {e}")),
                Err(e) => Err(anyhow::anyhow!("webhook task: {e}")),
            };
            sync_stopped.await;
            let _ = api_stopping.send(true);
            if let Ok(mut slot) = result_slot.lock() {
                *slot = outcome;
            }
        };
        listeners
            .serve("pasa-pcp", service.into_server(), store, registry, api_stop)
            .await?;
        match webhook_result.lock() {
            Ok(mut slot) => std::mem::replace(&mut *slot, Ok(())),
            Err(_) => Ok(()),
        }
    }

    /// Loads or generates the webhook's certificate, binds it and serves it until `shutdown`.
    /// Prints `pasa-pcp webhook serving https://ADDR/validate` (and the development CA's path).
    fn start_webhook(
        &self,
        addr: SocketAddr,
        service: &WriteService,
        metrics: &Arc<Metrics>,
        namespaces: Option<(
            pasa_kube::namespaces::Namespaces,
            pasa_kube::remote::namespaces::RemoteNamespaces,
        )>,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<tokio::task::JoinHandle<std::io::Result<()>>> {
        let cert = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => tls::load(cert, key)?,
            _ => {
                let dir = if self.store.is_empty() {
                    self.embedded.data_dir.join("webhook-tls")
                } else {
                    std::env::temp_dir().join("pasa-pcp-webhook-tls")
                };
                tls::generate(&dir, addr)?
            }
        };
        let listener = std::net::TcpListener::bind(addr)
            .with_context(|| format!("binding the webhook listener on {addr}"))?;
        let bound = listener.local_addr()?;
        let (namespaces, remote_namespaces) = namespaces.unzip();
        let mut injector = Injector::new(
            self.inject
                .config(&self.kube.cluster_id, &self.embedded.domain_suffix),
            self.inject.never_namespaces(&self.kube.lease_namespace),
            namespaces,
        )
        .with_root_namespace(&self.inject.root_namespace);
        if let Some(remote) = remote_namespaces {
            injector = injector.with_remote_namespaces(remote);
        }
        let hook = Arc::new(Webhook::new(service.clone(), metrics.clone(), injector));
        let ca = cert
            .generated_ca
            .as_ref()
            .map(|p| format!(", development CA certificate in {}", p.display()))
            .unwrap_or_default();
        let task =
            tokio::spawn(async move { webhook::serve(listener, &cert, hook, shutdown).await });
        println!("pasa-pcp webhook serving https://{bound}/validate and /inject{ca}");
        tracing::info!(webhook = %bound, "webhook serving");
        Ok(task)
    }
}

/// Reads the webhook address back from its ready line.
pub fn parse_webhook_line(line: &str) -> Option<SocketAddr> {
    let rest = line.strip_prefix("pasa-pcp webhook serving https://")?;
    let (addr, _) = rest.split_once("/validate")?;
    addr.parse().ok()
}
