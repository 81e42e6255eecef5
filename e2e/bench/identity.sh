#!/usr/bin/env bash
# `make bench-identity`: the pod identity signer (`splice.dev/identity`) at scale on a control
# plane of its own (kwok nodes only, pod certificates on, the NodeRestriction admission plugin on
# so requests made as a node are checked as a kubelet's are). Starts the control plane, installs
# the CRD, runs one `splice run` (a --release build unless SPLICE_BIN is given) and the Go driver
# in e2e/bench/identity/ (built here with the Go of the control plane, GOTOOLCHAIN=local), which:
#   - creates NODES (4) kwok nodes of its own, NAMESPACES (4) namespaces with SERVICE_ACCOUNTS (2)
#     service accounts each, and one policy (mode: Webhook) with `spec.identity` (keyType KEY_TYPE,
#     default ECDSAP256; maxExpirationSeconds 3600) selecting those namespaces; waits until Ready;
#   - per row (RATES, default "0": one row; e.g. RATES=0,20 adds a row paced at 20 requests/s):
#     PODS (1000) pods created through Splice's webhook (each must carry the podCertificate
#     volume and `splice.dev/status`), bound by the scheduler to the kwok nodes and Running; then
#     one PodCertificateRequest per pod made as the v1.36 kubelet makes it (FORM=csr: a fresh key's
#     stub PKCS#10 request; FORM=pkix: pkixPublicKey + proofOfPossession over the pod UID), as the
#     pod's node (impersonating system:node:<node>, group system:nodes; AS_NODE=0: as the admin),
#     CONCURRENCY (16) creates in flight;
#   - reports per row the create rate, the time until every request is answered, issuance latency
#     p50/p90/p99/max (the create call's return to the watch showing Issued, ms), issued / denied /
#     failed / unanswered, each issued leaf checked (SPIFFE ID, the request's key), how many bursts
#     the answers came in, `splice run`'s CPU (utime+stime from /proc/<pid>/stat) per 1,000
#     requests over the window and its VmRSS / VmHWM; and its CPU while idle (IDLE, 10s) before.
#
# Environment: SPLICE_RUN_DIR (default ~/.cache/splice/bench-identity), SPLICE_PORT_BASE (default
# 16840), PODS, NAMESPACES, SERVICE_ACCOUNTS, NODES, CONCURRENCY, RATES, FORM, KEY_TYPE, AS_NODE,
# IDLE, SPLICE_BIN, OUT (also write the table).
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
export SPLICE_RUN_DIR=${SPLICE_RUN_DIR:-$HOME/.cache/splice/bench-identity}
export SPLICE_PORT_BASE=${SPLICE_PORT_BASE:-16840}
# kwok nodes only: no kubelet runs, the driver makes the requests a kubelet would.
export SPLICE_REAL_NODE=0
export SPLICE_POD_CERTIFICATES=1
# NodeRestriction is off by default in kube-apiserver; a kubelet's cluster has it on, and it is
# what checks a node's PodCertificateRequest against the pod, node and service account.
export SPLICE_APISERVER_ARGS="--enable-admission-plugins NodeRestriction${SPLICE_APISERVER_ARGS:+ $SPLICE_APISERVER_ARGS}"
export KUBECONFIG=$SPLICE_RUN_DIR/kubeconfig
cp_dir="$repo/e2e/controlplane"
log() { echo "bench: $*" >&2; }

if [ -z "${SPLICE_BIN:-}" ]; then
  (cd "$repo" && cargo build -q --release -p splice)
  SPLICE_BIN=${CARGO_TARGET_DIR:-$repo/target}/release/splice
fi
"$cp_dir/build.sh" >/dev/null
kubectl="$("$cp_dir/build.sh" --print-bin-dir)/kubectl"
driver=${CARGO_TARGET_DIR:-$repo/target}/bench-identity/identity-bench
(cd "$repo/e2e/bench/identity" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod go build -o "$driver" .)
source "$repo/e2e/bench/common.sh"

splice_pid=""
trap stop_splice_and_control_plane EXIT

bench_control_plane

start_bench_splice identity

"$driver" --kubeconfig "$KUBECONFIG" --instance "$instance" \
  --splice-pid "$splice_pid" --admin "127.0.0.1:$admin" --clk-tck "$(getconf CLK_TCK)" \
  --pods "${PODS:-1000}" --namespaces "${NAMESPACES:-4}" \
  --service-accounts "${SERVICE_ACCOUNTS:-2}" --nodes "${NODES:-4}" \
  --concurrency "${CONCURRENCY:-16}" --rates "${RATES:-0}" --form "${FORM:-csr}" \
  --key-type "${KEY_TYPE:-ECDSAP256}" --as-node="$([ "${AS_NODE:-1}" = 0 ] && echo false || echo true)" \
  --idle "${IDLE:-10}s" --splice-bin "$SPLICE_BIN" ${OUT:+--out "$OUT"}
log "splice log: $splice_log"
