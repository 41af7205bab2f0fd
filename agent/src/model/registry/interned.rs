//! Endpoints built sharing what repeats among them: one copy of each label set, port map and
//! string.

use std::collections::BTreeMap;
use std::hash::Hash;
use std::sync::Arc;

use pasa_istio::persistent_session::labelled_draining;
use pasa_istio::service_endpoints::EndpointView;
use pasa_runtime::interned::Interned;
use rustc_hash::FxBuildHasher;

use super::{EndpointPorts, Health, Instance, Labels, WORKLOAD_NAME_LABEL};

/// One copy of each distinct label set, port map and string among the endpoints of a service,
/// each made only when it is first met.
#[derive(Default)]
pub(super) struct Shared {
    labels: Interned<BTreeMap<String, String>, FxBuildHasher>,
    ports: Interned<BTreeMap<u32, u32>, FxBuildHasher>,
    strings: Interned<str, FxBuildHasher>,
    /// An endpoint's ports while they are looked up.
    scratch: Vec<(u32, u32)>,
}

impl Shared {
    /// An endpoint as read, reached on `ports`.
    pub(super) fn instance(
        &mut self,
        e: &EndpointView<'_>,
        ports: EndpointPorts,
        cluster: &str,
    ) -> Instance {
        Instance {
            cluster: self.string(cluster),
            ports,
            address: e.address.to_string(),
            labels: self.labels(&e.labels),
            locality: self.string(&e.locality),
            weight: e.weight.max(1),
            network: self.string(&e.network),
            service_account: self.string(&e.service_account),
            workload: self.string(e.labels.get(WORKLOAD_NAME_LABEL).map_or("", |v| v.as_ref())),
            health: if e.draining || labelled_draining(&e.labels) {
                Health::Draining
            } else if e.ready {
                Health::Healthy
            } else {
                Health::Unhealthy
            },
        }
    }

    /// `labels`, of `String`s or of strings still in the JSON (which hash alike).
    pub(super) fn labels<K, V>(&mut self, labels: &BTreeMap<K, V>) -> Labels
    where
        K: AsRef<str> + Hash,
        V: AsRef<str> + Hash,
    {
        self.labels
            .intern_like(
                labels,
                |held, key| {
                    held.len() == key.len()
                        && held
                            .iter()
                            .zip(key)
                            .all(|(a, b)| a.0 == b.0.as_ref() && a.1 == b.1.as_ref())
                },
                |key| {
                    let owned = key
                        .iter()
                        .map(|(k, v)| (k.as_ref().to_string(), v.as_ref().to_string()));
                    Some(Arc::new(owned.collect()))
                },
            )
            .unwrap_or_default()
    }

    /// The map of `(service port, endpoint port)` pairs; of a port given twice, the last counts.
    pub(super) fn ports(&mut self, pairs: impl IntoIterator<Item = (u32, u32)>) -> EndpointPorts {
        let Shared { ports, scratch, .. } = self;
        scratch.clear();
        scratch.extend(pairs);
        // Sorted and each port once, the last of it kept: laid out as the map is.
        scratch.reverse();
        scratch.sort_by_key(|p| p.0);
        scratch.dedup_by_key(|p| p.0);
        ports
            .intern_like(
                &scratch[..],
                |held, key| {
                    held.len() == key.len() && held.iter().zip(key).all(|(a, b)| (*a.0, *a.1) == *b)
                },
                |key| Some(Arc::new(key.iter().copied().collect())),
            )
            .unwrap_or_default()
    }

    pub(super) fn string(&mut self, s: &str) -> Arc<str> {
        self.strings
            .intern_like(s, |held, key| held == key, |key| Some(Arc::from(key)))
            .unwrap_or_else(|| Arc::from(s))
    }
}
