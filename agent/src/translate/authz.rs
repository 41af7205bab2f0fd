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

use envoy_types::pb::envoy::config::core::v3::{CidrRange, TypedExtensionConfig};
use envoy_types::pb::envoy::config::listener::v3::Filter as NetworkFilter;
use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType as NetworkConfigType;
use envoy_types::pb::envoy::config::rbac::v3::{
    Permission, Policy, Principal, Rbac, permission, principal, rbac,
};
use envoy_types::pb::envoy::config::route::v3::HeaderMatcher;
use envoy_types::pb::envoy::config::route::v3::header_matcher::HeaderMatchSpecifier;
use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType as HttpConfigType;
use envoy_types::pb::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;
use envoy_types::pb::envoy::extensions::path::r#match::uri_template::v3::UriTemplateMatchConfig;
use envoy_types::pb::envoy::r#type::matcher::v3::{
    ListMatcher, MetadataMatcher, OrMatcher, PathMatcher, RegexMatcher, StringMatcher,
    ValueMatcher, list_matcher, metadata_matcher, path_matcher, string_matcher, value_matcher,
};
use envoy_types::pb::google::protobuf::UInt32Value;
use envoy_types::util::pack_any;
use pasa_istio::authorization_policy::{
    Action, AuthorizationPolicy, DRY_RUN_ANNOTATION, Rule, go_bool,
};
use pasa_istio::request_authentication::{JwtRule, KeySetSource};

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

/// The local trust domain and its aliases: principals of one of them (or of `cluster.local`)
/// are matched in all of them. Empty: principals are taken as written.
#[derive(Debug, Clone, Default)]
pub struct TrustDomains(pub Vec<String>);

impl TrustDomains {
    /// The mesh config's trust domain and its aliases; as written when it names none.
    pub fn of(mesh: &pasa_istio::mesh_config::MeshConfig) -> TrustDomains {
        match &mesh.trust_domain {
            Some(domain) if !domain.is_empty() => TrustDomains(
                std::iter::once(domain.clone())
                    .chain(mesh.trust_domain_aliases.iter().cloned())
                    .collect(),
            ),
            _ => TrustDomains::default(),
        }
    }
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

/// How one attribute is matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attribute {
    DestinationIp,
    DestinationPort,
    ConnectionSni,
    EnvoyFilter,
    SourceIp,
    RemoteIp,
    SourceNamespace,
    SourceTrustDomain,
    SourceServiceAccount,
    SourcePrincipal,
    RequestPrincipal,
    RequestAudiences,
    RequestPresenter,
    RequestHeader,
    RequestClaims,
    Host,
    Path,
    Method,
}

impl Attribute {
    /// Extended attributes build one matcher from all their values at once.
    fn extended(self) -> bool {
        matches!(
            self,
            Attribute::EnvoyFilter
                | Attribute::RequestPrincipal
                | Attribute::RequestAudiences
                | Attribute::RequestPresenter
                | Attribute::RequestClaims
        )
    }
}

#[derive(Debug, Clone)]
struct Condition {
    key: String,
    attribute: Attribute,
    values: Vec<String>,
    not_values: Vec<String>,
}

/// An HTTP-only attribute met on a TCP filter chain, or a value that cannot be matched.
#[derive(Debug)]
struct Unusable;

/// One rule, as lists of conditions: each permission list (one per `to`) and each principal
/// list (one per `from`) is AND-ed.
struct Model {
    permissions: Vec<Vec<Condition>>,
    principals: Vec<Vec<Condition>>,
    /// The policy's namespace: a service account named without one is in it.
    namespace: String,
}

fn condition(
    list: &mut Vec<Condition>,
    front: bool,
    attribute: Attribute,
    key: &str,
    values: Option<&Vec<String>>,
    not_values: Option<&Vec<String>>,
) {
    let values = values.cloned().unwrap_or_default();
    let not_values = not_values.cloned().unwrap_or_default();
    if values.is_empty() && not_values.is_empty() {
        return;
    }
    let c = Condition {
        key: key.to_string(),
        attribute,
        values,
        not_values,
    };
    if front {
        list.insert(0, c);
    } else {
        list.push(c);
    }
}

