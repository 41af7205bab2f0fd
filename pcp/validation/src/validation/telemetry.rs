//! Validation of `telemetry` (in progress).

use pasa_proto::Object;

use super::Report;

/// Checks one object.
pub fn validate(_obj: &Object, _report: &mut Report) {}
