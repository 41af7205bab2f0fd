//! `AuthorizationPolicy` (`security.istio.io` v1 and v1beta1): who may do what to the workloads
//! a policy applies to — the mesh (root namespace), a namespace, the workloads a selector picks,
//! or the Services and gateways its `targetRefs` name. Fields that may be absent or null keep
//! the difference: istiod's rules tell "no rules" from "one empty rule", and "no `from`" from an
//! empty one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::destination_rule::WorkloadSelector;
use crate::label_selector::selects;

/// The annotation that makes an ALLOW or DENY policy only log what it would do.
pub const DRY_RUN_ANNOTATION: &str = "istio.io/dry-run";

/// A boolean as Go's `strconv.ParseBool` reads one (istiod reads `istio.io/dry-run` so); `None`
/// for anything else.
pub fn go_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// The label istiod's Gateway API controller puts on a gateway's pods: the Gateway's name.
pub const GATEWAY_NAME_LABEL: &str = "gateway.networking.k8s.io/gateway-name";

/// Whether a policy of `policy_namespace` (AuthorizationPolicy, RequestAuthentication,
/// Telemetry, WasmPlugin, TrafficExtension, EnvoyFilter) applies to a proxy of `namespace` with
/// `labels`, as istiod decides:
/// - a sidecar or Istio gateway: a policy of the root namespace applies mesh-wide (or, with a
///   selector, to the workloads it picks in any namespace), one of its own namespace to all of
///   it (or to those it picks); a policy attached by `targetRef(s)` does not apply;
/// - a Gateway API gateway (its pods labelled [`GATEWAY_NAME_LABEL`]): a policy with
///   `targetRef(s)` applies when one names that Gateway (group `gateway.networking.k8s.io`, kind
///   `Gateway`) and the policy is in the gateway's namespace; one without, by its selector as
///   above (istiod's `ENABLE_SELECTOR_BASED_K8S_GATEWAY_POLICY`, on by default).
///
/// Waypoints (targets of kind Service, ServiceEntry, GatewayClass) are not PASA's.
pub fn applies_to_workload(
    policy_namespace: &str,
    selector: Option<&WorkloadSelector>,
    targets: &[&PolicyTargetReference],
    root_namespace: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    let selected = || {
        (policy_namespace == root_namespace || policy_namespace == namespace)
            && selector.is_none_or(|s| selects(&s.match_labels, labels))
    };
    match labels.get(GATEWAY_NAME_LABEL) {
        _ if targets.is_empty() => selected(),
        None => false,
        Some(gateway) => {
            policy_namespace == namespace
                && targets.iter().any(|t| {
                    (t.namespace.is_empty() || t.namespace == namespace)
                        && t.group == "gateway.networking.k8s.io"
                        && t.kind == "Gateway"
                        && t.name == *gateway
                })
        }
    }
}

/// `targetRef` and `targetRefs` together.
pub fn target_refs<'a>(
    one: Option<&'a PolicyTargetReference>,
    many: &'a [PolicyTargetReference],
) -> Vec<&'a PolicyTargetReference> {
    one.into_iter().chain(many).collect()
}

/// A security policy that picks its workloads by `selector` or `targetRef(s)`
/// (AuthorizationPolicy, RequestAuthentication).
pub trait WorkloadPolicy {
    fn workload_selector(&self) -> Option<&WorkloadSelector>;
    /// `targetRef` and `targetRefs` together.
    fn targets(&self) -> Vec<&PolicyTargetReference>;
}

impl WorkloadPolicy for AuthorizationPolicy {
    fn workload_selector(&self) -> Option<&WorkloadSelector> {
        self.selector.as_ref()
    }

    fn targets(&self) -> Vec<&PolicyTargetReference> {
        target_refs(self.target_ref.as_ref(), &self.target_refs)
    }
}

impl WorkloadPolicy for super::request_authentication::RequestAuthentication {
    fn workload_selector(&self) -> Option<&WorkloadSelector> {
        self.selector.as_ref()
    }

    fn targets(&self) -> Vec<&PolicyTargetReference> {
        target_refs(self.target_ref.as_ref(), &self.target_refs)
    }
}

