#!/usr/bin/env bash
# What `make test`, `make demo` and the image targets need beyond Rust and Go, checked and, where
# missing, installed: Debian packages (when root with apt-get; otherwise the missing ones are
# named) and the Rust pieces (rustfmt, clippy, the musl target) through rustup. Quiet when
# everything is there.
#   deps.sh [test|demo|image]
#     test   everything `make test` runs
#     demo   less: no promtool, no image tools beyond the real node's
#     image  what `make image` and `make image-test` need (every target that builds the image
#            depends on it, so `make up image-load` works on a fresh machine after `make demo`)
set -euo pipefail
what=${1:-test}

# command package: one line each, the command that proves the package is there.
node=(
  "openssl openssl" "curl curl" "ps procps" "ip iproute2" "setsid util-linux" "gcc gcc"
  "git git" "jq jq" "umoci umoci" "runc runc" "iptables iptables"
  "/usr/lib/cni/bridge containernetworking-plugins"
)
# musl-gcc compiles ring's C for the static binary; objcopy strips it; umoci assembles the image;
# image-test runs it under runc, reads it with readelf and jq, and calls it with openssl and curl.
image=(
  "gcc gcc" "musl-gcc musl-tools" "objcopy binutils" "readelf binutils" "umoci umoci"
  "runc runc" "jq jq" "openssl openssl" "curl curl"
)
case $what in
  # promtool (make rules-test) and the Prometheus of e2e/tests/prometheus.rs.
  test) needs=("${node[@]}" "${image[@]}" "promtool prometheus") ;;
  demo) needs=("${node[@]}") ;;
  image) needs=("${image[@]}") ;;
  *) echo "usage: deps.sh [test|demo|image]" >&2; exit 2 ;;
esac

missing=()
for pair in "${needs[@]}"; do
  cmd=${pair% *} pkg=${pair#* }
  if [[ $cmd == /* ]]; then [ -e "$cmd" ] && continue; else command -v "$cmd" >/dev/null && continue; fi
  [[ " ${missing[*]} " == *" $pkg "* ]] || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing Debian packages: ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "error: missing Debian packages: ${missing[*]} (install them, or run as root with apt-get)" >&2
    exit 1
  fi
fi

if command -v rustup >/dev/null; then
  rustup component add rustfmt clippy >/dev/null 2>&1 || true
  if [ "$what" != demo ] && ! rustup target list --installed | grep -qx x86_64-unknown-linux-musl; then
    rustup target add x86_64-unknown-linux-musl >/dev/null
  fi
fi
