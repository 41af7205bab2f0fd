//! A rule as istiod models it ([`Model`]): its `to`, `from` and `when` entries as conditions on
//! attributes, generated into one RBAC policy's permissions (what is done) and principals (who
//! does it), for an HTTP or a TCP filter chain.

use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
use envoy_types::pb::envoy::config::rbac::v3::{
    Permission, Policy, Principal, permission, principal, rbac,
};
use envoy_types::pb::envoy::extensions::path::r#match::uri_template::v3::UriTemplateMatchConfig;
use envoy_types::pb::envoy::r#type::matcher::v3::{
    ListMatcher, MetadataMatcher, PathMatcher, ValueMatcher, list_matcher, path_matcher,
    value_matcher,
};
use envoy_types::util::pack_any;
use pasa_istio::authorization_policy::Rule;

use super::matchers::{
    and_permission, and_principal, any_permission, any_principal, authenticated, cidr, header,
    host_header, jwt_claim, jwt_claims, nested_names, not_permission, not_principal, or_permission,
    or_principal, or_values, path_key, port, prefix, regex, request_principal,
    service_account_regex, string, string_or, string_value, string_with_prefix,
};
use super::trust_domain::{TrustDomains, expand_aliases, replace_aliases};

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
pub(super) struct Unusable;

/// One rule, as lists of conditions: each permission list (one per `to`) and each principal
/// list (one per `from`) is AND-ed.
pub(super) struct Model {
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
    pub(super) fn new(namespace: &str, rule: &Rule, trust: &TrustDomains) -> Model {
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

    pub(super) fn generate(&self, for_tcp: bool, action: rbac::Action) -> Result<Policy, Unusable> {
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
