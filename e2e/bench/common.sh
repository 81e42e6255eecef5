# Shared by the benchmarks that run on a control plane of their own (controller.sh, rollout.sh,
# identity.sh, admission.sh): source it after setting repo, cp_dir, kubectl and SPLICE_BIN.

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Brings the control plane up, installs the InjectionPolicy CRD and creates splice-system.
bench_control_plane() {
  "$cp_dir/up.sh" >&2
  "$SPLICE_BIN" crd | "$kubectl" apply --server-side -f - >/dev/null
  # Right after the apply the CRD may have no conditions yet, which `kubectl wait` rejects.
  for _ in $(seq 1 60); do
    "$kubectl" wait --for=condition=Established crd/injectionpolicies.splice.dev --timeout=2s >/dev/null 2>&1 && break
    sleep 0.5
  done
  "$kubectl" create namespace splice-system >/dev/null
}

# Starts one `splice run` named NAME (its log target/bench-NAME-splice.log) managing the
# policies of instance "bench", with any more arguments, and waits until it is ready; sets
# port, admin, instance, splice_log and splice_pid. KUBECONFIG may be set for it alone.
start_bench_splice() {
  local name=$1
  shift
  port=$(free_port)
  admin=$(free_port)
  instance=bench
  mkdir -p "$repo/target"
  splice_log=$repo/target/bench-$name-splice.log
  SPLICE_LOG=${SPLICE_LOG:-info} "$SPLICE_BIN" run --namespace splice-system \
    --webhook-url "https://127.0.0.1:$port" --listen "127.0.0.1:$port" \
    --admin-listen "127.0.0.1:$admin" \
    --policy-selector "e2e.splice.dev/instance=$instance" \
    "$@" > "$splice_log" 2>&1 &
  splice_pid=$!
  wait_splice_ready "$admin" "$splice_log"
}

# Waits until the `splice run` whose admin port is $1 is ready; $2 is its log, named on failure.
wait_splice_ready() {
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$1/readyz" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "bench: splice run did not become ready; see $2" >&2
  return 1
}

# The EXIT trap of a benchmark that runs one `splice run` (its pid in $splice_pid, empty until it
# starts): stops it, then the control plane.
stop_splice_and_control_plane() {
  if [ -n "${splice_pid:-}" ] && kill -0 "$splice_pid" 2>/dev/null; then
    kill -TERM "$splice_pid" 2>/dev/null || true
    wait "$splice_pid" 2>/dev/null || true
  fi
  "$cp_dir/down.sh" >/dev/null 2>&1 || true
}
