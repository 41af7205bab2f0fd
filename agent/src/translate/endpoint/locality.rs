//! Locality load balancing, as istiod applies it to a proxy's endpoints
//! (`ApplyLocalityLoadBalancer`): the setting in force (a DestinationRule's, a Service's traffic
//! distribution, else the mesh config's), then either its `distribute` weights, or — only with
//! outlier detection, without which Envoy never leaves a priority — failover priorities: by
//! `failoverPriority` labels (compared with the proxy's), then by how near each locality is to
//! the proxy's, `failover` moving other regions further.

use std::borrow::Cow;
use std::collections::BTreeMap;

use pasa_istio::destination_rule::LocalityLoadBalancerSetting;
use pasa_istio::service_endpoints::TrafficDistribution;

use super::shaping::{Out, Shaped};

/// The label of a workload's network (which istiod adds to its labels).
pub(super) const NETWORK_LABEL: &str = "topology.istio.io/network";
/// The label of a workload's cluster (added by istiod).
pub(super) const CLUSTER_LABEL: &str = "topology.istio.io/cluster";
const REGION_LABEL: &str = "topology.kubernetes.io/region";
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
const SUBZONE_LABEL: &str = "topology.istio.io/subzone";

/// Where the proxy is, for locality load balancing.
#[derive(Debug, Clone, Copy)]
pub(in crate::translate) struct ProxyPlace<'a> {
    /// `region/zone/subzone`.
    pub locality: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub cluster: &'a str,
    pub network: &'a str,
}

impl ProxyPlace<'_> {
    fn label(&self, key: &str) -> Option<&str> {
        workload_label(self.labels, self.locality, self.cluster, self.network, key)
    }

    /// Whether it has any label, its own or those istiod adds.
    fn has_labels(&self) -> bool {
        !self.labels.is_empty()
            || !self.locality.is_empty()
            || !self.cluster.is_empty()
            || !self.network.is_empty()
    }
}

/// The value of `key` among a workload's labels, with those istiod adds to them
/// (`AugmentLabels`): its locality's region, zone and subzone and its cluster override the
/// labels; its network only fills in a missing network label.
pub(super) fn workload_label<'a>(
    labels: &'a BTreeMap<String, String>,
    locality: &'a str,
    cluster: &'a str,
    network: &'a str,
    key: &str,
) -> Option<&'a str> {
    let own = || labels.get(key).map(String::as_str);
    let part = |i: usize| locality.split('/').nth(i).filter(|p| !p.is_empty());
    match key {
        REGION_LABEL => part(0).or_else(own),
        ZONE_LABEL => part(1).or_else(own),
        SUBZONE_LABEL => part(2).or_else(own),
        CLUSTER_LABEL => Some(cluster).filter(|c| !c.is_empty()).or_else(own),
        NETWORK_LABEL => own()
            .filter(|n| !n.is_empty())
            .or(Some(network).filter(|n| !n.is_empty())),
        _ => own(),
    }
}

/// The locality load-balancing setting in force for a cluster, and whether failover applies
/// without outlier detection (istiod's `GetLocalityLbSetting`): the DestinationRule's (off if
/// it says `enabled: false`), else the Service's traffic distribution (failover by network,
/// region, zone — and subzone and node for `PreferSameNode` — forced), else the mesh
/// config's (off if it says `enabled: false`).
pub fn effective_setting<'a>(
    mesh: Option<&'a LocalityLoadBalancerSetting>,
    destination_rule: Option<&'a LocalityLoadBalancerSetting>,
    distribution: Option<TrafficDistribution>,
) -> (Option<Cow<'a, LocalityLoadBalancerSetting>>, bool) {
    if let Some(dr) = destination_rule {
        return (
            (dr.enabled != Some(false)).then_some(Cow::Borrowed(dr)),
            false,
        );
    }
    if let Some(distribution) = distribution {
        let mut labels = vec![NETWORK_LABEL, REGION_LABEL, ZONE_LABEL];
        if distribution == TrafficDistribution::PreferSameNode {
            labels.extend([SUBZONE_LABEL, "kubernetes.io/hostname"]);
        }
        let setting = LocalityLoadBalancerSetting {
            enabled: Some(true),
            failover_priority: labels.into_iter().map(str::to_string).collect(),
            ..Default::default()
        };
        return (Some(Cow::Owned(setting)), true);
    }
    (
        mesh.filter(|m| m.enabled != Some(false)).map(Cow::Borrowed),
        false,
    )
}

