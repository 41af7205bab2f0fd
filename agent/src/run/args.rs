//! `pasa-agent`'s command line: the agent's flags ([`AgentArgs`]), those for the Envoy it may run
//! ([`EnvoyRunArgs`]) and the mesh settings translation depends on ([`MeshArgs`]), with Istio's
//! defaults.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use pasa_istio::proxy_config::MeshProxyConfig;

use crate::credentials::CredentialArgs;
use crate::identity::IdentityArgs;
use crate::mesh::{MeshSettings, OutboundPolicy};
use crate::report::ReportArgs;

/// The PASA agent: follows its proxy's slice of the store, translates it to xDS and serves it
/// over ADS on a Unix socket.
#[derive(clap::Parser, Debug)]
#[command(name = "pasa-agent", version, args_conflicts_with_subcommands = true)]
pub struct AgentArgs {
    #[command(subcommand)]
    pub command: Option<AgentCommand>,
    /// The store (or PCP) to follow, `host:port` or a URL; several, comma-separated, are
    /// replicas of one store, used one at a time (the next when one cannot be reached).
    #[arg(long, env = "PASA_SERVER", default_value = "127.0.0.1:7400")]
    pub server: String,
    /// The Unix socket the ADS server listens on.
    #[arg(long, env = "PASA_UDS", default_value = "/var/run/pasa/xds.sock")]
    pub uds: PathBuf,
    /// Also serve ADS (plaintext gRPC) on this loopback TCP address: where Istio's pilot-agent
    /// forwards its Envoy's xDS when its `discoveryAddress` names it (the injection next to
    /// `istio-proxy` uses 127.0.0.1:15011). Loopback only: the pod's other containers reach it,
    /// nothing outside the pod does.
    #[arg(long, env = "PASA_XDS_LISTEN", value_parser = loopback_address)]
    pub xds_listen: Option<SocketAddr>,
    /// Where kubelet probes the app through the agent: `/app-health/<container>/<kind>` runs the
    /// app's original probe given in --app-probers (the standalone injection uses 0.0.0.0:15020,
    /// a port Istio's capture leaves alone).
    #[arg(long, env = "PASA_STATUS_LISTEN")]
    pub status_listen: Option<SocketAddr>,
    /// The app's original probes, a JSON map from `/app-health/<container>/<kind>` to the probe
    /// (`httpGet` or `tcpSocket`, `timeoutSeconds`), as the injector writes it.
    #[arg(long, env = "PASA_APP_PROBERS", requires = "status_listen")]
    pub app_probers: Option<String>,
    /// Where the last complete copy of the proxy's configuration is kept, so a restarted agent
    /// can serve while the store is away. Nothing is kept when not set.
    #[arg(long, env = "PASA_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Address of /healthz, /readyz, /healthz/ready, /sync_status, /config_dump, /metrics and
    /// /simulate [default: 127.0.0.1:15000; 127.0.0.1:15020 with --envoy, whose admin takes
    /// 15000].
    #[arg(long, env = "PASA_ADMIN")]
    pub admin: Option<SocketAddr>,
    #[command(flatten)]
    pub identity: IdentityArgs,
    #[command(flatten)]
    pub mesh: MeshArgs,
    #[command(flatten)]
    pub report: ReportArgs,
    #[command(flatten)]
    pub credentials: CredentialArgs,
    #[command(flatten)]
    pub envoy_run: EnvoyRunArgs,
    #[command(flatten)]
    pub envoy: crate::bootstrap::EnvoyArgs,
    /// How long one translation may take before it is logged and counted
    /// (`pasa_agent_translations_over_budget_total`). Translation runs on its own thread: while
    /// it runs, clients keep the last config published and the agent keeps serving.
    #[arg(long, env = "PASA_TRANSLATION_BUDGET", default_value = "5s", value_parser = pasa_proto::duration::parse)]
    pub translation_budget: Duration,
    /// Who fetches the Wasm modules of WasmPlugins and TrafficExtensions that are not files in
    /// the pod: `agent` (the agent, over HTTP(S), into --cache-dir) or `pilot-agent` (Istio's
    /// proxy agent in front of Envoy, as for istiod: the agent sends the modules' URLs).
    #[arg(long, env = "PASA_WASM_FETCHER", default_value = "agent", value_parser = ["agent", "pilot-agent"])]
    pub wasm_fetcher: String,
    /// The Envoy build the agent serves: `envoy` (upstream Envoy, as the agent runs it) or
    /// `istio` (Istio's proxy, next to `istio-proxy`): only Istio's has the filters of Istio's
    /// standard metrics and metadata exchange, which the agent then sends as istiod does.
    #[arg(long, env = "PASA_PROXY_BUILD", value_enum, default_value = "envoy")]
    pub proxy_build: ProxyBuildArg,
    /// Keep clients on one endpoint of a service labelled `istio.io/persistent-session` (a
    /// cookie) or `istio.io/persistent-session-header` with Envoy's stateful session filter, as
    /// istiod with the same variable (off by default, as there). Draining endpoints are kept
    /// for such services either way.
    #[arg(long, env = "PILOT_ENABLE_PERSISTENT_SESSION_FILTER")]
    pub persistent_session_filter: bool,
    /// Which services the proxy holds: `eager`, every service it may see (Istio's scope: its
    /// Sidecar's, else the whole mesh); `on-demand`, only those its application calls, learned
    /// from the hosts Envoy asks for (VHDS and on-demand CDS over delta ADS; see
    /// docs/on-demand.md). Only Envoy over delta ADS takes `on-demand`: the agent's own
    /// bootstrap then asks with DELTA_GRPC, and state-of-the-world or proxyless gRPC clients
    /// are refused, saying so.
    #[arg(long, env = "PASA_SCOPE", value_enum, default_value = "eager")]
    pub scope: Scope,
    /// On-demand scope: how long a learned host may go unused before it is forgotten (its
    /// routes and clusters taken from Envoy, its store subscription dropped; asked for again,
    /// it is learned again). Envoy's use is read from its admin endpoint (`--envoy-admin`).
    #[arg(long, env = "PASA_ON_DEMAND_IDLE", default_value = "1h", value_parser = pasa_proto::duration::parse)]
    pub on_demand_idle: Duration,
    /// How long the store watch may bring nothing, not even the store's progress marker (sent
    /// every `--progress-interval-secs` of the store, 10 s by default), before the agent takes
    /// it as lost: it is then degraded and reconnects. Keep it at a few progress intervals.
    #[arg(long, env = "PASA_STORE_LIVENESS", default_value = "30s", value_parser = pasa_proto::duration::parse)]
    pub store_liveness: Duration,
    /// Log as JSON lines.
    #[arg(long)]
    pub log_json: bool,
}

