//! RDS: virtual hosts and routes from VirtualService HTTP rules (matches, weighted destinations
//! and subsets, rewrite, redirect, direct response, timeout, retries, fault, mirror, header edits,
//! CORS), and the default route of a service without one.

use envoy_types::pb::envoy::config::core::v3::{
    HeaderValue, HeaderValueOption, RuntimeFractionalPercent,
    header_value_option::HeaderAppendAction,
};
use envoy_types::pb::envoy::config::route::v3::route::Action;
use envoy_types::pb::envoy::config::route::v3::route_action::{
    self, ClusterSpecifier, HostRewriteSpecifier, RequestMirrorPolicy,
};
use envoy_types::pb::envoy::config::route::v3::route_match::PathSpecifier;
use envoy_types::pb::envoy::config::route::v3::{
    Decorator, DirectResponseAction, HeaderMatcher, QueryParameterMatcher, RedirectAction,
    RetryPolicy, Route, RouteAction, RouteMatch, VirtualHost, WeightedCluster,
    header_matcher::HeaderMatchSpecifier, query_parameter_matcher::QueryParameterMatchSpecifier,
    redirect_action, retry_policy, weighted_cluster, weighted_cluster::ClusterWeight,
};
use envoy_types::pb::envoy::extensions::filters::common::fault::v3::{
    FaultDelay, fault_delay::FaultDelaySecifier,
};
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::{
    FaultAbort, HttpFault, fault_abort::ErrorType,
};
use envoy_types::pb::envoy::extensions::retry::host::previous_hosts::v3::PreviousHostsPredicate;
use envoy_types::pb::envoy::extensions::retry::priority::previous_priorities::v3::PreviousPrioritiesConfig;
use envoy_types::pb::envoy::r#type::matcher::v3::{
    RegexMatchAndSubstitute, RegexMatcher, StringMatcher, string_matcher::MatchPattern,
};
use envoy_types::pb::envoy::r#type::v3::{FractionalPercent, fractional_percent::DenominatorType};
use envoy_types::pb::google::protobuf::{Any, Duration, UInt32Value};
use envoy_types::util::pack_any;
use pasa_istio::virtual_service::{
    AbortErrorType, BodySpecifier, DelayType, HeaderOperations, HttpRetry, HttpRoute, RedirectPort,
    RedirectPortSelection,
};
use pasa_istio::virtual_service::{Destination, MatchType, Percent, StringMatch, VirtualService};

use super::builders::duration;
use super::{metadata, names};
use crate::model::registry::{Config, PersistentSession, Service};

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

