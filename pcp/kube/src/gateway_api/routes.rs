//! Routes: which parents each route binds to, and the VirtualServices its rules become.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use super::listeners::{Generated, ParentInfo};
use super::rules::{self, Converted};
use super::types::{Meta, ParentRef, Route, StreamRule};
use super::{
    GROUP, Input, Settings, WAYPOINT_CONTROLLER, generated, group_kind, host_intersection,
};
use pasa_istio::generated::{
    GATEWAY_SEMANTICS, GENERATED, PARENTS_ANNOTATION, ROUTE_SEMANTICS_ANNOTATION,
};
use pasa_proto::Kind;
use pasa_proto::Object;

const SERVICE: (&str, &str) = ("", "Service");
const SERVICE_ENTRY: (&str, &str) = ("networking.istio.io", "ServiceEntry");
const MESH: &str = "mesh";

/// One parent a route names, resolved to a listener (or the mesh).
#[derive(Debug, Clone)]
pub(super) struct RouteParent<'a> {
    pub internal_name: String,
    /// Service or ServiceEntry (mesh parents), Gateway otherwise.
    pub mesh_kind: Option<(&'static str, &'static str)>,
    /// The listener's hostname as written.
    pub hostname: String,
    /// Why the route may not bind here.
    pub denied: Option<String>,
    pub original: &'a ParentRef,
    /// Hostnames of the other listeners on the same port and protocol.
    pub banned: BTreeSet<String>,
}

impl RouteParent<'_> {
    fn is_mesh(&self) -> bool {
        self.internal_name == MESH
    }

    /// The namespace the parent reference names (the route's own when it names none).
    fn namespace<'b>(&'b self, route: &'b Meta) -> &'b str {
        self.original
            .namespace
            .as_deref()
            .unwrap_or(&route.namespace)
    }

    /// Whether a route host is this listener's to serve, given the more specific listeners
    /// beside it (the Gateway API's listener isolation).
    fn allowed_by_isolation(&self, route_host: &str) -> bool {
        let ours = self.hostname.as_str();
        if !ours.is_empty() && !ours.starts_with('*') {
            return true;
        }
        if !ours.is_empty() && !pasa_istio::host::matches(route_host, ours) {
            return false;
        }
        !self.banned.iter().any(|other| {
            ours.len() <= other.len() && pasa_istio::host::subset_of(route_host, other)
        })
    }
}

/// The parents of a route, ordered as istiod orders them.
pub(super) fn parents<'a>(
    input: &Input,
    gateways: &[Generated],
    meta: &Meta,
    parent_refs: &'a [ParentRef],
    hostnames: &[String],
    route_kind: &str,
) -> Vec<RouteParent<'a>> {
    let mesh = ParentInfo {
        internal_name: MESH.into(),
        allowed_kinds: ["HTTPRoute", "GRPCRoute", "TCPRoute", "TLSRoute"]
            .map(|k| (GROUP.to_string(), k.to_string()))
            .into(),
        ..ParentInfo::default()
    };
    let mut out = Vec::new();
    for r in parent_refs {
        let kind = group_kind(r.group.as_deref(), r.kind.as_deref(), (GROUP, "Gateway"));
        let namespace = r.namespace.as_deref().unwrap_or(&meta.namespace);
        let mesh_kind = match kind {
            SERVICE => Some(SERVICE),
            SERVICE_ENTRY => Some(SERVICE_ENTRY),
            (GROUP, "Gateway") | (GROUP, "ListenerSet") => None,
            _ => continue,
        };
        let candidates: Vec<&ParentInfo> = if let Some(k) = mesh_kind {
            if waypoint_of_another_controller(input, k, namespace, &r.name) {
                continue;
            }
            vec![&mesh]
        } else {
            gateways
                .iter()
                .filter(|g| g.owner.0 == kind.1 && g.owner.1 == namespace && g.owner.2 == r.name)
                .map(|g| &g.parent)
                .collect()
        };
        for p in &candidates {
            let banned = candidates
                .iter()
                .filter(|o| !std::ptr::eq(**o, *p) && o.port == p.port && o.protocol == p.protocol)
                .map(|o| o.original_hostname.clone())
                .filter(|h| *h != p.original_hostname)
                .collect();
            out.push(RouteParent {
                internal_name: p.internal_name.clone(),
                mesh_kind,
                hostname: p.original_hostname.clone(),
                denied: denied(
                    input, p, mesh_kind, r, namespace, hostnames, meta, route_kind,
                ),
                original: r,
                banned,
            });
        }
    }
    out.sort_by_cached_key(|p| parent_ref_string(p.original, &meta.namespace));
    out
}

