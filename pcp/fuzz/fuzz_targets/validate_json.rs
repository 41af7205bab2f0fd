//! Any bytes as one JSON document straight into admission (no YAML reader in front), so the
//! fuzzer spends its time in the validators. Nothing may panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use pasa_pcp::admission;

fuzz_target!(|data: &[u8]| {
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let mut checked = admission::check_documents(&[Ok(doc)], "default");
    admission::analyze(&mut checked, &[], "cluster.local");
});
