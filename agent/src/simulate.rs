//! A traffic simulator: walks one request (a [`Call`]) through generated Envoy resources the way
//! Envoy would, and reports the listener, filter chain, route configuration, virtual host, route
//! and cluster it went through, or the [`TrafficError`] that stopped it. It reads nothing but the
//! resources, so the same walk checks a translator against expectations written for istiod (the
//! conformance corpus's simulation cases) and answers a user's "where would this request go?".
//!
//! The walk, in order:
//! 1. the listener: `virtualInbound` for captured inbound calls; otherwise the one bound to the
//!    call's address and port, then to `0.0.0.0` and the port, then `virtualOutbound`;
//! 2. the listener filters: without an active TLS inspector the offered ALPN is not seen and every
//!    connection is raw; an active HTTP inspector gives plaintext HTTP an ALPN (`chain`);
//! 3. the filter chain, narrowed criterion by criterion (`chain`);
//! 4. the transport: plaintext into a TLS-terminating chain, or (m)TLS that does not match what
//!    the chain demands, fails;
//! 5. an HTTP connection manager: virtual host, then route (`http`); or
//! 6. a TCP proxy: its cluster.
//!
//! Only paths are matched on routes (not headers, query parameters or methods), and source
//! address criteria of filter chains are ignored, as in the reference simulator the expectations
//! were written against.

mod chain;
pub(crate) mod http;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::net::IpAddr;

use envoy_types::pb::envoy::config::core::v3::transport_socket;
use envoy_types::pb::envoy::config::listener::v3::{FilterChain, Listener, filter};
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::config::route::v3::virtual_host::TlsRequirementType;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::tcp_proxy::ClusterSpecifier;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext;
use envoy_types::pb::google::protobuf::Any;
use prost::{Message, Name};
use serde::{Deserialize, Serialize};

use crate::resource::Resources;

pub use http::route_table;

/// The listener captured inbound traffic lands on.
pub const VIRTUAL_INBOUND: &str = "virtualInbound";
/// The listener captured outbound traffic lands on when no listener binds its address and port.
pub const VIRTUAL_OUTBOUND: &str = "virtualOutbound";

/// The application protocol a call speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// HTTP/1.1.
    Http,
    Http2,
    /// Opaque bytes.
    Tcp,
}

impl Protocol {
    fn is_http(self) -> bool {
        matches!(self, Protocol::Http | Protocol::Http2)
    }
}

/// How a call wraps its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    #[default]
    Plaintext,
    /// TLS the application originates.
    Tls,
    /// Istio mutual TLS, as a sidecar originates it.
    Mtls,
}

/// How the call reaches the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CallMode {
    /// Sent to the proxy's own address (no traffic capture), as to a gateway.
    Gateway,
    /// Captured on its way out of the workload.
    Outbound,
    /// Captured on its way into the workload (lands on `virtualInbound`).
    Inbound,
}

/// A simulated request. Every field is optional; [`Call::with_defaults`] fills what is left out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Call {
    /// Destination IP (default `1.3.3.7`, an address no listener binds).
    pub address: String,
    /// Destination port.
    pub port: u16,
    /// Request path (default `/`).
    pub path: String,
    pub protocol: Option<Protocol>,
    pub tls: TlsMode,
    /// ALPN offered in the TLS handshake (default: from protocol and TLS mode).
    pub alpn: String,
    /// Host header (`:authority`).
    pub host: String,
    /// TLS server name (default for `tls`: the host).
    pub sni: String,
    /// Extra request headers.
    pub headers: BTreeMap<String, Vec<String>>,
    /// None behaves like [`CallMode::Outbound`].
    pub mode: Option<CallMode>,
    /// The SDS certificate name that marks a filter chain as Istio mutual TLS (default `default`,
    /// the workload certificate).
    pub mtls_secret_config_name: String,
}

/// The address a call goes to when it names none.
pub const DEFAULT_ADDRESS: &str = "1.3.3.7";
/// The workload certificate's SDS name.
pub const WORKLOAD_CERTIFICATE: &str = "default";

