//! [`LoadBalancerSettings`]: how a destination's endpoints are picked (a simple algorithm or
//! consistent hashing), locality-aware routing and slow start.
//!
//! The two protobuf `oneof`s here (`lb_policy`, and `hash_key`/`hash_algorithm` of consistent
//! hashing) are enums; JSON writes their members side by side, and two members of one are a parse
//! error at the message that holds them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::common::{Duration, U64, check_oneof};
use crate::proto_enum;

proto_enum! {
    /// Load-balancing algorithms that need no tuning.
    pub enum SimpleLb {
        /// Let Istio pick (currently LEAST_REQUEST).
        Unspecified = 0 => "UNSPECIFIED",
        /// Deprecated alias of LEAST_REQUEST.
        LeastConn = 1 => "LEAST_CONN",
        Random = 2 => "RANDOM",
        /// Send to the address the caller asked for, without load balancing.
        Passthrough = 3 => "PASSTHROUGH",
        RoundRobin = 4 => "ROUND_ROBIN",
        LeastRequest = 5 => "LEAST_REQUEST",
    }
}

/// Load balancing of one destination (or of one port or subset of it).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(
    try_from = "LoadBalancerSettingsJson",
    into = "LoadBalancerSettingsJson"
)]
pub struct LoadBalancerSettings {
    /// The `lb_policy` oneof; `None` leaves the algorithm to the default.
    pub policy: Option<LbPolicy>,
    /// Locality-weighted distribution and failover.
    pub locality_lb_setting: Option<LocalityLoadBalancerSetting>,
    /// Envoy's zone-aware routing (exclusive with `locality_lb_setting`).
    pub zone_aware_lb_setting: Option<ZoneAwareLoadBalancerSetting>,
    /// Slow start: how long a new endpoint takes to get its full share (prefer `warmup`).
    pub warmup_duration_secs: Option<Duration>,
    /// Slow start with its curve.
    pub warmup: Option<WarmupConfiguration>,
}

/// The `lb_policy` oneof of [`LoadBalancerSettings`].
#[derive(Debug, Clone, PartialEq)]
pub enum LbPolicy {
    Simple(SimpleLb),
    ConsistentHash(ConsistentHashLb),
}

impl LoadBalancerSettings {
    /// The simple algorithm, when one is chosen.
    pub fn simple(&self) -> Option<SimpleLb> {
        match &self.policy {
            Some(LbPolicy::Simple(lb)) => Some(*lb),
            _ => None,
        }
    }

    /// The consistent-hash settings, when consistent hashing is chosen.
    pub fn consistent_hash(&self) -> Option<&ConsistentHashLb> {
        match &self.policy {
            Some(LbPolicy::ConsistentHash(ch)) => Some(ch),
            _ => None,
        }
    }
}

/// [`LoadBalancerSettings`] as JSON writes it.
#[derive(Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
struct LoadBalancerSettingsJson {
    #[serde(skip_serializing_if = "Option::is_none")]
    simple: Option<SimpleLb>,
    #[serde(skip_serializing_if = "Option::is_none")]
    consistent_hash: Option<ConsistentHashLb>,
    #[serde(skip_serializing_if = "Option::is_none")]
    locality_lb_setting: Option<LocalityLoadBalancerSetting>,
    #[serde(skip_serializing_if = "Option::is_none")]
    zone_aware_lb_setting: Option<ZoneAwareLoadBalancerSetting>,
    #[serde(skip_serializing_if = "Option::is_none")]
    warmup_duration_secs: Option<Duration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    warmup: Option<WarmupConfiguration>,
}

impl TryFrom<LoadBalancerSettingsJson> for LoadBalancerSettings {
    type Error = String;

    fn try_from(json: LoadBalancerSettingsJson) -> Result<Self, String> {
        check_oneof(
            "the load balancer policy",
            &[
                ("simple", json.simple.is_some()),
                ("consistentHash", json.consistent_hash.is_some()),
            ],
        )?;
        let policy = json
            .simple
            .map(LbPolicy::Simple)
            .or(json.consistent_hash.map(LbPolicy::ConsistentHash));
        Ok(LoadBalancerSettings {
            policy,
            locality_lb_setting: json.locality_lb_setting,
            zone_aware_lb_setting: json.zone_aware_lb_setting,
            warmup_duration_secs: json.warmup_duration_secs,
            warmup: json.warmup,
        })
    }
}

