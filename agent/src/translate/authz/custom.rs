//! CUSTOM AuthorizationPolicies: requests their rules match are sent to an external authorizer,
//! one of the mesh's extension providers (MeshConfig `extensionProviders`), as istiod builds it.
//!
//! Per provider, two filters: an RBAC filter whose shadow rules are the provider's CUSTOM rules
//! (named `istio-ext-authz-<provider>-ns[…]-policy[…]-rule[…]`), which records the matching rule
//! in the request's metadata without acting on it, then the ext_authz filter, enabled only for
//! requests whose recorded rule belongs to its provider. A provider that cannot be used
//! (unknown, invalid, its service unknown), or more than one provider for one workload (istiod
//! refuses that unless a feature flag is on), turns the provider's rules into RBAC DENY rules
//! instead (suffix `-deny-due-to-bad-CUSTOM-action`): a request meant to be checked is refused
//! rather than let through unchecked.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::core::v3::{
    ApiVersion, GrpcService, HeaderValue, HttpUri, grpc_service, http_uri,
};
use envoy_types::pb::envoy::config::listener::v3::Filter as NetworkFilter;
use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType as NetworkConfigType;
use envoy_types::pb::envoy::config::rbac::v3::{Rbac, rbac};
use envoy_types::pb::envoy::extensions::filters::http::ext_authz::v3 as http_ext_authz;
use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use envoy_types::pb::envoy::extensions::filters::network::ext_authz::v3::ExtAuthz as NetworkExtAuthz;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType as HttpConfigType;
use envoy_types::pb::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;
use envoy_types::pb::envoy::r#type::matcher::v3::{
    ListStringMatcher, MetadataMatcher, ValueMatcher, metadata_matcher, string_matcher,
    value_matcher,
};
use envoy_types::pb::envoy::r#type::v3::{HttpStatus, StatusCode};
use envoy_types::pb::google::protobuf::Duration;
use envoy_types::util::pack_any;
use pasa_istio::authorization_policy::Action;
use pasa_istio::mesh_config::{ExtAuthzGrpc, ExtAuthzHttp, MeshConfig, RequestBody};

use crate::translate::providers::{KnownService, cluster};

use super::{
    AppliedPolicy, HTTP_RBAC, NETWORK_RBAC, Naming, TCP_STAT_PREFIX, TrustDomains, build, matcher,
};

pub const HTTP_EXT_AUTHZ: &str = "envoy.filters.http.ext_authz";
pub const NETWORK_EXT_AUTHZ: &str = "envoy.filters.network.ext_authz";
/// The prefix of CUSTOM rules' names, and of the shadow rules' stats.
const NAME_PREFIX: &str = "istio-ext-authz";
const SHADOW_STAT_PREFIX: &str = "istio_ext_authz_";
/// The dynamic metadata key the shadow rules record the matching rule under.
const EFFECTIVE_POLICY_KEY: &str = "istio_ext_authz_shadow_effective_policy_id";
const BAD_SUFFIX: &str = "-deny-due-to-bad-CUSTOM-action";
/// An authorizer's timeout when the provider sets none.
const DEFAULT_TIMEOUT_SECONDS: i64 = 600;

/// The mesh's external authorizers, built once per mesh config and set of services: each one
/// usable, or why not.
#[derive(Debug, Clone, Default)]
pub struct ExtAuthzProviders {
    providers: BTreeMap<String, Result<Built, InvalidProvider>>,
}

/// Every problem istiod would find in one ext_authz provider.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", .0.join("; "))]
pub struct InvalidProvider(Vec<String>);

/// Why a CUSTOM rule's provider cannot check requests (its rules then deny).
#[derive(Debug, Clone, thiserror::Error)]
pub enum ExtAuthzError {
    #[error("found errors in provider {name}: {source}")]
    Invalid {
        name: String,
        #[source]
        source: InvalidProvider,
    },
    #[error("available providers are {available:?} but found {name:?}")]
    Unknown {
        name: String,
        available: Vec<String>,
    },
}

/// Why a provider's name is not a DNS label (istiod's words).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderNameError {
    #[error("provider name too long (max 63 characters): {0}")]
    TooLong(usize),
    #[error("invalid character {character:?} at position {position}")]
    Character { character: char, position: usize },
    #[error("provider name cannot start or end with hyphen")]
    Hyphen,
}

