//! `pasactl proxy-config cluster|listener|route|endpoint|all AGENT`: what one pasa-agent serves,
//! as istioctl's `proxy-config` tables (`-o short`) or Envoy's protobuf JSON (`-o json`).
//!
//! The resources come from the agent's admin endpoint (`/config_dump`), not from the store: the
//! store holds only the raw Istio config, and only the agent knows what it generated from it
//! for its proxy (its scope, mesh settings and generator) and serves right now.

mod cluster;
mod dump;
mod endpoint;
mod listener;
mod route;
mod secret;

use clap::{Args, Subcommand};
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::cluster::v3::cluster::{ClusterDiscoveryType, DiscoveryType};
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use hyper::StatusCode;
use serde_json::{Value, json};

use crate::envoy_json as json;

use crate::cli::agent::{self, DEFAULT_ADMIN, resolve_agent};
use crate::cli::{CmdResult, UsageError, out, structured};
use dump::{Resources, Served};

#[derive(Subcommand, Debug)]
pub enum ProxyConfigCommand {
    /// Clusters: SERVICE FQDN, PORT, SUBSET, DIRECTION, TYPE, DESTINATION RULE.
    #[command(visible_aliases = ["clusters", "c"])]
    Cluster(ClusterArgs),
    /// Listeners, one row per filter chain: ADDRESSES, PORT, MATCH, DESTINATION.
    #[command(visible_aliases = ["listeners", "l"])]
    Listener(ListenerArgs),
    /// Routes: NAME, VHOST NAME, DOMAINS, MATCH, VIRTUAL SERVICE.
    #[command(visible_aliases = ["routes", "r"])]
    Route(RouteArgs),
    /// Endpoints: ENDPOINT, STATUS, OUTLIER CHECK (always -: the agent does not see Envoy's
    /// outlier ejections), CLUSTER.
    #[command(visible_aliases = ["endpoints", "ep"])]
    Endpoint(EndpointArgs),
    /// Extension configs served over ECDS (the Wasm filters of WasmPlugins and
    /// TrafficExtensions, EnvoyFilter extension configs): ECDS NAME, TYPE.
    #[command(visible_aliases = ["extensionconfigs"])]
    Ecds(Target),
    /// Certificates served over SDS (the workload certificate, the root, a gateway's
    /// credentials): RESOURCE NAME, TYPE, STATUS, VALID CERT, SERIAL NUMBER, NOT AFTER, NOT
    /// BEFORE. Private keys are never shown.
    #[command(visible_aliases = ["secrets", "s"])]
    Secret(Target),
    /// Clusters, listeners, routes and endpoints, one table after the other.
    All(Target),
    /// istioctl's sections pasactl does not have (bootstrap, log, ...): answered with what
    /// shows the same.
    #[command(external_subcommand)]
    Other(Vec<String>),
}

/// Which agent, which of its generators, and how to print.
#[derive(Args, Debug, Clone)]
pub struct Target {
    /// The agent: its admin address (host:port or http://host:port, its --admin), or its proxy
    /// as `proxy-status` lists it (pod.namespace, pod name or node ID), looked up in the store.
    #[arg(value_name = "AGENT")]
    pub agent: Option<String>,
    /// The agent's admin address, when not given as AGENT [default: 127.0.0.1:15000].
    #[arg(
        long = "agent",
        id = "agent_flag",
        env = "PASA_AGENT_ADMIN",
        value_name = "ADDR"
    )]
    pub agent_flag: Option<String>,
    /// The resources served to Envoy or to proxyless gRPC clients.
    #[arg(long, value_enum, default_value = "envoy")]
    pub generator: Generator,
    /// Where to read them: what the agent serves (its /config_dump), or what Envoy holds (its
    /// /config_dump: AGENT is then Envoy's admin address, e.g. 127.0.0.1:15000, or the proxy's
    /// name, read through the agent that runs its Envoy with --envoy).
    #[arg(long, value_enum, default_value = "agent")]
    pub source: Source,
    #[arg(short = 'o', long, value_enum, default_value = "short")]
    pub output: Output,
    /// The namespace of the pod named as AGENT (`AGENT -n NS` is `AGENT.NS`).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
}

