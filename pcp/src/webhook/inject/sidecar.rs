//! What the injecting webhook adds to a pod it moves to PASA, as a JSON Patch (RFC 6902) on the
//! pod of the admission request. Two modes:
//!
//! - **next to Istio** (the pod has Istio's `istio-proxy`): pilot-agent keeps everything it does
//!   (certificates over SDS, Envoy's lifecycle, the probes Istio rewrote, traffic capture); only
//!   its Envoy's xDS source moves. The pod's `proxy.istio.io/config` annotation, which
//!   pilot-agent reads at start from its downward API file and which wins over the mesh's and
//!   the injector's settings, gets `discoveryAddress: 127.0.0.1:15011` and
//!   `controlPlaneAuthPolicy: NONE` (plaintext on loopback, inside the pod): pilot-agent's xDS
//!   proxy then forwards Envoy's ADS to the `pasa-agent` container listening there. The CA
//!   address follows the discovery address when `CA_ADDR` is not set, so `istio-proxy` gets
//!   `CA_ADDR` (istiod's) if it lacks it: certificates keep coming from istiod. `pasa-agent` is a
//!   native sidecar placed just before `istio-proxy` among the init containers (or first, when
//!   `istio-proxy` is an ordinary container), so it runs before Envoy waits for its config.
//! - **standalone** (no `istio-proxy`): `pasa-agent` runs Envoy itself (`--envoy`), gets the
//!   workload certificate from istiod's CA with the pod's `istio-ca` token, and `pasa-init`
//!   (Istio's own `istio-iptables`, from its proxy image) captures the pod's traffic to Envoy's
//!   ports as Istio's init container does. The pod is labelled and annotated
//!   `sidecar.istio.io/inject: "false"` so that Istio's injector, if it runs later, leaves it.
//!
//! Both: identity from the downward API (pod name, namespace, IP, service account; the labels
//! as a file), an `emptyDir` in memory for the agent's sockets and one for its cache, resources
//! from `pasa.io/proxy{CPU,Memory,CPULimit,MemoryLimit}` (like Istio's `sidecar.istio.io/…`:
//! when any is set, only those set are used) or the mode's defaults, and the status annotation
//! `pasa.io/status` that makes a second injection change nothing.
//!
//! Both also place the pod in the mesh's topology as Istio's injection does: the agent gets the
//! cluster's ID (`ISTIO_META_CLUSTER_ID`, PCP's `--cluster-id`) and the pod's network
//! (`ISTIO_META_NETWORK`), and the pod is labelled `topology.istio.io/network` with it. The
//! network is the pod's own label when it has one, else the injector's `--network`; with
//! neither, the pod names no network. (istiod reads no namespace label for it: the label of its
//! own namespace sets the network of endpoints, which is the syncer's business, not injection's.)

use std::collections::{BTreeMap, BTreeSet};

use pasa_istio::proxy_config::MeshProxyConfig;
use pasa_istio::service_endpoints::NETWORK_LABEL;
use serde_json::{Map, Value, json};

use super::{STATUS_ANNOTATION, StoredSettings};

pub const AGENT_CONTAINER: &str = "pasa-agent";
pub const INIT_CONTAINER: &str = "pasa-init";
pub const ISTIO_PROXY: &str = "istio-proxy";
/// The pod annotation that picks the mode: `istio` or `standalone` (default: `istio` when the
/// pod has an `istio-proxy` container).
pub const MODE_ANNOTATION: &str = "pasa.io/mode";
/// The ProxyConfig pilot-agent reads from its pod.
pub const PROXY_CONFIG_ANNOTATION: &str = "proxy.istio.io/config";
/// Istio's own opt-out, set on standalone pods.
pub const ISTIO_INJECT: &str = "sidecar.istio.io/inject";
/// Where the agent serves ADS to pilot-agent, inside the pod.
pub const XDS_ADDRESS: &str = "127.0.0.1:15011";
/// Where kubelet probes the app through the agent (standalone): the port Istio's pilot-agent
/// uses, which the capture leaves alone.
pub const STATUS_PORT: u16 = 15020;
/// `"false"` keeps the app's probes as they are (Istio's `sidecar.istio.io/rewriteAppHTTPProbers`).
pub const REWRITE_PROBES_ANNOTATION: &str = "pasa.io/rewriteAppProbers";
/// `on-demand` or `eager`: which services the pod's proxy holds (the agent's `--scope`); PCP's
/// `--inject-scope` when the pod does not say.
pub const SCOPE_ANNOTATION: &str = "pasa.io/scope";
/// The user Istio's capture leaves alone (Envoy's and its agent's own traffic).
const PROXY_UID: u32 = 1337;

