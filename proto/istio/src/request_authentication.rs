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

/// Where a JWT rule's keys come from when they are not inline: its `jwksUri`, or the issuer's
/// OpenID discovery document (`<issuer>/.well-known/openid-configuration`) when it names none.
/// PCP fetches each once for the mesh and keeps the keys in the store as the `JsonWebKeySet`
/// [`KeySetSource::object_name`] of the root namespace; agents read them from there.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KeySetSource {
    Uri(String),
    Issuer(String),
}

impl KeySetSource {
    /// The source of `rule`'s keys, or None when they are inline.
    pub fn of(rule: &JwtRule) -> Option<KeySetSource> {
        if rule.has_inline_keys() {
            None
        } else if !rule.jwks_uri.is_empty() {
            Some(KeySetSource::Uri(rule.jwks_uri.clone()))
        } else {
            Some(KeySetSource::Issuer(rule.issuer.clone()))
        }
    }

    /// The name of the `JsonWebKeySet` object holding this source's keys: `jwks-` and a
    /// 64-bit FNV-1a hash of the source, in hex (stable across processes and releases).
    pub fn object_name(&self) -> String {
        let text = match self {
            KeySetSource::Uri(uri) => format!("uri:{uri}"),
            KeySetSource::Issuer(issuer) => format!("issuer:{issuer}"),
        };
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for b in text.bytes() {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        format!("jwks-{hash:016x}")
    }
}

/// The `spec` of a `JsonWebKeySet` object: a key set PCP fetched.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct JsonWebKeySet {
    /// The `jwksUri`, or the issuer whose discovery document named the keys' URI.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub jwks_uri: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub issuer: String,
    /// The key set as fetched (JSON text).
    #[serde(default)]
    pub jwks: String,
}

impl JsonWebKeySet {
    /// The source this key set answers.
    pub fn source(&self) -> KeySetSource {
        if self.jwks_uri.is_empty() {
            KeySetSource::Issuer(self.issuer.clone())
        } else {
            KeySetSource::Uri(self.jwks_uri.clone())
        }
    }
}
