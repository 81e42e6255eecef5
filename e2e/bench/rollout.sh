#!/usr/bin/env bash
# `make bench-rollout`: `spec.rollout` at scale on a control plane of its own (kwok nodes only), two
# rows one after the other (ROWS, default "restart,in-place"). Starts the control plane with an
# audit log of every write (e2e/bench/rollout-audit-policy.yaml) and the bench's own kwok Stages,
# installs the CRD, runs one `splice run` (a --release build unless SPLICE_BIN is given) as its own
# impersonated user `splice-bench`, so the audit log tells its writes apart, and runs rollout.py:
#   - restart row: one policy (mode: Webhook) injecting a sidecar (v1) into NAMESPACES (10)
#     namespaces; DEPLOYMENTS (1000) one-replica Deployments across them, on kwok nodes, all
#     injected with v1; the template changes to v2 (an env change), with `rollout: {strategy:
#     Restart, maxConcurrent: MAX_CONCURRENT (10), maxConcurrentPerNamespace: PER_NAMESPACE
#     (default MAX_CONCURRENT)}`, and `splice run --rollout-max-concurrent CAP (default
#     MAX_CONCURRENT)`;
#   - in-place row: a second policy injecting sidecar image registry.invalid/sidecar:1 into
#     NAMESPACES other namespaces; IN_PLACE_DEPLOYMENTS (100) Deployments of IN_PLACE_REPLICAS (10)
#     replicas; the template changes the sidecar's image only, to :2, under `strategy: Auto` and
#     the same budget: Splice updates each running pod in place.
#   - reports, per row, the time from the change to `status.rollout.phase: Complete` with every
#     pod current (and `updatedInPlace` == every pod), the most restarting/updating at once, and
#     Splice's API writes per workload (restart) or per pod (in-place), from the audit log, split
#     by resource and verb.
#
# kwok runs no images, so nothing would act on an in-place update: the in-place row's kubelet is
# the bench's own kwok Stages (e2e/bench/kwok-in-place-stage.yaml, passed to up.sh as
# SPLICE_KWOK_EXTRA_CONFIG). For a Running pod whose containers do not report `imageID:
# kwok-bench://<spec image>` or whose `status.observedGeneration` is behind `metadata.generation`,
# they set observedGeneration to the generation, each container's image and imageID from the
# spec, ready and started, and keep restartCount. New pods get their imageID that way too, so an
# image change shows as a new imageID, as Splice's proof requires.
#
# Environment: SPLICE_RUN_DIR (default ~/.cache/splice/bench-rollout), SPLICE_PORT_BASE (default
# 16740), ROWS, DEPLOYMENTS, IN_PLACE_DEPLOYMENTS, IN_PLACE_REPLICAS, NAMESPACES, MAX_CONCURRENT,
# PER_NAMESPACE, CAP, THREADS, QUIET (60: seconds after the last pod is current whose writes still
# count), SPLICE_BIN, OUT (also write the table).
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
export SPLICE_RUN_DIR=${SPLICE_RUN_DIR:-$HOME/.cache/splice/bench-rollout}
export SPLICE_PORT_BASE=${SPLICE_PORT_BASE:-16740}
# kwok nodes only: the pods never run, kwok's stages make them Ready.
export SPLICE_REAL_NODE=0
export KUBECONFIG=$SPLICE_RUN_DIR/kubeconfig
audit_log=$SPLICE_RUN_DIR/audit.log
export SPLICE_KWOK_EXTRA_CONFIG=$repo/e2e/bench/kwok-in-place-stage.yaml
export SPLICE_APISERVER_ARGS="--audit-policy-file $repo/e2e/bench/rollout-audit-policy.yaml --audit-log-path $audit_log --audit-log-maxsize 0"
cp_dir="$repo/e2e/controlplane"
log() { echo "bench: $*" >&2; }

python3 -c 'import yaml' 2>/dev/null || { log "python3 with PyYAML is required (apt-get install python3-yaml)"; exit 1; }

if [ -z "${SPLICE_BIN:-}" ]; then
  (cd "$repo" && cargo build -q --release -p splice)
  SPLICE_BIN=${CARGO_TARGET_DIR:-$repo/target}/release/splice
fi
"$cp_dir/build.sh" >/dev/null
kubectl="$("$cp_dir/build.sh" --print-bin-dir)/kubectl"
source "$repo/e2e/bench/common.sh"

splice_pid=""
trap stop_splice_and_control_plane EXIT

rm -f "$audit_log"
bench_control_plane

# Splice acts as the user splice-bench (with the admin's rights) through impersonation.
user=splice-bench
splice_kubeconfig=$SPLICE_RUN_DIR/$user.kubeconfig
"$kubectl" config view --raw --minify --flatten -o json | python3 -c '
import json, sys
c = json.load(sys.stdin)
c["users"][0]["user"]["as"] = sys.argv[1]
c["users"][0]["user"]["as-groups"] = ["system:masters", "system:authenticated"]
json.dump(c, sys.stdout)' "$user" > "$splice_kubeconfig"

max=${MAX_CONCURRENT:-10}
KUBECONFIG=$splice_kubeconfig start_bench_splice rollout --rollout-max-concurrent "${CAP:-$max}"

python3 "$repo/e2e/bench/rollout.py" --kubeconfig "$KUBECONFIG" --instance "$instance" \
  --user "$user" --audit-log "$audit_log" --rows "${ROWS:-restart,in-place}" \
  --deployments "${DEPLOYMENTS:-1000}" --in-place-deployments "${IN_PLACE_DEPLOYMENTS:-100}" \
  --in-place-replicas "${IN_PLACE_REPLICAS:-10}" \
  --namespaces "${NAMESPACES:-10}" --max-concurrent "$max" \
  --per-namespace "${PER_NAMESPACE:-$max}" --cap "${CAP:-$max}" --threads "${THREADS:-16}" \
  --quiet "${QUIET:-60}" --splice-bin "$SPLICE_BIN" ${OUT:+--out "$OUT"}
log "splice log: $splice_log"
