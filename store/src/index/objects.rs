//! Objects by dimension value: which objects a selector matches.

use roaring::RoaringBitmap;

use super::{HostIndex, ObjectKeys, ValueIndex};
use crate::selector::{Rule, Selector};

#[derive(Default, Debug)]
pub struct ObjectIndex {
    all: RoaringBitmap,
    kinds: ValueIndex,
    namespaces: ValueIndex,
    hosts: HostIndex,
    gateways: ValueIndex,
}

impl ObjectIndex {
    pub fn insert(&mut self, id: u32, keys: &ObjectKeys) {
        self.all.insert(id);
        self.kinds.insert(keys.kind.as_str(), id);
        self.namespaces.insert(&keys.namespace, id);
        for h in &keys.hosts {
            self.hosts.insert(h, id);
        }
        for g in &keys.gateways {
            self.gateways.insert(g, id);
        }
    }

    pub fn remove(&mut self, id: u32, keys: &ObjectKeys) {
        self.all.remove(id);
        self.kinds.remove(keys.kind.as_str(), id);
        self.namespaces.remove(&keys.namespace, id);
        for h in &keys.hosts {
            self.hosts.remove(h, id);
        }
        for g in &keys.gateways {
            self.gateways.remove(g, id);
        }
    }

    pub fn len(&self) -> u64 {
        self.all.len()
    }

    pub fn is_empty(&self) -> bool {
        self.all.is_empty()
    }

    /// Ids of the objects any rule of the selector matches.
    pub fn select(&self, selector: &Selector) -> RoaringBitmap {
        let mut out = RoaringBitmap::new();
        for rule in &selector.rules {
            out |= self.select_rule(rule);
        }
        out
    }

    fn select_rule(&self, rule: &Rule) -> RoaringBitmap {
        let mut acc: Option<RoaringBitmap> = None;
        let mut narrow = |set: RoaringBitmap| {
            acc = Some(match acc.take() {
                Some(a) => a & set,
                None => set,
            });
        };
        if !rule.kinds.is_empty() {
            let mut set = RoaringBitmap::new();
            for k in &rule.kinds {
                self.kinds.union_into(k.as_str(), &mut set);
            }
            narrow(set);
        }
        if !rule.namespaces.is_empty() {
            let mut set = RoaringBitmap::new();
            for ns in &rule.namespaces {
                self.namespaces.union_into(ns, &mut set);
            }
            narrow(set);
        }
        if !rule.hosts.is_empty() {
            let mut set = RoaringBitmap::new();
            for h in &rule.hosts {
                self.hosts.matching_into(h, &mut set);
            }
            narrow(set);
        }
        if !rule.gateways.is_empty() {
            let mut set = RoaringBitmap::new();
            for g in &rule.gateways {
                self.gateways.union_into(g, &mut set);
            }
            narrow(set);
        }
        acc.unwrap_or_else(|| self.all.clone())
    }
}
