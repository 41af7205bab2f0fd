//! With the `fake` feature, generates the PD and TiKV services from the `.proto` files that the
//! `tikv-client` crate ships (found through `cargo metadata`), with protox, so no system `protoc`
//! is needed. The client side needs nothing generated: tikv-client brings its own.

use std::path::PathBuf;
use std::process::Command;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_FAKE").is_none() {
        return Ok(());
    }
    let root = tikv_client_protos()?;
    let files = ["pdpb.proto", "tikvpb.proto"];
    for file in files {
        println!("cargo:rerun-if-changed={}", root.join(file).display());
    }
    let fds = protox::compile(files, [root.clone(), root.join("include")])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        // Only a handful of the services' calls are answered; the rest say "unimplemented".
        .generate_default_stubs(true)
        .compile_fds(fds)?;
    Ok(())
}

/// The `proto/` folder of the tikv-client package this build resolved.
fn tikv_client_protos() -> Result<PathBuf, Box<dyn std::error::Error>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("Cargo.toml");
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
            "--manifest-path",
        ])
        .arg(&manifest)
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let packages = meta["packages"]
        .as_array()
        .ok_or("cargo metadata: no packages")?;
    let tikv = packages
        .iter()
        .find(|p| p["name"] == "tikv-client")
        .ok_or("cargo metadata does not list tikv-client")?;
    let manifest_path = tikv["manifest_path"]
        .as_str()
        .ok_or("tikv-client has no manifest_path")?;
    let dir = PathBuf::from(manifest_path)
        .parent()
        .ok_or("tikv-client's manifest has no folder")?
        .join("proto");
    if !dir.join("tikvpb.proto").exists() {
        return Err(format!("{} has no tikvpb.proto", dir.display()).into());
    }
    Ok(dir)
}
