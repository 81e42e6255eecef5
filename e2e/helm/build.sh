#!/usr/bin/env bash
# Builds helm from the version pinned in go.mod into a cache outside the repository, keyed by that
# version, so a warm build is a no-op. Prints the binary's path. Usage: build.sh [--print-bin]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=$(cd "$here" && go list -m -f '{{.Version}}' helm.sh/helm/v4)
cache=${SPLICE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/splice}
bin="$cache/helm/helm-$version/helm"
if [ "${1:-}" = "--print-bin" ]; then echo "$bin"; exit 0; fi
if [ ! -x "$bin" ]; then
  mkdir -p "$(dirname "$bin")"
  echo "building helm $version" >&2
  start=$SECONDS
  # helm reports its version from this variable; without it `helm version` says v4-unknown.
  (cd "$here" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod go build -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$version" \
    -o "$bin.tmp" helm.sh/helm/v4/cmd/helm)
  mv "$bin.tmp" "$bin"
  echo "built helm in $((SECONDS - start))s" >&2
fi
echo "$bin"
