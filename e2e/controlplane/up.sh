#!/usr/bin/env bash
# Brings up a real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kwok with two fake nodes, and one real worker node
# (containerd 2, runc, a CNI bridge, a kubelet; see node.sh) labelled and tainted
# e2e.splice.dev/node=real, so only pods that ask for it run there.
#
#   up.sh            start everything, wait for /readyz and Ready nodes
#   env: SPLICE_RUN_DIR (default ~/.cache/splice/run), SPLICE_PORT_BASE (default 16440),
#        SPLICE_APISERVER_ARGS (extra kube-apiserver flags, split on spaces; e.g. an audit log),
#        SPLICE_REAL_NODE=0 (no real node: kwok nodes only, no root needed),
#        SPLICE_KWOK_EXTRA_CONFIG (a file of further kwok Stages, loaded after the standard ones;
#        e.g. e2e/bench/kwok-in-place-stage.yaml),
#        SPLICE_POD_CERTIFICATES=0 (no PodCertificateRequest / ClusterTrustBundle gates and APIs;
#        on by default). The choice is recorded in $SPLICE_RUN_DIR/features.
#
# The admin kubeconfig is written to $SPLICE_RUN_DIR/kubeconfig.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=common.sh
source "$here/common.sh"
# shellcheck source=node.sh
source "$here/node.sh"

BIN_DIR=$("$here/build.sh" --print-bin-dir)
if [ -d "$RUN_DIR" ]; then
  if any_recorded_process_alive; then
    running=$(cat "$FEATURES_FILE" 2>/dev/null || echo "unrecorded")
    if [ "$running" != "$(features_wanted)" ]; then
      die "a control plane is already running from $RUN_DIR with $running, but $(features_wanted) was asked for (SPLICE_POD_CERTIFICATES); run 'make down' first"
    fi
    die "a control plane is already running from $RUN_DIR ($running; pids: $(recorded_pids | tr '\n' ' ')); run 'make down' first"
  fi
  # A leftover run folder whose processes are all gone (a crashed run, a reboot): remove what its
  # node left outside the folder, then start afresh.
  node_down
  rm -rf "$RUN_DIR"
fi

for b in etcd kube-apiserver kube-controller-manager kube-scheduler kwok kubectl; do
  [ -x "$BIN_DIR/$b" ] || die "$BIN_DIR/$b is missing: run 'make controlplane' first"
done
node_names
if real_node_enabled; then node_preflight; fi

mkdir -p "$RUN_DIR"/{pki,logs,pids,etcd}
features_wanted > "$FEATURES_FILE"
gate_args=() runtime_config_args=()
if pod_certificates_enabled; then
  gate_args=(--feature-gates "$POD_CERTIFICATE_GATES")
  runtime_config_args=(--runtime-config "$POD_CERTIFICATE_RUNTIME_CONFIG")
fi
start=$SECONDS
# Any failure (a failed command or a `die`) stops what was started, the node's network included.
finished=0
trap 'on_exit' EXIT
on_exit() {
  [ "$finished" = 1 ] && return
  echo "up: failed; stopping what was started (logs kept in $RUN_DIR/logs)" >&2
  "$here/down.sh" --keep-logs >&2 || true
}

# ---------------------------------------------------------------------------------------------
# PKI: one CA for everything; a fresh one per run so no state leaks between runs.
pki="$RUN_DIR/pki"
openssl_quiet() { openssl "$@" 2>/dev/null; }
openssl_quiet ecparam -name prime256v1 -genkey -noout -out "$pki/ca.key"
openssl_quiet req -x509 -new -key "$pki/ca.key" -sha256 -days 7 -subj "/CN=splice-local-ca" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out "$pki/ca.crt"

issue() { # name subject extfile-lines
  local name=$1 subj=$2 ext=$3
  openssl_quiet ecparam -name prime256v1 -genkey -noout -out "$pki/$name.key"
  openssl_quiet req -new -key "$pki/$name.key" -subj "$subj" -out "$pki/$name.csr"
  printf '%b\n' "$ext" > "$pki/$name.ext"
  openssl_quiet x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
    -CAcreateserial -days 7 -sha256 -extfile "$pki/$name.ext" -out "$pki/$name.crt"
  rm -f "$pki/$name.csr" "$pki/$name.ext"
}
issue apiserver "/CN=kube-apiserver" \
  "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
client_ext="basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth"
issue admin "/O=system:masters/CN=splice-admin" "$client_ext"
# Served by the controller-manager, so tests can read its garbage collector's graph
# (/debug/controllers/garbage-collector-controller/graph) over TLS verified by the same CA.
issue controller-manager-serving "/CN=kube-controller-manager" \
  "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1"
issue controller-manager "/CN=system:kube-controller-manager" "$client_ext"
issue scheduler "/CN=system:kube-scheduler" "$client_ext"
issue kwok "/O=system:masters/CN=kwok" "$client_ext"
# The API server's identity towards kubelets (logs, exec, port-forward).
issue apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client_ext"
if real_node_enabled; then node_pki; fi
openssl_quiet ecparam -name prime256v1 -genkey -noout -out "$pki/sa.key"
openssl_quiet ec -in "$pki/sa.key" -pubout -out "$pki/sa.pub"

kubeconfig() { # file user
  local file=$1 user=$2
  cat > "$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: splice-local
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority: $pki/ca.crt
users:
- name: $user
  user:
    client-certificate: $pki/$user.crt
    client-key: $pki/$user.key
contexts:
- name: splice-local
  context: {cluster: splice-local, user: $user}
current-context: splice-local
EOF
}
kubeconfig "$KUBECONFIG_PATH" admin
kubeconfig "$RUN_DIR/controller-manager.kubeconfig" controller-manager
kubeconfig "$RUN_DIR/scheduler.kubeconfig" scheduler
kubeconfig "$RUN_DIR/kwok.kubeconfig" kwok

