#!/usr/bin/env bash
# `make bench-webhook`: Splice's admission server against agnhost's reference webhook and against
# a null handler on Splice's own stack, in one run, on this machine, printing a markdown table.
#
# Same ECDSA P-256 certificate, same 8.5 KB pod in an admission.k8s.io/v1 AdmissionReview, server
# pinned to one core and the load generator to another, HTTP/1.1 keep-alive. Columns:
#   max req/s       best of wrk runs at several connection counts (wrk, keep-alive)
#   server util     server CPU time / wall time during that run (1.00 = the whole core)
#   CPU µs/req      server utime+stime delta (/proc/PID/stat) / requests, same run
#   req/s per core  1e6 / (CPU µs/req): throughput if the server had the whole core
#   p50/p99/p99.9   at a constant half of that server's max rate (oha -q), twice:
#                   latency-corrected with LAT_CONNS connections (measured from when each request
#                   was due, so it includes any lag of oha's own schedule: the null ceiling's
#                   figure shows that floor), and service latency (from when it was sent) with
#                   SERVICE_CONNS connections
#   RSS             VmRSS idle (after start and one request), peak VmRSS sampled under load, VmHWM
#   CPU µs/handshake server CPU per fresh TLS connection (openssl s_time -new: full handshakes)
#   run-queue wait  time the server's threads were runnable but not running during the latency run
#                   (/proc/PID/task/*/schedstat), per second: other processes on the server's core
#                   (a shared machine, a compiler) show up here and in the tail latencies, not in
#                   the server's CPU cost. Near 0 on an idle machine for a server with one busy
#                   thread; a server whose own threads (GC, runtime) take turns on its one core also
#                   accrues it.
#
# Environment: DURATION (s per wrk run, default 10), CONNS (default "8 32 64"), LAT_DURATION
# (default 15), LAT_CONNS (default 32), SERVICE_CONNS (default 4), SERVER_CPU (0), CLIENT_CPU (1), AGNHOST (path; default from the control-plane
# build cache), SPLICE_BIN (use this binary instead of building one), OUT (also write the table
# to this file), RT=1 (run servers and load generators under SCHED_FIFO with chrt, so that other
# processes on a shared machine cannot delay them: a control for the latency columns), ROUNDS
# (default 5; 0 skips the paired rounds), PAIR_DURATION (s, default 4), PAIR_CONNS (default 8).
#
# After the table, paired rounds: both Splice servers up at once, short wrk runs alternating
# between /inject, /null and /null/read (the review read as /inject reads it, no engine), and the
# median over rounds of the per-round ratios (requests/s and CPU µs per request), which the
# machine's drift moves far less than the table's ratio.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
here="$repo/e2e/bench"
DURATION=${DURATION:-10}
CONNS=${CONNS:-"8 32 64"}
LAT_DURATION=${LAT_DURATION:-15}
LAT_CONNS=${LAT_CONNS:-32}
SERVICE_CONNS=${SERVICE_CONNS:-4}
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
POLICY_FILE=${POLICY_FILE:-$repo/webhook/testdata/policy-sidecar.yaml}
POD_FILE=${POD_FILE:-$repo/webhook/testdata/pod-8k.json}
POLICY_NAME=${POLICY_NAME:-mesh-proxy}
ROUNDS=${ROUNDS:-5}
PAIR_DURATION=${PAIR_DURATION:-4}
PAIR_CONNS=${PAIR_CONNS:-8}
NAMESPACE=${NAMESPACE:-shop}
clk_tck=$(getconf CLK_TCK)
prio=()
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
if [ "${RT:-0}" = 1 ]; then prio=(chrt -f 10); fi

log() { echo "bench: $*" >&2; }
die() { echo "bench: error: $*" >&2; exit 1; }

work=$(mktemp -d)
server_pid=""
other_pid="" # the paired rounds' first server while the second runs
cleanup() {
  local pid
  for pid in $server_pid $other_pid; do
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
  rm -rf "$work"
}
trap cleanup EXIT

