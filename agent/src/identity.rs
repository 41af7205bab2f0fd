//! Who the agent serves: the proxy's identity, from the command line or the downward API
//! environment Istio's injector sets (`POD_NAMESPACE`, `SERVICE_ACCOUNT`, ...). These are claims:
//! once the store API is secured, what the agent may read is decided by its verified SPIFFE
//! identity, never by them.

use std::collections::BTreeMap;
use std::fmt;

use pasa_istio::node::{NodeId, NodeIdError, ProxyType};
use pasa_istio::proxy_config::MeshProxyConfig;

/// The identity options of `pasa-agent`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct IdentityArgs {
    /// Istio node ID `type~ip~id~domain`, e.g.
    /// `sidecar~10.42.1.7~reviews-v1-x9k2q.default~default.svc.cluster.local`.
    /// Required: give it here or after `pasa-agent bootstrap`.
    #[arg(
        long,
        env = "PASA_NODE_ID",
        default_value = "",
        hide_default_value = true
    )]
    pub node_id: String,
    /// The pod's name, as status reports name the proxy; defaults to the pod part of the node
    /// ID's `pod.namespace`.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// The pod's namespace; defaults to the namespace part of the node ID's `pod.namespace`.
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,
    /// The pod's labels, `k=v,k2=v2` (select Sidecars and Gateways).
    #[arg(long, env = "PASA_LABELS", default_value = "")]
    pub labels: String,
    /// The pod's labels as Kubernetes' downward API writes them into a file (one `key="value"`
    /// line each), read at start; replaces --labels. The injected agent reads them so.
    #[arg(long, env = "PASA_LABELS_FILE")]
    pub labels_file: Option<std::path::PathBuf>,
    /// The pod's annotations as Kubernetes' downward API writes them into a file, read at
    /// start: Istio's `sidecar.istio.io/statsInclusion*` there shape Envoy's stats, as for
    /// pilot-agent.
    #[arg(long, env = "PASA_ANNOTATIONS_FILE")]
    pub annotations_file: Option<std::path::PathBuf>,
    /// The pod's service account.
    #[arg(long, env = "SERVICE_ACCOUNT", default_value = "default")]
    pub service_account: String,
    /// The cluster the pod runs in, as Istio names it.
    #[arg(long, env = "ISTIO_META_CLUSTER_ID", default_value = "Kubernetes")]
    pub cluster_id: String,
    /// The network the pod is on (multi-network meshes).
    #[arg(long, env = "ISTIO_META_NETWORK", default_value = "")]
    pub network: String,
    /// The networks whose endpoints the proxy is sent, comma-separated, besides its own
    /// (`ISTIO_META_REQUESTED_NETWORK_VIEW`, which Istio sets on an east-west gateway so that it
    /// forwards only into its own network); empty: every network.
    #[arg(long, env = "ISTIO_META_REQUESTED_NETWORK_VIEW", default_value = "")]
    pub requested_network_view: String,
    /// The mesh the pod is in (`ISTIO_META_MESH_ID`, which Istio's injection sets), for the
    /// proxy's telemetry.
    #[arg(long, env = "ISTIO_META_MESH_ID", default_value = "")]
    pub mesh_id: String,
    /// `region/zone/subzone` (any trailing part may be left out).
    #[arg(long, env = "PASA_LOCALITY", default_value = "")]
    pub locality: String,
    /// The proxy's settings (Istio's `ProxyConfig`, JSON or YAML), as Istio's injection and
    /// PASA's give them to the pod: Envoy's worker threads and drain time, tracing, proxy
    /// headers. Unset, the mesh config's `defaultConfig` holds.
    #[arg(
        long,
        env = "PROXY_CONFIG",
        default_value = "",
        hide_default_value = true
    )]
    pub proxy_config: String,
}

/// Where a workload runs, for locality-aware load balancing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Locality {
    pub region: String,
    pub zone: String,
    pub subzone: String,
}

impl fmt::Display for Locality {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.region, self.zone, self.subzone)
    }
}

