//! AuthorizationPolicy to Envoy's RBAC filters, as istiod builds them: one filter per action
//! that has policies, in the order AUDIT, DENY, ALLOW, each holding one RBAC policy per rule
//! (`ns[<namespace>]-policy[<name>]-rule[<i>]`), dry-run policies as shadow rules.
//!
//! A rule becomes a policy whose permissions (what is done: hosts, methods, paths, ports,
//! destination conditions) and principals (who does it: identities, namespaces, IPs, request
//! principals, headers, claims) are built from its `to`, `from` and `when` entries. On a TCP
//! filter chain the HTTP-only attributes cannot be evaluated: an ALLOW rule that needs one is
//! dropped (so less is allowed), while in a DENY or AUDIT rule such a value is ignored (so more
//! is denied). CUSTOM policies (ext_authz) are built in [`custom`], before these filters.
//!
//! This module builds the filters from the policies that apply; a rule's model (its conditions,
//! generated into permissions and principals) is in [`model`], the matchers and values those are
//! made of in [`matchers`], and the trust domain with its aliases in [`trust_domain`].

use envoy_types::pb::envoy::config::listener::v3::Filter as NetworkFilter;
use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType as NetworkConfigType;
use envoy_types::pb::envoy::config::rbac::v3::{
    Policy, Rbac, rbac,
};
use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType as HttpConfigType;
use envoy_types::pb::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;
use envoy_types::util::pack_any;
use pasa_istio::authorization_policy::{
    Action, AuthorizationPolicy, DRY_RUN_ANNOTATION, go_bool,
};
use pasa_istio::request_authentication::{JwtRule, KeySetSource};

mod matchers;
mod model;
mod trust_domain;
use matchers::{any_permission, any_principal, matcher, not_permission, not_principal};
use model::Model;
pub use trust_domain::TrustDomains;

pub mod custom;
pub mod jwt;

pub const HTTP_RBAC: &str = "envoy.filters.http.rbac";
pub const NETWORK_RBAC: &str = "envoy.filters.network.rbac";
/// A proxyless gRPC server's DENY filter (its ALLOW filter is named [`HTTP_RBAC`]).
pub const GRPC_RBAC_DENY: &str = "envoy.filters.http.rbac.DENY";
const JWT_FILTER: &str = "envoy.filters.http.jwt_authn";
const JWT_PAYLOAD: &str = "payload";
pub(crate) const SHADOW_ALLOW_PREFIX: &str = "istio_dry_run_allow_";
pub(crate) const SHADOW_DENY_PREFIX: &str = "istio_dry_run_deny_";
const TCP_STAT_PREFIX: &str = "tcp.";
const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";

/// The filters of the AuthorizationPolicies and RequestAuthentications that apply to a proxy (a
/// sidecar's inbound side, a router's listeners), built once for all its chains, in istiod's
/// order: CUSTOM's (with the mesh config's providers), the JWT filter, then RBAC's; principals in
/// the mesh config's trust domain and its aliases.
pub(super) struct ProxyAuthz {
    pub http: Vec<HttpFilter>,
    pub tcp: Vec<NetworkFilter>,
}

impl ProxyAuthz {
    pub(super) fn of(view: &super::View<'_>) -> ProxyAuthz {
        let proxy = view.proxy;
        let applied = AppliedPolicy::all(view);
        let mesh = view.registry.mesh_config(&proxy.mesh.root_namespace);
        let trust = mesh.map(TrustDomains::of).unwrap_or_default();
        // CUSTOM first (its ext_authz decides before any RBAC rule), then AUDIT, DENY, ALLOW.
        let (mut http, mut tcp) = (Vec::new(), Vec::new());
        if applied.iter().any(|p| p.spec.action == Action::Custom) {
            let known = super::providers::known_services(view.registry);
            let providers = mesh
                .map(|mesh| custom::ExtAuthzProviders::resolve(mesh, &known))
                .unwrap_or_default();
            http = custom::http_filters(&applied, &providers, &trust);
            tcp = custom::tcp_filters(&applied, &providers, &trust);
        }
        // Then the JWT filter: it records the request principal the RBAC rules read. Keys not
        // inline come from the store (fetched by PCP); a rule whose keys are not there yet is
        // left out (see `jwt`).
        let rules: Vec<(&JwtRule, &str)> = view
            .registry
            .request_authentications_for(
                &proxy.mesh.root_namespace,
                &proxy.namespace,
                &proxy.labels,
            )
            .flat_map(|ra| ra.jwt_rules.iter().flatten())
            .filter_map(|rule| match KeySetSource::of(rule) {
                None => Some((rule, rule.jwks.as_str())),
                Some(source) => view
                    .registry
                    .key_set(&proxy.mesh.root_namespace, &source)
                    .map(|keys| (rule, keys)),
            })
            .collect();
        http.extend(jwt::filter(rules));
        http.extend(http_filters(&applied, &trust));
        tcp.extend(tcp_filters(&applied, &trust));
        ProxyAuthz { http, tcp }
    }