const RUN_VOLUME: &str = "pasa-run";
const CACHE_VOLUME: &str = "pasa-cache";
const PODINFO_VOLUME: &str = "pasa-podinfo";
const TOKEN_VOLUME: &str = "pasa-istio-token";
const ROOT_CERT_VOLUME: &str = "pasa-istiod-ca-cert";

/// The resource annotations: (annotation, which part of `resources`).
const RESOURCE_ANNOTATIONS: [(&str, &str, &str); 4] = [
    ("pasa.io/proxyCPU", "requests", "cpu"),
    ("pasa.io/proxyMemory", "requests", "memory"),
    ("pasa.io/proxyCPULimit", "limits", "cpu"),
    ("pasa.io/proxyMemoryLimit", "limits", "memory"),
];

/// How pods are injected: the agent's image, where agents find the store, istiod's CA.
#[derive(Debug, Clone)]
pub struct InjectConfig {
    /// The `pasa-agent` image (it carries Envoy for the standalone mode).
    pub image: String,
    /// The store (or PCP) address agents follow.
    pub store: String,
    /// istiod's CA, `host:port`.
    pub ca_address: String,
    /// The image with Istio's `istio-iptables` (Istio's proxy image), for the standalone mode.
    pub iptables_image: String,
    /// The cluster's ID (`ISTIO_META_CLUSTER_ID`): PCP's `--cluster-id`, as istiod's
    /// injection gives its `CLUSTER_ID`.
    pub cluster_id: String,
    pub trust_domain: String,
    pub domain_suffix: String,
    /// Agents reach the store over mutual TLS, with a workload certificate from istiod's CA,
    /// trusting the mesh root for the store's certificate.
    pub store_tls: bool,
    /// Agents serve persistent sessions with the stateful session filter
    /// (`PILOT_ENABLE_PERSISTENT_SESSION_FILTER`).
    pub persistent_session_filter: bool,
    /// The network of injected pods (`ISTIO_META_NETWORK` and the pod label
    /// `topology.istio.io/network`) unless a pod is labelled with its own; empty for none.
    pub network: String,
    /// Agents learn their proxy's services from its requests (`PASA_SCOPE=on-demand`) unless
    /// a pod's [`SCOPE_ANNOTATION`] says `eager`.
    pub on_demand: bool,
}

/// Where the mesh root (the `istio-ca-root-cert` ConfigMap) is mounted in the agent.
const ROOT_CERT_DIR: &str = "/var/run/secrets/istio";

impl Default for InjectConfig {
    fn default() -> Self {
        InjectConfig {
            image: format!("pasa-agent:{}", env!("CARGO_PKG_VERSION")),
            store: "pasa-pcp.pasa-system.svc:7400".into(),
            ca_address: "istiod.istio-system.svc:15012".into(),
            iptables_image: "docker.io/istio/proxyv2:1.30.0".into(),
            cluster_id: "Kubernetes".into(),
            trust_domain: "cluster.local".into(),
            domain_suffix: "cluster.local".into(),
            store_tls: false,
            persistent_session_filter: false,
            network: String::new(),
            on_demand: false,
        }
    }
}

/// How a pod is moved to PASA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    NextToIstio,
    Standalone,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::NextToIstio => "istio",
            Mode::Standalone => "standalone",
        }
    }
}