# --- tools -------------------------------------------------------------------------------------
[ "$(nproc)" -ge 2 ] || die "needs 2 CPUs (server and load generator on separate cores)"
command -v taskset >/dev/null || die "taskset (util-linux) is required"
command -v openssl >/dev/null || die "openssl is required"
command -v python3 >/dev/null || die "python3 is required"
if ! command -v wrk >/dev/null; then
  log "installing wrk (Debian package)"
  if [ "$(id -u)" = 0 ]; then apt-get install -y -qq wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk >/dev/null; }
  else sudo apt-get install -y -qq wrk >/dev/null; fi
fi
if ! command -v oha >/dev/null; then
  log "installing oha (cargo install; once)"
  cargo install oha --locked --quiet
fi
export PATH="$HOME/.cargo/bin:$PATH"

# --- build and fixtures --------------------------------------------------------------------------
if [ -n "${SPLICE_BIN:-}" ]; then
  splice=$SPLICE_BIN
else
  log "building splice (release)"
  (cd "$repo" && cargo build --release -p splice --features bench-baselines --quiet)
  target_dir=$(cd "$repo" && cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
  splice="$target_dir/release/splice"
fi
[ -x "$splice" ] || die "no release binary at $splice"

agnhost=${AGNHOST:-$("$repo/e2e/controlplane/build.sh" --print-bin-dir 2>/dev/null)/agnhost}
if [ ! -x "$agnhost" ]; then
  log "agnhost not found at $agnhost (run 'make controlplane'); its row is skipped"
  agnhost=""
fi

openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$work/key.pem" 2>/dev/null
openssl req -x509 -new -key "$work/key.pem" -out "$work/cert.pem" -days 2 -subj "/CN=bench-webhook" \
  -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" 2>/dev/null
python3 "$here/webhook_util.py" review "$POD_FILE" "$NAMESPACE" >"$work/review.json"
review_bytes=$(wc -c <"$work/review.json")
pod_bytes=$(wc -c <"$POD_FILE")

cat >"$work/post.lua" <<EOF
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = assert(io.open("$work/review.json", "rb"))
wrk.body = f:read("*a")
f:close()
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT requests=%d duration_us=%d errors=%d status=%d\n",
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status))
end
EOF