#[derive(Debug, Clone)]
struct Built {
    http: http_ext_authz::ExtAuthz,
    /// Only gRPC authorizers can check TCP connections.
    tcp: Option<NetworkExtAuthz>,
}

impl ExtAuthzProviders {
    /// The ext_authz providers of `mesh`, their services looked up among `services`.
    pub fn resolve(mesh: &MeshConfig, services: &[KnownService<'_>]) -> ExtAuthzProviders {
        let mut providers = BTreeMap::new();
        for (i, provider) in mesh.extension_providers.iter().enumerate() {
            let mut errors = Vec::new();
            if provider.name.is_empty() {
                errors.push(format!(
                    "extension provider name must not be empty, found empty at index: {i}"
                ));
            } else if providers.contains_key(&provider.name) {
                errors.push(format!(
                    "extension provider name must be unique, found duplicate: {}",
                    provider.name
                ));
            } else if let Err(e) = provider_name(&provider.name) {
                errors.push(format!("invalid provider name {:?}: {e}", provider.name));
            }
            let built = match (
                &provider.envoy_ext_authz_http,
                &provider.envoy_ext_authz_grpc,
            ) {
                (Some(http), _) => http_provider(http, services),
                (None, Some(grpc)) => grpc_provider(grpc, services),
                // A tracing, logging or metrics provider.
                (None, None) => continue,
            };
            let built = match built {
                Ok(built) if errors.is_empty() => Ok(built),
                Ok(_) => Err(InvalidProvider(errors)),
                Err(e) => {
                    errors.extend(e);
                    Err(InvalidProvider(errors))
                }
            };
            providers.insert(provider.name.clone(), built);
        }
        ExtAuthzProviders { providers }
    }

    fn get(&self, name: &str) -> Result<&Built, ExtAuthzError> {
        match self.providers.get(name) {
            Some(Ok(built)) => Ok(built),
            Some(Err(e)) => Err(ExtAuthzError::Invalid {
                name: name.to_string(),
                source: e.clone(),
            }),
            None => Err(ExtAuthzError::Unknown {
                name: name.to_string(),
                available: self.providers.keys().cloned().collect(),
            }),
        }
    }
}

/// What is built for one provider's CUSTOM rules.
enum Plan<'p> {
    /// The provider cannot be used: its rules deny.
    Deny(Rbac),
    /// The shadow rules that pick the requests to check, the dry-run rules, and the authorizer.
    Check {
        provider: String,
        rules: Rbac,
        dry_run: Option<Rbac>,
        built: &'p Built,
    },
}

/// Per provider (sorted by name): check with it, or deny what it should have checked (unknown,
/// invalid, or one of several providers).
fn plans<'p>(
    policies: &[AppliedPolicy<'_>],
    providers: &'p ExtAuthzProviders,
    trust: &TrustDomains,
    for_tcp: bool,
) -> Vec<Plan<'p>> {
    let by_provider = built_by_provider(policies, trust, for_tcp);
    let several = by_provider.len() > 1;
    by_provider
        .into_iter()
        .map(
            |(provider, (rules, dry_run))| match providers.get(&provider) {
                Ok(built) if !several => Plan::Check {
                    provider,
                    rules,
                    dry_run: dry_run.filter(|s| !s.policies.is_empty()),
                    built,
                },
                Ok(_) | Err(_) => Plan::Deny(bad(&rules)),
            },
        )
        .collect()
}

