#!/usr/bin/env bash
# Builds the real node's own images as OCI archives, without a registry (make image-load imports
# them, e2e/controlplane/up.sh imports the pause image):
#   pause.tar    the sandbox image, imported as localhost/splice-pause:e2e
#   testapp.tar  the tests' application, imported as splice-testapp:e2e (see testapp/main.go)
#   testapp-v2.tar  the same program with one more file (/VERSION), so another digest and image
#                ID: imported as splice-testapp:e2e-v2, the in-place rollout's new image
#   agnhost.tar  the upstream e2e image's binary from the control plane's cache, for
#                bench-admission's in-cluster arm, imported as splice-agnhost:e2e
# Usage: build.sh [OUT_DIR]   (default target/image/e2e); prints OUT_DIR.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-${SPLICE_IMAGE_DIR:-$root/target/image}/e2e}
# shellcheck source=../../deploy/image/oci-layout.sh
source "$root/deploy/image/oci-layout.sh"
mkdir -p "$out"
work=$(mktemp -d "${TMPDIR:-/tmp}/splice-e2e-images.XXXXXX")
trap 'rm -rf "$work"' EXIT

# image NAME BINARY ENTRYPOINT USER [TAG [VERSION]]: one static binary at ENTRYPOINT in an image of
# its own, tagged TAG (default e2e); with VERSION, a /VERSION file holding it.
image() {
  local name=$1 binary=$2 entrypoint=$3 user=$4 tag=${5:-e2e} version=${6:-}
  install -D -m 0755 "$binary" "$work/$name/rootfs$entrypoint"
  if [ -n "$version" ]; then
    echo "$version" > "$work/$name/rootfs/VERSION"
  fi
  oci_image "$work/$name/oci" "$tag" "$work/$name/rootfs" "e2e/images/build.sh ($name)" \
    --config.user "$user" --config.entrypoint "$entrypoint" >/dev/null
  mv "$work/$name/oci.tar" "$out/$name.tar"
}

for cmd in pause testapp; do
  (cd "$here" && CGO_ENABLED=0 GOTOOLCHAIN=local go build -trimpath -ldflags "-s -w" \
    -o "$work/bin/$cmd" "./$cmd")
done
image pause "$work/bin/pause" /pause 65535:65535
image testapp "$work/bin/testapp" /testapp 65532:65532
image testapp-v2 "$work/bin/testapp" /testapp 65532:65532 e2e-v2 v2
agnhost="$("$root/e2e/controlplane/build.sh" --print-bin-dir)/agnhost"
if [ -x "$agnhost" ]; then
  image agnhost "$agnhost" /agnhost 65532:65532
fi
echo "$out"
