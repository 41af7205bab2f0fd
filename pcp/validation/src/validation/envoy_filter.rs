//! Validation of `EnvoyFilter` (`networking.istio.io` v1alpha3), following istiod's webhook: a
//! warning on every EnvoyFilter (it reaches into generated Envoy config), the workload selector,
//! and each patch — an object kind, an operation, a value unless it removes, a proxy version
//! expression that compiles, a match of the kind the patch applies to (listener, route
//! configuration or cluster) with the filter and sub-filter names such a match needs, and a value
//! that reads as the Envoy type the patch applies to (see [`patch_value`]). Waypoint patches are
//! not checked beyond the CRD, as istiod does not check them. The CRD schema's own rules
//! (`targetRefs`, the selector's limits, the waypoint match, named enum values) are checked too,
//! as PCP has no API server in front of it.

mod envoy_schema;
mod patch_value;

use pasa_istio::authorization_policy::PolicyTargetReference;
use pasa_istio::envoy_filter::{
    ApplyTo, EnvoyConfigObjectMatch, EnvoyConfigObjectPatch, EnvoyFilter, FilterClass,
    ListenerMatch, Operation, PatchContext, RouteAction,
};
use pasa_istio::service_entry::WorkloadSelector;
use pasa_proto::Object;

use super::common::{validate_selector_label_limits, validate_selector_labels};
use super::virtual_service::re2;
use super::{Path, Report, parse};

/// The warning istiod gives on every EnvoyFilter it admits.
const EXPOSES_INTERNALS: &str = "EnvoyFilter exposes internal implementation details that may \
     change at any time. Prefer other APIs if possible, and exercise extreme caution, especially \
     around upgrades.";

/// Longest proxy version expression istiod compiles; a longer one is ignored, with a warning.
const MAX_PROXY_VERSION_LENGTH: usize = 1024;

/// The network filter that holds HTTP filters, by its current and its deprecated name.
const HTTP_CONNECTION_MANAGER: &str = "envoy.filters.network.http_connection_manager";
const HTTP_CONNECTION_MANAGER_DEPRECATED: &str = "envoy.http_connection_manager";

/// Filter names Envoy has deprecated, each with the name to use instead (istiod warns when a
/// match uses one). `envoy.ext_authz` named both the network and the HTTP filter; it is read as
/// the network filter in a filter match and as the HTTP filter in a sub-filter match.
const DEPRECATED_FILTER_NAMES: [(&str, &str); 25] = [
    ("envoy.buffer", "envoy.filters.http.buffer"),
    ("envoy.cors", "envoy.filters.http.cors"),
    ("envoy.csrf", "envoy.filters.http.csrf"),
    ("envoy.http_dynamo_filter", "envoy.filters.http.dynamo"),
    ("envoy.fault", "envoy.filters.http.fault"),
    (
        "envoy.grpc_http1_bridge",
        "envoy.filters.http.grpc_http1_bridge",
    ),
    (
        "envoy.grpc_json_transcoder",
        "envoy.filters.http.grpc_json_transcoder",
    ),
    ("envoy.grpc_web", "envoy.filters.http.grpc_web"),
    ("envoy.gzip", "envoy.filters.http.gzip"),
    ("envoy.health_check", "envoy.filters.http.health_check"),
    ("envoy.ip_tagging", "envoy.filters.http.ip_tagging"),
    ("envoy.lua", "envoy.filters.http.lua"),
    ("envoy.rate_limit", "envoy.filters.http.ratelimit"),
    ("envoy.router", "envoy.filters.http.router"),
    ("envoy.squash", "envoy.filters.http.squash"),
    (
        "envoy.listener.http_inspector",
        "envoy.filters.listener.http_inspector",
    ),
    (
        "envoy.listener.original_dst",
        "envoy.filters.listener.original_dst",
    ),
    (
        "envoy.listener.original_src",
        "envoy.filters.listener.original_src",
    ),
    (
        "envoy.listener.proxy_protocol",
        "envoy.filters.listener.proxy_protocol",
    ),
    (
        "envoy.listener.tls_inspector",
        "envoy.filters.listener.tls_inspector",
    ),
    (
        "envoy.client_ssl_auth",
        "envoy.filters.network.client_ssl_auth",
    ),
    (HTTP_CONNECTION_MANAGER_DEPRECATED, HTTP_CONNECTION_MANAGER),
    ("envoy.mongo_proxy", "envoy.filters.network.mongo_proxy"),
    ("envoy.ratelimit", "envoy.filters.network.ratelimit"),
    ("envoy.redis_proxy", "envoy.filters.network.redis_proxy"),
];

