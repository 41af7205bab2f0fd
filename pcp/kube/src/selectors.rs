//! Mesh `discoverySelectors`: which namespaces the syncer reads, as istiod decides it. The
//! selectors are Kubernetes label selectors, OR-ed: a namespace matching any is read; no
//! selectors reads every namespace. Within one selector, `matchLabels` and every
//! `matchExpressions` entry must all hold.

use std::collections::BTreeMap;

use pasa_istio::label_selector::LabelSelector;

/// The namespaces a mesh discovers.
#[derive(Debug, Clone, Default)]
pub struct DiscoverySelectors(Vec<LabelSelector>);

impl DiscoverySelectors {
    /// Checks every selector's operators first: an unknown one is an error naming it.
    pub fn new(selectors: Vec<LabelSelector>) -> anyhow::Result<DiscoverySelectors> {
        for (i, s) in selectors.iter().enumerate() {
            for (j, r) in s.match_expressions.iter().enumerate() {
                match r.operator.as_str() {
                    "In" | "NotIn" if r.values.is_empty() => {
                        anyhow::bail!(
                            "discoverySelectors[{i}].matchExpressions[{j}].values: {} needs values",
                            r.operator
                        )
                    }
                    "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
                    other => anyhow::bail!(
                        "discoverySelectors[{i}].matchExpressions[{j}].operator: {other:?} is not \
                         one of In, NotIn, Exists, DoesNotExist"
                    ),
                }
            }
        }
        Ok(DiscoverySelectors(selectors))
    }

    /// The `discoverySelectors` of an Istio mesh config document (the `mesh` key of istiod's
    /// `istio` ConfigMap); every namespace when it has none.
    pub fn from_mesh_config(mesh: &serde_json::Value) -> anyhow::Result<DiscoverySelectors> {
        match mesh.get("discoverySelectors") {
            None | Some(serde_json::Value::Null) => Ok(DiscoverySelectors::all()),
            Some(list) => {
                let selectors: Vec<LabelSelector> = serde_json::from_value(list.clone())
                    .map_err(|e| anyhow::anyhow!("discoverySelectors: {e}"))?;
                DiscoverySelectors::new(selectors)
            }
        }
    }

    /// Every namespace.
    pub fn all() -> DiscoverySelectors {
        DiscoverySelectors::default()
    }

    /// Whether a namespace with these labels is read.
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.is_empty() || self.0.iter().any(|s| s.matches(labels))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn selector(doc: serde_json::Value) -> LabelSelector {
        serde_json::from_value(doc).unwrap()
    }

    #[test]
    fn selectors_are_ored_and_their_terms_anded() {
        let s = DiscoverySelectors::new(vec![
            selector(serde_json::json!({"matchLabels": {"env": "prod"},
                "matchExpressions": [{"key": "team", "operator": "In", "values": ["a", "b"]}]})),
            selector(serde_json::json!({"matchExpressions": [
                {"key": "mesh", "operator": "Exists"},
                {"key": "legacy", "operator": "DoesNotExist"},
                {"key": "tier", "operator": "NotIn", "values": ["batch"]}]})),
        ])
        .unwrap();
        assert!(s.selects(&labels(&[("env", "prod"), ("team", "a")])));
        assert!(!s.selects(&labels(&[("env", "prod"), ("team", "c")])));
        assert!(!s.selects(&labels(&[("env", "prod")])));
        assert!(s.selects(&labels(&[("mesh", "")])));
        assert!(!s.selects(&labels(&[("mesh", ""), ("legacy", "1")])));
        assert!(!s.selects(&labels(&[("mesh", ""), ("tier", "batch")])));
        assert!(DiscoverySelectors::all().selects(&labels(&[])));
    }

    #[test]
    fn read_from_a_mesh_config() {
        let mesh = serde_json::json!({"rootNamespace": "istio-system",
            "discoverySelectors": [{"matchLabels": {"env": "prod"}}]});
        let s = DiscoverySelectors::from_mesh_config(&mesh).unwrap();
        assert!(s.selects(&labels(&[("env", "prod")])));
        assert!(!s.selects(&labels(&[])));
        let none = DiscoverySelectors::from_mesh_config(&serde_json::json!({})).unwrap();
        assert!(none.selects(&labels(&[])));
        let bad = serde_json::json!({"discoverySelectors": [{"matchLabels": "env"}]});
        let e = DiscoverySelectors::from_mesh_config(&bad)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("discoverySelectors:"), "{e}");
    }

    #[test]
    fn bad_operators_are_named() {
        let bad =
            selector(serde_json::json!({"matchExpressions": [{"key": "a", "operator": "Has"}]}));
        let e = DiscoverySelectors::new(vec![bad]).unwrap_err().to_string();
        assert!(
            e.contains("discoverySelectors[0].matchExpressions[0].operator"),
            "{e}"
        );
        let empty =
            selector(serde_json::json!({"matchExpressions": [{"key": "a", "operator": "In"}]}));
        assert!(DiscoverySelectors::new(vec![empty]).is_err());
    }
}