/// `--scope`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Eager,
    OnDemand,
}

/// Running Envoy as the agent's child.
#[derive(clap::Args, Debug, Clone)]
pub struct EnvoyRunArgs {
    /// Run this Envoy binary as the agent's child, on the bootstrap `pasa-agent bootstrap` would
    /// print (written beside --uds as envoy-rev.json); drained and stopped on SIGTERM. As with
    /// pilot-agent, if it cannot start or exits, the agent exits too (non-zero, with Envoy's
    /// status), and the pod's restart policy starts both again.
    #[arg(long = "envoy", env = "PASA_ENVOY_BINARY")]
    pub binary: Option<PathBuf>,
    /// How long Envoy's listeners drain on SIGTERM before it is stopped; unset, the proxy
    /// config's `terminationDrainDuration`, else 5s (as pilot-agent).
    #[arg(long, env = "TERMINATION_DRAIN_DURATION", value_parser = pasa_proto::duration::parse)]
    pub drain_duration: Option<Duration>,
    /// Envoy's log level.
    #[arg(long, env = "PASA_ENVOY_LOG_LEVEL", default_value = "warning")]
    pub envoy_log_level: String,
    /// Envoy's worker threads (0: one per core); unset, the proxy config's `concurrency`, else
    /// the container's CPU limit (--cpu-limit), else 2.
    #[arg(long, env = "ISTIO_META_PROXY_CONCURRENCY")]
    pub envoy_concurrency: Option<u32>,
    /// The container's CPU limit in whole cores, rounded up (Kubernetes' downward API
    /// `limits.cpu`, as Istio's injection sets it): Envoy's worker threads when nothing else
    /// says.
    #[arg(long, env = "ISTIO_CPU_LIMIT")]
    pub cpu_limit: Option<u32>,
}