/// The `spec` of an AuthorizationPolicy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AuthorizationPolicy {
    #[serde(default)]
    pub selector: Option<WorkloadSelector>,
    #[serde(default)]
    pub target_ref: Option<PolicyTargetReference>,
    #[serde(default)]
    pub target_refs: Vec<PolicyTargetReference>,
    /// Absent is not the same as empty: no rules never matches (an ALLOW policy then allows
    /// nothing); a null entry is kept so that validation can name it.
    #[serde(default)]
    pub rules: Option<Vec<Option<Rule>>>,
    #[serde(default)]
    pub action: Action,
    #[serde(default)]
    pub provider: Option<ExtensionProvider>,
}

/// What a matching request gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Action {
    #[default]
    Allow,
    Deny,
    Audit,
    Custom,
}

/// A Service, ServiceEntry or gateway the policy attaches to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyTargetReference {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
}

/// The mesh's extension provider a CUSTOM policy delegates to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ExtensionProvider {
    #[serde(default)]
    pub name: String,
}

/// A rule matches when one of its sources, one of its operations and all of its conditions do.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    #[serde(default)]
    pub from: Option<Vec<Option<From>>>,
    #[serde(default)]
    pub to: Option<Vec<Option<To>>>,
    #[serde(default)]
    pub when: Option<Vec<Option<Condition>>>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct From {
    #[serde(default)]
    pub source: Option<Source>,
}

/// Who sends the request. Every list is absent or set (possibly empty), as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Source {
    #[serde(default)]
    pub principals: Option<Vec<String>>,
    #[serde(default)]
    pub not_principals: Option<Vec<String>>,
    #[serde(default)]
    pub request_principals: Option<Vec<String>>,
    #[serde(default)]
    pub not_request_principals: Option<Vec<String>>,
    #[serde(default)]
    pub namespaces: Option<Vec<String>>,
    #[serde(default)]
    pub not_namespaces: Option<Vec<String>>,
    #[serde(default)]
    pub service_accounts: Option<Vec<String>>,
    #[serde(default)]
    pub not_service_accounts: Option<Vec<String>>,
    #[serde(default)]
    pub trust_domains: Option<Vec<String>>,
    #[serde(default)]
    pub not_trust_domains: Option<Vec<String>>,
    #[serde(default)]
    pub ip_blocks: Option<Vec<String>>,
    #[serde(default)]
    pub not_ip_blocks: Option<Vec<String>>,
    #[serde(default)]
    pub remote_ip_blocks: Option<Vec<String>>,
    #[serde(default)]
    pub not_remote_ip_blocks: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct To {
    #[serde(default)]
    pub operation: Option<Operation>,
}

/// What the request does.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Operation {
    #[serde(default)]
    pub hosts: Option<Vec<String>>,
    #[serde(default)]
    pub not_hosts: Option<Vec<String>>,
    #[serde(default)]
    pub ports: Option<Vec<String>>,
    #[serde(default)]
    pub not_ports: Option<Vec<String>>,
    #[serde(default)]
    pub methods: Option<Vec<String>>,
    #[serde(default)]
    pub not_methods: Option<Vec<String>>,
    #[serde(default)]
    pub paths: Option<Vec<String>>,
    #[serde(default)]
    pub not_paths: Option<Vec<String>>,
}

/// An extra condition on a request attribute.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Condition {
    #[serde(default)]
    pub key: String,
    #[serde(default)]
    pub values: Option<Vec<String>>,
    #[serde(default)]
    pub not_values: Option<Vec<String>>,
}

