//! RDS: virtual hosts and routes from VirtualService HTTP rules (matches, weighted destinations
//! and subsets, rewrite, redirect, direct response, timeout, retries, fault, mirror, header edits,
//! CORS), and the default route of a service without one.
//!
//! This module builds virtual hosts and routes and their matches; what a route does with a
//! request (its action, with retries) is in [`action`], its header edits, fault injection, CORS
//! and persistent sessions in [`extras`].

use envoy_types::pb::envoy::config::route::v3::route::Action;
use envoy_types::pb::envoy::config::route::v3::route_action::{self, ClusterSpecifier};
use envoy_types::pb::envoy::config::route::v3::route_match::PathSpecifier;
use envoy_types::pb::envoy::config::route::v3::{
    Decorator, HeaderMatcher, QueryParameterMatcher, RetryPolicy, Route, RouteAction, RouteMatch,
    VirtualHost, header_matcher::HeaderMatchSpecifier,
    query_parameter_matcher::QueryParameterMatchSpecifier,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{
    RegexMatchAndSubstitute, RegexMatcher, StringMatcher, string_matcher::MatchPattern,
};
use envoy_types::pb::google::protobuf::{Duration, UInt32Value};
use pasa_istio::virtual_service::{Destination, MatchType, StringMatch, VirtualService};
use pasa_istio::virtual_service::{HttpRetry, HttpRoute};

use super::{metadata, names};
use crate::model::registry::{Config, PersistentSession, Service};

mod action;
mod extras;
use action::{action, default_retry, retry};
use extras::decorate;

/// Name of the fault filter; a route's fault config must be keyed by it.
pub(super) const FAULT_FILTER: &str = "envoy.filters.http.fault";

/// The CORS filter's name, under which routes carry their CORS policy.
pub(super) const CORS_FILTER: &str = "envoy.filters.http.cors";

/// Resolves a route destination to its cluster name.
pub(super) trait Destinations {
    /// The cluster for `destination` (a host as written in a VirtualService of `namespace`) when
    /// the listener port is `port`.
    fn cluster(&self, destination: &Destination, namespace: &str, port: u32) -> String;

    /// The hash policy of a route to `destinations`: the consistent-hash key of their
    /// DestinationRule policy, when they all hash the same way.
    fn hash_policy(
        &self,
        _destinations: &[&Destination],
        _namespace: &str,
        _port: u32,
    ) -> Option<envoy_types::pb::envoy::config::route::v3::route_action::HashPolicy> {
        None
    }

    /// Whether routes that rewrite send the original host as X-Forwarded-Host (the proxy
    /// settings' `proxyHeaders.xForwardedHost`).
    fn append_x_forwarded_host(&self) -> bool {
        false
    }

    /// The mesh config's `defaultHttpRetryPolicy`: for routes without retries of their own.
    fn default_retry(&self) -> Option<&HttpRetry> {
        None
    }

    /// The persistent sessions of the service `destination` names, when they are served with
    /// the stateful session filter.
    fn persistent_session(
        &self,
        _destination: &Destination,
        _namespace: &str,
    ) -> Option<&PersistentSession> {
        None
    }
}

/// [`http_routes`] of a VirtualService, each route marked with the VirtualService it came from
/// (the `istio` filter metadata istiod sets, shown by `pasactl proxy-config route`).
pub(super) fn virtual_service_routes(
    vs: &Config<VirtualService>,
    port: u32,
    gateway: &str,
    destinations: &impl Destinations,
) -> Vec<Route> {
    let mut routes = http_routes(
        &vs.spec.http,
        &vs.meta.namespace,
        port,
        gateway,
        destinations,
        Semantics::of(&vs.meta.annotations),
    );
    if !routes.is_empty() {
        let metadata = metadata::config_metadata(pasa_proto::Kind::VirtualService, &vs.meta);
        for route in &mut routes {
            route.metadata = Some(metadata.clone());
            route.decorator = Some(Decorator {
                operation: operation(route, &vs.meta.name, port),
                ..Default::default()
            });
        }
    }
    routes
}

/// How tracing names a route's span, as istiod names it: `<host>:<port><path>` for a route to
/// one cluster (its host and port), else `<VirtualService>:<listener port><path>`, the path being
/// the match's (`<prefix>*`, the exact path or the regex; `/*` without one).
fn operation(route: &Route, virtual_service: &str, port: u32) -> String {
    let path = match route
        .r#match
        .as_ref()
        .and_then(|m| m.path_specifier.as_ref())
    {
        Some(PathSpecifier::Prefix(prefix)) => format!("{prefix}*"),
        Some(PathSpecifier::Path(path)) => path.clone(),
        Some(PathSpecifier::SafeRegex(regex)) => regex.regex.clone(),
        _ => "/*".to_string(),
    };
    let cluster = match &route.action {
        Some(Action::Route(RouteAction {
            cluster_specifier: Some(ClusterSpecifier::Cluster(cluster)),
            ..
        })) => cluster.as_str(),
        _ => "",
    };
    match names::parse_subset_cluster(cluster) {
        Some((cluster_port, host)) => format!("{host}:{cluster_port}{path}"),
        None => format!("{virtual_service}:{port}{path}"),
    }
}

/// How a VirtualService's routes read, by who made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Semantics {
    /// Written by users.
    Istio,
    /// Generated from Ingresses: a URI prefix other than `/` matches whole path segments only
    /// (`/a` matches `/a` and `/a/b`, not `/ab`).
    Ingress,
    /// Generated from the Gateway API: whole-segment prefixes too; a backend without a cluster
    /// answers 500; a rewrite to `/` removes the matched prefix.
    Gateway,
}

