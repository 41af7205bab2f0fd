//! PeerAuthentication (`security.istio.io`): the part inbound listeners depend on, the mutual TLS
//! mode per port, merged as istiod merges it.
//!
//! The mesh-wide policy (root namespace, no selector) is overridden by the namespace's (no
//! selector), then by a workload policy (a selector matching the proxy's labels, outside the root
//! namespace); within one level the oldest policy wins; an unset mode inherits the level above.
//! A workload policy's port-level modes override the result per port. Without any policy the mode
//! is `PERMISSIVE`.

use std::collections::BTreeMap;
use std::sync::Arc;

use pasa_istio::label_selector::selects;
use pasa_istio::peer_authentication::{PeerAuthentication, PeerMode};

use super::registry::{Config, Registry};

/// The effective mutual TLS mode of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MtlsMode {
    /// Plaintext only.
    Disable,
    /// Istio mutual TLS or plaintext.
    Permissive,
    /// Istio mutual TLS only.
    Strict,
}

/// A mode as written, as it applies; `None` inherits.
fn effective(mode: PeerMode) -> Option<MtlsMode> {
    match mode {
        PeerMode::Unset => None,
        PeerMode::Disable => Some(MtlsMode::Disable),
        PeerMode::Permissive => Some(MtlsMode::Permissive),
        PeerMode::Strict => Some(MtlsMode::Strict),
    }
}

/// The merged policy of one workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergedPolicy {
    pub mode: MtlsMode,
    pub per_port: BTreeMap<u32, MtlsMode>,
}

impl Default for MergedPolicy {
    fn default() -> Self {
        MergedPolicy {
            mode: MtlsMode::Permissive,
            per_port: BTreeMap::new(),
        }
    }
}

impl MergedPolicy {
    /// The mode of `port` (a target port of the workload).
    pub fn for_port(&self, port: u32) -> MtlsMode {
        self.per_port.get(&port).copied().unwrap_or(self.mode)
    }

    /// The policy of a proxy in `namespace` with `labels`, from every PeerAuthentication.
    pub fn compose<'p>(
        policies: impl Iterator<Item = &'p Config<PeerAuthentication>>,
        root_namespace: &str,
        namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> MergedPolicy {
        let mut mesh: Option<&Config<PeerAuthentication>> = None;
        let mut ns: Option<&Config<PeerAuthentication>> = None;
        let mut workload: Option<&Config<PeerAuthentication>> = None;
        let older = |slot: &Option<&Config<PeerAuthentication>>, c: &Config<PeerAuthentication>| {
            slot.is_none_or(|s| (c.meta.created, &c.meta.name) < (s.meta.created, &s.meta.name))
        };
        for p in policies {
            let selector = p
                .spec
                .selector
                .as_ref()
                .filter(|_| p.spec.selects_workloads());
            let slot = match selector {
                None if p.meta.namespace == root_namespace => Some(&mut mesh),
                None if p.meta.namespace == namespace => Some(&mut ns),
                Some(s)
                    if p.meta.namespace == namespace
                        && p.meta.namespace != root_namespace
                        && selects(&s.match_labels, labels) =>
                {
                    Some(&mut workload)
                }
                _ => None,
            };
            if let Some(slot) = slot
                && older(slot, p)
            {
                *slot = Some(p);
            }
        }
        let mut out = MergedPolicy::default();
        for level in [mesh, ns, workload].into_iter().flatten() {
            if let Some(mode) = level.spec.mtls.as_ref().and_then(|m| effective(m.mode)) {
                out.mode = mode;
            }
        }
        if let Some(w) = workload {
            for (port, mode) in w.spec.port_modes() {
                out.per_port
                    .insert(port, effective(mode).unwrap_or(out.mode));
            }
        }
        out
    }
}

/// What clients need of the PeerAuthentications of the workloads they send to: whether one
/// turns mutual TLS off for a port, so that a client's automatic mutual TLS sends it plaintext
/// instead (as istiod's endpoints say). Empty (and free to ask) unless some policy turns it off
/// somewhere; equal while the policies it holds are unchanged.
#[derive(Debug, Clone, Default)]
pub struct PeerModes {
    root_namespace: String,
    policies: Vec<Arc<Config<PeerAuthentication>>>,
}