/// Locality load balancing for one cluster of a proxy.
#[derive(Debug, Clone, Copy)]
pub(in crate::translate) struct LocalityLb<'a> {
    pub setting: &'a LocalityLoadBalancerSetting,
    /// Failover applies (the cluster has outlier detection, or the setting forces it).
    pub failover: bool,
    pub proxy: ProxyPlace<'a>,
}

impl LocalityLb<'_> {
    /// The localities with their weights or priorities set.
    pub(super) fn apply<'e, 's>(&self, mut shaped: Vec<Shaped<'e, 's>>) -> Vec<Shaped<'e, 's>> {
        if !self.setting.distribute.is_empty() {
            self.distribute(&mut shaped);
            return shaped;
        }
        if !self.failover {
            return shaped;
        }
        if self.setting.failover_priority.is_empty() {
            self.by_locality(&mut shaped);
            return shaped;
        }
        if self.proxy.has_labels() {
            shaped = self.by_labels(shaped);
        }
        if !self.setting.failover.is_empty() {
            self.by_locality(&mut shaped);
        }
        shaped
    }

    /// Weights each locality by the `distribute` rule for the proxy's locality: its share of
    /// the weight of the first `to` entry it matches, split among the localities that match it
    /// by their weights; a locality no entry matches gets no endpoints. (The entries are taken
    /// in name order, where istiod takes them in map order.)
    fn distribute(&self, shaped: &mut [Shaped<'_, '_>]) {
        let Some(rule) = self
            .setting
            .distribute
            .iter()
            .find(|d| locality_matches(self.proxy.locality, &d.from))
        else {
            return;
        };
        let mut unmatched: Vec<bool> = vec![true; shaped.len()];
        for (to, share) in &rule.to {
            let matched: Vec<usize> = (0..shaped.len())
                .filter(|&i| unmatched[i] && locality_matches(locality_of(&shaped[i]), to))
                .collect();
            let total: u64 = matched
                .iter()
                .map(|&i| u64::from(shaped[i].weight.unwrap_or(1)))
                .sum();
            for &i in &matched {
                unmatched[i] = false;
                let own = u64::from(shaped[i].weight.unwrap_or(1));
                let weight = (own * u64::from(*share)).div_ceil(total.max(1));
                if weight > 0 {
                    shaped[i].weight = Some(u32::try_from(weight).unwrap_or(u32::MAX));
                }
            }
        }
        for (l, unmatched) in shaped.iter_mut().zip(unmatched) {
            if unmatched {
                l.endpoints.clear();
            }
        }
    }

    /// Splits each locality by the priority its endpoints' labels give them: at the first
    /// `failoverPriority` entry (`label` or `label=value`) an endpoint differs from the proxy
    /// on (or from the value), it is `n - index` (n entries), else 0.
    fn by_labels<'e, 's>(&self, shaped: Vec<Shaped<'e, 's>>) -> Vec<Shaped<'e, 's>> {
        let entries: Vec<(&str, Option<&str>)> = self
            .setting
            .failover_priority
            .iter()
            .map(|e| match e.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (e.as_str(), None),
            })
            .collect();
        let n = u32::try_from(entries.len()).unwrap_or(u32::MAX);
        let priority_of = |o: &Out| {
            for (j, (key, value)) in entries.iter().enumerate() {
                let want = value.or_else(|| self.proxy.label(key)).unwrap_or("");
                if o.label(key).unwrap_or("") != want {
                    return n - u32::try_from(j).unwrap_or(0);
                }
            }
            0
        };
        let mut out = Vec::new();
        for l in shaped {
            let mut by_priority: BTreeMap<u32, Vec<Out>> = BTreeMap::new();
            for o in l.endpoints {
                by_priority.entry(priority_of(&o)).or_default().push(o);
            }
            for (priority, endpoints) in by_priority {
                out.push(Shaped {
                    locality: l.locality,
                    weight: Some(endpoints.iter().map(Out::weight).sum()),
                    endpoints,
                    priority,
                });
            }
        }
        compact(&mut out);
        out
    }

    /// Each locality's priority (after any it has, times five) by how near it is to the
    /// proxy's: 0 the same subzone, 1 the same zone, 2 the same region, 3 another region, 4
    /// another region than the one `failover` names for the proxy's.
    fn by_locality(&self, shaped: &mut [Shaped<'_, '_>]) {
        let proxy: Vec<&str> = self.proxy.locality.splitn(3, '/').collect();
        fn part<'a>(parts: &[&'a str], i: usize) -> &'a str {
            parts.get(i).copied().unwrap_or("")
        }
        for l in shaped.iter_mut() {
            let theirs: Vec<&str> = locality_of(l).splitn(3, '/').collect();
            let mut near = if part(&proxy, 0) != part(&theirs, 0) {
                3
            } else if part(&proxy, 1) != part(&theirs, 1) {
                2
            } else if part(&proxy, 2) != part(&theirs, 2) {
                1
            } else {
                0
            };
            if near == 3
                && let Some(rule) = self
                    .setting
                    .failover
                    .iter()
                    .find(|f| f.from == part(&proxy, 0))
                && part(&theirs, 0) != rule.to
            {
                near = 4;
            }
            l.priority = l.priority * 5 + near;
        }
        compact(shaped);
    }
}