impl Semantics {
    pub(super) fn of(annotations: &std::collections::BTreeMap<String, String>) -> Semantics {
        match annotations
            .get(pasa_istio::generated::ROUTE_SEMANTICS_ANNOTATION)
            .map(String::as_str)
        {
            Some(pasa_istio::generated::INGRESS_SEMANTICS) => Semantics::Ingress,
            Some(pasa_istio::generated::GATEWAY_SEMANTICS) => Semantics::Gateway,
            _ => Semantics::Istio,
        }
    }
}

/// Builds one route per match of each rule (the rule applies when any match does), for the
/// sidecars (`gateway` = `mesh`) or one gateway (`namespace/name`), up to the first route that
/// matches every request (as istiod, nothing after it could match). Matches restricted to
/// another port or other gateways are left out.
pub(super) fn http_routes(
    rules: &[HttpRoute],
    namespace: &str,
    port: u32,
    gateway: &str,
    destinations: &impl Destinations,
    semantics: Semantics,
) -> Vec<Route> {
    let segments = semantics != Semantics::Istio;
    let mut routes = Vec::new();
    for rule in rules {
        if rule.delegate.is_some() {
            // Delegation is resolved when the VirtualServices are read.
            continue;
        }
        let mut action = action(rule, namespace, port, destinations);
        if let Action::Route(ra) = &mut action
            && rule.rewrite.is_some()
        {
            ra.append_x_forwarded_host = destinations.append_x_forwarded_host();
        }
        // Pushes a route; whether it matches every request.
        let mut push = |name: String, route_match: RouteMatch| -> bool {
            let mut action = action.clone();
            if semantics == Semantics::Gateway {
                gateway_action(&mut action, rule, &route_match);
            }
            let everything = is_catch_all(&route_match);
            let mut route = Route {
                name,
                r#match: Some(route_match),
                action: Some(action),
                ..Default::default()
            };
            decorate(&mut route, rule, namespace, port, destinations);
            routes.push(route);
            everything
        };
        if rule.matches.is_empty() {
            push(rule.name.clone(), catch_all());
            break;
        }
        let mut catch_all_seen = false;
        for m in &rule.matches {
            if m.port != 0 && m.port != port {
                continue;
            }
            // A match restricted to gateways applies only where one of them is the one routed.
            if !m.gateways.is_empty()
                && !m
                    .gateways
                    .iter()
                    .any(|g| pasa_istio::gateway::resolve_gateway_name(g, namespace) == gateway)
            {
                continue;
            }
            let name = match (rule.name.is_empty(), m.name.is_empty()) {
                (false, false) => format!("{}.{}", rule.name, m.name),
                _ => rule.name.clone(),
            };
            let path = match m.uri.as_ref().and_then(|u| u.match_type.as_ref()) {
                Some(MatchType::Exact(p)) => PathSpecifier::Path(p.clone()),
                Some(MatchType::Prefix(p)) if segments && p != "/" => {
                    PathSpecifier::PathSeparatedPrefix(p.trim_end_matches('/').to_string())
                }
                Some(MatchType::Prefix(p)) => PathSpecifier::Prefix(p.clone()),
                Some(MatchType::Regex(r)) => PathSpecifier::SafeRegex(regex(r)),
                None => PathSpecifier::Prefix("/".into()),
            };
            // Said either way, as istiod says it.
            let mut rm = RouteMatch {
                path_specifier: Some(path),
                case_sensitive: Some(envoy_types::pb::google::protobuf::BoolValue {
                    value: !m.ignore_uri_case,
                }),
                ..Default::default()
            };
            for (name, value) in [
                (":method", &m.method),
                (":authority", &m.authority),
                (":scheme", &m.scheme),
            ] {
                if let Some(value) = value {
                    rm.headers.push(header_matcher(name, value, false));
                }
            }
            for (name, value) in &m.headers {
                rm.headers.push(header_matcher(name, value, false));
            }
            for (name, value) in &m.without_headers {
                rm.headers.push(header_matcher(name, value, true));
            }
            for (name, value) in &m.query_params {
                rm.query_parameters.push(QueryParameterMatcher {
                    name: name.clone(),
                    query_parameter_match_specifier: Some(match string_matcher(value) {
                        Some(sm) => QueryParameterMatchSpecifier::StringMatch(sm),
                        None => QueryParameterMatchSpecifier::PresentMatch(true),
                    }),
                });
            }
            if push(name, rm) {
                catch_all_seen = true;
                break;
            }
        }
        if catch_all_seen {
            break;
        }
    }
    routes
}

