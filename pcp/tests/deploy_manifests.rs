//! Every manifest in `deploy/` is a valid Kubernetes object: each YAML file is checked offline
//! against the Kubernetes 1.37 schemas by `kubernetes-validate --strict` (unknown fields are
//! errors), installed from `deploy/requirements.txt` (CI's `.ci/run` installs it). Without it the
//! test says loudly that it skipped, unless `PASA_E2E_REQUIRED` is set (as in CI), in which case
//! it fails.

use std::path::{Path, PathBuf};
use std::process::Command;

const FIX: &str = "pip install -r deploy/requirements.txt";

/// The YAML files under `dir`, sorted, at any depth.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("reading deploy/") {
            let path = entry.expect("a deploy/ entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

#[test]
fn every_deploy_manifest_matches_the_kubernetes_schemas() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let files = yaml_files(&deploy);
    assert!(
        !files.is_empty(),
        "no manifests found in {}",
        deploy.display()
    );
    if let Err(e) = Command::new("kubernetes-validate")
        .arg("--version")
        .output()
    {
        if std::env::var_os("PASA_E2E_REQUIRED").is_some() {
            panic!("kubernetes-validate is not installed ({e}); run `{FIX}`");
        }
        eprintln!(
            "SKIPPED: the deploy/ manifests were not validated: kubernetes-validate ({e}); run `{FIX}`"
        );
        return;
    }
    let mut failed = Vec::new();
    for file in &files {
        let out = Command::new("kubernetes-validate")
            .args(["--strict", "--quiet"])
            .arg(file)
            .output()
            .expect("running kubernetes-validate");
        let shown = file.strip_prefix(&deploy).unwrap_or(file).display();
        if out.status.success() {
            println!("{shown}: valid");
        } else {
            println!("{shown}: INVALID");
            failed.push(format!(
                "{shown}:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    println!(
        "deploy/: {} of {} files valid",
        files.len() - failed.len(),
        files.len()
    );
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