impl Source {
    /// Each list with its field name, in the order istiod checks them.
    pub fn lists(&self) -> [(&'static str, Option<&Vec<String>>); 14] {
        [
            ("principals", self.principals.as_ref()),
            ("notPrincipals", self.not_principals.as_ref()),
            ("requestPrincipals", self.request_principals.as_ref()),
            ("notRequestPrincipals", self.not_request_principals.as_ref()),
            ("namespaces", self.namespaces.as_ref()),
            ("notNamespaces", self.not_namespaces.as_ref()),
            ("serviceAccounts", self.service_accounts.as_ref()),
            ("notServiceAccounts", self.not_service_accounts.as_ref()),
            ("trustDomains", self.trust_domains.as_ref()),
            ("notTrustDomains", self.not_trust_domains.as_ref()),
            ("ipBlocks", self.ip_blocks.as_ref()),
            ("notIpBlocks", self.not_ip_blocks.as_ref()),
            ("remoteIpBlocks", self.remote_ip_blocks.as_ref()),
            ("notRemoteIpBlocks", self.not_remote_ip_blocks.as_ref()),
        ]
    }
}

impl Operation {
    /// Each list with its field name.
    pub fn lists(&self) -> [(&'static str, Option<&Vec<String>>); 8] {
        [
            ("hosts", self.hosts.as_ref()),
            ("notHosts", self.not_hosts.as_ref()),
            ("ports", self.ports.as_ref()),
            ("notPorts", self.not_ports.as_ref()),
            ("methods", self.methods.as_ref()),
            ("notMethods", self.not_methods.as_ref()),
            ("paths", self.paths.as_ref()),
            ("notPaths", self.not_paths.as_ref()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_policy_applies_mesh_wide_namespace_wide_or_to_what_it_selects() {
        let labels: BTreeMap<String, String> = [("app".into(), "reviews".into())].into();
        let select = |app: &str| WorkloadSelector {
            match_labels: [("app".into(), app.into())].into(),
        };
        let gateway = |name: &str| PolicyTargetReference {
            group: "gateway.networking.k8s.io".into(),
            kind: "Gateway".into(),
            name: name.into(),
            namespace: String::new(),
        };
        let web = gateway("web");
        let applies = |ns: &str, selector: Option<&WorkloadSelector>, targeted: bool| {
            let targets: Vec<&PolicyTargetReference> =
                targeted.then_some(&web).into_iter().collect();
            applies_to_workload(ns, selector, &targets, "istio-system", "shop", &labels)
        };
        assert!(applies("istio-system", None, false));
        assert!(applies("shop", None, false));
        assert!(applies("istio-system", Some(&select("reviews")), false));
        assert!(applies("shop", Some(&select("reviews")), false));
        assert!(!applies("shop", Some(&select("ratings")), false));
        assert!(!applies("other", None, false));
        assert!(!applies("shop", None, true));
        // A Gateway API gateway's pods: attached by targetRef to their Gateway, in its namespace.
        let mut pod: BTreeMap<String, String> = [(GATEWAY_NAME_LABEL.into(), "web".into())].into();
        let at =
            |ns: &str, targets: &[&PolicyTargetReference], labels: &BTreeMap<String, String>| {
                applies_to_workload(ns, None, targets, "istio-system", "shop", labels)
            };
        assert!(at("shop", &[&web], &pod));
        assert!(!at("istio-system", &[&web], &pod), "another namespace");
        assert!(!at("shop", &[&gateway("api")], &pod), "another Gateway");
        let service = PolicyTargetReference {
            kind: "Service".into(),
            name: "web".into(),
            ..Default::default()
        };
        assert!(!at("shop", &[&service], &pod), "a waypoint's");
        assert!(
            at("istio-system", &[], &pod),
            "without targetRefs, as for any workload"
        );
        pod.insert("app".into(), "reviews".into());
        assert!(applies_to_workload(
            "shop",
            Some(&select("reviews")),
            &[],
            "istio-system",
            "shop",
            &pod
        ));
        assert_eq!(go_bool("T"), Some(true));
        assert_eq!(go_bool("0"), Some(false));
        assert_eq!(go_bool("yes"), None);
    }

    #[test]
    fn absent_empty_and_null_stay_apart() {
        let none: AuthorizationPolicy = crate::parse_spec(&json!({})).unwrap();
        assert_eq!(none.rules, None);
        assert_eq!(none.action, Action::Allow);
        let one_empty: AuthorizationPolicy =
            crate::parse_spec(&json!({"action": "DENY", "rules": [{}]})).unwrap();
        assert_eq!(one_empty.rules, Some(vec![Some(Rule::default())]));
        let null: AuthorizationPolicy = crate::parse_spec(&json!({"rules": [null]})).unwrap();
        assert_eq!(null.rules, Some(vec![None]));
        assert!(crate::parse_spec::<AuthorizationPolicy>(&json!({"action": "PERMIT"})).is_err());
    }
}
