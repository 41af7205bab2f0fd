//! The names of SDS secrets, as istiod and its agent name them: what listeners and clusters ask
//! for and what the agent's credential store serves.

/// The workload's own certificate and key.
pub const WORKLOAD_CERTIFICATE: &str = "default";
/// The mesh root certificate(s), to verify peers.
pub const ROOT_CA: &str = "ROOTCA";
/// A Kubernetes Secret named by a `credentialName`: `kubernetes://<name>` (the bare name means
/// the same).
pub const KUBERNETES_PREFIX: &str = "kubernetes://";
/// Certificates mounted in the pod: `file-cert:<certificate>~<key>` and `file-root:<ca>`.
pub const FILE_CERT_PREFIX: &str = "file-cert:";
pub const FILE_ROOT_PREFIX: &str = "file-root:";
/// `file-root:` of the system's root certificates (whichever bundle the host has).
pub const SYSTEM_ROOTS: &str = "system";
/// The CA certificate of a credential: `<credential>-cacert`.
pub const CA_SUFFIX: &str = "-cacert";
/// A CA bundle of a Kubernetes ConfigMap named by a `credentialName`: `configmap://<ns>/<name>`
/// (not served by the agent).
pub const CONFIG_MAP_PREFIX: &str = "configmap://";
