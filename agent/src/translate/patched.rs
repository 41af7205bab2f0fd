//! Resources changed after the builders built them (access logs, then EnvoyFilter patches), as
//! a generation is handed out. Each changed resource is remembered with the resource it was
//! changed from: while the builders hand out the same resource (the same allocation) and the
//! change is the same (its fingerprint), the change is not decoded and made again.

use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::resource::{Resource, ResourceMap};

/// Which map of a generation a resource is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Type {
    Listener,
    Route,
    Cluster,
}

/// Changed resources by type and name, for one change.
#[derive(Debug, Default)]
pub(super) struct Memo {
    /// The fingerprint of the change the entries are results of.
    fingerprint: u64,
    entries: FxHashMap<(Type, String), Changed>,
}

/// A resource changed: what it was changed from, and the result (`None`: removed).
#[derive(Debug)]
struct Changed {
    from: Arc<Resource>,
    to: Option<Arc<Resource>>,
}

impl Memo {
    /// Starts a generation whose change has `fingerprint`: results of another are forgotten.
    pub(super) fn begin(&mut self, fingerprint: u64) {
        if fingerprint != self.fingerprint {
            self.entries.clear();
            self.fingerprint = fingerprint;
        }
    }

    /// Forgets every result (nothing is changed any more).
    pub(super) fn clear(&mut self) {
        self.entries.clear();
    }

    /// Changes each resource of `map` with `change` (given its name; `None`: removed), reusing
    /// what was made of the same resource before.
    pub(super) fn each(
        &mut self,
        kind: Type,
        map: &mut ResourceMap,
        change: impl Fn(&str, &Arc<Resource>) -> Option<Arc<Resource>>,
    ) {
        let names: Vec<(String, Arc<Resource>)> = map
            .iter()
            .map(|(k, v)| (k.clone(), Arc::clone(v)))
            .collect();
        let mut seen = FxHashSet::default();
        for (name, source) in names {
            let key = (kind, name);
            let out = match self.entries.get(&key) {
                Some(c) if Arc::ptr_eq(&c.from, &source) => c.to.clone(),
                _ => {
                    let to = change(&key.1, &source);
                    let from = Arc::clone(&source);
                    self.entries.insert(
                        key.clone(),
                        Changed {
                            from,
                            to: to.clone(),
                        },
                    );
                    to
                }
            };
            match out {
                Some(r) if !Arc::ptr_eq(&r, &source) => {
                    map.insert(key.1.clone(), r);
                }
                Some(_) => {}
                None => {
                    map.remove(&key.1);
                }
            }
            seen.insert(key);
        }
        self.entries.retain(|k, _| k.0 != kind || seen.contains(k));
    }
}
