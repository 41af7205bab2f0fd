//! Istio node IDs: `type~ip~id~domain`, e.g.
//! `sidecar~10.42.1.7~reviews-v1-x9k2q.default~default.svc.cluster.local`.

use std::fmt;
use std::net::IpAddr;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyType {
    Sidecar,
    Router,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeId {
    pub proxy_type: ProxyType,
    pub ip: IpAddr,
    /// `pod-name.namespace`.
    pub id: String,
    pub domain: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "node ID {input:?}: {reason} (expected type~ip~id~domain, e.g. sidecar~10.42.1.7~reviews-v1-x9k2q.default~default.svc.cluster.local)"
)]
pub struct NodeIdError {
    pub input: String,
    pub reason: String,
}

impl NodeId {
    pub fn parse(input: &str) -> Result<NodeId, NodeIdError> {
        let err = |reason: &str| NodeIdError {
            input: input.to_string(),
            reason: reason.to_string(),
        };
        let parts: Vec<&str> = input.split('~').collect();
        let [proxy_type, ip, id, domain] = parts[..] else {
            return Err(err(&format!("has {} parts, not 4", parts.len())));
        };
        let proxy_type = match proxy_type {
            "sidecar" => ProxyType::Sidecar,
            "router" => ProxyType::Router,
            other => {
                return Err(err(&format!(
                    "proxy type {other:?} is not sidecar or router"
                )));
            }
        };
        let ip = ip
            .parse()
            .map_err(|_| err(&format!("{ip:?} is not an IP address")))?;
        if id.is_empty() {
            return Err(err("the id part is empty"));
        }
        Ok(NodeId {
            proxy_type,
            ip,
            id: id.to_string(),
            domain: domain.to_string(),
        })
    }

    /// The namespace part of `pod-name.namespace`, if present.
    pub fn namespace(&self) -> Option<&str> {
        self.id.split_once('.').map(|(_, ns)| ns)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = match self.proxy_type {
            ProxyType::Sidecar => "sidecar",
            ProxyType::Router => "router",
        };
        write!(f, "{t}~{}~{}~{}", self.ip, self.id, self.domain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_istio_node_ids() {
        let n =
            NodeId::parse("sidecar~10.42.1.7~reviews-v1-x9k2q.default~default.svc.cluster.local")
                .unwrap();
        assert_eq!(n.proxy_type, ProxyType::Sidecar);
        assert_eq!(n.namespace(), Some("default"));
        assert_eq!(
            n.to_string(),
            "sidecar~10.42.1.7~reviews-v1-x9k2q.default~default.svc.cluster.local"
        );
        let r = NodeId::parse("router~::1~ingress-abc.istio-system~istio-system.svc.cluster.local")
            .unwrap();
        assert_eq!(r.proxy_type, ProxyType::Router);
        for bad in [
            "",
            "sidecar~10.0.0.1~x",
            "waypoint~1.2.3.4~a.b~d",
            "sidecar~nope~a.b~d",
            "sidecar~1.2.3.4~~d",
        ] {
            let e = NodeId::parse(bad).unwrap_err();
            assert!(e.to_string().contains("expected type~ip~id~domain"), "{e}");
        }
    }
}