impl PeerModes {
    /// From the registry's PeerAuthentications.
    pub fn of(registry: &Registry, root_namespace: &str) -> PeerModes {
        let disables = |p: &Config<PeerAuthentication>| {
            p.spec
                .mtls
                .as_ref()
                .is_some_and(|m| m.mode == PeerMode::Disable)
                || p.spec
                    .port_modes()
                    .any(|(_, mode)| mode == PeerMode::Disable)
        };
        if !registry.peer_authentications().any(disables) {
            return PeerModes::default();
        }
        PeerModes {
            root_namespace: root_namespace.to_string(),
            policies: registry.peer_authentication_configs().cloned().collect(),
        }
    }

    /// Whether a workload of `namespace` with `labels` takes only plaintext on `port`.
    pub fn disables(&self, namespace: &str, labels: &BTreeMap<String, String>, port: u32) -> bool {
        !self.policies.is_empty()
            && MergedPolicy::compose(
                self.policies.iter().map(Arc::as_ref),
                &self.root_namespace,
                namespace,
                labels,
            )
            .for_port(port)
                == MtlsMode::Disable
    }

    fn identity(&self) -> impl Iterator<Item = (&str, &str, u64)> {
        self.policies.iter().map(|p| {
            (
                p.meta.namespace.as_str(),
                p.meta.name.as_str(),
                p.meta.revision,
            )
        })
    }
}

impl PartialEq for PeerModes {
    fn eq(&self, other: &Self) -> bool {
        self.root_namespace == other.root_namespace && self.identity().eq(other.identity())
    }
}

impl Eq for PeerModes {}

impl std::hash::Hash for PeerModes {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.root_namespace.hash(state);
        for id in self.identity() {
            id.hash(state);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::PeerModes;
    use crate::cache::Cache;
    use crate::model::registry::Registry;

    fn modes(policies: &[(&str, &str, Value, u64)]) -> PeerModes {
        let resources = policies.iter().map(|(ns, name, spec, revision)| {
            let mut r =
                crate::testing::resource("PeerAuthentication", ns, name, spec.clone(), *revision);
            r.api_version = "security.istio.io/v1".into();
            r
        });
        let mut registry = Registry::default();
        registry.update(&Cache::from_resources(resources, 100), "cluster.local");
        PeerModes::of(&registry, "istio-system")
    }

    #[test]
    fn clients_learn_which_destination_ports_take_only_plaintext() {
        let labels = |app: &str| [("app".to_string(), app.to_string())].into();
        let strict = (
            "istio-system",
            "default",
            json!({"mtls": {"mode": "STRICT"}}),
            1,
        );
        // Nothing turns mutual TLS off: nothing to hold, nothing disabled.
        let none = modes(std::slice::from_ref(&strict));
        assert_eq!(none, PeerModes::default());
        assert!(!none.disables("shop", &labels("db"), 5432));
        let port = (
            "shop",
            "db",
            json!({"selector": {"matchLabels": {"app": "db"}},
                   "portLevelMtls": {"5432": {"mode": "DISABLE"}}}),
            2,
        );
        let some = modes(&[strict.clone(), port.clone()]);
        assert!(some.disables("shop", &labels("db"), 5432));
        assert!(!some.disables("shop", &labels("db"), 8080));
        assert!(!some.disables("shop", &labels("web"), 5432));
        assert!(!some.disables("other", &labels("db"), 5432));
        // A namespace's DISABLE, overridden for one workload.
        let namespace = ("shop", "default", json!({"mtls": {"mode": "DISABLE"}}), 3);
        let web = (
            "shop",
            "web",
            json!({"selector": {"matchLabels": {"app": "web"}}, "mtls": {"mode": "STRICT"}}),
            4,
        );
        let mixed = modes(&[strict, namespace, web]);
        assert!(mixed.disables("shop", &labels("db"), 80));
        assert!(!mixed.disables("shop", &labels("web"), 80));
        // Equal while the policies are; a change of one is a change.
        let mut changed = port.clone();
        changed.3 = 9;
        assert_eq!(
            some,
            modes(&[
                (
                    "istio-system",
                    "default",
                    json!({"mtls": {"mode": "STRICT"}}),
                    1
                ),
                port
            ])
        );
        assert_ne!(
            some,
            modes(&[
                (
                    "istio-system",
                    "default",
                    json!({"mtls": {"mode": "STRICT"}}),
                    1
                ),
                changed
            ])
        );
    }
}