impl From<LoadBalancerSettings> for LoadBalancerSettingsJson {
    fn from(lb: LoadBalancerSettings) -> Self {
        let (simple, consistent_hash) = match lb.policy {
            Some(LbPolicy::Simple(s)) => (Some(s), None),
            Some(LbPolicy::ConsistentHash(ch)) => (None, Some(ch)),
            None => (None, None),
        };
        LoadBalancerSettingsJson {
            simple,
            consistent_hash,
            locality_lb_setting: lb.locality_lb_setting,
            zone_aware_lb_setting: lb.zone_aware_lb_setting,
            warmup_duration_secs: lb.warmup_duration_secs,
            warmup: lb.warmup,
        }
    }
}

/// Consistent hashing: requests with the same key go to the same endpoint (soft affinity).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(try_from = "ConsistentHashLbJson", into = "ConsistentHashLbJson")]
pub struct ConsistentHashLb {
    /// What the hash is computed from (the `hash_key` oneof).
    pub hash_key: Option<HashKey>,
    /// Ring hash or Maglev (the `hash_algorithm` oneof); `None` is Envoy's default.
    pub hash_algorithm: Option<HashAlgorithm>,
    /// Deprecated: use `hash_algorithm` = [`HashAlgorithm::RingHash`].
    pub minimum_ring_size: U64,
}

/// The `hash_key` oneof of [`ConsistentHashLb`].
#[derive(Debug, Clone, PartialEq)]
pub enum HashKey {
    /// A request header's value.
    HttpHeaderName(String),
    /// A cookie's value; the cookie is generated when absent.
    HttpCookie(HttpCookie),
    /// The client's IP address.
    UseSourceIp(bool),
    /// A query parameter's value.
    HttpQueryParameterName(String),
}

/// The `hash_algorithm` oneof of [`ConsistentHashLb`].
#[derive(Debug, Clone, PartialEq)]
pub enum HashAlgorithm {
    RingHash(RingHash),
    Maglev(MagLev),
}

/// Ketama ring hashing.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RingHash {
    /// Fewest virtual nodes on the ring (0: Envoy's default of 1024).
    #[serde(default)]
    pub minimum_ring_size: U64,
}

/// Maglev hashing.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MagLev {
    /// Lookup table size: a prime number.
    #[serde(default)]
    pub table_size: U64,
}

/// The cookie consistent hashing reads (and sets when missing).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpCookie {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub path: String,
    /// Lifetime of a generated cookie; without it, a session cookie.
    #[serde(default)]
    pub ttl: Option<Duration>,
    /// Extra attributes of a generated cookie (`SameSite=Strict`, ...).
    #[serde(default)]
    pub attributes: Vec<CookieAttribute>,
}

/// One attribute of a generated cookie.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CookieAttribute {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub value: String,
}

impl ConsistentHashLb {
    /// The header hashed on, when the key is a header.
    pub fn http_header_name(&self) -> Option<&str> {
        match &self.hash_key {
            Some(HashKey::HttpHeaderName(h)) => Some(h),
            _ => None,
        }
    }

    /// The cookie hashed on, when the key is a cookie.
    pub fn http_cookie(&self) -> Option<&HttpCookie> {
        match &self.hash_key {
            Some(HashKey::HttpCookie(c)) => Some(c),
            _ => None,
        }
    }

    /// The Maglev settings, when Maglev is chosen.
    pub fn maglev(&self) -> Option<&MagLev> {
        match &self.hash_algorithm {
            Some(HashAlgorithm::Maglev(m)) => Some(m),
            _ => None,
        }
    }

    /// The ring-hash settings, when ring hashing is chosen explicitly.
    pub fn ring_hash(&self) -> Option<&RingHash> {
        match &self.hash_algorithm {
            Some(HashAlgorithm::RingHash(r)) => Some(r),
            _ => None,
        }
    }
}

/// [`ConsistentHashLb`] as JSON writes it.
#[derive(Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
struct ConsistentHashLbJson {
    #[serde(skip_serializing_if = "Option::is_none")]
    http_header_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    http_cookie: Option<HttpCookie>,
    #[serde(skip_serializing_if = "Option::is_none")]
    use_source_ip: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    http_query_parameter_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ring_hash: Option<RingHash>,
    #[serde(skip_serializing_if = "Option::is_none")]
    maglev: Option<MagLev>,
    #[serde(skip_serializing_if = "is_zero")]
    minimum_ring_size: U64,
}

