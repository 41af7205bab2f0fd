//! One shared copy of each distinct value: the store's hub keeps one selector per distinct
//! subscription (the pods of one workload subscribe alike), the agent one label set per
//! workload version among a service's endpoints.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

/// The shared copies handed out so far, by hash (equal hashes are told apart by equality).
#[derive(Debug)]
pub struct Interned<T: ?Sized, S = RandomState> {
    values: HashMap<u64, Vec<Arc<T>>, S>,
    hasher: S,
    len: usize,
}

impl<T: ?Sized, S: Default> Default for Interned<T, S> {
    fn default() -> Self {
        Interned {
            values: HashMap::default(),
            hasher: S::default(),
            len: 0,
        }
    }
}

impl<T: Eq + Hash, S: BuildHasher> Interned<T, S> {
    /// The shared copy of `value`: the one handed out before, or a new one.
    pub fn intern(&mut self, value: T) -> Arc<T> {
        let hash = self.hasher.hash_one(&value);
        match self.find(hash, |held| *held == value) {
            Some(shared) => shared,
            None => self.insert(hash, Arc::new(value)),
        }
    }
}

impl<T: Eq + Hash + ?Sized, S: BuildHasher> Interned<T, S> {
    /// The shared copy of the value that `key` stands for, made by `make` only when none is
    /// held yet: a value can be looked up by a borrowed form of it (labels still in the JSON
    /// they were read from) without building it first. `key` must hash as its value hashes
    /// (as `&str` hashes as `String`, a map of `&str` as a map of `String`), and `same` tells
    /// whether a held value is the one `key` stands for. `None` if `make` made none.
    pub fn intern_like<Q: Hash + ?Sized>(
        &mut self,
        key: &Q,
        same: impl Fn(&T, &Q) -> bool,
        make: impl FnOnce(&Q) -> Option<Arc<T>>,
    ) -> Option<Arc<T>> {
        let hash = self.hasher.hash_one(key);
        if let Some(shared) = self.find(hash, |held| same(held, key)) {
            return Some(shared);
        }
        Some(self.insert(hash, make(key)?))
    }

    /// The held value of `hash` that `same` picks.
    fn find(&self, hash: u64, same: impl Fn(&T) -> bool) -> Option<Arc<T>> {
        let held = self.values.get(&hash)?;
        held.iter().find(|held| same(held)).cloned()
    }

    /// Holds `shared`, a value of `hash` not held yet.
    fn insert(&mut self, hash: u64, shared: Arc<T>) -> Arc<T> {
        self.values
            .entry(hash)
            .or_default()
            .push(Arc::clone(&shared));
        self.len += 1;
        shared
    }

    /// A holder lets go of its copy: the set's goes with the last holder.
    pub fn release(&mut self, value: Arc<T>) {
        // The set's reference and this one.
        if Arc::strong_count(&value) != 2 {
            return;
        }
        let hash = self.hasher.hash_one(&*value);
        if let Some(held) = self.values.get_mut(&hash) {
            let before = held.len();
            held.retain(|held| !Arc::ptr_eq(held, &value));
            self.len -= before - held.len();
            if held.is_empty() {
                self.values.remove(&hash);
            }
        }
    }

    /// Distinct values held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_share_one_copy_until_the_last_holder_lets_go() {
        let mut set: Interned<String> = Interned::default();
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

    /// A map of borrowed strings finds the map of owned strings equal to it, and the owned one
    /// is made only once.
    #[test]
    fn a_borrowed_form_finds_its_owned_value() {
        use std::collections::BTreeMap;
        let owned = |m: &BTreeMap<&str, &str>| -> BTreeMap<String, String> {
            m.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let same = |held: &BTreeMap<String, String>, key: &BTreeMap<&str, &str>| {
            held.len() == key.len()
                && held
                    .iter()
                    .zip(key)
                    .all(|(a, b)| (a.0 == b.0) && (a.1 == b.1))
        };
        let mut set: Interned<BTreeMap<String, String>> = Interned::default();
        let v1 = set.intern(owned(&BTreeMap::from([
            ("app", "reviews"),
            ("version", "v1"),
        ])));
        let mut made = 0;
        let key = BTreeMap::from([("app", "reviews"), ("version", "v1")]);
        let found = set
            .intern_like(&key, same, |k| {
                made += 1;
                Some(Arc::new(owned(k)))
            })
            .unwrap();
        assert!(Arc::ptr_eq(&v1, &found));
        assert_eq!(made, 0);
        let key = BTreeMap::from([("app", "reviews"), ("version", "v2")]);
        let v2 = set
            .intern_like(&key, same, |k| Some(Arc::new(owned(k))))
            .unwrap();
        assert_eq!(v2.get("version").map(String::as_str), Some("v2"));
        assert_eq!(set.len(), 2);
        assert!(
            set.intern_like(&BTreeMap::from([("x", "y")]), same, |_| None)
                .is_none()
        );
        assert_eq!(set.len(), 2);

        let mut strings: Interned<str> = Interned::default();
        let a = strings.intern_like(
            "us-east1/b",
            |held, key| held == key,
            |key| Some(Arc::from(key)),
        );
        let b = strings.intern_like("us-east1/b", |held, key| held == key, |_| None);
        assert!(Arc::ptr_eq(&a.unwrap(), &b.unwrap()));
    }
}