/// The patch for one pod, and what the answer should warn about.
#[derive(Debug, Clone)]
pub struct Injection {
    pub mode: Mode,
    /// RFC 6902 operations, in order.
    pub patch: Vec<Value>,
    pub warnings: Vec<String>,
}

/// Where a container of the pod is: `containers` or `initContainers`, and its index.
fn find_container(pod: &Value, name: &str) -> Option<(&'static str, usize)> {
    ["initContainers", "containers"]
        .into_iter()
        .find_map(|list| {
            let items = pod.pointer(&format!("/spec/{list}"))?.as_array()?;
            let i = items.iter().position(|c| c["name"] == name)?;
            Some((list, i))
        })
}

/// The mode `pod` is injected in: its annotation's, or else next to Istio when it has Istio's
/// `istio-proxy`; with a warning when the annotation is neither mode.
pub fn mode(pod: &Value) -> (Mode, Option<String>) {
    let annotation = pod
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(MODE_ANNOTATION))
        .and_then(Value::as_str);
    match annotation {
        Some("istio") => (Mode::NextToIstio, None),
        Some("standalone") => (Mode::Standalone, None),
        other => {
            let warning = other.map(|value| {
                format!(
                    "metadata.annotations[{MODE_ANNOTATION}]: {value:?} is neither \"istio\" nor \
                     \"standalone\"; chosen by the pod's containers"
                )
            });
            if find_container(pod, ISTIO_PROXY).is_some() {
                (Mode::NextToIstio, warning)
            } else {
                (Mode::Standalone, warning)
            }
        }
    }
}

