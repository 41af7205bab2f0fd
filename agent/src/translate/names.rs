//! istiod's names for generated resources (clusters, listeners, route configurations, virtual
//! hosts), in one place.

pub const PASSTHROUGH_CLUSTER: &str = "PassthroughCluster";
pub const BLACK_HOLE_CLUSTER: &str = "BlackHoleCluster";
pub const INBOUND_PASSTHROUGH_CLUSTER: &str = "InboundPassthroughCluster";
pub const VIRTUAL_OUTBOUND: &str = "virtualOutbound";
pub const VIRTUAL_INBOUND: &str = "virtualInbound";
/// Port of the listener captured outbound traffic is redirected to.
pub const VIRTUAL_OUTBOUND_PORT: u32 = 15001;
/// Port of the listener captured inbound traffic is redirected to.
pub const VIRTUAL_INBOUND_PORT: u32 = 15006;
/// The catch-all virtual host when unknown destinations are allowed.
pub const ALLOW_ANY: &str = "allow_any";
/// The catch-all virtual host when only registered destinations are allowed.
pub const BLOCK_ALL: &str = "block_all";
/// The route of a service without a VirtualService.
pub const DEFAULT_ROUTE: &str = "default";

/// `outbound|<port>|<subset>|<host>`.
pub fn outbound_cluster(port: u32, subset: &str, host: &str) -> String {
    format!("outbound|{port}|{subset}|{host}")
}

/// `inbound|<port>||`.
pub fn inbound_cluster(port: u32) -> String {
    format!("inbound|{port}||")
}

/// The SNI Istio mutual TLS uses towards a cluster: `outbound_.<port>_.<subset>_.<host>`.
pub fn istio_mutual_sni(port: u32, subset: &str, host: &str) -> String {
    format!("outbound_.{port}_.{subset}_.{host}")
}

/// `<address>_<port>`: listener names.
pub fn listener(address: &str, port: u32) -> String {
    format!("{address}_{port}")
}

/// `<host>:<port>`: virtual hosts and proxyless gRPC listeners.
pub fn host_port(host: &str, port: u32) -> String {
    format!("{host}:{port}")
}

/// `inbound|http|<port>`: the virtual host of an inbound HTTP port.
pub fn inbound_virtual_host(port: u32) -> String {
    format!("inbound|http|{port}")
}
