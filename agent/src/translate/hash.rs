//! Consistent hashing: the `consistentHash` key of the DestinationRule policy that applies to a
//! route's destination becomes the route's hash policy (the cluster side, ring hash or Maglev,
//! is set with the cluster's load balancer).

use envoy_types::pb::envoy::config::route::v3::route_action::HashPolicy;
use envoy_types::pb::envoy::config::route::v3::route_action::hash_policy::{
    ConnectionProperties, Cookie, Header, PolicySpecifier, QueryParameter,
};
use std::hash::{Hash, Hasher};

use pasa_istio::destination_rule::{DestinationRule, HashKey, TrafficPolicy};

use super::builders::duration;
use super::cluster::Policy;

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

/// A fingerprint of what route hash policies read of a DestinationRule: which of its policies
/// (rule, subsets, ports) set a load balancer, and the consistent hash of each. A change of a
/// simple load balancer, of connection pools or of TLS leaves it as it was.
pub(super) fn rule_fingerprint(dr: &DestinationRule) -> u64 {
    fn feed(tp: Option<&TrafficPolicy>, h: &mut impl Hasher) {
        let Some(tp) = tp else {
            0u8.hash(h);
            return;
        };
        let key = |lb: Option<&pasa_istio::destination_rule::LoadBalancerSettings>| {
            lb.map(|lb| format!("{:?}", lb.consistent_hash()))
        };
        key(tp.load_balancer.as_ref()).hash(h);
        for p in &tp.port_level_settings {
            (
                p.port.as_ref().map(|s| s.number),
                key(p.load_balancer.as_ref()),
            )
                .hash(h);
        }
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    feed(dr.traffic_policy.as_ref(), &mut h);
    for s in &dr.subsets {
        s.name.hash(&mut h);
        feed(s.traffic_policy.as_ref(), &mut h);
    }
    h.finish()
}
