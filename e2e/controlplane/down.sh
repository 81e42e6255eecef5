#!/usr/bin/env bash
# Stops exactly the processes up.sh recorded and removes the run folder.
#   down.sh [--keep-logs]   --keep-logs leaves the run folder for inspection (used when up fails)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=common.sh
source "$here/common.sh"
# shellcheck source=node.sh
source "$here/node.sh"
BIN_DIR=$("$here/build.sh" --print-bin-dir)

[ -d "$RUN_DIR" ] || { echo "no control plane at $RUN_DIR"; exit 0; }
# The real node first, while the API server still answers: its pods, network, mounts and cgroups.
node_down
# Reverse start order: kwok and the controllers first, etcd last, so nothing logs a dead backend.
order="splice kwok kube-scheduler kube-controller-manager kube-apiserver etcd"
for name in $order; do stop_component "$name"; done
for pid in $(recorded_pids); do kill -KILL "$pid" 2>/dev/null || true; done
if [ "${1:-}" = "--keep-logs" ]; then
  echo "control plane stopped; logs kept in $RUN_DIR/logs"
else
  rm -rf "$RUN_DIR"
  echo "control plane stopped and $RUN_DIR removed"
fi