# --- helpers -----------------------------------------------------------------------------------
cpu_ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }
rss_kb() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status"; }
# Nanoseconds the process's threads spent runnable but waiting for a CPU (second schedstat field).
runq_wait_ns() { cat "/proc/$1"/task/*/schedstat 2>/dev/null | awk '{s += $2} END {printf "%.0f\n", s}'; }

run_oha() { # url rate conns [--latency-correction] -> $work/oha.json
  taskset -c "$CLIENT_CPU" "${prio[@]}" oha --no-tui --insecure -q "$2" -z "${LAT_DURATION}s" -c "$3" ${4:-} \
    -m POST -T application/json -D "$work/review.json" --output-format json "$1" >"$work/oha.json" 2>"$work/oha.err" \
    || { cat "$work/oha.err" >&2; die "oha failed on $1"; }
}

post_once() { # url -> response body
  curl -sk --max-time 5 -X POST -H 'Content-Type: application/json' --data-binary @"$work/review.json" "$1"
}

start_server() { # port cmd...
  local port=$1; shift
  taskset -c "$SERVER_CPU" "${prio[@]}" "$@" >"$work/server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 100); do
    if curl -sk --max-time 1 -o /dev/null "https://127.0.0.1:$port/"; then return 0; fi
    kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log" >&2; die "server exited: $*"; }
    sleep 0.1
  done
  cat "$work/server.log" >&2
  die "server did not come up: $*"
}

stop_server() {
  kill -TERM "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
}

run_wrk() { # url conns seconds -> "requests seconds errors"
  taskset -c "$CLIENT_CPU" "${prio[@]}" wrk -t1 -c"$2" -d"$3"s -s "$work/post.lua" "$1" >"$work/wrk.out" 2>&1 || true
  local line
  line=$(grep '^RESULT' "$work/wrk.out") || { cat "$work/wrk.out" >&2; die "wrk failed"; }
  python3 - "$line" <<'PY'
import sys
kv = dict(p.split("=") for p in sys.argv[1].split()[1:])
print(kv["requests"], int(kv["duration_us"]) / 1e6, int(kv["errors"]) + int(kv["status"]))
PY
}

measure() { # label url expect(patch|nopatch) port cmd...
  local label=$1 url=$2 expect=$3 port=$4; shift 4
  log "$label: starting"
  start_server "$port" "$@"
  local reply
  reply=$(post_once "$url")
  python3 "$here/webhook_util.py" check "$expect" <<<"$reply" || die "$label: unexpected reply: ${reply:0:300}"
  sleep 1
  local rss_idle; rss_idle=$(rss_kb "$server_pid" VmRSS)

  run_wrk "$url" 16 3 >/dev/null # warm-up
  local best_rps=0 best_line=""
  for c in $CONNS; do
    local t0 t1 sampler peak
    t0=$(cpu_ticks "$server_pid")
    ( peak=0; while kill -0 "$server_pid" 2>/dev/null; do
        r=$(rss_kb "$server_pid" VmRSS); [ "${r:-0}" -gt "$peak" ] && peak=$r; echo "$peak" >"$work/peak"; sleep 0.25
      done ) & sampler=$!
    local out reqs secs errs
    out=$(run_wrk "$url" "$c" "$DURATION")
    read -r reqs secs errs <<<"$out"
    t1=$(cpu_ticks "$server_pid")
    kill "$sampler" 2>/dev/null || true; wait "$sampler" 2>/dev/null || true
    peak=$(cat "$work/peak" 2>/dev/null || echo 0)
    [ "$errs" = 0 ] || die "$label: $errs errors or non-2xx responses at -c$c"
    local line
    line=$(python3 -c "
reqs, secs, ticks, tck = $reqs, $secs, $((t1 - t0)), $clk_tck
cpu_s = ticks / tck
print(f'{reqs/secs:.0f} {cpu_s/secs:.2f} {cpu_s*1e6/reqs:.1f} $c $peak')")
    log "$label: -c$c: $line (rps util us/req conns peakRSSkB)"
    local rps=${line%% *}
    if [ "$rps" -gt "$best_rps" ]; then best_rps=$rps; best_line=$line; fi
  done
  local hwm; hwm=$(rss_kb "$server_pid" VmHWM)

  local rate=$((best_rps / 2))
  log "$label: latency at $rate req/s for ${LAT_DURATION}s"
  local q0 q1
  q0=$(runq_wait_ns "$server_pid")
  run_oha "$url" "$rate" "$LAT_CONNS" --latency-correction
  q1=$(runq_wait_ns "$server_pid")
  local lat; lat=$(python3 "$here/webhook_util.py" oha "$work/oha.json") || die "$label: cannot read oha output"
  local runq; runq=$(python3 -c "print(f'{($q1 - $q0) / 1e6 / $LAT_DURATION:.1f}')")
  log "$label: service latency at $rate req/s, $SERVICE_CONNS connections"
  run_oha "$url" "$rate" "$SERVICE_CONNS"
  local svc; svc=$(python3 "$here/webhook_util.py" oha "$work/oha.json") || die "$label: cannot read oha output"

  log "$label: fresh TLS handshakes"
  local h0 h1 conns
  h0=$(cpu_ticks "$server_pid")
  taskset -c "$CLIENT_CPU" "${prio[@]}" openssl s_time -connect "127.0.0.1:$port" -new -time 5 >"$work/stime.out" 2>&1 || true
  h1=$(cpu_ticks "$server_pid")
  conns=$(sed -n 's/^\([0-9]*\) connections in [0-9.]* real seconds.*/\1/p' "$work/stime.out" | head -1)
  [ -n "$conns" ] && [ "$conns" -gt 0 ] || { cat "$work/stime.out" >&2; die "$label: s_time failed"; }
  local hs; hs=$(python3 -c "print(f'{$((h1 - h0)) / $clk_tck * 1e6 / $conns:.0f}')")

  stop_server
  # label|rps|util|us/req|conns|rss_idle|rss_peak|hwm|lat|handshake|handshakes|runq|service lat
  echo "$label|$best_line|$rss_idle|$hwm|$lat|$hs|$conns|$runq|$svc" | awk -F'|' '{
    split($2, b, " ");
    printf "%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s\n", $1, b[1], b[2], b[3], b[4], $3, b[5], $4, $5, $6, $7, $8, $9 }' >>"$work/rows"
}

