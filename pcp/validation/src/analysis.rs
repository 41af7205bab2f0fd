//! Cross-resource checks that Istio reports as warnings rather than errors (`istioctl analyze`'s
//! IST0101 ReferencedResourceNotFound): a VirtualService that routes to a subset no visible
//! DestinationRule defines, or that binds to a Gateway that does not exist.
//!
//! Analysis sees the batch being written plus what the store already holds; a batch object
//! replaces a stored one of the same kind, namespace and name.

use std::collections::{BTreeSet, HashMap, HashSet};

use pasa_istio::destination_rule::DestinationRule;
use pasa_istio::gateway::{MESH, resolve_gateway_name};
use pasa_istio::host::{matches, resolve_short_name};
use pasa_istio::parse_spec;
use pasa_istio::virtual_service::{Destination, VirtualService};
use pasa_istio::visibility::exported_to;
use pasa_proto::store::v1::{Rule, Subscription};
use pasa_proto::{Kind, Object};

use crate::validation::{Path, Problem};

/// A destination a VirtualService names, with where it names it.
struct Reference<'a> {
    at: Path,
    destination: &'a Destination,
}

/// Every destination of a VirtualService (routes and mirrors), with its field path.
fn destinations(vs: &VirtualService) -> Vec<Reference<'_>> {
    let mut out = Vec::new();
    let spec = Path::spec();
    for (i, http) in vs.http.iter().enumerate() {
        let at = spec.field("http").index(i);
        for (j, route) in http.route.iter().enumerate() {
            if let Some(d) = &route.destination {
                out.push(Reference {
                    at: at.field("route").index(j).field("destination"),
                    destination: d,
                });
            }
        }
        if let Some(d) = &http.mirror {
            out.push(Reference {
                at: at.field("mirror"),
                destination: d,
            });
        }
        for (j, mirror) in http.mirrors.iter().enumerate() {
            if let Some(d) = &mirror.destination {
                out.push(Reference {
                    at: at.field("mirrors").index(j).field("destination"),
                    destination: d,
                });
            }
        }
    }
    for (name, routes) in [
        ("tls", vs.tls.iter().map(|r| &r.route).collect::<Vec<_>>()),
        ("tcp", vs.tcp.iter().map(|r| &r.route).collect()),
    ] {
        for (i, route) in routes.into_iter().enumerate() {
            for (j, rd) in route.iter().enumerate() {
                if let Some(d) = &rd.destination {
                    out.push(Reference {
                        at: spec
                            .field(name)
                            .index(i)
                            .field("route")
                            .index(j)
                            .field("destination"),
                        destination: d,
                    });
                }
            }
        }
    }
    out
}

/// The gateways a VirtualService binds to, as `namespace/name`, with their paths; `mesh` left out.
fn gateway_refs(vs: &VirtualService, namespace: &str) -> Vec<(Path, String)> {
    let mut out = Vec::new();
    let spec = Path::spec();
    for (i, g) in vs.gateways.iter().enumerate() {
        if g != MESH {
            out.push((
                spec.field("gateways").index(i),
                resolve_gateway_name(g, namespace),
            ));
        }
    }
    for (i, http) in vs.http.iter().enumerate() {
        for (j, m) in http.matches.iter().enumerate() {
            for (k, g) in m.gateways.iter().enumerate() {
                if g != MESH {
                    let at = spec
                        .field("http")
                        .index(i)
                        .field("match")
                        .index(j)
                        .field("gateways")
                        .index(k);
                    out.push((at, resolve_gateway_name(g, namespace)));
                }
            }
        }
    }
    out
}

/// A DestinationRule as the subset check reads it: its host resolved, its subsets' names.
struct Rules<'a> {
    namespace: &'a str,
    host: String,
    export_to: Vec<String>,
    subsets: HashSet<String>,
}

/// Most rules compared, per VirtualService, for destinations whose host is a wildcard (the
/// only ones not found by their host): past it, they get no warning.
const MAX_WILDCARD_COMPARISONS: usize = 100_000;

/// The DestinationRules indexed by host, to find those a destination's host matches without
/// comparing it with every rule.
struct RuleIndex<'a> {
    rules: Vec<Rules<'a>>,
    /// Rules of a plain host, by that host.
    exact: HashMap<String, Vec<usize>>,
    /// Rules of a wildcard host, by its suffix (`*.a.com` → `.a.com`, `*` → ``).
    wildcard: HashMap<String, Vec<usize>>,
}

