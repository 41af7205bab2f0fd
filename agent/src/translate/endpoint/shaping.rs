//! What istiod's endpoint builder does to a cluster's endpoints once they are chosen, beyond
//! grouping them by locality:
//! - whether each takes Istio mutual TLS, the cluster's DestinationRule first (its TLS mode for
//!   the port: `ISTIO_MUTUAL` on, any other off), then the workload's sidecar and
//!   PeerAuthentication;
//! - split horizon (istiod's `EndpointsByNetworkFilter`): in a mesh of several networks, an
//!   endpoint the proxy cannot reach directly is replaced by the gateways of its network, its
//!   weight split among them, and dropped when it does not take Istio mutual TLS (a gateway
//!   routes by the SNI of that TLS);
//! - the SNI-DNAT clusters of an `AUTO_PASSTHROUGH` gateway keep only endpoints that take Istio
//!   mutual TLS (istiod's `EndpointsWithMTLSFilter`, [`keep_mtls_only`]);
//! - endpoints that take HBONE are sent as such when the control plane prefers it
//!   (`PILOT_PREFER_SENDING_HBONE`);
//! - locality load balancing (see [`super::locality`]).
//!
//! A cluster none of this changes is assembled from the shared encodings as they are (see
//! [`Shaping::is_plain`]).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::net::IpAddr;

use envoy_types::pb::envoy::config::core::v3::{
    Address, EnvoyInternalAddress, Metadata, address, envoy_internal_address,
};
use envoy_types::pb::envoy::config::endpoint::v3::{Endpoint, LbEndpoint, lb_endpoint};
use envoy_types::pb::google::protobuf::UInt32Value;
use prost::Message;

use super::locality::{self, LocalityLb};
use super::{
    EncodedEndpoint, Group, LocalityEndpoints, Where, encoded_lb_endpoint, endpoint_workload,
    health_status, istio_mtls, socket_address, write_assignment,
};
use crate::model::network::{Gateway, Networks};
use crate::model::registry::Instance;
use crate::translate::metadata;

/// The label of a workload that takes HBONE (`http`).
pub(in crate::translate) const TUNNEL_LABEL: &str = "networking.istio.io/tunnel";
/// The internal listener that tunnels a sidecar's connections over HBONE.
const CONNECT_ORIGINATE: &str = "connect_originate";
/// The metadata naming where an HBONE tunnel leads.
const ORIGINAL_DST: &str = "envoy.filters.listener.original_dst";

/// How one cluster's endpoints are shaped (see the module's documentation).
#[derive(Debug, Clone, Copy, Default)]
pub(in crate::translate) struct Shaping<'a> {
    /// The TLS mode the cluster's DestinationRule sets for its port (`Some(true)`:
    /// `ISTIO_MUTUAL`); a subset's cluster reads only the subset's policy.
    pub dr_mtls: Option<bool>,
    /// The mesh's networks, for a sidecar of a mesh with network gateways.
    pub networks: Option<&'a Networks>,
    /// Endpoints that take HBONE are sent as such.
    pub hbone: bool,
    pub locality: Option<LocalityLb<'a>>,
    /// Where the endpoints are, for those written again.
    pub at: Option<Where<'a>>,
}

impl Shaping<'_> {
    /// Whether nothing changes the endpoints as the port's encodings have them.
    pub(super) fn is_plain(&self) -> bool {
        self.dr_mtls.is_none()
            && self
                .networks
                .is_none_or(|n| !n.is_multi_network() && !n.has_view())
            && !self.hbone
            && self.locality.is_none()
    }
}

/// The mesh-wide DestinationRule TLS decision for a cluster (see [`Shaping::dr_mtls`]): the
/// policy's TLS mode, a port-level setting of the port overriding it.
pub(in crate::translate) fn dr_mtls(
    dr: Option<&pasa_istio::destination_rule::DestinationRule>,
    subset: Option<&str>,
    port: u32,
) -> Option<bool> {
    use pasa_istio::destination_rule::ClientTlsMode;
    let dr = dr?;
    let policy = match subset {
        None => dr.traffic_policy.as_ref(),
        Some(name) => dr
            .subsets
            .iter()
            .find(|s| s.name == name)?
            .traffic_policy
            .as_ref(),
    }?;
    let port_level = policy
        .port_level_settings
        .iter()
        .find(|p| p.port.as_ref().is_some_and(|p| p.number == port) && p.tls.is_some());
    let tls = port_level.map_or(policy.tls.as_ref(), |p| p.tls.as_ref())?;
    Some(tls.mode == ClientTlsMode::IstioMutual)
}

/// An endpoint as it goes out: one of the service's, or a gateway standing for some.
#[derive(Debug)]
pub(super) enum Out<'e, 's> {
    Endpoint {
        e: &'e EncodedEndpoint<'s>,
        weight: u32,
        /// Whether it is sent as taking Istio mutual TLS.
        mtls: bool,
        hbone: bool,
    },
    Gateway {
        gateway: &'e Gateway,
        weight: u32,
    },
}

