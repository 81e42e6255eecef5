#!/usr/bin/env python3
"""The load rows of `make bench-admission` (admission.sh runs this after admission.py, only with
the real node). Dry-run pod creates at C concurrent clients through the API server, sent by the
Rust generator e2e/src/bin/admission_load.rs, into
  splice17  namespace load-splice, served by the chart-installed Splice (namespace splice-cluster,
            instance bench-cluster) with 17 InjectionPolicies, mode Webhook, failurePolicy Fail,
            over 3 namespace selectors (load-a/load-b/load-c=on; the namespace carries all three)
            and object selectors app=load, tier=web or none; one policy (load-c-4) wants
            tier=db, which the load pod does not carry, so 16 sidecars are injected;
  agnhost   namespace load-agnhost, served by the agnhost pod behind its Service (admission.sh's
            agnhost-cluster arm), failurePolicy Fail, one sidecar;
  floor     namespace load-floor, no webhook: the pod sent already as splice17 leaves it (16
            sidecars and the record, less what the API server adds itself), so the row is what
            the API server and the generator cost for a pod of that size: the floor of any
            injector of 16 containers.
Per row: latency, errors, timeouts, the API server's calls to Splice's webhooks per create (its
apiserver_admission_webhook_admission_duration_seconds_count, type admit) and its mean measure
of one call (to Splice's webhooks, or agnhost's in the agnhost rows), Splice's CPU seconds
per 1000 creates (/proc/<pid>/stat of the processes in Splice's pods' cgroups) and RSS, and
the API server's CPU seconds per 1000 creates (its /proc/<pid>/stat). Then
fault rows (--faults, default 3): each a splice17 load at 32 clients during which one Splice pod
is deleted after 2 s, started once both replicas are Ready again.
"""

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from admission import histograms, plain_webhook  # noqa: E402  (the agnhost-cluster arm's entry)
from controller import Api  # noqa: E402  (the same admin-certificate client)

GROUP = "/apis/splice.dev/v1alpha1/injectionpolicies"
SPLICE_NS = "splice-cluster"
NS_SPLICE, NS_AGNHOST, NS_FLOOR = "load-splice", "load-agnhost", "load-floor"
# The pod admission_load sends unless given --pod.
LOAD_POD = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "load", "labels": {"app": "load", "tier": "web"}},
    "spec": {"containers": [{"name": "app", "image": "registry.invalid/app:1"}]},
}
MANAGED = "app.kubernetes.io/managed-by=splice"
AGNHOST_WEBHOOK = "bench-load-agnhost.bench.splice.dev"  # plain_webhook names it so


def policies():
    """(name, namespace selector key, object selector or None); 6 + 6 + 5 = 17."""
    out = []
    objects = [{"app": "load"}, {"tier": "web"}, None]
    for key, count in (("load-a", 6), ("load-b", 6), ("load-c", 5)):
        for i in range(count):
            sel = objects[i % 3]
            if key == "load-c" and i == 4:
                sel = {"tier": "db"}  # the pod is tier=web: this one must not inject
            out.append((f"{key}-{i}", key, sel))
    return out


INJECTED = sum(1 for _, _, sel in policies() if sel != {"tier": "db"})


def setup(api, agnhost_ns, agnhost_ca):
    api.json("POST", "/api/v1/namespaces", ok=(201, 409), body={"metadata": {
        "name": NS_SPLICE, "labels": {"load-a": "on", "load-b": "on", "load-c": "on"}}})
    # admission.py's webhook entries select namespaces by label bench-arm.
    api.json("POST", "/api/v1/namespaces", ok=(201, 409),
             body={"metadata": {"name": NS_AGNHOST, "labels": {"bench-arm": NS_AGNHOST}}})
    api.json("POST", "/api/v1/namespaces", ok=(201, 409), body={"metadata": {"name": NS_FLOOR}})
    for i, (name, key, sel) in enumerate(policies()):
        spec = {
            "mode": "Webhook",
            "failurePolicy": "Fail",
            "timeoutSeconds": 10,
            "namespaceSelector": {"matchLabels": {key: "on"}},
            "template": {"containers": [{"name": f"sidecar-{name}",
                                         "image": f"registry.invalid/{name}:1"}]},
        }
        if sel:
            spec["objectSelector"] = {"matchLabels": sel}
        # 409 and the merge patch below: a rerun against the same cluster updates the spec.
        api.json("POST", GROUP, ok=(201, 409), body={
            "apiVersion": "splice.dev/v1alpha1", "kind": "InjectionPolicy",
            "metadata": {"name": name, "labels": {"e2e.splice.dev/instance": "bench-cluster"}},
            "spec": spec,
        })
        api.json("PATCH", f"{GROUP}/{name}", {"spec": spec}, "application/merge-patch+json")
    with open(agnhost_ca, "rb") as f:
        bundle = base64.b64encode(f.read()).decode()
    try:
        plain_webhook(api, AGNHOST_WEBHOOK.split(".")[0],
                      {"namespace": agnhost_ns, "name": "agnhost",
                       "path": "/mutating-pods-sidecar", "port": 443},
                      bundle, NS_AGNHOST)
    except RuntimeError as e:  # a rerun: the entry is there already
        if " 409 " not in str(e):
            raise


