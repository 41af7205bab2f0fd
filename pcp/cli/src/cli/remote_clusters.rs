//! `pasactl remote-clusters`: the clusters the PCP at `--server` syncs, as `istioctl
//! remote-clusters` lists those each istiod reads: NAME, SECRET (the Secret, `namespace/name`,
//! or the kubeconfig file that registers a remote cluster; empty for PCP's own), STATUS
//! (`synced`, `syncing`, `timeout`, `failed`, or `standby` on a replica that does not lead) and
//! PCP (the replica that answered, where istioctl says ISTIOD). A cluster not synced says what
//! it waits for, or why it failed, under the table.
//!
//! PCP is asked as istioctl asks istiod's debug endpoints over xDS: a `DiscoveryRequest` of type
//! `istio.io/debug` naming `clusterz`, on the API's own port and with its TLS.

use std::fmt::Write as _;

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use serde::Deserialize;

use super::{CmdResult, REQUEST_TIMEOUT, Server, out, status_error, structured};

/// The debug type over xDS and the resource asked for.
const DEBUG_TYPE: &str = "istio.io/debug";
const CLUSTERZ: &str = "clusterz";

/// `pasactl remote-clusters` options.
#[derive(clap::Args, Debug)]
pub struct RemoteClustersArgs {
    /// Output format; a table by default.
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<Output>,
}

pub use super::Structured as Output;

/// One cluster as PCP's `clusterz` (istiod's format) says it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cluster {
    pub id: String,
    #[serde(default)]
    pub secret_name: String,
    #[serde(default)]
    pub sync_status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// The answer: the clusters, and the PCP replica that answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub pcp: String,
    pub clusters: Vec<Cluster>,
}

/// Asks the PCP at `server` for its clusters.
pub async fn fetch(server: &Server) -> anyhow::Result<Answer> {
    let ask = async {
        let channel = pasa_proto::client::channel(&server.address, server.tls.as_ref())
            .await
            .map_err(|e| {
                anyhow::anyhow!("{e} (is pasa-pcp running? set --server or PASA_SERVER)")
            })?;
        let mut client = AggregatedDiscoveryServiceClient::new(channel);
        let request = DiscoveryRequest {
            type_url: DEBUG_TYPE.to_string(),
            resource_names: vec![CLUSTERZ.to_string()],
            ..Default::default()
        };
        let mut answers = client
            .stream_aggregated_resources(one_request(request))
            .await
            .map_err(|status| status_error(server, status))?
            .into_inner();
        let response = answers
            .message()
            .await
            .map_err(|status| status_error(server, status))?
            .ok_or_else(|| anyhow::anyhow!("the server at {server} ended the stream unanswered"))?;
        let resource = response
            .resources
            .first()
            .ok_or_else(|| anyhow::anyhow!("the server at {server} sent no {CLUSTERZ}"))?;
        let clusters: Vec<Cluster> = serde_json::from_slice(&resource.value).map_err(|e| {
            anyhow::anyhow!("the server at {server} sent a {CLUSTERZ} pasactl cannot read: {e}")
        })?;
        let pcp = response
            .control_plane
            .as_ref()
            .and_then(|c| serde_json::from_str::<serde_json::Value>(&c.identifier).ok())
            .and_then(|id| id["ID"].as_str().map(str::to_string))
            .unwrap_or_else(|| server.address.clone());
        anyhow::Ok(Answer { pcp, clusters })
    };
    server
        .within("`remote-clusters`", REQUEST_TIMEOUT, ask)
        .await
}

/// A request stream of one request that stays open (closing it would end the exchange before
/// the answer on some servers).
fn one_request(request: DiscoveryRequest) -> impl request_stream::Stream<Item = DiscoveryRequest> {
    request_stream::once_then_pending(request)
}

/// The table `istioctl remote-clusters` prints, with PCP for ISTIOD, and each cluster not
/// synced with what it waits for under it.
pub fn table(answer: &Answer) -> String {
    let header = ["NAME", "SECRET", "STATUS", "PCP"];
    let rows: Vec<[&str; 4]> = answer
        .clusters
        .iter()
        .map(|c| {
            [
                c.id.as_str(),
                c.secret_name.as_str(),
                c.sync_status.as_str(),
                answer.pcp.as_str(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut text = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:w$}     ");
            }
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    let troubled: Vec<&Cluster> = answer
        .clusters
        .iter()
        .filter(|c| !c.detail.is_empty())
        .collect();
    if !troubled.is_empty() {
        text.push('\n');
        for c in troubled {
            let _ = writeln!(text, "{} {}: {}", c.id, c.sync_status, c.detail);
        }
    }
    text
}

pub async fn run(server: &Server, args: RemoteClustersArgs) -> CmdResult {
    let answer = fetch(server).await?;
    match args.output {
        Some(output) => {
            let value = serde_json::json!({"pcp": answer.pcp, "clusters": answer.clusters});
            out(&structured(output == Output::Yaml, &value)?)?;
        }
        None if answer.clusters.is_empty() => {
            out(&format!(
                "The PCP at {server} syncs no Kubernetes cluster (it runs without --kubeconfig \
                 or --in-cluster).\n"
            ))?;
        }
        None => out(&table(&answer))?,
    }
    Ok(())
}

/// The stream of [`one_request`]: yields the request, then stays pending until dropped.
mod request_stream {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    pub use tonic::codegen::tokio_stream::Stream;

    pub struct OnceThenPending<T>(Option<T>);

    impl<T: Unpin> Stream for OnceThenPending<T> {
        type Item = T;

        fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<T>> {
            match self.0.take() {
                Some(item) => Poll::Ready(Some(item)),
                None => Poll::Pending,
            }
        }
    }

    pub fn once_then_pending<T: Unpin>(item: T) -> OnceThenPending<T> {
        OnceThenPending(Some(item))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The columns istioctl prints, PCP for ISTIOD; what a missing cluster waits for beneath.
    #[test]
    fn the_table_is_istioctls() {
        let answer = Answer {
            pcp: "pasa-pcp-0".into(),
            clusters: vec![
                Cluster {
                    id: "Kubernetes".into(),
                    secret_name: String::new(),
                    sync_status: "synced".into(),
                    detail: String::new(),
                },
                Cluster {
                    id: "east".into(),
                    secret_name: "pasa-system/istio-remote-secret-east".into(),
                    sync_status: "timeout".into(),
                    detail: "not synced within 30s; waiting for pods (unreachable)".into(),
                },
            ],
        };
        assert_eq!(
            table(&answer),
            "NAME           SECRET                                   STATUS      PCP\n\
             Kubernetes                                              synced      pasa-pcp-0\n\
             east           pasa-system/istio-remote-secret-east     timeout     pasa-pcp-0\n\
             \n\
             east timeout: not synced within 30s; waiting for pods (unreachable)\n"
        );
    }
}
