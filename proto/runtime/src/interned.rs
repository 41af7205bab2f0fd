//! One shared copy of each distinct value: the store's hub keeps one selector per distinct
//! subscription (the pods of one workload subscribe alike), the agent one label set per
//! workload version among a service's endpoints.

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::Arc;

/// The shared copies handed out so far.
#[derive(Debug)]
pub struct Interned<T> {
    values: HashSet<Arc<T>>,
}

impl<T> Default for Interned<T> {
    fn default() -> Self {
        Interned {
            values: HashSet::new(),
        }
    }
}

impl<T: Eq + Hash> Interned<T> {
    /// The shared copy of `value`: the one handed out before, or a new one.
    pub fn intern(&mut self, value: T) -> Arc<T> {
        if let Some(shared) = self.values.get(&value) {
            return Arc::clone(shared);
        }
        let shared = Arc::new(value);
        self.values.insert(Arc::clone(&shared));
        shared
    }

    /// A holder lets go of its copy: the set's goes with the last holder.
    pub fn release(&mut self, value: Arc<T>) {
        // The set's reference and this one.
        if Arc::strong_count(&value) == 2 {
            self.values.remove(&*value);
        }
    }

    /// Distinct values held.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_share_one_copy_until_the_last_holder_lets_go() {
        let mut set = Interned::default();
        let a = set.intern("reviews".to_string());
        let b = set.intern("reviews".to_string());
        let c = set.intern("ratings".to_string());
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(set.len(), 2);
        set.release(a);
        assert_eq!(set.len(), 2);
        set.release(b);
        assert_eq!(set.len(), 1);
        set.release(c);
        assert!(set.is_empty());
    }
}
