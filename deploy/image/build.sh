#!/usr/bin/env bash
# `make image`: the static `splice` binary in an OCI image, assembled with umoci (Debian package
# umoci): no container daemon, no registry, no base image to pull. The image holds one layer with
# /usr/local/bin/splice and nothing else (no shell, no libc, no /etc), runs as UID/GID 65532 and
# writes nothing to its root filesystem, so it runs with readOnlyRootFilesystem as
# deploy/deployment.yaml asks.
#
# Output (under target/image/, or $SPLICE_IMAGE_DIR):
#   oci/               an OCI image layout, tag = the workspace version
#   splice-VERSION.tar the same layout as one archive (`podman load -i`, `skopeo copy oci-archive:...`)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${SPLICE_IMAGE_DIR:-$root/target/image}
command -v umoci >/dev/null || { echo "umoci is required (Debian package umoci)" >&2; exit 1; }
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -1)
[ -n "$version" ] || { echo "no version in $root/Cargo.toml" >&2; exit 1; }

rm -rf "$out/rootfs" "$out/oci" "$out"/splice-*.tar
"$here/static-binary.sh" "$out/rootfs/usr/local/bin/splice"
# shellcheck source=oci-layout.sh
source "$here/oci-layout.sh"
oci_image "$out/oci" "$version" "$out/rootfs" \
  "deploy/image/static-binary.sh (cargo build --release --target x86_64-unknown-linux-musl)" \
  --config.user 65532:65532 \
  --config.entrypoint /usr/local/bin/splice \
  --config.cmd run \
  --config.exposedports 8443/tcp --config.exposedports 8080/tcp \
  --config.label org.opencontainers.image.title=splice \
  --config.label "org.opencontainers.image.version=$version"
mv "$out/oci.tar" "$out/splice-$version.tar"
rm -rf "$out/rootfs"
image="$out/oci:$version"
echo "built $image ($(du -h "$out/splice-$version.tar" | cut -f1)): $out/splice-$version.tar"
