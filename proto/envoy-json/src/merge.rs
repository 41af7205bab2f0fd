//! Merging one Envoy message into another as istiod merges an EnvoyFilter's `MERGE` patch: every
//! field the patch sets overrides the target's — scalars and bytes replaced, messages merged
//! field by field (but a `google.protobuf.Duration`, replaced whole: `5s` over `0.5s` is `5s`, not
//! `5.5s`), map entries replaced by key, lists appended to (or, for `MERGE_AND_REPLACE_LIST`,
//! replaced) — and setting one member of a `oneof` clears the others. An `Any` is a message like
//! any other here (its type and bytes replaced); [`merge_any`] merges what two `Any` of one type
//! hold, as istiod does for filters' typed configs.

use envoy_types::pb::google::protobuf::Any;
use prost::Message as _;
use prost_reflect::{DynamicMessage, Kind, MessageDescriptor, Value};

use prost_reflect::DescriptorPool;

use crate::JsonError;

/// What a merge does with a list the patch sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lists {
    /// Appends the patch's items (`MERGE`).
    Append,
    /// Replaces the list with the patch's (`MERGE_AND_REPLACE_LIST`).
    Replace,
}

const DURATION: &str = "google.protobuf.Duration";

/// `patch` merged into `target`, both encodings of the message `type_name` (which `pool`
/// describes).
pub fn merge(
    pool: &DescriptorPool,
    type_name: &str,
    target: &[u8],
    patch: &[u8],
    lists: Lists,
) -> Result<Vec<u8>, JsonError> {
    let descriptor = descriptor(pool, type_name)?;
    let decode = |bytes: &[u8]| {
        DynamicMessage::decode(descriptor.clone(), bytes).map_err(|source| JsonError::Decode {
            name: type_name.to_string(),
            type_url: type_name.to_string(),
            source,
        })
    };
    let mut dst = decode(target)?;
    merge_message(&mut dst, &decode(patch)?, lists);
    Ok(dst.encode_to_vec())
}

/// What `patch` holds merged into what `target` holds, when both hold the same type (istiod's
/// merge of a filter's typed config); an error when they differ or the type is unknown.
pub fn merge_any(pool: &DescriptorPool, target: &Any, patch: &Any) -> Result<Any, JsonError> {
    if target.type_url != patch.type_url {
        return Err(JsonError::TypesDiffer {
            target: target.type_url.clone(),
            patch: patch.type_url.clone(),
        });
    }
    let type_name = target.type_url.rsplit('/').next().unwrap_or_default();
    Ok(Any {
        type_url: target.type_url.clone(),
        value: merge(pool, type_name, &target.value, &patch.value, Lists::Append)?,
    })
}

fn descriptor(pool: &DescriptorPool, type_name: &str) -> Result<MessageDescriptor, JsonError> {
    pool.get_message_by_name(type_name)
        .ok_or_else(|| JsonError::UnknownType {
            name: type_name.to_string(),
            type_url: type_name.to_string(),
        })
}