# ---------------------------------------------------------------------------------------------
launch etcd "$BIN_DIR/etcd" \
  --name local --data-dir "$RUN_DIR/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster "local=http://127.0.0.1:$ETCD_PEER_PORT" \
  --listen-metrics-urls "http://127.0.0.1:$ETCD_METRICS_PORT" \
  --unsafe-no-fsync --quota-backend-bytes 2147483648 --log-level warn
wait_for etcd 60 curl -fsS "http://127.0.0.1:$ETCD_PORT/health"

launch kube-apiserver "$BIN_DIR/kube-apiserver" \
  --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$APISERVER_PORT" \
  --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
  --client-ca-file "$pki/ca.crt" \
  --service-account-issuer https://kubernetes.default.svc \
  --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
  --authorization-mode Node,RBAC \
  --service-cluster-ip-range 10.0.0.0/24 \
  --endpoint-reconciler-type none \
  --allow-privileged=true \
  --disable-admission-plugins TaintNodesByCondition \
  --enable-priority-and-fairness=false \
  --profiling=false \
  --enable-aggregator-routing=true \
  --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
  --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
  --kubelet-certificate-authority "$pki/ca.crt" \
  --kubelet-preferred-address-types InternalIP \
  ${gate_args[@]+"${gate_args[@]}"} ${runtime_config_args[@]+"${runtime_config_args[@]}"} \
  ${SPLICE_APISERVER_ARGS:-}
wait_for kube-apiserver 120 kubectl_admin get --raw /readyz

launch kube-controller-manager "$BIN_DIR/kube-controller-manager" \
  --kubeconfig "$RUN_DIR/controller-manager.kubeconfig" \
  --authentication-kubeconfig "$RUN_DIR/controller-manager.kubeconfig" \
  --authorization-kubeconfig "$RUN_DIR/controller-manager.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$CONTROLLER_MANAGER_PORT" \
  --tls-cert-file "$pki/controller-manager-serving.crt" \
  --tls-private-key-file "$pki/controller-manager-serving.key" \
  --leader-elect=false --use-service-account-credentials=true \
  --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
  --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
  --controllers '*,-nodeipam,-service-lb-controller,-cloud-node-lifecycle-controller' \
  --flex-volume-plugin-dir "$RUN_DIR/flexvolume" \
  --concurrent-deployment-syncs 10 --concurrent-replicaset-syncs 10 \
  ${gate_args[@]+"${gate_args[@]}"} \
  --profiling=false
launch kube-scheduler "$BIN_DIR/kube-scheduler" \
  --kubeconfig "$RUN_DIR/scheduler.kubeconfig" \
  --authentication-kubeconfig "$RUN_DIR/scheduler.kubeconfig" \
  --authorization-kubeconfig "$RUN_DIR/scheduler.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$SCHEDULER_PORT" \
  --leader-elect=false --profiling=false
wait_for kube-controller-manager 60 curl -fsS --cacert "$pki/ca.crt" "https://127.0.0.1:$CONTROLLER_MANAGER_PORT/healthz"
echo "https://127.0.0.1:$CONTROLLER_MANAGER_PORT" > "$RUN_DIR/controller-manager.url"
wait_for kube-scheduler 60 curl -fsSk "https://127.0.0.1:$SCHEDULER_PORT/healthz"

# kwok only manages nodes carrying this annotation, so it never touches anything else.
launch kwok "$BIN_DIR/kwok" \
  --kubeconfig "$RUN_DIR/kwok.kubeconfig" \
  --config "$BIN_DIR/kwok-stages.yaml" \
  ${SPLICE_KWOK_EXTRA_CONFIG:+--config "$SPLICE_KWOK_EXTRA_CONFIG"} \
  --node-lease-duration-seconds 40 \
  --manage-all-nodes=false \
  --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
  --node-ip 127.0.0.1 \
  --server-address "127.0.0.1:$KWOK_PORT" \
  --cidr 10.244.0.0/16
for i in 0 1; do
  kubectl_admin apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-$i
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    kubernetes.io/hostname: kwok-node-$i
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok
status:
  allocatable: {cpu: "32", memory: 256Gi, pods: "250"}
  capacity: {cpu: "32", memory: 256Gi, pods: "250"}
EOF
done
wait_for "nodes Ready" 60 kubectl_admin wait --for=condition=Ready node/kwok-node-0 node/kwok-node-1 --timeout=2s
# Schedulable means Ready and untainted; without a kubelet nothing else would lift a not-ready taint
# quickly, which is why TaintNodesByCondition is off above.
nodes_untainted() { [ -z "$(kubectl_admin get nodes -o jsonpath='{.items[*].spec.taints}')" ]; }
wait_for "nodes without taints" 60 nodes_untainted
# The default ServiceAccount must exist before pods can be created in "default".
wait_for "default ServiceAccount" 60 kubectl_admin -n default get serviceaccount default

if real_node_enabled; then
  node_start=$SECONDS
  node_record_names
  node_up
  echo "real node $NODE_NAME Ready in $((SECONDS - node_start))s (pods on $NODE_SUBNET, bridge $NODE_BRIDGE)"
fi

finished=1
echo "control plane up in $((SECONDS - start))s"
echo "  export KUBECONFIG=$KUBECONFIG_PATH"