/// istiod's sort key of a parent reference.
fn parent_ref_string(r: &ParentRef, namespace: &str) -> String {
    format!(
        "{}/{}/{}/{}/{}.{}",
        r.group.as_deref().unwrap_or(GROUP),
        r.kind.as_deref().unwrap_or("Gateway"),
        r.name,
        r.section_name.as_deref().unwrap_or_default(),
        r.port.unwrap_or(0),
        r.namespace.as_deref().unwrap_or(namespace)
    )
}

/// The parents a route binds to: those not denied, by internal name.
fn bound<'a, 'b>(parents: &'b [RouteParent<'a>]) -> Vec<&'b RouteParent<'a>> {
    let mut out: Vec<_> = parents.iter().filter(|p| p.denied.is_none()).collect();
    out.sort_by(|a, b| a.internal_name.cmp(&b.internal_name));
    out
}

/// Why a route may not bind to a parent, if it may not.
#[allow(clippy::too_many_arguments)]
fn denied(
    input: &Input,
    parent: &ParentInfo,
    mesh_kind: Option<(&str, &str)>,
    r: &ParentRef,
    namespace: &str,
    hostnames: &[String],
    route: &Meta,
    route_kind: &str,
) -> Option<String> {
    let key = (namespace.to_string(), r.name.clone());
    match mesh_kind {
        Some(SERVICE) if !input.services.contains_key(&key) => {
            return Some(format!("parent service: {:?} not found", r.name));
        }
        Some(_)
            if mesh_kind == Some(SERVICE_ENTRY) && !input.service_entries.contains_key(&key) =>
        {
            return Some(format!("parent service entry: {:?} not found", r.name));
        }
        Some(_) => {}
        None => {
            if let Some(port) = r.port.filter(|p| *p != 0 && *p != parent.port) {
                return Some(format!("port {port} not found"));
            }
            if let Some(section) = r
                .section_name
                .as_deref()
                .filter(|s| !s.is_empty() && *s != parent.section_name)
            {
                return Some(format!("sectionName {section:?} not found"));
            }
            let star = ["*".to_string()];
            let route_hosts = if hostnames.is_empty() {
                &star[..]
            } else {
                hostnames
            };
            if !parent.hostnames.is_empty() {
                let (mut matched, mut host_matched) = (false, false);
                'out: for rh in route_hosts {
                    for ph in &parent.hostnames {
                        let (pns, phost) = ph.split_once('/').unwrap_or(("*", ph));
                        let host_match = pasa_istio::host::matches(phost, rh);
                        host_matched |= host_match;
                        if host_match && (pns == "*" || pns == route.namespace) {
                            matched = true;
                            break 'out;
                        }
                    }
                }
                if !matched {
                    return Some(if host_matched {
                        format!(
                            "hostnames matched parent hostname {:?}, but namespace {:?} is not \
                             allowed by the parent",
                            parent.original_hostname, route.namespace
                        )
                    } else {
                        format!(
                            "no hostnames matched parent hostname {:?}",
                            parent.original_hostname
                        )
                    });
                }
            }
        }
    }
    if !parent
        .allowed_kinds
        .iter()
        .any(|(g, k)| g == GROUP && k == route_kind)
    {
        return Some(format!("kind {route_kind} is not allowed"));
    }
    None
}

