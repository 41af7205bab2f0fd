//! Who may read what. The single place where a subscriber's identity is turned into a decision.
//!
//! Today the store API is not yet secured with mTLS, so the only identity is what the subscriber
//! claims: its node ID and metadata. Claims are checked for form and logged, and every read is
//! allowed. When the API is secured, this function receives the verified SPIFFE identity of the
//! connection and limits the namespaces a subscription may read to what that identity allows,
//! never trusting the claim.

use pasa_proto::node::NodeId;
use pasa_proto::store::v1::SubscriberIdentity;

use crate::selector::Selector;

/// Why a subscriber may not watch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    #[error("identity.node_id: {0}")]
    BadNodeId(#[from] pasa_proto::node::NodeIdError),
}

/// Decides whether `identity` may watch what `selector` selects. An empty node ID stands for an
/// operator tool (pasactl) rather than a proxy.
pub fn authorize(
    identity: Option<&SubscriberIdentity>,
    _selector: &Selector,
) -> Result<(), AccessError> {
    if let Some(identity) = identity
        && !identity.node_id.is_empty()
    {
        NodeId::parse(&identity.node_id)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_are_checked_for_form() {
        let sel = Selector::everything();
        assert!(authorize(None, &sel).is_ok());
        let ok = SubscriberIdentity {
            node_id: "sidecar~10.0.0.1~a-1.default~default.svc.cluster.local".into(),
            ..Default::default()
        };
        assert!(authorize(Some(&ok), &sel).is_ok());
        let bad = SubscriberIdentity {
            node_id: "nonsense".into(),
            ..Default::default()
        };
        let err = authorize(Some(&bad), &sel).unwrap_err();
        assert!(
            err.to_string().starts_with("identity.node_id: node ID"),
            "{err}"
        );
    }
}