impl Model {
    fn new(namespace: &str, rule: &Rule, trust: &TrustDomains) -> Model {
        let mut base_permission = Vec::new();
        let mut base_principal = Vec::new();
        for when in rule.when.iter().flatten().flatten() {
            let key = when.key.as_str();
            let (list, attribute) = match key {
                "destination.ip" => (&mut base_permission, Attribute::DestinationIp),
                "destination.port" => (&mut base_permission, Attribute::DestinationPort),
                "connection.sni" => (&mut base_permission, Attribute::ConnectionSni),
                _ if key.starts_with("experimental.envoy.filters.") => {
                    (&mut base_permission, Attribute::EnvoyFilter)
                }
                "source.ip" => (&mut base_principal, Attribute::SourceIp),
                "remote.ip" => (&mut base_principal, Attribute::RemoteIp),
                "source.namespace" => (&mut base_principal, Attribute::SourceNamespace),
                "source.trustDomain" => (&mut base_principal, Attribute::SourceTrustDomain),
                "source.serviceAccount" => (&mut base_principal, Attribute::SourceServiceAccount),
                "source.principal" => (&mut base_principal, Attribute::SourcePrincipal),
                "request.auth.principal" => (&mut base_principal, Attribute::RequestPrincipal),
                "request.auth.audiences" => (&mut base_principal, Attribute::RequestAudiences),
                "request.auth.presenter" => (&mut base_principal, Attribute::RequestPresenter),
                _ if key.starts_with("request.headers") => {
                    (&mut base_principal, Attribute::RequestHeader)
                }
                _ if key.starts_with("request.auth.claims") => {
                    (&mut base_principal, Attribute::RequestClaims)
                }
                // Validation refuses unknown attributes; one that slipped through matches nothing
                // it could not name.
                _ => continue,
            };
            condition(
                list,
                false,
                attribute,
                key,
                when.values.as_ref(),
                when.not_values.as_ref(),
            );
        }

        let mut principals = Vec::new();
        for from in rule.from.iter().flatten() {
            let mut merged = base_principal.clone();
            if let Some(s) = from.as_ref().and_then(|f| f.source.as_ref()) {
                use Attribute as A;
                let front = true;
                condition(
                    &mut merged,
                    front,
                    A::SourceIp,
                    "source.ip",
                    s.ip_blocks.as_ref(),
                    s.not_ip_blocks.as_ref(),
                );
                condition(
                    &mut merged,
                    front,
                    A::RemoteIp,
                    "remote.ip",
                    s.remote_ip_blocks.as_ref(),
                    s.not_remote_ip_blocks.as_ref(),
                );
                condition(
                    &mut merged,
                    front,
                    A::SourceNamespace,
                    "source.namespace",
                    s.namespaces.as_ref(),
                    s.not_namespaces.as_ref(),
                );
                condition(
                    &mut merged,
                    front,
                    A::SourceTrustDomain,
                    "source.trustDomain",
                    s.trust_domains.as_ref(),
                    s.not_trust_domains.as_ref(),
                );
                condition(
                    &mut merged,
                    front,
                    A::SourceServiceAccount,
                    "source.serviceAccount",
                    s.service_accounts.as_ref(),
                    s.not_service_accounts.as_ref(),
                );
                condition(
                    &mut merged,
                    front,
                    A::RequestPrincipal,
                    "request.auth.principal",
                    s.request_principals.as_ref(),
                    s.not_request_principals.as_ref(),
                );
                condition(
                    &mut merged,
                    front,
                    A::SourcePrincipal,
                    "source.principal",
                    s.principals.as_ref(),
                    s.not_principals.as_ref(),
                );
            }
            principals.push(merged);
        }
        if principals.is_empty() {
            principals.push(base_principal);
        }

        let mut permissions = Vec::new();
        for to in rule.to.iter().flatten() {
            let mut merged = base_permission.clone();
            if let Some(o) = to.as_ref().and_then(|t| t.operation.as_ref()) {
                use Attribute as A;
                condition(
                    &mut merged,
                    true,
                    A::DestinationPort,
                    "destination.port",
                    o.ports.as_ref(),
                    o.not_ports.as_ref(),
                );
                condition(
                    &mut merged,
                    true,
                    A::Path,
                    "path-matcher",
                    o.paths.as_ref(),
                    o.not_paths.as_ref(),
                );
                condition(
                    &mut merged,
                    true,
                    A::Method,
                    ":method",
                    o.methods.as_ref(),
                    o.not_methods.as_ref(),
                );
                condition(
                    &mut merged,
                    true,
                    A::Host,
                    ":authority",
                    o.hosts.as_ref(),
                    o.not_hosts.as_ref(),
                );
            }
            permissions.push(merged);
        }
        if permissions.is_empty() {
            permissions.push(base_permission);
        }

        let mut model = Model {
            permissions,
            principals,
            namespace: namespace.to_string(),
        };
        model.migrate_trust_domain(trust);
        model
    }

