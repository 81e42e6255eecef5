#!/usr/bin/env bash
# `make bench-admission`: what one pod create pays for its mutating admission, measured through
# the API server (server-side dry-run creates, nothing stored) on a control plane of its own, into
# namespaces served by
#   none     nothing (the baseline),
#   pre, pre10  nothing, but the pod arrives already carrying splice's (pre) or splice10's (pre10)
#            sidecars: what the bigger pod alone costs the API server,
#   null     a webhook answering "allowed" with no patch (Splice's stack, `splice webhook
#            --null-handler`): the floor of any webhook,
#   null1, null10  the same stack answering a constant patch of 1 or 10 containers
#            (`/null/containers/<n>`): the floor of any webhook injecting that many,
#   splice   one InjectionPolicy of `splice run` in mode Webhook (a --release build unless
#            SPLICE_BIN is given),
#   splice-intree  the same policy in mode InTree: the MutatingAdmissionPolicy Splice writes,
#   splice10 ten InjectionPolicies selecting one namespace, each adding its own sidecar (one
#            shared webhook entry),
#   agnhost  agnhost's Go sidecar webhook (/mutating-pods-sidecar),
#   map      an in-tree MutatingAdmissionPolicy doing the same injection as splice,
#   map10    ten MutatingAdmissionPolicies doing what splice10 does,
#   splice-cluster   Splice installed by its chart on the real node (the image `make image`
#            built), called by the API server through its Service,
#   agnhost-cluster  agnhost as a pod on the real node behind a Service, called the same way
#            (both only with the real node; SPLICE_REAL_NODE=0 leaves them out),
# each (but none and null) adding the same sidecar container; the ten-arms nine more. admission.py interleaves the arms in rounds (sequential
# creates, then concurrent ones) and prints p50/p90/p99 per arm and what each adds over `none`.
#
# Environment: SPLICE_RUN_DIR (default ~/.cache/splice/bench-admission), SPLICE_PORT_BASE (default
# 16640), ROUNDS (5), SEQUENTIAL (100 creates per arm and round), CONCURRENT (8 clients),
# PER_CLIENT (25 creates each), SPLICE_BIN, OUT (also write the table there), SPLICE_BASELINE_BIN
# (another splice binary, e.g. a build of an earlier commit: measured as arm `splice-before` in the
# same run, so a change to the request path is compared side by side). With the real node also
# the load rows (e2e/bench/load.py, sent by e2e/src/bin/admission_load.rs): LOAD (1; 0 leaves them
# out), LOAD_CREATES (10000 creates a row), LOAD_CLIENTS ("32 128": one splice17, one agnhost
# and one floor row per client count, then fault rows at 32 with one Splice pod deleted mid-load).
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
export SPLICE_RUN_DIR=${SPLICE_RUN_DIR:-$HOME/.cache/splice/bench-admission}
export SPLICE_PORT_BASE=${SPLICE_PORT_BASE:-16640}
export KUBECONFIG=$SPLICE_RUN_DIR/kubeconfig
cp_dir="$repo/e2e/controlplane"
log() { echo "bench: $*" >&2; }

python3 -c 'import yaml' 2>/dev/null || { log "python3 with PyYAML is required (apt-get install python3-yaml)"; exit 1; }
command -v openssl >/dev/null || { log "openssl is required"; exit 1; }

# The null arm's server is Splice's own stack with the benchmark-only routes.
(cd "$repo" && cargo build -q --release -p splice --features bench-baselines)
NULL_BIN=${CARGO_TARGET_DIR:-$repo/target}/release/splice
SPLICE_BIN=${SPLICE_BIN:-$NULL_BIN}
"$cp_dir/build.sh" >/dev/null
bin_dir=$("$cp_dir/build.sh" --print-bin-dir)
kubectl="$bin_dir/kubectl"
source "$repo/e2e/bench/common.sh"

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  "$cp_dir/down.sh" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

bench_control_plane

# Splice: the admission probe is off so that only the measured creates reach the webhook.
port=$(free_port)
admin=$(free_port)
mkdir -p "$repo/target"
splice_log=$repo/target/bench-admission-splice.log
SPLICE_LOG=${SPLICE_LOG:-warn} "$SPLICE_BIN" run --namespace splice-system \
  --webhook-url "https://127.0.0.1:$port" --listen "127.0.0.1:$port" \
  --admin-listen "127.0.0.1:$admin" --policy-selector "e2e.splice.dev/instance=bench" \
  --probe-interval 0 > "$splice_log" 2>&1 &
pids+=($!)
wait_splice_ready "$admin" "$splice_log"

baseline=()
if [ -n "${SPLICE_BASELINE_BIN:-}" ]; then
  "$kubectl" create namespace splice-before >/dev/null
  bport=$(free_port)
  badmin=$(free_port)
  before_log=$repo/target/bench-admission-splice-before.log
  SPLICE_LOG=${SPLICE_LOG:-warn} "$SPLICE_BASELINE_BIN" run --namespace splice-before \
    --webhook-url "https://127.0.0.1:$bport" --listen "127.0.0.1:$bport" \
    --admin-listen "127.0.0.1:$badmin" --policy-selector "e2e.splice.dev/instance=bench-before" \
    --probe-interval 0 > "$before_log" 2>&1 &
  pids+=($!)
  wait_splice_ready "$badmin" "$before_log"
  baseline=(--baseline)
fi