/// Whether a Service or ServiceEntry parent uses a waypoint Istio does not program (its routes
/// are then that waypoint controller's, not Istio's).
fn waypoint_of_another_controller(
    input: &Input,
    kind: (&str, &str),
    namespace: &str,
    name: &str,
) -> bool {
    let key = (namespace.to_string(), name.to_string());
    let labels = match kind {
        SERVICE => input.services.get(&key),
        _ => input.service_entries.get(&key),
    };
    let Some(mut labels) = labels.map(|b| &b.labels) else {
        return false;
    };
    let mut waypoint = labels.get("istio.io/use-waypoint");
    if waypoint.is_none() {
        let Some(ns) = input.namespaces.get(namespace) else {
            return false;
        };
        labels = ns;
        waypoint = labels.get("istio.io/use-waypoint");
    }
    let Some(waypoint) = waypoint.filter(|w| !w.is_empty() && !w.eq_ignore_ascii_case("none"))
    else {
        return false;
    };
    let waypoint_ns = labels
        .get("istio.io/use-waypoint-namespace")
        .filter(|n| !n.is_empty())
        .map_or(namespace, String::as_str);
    let Some(gw) = input
        .gateways
        .iter()
        .find(|g| g.metadata.namespace == waypoint_ns && g.metadata.name == *waypoint)
    else {
        return false;
    };
    let Some(class) = input
        .classes
        .iter()
        .find(|c| c.metadata.name == gw.spec.gateway_class_name)
    else {
        return false;
    };
    let controller = class.spec.controller_name.as_str();
    controller != WAYPOINT_CONTROLLER && controller != super::GATEWAY_CONTROLLER
}

/// A VirtualService before the routes of several for one key are merged.
struct Base {
    key: String,
    creation: String,
    namespace: String,
    name: String,
    parents: String,
    spec: Value,
}

/// The VirtualServices of every route.
pub(super) fn convert(settings: &Settings, input: &Input, gateways: &[Generated]) -> Vec<Object> {
    let mut bases = Vec::new();
    for route in &input.http_routes {
        http_like(
            settings,
            input,
            gateways,
            route,
            "HTTPRoute",
            &mut bases,
            |mesh| rules::http(settings, input, route, !mesh),
        );
    }
    for route in &input.grpc_routes {
        http_like(
            settings,
            input,
            gateways,
            route,
            "GRPCRoute",
            &mut bases,
            |mesh| rules::grpc(settings, input, route, !mesh),
        );
    }
    let mut out = merge(bases);
    for route in &input.tcp_routes {
        out.extend(stream(settings, input, gateways, route, "TCPRoute"));
    }
    for route in &input.tls_routes {
        out.extend(stream(settings, input, gateways, route, "TLSRoute"));
    }
    out
}

fn route_annotations(kind: &str, meta: &Meta) -> BTreeMap<String, String> {
    [
        (PARENTS_ANNOTATION.to_string(), route_parent(kind, meta)),
        (
            ROUTE_SEMANTICS_ANNOTATION.to_string(),
            GATEWAY_SEMANTICS.to_string(),
        ),
    ]
    .into()
}

/// How `internal.istio.io/parents` names a route.
fn route_parent(kind: &str, meta: &Meta) -> String {
    format!("{kind}/{}.{}", meta.name, meta.namespace)
}

/// The hosts of a mesh parent: the Service's, or the ServiceEntry's.
fn mesh_hosts(
    settings: &Settings,
    input: &Input,
    parent: &RouteParent,
    route: &Meta,
) -> Vec<String> {
    let namespace = parent.namespace(route);
    let name = &parent.original.name;
    if parent.mesh_kind == Some(SERVICE_ENTRY) {
        return input
            .service_entries
            .get(&(namespace.to_string(), name.clone()))
            .map(|b| b.hosts.clone())
            .unwrap_or_default();
    }
    vec![pasa_istio::host::service_fqdn(
        name,
        namespace,
        &settings.domain_suffix,
    )]
}