def wait_ready(api, timeout=300):
    """Every load policy Ready=True with Fail in force (the availability guard holds Fail back
    until the Deployment and its budget have been sufficient for 60 s)."""
    names = {n for n, _, _ in policies()}
    deadline = time.time() + timeout
    while True:
        items = api.json("GET", GROUP)["items"]
        pending = []
        for p in items:
            if p["metadata"]["name"] not in names:
                continue
            st = p.get("status") or {}
            ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                        for c in st.get("conditions", []))
            if not ready or st.get("effectiveFailurePolicy") != "Fail":
                pending.append(f"{p['metadata']['name']}(ready={ready},"
                               f"fp={st.get('effectiveFailurePolicy')})")
        if not pending:
            return
        if time.time() > deadline:
            raise RuntimeError(f"policies not Ready with Fail after {timeout}s: {pending}")
        time.sleep(2)


def added(api, ns):
    status, text = api.call("POST", f"/api/v1/namespaces/{ns}/pods?dryRun=All",
                            json.dumps(LOAD_POD))
    if status != 201:
        return None
    return len(json.loads(text)["spec"]["containers"]) - 1


def floor_pod(api, path):
    """Writes to `path` the load pod as splice17 leaves it, less the ServiceAccount token volume
    and mounts, the server's metadata and the priority, which the API server adds again. The
    fields it defaulted stay, so the floor is if anything low."""
    status, text = api.call("POST", f"/api/v1/namespaces/{NS_SPLICE}/pods?dryRun=All",
                            json.dumps(LOAD_POD))
    if status != 201:
        raise RuntimeError(f"the floor's pod: dry-run create answered {status}: {text[:300]!r}")
    pod = json.loads(text)
    pod["metadata"] = {k: v for k, v in pod["metadata"].items()
                       if k in ("name", "labels", "annotations")}
    pod.pop("status", None)
    spec = pod["spec"]
    spec.pop("priority", None)
    token = {v["name"] for v in spec.get("volumes", []) if v["name"].startswith("kube-api-access-")}
    spec["volumes"] = [v for v in spec.get("volumes", []) if v["name"] not in token]
    for c in spec["containers"] + spec.get("initContainers", []):
        c["volumeMounts"] = [m for m in c.get("volumeMounts", []) if m["name"] not in token]
        if not c["volumeMounts"]:
            del c["volumeMounts"]
    if not spec["volumes"]:
        del spec["volumes"]
    with open(path, "w") as f:
        json.dump(pod, f)


def wait_live(api, timeout=120):
    """The API server has loaded every webhook entry: each namespace gets its sidecars."""
    deadline = time.time() + timeout
    for ns, want in ((NS_SPLICE, INJECTED), (NS_AGNHOST, 1)):
        while (got := added(api, ns)) != want:
            if time.time() > deadline:
                raise RuntimeError(f"{ns}: {got} containers injected, expected {want}")
            time.sleep(0.5)


def splice_webhooks(api):
    """Webhook names of the configurations Splice wrote."""
    cfgs = api.json("GET", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
                    f"?labelSelector={MANAGED}")["items"]
    return {w["name"] for c in cfgs for w in c.get("webhooks", [])}, len(cfgs)


