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

/// The files a kustomization's `resources:` lists (one `- name` per line).
fn kustomized(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).expect("reading a kustomization");
    let mut listed = Vec::new();
    let mut in_resources = false;
    for line in text.lines() {
        if !line.starts_with([' ', '-']) {
            in_resources = line.trim_end() == "resources:";
        } else if in_resources && let Some(item) = line.trim_start().strip_prefix("- ") {
            listed.push(item.trim().to_string());
        }
    }
    listed
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
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if file.file_name().is_some_and(|n| n == "kustomization.yaml") {
            // Not a Kubernetes object (kustomize reads it): what it lists must be there.
            let missing = kustomized(file)
                .into_iter()
                .filter(|r| !file.parent().unwrap().join(r).exists())
                .collect::<Vec<_>>();
            if missing.is_empty() {
                println!("{shown}: lists only files that exist");
            } else {
                failed.push(format!("{shown}: lists missing files {missing:?}"));
            }
            continue;
        }
        // kubernetes-validate passes a kind it has no schema for with a warning: a misspelt
        // kind or group would slip through.
        if said.contains("Couldn't find schema") {
            println!("{shown}: INVALID");
            failed.push(format!(
                "{shown}: a kind Kubernetes has no schema for:\n{said}"
            ));
        } else if out.status.success() {
            println!("{shown}: valid");
        } else {
            println!("{shown}: INVALID");
            failed.push(format!("{shown}:\n{said}"));
        }
    }
    println!(
        "deploy/: {} of {} files valid",
        files.len() - failed.len(),
        files.len()
    );
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
