//! The networks of a multi-network mesh as a proxy sees them: the gateways into each network
//! (istiod's `NetworkGateways`), and the proxy's own network, cluster and IP family. Endpoints
//! on a network the proxy cannot reach directly are reached through that network's gateways
//! ("split horizon", see `crate::translate::endpoint`).

use std::collections::BTreeMap;
use std::net::IpAddr;

use pasa_istio::mesh_networks::MeshNetworks;
use pasa_istio::service_endpoints::NetworkGateway;

/// A gateway into a network, in a cluster (empty: not said).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Gateway {
    pub network: String,
    pub cluster: String,
    pub address: String,
    pub port: u32,
    pub hbone_port: u32,
}

/// The IP families a proxy has addresses of: which gateways it can reach.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum IpFamily {
    V4,
    V6,
    Dual,
    /// Not known: every gateway is kept.
    #[default]
    Unknown,
}

impl IpFamily {
    /// The family of a proxy with these addresses (an IPv4-mapped IPv6 address counts as IPv4).
    pub fn of(ips: &[IpAddr]) -> IpFamily {
        let v4 = ips.iter().any(|ip| ip.to_canonical().is_ipv4());
        let v6 = ips.iter().any(|ip| ip.to_canonical().is_ipv6());
        match (v4, v6) {
            (true, true) => IpFamily::Dual,
            (true, false) => IpFamily::V4,
            (false, true) => IpFamily::V6,
            (false, false) => IpFamily::Unknown,
        }
    }

    /// Whether a proxy of this family reaches a gateway at `address`: an IPv4-only proxy
    /// IPv4 gateways, an IPv6-only one IPv6 gateways (a DNS name neither); a dual-stack proxy,
    /// or one of unknown family, every gateway.
    fn reaches(self, address: &str) -> bool {
        let ip = address.parse::<IpAddr>().ok().map(|ip| ip.to_canonical());
        match self {
            IpFamily::V4 => ip.is_some_and(|ip| ip.is_ipv4()),
            IpFamily::V6 => ip.is_some_and(|ip| ip.is_ipv6()),
            IpFamily::Dual | IpFamily::Unknown => true,
        }
    }
}

/// The network gateways of the mesh, and where the proxy is: what split-horizon EDS needs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Networks {
    /// The proxy's network (empty: none, which is "in every network").
    pub network: String,
    pub family: IpFamily,
    /// The networks whose endpoints the proxy takes (its requested view and its own); none:
    /// every network.
    view: Option<std::collections::BTreeSet<String>>,
    /// Every gateway, sorted, each once.
    gateways: Vec<Gateway>,
    /// The mesh config's networks: where endpoints that do not say their network are.
    mesh_networks: Option<MeshNetworks>,
    /// What every endpoint weight is multiplied by, so that the weight of an endpoint reached
    /// through gateways divides evenly among them.
    scale: u32,
}