impl<'a> RuleIndex<'a> {
    fn new(rules: Vec<Rules<'a>>) -> Self {
        let mut exact: HashMap<String, Vec<usize>> = HashMap::new();
        let mut wildcard: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, rule) in rules.iter().enumerate() {
            match rule.host.strip_prefix('*') {
                Some(suffix) => wildcard.entry(suffix.to_string()).or_default().push(i),
                None => exact.entry(rule.host.clone()).or_default().push(i),
            }
        }
        RuleIndex {
            rules,
            exact,
            wildcard,
        }
    }

    /// Whether a rule visible from `namespace` whose host matches `host` defines `subset`;
    /// `budget` bounds the rules compared for a wildcard `host` (none left: taken as defined).
    fn defines(&self, host: &str, subset: &str, namespace: &str, budget: &mut usize) -> bool {
        let defines = |r: &Rules<'_>| {
            r.subsets.contains(subset) && exported_to(&r.export_to, r.namespace, namespace)
        };
        if host.starts_with('*') {
            for rule in &self.rules {
                if *budget == 0 {
                    return true;
                }
                *budget -= 1;
                if matches(&rule.host, host) && defines(rule) {
                    return true;
                }
            }
            return false;
        }
        // A plain host: the rules of that host, and of each wildcard it ends with the suffix of.
        let suffixes = host
            .char_indices()
            .map(|(k, _)| &host[k..])
            .chain([""])
            .filter_map(|suffix| self.wildcard.get(suffix));
        self.exact
            .get(host)
            .into_iter()
            .chain(suffixes)
            .flatten()
            .any(|&i| defines(&self.rules[i]))
    }
}

/// Warnings for the batch's objects (by document index), given the objects already stored.
pub fn analyze(
    batch: &[(usize, &Object)],
    existing: &[Object],
    domain_suffix: &str,
) -> Vec<(usize, Problem)> {
    // The world as it will be: stored objects, replaced by the batch's.
    let mut world: HashMap<(Kind, &str, &str), &Object> = HashMap::new();
    for obj in existing.iter().chain(batch.iter().map(|(_, o)| *o)) {
        world.insert((obj.kind, &obj.namespace, &obj.name), obj);
    }
    let mut rules: Vec<Rules<'_>> = Vec::new();
    for obj in world.values().filter(|o| o.kind == Kind::DestinationRule) {
        if let Ok(spec) = parse_spec::<DestinationRule>(&obj.spec) {
            rules.push(Rules {
                namespace: &obj.namespace,
                host: resolve_short_name(&spec.host, &obj.namespace, domain_suffix),
                subsets: spec.subsets.into_iter().map(|s| s.name).collect(),
                export_to: spec.export_to,
            });
        }
    }
    let rules = RuleIndex::new(rules);

    let mut out = Vec::new();
    for (index, obj) in batch {
        if obj.kind != Kind::VirtualService {
            continue;
        }
        let Ok(vs) = parse_spec::<VirtualService>(&obj.spec) else {
            continue;
        };
        for (at, gateway) in gateway_refs(&vs, &obj.namespace) {
            let (ns, name) = gateway.split_once('/').unwrap_or(("", &gateway));
            if !world.contains_key(&(Kind::Gateway, ns, name)) {
                out.push((
                    *index,
                    Problem {
                        field: at.to_string(),
                        message: format!(
                            "referenced gateway not found: {gateway:?} (IST0101 ReferencedResourceNotFound)"
                        ),
                    },
                ));
            }
        }
        // Each host and subset is looked up once, however many routes name it.
        let mut known: HashMap<(String, &str), bool> = HashMap::new();
        let mut budget = MAX_WILDCARD_COMPARISONS;
        for reference in destinations(&vs) {
            let d = reference.destination;
            if d.subset.is_empty() {
                continue;
            }
            let host = resolve_short_name(&d.host, &obj.namespace, domain_suffix);
            let defined = *known
                .entry((host.clone(), d.subset.as_str()))
                .or_insert_with(|| rules.defines(&host, &d.subset, &obj.namespace, &mut budget));
            if !defined {
                out.push((
                    *index,
                    Problem {
                        field: reference.at.field("subset").to_string(),
                        message: format!(
                            "referenced host+subset in destinationrule not found: \"{}+{}\" (IST0101 ReferencedResourceNotFound)",
                            host, d.subset
                        ),
                    },
                ));
            }
        }
    }
    out
}

