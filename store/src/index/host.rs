//! Host postings with Istio wildcard semantics on both sides.
//!
//! Every wildcard suffix starts with a dot (`*.foo.com` → `.foo.com`) or is empty (`*`), so
//! "host ends with the suffix" can be answered by looking up each dot-suffix of the host:
//! - an exact host matches wildcards posted under any of its dot-suffixes (or `*`);
//! - a wildcard `*t` matches exact hosts that have `t` as a dot-suffix, wildcards `*s` where `t` is
//!   a dot-suffix of `s`, and wildcards posted under a dot-suffix of `t`.

use roaring::RoaringBitmap;

use super::value::ValueIndex;

#[derive(Default, Debug)]
pub struct HostIndex {
    /// Exact host → ids.
    exact: ValueIndex,
    /// Dot-suffix (and "") of exact hosts → ids.
    exact_suffix: ValueIndex,
    /// Wildcard suffix (`.foo.com`, or "" for `*`) → ids.
    wild: ValueIndex,
    /// Dot-suffix (and "") of wildcard suffixes → ids.
    wild_suffix: ValueIndex,
}

/// Every suffix of `s` that starts at a dot, longest first, then "".
fn dot_suffixes(s: &str) -> impl Iterator<Item = &str> {
    s.char_indices()
        .filter(|&(_, c)| c == '.')
        .map(move |(i, _)| &s[i..])
        .chain(std::iter::once(""))
}

impl HostIndex {
    pub fn insert(&mut self, host: &str, id: u32) {
        match host.strip_prefix('*') {
            Some(suffix) => {
                self.wild.insert(suffix, id);
                for s in dot_suffixes(suffix) {
                    self.wild_suffix.insert(s, id);
                }
            }
            None => {
                self.exact.insert(host, id);
                for s in dot_suffixes(host) {
                    self.exact_suffix.insert(s, id);
                }
            }
        }
    }

    /// Removes `id` from every posting of `host`. Removing an entity removes all its hosts, so a
    /// posting shared by two hosts of the same entity is never left half-removed.
    pub fn remove(&mut self, host: &str, id: u32) {
        match host.strip_prefix('*') {
            Some(suffix) => {
                self.wild.remove(suffix, id);
                for s in dot_suffixes(suffix) {
                    self.wild_suffix.remove(s, id);
                }
            }
            None => {
                self.exact.remove(host, id);
                for s in dot_suffixes(host) {
                    self.exact_suffix.remove(s, id);
                }
            }
        }
    }

    /// Adds to `out` every id posted under a host that matches `query`.
    pub fn matching_into(&self, query: &str, out: &mut RoaringBitmap) {
        match query.strip_prefix('*') {
            Some(t) => {
                self.exact_suffix.union_into(t, out);
                self.wild_suffix.union_into(t, out);
                for s in dot_suffixes(t) {
                    self.wild.union_into(s, out);
                }
            }
            None => {
                self.exact.union_into(query, out);
                for s in dot_suffixes(query) {
                    self.wild.union_into(s, out);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_suffixes_of_hosts() {
        assert_eq!(
            dot_suffixes("a.foo.com").collect::<Vec<_>>(),
            [".foo.com", ".com", ""]
        );
        assert_eq!(dot_suffixes(".foo").collect::<Vec<_>>(), [".foo", ""]);
        assert_eq!(dot_suffixes("").collect::<Vec<_>>(), [""]);
    }

    #[test]
    fn wildcards_on_both_sides() {
        let mut idx = HostIndex::default();
        let hosts = [
            "a.foo.com",        // 0
            "*.foo.com",        // 1
            "*",                // 2
            "foo.com",          // 3
            "*.bar.foo.com",    // 4
            "en.wikipedia.org", // 5
        ];
        for (id, h) in hosts.iter().enumerate() {
            idx.insert(h, id as u32);
        }
        fn q_in(idx: &HostIndex, query: &str) -> Vec<u32> {
            let mut out = RoaringBitmap::new();
            idx.matching_into(query, &mut out);
            out.iter().collect()
        }
        let q = |query: &str| q_in(&idx, query);
        assert_eq!(q("a.foo.com"), [0, 1, 2]);
        assert_eq!(q("x.bar.foo.com"), [1, 2, 4]);
        assert_eq!(q("foo.com"), [2, 3]);
        assert_eq!(q("*.foo.com"), [0, 1, 2, 4]);
        assert_eq!(q("*.wikipedia.org"), [2, 5]);
        assert_eq!(q("*"), [0, 1, 2, 3, 4, 5]);
        assert_eq!(q("*.com"), [0, 1, 2, 3, 4]);
        idx.remove("*.foo.com", 1);
        idx.remove("a.foo.com", 0);
        assert_eq!(q_in(&idx, "*.foo.com"), [2, 4]);
        assert_eq!(q_in(&idx, "a.foo.com"), [2]);
    }
}