/// The HTTP filters of the CUSTOM policies among `policies`.
pub fn http_filters(
    policies: &[AppliedPolicy<'_>],
    providers: &ExtAuthzProviders,
    trust: &TrustDomains,
) -> Vec<HttpFilter> {
    let rbac_filter = |rbac: HttpRbac| HttpFilter {
        name: HTTP_RBAC.to_string(),
        config_type: Some(HttpConfigType::TypedConfig(pack_any(rbac))),
        ..Default::default()
    };
    let mut filters = Vec::new();
    for plan in plans(policies, providers, trust, false) {
        match plan {
            Plan::Deny(rules) => filters.push(rbac_filter(HttpRbac {
                rules: Some(rules),
                ..Default::default()
            })),
            Plan::Check {
                provider,
                rules,
                dry_run,
                built,
            } => {
                filters.push(rbac_filter(HttpRbac {
                    rules: dry_run,
                    shadow_rules: Some(rules),
                    shadow_rules_stat_prefix: SHADOW_STAT_PREFIX.to_string(),
                    ..Default::default()
                }));
                let mut http = built.http.clone();
                http.filter_enabled_metadata = Some(enabled_for(HTTP_RBAC, &provider));
                filters.push(HttpFilter {
                    name: HTTP_EXT_AUTHZ.to_string(),
                    config_type: Some(HttpConfigType::TypedConfig(pack_any(http))),
                    ..Default::default()
                });
            }
        }
    }
    filters
}

/// The network filters of the CUSTOM policies among `policies`, for a TCP filter chain (HTTP
/// authorizers cannot check TCP connections: their policies add nothing there).
pub fn tcp_filters(
    policies: &[AppliedPolicy<'_>],
    providers: &ExtAuthzProviders,
    trust: &TrustDomains,
) -> Vec<NetworkFilter> {
    let rbac_filter = |rbac: NetworkRbac| NetworkFilter {
        name: NETWORK_RBAC.to_string(),
        config_type: Some(NetworkConfigType::TypedConfig(pack_any(rbac))),
    };
    let mut filters = Vec::new();
    for plan in plans(policies, providers, trust, true) {
        match plan {
            Plan::Deny(rules) => filters.push(rbac_filter(NetworkRbac {
                rules: Some(rules),
                stat_prefix: TCP_STAT_PREFIX.to_string(),
                ..Default::default()
            })),
            Plan::Check {
                provider,
                rules,
                dry_run,
                built,
            } => {
                let Some(tcp) = &built.tcp else { continue };
                filters.push(rbac_filter(NetworkRbac {
                    rules: dry_run,
                    shadow_rules: Some(rules),
                    stat_prefix: TCP_STAT_PREFIX.to_string(),
                    shadow_rules_stat_prefix: SHADOW_STAT_PREFIX.to_string(),
                    ..Default::default()
                }));
                let mut tcp = tcp.clone();
                tcp.filter_enabled_metadata = Some(enabled_for(NETWORK_RBAC, &provider));
                filters.push(NetworkFilter {
                    name: NETWORK_EXT_AUTHZ.to_string(),
                    config_type: Some(NetworkConfigType::TypedConfig(pack_any(tcp))),
                });
            }
        }
    }
    filters
}

/// Per provider (sorted by name), its CUSTOM rules: (enforced, dry-run), as DENY rules.
fn built_by_provider(
    policies: &[AppliedPolicy<'_>],
    trust: &TrustDomains,
    for_tcp: bool,
) -> BTreeMap<String, (Rbac, Option<Rbac>)> {
    let mut grouped: BTreeMap<String, Vec<&AppliedPolicy<'_>>> = BTreeMap::new();
    for p in policies.iter().filter(|p| p.spec.action == Action::Custom) {
        let provider = p
            .spec
            .provider
            .as_ref()
            .map(|p| p.name.clone())
            .unwrap_or_default();
        grouped.entry(provider).or_default().push(p);
    }
    grouped
        .into_iter()
        .map(|(provider, of_provider)| {
            let prefix = if provider.is_empty() {
                format!("{NAME_PREFIX}-")
            } else {
                format!("{NAME_PREFIX}-{provider}-")
            };
            let (enforced, shadow) = build(
                &of_provider,
                rbac::Action::Deny,
                trust,
                for_tcp,
                Naming::Proxy(&prefix),
            );
            // istiod keeps the provider's enforced rules even when all its policies are dry-run.
            let enforced = enforced.unwrap_or(Rbac {
                action: rbac::Action::Deny as i32,
                ..Default::default()
            });
            (provider, (enforced, shadow))
        })
        .collect()
}

/// A provider's rules as DENY rules: what it should have checked is refused.
fn bad(rules: &Rbac) -> Rbac {
    Rbac {
        action: rbac::Action::Deny as i32,
        policies: rules
            .policies
            .iter()
            .map(|(name, policy)| (format!("{name}{BAD_SUFFIX}"), policy.clone()))
            .collect(),
        ..Default::default()
    }
}

/// Enables an ext_authz filter for requests whose matching CUSTOM rule is its provider's.
fn enabled_for(rbac_filter: &str, provider: &str) -> MetadataMatcher {
    MetadataMatcher {
        filter: rbac_filter.to_string(),
        path: vec![metadata_matcher::PathSegment {
            segment: Some(metadata_matcher::path_segment::Segment::Key(
                EFFECTIVE_POLICY_KEY.to_string(),
            )),
        }],
        value: Some(ValueMatcher {
            match_pattern: Some(value_matcher::MatchPattern::StringMatch(matcher(
                string_matcher::MatchPattern::Prefix(format!("{NAME_PREFIX}-{provider}")),
                false,
            ))),
        }),
        ..Default::default()
    }
}

/// A provider's name: a DNS label of lower-case letters, digits and dashes.
fn provider_name(name: &str) -> Result<(), ProviderNameError> {
    if name.len() > 63 {
        return Err(ProviderNameError::TooLong(name.len()));
    }
    if let Some((i, c)) = name
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        return Err(ProviderNameError::Character {
            character: c,
            position: i,
        });
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Err(ProviderNameError::Hyphen);
    }
    Ok(())
}

/// Checks shared by both kinds of authorizer: the port, the service (and its cluster), the
/// status on error.
fn target(
    service: &str,
    port: u32,
    status_on_error: &str,
    services: &[KnownService<'_>],
    errors: &mut Vec<String>,
) -> Option<(String, String, Option<HttpStatus>)> {
    if !(1..=65535).contains(&port) {
        errors.push(format!(
            "port must be in the range [1, 65535], found: {port}"
        ));
    }
    let status = match status_on_error {
        "" => None,
        text => match text
            .parse::<i32>()
            .ok()
            .filter(|c| StatusCode::try_from(*c).is_ok())
        {
            Some(code) => Some(HttpStatus { code }),
            None => {
                errors.push(format!("unsupported statusOnError {text}"));
                None
            }
        },
    };
    let found = match cluster(service, port, services) {
        Ok(found) => Some(found),
        Err(e) => {
            errors.push(e.to_string());
            None
        }
    };
    let (hostname, cluster) = found.filter(|_| errors.is_empty())?;
    Some((hostname, cluster, status))
}

fn timeout(t: Option<&pasa_istio::common::Duration>) -> Duration {
    match t {
        Some(t) => Duration {
            seconds: t.seconds,
            nanos: t.nanos,
        },
        None => Duration {
            seconds: DEFAULT_TIMEOUT_SECONDS,
            nanos: 0,
        },
    }
}

fn body(body: Option<&RequestBody>) -> Option<http_ext_authz::BufferSettings> {
    body.map(|b| http_ext_authz::BufferSettings {
        max_request_bytes: b.max_request_bytes,
        allow_partial_message: b.allow_partial_message,
        pack_as_bytes: b.pack_as_bytes,
    })
}

/// Header names as matchers: `x-*` a prefix, `*-x` a suffix, anything else exact; any case.
fn headers(names: &[String]) -> Option<ListStringMatcher> {
    (!names.is_empty()).then(|| ListStringMatcher {
        patterns: names
            .iter()
            .map(|h| {
                let pattern = if let Some(rest) = h.strip_prefix('*') {
                    string_matcher::MatchPattern::Suffix(rest.to_string())
                } else if let Some(rest) = h.strip_suffix('*') {
                    string_matcher::MatchPattern::Prefix(rest.to_string())
                } else {
                    string_matcher::MatchPattern::Exact(h.clone())
                };
                matcher(pattern, true)
            })
            .collect(),
    })
}

fn http_provider(p: &ExtAuthzHttp, services: &[KnownService<'_>]) -> Result<Built, Vec<String>> {
    let mut errors = Vec::new();
    if !p.path_prefix.is_empty() && !p.path_prefix.starts_with('/') {
        errors.push(format!(
            "pathPrefix must begin with `/`, found: {:?}",
            p.path_prefix
        ));
    }
    for (field, values) in [
        (
            "includeRequestHeadersInCheck",
            &p.include_request_headers_in_check,
        ),
        ("includeHeadersInCheck", &p.include_headers_in_check),
        (
            "headersToDownstreamOnDeny",
            &p.headers_to_downstream_on_deny,
        ),
        (
            "headersToDownstreamOnAllow",
            &p.headers_to_downstream_on_allow,
        ),
        ("headersToUpstreamOnAllow", &p.headers_to_upstream_on_allow),
    ] {
        if values.iter().any(|v| v == "*") {
            errors.push(format!(
                "a single wildcard (\"*\") is not supported, change it to either prefix or suffix match: {field}"
            ));
        }
    }
    let Some((hostname, cluster, status)) = target(
        &p.service,
        p.port,
        &p.status_on_error,
        services,
        &mut errors,
    ) else {
        return Err(errors);
    };
    let authorization_request = (!p.include_additional_headers_in_check.is_empty()).then(|| {
        http_ext_authz::AuthorizationRequest {
            headers_to_add: p
                .include_additional_headers_in_check
                .iter()
                .map(|(key, value)| HeaderValue {
                    key: key.clone(),
                    value: value.clone(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    });
    let authorization_response = (!p.headers_to_upstream_on_allow.is_empty()
        || !p.headers_to_downstream_on_deny.is_empty()
        || !p.headers_to_downstream_on_allow.is_empty())
    .then(|| http_ext_authz::AuthorizationResponse {
        allowed_upstream_headers: headers(&p.headers_to_upstream_on_allow),
        allowed_client_headers: headers(&p.headers_to_downstream_on_deny),
        allowed_client_headers_on_success: headers(&p.headers_to_downstream_on_allow),
        ..Default::default()
    });
    let service = http_ext_authz::HttpService {
        path_prefix: p.path_prefix.clone(),
        server_uri: Some(HttpUri {
            // Required by Envoy, but not used: the cluster is.
            uri: format!("http://{hostname}"),
            timeout: Some(timeout(p.timeout.as_ref())),
            http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster(cluster)),
        }),
        authorization_request,
        authorization_response,
        ..Default::default()
    };
    let allowed = match headers(&p.include_request_headers_in_check) {
        Some(allowed) => Some(allowed),
        None => headers(&p.include_headers_in_check),
    };
    Ok(Built {
        http: http_ext_authz::ExtAuthz {
            status_on_error: status,
            failure_mode_allow: p.fail_open,
            transport_api_version: ApiVersion::V3 as i32,
            services: Some(http_ext_authz::ext_authz::Services::HttpService(service)),
            with_request_body: body(p.include_request_body_in_check.as_ref()),
            allowed_headers: allowed,
            ..Default::default()
        },
        tcp: None,
    })
}

fn grpc_provider(p: &ExtAuthzGrpc, services: &[KnownService<'_>]) -> Result<Built, Vec<String>> {
    let mut errors = Vec::new();
    let Some((hostname, cluster, status)) = target(
        &p.service,
        p.port,
        &p.status_on_error,
        services,
        &mut errors,
    ) else {
        return Err(errors);
    };
    let grpc = GrpcService {
        timeout: Some(timeout(p.timeout.as_ref())),
        target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
            grpc_service::EnvoyGrpc {
                cluster_name: cluster,
                authority: hostname,
                ..Default::default()
            },
        )),
        ..Default::default()
    };
    Ok(Built {
        http: http_ext_authz::ExtAuthz {
            status_on_error: status,
            failure_mode_allow: p.fail_open,
            transport_api_version: ApiVersion::V3 as i32,
            services: Some(http_ext_authz::ext_authz::Services::GrpcService(
                grpc.clone(),
            )),
            with_request_body: body(p.include_request_body_in_check.as_ref()),
            ..Default::default()
        },
        tcp: Some(NetworkExtAuthz {
            stat_prefix: TCP_STAT_PREFIX.to_string(),
            failure_mode_allow: p.fail_open,
            transport_api_version: ApiVersion::V3 as i32,
            grpc_service: Some(grpc),
            ..Default::default()
        }),
    })
}
