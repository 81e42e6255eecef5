#!/usr/bin/env bash
# Builds the control-plane programs into a cache outside the repository, keyed by the pinned
# versions, so a warm build is a no-op. Usage: build.sh [--print-bin-dir]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
k8s_version=$(cd "$here" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
etcd_version=$(cd "$here" && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
kwok_version=$(cd "$here/kwok" && go list -m -f '{{.Version}}' sigs.k8s.io/kwok)
containerd_version=$(cd "$here/containerd" && go list -m -f '{{.Version}}' github.com/containerd/containerd/v2)
cache=${SPLICE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/splice}
bin="$cache/controlplane/k8s-${k8s_version}_etcd-${etcd_version}_kwok-${kwok_version}_containerd-${containerd_version}/bin"
if [ "${1:-}" = "--print-bin-dir" ]; then echo "$bin"; exit 0; fi
mkdir -p "$bin"

export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod
minor=$(echo "$k8s_version" | cut -d. -f2)
# Without the stamp /version reports v0.0.0, which kube-rs and kwok both read.
vpkg=k8s.io/component-base/version
ldflags="-s -w -X $vpkg.gitVersion=$k8s_version -X $vpkg.gitMajor=1 -X $vpkg.gitMinor=$minor -X $vpkg.gitTreeState=clean"

build() { # name module-dir package [ldflags]
  local name=$1 dir=$2 pkg=$3 flags=${4:-}
  if [ -x "$bin/$name" ]; then return 0; fi
  echo "building $name ($pkg)"
  local start=$SECONDS
  (cd "$dir" && go build -trimpath -ldflags "$flags" -o "$bin/$name.tmp" "$pkg")
  mv "$bin/$name.tmp" "$bin/$name"
  echo "built $name in $((SECONDS - start))s"
}

build etcd "$here" go.etcd.io/etcd/server/v3 "-s -w"
build kube-apiserver "$here" k8s.io/kubernetes/cmd/kube-apiserver "$ldflags"
build kube-controller-manager "$here" k8s.io/kubernetes/cmd/kube-controller-manager "$ldflags"
build kube-scheduler "$here" k8s.io/kubernetes/cmd/kube-scheduler "$ldflags"
build kubectl "$here" k8s.io/kubernetes/cmd/kubectl "$ldflags"
build kubelet "$here" k8s.io/kubernetes/cmd/kubelet "$ldflags"
build agnhost "$here" k8s.io/kubernetes/test/images/agnhost "-s -w"
build kwok "$here/kwok" sigs.k8s.io/kwok/cmd/kwok "-s -w"
# The real node (up.sh): containerd 2 with its runc shim and ctr, and our CRI probe.
cflags="-s -w -X github.com/containerd/containerd/v2/version.Version=$containerd_version"
for c in containerd containerd-shim-runc-v2 ctr; do
  build "$c" "$here/containerd" "github.com/containerd/containerd/v2/cmd/$c" "$cflags"
done
build nodeprobe "$here" ./nodeprobe "-s -w"

# kwok ships its lifecycle stages as data in its module; gather the "fast" set (what kwokctl uses:
# nodes Ready at once, heartbeats through Leases, pods Running at once) into one config file.
if [ ! -s "$bin/kwok-stages.yaml" ]; then
  stages=$(cd "$here/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    echo "---"; cat "$stages/$f"
  done > "$bin/kwok-stages.yaml.tmp"
  mv "$bin/kwok-stages.yaml.tmp" "$bin/kwok-stages.yaml"
fi
echo "$bin"
