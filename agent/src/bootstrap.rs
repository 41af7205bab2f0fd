//! Envoy's bootstrap for the pod's proxy, as pilot-agent writes it: the node (ID, service
//! cluster, locality, Istio's node metadata), ADS over the agent's Unix socket (`xds-grpc`), the
//! workload certificates from an SDS socket (`sds-grpc`), the admin endpoint on localhost, the
//! Prometheus listener (15090) and the readiness listener (15021), Istio's stats tags and the
//! runtime settings it sets. `pasa-agent bootstrap` prints it; `pasa-agent --envoy` writes it
//! for the Envoy it runs.
//!
//! Everything Envoy needs beyond this comes over ADS from the agent.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use serde_json::{Value, json};

use crate::identity::Identity;

/// The Envoy side of the agent's options (shared by `pasa-agent bootstrap` and `--envoy`).
#[derive(clap::Args, Debug, Clone)]
pub struct EnvoyArgs {
    /// Envoy's admin endpoint: `host:port` (pilot-agent's is `127.0.0.1:15000`) or `unix:PATH`.
    #[arg(long, env = "PASA_ENVOY_ADMIN", default_value = "127.0.0.1:15000")]
    pub envoy_admin: AdminAddress,
    /// The SDS socket Envoy gets the workload certificate (`default`) and root (`ROOTCA`) from:
    /// the istio-agent's, or this agent's own when it serves them (`--cert-dir`).
    #[arg(
        long,
        env = "PASA_SDS_UDS",
        default_value = "/var/run/secrets/workload-spiffe-uds/socket"
    )]
    pub sds_uds: PathBuf,
    /// Ask for configuration with the incremental (Delta) ADS protocol instead of state of
    /// the world (pilot-agent's `ISTIO_DELTA_XDS`).
    #[arg(long, env = "ISTIO_DELTA_XDS")]
    pub delta_xds: bool,
    /// The port of Envoy's Prometheus listener (`/stats/prometheus`); 0 leaves it out.
    #[arg(long, env = "PASA_PROMETHEUS_PORT", default_value_t = 15090)]
    pub prometheus_port: u16,
    /// The port of Envoy's readiness listener (`/healthz/ready`, answered by the agent's admin
    /// endpoint); 0 leaves it out.
    #[arg(long, env = "PASA_STATUS_PORT", default_value_t = 15021)]
    pub status_port: u16,
}

/// `pasa-agent bootstrap`: prints the Envoy bootstrap for this node on stdout.
#[derive(clap::Args, Debug, Clone)]
pub struct BootstrapArgs {
    /// The Unix socket the agent serves ADS on (`pasa-agent --uds`).
    #[arg(long, env = "PASA_UDS", default_value = "/var/run/pasa/xds.sock")]
    pub uds: PathBuf,
    /// The agent's admin address as it runs beside this Envoy (`pasa-agent --admin`): the
    /// readiness listener asks it.
    #[arg(long, env = "PASA_ADMIN", default_value = "127.0.0.1:15020")]
    pub admin: SocketAddr,
    #[command(flatten)]
    pub identity: crate::identity::IdentityArgs,
    #[command(flatten)]
    pub envoy: EnvoyArgs,
}

impl BootstrapArgs {
    /// The bootstrap as pretty JSON, or the identity problem.
    pub fn render(&self) -> Result<String, crate::identity::IdentityError> {
        let identity = self.identity.resolve()?;
        let value = bootstrap(&BootstrapInput {
            identity: &identity,
            xds_uds: &self.uds,
            agent_admin: self.admin,
            envoy: &self.envoy,
        });
        Ok(serde_json::to_string_pretty(&value).unwrap_or_default())
    }
}

/// Where Envoy's admin endpoint listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminAddress {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl FromStr for AdminAddress {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s.strip_prefix("unix:") {
            let path = path.trim_start_matches("//");
            if path.is_empty() {
                return Err(
                    "unix: needs a socket path, e.g. unix:/var/run/envoy/admin.sock".into(),
                );
            }
            return Ok(AdminAddress::Unix(PathBuf::from(path)));
        }
        s.parse()
            .map(AdminAddress::Tcp)
            .map_err(|_| format!("{s:?} is neither host:port (e.g. 127.0.0.1:15000) nor unix:PATH"))
    }
}

impl std::fmt::Display for AdminAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdminAddress::Tcp(addr) => write!(f, "{addr}"),
            AdminAddress::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

