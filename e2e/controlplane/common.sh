# Shared by up.sh and down.sh. Everything listens on 127.0.0.1 only.
RUN_DIR=${SPLICE_RUN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/splice/run}
KUBECONFIG_PATH="$RUN_DIR/kubeconfig"
PORT_BASE=${SPLICE_PORT_BASE:-16440}
APISERVER_PORT=$((PORT_BASE + 3))          # 16443
ETCD_PORT=$((PORT_BASE + 10))              # 16450
ETCD_PEER_PORT=$((PORT_BASE + 11))
ETCD_METRICS_PORT=$((PORT_BASE + 12))
CONTROLLER_MANAGER_PORT=$((PORT_BASE + 20))
SCHEDULER_PORT=$((PORT_BASE + 21))
KWOK_PORT=$((PORT_BASE + 22))
# base+30 and +31 are the demo's `splice run` (webhook, admin).
KUBELET_PORT=$((PORT_BASE + 40))           # the real node's kubelet, on the bridge's address
KUBELET_HEALTHZ_PORT=$((PORT_BASE + 41))   # on 127.0.0.1
API_RELAY_PORT=$((PORT_BASE + 42))         # pods' way to the API server, on the bridge's address

die() { echo "error: $*" >&2; exit 1; }

# Pod certificates (KEP-4317) and ClusterTrustBundles: beta and off by default in 1.36, on here
# unless SPLICE_POD_CERTIFICATES=0, so a test can also see a cluster without them. The gates go to
# the API server, the controller-manager (its PodCertificateRequest cleaner and ClusterTrustBundle
# publisher) and the kubelet; the beta API versions must be served explicitly as well.
POD_CERTIFICATES=${SPLICE_POD_CERTIFICATES:-1}
POD_CERTIFICATE_GATES="PodCertificateRequest=true,ClusterTrustBundle=true,ClusterTrustBundleProjection=true"
POD_CERTIFICATE_RUNTIME_CONFIG="certificates.k8s.io/v1beta1/podcertificaterequests=true,certificates.k8s.io/v1beta1/clustertrustbundles=true"
pod_certificates_enabled() { [ "$POD_CERTIFICATES" != 0 ]; }
# What the running control plane was started with, one KEY=VALUE a line: tests read it, and a
# second `make up` compares against it.
FEATURES_FILE="$RUN_DIR/features"
features_wanted() { echo "pod-certificates=$(pod_certificates_enabled && echo 1 || echo 0)"; }

recorded_pids() { cat "$RUN_DIR"/pids/*.pid 2>/dev/null || true; }

any_recorded_process_alive() {
  local pid
  for pid in $(recorded_pids); do
    kill -0 "$pid" 2>/dev/null && return 0
  done
  return 1
}

# launch NAME PROGRAM ARGS...: start a component in its own session, log to logs/NAME.log, record
# its PID so down.sh stops exactly what up.sh started.
launch() {
  local name=$1; shift
  setsid "$@" >"$RUN_DIR/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$RUN_DIR/pids/$name.pid"
}

# stop_component NAME: stops a recorded component: TERM, up to 10 s, then KILL.
stop_component() {
  local f="$RUN_DIR/pids/$1.pid" pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
  kill -KILL "$pid" 2>/dev/null || true
}

# Fails (and prints the log tail) if a launched component has exited.
check_components_alive() {
  local f name pid
  for f in "$RUN_DIR"/pids/*.pid; do
    [ -e "$f" ] || continue
    name=$(basename "$f" .pid); pid=$(cat "$f")
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "error: $name (pid $pid) exited during startup; last lines of $RUN_DIR/logs/$name.log:" >&2
      tail -n 40 "$RUN_DIR/logs/$name.log" >&2 || true
      return 1
    fi
  done
}

# wait_for WHAT TIMEOUT_SECONDS COMMAND...: poll until COMMAND succeeds, a component dies, or time
# runs out.
wait_for() {
  local what=$1 timeout=$2; shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    check_components_alive || return 1
    if [ $SECONDS -ge $deadline ]; then
      echo "error: timed out after ${timeout}s waiting for $what" >&2
      return 1
    fi
    sleep 0.5
  done
}

kubectl_admin() { "$BIN_DIR/kubectl" --kubeconfig "$KUBECONFIG_PATH" "$@"; }