    /// Principals of the local trust domain or an alias are matched in all of them.
    fn migrate_trust_domain(&mut self, trust: &TrustDomains) {
        if trust.0.is_empty() {
            return;
        }
        for c in self.principals.iter_mut().flatten() {
            match c.attribute {
                Attribute::SourcePrincipal => {
                    c.values = replace_aliases(&c.values, &trust.0);
                    c.not_values = replace_aliases(&c.not_values, &trust.0);
                }
                Attribute::SourceTrustDomain => {
                    c.values = expand_aliases(&c.values, &trust.0);
                    c.not_values = expand_aliases(&c.not_values, &trust.0);
                }
                _ => {}
            }
        }
    }

    fn generate(&self, for_tcp: bool, action: rbac::Action) -> Result<Policy, Unusable> {
        let permissions = self
            .permissions
            .iter()
            .map(|list| {
                let mut and = Vec::new();
                for c in list {
                    and.extend(c.permissions(for_tcp, action)?);
                }
                if and.is_empty() {
                    and.push(any_permission());
                }
                Ok(and_permission(and))
            })
            .collect::<Result<Vec<_>, Unusable>>()?;
        let principals = self
            .principals
            .iter()
            .map(|list| {
                let mut and = Vec::new();
                for c in list {
                    and.extend(c.principals(for_tcp, action, &self.namespace)?);
                }
                if and.is_empty() {
                    and.push(any_principal());
                }
                Ok(and_principal(and))
            })
            .collect::<Result<Vec<_>, Unusable>>()?;
        Ok(Policy {
            permissions,
            principals,
            ..Default::default()
        })
    }
}

/// ALLOW keeps the error (the whole rule is dropped); DENY and AUDIT ignore the value.
fn checked<T>(result: Result<T, Unusable>, action: rbac::Action) -> Result<Option<T>, Unusable> {
    match result {
        Ok(v) => Ok(Some(v)),
        Err(e) if action == rbac::Action::Allow => Err(e),
        Err(_) => Ok(None),
    }
}

impl Condition {
    fn permissions(
        &self,
        for_tcp: bool,
        action: rbac::Action,
    ) -> Result<Vec<Permission>, Unusable> {
        let mut out = Vec::new();
        if self.attribute.extended() {
            if !self.values.is_empty()
                && let Some(p) = checked(self.extended_permission(&self.values, for_tcp), action)?
            {
                out.push(p);
            }
            if !self.not_values.is_empty()
                && let Some(p) =
                    checked(self.extended_permission(&self.not_values, for_tcp), action)?
            {
                out.push(not_permission(p));
            }
            return Ok(out);
        }
        let mut or = Vec::new();
        for v in &self.values {
            if let Some(p) = checked(self.permission(v, for_tcp), action)? {
                or.push(p);
            }
        }
        if !or.is_empty() {
            out.push(or_permission(or));
        }
        let mut or = Vec::new();
        for v in &self.not_values {
            if let Some(p) = checked(self.permission(v, for_tcp), action)? {
                or.push(p);
            }
        }
        if !or.is_empty() {
            out.push(not_permission(or_permission(or)));
        }
        Ok(out)
    }

    fn principals(
        &self,
        for_tcp: bool,
        action: rbac::Action,
        namespace: &str,
    ) -> Result<Vec<Principal>, Unusable> {
        let mut out = Vec::new();
        if self.attribute.extended() {
            if !self.values.is_empty()
                && let Some(p) = checked(self.extended_principal(&self.values, for_tcp), action)?
            {
                out.push(p);
            }
            if !self.not_values.is_empty()
                && let Some(p) =
                    checked(self.extended_principal(&self.not_values, for_tcp), action)?
            {
                out.push(not_principal(p));
            }
            return Ok(out);
        }
        let mut or = Vec::new();
        for v in &self.values {
            if let Some(p) = checked(self.principal(v, for_tcp, namespace), action)? {
                or.push(p);
            }
        }
        if !or.is_empty() {
            out.push(or_principal(or));
        }
        let mut or = Vec::new();
        for v in &self.not_values {
            if let Some(p) = checked(self.principal(v, for_tcp, namespace), action)? {
                or.push(p);
            }
        }
        if !or.is_empty() {
            out.push(not_principal(or_principal(or)));
        }
        Ok(out)
    }