impl Networks {
    /// The gateways of `gateways` (as Services state them, with their clusters) for a proxy on
    /// `network` with addresses of `family`. PCP writes gateways known by DNS name resolved,
    /// as istiod resolves them (see the multi-cluster guide); a name that still reaches an
    /// agent (an object written by hand) is left out, as istiod leaves out names that do not
    /// resolve: agents resolve nothing.
    pub fn new<'a>(
        network: &str,
        family: IpFamily,
        gateways: impl IntoIterator<Item = (&'a str, &'a NetworkGateway)>,
    ) -> Networks {
        let mut gateways: Vec<Gateway> = gateways
            .into_iter()
            .filter(|(_, g)| !g.network.is_empty() && g.address.parse::<IpAddr>().is_ok())
            .map(|(cluster, g)| Gateway {
                network: g.network.clone(),
                cluster: cluster.to_string(),
                address: g.address.clone(),
                port: g.port,
                hbone_port: g.hbone_port,
            })
            .collect();
        gateways.sort();
        gateways.dedup();
        let scale = scale_factor(&gateways);
        Networks {
            network: network.to_string(),
            family,
            view: None,
            gateways,
            mesh_networks: None,
            scale,
        }
    }

    /// The same, with the networks the mesh config states (`meshNetworks`): their gateways
    /// (by address, or the addresses the Service they name has in each cluster their endpoints
    /// come from, which `external` tells), and where endpoints that do not say their network
    /// are (see [`Networks::network_of`]).
    pub fn with_mesh_networks(
        mut self,
        mesh: Option<MeshNetworks>,
        external: impl Fn(&str, &str) -> Vec<String>,
    ) -> Networks {
        let Some(mesh) = mesh else { return self };
        for (name, network) in &mesh.networks {
            for g in &network.gateways {
                let at = |cluster: &str, address: &str| Gateway {
                    network: name.clone(),
                    cluster: cluster.to_string(),
                    address: address.to_string(),
                    port: g.port,
                    hbone_port: 0,
                };
                if !g.address.is_empty() {
                    // A name is PCP's to resolve: it writes what it resolves to as gateways
                    // of their own, which `new` has taken.
                    if g.address.parse::<IpAddr>().is_ok() {
                        self.gateways.push(at("", &g.address));
                    }
                    continue;
                }
                for cluster in mesh.registries(network) {
                    for address in external(&g.registry_service_name, cluster) {
                        if address.parse::<IpAddr>().is_ok() {
                            self.gateways.push(at(cluster, &address));
                        }
                    }
                }
            }
        }
        self.gateways.sort();
        self.gateways.dedup();
        self.scale = scale_factor(&self.gateways);
        self.mesh_networks = Some(mesh);
        self
    }

    /// The network of an endpoint: its own, else the one the mesh config's networks place it
    /// on by its address or its cluster.
    pub fn network_of<'a>(&'a self, own: &'a str, address: &str, cluster: &str) -> &'a str {
        if !own.is_empty() {
            return own;
        }
        self.mesh_networks
            .as_ref()
            .and_then(|m| m.network_of(address, cluster))
            .unwrap_or("")
    }

    /// The same, for a proxy that asks for the endpoints of `view` only (besides its own
    /// network's; istiod's `REQUESTED_NETWORK_VIEW`). An empty view is every network.
    pub fn with_view(mut self, view: &[String]) -> Networks {
        if !view.is_empty() {
            let mut networks: std::collections::BTreeSet<String> = view.iter().cloned().collect();
            networks.insert(self.network.clone());
            self.view = Some(networks);
        }
        self
    }

    /// Whether the proxy takes endpoints of `network` at all (see [`Networks::with_view`]).
    pub fn in_view(&self, network: &str) -> bool {
        self.view.as_ref().is_none_or(|v| v.contains(network))
    }

    /// Whether the proxy takes only some networks' endpoints.
    pub fn has_view(&self) -> bool {
        self.view.is_some()
    }

    /// Whether the mesh has any network gateway: without, every endpoint is reached directly.
    pub fn is_multi_network(&self) -> bool {
        !self.gateways.is_empty()
    }

    /// What endpoint weights are multiplied by (see [`scale_factor`]).
    pub fn scale(&self) -> u32 {
        self.scale
    }

    /// Whether `network` has a gateway.
    pub fn has_gateway(&self, network: &str) -> bool {
        self.gateways.iter().any(|g| g.network == network)
    }

    /// Whether an endpoint on `network` is on the proxy's: the same network, or either has none.
    pub fn is_local(&self, network: &str) -> bool {
        network.is_empty() || self.network.is_empty() || network == self.network
    }

    /// The gateways an endpoint of `network` in `cluster` is reached through, that the proxy
    /// can reach: those of its (network, cluster), else all of its network's; those without a
    /// port are not used by sidecars.
    pub fn gateways_for(&self, network: &str, cluster: &str) -> Vec<&Gateway> {
        let of_network = || self.gateways.iter().filter(|g| g.network == network);
        let mut chosen: Vec<&Gateway> = of_network().filter(|g| g.cluster == cluster).collect();
        if chosen.is_empty() {
            chosen = of_network().collect();
        }
        chosen.retain(|g| g.port != 0 && self.family.reaches(&g.address));
        chosen
    }
}

