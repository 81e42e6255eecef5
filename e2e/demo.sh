#!/usr/bin/env bash
# The main job, from nothing: build Splice, bring the local control plane up, install the CRD, run
# the operator outside the cluster, apply the example policy, and show a pod coming out injected.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cp="$root/e2e/controlplane"
source "$cp/common.sh"
BIN_DIR=$("$cp/build.sh" --print-bin-dir)
kubectl() { "$BIN_DIR/kubectl" --kubeconfig "$KUBECONFIG_PATH" "$@"; }
step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

step "Building splice"
(cd "$root" && cargo build -q -p splice)
splice="$root/target/debug/splice"

step "Control plane"
if [ -d "$RUN_DIR" ] && any_recorded_process_alive; then
  echo "already running from $RUN_DIR: reusing it"
else
  "$cp/up.sh"
fi
kubectl get nodes

step "Installing the InjectionPolicy CRD"
kubectl apply --server-side --force-conflicts --field-manager=splice-demo -f "$root/deploy/crd.yaml"
# kubectl wait fails at once, instead of waiting, while the new CRD has no status yet.
wait_for "the CRD to be established" 30 \
  kubectl wait --for=condition=Established crd/injectionpolicies.splice.dev --timeout=5s

step "Running the operator (splice run) outside the cluster"
kubectl create namespace splice-system --dry-run=client -o yaml | kubectl apply -f - >/dev/null
if [ -f "$RUN_DIR/pids/splice.pid" ] && kill -0 "$(cat "$RUN_DIR/pids/splice.pid")" 2>/dev/null; then
  echo "splice run is already running (pid $(cat "$RUN_DIR/pids/splice.pid"))"
else
  port=$((PORT_BASE + 30)) admin=$((PORT_BASE + 31))
  # The API server calls the webhook at this URL; the serving certificate carries its IP.
  KUBECONFIG="$KUBECONFIG_PATH" setsid "$splice" run --namespace splice-system \
    --webhook-url "https://127.0.0.1:$port" --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin" \
    > "$RUN_DIR/logs/splice.log" 2>&1 < /dev/null &
  echo $! > "$RUN_DIR/pids/splice.pid"
  wait_for "splice to be ready" 60 curl -fsS "http://127.0.0.1:$admin/readyz"
  echo "splice run is up (pid $(cat "$RUN_DIR/pids/splice.pid"), log $RUN_DIR/logs/splice.log)"
fi

step "Applying the example policy (examples/mesh-proxy.yaml)"
kubectl apply -f "$root/examples/mesh-proxy.yaml"
kubectl wait --for=condition=Ready ipol/mesh-proxy --timeout=60s
kubectl get ipol mesh-proxy
# Its templates only read values and the namespace's name, so under mode Auto it runs in-tree: a
# MutatingAdmissionPolicy and its binding, and no webhook configuration.
kubectl get mutatingadmissionpolicy,mutatingadmissionpolicybinding splice-mesh-proxy

step "Creating a pod in a namespace labelled mesh=enabled"
kubectl create namespace shop --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl label namespace shop mesh=enabled --overwrite >/dev/null
wait_for "the default ServiceAccount in shop" 30 kubectl -n shop get serviceaccount default
kubectl -n shop delete pod debug --ignore-not-found --wait=true >/dev/null
# The API server loads a new admission policy asynchronously: a server-side dry run shows when it
# is live, without creating anything.
injected() { kubectl -n shop create --dry-run=server -f "$root/examples/pod.yaml" -o jsonpath='{.spec.initContainers[*].name}' | grep -q mesh-proxy; }
wait_for "the injection to be live" 30 injected
kubectl -n shop create -f "$root/examples/pod.yaml"
kubectl -n shop wait --for=condition=Ready pod/debug --timeout=60s

step "The pod as the API server stored it"
kubectl -n shop get pod debug -o jsonpath='{"init containers: "}{.spec.initContainers[*].name}{"\ncontainers:      "}{.spec.containers[*].name}{"\nvolumes:         "}{.spec.volumes[*].name}{"\nsplice.dev/status: "}{.metadata.annotations.splice\.dev/status}{"\n"}'
kubectl -n shop get pod debug

step "The policy, verified end to end by the admission probe (a dry-run pod through the API server)"
kubectl wait --for=condition=Verified ipol/mesh-proxy --timeout=90s
kubectl get ipol mesh-proxy -o jsonpath='{range .status.conditions[?(@.type=="Verified")]}{.reason}: {.message}{"\n"}{end}'

cat <<MSG

Done. The control plane and splice run keep running:
  export KUBECONFIG=$KUBECONFIG_PATH
  $BIN_DIR/kubectl get ipol,mutatingadmissionpolicies,mutatingwebhookconfigurations
  $splice inject -p examples/mesh-proxy.yaml -f examples/deployment.yaml --namespace-label mesh=enabled
Clean up everything (control plane, splice run, state): make down
MSG