    fn permission(&self, value: &str, for_tcp: bool) -> Result<Permission, Unusable> {
        let rule = match self.attribute {
            Attribute::DestinationIp => permission::Rule::DestinationIp(cidr(value)?),
            Attribute::DestinationPort => permission::Rule::DestinationPort(port(value)?),
            Attribute::ConnectionSni => permission::Rule::RequestedServerName(string(value)),
            Attribute::Host if !for_tcp => {
                permission::Rule::Header(host_header(":authority", value))
            }
            Attribute::Method if !for_tcp => permission::Rule::Header(header(":method", value)),
            Attribute::Path if !for_tcp => {
                if value.contains("{*}") || value.contains("{**}") {
                    permission::Rule::UriTemplate(TypedExtensionConfig {
                        name: "uri-template".into(),
                        typed_config: Some(pack_any(UriTemplateMatchConfig {
                            path_template: value.replace("{**}", "**").replace("{*}", "*"),
                        })),
                    })
                } else {
                    permission::Rule::UrlPath(PathMatcher {
                        rule: Some(path_matcher::Rule::Path(string(value))),
                    })
                }
            }
            _ => return Err(Unusable),
        };
        Ok(Permission { rule: Some(rule) })
    }

    // istiod still writes `metadata` (Envoy has deprecated it for `sourced_metadata`).
    #[allow(deprecated)]
    fn extended_permission(
        &self,
        values: &[String],
        _for_tcp: bool,
    ) -> Result<Permission, Unusable> {
        // Only `experimental.envoy.filters.<filter>[<key>]` is an extended permission.
        let inner = self
            .key
            .trim_start_matches("experimental.")
            .trim_end_matches(']');
        let (filter, key) = inner.split_once('[').ok_or(Unusable)?;
        let matchers = values
            .iter()
            .map(|v| {
                if v.starts_with('[') && v.ends_with(']') {
                    ValueMatcher {
                        match_pattern: Some(value_matcher::MatchPattern::ListMatch(Box::new(
                            ListMatcher {
                                match_pattern: Some(list_matcher::MatchPattern::OneOf(Box::new(
                                    string_value(string(v.trim_matches(['[', ']']))),
                                ))),
                            },
                        ))),
                    }
                } else {
                    string_value(string(v))
                }
            })
            .collect();
        Ok(Permission {
            rule: Some(permission::Rule::Metadata(MetadataMatcher {
                filter: filter.to_string(),
                path: vec![path_key(key)],
                value: Some(or_values(matchers)),
                ..Default::default()
            })),
        })
    }

    fn principal(
        &self,
        value: &str,
        for_tcp: bool,
        namespace: &str,
    ) -> Result<Principal, Unusable> {
        let identifier = match self.attribute {
            Attribute::SourceIp => principal::Identifier::DirectRemoteIp(cidr(value)?),
            Attribute::RemoteIp => principal::Identifier::RemoteIp(cidr(value)?),
            Attribute::SourceNamespace => {
                let pattern = value
                    .split('*')
                    .map(pasa_istio::regex::quote_meta)
                    .collect::<Vec<_>>()
                    .join(".*");
                authenticated(regex(&format!(".*/ns/{pattern}/.*")))
            }
            Attribute::SourceServiceAccount => {
                authenticated(regex(&service_account_regex(namespace, value)))
            }
            Attribute::SourceTrustDomain => authenticated(if value == "*" {
                prefix("spiffe://", false)
            } else if !value.contains('*') {
                prefix(&format!("spiffe://{value}/"), false)
            } else {
                let (before, after) = value.split_once('*').unwrap_or((value, ""));
                regex(&format!(
                    "spiffe://{}[^/]*{}/.*",
                    pasa_istio::regex::quote_meta(before),
                    pasa_istio::regex::quote_meta(after)
                ))
            }),
            Attribute::SourcePrincipal => authenticated(string_with_prefix(value, "spiffe://")),
            Attribute::RequestHeader if !for_tcp => {
                let name = self
                    .key
                    .strip_prefix("request.headers")
                    .and_then(|k| k.strip_prefix('['))
                    .and_then(|k| k.strip_suffix(']'))
                    .ok_or(Unusable)?;
                principal::Identifier::Header(header(name, value))
            }
            _ => return Err(Unusable),
        };
        Ok(Principal {
            identifier: Some(identifier),
        })
    }

