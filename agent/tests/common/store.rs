//! A real store server (embedded sled) on loopback, in-process, for tests that follow it.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use pasa_proto::store::v1::store_client::StoreClient;
use pasa_proto::store::v1::{ApplyDocument, ApplyRequest};
use pasa_store::backend::sled::SledBackend;
use pasa_store::metrics::Metrics;
use pasa_store::store::{Store, StoreConfig};
use tokio::sync::oneshot;

pub struct StoreServer {
    pub addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl StoreServer {
    /// A store on the database in `dir`, on `port` (0 picks a free one).
    pub async fn start(dir: &Path, port: u16) -> StoreServer {
        StoreServer::start_with(dir, port, StoreConfig::default()).await
    }

    /// [`StoreServer::start`] with `config`.
    pub async fn start_with(dir: &Path, port: u16, config: StoreConfig) -> StoreServer {
        let backend = SledBackend::open(dir).expect("open sled");
        StoreServer::serve(Arc::new(backend), port, config).await
    }

    /// A store replica on the TiKV whose PD is at `pd` (in tests, the fake: see
    /// `pasa_tikv::fake`).
    pub async fn start_on_tikv(pd: &str) -> StoreServer {
        let backend = pasa_store::backend::tikv::TikvBackend::connect(
            &[pd.to_string()],
            "agent-tests/",
            std::time::Duration::from_secs(5),
        )
        .expect("connect to PD");
        StoreServer::serve(Arc::new(backend), 0, StoreConfig::default()).await
    }

    /// A store on the database in `dir` serving mutual TLS as `tls` says.
    pub async fn start_secured(dir: &Path, tls: &pasa_store::access::TlsArgs) -> StoreServer {
        let backend = SledBackend::open(dir).expect("open sled");
        let secured = tls.load("istio-system").expect("the TLS settings");
        StoreServer::serve_secured(Arc::new(backend), 0, StoreConfig::default(), Some(secured))
            .await
    }

    async fn serve(
        backend: Arc<dyn pasa_store::backend::Backend>,
        port: u16,
        config: StoreConfig,
    ) -> StoreServer {
        StoreServer::serve_secured(backend, port, config, None).await
    }

    async fn serve_secured(
        backend: Arc<dyn pasa_store::backend::Backend>,
        port: u16,
        config: StoreConfig,
        secured: Option<(
            pasa_store::access::Access,
            Option<pasa_store::access::ServerTls>,
        )>,
    ) -> StoreServer {
        let store = Store::open(backend, config, Metrics::new()).unwrap();
        let listen = format!("127.0.0.1:{port}").parse().unwrap();
        let mut bound = pasa_store::server::bind(store, listen, "127.0.0.1:0".parse().unwrap())
            .await
            .expect("bind");
        if let Some((access, tls)) = secured {
            bound = bound.secured(access, tls);
        }
        let addr = bound.grpc_addr();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(bound.run("test-store", async move {
            let _ = stopped.await;
        }));
        StoreServer { addr, stop, task }
    }

    pub async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }

    /// Applies whole objects (apiVersion, kind, metadata, spec) in one batch.
    pub async fn apply(&self, docs: &[serde_json::Value]) {
        let mut client = StoreClient::connect(format!("http://{}", self.addr))
            .await
            .unwrap();
        let r = client
            .apply(ApplyRequest {
                documents: docs
                    .iter()
                    .map(|d| ApplyDocument {
                        json: d.to_string(),
                        expected_mod_revision: None,
                    })
                    .collect(),
                dry_run: false,
            })
            .await
            .unwrap()
            .into_inner();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
    }

    /// Deletes `kind` `namespace/name` (missing is no error).
    pub async fn delete(&self, kind: &str, namespace: &str, name: &str) {
        let mut client = StoreClient::connect(format!("http://{}", self.addr))
            .await
            .unwrap();
        client
            .delete(pasa_proto::store::v1::DeleteRequest {
                refs: vec![pasa_proto::store::v1::ObjectRef {
                    kind: kind.into(),
                    namespace: namespace.into(),
                    name: name.into(),
                }],
                expected_mod_revision: None,
                ignore_not_found: true,
            })
            .await
            .unwrap();
    }

    /// Applies a DestinationRule `name` in namespace `shop` for `host`.
    pub async fn apply_rule(&self, name: &str, host: &str) {
        self.apply(&[serde_json::json!({
            "apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
            "metadata": {"name": name, "namespace": "shop"}, "spec": {"host": host}
        })])
        .await;
    }
}
