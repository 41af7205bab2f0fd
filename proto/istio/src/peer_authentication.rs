//! `PeerAuthentication` (`security.istio.io` v1 and v1beta1): the mutual TLS a workload's inbound
//! side accepts, for the mesh (root namespace, no selector), a namespace (no selector) or the
//! workloads a selector picks, and per port for the latter.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::destination_rule::WorkloadSelector;

/// The `spec` of a PeerAuthentication.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PeerAuthentication {
    #[serde(default)]
    pub selector: Option<WorkloadSelector>,
    #[serde(default)]
    pub mtls: Option<MutualTls>,
    /// Modes by the workload's port (a target port, not a service port). Present but empty is
    /// not the same as absent: istiod rejects an empty map.
    #[serde(default)]
    pub port_level_mtls: Option<BTreeMap<u32, MutualTls>>,
}

/// A mutual TLS setting.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MutualTls {
    #[serde(default)]
    pub mode: PeerMode,
}

/// A mode as written; `UNSET` inherits from the level above.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PeerMode {
    #[default]
    Unset,
    Disable,
    Permissive,
    Strict,
}

impl PeerAuthentication {
    /// The port-level modes (none when the field is absent).
    pub fn port_modes(&self) -> impl Iterator<Item = (u32, PeerMode)> + '_ {
        self.port_level_mtls
            .iter()
            .flatten()
            .map(|(port, tls)| (*port, tls.mode))
    }

    /// Whether the policy picks workloads by label (a workload policy), rather than applying to
    /// a whole namespace or the mesh.
    pub fn selects_workloads(&self) -> bool {
        self.selector
            .as_ref()
            .is_some_and(|s| !s.match_labels.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_the_crd_form() {
        let spec: PeerAuthentication = crate::parse_spec(&json!({
            "selector": {"matchLabels": {"app": "httpbin"}},
            "mtls": {"mode": "PERMISSIVE"},
            "portLevelMtls": {"8080": {"mode": "STRICT"}}
        }))
        .expect("parses");
        assert_eq!(
            spec.mtls.as_ref().map(|m| m.mode),
            Some(PeerMode::Permissive)
        );
        assert_eq!(
            spec.port_modes().collect::<Vec<_>>(),
            [(8080, PeerMode::Strict)]
        );
        assert!(spec.selects_workloads());
        let err =
            crate::parse_spec::<PeerAuthentication>(&json!({"mtls": {"mode": "ON"}})).unwrap_err();
        assert_eq!(err.field, "spec.mtls.mode");
        let empty: PeerAuthentication =
            crate::parse_spec(&json!({"portLevelMtls": {}})).expect("parses");
        assert_eq!(empty.port_level_mtls, Some(BTreeMap::new()));
    }
}
