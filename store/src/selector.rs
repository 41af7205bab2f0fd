//! Subscriptions as the store evaluates them: rules OR-ed, dimensions within a rule AND-ed, an
//! empty dimension matching anything. [`Rule::matches`] is the reference evaluator the indexes
//! must agree with.

use pasa_proto::Kind;
use pasa_proto::host;
use pasa_proto::store::v1 as pb;

use crate::index::ObjectKeys;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rule {
    pub kinds: Vec<Kind>,
    pub namespaces: Vec<String>,
    pub hosts: Vec<String>,
    pub gateways: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
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
        let kinds = rule
            .kinds
            .iter()
            .enumerate()
            .map(|(i, k)| {
                k.parse::<Kind>().map_err(|e| SelectorError {
                    field: format!("{at}.kinds[{i}]"),
                    message: e.to_string(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        for (i, h) in rule.hosts.iter().enumerate() {
            host::check_pattern(h).map_err(|e| SelectorError {
                field: format!("{at}.hosts[{i}]"),
                message: e.to_string(),
            })?;
        }
        let nonempty = |values: &[String], dim: &str| -> Result<(), SelectorError> {
            match values.iter().position(String::is_empty) {
                Some(i) => Err(SelectorError {
                    field: format!("{at}.{dim}[{i}]"),
                    message: "must not be empty".into(),
                }),
                None => Ok(()),
            }
        };
        nonempty(&rule.namespaces, "namespaces")?;
        nonempty(&rule.gateways, "gateways")?;
        Ok(Rule {
            kinds,
            namespaces: rule.namespaces.clone(),
            hosts: rule.hosts.clone(),
            gateways: rule.gateways.clone(),
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
