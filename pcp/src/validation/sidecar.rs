//! Validation of `Sidecar`, following istiod.

use pasa_proto::Object;

use super::Report;

/// Checks one Sidecar.
pub fn validate(_obj: &Object, _report: &mut Report) {}
