//! Istio's Ingress conversion goldens (the conformance corpus, `translation/ingress/`): for each
//! case of its `cases.yaml`, the case's Ingresses go through the conversion PCP's syncer runs
//! (`pasa_kube::ingress`) with the settings under `defaults`, and the Gateways and
//! VirtualServices generated must equal the golden file's, matched by kind, namespace and name
//! and compared as data (list order inside an object kept). Prints the cases passed per file.
//!
//! The corpus lives beside the project (`../shared/conformance`, or `PASA_CONFORMANCE_DIR`);
//! without it the test says SKIPPED and passes (CI sets `PASA_CONFORMANCE_REQUIRED`).

use pasa_kube::ingress::{self, Ingress, Mode, Settings};
use pasa_testing::{conformance_dir, keyed_documents, matches_golden, yaml_docs};
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
        let ingresses: Vec<Ingress> = yaml_docs(&dir.join(case["input"].as_str().unwrap()))
            .into_iter()
            .map(|d| serde_json::from_value(d).expect("an Ingress"))
            .collect();
        let served: Vec<Ingress> = ingresses
            .into_iter()
            .filter(|i| ingress::served(&settings, i, |_| None))
            .collect();
        let got = keyed_documents(
            ingress::convert(&settings, &served, |_, _, _| None)
                .iter()
                .map(pasa_proto::Object::to_document),
        );
        let want = keyed_documents(yaml_docs(&dir.join(case["golden"].as_str().unwrap())));
        if matches_golden(case, &want, &got) {
            passed += 1;
        } else {
            failed += 1;
        }
    }
    println!("translation/ingress: {passed} passed, {failed} failed");
    assert_eq!(failed, 0);
    assert_eq!(passed, cases["cases"].as_array().unwrap().len());
}
