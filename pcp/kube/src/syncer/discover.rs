//! Which Istio and Gateway API kinds a cluster serves, and at which version, asked until every
//! one is answered; and how a resource that cannot be read is told.

use super::*;

/// The Istio and Gateway API kinds the cluster serves, each at the version read.
pub(super) struct ServedKinds {
    pub(super) istio: Vec<(Kind, ApiResource)>,
    pub(super) gateway_api: Vec<(&'static gateway_api::cluster::GatewayApiKind, ApiResource)>,
    /// Istio kinds without a CRD in the cluster, by resource name.
    unserved: Vec<String>,
}

/// Asks which version of each Istio and Gateway API kind the cluster serves, again (with
/// backoff) until every one is answered: a kind PCP may not read (403) or cannot ask about
/// (the API server away) is waited for, never taken for absent, since the first comparison
/// would then delete what the store holds of it. The status says what is waited for.
pub(super) async fn discover(
    client: &Client,
    config: &SyncConfig,
    status: &watch::Sender<SyncStatus>,
    metrics: &SyncMetrics,
) -> ServedKinds {
    /// A kind to ask about: Istio's, or the Gateway API's.
    #[derive(Clone, Copy)]
    enum Wanted {
        Istio(Kind),
        GatewayApi(&'static gateway_api::cluster::GatewayApiKind),
    }
    let mut pending: Vec<Wanted> = Kind::ALL
        .into_iter()
        .filter(|k| k.in_kubernetes())
        .map(Wanted::Istio)
        .collect();
    pending.extend(
        gateway_api::cluster::KINDS
            .iter()
            .filter(|k| match k.group {
                gateway_api::ALPHA_GROUP => config.gateway_api.alpha,
                gateway_api::INFERENCE_GROUP => config.gateway_api.inference,
                _ => true,
            })
            .map(Wanted::GatewayApi),
    );
    let mut served = ServedKinds {
        istio: Vec::new(),
        gateway_api: Vec::new(),
        unserved: Vec::new(),
    };
    let mut told: BTreeMap<String, Problem> = BTreeMap::new();
    let mut backoff = Backoff::new(RETRY_FIRST, RETRY_MAX, Duration::ZERO);
    loop {
        let mut failed = Vec::new();
        let mut failing = BTreeMap::new();
        for wanted in pending {
            let (group, kind, plural, versions) = match wanted {
                Wanted::Istio(k) => (k.group(), k.as_str(), k.plural(), k.versions()),
                Wanted::GatewayApi(k) => (k.group, k.kind, k.plural, k.versions),
            };
            let resource = format!("{plural}.{group}");
            match served_version(client, group, kind, plural, versions).await {
                Ok(Served::At(api)) => match wanted {
                    Wanted::Istio(k) => served.istio.push((k, api)),
                    Wanted::GatewayApi(k) => served.gateway_api.push((k, api)),
                },
                Ok(Served::No) => {
                    if let Wanted::Istio(_) = wanted {
                        served.unserved.push(resource);
                    }
                }
                Err(problem) => {
                    if told.get(&resource) != Some(&problem) {
                        tell(&resource, &problem, &config.api_server);
                    }
                    failing.insert(resource, problem);
                    failed.push(wanted);
                }
            }
        }
        told = failing;
        status.send_modify(|s| {
            s.waiting = told.keys().cloned().collect();
            s.problems = told.clone();
        });
        metrics.set_waiting(&status.borrow());
        if failed.is_empty() {
            break;
        }
        pending = failed;
        tokio::time::sleep(backoff.failed()).await;
    }
    if !served.unserved.is_empty() {
        tracing::warn!(
            kinds = %served.unserved.join(", "),
            "the cluster serves no CRD for these Istio kinds: they are not synced (install \
             Istio's CRDs, Istio's `base` Helm chart, then restart PCP)"
        );
    }
    served
}

/// Tells, once per change, why a resource cannot be read.
pub(super) fn tell(resource: &str, problem: &Problem, api_server: &str) {
    match problem.reason {
        Reason::Forbidden => tracing::error!(
            resource,
            error = %problem,
            "PCP's service account may not read {resource}, which the syncer needs: grant \
             get, list and watch on it (the pasa-pcp-syncer ClusterRole of \
             deploy/base/clusterrole.yaml); the first sync waits for it"
        ),
        _ => {
            let hint = problem.hint(api_server);
            let hint = hint.as_deref().unwrap_or("retrying");
            tracing::warn!(resource, error = %problem, "cannot read {resource}; {hint}")
        }
    }
}