/// The patch that moves `pod` (in `namespace`) to PASA, its proxy settings worked out from
/// `stored` as Istio's injection works them out; an error says why it cannot be, and the pod
/// is then left as it is.
pub fn inject(
    pod: &Value,
    namespace: &str,
    config: &InjectConfig,
    stored: &StoredSettings,
) -> Result<Injection, String> {
    let annotations = pod
        .pointer("/metadata/annotations")
        .and_then(Value::as_object);
    let annotation = |key: &str| annotations.and_then(|a| a.get(key)).and_then(Value::as_str);
    let istio_proxy = find_container(pod, ISTIO_PROXY);
    let (mode, warning) = mode(pod);
    let mut warnings: Vec<String> = warning.into_iter().collect();
    if mode == Mode::NextToIstio && istio_proxy.is_none() {
        return Err(format!(
            "{MODE_ANNOTATION}: istio needs the pod's {ISTIO_PROXY} container, which Istio's \
             injector adds, and it has not: is Istio injection on for this pod, and does PASA's \
             webhook configuration run after Istio's (its name sorts after it; \
             reinvocationPolicy: IfNeeded)?"
        ));
    }
    if mode == Mode::Standalone && istio_proxy.is_some() {
        return Err(format!(
            "{MODE_ANNOTATION}: standalone, but the pod already has Istio's {ISTIO_PROXY}: two \
             proxies cannot both capture its traffic (use the istio mode, or opt the pod out of \
             Istio's injection with the label {ISTIO_INJECT}=false)"
        ));
    }
    let mut patch = Patch::new(pod);
    let network = network(pod, config);
    let on_demand = match annotation(SCOPE_ANNOTATION) {
        Some("on-demand") => true,
        Some("eager") => false,
        None => config.on_demand,
        Some(other) => {
            warnings.push(format!(
                "metadata.annotations[{SCOPE_ANNOTATION}]: {other:?} is neither \"on-demand\" \
                 nor \"eager\"; the mesh's default ({}) holds",
                if config.on_demand {
                    "on-demand"
                } else {
                    "eager"
                }
            ));
            config.on_demand
        }
    };
    let (resources, resource_warnings) = resources(annotation, mode);
    warnings.extend(resource_warnings);

    let mut init_containers = Vec::new();
    let mut volumes = vec![RUN_VOLUME, CACHE_VOLUME, PODINFO_VOLUME];
    let annotated = MeshProxyConfig::parse(annotation(PROXY_CONFIG_ANNOTATION).unwrap_or_default())
        .map_err(|e| format!("metadata.annotations[{PROXY_CONFIG_ANNOTATION}]: {e}"))?;
    match mode {
        Mode::NextToIstio => {
            patch.annotate(PROXY_CONFIG_ANNOTATION, &proxy_config(&annotated));
            let (list, index) = istio_proxy.unwrap_or(("containers", 0));
            // The settings pilot-agent runs with: those Istio's injection gave it, under the
            // pod's annotation.
            let mut settings = pod
                .pointer(&format!("/spec/{list}/{index}/env"))
                .and_then(Value::as_array)
                .and_then(|env| env.iter().find(|e| e["name"] == "PROXY_CONFIG"))
                .and_then(|e| e["value"].as_str())
                .map(MeshProxyConfig::parse)
                .transpose()
                .map_err(|e| format!("{ISTIO_PROXY}'s PROXY_CONFIG: {e}"))?
                .unwrap_or_default();
            settings.overlay(&annotated);
            let has_ca = pod
                .pointer(&format!("/spec/{list}/{index}/env"))
                .and_then(Value::as_array)
                .is_some_and(|env| env.iter().any(|e| e["name"] == "CA_ADDR"));
            if !has_ca {
                patch.append(
                    &format!("/spec/{list}/{index}/env"),
                    json!({"name": "CA_ADDR", "value": config.ca_address}),
                );
            }
            // Just before istio-proxy when it is a native sidecar; first otherwise.
            let at = if list == "initContainers" { index } else { 0 };
            patch.insert(
                "/spec/initContainers",
                at,
                agent_container(config, mode, resources, &settings, network, on_demand),
            );
            init_containers.push(AGENT_CONTAINER);
        }
        Mode::Standalone => {
            patch.annotate(ISTIO_INJECT, "false");
            patch.label(ISTIO_INJECT, "false");
            let probers = if annotation(REWRITE_PROBES_ANNOTATION) == Some("false") {
                Map::new()
            } else {
                rewrite_probes(pod, &mut patch, &mut warnings)
            };
            let labels: BTreeMap<String, String> = pod
                .pointer("/metadata/labels")
                .and_then(|l| serde_json::from_value(l.clone()).ok())
                .unwrap_or_default();
            let settings = stored.effective(namespace, &labels, &annotated);
            let mut agent = agent_container(config, mode, resources, &settings, network, on_demand);
            if let Some(env) = agent["env"].as_array_mut() {
                env.push(json!({"name": "PASA_APP_PROBERS",
                                "value": Value::Object(probers).to_string()}));
            }
            patch.insert("/spec/initContainers", 0, init_container(config));
            patch.insert("/spec/initContainers", 1, agent);
            init_containers.extend([INIT_CONTAINER, AGENT_CONTAINER]);
            volumes.extend([TOKEN_VOLUME, ROOT_CERT_VOLUME]);
        }
    }
    if config.store_tls && mode == Mode::NextToIstio {
        // The agent asks istiod's CA for a certificate of its own (pilot-agent keeps the
        // pod's in memory), to present to the store.
        volumes.extend([TOKEN_VOLUME, ROOT_CERT_VOLUME]);
    }
    let existing: BTreeSet<&str> = pod
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str())
        .collect();
    for name in &volumes {
        if existing.contains(name) {
            return Err(format!(
                "spec.volumes: the pod already has a volume named {name:?}, which PASA's \
                 injection adds"
            ));
        }
        patch.append("/spec/volumes", volume(name));
    }
    if let Some(network) = network
        && pod
            .pointer("/metadata/labels")
            .and_then(|l| l.get(NETWORK_LABEL))
            .is_none()
    {
        patch.label(NETWORK_LABEL, network);
    }
    let status = json!({
        "version": env!("CARGO_PKG_VERSION"),
        "mode": mode.as_str(),
        "initContainers": init_containers,
        "volumes": volumes,
    });
    patch.annotate(STATUS_ANNOTATION, &status.to_string());
    Ok(Injection {
        mode,
        patch: patch.ops,
        warnings,
    })
}