/// Whether a route matches every request: the prefix `/` (or regex `.*`) alone.
pub(super) fn is_catch_all(m: &RouteMatch) -> bool {
    let path = match &m.path_specifier {
        Some(PathSpecifier::Prefix(p)) | Some(PathSpecifier::PathSeparatedPrefix(p)) => p == "/",
        Some(PathSpecifier::SafeRegex(r)) => r.regex == ".*",
        _ => false,
    };
    path && m.headers.is_empty() && m.query_parameters.is_empty() && m.dynamic_metadata.is_empty()
}

/// The Gateway API's route semantics: a backend without a cluster answers 500, and a rewrite
/// to `/` removes the matched prefix (keeping one `/`).
fn gateway_action(action: &mut Action, rule: &HttpRoute, m: &RouteMatch) {
    let Action::Route(ra) = action else { return };
    ra.cluster_not_found_response_code =
        envoy_types::pb::envoy::config::route::v3::route_action::ClusterNotFoundResponseCode::InternalServerError
            as i32;
    // A regex rewrite wins over a URI one (as istiod).
    if rule
        .rewrite
        .as_ref()
        .is_some_and(|r| r.uri == "/" && r.uri_regex_rewrite.is_none())
    {
        let prefix = match &m.path_specifier {
            Some(PathSpecifier::PathSeparatedPrefix(p)) => p.as_str(),
            _ => "",
        };
        ra.prefix_rewrite.clear();
        ra.regex_rewrite = Some(RegexMatchAndSubstitute {
            pattern: Some(regex(&format!(
                "^{}(/?)(.*)",
                pasa_istio::regex::quote_meta(prefix)
            ))),
            substitution: r"/\2".into(),
        });
    }
}

fn catch_all() -> RouteMatch {
    RouteMatch {
        path_specifier: Some(PathSpecifier::Prefix("/".into())),
        ..Default::default()
    }
}