/// The per-(listener, host) VirtualServices of an HTTPRoute or GRPCRoute.
#[allow(clippy::too_many_arguments)]
fn http_like<R>(
    settings: &Settings,
    input: &Input,
    gateways: &[Generated],
    route: &Route<R>,
    kind: &str,
    bases: &mut Vec<Base>,
    convert: impl Fn(bool) -> Converted,
) {
    let meta = &route.metadata;
    let parents = parents(
        input,
        gateways,
        meta,
        &route.spec.parent_refs,
        &route.spec.hostnames,
        kind,
    );
    let needs = |mesh: bool| parents.iter().any(|p| p.is_mesh() == mesh);
    let mesh_routes = if needs(true) {
        convert(true).routes
    } else {
        Vec::new()
    };
    let gateway_routes = if needs(false) {
        convert(false).routes
    } else {
        Vec::new()
    };
    let mut count = 0;
    for parent in bound(&parents) {
        let mut key = parent.internal_name.clone();
        let mut hosts = if route.spec.hostnames.is_empty() {
            vec!["*".to_string()]
        } else {
            route.spec.hostnames.clone()
        };
        let mut routes = gateway_routes.clone();
        if parent.is_mesh() {
            routes = mesh_routes.clone();
            key = meta.namespace.clone();
            if let Some(port) = parent.original.port {
                routes.iter_mut().for_each(|r| match_port(r, port));
                key = format!("{key}/{port}");
            }
            hosts = mesh_hosts(settings, input, parent, meta);
        }
        if routes.is_empty() {
            continue;
        }
        rules::sort_http(&mut routes);
        for h in hosts {
            if !parent.allowed_by_isolation(&h) {
                continue;
            }
            bases.push(Base {
                key: format!("{key}/{h}"),
                creation: meta.creation_timestamp.clone(),
                namespace: meta.namespace.clone(),
                name: format!("{}~{count}~{GENERATED}", meta.name),
                parents: route_parent(kind, meta),
                spec: json!({"hosts": [h], "gateways": [parent.internal_name], "http": routes}),
            });
            count += 1;
        }
    }
}

/// One VirtualService per key: the routes of every HTTPRoute and GRPCRoute for that (listener,
/// host), oldest route first, sorted as the Gateway API orders matches; named after the key.
fn merge(bases: Vec<Base>) -> Vec<Object> {
    let mut by_key: BTreeMap<String, Vec<Base>> = BTreeMap::new();
    for b in bases {
        by_key.entry(b.key.clone()).or_default().push(b);
    }
    by_key
        .into_iter()
        .map(|(key, mut group)| {
            group.sort_by(|a, b| {
                (&a.creation, &a.namespace, &a.name).cmp(&(&b.creation, &b.namespace, &b.name))
            });
            let mut spec = group[0].spec.clone();
            if group.len() > 1 {
                let mut http: Vec<Value> = group
                    .iter()
                    .flat_map(|b| b.spec["http"].as_array().cloned().unwrap_or_default())
                    .collect();
                rules::sort_http(&mut http);
                spec["http"] = http.into();
            }
            let parents: Vec<&str> = group.iter().map(|b| b.parents.as_str()).collect();
            let annotations = [
                (PARENTS_ANNOTATION.to_string(), parents.join(",")),
                (
                    ROUTE_SEMANTICS_ANNOTATION.to_string(),
                    GATEWAY_SEMANTICS.to_string(),
                ),
            ]
            .into();
            generated(
                Kind::VirtualService,
                &group[0].namespace,
                key.replace('/', "~"),
                annotations,
                spec,
            )
        })
        .collect()
}

/// Restricts a mesh route to the port its parent reference names: every match, or a match of
/// its own when it has none.
fn match_port(route: &mut Value, port: u32) {
    match route["match"].as_array_mut() {
        Some(matches) => matches.iter_mut().for_each(|m| m["port"] = port.into()),
        None => route["match"] = json!([{"port": port}]),
    }
}