# --- runs --------------------------------------------------------------------------------------
# Every Splice server of the run, short of its --listen address (and --null-handler).
splice_server=("$splice" webhook --policy "$POLICY_FILE" --tls-cert "$work/cert.pem"
  --tls-key "$work/key.pem" --workers 1)
port=18443
measure "splice /inject/$POLICY_NAME" "https://127.0.0.1:$port/inject/$POLICY_NAME" patch "$port" \
  "${splice_server[@]}" --listen "127.0.0.1:$port"
port=18444
measure "splice /null (baseline)" "https://127.0.0.1:$port/null" nopatch "$port" \
  "${splice_server[@]}" --listen "127.0.0.1:$port" --null-handler
if [ -n "$agnhost" ]; then
  port=18445
  measure "agnhost /mutating-pods-sidecar" "https://127.0.0.1:$port/mutating-pods-sidecar" patch "$port" \
    "$agnhost" webhook --tls-cert-file "$work/cert.pem" --tls-private-key-file "$work/key.pem" \
    --port "$port" --sidecar-image registry.example/sidecar:1.0
fi

# --- paired rounds ------------------------------------------------------------------------------
# This machine's speed drifts by tens of percent over minutes (a shared VM), so two servers
# measured minutes apart can differ by more than a code change does. Here both Splice servers run
# at once (only one is loaded at a time) and short wrk runs alternate between them: each round
# sees both in the same phase, and the median of the per-round ratios is the steady figure. The
# null server also serves /null/read, which reads the review as /inject does and stops before the
# engine: its column splits /inject's extra cost into reading the request and the rest.
paired() {
  local inject_url="https://127.0.0.1:18446/inject/$POLICY_NAME" null_url="https://127.0.0.1:18447/null"
  local read_url="https://127.0.0.1:18447/null/read"
  start_server 18446 "${splice_server[@]}" --listen "127.0.0.1:18446"
  local inject_pid=$server_pid
  other_pid=$inject_pid
  start_server 18447 "${splice_server[@]}" --listen "127.0.0.1:18447" --null-handler
  local null_pid=$server_pid
  run_wrk "$inject_url" "$PAIR_CONNS" 2 >/dev/null # warm-up
  run_wrk "$null_url" "$PAIR_CONNS" 2 >/dev/null
  run_wrk "$read_url" "$PAIR_CONNS" 2 >/dev/null
  local r pid url t0 t1 reqs secs errs
  for r in $(seq 1 "$ROUNDS"); do
    for pid_url in "$inject_pid $inject_url" "$null_pid $null_url" "$null_pid $read_url"; do
      read -r pid url <<<"$pid_url"
      t0=$(cpu_ticks "$pid")
      read -r reqs secs errs <<<"$(run_wrk "$url" "$PAIR_CONNS" "$PAIR_DURATION")"
      t1=$(cpu_ticks "$pid")
      [ "$errs" = 0 ] || die "paired round $r: $errs errors or non-2xx responses from $url"
      echo "$r $url $reqs $secs $((t1 - t0))" >>"$work/paired"
    done
  done
  stop_server
  server_pid=$inject_pid; other_pid=""; stop_server
  python3 "$here/webhook_util.py" paired "$work/paired" "$clk_tck" "$PAIR_CONNS" "$PAIR_DURATION"
}
if [ "$ROUNDS" -gt 0 ]; then
  log "paired rounds: $ROUNDS x ${PAIR_DURATION}s each, -c$PAIR_CONNS, alternating /inject, /null and /null/read"
  paired >"$work/paired.txt"
fi

python3 "$here/webhook_util.py" table "$work/rows" "$review_bytes" "$pod_bytes" "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)" "$load_start" "$LAT_CONNS" "$SERVICE_CONNS" | tee "${OUT:-/dev/null}"
if [ -s "$work/paired.txt" ]; then tee -a "${OUT:-/dev/null}" <"$work/paired.txt"; fi
