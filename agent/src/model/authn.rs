//! PeerAuthentication (`security.istio.io`): the part inbound listeners depend on, the mutual TLS
//! mode per port, merged as istiod merges it.
//!
//! The mesh-wide policy (root namespace, no selector) is overridden by the namespace's (no
//! selector), then by a workload policy (a selector matching the proxy's labels, outside the root
//! namespace); within one level the oldest policy wins; an unset mode inherits the level above.
//! A workload policy's port-level modes override the result per port. Without any policy the mode
//! is `PERMISSIVE`.

use std::collections::BTreeMap;

use pasa_proto::istio::peer_authentication::{PeerAuthentication, PeerMode};

use super::registry::{Config, selects};

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