impl Call {
    /// The call with its defaults applied: address `1.3.3.7`, path `/`, the SNI of a `tls` call
    /// from its host, the ALPN of a TLS call from its protocol (`http/1.1`, `h2`, none for `tls`;
    /// `istio-http/1.1`, `istio-h2`, `istio` for `mtls`), the mTLS certificate name `default`.
    pub fn with_defaults(&self) -> Call {
        let mut c = self.clone();
        if c.address.is_empty() {
            c.address = DEFAULT_ADDRESS.into();
        }
        if c.path.is_empty() {
            c.path = "/".into();
        }
        if c.sni.is_empty() && c.tls == TlsMode::Tls {
            c.sni = c.host.clone();
        }
        if c.alpn.is_empty() {
            c.alpn = match (c.tls, c.protocol) {
                (TlsMode::Plaintext, _) => "",
                (TlsMode::Tls, Some(Protocol::Http)) => "http/1.1",
                (TlsMode::Tls, Some(Protocol::Http2)) => "h2",
                (TlsMode::Tls, _) => "",
                (TlsMode::Mtls, Some(Protocol::Http)) => "istio-http/1.1",
                (TlsMode::Mtls, Some(Protocol::Http2)) => "istio-h2",
                (TlsMode::Mtls, _) => "istio",
            }
            .into();
        }
        if c.mtls_secret_config_name.is_empty() {
            c.mtls_secret_config_name = WORKLOAD_CERTIFICATE.into();
        }
        c
    }

    /// The Host header: `host`, else the first `Host` in `headers`.
    fn host_header(&self) -> &str {
        if !self.host.is_empty() {
            return &self.host;
        }
        self.headers
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case("host"))
            .and_then(|(_, values)| values.first())
            .map_or("", String::as_str)
    }
}

/// Why a call did not get through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
pub enum TrafficError {
    #[error("no listener matched")]
    NoListener,
    #[error("no filter chain matched and the listener has no default filter chain")]
    NoFilterChain,
    #[error("more than one filter chain matched")]
    MultipleFilterChain,
    #[error("plaintext sent to a filter chain that terminates TLS")]
    #[serde(rename = "TLSError")]
    TlsError,
    #[error("the call's TLS and the filter chain disagree on Istio mutual TLS")]
    #[serde(rename = "MTLSError")]
    MtlsError,
    #[error(
        "protocol error: TLS or raw TCP sent to an HTTP connection manager that does not terminate it"
    )]
    ProtocolError,
    #[error("no virtual host matched the Host header")]
    NoVirtualHost,
    #[error("the virtual host requires TLS (the client gets a redirect)")]
    #[serde(rename = "TLSRedirect")]
    TlsRedirect,
    #[error("no route matched the path")]
    NoRoute,
}

/// The TLS a filter chain terminates: its first SDS certificate and whether it requires a client
/// certificate.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChainTls {
    #[serde(default)]
    pub certificate_sds_secret: String,
    #[serde(default)]
    pub require_client_certificate: bool,
}

/// Where a call went: the names of the objects it passed (empty: not reached, or unnamed), and
/// the error that stopped it, if any.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Outcome {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<TrafficError>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub listener: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub filter_chain: String,
    /// The RDS name (empty for an inline route configuration).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub route_config: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub virtual_host: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub route: String,
    /// The single target cluster (empty for weighted clusters, redirects and direct responses).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub cluster: String,
    /// A route that splits traffic: each cluster with its weight, in the route's order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub weighted_clusters: Vec<WeightedCluster>,
    /// The TLS the matched filter chain terminates, if it does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter_chain_tls: Option<ChainTls>,
}

/// One cluster of a route's weighted split.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WeightedCluster {
    pub name: String,
    pub weight: u32,
}

impl Outcome {
    fn stopped(mut self, error: TrafficError) -> Outcome {
        self.error = Some(error);
        self
    }
}

