//! Any bytes, read as YAML (or JSON) manifests, through admission: structure, Istio validation
//! and cross-resource analysis. Nothing may panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use pasa_pcp::{admission, manifest};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut docs = Vec::new();
    if manifest::parse_into("fuzz", text, &mut docs).is_err() {
        return;
    }
    let docs: Vec<Result<serde_json::Value, String>> =
        docs.into_iter().map(|(_, d)| Ok(d)).collect();
    let mut checked = admission::check_documents(&docs, "default");
    admission::analyze(&mut checked, &[], "cluster.local");
});
