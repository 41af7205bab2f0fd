//! `pasa-pcp --mesh-config FILE` publishes Istio's mesh config into the store, as the
//! `MeshConfig` `mesh` of the root namespace, for the agents; a file that cannot be read stops
//! PCP at start, naming it. What a file published belongs to the flag: a PCP restarted without
//! it removes it, and leaves one applied by hand alone.

mod common;

use common::{Pcp, WAIT};

#[test]
fn the_mesh_config_file_is_published_for_the_agents() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mesh");
    std::fs::write(
        &file,
        "trustDomain: example.org\nextensionProviders:\n- name: opa\n  envoyExtAuthzGrpc:\n    service: opa.opa.svc.cluster.local\n    port: 9191\naccessLogFile: /dev/stdout\n",
    )
    .unwrap();
    let pcp = Pcp::start_with(
        &dir.path().join("data"),
        &["--mesh-config", file.to_str().unwrap()],
    );
    let deadline = std::time::Instant::now() + WAIT;
    let yaml = loop {
        let out = pcp.ctl(&["get", "mesh", "mesh", "-n", "istio-system", "-o", "yaml"]);
        if out.status.success() {
            break String::from_utf8(out.stdout).unwrap();
        }
        assert!(std::time::Instant::now() < deadline, "never published");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    for expected in [
        "trustDomain: example.org",
        "name: opa",
        "port: 9191",
        "accessLogFile: /dev/stdout",
    ] {
        assert!(yaml.contains(expected), "{expected} missing from\n{yaml}");
    }
    assert!(yaml.contains("pasa.io/mesh-config-file"), "{yaml}");
    pcp.terminate();

    // Restarted without the flag: what the file published is gone by the time PCP serves.
    let pcp = Pcp::start(&dir.path().join("data"));
    let out = pcp.ctl(&["get", "mesh", "mesh", "-n", "istio-system", "-o", "yaml"]);
    assert!(
        !out.status.success(),
        "the published mesh config stayed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    // One applied by hand is the user's: a restart leaves it.
    let by_hand = dir.path().join("by-hand.yaml");
    std::fs::write(
        &by_hand,
        "apiVersion: pasa.io/v1alpha1\nkind: MeshConfig\nmetadata: {name: mesh, namespace: istio-system}\nspec: {trustDomain: hand.example}\n",
    )
    .unwrap();
    pcp.ok(&["apply", "-f", by_hand.to_str().unwrap()]);
    pcp.terminate();
    let pcp = Pcp::start(&dir.path().join("data"));
    // PCP decides which mesh config is in effect before its API answers.
    let yaml = pcp.ok(&["get", "mesh", "mesh", "-n", "istio-system", "-o", "yaml"]);
    assert!(yaml.contains("trustDomain: hand.example"), "{yaml}");
    pcp.terminate();

    // A file that is not a mapping stops PCP at start, naming the file.
    std::fs::write(&file, "- just\n- a list\n").unwrap();
    let out = common::pcp_command()
        .arg("--data-dir")
        .arg(dir.path().join("data2"))
        .arg("--mesh-config")
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("--mesh-config") && said.contains("not a mapping"),
        "{said}"
    );
}
