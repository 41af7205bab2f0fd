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
/// The route configuration an on-demand sidecar's `virtualOutbound` sends plaintext HTTP to,
/// for ports it has no listener for yet (see `docs/on-demand.md`, "Ports"): no virtual host of
/// its own, each asked for by VHDS as `on-demand/<host>:<port>`. Not an istiod name: istiod has
/// no on-demand scope.
pub const ON_DEMAND_ROUTE: &str = "on-demand";
/// The route of a service without a VirtualService.
pub const DEFAULT_ROUTE: &str = "default";

/// The name a cluster's stats go by (`alt_stat_name`), or a connection manager's stat prefix:
/// istiod ends them in `;` so that the bootstrap's tag regexes know where the name ends (a
/// cluster's name has dots) and report it as the `cluster_name` or `http_conn_manager_prefix`
/// tag.
pub fn delimited_stats(name: &str) -> String {
    format!("{name};")
}

/// `outbound|<port>|<subset>|<host>`.
pub fn outbound_cluster(port: u32, subset: &str, host: &str) -> String {
    join(&[
        "outbound|",
        Digits::of(port).as_str(),
        "|",
        subset,
        "|",
        host,
    ])
}

/// The port and host of a cluster named `<direction>|<port>|<subset>|<host>`, as istiod reads one.
pub fn parse_subset_cluster(name: &str) -> Option<(u32, &str)> {
    let mut parts = name.split('|');
    let direction = parts.next()?;
    let port = parts.next()?.parse().ok()?;
    let _subset = parts.next()?;
    let host = parts.next()?;
    ((direction == "outbound" || direction == "inbound") && parts.next().is_none())
        .then_some((port, host))
}

/// `inbound|<port>||`.
pub fn inbound_cluster(port: u32) -> String {
    format!("inbound|{port}||")
}

/// The SNI Istio mutual TLS uses towards a cluster: `outbound_.<port>_.<subset>_.<host>`.
pub fn istio_mutual_sni(port: u32, subset: &str, host: &str) -> String {
    join(&[
        "outbound_.",
        Digits::of(port).as_str(),
        "_.",
        subset,
        "_.",
        host,
    ])
}

/// A cluster name read as istiod reads one (`ParseSubsetKey`): `direction|port|subset|host`,
/// or `outbound_.port_.subset_.host` (SNI-DNAT); as far as it goes: (port, subset, host).
pub fn read_cluster(name: &str) -> (u32, &str, &str) {
    let sep = if name.starts_with("outbound_") || name.starts_with("inbound_") {
        "_."
    } else {
        "|"
    };
    let mut out = (0, "", "");
    let Some((_, rest)) = name.split_once(sep) else {
        return out;
    };
    let Some((port, rest)) = rest.split_once(sep) else {
        return out;
    };
    out.0 = port.parse().unwrap_or(0);
    let Some((subset, host)) = rest.split_once(sep) else {
        return out;
    };
    out.1 = subset;
    if !host.contains(sep) {
        out.2 = host;
    }
    out
}

/// `<address>_<port>`: listener names.
pub fn listener(address: &str, port: u32) -> String {
    format!("{address}_{port}")
}

/// `<host>:<port>`: virtual hosts and proxyless gRPC listeners.
pub fn host_port(host: &str, port: u32) -> String {
    join(&[host, ":", Digits::of(port).as_str()])
}

/// The parts, one after the other, in one allocation (names are built by the thousand per
/// translation; `format!` costs several times as much).
fn join(parts: &[&str]) -> String {
    let mut name = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for part in parts {
        name.push_str(part);
    }
    name
}

/// A number's decimal digits, written without allocating.
struct Digits {
    buf: [u8; 10],
    start: usize,
}

impl Digits {
    fn of(mut n: u32) -> Digits {
        let mut buf = [0u8; 10];
        let mut start = buf.len();
        loop {
            start -= 1;
            buf[start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        Digits { buf, start }
    }

    fn as_str(&self) -> &str {
        // Only ASCII digits were written.
        std::str::from_utf8(&self.buf[self.start..]).unwrap_or_default()
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_port_in_decimal() {
        assert_eq!(outbound_cluster(0, "", "a"), "outbound|0||a");
        assert_eq!(outbound_cluster(8080, "v1", "a.b"), "outbound|8080|v1|a.b");
        assert_eq!(
            istio_mutual_sni(u32::MAX, "s", "h"),
            "outbound_.4294967295_.s_.h"
        );
        assert_eq!(host_port("h", 9), "h:9");
    }
}