/// The network of `pod`, as Istio's injection works it out: its label `topology.istio.io/network`
/// when it has that label (whatever its value), else the injector's `--network`; `None` when
/// that comes to nothing.
fn network<'a>(pod: &'a Value, config: &'a InjectConfig) -> Option<&'a str> {
    let network = match pod
        .pointer("/metadata/labels")
        .and_then(|labels| labels.get(NETWORK_LABEL))
    {
        Some(label) => label.as_str().unwrap_or_default(),
        None => &config.network,
    };
    (!network.is_empty()).then_some(network)
}

/// The pod's `proxy.istio.io/config` (`annotated`, as read) with the discovery address pointing
/// at the agent, as JSON.
fn proxy_config(annotated: &MeshProxyConfig) -> String {
    let mut config = annotated.as_map().clone();
    config.insert("discoveryAddress".into(), json!(XDS_ADDRESS));
    config.insert("controlPlaneAuthPolicy".into(), json!("NONE"));
    Value::Object(config).to_string()
}

/// The agent's resources: the annotated ones when any is set (each checked), else the mode's
/// defaults (the agent alone next to Istio; agent and Envoy standalone, Istio's own defaults).
fn resources<'a>(annotation: impl Fn(&str) -> Option<&'a str>, mode: Mode) -> (Value, Vec<String>) {
    let mut warnings = Vec::new();
    let mut any_set = false;
    let mut annotated = Map::new();
    for (key, part, resource) in RESOURCE_ANNOTATIONS {
        let Some(value) = annotation(key) else {
            continue;
        };
        any_set = true;
        if !is_quantity(value) {
            warnings.push(format!(
                "metadata.annotations[{key}]: {value:?} is not a Kubernetes quantity; ignored"
            ));
            continue;
        }
        annotated.entry(part).or_insert_with(|| json!({}))[resource] = json!(value);
    }
    if any_set {
        return (Value::Object(annotated), warnings);
    }
    let defaults = match mode {
        Mode::NextToIstio => {
            json!({"requests": {"cpu": "10m", "memory": "40Mi"}, "limits": {"memory": "128Mi"}})
        }
        Mode::Standalone => json!({"requests": {"cpu": "100m", "memory": "128Mi"},
                                   "limits": {"cpu": "2000m", "memory": "1Gi"}}),
    };
    (defaults, warnings)
}

/// A Kubernetes resource quantity: a decimal number with an optional suffix.
fn is_quantity(value: &str) -> bool {
    const SUFFIXES: [&str; 13] = [
        "", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi",
    ];
    let digits_end = value
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(value.len());
    let (number, suffix) = value.split_at(digits_end);
    !number.is_empty()
        && number.parse::<f64>().is_ok()
        && (SUFFIXES.contains(&suffix)
            || suffix.starts_with(['e', 'E']) && suffix[1..].parse::<i32>().is_ok())
}

