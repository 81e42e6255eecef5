# Sourced by the image builds (deploy/image/build.sh, e2e/images/build.sh): one way to turn a
# folder into a one-layer OCI image with umoci, without a daemon, a registry or a base image.
#
#   oci_image LAYOUT TAG ROOTFS CREATED_BY [umoci config flags...]
#
# The layer is made with GNU tar (umoci 0.4.7's `insert` writes a tar stream without its final
# padding and end-of-archive blocks, which strict readers refuse): owned by root like any scratch
# image's files, entries sorted and dated at the epoch, so the same files give the same layer.
# Writes LAYOUT (an OCI image layout) and LAYOUT.tar (the same as one archive, for `ctr images
# import`, `podman load -i`, `skopeo copy oci-archive:...`).
oci_image() {
  local layout=$1 tag=$2 rootfs=$3 created_by=$4
  shift 4
  command -v umoci >/dev/null || { echo "umoci is required (Debian package umoci)" >&2; return 1; }
  local layer
  layer=$(mktemp "${TMPDIR:-/tmp}/oci-layer.XXXXXX")
  rm -rf "$layout" "$layout.tar"
  (cd "$rootfs" && tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=ustar \
    -cf "$layer" -- *)
  umoci init --layout "$layout"
  umoci new --image "$layout:$tag"
  umoci raw add-layer --image "$layout:$tag" --history.created_by "$created_by" "$layer"
  umoci config --image "$layout:$tag" --os linux --architecture amd64 "$@" \
    --history.created_by "umoci config ($(basename "$0"))"
  umoci gc --layout "$layout"
  tar -C "$layout" -cf "$layout.tar" .
  rm -f "$layer"
}
