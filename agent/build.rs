//! Generates the server side of Envoy's ADS and SDS services from the shapes in `proto/` (with
//! protox, so no system `protoc` is needed): requests are envoy-types' messages, responses the
//! agent's own, which encode the snapshot's resources without copying them (`src/ads/wire.rs`).

use std::path::Path;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new("proto");
    let files = [
        "envoy/service/discovery/v3/ads.proto",
        "envoy/service/secret/v3/sds.proto",
    ];
    for file in files {
        println!("cargo:rerun-if-changed={}", root.join(file).display());
    }
    let fds = protox::compile(files, [root])?;
    let envoy = "::envoy_types::pb::envoy::service::discovery::v3";
    let mut config = tonic_prost_build::configure()
        .build_client(false)
        .build_server(true);
    for request in ["DiscoveryRequest", "DeltaDiscoveryRequest"] {
        config = config.extern_path(
            format!(".envoy.service.discovery.v3.{request}"),
            format!("{envoy}::{request}"),
        );
    }
    for response in ["DiscoveryResponse", "DeltaDiscoveryResponse"] {
        config = config.extern_path(
            format!(".envoy.service.discovery.v3.{response}"),
            format!("crate::ads::wire::{response}"),
        );
    }
    config.compile_fds(fds)?;
    Ok(())
}
