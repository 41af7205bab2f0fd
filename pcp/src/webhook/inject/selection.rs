//! Which pods are moved to PASA ([`Selection::decide`]): the rule of this module's documentation,
//! from the pod's annotation, its namespace's label and the namespaces never injected.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// The pod annotation that opts a pod in or out.
pub const ENABLED_ANNOTATION: &str = "pasa.io/enabled";
/// The namespace label that opts every pod of a namespace in (value `enabled`).
pub const INJECTION_LABEL: &str = "pasa.io/injection";
/// The annotation an injected pod carries: what was injected, so a second pass is a no-op.
pub const STATUS_ANNOTATION: &str = "pasa.io/status";

/// Namespaces of the cluster itself, never injected whatever their labels say.
const CLUSTER_NAMESPACES: [&str; 4] = [
    "kube-system",
    "kube-public",
    "kube-node-lease",
    "local-path-storage",
];

/// Why a pod is left as it is; also the `reason` label of the webhook's metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    HostNetwork,
    /// A namespace of the cluster or of the mesh's control planes.
    SystemNamespace,
    AlreadyInjected,
    /// `pasa.io/enabled` says no.
    OptedOut,
    /// Neither the pod nor its namespace asks for PASA.
    NotSelected,
    /// `pasa.io/enabled` holds a value that is neither yes nor no; the pod stays with istiod and
    /// the answer warns, naming the annotation and the value.
    BadAnnotation(String),
}

impl Skip {
    /// The metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Skip::HostNetwork => "host_network",
            Skip::SystemNamespace => "system_namespace",
            Skip::AlreadyInjected => "already_injected",
            Skip::OptedOut => "opted_out",
            Skip::NotSelected => "not_selected",
            Skip::BadAnnotation(_) => "bad_annotation",
        }
    }

    /// A warning for the admission answer, when the user should hear of it.
    pub fn warning(&self) -> Option<String> {
        match self {
            Skip::BadAnnotation(value) => Some(format!(
                "metadata.annotations[{ENABLED_ANNOTATION}]: {value:?} is neither \"true\" nor \
                 \"false\"; the pod is not moved to PASA"
            )),
            _ => None,
        }
    }
}

/// The webhook's decision for one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Inject,
    Skip(Skip),
}

/// The namespaces never injected, and the rule above.
#[derive(Debug, Clone)]
pub struct Selection {
    never: BTreeSet<String>,
}

impl Selection {
    /// `mesh_namespaces`: the control planes' own (istiod's `istio-system`, PASA's), never
    /// injected, besides the cluster's own.
    pub fn new<S: Into<String>>(mesh_namespaces: impl IntoIterator<Item = S>) -> Selection {
        let mut never: BTreeSet<String> =
            CLUSTER_NAMESPACES.iter().map(|n| n.to_string()).collect();
        never.extend(mesh_namespaces.into_iter().map(Into::into));
        Selection { never }
    }

    /// Decides for `pod` (the admission request's object) in `namespace`, whose labels are
    /// `namespace_labels`.
    pub fn decide(
        &self,
        pod: &Value,
        namespace: &str,
        namespace_labels: &BTreeMap<String, String>,
    ) -> Decision {
        let skip = Decision::Skip;
        if pod.pointer("/spec/hostNetwork") == Some(&Value::Bool(true)) {
            return skip(Skip::HostNetwork);
        }
        if self.never.contains(namespace) {
            return skip(Skip::SystemNamespace);
        }
        let annotation = |key: &str| {
            pod.pointer("/metadata/annotations")
                .and_then(|a| a.get(key))
                .and_then(Value::as_str)
        };
        if annotation(STATUS_ANNOTATION).is_some() {
            return skip(Skip::AlreadyInjected);
        }
        if let Some(value) = annotation(ENABLED_ANNOTATION) {
            return match yes_or_no(value) {
                Some(true) => Decision::Inject,
                Some(false) => skip(Skip::OptedOut),
                None => skip(Skip::BadAnnotation(value.to_string())),
            };
        }
        match namespace_labels.get(INJECTION_LABEL).map(String::as_str) {
            Some("enabled") => Decision::Inject,
            _ => skip(Skip::NotSelected),
        }
    }
}

