//! `pasa-pcp --mesh-config FILE` publishes Istio's mesh config into the store, as the
//! `MeshConfig` `mesh` of the root namespace, for the agents; a file that cannot be read stops
//! PCP at start, naming it.

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
    pcp.terminate();

    // A file that is not a mapping stops PCP at start, naming the file.
    std::fs::write(&file, "- just\n- a list\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pasa-pcp"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--data-dir",
        ])
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