def webhook_counts(api):
    """[calls, seconds] by webhook name (type admit) since the API server started: the seconds
    are the API server's own measure of each call, round trip included."""
    return histograms(api, "apiserver_admission_webhook_admission_duration_seconds", "name",
                      'type="admit"')


def mean_call_ms(before, after, names):
    """The mean call of `names` between two webhook_counts, in ms."""
    calls = sum(after.get(n, [0, 0])[0] - before.get(n, [0, 0])[0] for n in names)
    seconds = sum(after.get(n, [0, 0])[1] - before.get(n, [0, 0])[1] for n in names)
    return seconds / calls * 1000 if calls else None


def splice_pids(kubectl):
    """Processes in the cgroups of Splice's running pods (by pod UID, so nothing of another
    control plane or the local `splice run` is counted)."""
    out = subprocess.run([kubectl, "-n", SPLICE_NS, "get", "pods", "-o", "json"],
                         check=True, capture_output=True, text=True).stdout
    uids = [p["metadata"]["uid"] for p in json.loads(out)["items"]
            if p["status"].get("phase") == "Running"]
    keys = [u.replace("-", "_") for u in uids] + uids
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                cg = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if any(f"pod{k}" in cg for k in keys) and cmd and cmd[0].endswith(b"splice"):
            pids.append(int(pid))
    return pids


