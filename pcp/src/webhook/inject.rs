//! Which pods the injecting webhook (`POST /inject`) moves to PASA, and which it leaves with
//! istiod. The rule, first match wins:
//! 1. a pod on the host's network is never injected (its traffic cannot be captured per pod);
//! 2. nor is a pod in a namespace of the cluster's or the mesh's own (kube-system, istio-system,
//!    PASA's own, …; see [`Selection::new`]);
//! 3. nor a pod that already carries PASA's status annotation: injecting twice changes nothing;
//! 4. the pod's annotation `pasa.io/enabled` decides when it is set (`"true"` or `"false"`, and
//!    the spellings istiod accepts for its own inject annotation: y/yes/on, n/no/off, any case);
//! 5. otherwise the namespace's label `pasa.io/injection=enabled` decides;
//! 6. otherwise the pod stays with istiod.
//!
//! The namespace's labels are not in the admission request, and a webhook configuration's
//! `objectSelector` can select on labels only, never on annotations: the API server therefore
//! sends every pod outside the system namespaces, and the caller of [`Selection::decide`] passes
//! the namespace's labels in, from the namespaces PCP follows in Kubernetes (without a cluster
//! to follow, `--kubeconfig` or `--in-cluster`, only the pod's annotation can opt it in). A pod
//! of a remote cluster, sent on Istio's path `/inject/cluster/<id>/net/<network>`
//! ([`PathSettings`]), is judged by its namespace in that cluster, as PCP follows every
//! registered cluster's namespaces ([`RemoteNamespaces`]).
//!
//! What an injected pod gets is [`sidecar`]'s.
//!
//! This module holds the webhook's settings and its answer to a review ([`Injector`]); the rule
//! above is [`selection`]'s, and the config that keeps a pod with istiod because PASA does not
//! apply all of it yet is [`policies`]'.

pub mod sidecar;

use std::collections::BTreeMap;

use kube::core::admission::{AdmissionResponse, Operation};
use pasa_istio::proxy_config::{MeshProxyConfig, NamespacedProxyConfig, ProxyConfig, effective};
use pasa_kube::namespaces::Namespaces;
use pasa_kube::remote::namespaces::RemoteNamespaces;
use serde_json::Value;

use super::review::{self, AdmissionRequest};
use sidecar::InjectConfig;

mod policies;
mod selection;
pub use policies::{UNENFORCED_KINDS, move_warnings, unenforced_policies};
pub use selection::{
    Decision, ENABLED_ANNOTATION, INJECTION_LABEL, STATUS_ANNOTATION, Selection, Skip,
};