impl Out<'_, '_> {
    pub(super) fn weight(&self) -> u32 {
        match self {
            Out::Endpoint { weight, .. } | Out::Gateway { weight, .. } => *weight,
        }
    }

    /// The value of `key` among its labels, with what istiod adds to a workload's (its
    /// locality, cluster and network); a gateway has only its network and cluster.
    pub(super) fn label(&self, key: &str) -> Option<&str> {
        match self {
            Out::Endpoint { e, .. } => locality::workload_label(
                &e.instance.labels,
                &e.instance.locality,
                &e.instance.cluster,
                &e.instance.network,
                key,
            ),
            Out::Gateway { gateway, .. } => match key {
                locality::NETWORK_LABEL => Some(gateway.network.as_str()),
                locality::CLUSTER_LABEL => Some(gateway.cluster.as_str()),
                _ => None,
            },
        }
    }

    /// Its `LbEndpoint`, encoded: the port's encoding where nothing changed.
    fn encoded(&self, at: Option<Where<'_>>) -> Cow<'_, [u8]> {
        match self {
            Out::Endpoint {
                e,
                weight,
                mtls,
                hbone: false,
            } => {
                if *weight == e.weight && *mtls == e.mtls {
                    Cow::Borrowed(e.encoded.as_slice())
                } else {
                    Cow::Owned(encoded_lb_endpoint(e.instance, e.port, *weight, *mtls, at))
                }
            }
            Out::Endpoint {
                e,
                weight,
                hbone: true,
                ..
            } => Cow::Owned(hbone_endpoint(e.instance, e.port, *weight, at).encode_to_vec()),
            Out::Gateway { gateway, weight } => {
                Cow::Owned(gateway_endpoint(gateway, *weight, at).encode_to_vec())
            }
        }
    }
}

/// One locality of the assignment being shaped.
#[derive(Debug)]
pub(super) struct Shaped<'e, 's> {
    pub(super) locality: &'e LocalityEndpoints<'s>,
    pub(super) endpoints: Vec<Out<'e, 's>>,
    /// None: unset (an emptied locality).
    pub(super) weight: Option<u32>,
    pub(super) priority: u32,
}

/// The load assignment of `cluster` from the endpoints `selected` in each locality, shaped as
/// `shaping` says; encoded.
pub(super) fn assign<'e, 's: 'e>(
    cluster: &str,
    selected: impl Iterator<Item = (&'e LocalityEndpoints<'s>, Vec<&'e EncodedEndpoint<'s>>)>,
    shaping: &Shaping<'e>,
) -> Vec<u8> {
    let view = shaping.networks.filter(|n| n.has_view());
    let networks = shaping.networks.filter(|n| n.is_multi_network());
    let scale = networks.map_or(1, Networks::scale);
    let mut shaped: Vec<Shaped> = Vec::new();
    for (locality, chosen) in selected {
        let mut out = Vec::with_capacity(chosen.len());
        // Gateways by address and port (their order in the assignment), with their weight.
        let mut through: BTreeMap<(&str, u32), (&Gateway, u64)> = BTreeMap::new();
        for e in chosen {
            let instance = e.instance;
            let network = shaping.networks.map_or(&*instance.network, |n| {
                n.network_of(&instance.network, &instance.address, &instance.cluster)
            });
            if view.is_some_and(|v| !v.in_view(network)) {
                continue;
            }
            let mtls = match shaping.dr_mtls {
                Some(on) => on && super::istio_mtls_metadata(instance).is_some(),
                None => e.mtls,
            };
            let hbone = shaping.hbone
                && instance.labels.get(TUNNEL_LABEL).map(String::as_str) == Some("http");
            let weight = e.weight.saturating_mul(scale);
            let endpoint = Out::Endpoint {
                e,
                weight,
                mtls: mtls && !hbone,
                hbone,
            };
            let Some(networks) = networks else {
                out.push(endpoint);
                continue;
            };
            // An address a proxy cannot be sent (a DNS name) is no EDS endpoint.
            if !instance.address.is_empty()
                && !instance.address.starts_with("unix://")
                && instance.address.parse::<IpAddr>().is_err()
            {
                continue;
            }
            let direct = (networks.is_local(network) || !networks.has_gateway(network))
                && !(networks.network.is_empty()
                    && !network.is_empty()
                    && networks.has_gateway(network));
            if direct {
                if !instance.address.is_empty() {
                    out.push(endpoint);
                }
                continue;
            }
            let gateways = networks.gateways_for(network, &instance.cluster);
            // A gateway forwards by the SNI of Istio mutual TLS: nothing else crosses it.
            if gateways.is_empty() || !mtls || hbone {
                continue;
            }
            let share = weight / u32::try_from(gateways.len()).unwrap_or(u32::MAX);
            for gateway in gateways {
                let slot = through
                    .entry((gateway.address.as_str(), gateway.port))
                    .or_insert((gateway, 0));
                slot.1 += u64::from(share);
            }
        }
        out.extend(through.into_values().map(|(gateway, weight)| Out::Gateway {
            gateway,
            weight: u32::try_from(weight).unwrap_or(u32::MAX).max(1),
        }));
        let weight = (!out.is_empty()).then(|| out.iter().map(Out::weight).sum());
        shaped.push(Shaped {
            locality,
            endpoints: out,
            weight,
            priority: 0,
        });
    }
    if let Some(lb) = &shaping.locality {
        shaped = lb.apply(shaped);
    }
    let groups: Vec<Group> = shaped
        .iter()
        .map(|l| Group {
            locality: &l.locality.locality,
            endpoints: l.endpoints.iter().map(|o| o.encoded(shaping.at)).collect(),
            weight: l.weight,
            priority: l.priority,
        })
        .collect();
    write_assignment(cluster, &groups)
}