fn merge_message(dst: &mut DynamicMessage, src: &DynamicMessage, lists: Lists) {
    for (field, value) in src.fields() {
        match value {
            Value::List(items) => {
                let Value::List(existing) = dst.get_field_mut(&field) else {
                    continue;
                };
                if lists == Lists::Replace {
                    existing.clear();
                }
                existing.extend(items.iter().cloned());
            }
            Value::Map(entries) => {
                let Value::Map(existing) = dst.get_field_mut(&field) else {
                    continue;
                };
                existing.extend(entries.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            Value::Message(inner) => {
                let replace = matches!(field.kind(), Kind::Message(m) if m.full_name() == DURATION);
                if replace || !dst.has_field(&field) {
                    dst.set_field(&field, value.clone());
                } else if let Value::Message(existing) = dst.get_field_mut(&field) {
                    merge_message(existing, inner, lists);
                }
            }
            scalar => dst.set_field(&field, scalar.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::cluster::v3::cluster::{DiscoveryType, LbPolicy};
    use envoy_types::pb::envoy::config::cluster::v3::{Cluster, OutlierDetection};
    use envoy_types::pb::envoy::config::core::v3::{Http1ProtocolOptions, Http2ProtocolOptions};
    use envoy_types::pb::google::protobuf::{Duration, UInt32Value};
    use prost::Name;

    fn cluster_merge(target: &Cluster, patch: &Cluster, lists: Lists) -> Cluster {
        let pool = crate::pool_for([Cluster::full_name().as_str()]).unwrap();
        let merged = merge(
            &pool,
            &Cluster::full_name(),
            &target.encode_to_vec(),
            &patch.encode_to_vec(),
            lists,
        )
        .unwrap();
        Cluster::decode(merged.as_slice()).unwrap()
    }

    #[test]
    fn scalars_replace_messages_merge_durations_replace() {
        let target = Cluster {
            name: "outbound|80||a".into(),
            lb_policy: LbPolicy::LeastRequest as i32,
            connect_timeout: Some(Duration {
                seconds: 0,
                nanos: 500_000_000,
            }),
            outlier_detection: Some(OutlierDetection {
                consecutive_5xx: Some(UInt32Value { value: 5 }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let patch = Cluster {
            lb_policy: LbPolicy::Maglev as i32,
            connect_timeout: Some(Duration {
                seconds: 5,
                nanos: 0,
            }),
            outlier_detection: Some(OutlierDetection {
                interval: Some(Duration {
                    seconds: 1,
                    nanos: 0,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let merged = cluster_merge(&target, &patch, Lists::Append);
        assert_eq!(merged.name, "outbound|80||a", "unset in the patch: kept");
        assert_eq!(merged.lb_policy, LbPolicy::Maglev as i32);
        assert_eq!(
            merged.connect_timeout,
            Some(Duration {
                seconds: 5,
                nanos: 0
            }),
            "a duration is replaced whole"
        );
        let od = merged.outlier_detection.unwrap();
        assert_eq!(
            od.consecutive_5xx,
            Some(UInt32Value { value: 5 }),
            "a message is merged field by field"
        );
        assert_eq!(od.interval.map(|d| d.seconds), Some(1));
    }

    #[test]
    fn lists_append_or_replace_and_oneofs_switch() {
        let target = Cluster {
            dns_lookup_family: 1,
            alt_stat_name: "old".into(),
            cluster_discovery_type: Some(
                envoy_types::pb::envoy::config::cluster::v3::cluster::ClusterDiscoveryType::Type(
                    DiscoveryType::Eds as i32,
                ),
            ),
            ..Default::default()
        };
        let mut target = target;
        target.filters.push(Default::default());
        let mut patch = Cluster {
            cluster_discovery_type: Some(
                envoy_types::pb::envoy::config::cluster::v3::cluster::ClusterDiscoveryType::Type(
                    DiscoveryType::StrictDns as i32,
                ),
            ),
            ..Default::default()
        };
        patch
            .filters
            .push(envoy_types::pb::envoy::config::cluster::v3::Filter {
                name: "added".into(),
                ..Default::default()
            });
        let appended = cluster_merge(&target, &patch, Lists::Append);
        assert_eq!(appended.filters.len(), 2);
        assert_eq!(appended.alt_stat_name, "old");
        assert_eq!(
            appended.cluster_discovery_type,
            patch.cluster_discovery_type
        );
        let replaced = cluster_merge(&target, &patch, Lists::Replace);
        assert_eq!(replaced.filters.len(), 1);
        assert_eq!(replaced.filters[0].name, "added");
    }

    #[test]
    fn typed_configs_merge_only_within_one_type() {
        let a = envoy_types::util::pack_any(Http1ProtocolOptions {
            accept_http_10: true,
            ..Default::default()
        });
        let b = envoy_types::util::pack_any(Http1ProtocolOptions {
            allow_absolute_url: Some(envoy_types::pb::google::protobuf::BoolValue { value: true }),
            ..Default::default()
        });
        let pool = crate::pool().unwrap();
        let merged = merge_any(pool, &a, &b).unwrap();
        let h1 = Http1ProtocolOptions::decode(merged.value.as_slice()).unwrap();
        assert!(h1.accept_http_10);
        assert_eq!(
            h1.allow_absolute_url,
            Some(envoy_types::pb::google::protobuf::BoolValue { value: true })
        );
        let other = envoy_types::util::pack_any(Http2ProtocolOptions::default());
        assert!(merge_any(pool, &a, &other).is_err());
    }
}