    #[allow(deprecated)]
    fn extended_principal(&self, values: &[String], for_tcp: bool) -> Result<Principal, Unusable> {
        if for_tcp {
            return Err(Unusable);
        }
        let metadata = |m: MetadataMatcher| Principal {
            identifier: Some(principal::Identifier::Metadata(m)),
        };
        match self.attribute {
            Attribute::RequestPrincipal => {
                let mut or: Vec<Principal> = values
                    .iter()
                    .map(|v| {
                        let (iss, sub) = request_principal(v);
                        and_principal(vec![
                            metadata(jwt_claim("iss", iss)),
                            metadata(jwt_claim("sub", sub)),
                        ])
                    })
                    .collect();
                if or.len() == 1 {
                    Ok(or.remove(0))
                } else {
                    Ok(or_principal(or))
                }
            }
            Attribute::RequestAudiences => Ok(metadata(jwt_claims(&["aud"], string_or(values)))),
            Attribute::RequestPresenter => Ok(metadata(jwt_claims(&["azp"], string_or(values)))),
            Attribute::RequestClaims => {
                let claims = nested_names(
                    self.key
                        .strip_prefix("request.auth.claims")
                        .unwrap_or_default(),
                )?;
                let claims: Vec<&str> = claims.iter().map(String::as_str).collect();
                Ok(metadata(jwt_claims(&claims, string_or(values))))
            }
            _ => Err(Unusable),
        }
    }
}

fn service_account_regex(default_namespace: &str, value: &str) -> String {
    let (ns, sa) = value.split_once('/').unwrap_or((default_namespace, value));
    format!(
        "spiffe://.+/ns/{}/(.+/|)sa/{}(/.+)?",
        pasa_istio::regex::quote_meta(ns),
        pasa_istio::regex::quote_meta(sa)
    )
}

/// (issuer, subject) matchers of a request principal `iss/sub` with at most one `*`.
fn request_principal(value: &str) -> (StringMatcher, StringMatcher) {
    let any = || regex(".+");
    let split = value.rfind('/');
    let (iss, sub) = match split {
        Some(i) => (&value[..i], &value[i + 1..]),
        None => (value, ""),
    };
    if value == "*" {
        (any(), any())
    } else if let Some(rest) = value.strip_prefix('*') {
        match split {
            Some(_) if iss == "*" => (any(), exact(sub)),
            Some(_) => (suffix(iss.trim_start_matches('*')), exact(sub)),
            None => (any(), suffix(rest)),
        }
    } else if let Some(rest) = value.strip_suffix('*') {
        match split {
            Some(_) if sub == "*" => (exact(iss), any()),
            Some(_) => (exact(iss), prefix(sub.trim_end_matches('*'), false)),
            None => (prefix(rest, false), any()),
        }
    } else {
        (exact(iss), exact(sub))
    }
}

/// `[a][b]` → `a`, `b`; a key that is not of that form is one name in brackets.
fn nested_names(s: &str) -> Result<Vec<String>, Unusable> {
    let mut names = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        let Some(inner) = rest.strip_prefix('[') else {
            return single_name(s);
        };
        let Some(end) = inner.find(']') else {
            return single_name(s);
        };
        if inner[..end].contains('[') {
            return single_name(s);
        }
        names.push(inner[..end].to_string());
        rest = &inner[end + 1..];
    }
    Ok(names)
}

fn single_name(s: &str) -> Result<Vec<String>, Unusable> {
    s.strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .map(|n| vec![n.to_string()])
        .ok_or(Unusable)
}