/// The injecting webhook's options.
#[derive(clap::Args, Debug, Clone)]
pub struct InjectArgs {
    /// The image of the injected `pasa-agent` container.
    #[arg(long, env = "PASA_INJECT_IMAGE", default_value = concat!("pasa-agent:", env!("CARGO_PKG_VERSION")))]
    pub inject_image: String,
    /// The address injected agents follow the store at (PCP's Service).
    #[arg(
        long,
        env = "PASA_INJECT_STORE",
        default_value = "pasa-pcp.pasa-system.svc:7400"
    )]
    pub inject_store: String,
    /// istiod's CA (`CA_ADDR`): where injected pods get their certificates.
    #[arg(
        long,
        env = "PASA_INJECT_CA_ADDRESS",
        default_value = "istiod.istio-system.svc:15012"
    )]
    pub inject_ca_address: String,
    /// Injected agents reach the store over mutual TLS (for a store or PCP started with
    /// --grpc-tls-cert): they present a workload certificate from istiod's CA
    /// (--inject-ca-address) and trust the mesh root (the `istio-ca-root-cert` ConfigMap), so
    /// the store's certificate must chain to the mesh root.
    #[arg(long, env = "PASA_INJECT_STORE_TLS")]
    pub inject_store_tls: bool,
    /// The image with Istio's `istio-iptables` (Istio's proxy image), run as the standalone
    /// mode's traffic-capture init container.
    #[arg(
        long,
        env = "PASA_INJECT_IPTABLES_IMAGE",
        default_value = "docker.io/istio/proxyv2:1.30.0"
    )]
    pub inject_iptables_image: String,
    /// The mesh's trust domain (of injected workloads; over mutual TLS, the API refuses
    /// workload identities of another).
    #[arg(long, env = "PASA_TRUST_DOMAIN", default_value = "cluster.local")]
    pub trust_domain: String,
    /// The mesh's root namespace: security policies there apply to the whole mesh (for
    /// injection, and for what the API lets each agent read).
    #[arg(
        long = "root-namespace",
        alias = "inject-root-namespace",
        env = "PASA_ROOT_NAMESPACE",
        default_value = "istio-system"
    )]
    pub root_namespace: String,
    /// Namespaces never injected besides Kubernetes' own and PCP's (comma-separated): the
    /// control planes' (istiod's).
    #[arg(long, value_delimiter = ',', default_value = "istio-system")]
    pub inject_never: Vec<String>,
    /// Injected agents keep clients on one endpoint of services labelled for persistent
    /// sessions with Envoy's stateful session filter: the variable istiod reads for the same
    /// (it is passed to the agents).
    #[arg(
        long = "persistent-session-filter",
        env = "PILOT_ENABLE_PERSISTENT_SESSION_FILTER"
    )]
    pub persistent_session_filter: bool,
    /// The network of the pods injected here (istiod's `NETWORK`, the chart's
    /// `values.global.network`): injected agents get it as `ISTIO_META_NETWORK` and their pods
    /// the label `topology.istio.io/network`, unless the pod is labelled with a network of its
    /// own. Empty: pods name no network (a single-network mesh).
    #[arg(long, env = "NETWORK", default_value = "")]
    pub network: String,
    /// Which services injected proxies hold unless a pod's `pasa.io/scope` annotation says:
    /// `eager` (Istio's scope: its Sidecar's, else the whole mesh) or `on-demand` (those its
    /// application calls, learned from Envoy's requests; see the agent's `--scope`).
    #[arg(long, env = "PASA_INJECT_SCOPE", default_value = "eager", value_parser = ["eager", "on-demand"])]
    pub inject_scope: String,
}

impl InjectArgs {
    pub fn config(&self, cluster_id: &str, domain_suffix: &str) -> InjectConfig {
        InjectConfig {
            image: self.inject_image.clone(),
            store: self.inject_store.clone(),
            ca_address: self.inject_ca_address.clone(),
            iptables_image: self.inject_iptables_image.clone(),
            cluster_id: cluster_id.to_string(),
            trust_domain: self.trust_domain.clone(),
            domain_suffix: domain_suffix.to_string(),
            store_tls: self.inject_store_tls,
            persistent_session_filter: self.persistent_session_filter,
            network: self.network.clone(),
            on_demand: self.inject_scope == "on-demand",
        }
    }

    /// The namespaces never injected: `--inject-never` and PCP's own.
    pub fn never_namespaces(&self, own: &str) -> Selection {
        Selection::new(self.inject_never.iter().cloned().chain([own.to_string()]))
    }
}

/// The injecting webhook: decides, then patches.
pub struct Injector {
    config: InjectConfig,
    selection: Selection,
    namespaces: Option<Namespaces>,
    /// The remote clusters' namespaces, for pods injected on a remote cluster's path.
    remote_namespaces: Option<RemoteNamespaces>,
    root_namespace: String,
}

/// The settings Istio's injection path carries after `/inject` (istiod's): a remote cluster's
/// webhook configuration calls `/inject/cluster/<id>/net/<network>`, so that the proxies of its
/// pods get their own cluster's ID and network rather than PCP's.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PathSettings {
    /// `cluster/<id>`: `ISTIO_META_CLUSTER_ID`.
    pub cluster_id: Option<String>,
    /// `net/<network>`: `ISTIO_META_NETWORK` and the pod's network label.
    pub network: Option<String>,
    /// What else the path said, which PASA's injection does not take (istiod sets any other
    /// key as an environment variable of its proxy): each is warned of.
    pub ignored: Vec<String>,
}

