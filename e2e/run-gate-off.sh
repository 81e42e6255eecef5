#!/usr/bin/env bash
# Pod identity where the API server does not serve PodCertificateRequests
# (e2e/tests/identity_gate_off.rs): starts a second, kwok-only control plane without the pod
# certificate gates, on ports and a run folder of its own, runs only that test binary against it
# (its tests are #[ignore]d in the main run), and always stops it. Called by e2e/run-e2e.sh;
# runs on its own too. Needs `cargo build -p splice` first (or SPLICE_BIN).
#   env: SPLICE_GATE_OFF_RUN_DIR (default ~/.cache/splice/gate-off),
#        SPLICE_GATE_OFF_PORT_BASE (default 16940).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cp="$root/e2e/controlplane"
export SPLICE_POD_CERTIFICATES=0 SPLICE_REAL_NODE=0
export SPLICE_RUN_DIR="${SPLICE_GATE_OFF_RUN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/splice/gate-off}"
export SPLICE_PORT_BASE="${SPLICE_GATE_OFF_PORT_BASE:-16940}"
export KUBECONFIG="$SPLICE_RUN_DIR/kubeconfig"
# What the caller set for the main control plane (run-e2e.sh's audit log, a kubeconfig, a CRD
# managed by someone else) must not leak into this one.
unset SPLICE_APISERVER_ARGS SPLICE_AUDIT_LOG SPLICE_KUBECONFIG SPLICE_E2E_CRD_INSTALLED
start=$SECONDS
"$cp/up.sh" || exit 1
trap '"$cp/down.sh" >/dev/null' EXIT
export SPLICE_BIN="${SPLICE_BIN:-$root/target/debug/splice}"
export SPLICE_CONTROLPLANE_BIN="$("$cp/build.sh" --print-bin-dir)"
cargo test -p splice-e2e --test identity_gate_off -- --ignored --test-threads=2 "$@"
status=$?
echo "gate-off step (control plane without pod certificates) took $((SECONDS - start))s"
exit $status