impl Target {
    /// The agent as given: AGENT (with -n, `pod.namespace`), --agent, or the default address.
    fn given(&self) -> Result<String, UsageError> {
        let given = self
            .agent
            .as_deref()
            .or(self.agent_flag.as_deref())
            .unwrap_or(DEFAULT_ADMIN);
        let Some(namespace) = &self.namespace else {
            return Ok(given.to_string());
        };
        match agent::agent_ref(given)? {
            agent::AgentRef::Proxy(pod) if self.agent.is_some() && !pod.contains(['.', '~']) => {
                Ok(format!("{pod}.{namespace}"))
            }
            _ => Err(UsageError(format!(
                "-n {namespace} needs a pod name as AGENT (`pasactl proxy-config cluster POD -n {namespace}`); {given:?} already says where the agent is: drop -n"
            ))),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Source {
    Agent,
    Envoy,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Generator {
    Envoy,
    Grpc,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// istioctl's table.
    Short,
    /// The resources as Envoy's protobuf JSON.
    Json,
    /// The same resources as YAML.
    Yaml,
}

#[derive(Args, Debug)]
pub struct ClusterArgs {
    #[command(flatten)]
    pub target: Target,
    #[command(flatten)]
    pub filter: cluster::ClusterFilter,
}

#[derive(Args, Debug)]
pub struct ListenerArgs {
    #[command(flatten)]
    pub target: Target,
    #[command(flatten)]
    pub filter: listener::ListenerFilter,
}

#[derive(Args, Debug)]
pub struct RouteArgs {
    #[command(flatten)]
    pub target: Target,
    #[command(flatten)]
    pub filter: route::RouteFilter,
}

#[derive(Args, Debug)]
pub struct EndpointArgs {
    #[command(flatten)]
    pub target: Target,
    #[command(flatten)]
    pub filter: endpoint::EndpointFilter,
}

/// The answer to `proxy-config SECTION` for a section pasactl does not have.
fn other_section(section: &str) -> UsageError {
    UsageError(match section {
        "bootstrap" => "proxy-config bootstrap: the agent writes Envoy's bootstrap; `pasa-agent bootstrap --node-id ID ...` prints it, and with --envoy it is envoy-rev.json beside the agent's socket".into(),
        "log" => "proxy-config log: Envoy's log levels are set on its own admin endpoint (`curl -X POST '127.0.0.1:15000/logging?level=debug'`); the agent's with RUST_LOG".into(),
        "rootca-compare" => "proxy-config rootca-compare: `pasactl pc secret POD` for each pod shows its ROOTCA's serial and dates".into(),
        other => format!("proxy-config {other:?}: the sections are cluster, listener, route, endpoint, ecds, secret and all"),
    })
}

pub async fn run(server: &crate::cli::Server, command: ProxyConfigCommand) -> CmdResult {
    let target = match &command {
        ProxyConfigCommand::Cluster(a) => &a.target,
        ProxyConfigCommand::Listener(a) => &a.target,
        ProxyConfigCommand::Route(a) => &a.target,
        ProxyConfigCommand::Endpoint(a) => &a.target,
        ProxyConfigCommand::Ecds(t)
        | ProxyConfigCommand::Secret(t)
        | ProxyConfigCommand::All(t) => t,
        ProxyConfigCommand::Other(words) => {
            return Err(other_section(words.first().map_or("", String::as_str)).into());
        }
    };
    let output = target.output;
    let yaml = output == Output::Yaml;
    let resources = fetch(server, target).await?;
    let text = match (&command, output) {
        (ProxyConfigCommand::Cluster(a), Output::Short) => {
            cluster::render(kept_clusters(&resources, &a.filter).map(|s| &s.message))
        }
        (ProxyConfigCommand::Cluster(a), Output::Json | Output::Yaml) => {
            structured(yaml, &json_list(kept_clusters(&resources, &a.filter))?)?
        }
        (ProxyConfigCommand::Listener(a), Output::Short) => {
            listener::render(kept_listeners(&resources, &a.filter).map(|s| &s.message))
        }
        (ProxyConfigCommand::Listener(a), Output::Json | Output::Yaml) => {
            structured(yaml, &json_list(kept_listeners(&resources, &a.filter))?)?
        }
        (ProxyConfigCommand::Route(a), Output::Short) => {
            route::render(kept_routes(&resources, &a.filter).map(|s| &s.message))
        }
        (ProxyConfigCommand::Route(a), Output::Json | Output::Yaml) => {
            structured(yaml, &json_list(kept_routes(&resources, &a.filter))?)?
        }
        (ProxyConfigCommand::Endpoint(a), Output::Short) => {
            endpoint::render(&assignments(&resources), &a.filter)
        }
        (ProxyConfigCommand::Endpoint(a), Output::Json | Output::Yaml) => {
            structured(yaml, &json_list(kept_endpoints(&resources, &a.filter))?)?
        }
        (ProxyConfigCommand::Ecds(_), Output::Short) => ecds(&resources),
        (ProxyConfigCommand::Ecds(_), Output::Json | Output::Yaml) => {
            structured(yaml, &json_list(resources.extension_configs.iter())?)?
        }
        (ProxyConfigCommand::Secret(_), Output::Short) => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
            secret::render(resources.secrets.iter().map(|s| &s.message), now)
        }
        (ProxyConfigCommand::Secret(_), Output::Json | Output::Yaml) => {
            structured(yaml, &json_list(resources.secrets.iter())?)?
        }
        (ProxyConfigCommand::All(_), Output::Short) => [
            cluster::render(resources.clusters.iter().map(|s| &s.message)),
            listener::render(resources.listeners.iter().map(|s| &s.message)),
            route::render(resources.routes.iter().map(|s| &s.message)),
            endpoint::render(&assignments(&resources), &Default::default()),
        ]
        .join("\n"),
        (ProxyConfigCommand::Other(words), _) => {
            return Err(other_section(words.first().map_or("", String::as_str)).into());
        }
        (ProxyConfigCommand::All(_), Output::Json | Output::Yaml) => structured(
            yaml,
            &json!({
                "clusters": json_list(resources.clusters.iter())?,
                "listeners": json_list(resources.listeners.iter())?,
                "routes": json_list(resources.routes.iter())?,
                "endpoints": json_list(resources.endpoints.iter())?,
            }),
        )?,
    };
    out(&text)?;
    Ok(())
}

/// Reads the agent's `/config_dump` and the resources of the generator asked for.
async fn fetch(server: &crate::cli::Server, target: &Target) -> anyhow::Result<Resources> {
    let given = target.given()?;
    let given = given.as_str();
    if target.source == Source::Envoy {
        let (address, path, whose) = match agent::agent_ref(given)? {
            agent::AgentRef::Address(address) => (
                address.to_owned(),
                "/config_dump?include_eds",
                "Envoy's admin endpoint",
            ),
            // Envoy's admin endpoint is the pod's own: its agent reads it.
            agent::AgentRef::Proxy(_) => (
                resolve_agent(server, given).await?,
                "/config_dump?source=envoy",
                "the agent",
            ),
        };
        let (status, body) = agent::get(&address, path).await?;
        anyhow::ensure!(
            status == StatusCode::OK,
            "{whose} at {address} answered {status}: {}",
            String::from_utf8_lossy(&body).trim()
        );
        return Ok(Resources::from_envoy_dump(&body)?);
    }
    let address = resolve_agent(server, given).await?;
    let (status, body) = agent::get(&address, "/config_dump").await?;
    match status {
        StatusCode::OK => {}
        StatusCode::NOT_FOUND => anyhow::bail!(
            "{address} has no /config_dump endpoint; is it the admin address (--admin) of a pasa-agent?"
        ),
        _ => anyhow::bail!(
            "the agent at {address} answered {status}: {}",
            String::from_utf8_lossy(&body).trim()
        ),
    }
    let generator = match target.generator {
        Generator::Envoy => "envoy",
        Generator::Grpc => "grpc",
    };
    Ok(Resources::from_dump(&body, generator)?)
}

fn kept_clusters<'a>(
    r: &'a Resources,
    filter: &'a cluster::ClusterFilter,
) -> impl Iterator<Item = &'a Served<Cluster>> {
    r.clusters.iter().filter(|s| filter.keeps(&s.message))
}

fn kept_listeners<'a>(
    r: &'a Resources,
    filter: &'a listener::ListenerFilter,
) -> impl Iterator<Item = &'a Served<envoy_types::pb::envoy::config::listener::v3::Listener>> {
    r.listeners.iter().filter(|s| filter.keeps(&s.message))
}

