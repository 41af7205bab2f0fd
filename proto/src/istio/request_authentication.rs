//! `RequestAuthentication` (`security.istio.io` v1 and v1beta1): the JWTs a workload accepts —
//! who issues them, where their keys are, where in the request they travel, and what of them is
//! passed on. A request with an invalid token is refused; one without a token is let through
//! (an AuthorizationPolicy decides whether it needs one).

use serde::{Deserialize, Serialize};

use super::authorization_policy::PolicyTargetReference;
use super::common::Duration;
use super::destination_rule::WorkloadSelector;

/// The `spec` of a RequestAuthentication.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RequestAuthentication {
    #[serde(default)]
    pub selector: Option<WorkloadSelector>,
    #[serde(default)]
    pub target_ref: Option<PolicyTargetReference>,
    #[serde(default)]
    pub target_refs: Vec<PolicyTargetReference>,
    /// A null entry is kept so that validation can name it.
    #[serde(default)]
    pub jwt_rules: Vec<Option<JwtRule>>,
}

impl RequestAuthentication {
    /// Whether the policy is attached by `targetRef` or `targetRefs`.
    pub fn targeted(&self) -> bool {
        self.target_ref.is_some() || !self.target_refs.is_empty()
    }
}

/// One issuer's tokens.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct JwtRule {
    #[serde(default)]
    pub issuer: String,
    #[serde(default)]
    pub audiences: Vec<String>,
    /// Where the issuer's public keys are fetched from (`http://` or `https://`).
    #[serde(default)]
    pub jwks_uri: String,
    /// The public keys inline, as a JSON Web Key Set.
    #[serde(default)]
    pub jwks: String,
    #[serde(default)]
    pub from_headers: Vec<Option<JwtHeader>>,
    #[serde(default)]
    pub from_params: Vec<String>,
    #[serde(default)]
    pub from_cookies: Vec<String>,
    #[serde(default)]
    pub output_payload_to_header: String,
    #[serde(default)]
    pub forward_original_token: bool,
    #[serde(default)]
    pub output_claim_to_headers: Vec<Option<ClaimToHeader>>,
    #[serde(default)]
    pub timeout: Option<Duration>,
    #[serde(default)]
    pub space_delimited_claims: Vec<String>,
}

impl JwtRule {
    /// Whether the issuer's keys are written in the rule (`jwks`). PASA's agents build only
    /// such rules: keys behind `jwksUri` (or the issuer's discovery document) would have every
    /// agent fetch them.
    pub fn has_inline_keys(&self) -> bool {
        !self.jwks.is_empty()
    }
}

/// A header the token is read from, and the prefix before it (`Bearer `).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct JwtHeader {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub prefix: String,
}

/// A claim copied into a request header.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimToHeader {
    #[serde(default)]
    pub header: String,
    #[serde(default)]
    pub claim: String,
}
