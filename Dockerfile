# syntax=docker/dockerfile:1
# The `splice` binary as a static (musl) executable in a distroless image, running as non-root.
#   docker build -t REGISTRY/splice:TAG .
# Not built in the development environment (no container engine there); see README.md.

ARG RUST_VERSION=1.95
FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
# ring (through rustls) compiles C: musl-gcc links it statically.
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
ARG TARGET=x86_64-unknown-linux-musl
RUN rustup target add "${TARGET}"
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p splice --target "${TARGET}" \
 && install -D -m 0755 "target/${TARGET}/release/splice" /out/splice

# No shell, no package manager; the `nonroot` user is 65532, as in deploy/deployment.yaml.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/splice /usr/local/bin/splice
USER 65532:65532
EXPOSE 8443 8080
ENTRYPOINT ["/usr/local/bin/splice"]
CMD ["run"]