/// A checked identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub node: NodeId,
    /// The pod's name (`--pod-name`, or the pod part of the node ID's id).
    pub pod_name: String,
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    /// The pod's annotations (`--annotations-file`); empty when not given.
    pub annotations: BTreeMap<String, String>,
    pub service_account: String,
    pub cluster_id: String,
    pub network: String,
    /// See [`IdentityArgs::requested_network_view`].
    pub requested_network_view: Vec<String>,
    pub mesh_id: String,
    pub locality: Locality,
    /// The proxy's own settings (`--proxy-config`); empty when none were given.
    pub proxy_config: MeshProxyConfig,
}

impl Identity {
    pub fn proxy_type(&self) -> ProxyType {
        self.node.proxy_type
    }

    /// `<app>.<namespace>`, Istio's service cluster (the proxy's node `cluster`): the `app`
    /// label (or `service.istio.io/canonical-name`, or `app.kubernetes.io/name`), else
    /// `istio-proxy`.
    pub fn service_cluster(&self) -> String {
        let app = [
            "app",
            "service.istio.io/canonical-name",
            "app.kubernetes.io/name",
        ]
        .iter()
        .find_map(|k| self.labels.get(*k))
        .map_or("istio-proxy", String::as_str);
        format!("{app}.{}", self.namespace)
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum IdentityError {
    #[error(
        "--node-id (or PASA_NODE_ID) is required: Istio's node ID type~ip~id~domain, e.g. \
         sidecar~10.42.1.7~reviews-v1-x9k2q.default~default.svc.cluster.local"
    )]
    MissingNodeId,
    #[error("--node-id: {0}")]
    NodeId(#[from] NodeIdError),
    #[error(
        "--namespace: no namespace given, and the node ID's id {0:?} has no `.namespace` part \
         (set --namespace or POD_NAMESPACE)"
    )]
    NoNamespace(String),
    #[error(
        "--namespace {given:?} contradicts the node ID, whose id names namespace {from_node:?}"
    )]
    NamespaceMismatch { given: String, from_node: String },
    #[error("--labels: {entry:?} is not key=value")]
    Label { entry: String },
    #[error("--locality: {0:?} has more than region/zone/subzone")]
    Locality(String),
    #[error("--labels-file {path}: {source}")]
    LabelsFile {
        path: String,
        #[source]
        source: DownwardFileError,
    },
    #[error("--annotations-file {path}: {source}")]
    AnnotationsFile {
        path: String,
        #[source]
        source: DownwardFileError,
    },
    #[error("--proxy-config (PROXY_CONFIG): {0}")]
    ProxyConfig(String),
}

/// Why a downward API file cannot be read.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DownwardFileError {
    #[error("{0}")]
    Read(#[source] std::sync::Arc<std::io::Error>),
    #[error(transparent)]
    Line(#[from] DownwardLineError),
}

/// A line of a downward API file that is not `key="value"`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {number}: {text:?} is not key=\"value\"")]
pub struct DownwardLineError {
    /// Counted from 1.
    pub number: usize,
    pub text: String,
}

/// A downward API file (see [`parse_downward_labels`]) read from `path`; what goes wrong is
/// told by `error` (path, cause).
fn read_downward_file(
    path: &std::path::Path,
    error: impl Fn(String, DownwardFileError) -> IdentityError,
) -> Result<BTreeMap<String, String>, IdentityError> {
    let fail = |source: DownwardFileError| error(path.display().to_string(), source);
    let text = std::fs::read_to_string(path)
        .map_err(|e| fail(DownwardFileError::Read(std::sync::Arc::new(e))))?;
    parse_downward_labels(&text).map_err(|e| fail(e.into()))
}

/// Reads a downward API labels (or annotations) file: `key="value"` lines, the value quoted as
/// Go quotes strings (`\"`, `\\`, `\n`).
pub fn parse_downward_labels(text: &str) -> Result<BTreeMap<String, String>, DownwardLineError> {
    let mut labels = BTreeMap::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let bad = || DownwardLineError {
            number: i + 1,
            text: line.to_string(),
        };
        let (key, quoted) = line.split_once('=').ok_or_else(bad)?;
        let inner = quoted
            .strip_prefix('"')
            .and_then(|q| q.strip_suffix('"'))
            .ok_or_else(bad)?;
        let mut value = String::with_capacity(inner.len());
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            if c != '\\' {
                value.push(c);
                continue;
            }
            let escaped = chars.next().ok_or_else(bad)?;
            let hex = |n: usize, chars: &mut std::str::Chars<'_>| {
                let digits: String = chars.by_ref().take(n).collect();
                u32::from_str_radix(&digits, 16)
                    .ok()
                    .filter(|_| digits.len() == n)
                    .and_then(char::from_u32)
            };
            value.push(match escaped {
                'n' => '\n',
                't' => '\t',
                'r' => '\r',
                'x' => hex(2, &mut chars).ok_or_else(bad)?,
                'u' => hex(4, &mut chars).ok_or_else(bad)?,
                'U' => hex(8, &mut chars).ok_or_else(bad)?,
                other => other,
            });
        }
        if key.is_empty() {
            return Err(bad());
        }
        labels.insert(key.to_string(), value);
    }
    Ok(labels)
}

