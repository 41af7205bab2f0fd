//! RequestAuthentication to Envoy's JWT filter (`envoy.filters.http.jwt_authn`), as istiod builds
//! it: one provider per JWT rule of the policies that apply (rules sorted by issuer, named
//! `origins-<i>`), and one requirement for every path: a token, when present, must be valid for
//! one of the providers; a request without a token passes (an AuthorizationPolicy decides whether
//! it needs one, from the `payload` the filter records, read by the RBAC filters as the request
//! principal and claims).
//!
//! **Keys.** istiod fetches each issuer's key set and sends it inline; so does PASA, and the
//! agents never fetch keys themselves (100k agents would all fetch the same URI): a rule's inline
//! `jwks` is served as written; keys behind a `jwksUri` (or the issuer's discovery document) are
//! fetched once for the mesh by PCP and kept in the store (`JsonWebKeySet`), where the agent
//! reads them. A rule whose keys are not there (yet) is left out; the injecting webhook keeps
//! the pods such a policy applies to with istiod.

use envoy_types::pb::envoy::config::core::v3::{DataSource, data_source};
use envoy_types::pb::envoy::config::route::v3::{RouteMatch, route_match};
use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::{
    JwtAuthentication, JwtClaimToHeader, JwtHeader, JwtProvider, JwtRequirement,
    JwtRequirementAndList, JwtRequirementOrList, RequirementRule, jwt_provider,
    jwt_requirement, requirement_rule,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType as HttpConfigType;
use envoy_types::pb::google::protobuf::Empty;
use envoy_types::util::pack_any;
use pasa_istio::request_authentication::JwtRule;

use super::{JWT_FILTER, JWT_PAYLOAD};

/// Claims whose space-separated values are matched one by one, besides those a rule names.
const SPACE_DELIMITED: [&str; 2] = ["permission", "scope"];

/// The JWT filter for the rules of the RequestAuthentications that apply, each with its key
/// set (JSON text), or None when there are none.
pub fn filter(mut rules: Vec<(&JwtRule, &str)>) -> Option<HttpFilter> {
    if rules.is_empty() {
        return None;
    }
    rules.sort_by(|(a, _), (b, _)| a.issuer.cmp(&b.issuer));
    let mut providers = std::collections::HashMap::new();
    let (mut each, mut any_of) = (Vec::new(), Vec::new());
    for (i, (rule, keys)) in rules.iter().enumerate() {
        let name = format!("origins-{i}");
        providers.insert(name.clone(), provider(rule, keys));
        let named = || JwtRequirement {
            requires_type: Some(jwt_requirement::RequiresType::ProviderName(name.clone())),
        };
        // This provider's token, or none at all.
        each.push(JwtRequirement {
            requires_type: Some(jwt_requirement::RequiresType::RequiresAny(
                JwtRequirementOrList {
                    requirements: vec![
                        named(),
                        JwtRequirement {
                            requires_type: Some(jwt_requirement::RequiresType::AllowMissing(
                                Empty {},
                            )),
                        },
                    ],
                },
            )),
        });
        any_of.push(named());
    }
    let requires = if each.len() == 1 {
        each.remove(0)
    } else {
        any_of.push(JwtRequirement {
            requires_type: Some(jwt_requirement::RequiresType::RequiresAll(
                JwtRequirementAndList { requirements: each },
            )),
        });
        JwtRequirement {
            requires_type: Some(jwt_requirement::RequiresType::RequiresAny(
                JwtRequirementOrList {
                    requirements: any_of,
                },
            )),
        }
    };
    let config = JwtAuthentication {
        rules: vec![RequirementRule {
            r#match: Some(RouteMatch {
                path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
                ..Default::default()
            }),
            requirement_type: Some(requirement_rule::RequirementType::Requires(requires)),
        }],
        providers,
        bypass_cors_preflight: true,
        ..Default::default()
    };
    Some(HttpFilter {
        name: JWT_FILTER.to_string(),
        config_type: Some(HttpConfigType::TypedConfig(pack_any(config))),
        ..Default::default()
    })
}

fn provider(rule: &JwtRule, keys: &str) -> JwtProvider {
    let mut claims: Vec<String> = SPACE_DELIMITED.iter().map(|c| c.to_string()).collect();
    claims.extend(rule.space_delimited_claims.iter().cloned());
    claims.sort();
    claims.dedup();
    JwtProvider {
        issuer: rule.issuer.clone(),
        audiences: rule.audiences.clone(),
        forward: rule.forward_original_token,
        forward_payload_header: rule.output_payload_to_header.clone(),
        payload_in_metadata: JWT_PAYLOAD.to_string(),
        normalize_payload_in_metadata: Some(jwt_provider::NormalizePayload {
            space_delimited_claims: claims,
        }),
        claim_to_headers: rule
            .output_claim_to_headers
            .iter()
            .flatten()
            .map(|c| JwtClaimToHeader {
                header_name: c.header.clone(),
                claim_name: c.claim.clone(),
                ..Default::default()
            })
            .collect(),
        from_headers: rule
            .from_headers
            .iter()
            .flatten()
            .map(|h| JwtHeader {
                name: h.name.clone(),
                value_prefix: h.prefix.clone(),
            })
            .collect(),
        from_params: rule.from_params.clone(),
        from_cookies: rule.from_cookies.clone(),
        jwks_source_specifier: Some(jwt_provider::JwksSourceSpecifier::LocalJwks(DataSource {
            specifier: Some(data_source::Specifier::InlineString(keys.to_string())),
            ..Default::default()
        })),
        ..Default::default()
    }
}