fn kept_routes<'a>(
    r: &'a Resources,
    filter: &'a route::RouteFilter,
) -> impl Iterator<Item = &'a Served<envoy_types::pb::envoy::config::route::v3::RouteConfiguration>>
{
    r.routes.iter().filter(|s| filter.keeps(&s.message))
}

/// EDS assignments with at least one endpoint the filter keeps.
fn kept_endpoints<'a>(
    r: &'a Resources,
    filter: &'a endpoint::EndpointFilter,
) -> impl Iterator<Item = &'a Served<ClusterLoadAssignment>> {
    r.endpoints
        .iter()
        .filter(|s| !endpoint::rows(std::iter::once(&s.message), filter).is_empty())
}

/// Every endpoint assignment served: EDS, and those DNS and static clusters carry inline.
fn assignments(r: &Resources) -> Vec<ClusterLoadAssignment> {
    let inline = r.clusters.iter().filter_map(|s| {
        let eds = matches!(
            s.message.cluster_discovery_type,
            Some(ClusterDiscoveryType::Type(t)) if t == DiscoveryType::Eds as i32
        );
        if eds {
            return None;
        }
        s.message.load_assignment.clone().map(|mut cla| {
            if cla.cluster_name.is_empty() {
                cla.cluster_name = s.message.name.clone();
            }
            cla
        })
    });
    r.endpoints
        .iter()
        .map(|s| s.message.clone())
        .chain(inline)
        .collect()
}