fn action(
    rule: &HttpRoute,
    namespace: &str,
    port: u32,
    destinations: &impl Destinations,
) -> Action {
    if let Some(redirect) = &rule.redirect {
        let mut r = RedirectAction {
            host_redirect: redirect.authority.clone(),
            response_code: match redirect.redirect_code {
                302 => redirect_action::RedirectResponseCode::Found,
                303 => redirect_action::RedirectResponseCode::SeeOther,
                307 => redirect_action::RedirectResponseCode::TemporaryRedirect,
                308 => redirect_action::RedirectResponseCode::PermanentRedirect,
                _ => redirect_action::RedirectResponseCode::MovedPermanently,
            } as i32,
            ..Default::default()
        };
        if !redirect.uri.is_empty() {
            r.path_rewrite_specifier = Some(redirect_action::PathRewriteSpecifier::PathRedirect(
                redirect.uri.clone(),
            ));
        } else if !redirect.prefix_rewrite.is_empty() {
            r.path_rewrite_specifier = Some(redirect_action::PathRewriteSpecifier::PrefixRewrite(
                redirect.prefix_rewrite.clone(),
            ));
        }
        if !redirect.scheme.is_empty() {
            r.scheme_rewrite_specifier = Some(
                redirect_action::SchemeRewriteSpecifier::SchemeRedirect(redirect.scheme.clone()),
            );
        }
        match redirect.redirect_port {
            Some(RedirectPort::Port(p)) => r.port_redirect = p,
            Some(RedirectPort::DerivePort(RedirectPortSelection::FromRequestPort)) => {
                r.port_redirect = port;
            }
            _ => {}
        }
        return Action::Redirect(r);
    }
    if let Some(direct) = &rule.direct_response {
        use envoy_types::pb::envoy::config::core::v3::{DataSource, data_source::Specifier};
        let body = direct.body.as_ref().and_then(|b| match &b.specifier {
            Some(BodySpecifier::String(s)) => Some(Specifier::InlineString(s.clone())),
            Some(BodySpecifier::Bytes(b)) => Some(Specifier::InlineBytes(b.clone())),
            None => None,
        });
        return Action::DirectResponse(DirectResponseAction {
            status: direct.status,
            body: body.map(|s| DataSource {
                specifier: Some(s),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    let timeout = rule.timeout.as_ref().map_or_else(zero, duration);
    // Deprecated in Envoy's API, and what istiod sends (its replacement has regressions).
    #[allow(deprecated)]
    let mut ra = RouteAction {
        // gRPC's `grpc-timeout` header bounds the request up to the route's timeout (without
        // one, as long as the client says), as from istiod.
        max_grpc_timeout: Some(timeout),
        timeout: Some(timeout),
        ..Default::default()
    };
    let targets: Vec<(String, u32, Option<&pasa_istio::virtual_service::Headers>)> = rule
        .route
        .iter()
        .filter_map(|d| {
            let dest = d.destination.as_ref()?;
            Some((
                destinations.cluster(dest, namespace, port),
                d.weight.max(0) as u32,
                d.headers.as_ref(),
            ))
        })
        .collect();
    let dests: Vec<&Destination> = rule
        .route
        .iter()
        .filter(|d| d.weight > 0 || rule.route.len() == 1)
        .filter_map(|d| d.destination.as_ref())
        .collect();
    // Each destination's consistent hash, in order, as istiod appends them.
    ra.hash_policy = dests
        .iter()
        .filter_map(|d| destinations.hash_policy(&[d], namespace, port))
        .collect();
    // Retries keep a consistent-hash destination's host (istiod looks at a single destination).
    let consistent_hash = match rule.route.as_slice() {
        [only] => only
            .destination
            .as_ref()
            .is_some_and(|d| destinations.hash_policy(&[d], namespace, port).is_some()),
        _ => false,
    };
    ra.retry_policy = retry(
        rule.retries.as_ref().or(destinations.default_retry()),
        consistent_hash,
    );
    ra.cluster_specifier = match targets.as_slice() {
        [] => None,
        [(cluster, _, _)] => Some(ClusterSpecifier::Cluster(cluster.clone())),
        many => {
            let nonzero: Vec<_> = many.iter().filter(|t| t.1 > 0).collect();
            if let [(cluster, _, _)] = nonzero.as_slice() {
                Some(ClusterSpecifier::Cluster(cluster.clone()))
            } else {
                Some(ClusterSpecifier::WeightedClusters(WeightedCluster {
                    clusters: nonzero
                        .iter()
                        .map(|(cluster, weight, headers)| {
                            let mut cw = ClusterWeight {
                                name: cluster.clone(),
                                weight: Some(UInt32Value { value: *weight }),
                                ..Default::default()
                            };
                            if let Some(h) = headers {
                                let edits = HeaderEdits::of(h);
                                cw.request_headers_to_add = edits.request_add;
                                cw.request_headers_to_remove = edits.request_remove;
                                cw.response_headers_to_add = edits.response_add;
                                cw.response_headers_to_remove = edits.response_remove;
                                cw.host_rewrite_specifier = edits.authority.map(
                                    weighted_cluster::cluster_weight::HostRewriteSpecifier::HostRewriteLiteral,
                                );
                            }
                            cw
                        })
                        .collect(),
                    ..Default::default()
                }))
            }
        }
    };
    if let Some(rewrite) = &rule.rewrite {
        if !rewrite.uri.is_empty() {
            ra.prefix_rewrite = rewrite.uri.clone();
        }
        if let Some(rr) = &rewrite.uri_regex_rewrite {
            ra.regex_rewrite = Some(RegexMatchAndSubstitute {
                pattern: Some(regex(&rr.pattern)),
                substitution: rr.rewrite.clone(),
            });
        }
    }
    // The authority: a rewrite's, else a `host` (or `:authority`) header the route sets, else
    // one its single destination sets; Envoy may not edit these as ordinary headers.
    let authority = rule
        .rewrite
        .as_ref()
        .map(|r| r.authority.clone())
        .filter(|a| !a.is_empty())
        .or_else(|| {
            rule.headers
                .as_ref()
                .and_then(|h| HeaderEdits::of(h).authority)
        })
        .or_else(|| {
            single_destination(rule)
                .and_then(|d| d.headers.as_ref())
                .and_then(|h| HeaderEdits::of(h).authority)
        });
    if let Some(authority) = authority {
        ra.host_rewrite_specifier = Some(HostRewriteSpecifier::HostRewriteLiteral(authority));
    }
    let mirrors = rule
        .mirror
        .iter()
        .map(|d| {
            let pct = rule
                .mirror_percentage
                .map(|p| p.value)
                .or(rule.mirror_percent.map(f64::from));
            (d, pct)
        })
        .chain(
            rule.mirrors
                .iter()
                .filter_map(|m| Some((m.destination.as_ref()?, m.percentage.map(|p| p.value)))),
        );
    for (dest, pct) in mirrors {
        ra.request_mirror_policies.push(RequestMirrorPolicy {
            cluster: destinations.cluster(dest, namespace, port),
            runtime_fraction: Some(RuntimeFractionalPercent {
                default_value: Some(fraction(pct.unwrap_or(100.0))),
                ..Default::default()
            }),
            trace_sampled: Some(envoy_types::pb::google::protobuf::BoolValue { value: false }),
            ..Default::default()
        });
    }
    Action::Route(ra)
}

/// Route-level extras: header edits, fault injection, CORS, and the persistent sessions of the
/// first destination's service that has them (istiod's choice when several have).
fn decorate(
    route: &mut Route,
    rule: &HttpRoute,
    namespace: &str,
    _port: u32,
    destinations: &impl Destinations,
) {
    let session = rule
        .route
        .iter()
        .filter_map(|r| r.destination.as_ref())
        .find_map(|d| destinations.persistent_session(d, namespace));
    if let Some(session) = session {
        super::session::configure(&mut route.typed_per_filter_config, session);
    }
    // The route's own edits, then those of its single destination (several destinations
    // carry theirs on their weighted clusters).
    let single = matches!(route.action, Some(Action::Route(_)))
        .then(|| single_destination(rule).and_then(|d| d.headers.as_ref()))
        .flatten();
    for h in rule.headers.iter().chain(single) {
        let edits = HeaderEdits::of(h);
        route.request_headers_to_add.extend(edits.request_add);
        route.request_headers_to_remove.extend(edits.request_remove);
        route.response_headers_to_add.extend(edits.response_add);
        route
            .response_headers_to_remove
            .extend(edits.response_remove);
    }
    if let Some(fault) = &rule.fault {
        let mut f = HttpFault::default();
        if let Some(delay) = &fault.delay
            && let Some(DelayType::FixedDelay(d)) = &delay.delay_type
        {
            f.delay = Some(FaultDelay {
                fault_delay_secifier: Some(FaultDelaySecifier::FixedDelay(duration(d))),
                percentage: Some(percentage(delay.percentage, delay.percent)),
            });
        }
        if let Some(abort) = &fault.abort {
            let error_type = match &abort.error_type {
                Some(AbortErrorType::HttpStatus(s)) => Some(ErrorType::HttpStatus(*s as u32)),
                Some(AbortErrorType::GrpcStatus(name)) => {
                    pasa_istio::common::grpc_status_code(name).map(ErrorType::GrpcStatus)
                }
                _ => None,
            };
            if error_type.is_some() {
                f.abort = Some(FaultAbort {
                    error_type,
                    percentage: Some(percentage(abort.percentage, 0)),
                    ..Default::default()
                });
            }
        }
        route
            .typed_per_filter_config
            .insert(FAULT_FILTER.into(), pack_any(f));
    }
    if let Some(cors) = &rule.cors_policy {
        route
            .typed_per_filter_config
            .insert(CORS_FILTER.into(), cors_policy(cors));
    }
}

fn cors_policy(cors: &pasa_istio::virtual_service::CorsPolicy) -> Any {
    use envoy_types::pb::envoy::extensions::filters::http::cors::v3::CorsPolicy;
    let mut origins: Vec<StringMatcher> = cors
        .allow_origins
        .iter()
        .filter_map(string_matcher)
        .collect();
    origins.extend(cors.allow_origin.iter().map(|o| StringMatcher {
        match_pattern: Some(MatchPattern::Exact(o.clone())),
        ..Default::default()
    }));
    pack_any(CorsPolicy {
        allow_origin_string_match: origins,
        allow_methods: cors.allow_methods.join(","),
        allow_headers: cors.allow_headers.join(","),
        expose_headers: cors.expose_headers.join(","),
        max_age: cors
            .max_age
            .as_ref()
            .map(|d| d.seconds.to_string())
            .unwrap_or_default(),
        allow_credentials: cors
            .allow_credentials
            .map(|value| envoy_types::pb::google::protobuf::BoolValue { value }),
        // On for every request, and preflights no origin matches go on to the app (unless the
        // policy says to ignore them), as istiod sets them.
        filter_enabled: Some(RuntimeFractionalPercent {
            default_value: Some(FractionalPercent {
                numerator: 100,
                denominator: DenominatorType::Hundred as i32,
            }),
            ..Default::default()
        }),
        forward_not_matching_preflights: Some(envoy_types::pb::google::protobuf::BoolValue {
            value: cors.unmatched_preflights
                != pasa_istio::virtual_service::UnmatchedPreflights::Ignore,
        }),
        ..Default::default()
    })
}

/// A fault percentage: `percentage` when set, else the deprecated whole `percent`, else all.
fn percentage(p: Option<Percent>, whole: i32) -> FractionalPercent {
    match p {
        Some(p) => fraction(p.value),
        None if whole > 0 => fraction(f64::from(whole)),
        None => fraction(100.0),
    }
}

fn fraction(percent: f64) -> FractionalPercent {
    FractionalPercent {
        numerator: (percent * 10_000.0).round().clamp(0.0, 1_000_000.0) as u32,
        denominator: DenominatorType::Million as i32,
    }
}

/// Istio's retry policy, as istiod converts one: `policy` (a route's, else the mesh config's
/// `defaultHttpRetryPolicy`), or Istio's default (2 attempts on connection failures, refused
/// streams, `unavailable`, `cancelled`, and the status codes a request's
/// `x-envoy-retriable-status-codes` names), each retry to another host unless the destination
/// hashes consistently; none for `attempts: 0`.
fn retry(policy: Option<&HttpRetry>, consistent_hash: bool) -> Option<RetryPolicy> {
    let mut out = default_retry(consistent_hash);
    let Some(r) = policy else {
        return Some(out);
    };
    if r.attempts <= 0 {
        return None;
    }
    out.num_retries = Some(UInt32Value {
        value: r.attempts as u32,
    });
    out.per_try_timeout = r.per_try_timeout.as_ref().map(duration);
    if !r.retry_on.is_empty() {
        let (codes, conditions): (Vec<&str>, Vec<&str>) = r
            .retry_on
            .split(',')
            .map(str::trim)
            .partition(|p| p.parse::<u32>().is_ok());
        let mut on: Vec<&str> = conditions;
        out.retriable_status_codes = codes.iter().filter_map(|c| c.parse().ok()).collect();
        if !out.retriable_status_codes.is_empty() && !on.contains(&"retriable-status-codes") {
            on.push("retriable-status-codes");
        }
        out.retry_on = on.join(",");
    }
    if let Some(ignore) = r.retry_ignore_previous_hosts {
        out.retry_host_predicate = if ignore { previous_hosts() } else { Vec::new() };
    }
    if r.retry_remote_localities == Some(true) {
        out.retry_priority = Some(retry_policy::RetryPriority {
            name: "envoy.retry_priorities.previous_priorities".into(),
            config_type: Some(retry_policy::retry_priority::ConfigType::TypedConfig(
                pack_any(PreviousPrioritiesConfig {
                    update_frequency: 2,
                }),
            )),
        });
    }
    if let Some(backoff) = &r.backoff {
        out.retry_back_off = Some(retry_policy::RetryBackOff {
            base_interval: Some(duration(backoff)),
            ..Default::default()
        });
    }
    Some(out)
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

/// Istio's default retry policy.
fn default_retry(consistent_hash: bool) -> RetryPolicy {
    RetryPolicy {
        retry_on: "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
            .into(),
        num_retries: Some(UInt32Value { value: 2 }),
        host_selection_retry_max_attempts: 5,
        retry_host_predicate: if consistent_hash {
            Vec::new()
        } else {
            previous_hosts()
        },
        ..Default::default()
    }
}

/// Retries go to a host not tried before.
fn previous_hosts() -> Vec<retry_policy::RetryHostPredicate> {
    vec![retry_policy::RetryHostPredicate {
        name: "envoy.retry_host_predicates.previous_hosts".into(),
        config_type: Some(retry_policy::retry_host_predicate::ConfigType::TypedConfig(
            pack_any(PreviousHostsPredicate::default()),
        )),
    }]
}

fn zero() -> Duration {
    Duration {
        seconds: 0,
        nanos: 0,
    }
}

/// The one destination a rule sends to: its only one, or its only one with a weight.
fn single_destination(
    rule: &HttpRoute,
) -> Option<&pasa_istio::virtual_service::HttpRouteDestination> {
    let with_destination: Vec<_> = rule
        .route
        .iter()
        .filter(|d| d.destination.is_some())
        .collect();
    match with_destination.as_slice() {
        [only] => Some(only),
        many => {
            let weighted: Vec<_> = many.iter().filter(|d| d.weight > 0).collect();
            match weighted.as_slice() {
                [only] => Some(**only),
                _ => None,
            }
        }
    }
}

/// Istio's header operations as Envoy's: `set` overwrites, `add` appends (sorted by name, `set`
/// first); the pseudo-headers and `host`, which Envoy refuses to edit, are left out, and a `host`
/// or `:authority` a request sets (`set` over `add`) becomes the authority rewrite.
#[derive(Default)]
struct HeaderEdits {
    request_add: Vec<HeaderValueOption>,
    request_remove: Vec<String>,
    response_add: Vec<HeaderValueOption>,
    response_remove: Vec<String>,
    authority: Option<String>,
}

impl HeaderEdits {
    fn of(headers: &pasa_istio::virtual_service::Headers) -> HeaderEdits {
        let mut edits = HeaderEdits::default();
        if let Some(req) = &headers.request {
            edits.request_add = header_options(req);
            edits.request_remove = removable(&req.remove);
            let authority = |m: &std::collections::BTreeMap<String, String>| {
                m.iter()
                    .filter(|(k, _)| is_authority(k))
                    .map(|(_, v)| v.clone())
                    .next_back()
            };
            edits.authority = authority(&req.set).or_else(|| authority(&req.add));
        }
        if let Some(resp) = &headers.response {
            edits.response_add = header_options(resp);
            edits.response_remove = removable(&resp.remove);
        }
        edits
    }
}

/// `host` and the pseudo-headers: Envoy's own, never edited as ordinary headers.
fn is_internal_header(name: &str) -> bool {
    name.starts_with(':') || name.eq_ignore_ascii_case("host")
}

fn is_authority(name: &str) -> bool {
    name.eq_ignore_ascii_case("host") || name.eq_ignore_ascii_case(":authority")
}

fn removable(names: &[String]) -> Vec<String> {
    names
        .iter()
        .filter(|n| !is_internal_header(n))
        .cloned()
        .collect()
}

fn header_options(ops: &HeaderOperations) -> Vec<HeaderValueOption> {
    let option = |(key, value): (&String, &String), action: HeaderAppendAction| HeaderValueOption {
        header: Some(HeaderValue {
            key: key.clone(),
            value: value.clone(),
            ..Default::default()
        }),
        append_action: action as i32,
        ..Default::default()
    };
    let external = |(key, _): &(&String, &String)| !is_internal_header(key);
    ops.set
        .iter()
        .filter(external)
        .map(|kv| option(kv, HeaderAppendAction::OverwriteIfExistsOrAdd))
        .chain(
            ops.add
                .iter()
                .filter(external)
                .map(|kv| option(kv, HeaderAppendAction::AppendIfExistsOrAdd)),
        )
        .collect()
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