    /// `filters` of a TCP chain, after the network RBAC filters.
    pub(super) fn tcp_chain(&self, filters: Vec<NetworkFilter>) -> Vec<NetworkFilter> {
        self.tcp.iter().cloned().chain(filters).collect()
    }
}

/// One AuthorizationPolicy that applies to the proxy.
#[derive(Debug, Clone, Copy)]
pub struct AppliedPolicy<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    /// `istio.io/dry-run: true`: evaluated and logged, not enforced.
    pub dry_run: bool,
    pub spec: &'a AuthorizationPolicy,
}

impl<'a> AppliedPolicy<'a> {
    /// The AuthorizationPolicies that apply to the view's proxy.
    fn all(view: &super::View<'a>) -> Vec<AppliedPolicy<'a>> {
        let proxy = view.proxy;
        view.registry
            .authorization_policies_for(&proxy.mesh.root_namespace, &proxy.namespace, &proxy.labels)
            .map(|c| AppliedPolicy {
                namespace: &c.meta.namespace,
                name: &c.meta.name,
                dry_run: c
                    .meta
                    .annotations
                    .get(DRY_RUN_ANNOTATION)
                    .is_some_and(|v| go_bool(v) == Some(true)),
                spec: &c.spec,
            })
            .collect()
    }
}

/// The RBAC filters of a proxyless gRPC server, as istiod's gRPC generator builds them. gRPC
/// implements ALLOW and DENY only, so CUSTOM and AUDIT policies are left out; a DENY filter
/// (`envoy.filters.http.rbac.DENY`) comes before an ALLOW one (`envoy.filters.http.rbac`), each
/// rule's policy is named `<namespace>-<name>-<rule>`, and principals are taken as written (not
/// widened to the trust domain's aliases).
///
/// Two differences from istiod, where its gRPC generator goes against what the policy says:
/// dry-run policies are not enforced (istiod enforces them on gRPC servers), and a policy
/// without rules matches nothing, as on a sidecar (istiod drops it, so an ALLOW policy without
/// rules, Istio's "allow nothing", lets everything through).
pub(super) fn grpc_server_filters(view: &super::View<'_>) -> Vec<HttpFilter> {
    let applied: Vec<AppliedPolicy<'_>> = AppliedPolicy::all(view)
        .into_iter()
        .filter(|p| !p.dry_run)
        .collect();
    let trust = TrustDomains::default();
    [
        (Action::Deny, rbac::Action::Deny, GRPC_RBAC_DENY),
        (Action::Allow, rbac::Action::Allow, HTTP_RBAC),
    ]
    .into_iter()
    .filter_map(|(action, rbac_action, filter)| {
        let of_action: Vec<&AppliedPolicy<'_>> =
            applied.iter().filter(|p| p.spec.action == action).collect();
        let (rules, _) = build(&of_action, rbac_action, &trust, false, Naming::Grpc);
        let rules = rules.filter(|r| !r.policies.is_empty())?;
        Some(HttpFilter {
            name: filter.to_string(),
            config_type: Some(HttpConfigType::TypedConfig(pack_any(HttpRbac {
                rules: Some(rules),
                ..Default::default()
            }))),
            ..Default::default()
        })
    })
    .collect()
}

/// The HTTP filters for `policies` (CUSTOM ones aside): AUDIT, DENY, ALLOW.
pub fn http_filters(policies: &[AppliedPolicy<'_>], trust: &TrustDomains) -> Vec<HttpFilter> {
    built(policies, trust, false)
        .into_iter()
        .map(|(rules, shadow)| HttpFilter {
            name: HTTP_RBAC.to_string(),
            config_type: Some(HttpConfigType::TypedConfig(pack_any(HttpRbac {
                shadow_rules_stat_prefix: shadow_prefix(shadow.as_ref()).to_string(),
                rules,
                shadow_rules: shadow,
                ..Default::default()
            }))),
            ..Default::default()
        })
        .collect()
}

/// The network filters for a TCP filter chain, for `policies` (CUSTOM ones aside).
pub fn tcp_filters(policies: &[AppliedPolicy<'_>], trust: &TrustDomains) -> Vec<NetworkFilter> {
    built(policies, trust, true)
        .into_iter()
        .map(|(rules, shadow)| NetworkFilter {
            name: NETWORK_RBAC.to_string(),
            config_type: Some(NetworkConfigType::TypedConfig(pack_any(NetworkRbac {
                shadow_rules_stat_prefix: shadow_prefix(shadow.as_ref()).to_string(),
                stat_prefix: TCP_STAT_PREFIX.to_string(),
                rules,
                shadow_rules: shadow,
                ..Default::default()
            }))),
        })
        .collect()
}

/// What istiod names the shadow rules' stats; with no shadow rules it still says ALLOW's.
fn shadow_prefix(shadow: Option<&Rbac>) -> &'static str {
    match shadow.map(|r| rbac::Action::try_from(r.action)) {
        Some(Ok(rbac::Action::Deny)) => SHADOW_DENY_PREFIX,
        Some(Ok(rbac::Action::Allow)) | None => SHADOW_ALLOW_PREFIX,
        Some(_) => "",
    }
}

/// (enforced rules, shadow rules) per action that has policies, in filter order.
fn built(
    policies: &[AppliedPolicy<'_>],
    trust: &TrustDomains,
    for_tcp: bool,
) -> Vec<(Option<Rbac>, Option<Rbac>)> {
    [
        (Action::Audit, rbac::Action::Log),
        (Action::Deny, rbac::Action::Deny),
        (Action::Allow, rbac::Action::Allow),
    ]
    .into_iter()
    .filter_map(|(action, rbac_action)| {
        let of_action: Vec<&AppliedPolicy<'_>> = policies
            .iter()
            .filter(|p| p.spec.action == action)
            .collect();
        (!of_action.is_empty())
            .then(|| build(&of_action, rbac_action, trust, for_tcp, Naming::Proxy("")))
    })
    .collect()
}

/// The rules of `policies` for `action`: (enforced, dry-run), each policy named by `naming`.
fn build(
    policies: &[&AppliedPolicy<'_>],
    action: rbac::Action,
    trust: &TrustDomains,
    for_tcp: bool,
    naming: Naming<'_>,
) -> (Option<Rbac>, Option<Rbac>) {
    let empty = || Rbac {
        action: action as i32,
        ..Default::default()
    };
    let (mut enforced, mut shadow) = (empty(), empty());
    let (mut has_enforced, mut has_shadow) = (false, false);
    for policy in policies {
        let target = if policy.dry_run {
            has_shadow = true;
            &mut shadow
        } else {
            has_enforced = true;
            &mut enforced
        };
        let rules = policy.spec.rules.as_deref().unwrap_or_default();
        for (i, rule) in rules.iter().enumerate() {
            let Some(rule) = rule else { continue };
            let model = Model::new(policy.namespace, rule, trust);
            if let Ok(generated) = model.generate(for_tcp, action) {
                target
                    .policies
                    .insert(naming.name(policy.namespace, policy.name, i), generated);
            }
        }
        if rules.is_empty() {
            target
                .policies
                .insert(naming.name(policy.namespace, policy.name, 0), match_never());
        }
    }
    (
        has_enforced.then_some(enforced),
        has_shadow.then_some(shadow),
    )
}

/// How the RBAC policy built from one rule is named.
#[derive(Debug, Clone, Copy)]
enum Naming<'p> {
    /// As on sidecars and gateways, `<prefix>ns[<namespace>]-policy[<name>]-rule[<i>]` (the
    /// prefix is empty, or CUSTOM's provider prefix).
    Proxy(&'p str),
    /// As for proxyless gRPC servers, `<namespace>-<name>-<i>`.
    Grpc,
}

impl Naming<'_> {
    fn name(self, namespace: &str, name: &str, rule: usize) -> String {
        match self {
            Naming::Proxy(prefix) => format!("{prefix}ns[{namespace}]-policy[{name}]-rule[{rule}]"),
            Naming::Grpc => format!("{namespace}-{name}-{rule}"),
        }
    }
}

/// A policy that matches nothing: a policy without rules.
fn match_never() -> Policy {
    Policy {
        permissions: vec![not_permission(any_permission())],
        principals: vec![not_principal(any_principal())],
        ..Default::default()
    }
}
