//! The workload's own certificate and the mesh root, from files mounted the way Istio names
//! them (`--cert-dir`): `cert-chain.pem` and `key.pem` (the workload certificate with its chain
//! and private key) and `root-cert.pem` (the trust root), as cert-manager's istio-csr, SPIRE or
//! a pilot-agent's output directory provide them. They are served over SDS as istiod's
//! translation names them: `default` (a `tls_certificate`) and `ROOTCA` (a `validation_context`),
//! the secrets every sidecar's mTLS listeners and `ISTIO_MUTUAL` clusters wait for.
//!
//! The private key is read from the pod's own files and sent only to the pod's own Envoy over
//! the agent's Unix socket; it never leaves the pod.

use std::collections::BTreeMap;
use std::path::Path;

use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;

use super::{CredentialError, ca_secret, read_file, tls_secret};
use crate::model::secrets::{ROOT_CA, WORKLOAD_CERTIFICATE as WORKLOAD_CERT};

/// The certificate chain's file.
pub const CERT_CHAIN: &str = "cert-chain.pem";
/// The private key's file.
pub const KEY: &str = "key.pem";
/// The root certificate's file.
pub const ROOT_CERT: &str = "root-cert.pem";

/// What the secrets are called in errors.
const NAME: &str = "workload certificate";

/// Reads `dir`: `default` from the chain and key, `ROOTCA` from the root. A missing root is an
/// error (without it no peer can be verified); so is a chain without its key.
pub fn load(dir: &Path) -> Result<BTreeMap<String, Secret>, CredentialError> {
    let read = |file: &str| read_file(NAME, dir, file);
    let incomplete = |present: &'static str, missing: &'static str| CredentialError::Incomplete {
        name: NAME.into(),
        path: dir.join(missing),
        present,
        missing,
    };
    let (chain, key, root) = (read(CERT_CHAIN)?, read(KEY)?, read(ROOT_CERT)?);
    let mut secrets = BTreeMap::new();
    match (chain, key) {
        (Some(chain), Some(key)) => {
            secrets.insert(
                WORKLOAD_CERT.to_string(),
                tls_secret(WORKLOAD_CERT.to_string(), chain, key),
            );
        }
        (Some(_), None) => return Err(incomplete(CERT_CHAIN, KEY)),
        (None, Some(_)) => return Err(incomplete(KEY, CERT_CHAIN)),
        (None, None) => {
            return Err(CredentialError::Incomplete {
                name: NAME.into(),
                path: dir.join(CERT_CHAIN),
                present: "no certificate",
                missing: CERT_CHAIN,
            });
        }
    }
    let Some(root) = root else {
        return Err(incomplete(CERT_CHAIN, ROOT_CERT));
    };
    secrets.insert(ROOT_CA.to_string(), ca_secret(ROOT_CA.to_string(), root));
    Ok(secrets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn istio_file_names_become_default_and_rootca() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(CERT_CHAIN), "CHAIN").unwrap();
        std::fs::write(dir.path().join(KEY), "KEY").unwrap();
        let e = load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("root-cert.pem is missing"), "{e}");
        std::fs::write(dir.path().join(ROOT_CERT), "ROOT").unwrap();
        let secrets = load(dir.path()).unwrap();
        assert_eq!(
            secrets.keys().collect::<Vec<_>>(),
            [&"ROOTCA".to_string(), &"default".to_string()]
        );
        std::fs::remove_file(dir.path().join(KEY)).unwrap();
        let e = load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("key.pem is missing"), "{e}");
    }
}
