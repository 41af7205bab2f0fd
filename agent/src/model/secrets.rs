//! The names of SDS secrets, as istiod and its agent name them: what listeners and clusters ask
//! for and what the agent's credential store serves.

/// The workload's own certificate and key.
pub const WORKLOAD_CERTIFICATE: &str = "default";
/// The mesh root certificate(s), to verify peers.
pub const ROOT_CA: &str = "ROOTCA";
/// A Kubernetes Secret named by a `credentialName`: `kubernetes://<name>` (the bare name means
/// the same).
pub const KUBERNETES_PREFIX: &str = "kubernetes://";
/// The CA certificate of a credential: `<credential>-cacert`.
pub const CA_SUFFIX: &str = "-cacert";