/// istioctl's ECDS table: each extension config's name and the type of its filter, by type
/// then name.
fn ecds(r: &Resources) -> String {
    let mut rows: Vec<Vec<String>> = r
        .extension_configs
        .iter()
        .map(|s| {
            let kind = s.message.typed_config.as_ref().map_or("", |a| {
                a.type_url
                    .strip_prefix("type.googleapis.com/")
                    .unwrap_or(&a.type_url)
            });
            vec![s.name.clone(), kind.to_string()]
        })
        .collect();
    rows.sort_by(|a, b| (&a[1], &a[0]).cmp(&(&b[1], &b[0])));
    crate::cli::table::render(&["ECDS NAME", "TYPE"], &rows, crate::cli::table::WIDE)
}

fn json_list<'a, T: 'a>(served: impl Iterator<Item = &'a Served<T>>) -> anyhow::Result<Value> {
    let list: Result<Vec<Value>, json::JsonError> =
        served.map(|s| json::to_json(&s.name, &s.any)).collect();
    Ok(Value::Array(list?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Test {
        #[command(subcommand)]
        command: ProxyConfigCommand,
    }

    #[test]
    fn ecds_rows_are_name_and_filter_type_by_type_then_name() {
        use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
        use envoy_types::pb::google::protobuf::Any;
        let config = |name: &str, type_url: &str| {
            let message = TypedExtensionConfig {
                name: name.into(),
                typed_config: Some(Any {
                    type_url: type_url.into(),
                    value: Vec::new(),
                }),
            };
            Served {
                name: name.into(),
                any: Any::default(),
                message,
            }
        };
        let wasm = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
        let resources = Resources {
            extension_configs: vec![
                config("extensions.istio.io/trafficextension/shop.b", wasm),
                config("extensions.istio.io/trafficextension/shop.a", wasm),
                config(
                    "shop.header",
                    "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                ),
            ],
            ..Default::default()
        };
        let text = ecds(&resources);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("ECDS NAME") && lines[0].contains("TYPE"),
            "{text}"
        );
        assert!(
            lines[1].starts_with("shop.header") && lines[1].contains("lua.v3.Lua"),
            "{text}"
        );
        assert!(
            lines[2].starts_with("extensions.istio.io/trafficextension/shop.a"),
            "{text}"
        );
        assert!(
            lines[3].starts_with("extensions.istio.io/trafficextension/shop.b"),
            "{text}"
        );
    }

    #[test]
    fn the_agent_is_positional_or_a_flag() {
        let t =
            Test::try_parse_from(["t", "cluster", "127.0.0.1:15000", "--port", "9080"]).unwrap();
        let ProxyConfigCommand::Cluster(a) = t.command else {
            panic!("a cluster command")
        };
        assert_eq!(a.target.agent.as_deref(), Some("127.0.0.1:15000"));
        assert_eq!(a.filter.port, Some(9080));
        let t = Test::try_parse_from(["t", "routes", "--agent", "a:1", "-o", "json"]).unwrap();
        let ProxyConfigCommand::Route(a) = t.command else {
            panic!("a route command")
        };
        assert_eq!(a.target.agent_flag.as_deref(), Some("a:1"));
        assert_eq!(a.target.output, Output::Json);
        assert!(Test::try_parse_from(["t", "listener", "x:1", "-o", "yaml"]).is_ok());
        assert!(Test::try_parse_from(["t", "listener", "x:1", "-o", "xml"]).is_err());
        let given = |args: &[&str]| {
            let t = Test::try_parse_from(args).unwrap();
            let ProxyConfigCommand::Cluster(a) = t.command else {
                panic!("a cluster command")
            };
            a.target.given().map_err(|e| e.to_string())
        };
        assert_eq!(
            given(&["t", "cluster", "reviews-v1", "-n", "shop"]).unwrap(),
            "reviews-v1.shop"
        );
        assert_eq!(
            given(&["t", "cluster", "reviews-v1.shop"]).unwrap(),
            "reviews-v1.shop"
        );
        let address = given(&["t", "cluster", "127.0.0.1:15000", "-n", "shop"]).unwrap_err();
        assert!(address.contains("drop -n"), "{address}");
    }
}