fn is_zero(v: &U64) -> bool {
    v.0 == 0
}

impl TryFrom<ConsistentHashLbJson> for ConsistentHashLb {
    type Error = String;

    fn try_from(json: ConsistentHashLbJson) -> Result<Self, String> {
        check_oneof(
            "the consistent hash key",
            &[
                ("httpHeaderName", json.http_header_name.is_some()),
                ("httpCookie", json.http_cookie.is_some()),
                ("useSourceIp", json.use_source_ip.is_some()),
                (
                    "httpQueryParameterName",
                    json.http_query_parameter_name.is_some(),
                ),
            ],
        )?;
        check_oneof(
            "the consistent hash algorithm",
            &[
                ("ringHash", json.ring_hash.is_some()),
                ("maglev", json.maglev.is_some()),
            ],
        )?;
        let hash_key = if let Some(h) = json.http_header_name {
            Some(HashKey::HttpHeaderName(h))
        } else if let Some(c) = json.http_cookie {
            Some(HashKey::HttpCookie(c))
        } else if let Some(ip) = json.use_source_ip {
            Some(HashKey::UseSourceIp(ip))
        } else {
            json.http_query_parameter_name
                .map(HashKey::HttpQueryParameterName)
        };
        let hash_algorithm = match (json.ring_hash, json.maglev) {
            (Some(r), _) => Some(HashAlgorithm::RingHash(r)),
            (None, Some(m)) => Some(HashAlgorithm::Maglev(m)),
            (None, None) => None,
        };
        Ok(ConsistentHashLb {
            hash_key,
            hash_algorithm,
            minimum_ring_size: json.minimum_ring_size,
        })
    }
}

impl From<ConsistentHashLb> for ConsistentHashLbJson {
    fn from(ch: ConsistentHashLb) -> Self {
        let mut json = ConsistentHashLbJson {
            minimum_ring_size: ch.minimum_ring_size,
            ..Default::default()
        };
        match ch.hash_key {
            Some(HashKey::HttpHeaderName(h)) => json.http_header_name = Some(h),
            Some(HashKey::HttpCookie(c)) => json.http_cookie = Some(c),
            Some(HashKey::UseSourceIp(ip)) => json.use_source_ip = Some(ip),
            Some(HashKey::HttpQueryParameterName(q)) => json.http_query_parameter_name = Some(q),
            None => {}
        }
        match ch.hash_algorithm {
            Some(HashAlgorithm::RingHash(r)) => json.ring_hash = Some(r),
            Some(HashAlgorithm::Maglev(m)) => json.maglev = Some(m),
            None => {}
        }
        json
    }
}

/// Locality-aware load balancing: weighted distribution across localities, or failover order.
/// Localities are written `region/zone/subzone`, with `*` allowed as the last part.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LocalityLoadBalancerSetting {
    /// Traffic shares per destination locality, by origin locality (exclusive with `failover`).
    #[serde(default)]
    pub distribute: Vec<LocalityDistribute>,
    /// Region to fail over to, by origin region.
    #[serde(default)]
    pub failover: Vec<Failover>,
    /// Endpoint labels ordered by priority for failover.
    #[serde(default)]
    pub failover_priority: Vec<String>,
    /// Turns locality load balancing on or off for this destination (absent: the mesh default).
    #[serde(default)]
    pub enabled: Option<bool>,
}

/// Traffic from the `from` locality, split across `to` localities by weight (summing to 100).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LocalityDistribute {
    #[serde(default)]
    pub from: String,
    #[serde(default)]
    pub to: BTreeMap<String, u32>,
}

/// When endpoints in region `from` are unhealthy, send traffic to region `to`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Failover {
    #[serde(default)]
    pub from: String,
    #[serde(default)]
    pub to: String,
}

/// Envoy's zone-aware routing; zone and subzone order are automatic, only cross-region order is
/// configurable.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ZoneAwareLoadBalancerSetting {
    #[serde(default)]
    pub enabled: Option<bool>,
    /// Region to fail over to, by origin region.
    #[serde(default)]
    pub failover: Vec<Failover>,
    /// Endpoint labels ordered by priority (no topology labels).
    #[serde(default)]
    pub failover_priority: Vec<String>,
    /// Smallest upstream cluster for which zone-aware routing applies (at least 1).
    #[serde(default)]
    pub min_cluster_size: Option<U64>,
}

