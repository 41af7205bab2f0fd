//! Label selectors: Istio's (a workload selector's labels, a Gateway's `selector`, a subset's
//! labels, a match's `sourceLabels`), matched by [`selects`], and Kubernetes' (`matchLabels` and
//! `matchExpressions`), as the API server evaluates them: every label pair and every expression
//! must hold.

use std::collections::BTreeMap;

use serde::Deserialize;

/// Whether `labels` carry every label of `selector` with an equal value, as istiod matches a
/// selector's labels against a workload's: an empty selector selects everything. Where an
/// empty selector selects nothing instead (a ProxyConfig's), the caller says so beside its call.
pub fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// A Kubernetes label selector.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct LabelSelector {
    #[serde(deserialize_with = "null_as_empty")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(deserialize_with = "null_as_empty")]
    pub match_expressions: Vec<LabelRequirement>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct LabelRequirement {
    pub key: String,
    pub operator: String,
    #[serde(deserialize_with = "null_as_empty")]
    pub values: Vec<String>,
}

impl LabelSelector {
    /// Whether Kubernetes accepts the selector: `In` and `NotIn` need values, `Exists` and
    /// `DoesNotExist` take none, and no other operator exists.
    pub fn is_valid(&self) -> bool {
        self.match_expressions
            .iter()
            .all(|r| match r.operator.as_str() {
                "In" | "NotIn" => !r.values.is_empty(),
                "Exists" | "DoesNotExist" => r.values.is_empty(),
                _ => false,
            })
    }

    /// Whether labels satisfy the selector; an invalid selector selects nothing.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.is_valid()
            && selects(&self.match_labels, labels)
            && self.match_expressions.iter().all(|r| {
                let value = labels.get(&r.key);
                let listed = |v: &String| r.values.contains(v);
                match r.operator.as_str() {
                    "In" => value.is_some_and(listed),
                    "NotIn" => !value.is_some_and(listed),
                    "Exists" => value.is_some(),
                    "DoesNotExist" => value.is_none(),
                    _ => false,
                }
            })
    }
}

/// A field written as `null` (an empty YAML key) reads as empty, as Kubernetes reads it.
fn null_as_empty<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
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

    #[test]
    fn a_selector_selects_labels_that_carry_all_its_pairs() {
        let selector = labels(&[("app", "web"), ("version", "v1")]);
        assert!(selects(
            &selector,
            &labels(&[("app", "web"), ("version", "v1")])
        ));
        assert!(
            selects(
                &selector,
                &labels(&[("app", "web"), ("version", "v1"), ("team", "a")])
            ),
            "more labels than the selector's are fine"
        );
        assert!(
            !selects(&selector, &labels(&[("app", "web")])),
            "a missing label"
        );
        assert!(
            !selects(&selector, &labels(&[("app", "web"), ("version", "v2")])),
            "a different value"
        );
        assert!(
            !selects(&selector, &labels(&[("app", "web"), ("version", "")])),
            "an empty value is a value"
        );
        assert!(!selects(&selector, &labels(&[])));
    }

    #[test]
    fn an_empty_selector_selects_everything() {
        assert!(selects(&labels(&[]), &labels(&[])));
        assert!(selects(&labels(&[]), &labels(&[("app", "web")])));
    }

    #[test]
    fn a_selector_of_empty_values_needs_the_labels_present() {
        let selector = labels(&[("canary", "")]);
        assert!(selects(&selector, &labels(&[("canary", "")])));
        assert!(!selects(&selector, &labels(&[])));
    }

    #[test]
    fn expressions_and_labels_all_hold_and_null_reads_as_empty() {
        let s: LabelSelector = serde_json::from_value(serde_json::json!({
            "matchLabels": {"env": "prod"},
            "matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["b"]}]}))
        .unwrap();
        assert!(s.matches(&labels(&[("env", "prod")])));
        assert!(!s.matches(&labels(&[("env", "prod"), ("team", "b")])));
        let empty: LabelSelector =
            serde_json::from_value(serde_json::json!({"matchLabels": null})).unwrap();
        assert!(empty.matches(&labels(&[])));
        let invalid: LabelSelector = serde_json::from_value(serde_json::json!({
            "matchExpressions": [{"key": "team", "operator": "NotIn"}]}))
        .unwrap();
        assert!(!invalid.matches(&labels(&[])), "NotIn needs values");
    }
}
