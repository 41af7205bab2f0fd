# pasa-store: the store server without PCP.
# Built from the repository root: docker build -f deploy/docker/pasa-store.Dockerfile -t pasa-store:0.1.0 .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p pasa-store --bin pasa-store

# glibc (the binaries are dynamically linked against it) and nothing else; runs as uid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/pasa-store /usr/local/bin/pasa-store
ENTRYPOINT ["/usr/local/bin/pasa-store"]
