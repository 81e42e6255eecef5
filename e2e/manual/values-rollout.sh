#!/usr/bin/env bash
# A check by hand, not part of make test: a `valuesFrom` ConfigMap edit restarts, through
# `spec.rollout`, the Deployments whose pods carry the old data (kwok nodes, no real node).
# Starts its own control plane (SPLICE_RUN_DIR /tmp/splice-values-rollout, port base 17740) and
# `target/debug/splice run` (cargo build -p splice first); prints the pods' data version before and
# after, the time to Complete, and each Deployment's revision.
set -uo pipefail
cd "$(dirname "$0")/../.."
export SPLICE_RUN_DIR=/tmp/splice-values-rollout SPLICE_PORT_BASE=17740 SPLICE_REAL_NODE=0
e2e/controlplane/up.sh >/dev/null || { echo "control plane did not start"; exit 1; }
export KUBECONFIG=$SPLICE_RUN_DIR/kubeconfig
K="$(e2e/controlplane/build.sh --print-bin-dir)/kubectl"
$K apply --server-side -f deploy/crd.yaml >/dev/null
$K wait --for condition=Established crd/injectionpolicies.splice.dev --timeout=60s >/dev/null
$K create ns splice-system >/dev/null
$K -n splice-system create configmap mesh --from-literal=version=v1 >/dev/null
$K create ns app >/dev/null; $K label ns app data-roll=on >/dev/null
target/debug/splice run --namespace splice-system --webhook-url https://127.0.0.1:17790 --listen 127.0.0.1:17790 \
  --admin-listen 127.0.0.1:17791 --policy-selector e2e.splice.dev/instance=manual > "$SPLICE_RUN_DIR/splice.log" 2>&1 &
pid=$!
trap 'kill $pid; e2e/controlplane/down.sh >/dev/null 2>&1' EXIT
cat <<'Y' | $K apply -f - >/dev/null
apiVersion: splice.dev/v1alpha1
kind: InjectionPolicy
metadata: {name: data-roll, labels: {e2e.splice.dev/instance: manual}}
spec:
  mode: Webhook
  namespaceSelector: {matchLabels: {data-roll: "on"}}
  valuesFrom:
    - name: version
      configMapKeyRef: {name: mesh, key: version}
  rollout: {maxConcurrent: 2, timeout: 2m}
  template:
    annotations: {mesh.example/version: "{{ values.version }}"}
Y
$K wait --for condition=Ready injectionpolicy/data-roll --timeout=120s
for i in 1 2 3; do
cat <<Y | $K apply -f - >/dev/null
apiVersion: apps/v1
kind: Deployment
metadata: {name: app-$i, namespace: app}
spec:
  replicas: 1
  selector: {matchLabels: {app: app-$i}}
  template:
    metadata: {labels: {app: app-$i}}
    spec:
      tolerations: [{operator: Exists}]
      containers: [{name: app, image: registry.invalid/app:1}]
Y
done
for i in 1 2 3; do $K -n app rollout status deploy/app-$i --timeout=120s >/dev/null || echo "app-$i not available"; done
show() { $K -n app get pods -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.annotations.mesh\.example/version} {.metadata.deletionTimestamp}{"\n"}{end}'; }
echo "--- before the data change"; show
$K get injectionpolicy data-roll -o jsonpath='{.status.rollout}{"\n"}'
t0=$(date +%s.%N)
$K -n splice-system patch configmap mesh -p '{"data":{"version":"v2"}}' >/dev/null
for s in $(seq 1 120); do
  n=$($K -n app get pods -o jsonpath='{range .items[*]}{.metadata.annotations.mesh\.example/version}{"\n"}{end}' | grep -c v2)
  phase=$($K get injectionpolicy data-roll -o jsonpath='{.status.rollout.phase}')
  total=$($K -n app get pods --no-headers | wc -l)
  if [ "$n" = 3 ] && [ "$total" = 3 ] && [ "$phase" = Complete ]; then break; fi
  sleep 1
done
echo "--- after $(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $t0}") s"; show
$K get injectionpolicy data-roll -o jsonpath='{.status.rollout}{"\n"}'
for i in 1 2 3; do echo "app-$i revision $($K -n app get deploy app-$i -o jsonpath='{.metadata.annotations.deployment\.kubernetes\.io/revision}') restartedFor $($K -n app get deploy app-$i -o jsonpath='{.spec.template.metadata.annotations.splice\.dev/restartedFor}')"; done