/// The VirtualServices of a TCPRoute or TLSRoute: one per parent and host.
fn stream(
    settings: &Settings,
    input: &Input,
    gateways: &[Generated],
    route: &Route<StreamRule>,
    kind: &str,
) -> Vec<Object> {
    let meta = &route.metadata;
    let tls = kind == "TLSRoute";
    let hostnames = if tls { &route.spec.hostnames[..] } else { &[] };
    let parents = parents(
        input,
        gateways,
        meta,
        &route.spec.parent_refs,
        hostnames,
        kind,
    );
    let needs = |mesh: bool| parents.iter().any(|p| p.is_mesh() == mesh);
    let convert = |mesh: bool| rules::stream(settings, input, route, kind, !mesh).routes;
    let mesh_routes = if needs(true) {
        convert(true)
    } else {
        Vec::new()
    };
    let gateway_routes = if needs(false) {
        convert(false)
    } else {
        Vec::new()
    };
    let tag = if tls { "tls" } else { "tcp" };
    let mut out = Vec::new();
    let mut count = 0;
    for parent in bound(&parents) {
        let mut routes = gateway_routes.clone();
        let mut hosts = if tls && !route.spec.hostnames.is_empty() {
            route.spec.hostnames.clone()
        } else {
            vec!["*".to_string()]
        };
        if parent.is_mesh() {
            routes = mesh_routes.clone();
            hosts = mesh_hosts(settings, input, parent, meta);
            let port = parent.original.port;
            for r in &mut routes {
                if tls {
                    let matches = r["match"].as_array().map_or(0, Vec::len);
                    if matches == 1 && r["match"][0]["sniHosts"] == json!(["*"]) {
                        r["match"][0]["sniHosts"] = hosts.clone().into();
                    }
                    if let (Some(port), Some(ms)) = (port, r["match"].as_array_mut()) {
                        ms.iter_mut().for_each(|m| m["port"] = port.into());
                    }
                } else if let Some(port) = port {
                    match_port(r, port);
                }
            }
        } else if tls && !parent.hostname.is_empty() {
            let listener = [parent.hostname.clone()];
            hosts = host_intersection(&hosts, &listener);
            routes = routes
                .into_iter()
                .filter_map(|mut r| {
                    let Some(ms) = r["match"].as_array_mut() else {
                        return Some(r);
                    };
                    let mut any = ms.is_empty();
                    for m in ms.iter_mut() {
                        let sni: Vec<String> = m["sniHosts"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|h| h.as_str().map(str::to_string))
                            .collect();
                        let narrowed = host_intersection(&sni, &listener);
                        any |= !narrowed.is_empty();
                        m["sniHosts"] = narrowed.into();
                    }
                    any.then_some(r)
                })
                .collect();
        }
        for host in hosts {
            let mut filtered = routes.clone();
            if parent.is_mesh() && tls {
                for r in &mut filtered {
                    let sni = r["match"][0]["sniHosts"].as_array().cloned();
                    if r["match"].as_array().map(Vec::len) == Some(1)
                        && sni.as_ref().is_some_and(|s| s.len() > 1)
                    {
                        let kept: Vec<Value> = sni
                            .into_iter()
                            .flatten()
                            .filter(|h| {
                                h.as_str()
                                    .is_some_and(|h| pasa_istio::host::matches(&host, h))
                            })
                            .collect();
                        r["match"][0]["sniHosts"] = kept.into();
                    }
                }
            }
            out.push(generated(
                Kind::VirtualService,
                &meta.namespace,
                format!("{}~{tag}~{count}~{GENERATED}", meta.name),
                route_annotations(kind, meta),
                json!({"hosts": [host], "gateways": [parent.internal_name], tag: filtered}),
            ));
            count += 1;
        }
    }
    out
}