/// Checks one EnvoyFilter.
pub fn validate(obj: &Object, report: &mut Report) {
    let Some(filter) = parse::<EnvoyFilter>(obj, report) else {
        return;
    };
    let spec = Path::spec();
    validate_schema(&spec, &filter, report);

    if let Some(selector) = &filter.workload_selector
        && !validate_selector(&spec.field("workloadSelector"), selector, report)
    {
        // istiod stops at a selector it refuses.
        return;
    }
    report.warn(&spec, EXPOSES_INTERNALS);

    let patches = spec.field("configPatches");
    for (i, patch) in filter.config_patches.iter().enumerate() {
        let at = patches.index(i);
        match patch {
            None => report.error(&at, "Envoy filter: null config patch"),
            Some(patch) => validate_patch(&at, patch, report),
        }
    }
}

/// The workload selector: labels as for every selector, with a warning when there are none.
/// Returns whether istiod goes on.
fn validate_selector(at: &Path, selector: &WorkloadSelector, report: &mut Report) -> bool {
    let mut found = Report::default();
    validate_selector_labels(&at.field("labels"), &selector.labels, &mut found);
    let refused = !found.errors.is_empty();
    report.errors.extend(found.errors);
    if !refused && !found.warnings.is_empty() {
        report.warn(
            at,
            "Envoy filter: workload selector specified without labels, will be applied to all \
             services in namespace",
        );
    }
    !refused
}

/// One patch, as istiod checks it: each problem that makes the rest meaningless ends the check.
fn validate_patch(at: &Path, patch: &EnvoyConfigObjectPatch, report: &mut Report) {
    let matching = patch.match_.as_ref();
    if matching.is_some_and(|m| m.context == PatchContext::Waypoint) {
        return;
    }
    if patch.apply_to == ApplyTo::Invalid {
        report.error(&at.field("applyTo"), "Envoy filter: missing applyTo");
        return;
    }
    let Some(change) = &patch.patch else {
        report.error(&at.field("patch"), "Envoy filter: missing patch");
        return;
    };
    let patch_at = at.field("patch");
    if change.operation == Operation::Invalid {
        report.error(
            &patch_at.field("operation"),
            "Envoy filter: missing patch operation",
        );
        return;
    }
    if change.operation != Operation::Remove && change.value.is_none() {
        report.error(
            &patch_at.field("value"),
            "Envoy filter: missing patch value for non-remove operation",
        );
        return;
    }
    if let Some(m) = matching
        && !validate_proxy_version(&at.field("match"), m, report)
    {
        return;
    }
    if let Some(m) = matching
        && !validate_match_kind(&at.field("match"), patch.apply_to, m, report)
    {
        return;
    }
    if let Some(value) = &change.value {
        patch_value::validate(patch.apply_to, value, &patch_at.field("value"), report);
    }
}

/// The proxy version expression compiles (RE2), unless it is too long to be used at all.
/// Returns whether istiod goes on.
fn validate_proxy_version(at: &Path, m: &EnvoyConfigObjectMatch, report: &mut Report) -> bool {
    let Some(version) = m.proxy.as_ref().map(|p| p.proxy_version.as_str()) else {
        return true;
    };
    let at = at.field("proxy").field("proxyVersion");
    if version.len() > MAX_PROXY_VERSION_LENGTH {
        report.warn(
            &at,
            format!(
                "Envoy filter: proxyVersion match exceeds {MAX_PROXY_VERSION_LENGTH} characters \
                 and will be ignored"
            ),
        );
        return true;
    }
    match re2::syntax_error(version) {
        None => true,
        Some(e) => {
            report.error(
                &at,
                format!(
                    "Envoy filter: invalid regex for proxy version, [error parsing regexp: {e}]"
                ),
            );
            false
        }
    }
}