/// The route of a service without a VirtualService: everything to its cluster.
pub(super) fn default_route(cluster: &str) -> Route {
    #[allow(deprecated)]
    Route {
        name: names::DEFAULT_ROUTE.into(),
        r#match: Some(catch_all()),
        action: Some(Action::Route(RouteAction {
            cluster_specifier: Some(ClusterSpecifier::Cluster(cluster.to_string())),
            timeout: Some(zero()),
            max_grpc_timeout: Some(zero()),
            retry_policy: Some(default_retry(false)),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// The default route of a service without a VirtualService, as istiod builds it: everything
/// to `cluster`, the mesh config's `defaultHttpRetryPolicy` (or Istio's default) whether or not
/// the destination hashes, traced as `<host>:<port>/*`.
pub(super) fn default_outbound_route(
    cluster: &str,
    host: &str,
    port: u32,
    retry_policy: Option<&HttpRetry>,
) -> Route {
    let mut route = default_route(cluster);
    if let Some(Action::Route(action)) = &mut route.action {
        action.retry_policy = retry(retry_policy, false);
    }
    route.decorator = Some(Decorator {
        operation: format!("{host}:{port}/*"),
        ..Default::default()
    });
    route
}

/// `routes` encoded as a virtual host's `routes` field (3): each route's key, length and
/// encoding, one after the other.
pub(super) fn encoded_routes(routes: &[Route]) -> Vec<u8> {
    let len = routes
        .iter()
        .map(|r| prost::encoding::message::encoded_len(3, r))
        .sum();
    let mut out = Vec::with_capacity(len);
    for route in routes {
        prost::encoding::message::encode(3, route, &mut out);
    }
    out
}

/// [`virtual_host`] encoded from its routes' encoding ([`encoded_routes`]): the same bytes as
/// encoding the message, in its field order (name and domains, the routes, then the rest),
/// without building or copying the routes again.
pub(super) fn encoded_virtual_host(
    name: &str,
    domains: &[String],
    routes: &[u8],
    (attempt_count, session): (bool, Option<&PersistentSession>),
) -> Vec<u8> {
    use prost::Message;
    let head = VirtualHost {
        name: name.to_string(),
        domains: domains.to_vec(),
        ..Default::default()
    };
    let mut rest = virtual_host(String::new(), Vec::new(), Vec::new(), attempt_count);
    if let Some(session) = session {
        super::session::configure(&mut rest.typed_per_filter_config, session);
    }
    let mut out = Vec::with_capacity(head.encoded_len() + routes.len() + rest.encoded_len());
    head.encode_raw(&mut out);
    out.extend_from_slice(routes);
    rest.encode_raw(&mut out);
    out
}

/// The largest direct response body an outbound or gateway route configuration carries: 1 MiB,
/// what Istio's validation allows (Envoy's default, 4 KiB, would refuse the route configuration
/// of a larger one).
pub(super) fn max_direct_response_body() -> Option<UInt32Value> {
    Some(UInt32Value { value: 1 << 20 })
}

/// A virtual host named `name` for `domains` with `routes`, telling upstreams the attempt
/// (`x-envoy-attempt-count`) when `attempt_count`.
pub(super) fn virtual_host(
    name: String,
    domains: Vec<String>,
    routes: Vec<Route>,
    attempt_count: bool,
) -> VirtualHost {
    VirtualHost {
        name,
        domains,
        routes,
        include_request_attempt_count: attempt_count,
        ..Default::default()
    }
}

/// The names a proxyless gRPC client may use for `host` on `port`, as istiod lists them: the full
/// name, its [`alt_hosts`], the virtual IPs (IPv6 ones in brackets), each followed by itself with
/// `:<port>` (gRPC matches the target's authority, port included, against the domains).
pub(super) fn domains(
    host: &str,
    service: Option<&Service>,
    port: u32,
    dns_domain: &str,
) -> Vec<String> {
    let mut names = vec![host.to_string()];
    if !host.starts_with('*') {
        names.extend(alt_hosts(host, dns_domain));
    }
    if let Some(service) = service {
        for address in &service.addresses {
            if address.contains('/') {
                continue;
            }
            names.push(match address.parse::<std::net::Ipv6Addr>() {
                Ok(_) => format!("[{address}]"),
                Err(_) => address.clone(),
            });
        }
    }
    let mut out: Vec<String> = Vec::with_capacity(names.len() * 2);
    for n in names {
        let with_port = format!("{n}:{port}");
        if !out.contains(&n) {
            out.push(n);
            out.push(with_port);
        }
    }
    out
}

/// The other names a client may use for `host` from a proxy whose DNS domain is `dns_domain`
/// (`<ns>.svc.cluster.local`), as istiod lists them (without ports, which sidecars ignore): the
/// absolute name (`host.`), and for a Kubernetes service of the same cluster `name`,
/// `name.ns.svc` and `name.ns` from its own namespace, `name.ns` and `name.ns.svc` from another.
/// Hosts outside the cluster domain get no short forms.
pub(super) fn alt_hosts(host: &str, dns_domain: &str) -> Vec<String> {
    let mut out = Vec::new();
    if host.parse::<std::net::IpAddr>().is_err() {
        out.push(format!("{host}."));
    }
    if let Some(at) = dns_domain.find(".svc.") {
        let proxy_ns = &dns_domain[..at];
        let suffix = &dns_domain[at..];
        if !host.ends_with(suffix) {
            return out;
        }
        let Some(svc_at) = host.find(".svc.") else {
            return out;
        };
        let Some(dot) = host.find('.') else {
            return out;
        };
        if dot + 1 > svc_at {
            return out;
        }
        let name = &host[..dot];
        let name_ns = &host[..svc_at];
        if &host[dot + 1..svc_at] == proxy_ns {
            out.extend([
                name.to_string(),
                format!("{name_ns}.svc"),
                name_ns.to_string(),
            ]);
        } else {
            out.extend([name_ns.to_string(), format!("{name_ns}.svc")]);
        }
        return out;
    }
    let host_labels: Vec<&str> = host.split('.').collect();
    let domain_labels: Vec<&str> = dns_domain.split('.').collect();
    let shared = host_labels
        .iter()
        .rev()
        .zip(domain_labels.iter().rev())
        .take_while(|(a, b)| a == b)
        .count();
    if shared == 0 || shared >= host_labels.len() {
        return out;
    }
    let unique = &host_labels[..host_labels.len() - shared];
    out.push(unique.join("."));
    if unique.len() == 2 {
        out.push(format!(
            "{}.{}",
            unique.join("."),
            host_labels[host_labels.len() - shared]
        ));
    }
    out
}

/// The route of an inbound HTTP chain, as istiod builds it: everything to `cluster` without a
/// timeout (nor one from `grpc-timeout`), traced as `operation`, retried as the mesh config's
/// `defaultInboundHttpRetryPolicy` says (by default twice, only when the connection was reset
/// before the request was sent, which is safe for any method) except on gRPC ports.
pub(super) fn default_inbound_route(
    cluster: &str,
    operation: String,
    policy: Option<&HttpRetry>,
    grpc: bool,
) -> Route {
    let retry_policy = if grpc {
        None
    } else {
        match policy {
            None => Some(RetryPolicy {
                num_retries: Some(UInt32Value { value: 2 }),
                retry_on: "reset-before-request".into(),
                ..Default::default()
            }),
            Some(r) if r.attempts <= 0 => None,
            Some(r) => retry(Some(r), true).map(|converted| RetryPolicy {
                num_retries: converted.num_retries,
                retry_on: if r.retry_on.is_empty() {
                    "reset-before-request".into()
                } else {
                    converted.retry_on
                },
                retriable_status_codes: converted.retriable_status_codes,
                retry_back_off: converted.retry_back_off,
                ..Default::default()
            }),
        }
    };
    Route {
        name: names::DEFAULT_ROUTE.into(),
        r#match: Some(catch_all()),
        decorator: Some(Decorator {
            operation,
            ..Default::default()
        }),
        action: Some(Action::Route(RouteAction {
            cluster_specifier: Some(ClusterSpecifier::Cluster(cluster.to_string())),
            timeout: Some(zero()),
            max_stream_duration: Some(route_action::MaxStreamDuration {
                max_stream_duration: Some(zero()),
                grpc_timeout_header_max: Some(zero()),
                ..Default::default()
            }),
            retry_policy,
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn zero() -> Duration {
    Duration {
        seconds: 0,
        nanos: 0,
    }
}

fn regex(pattern: &str) -> RegexMatcher {
    RegexMatcher {
        regex: pattern.to_string(),
        ..Default::default()
    }
}

fn string_matcher(m: &StringMatch) -> Option<StringMatcher> {
    let pattern = match m.match_type.as_ref()? {
        MatchType::Exact(v) => MatchPattern::Exact(v.clone()),
        MatchType::Prefix(v) => MatchPattern::Prefix(v.clone()),
        MatchType::Regex(v) => MatchPattern::SafeRegex(regex(v)),
    };
    Some(StringMatcher {
        match_pattern: Some(pattern),
        ..Default::default()
    })
}

fn header_matcher(name: &str, value: &StringMatch, invert: bool) -> HeaderMatcher {
    HeaderMatcher {
        name: name.to_string(),
        invert_match: invert,
        header_match_specifier: Some(match string_matcher(value) {
            Some(sm) => HeaderMatchSpecifier::StringMatch(sm),
            None => HeaderMatchSpecifier::PresentMatch(true),
        }),
        ..Default::default()
    }
}
