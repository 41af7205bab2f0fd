//! Subscriptions as the store evaluates them: rules OR-ed, dimensions within a rule AND-ed, an
//! empty dimension matching anything. [`Rule::matches`] is the reference evaluator the indexes
//! must agree with.

use pasa_istio::host;
use pasa_proto::Kind;
use pasa_proto::object::check_dns1123_label;
use pasa_proto::store::v1 as pb;

use crate::index::ObjectKeys;

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Rule {
    pub kinds: Vec<Kind>,
    pub namespaces: Vec<String>,
    pub hosts: Vec<String>,
    pub gateways: Vec<String>,
}

/// Rules one subscription may have.
pub const MAX_RULES: usize = 1_000;
/// Values one dimension of a rule may list.
pub const MAX_VALUES: usize = 10_000;

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Selector {
    pub rules: Vec<Rule>,
}

/// A subscription the store cannot evaluate, with the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SelectorError {
    pub field: String,
    pub message: String,
}

impl Rule {
    pub fn matches(&self, keys: &ObjectKeys) -> bool {
        (self.kinds.is_empty() || self.kinds.contains(&keys.kind))
            && (self.namespaces.is_empty() || self.namespaces.contains(&keys.namespace))
            && (self.hosts.is_empty()
                || self
                    .hosts
                    .iter()
                    .any(|r| keys.hosts.iter().any(|o| host::matches(r, o))))
            && (self.gateways.is_empty() || self.gateways.iter().any(|g| keys.gateways.contains(g)))
    }

    fn from_pb(rule: &pb::Rule, at: &str) -> Result<Rule, SelectorError> {
        let err = |field: String, message: String| SelectorError { field, message };
        for (dim, values) in [
            ("kinds", &rule.kinds),
            ("namespaces", &rule.namespaces),
            ("hosts", &rule.hosts),
            ("gateways", &rule.gateways),
        ] {
            if values.len() > MAX_VALUES {
                return Err(err(
                    format!("{at}.{dim}"),
                    format!(
                        "{} values is more than the {MAX_VALUES} allowed",
                        values.len()
                    ),
                ));
            }
        }
        let mut kinds = rule
            .kinds
            .iter()
            .enumerate()
            .map(|(i, k)| {
                k.parse::<Kind>()
                    .map_err(|e| err(format!("{at}.kinds[{i}]"), e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        for (i, h) in rule.hosts.iter().enumerate() {
            host::check_pattern(h).map_err(|e| err(format!("{at}.hosts[{i}]"), e.to_string()))?;
        }
        for (i, ns) in rule.namespaces.iter().enumerate() {
            check_dns1123_label(ns)
                .map_err(|e| err(format!("{at}.namespaces[{i}]"), format!("namespace {e}")))?;
        }
        for (i, g) in rule.gateways.iter().enumerate() {
            if g.is_empty() || g.len() > 317 {
                return Err(err(
                    format!("{at}.gateways[{i}]"),
                    "must be `mesh` or `namespace/name`".into(),
                ));
            }
        }
        let sorted = |values: &[String]| {
            let mut v = values.to_vec();
            v.sort();
            v.dedup();
            v
        };
        kinds.sort();
        kinds.dedup();
        Ok(Rule {
            kinds,
            namespaces: sorted(&rule.namespaces),
            hosts: sorted(&rule.hosts),
            gateways: sorted(&rule.gateways),
        })
    }

    pub fn to_pb(&self) -> pb::Rule {
        pb::Rule {
            kinds: self.kinds.iter().map(|k| k.as_str().to_string()).collect(),
            namespaces: self.namespaces.clone(),
            hosts: self.hosts.clone(),
            gateways: self.gateways.clone(),
        }
    }
}

impl Selector {
    /// A selector with one open rule: every object.
    pub fn everything() -> Selector {
        Selector {
            rules: vec![Rule::default()],
        }
    }

    pub fn matches(&self, keys: &ObjectKeys) -> bool {
        self.rules.iter().any(|r| r.matches(keys))
    }

    pub fn from_pb(sub: &pb::Subscription) -> Result<Selector, SelectorError> {
        if sub.rules.len() > MAX_RULES {
            return Err(SelectorError {
                field: "rules".into(),
                message: format!(
                    "{} rules is more than the {MAX_RULES} allowed: rules take lists of values",
                    sub.rules.len()
                ),
            });
        }
        let rules = sub
            .rules
            .iter()
            .enumerate()
            .map(|(i, r)| Rule::from_pb(r, &format!("rules[{i}]")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Selector { rules })
    }

    pub fn to_pb(&self) -> pb::Subscription {
        pb::Subscription {
            rules: self.rules.iter().map(Rule::to_pb).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(kind: Kind, ns: &str, hosts: &[&str], gateways: &[&str]) -> ObjectKeys {
        ObjectKeys {
            kind,
            namespace: ns.into(),
            hosts: hosts.iter().map(|s| s.to_string()).collect(),
            gateways: gateways.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn dimensions_and_rules() {
        let vs = keys(
            Kind::VirtualService,
            "default",
            &["reviews.default.svc.cluster.local"],
            &["mesh"],
        );
        let se = keys(Kind::ServiceEntry, "web", &["*.wikipedia.org"], &[]);
        let by_host = Rule {
            hosts: vec!["en.wikipedia.org".into()],
            ..Default::default()
        };
        assert!(by_host.matches(&se));
        assert!(!by_host.matches(&vs));
        let ns_and_kind = Rule {
            kinds: vec![Kind::VirtualService],
            namespaces: vec!["default".into()],
            ..Default::default()
        };
        assert!(ns_and_kind.matches(&vs));
        assert!(!ns_and_kind.matches(&se));
        let gw = Rule {
            gateways: vec!["istio-system/ingress".into()],
            ..Default::default()
        };
        assert!(!gw.matches(&vs));
        let sel = Selector {
            rules: vec![by_host, gw],
        };
        assert!(sel.matches(&se) && !sel.matches(&vs));
        assert!(Selector::everything().matches(&vs));
        assert!(!Selector::default().matches(&vs), "no rule matches nothing");
    }

    #[test]
    fn bad_subscriptions_name_the_field() {
        let sub = pb::Subscription {
            rules: vec![
                pb::Rule::default(),
                pb::Rule {
                    kinds: vec!["vs".into(), "pods".into()],
                    ..Default::default()
                },
            ],
        };
        let err = Selector::from_pb(&sub).unwrap_err();
        assert_eq!(err.field, "rules[1].kinds[1]");
        let sub = pb::Subscription {
            rules: vec![pb::Rule {
                hosts: vec!["a.com".into(), "*a.com".into()],
                ..Default::default()
            }],
        };
        assert_eq!(
            Selector::from_pb(&sub).unwrap_err().field,
            "rules[0].hosts[1]"
        );
    }
}
