//! With the `fake` feature, generates the PD and TiKV services from the `.proto` files that the
//! `tikv-client` crate ships (found through `cargo metadata`, or `PASA_TIKV_PROTO_DIR`), with protox, so no system `protoc`
//! is needed. The client side needs nothing generated: tikv-client brings its own.

#[path = "../../proto/build_support/package_dir.rs"]
mod package_dir;

use std::path::PathBuf;

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
    Ok(package_dir::package_dir(
        "tikv-client",
        "PASA_TIKV_PROTO_DIR",
        |dir| Some(dir.join("proto")).filter(|p| p.join("tikvpb.proto").exists()),
    )?)
}