impl AdminAddress {
    fn envoy_address(&self) -> Value {
        match self {
            AdminAddress::Tcp(addr) => socket_address(*addr),
            AdminAddress::Unix(path) => json!({ "pipe": { "path": path } }),
        }
    }
}

/// What the bootstrap is made of besides [`EnvoyArgs`].
#[derive(Debug, Clone)]
pub struct BootstrapInput<'a> {
    pub identity: &'a Identity,
    /// The agent's ADS socket.
    pub xds_uds: &'a std::path::Path,
    /// The agent's admin endpoint, where the readiness listener sends `/healthz/ready`.
    pub agent_admin: SocketAddr,
    pub envoy: &'a EnvoyArgs,
}

/// The Istio version the node claims (see [`crate::model::proxy::ISTIO_VERSION`]).
pub use crate::model::proxy::ISTIO_VERSION;

/// The bootstrap, as Envoy's JSON configuration.
pub fn bootstrap(input: &BootstrapInput<'_>) -> Value {
    let id = input.identity;
    let mut listeners = Vec::new();
    let mut clusters = vec![
        grpc_pipe_cluster("xds-grpc", &input.xds_uds.to_string_lossy()),
        grpc_pipe_cluster("sds-grpc", &input.envoy.sds_uds.to_string_lossy()),
    ];
    if input.envoy.prometheus_port != 0 {
        clusters.push(static_cluster(
            "prometheus_stats",
            input.envoy.envoy_admin.envoy_address(),
        ));
        listeners.push(http_listener(
            "prometheus",
            input.envoy.prometheus_port,
            "/stats/prometheus",
            "prometheus_stats",
            "stats_prometheus",
        ));
    }
    if input.envoy.status_port != 0 {
        clusters.push(static_cluster("agent", socket_address(input.agent_admin)));
        listeners.push(http_listener(
            "readiness",
            input.envoy.status_port,
            "/healthz/ready",
            "agent",
            "agent",
        ));
    }
    let ads_api = if input.envoy.delta_xds {
        "DELTA_GRPC"
    } else {
        "GRPC"
    };
    json!({
        "node": {
            "id": id.node.to_string(),
            "cluster": id.service_cluster(),
            "locality": locality(id),
            "metadata": metadata(id),
        },
        "layered_runtime": {
            "layers": [
                {
                    "name": "global config",
                    "static_layer": {
                        // Regexes from VirtualServices are compiled with RE2; Istio warns
                        // instead of failing on large ones, up to this program size.
                        "re2.max_program_size.error_level": 32768,
                    },
                },
                { "name": "admin", "admin_layer": {} },
            ],
        },
        // No limit of Envoy's own on downstream connections (Envoy warns on every start
        // without one), as Istio sets it.
        "overload_manager": {
            "resource_monitors": [{
                "name": "envoy.resource_monitors.global_downstream_max_connections",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig",
                    "max_active_downstream_connections": 2_147_483_647,
                },
            }],
        },
        "stats_config": stats_config(id),
        "admin": {
            "access_log": [{
                "name": "envoy.access_loggers.file",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                    "path": "/dev/null",
                },
            }],
            "address": input.envoy.envoy_admin.envoy_address(),
        },
        "dynamic_resources": {
            "lds_config": ads_source(),
            "cds_config": ads_source(),
            "ads_config": {
                "api_type": ads_api,
                "set_node_on_first_message_only": true,
                "transport_api_version": "V3",
                "grpc_services": [{ "envoy_grpc": { "cluster_name": "xds-grpc" } }],
            },
        },
        "static_resources": {
            "clusters": clusters,
            "listeners": listeners,
        },
    })
}

fn locality(id: &Identity) -> Value {
    let mut locality = serde_json::Map::new();
    for (key, value) in [
        ("region", &id.locality.region),
        ("zone", &id.locality.zone),
        ("sub_zone", &id.locality.subzone),
    ] {
        if !value.is_empty() {
            locality.insert(key.into(), Value::String(value.clone()));
        }
    }
    Value::Object(locality)
}