/// A call that cannot be simulated, or resources the simulator cannot read.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    #[error(
        "invalid call: ALPN {alpn:?} is only offered in a TLS handshake; set tls to tls or mtls, or drop alpn"
    )]
    AlpnWithoutTls { alpn: String },
    #[error("invalid call: address {address:?} is not an IP address")]
    Address { address: String },
    #[error("{at}: cannot decode {type_url}: {source}")]
    Decode {
        at: String,
        type_url: String,
        #[source]
        source: prost::DecodeError,
    },
    #[error("{at}: expected a typed config of {expected}, found {found:?}")]
    UnexpectedType {
        at: String,
        expected: String,
        found: String,
    },
    #[error("{at}: prefix range {prefix}/{len} is not a CIDR range")]
    Cidr {
        at: String,
        prefix: String,
        len: u32,
    },
    #[error("{at}: invalid regular expression {regex:?}: {source}")]
    Regex {
        at: String,
        regex: String,
        #[source]
        source: Box<regex::Error>,
    },
    #[error(
        "{at}: the route has no path matcher the simulator knows (prefix, path, path-separated prefix, safe regex)"
    )]
    PathMatcher { at: String },
}

/// Walks `call` through `resources` (see the module documentation for the steps).
pub fn simulate(resources: &Resources, call: &Call) -> Result<Outcome, SimulateError> {
    let call = call.with_defaults();
    if !call.alpn.is_empty() && call.tls == TlsMode::Plaintext {
        return Err(SimulateError::AlpnWithoutTls { alpn: call.alpn });
    }
    let ip: IpAddr = call.address.parse().map_err(|_| SimulateError::Address {
        address: call.address.clone(),
    })?;
    let mut out = Outcome::default();

    // 1. The listener.
    let Some(listener) = pick_listener(resources, &call) else {
        return Ok(out.stopped(TrafficError::NoListener));
    };
    out.listener = listener.name.clone();
    let at = format!("listener {:?}", listener.name);

    // 2. Listener filters.
    let tls_inspector = chain::inspector_active(listener, chain::Inspector::Tls, call.port, &at)?;
    let mut alpn = if tls_inspector {
        call.alpn.clone()
    } else {
        String::new()
    };
    if call.tls == TlsMode::Plaintext
        && chain::inspector_active(listener, chain::Inspector::Http, call.port, &at)?
    {
        match call.protocol {
            Some(Protocol::Http) => alpn = "http/1.1".into(),
            Some(Protocol::Http2) => alpn = "h2c".into(),
            _ => {}
        }
    }

    // 3. The filter chain.
    let traffic = chain::Traffic {
        port: call.port,
        ip,
        sni: &call.sni,
        tls: call.tls,
        alpn: &alpn,
        tls_inspector,
    };
    let fc = match chain::select(listener, &traffic, &at)? {
        Ok(fc) => fc,
        Err(e) => return Ok(out.stopped(e)),
    };
    out.filter_chain = fc.name.clone();
    let at = format!("{at}, filter chain {:?}", fc.name);

    // 4. Transport.
    let tls = terminated_tls(fc, &at)?;
    out.filter_chain_tls = tls.clone();
    if let Some(tls) = &tls {
        if call.tls == TlsMode::Plaintext {
            return Ok(out.stopped(TrafficError::TlsError));
        }
        let istio_mtls = tls.certificate_sds_secret == call.mtls_secret_config_name
            && tls.require_client_certificate;
        if istio_mtls != (call.tls == TlsMode::Mtls) {
            return Ok(out.stopped(TrafficError::MtlsError));
        }
    }

    // 5. HTTP connection manager.
    if let Some(hcm) = network_filter::<HttpConnectionManager>(fc, &at)? {
        if call.tls != TlsMode::Plaintext && tls.is_none() {
            return Ok(out.stopped(TrafficError::ProtocolError));
        }
        if !call.protocol.is_some_and(Protocol::is_http) {
            return Ok(out.stopped(TrafficError::ProtocolError));
        }
        let route_config: Option<&RouteConfiguration> = match &hcm.route_specifier {
            Some(RouteSpecifier::RouteConfig(rc)) => Some(rc),
            Some(RouteSpecifier::Rds(rds)) => {
                out.route_config = rds.route_config_name.clone();
                resources.routes.get(&rds.route_config_name)
            }
            _ => None,
        };
        let Some(vh) = route_config.and_then(|rc| http::virtual_host(rc, call.host_header()))
        else {
            return Ok(out.stopped(TrafficError::NoVirtualHost));
        };
        out.virtual_host = vh.name.clone();
        if vh.require_tls == TlsRequirementType::All as i32 && call.tls == TlsMode::Plaintext {
            return Ok(out.stopped(TrafficError::TlsRedirect));
        }
        let at = format!("{at}, virtual host {:?}", vh.name);
        let Some(route) = http::route(vh, &call.path, &at)? else {
            return Ok(out.stopped(TrafficError::NoRoute));
        };
        out.route = route.name.clone();
        out.cluster = http::single_cluster(route).unwrap_or_default().to_string();
        out.weighted_clusters = http::weighted_clusters(route);
    } else if let Some(tcp) = network_filter::<TcpProxy>(fc, &at)? {
        // 6. TCP proxy.
        if let Some(ClusterSpecifier::Cluster(cluster)) = tcp.cluster_specifier {
            out.cluster = cluster;
        }
    }
    Ok(out)
}

