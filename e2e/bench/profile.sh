#!/usr/bin/env bash
# `make bench-profile`: where Splice's CPU time goes per pod create under concurrent load through
# the API server. A control plane of its own, one `splice run` (a --release build unless SPLICE_BIN
# is given) serving 17 InjectionPolicies over 3 namespace selectors, CONCURRENT clients (32)
# sending server-side dry-run creates for DURATION seconds (30) while `perf record` samples Splice;
# profile.py prints the split by the crate of the sampled functions.
#
# Environment: SPLICE_RUN_DIR (default ~/.cache/splice/bench-profile), SPLICE_PORT_BASE (default
# 16840), SPLICE_BIN, DURATION, CONCURRENT, OUT (also write the table there). Needs perf
# (Debian package linux-perf) and python3 with PyYAML.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
export SPLICE_RUN_DIR=${SPLICE_RUN_DIR:-$HOME/.cache/splice/bench-profile}
export SPLICE_PORT_BASE=${SPLICE_PORT_BASE:-16840}
# Nothing runs on a node: dry-run creates only.
export SPLICE_REAL_NODE=${SPLICE_REAL_NODE:-0}
export KUBECONFIG=$SPLICE_RUN_DIR/kubeconfig
cp_dir="$repo/e2e/controlplane"

command -v perf >/dev/null || { echo "bench: perf is required (apt-get install linux-perf)" >&2; exit 1; }
python3 -c 'import yaml' 2>/dev/null || { echo "bench: python3 with PyYAML is required" >&2; exit 1; }
if [ -z "${SPLICE_BIN:-}" ]; then
  (cd "$repo" && cargo build -q --release -p splice)
  SPLICE_BIN=${CARGO_TARGET_DIR:-$repo/target}/release/splice
fi
"$cp_dir/build.sh" >/dev/null
kubectl="$("$cp_dir/build.sh" --print-bin-dir)/kubectl"
source "$repo/e2e/bench/common.sh"

work=$(mktemp -d)
splice_pid=
trap 'stop_splice_and_control_plane; rm -rf "$work"' EXIT
bench_control_plane
SPLICE_LOG=warn start_bench_splice profile --probe-interval 0
python3 "$repo/e2e/bench/profile.py" --kubeconfig "$KUBECONFIG" --pid "$splice_pid" \
  --duration "${DURATION:-30}" --concurrent "${CONCURRENT:-32}" --perf-data "$work/perf.data" \
  ${OUT:+--out "$OUT"}