/// The match selects objects of the class the patch applies to. Returns whether istiod goes on
/// (to the value).
fn validate_match_kind(
    at: &Path,
    apply_to: ApplyTo,
    m: &EnvoyConfigObjectMatch,
    report: &mut Report,
) -> bool {
    if m.object.is_none() {
        return true;
    }
    match apply_to {
        ApplyTo::Listener | ApplyTo::FilterChain | ApplyTo::NetworkFilter | ApplyTo::HttpFilter => {
            let Some(listener) = m.listener() else {
                report.error(
                    at,
                    "Envoy filter: applyTo for listener class objects cannot have non listener \
                     match",
                );
                return false;
            };
            validate_filter_match(&at.field("listener"), apply_to, listener, report)
        }
        ApplyTo::RouteConfiguration | ApplyTo::VirtualHost | ApplyTo::HttpRoute => {
            if m.route_configuration().is_none() {
                report.error(
                    at,
                    "Envoy filter: applyTo for http route class objects cannot have non route \
                     configuration match",
                );
            }
            true
        }
        ApplyTo::Cluster => {
            if m.cluster().is_none() {
                report.error(
                    at,
                    "Envoy filter: applyTo for cluster class objects cannot have non cluster match",
                );
            }
            true
        }
        _ => true,
    }
}

/// A filter match inside a listener match: named, with a sub-filter only inside the HTTP
/// connection manager and for HTTP filters. Returns whether istiod goes on.
fn validate_filter_match(
    at: &Path,
    apply_to: ApplyTo,
    listener: &ListenerMatch,
    report: &mut Report,
) -> bool {
    let Some(filter) = listener
        .filter_chain
        .as_ref()
        .and_then(|fc| fc.filter.as_ref())
    else {
        return true;
    };
    let at = at.field("filterChain").field("filter");
    if matches!(apply_to, ApplyTo::Listener | ApplyTo::FilterChain) {
        report.warn(
            &at,
            format!("Envoy filter: filter match has no effect when used with {apply_to}"),
        );
    }
    if filter.name.is_empty() {
        report.error(
            &at.field("name"),
            "Envoy filter: filter match has no name to match on",
        );
        return false;
    }
    if let Some(sub_filter) = &filter.sub_filter {
        if apply_to != ApplyTo::HttpFilter {
            report.error(
                &at.field("subFilter"),
                "Envoy filter: subfilter match can be used with applyTo HTTP_FILTER only",
            );
            return false;
        }
        if filter.name != HTTP_CONNECTION_MANAGER
            && filter.name != HTTP_CONNECTION_MANAGER_DEPRECATED
        {
            report.error(
                &at.field("name"),
                format!(
                    "Envoy filter: subfilter match requires filter match with \
                     {HTTP_CONNECTION_MANAGER}"
                ),
            );
            return false;
        }
        if sub_filter.name.is_empty() {
            report.error(
                &at.field("subFilter").field("name"),
                "Envoy filter: subfilter match has no name to match on",
            );
            return false;
        }
    }
    warn_deprecated_name(
        &at.field("name"),
        &filter.name,
        "envoy.filters.network.ext_authz",
        report,
    );
    if let Some(sub_filter) = &filter.sub_filter {
        warn_deprecated_name(
            &at.field("subFilter").field("name"),
            &sub_filter.name,
            "envoy.filters.http.ext_authz",
            report,
        );
    }
    true
}

/// A warning for a deprecated filter name; `ext_authz` is what `envoy.ext_authz` stands for here.
fn warn_deprecated_name(at: &Path, name: &str, ext_authz: &str, report: &mut Report) {
    let replacement = if name == "envoy.ext_authz" {
        Some(ext_authz)
    } else {
        DEPRECATED_FILTER_NAMES
            .iter()
            .find(|(old, _)| *old == name)
            .map(|(_, new)| *new)
    };
    if let Some(new) = replacement {
        report.warn(
            at,
            format!("using deprecated filter name {name:?}; use {new:?} instead"),
        );
    }
}

/// What the CRD schema adds to istiod's checks.
fn validate_schema(spec: &Path, filter: &EnvoyFilter, report: &mut Report) {
    /// The CRD's caps on a workload selector and on `targetRefs`.
    const MAX_SELECTOR_LABELS: usize = 256;
    const MAX_TARGET_REFS: usize = 16;

    if filter.workload_selector.is_some() && !filter.target_refs.is_empty() {
        report.error(
            spec,
            "only one of targetRefs or workloadSelector can be set",
        );
    }
    if let Some(selector) = &filter.workload_selector {
        validate_selector_label_limits(
            &spec.field("workloadSelector").field("labels"),
            &selector.labels,
            MAX_SELECTOR_LABELS,
            report,
        );
    }
    let refs = spec.field("targetRefs");
    if filter.target_refs.len() > MAX_TARGET_REFS {
        report.error(
            &refs,
            format!(
                "at most {MAX_TARGET_REFS} targetRefs may be given, found {}",
                filter.target_refs.len()
            ),
        );
    }
    for (i, target) in filter.target_refs.iter().enumerate() {
        validate_target_ref(&refs.index(i), target, report);
    }

    let patches = spec.field("configPatches");
    for (i, patch) in filter.config_patches.iter().enumerate() {
        let Some(patch) = patch else { continue };
        let at = patches.index(i);
        if let ApplyTo::Unknown(n) = patch.apply_to {
            unnamed(&at.field("applyTo"), "applyTo", n, ApplyTo::NAMES, report);
        }
        if let Some(change) = &patch.patch {
            let at = at.field("patch");
            if let Operation::Unknown(n) = change.operation {
                unnamed(
                    &at.field("operation"),
                    "operation",
                    n,
                    Operation::NAMES,
                    report,
                );
            }
            if let FilterClass::Unknown(n) = change.filter_class {
                let names = FilterClass::NAMES;
                unnamed(&at.field("filterClass"), "filterClass", n, names, report);
            }
        }
        if let Some(m) = &patch.match_ {
            validate_match_schema(&at.field("match"), m, report);
        }
    }
}

