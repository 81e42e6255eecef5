#!/usr/bin/env python3
"""Driver of `make bench-controller` (see controller.sh, which starts the control plane and
`splice run`). Talks to the API server directly over HTTPS with the admin client certificate of the
local control plane, and counts Splice's API writes from the API server's own
`apiserver_request_total` counters: writes to injectionpolicies/status, the webhook
configurations (mutating and validating), the in-tree MutatingAdmissionPolicies and their bindings,
and events. The driver never writes any of those itself (it only creates, patches and deletes
policies' main resource, namespaces and pods), so every such write is Splice's. Lease renewals
(leader election) are reported apart.

The webhook rows pin every policy to `mode: Webhook` (static templates run in-tree under the
default `Auto`); the in-tree rows apply as many `mode: InTree` policies of their own, then delete
them before the webhook rows go on.
"""

import argparse
import concurrent.futures as cf
import http.client
import json
import os
import re
import ssl
import statistics
import subprocess
import sys
import threading
import time

import yaml

SPLICE_WRITES = ("injectionpolicies/status", "mutatingwebhookconfigurations",
                 "validatingwebhookconfigurations", "mutatingadmissionpolicies",
                 "mutatingadmissionpolicybindings", "events")
WRITE_VERBS = {"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"}
GROUP = "/apis/splice.dev/v1alpha1/injectionpolicies"


class Api:
    def __init__(self, kubeconfig):
        with open(kubeconfig) as f:
            cfg = yaml.safe_load(f)
        cluster = cfg["clusters"][0]["cluster"]
        user = cfg["users"][0]["user"]
        m = re.match(r"https://([^:/]+):(\d+)", cluster["server"])
        self.host, self.port = m.group(1), int(m.group(2))
        self.ctx = ssl.create_default_context(cafile=cluster["certificate-authority"])
        self.ctx.load_cert_chain(user["client-certificate"], user["client-key"])
        self.local = threading.local()

    def conn(self):
        c = getattr(self.local, "c", None)
        if c is None:
            c = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=60)
            self.local.c = c
        return c

    def call(self, method, path, body=None, ctype="application/json"):
        for attempt in range(3):
            c = self.conn()
            try:
                headers = {"Accept": "application/json", "User-Agent": "splice-bench-controller"}
                data = None
                if body is not None:
                    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
                    headers["Content-Type"] = ctype
                c.request(method, path, body=data, headers=headers)
                r = c.getresponse()
                text = r.read()
                return r.status, text
            except (http.client.HTTPException, OSError):
                self.local.c = None
                if attempt == 2:
                    raise
        raise RuntimeError("unreachable")

    def json(self, method, path, body=None, ctype="application/json", ok=(200, 201)):
        status, text = self.call(method, path, body, ctype)
        if status not in ok:
            raise RuntimeError(f"{method} {path}: {status} {text[:300]!r}")
        return json.loads(text) if text else None


def writes(api):
    """Write requests by resource[/subresource] since the API server started."""
    status, text = api.call("GET", "/metrics")
    counts = {}
    for line in text.decode().splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels, _, value = line.rpartition(" ")
        lab = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if lab.get("verb") not in WRITE_VERBS:
            continue
        key = lab.get("resource", "")
        if lab.get("subresource"):
            key += "/" + lab["subresource"]
        counts[key] = counts.get(key, 0.0) + float(value)
    return counts


class Table:
    """A benchmark's markdown table: each row printed to stderr as it comes, then the table."""

    def __init__(self):
        self.rows = []

    def add(self, row):
        self.rows.append(row)
        print("bench: " + " | ".join(row), file=sys.stderr, flush=True)

    def write(self, out=None, preface=()):
        """Prints the table (after the `preface` lines) and writes it to `out` too, if given."""
        lines = list(preface) + ["| measurement | result | goal |", "|---|---|---|"]
        lines += [f"| {m} | {r} | {g} |" for m, r, g in self.rows]
        text = "\n".join(lines) + "\n"
        print(text)
        if out:
            with open(out, "w") as f:
                f.write(text)


def splice_writes(before, after):
    return {k: after.get(k, 0) - before.get(k, 0) for k in SPLICE_WRITES}