/// Reads `k=v,k2=v2`; an empty string is no labels.
pub fn parse_labels(text: &str) -> Result<BTreeMap<String, String>, IdentityError> {
    let mut labels = BTreeMap::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        match entry.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => {
                labels.insert(k.trim().to_string(), v.trim().to_string());
            }
            _ => {
                return Err(IdentityError::Label {
                    entry: entry.to_string(),
                });
            }
        }
    }
    Ok(labels)
}

/// Reads `region/zone/subzone`; missing trailing parts are empty.
pub fn parse_locality(text: &str) -> Result<Locality, IdentityError> {
    let parts: Vec<&str> = text.split('/').collect();
    if parts.len() > 3 {
        return Err(IdentityError::Locality(text.to_string()));
    }
    let part = |i: usize| parts.get(i).copied().unwrap_or_default().to_string();
    Ok(Locality {
        region: part(0),
        zone: part(1),
        subzone: part(2),
    })
}

impl IdentityArgs {
    /// Checks the options and puts them together.
    pub fn resolve(&self) -> Result<Identity, IdentityError> {
        if self.node_id.trim().is_empty() {
            return Err(IdentityError::MissingNodeId);
        }
        let node = NodeId::parse(&self.node_id)?;
        let from_node = node.namespace().map(str::to_string);
        let namespace = match (
            self.namespace.as_deref().filter(|n| !n.is_empty()),
            from_node,
        ) {
            (Some(given), Some(from_node)) if given != from_node => {
                return Err(IdentityError::NamespaceMismatch {
                    given: given.to_string(),
                    from_node,
                });
            }
            (Some(given), _) => given.to_string(),
            (None, Some(from_node)) => from_node,
            (None, None) => return Err(IdentityError::NoNamespace(node.id.clone())),
        };
        let pod_name = match self.pod_name.as_deref().filter(|n| !n.is_empty()) {
            Some(given) => given.to_string(),
            None => node
                .id
                .split_once('.')
                .map_or(node.id.as_str(), |(pod, _)| pod)
                .to_string(),
        };
        Ok(Identity {
            pod_name,
            namespace,
            labels: match &self.labels_file {
                None => parse_labels(&self.labels)?,
                Some(path) => read_downward_file(path, |path, source| IdentityError::LabelsFile {
                    path,
                    source,
                })?,
            },
            annotations: match &self.annotations_file {
                None => BTreeMap::new(),
                Some(path) => read_downward_file(path, |path, source| {
                    IdentityError::AnnotationsFile { path, source }
                })?,
            },
            service_account: self.service_account.clone(),
            cluster_id: self.cluster_id.clone(),
            network: self.network.clone(),
            requested_network_view: self
                .requested_network_view
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(str::to_string)
                .collect(),
            mesh_id: self.mesh_id.clone(),
            locality: parse_locality(&self.locality)?,
            proxy_config: MeshProxyConfig::parse(&self.proxy_config)
                .map_err(IdentityError::ProxyConfig)?,
            node,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: &str = "sidecar~10.42.1.7~reviews-v1-x9k2q.default~default.svc.cluster.local";

    fn args(node_id: &str) -> IdentityArgs {
        IdentityArgs {
            node_id: node_id.to_string(),
            service_account: "default".into(),
            cluster_id: "Kubernetes".into(),
            ..Default::default()
        }
    }

    #[test]
    fn namespace_comes_from_the_node_id_or_the_flag() {
        let id = args(NODE).resolve().unwrap();
        assert_eq!(id.namespace, "default");
        assert_eq!(id.pod_name, "reviews-v1-x9k2q");
        assert_eq!(id.proxy_type(), ProxyType::Sidecar);

        let mut a = args("router~10.0.0.1~ingress-7d9~istio-system.svc.cluster.local");
        assert!(matches!(a.resolve(), Err(IdentityError::NoNamespace(_))));
        a.namespace = Some("istio-system".into());
        assert_eq!(a.resolve().unwrap().namespace, "istio-system");
        assert_eq!(a.resolve().unwrap().pod_name, "ingress-7d9");
        a.pod_name = Some("ingress-7d9-abcde".into());
        assert_eq!(a.resolve().unwrap().pod_name, "ingress-7d9-abcde");

        let mut b = args(NODE);
        b.namespace = Some("prod".into());
        let e = b.resolve().unwrap_err();
        assert!(e.to_string().contains("contradicts"), "{e}");
    }

    #[test]
    fn bad_node_ids_are_explained() {
        let e = args("").resolve().unwrap_err();
        assert!(
            e.to_string()
                .starts_with("--node-id (or PASA_NODE_ID) is required"),
            "{e}"
        );
        let e = args("sidecar~not-an-ip~x.ns~d").resolve().unwrap_err();
        assert!(e.to_string().starts_with("--node-id: "), "{e}");
        assert!(e.to_string().contains("not an IP address"), "{e}");
    }

    #[test]
    fn labels_and_locality() {
        let mut a = args(NODE);
        a.labels = "app=reviews, version=v1".into();
        a.locality = "us-east1/us-east1-b".into();
        let id = a.resolve().unwrap();
        assert_eq!(id.labels["app"], "reviews");
        assert_eq!(id.labels["version"], "v1");
        assert_eq!(id.locality.zone, "us-east1-b");
        assert_eq!(id.locality.subzone, "");
        assert!(parse_labels("app").is_err());
        assert!(parse_labels("=x").is_err());
        assert!(parse_locality("a/b/c/d").is_err());
        assert!(parse_labels("").unwrap().is_empty());
        let file = "app=\"reviews\"\npod-template-hash=\"7f9c\"\nodd=\"a\\\"b\"\n";
        let labels = parse_downward_labels(file).unwrap();
        assert_eq!(labels["app"], "reviews");
        assert_eq!(labels["pod-template-hash"], "7f9c");
        assert_eq!(labels["odd"], "a\"b");
        let e = parse_downward_labels("app=reviews\n").unwrap_err();
        assert!(e.to_string().contains("line 1"), "{e}");
        // Annotations as the downward API writes them (Go's quoting: a JSON value with a line
        // break, a tab, a non-ASCII character).
        let file = "proxy.istio.io/config=\"{\\\"concurrency\\\": 2}\\n\"\n\
                    note=\"a\\tb \\u00e9\"\n";
        let annotations = parse_downward_labels(file).unwrap();
        assert_eq!(
            annotations["proxy.istio.io/config"],
            "{\"concurrency\": 2}\n"
        );
        assert_eq!(annotations["note"], "a\tb \u{e9}");
        assert!(parse_downward_labels("k=\"\\u12\"").is_err());
    }
}
