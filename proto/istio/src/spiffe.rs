//! SPIFFE identities as Istio writes them for workloads:
//! `spiffe://<trust domain>/ns/<namespace>/sa/<service account>`.

use std::fmt;

/// A workload's SPIFFE identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SpiffeId {
    pub trust_domain: String,
    pub namespace: String,
    pub service_account: String,
}

/// Text that is not a workload SPIFFE ID, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{input:?} is not a workload SPIFFE ID (spiffe://<trust domain>/ns/<namespace>/sa/<service account>): {reason}"
)]
pub struct SpiffeIdError {
    pub input: String,
    pub reason: &'static str,
}

impl SpiffeId {
    pub fn parse(input: &str) -> Result<SpiffeId, SpiffeIdError> {
        let err = |reason| SpiffeIdError {
            input: input.to_string(),
            reason,
        };
        let rest = input
            .strip_prefix("spiffe://")
            .ok_or_else(|| err("the scheme is not spiffe://"))?;
        let parts: Vec<&str> = rest.split('/').collect();
        let [trust_domain, "ns", namespace, "sa", service_account] = parts[..] else {
            return Err(err("the path is not /ns/<namespace>/sa/<service account>"));
        };
        if [trust_domain, namespace, service_account]
            .iter()
            .any(|p| p.is_empty())
        {
            return Err(err("a part is empty"));
        }
        Ok(SpiffeId {
            trust_domain: trust_domain.to_string(),
            namespace: namespace.to_string(),
            service_account: service_account.to_string(),
        })
    }
}

impl fmt::Display for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "spiffe://{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_ids_round_trip_and_others_are_refused() {
        let id = SpiffeId::parse("spiffe://cluster.local/ns/shop/sa/web").unwrap();
        assert_eq!(id.namespace, "shop");
        assert_eq!(id.service_account, "web");
        assert_eq!(id.to_string(), "spiffe://cluster.local/ns/shop/sa/web");
        for bad in [
            "https://cluster.local/ns/shop/sa/web",
            "spiffe://cluster.local/ns/shop",
            "spiffe://cluster.local/ns//sa/web",
            "spiffe://cluster.local/sa/web/ns/shop",
            "spiffe://cluster.local/ns/shop/sa/web/extra",
        ] {
            assert!(SpiffeId::parse(bad).is_err(), "{bad}");
        }
    }
}
