//! Istio's Ingress conversion goldens (the conformance corpus, `translation/ingress/`): for each
//! case of its `cases.yaml`, the case's Ingresses go through the conversion PCP's syncer runs
//! (`pasa_proto::ingress`) with the settings under `defaults`, and the Gateways and
//! VirtualServices generated must equal the golden file's, matched by kind, namespace and name
//! and compared as data (list order inside an object kept). Prints the cases passed per file.
//!
//! The corpus lives beside the project (`../shared/conformance`, or `PASA_CONFORMANCE_DIR`);
//! without it the test says SKIPPED and passes (CI sets `PASA_CONFORMANCE_REQUIRED`).

use std::collections::BTreeMap;

use pasa_proto::ingress::{self, Ingress, Mode, Settings};
use pasa_testing::{conformance_dir, yaml_docs};
use serde_json::Value;

/// Every case must pass: there is no skip list.
#[test]
fn ingress_conversion_matches_istios_goldens() {
    let Some(corpus) = conformance_dir("translation/ingress") else {
        return;
    };
    let dir = corpus.join("translation/ingress");
    let cases = &yaml_docs(&dir.join("cases.yaml"))[0];
    let defaults = &cases["defaults"];
    let mesh = defaults["mesh_config"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let mut settings = Settings::from_mesh(
        &mesh,
        defaults["ingress_namespace"]
            .as_str()
            .expect("ingress_namespace"),
    );
    settings.domain_suffix = defaults["domain_suffix"].as_str().unwrap().to_string();
    // The corpus's mesh config sets only the mode: class, selector and service are empty.
    settings.class = mesh
        .get("ingressClass")
        .and_then(Value::as_str)
        .unwrap_or("")
        .into();
    settings.service = mesh
        .get("ingressService")
        .and_then(Value::as_str)
        .unwrap_or("")
        .into();
    assert_eq!(settings.mode, Mode::Default);
    let (mut passed, mut failed) = (0, 0);
    for case in cases["cases"].as_array().expect("cases") {
        let name = case["name"].as_str().unwrap();
        let ingresses: Vec<Ingress> = yaml_docs(&dir.join(case["input"].as_str().unwrap()))
            .into_iter()
            .map(|d| serde_json::from_value(d).expect("an Ingress"))
            .collect();
        let served: Vec<Ingress> = ingresses
            .into_iter()
            .filter(|i| ingress::served(&settings, i, |_| None))
            .collect();
        let got: BTreeMap<(String, String, String), Value> =
            ingress::convert(&settings, &served, |_, _, _| None)
                .into_iter()
                .map(|o| {
                    let key = (
                        o.kind.as_str().to_string(),
                        o.namespace.clone(),
                        o.name.clone(),
                    );
                    (key, o.to_document())
                })
                .collect();
        let want: BTreeMap<(String, String, String), Value> =
            yaml_docs(&dir.join(case["golden"].as_str().unwrap()))
                .into_iter()
                .map(|d| {
                    let key = (
                        d["kind"].as_str().unwrap().to_string(),
                        d["metadata"]["namespace"].as_str().unwrap().to_string(),
                        d["metadata"]["name"].as_str().unwrap().to_string(),
                    );
                    (key, d)
                })
                .collect();
        let counts = case["golden_objects"].as_object().expect("golden_objects");
        for (kind, n) in counts {
            let have = want.keys().filter(|k| &k.0 == kind).count();
            assert_eq!(
                Some(have as u64),
                n.as_u64(),
                "{name}: the golden's {kind}s"
            );
        }
        if got == want {
            passed += 1;
        } else {
            failed += 1;
            for key in want.keys().chain(got.keys()) {
                if want.get(key) != got.get(key) {
                    println!(
                        "  FAIL {name} {key:?}:\n    want {}\n    got  {}",
                        want.get(key).map_or("nothing".into(), Value::to_string),
                        got.get(key).map_or("nothing".into(), Value::to_string)
                    );
                }
            }
        }
    }
    println!("translation/ingress: {passed} passed, {failed} failed");
    assert_eq!(failed, 0);
    assert_eq!(passed, cases["cases"].as_array().unwrap().len());
}
