//! Exact-value postings: value → bitmap of ids.

use roaring::RoaringBitmap;
use rustc_hash::FxHashMap;

#[derive(Default, Debug)]
pub struct ValueIndex {
    postings: FxHashMap<String, RoaringBitmap>,
}

impl ValueIndex {
    pub fn insert(&mut self, value: &str, id: u32) {
        match self.postings.get_mut(value) {
            Some(bitmap) => {
                bitmap.insert(id);
            }
            None => {
                self.postings
                    .insert(value.to_string(), RoaringBitmap::from_iter([id]));
            }
        }
    }

    pub fn remove(&mut self, value: &str, id: u32) {
        if let Some(bitmap) = self.postings.get_mut(value) {
            bitmap.remove(id);
            if bitmap.is_empty() {
                self.postings.remove(value);
            }
        }
    }

    pub fn get(&self, value: &str) -> Option<&RoaringBitmap> {
        self.postings.get(value)
    }

    /// Adds the ids posted under `value` to `out`.
    pub fn union_into(&self, value: &str, out: &mut RoaringBitmap) {
        if let Some(bitmap) = self.postings.get(value) {
            *out |= bitmap;
        }
    }

    /// Number of distinct values.
    pub fn len(&self) -> usize {
        self.postings.len()
    }

    pub fn is_empty(&self) -> bool {
        self.postings.is_empty()
    }
}
