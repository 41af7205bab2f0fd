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

/// The fall-through chain of an outbound listener: unmatched traffic goes where the outbound
/// traffic policy says.
pub const PASSTHROUGH_FILTER_CHAIN: &str = "PassthroughFilterChain";
/// `virtualOutbound`'s chain refusing traffic sent to its own port (it would loop).
pub const VIRTUAL_OUTBOUND_BLACKHOLE: &str = "virtualOutbound-blackhole";
/// `virtualOutbound`'s catch-all chain.
pub const VIRTUAL_OUTBOUND_CATCH_ALL_TCP: &str = "virtualOutbound-catchall-tcp";
/// `virtualInbound`'s chain refusing traffic sent to its own port.
pub const VIRTUAL_INBOUND_BLACKHOLE: &str = "virtualInbound-blackhole";
/// `virtualInbound`'s catch-all chain for plaintext HTTP.
pub const VIRTUAL_INBOUND_CATCH_ALL_HTTP: &str = "virtualInbound-catchall-http";
/// The catch-all virtual host and route under `ALLOW_ANY_DYNAMIC_DNS`.
pub const ALLOW_ANY_DYNAMIC_DNS: &str = "allow_any_dynamic_dns";
/// The dynamic forward proxy cluster unknown plaintext HTTP goes to under
/// `ALLOW_ANY_DYNAMIC_DNS`.
pub const ALLOW_ANY_DYNAMIC_DNS_CLUSTER: &str = "AllowAnyDynamicDNSCluster";