/// Istio's node metadata: what istiod (and this agent) reads of the proxy.
fn metadata(id: &Identity) -> Value {
    let mut meta = serde_json::Map::new();
    let mut put = |key: &str, value: Value| {
        meta.insert(key.to_string(), value);
    };
    put("ISTIO_VERSION", json!(ISTIO_VERSION));
    put("NAMESPACE", json!(id.namespace));
    put("NAME", json!(id.pod_name));
    put("SERVICE_ACCOUNT", json!(id.service_account));
    put("CLUSTER_ID", json!(id.cluster_id));
    put("INSTANCE_IPS", json!(id.node.ip.to_string()));
    put("INTERCEPTION_MODE", json!("REDIRECT"));
    put("LABELS", json!(id.labels));
    put(
        "WORKLOAD_NAME",
        json!(
            id.labels
                .get("app")
                .cloned()
                .unwrap_or_else(|| id.pod_name.clone())
        ),
    );
    if !id.network.is_empty() {
        put("NETWORK", json!(id.network));
    }
    if !id.mesh_id.is_empty() {
        put("MESH_ID", json!(id.mesh_id));
    }
    put("PILOT_SAN", json!([]));
    put("PROXY_CONFIG", json!(id.proxy_config));
    Value::Object(meta)
}

fn ads_source() -> Value {
    json!({ "ads": {}, "initial_fetch_timeout": "0s", "resource_api_version": "V3" })
}

fn socket_address(addr: SocketAddr) -> Value {
    json!({ "socket_address": { "address": addr.ip().to_string(), "port_value": addr.port() } })
}

/// A cluster speaking gRPC (HTTP/2) to one Unix socket, as `xds-grpc` and `sds-grpc` are.
fn grpc_pipe_cluster(name: &str, path: &str) -> Value {
    json!({
        "name": name,
        "alt_stat_name": format!("{name};"),
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": { "pipe": { "path": path } } } }] }],
        },
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {
                    "http2_protocol_options": {
                        // Keep the stream to the agent alive through idle periods.
                        "connection_keepalive": { "interval": "30s", "timeout": "10s" },
                    },
                },
            },
        },
        // The one connection to the agent must never be refused by Envoy's own limits.
        "circuit_breakers": {
            "thresholds": [{
                "priority": "DEFAULT",
                "max_connections": 100_000,
                "max_pending_requests": 100_000,
                "max_requests": 100_000,
            }, {
                "priority": "HIGH",
                "max_connections": 100_000,
                "max_pending_requests": 100_000,
                "max_requests": 100_000,
            }],
        },
    })
}

fn static_cluster(name: &str, address: Value) -> Value {
    json!({
        "name": name,
        "alt_stat_name": format!("{name};"),
        "type": "STATIC",
        "connect_timeout": "0.250s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": address } }] }],
        },
    })
}

/// A static listener on `0.0.0.0:port` sending `prefix` to `cluster` (the Prometheus and
/// readiness listeners).
fn http_listener(name: &str, port: u16, prefix: &str, cluster: &str, stat_prefix: &str) -> Value {
    json!({
        "name": name,
        "address": { "socket_address": { "protocol": "TCP", "address": "0.0.0.0", "port_value": port } },
        "filter_chains": [{
            "filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "codec_type": "AUTO",
                    "stat_prefix": stat_prefix,
                    "route_config": {
                        "virtual_hosts": [{
                            "name": "backend",
                            "domains": ["*"],
                            "routes": [{
                                "match": { "prefix": prefix },
                                "route": { "cluster": cluster, "timeout": "5s" },
                            }],
                        }],
                    },
                    "http_filters": [{
                        "name": "envoy.filters.http.router",
                        "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
                        },
                    }],
                },
            }],
        }],
    })
}