/// Slow start: a new endpoint's share of traffic grows over `duration`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WarmupConfiguration {
    /// Length of the warmup window (required).
    #[serde(default)]
    pub duration: Option<Duration>,
    /// Share of its traffic an endpoint gets at the start, in percent (0..100).
    #[serde(default)]
    pub minimum_percent: Option<f64>,
    /// Curve of the increase: 1 is linear, higher is slower at first (greater than 0).
    #[serde(default)]
    pub aggression: Option<f64>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::destination_rule::DestinationRule;
    use crate::parse_spec;

    fn lb_of(spec: serde_json::Value) -> Result<LoadBalancerSettings, String> {
        parse_spec::<DestinationRule>(&spec)
            .map(|dr| {
                dr.traffic_policy
                    .and_then(|p| p.load_balancer)
                    .unwrap_or_default()
            })
            .map_err(|e| format!("{}: {}", e.field, e.message))
    }

    #[test]
    fn oneofs_read_into_enums() {
        let lb = lb_of(json!({"host": "r", "trafficPolicy": {"loadBalancer": {
            "consistentHash": {"httpCookie": {"name": "c", "ttl": "0s"}, "maglev": {"tableSize": "65537"}}
        }}}))
        .unwrap();
        let ch = lb.consistent_hash().unwrap();
        assert_eq!(ch.http_cookie().unwrap().name, "c");
        assert_eq!(ch.maglev().unwrap().table_size, U64(65537));
        assert_eq!(lb.simple(), None);

        let lb =
            lb_of(json!({"host": "r", "trafficPolicy": {"loadBalancer": {"simple": "RANDOM"}}}))
                .unwrap();
        assert_eq!(lb.policy, Some(LbPolicy::Simple(SimpleLb::Random)));
        // A oneof member present with its zero value is still the chosen member.
        let lb = lb_of(json!({"host": "r", "trafficPolicy": {"loadBalancer": {
            "consistentHash": {"useSourceIp": false}
        }}}))
        .unwrap();
        assert_eq!(
            lb.consistent_hash().unwrap().hash_key,
            Some(HashKey::UseSourceIp(false))
        );
    }

    #[test]
    fn two_members_of_a_oneof_are_refused_at_the_parent() {
        let err = lb_of(json!({"host": "r", "trafficPolicy": {"loadBalancer": {
            "simple": "RANDOM", "consistentHash": {"useSourceIp": true}
        }}}))
        .unwrap_err();
        assert!(
            err.starts_with("spec.trafficPolicy.loadBalancer: only one of simple, consistentHash"),
            "{err}"
        );
        let err = lb_of(json!({"host": "r", "trafficPolicy": {"loadBalancer": {
            "consistentHash": {"httpHeaderName": "x", "useSourceIp": true}
        }}}))
        .unwrap_err();
        assert!(
            err.contains("found httpHeaderName and useSourceIp"),
            "{err}"
        );
        let err = lb_of(json!({"host": "r", "trafficPolicy": {"loadBalancer": {
            "consistentHash": {"ringHash": {}, "maglev": {}}
        }}}))
        .unwrap_err();
        assert!(err.contains("found ringHash and maglev"), "{err}");
        let err =
            lb_of(json!({"host": "r", "trafficPolicy": {"loadBalancer": {"simpel": "RANDOM"}}}))
                .unwrap_err();
        assert!(err.contains("unknown field"), "{err}");
    }

    #[test]
    fn serializes_back_to_protobuf_json() {
        let lb = LoadBalancerSettings {
            policy: Some(LbPolicy::ConsistentHash(ConsistentHashLb {
                hash_key: Some(HashKey::HttpHeaderName("x-user".into())),
                hash_algorithm: Some(HashAlgorithm::RingHash(RingHash {
                    minimum_ring_size: U64(1024),
                })),
                minimum_ring_size: U64(0),
            })),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&lb).unwrap(),
            json!({"consistentHash": {"httpHeaderName": "x-user", "ringHash": {"minimumRingSize": "1024"}}})
        );
    }
}
