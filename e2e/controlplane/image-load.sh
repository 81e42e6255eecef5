#!/usr/bin/env bash
# `make image-load`: imports into the real node's containerd, without a registry,
#   - Splice's image from `make image` (target/image/splice-VERSION.tar), under the reference the
#     chart's defaults name (image.repository:image.tag in deploy/chart/values.yaml);
#   - the pause image, and the tests' images (e2e/images): splice-testapp:e2e and :e2e-v2 (the
#     same program, another image ID), splice-agnhost:e2e.
# Each import is pinned (never garbage-collected) and checked through the CRI afterwards.
# Honours SPLICE_RUN_DIR and SPLICE_PORT_BASE like up.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=common.sh
source "$here/common.sh"
# shellcheck source=node.sh
source "$here/node.sh"
BIN_DIR=$("$here/build.sh" --print-bin-dir)
[ -f "$NODE_DIR/env" ] || die "no real node at $RUN_DIR: run 'make up' first (as root, without SPLICE_REAL_NODE=0)"
node_names
[ -S "$CONTAINERD_SOCKET" ] || die "the real node's containerd is not running ($CONTAINERD_SOCKET)"

values="$root/deploy/chart/values.yaml"
repository=$(sed -n '/^image:/,/^[^ ]/s/^  repository: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$values")
tag=$(sed -n '/^image:/,/^[^ ]/s/^  tag: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$values")
[ -n "$repository" ] && [ -n "$tag" ] || die "no image.repository/image.tag in $values"
# What a Deployment's `image: NAME:TAG` means without a registry host: Docker Hub's library.
case "$repository" in
  */*.*/*|*.*/*|localhost/*) ref_base=$repository ;;
  */*) ref_base="docker.io/$repository" ;;
  *) ref_base="docker.io/library/$repository" ;;
esac
archive="$root/target/image/splice-$tag.tar"
[ -f "$archive" ] || die "$archive is missing: run 'make image' (the chart names tag $tag)"

images=$("$root/e2e/images/build.sh")
node_import "$archive" "$ref_base"
node_import "$images/pause.tar" "${PAUSE_IMAGE%:*}"
node_import "$images/testapp.tar" docker.io/library/splice-testapp
node_import "$images/testapp-v2.tar" docker.io/library/splice-testapp
refs=("$ref_base:$tag" "$PAUSE_IMAGE" docker.io/library/splice-testapp:e2e
  docker.io/library/splice-testapp:e2e-v2)
if [ -f "$images/agnhost.tar" ]; then
  node_import "$images/agnhost.tar" docker.io/library/splice-agnhost
  refs+=(docker.io/library/splice-agnhost:e2e)
fi
"$BIN_DIR/nodeprobe" has-images "$CONTAINERD_SOCKET" "${refs[@]}"
