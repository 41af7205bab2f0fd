//! The VirtualService checks that relate hosts to one another, in time linear in the number of
//! hosts (times their length, at most 255 bytes): which hosts repeat or overlap
//! ([`overlapping_pairs`]), and whether an SNI name lies within one of the hosts ([`Within`]).
//!
//! A host `*` followed by a suffix is a wildcard; anything else is a plain name. Matching is on
//! bytes, as `pasa_istio::host::matches` and `super::host_subset_of` define it: a plain name
//! matches a wildcard it ends with the suffix of; two wildcards match when one suffix ends with the
//! other.

use std::collections::{HashMap, HashSet};

/// Most overlapping host pairs reported; a VirtualService with more is refused all the same.
pub(super) const MAX_REPORTED_PAIRS: usize = 100;

/// The hosts' overlapping pairs `(i, j)` with `i < j`, in the order a pairwise comparison finds
/// them (by `i`, then `j`), at most `limit` of them, and whether there were more.
pub(super) fn overlapping_pairs(hosts: &[String], limit: usize) -> (Vec<(usize, usize)>, bool) {
    let mut pairs = Pairs {
        found: HashSet::new(),
        limit,
        more: false,
    };
    // Plain names, grouped when equal (groups in the order their first name comes).
    let mut group_of: HashMap<&str, usize> = HashMap::new();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    // Wildcard suffixes (`*.a.com` → `.a.com`), and both kinds reversed and sorted, so that the
    // names ending with a suffix are one range.
    let mut wild: Vec<(usize, &str)> = Vec::new();
    let mut plain_reversed: Vec<(Vec<u8>, usize)> = Vec::new();
    let mut wild_reversed: Vec<(Vec<u8>, usize)> = Vec::new();
    for (i, host) in hosts.iter().enumerate() {
        match host.strip_prefix('*') {
            Some(suffix) => {
                wild.push((i, suffix));
                wild_reversed.push((reversed(suffix), i));
            }
            None => {
                let next = groups.len();
                let group = *group_of.entry(host.as_str()).or_insert(next);
                if group == next {
                    groups.push(Vec::new());
                }
                groups[group].push(i);
                plain_reversed.push((reversed(host), i));
            }
        }
    }
    plain_reversed.sort_unstable();
    wild_reversed.sort_unstable();
    for same in &groups {
        for (n, &i) in same.iter().enumerate() {
            for &j in &same[n + 1..] {
                if !pairs.add(i, j) {
                    return pairs.finish();
                }
            }
        }
    }
    for &(i, suffix) in &wild {
        let key = reversed(suffix);
        // Plain names and wildcards ending with this suffix (wildcards as wide or narrower).
        for list in [&plain_reversed, &wild_reversed] {
            let start = list.partition_point(|(r, _)| r.as_slice() < key.as_slice());
            for (_, j) in list[start..]
                .iter()
                .take_while(|(r, _)| r.starts_with(&key))
            {
                if *j != i && !pairs.add(i, *j) {
                    return pairs.finish();
                }
            }
        }
    }
    pairs.finish()
}

struct Pairs {
    found: HashSet<(usize, usize)>,
    limit: usize,
    more: bool,
}

impl Pairs {
    /// Records the pair; false once the limit is passed.
    fn add(&mut self, a: usize, b: usize) -> bool {
        let pair = (a.min(b), a.max(b));
        if self.found.contains(&pair) {
            return true;
        }
        if self.found.len() == self.limit {
            self.more = true;
            return false;
        }
        self.found.insert(pair);
        true
    }

    fn finish(self) -> (Vec<(usize, usize)>, bool) {
        let mut pairs: Vec<(usize, usize)> = self.found.into_iter().collect();
        pairs.sort_unstable();
        (pairs, self.more)
    }
}

fn reversed(s: &str) -> Vec<u8> {
    s.bytes().rev().collect()
}

/// The hosts of a VirtualService, indexed to say whether a name lies within one of them.
pub(super) struct Within<'a> {
    plain: HashSet<&'a str>,
    /// The suffixes of the wildcard hosts (`""` for `*`).
    wild: HashSet<&'a str>,
}

impl<'a> Within<'a> {
    pub(super) fn new(hosts: &'a [String]) -> Self {
        let mut within = Within {
            plain: HashSet::new(),
            wild: HashSet::new(),
        };
        for host in hosts {
            match host.strip_prefix('*') {
                Some(suffix) => within.wild.insert(suffix),
                None => within.plain.insert(host.as_str()),
            };
        }
        within
    }

    /// Whether `name` lies within one of the hosts (`super::host_subset_of` of any of them).
    pub(super) fn contains(&self, name: &str) -> bool {
        let suffixes_in_wild = |s: &str| {
            s.char_indices()
                .map(|(k, _)| &s[k..])
                .chain([""])
                .any(|suffix| self.wild.contains(suffix))
        };
        match name.strip_prefix('*') {
            // A wildcard lies within a wildcard whose suffix its own suffix ends with.
            Some(suffix) => suffixes_in_wild(suffix),
            None => self.plain.contains(name) || suffixes_in_wild(name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pairwise comparison the index replaces.
    fn pairwise(hosts: &[String]) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for (i, a) in hosts.iter().enumerate() {
            for (j, b) in hosts.iter().enumerate().skip(i + 1) {
                if pasa_istio::host::matches(a, b) {
                    out.push((i, j));
                }
            }
        }
        out
    }

    fn hosts(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn overlapping_pairs_are_those_a_pairwise_comparison_finds() {
        let cases = [
            hosts(&[
                "a.com", "b.com", "a.com", "*.com", "*.a.com", "x.a.com", "*", "a.com",
            ]),
            hosts(&["*.a.com", "*.com", "*.a.com", "b.a.com", "com", "*com", "*"]),
            hosts(&["a", "b", "c"]),
            hosts(&[]),
        ];
        for case in cases {
            assert_eq!(
                overlapping_pairs(&case, usize::MAX),
                (pairwise(&case), false),
                "{case:?}"
            );
        }
    }

    #[test]
    fn overlapping_pairs_stop_at_the_limit() {
        let many: Vec<String> = (0..50).map(|_| "a.com".to_string()).collect();
        let (pairs, more) = overlapping_pairs(&many, 10);
        assert_eq!(pairs.len(), 10);
        assert!(more);
    }

    #[test]
    fn within_agrees_with_host_subset_of() {
        let all = hosts(&[
            "a.com",
            "*.a.com",
            "*.com",
            "b.a.com",
            "*",
            "*.b.a.com",
            "com",
            "x.org",
            "*com",
        ]);
        for split in 0..all.len() {
            let (hs, names) = all.split_at(split);
            let index = Within::new(hs);
            for name in names.iter().chain(hs) {
                let expected = hs.iter().any(|h| super::super::host_subset_of(name, h));
                assert_eq!(index.contains(name), expected, "{name} within {hs:?}");
            }
        }
    }
}