# agnhost, with a throw-away certificate for 127.0.0.1.
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$work/key.pem" 2>/dev/null
openssl req -x509 -new -key "$work/key.pem" -out "$work/cert.pem" -days 2 -subj "/CN=bench-agnhost" \
  -addext "subjectAltName=IP:127.0.0.1" 2>/dev/null
agnhost_port=$(free_port)
"$bin_dir/agnhost" webhook --tls-cert-file "$work/cert.pem" --tls-private-key-file "$work/key.pem" \
  --port "$agnhost_port" --sidecar-image registry.invalid/sidecar:1 > "$repo/target/bench-admission-agnhost.log" 2>&1 &
pids+=($!)

# The null arm: `splice webhook` answering /null, with the same throw-away certificate.
cat > "$work/policy.yaml" <<'YAML'
apiVersion: splice.dev/v1alpha1
kind: InjectionPolicy
metadata: {name: unused}
spec:
  template: {containers: [{name: unused, image: registry.invalid/unused:1}]}
YAML
null_port=$(free_port)
SPLICE_LOG=warn "$NULL_BIN" webhook --policy "$work/policy.yaml" --tls-cert "$work/cert.pem" \
  --tls-key "$work/key.pem" --listen "127.0.0.1:$null_port" --null-handler \
  > "$repo/target/bench-admission-null.log" 2>&1 &
pids+=($!)

# In the cluster: Splice from its chart (policies labelled instance bench-cluster only) and agnhost
# as a pod behind a Service, both on the real node.
cluster=()
if [ "${SPLICE_REAL_NODE:-1}" != 0 ]; then
  "$cp_dir/image-load.sh" >&2
  placement=(--set-json 'nodeSelector={"e2e.splice.dev/node":"real"}'
    --set-json 'tolerations=[{"key":"e2e.splice.dev/node","operator":"Equal","value":"real","effect":"NoSchedule"}]')
  "$("$repo/e2e/helm/build.sh")" install splice "$repo/deploy/chart" -n splice-cluster \
    --create-namespace "${placement[@]}" --set policySelector=e2e.splice.dev/instance=bench-cluster \
    --set probeInterval=0 --set logFormat=text --wait --timeout 5m >&2
  "$kubectl" create namespace bench-infra >/dev/null
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$work/svc-key.pem" 2>/dev/null
  openssl req -x509 -new -key "$work/svc-key.pem" -out "$work/svc-cert.pem" -days 2 \
    -subj "/CN=agnhost.bench-infra.svc" -addext "subjectAltName=DNS:agnhost.bench-infra.svc" 2>/dev/null
  "$kubectl" -n bench-infra create secret tls agnhost-tls --cert "$work/svc-cert.pem" \
    --key "$work/svc-key.pem" >/dev/null
  "$kubectl" -n bench-infra apply -f - >/dev/null <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: agnhost}
spec:
  replicas: 1
  selector: {matchLabels: {app: agnhost}}
  template:
    metadata: {labels: {app: agnhost}}
    spec:
      nodeSelector: {e2e.splice.dev/node: real}
      tolerations: [{key: e2e.splice.dev/node, operator: Equal, value: real, effect: NoSchedule}]
      containers:
        - name: agnhost
          image: splice-agnhost:e2e
          imagePullPolicy: Never
          args: [webhook, --tls-cert-file, /certs/tls.crt, --tls-private-key-file, /certs/tls.key,
                 --port, "8443", --sidecar-image, registry.invalid/sidecar:1]
          ports: [{containerPort: 8443}]
          readinessProbe: {tcpSocket: {port: 8443}, periodSeconds: 1}
          volumeMounts: [{name: certs, mountPath: /certs, readOnly: true}]
      volumes: [{name: certs, secret: {secretName: agnhost-tls}}]
---
apiVersion: v1
kind: Service
metadata: {name: agnhost}
spec:
  selector: {app: agnhost}
  ports: [{port: 443, targetPort: 8443}]
YAML
  "$kubectl" -n bench-infra rollout status deploy/agnhost --timeout=120s >&2
  cluster=(--cluster-agnhost-namespace bench-infra --cluster-agnhost-ca "$work/svc-cert.pem")
fi

python3 "$repo/e2e/bench/admission.py" --kubeconfig "$KUBECONFIG" \
  --agnhost-port "$agnhost_port" --agnhost-ca "$work/cert.pem" --null-port "$null_port" \
  --rounds "${ROUNDS:-5}" --sequential "${SEQUENTIAL:-100}" \
  --concurrent "${CONCURRENT:-8}" --per-client "${PER_CLIENT:-25}" ${OUT:+--out "$OUT"} \
  "${baseline[@]}" "${cluster[@]}"

# The load rows: 17 policies (Fail) on the chart-installed Splice against the agnhost pod, at
# LOAD_CLIENTS concurrent clients, then one Splice pod deleted mid-load.
if [ "${SPLICE_REAL_NODE:-1}" != 0 ] && [ "${LOAD:-1}" != 0 ]; then
  (cd "$repo" && cargo build -q --release -p splice-e2e --bin admission_load)
  python3 "$repo/e2e/bench/load.py" --kubeconfig "$KUBECONFIG" --kubectl "$kubectl" \
    --generator "${CARGO_TARGET_DIR:-$repo/target}/release/admission_load" \
    --agnhost-namespace bench-infra --agnhost-ca "$work/svc-cert.pem" \
    --creates "${LOAD_CREATES:-10000}" --clients "${LOAD_CLIENTS:-32 128}" ${OUT:+--out "$OUT"}
fi
