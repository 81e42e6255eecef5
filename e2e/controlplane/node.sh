# The real worker node beside the kwok nodes, sourced by up.sh and down.sh after common.sh:
# containerd 2 with runc, the CNI bridge and host-local plugins on a bridge of its own, and a
# kubelet. Pods run in network namespaces on this machine; nothing is routed or NATed outward.
#
# Every name the node uses derives from the run folder and the port base, so two runs coexist;
# up.sh records them in $NODE_DIR/env and down.sh removes exactly those.
#   SPLICE_REAL_NODE=0   up.sh starts no real node (kwok nodes only); it needs root otherwise.

NODE_DIR="$RUN_DIR/node"
NODE_LABEL_KEY=e2e.splice.dev/node
NODE_LABEL_VALUE=real
SERVICE_CIDR=10.0.0.0/24
KUBERNETES_SERVICE_IP=10.0.0.1
# The sandbox image: built and imported by up.sh (e2e/images), never pulled.
PAUSE_IMAGE=localhost/splice-pause:e2e
# Every registry resolves here, a loopback port nothing listens on: a pull fails at once.
DEAD_REGISTRY=http://127.0.0.1:9
# Kernel settings the kubelet sets at start; down.sh puts back what was there before.
KUBELET_SYSCTLS="vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes"

real_node_enabled() { [ "${SPLICE_REAL_NODE:-1}" != 0 ]; }

# Derives the node's names from RUN_DIR and PORT_BASE (up), or reads what up recorded (down).
node_names() {
  if [ -f "$NODE_DIR/env" ]; then
    # shellcheck source=/dev/null
    source "$NODE_DIR/env"
    return
  fi
  local hash
  hash=$(printf '%s:%s' "$RUN_DIR" "$PORT_BASE" | cksum | cut -d' ' -f1)
  NODE_ID=$(printf '%06x' $((hash % 16777216)))
  NODE_NAME="splice-node-$NODE_ID"
  NODE_BRIDGE="splbr$NODE_ID"                  # 11 characters; interface names stop at 15
  NODE_OCTET=$((hash % 200 + 20))
  NODE_SUBNET="10.88.$NODE_OCTET.0/24"         # kwok invents 10.244.0.0/16: no overlap
  NODE_IP="10.88.$NODE_OCTET.1"                # the bridge's address, the kubelet's and the relay's
  NODE_CNI_NETWORK="splice-$NODE_ID"
  NODE_CGROUP="splice-node-$NODE_ID"           # the kubelet's cgroupRoot, in every hierarchy
  CONTAINERD_SOCKET="$NODE_DIR/containerd.sock"
  # Shim sockets need a short path (108 bytes with a 64-character name), so not the run folder.
  SHIM_SOCKET_DIR="/run/splice-node-$NODE_ID"
}

# Paths outside the run folder that the kubelet, containerd, libcni or mount(8) create whatever
# they are told; down.sh removes those that did not exist before, once empty of the node's files.
NODE_GLOBAL_PATHS="/run/mount /run/containerd /var/lib/cni /var/lib/kubelet /var/log/containers"

node_record_names() {
  mkdir -p "$NODE_DIR"
  local v
  for v in NODE_ID NODE_NAME NODE_BRIDGE NODE_OCTET NODE_SUBNET NODE_IP NODE_CNI_NETWORK \
           NODE_CGROUP KUBELET_PORT KUBELET_HEALTHZ_PORT API_RELAY_PORT CONTAINERD_SOCKET \
           SHIM_SOCKET_DIR; do
    printf '%s=%q\n' "$v" "${!v}"
  done > "$NODE_DIR/env"
  local p
  for p in $NODE_GLOBAL_PATHS; do
    [ -e "$p" ] || echo "$p"
  done > "$NODE_DIR/created-paths"
}

# The rules that let pods, and only pods, reach the API server: the kubernetes Service address
# arriving on this bridge goes to the relay, and the relay takes nothing from any other interface.
# Each takes -A (add) or -D (delete once).
node_rule_dnat() {
  iptables -w -t nat "$1" PREROUTING -i "$NODE_BRIDGE" -d "$KUBERNETES_SERVICE_IP/32" -p tcp \
    --dport 443 -m comment --comment "splice real node $NODE_ID" \
    -j DNAT --to-destination "$NODE_IP:$API_RELAY_PORT"
}
node_rule_relay_only() {
  iptables -w "$1" INPUT -d "$NODE_IP/32" -p tcp --dport "$API_RELAY_PORT" ! -i "$NODE_BRIDGE" \
    -m comment --comment "splice real node $NODE_ID" -j DROP
}

