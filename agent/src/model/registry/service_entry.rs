//! The services of a ServiceEntry: one per host, with its endpoints (inline, or the
//! WorkloadEntries it selects), and the addresses istiod's older allocator gives hosts without one.

use std::collections::BTreeMap;
use std::sync::Arc;

use pasa_istio::common::Protocol;
use pasa_istio::label_selector::selects;
use pasa_istio::persistent_session::PersistentSession;
use pasa_istio::persistent_session::labelled_draining;
use pasa_istio::service_entry::{Location, Resolution as SeResolution, ServiceEntry};
use pasa_istio::workload_entry::{self, WorkloadEntry};
use pasa_proto::Kind;

use crate::cache::Key;

use super::interned::Shared;
use super::parse::Parsed;
use super::{
    Config, Health, Instance, Registry, Resolution, Service, ServicePort, TLS_MODE_LABEL,
    WORKLOAD_NAME_LABEL,
};

/// The annotation of a WorkloadEntry auto-registered for a WorkloadGroup: the group's name.
const AUTO_REGISTRATION_GROUP: &str = "istio.io/autoRegistrationGroup";

/// A workload's name as Istio's telemetry reads it: its auto-registration group, its
/// `service.istio.io/workload-name` label, or `name`.
fn workload_name<'a>(
    name: &'a str,
    annotations: Option<&'a BTreeMap<String, String>>,
    labels: &'a BTreeMap<String, String>,
) -> &'a str {
    annotations
        .and_then(|a| a.get(AUTO_REGISTRATION_GROUP))
        .or_else(|| labels.get(WORKLOAD_NAME_LABEL))
        .map_or(name, String::as_str)
}

/// A WorkloadEntry's labels as its endpoint's: one with a service account and no
/// `security.istio.io/tlsMode` label takes Istio mutual TLS (istiod takes it to have a sidecar).
fn with_tls_mode<'a>(
    labels: &'a BTreeMap<String, String>,
    service_account: &str,
) -> std::borrow::Cow<'a, BTreeMap<String, String>> {
    if service_account.is_empty() || labels.contains_key(TLS_MODE_LABEL) {
        return std::borrow::Cow::Borrowed(labels);
    }
    let mut labels = labels.clone();
    labels.insert(TLS_MODE_LABEL.to_string(), "istio".to_string());
    std::borrow::Cow::Owned(labels)
}

/// The addresses istiod's older allocator gives ServiceEntry hosts that have none (not wildcards,
/// not resolution `NONE`), by namespace and host: `240.240.<x/255>.<x%255>`, `x` derived from an
/// FNV-1a hash of `<namespace>/<host>` with double hashing on collisions, the same host of one
/// namespace always getting the same address. Sidecars that capture DNS and ask for it listen on
/// these addresses.
pub fn legacy_auto_addresses(registry: &Registry) -> BTreeMap<(String, String), String> {
    const MAX: u32 = 256 * 254;
    const PRIME: u32 = 65_011;
    let mut services: Vec<&Arc<Service>> = registry
        .services
        .values()
        .flatten()
        .filter(|s| {
            !s.kubernetes
                && s.addresses.is_empty()
                && !s.hostname.starts_with('*')
                && s.resolution != Resolution::Passthrough
        })
        .collect();
    services.sort_by(|a, b| (a.created, &a.source).cmp(&(b.created, &b.source)));
    let mut slots: BTreeMap<u32, String> = BTreeMap::new();
    for s in services {
        let key = format!("{}/{}", s.namespace, s.hostname);
        let h = fnv1a(key.as_bytes());
        let mut slot = h % MAX;
        if slots.contains_key(&slot) {
            let second = PRIME - (h % PRIME);
            let mut i: u32 = 1;
            loop {
                slot = h.wrapping_add(i.wrapping_mul(second)) % (MAX - 1);
                if !slots.contains_key(&slot) {
                    break;
                }
                i += 1;
            }
        }
        slots.insert(slot, key);
    }
    let mut out: BTreeMap<(String, String), String> = BTreeMap::new();
    let mut bump = 0;
    for (slot, key) in slots {
        let mut x = slot + 1 + bump;
        if x % 255 == 0 {
            bump += 1;
            x += 1;
        }
        let Some((ns, host)) = key.split_once('/') else {
            continue;
        };
        out.entry((ns.to_string(), host.to_string()))
            .or_insert_with(|| format!("240.240.{}.{}", x / 255, x % 255));
    }
    out
}

fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

impl Registry {
    /// The services of `se`: one per host.
    pub(super) fn services_of_entry(&self, se: &Config<ServiceEntry>) -> Vec<Service> {
        let spec = &se.spec;
        let resolution = match spec.resolution {
            SeResolution::None => Resolution::Passthrough,
            SeResolution::Static => Resolution::ClientSideLb,
            SeResolution::Dns => Resolution::Dns,
            SeResolution::DnsRoundRobin => Resolution::DnsRoundRobin,
            SeResolution::DynamicDns => Resolution::DynamicDns,
            _ => Resolution::Passthrough,
        };
        let ports: Vec<ServicePort> = spec
            .ports
            .iter()
            .map(|p| ServicePort {
                name: p.name.clone(),
                number: p.number,
                protocol: Protocol::parse(&p.protocol),
                target_port: if p.target_port != 0 {
                    p.target_port
                } else {
                    p.number
                },
            })
            .collect();
        let mut revision = se.meta.revision;
        // Each workload with its name (see `Instance::workload`).
        let workloads: Vec<(String, &WorkloadEntry)> = match &spec.workload_selector {
            Some(selector) => self
                .entries
                .values()
                .filter_map(|e| match &e.parsed {
                    Parsed::WorkloadEntry(we)
                        if we.meta.namespace == se.meta.namespace
                            && selects(&selector.labels, &we.spec.labels) =>
                    {
                        // An entry left out (its health checked, not healthy) still counts
                        // for the revision: its change is the service's.
                        revision = revision.max(we.meta.revision);
                        if !workload_entry::served(&we.meta.annotations) {
                            return None;
                        }
                        let name = workload_name(
                            &we.meta.name,
                            Some(&we.meta.annotations),
                            &we.spec.labels,
                        );
                        Some((name.to_string(), &we.spec))
                    }
                    _ => None,
                })
                .collect(),
            None => spec
                .endpoints
                .iter()
                .enumerate()
                .map(|(i, w)| {
                    let name = format!("{}-{i}", se.meta.name);
                    (workload_name(&name, None, &w.labels).to_string(), w)
                })
                .collect(),
        };
        let mut shared = Shared::default();
        let endpoints: Vec<Instance> = workloads
            .iter()
            .map(|(workload, w)| Instance {
                address: w.address.clone(),
                ports: shared.ports(spec.ports.iter().map(|p| {
                    let target = w
                        .ports
                        .get(&p.name)
                        .copied()
                        .unwrap_or(if p.target_port != 0 {
                            p.target_port
                        } else {
                            p.number
                        });
                    (p.number, target)
                })),
                labels: shared.labels(&with_tls_mode(&w.labels, &w.service_account)),
                locality: shared.string(&w.locality),
                weight: w.weight.max(1),
                network: shared.string(&w.network),
                cluster: shared.string(""),
                service_account: shared.string(&w.service_account),
                workload: shared.string(workload),
                health: if labelled_draining(&w.labels) {
                    Health::Draining
                } else {
                    Health::Unknown
                },
            })
            .collect();
        spec.hosts
            .iter()
            .map(|hostname| Service {
                hostname: hostname.clone(),
                namespace: se.meta.namespace.clone(),
                addresses: spec.addresses.clone(),
                ports: ports.clone(),
                resolution,
                external: spec.location == Location::MeshExternal,
                export_to: spec.export_to.clone(),
                endpoints: endpoints.clone(),
                kubernetes: false,
                external_name: None,
                subject_alt_names: spec.subject_alt_names.clone(),
                persistent_session: PersistentSession::of(&se.meta.labels),
                traffic_distribution: None,
                created: se.meta.created,
                revision,
                source: Key {
                    kind: Kind::ServiceEntry,
                    namespace: se.meta.namespace.clone(),
                    name: se.meta.name.clone(),
                },
            })
            .collect()
    }
}