/// Principals of the local trust domain (or an alias, or `cluster.local`) in all of them.
fn replace_aliases(principals: &[String], domains: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for p in principals {
        let parts: Vec<&str> = p.split('/').collect();
        if parts.len() != 5 || parts[0] == "*" {
            out.push(p.clone());
            continue;
        }
        let td = parts[0];
        if domains.iter().any(|d| wildcard_match(td, d)) || td == DEFAULT_TRUST_DOMAIN {
            let mut these: Vec<String> = Vec::new();
            for d in domains {
                // A principal whose trust domain is a `*suffix` pattern the domain fits stays
                // as written.
                let replaced = if td
                    .strip_prefix('*')
                    .is_some_and(|suffix| d.ends_with(suffix))
                {
                    p.clone()
                } else {
                    format!("{d}/{}", parts[1..].join("/"))
                };
                if !these.contains(&replaced) {
                    these.push(replaced);
                }
            }
            out.extend(these);
        } else {
            out.push(p.clone());
        }
    }
    out
}

/// Either side may hold one `*` at the start or the end.
fn wildcard_match(a: &str, b: &str) -> bool {
    let prefix_match =
        |x: &str, pattern: &str| pattern.strip_suffix('*').is_some_and(|p| x.starts_with(p));
    let suffix_match =
        |x: &str, pattern: &str| pattern.strip_prefix('*').is_some_and(|p| x.ends_with(p));
    a == b
        || b == "*"
        || prefix_match(a, b)
        || prefix_match(b, a)
        || suffix_match(a, b)
        || suffix_match(b, a)
}

fn expand_aliases(values: &[String], domains: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for v in values {
        let expanded: Vec<String> = if domains.contains(v) {
            domains.to_vec()
        } else {
            vec![v.clone()]
        };
        for e in expanded {
            if !out.contains(&e) {
                out.push(e);
            }
        }
    }
    out
}

fn cidr(value: &str) -> Result<CidrRange, Unusable> {
    let (addr, bits) = match value.split_once('/') {
        Some((a, b)) => (a, Some(b)),
        None => (value, None),
    };
    let ip: std::net::IpAddr = addr.parse().map_err(|_| Unusable)?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let bits = match bits {
        Some(b) => b
            .parse::<u32>()
            .ok()
            .filter(|b| *b <= max)
            .ok_or(Unusable)?,
        None => max,
    };
    Ok(CidrRange {
        address_prefix: ip.to_string(),
        prefix_len: Some(UInt32Value { value: bits }),
    })
}

fn port(value: &str) -> Result<u32, Unusable> {
    value
        .parse::<u32>()
        .ok()
        .filter(|p| *p <= 65535 && value.bytes().all(|b| b.is_ascii_digit()))
        .ok_or(Unusable)
}

fn matcher(pattern: string_matcher::MatchPattern, ignore_case: bool) -> StringMatcher {
    StringMatcher {
        ignore_case,
        match_pattern: Some(pattern),
    }
}

fn exact(v: &str) -> StringMatcher {
    matcher(string_matcher::MatchPattern::Exact(v.to_string()), false)
}

fn prefix(v: &str, ignore_case: bool) -> StringMatcher {
    matcher(
        string_matcher::MatchPattern::Prefix(v.to_string()),
        ignore_case,
    )
}

fn suffix(v: &str) -> StringMatcher {
    matcher(string_matcher::MatchPattern::Suffix(v.to_string()), false)
}

fn regex(r: &str) -> StringMatcher {
    matcher(
        string_matcher::MatchPattern::SafeRegex(RegexMatcher {
            regex: r.to_string(),
            ..Default::default()
        }),
        false,
    )
}

/// A value with at most one `*` at the start or the end; `*` alone is "present".
fn string(v: &str) -> StringMatcher {
    string_with_prefix(v, "")
}

fn string_with_prefix(v: &str, before: &str) -> StringMatcher {
    if v == "*" {
        regex(".+")
    } else if let Some(rest) = v.strip_prefix('*') {
        if before.is_empty() {
            suffix(rest)
        } else {
            regex(&format!(
                "{before}.*{}",
                pasa_istio::regex::quote_meta(rest)
            ))
        }
    } else if let Some(rest) = v.strip_suffix('*') {
        prefix(&format!("{before}{rest}"), false)
    } else {
        exact(&format!("{before}{v}"))
    }
}

fn string_value(m: StringMatcher) -> ValueMatcher {
    ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::StringMatch(m)),
    }
}