/// The agent's container: a native sidecar (an init container that keeps running), with the
/// proxy `settings` as Istio's injection gives them to pilot-agent: as `PROXY_CONFIG`, and
/// their `proxyMetadata` as environment variables (over any of the same name); `network` is the
/// pod's (see [`network`]).
fn agent_container(
    config: &InjectConfig,
    mode: Mode,
    resources: Value,
    settings: &MeshProxyConfig,
    network: Option<&str>,
    on_demand: bool,
) -> Value {
    let field = |name: &str, path: &str| json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}});
    let value = |name: &str, value: &str| json!({"name": name, "value": value});
    let mut env = vec![
        field("POD_NAME", "metadata.name"),
        field("POD_NAMESPACE", "metadata.namespace"),
        field("INSTANCE_IP", "status.podIP"),
        field("SERVICE_ACCOUNT", "spec.serviceAccountName"),
        // Kubernetes expands $(VAR) from the variables above.
        value(
            "PASA_NODE_ID",
            &format!(
                "sidecar~$(INSTANCE_IP)~$(POD_NAME).$(POD_NAMESPACE)~$(POD_NAMESPACE).svc.{}",
                config.domain_suffix
            ),
        ),
        value("PASA_SERVER", &config.store),
        value("PASA_LABELS_FILE", "/etc/pasa/podinfo/labels"),
        value("PASA_UDS", "/var/run/pasa/xds.sock"),
        value("PASA_CACHE_DIR", "/var/lib/pasa/cache"),
        value("PASA_DOMAIN_SUFFIX", &config.domain_suffix),
        value("ISTIO_META_CLUSTER_ID", &config.cluster_id),
        // Istio's injection names the mesh after the trust domain unless told otherwise.
        value("ISTIO_META_MESH_ID", &config.trust_domain),
        value("TRUST_DOMAIN", &config.trust_domain),
    ];
    if let Some(network) = network {
        env.push(value("ISTIO_META_NETWORK", network));
    }
    if config.persistent_session_filter {
        env.push(value("PILOT_ENABLE_PERSISTENT_SESSION_FILTER", "true"));
    }
    if on_demand {
        // Envoy must ask over Delta: the agent's own bootstrap does (standalone); Istio's
        // proxy does by default since 1.22 (`ISTIO_DELTA_XDS`), through pilot-agent.
        env.push(value("PASA_SCOPE", "on-demand"));
    }
    let mut mounts = vec![
        json!({"name": RUN_VOLUME, "mountPath": "/var/run/pasa"}),
        json!({"name": CACHE_VOLUME, "mountPath": "/var/lib/pasa"}),
        json!({"name": PODINFO_VOLUME, "mountPath": "/etc/pasa/podinfo", "readOnly": true}),
    ];
    let mut container = json!({
        "name": AGENT_CONTAINER,
        "image": config.image,
        "imagePullPolicy": "IfNotPresent",
        "restartPolicy": "Always",
        "resources": resources,
        "securityContext": {
            "runAsUser": PROXY_UID,
            "runAsGroup": PROXY_UID,
            "runAsNonRoot": true,
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"]},
        },
    });
    let istiod_ca = |env: &mut Vec<Value>, mounts: &mut Vec<Value>| {
        env.push(value("CA_ADDR", &config.ca_address));
        mounts.push(
            json!({"name": TOKEN_VOLUME, "mountPath": "/var/run/secrets/tokens", "readOnly": true}),
        );
        mounts
            .push(json!({"name": ROOT_CERT_VOLUME, "mountPath": ROOT_CERT_DIR, "readOnly": true}));
    };
    if config.store_tls {
        env.push(value(
            "PASA_STORE_CA",
            &format!("{ROOT_CERT_DIR}/root-cert.pem"),
        ));
    }
    match mode {
        Mode::NextToIstio => {
            env.push(value("PASA_XDS_LISTEN", XDS_ADDRESS));
            // pilot-agent, between Envoy and the agent, fetches Wasm modules as for istiod.
            env.push(value("PASA_WASM_FETCHER", "pilot-agent"));
            // Istio's proxy has Istio's own filters: standard metrics and metadata exchange.
            env.push(value("PASA_PROXY_BUILD", "istio"));
            if config.store_tls {
                istiod_ca(&mut env, &mut mounts);
            }
        }
        Mode::Standalone => {
            env.push(value("PASA_ENVOY_BINARY", "/usr/local/bin/envoy"));
            // Istio's stats annotations shape Envoy's bootstrap.
            env.push(value(
                "PASA_ANNOTATIONS_FILE",
                "/etc/pasa/podinfo/annotations",
            ));
            env.push(value(
                "PASA_STATUS_LISTEN",
                &format!("0.0.0.0:{STATUS_PORT}"),
            ));
            // The admin endpoint stays on loopback, off the status port.
            env.push(value("PASA_ADMIN", "127.0.0.1:15030"));
            // Envoy's worker threads follow the container's CPU limit when the settings name
            // none, as pilot-agent's.
            env.push(
                json!({"name": "ISTIO_CPU_LIMIT", "valueFrom": {"resourceFieldRef": {
                "resource": "limits.cpu", "divisor": "1"}}}),
            );
            istiod_ca(&mut env, &mut mounts);
            container["ports"] = json!([
                {"name": "http-envoy-prom", "containerPort": 15090, "protocol": "TCP"},
                {"name": "status-port", "containerPort": 15021, "protocol": "TCP"},
            ]);
            // Envoy's readiness: the app containers start once Envoy has its config.
            let ready = json!({"httpGet": {"path": "/healthz/ready", "port": 15021}});
            let mut startup = ready.clone();
            startup["periodSeconds"] = json!(1);
            startup["failureThreshold"] = json!(600);
            container["startupProbe"] = startup;
            container["readinessProbe"] = ready;
        }
    }
    if !settings.is_empty() {
        env.push(value("PROXY_CONFIG", &settings.to_json()));
    }
    for (name, v) in settings.proxy_metadata() {
        env.retain(|e| e["name"] != name.as_str());
        env.push(value(&name, &v));
    }
    container["env"] = Value::Array(env);
    container["volumeMounts"] = Value::Array(mounts);
    container
}