/// The `istio` metadata naming a workload, for Istio's proxy (see [`Where`]).
fn workload(instance: &Instance, at: Option<Where<'_>>) -> Option<Metadata> {
    let encoded = endpoint_workload(instance, at)?;
    Metadata::decode(encoded.as_slice()).ok()
}

/// An endpoint reached over HBONE: through the sidecar's `connect_originate` listener, the
/// tunnel's destination in the endpoint ID and the listener's metadata.
fn hbone_endpoint(
    instance: &Instance,
    port: u32,
    weight: u32,
    at: Option<Where<'_>>,
) -> LbEndpoint {
    let target = match instance.address.parse::<IpAddr>() {
        Ok(IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
        _ => format!("{}:{port}", instance.address),
    };
    let mut filter_metadata = workload(instance, at).unwrap_or_default().filter_metadata;
    filter_metadata.extend(metadata::one_field(ORIGINAL_DST, "local", &target).filter_metadata);
    filter_metadata.extend(
        metadata::one_field(metadata::TRANSPORT_SOCKET_MATCH, "tunnel", "http").filter_metadata,
    );
    LbEndpoint {
        host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
            address: Some(Address {
                address: Some(address::Address::EnvoyInternalAddress(
                    EnvoyInternalAddress {
                        endpoint_id: target,
                        address_name_specifier: Some(
                            envoy_internal_address::AddressNameSpecifier::ServerListenerName(
                                CONNECT_ORIGINATE.to_string(),
                            ),
                        ),
                    },
                )),
            }),
            ..Default::default()
        })),
        health_status: health_status(instance.health) as i32,
        metadata: Some(Metadata {
            filter_metadata,
            ..Default::default()
        }),
        load_balancing_weight: Some(UInt32Value {
            value: weight.max(1),
        }),
    }
}

/// A gateway standing for the endpoints of its network: Istio mutual TLS, and, for Istio's
/// proxy, the cluster behind it in the workload's place (`;;;;<cluster>`).
fn gateway_endpoint(gateway: &Gateway, weight: u32, at: Option<Where<'_>>) -> LbEndpoint {
    let mut filter_metadata = istio_mtls().filter_metadata;
    if at.is_some_and(|at| at.workload_cluster.is_some()) {
        let value = format!(";;;;{}", gateway.cluster);
        filter_metadata.extend(metadata::one_field("istio", "workload", &value).filter_metadata);
    }
    LbEndpoint {
        host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
            address: Some(socket_address(&gateway.address, gateway.port)),
            ..Default::default()
        })),
        metadata: Some(Metadata {
            filter_metadata,
            ..Default::default()
        }),
        load_balancing_weight: Some(UInt32Value {
            value: weight.max(1),
        }),
        ..Default::default()
    }
}

/// Keeps only the endpoints that take Istio mutual TLS (their transport socket match says
/// `tlsMode: istio`), each locality weighed again (unset when emptied): what the SNI-DNAT
/// cluster of an `AUTO_PASSTHROUGH` gateway may reach, since the gateway cannot tell whether
/// the TLS it passes through is Istio's (istiod's `EndpointsWithMTLSFilter`).
pub fn keep_mtls_only(
    assignment: &mut envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment,
) {
    use envoy_types::pb::google::protobuf::value::Kind;
    for locality in &mut assignment.endpoints {
        locality.lb_endpoints.retain(|e| {
            e.metadata
                .as_ref()
                .and_then(|m| m.filter_metadata.get(metadata::TRANSPORT_SOCKET_MATCH))
                .and_then(|s| s.fields.get("tlsMode"))
                .is_some_and(|v| matches!(&v.kind, Some(Kind::StringValue(m)) if m == "istio"))
        });
        let weight: u32 = locality
            .lb_endpoints
            .iter()
            .map(|e| e.load_balancing_weight.map_or(1, |w| w.value))
            .fold(0, u32::saturating_add);
        locality.load_balancing_weight =
            (!locality.lb_endpoints.is_empty()).then_some(UInt32Value { value: weight });
    }
}
