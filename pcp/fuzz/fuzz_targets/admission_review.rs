//! Any bytes as an AdmissionReview body: parsing, admission of the object it carries, and the
//! response built from the verdict. Nothing may panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use pasa_pcp::admission;
use pasa_pcp::webhook::review::{self, Verdict};

fuzz_target!(|data: &[u8]| {
    let Ok((version, request)) = review::parse(data) else {
        return;
    };
    let verdict = match &request.object {
        Some(object) => {
            let checked = admission::check_documents(&[Ok(object.clone())], &request.namespace);
            Verdict {
                allowed: checked.is_admitted(),
                message: checked.errors.iter().map(|e| e.message.clone()).collect(),
                warnings: checked.warnings.iter().map(|w| w.message.clone()).collect(),
            }
        }
        None => Verdict::default(),
    };
    let _ = review::response(&version, &request.uid, &verdict);
});