/// The locality (`region/zone/subzone`) of a shaped locality.
fn locality_of<'a>(l: &'a Shaped<'_, '_>) -> &'a str {
    l.locality
        .endpoints
        .first()
        .map_or("", |e| &*e.instance.locality)
}

/// Renumbers priorities 0, 1, 2, … in their order, without gaps.
fn compact(shaped: &mut [Shaped<'_, '_>]) {
    let mut used: Vec<u32> = shaped.iter().map(|l| l.priority).collect();
    used.sort_unstable();
    used.dedup();
    for l in shaped {
        l.priority = u32::try_from(used.binary_search(&l.priority).unwrap_or(0)).unwrap_or(0);
    }
}

/// Whether `locality` matches a rule's `region/zone/subzone`, where `*` (and, for zone and
/// subzone, nothing) matches anything.
fn locality_matches(locality: &str, rule: &str) -> bool {
    let mut have = locality.splitn(3, '/');
    let mut want = rule.splitn(3, '/');
    (0..3).all(|i| {
        let (h, w) = (have.next().unwrap_or(""), want.next().unwrap_or(""));
        w == "*" || (i > 0 && w.is_empty()) || h == w
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_localities_match_with_wildcards() {
        assert!(locality_matches("us/east-a/rack1", "us/*"));
        assert!(locality_matches("us/east-a/rack1", "us"));
        assert!(locality_matches("us/east-a/rack1", "us/east-a/rack1"));
        assert!(!locality_matches("us/east-a/rack1", "us/east-b"));
        assert!(!locality_matches("eu/east-a", "us/*"));
        assert!(locality_matches("eu/x", "*"));
    }

    #[test]
    fn augmented_labels_as_istiod_adds_them() {
        let labels: BTreeMap<String, String> = [
            (NETWORK_LABEL.to_string(), "n-label".to_string()),
            (CLUSTER_LABEL.to_string(), "c-label".to_string()),
        ]
        .into();
        let get = |key| workload_label(&labels, "r/z/s", "c1", "n1", key);
        assert_eq!(get(NETWORK_LABEL), Some("n-label"));
        assert_eq!(get(CLUSTER_LABEL), Some("c1"));
        assert_eq!(get(REGION_LABEL), Some("r"));
        assert_eq!(get(SUBZONE_LABEL), Some("s"));
        assert_eq!(
            workload_label(&BTreeMap::new(), "", "", "n1", NETWORK_LABEL),
            Some("n1")
        );
    }
}
