//! Consistent hashing: the `consistentHash` key of the DestinationRule policy that applies to a
//! route's destination becomes the route's hash policy (the cluster side, ring hash or Maglev,
//! is set with the cluster's load balancer).

use envoy_types::pb::envoy::config::route::v3::route_action::HashPolicy;
use envoy_types::pb::envoy::config::route::v3::route_action::hash_policy::{
    ConnectionProperties, Cookie, Header, PolicySpecifier, QueryParameter,
};
use pasa_proto::istio::destination_rule::HashKey;

use super::cluster::{Policy, duration};

/// The route hash policy for a destination governed by `policy`, if it hashes consistently.
pub(super) fn route_hash_policy(policy: &Policy) -> Option<HashPolicy> {
    let key = policy
        .load_balancer
        .as_ref()?
        .consistent_hash()?
        .hash_key
        .as_ref()?;
    let specifier = match key {
        HashKey::HttpHeaderName(name) => PolicySpecifier::Header(Header {
            header_name: name.clone(),
            ..Default::default()
        }),
        HashKey::HttpCookie(cookie) => PolicySpecifier::Cookie(Cookie {
            name: cookie.name.clone(),
            path: cookie.path.clone(),
            ttl: cookie.ttl.as_ref().map(duration),
            ..Default::default()
        }),
        HashKey::UseSourceIp(true) => {
            PolicySpecifier::ConnectionProperties(ConnectionProperties { source_ip: true })
        }
        HashKey::UseSourceIp(false) => return None,
        HashKey::HttpQueryParameterName(name) => {
            PolicySpecifier::QueryParameter(QueryParameter { name: name.clone() })
        }
    };
    Some(HashPolicy {
        policy_specifier: Some(specifier),
        ..Default::default()
    })
}
