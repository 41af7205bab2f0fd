# pasa-agent: the per-pod agent. It serves Envoy's xDS over a Unix socket and, in the standalone
# injection mode, runs Envoy itself (--envoy), so the image carries Envoy's own release binary.
# Built from the repository root: docker build -f deploy/docker/pasa-agent.Dockerfile -t pasa-agent:0.1.0 .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# The dist profile (fat LTO, one codegen unit): smaller text in every pod.
RUN cargo build --profile dist --locked -p pasa-agent --bin pasa-agent

FROM envoyproxy/envoy:distroless-v1.40.0 AS envoy

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=envoy /usr/local/bin/envoy /usr/local/bin/envoy
COPY --from=build /src/target/dist/pasa-agent /usr/local/bin/pasa-agent
ENTRYPOINT ["/usr/local/bin/pasa-agent"]