fn pick_listener<'a>(resources: &'a Resources, call: &Call) -> Option<&'a Listener> {
    if call.mode == Some(CallMode::Inbound) {
        return resources.listeners.get(VIRTUAL_INBOUND);
    }
    let bound_to = |address: &str| {
        resources
            .listeners
            .values()
            .find(|l| chain::socket_address(l) == Some((address, u32::from(call.port))))
    };
    bound_to(&call.address)
        .or_else(|| bound_to("0.0.0.0"))
        .or_else(|| resources.listeners.get(VIRTUAL_OUTBOUND))
}

/// The TLS a chain terminates: `None` without a transport socket.
fn terminated_tls(fc: &FilterChain, at: &str) -> Result<Option<ChainTls>, SimulateError> {
    let Some(socket) = &fc.transport_socket else {
        return Ok(None);
    };
    let at = format!("{at}, transport socket");
    let context = match &socket.config_type {
        Some(transport_socket::ConfigType::TypedConfig(any)) => {
            unpack::<DownstreamTlsContext>(any, &at)?
        }
        None => None,
    };
    let Some(context) = context else {
        let found = match &socket.config_type {
            Some(transport_socket::ConfigType::TypedConfig(any)) => any.type_url.clone(),
            None => String::new(),
        };
        return Err(SimulateError::UnexpectedType {
            at,
            expected: DownstreamTlsContext::full_name(),
            found,
        });
    };
    let certificate_sds_secret = context
        .common_tls_context
        .as_ref()
        .and_then(|c| c.tls_certificate_sds_secret_configs.first())
        .map(|s| s.name.clone())
        .unwrap_or_default();
    Ok(Some(ChainTls {
        certificate_sds_secret,
        require_client_certificate: context.require_client_certificate.is_some_and(|b| b.value),
    }))
}

/// The first network filter of the chain whose typed config is a `T`.
fn network_filter<T: Message + Name + Default>(
    fc: &FilterChain,
    at: &str,
) -> Result<Option<T>, SimulateError> {
    for (i, f) in fc.filters.iter().enumerate() {
        if let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type
            && let Some(found) = unpack::<T>(any, &format!("{at}, filter {i} ({:?})", f.name))?
        {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

/// Decodes `any` when it holds a `T` (by type URL); `None` when it holds something else.
fn unpack<T: Message + Name + Default>(any: &Any, at: &str) -> Result<Option<T>, SimulateError> {
    let type_name = any.type_url.rsplit('/').next().unwrap_or_default();
    if type_name != T::full_name() {
        return Ok(None);
    }
    T::decode(any.value.as_slice())
        .map(Some)
        .map_err(|source| SimulateError::Decode {
            at: at.to_string(),
            type_url: any.type_url.clone(),
            source,
        })
}
