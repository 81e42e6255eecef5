#!/usr/bin/env bash
# Builds the `splice` binary every image ships, statically linked against musl (no libc to find
# at run time, so it runs on an empty base image), and installs it at OUT. `make image` and the
# Dockerfile both call this, so the two images carry the same build.
# Needs the Rust target (`rustup target add x86_64-unknown-linux-musl`) and musl-gcc (Debian's
# musl-tools), which compiles ring's C and assembly for that target.
# Usage: static-binary.sh OUT
set -euo pipefail
out=${1:?usage: static-binary.sh OUT}
root=$(cd "$(dirname "$0")/../.." && pwd)
target=x86_64-unknown-linux-musl
cd "$root"
cargo build --release --locked -p splice --target "$target"
install -D -m 0755 "${CARGO_TARGET_DIR:-$root/target}/$target/release/splice" "$out"
# The release profile keeps line tables for local profiling (123 MB); the image keeps the symbols
# (function names in a backtrace) and drops the rest (29 MB).
objcopy --strip-debug "$out"
