//! [`ConnectionPoolSettings`]: circuit-breaker limits and connection options towards upstream hosts.

use serde::{Deserialize, Serialize};

use crate::common::Duration;
use crate::proto_enum;

/// Limits on the connections and requests to one upstream host (Envoy's circuit breakers and
/// connection options). Also used by Sidecar for inbound connections.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConnectionPoolSettings {
    /// Settings common to HTTP and TCP connections.
    #[serde(default)]
    pub tcp: Option<TcpSettings>,
    /// HTTP/1.1 and HTTP/2 limits.
    #[serde(default)]
    pub http: Option<HttpSettings>,
}

/// Connection limits and socket options for TCP-level upstream connections.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TcpSettings {
    /// Most HTTP/1.1 or TCP connections to one destination host (0: Envoy's default).
    #[serde(default)]
    pub max_connections: i32,
    /// How long to wait for a TCP connection to be established.
    #[serde(default)]
    pub connect_timeout: Option<Duration>,
    /// SO_KEEPALIVE and its parameters on upstream sockets.
    #[serde(default)]
    pub tcp_keepalive: Option<TcpKeepalive>,
    /// Longest life of a connection, counted from its start.
    #[serde(default)]
    pub max_connection_duration: Option<Duration>,
    /// How long a connection may sit without traffic before it is closed; `0s` disables it.
    #[serde(default)]
    pub idle_timeout: Option<Duration>,
}

/// TCP keepalive probing of idle upstream connections.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TcpKeepalive {
    /// Unanswered probes before the connection is considered dead (0: the OS default).
    #[serde(default)]
    pub probes: u32,
    /// Idle time before the first probe.
    #[serde(default)]
    pub time: Option<Duration>,
    /// Time between probes.
    #[serde(default)]
    pub interval: Option<Duration>,
}

proto_enum! {
    /// Whether HTTP/1.1 connections to the destination are upgraded to HTTP/2.
    pub enum H2UpgradePolicy {
        /// Use the mesh-wide default.
        Default = 0 => "DEFAULT",
        DoNotUpgrade = 1 => "DO_NOT_UPGRADE",
        Upgrade = 2 => "UPGRADE",
    }
}

/// Request limits and options for HTTP upstream connections.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpSettings {
    /// Most requests queued while waiting for a connection (0: Envoy's default).
    #[serde(default)]
    pub http1_max_pending_requests: i32,
    /// Most concurrent requests to the destination (0: Envoy's default).
    #[serde(default)]
    pub http2_max_requests: i32,
    /// Requests per connection before it is closed (0: unlimited, 1: no keep-alive).
    #[serde(default)]
    pub max_requests_per_connection: i32,
    /// Most retries outstanding to the whole cluster at once (0: Envoy's default).
    #[serde(default)]
    pub max_retries: i32,
    /// How long a pooled connection may stay without active requests.
    #[serde(default)]
    pub idle_timeout: Option<Duration>,
    #[serde(default)]
    pub h2_upgrade_policy: H2UpgradePolicy,
    /// Speak to the upstream in the protocol the client used (HTTP/1.1 or HTTP/2).
    #[serde(default)]
    pub use_client_protocol: bool,
    /// Most concurrent streams on one HTTP/2 connection (0: Envoy's default).
    #[serde(default)]
    pub max_concurrent_streams: i32,
    /// HTTP/2 PING keepalive of upstream connections.
    #[serde(default)]
    pub http2_keep_alive: Option<ConnectionKeepalive>,
}

/// HTTP/2 PING keepalive: how often to ping and how long to wait for the answer.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConnectionKeepalive {
    #[serde(default)]
    pub interval: Option<Duration>,
    #[serde(default)]
    pub timeout: Option<Duration>,
}
