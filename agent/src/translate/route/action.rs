//! What a route does with a request: redirect, direct response, or forward it to its weighted
//! destinations' clusters with the rule's rewrite, timeout, retries (Istio's default policy or the
//! rule's) and mirrors.

use envoy_types::pb::envoy::config::core::v3::RuntimeFractionalPercent;
use envoy_types::pb::envoy::config::route::v3::route::Action;
use envoy_types::pb::envoy::config::route::v3::route_action::{
    ClusterSpecifier, HostRewriteSpecifier, RequestMirrorPolicy,
};
use envoy_types::pb::envoy::config::route::v3::{
    DirectResponseAction, RedirectAction, RetryPolicy, RouteAction, WeightedCluster,
    redirect_action, retry_policy, weighted_cluster, weighted_cluster::ClusterWeight,
};
use envoy_types::pb::envoy::extensions::retry::host::previous_hosts::v3::PreviousHostsPredicate;
use envoy_types::pb::envoy::extensions::retry::priority::previous_priorities::v3::PreviousPrioritiesConfig;
use envoy_types::pb::envoy::r#type::matcher::v3::RegexMatchAndSubstitute;
use envoy_types::pb::google::protobuf::UInt32Value;
use envoy_types::util::pack_any;
use pasa_istio::virtual_service::Destination;
use pasa_istio::virtual_service::{
    BodySpecifier, HttpRetry, HttpRoute, RedirectPort, RedirectPortSelection,
};

use super::super::builders::duration;
use super::extras::{HeaderEdits, fraction};
use super::{Destinations, regex, zero};

pub(super) fn action(
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

/// Istio's retry policy, as istiod converts one: `policy` (a route's, else the mesh config's
/// `defaultHttpRetryPolicy`), or Istio's default (2 attempts on connection failures, refused
/// streams, `unavailable`, `cancelled`, and the status codes a request's
/// `x-envoy-retriable-status-codes` names), each retry to another host unless the destination
/// hashes consistently; none for `attempts: 0`.
pub(super) fn retry(policy: Option<&HttpRetry>, consistent_hash: bool) -> Option<RetryPolicy> {
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

/// Istio's default retry policy.
pub(super) fn default_retry(consistent_hash: bool) -> RetryPolicy {
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
pub(super) fn previous_hosts() -> Vec<retry_policy::RetryHostPredicate> {
    vec![retry_policy::RetryHostPredicate {
        name: "envoy.retry_host_predicates.previous_hosts".into(),
        config_type: Some(retry_policy::retry_host_predicate::ConfigType::TypedConfig(
            pack_any(PreviousHostsPredicate::default()),
        )),
    }]
}

/// The one destination a rule sends to: its only one, or its only one with a weight.
pub(super) fn single_destination(
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