def describe(w):
    """Splice's writes by resource, the ones it made."""
    return ", ".join(f"{int(v)} {k}" for k, v in w.items() if v) or "none"


def ready(p):
    st = p.get("status") or {}
    if st.get("observedGeneration") != p["metadata"].get("generation"):
        return False
    return any(c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions", []))


PROBE_NS = "bench-probe"


def policy(i, instance, pods_ns, image="registry.invalid/sidecar:1", mode="Webhook", prefix="p"):
    # Ten policies inject a tenth of the bench pods each (by label); the rest select the empty
    # namespace PROBE_NS and a pod label no bench pod has, so the API server never calls them for
    # the bench pods, but the admission probe has a namespace to verify each of them in (with
    # labels of its own, so no baseline is shared: the probe's worst case).
    if i < 10:
        ns_sel = {"matchLabels": {"kubernetes.io/metadata.name": pods_ns}}
        obj_sel = {"matchLabels": {"bench.splice.dev/policy": f"p{i}"}}
    else:
        ns_sel = {"matchLabels": {"kubernetes.io/metadata.name": PROBE_NS}}
        obj_sel = {"matchLabels": {"bench.splice.dev/none": f"p{i}"}}
    spec = {
        "mode": mode,
        "namespaceSelector": ns_sel,
        "template": {
            "containers": [{"name": f"sidecar-{i}", "image": image}],
            # Unique per policy: a shared name with different values would be a conflict.
            "env": [{"name": f"BENCH_POLICY_{i}", "value": "1"}],
        },
    }
    if obj_sel:
        spec["objectSelector"] = obj_sel
    return {
        "apiVersion": "splice.dev/v1alpha1",
        "kind": "InjectionPolicy",
        "metadata": {"name": f"bench-{prefix}{i:04d}",
                     "labels": {"e2e.splice.dev/instance": instance}},
        "spec": spec,
    }


def dry_run_creates(api):
    """Dry-run pod creates (the admission probe's requests) since the API server started."""
    status, text = api.call("GET", "/metrics")
    total = 0.0
    for line in text.decode().splitlines():
        if line.startswith("apiserver_request_total{"):
            labels, _, value = line.rpartition(" ")
            lab = dict(re.findall(r'(\w+)="([^"]*)"', labels))
            if (lab.get("resource") == "pods" and lab.get("verb") == "POST"
                    and lab.get("dry_run") == "All" and not lab.get("subresource")):
                total += float(value)
    return total


def cpu_seconds(pid):
    """User + system CPU time of a process, from /proc (clock ticks)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def verified(p):
    st = p.get("status") or {}
    return any(c["type"] == "Verified" for c in st.get("conditions", []))


def create_namespace(api, name):
    """Creates the namespace (if absent) and waits for its default ServiceAccount, without which
    no pod can be created there."""
    api.json("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                            "metadata": {"name": name}}, ok=(201, 409))
    for _ in range(100):
        s, _ = api.call("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default")
        if s == 200:
            break
        time.sleep(0.2)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def reconcile_count(admin):
    """Splice's own count of reconciles so far (`splice_reconcile_total`, every result), or
    "?" without an admin port."""
    if not admin:
        return "?"
    import urllib.request
    text = urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=10).read().decode()
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("splice_reconcile_total{")))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--instance", required=True)
    ap.add_argument("--splice-pid", type=int, required=True)
    ap.add_argument("--policies", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=10000)
    ap.add_argument("--idle", type=int, default=120)
    ap.add_argument("--changes", type=int, default=30)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--out")
    ap.add_argument("--admin", type=int, help="splice run's admin port (its /metrics)")
    ap.add_argument("--splice-bin", help="runs `splice rotate` for the CA-rotation row")
    ap.add_argument("--splice-namespace", default="splice-system")
    ap.add_argument("--rotation-timeout", type=int, default=300)
    ap.add_argument("--rotation", type=int, default=1, help="0: skip the CA-rotation row")
    ap.add_argument("--probe", type=int, default=1,
                    help="0: splice run was started with --probe-interval 0")
    ap.add_argument("--probe-timeout", type=int, default=1200)
    ap.add_argument("--intree", type=int, default=1000,
                    help="in-tree policies for the in-tree rows (0: skip them)")
    a = ap.parse_args()
    api = Api(a.kubeconfig)
    pool = cf.ThreadPoolExecutor(a.threads)
    pods_ns = "bench-pods"
    table = Table()
    add = table.add

    def log(msg):
        print(f"bench: {msg}", file=sys.stderr, flush=True)

    def list_policies():
        sel = f"e2e.splice.dev/instance={a.instance}"
        return api.json("GET", f"{GROUP}?labelSelector={sel}")["items"]

    # The namespace the admission probe verifies most policies in; it has no pods.
    create_namespace(api, PROBE_NS)

    # 1. N policies at once.
    before = writes(api)
    t0 = time.monotonic()
    list(pool.map(lambda i: api.json("POST", GROUP, policy(i, a.instance, pods_ns)),
                  range(a.policies)))
    created = time.monotonic() - t0
    log(f"{a.policies} policies created in {created:.1f}s; waiting for Ready")
    while True:
        items = list_policies()
        n = sum(1 for p in items if ready(p))
        if n == a.policies:
            break
        if time.monotonic() - t0 > 600:
            raise SystemExit(f"only {n}/{a.policies} Ready after 600 s")
        time.sleep(0.5)
    all_ready = time.monotonic() - t0
    reconciles = reconcile_count(a.admin)
    # The probe's first round: every policy gets its Verified condition (one status write each).
    if a.probe:
        while True:
            items = list_policies()
            n = sum(1 for p in items if verified(p))
            if n == a.policies:
                break
            if time.monotonic() - t0 > a.probe_timeout:
                raise SystemExit(f"only {n}/{a.policies} Verified after {a.probe_timeout} s")
            time.sleep(2)
        all_verified = time.monotonic() - t0
        results = {}
        for p in items:
            c = next(c for c in p["status"]["conditions"] if c["type"] == "Verified")
            results[c["reason"]] = results.get(c["reason"], 0) + 1
    time.sleep(10)  # let trailing writes (Events) land before the idle window
    after_ready = writes(api)
    w = splice_writes(before, after_ready)
    total = sum(w.values())
    add((f"{a.policies} policies applied at once: time until all Ready",
                 f"{all_ready:.1f} s (creates took {created:.1f} s; {reconciles} reconciles)",
                 "<= 60 s"))
    if a.probe:
        add((f"admission probe's first round: time until all {a.policies} policies have "
             f"Verified (at most 5 requests/s)",
             f"{all_verified:.1f} s from the creates; results {json.dumps(results)}", "-"))
    add(("API writes per webhook policy (every resource Splice writes"
         + (", with the probe's one Verified write)" if a.probe else ")"),
                 f"{total / a.policies:.2f} ({describe(w)})",
                 "<= 2 (+1 with the probe)"))
    log(f"idle for {a.idle}s")
    probes_before = dry_run_creates(api)
    cpu_before = cpu_seconds(a.splice_pid)
    idle_t0 = time.monotonic()
    time.sleep(a.idle)
    idle_took = time.monotonic() - idle_t0
    cpu = cpu_seconds(a.splice_pid) - cpu_before
    probes = dry_run_creates(api) - probes_before
    after_idle = writes(api)
    wi = splice_writes(after_ready, after_idle)
    add((f"admission probe in steady state ({'on' if a.probe else 'off'}): dry-run pod "
         f"creates per policy per minute, and the leader's CPU, over {a.idle} s idle",
         f"{probes / a.policies / (idle_took / 60):.3f} requests/policy/min "
         f"({int(probes)} dry runs, {probes / idle_took:.2f}/s); CPU "
         f"{cpu / idle_took * 100:.1f} % of a core ({cpu:.1f} s)", "<= 5 requests/s in all"))
    leases = after_idle.get("leases", 0) - after_ready.get("leases", 0)
    add((f"Splice writes over {a.idle} s idle afterwards",
                 f"{int(sum(wi.values()))} {json.dumps({k: int(v) for k, v in wi.items()})} "
                 f"(+{int(leases)} Lease renewals)", "0"))

    # 1b. As many in-tree policies at once, then gone again.
    if a.intree:
        intree_rows(api, a, pool, list_policies, add, log)

    # 2. Template changes on one policy with N present.
    name = "bench-p0500" if a.policies > 500 else "bench-p0000"
    lat = []
    for k in range(a.changes):
        p = api.json("GET", f"{GROUP}/{name}")
        old_hash = (p.get("status") or {}).get("templateHash")
        patch = {"spec": {"template": {"containers": [
            {"name": "sidecar-x", "image": f"registry.invalid/sidecar:{k + 2}"}]}}}
        t = time.monotonic()
        p = api.json("PATCH", f"{GROUP}/{name}", patch, "application/merge-patch+json")
        gen = p["metadata"]["generation"]
        while True:
            q = api.json("GET", f"{GROUP}/{name}")
            st = q.get("status") or {}
            if st.get("observedGeneration") == gen and st.get("templateHash") not in (None, old_hash):
                break
            if time.monotonic() - t > 30:
                raise SystemExit(f"template change {k} not reflected in 30 s")
            time.sleep(0.01)
        lat.append(time.monotonic() - t)
    lat.sort()
    p99 = lat[min(len(lat) - 1, int(round(0.99 * (len(lat) - 1))))]
    add((f"template change on one policy with {a.policies} present: until status shows it "
                 f"({a.changes} changes)",
                 f"p50 {statistics.median(lat) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, "
                 f"max {lat[-1] * 1000:.0f} ms", "p99 <= 1 s"))

    # 3. Pods on kwok nodes, then Splice's resident memory.
    create_namespace(api, pods_ns)
    rss_before = rss_kib(a.splice_pid)

    def make_pod(i):
        labels = {"app": "bench"}
        if i % 10 == 0:
            labels["bench.splice.dev/policy"] = f"p{(i // 10) % 10}"
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"pod-{i:05d}", "labels": labels},
                "spec": {"nodeName": f"kwok-node-{i % 2}",
                         "containers": [{"name": "app", "image": "registry.invalid/app:1"}]}}
        api.json("POST", f"/api/v1/namespaces/{pods_ns}/pods", body)

    t = time.monotonic()
    list(pool.map(make_pod, range(a.pods), chunksize=50))
    pods_time = time.monotonic() - t
    log(f"{a.pods} pods created in {pods_time:.1f}s")
    peak = 0
    for _ in range(30):  # coverage passes run every 5 s; sample while they count
        peak = max(peak, rss_kib(a.splice_pid))
        time.sleep(1)
    rss = rss_kib(a.splice_pid)
    bin_path = a.splice_bin or ""
    build = ("release" if "/release/" in bin_path else "debug" if "/debug/" in bin_path
             else "given")
    add((f"resident memory of splice run ({build} build), {a.policies} policies + {a.pods} pods "
                 f"(created in {pods_time:.0f} s)",
                 f"{rss / 1024:.1f} MiB after (peak sampled {peak / 1024:.1f} MiB; "
                 f"{rss_before / 1024:.1f} MiB before the pods)", "<= 100 MB"))
    cov = [(p["metadata"]["name"], (p.get("status") or {}).get("coverage"))
           for p in list_policies()]
    covered = [c for _, c in cov if c]
    add(("coverage written for the policies that select bench pods",
                 f"{len(covered)} policies, {sum(c['matched'] for c in covered)} matched, "
                 f"{sum(c['current'] for c in covered)} current, "
                 f"{sum(c['missed'] for c in covered)} missed", "-"))

    # 4. A CA rotation across every policy's webhook configuration, with pods admitted throughout.
    if a.splice_bin and a.rotation:
        add(ca_rotation(api, a, pods_ns, log))

    table.write(a.out)


def intree_rows(api, a, pool, list_policies, add, log):
    """`a.intree` policies of mode InTree applied at once: the time until all are Ready and
    Splice's writes per policy (status, MutatingAdmissionPolicy, binding, Events); then deleted,
    and the time until their in-tree objects are gone."""
    before = writes(api)
    t0 = time.monotonic()
    list(pool.map(lambda i: api.json("POST", GROUP, policy(i, a.instance, "bench-pods",
                                                           mode="InTree", prefix="t")),
                  range(a.intree)))
    log(f"{a.intree} in-tree policies created; waiting for Ready")
    names = {f"bench-t{i:04d}" for i in range(a.intree)}
    while True:
        n = sum(1 for p in list_policies() if p["metadata"]["name"] in names and ready(p))
        if n == a.intree:
            break
        if time.monotonic() - t0 > 600:
            raise SystemExit(f"only {n}/{a.intree} in-tree policies Ready after 600 s")
        time.sleep(0.5)
    all_ready = time.monotonic() - t0
    time.sleep(10)  # trailing Events
    w = splice_writes(before, writes(api))
    add((f"{a.intree} in-tree policies (mode: InTree) applied at once: time until all Ready",
         f"{all_ready:.1f} s", "-"))
    add(("API writes per in-tree policy (every resource Splice writes)",
         f"{sum(w.values()) / a.intree:.2f} ({describe(w)})", "-"))
    list(pool.map(lambda n: api.call("DELETE", f"{GROUP}/{n}"), sorted(names)))
    maps = "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies"
    while True:
        left = [m for m in api.json("GET", maps)["items"]
                if m["metadata"]["name"].startswith("splice-bench-t")]
        if not left:
            break
        if time.monotonic() - t0 > 900:
            raise SystemExit(f"{len(left)} in-tree objects left after their policies' deletion")
        time.sleep(1)
    log("in-tree policies deleted and their objects gone")


def ca_rotation(api, a, pods_ns, log):
    """`splice rotate`, then the time until the CA Secret's rotation phase is back to Stable (the
    new CA in every bundle, serving from it, the old CA removed), while pods that one policy
    injects are created at ~10/s. A pod is a failed admission when the create fails or when it
    comes back without the sidecar (failurePolicy Ignore hides a TLS failure that way)."""
    secret = f"/api/v1/namespaces/{a.splice_namespace}/secrets/splice-ca"

    def phase():
        s = api.json("GET", secret)
        return (s["metadata"].get("annotations") or {}).get("splice.dev/ca-rotation-phase", "Stable")

    stop = threading.Event()
    counts = {"created": 0, "failed": 0, "uninjected": 0}

    def load():
        i = 0
        while not stop.is_set():
            body = {"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": f"rot-{i:05d}",
                                 "labels": {"bench.splice.dev/policy": "p1"}},
                    "spec": {"nodeName": f"kwok-node-{i % 2}",
                             "containers": [{"name": "app", "image": "registry.invalid/app:1"}]}}
            status, text = api.call("POST", f"/api/v1/namespaces/{pods_ns}/pods", body)
            if status != 201:
                counts["failed"] += 1
            else:
                names = [c["name"] for c in json.loads(text)["spec"]["containers"]]
                counts["created"] += 1
                if "sidecar-1" not in names:
                    counts["uninjected"] += 1
            i += 1
            time.sleep(0.1)

    worker = threading.Thread(target=load)
    worker.start()
    time.sleep(2)
    t0 = time.monotonic()
    env = dict(os.environ, KUBECONFIG=a.kubeconfig)
    subprocess.run([a.splice_bin, "rotate", "--namespace", a.splice_namespace], check=True, env=env)
    left_stable = None
    phases = []
    while True:
        p = phase()
        if not phases or phases[-1] != p:
            phases.append(p)
            log(f"CA rotation phase {p} at {time.monotonic() - t0:.1f}s")
        if p != "Stable" and left_stable is None:
            left_stable = time.monotonic()
        if p == "Stable" and left_stable is not None:
            break
        if time.monotonic() - t0 > a.rotation_timeout:
            break
        time.sleep(0.2)
    took = time.monotonic() - t0
    done = phases[-1] == "Stable" and left_stable is not None
    time.sleep(2)
    stop.set()
    worker.join()
    bad = counts["failed"] + counts["uninjected"]
    return (f"CA rotation across {a.policies} webhook configurations (splice rotate until the "
            f"phase is Stable again; phases {' -> '.join(phases)})",
            f"{took:.1f} s{'' if done else ' (NOT complete: stopped waiting)'}; {bad} failed admissions of {counts['created'] + counts['failed']} pods "
            f"created during it ({counts['failed']} errors, {counts['uninjected']} not injected)",
            "0 failed")


if __name__ == "__main__":
    main()
