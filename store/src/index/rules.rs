//! Subscription rules by dimension value, plus per-dimension "any" bitmaps for rules that leave a
//! dimension open: which rules one object matches, without scanning subscriptions.

use roaring::RoaringBitmap;

use super::{HostIndex, ObjectKeys, ValueIndex};
use crate::selector::Rule;

#[derive(Default, Debug)]
pub struct RuleIndex {
    any_kind: RoaringBitmap,
    any_namespace: RoaringBitmap,
    any_host: RoaringBitmap,
    any_gateway: RoaringBitmap,
    kinds: ValueIndex,
    namespaces: ValueIndex,
    hosts: HostIndex,
    gateways: ValueIndex,
}

impl RuleIndex {
    pub fn insert(&mut self, id: u32, rule: &Rule) {
        if rule.kinds.is_empty() {
            self.any_kind.insert(id);
        }
        for k in &rule.kinds {
            self.kinds.insert(k.as_str(), id);
        }
        if rule.namespaces.is_empty() {
            self.any_namespace.insert(id);
        }
        for ns in &rule.namespaces {
            self.namespaces.insert(ns, id);
        }
        if rule.hosts.is_empty() {
            self.any_host.insert(id);
        }
        for h in &rule.hosts {
            self.hosts.insert(h, id);
        }
        if rule.gateways.is_empty() {
            self.any_gateway.insert(id);
        }
        for g in &rule.gateways {
            self.gateways.insert(g, id);
        }
    }

    pub fn remove(&mut self, id: u32, rule: &Rule) {
        self.any_kind.remove(id);
        self.any_namespace.remove(id);
        self.any_host.remove(id);
        self.any_gateway.remove(id);
        for k in &rule.kinds {
            self.kinds.remove(k.as_str(), id);
        }
        for ns in &rule.namespaces {
            self.namespaces.remove(ns, id);
        }
        for h in &rule.hosts {
            self.hosts.remove(h, id);
        }
        for g in &rule.gateways {
            self.gateways.remove(g, id);
        }
    }

    /// Ids of the rules that match an object with these keys.
    pub fn matching(&self, keys: &ObjectKeys) -> RoaringBitmap {
        // Kind and namespace are single-valued on the object, so these are the most selective
        // first steps; the result only shrinks from here.
        let mut out = self.any_kind.clone();
        self.kinds.union_into(keys.kind.as_str(), &mut out);
        if out.is_empty() {
            return out;
        }
        let mut namespace = self.any_namespace.clone();
        self.namespaces.union_into(&keys.namespace, &mut namespace);
        out &= namespace;
        if out.is_empty() {
            return out;
        }
        let mut hosts = self.any_host.clone();
        for h in &keys.hosts {
            self.hosts.matching_into(h, &mut hosts);
        }
        out &= hosts;
        if out.is_empty() {
            return out;
        }
        let mut gateways = self.any_gateway.clone();
        for g in &keys.gateways {
            self.gateways.union_into(g, &mut gateways);
        }
        out &= gateways;
        out
    }
}
