//! Whether a patch's `match` selects a listener, filter chain, route configuration, virtual host,
//! route or cluster, as istiod matches it.

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::listener::v3::{FilterChain, Listener};
use envoy_types::pb::envoy::config::route::v3::{Route, VirtualHost, route::Action};
use pasa_istio::envoy_filter::{ApplyTo, PatchContext, RouteAction};

use super::super::names;
use super::patch::Patch;
use super::patcher::Targets;

fn is_virtual(l: &Listener) -> bool {
    l.name == names::VIRTUAL_INBOUND || l.name == names::VIRTUAL_OUTBOUND
}

pub(super) fn listener_matches(l: &Listener, p: &Patch) -> bool {
    let Some(m) = p.matching.listener() else {
        return true;
    };
    if !m.name.is_empty() && m.name != l.name {
        return false;
    }
    // A virtual listener's ports are its filter chains' (see `chain_matches`).
    if p.apply_to != ApplyTo::Listener && is_virtual(l) {
        return true;
    }
    m.port_number == 0 || super::super::builders::listener_port(l) == Some(m.port_number)
}

pub(super) fn chain_matches(l: &Listener, fc: &FilterChain, p: &Patch) -> bool {
    let Some(m) = p.matching.listener() else {
        return true;
    };
    let fcm = fc.filter_chain_match.as_ref();
    let destination_port = fcm.and_then(|f| f.destination_port.map(|p| p.value));
    if is_virtual(l) && m.port_number > 0 && destination_port != Some(m.port_number) {
        return false;
    }
    let Some(want) = &m.filter_chain else {
        return true;
    };
    if !want.name.is_empty() && want.name != fc.name {
        return false;
    }
    if !want.sni.is_empty() && !fcm.is_some_and(|f| f.server_names.contains(&want.sni)) {
        return false;
    }
    if !want.transport_protocol.is_empty()
        && fcm.is_none_or(|f| f.transport_protocol != want.transport_protocol)
    {
        return false;
    }
    if !want.application_protocols.is_empty() {
        let Some(f) = fcm else { return false };
        if !want
            .application_protocols
            .split(',')
            .all(|p| f.application_protocols.iter().any(|a| a == p))
        {
            return false;
        }
    }
    if !want.transport_socket.is_empty()
        && fc.transport_socket.as_ref().map(|t| t.name.as_str()) != Some(&want.transport_socket)
    {
        return false;
    }
    want.destination_port == 0 || destination_port == Some(want.destination_port)
}

/// A route configuration's port, from its name as istiod names it: `<port>` outbound,
/// `inbound|<port>||` inbound.
fn route_port(name: &str) -> u32 {
    if name.starts_with("inbound|") {
        return names::read_cluster(name).0;
    }
    name.parse().unwrap_or(0)
}

/// Whether the route configuration `name` is one `p` selects; on a gateway, a port matches the
/// route's listener port or a service port served on it.
pub(super) fn route_configuration_matches(
    context: PatchContext,
    name: &str,
    p: &Patch,
    targets: &Targets<'_>,
) -> bool {
    let Some(m) = p.matching.route_configuration() else {
        return true;
    };
    if !m.name.is_empty() && m.name != name {
        return false;
    }
    if context != PatchContext::Gateway {
        return m.port_number == 0 || m.port_number == route_port(name);
    }
    let (port, port_name, gateway) = crate::model::gateway::read_route_name(name);
    (m.port_name.is_empty() || m.port_name == port_name)
        && (m.gateway.is_empty() || m.gateway == gateway)
        && (m.port_number == 0
            || match targets.on(port) {
                [] => m.port_number == port,
                served => served.iter().any(|t| t.port == m.port_number),
            })
}

pub(super) fn virtual_host_matches(vh: &VirtualHost, p: &Patch) -> bool {
    let Some(m) = p
        .matching
        .route_configuration()
        .and_then(|r| r.vhost.as_ref())
    else {
        return true;
    };
    (m.name.is_empty() || m.name == vh.name)
        && (m.domain_name.is_empty() || vh.domains.contains(&m.domain_name))
}

pub(super) fn route_match(p: &Patch) -> Option<&pasa_istio::envoy_filter::RouteMatch> {
    p.matching
        .route_configuration()?
        .vhost
        .as_ref()?
        .route
        .as_ref()
}

pub(super) fn route_matches(r: &Route, p: &Patch) -> bool {
    let Some(m) = route_match(p) else {
        return true;
    };
    if !m.name.is_empty() && m.name != r.name {
        return false;
    }
    match m.action {
        RouteAction::Any | RouteAction::Unknown(_) => true,
        // A route of another action (or none) matches whatever action is asked for, as in
        // istiod.
        RouteAction::Route => !matches!(
            r.action,
            Some(Action::Redirect(_) | Action::DirectResponse(_))
        ),
        RouteAction::Redirect => {
            !matches!(r.action, Some(Action::Route(_) | Action::DirectResponse(_)))
        }
        RouteAction::DirectResponse => {
            !matches!(r.action, Some(Action::Route(_) | Action::Redirect(_)))
        }
    }
}

/// An inbound cluster (`inbound|<port>||`) is of the services the proxy serves on its port, as
/// istiod matches it by service.
pub(super) fn cluster_matches(c: &Cluster, p: &Patch, targets: &Targets<'_>) -> bool {
    let Some(m) = p.matching.cluster() else {
        return true;
    };
    if !m.name.is_empty() {
        return m.name == c.name;
    }
    let (port, subset, host) = names::read_cluster(&c.name);
    let service_matches = || {
        if c.name.starts_with("inbound|") {
            targets.on(port).iter().any(|t| t.hostname == m.service)
        } else {
            m.service == host
        }
    };
    (m.subset.is_empty() || m.subset == subset)
        && (m.service.is_empty() || service_matches())
        && (m.port_number == 0 || m.port_number == port)
}
