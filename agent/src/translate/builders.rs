//! Envoy builders every output shares (clusters, routes, listeners, hash policies): a leaf the
//! other translation modules stand on, so that none borrows helpers from a sibling.

use envoy_types::pb::envoy::config::core::v3::config_source::ConfigSourceSpecifier;
use envoy_types::pb::envoy::config::core::v3::{AggregatedConfigSource, ApiVersion, ConfigSource};
use envoy_types::pb::google::protobuf::Duration;

/// ADS as the config source of EDS clusters and RDS route configurations.
pub(super) fn ads() -> ConfigSource {
    ConfigSource {
        config_source_specifier: Some(ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
        resource_api_version: ApiVersion::V3 as i32,
        initial_fetch_timeout: Some(Duration {
            seconds: 0,
            nanos: 0,
        }),
        ..Default::default()
    }
}

/// An Istio duration as a protobuf one.
pub(super) fn duration(d: &pasa_proto::istio::common::Duration) -> Duration {
    Duration {
        seconds: d.seconds,
        nanos: d.nanos,
    }
}