# The kubelet's client certificate (its Node identity) and its serving certificate. Called from
# up.sh's PKI step, with its `issue`.
node_pki() {
  issue "node-$NODE_ID" "/O=system:nodes/CN=system:node:$NODE_NAME" "$client_ext"
  issue "kubelet-serving-$NODE_ID" "/CN=$NODE_NAME" \
    "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:$NODE_IP,DNS:$NODE_NAME"
}

node_preflight() {
  [ "$(id -u)" = 0 ] ||
    die "the real node needs root (network namespaces, a bridge, cgroups); run as root or set SPLICE_REAL_NODE=0 for kwok nodes only"
  local tool
  for tool in runc iptables ip umoci mount umount; do
    command -v "$tool" >/dev/null || die "$tool is required for the real node (e2e/deps.sh installs it)"
  done
  for tool in bridge host-local loopback; do
    [ -x "/usr/lib/cni/$tool" ] || die "/usr/lib/cni/$tool is required (Debian package containernetworking-plugins; e2e/deps.sh installs it)"
  done
  for tool in containerd containerd-shim-runc-v2 ctr kubelet nodeprobe; do
    [ -x "$BIN_DIR/$tool" ] || die "$BIN_DIR/$tool is missing: run 'make controlplane' first"
  done
  if ip -o -4 addr show | grep -q " 10\.88\.$NODE_OCTET\."; then
    die "10.88.$NODE_OCTET.0/24 is already on an interface (another run?): $(ip -o -4 addr show | grep " 10\.88\.$NODE_OCTET\." | awk '{print $2}')"
  fi
  [ "$(cat /proc/sys/net/ipv4/ip_forward)" = 0 ] ||
    echo "warning: net.ipv4.ip_forward is already 1 on this machine; the real node does not need it" >&2
}

node_network_up() {
  ip link add "$NODE_BRIDGE" type bridge
  ip addr add "$NODE_IP/24" dev "$NODE_BRIDGE"
  ip link set "$NODE_BRIDGE" up
  node_rule_dnat -A
  node_rule_relay_only -A
  launch api-relay "$BIN_DIR/nodeprobe" relay "$NODE_IP:$API_RELAY_PORT" "127.0.0.1:$APISERVER_PORT"
  mkdir -p "$NODE_DIR/cni/net.d" "$NODE_DIR/cni/ipam"
  # No gateway role for the bridge (isGateway would switch ip_forward on), no masquerade, and one
  # route: the Service range, via the bridge's address.
  cat > "$NODE_DIR/cni/net.d/10-splice.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$NODE_CNI_NETWORK",
  "plugins": [{
    "type": "bridge",
    "bridge": "$NODE_BRIDGE",
    "isGateway": false,
    "isDefaultGateway": false,
    "ipMasq": false,
    "hairpinMode": true,
    "ipam": {
      "type": "host-local",
      "ranges": [[{"subnet": "$NODE_SUBNET", "rangeStart": "10.88.$NODE_OCTET.10", "gateway": "$NODE_IP"}]],
      "routes": [{"dst": "$SERVICE_CIDR", "gw": "$NODE_IP"}],
      "dataDir": "$NODE_DIR/cni/ipam"
    }
  }]
}
EOF
}

