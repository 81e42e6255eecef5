#!/usr/bin/env bash
# `make image-test`: checks the image `make image` built, then runs it under a real OCI runtime
# (Debian's runc; the image is unpacked into a runtime bundle by umoci, no daemon involved):
#   1. the config: user 65532:65532, entrypoint /usr/local/bin/splice, one layer holding only
#      that binary, statically linked;
#   2. `splice --version` in the container, root filesystem read-only;
#   3. `splice webhook` in the container (read-only root, the host's network) answers one
#      AdmissionReview over TLS on 127.0.0.1 with the policy's patch.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${SPLICE_IMAGE_DIR:-$root/target/image}
for tool in umoci runc jq openssl curl; do
  command -v "$tool" >/dev/null || { echo "$tool is required (make image-test; see .ci/run)" >&2; exit 1; }
done
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -1)
layout="$out/oci"
[ -f "$layout/index.json" ] || { echo "no image in $layout: run make image" >&2; exit 1; }

failed=0
fail() { echo "FAIL: $*" >&2; failed=1; }
blob() { echo "$layout/blobs/${1%%:*}/${1#*:}"; }

# 1. The image's manifest, config and layer, read from the layout's blobs.
manifest=$(jq -r --arg t "$version" \
  '.manifests[] | select(.annotations["org.opencontainers.image.ref.name"] == $t) | .digest' \
  "$layout/index.json")
[ -n "$manifest" ] || { echo "FAIL: no tag $version in $layout/index.json" >&2; exit 1; }
config=$(blob "$(jq -r .config.digest "$(blob "$manifest")")")
[ "$(jq -r .config.User "$config")" = 65532:65532 ] || fail "user is $(jq -c .config.User "$config"), not 65532:65532"
[ "$(jq -c .config.Entrypoint "$config")" = '["/usr/local/bin/splice"]' ] ||
  fail "entrypoint is $(jq -c .config.Entrypoint "$config")"
[ "$(jq -c .config.Cmd "$config")" = '["run"]' ] || fail "cmd is $(jq -c .config.Cmd "$config")"
[ "$(jq -r '.os + "/" + .architecture' "$config")" = linux/amd64 ] || fail "platform is not linux/amd64"
layers=$(jq -r '.layers[].digest' "$(blob "$manifest")")
[ "$(wc -l <<<"$layers")" = 1 ] || fail "$(wc -l <<<"$layers") layers, expected 1"
# A complete tar stream (tar fails on a truncated one) holding the binary and its folders only.
if listing=$(tar -tzf "$(blob "$(head -1 <<<"$layers")")" 2>&1); then
  [ "$(echo $listing)" = "usr/ usr/local/ usr/local/bin/ usr/local/bin/splice" ] ||
    fail "the layer holds more or less than the binary: $(echo $listing)"
else
  fail "the layer is not a valid tar stream: $listing"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/splice-image-test.XXXXXX")
containers=()
cleanup() {
  for c in "${containers[@]}"; do runc delete --force "$c" >/dev/null 2>&1 || true; done
  rm -rf "$work"
}
trap cleanup EXIT
bundle="$work/bundle"
umoci unpack --image "$layout:$version" "$bundle" >/dev/null
# No PT_INTERP: nothing to load from the (absent) /lib.
if readelf -l "$bundle/rootfs/usr/local/bin/splice" | grep -q 'program interpreter'; then
  fail "the binary is dynamically linked: $(readelf -l "$bundle/rootfs/usr/local/bin/splice" | grep interpreter)"
fi

# A runtime config from the image's: root read-only, and a process we choose.
#   spec FILTER...: writes $bundle/config.json from the unpacked one through jq.
cp "$bundle/config.json" "$work/image-config.json"
spec() { jq "$@" "$work/image-config.json" >"$bundle/config.json"; }
readonly_root='.root.readonly = true | .process.terminal = false'
[ "$(jq -c '[.process.user.uid, .process.user.gid]' "$work/image-config.json")" = '[65532,65532]' ] ||
  fail "the runtime config does not run as 65532: $(jq -c .process.user "$work/image-config.json")"