impl PathSettings {
    /// Reads the path after `/inject/`: key/value segments in any order, a value's `--slash--`
    /// standing for `/`, as istiod reads them. A key without a value, and keys other than
    /// `cluster` and `net`, are listed as ignored.
    pub fn parse(rest: &str) -> PathSettings {
        let mut settings = PathSettings::default();
        let segments: Vec<&str> = rest
            .trim_matches('/')
            .split('/')
            .filter(|s| !s.is_empty())
            .collect();
        for pair in segments.chunks(2) {
            match pair {
                [key, value] => {
                    let value = value.replace("--slash--", "/");
                    match *key {
                        "cluster" => settings.cluster_id = Some(value),
                        "net" => settings.network = Some(value),
                        other => settings.ignored.push(format!("{other}={value}")),
                    }
                }
                [key] => settings.ignored.push(format!("{key} (without a value)")),
                _ => {}
            }
        }
        settings
    }

    /// Whether the request is for pods of another cluster than `own`.
    fn other_cluster(&self, own: &str) -> Option<&str> {
        self.cluster_id.as_deref().filter(|c| *c != own)
    }
}

/// What the webhook answers for one pod, and the metric's `result`.
pub struct Answer {
    pub verdict: AdmissionResponse,
    pub result: &'static str,
}

impl Injector {
    pub fn new(config: InjectConfig, selection: Selection, namespaces: Option<Namespaces>) -> Self {
        Injector {
            config,
            selection,
            namespaces,
            remote_namespaces: None,
            root_namespace: "istio-system".into(),
        }
    }

    /// Reads the namespaces of remote clusters' pods (injected on Istio's remote path) here.
    pub fn with_remote_namespaces(mut self, remote: RemoteNamespaces) -> Self {
        self.remote_namespaces = Some(remote);
        self
    }

    /// The mesh's root namespace (default `istio-system`), whose security policies apply to the
    /// whole mesh.
    pub fn with_root_namespace(mut self, namespace: &str) -> Self {
        self.root_namespace = namespace.to_string();
        self
    }

    pub fn root_namespace(&self) -> &str {
        &self.root_namespace
    }

    /// Answers one admission request: always allowed (a pod PASA cannot take stays with
    /// istiod, with a warning saying why), with the patch when the pod is injected; proxy
    /// settings from the pod alone (see [`Injector::review_with`]).
    pub fn review(&self, req: &AdmissionRequest) -> Answer {
        self.review_with(req, &StoredSettings::default())
    }

    /// [`Injector::review`], with the proxy settings the store holds.
    pub fn review_with(&self, req: &AdmissionRequest, stored: &StoredSettings) -> Answer {
        self.review_at(req, stored, &PathSettings::default())
    }

