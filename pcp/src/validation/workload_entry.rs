//! Validation of `WorkloadEntry`, following istiod.

use pasa_proto::Object;

use super::Report;

/// Checks one WorkloadEntry.
pub fn validate(_obj: &Object, _report: &mut Report) {}