node_containerd_up() {
  local c="$NODE_DIR/containerd"
  mkdir -p "$c/root" "$c/state" "$NODE_DIR/certs.d/_default" "$NODE_DIR/runc"
  printf 'server = "%s"\n' "$DEAD_REGISTRY" > "$NODE_DIR/certs.d/_default/hosts.toml"
  # Plugins that would reach outside the run folder (/opt/containerd, /var/run/nri) or need
  # kernel features absent here are off; every path is under the run folder.
  cat > "$c/config.toml" <<EOF
version = 3
root = "$c/root"
state = "$c/state"
disabled_plugins = [
  "io.containerd.internal.v1.opt",
  "io.containerd.nri.v1.nri",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "$CONTAINERD_SOCKET"

[ttrpc]
  address = "$CONTAINERD_SOCKET.ttrpc"

[plugins.'io.containerd.shim.v1.manager']
  socket_dir = "$SHIM_SOCKET_DIR"

[plugins.'io.containerd.cri.v1.runtime']
  # This VM lacks CAP_SYS_RESOURCE: runc cannot lower oom_score_adj to the kubelet's -998.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$NODE_DIR/cni/net.d"
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "$NODE_DIR/runc"
        SystemdCgroup = false

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$PAUSE_IMAGE"
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "$NODE_DIR/certs.d"
EOF
  launch containerd env PATH="$BIN_DIR:$PATH" "$BIN_DIR/containerd" --config "$c/config.toml" \
    --log-level warn
  wait_for containerd 30 "$BIN_DIR/ctr" --address "$CONTAINERD_SOCKET" version
  # The guard first: no image may be imported, let alone a pod run, before a pull is known to
  # fail on this machine.
  "$BIN_DIR/nodeprobe" pull-guard "$CONTAINERD_SOCKET" > "$RUN_DIR/logs/pull-guard.log" 2>&1 || {
    cat "$RUN_DIR/logs/pull-guard.log" >&2
    return 1
  }
  local images
  images=$("$here/../images/build.sh" "$NODE_DIR/images")
  node_import "$images/pause.tar" "${PAUSE_IMAGE%:*}"
  "$BIN_DIR/nodeprobe" has-images "$CONTAINERD_SOCKET" "$PAUSE_IMAGE" >/dev/null
}

# node_import ARCHIVE BASE_NAME: imports an OCI archive tagged T as BASE_NAME:T, pinned so the
# kubelet's image garbage collection never removes it (nothing could pull it back).
node_import() {
  "$BIN_DIR/ctr" --address "$CONTAINERD_SOCKET" -n k8s.io images import \
    --base-name "$2" --label io.cri-containerd.pinned=pinned "$1" >/dev/null
}

# cgroup v1 (this VM) has a hierarchy per controller; the kubelet's root must exist in each, and a
# new cpuset must be given its parent's CPUs and memory nodes before anything can join it.
node_cgroups_up() {
  local h
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    mkdir -p "/sys/fs/cgroup/$NODE_CGROUP"
    return
  fi
  for h in /sys/fs/cgroup/*/; do
    [ -f "$h/tasks" ] || continue
    mkdir -p "$h$NODE_CGROUP"
    if [ -f "$h/cpuset.cpus" ]; then
      cat "$h/cpuset.cpus" > "$h$NODE_CGROUP/cpuset.cpus"
      cat "$h/cpuset.mems" > "$h$NODE_CGROUP/cpuset.mems"
    fi
  done
}

node_kubelet_up() {
  local k="$NODE_DIR/kubelet" s
  mkdir -p "$k/root" "$k/pod-logs" "$k/volume-plugins"
  for s in $KUBELET_SYSCTLS; do
    echo "$s=$(sysctl -n "$s" 2>/dev/null)"
  done > "$NODE_DIR/sysctls.before"
  kubeconfig "$k/kubeconfig" "node-$NODE_ID"
  cat > "$k/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
tlsCertFile: $pki/kubelet-serving-$NODE_ID.crt
tlsPrivateKeyFile: $pki/kubelet-serving-$NODE_ID.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://$CONTAINERD_SOCKET
cgroupDriver: cgroupfs
cgroupRoot: /$NODE_CGROUP
# This VM runs cgroup v1, which kubelet 1.35+ refuses unless told otherwise, and has swap rules of
# its own.
failCgroupV1: false
failSwapOn: false
# No KUBE-FIREWALL jumps in the machine's INPUT and OUTPUT chains.
makeIPTablesUtilChains: false
podLogsDir: $k/pod-logs
volumePluginDir: $k/volume-plugins
# No DNS for pods: nothing to resolve on this machine, and no query may leave it.
resolvConf: ""
clusterDomain: cluster.local
registerWithTaints:
  - {key: $NODE_LABEL_KEY, value: $NODE_LABEL_VALUE, effect: NoSchedule}
# The machine's disk is shared and often fuller than the defaults allow; images cannot be pulled
# back, so they are never garbage-collected.
evictionHard: {memory.available: 100Mi, nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
maxPods: 60
serializeImagePulls: false
EOF
  # The podCertificate and clusterTrustBundle projected sources are the kubelet's to fill.
  if pod_certificates_enabled; then
    printf 'featureGates:\n' >> "$k/config.yaml"
    local gate
    for gate in ${POD_CERTIFICATE_GATES//,/ }; do
      printf '  %s: %s\n' "${gate%=*}" "${gate#*=}" >> "$k/config.yaml"
    done
  fi
  launch kubelet "$BIN_DIR/kubelet" --config "$k/config.yaml" --kubeconfig "$k/kubeconfig" \
    --root-dir "$k/root" --cert-dir "$k/root/pki" \
    --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" \
    --node-labels "$NODE_LABEL_KEY=$NODE_LABEL_VALUE" --v 1
  if ! wait_for "the real node $NODE_NAME to be Ready" 90 \
      kubectl_admin wait --for=condition=Ready "node/$NODE_NAME" --timeout=2s; then
    echo "last lines of $RUN_DIR/logs/kubelet.log:" >&2; tail -n 30 "$RUN_DIR/logs/kubelet.log" >&2
    echo "last lines of $RUN_DIR/logs/containerd.log:" >&2; tail -n 15 "$RUN_DIR/logs/containerd.log" >&2
    return 1
  fi
  [ "$(cat /proc/sys/net/ipv4/ip_forward)" = 0 ] || die "net.ipv4.ip_forward was switched on"
}

node_up() {
  real_node_enabled || return 0
  node_network_up
  node_containerd_up
  node_cgroups_up
  node_kubelet_up
}

# Removes everything the node made, inside and outside the run folder; safe to run twice and on
# a half-made node.
node_down() {
  [ -f "$NODE_DIR/env" ] || return 0
  node_names
  stop_component kubelet
  # With the kubelet gone nothing recreates sandboxes: remove them through the CRI, so the CNI
  # plugins release addresses and veths and containerd unmounts netns and rootfs.
  if [ -S "$CONTAINERD_SOCKET" ] && [ -x "$BIN_DIR/nodeprobe" ]; then
    timeout 90 "$BIN_DIR/nodeprobe" remove-all "$CONTAINERD_SOCKET" >/dev/null 2>&1 || true
  fi
  stop_component containerd
  # Whatever outlived that: shims of this containerd, and containers under this runc root.
  pkill -KILL -f -- "-address $CONTAINERD_SOCKET" 2>/dev/null || true
  local ns id
  for ns in "$NODE_DIR"/runc/*/; do
    [ -d "$ns" ] || continue
    for id in $(runc --root "$ns" list -q 2>/dev/null); do
      runc --root "$ns" delete --force "$id" >/dev/null 2>&1 || true
    done
  done
  stop_component api-relay
  # Mounts under the run folder (overlay rootfs, shm, netns, volumes), deepest first.
  awk -v d="$RUN_DIR/" 'index($2, d) == 1 { print $2 }' /proc/self/mounts | sort -r |
    while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
  local veth
  for veth in $(ip -o link show master "$NODE_BRIDGE" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
    ip link delete "$veth" 2>/dev/null || true
  done
  ip link delete "$NODE_BRIDGE" 2>/dev/null || true
  while node_rule_dnat -D 2>/dev/null; do :; done
  while node_rule_relay_only -D 2>/dev/null; do :; done
  local h
  for h in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
    [ -d "$h$NODE_CGROUP" ] || continue
    find "$h$NODE_CGROUP" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  # The two paths the kubelet and libcni write outside any folder they are given.
  find /var/log/containers -maxdepth 1 -type l -lname "$NODE_DIR/*" -delete 2>/dev/null || true
  rm -f /var/lib/cni/results/"$NODE_CNI_NETWORK"-* 2>/dev/null || true
  rm -rf "$SHIM_SOCKET_DIR"
  if [ -f "$NODE_DIR/created-paths" ]; then
    # The kubelet's device-plugin socket has a fixed path: it stays while another kubelet runs.
    pgrep -x kubelet >/dev/null || rm -f /var/lib/kubelet/device-plugins/kubelet.sock
    local p
    while read -r p; do
      [ -d "$p" ] && find "$p" -depth -type d -empty -delete 2>/dev/null
    done < "$NODE_DIR/created-paths"
  fi
  if [ -f "$NODE_DIR/sysctls.before" ]; then
    local line
    while read -r line; do
      [ -n "${line#*=}" ] && sysctl -qw "$line" 2>/dev/null || true
    done < "$NODE_DIR/sysctls.before"
  fi
}
