# pasactl: the command-line tool.
# Built from the repository root: docker build -f deploy/docker/pasactl.Dockerfile -t pasactl:0.1.0 .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p pasactl --bin pasactl

# glibc (the binaries are dynamically linked against it) and nothing else; runs as uid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/pasactl /usr/local/bin/pasactl
ENTRYPOINT ["/usr/local/bin/pasactl"]
