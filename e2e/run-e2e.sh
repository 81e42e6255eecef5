#!/usr/bin/env bash
# Starts a fresh control plane with the real node, imports the images (make image built Splice's),
# runs the e2e suite against it, and always stops it; then e2e/run-gate-off.sh on a second one.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cp="$root/e2e/controlplane"
# The API server's audit log of writes to what Splice owns: e2e/tests/leadership.rs reads it to
# tell which replica wrote what. Appended to any SPLICE_APISERVER_ARGS the caller set.
run_dir=$(source "$cp/common.sh" && echo "$RUN_DIR")
export SPLICE_AUDIT_LOG="$run_dir/audit.log"
export SPLICE_APISERVER_ARGS="${SPLICE_APISERVER_ARGS:-} --audit-policy-file $root/e2e/audit-policy.yaml --audit-log-path $SPLICE_AUDIT_LOG"
"$cp/up.sh" || exit 1
trap '"$cp/down.sh" >/dev/null' EXIT
if [ "${SPLICE_REAL_NODE:-1}" != 0 ]; then
  "$cp/image-load.sh" || exit 1
fi
export SPLICE_BIN="${SPLICE_BIN:-$root/target/debug/splice}"
export SPLICE_CONTROLPLANE_BIN="$("$cp/build.sh" --print-bin-dir)"
# Tests share one API server: two threads keep the load predictable on a 2-core machine.
cargo test -p splice-e2e -- --test-threads="${SPLICE_E2E_THREADS:-2}" "$@"
main=$?
# Then the tests that need an API server without pod certificates, on a second control plane of
# their own (run-gate-off.sh), once this one is stopped. Either failing fails the run.
# SPLICE_E2E_GATE_OFF=0 skips them (a focused local run).
"$cp/down.sh" >/dev/null
trap - EXIT
gate_off=0
if [ "${SPLICE_E2E_GATE_OFF:-1}" != 0 ]; then
  "$root/e2e/run-gate-off.sh"
  gate_off=$?
fi
echo "e2e: main suite exit $main, gate-off step exit $gate_off"
[ "$main" = 0 ] && [ "$gate_off" = 0 ]
