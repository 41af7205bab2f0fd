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

    // The configurations of Istio's proxy's own filters and the TypedStruct wrappers of JSON
    // configurations, which Envoy's generated API lacks: types, and descriptors for printing
    // and reading them as protobuf JSON (`OUT_DIR/istio_proxy_descriptors.bin`).
    let proxy = [
        "istio/proxy/stats.proto",
        "istio/proxy/alpn.proto",
        "istio/proxy/metadata_exchange.proto",
        "udpa/type/v1/typed_struct.proto",
        "xds/type/v3/typed_struct.proto",
    ];
    for file in proxy {
        println!("cargo:rerun-if-changed={}", root.join(file).display());
    }
    let mut fds = protox::compile(proxy, [root])?;
    for f in &mut fds.file {
        f.source_code_info = None;
    }
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("istio_proxy_descriptors.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        // Encoded in key order: a resource's version is a digest of its encoding.
        .btree_map(".")
        .compile_fds(fds)?;
    Ok(())
}
