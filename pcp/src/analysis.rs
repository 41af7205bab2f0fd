//! Cross-resource checks that istiod reports as warnings, not errors (as `istioctl analyze`
//! would flag them): references to subsets and gateways that no resource defines.

use pasa_proto::Object;
use pasa_proto::store::v1::Subscription;

use crate::validation::Problem;

/// Warnings for the batch's objects (by document index), given the objects already stored.
pub fn analyze(_batch: &[(usize, &Object)], _existing: &[Object]) -> Vec<(usize, Problem)> {
    Vec::new()
}

/// What to read from the store to analyze a batch; `None` when nothing in it refers elsewhere.
pub fn lookups(_batch: &[&Object]) -> Option<Subscription> {
    None
}