/// The least common multiple of the number of gateways of every network and of every
/// (network, cluster): every endpoint weight is multiplied by it, so that an endpoint's weight
/// split among the gateways it is reached through stays whole (istiod's scale factor).
fn scale_factor(gateways: &[Gateway]) -> u32 {
    let mut networks: BTreeMap<&str, u64> = BTreeMap::new();
    let mut pairs: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for g in gateways {
        *networks.entry(&g.network).or_default() += 1;
        *pairs.entry((&g.network, &g.cluster)).or_default() += 1;
    }
    let lcm = networks
        .values()
        .chain(pairs.values())
        .fold(1_u64, |acc, &n| acc / gcd(acc, n) * n)
        .min(u64::from(u32::MAX));
    u32::try_from(lcm).unwrap_or(u32::MAX)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gateway(network: &str, address: &str) -> NetworkGateway {
        NetworkGateway {
            network: network.into(),
            address: address.into(),
            port: 15443,
            hbone_port: 0,
        }
    }

    /// The mesh config's networks add gateways (by address, and by the Service whose load
    /// balancer addresses they are in the network's registries) and place endpoints.
    #[test]
    fn mesh_networks_add_gateways_and_place_endpoints() {
        let mesh: MeshNetworks = serde_json::from_value(serde_json::json!({"networks": {
            "n2": {"endpoints": [{"fromRegistry": "c2"}, {"fromCidr": "10.20.0.0/16"}],
                   "gateways": [{"registryServiceName": "eastwest.istio-system.svc.cluster.local",
                                 "port": 15443},
                                {"address": "35.0.0.1", "port": 15443},
                                {"address": "gw.example.com", "port": 15443}]},
        }}))
        .unwrap();
        let networks = Networks::new("n1", IpFamily::V4, std::iter::empty()).with_mesh_networks(
            Some(mesh),
            |host, cluster| match (host, cluster) {
                ("eastwest.istio-system.svc.cluster.local", "c2") => {
                    vec!["35.0.0.2".into(), "35.0.0.3".into()]
                }
                _ => Vec::new(),
            },
        );
        let addresses: Vec<(String, String)> = networks
            .gateways_for("n2", "c2")
            .iter()
            .map(|g| (g.cluster.clone(), g.address.clone()))
            .collect();
        assert_eq!(
            addresses,
            [
                ("c2".into(), "35.0.0.2".into()),
                ("c2".into(), "35.0.0.3".into())
            ]
        );
        assert_eq!(networks.gateways_for("n2", "elsewhere").len(), 3);
        // n2: 3, (n2, ""): 1, (n2, c2): 2.
        assert_eq!(networks.scale(), 6);
        assert_eq!(networks.network_of("", "10.20.1.1", "c9"), "n2");
        assert_eq!(networks.network_of("", "10.30.1.1", "c2"), "n2");
        assert_eq!(networks.network_of("own", "10.20.1.1", "c2"), "own");
        assert_eq!(networks.network_of("", "10.30.1.1", "c9"), "");
    }

    #[test]
    fn gateways_by_network_and_cluster_and_the_scale_factor() {
        let gateways = [
            ("c1", gateway("n1", "1.1.1.1")),
            ("c2a", gateway("n2", "2.2.2.2")),
            ("c2b", gateway("n2", "2.2.2.20")),
            ("c2b", gateway("n2", "2.2.2.21")),
            ("c2b", gateway("n2", "2001:db8::1")),
            ("c3", gateway("n3", "gw.example.com")),
        ];
        let networks = Networks::new("n1", IpFamily::V4, gateways.iter().map(|(c, g)| (*c, g)));
        // n1: 1, n2: 4, (n2, c2a): 1, (n2, c2b): 3; the DNS-named gateway is left out.
        assert_eq!(networks.scale(), 12);
        assert!(!networks.has_gateway("n3"));
        let addresses =
            |gws: Vec<&Gateway>| gws.iter().map(|g| g.address.clone()).collect::<Vec<_>>();
        assert_eq!(
            addresses(networks.gateways_for("n2", "c2b")),
            ["2.2.2.20", "2.2.2.21"]
        );
        assert_eq!(
            addresses(networks.gateways_for("n2", "elsewhere")),
            ["2.2.2.2", "2.2.2.20", "2.2.2.21"]
        );
        assert!(networks.is_local("") && networks.is_local("n1") && !networks.is_local("n2"));
        let v4: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(IpFamily::of(&[v4]), IpFamily::V4);
    }
}
