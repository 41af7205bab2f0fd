//! Subscription rules by dimension value: which rules one object matches, in time that grows
//! with the number of candidate rules, not with the number of subscriptions.
//!
//! Each rule is posted under its *primary* key, the most selective thing it restricts:
//! - its hosts, if it restricts hosts;
//! - else its gateways, if it restricts gateways;
//! - else every (namespace, kind) pair it allows, `*` standing for an open dimension;
//! - a rule that restricts nothing is in `open`.
//!
//! A lookup unions the postings of the object's keys. Rules posted under (namespace, kind) need no
//! further check. Host- and gateway-keyed rules that also restrict other dimensions are checked
//! against those dimensions' postings, by bitmap intersection with the candidates only.

use roaring::RoaringBitmap;

use super::{HostIndex, ObjectKeys, ValueIndex};
use crate::selector::Rule;

const ANY: &str = "*";

/// A dimension checked after the primary lookup.
#[derive(Default, Debug)]
struct Checked {
    /// Rules that restrict this dimension and are keyed by something else.
    restricted: RoaringBitmap,
    /// Value → those rules that allow it.
    postings: ValueIndex,
}

impl Checked {
    fn insert<'a>(&mut self, id: u32, values: impl ExactSizeIterator<Item = &'a str>) {
        if values.len() > 0 {
            self.restricted.insert(id);
        }
        for v in values {
            self.postings.insert(v, id);
        }
    }

    fn remove<'a>(&mut self, id: u32, values: impl Iterator<Item = &'a str>) {
        self.restricted.remove(id);
        for v in values {
            self.postings.remove(v, id);
        }
    }

    /// Drops from `candidates` the rules that restrict this dimension to none of `values`.
    fn filter<'a>(&self, candidates: &mut RoaringBitmap, values: impl Iterator<Item = &'a str>) {
        if self.restricted.is_empty() || candidates.is_disjoint(&self.restricted) {
            return;
        }
        let to_check = &*candidates & &self.restricted;
        let mut allowed = RoaringBitmap::new();
        for v in values {
            if let Some(postings) = self.postings.get(v) {
                allowed |= &to_check & postings;
            }
        }
        *candidates -= &to_check;
        *candidates |= allowed;
    }
}

#[derive(Default, Debug)]
pub struct RuleIndex {
    open: RoaringBitmap,
    by_host: HostIndex,
    by_gateway: ValueIndex,
    /// `namespace\0kind` (either may be `*`) → rules.
    by_namespace_kind: ValueIndex,
    gateways: Checked,
    namespaces: Checked,
    kinds: Checked,
}

fn pair_key(namespace: &str, kind: &str) -> String {
    format!("{namespace}\0{kind}")
}

/// Whether the rule is posted under (namespace, kind) pairs.
fn keyed_by_pairs(rule: &Rule) -> bool {
    rule.hosts.is_empty()
        && rule.gateways.is_empty()
        && !(rule.namespaces.is_empty() && rule.kinds.is_empty())
}

/// The (namespace, kind) keys a rule without hosts or gateways is posted under.
fn pair_keys(rule: &Rule) -> Vec<String> {
    let namespaces: Vec<&str> = if rule.namespaces.is_empty() {
        vec![ANY]
    } else {
        rule.namespaces.iter().map(String::as_str).collect()
    };
    let kinds: Vec<&str> = if rule.kinds.is_empty() {
        vec![ANY]
    } else {
        rule.kinds.iter().map(|k| k.as_str()).collect()
    };
    namespaces
        .iter()
        .flat_map(|ns| kinds.iter().map(move |k| pair_key(ns, k)))
        .collect()
}

impl RuleIndex {
    pub fn insert(&mut self, id: u32, rule: &Rule) {
        let keyed_by_host = !rule.hosts.is_empty();
        if keyed_by_host {
            for h in &rule.hosts {
                self.by_host.insert(h, id);
            }
            self.gateways
                .insert(id, rule.gateways.iter().map(String::as_str));
        } else if !rule.gateways.is_empty() {
            for g in &rule.gateways {
                self.by_gateway.insert(g, id);
            }
        } else if rule.namespaces.is_empty() && rule.kinds.is_empty() {
            self.open.insert(id);
            return;
        } else {
            for key in pair_keys(rule) {
                self.by_namespace_kind.insert(&key, id);
            }
            return;
        }
        // Keyed by host or gateway: namespaces and kinds are checked afterwards.
        self.namespaces
            .insert(id, rule.namespaces.iter().map(String::as_str));
        self.kinds.insert(id, rule.kinds.iter().map(|k| k.as_str()));
    }

    pub fn remove(&mut self, id: u32, rule: &Rule) {
        self.open.remove(id);
        for h in &rule.hosts {
            self.by_host.remove(h, id);
        }
        for g in &rule.gateways {
            self.by_gateway.remove(g, id);
        }
        if keyed_by_pairs(rule) {
            for key in pair_keys(rule) {
                self.by_namespace_kind.remove(&key, id);
            }
        }
        self.gateways
            .remove(id, rule.gateways.iter().map(String::as_str));
        self.namespaces
            .remove(id, rule.namespaces.iter().map(String::as_str));
        self.kinds.remove(id, rule.kinds.iter().map(|k| k.as_str()));
    }

    /// Ids of the rules that match an object with these keys.
    pub fn matching(&self, keys: &ObjectKeys) -> RoaringBitmap {
        let mut out = self.open.clone();
        for h in &keys.hosts {
            self.by_host.matching_into(h, &mut out);
        }
        for g in &keys.gateways {
            self.by_gateway.union_into(g, &mut out);
        }
        // Only host- and gateway-keyed rules are in the checked dimensions.
        self.gateways
            .filter(&mut out, keys.gateways.iter().map(String::as_str));
        self.namespaces
            .filter(&mut out, std::iter::once(keys.namespace.as_str()));
        self.kinds
            .filter(&mut out, std::iter::once(keys.kind.as_str()));
        let (ns, kind) = (keys.namespace.as_str(), keys.kind.as_str());
        for key in [pair_key(ns, kind), pair_key(ns, ANY), pair_key(ANY, kind)] {
            self.by_namespace_kind.union_into(&key, &mut out);
        }
        out
    }
}