/// Istio's stats tags: the cluster, listener and connection-manager names and the response
/// code are tags of Envoy's stats, not parts of their names, so dashboards built for istiod's
/// proxies work unchanged. Cluster and connection-manager stat names end in `;` (see
/// `translate::names::delimited_stats`), as istiod's and Istio's bootstrap have them.
///
/// Envoy keeps only the stats Istio's bootstrap keeps (`stats_matcher`): its own and the xDS
/// stream's, RBAC decisions, routes, Istio's, and what the pod asks for with
/// `sidecar.istio.io/statsInclusionPrefixes|Suffixes|Regexps` or, without those, its settings'
/// `proxyStatsMatcher` (`{pod_ip}` stands for each of its addresses). Per-cluster and
/// per-listener stats cost memory in every proxy; they are left out unless asked for.
fn stats_config(id: &Identity) -> Value {
    // Each regex's first capture group is removed from the stat name, the second becomes the
    // tag's value.
    let address = r"(?:[_.[:digit:]]*|[_\[\]aAbBcCdDeEfF[:digit:]]*)";
    let matcher = id
        .proxy_config
        .as_map()
        .get("proxyStatsMatcher")
        .cloned()
        .unwrap_or_default();
    let inclusion = |annotation: &str, field: &str, required: &[&str]| -> Vec<String> {
        let asked: Vec<String> = match id.annotations.get(annotation) {
            Some(listed) if !listed.is_empty() => listed.split(',').map(str::to_string).collect(),
            _ => matcher
                .get(field)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect(),
        };
        asked
            .into_iter()
            .chain(required.iter().map(|r| r.to_string()))
            .map(|p| p.replace("{pod_ip}", &id.node.ip.to_string()))
            .collect()
    };
    let mut patterns = vec![json!({"prefix": "reporter="})];
    patterns.extend(
        inclusion(
            "sidecar.istio.io/statsInclusionPrefixes",
            "inclusionPrefixes",
            &[
                "cluster_manager",
                "listener_manager",
                "server",
                "cluster.xds-grpc",
                "wasm",
            ],
        )
        .into_iter()
        .map(|p| json!({"prefix": p})),
    );
    patterns.extend(
        inclusion(
            "sidecar.istio.io/statsInclusionSuffixes",
            "inclusionSuffixes",
            &[
                "rbac.allowed",
                "rbac.denied",
                "shadow_allowed",
                "shadow_denied",
            ],
        )
        .into_iter()
        .map(|p| json!({"suffix": p})),
    );
    patterns.extend(
        inclusion(
            "sidecar.istio.io/statsInclusionRegexps",
            "inclusionRegexps",
            &[r"vhost\..*\.route\..*"],
        )
        .into_iter()
        .map(|p| json!({"safe_regex": {"regex": p}})),
    );
    patterns.extend([json!({"prefix": "component"}), json!({"prefix": "istio"})]);
    json!({
        "stats_matcher": {"inclusion_list": {"patterns": patterns}},
        "use_all_default_tags": false,
        "stats_tags": [
            { "tag_name": "cluster_name", "regex": r"^cluster(\.(.+);)" },
            { "tag_name": "tcp_prefix", "regex": r"^tcp\.((.*?)\.)\w+?$" },
            { "tag_name": "response_code", "regex": r"_rq(_(\d{3}))$" },
            { "tag_name": "response_code_class", "regex": r"_rq(_(\dxx))$" },
            { "tag_name": "http_conn_manager_listener_prefix", "regex": format!(r"^listener(?=\.).*?\.http\.(({address})\.)") },
            { "tag_name": "http_conn_manager_prefix", "regex": r"^http\.(((?:[_.[:digit:]\w]*|[_\[\]aAbBcCdDeEfF[:digit:]\w\:]*));\.)" },
            { "tag_name": "listener_address", "regex": format!(r"^listener\.(({address})\.)") },
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::IdentityArgs;

    fn args() -> EnvoyArgs {
        EnvoyArgs {
            envoy_admin: "127.0.0.1:15000".parse().unwrap(),
            sds_uds: "/var/run/secrets/workload-spiffe-uds/socket".into(),
            delta_xds: false,
            prometheus_port: 15090,
            status_port: 15021,
        }
    }

    fn identity() -> Identity {
        IdentityArgs {
            node_id: "sidecar~10.42.0.7~web-1.shop~shop.svc.cluster.local".into(),
            labels: "app=web,version=v1".into(),
            service_account: "web".into(),
            cluster_id: "Kubernetes".into(),
            locality: "eu-west1/eu-west1-b".into(),
            ..Default::default()
        }
        .resolve()
        .unwrap()
    }

    #[test]
    fn envoy_keeps_the_stats_istio_keeps() {
        let envoy = args();
        let patterns = |id: &Identity| {
            let b = bootstrap(&BootstrapInput {
                identity: id,
                xds_uds: std::path::Path::new("/var/run/pasa/xds.sock"),
                agent_admin: "127.0.0.1:15020".parse().unwrap(),
                envoy: &envoy,
            });
            b["stats_config"]["stats_matcher"]["inclusion_list"]["patterns"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
        };
        let mut id = identity();
        let defaults = patterns(&id);
        assert_eq!(
            defaults,
            [
                r#"{"prefix":"reporter="}"#,
                r#"{"prefix":"cluster_manager"}"#,
                r#"{"prefix":"listener_manager"}"#,
                r#"{"prefix":"server"}"#,
                r#"{"prefix":"cluster.xds-grpc"}"#,
                r#"{"prefix":"wasm"}"#,
                r#"{"suffix":"rbac.allowed"}"#,
                r#"{"suffix":"rbac.denied"}"#,
                r#"{"suffix":"shadow_allowed"}"#,
                r#"{"suffix":"shadow_denied"}"#,
                r#"{"safe_regex":{"regex":"vhost\\..*\\.route\\..*"}}"#,
                r#"{"prefix":"component"}"#,
                r#"{"prefix":"istio"}"#,
            ]
        );
        // The settings' proxyStatsMatcher adds to them...
        id.proxy_config = pasa_istio::proxy_config::MeshProxyConfig::parse(
            r#"{"proxyStatsMatcher": {"inclusionPrefixes": ["http.{pod_ip}_"],
                "inclusionRegexps": [".*outlier_detection.*"]}}"#,
        )
        .unwrap();
        let asked = patterns(&id);
        assert!(
            asked.contains(&r#"{"prefix":"http.10.42.0.7_"}"#.to_string()),
            "{asked:?}"
        );
        assert!(asked.contains(&r#"{"safe_regex":{"regex":".*outlier_detection.*"}}"#.to_string()));
        // ... unless the pod's annotation names its own.
        id.annotations.insert(
            "sidecar.istio.io/statsInclusionPrefixes".into(),
            "cluster.outbound,upstream_cx".into(),
        );
        let annotated = patterns(&id);
        assert!(annotated.contains(&r#"{"prefix":"cluster.outbound"}"#.to_string()));
        assert!(!annotated.contains(&r#"{"prefix":"http.10.42.0.7_"}"#.to_string()));
        assert!(
            annotated.contains(&r#"{"safe_regex":{"regex":".*outlier_detection.*"}}"#.to_string())
        );
    }

    #[test]
    fn node_ads_and_static_parts_are_pilot_agents() {
        let id = identity();
        let envoy = args();
        let b = bootstrap(&BootstrapInput {
            identity: &id,
            xds_uds: std::path::Path::new("/var/run/pasa/xds.sock"),
            agent_admin: "127.0.0.1:15020".parse().unwrap(),
            envoy: &envoy,
        });
        assert_eq!(
            b["node"]["id"],
            "sidecar~10.42.0.7~web-1.shop~shop.svc.cluster.local"
        );
        assert_eq!(b["node"]["cluster"], "web.shop");
        assert_eq!(b["node"]["locality"]["zone"], "eu-west1-b");
        assert!(b["node"]["locality"].get("sub_zone").is_none());
        assert_eq!(b["node"]["metadata"]["NAMESPACE"], "shop");
        assert_eq!(b["node"]["metadata"]["LABELS"]["version"], "v1");
        assert_eq!(b["node"]["metadata"]["SERVICE_ACCOUNT"], "web");
        assert_eq!(b["dynamic_resources"]["ads_config"]["api_type"], "GRPC");
        let clusters = b["static_resources"]["clusters"].as_array().unwrap();
        let names: Vec<&str> = clusters
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["xds-grpc", "sds-grpc", "prometheus_stats", "agent"]);
        assert_eq!(
            clusters[0]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
                ["pipe"]["path"],
            "/var/run/pasa/xds.sock"
        );
        let ports: Vec<u64> = b["static_resources"]["listeners"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                l["address"]["socket_address"]["port_value"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(ports, [15090, 15021]);
        assert_eq!(b["admin"]["address"]["socket_address"]["port_value"], 15000);
    }

    #[test]
    fn delta_unix_admin_and_no_static_listeners() {
        let id = identity();
        let envoy = EnvoyArgs {
            envoy_admin: "unix:/tmp/envoy-admin.sock".parse().unwrap(),
            delta_xds: true,
            prometheus_port: 0,
            status_port: 0,
            ..args()
        };
        let b = bootstrap(&BootstrapInput {
            identity: &id,
            xds_uds: std::path::Path::new("/x.sock"),
            agent_admin: "127.0.0.1:15020".parse().unwrap(),
            envoy: &envoy,
        });
        assert_eq!(
            b["dynamic_resources"]["ads_config"]["api_type"],
            "DELTA_GRPC"
        );
        assert_eq!(
            b["admin"]["address"]["pipe"]["path"],
            "/tmp/envoy-admin.sock"
        );
        assert!(
            b["static_resources"]["listeners"]
                .as_array()
                .unwrap()
                .is_empty()
        );
        assert!("unix:".parse::<AdminAddress>().is_err());
        let e = "localhost".parse::<AdminAddress>().unwrap_err();
        assert!(e.contains("host:port"), "{e}");
    }
}
