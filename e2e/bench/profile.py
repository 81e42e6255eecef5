#!/usr/bin/env python3
"""Driver of `make bench-profile` (see profile.sh, which starts the control plane and `splice run`):
17 InjectionPolicies over 3 namespace selectors and 2 object selectors, all selecting the load
namespace's pods, then CONCURRENT clients sending server-side dry-run pod creates for DURATION
seconds while `perf record` samples the Splice process. Prints where Splice's CPU time per create
goes, by the crate of the sampled function (self time), grouped as TLS, HTTP, reading the review,
planning, the patch, the response, allocation and copies, the runtime, and the kernel.
"""

import argparse
import concurrent.futures as cf
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from controller import Api  # noqa: E402  (the same admin-certificate client)

NS = "bench-profile-load"
# (namespace label, object selector) per policy: 6 + 6 + 5 over three namespace selectors, some
# with an object selector the load pod matches.
SHAPES = [("profile-a", None)] * 3 + [("profile-a", {"app": "load"})] * 3 \
    + [("profile-b", None)] * 3 + [("profile-b", {"tier": "web"})] * 3 \
    + [("profile-c", None)] * 3 + [("profile-c", {"app": "load", "tier": "web"})] * 2
POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"generateName": "load-", "labels": {"app": "load", "tier": "web"}},
    "spec": {"containers": [{"name": "app", "image": "registry.invalid/app:1",
                             "env": [{"name": f"E{i}", "value": "x" * 40} for i in range(20)]}]},
}

# First match wins: (bucket, pattern over "dso symbol").
BUCKETS = [
    ("kernel (syscalls, TCP)", r"^\[kernel\]"),
    ("TLS (rustls, ring/aws-lc)", r"rustls|ring::|ring_core|aws_lc|aes|gcm|chacha|sha2|p256|ecp_nistz|GFp_|x25519"),
    ("HTTP (hyper, httparse)", r"hyper|httparse|http::|h2::|http_body"),
    ("reading the review (the pod, per policy)", r"splice_server::admission|splice_engine::(pod|view)|splice_json|scan_|serde_json::de|serde_json::read|parse_str|from_utf8"),
    ("the patch and response (JSON out)", r"patch|base64|serde_json::ser|serde_json::value::ser|to_vec|format_escaped"),
    ("planning (engine)", r"splice_engine|minijinja|splice_server::server::handler"),
    ("allocation and copies", r"malloc|free|realloc|memcpy|memmove|memset|memcmp|alloc::|\bmi_|_mi_|unlink_chunk"),
    ("runtime and hashing (tokio, std)", r"tokio|std::|core::|parking_lot|futex|mio::|crossbeam|hashbrown|indexmap|sip::"),
]


def policy(api, i, label, objects):
    spec = {
        "mode": "Webhook",
        "failurePolicy": "Ignore",
        "namespaceSelector": {"matchLabels": {label: "on"}},
        "template": {"containers": [{"name": f"sidecar-{i:02}",
                                     "image": f"registry.invalid/sidecar-{i:02}:1",
                                     "env": [{"name": "POLICY", "value": str(i)}]}]},
    }
    if objects:
        spec["objectSelector"] = {"matchLabels": objects}
    api.json("POST", "/apis/splice.dev/v1alpha1/injectionpolicies", {
        "apiVersion": "splice.dev/v1alpha1",
        "kind": "InjectionPolicy",
        "metadata": {"name": f"profile-{i:02}", "labels": {"e2e.splice.dev/instance": "bench"}},
        "spec": spec,
    })


def create(api):
    status, text = api.call("POST", f"/api/v1/namespaces/{NS}/pods?dryRun=All", POD)
    if status != 201:
        return -1
    return sum(1 for c in json.loads(text)["spec"]["containers"] if c["name"].startswith("sidecar-"))


def calls(api):
    """Calls the API server made to every Splice webhook so far (all operations)."""
    _, text = api.call("GET", "/metrics", ctype="text/plain")
    total = 0.0
    for line in text.decode().splitlines():
        if line.startswith("apiserver_admission_webhook_admission_duration_seconds_count{") \
                and 'splice.dev"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--duration", type=float, default=30)
    ap.add_argument("--concurrent", type=int, default=32)
    ap.add_argument("--perf-data", required=True)
    ap.add_argument("--out")
    args = ap.parse_args()
    api = Api(args.kubeconfig)
    api.json("POST", "/api/v1/namespaces", {"metadata": {"name": NS, "labels": {
        "profile-a": "on", "profile-b": "on", "profile-c": "on"}}})
    for i, (label, objects) in enumerate(SHAPES):
        policy(api, i, label, objects)
    deadline = time.time() + 120
    while create(api) != len(SHAPES):
        if time.time() > deadline:
            sys.exit(f"profile: the pod never got all {len(SHAPES)} sidecars")
        time.sleep(0.5)
    for _ in range(200):
        create(api)

    stop = threading.Event()
    counts = {"ok": 0, "bad": 0}
    lock = threading.Lock()

    def client():
        while not stop.is_set():
            got = create(api)
            with lock:
                counts["ok" if got == len(SHAPES) else "bad"] += 1

    calls_before = calls(api)
    cpu_before = cpu_seconds(args.pid)
    perf = subprocess.Popen(["perf", "record", "-F", "997", "-p", str(args.pid), "-o",
                             args.perf_data], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started = time.time()
    with cf.ThreadPoolExecutor(args.concurrent) as pool:
        for _ in range(args.concurrent):
            pool.submit(client)
        time.sleep(args.duration)
        stop.set()
    wall = time.time() - started
    perf.send_signal(signal.SIGINT)
    perf.wait()
    cpu = cpu_seconds(args.pid) - cpu_before
    made = calls(api) - calls_before
    creates = counts["ok"] + counts["bad"]

    report = subprocess.run(["perf", "report", "-i", args.perf_data, "--no-children", "--sort",
                             "dso,sym", "--stdio", "--percent-limit", "0"],
                            capture_output=True, text=True, check=True).stdout
    shares = {name: 0.0 for name, _ in BUCKETS}
    shares["other"] = 0.0
    for line in report.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(.*)$", line)
        if not m:
            continue
        share, what = float(m.group(1)), m.group(2)
        # Classify by the symbol alone: a binary's file name ("splice-mimalloc") says nothing.
        dso, _, symbol = what.partition("] ")
        if "[kernel" in dso:
            symbol = "[kernel] " + symbol
        for name, pattern in BUCKETS:
            if re.search(pattern, symbol, re.IGNORECASE):
                shares[name] += share
                break
        else:
            shares["other"] += share
    per_create = cpu / creates * 1e6 if creates else 0.0
    lines = [
        f"{creates} dry-run creates in {wall:.0f} s ({creates / wall:.0f}/s) from "
        f"{args.concurrent} clients, {counts['bad']} without all {len(SHAPES)} sidecars; "
        f"{made / creates if creates else 0:.2f} webhook calls per create; Splice CPU "
        f"{cpu:.1f} s = {per_create:.0f} µs per create",
        "",
        "| where Splice's CPU goes (perf, self time) | share | µs per create |",
        "|---|---|---|",
    ]
    for name, share in sorted(shares.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {name} | {share:.1f}% | {per_create * share / 100:.0f} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    top = [l for l in report.splitlines() if re.match(r"\s*[\d.]+%", l)][:25]
    print("\ntop symbols:\n" + "\n".join(top), file=sys.stderr)


if __name__ == "__main__":
    main()