/// The spellings of yes and no istiod accepts for its own inject annotation.
fn yes_or_no(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "y" | "yes" | "on" => Some(true),
        "false" | "n" | "no" | "off" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(annotations: Value, host_network: bool) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "reviews-v1-abc", "annotations": annotations},
            "spec": {"hostNetwork": host_network, "containers": [{"name": "reviews"}]},
        })
    }

    #[test]
    fn the_injection_table() {
        let selection = Selection::new(["istio-system", "pasa-system"]);
        let enabled: BTreeMap<String, String> =
            [(INJECTION_LABEL.to_string(), "enabled".to_string())].into();
        let disabled: BTreeMap<String, String> =
            [(INJECTION_LABEL.to_string(), "disabled".to_string())].into();
        let none = BTreeMap::new();
        let inject = Decision::Inject;
        let skip = Decision::Skip;
        let bad = |v: &str| skip(Skip::BadAnnotation(v.into()));
        // (pod annotations, hostNetwork, namespace, its labels) → decision
        type Case<'a> = (Value, bool, &'a str, &'a BTreeMap<String, String>, Decision);
        let cases: Vec<Case> = vec![
            (json!({}), false, "default", &none, skip(Skip::NotSelected)),
            (json!({}), false, "bookinfo", &enabled, inject.clone()),
            (
                json!({}),
                false,
                "bookinfo",
                &disabled,
                skip(Skip::NotSelected),
            ),
            (
                json!({"pasa.io/enabled": "true"}),
                false,
                "default",
                &none,
                inject.clone(),
            ),
            (
                json!({"pasa.io/enabled": "Yes"}),
                false,
                "default",
                &none,
                inject.clone(),
            ),
            (
                json!({"pasa.io/enabled": "false"}),
                false,
                "bookinfo",
                &enabled,
                skip(Skip::OptedOut),
            ),
            (
                json!({"pasa.io/enabled": "off"}),
                false,
                "bookinfo",
                &enabled,
                skip(Skip::OptedOut),
            ),
            (
                json!({"pasa.io/enabled": "maybe"}),
                false,
                "bookinfo",
                &enabled,
                bad("maybe"),
            ),
            (
                json!({"pasa.io/enabled": "true"}),
                true,
                "default",
                &none,
                skip(Skip::HostNetwork),
            ),
            (
                json!({}),
                true,
                "bookinfo",
                &enabled,
                skip(Skip::HostNetwork),
            ),
            (
                json!({"pasa.io/enabled": "true"}),
                false,
                "kube-system",
                &enabled,
                skip(Skip::SystemNamespace),
            ),
            (
                json!({"pasa.io/enabled": "true"}),
                false,
                "istio-system",
                &none,
                skip(Skip::SystemNamespace),
            ),
            (
                json!({}),
                false,
                "pasa-system",
                &enabled,
                skip(Skip::SystemNamespace),
            ),
            (
                json!({"pasa.io/enabled": "true", "pasa.io/status": "{}"}),
                false,
                "default",
                &none,
                skip(Skip::AlreadyInjected),
            ),
            // Istio's own annotation does not move a pod to PASA.
            (
                json!({"sidecar.istio.io/inject": "true"}),
                false,
                "default",
                &none,
                skip(Skip::NotSelected),
            ),
        ];
        for (i, (annotations, host_network, namespace, labels, want)) in
            cases.into_iter().enumerate()
        {
            let got = selection.decide(&pod(annotations.clone(), host_network), namespace, labels);
            assert_eq!(
                got, want,
                "case {i}: {annotations} hostNetwork={host_network} in {namespace}"
            );
        }
    }

    #[test]
    fn a_pod_without_annotations_or_spec_is_read_as_not_asking() {
        let selection = Selection::new(["istio-system"]);
        let bare = json!({"metadata": {"name": "p"}});
        assert_eq!(
            selection.decide(&bare, "default", &BTreeMap::new()),
            Decision::Skip(Skip::NotSelected)
        );
    }

    #[test]
    fn a_bad_value_is_warned_about_by_name() {
        let warning = Skip::BadAnnotation("maybe".into()).warning().unwrap();
        assert!(
            warning.contains("pasa.io/enabled") && warning.contains("\"maybe\""),
            "{warning}"
        );
        assert_eq!(Skip::OptedOut.warning(), None);
        assert_eq!(
            Skip::BadAnnotation(String::new()).reason(),
            "bad_annotation"
        );
    }
}