/// What to read from the store to analyze a batch: DestinationRules for the hosts routed to
/// with a subset, Gateways of the namespaces bound to. `None` when nothing refers elsewhere.
pub fn lookups(batch: &[&Object], domain_suffix: &str) -> Option<Subscription> {
    let mut hosts = BTreeSet::new();
    let mut gateway_namespaces = BTreeSet::new();
    for obj in batch.iter().filter(|o| o.kind == Kind::VirtualService) {
        let Ok(vs) = parse_spec::<VirtualService>(&obj.spec) else {
            continue;
        };
        for reference in destinations(&vs) {
            if !reference.destination.subset.is_empty() {
                hosts.insert(resolve_short_name(
                    &reference.destination.host,
                    &obj.namespace,
                    domain_suffix,
                ));
            }
        }
        for (_, gateway) in gateway_refs(&vs, &obj.namespace) {
            if let Some((ns, _)) = gateway.split_once('/') {
                gateway_namespaces.insert(ns.to_string());
            }
        }
    }
    let mut rules = Vec::new();
    if !hosts.is_empty() {
        rules.push(Rule {
            kinds: vec![Kind::DestinationRule.as_str().to_string()],
            hosts: hosts.into_iter().collect(),
            ..Default::default()
        });
    }
    if !gateway_namespaces.is_empty() {
        rules.push(Rule {
            kinds: vec![Kind::Gateway.as_str().to_string()],
            namespaces: gateway_namespaces.into_iter().collect(),
            ..Default::default()
        });
    }
    (!rules.is_empty()).then_some(Subscription { rules })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const D: &str = pasa_istio::host::DEFAULT_DOMAIN_SUFFIX;

    fn object(doc: serde_json::Value) -> Object {
        Object::from_json(&doc, "default", pasa_istio::generated::is_generated_object).unwrap()
    }

    fn vs(ns: &str, spec: serde_json::Value) -> Object {
        object(
            json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
                      "metadata": {"name": "vs", "namespace": ns}, "spec": spec}),
        )
    }

    fn dr(ns: &str, name: &str, spec: serde_json::Value) -> Object {
        object(
            json!({"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
                      "metadata": {"name": name, "namespace": ns}, "spec": spec}),
        )
    }

    #[test]
    fn unknown_subset_and_gateway_are_warned_with_their_paths() {
        let v = vs(
            "shop",
            json!({"hosts": ["cart"], "gateways": ["shop-gw", "mesh"], "http": [{"route": [
                {"destination": {"host": "cart", "subset": "v1"}, "weight": 50},
                {"destination": {"host": "cart", "subset": "v9"}, "weight": 50}]}]}),
        );
        let rule = dr(
            "shop",
            "cart",
            json!({"host": "cart", "subsets": [{"name": "v1", "labels": {"version": "v1"}}]}),
        );
        let found = analyze(&[(3, &v)], &[rule], D);
        let fields: Vec<&str> = found.iter().map(|(_, p)| p.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.gateways[0]",
                "spec.http[0].route[1].destination.subset"
            ]
        );
        assert!(found.iter().all(|(i, _)| *i == 3));
        assert!(
            found[1]
                .1
                .message
                .contains("cart.shop.svc.cluster.local+v9")
        );
    }

    #[test]
    fn batch_objects_count_and_private_rules_elsewhere_do_not() {
        let v = vs(
            "shop",
            json!({"hosts": ["cart"], "http": [{"route": [{"destination": {"host": "cart.shop.svc.cluster.local", "subset": "v1"}}]}]}),
        );
        let private = dr(
            "other",
            "cart",
            json!({"host": "cart.shop.svc.cluster.local", "exportTo": ["."], "subsets": [{"name": "v1"}]}),
        );
        assert_eq!(
            analyze(&[(0, &v)], std::slice::from_ref(&private), D).len(),
            1
        );
        let shared = dr(
            "shop",
            "cart",
            json!({"host": "cart", "subsets": [{"name": "v1"}]}),
        );
        assert!(analyze(&[(0, &v), (1, &shared)], &[private], D).is_empty());
    }

    #[test]
    fn lookups_ask_for_what_is_referenced() {
        let v = vs(
            "shop",
            json!({"hosts": ["cart"], "gateways": ["edge/gw"], "http": [{"route": [{"destination": {"host": "cart", "subset": "v1"}}]}]}),
        );
        let sub = lookups(&[&v], D).unwrap();
        assert_eq!(sub.rules[0].hosts, ["cart.shop.svc.cluster.local"]);
        assert_eq!(sub.rules[1].namespaces, ["edge"]);
        let plain = vs(
            "shop",
            json!({"hosts": ["cart"], "http": [{"route": [{"destination": {"host": "cart"}}]}]}),
        );
        assert!(lookups(&[&plain], D).is_none());
    }
}
