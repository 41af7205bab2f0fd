//! `pasactl` on its own, with no server: validating files offline, and the error when the
//! server is unreachable. (Its commands against a real control plane and agents are tested
//! beside those, in pcp's tests.)

use std::path::PathBuf;
use std::process::Command;

fn examples() -> PathBuf {
    pasa_testing::workspace_root().join("examples")
}

#[test]
fn unreachable_server_is_explained() {
    let out = Command::new(env!("CARGO_BIN_EXE_pasactl"))
        .args(["--server", "127.0.0.1:1", "status"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot reach the store at 127.0.0.1:1: transport error: "),
        "{err}"
    );
    // Why, said once: not only tonic's "transport error".
    assert_eq!(
        err.to_lowercase().matches("connection refused").count(),
        1,
        "{err}"
    );
    assert!(err.contains("is pasa-pcp running?"), "{err}");
}

/// An OS error is said once, although the error that carries it also prints it.
#[test]
fn an_unreadable_file_is_explained_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.yaml");
    let out = Command::new(env!("CARGO_BIN_EXE_pasactl"))
        .args(["--server", "127.0.0.1:1", "apply", "-f"])
        .arg(&missing)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("cannot read {}", missing.display())),
        "{err}"
    );
    assert_eq!(err.matches("(os error 2)").count(), 1, "{err}");
}

/// Logs read by a program (a pipe here) carry no colour codes; a terminal would get them
/// unless NO_COLOR is set.
#[test]
fn logs_to_a_pipe_are_plain_text() {
    let out = Command::new(env!("CARGO_BIN_EXE_pasactl"))
        .args(["--server", "127.0.0.1:1", "status"])
        .env("RUST_LOG", "debug")
        .env_remove("NO_COLOR")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("DEBUG"), "a debug log line to look at: {err}");
    assert!(!err.contains('\x1b'), "colour codes in a pipe: {err:?}");
}

#[test]
fn validate_offline() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_pasactl"))
            // No server runs at this address: validate must not need one.
            .args(["--server", "127.0.0.1:1", "validate"])
            .args(args)
            .output()
            .expect("run pasactl")
    };
    let shop = examples().join("shop");
    let out = run(&["-f", shop.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("9 document(s) valid"));
    // The README's first example validates without a warning: a new user's first command.
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!said.contains("Warning"), "examples/shop: {said}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("valid, 0 warning(s)"),
        "examples/shop: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    // The mesh the real-Envoy tests serve, as the README applies it.
    let envoy = examples().join("envoy");
    let out = run(&["-f", envoy.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "examples/envoy: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let broken = examples().join("broken.yaml");
    let out = run(&["-f", broken.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    for expected in [
        "error: ",
        "broken.yaml document 1 (virtualservice/shop/Not_A_DNS_Name): metadata.name:",
        "broken.yaml document 3 (destinationrule/shop/cart): apiVersion:",
        "broken.yaml document 4 (virtualservice/shop/split): spec.http[0].route[1].weight:",
        "broken.yaml document 5 (destinationrule/shop/cart-pool): spec.trafficPolicy.loadBalancer.simple:",
    ] {
        assert!(err.contains(expected), "missing {expected:?} in:\n{err}");
    }
    assert!(
        !err.contains("document 2 "),
        "the good document has no problem: {err}"
    );
    assert!(
        !err.contains("route[0].weight"),
        "weights are relative; 110 is fine: {err}"
    );
    // Totals worded as apply words them.
    assert!(
        err.contains("error: 4 error(s), 2 warning(s) in 5 document(s)"),
        "{err}"
    );

    // -n that differs from the namespace the documents name is refused, as by apply.
    let out = run(&["-n", "other", "-f", shop.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("document 1: metadata.namespace is \"shop\", but -n is \"other\"")
            && err.contains("drop -n"),
        "{err}"
    );
    assert!(
        run(&["-n", "shop", "-f", shop.to_str().unwrap()])
            .status
            .success()
    );

    // Warnings alone do not fail validation.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("vs.yaml");
    std::fs::write(
        &file,
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: r, namespace: ns}\n\
         spec: {hosts: [r], http: [{route: [{destination: {host: r, subset: v1}}]}]}\n",
    )
    .unwrap();
    let out = run(&["-f", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Warning: ") && err.contains("spec.http[0].route[0].destination.subset"),
        "{err}"
    );
}
