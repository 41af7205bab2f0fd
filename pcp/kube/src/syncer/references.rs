//! Which slices point at each pod, node and Service: what a change of one of them rewrites.

use super::*;

/// A namespaced object: (namespace, name).
pub(super) type Id = (String, String);

/// Which slices point at each pod, node and Service: what a pod's, node's or Service's change
/// rewrites.
#[derive(Default)]
pub(super) struct References {
    /// A slice's pods, nodes and Service, by the slice.
    pub(super) of_slice: HashMap<Id, SliceReferences>,
    pub(super) by_pod: HashMap<Id, BTreeSet<Id>>,
    pub(super) by_node: HashMap<String, BTreeSet<Id>>,
    pub(super) by_service: HashMap<Id, BTreeSet<Id>>,
}

impl References {
    pub(super) fn set(&mut self, slice: Id, refs: SliceReferences) {
        self.remove(&slice);
        link(&mut self.by_pod, &refs.pods, &slice);
        link(&mut self.by_node, &refs.nodes, &slice);
        let service = refs.service.as_ref().map(|s| (slice.0.clone(), s.clone()));
        link(&mut self.by_service, service.as_slice(), &slice);
        self.of_slice.insert(slice, refs);
    }

    pub(super) fn remove(&mut self, slice: &Id) {
        let Some(refs) = self.of_slice.remove(slice) else {
            return;
        };
        unlink(&mut self.by_pod, &refs.pods, slice);
        unlink(&mut self.by_node, &refs.nodes, slice);
        let service = refs.service.map(|s| (slice.0.clone(), s));
        unlink(&mut self.by_service, service.as_slice(), slice);
    }
}

/// Records that `slice` reads each of `keys`.
fn link<K: Clone + Eq + std::hash::Hash>(
    by: &mut HashMap<K, BTreeSet<Id>>,
    keys: &[K],
    slice: &Id,
) {
    for key in keys {
        by.entry(key.clone()).or_default().insert(slice.clone());
    }
}

/// Forgets that `slice` reads each of `keys`.
fn unlink<K: Eq + std::hash::Hash>(by: &mut HashMap<K, BTreeSet<Id>>, keys: &[K], slice: &Id) {
    for key in keys {
        if let Some(set) = by.get_mut(key) {
            set.remove(slice);
            if set.is_empty() {
                by.remove(key);
            }
        }
    }
}

pub(super) fn slice_id(eps: &EndpointSlice) -> Id {
    (eps.namespace().unwrap_or_default(), eps.name_any())
}
