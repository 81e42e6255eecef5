#!/usr/bin/env bash
# `make bench-controller`: the controller at scale on a control plane of its own (kwok nodes).
# Starts the control plane, installs the CRD, runs one `splice run` (a --release build unless
# SPLICE_BIN is given: memory and latency are measured on what would be shipped), and runs controller.py, which prints a markdown table:
#   - POLICIES (1000) policies (mode: Webhook) applied at once: time until all Ready, Splice's API
#     writes per policy, and Splice's writes over IDLE (120) s afterwards;
#   - INTREE (default POLICIES) policies of mode InTree applied at once: time until all Ready and
#     Splice's API writes per policy; then deleted;
#   - CHANGES (30) template changes on one policy with all present: time until status shows it;
#   - PODS (10000) pods created on kwok nodes (parallel requests), then splice run's VmRSS.
#   - the admission probe (on unless PROBE=0, which starts splice run with --probe-interval 0):
#     time until every policy has its Verified condition, then over the idle window its dry-run
#     creates per policy per minute and the leader's CPU.
# Writes are counted from the API server's apiserver_request_total (see controller.py).
#   - a CA rotation (`splice rotate`) across every policy's webhook configuration: time until the
#     rotation phase is Stable again, and failed admissions among pods created during it.
#
# Environment: SPLICE_RUN_DIR (default ~/.cache/splice/bench-controller), SPLICE_PORT_BASE
# (default 16540), POLICIES, INTREE (0: skip the in-tree rows), PODS, IDLE, CHANGES, THREADS,
# SPLICE_BIN, OUT (also write the table),
# ROTATION (0: skip the CA-rotation row, for quicker runs while working on the rest), PROBE (0: the
# admission probe off, to compare the leader's CPU without it).
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
export SPLICE_RUN_DIR=${SPLICE_RUN_DIR:-$HOME/.cache/splice/bench-controller}
export SPLICE_PORT_BASE=${SPLICE_PORT_BASE:-16540}
export KUBECONFIG=$SPLICE_RUN_DIR/kubeconfig
cp_dir="$repo/e2e/controlplane"
log() { echo "bench: $*" >&2; }

python3 -c 'import yaml' 2>/dev/null || { log "python3 with PyYAML is required (apt-get install python3-yaml)"; exit 1; }

if [ -z "${SPLICE_BIN:-}" ]; then
  (cd "$repo" && cargo build -q --release -p splice)
  SPLICE_BIN=$repo/target/release/splice
fi
"$cp_dir/build.sh" >/dev/null
kubectl="$("$cp_dir/build.sh" --print-bin-dir)/kubectl"
source "$repo/e2e/bench/common.sh"

splice_pid=""
trap stop_splice_and_control_plane EXIT

bench_control_plane

start_bench_splice controller $([ "${PROBE:-1}" = 0 ] && echo --probe-interval 0)

python3 "$repo/e2e/bench/controller.py" --kubeconfig "$KUBECONFIG" --instance "$instance" \
  --splice-pid "$splice_pid" --admin "$admin" --policies "${POLICIES:-1000}" --pods "${PODS:-10000}" \
  --idle "${IDLE:-120}" --changes "${CHANGES:-30}" --threads "${THREADS:-16}" \
  --splice-bin "$SPLICE_BIN" ${OUT:+--out "$OUT"} ${ROTATION:+--rotation "$ROTATION"} \
  --probe "${PROBE:-1}" --intree "${INTREE:-${POLICIES:-1000}}"
log "splice log: $splice_log"
