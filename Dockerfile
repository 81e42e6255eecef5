# syntax=docker/dockerfile:1
# The image `make image` builds without a daemon (deploy/image/build.sh), for those with a
# container engine and a registry: the same static (musl) binary, built by the same script, alone
# on an empty base, running as 65532 (as deploy/deployment.yaml expects).
#   docker build -t REGISTRY/splice:TAG .

ARG RUST_VERSION=1.95
FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
# ring (through rustls) compiles C: musl-gcc links it statically.
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
RUN rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    deploy/image/static-binary.sh /out/splice

# No shell, no libc, no /etc: the binary needs none (the API server's CA comes from the
# ServiceAccount's mounted ca.crt).
FROM scratch
COPY --from=build /out/splice /usr/local/bin/splice
USER 65532:65532
EXPOSE 8443 8080
ENTRYPOINT ["/usr/local/bin/splice"]
CMD ["run"]