/// Kubelet's HTTP and TCP probes of the app's containers, moved to the agent's status port
/// (`/app-health/<container>/livez|readyz|startupz`, timing kept); returns the originals, by
/// path, for the agent. Probes it cannot run (HTTPS, gRPC, a port name no container port has)
/// stay as they are, with a warning; `exec` probes run in the container and need nothing.
fn rewrite_probes(
    pod: &Value,
    patch: &mut Patch,
    warnings: &mut Vec<String>,
) -> Map<String, Value> {
    let mut probers = Map::new();
    let containers = pod.pointer("/spec/containers").and_then(Value::as_array);
    for (i, c) in containers.into_iter().flatten().enumerate() {
        let name = c["name"].as_str().unwrap_or_default();
        for (field, kind) in [
            ("livenessProbe", "livez"),
            ("readinessProbe", "readyz"),
            ("startupProbe", "startupz"),
        ] {
            let Some(probe) = c.get(field).filter(|p| p.is_object()) else {
                continue;
            };
            let at = format!("spec.containers[{i}].{field}");
            let port = |p: &Value| -> Option<u64> {
                match p {
                    Value::Number(n) => n.as_u64(),
                    Value::String(port_name) => c["ports"]
                        .as_array()?
                        .iter()
                        .find(|cp| cp["name"] == *port_name)?["containerPort"]
                        .as_u64(),
                    _ => None,
                }
            };
            let original = if let Some(http) = probe.get("httpGet") {
                let scheme = http["scheme"].as_str().unwrap_or("HTTP");
                if !scheme.eq_ignore_ascii_case("http") {
                    warnings.push(format!("{at}: an {scheme} probe is not rewritten"));
                    continue;
                }
                let Some(number) = port(&http["port"]) else {
                    warnings.push(format!(
                        "{at}: port {} is not one of the container's; not rewritten",
                        http["port"]
                    ));
                    continue;
                };
                let mut get = json!({"path": http["path"].as_str().unwrap_or("/"), "port": number});
                if let Some(headers) = http.get("httpHeaders") {
                    get["httpHeaders"] = headers.clone();
                }
                json!({"httpGet": get})
            } else if let Some(tcp) = probe.get("tcpSocket") {
                let Some(number) = port(&tcp["port"]) else {
                    warnings.push(format!(
                        "{at}: port {} is not one of the container's; not rewritten",
                        tcp["port"]
                    ));
                    continue;
                };
                json!({"tcpSocket": {"port": number}})
            } else {
                if probe.get("grpc").is_some() {
                    warnings.push(format!("{at}: a gRPC probe is not rewritten"));
                }
                continue;
            };
            let path = format!("/app-health/{name}/{kind}");
            let mut original = original;
            if let Some(timeout) = probe.get("timeoutSeconds") {
                original["timeoutSeconds"] = timeout.clone();
            }
            probers.insert(path.clone(), original);
            let mut rewritten = probe.clone();
            if let Some(map) = rewritten.as_object_mut() {
                map.remove("httpGet");
                map.remove("tcpSocket");
                map.insert(
                    "httpGet".into(),
                    json!({"path": path, "port": STATUS_PORT, "scheme": "HTTP"}),
                );
            }
            patch.ops.push(json!({"op": "replace",
                "path": format!("/spec/containers/{i}/{field}"), "value": rewritten}));
        }
    }
    probers
}