# 2. --version
spec "$readonly_root | .process.args = [\"/usr/local/bin/splice\", \"--version\"]"
name="splice-image-test-$$-version"
containers+=("$name")
got=$(runc run --bundle "$bundle" "$name" </dev/null 2>&1) || fail "runc run --version failed: $got"
[ "$got" = "splice $version" ] && echo "ok: splice --version in the container: $got" ||
  fail "splice --version printed '$got', expected 'splice $version'"

# 3. splice webhook, with a throw-away certificate for 127.0.0.1 and a policy mounted read-only.
free_port() {
  local p
  for _ in $(seq 50); do
    p=$((20000 + RANDOM % 20000))
    ss -Htln "sport = :$p" | grep -q . || { echo "$p"; return; }
  done
  echo "no free port" >&2; return 1
}
port=$(free_port); admin=$(free_port)
mkdir -p "$work/config"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
  -subj /CN=splice-image-test -addext subjectAltName=IP:127.0.0.1 \
  -keyout "$work/config/tls.key" -out "$work/config/tls.crt" 2>/dev/null
cp "$root/webhook/testdata/policy-sidecar.yaml" "$work/config/policy.yaml"
# UID 65532 reads them through the bind mount (the key is this test's own, thrown away after).
chmod 0755 "$work" "$work/config"; chmod 0644 "$work/config"/*
spec "$readonly_root
  | .process.args = [\"/usr/local/bin/splice\", \"webhook\", \"--policy\", \"/config/policy.yaml\",
      \"--tls-cert\", \"/config/tls.crt\", \"--tls-key\", \"/config/tls.key\",
      \"--listen\", \"127.0.0.1:$port\", \"--admin-listen\", \"127.0.0.1:$admin\"]
  | .linux.namespaces |= map(select(.type != \"network\"))
  | .mounts += [{destination: \"/config\", type: \"bind\", source: \"$work/config\", options: [\"rbind\", \"ro\"]}]"
name="splice-image-test-$$-webhook"
containers+=("$name")
runc run --detach --bundle "$bundle" "$name" </dev/null >"$work/webhook.log" 2>&1 ||
  { fail "runc run webhook failed: $(cat "$work/webhook.log")"; exit 1; }
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null && break
  sleep 0.1
done
uid=00000000-0000-4000-8000-$(printf '%012d' $$)
review=$(jq -nc --arg uid "$uid" '{
  apiVersion: "admission.k8s.io/v1", kind: "AdmissionReview",
  request: {uid: $uid, kind: {group: "", version: "v1", kind: "Pod"},
    resource: {group: "", version: "v1", resource: "pods"}, namespace: "shop", operation: "CREATE",
    userInfo: {username: "image-test"}, dryRun: false,
    object: {apiVersion: "v1", kind: "Pod", metadata: {name: "web", namespace: "shop", labels: {app: "web"}},
      spec: {containers: [{name: "app", image: "registry.invalid/app:1"}]}}}}')
if answer=$(curl -sS --fail --cacert "$work/config/tls.crt" -H 'Content-Type: application/json' \
     --data-binary "$review" "https://127.0.0.1:$port/inject/mesh-proxy" 2>&1); then
  [ "$(jq -r .response.uid <<<"$answer")" = "$uid" ] || fail "the answer has another uid: $answer"
  [ "$(jq -r .response.allowed <<<"$answer")" = true ] || fail "the pod was not allowed: $answer"
  [ "$(jq -r .response.patchType <<<"$answer")" = JSONPatch ] || fail "no JSONPatch: $answer"
  patch=$(jq -r .response.patch <<<"$answer" | base64 -d)
  if jq -e 'map(select(.path == "/spec/initContainers")) | .[0].value | map(.name) == ["mesh-init", "mesh-proxy"]' \
       <<<"$patch" >/dev/null; then
    echo "ok: splice webhook in the container answered an AdmissionReview over TLS with the policy's patch"
  else
    fail "the patch does not inject mesh-init and mesh-proxy: $patch"
  fi
else
  fail "no answer from the webhook in the container: $answer; its log: $(cat "$work/webhook.log")"
fi

[ "$failed" = 0 ] && echo "image $layout:$version: all checks passed"
exit "$failed"