/// The CRD's rules on a match: named enum values, and a waypoint match exactly when the context
/// is `WAYPOINT`, on a real port.
fn validate_match_schema(at: &Path, m: &EnvoyConfigObjectMatch, report: &mut Report) {
    if let PatchContext::Unknown(n) = m.context {
        unnamed(
            &at.field("context"),
            "context",
            n,
            PatchContext::NAMES,
            report,
        );
    }
    let waypoint = m.waypoint();
    if (m.context == PatchContext::Waypoint) != waypoint.is_some() {
        report.error(at, "only support waypointMatch when context is WAYPOINT");
    }
    if let Some(port) = waypoint.and_then(|w| w.port_number)
        && !(1..=65535).contains(&port)
    {
        report.error(
            &at.field("waypoint").field("portNumber"),
            "port must be between 1-65535",
        );
    }
    let action = m
        .route_configuration()
        .and_then(|r| r.vhost.as_ref())
        .and_then(|v| v.route.as_ref())
        .map(|r| r.action);
    if let Some(RouteAction::Unknown(n)) = action {
        let at = at
            .field("routeConfiguration")
            .field("vhost")
            .field("route")
            .field("action");
        unnamed(&at, "route action", n, RouteAction::NAMES, report);
    }
}

fn unnamed(at: &Path, what: &str, n: i32, names: &[&str], report: &mut Report) {
    report.error(
        at,
        format!("unknown {what} {n}: expected one of {}", names.join(", ")),
    );
}

/// A `targetRefs` entry as the CRD admits it: a kind and a name, in the EnvoyFilter's namespace.
fn validate_target_ref(at: &Path, target: &PolicyTargetReference, report: &mut Report) {
    const MAX_GROUP_LENGTH: usize = 253;
    const MAX_KIND_LENGTH: usize = 63;
    const MAX_NAME_LENGTH: usize = 253;

    if target.group.len() > MAX_GROUP_LENGTH || !is_group(&target.group) {
        report.error(
            &at.field("group"),
            format!(
                "invalid group {:?}: expected a DNS subdomain of at most {MAX_GROUP_LENGTH} \
                 characters, or empty for the core group",
                target.group
            ),
        );
    }
    if target.kind.is_empty() {
        report.error(&at.field("kind"), "kind is required");
    } else if target.kind.len() > MAX_KIND_LENGTH || !is_kind(&target.kind) {
        report.error(
            &at.field("kind"),
            format!(
                "invalid kind {:?}: expected a letter, then letters, digits or '-', at most \
                 {MAX_KIND_LENGTH} characters",
                target.kind
            ),
        );
    }
    if target.name.is_empty() {
        report.error(&at.field("name"), "name is required");
    } else if target.name.len() > MAX_NAME_LENGTH {
        report.error(
            &at.field("name"),
            format!("name may be at most {MAX_NAME_LENGTH} characters long"),
        );
    }
    if !target.namespace.is_empty() {
        report.error(
            &at.field("namespace"),
            "cross namespace referencing is not currently supported",
        );
    }
}

/// Lowercase DNS labels joined by dots, or empty.
fn is_group(group: &str) -> bool {
    group.is_empty()
        || group.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

/// A letter, then letters, digits and dashes, not ending with a dash.
fn is_kind(kind: &str) -> bool {
    let b = kind.as_bytes();
    b.first().is_some_and(u8::is_ascii_alphabetic)
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
        && b.last() != Some(&b'-')
}

#[cfg(test)]
mod tests;
