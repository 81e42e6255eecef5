#!/usr/bin/env bash
# What `make test` and `make demo` need beyond Rust and Go, checked and, where missing, installed:
# Debian packages (when root with apt-get; otherwise the missing ones are named) and the Rust
# pieces (rustfmt, clippy, the musl target) through rustup. Quiet when everything is there.
#   deps.sh [test|demo]   demo needs less: no promtool, no image tools beyond the real node's
set -euo pipefail
what=${1:-test}

# command package: one line each, the command that proves the package is there.
needs=(
  "openssl openssl" "curl curl" "ps procps" "ip iproute2" "setsid util-linux" "gcc gcc"
  "git git" "jq jq" "umoci umoci" "runc runc" "iptables iptables"
  "/usr/lib/cni/bridge containernetworking-plugins"
)
if [ "$what" = test ]; then
  # promtool (make rules-test) and the Prometheus of e2e/tests/prometheus.rs; musl-gcc for the
  # image's static binary.
  needs+=("promtool prometheus" "musl-gcc musl-tools")
fi

missing=()
for pair in "${needs[@]}"; do
  cmd=${pair% *} pkg=${pair#* }
  if [[ $cmd == /* ]]; then [ -e "$cmd" ] && continue; else command -v "$cmd" >/dev/null && continue; fi
  missing+=("$pkg")
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
  if [ "$what" = test ] && ! rustup target list --installed | grep -qx x86_64-unknown-linux-musl; then
    rustup target add x86_64-unknown-linux-musl >/dev/null
  fi
fi