def apiserver_pids(api):
    """The kube-apiserver serving `api` (by its --secure-port)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith("kube-apiserver") and (
                f"--secure-port={api.port}" in cmd or any(
                    a == "--secure-port" and b == str(api.port) for a, b in zip(cmd, cmd[1:]))):
            pids.append(int(pid))
    return pids


def cpu_seconds(pids):
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def memory_mib(pids):
    """(max VmRSS, max VmHWM) in MiB over the processes."""
    rss = hwm = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss = max(rss, int(line.split()[1]))
                    elif line.startswith("VmHWM:"):
                        hwm = max(hwm, int(line.split()[1]))
        except OSError:
            continue
    return rss / 1024, hwm / 1024


def wait_replicas(kubectl, want=2, timeout=180):
    """`want` Splice pods Ready and none terminating: a fault row deletes one of a full set."""
    deadline = time.time() + timeout
    while True:
        out = subprocess.run([kubectl, "-n", SPLICE_NS, "get", "pods", "-o", "json"],
                             check=True, capture_output=True, text=True).stdout
        pods = json.loads(out)["items"]
        ready = [p for p in pods if not p["metadata"].get("deletionTimestamp") and any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (p.get("status") or {}).get("conditions", []))]
        if len(ready) == want and len(pods) == want:
            return
        if time.time() > deadline:
            raise RuntimeError(f"{len(ready)} of {want} Splice pods Ready ({len(pods)} pods)")
        time.sleep(1)


def row(api, args, label, ns, clients, expect, fault=False, pod=None):
    names, _ = splice_webhooks(api)
    pids, apiserver = splice_pids(args.kubectl), apiserver_pids(api)
    before_calls, before_cpu = webhook_counts(api), cpu_seconds(pids)
    before_apiserver = cpu_seconds(apiserver)
    # No warm-up in the fault row, so that the deletion lands in the counted creates (at 17
    # policies 200 warm-up creates took about 10 s on 2 cores).
    warmup = 0 if fault else 200
    cmd = [args.generator, "--namespace", ns, "--creates", str(args.creates),
           "--clients", str(clients), "--expect", str(expect), "--warmup", str(warmup)]
    if pod:
        cmd += ["--pod", pod]
    if fault:
        wait_replicas(args.kubectl)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    deleted = ""
    if fault:
        time.sleep(2)
        pod = subprocess.run([args.kubectl, "-n", SPLICE_NS, "get", "pods", "-o",
                              "jsonpath={.items[0].metadata.name}"],
                             check=True, capture_output=True, text=True).stdout
        subprocess.run([args.kubectl, "-n", SPLICE_NS, "delete", "pod", pod, "--wait=false"],
                       check=True, capture_output=True)
        deleted = pod
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{label}: admission_load failed ({proc.returncode})")
    r = json.loads(out)
    after_calls, after_cpu = webhook_counts(api), cpu_seconds(pids)
    after_apiserver = cpu_seconds(apiserver)
    creates_seen = args.creates + warmup  # the warm-up goes through the same webhooks
    calls = sum(after_calls.get(n, [0, 0])[0] - before_calls.get(n, [0, 0])[0] for n in names)
    called = {NS_SPLICE: names, NS_AGNHOST: {AGNHOST_WEBHOOK}}.get(ns, set())
    rss, hwm = memory_mib(splice_pids(args.kubectl))
    r.update(label=label, calls_per_create=calls / creates_seen if ns == NS_SPLICE else None,
             call_ms=mean_call_ms(before_calls, after_calls, called),
             cpu_per_1000=None if fault or ns != NS_SPLICE
             else (after_cpu - before_cpu) / creates_seen * 1000,
             apiserver_cpu_per_1000=(after_apiserver - before_apiserver) / creates_seen * 1000
             if apiserver else None,
             rss_mib=rss, hwm_mib=hwm, deleted=deleted, splice_pids=len(pids))
    print(f"bench: load {label}: {json.dumps(r)}", file=sys.stderr, flush=True)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--kubectl", required=True)
    ap.add_argument("--generator", required=True, help="the admission_load binary")
    ap.add_argument("--agnhost-namespace", required=True)
    ap.add_argument("--agnhost-ca", required=True)
    ap.add_argument("--creates", type=int, default=10000)
    ap.add_argument("--clients", default="32 128")
    ap.add_argument("--faults", type=int, default=3, help="fault rows, one deletion each")
    ap.add_argument("--out")
    args = ap.parse_args()
    api = Api(args.kubeconfig)
    setup(api, args.agnhost_namespace, args.agnhost_ca)
    start = time.time()
    wait_ready(api)
    print(f"bench: load policies Ready with Fail after {time.time() - start:.0f}s",
          file=sys.stderr)
    wait_live(api)
    names, ncfg = splice_webhooks(api)
    print(f"bench: Splice's webhooks ({ncfg} configurations): {sorted(names)}", file=sys.stderr)
    load_start = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        floor = os.path.join(tmp, "floor-pod.json")
        floor_pod(api, floor)
        for c in (int(x) for x in args.clients.split()):
            rows.append(row(api, args, "splice17", NS_SPLICE, c, INJECTED))
            rows.append(row(api, args, "agnhost", NS_AGNHOST, c, 1))
            rows.append(row(api, args, "floor (splice17's pod, no webhook)", NS_FLOOR, c,
                            INJECTED, pod=floor))
    for i in range(args.faults):
        rows.append(row(api, args, f"splice17, one Splice pod deleted ({i + 1})", NS_SPLICE, 32,
                        INJECTED, fault=True))

    def f(v, fmt):
        return "–" if v is None else format(v, fmt)

    lines = ["| row | clients | creates | p50 ms | p99 ms | max ms | errors | timeouts | "
             "calls/create | mean call ms | Splice CPU s/1000 | API server CPU s/1000 | "
             "Splice RSS MiB (HWM) | creates/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['clients']} | {r['n']} | {r['p50_ms']:.1f} | "
            f"{r['p99_ms']:.1f} | {r['max_ms']:.0f} | {r['errors']} | {r['timeouts']} | "
            f"{f(r['calls_per_create'], '.2f')} | {f(r['call_ms'], '.2f')} | "
            f"{f(r['cpu_per_1000'], '.2f')} | {f(r['apiserver_cpu_per_1000'], '.2f')} | "
            f"{r['rss_mib']:.1f} ({r['hwm_mib']:.1f}) | {r['creates_per_s']:.0f} |")
    lines.append("")
    lines.append(
        f"{len(policies())} policies in {ncfg} webhook configurations ({INJECTED} inject); "
        f"in flight at most / connections: "
        + ", ".join(f"{r['label']}@{r['clients']}: {r['max_in_flight']}/{r['connections']}"
                    for r in rows)
        + f"; {os.cpu_count()} CPUs, load average {load_start:.2f} -> {os.getloadavg()[0]:.2f}.")
    for r in rows:
        for kind in ("error_samples", "timeout_samples"):
            for s in r.get(kind, []):
                lines.append(f"- {r['label']}@{r['clients']} {kind[:-8]}: {s[:300]}")
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n" + table + "\n")


if __name__ == "__main__":
    main()