    /// [`Injector::review_with`], with the settings the injection path carries.
    pub fn review_at(
        &self,
        req: &AdmissionRequest,
        stored: &StoredSettings,
        path: &PathSettings,
    ) -> Answer {
        let told: Vec<String> = path
            .ignored
            .iter()
            .map(|k| format!("the injection path's {k} is not taken by PASA's injection"))
            .collect();
        let allow = |result, mut warnings: Vec<String>| {
            warnings.extend(told.iter().cloned());
            Answer {
                verdict: review::warn(AdmissionResponse::from(req), warnings),
                result,
            }
        };
        let stays = |why: &dyn std::fmt::Display| {
            allow(
                "cannot_inject",
                vec![format!("not moved to PASA (it stays with istiod): {why}")],
            )
        };
        if req.kind.kind != "Pod" || req.operation != Operation::Create {
            return allow("not_a_pod_creation", Vec::new());
        }
        let Some(object) = &req.object else {
            return allow("not_a_pod_creation", Vec::new());
        };
        let pod = match review::object_json(object) {
            Ok(pod) => pod,
            Err(e) => return stays(&PatchError::Pod(e)),
        };
        let namespace = req.namespace.as_deref().unwrap_or_default();
        // A pod of a remote cluster is judged by that cluster's namespace, as PCP follows it;
        // when its labels are not known, by the pod's own annotation alone (and the answer
        // says why).
        let remote = path.other_cluster(&self.config.cluster_id);
        let mut unknown = None;
        let labels = match remote {
            Some(cluster) => {
                let looked = match &self.remote_namespaces {
                    Some(remote) => remote.labels(cluster, namespace).map_err(|e| e.to_string()),
                    None => {
                        Err("PCP follows no remote cluster (it runs without Kubernetes)".into())
                    }
                };
                looked.unwrap_or_else(|why| {
                    unknown = Some((cluster, why));
                    BTreeMap::new()
                })
            }
            None => self
                .namespaces
                .as_ref()
                .and_then(|n| n.labels(namespace))
                .unwrap_or_default(),
        };
        let mut config = std::borrow::Cow::Borrowed(&self.config);
        if let Some(cluster) = &path.cluster_id {
            config.to_mut().cluster_id = cluster.clone();
        }
        if let Some(network) = &path.network {
            config.to_mut().network = network.clone();
        }
        match self.selection.decide(&pod, namespace, &labels) {
            Decision::Skip(skip) => {
                let mut warnings: Vec<String> = skip.warning().into_iter().collect();
                if let (Skip::NotSelected, Some((cluster, why))) = (&skip, &unknown) {
                    warnings.push(format!(
                        "the labels of namespace {namespace} in cluster {cluster} are not \
                         known ({why}): the pod is moved to PASA only by its \
                         {ENABLED_ANNOTATION} annotation"
                    ));
                }
                allow(skip.reason(), warnings)
            }
            Decision::Inject => match sidecar::inject(&pod, namespace, &config, stored) {
                Ok(injection) => {
                    let patched = serde_json::from_value(Value::Array(injection.patch))
                        .map_err(PatchError::Ops)
                        .and_then(|patch| {
                            AdmissionResponse::from(req)
                                .with_patch(patch)
                                .map_err(PatchError::Write)
                        });
                    match patched {
                        Ok(patched) => Answer {
                            verdict: review::warn(patched, {
                                let mut warnings = injection.warnings;
                                warnings.extend(told.iter().cloned());
                                warnings
                            }),
                            result: match injection.mode {
                                sidecar::Mode::NextToIstio => "injected_next_to_istio",
                                sidecar::Mode::Standalone => "injected_standalone",
                            },
                        },
                        Err(why) => stays(&why),
                    }
                }
                Err(why) => stays(&why),
            },
        }
    }
}

