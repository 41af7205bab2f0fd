# pasa-pcp: the control plane (validating webhook, validated writes, the embedded store).
# Built from the repository root: docker build -f deploy/docker/pasa-pcp.Dockerfile -t pasa-pcp:0.1.0 .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p pasa-pcp --bin pasa-pcp

# glibc (the binaries are dynamically linked against it) and nothing else; runs as uid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/pasa-pcp /usr/local/bin/pasa-pcp
ENTRYPOINT ["/usr/local/bin/pasa-pcp"]