fn or_values(mut matchers: Vec<ValueMatcher>) -> ValueMatcher {
    if matchers.len() == 1 {
        return matchers.remove(0);
    }
    ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::OrMatch(OrMatcher {
            value_matchers: matchers,
        })),
    }
}

fn string_or(values: &[String]) -> ValueMatcher {
    or_values(values.iter().map(|v| string_value(string(v))).collect())
}

fn header_with(name: &str, value: &str, ignore_case: bool) -> HeaderMatcher {
    let specifier = if value == "*" {
        HeaderMatchSpecifier::PresentMatch(true)
    } else if let Some(rest) = value.strip_prefix('*') {
        HeaderMatchSpecifier::StringMatch(matcher(
            string_matcher::MatchPattern::Suffix(rest.to_string()),
            ignore_case,
        ))
    } else if let Some(rest) = value.strip_suffix('*') {
        HeaderMatchSpecifier::StringMatch(prefix(rest, ignore_case))
    } else {
        HeaderMatchSpecifier::StringMatch(matcher(
            string_matcher::MatchPattern::Exact(value.to_string()),
            ignore_case,
        ))
    };
    HeaderMatcher {
        name: name.to_string(),
        header_match_specifier: Some(specifier),
        ..Default::default()
    }
}

fn header(name: &str, value: &str) -> HeaderMatcher {
    header_with(name, value, false)
}

/// Hosts compare without case.
fn host_header(name: &str, value: &str) -> HeaderMatcher {
    header_with(name, value, true)
}

fn path_key(key: &str) -> metadata_matcher::PathSegment {
    metadata_matcher::PathSegment {
        segment: Some(metadata_matcher::path_segment::Segment::Key(
            key.to_string(),
        )),
    }
}

/// The JWT filter's payload claim `claim` matched by `m`.
fn jwt_claim(claim: &str, m: StringMatcher) -> MetadataMatcher {
    MetadataMatcher {
        filter: JWT_FILTER.to_string(),
        path: vec![path_key(JWT_PAYLOAD), path_key(claim)],
        value: Some(string_value(m)),
        ..Default::default()
    }
}

/// Nested claims, matched as one value or as a list holding one.
fn jwt_claims(claims: &[&str], value: ValueMatcher) -> MetadataMatcher {
    let mut path = vec![path_key(JWT_PAYLOAD)];
    path.extend(claims.iter().map(|c| path_key(c)));
    let list = ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::ListMatch(Box::new(
            ListMatcher {
                match_pattern: Some(list_matcher::MatchPattern::OneOf(Box::new(value.clone()))),
            },
        ))),
    };
    MetadataMatcher {
        filter: JWT_FILTER.to_string(),
        path,
        value: Some(ValueMatcher {
            match_pattern: Some(value_matcher::MatchPattern::OrMatch(OrMatcher {
                value_matchers: vec![list, value],
            })),
        }),
        ..Default::default()
    }
}

fn authenticated(m: StringMatcher) -> principal::Identifier {
    principal::Identifier::Authenticated(principal::Authenticated {
        principal_name: Some(m),
    })
}

fn any_permission() -> Permission {
    Permission {
        rule: Some(permission::Rule::Any(true)),
    }
}

fn and_permission(rules: Vec<Permission>) -> Permission {
    Permission {
        rule: Some(permission::Rule::AndRules(permission::Set { rules })),
    }
}

fn or_permission(rules: Vec<Permission>) -> Permission {
    Permission {
        rule: Some(permission::Rule::OrRules(permission::Set { rules })),
    }
}

fn not_permission(p: Permission) -> Permission {
    Permission {
        rule: Some(permission::Rule::NotRule(Box::new(p))),
    }
}

fn any_principal() -> Principal {
    Principal {
        identifier: Some(principal::Identifier::Any(true)),
    }
}

fn and_principal(ids: Vec<Principal>) -> Principal {
    Principal {
        identifier: Some(principal::Identifier::AndIds(principal::Set { ids })),
    }
}

fn or_principal(ids: Vec<Principal>) -> Principal {
    Principal {
        identifier: Some(principal::Identifier::OrIds(principal::Set { ids })),
    }
}

fn not_principal(p: Principal) -> Principal {
    Principal {
        identifier: Some(principal::Identifier::NotId(Box::new(p))),
    }
}
