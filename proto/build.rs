//! Generates the store API and the client side of Istio's CA API from `proto/` with protox, so
//! no system `protoc` is needed.

use std::path::Path;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new("proto");
    let files = ["pasa/store/v1/store.proto", "istio/v1/auth/ca.proto"];
    for file in files {
        println!("cargo:rerun-if-changed={}", root.join(file).display());
    }
    let fds = protox::compile(files, [root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Written by hand, with a shared resource (see `src/event.rs`).
        .extern_path(".pasa.store.v1.Event", "crate::event::Event")
        .compile_fds(fds)?;
    Ok(())
}
