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
        Some(object) => review::verdict(&admission::check_documents(
            &[Ok(object.clone())],
            &request.namespace,
        )),
        None => Verdict::default(),
    };
    let _ = review::response(&version, &request.uid, &verdict);
});