impl EnvoyRunArgs {
    /// Envoy's worker threads, decided as pilot-agent decides them: the flag, else `settings`'
    /// `concurrency`, else the CPU limit, else 2.
    pub fn concurrency(&self, settings: &MeshProxyConfig) -> u32 {
        self.envoy_concurrency
            .or_else(|| settings.concurrency())
            .or(self.cpu_limit.filter(|c| *c > 0))
            .unwrap_or(2)
    }

    /// How long Envoy drains on shutdown: the flag, else `settings`', else 5s.
    pub fn drain(&self, settings: &MeshProxyConfig) -> Duration {
        self.drain_duration
            .or_else(|| settings.termination_drain_duration())
            .unwrap_or(Duration::from_secs(5))
    }
}

/// What `pasa-agent` does besides running (the default).
#[derive(clap::Subcommand, Debug)]
pub enum AgentCommand {
    /// Print the Envoy bootstrap for this node (JSON), as pilot-agent writes it: ADS over the
    /// agent's socket, SDS, admin, Prometheus and readiness listeners.
    Bootstrap(crate::bootstrap::BootstrapArgs),
}

/// The mesh settings translation depends on, with Istio's defaults.
#[derive(clap::Args, Debug, Clone)]
pub struct MeshArgs {
    /// Where mesh-wide Sidecars and DestinationRules live (MeshConfig `rootNamespace`).
    #[arg(long, env = "PASA_ROOT_NAMESPACE", default_value = "istio-system")]
    pub root_namespace: String,
    /// The cluster's DNS suffix.
    #[arg(long, env = "PASA_DOMAIN_SUFFIX", default_value = "cluster.local")]
    pub domain_suffix: String,
    /// What sidecars do with traffic to unknown destinations (MeshConfig
    /// `outboundTrafficPolicy.mode`).
    #[arg(
        long,
        env = "PASA_OUTBOUND_TRAFFIC_POLICY",
        value_enum,
        default_value = "ALLOW_ANY"
    )]
    pub outbound_traffic_policy: OutboundTrafficPolicy,
}

/// `--proxy-build`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyBuildArg {
    Envoy,
    Istio,
}

/// `--outbound-traffic-policy`, spelled as in MeshConfig.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutboundTrafficPolicy {
    #[value(name = "ALLOW_ANY")]
    AllowAny,
    #[value(name = "REGISTRY_ONLY")]
    RegistryOnly,
    #[value(name = "ALLOW_ANY_DYNAMIC_DNS")]
    AllowAnyDynamicDns,
}

impl MeshArgs {
    pub fn settings(&self) -> MeshSettings {
        MeshSettings {
            root_namespace: self.root_namespace.clone(),
            domain_suffix: self.domain_suffix.clone(),
            outbound_policy: match self.outbound_traffic_policy {
                OutboundTrafficPolicy::AllowAny => OutboundPolicy::AllowAny,
                OutboundTrafficPolicy::RegistryOnly => OutboundPolicy::RegistryOnly,
                OutboundTrafficPolicy::AllowAnyDynamicDns => OutboundPolicy::AllowAnyDynamicDns,
            },
            ..MeshSettings::default()
        }
    }
}

/// `--xds-listen`: an `ip:port` on a loopback address.
fn loopback_address(value: &str) -> Result<SocketAddr, String> {
    let addr: SocketAddr = value
        .parse()
        .map_err(|e| format!("{value:?} is not an ip:port address: {e}"))?;
    if !addr.ip().is_loopback() {
        return Err(format!(
            "{addr} is not a loopback address: ADS without TLS is served inside the pod only"
        ));
    }
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::path::Path;

    #[test]
    fn defaults_are_istios() {
        let args = AgentArgs::try_parse_from([
            "pasa-agent",
            "--node-id",
            "sidecar~10.0.0.1~a.default~default.svc.cluster.local",
        ])
        .unwrap();
        assert_eq!(args.uds, Path::new("/var/run/pasa/xds.sock"));
        assert_eq!(
            args.admin, None,
            "15000, or 15020 beside an Envoy the agent runs"
        );
        assert_eq!(args.server, "127.0.0.1:7400");
        assert_eq!(args.mesh.settings(), MeshSettings::default());
        let strict = AgentArgs::try_parse_from([
            "pasa-agent",
            "--node-id",
            "x",
            "--outbound-traffic-policy",
            "REGISTRY_ONLY",
        ])
        .unwrap();
        assert_eq!(
            strict.mesh.settings().outbound_policy,
            OutboundPolicy::RegistryOnly
        );
    }
}