/// Why an injection could not be answered with its patch.
#[derive(Debug, thiserror::Error)]
enum PatchError {
    #[error("the pod cannot be read as JSON: {0}")]
    Pod(#[source] serde_json::Error),
    #[error("the injection's patch is not RFC 6902 operations: {0}")]
    Ops(#[source] serde_json::Error),
    #[error(transparent)]
    Write(kube::core::admission::SerializePatchError),
}

/// The mesh config among `resources` (`mesh` in `root_namespace`), if there is one that reads.
fn stored_mesh_config(
    resources: &[pasa_proto::store::v1::Resource],
    root_namespace: &str,
) -> Option<pasa_istio::mesh_config::MeshConfig> {
    resources
        .iter()
        .find(|r| {
            r.kind == pasa_proto::Kind::MeshConfig.as_str()
                && r.namespace == root_namespace
                && r.name == pasa_istio::mesh_config::MESH_CONFIG_NAME
        })
        .and_then(|r| pasa_istio::parse_spec_json(&r.spec_json).ok())
}

/// What the store says of proxies' settings, for a standalone pod's: the mesh config's
/// `defaultConfig` and the ProxyConfigs of the pod's namespace and of the root namespace.
#[derive(Debug, Default)]
pub struct StoredSettings {
    root_namespace: String,
    mesh_default: MeshProxyConfig,
    /// `(namespace, spec)`, oldest first.
    configs: Vec<(String, ProxyConfig)>,
}

impl StoredSettings {
    /// Reads the mesh config (`mesh` in `root_namespace`) and the ProxyConfigs among
    /// `resources`; one that cannot be read is left out (the validating webhook refuses such).
    /// Creation order is the store's (`create_revision`), names breaking ties.
    pub fn from_resources(
        resources: &[pasa_proto::store::v1::Resource],
        root_namespace: &str,
    ) -> StoredSettings {
        use pasa_istio::parse_spec_json;
        use pasa_proto::Kind;
        let mesh_default = stored_mesh_config(resources, root_namespace)
            .map(|m| m.default_config())
            .unwrap_or_default();
        let mut stored: Vec<&pasa_proto::store::v1::Resource> = resources
            .iter()
            .filter(|r| r.kind == Kind::ProxyConfig.as_str())
            .collect();
        stored.sort_by(|a, b| {
            (a.create_revision, &a.name, &a.namespace).cmp(&(
                b.create_revision,
                &b.name,
                &b.namespace,
            ))
        });
        let configs = stored
            .into_iter()
            .filter_map(|r| {
                let spec = parse_spec_json::<ProxyConfig>(&r.spec_json).ok()?;
                Some((r.namespace.clone(), spec))
            })
            .collect();
        StoredSettings {
            root_namespace: root_namespace.to_string(),
            mesh_default,
            configs,
        }
    }

    /// The settings of a pod in `namespace` with `labels` and its `annotated` ones, as Istio's
    /// injection works them out (see [`pasa_istio::proxy_config::effective`]).
    pub fn effective(
        &self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
        annotated: &MeshProxyConfig,
    ) -> MeshProxyConfig {
        let configs: Vec<NamespacedProxyConfig<'_>> = self
            .configs
            .iter()
            .map(|(namespace, spec)| NamespacedProxyConfig { namespace, spec })
            .collect();
        effective(
            &self.mesh_default,
            &configs,
            &self.root_namespace,
            namespace,
            labels,
            Some(annotated),
        )
    }
}

#[cfg(test)]
mod tests {
    /// istiod's injection path: key/value pairs in any order, `--slash--` for `/`; what PASA
    /// does not take is listed.
    #[test]
    fn the_injection_path_names_the_cluster_and_network() {
        assert_eq!(
            super::PathSettings::parse(""),
            super::PathSettings::default()
        );
        let at = super::PathSettings::parse("net/n--slash--2/cluster/east/");
        assert_eq!(
            (at.cluster_id.as_deref(), at.network.as_deref()),
            (Some("east"), Some("n/2"))
        );
        assert!(at.ignored.is_empty());
        let odd = super::PathSettings::parse("cluster/east/proxy_xds_via_agent/true/net");
        assert_eq!(odd.cluster_id.as_deref(), Some("east"));
        assert_eq!(
            odd.ignored,
            ["proxy_xds_via_agent=true", "net (without a value)"]
        );
    }

    use clap::Parser;

    use crate::server::PcpArgs;

    /// PCP's `--network` (istiod's `NETWORK`) and `--cluster-id` are what injected pods get.
    #[test]
    fn the_network_and_cluster_flags_reach_the_injection() {
        let parse = |args: &[&str]| {
            let pcp = PcpArgs::try_parse_from(["pasa-pcp"].iter().chain(args))
                .unwrap_or_else(|e| panic!("{args:?}: {e}"));
            pcp.inject.config(&pcp.kube.cluster_id, "cluster.local")
        };
        let default = parse(&[]);
        assert_eq!(
            (default.network.as_str(), default.cluster_id.as_str()),
            ("", "Kubernetes")
        );
        let given = parse(&["--network", "net-east", "--cluster-id", "east"]);
        assert_eq!(
            (given.network.as_str(), given.cluster_id.as_str()),
            ("net-east", "east")
        );
    }
}