/// Traffic capture for the standalone mode: Istio's `istio-iptables`, redirecting the pod's
/// inbound and outbound TCP to Envoy (15006, 15001), sparing the proxy's own user and Envoy's
/// own ports, as Istio's `istio-init` does.
fn init_container(config: &InjectConfig) -> Value {
    json!({
        "name": INIT_CONTAINER,
        "image": config.iptables_image,
        "imagePullPolicy": "IfNotPresent",
        "args": ["istio-iptables", "-p", "15001", "-z", "15006", "-u", PROXY_UID.to_string(),
                 "-m", "REDIRECT", "-i", "*", "-x", "", "-b", "*", "-d", "15090,15021,15020"],
        "resources": {"requests": {"cpu": "10m", "memory": "10Mi"}, "limits": {"cpu": "100m", "memory": "50Mi"}},
        "securityContext": {
            "runAsUser": 0,
            "runAsGroup": 0,
            "runAsNonRoot": false,
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": false,
            "capabilities": {"add": ["NET_ADMIN", "NET_RAW"], "drop": ["ALL"]},
        },
    })
}

fn volume(name: &str) -> Value {
    match name {
        RUN_VOLUME => json!({"name": name, "emptyDir": {"medium": "Memory"}}),
        CACHE_VOLUME => json!({"name": name, "emptyDir": {}}),
        PODINFO_VOLUME => json!({"name": name, "downwardAPI": {"items": [
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
        ]}}),
        TOKEN_VOLUME => json!({"name": name, "projected": {"sources": [
            {"serviceAccountToken": {"audience": "istio-ca", "expirationSeconds": 43200, "path": "istio-token"}},
        ]}}),
        ROOT_CERT_VOLUME => json!({"name": name, "configMap": {"name": "istio-ca-root-cert"}}),
        other => json!({"name": other, "emptyDir": {}}),
    }
}

/// RFC 6902 operations built against the original pod: a list or map the pod lacks is added
/// once, before the first operation that needs it.
struct Patch<'a> {
    pod: &'a Value,
    ops: Vec<Value>,
    created: BTreeSet<String>,
}

impl<'a> Patch<'a> {
    fn new(pod: &'a Value) -> Self {
        Patch {
            pod,
            ops: Vec::new(),
            created: BTreeSet::new(),
        }
    }

    /// Makes sure `path` exists, as `empty` when the pod lacks it.
    fn ensure(&mut self, path: &str, empty: Value) {
        if self.pod.pointer(path).is_some_and(|v| !v.is_null()) || self.created.contains(path) {
            return;
        }
        self.ops
            .push(json!({"op": "add", "path": path, "value": empty}));
        self.created.insert(path.to_string());
    }

    fn append(&mut self, list: &str, value: Value) {
        self.ensure(list, json!([]));
        self.ops
            .push(json!({"op": "add", "path": format!("{list}/-"), "value": value}));
    }

    fn insert(&mut self, list: &str, index: usize, value: Value) {
        self.ensure(list, json!([]));
        self.ops
            .push(json!({"op": "add", "path": format!("{list}/{index}"), "value": value}));
    }

    fn annotate(&mut self, key: &str, value: &str) {
        self.set("/metadata/annotations", key, value);
    }

    fn label(&mut self, key: &str, value: &str) {
        self.set("/metadata/labels", key, value);
    }

    fn set(&mut self, map: &str, key: &str, value: &str) {
        self.ensure(map, json!({}));
        let escaped = key.replace('~', "~0").replace('/', "~1");
        self.ops
            .push(json!({"op": "add", "path": format!("{map}/{escaped}"), "value": value}));
    }
}
