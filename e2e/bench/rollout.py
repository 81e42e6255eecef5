#!/usr/bin/env python3
"""Driver of `make bench-rollout` (see rollout.sh, which starts the control plane with an audit log
of every write, kwok with the bench's own Stages (kwok-in-place-stage.yaml), and `splice run` as
the impersonated user `--user`). Talks to the API server directly over HTTPS with the admin client
certificate (reusing controller.py's client). Two rows, one after the other on one control plane
(`--rows`), each with its own policy, namespaces and workloads, created after the row before ended:

restart: one policy (mode: Webhook) injects a sidecar (v1) into `--namespaces` namespaces;
   `--deployments` one-replica Deployments are created across them, on kwok nodes of this
   benchmark's own (no status, so kwok gives them room for a million pods), all injected with v1.
   The template changes to v2 (an env change: no in-place path) with `rollout: {maxConcurrent,
   maxConcurrentPerNamespace, strategy: Restart}`. A watch of the Deployments counts those
   restarted for v2 and not yet settled (what `kubectl rollout status` waits for) at every event:
   the most at once must not exceed the budget. Reported: the time until `status.rollout` is
   Complete with every Deployment done, and until every pod is on v2; Splice's API writes per
   workload.
in-place: a second policy injects sidecar image registry.invalid/sidecar:1 into as many other
   namespaces; `--in-place-deployments` Deployments of `--in-place-replicas` replicas. The
   template changes the sidecar's image only, to :2, with `rollout: {maxConcurrent,
   maxConcurrentPerNamespace}` and `strategy: Auto` (the default, written out). Splice updates
   each pod in place; kwok runs no images, so the bench's Stage stands in for the kubelet
   (observedGeneration, the imageID derived from the image, Ready). Reported: the time until
   `status.rollout` is Complete with `updatedInPlace` == every pod and every pod on v2, that every
   pod kept its UID, runs imageID kwok-bench://registry.invalid/sidecar:2 and no app container
   restarted; the most pods `updating` at once (polled); Splice's API writes per pod.

Writes are counted from the change until the last pod is current plus `--quiet` seconds (trailing
status writes and Events), read from the audit log by impersonated user, split by resource and verb
(policy status patches by field manager).
"""

import argparse
import concurrent.futures as cf
import http.client
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from controller import GROUP, Api, Table, create_namespace  # noqa: E402

LABEL = "bench.splice.dev/rollout"
IN_PLACE_LABEL = "bench.splice.dev/in-place"
NODE_LABEL = "bench.splice.dev/rollout-node"
NODES = 2
SIDECAR = "bench-sidecar"
IN_PLACE_SIDECAR = "bench-in-place-sidecar"
IMAGE_ID = "kwok-bench://"  # what the bench's kwok Stage reports as imageID: this + the image
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}


def log(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def policy_body(instance, name, rev, rollout=None):
    """The restart row's policy: v1 -> v2 changes an env value (a change no pod takes in place)."""
    spec = {
        "mode": "Webhook",
        "namespaceSelector": {"matchLabels": {LABEL: "on"}},
        "template": {"containers": [{
            "name": SIDECAR, "image": "registry.invalid/sidecar:1",
            "env": [{"name": "REV", "value": rev}]}]},
    }
    if rollout:
        spec["rollout"] = rollout
    return {"apiVersion": "splice.dev/v1alpha1", "kind": "InjectionPolicy",
            "metadata": {"name": name, "labels": {"e2e.splice.dev/instance": instance}},
            "spec": spec}


def in_place_policy_body(instance, name, image, rollout=None):
    """The in-place row's policy: v1 -> v2 changes the injected container's image only."""
    spec = {
        "mode": "Webhook",
        "namespaceSelector": {"matchLabels": {IN_PLACE_LABEL: "on"}},
        "template": {"containers": [{"name": IN_PLACE_SIDECAR, "image": image}]},
    }
    if rollout:
        spec["rollout"] = rollout
    return {"apiVersion": "splice.dev/v1alpha1", "kind": "InjectionPolicy",
            "metadata": {"name": name, "labels": {"e2e.splice.dev/instance": instance}},
            "spec": spec}


def deployment_body(name, label=LABEL, replicas=1):
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": {label: "1"}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, label: "1"}},
                "spec": {
                    "nodeSelector": {NODE_LABEL: "true"},
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "app", "image": "registry.invalid/app:1"}],
                },
            },
        },
    }


def node_body(i):
    # No status: kwok's node-initialize stage gives it room for a million pods (the two nodes
    # up.sh creates allow 250 each).
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": f"kwok-rollout-{i}",
                         "annotations": {"kwok.x-k8s.io/node": "fake",
                                         "node.alpha.kubernetes.io/ttl": "0"},
                         "labels": {"kubernetes.io/hostname": f"kwok-rollout-{i}",
                                    "type": "kwok", NODE_LABEL: "true"}}}


def settled(d):
    """What `kubectl rollout status` waits for (and the rollout's planner too)."""
    spec, st = d.get("spec") or {}, d.get("status") or {}
    desired = spec.get("replicas", 1)
    updated = st.get("updatedReplicas", 0)
    return (st.get("observedGeneration", 0) >= d["metadata"].get("generation", 0)
            and updated >= desired and st.get("replicas", 0) <= updated
            and st.get("availableReplicas", 0) >= desired)


def restarted_for(d):
    meta = ((d.get("spec") or {}).get("template") or {}).get("metadata") or {}
    return (meta.get("annotations") or {}).get("splice.dev/restartedFor")


def pod_hash(p, policy):
    raw = (p["metadata"].get("annotations") or {}).get("splice.dev/status")
    try:
        return (json.loads(raw).get(policy) or {}).get("hash") if raw else None
    except ValueError:
        return None


class Watch:
    """Watches the benchmark's Deployments; at every event counts those restarted for `mine` and
    not settled, keeping the most seen at once and the fewest available replicas of any."""

    def __init__(self, api, mine):
        self.api, self.mine = api, mine
        self.state = {}
        self.max_restarting = 0
        self.min_available = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def start(self):
        self.thread.start()

    def observe(self):
        restarting = sum(1 for d in self.state.values()
                         if restarted_for(d) == self.mine and not settled(d))
        self.max_restarting = max(self.max_restarting, restarting)
        available = min(((d.get("status") or {}).get("availableReplicas", 0)
                         for d in self.state.values()), default=None)
        if available is not None:
            self.min_available = (available if self.min_available is None
                                  else min(self.min_available, available))

    def run(self):
        path = f"/apis/apps/v1/deployments?labelSelector={LABEL}%3D1"
        while not self.stop.is_set():
            listed = self.api.json("GET", path)
            self.state = {(d["metadata"]["namespace"], d["metadata"]["name"]): d
                          for d in listed["items"]}
            self.observe()
            rv = listed["metadata"]["resourceVersion"]
            conn = http.client.HTTPSConnection(self.api.host, self.api.port,
                                               context=self.api.ctx, timeout=700)
            try:
                conn.request("GET", f"{path}&watch=1&resourceVersion={rv}&timeoutSeconds=600",
                             headers={"Accept": "application/json"})
                r = conn.getresponse()
                while not self.stop.is_set():
                    line = r.readline()
                    if not line:
                        break
                    ev = json.loads(line)
                    d = ev["object"]
                    if ev["type"] in ("ADDED", "MODIFIED"):
                        self.state[(d["metadata"]["namespace"], d["metadata"]["name"])] = d
                    elif ev["type"] == "DELETED":
                        self.state.pop((d["metadata"]["namespace"], d["metadata"]["name"]), None)
                    else:
                        break  # ERROR (e.g. resourceVersion too old): list again
                    self.observe()
            except (OSError, ValueError):
                pass
            finally:
                conn.close()


def audit_writes(path, offset, end, user):
    """Writes by the impersonated `user` in the audit log between bytes `offset` and `end`, by
    (resource[/subresource], verb[, dry run])."""
    counts = {}
    with open(path, "rb") as f:
        f.seek(offset)
        for line in f.read(end - offset).splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if (e.get("impersonatedUser") or {}).get("username") != user:
                continue
            if e.get("verb") not in WRITE_VERBS:
                continue
            ref = e.get("objectRef") or {}
            key = ref.get("resource", "?")
            if ref.get("subresource"):
                key += "/" + ref["subresource"]
            verb = e["verb"]
            uri = e.get("requestURI", "")
            if key == "injectionpolicies/status" and "fieldManager=" in uri:
                # Which of Splice's status writers: the rollout, coverage, the probe, ...
                verb += " " + uri.split("fieldManager=", 1)[1].split("&", 1)[0]
            if "dryRun=All" in uri:
                verb += " (dry run)"
            code = (e.get("responseStatus") or {}).get("code", 0)
            if code >= 400:
                verb += f" ({code})"
            counts[(key, verb)] = counts.get((key, verb), 0) + 1
    return counts



def wait_policy_ready(api, name, deadline):
    while True:
        st = api.json("GET", f"{GROUP}/{name}").get("status") or {}
        ready = any(c["type"] == "Ready" and c["status"] == "True"
                    for c in st.get("conditions", []))
        if ready and st.get("templateHash"):
            return st["templateHash"]
        if time.monotonic() > deadline:
            raise SystemExit(f"policy {name} not Ready: {st}")
        time.sleep(0.5)


def wait_injecting(api, namespaces, sidecar, deadline):
    """The API server loads a new configuration asynchronously: dry-run a pod in each namespace
    until it comes back injected."""
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
             "spec": {"containers": [{"name": "app", "image": "registry.invalid/app:1"}]}}
    for ns in namespaces:
        while True:
            got = api.json("POST", f"/api/v1/namespaces/{ns}/pods?dryRun=All", probe)
            if any(c["name"] == sidecar for c in got["spec"]["containers"]):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"{ns}: the webhook never injected a dry-run pod")
            time.sleep(0.2)


def wait_new_revision(api, name, old, t0):
    while True:
        st = api.json("GET", f"{GROUP}/{name}").get("status") or {}
        if st.get("templateHash") not in (None, old):
            return st["templateHash"]
        if time.monotonic() - t0 > 60:
            raise SystemExit(f"{name}: the template change never showed in status")
        time.sleep(0.1)


def writes_row(a, offset, end, per, unit, goal):
    """The row of Splice's writes between two audit-log offsets, per `per` `unit`s."""
    w = audit_writes(a.audit_log, offset, end, a.user)
    # Lease renewals (leader election) go with time, not with workloads; dry-run creates (the
    # check that the webhook serves v2 before restarting into a namespace) persist nothing.
    leases = sum(n for (k, _), n in w.items() if k == "leases")
    dry = sum(n for (_, v), n in w.items() if "dry run" in v)
    persisted = {kv: n for kv, n in w.items() if kv[0] != "leases" and "dry run" not in kv[1]}
    total = sum(persisted.values())
    splits = ", ".join(f"{n} {k} {v}"
                       for (k, v), n in sorted(persisted.items(), key=lambda x: -x[1]))
    return (f"Splice's API writes per {unit} (from the change to {a.quiet} s after the last pod "
            "is current, audit log; Lease renewals and dry runs apart)",
            f"{total / per:.2f} ({total}: {splits}); besides, {dry} dry-run pod creates "
            f"and {leases} Lease writes", goal)


def label_namespaces(api, namespaces, label):
    for ns in namespaces:
        create_namespace(api, ns)
        api.json("PATCH", f"/api/v1/namespaces/{ns}", {"metadata": {"labels": {label: "on"}}},
                 "application/merge-patch+json")


def restart_row(a, api, pool, add):
    name = "bench-rollout"
    namespaces = [f"bench-rollout-{i:02d}" for i in range(a.namespaces)]
    label_namespaces(api, namespaces, LABEL)

    # 1. v1, and the Deployments injected with it.
    api.json("POST", GROUP, policy_body(a.instance, name, "v1"))
    deadline = time.monotonic() + 120
    v1 = wait_policy_ready(api, name, deadline)
    wait_injecting(api, namespaces, SIDECAR, deadline)
    per_ns = -(-a.deployments // a.namespaces)
    names = [(namespaces[i // per_ns], f"app-{i % per_ns:04d}") for i in range(a.deployments)]
    t = time.monotonic()
    list(pool.map(lambda nn: api.json(
        "POST", f"/apis/apps/v1/namespaces/{nn[0]}/deployments", deployment_body(nn[1])),
        names, chunksize=20))
    log(f"restart row: {a.deployments} Deployments created in {time.monotonic() - t:.1f}s; "
        "waiting for them available and injected with v1")

    def all_pods_at(revision):
        pods = api.json("GET", f"/api/v1/pods?labelSelector={LABEL}%3D1")["items"]
        return (len(pods) == a.deployments
                and all(pod_hash(p, name) == revision for p in pods)), pods

    def all_settled():
        ds = api.json("GET", f"/apis/apps/v1/deployments?labelSelector={LABEL}%3D1")["items"]
        return len(ds) == a.deployments and all(settled(d) for d in ds), ds

    while True:
        ok, _ = all_settled()
        if ok and all_pods_at(v1)[0]:
            break
        if time.monotonic() - t > 900:
            raise SystemExit("the Deployments were not all available with v1 within 900 s")
        time.sleep(2)
    healthy = time.monotonic() - t
    add((f"**restart row**: {a.deployments} Deployments (1 replica, {a.namespaces} namespaces, "
         "kwok) created and available with v1", f"{healthy:.1f} s", "-"))
    time.sleep(15)  # let coverage settle before the change

    # 2. v2 (an env change) with a rollout that restarts.
    offset = os.path.getsize(a.audit_log)
    rollout = {"maxConcurrent": a.max_concurrent, "maxConcurrentPerNamespace": a.per_namespace,
               "timeout": "5m", "strategy": "Restart"}
    t0 = time.monotonic()
    api.json("PATCH", f"{GROUP}/{name}",
             {"spec": policy_body(a.instance, name, "v2", rollout)["spec"]},
             "application/merge-patch+json")
    v2 = wait_new_revision(api, name, v1, t0)
    watch = Watch(api, f"{name}@{v2}")
    watch.start()
    complete = None
    last_log = 0.0
    while True:
        st = api.json("GET", f"{GROUP}/{name}").get("status") or {}
        r = st.get("rollout") or {}
        if (complete is None and r.get("revision") == v2 and r.get("phase") == "Complete"
                and r.get("done") == a.deployments):
            complete = time.monotonic() - t0
            log(f"restart row: Complete after {complete:.1f}s")
        if r.get("phase") == "Halted":
            raise SystemExit(f"the rollout halted: {r}")
        if complete is not None and all_pods_at(v2)[0]:
            break
        now = time.monotonic()
        if now - last_log > 30:
            log(f"restart row: {now - t0:.0f}s: {json.dumps(r)}; most restarting at once so far "
                f"{watch.max_restarting}")
            last_log = now
        if now - t0 > a.timeout:
            raise SystemExit(f"not complete after {a.timeout}s: {r}")
        time.sleep(1)
    current = time.monotonic() - t0
    time.sleep(a.quiet)
    end = os.path.getsize(a.audit_log)
    watch.stop.set()
    _, ds = all_settled()
    counts = {}
    for d in ds:
        rev = d["metadata"].get("annotations", {}).get("deployment.kubernetes.io/revision")
        counts[rev] = counts.get(rev, 0) + 1
    restarted = sum(1 for d in ds if restarted_for(d) == f"{name}@{v2}")
    budget = min(a.max_concurrent, a.cap)
    add((f"restart row: template change to v2 (env) with rollout strategy Restart, maxConcurrent "
         f"{a.max_concurrent} (per namespace {a.per_namespace}), --rollout-max-concurrent "
         f"{a.cap}: until status.rollout Complete ({a.deployments} done)",
         f"{complete:.1f} s ({a.deployments / complete:.1f} Deployments/s)",
         f"the budget's pace: {budget} per 5 s pass = {budget / 5:.1f}/s, "
         f"{a.deployments / (budget / 5):.0f} s"))
    add(("... until every pod is on v2", f"{current:.1f} s", "-"))
    add(("most Deployments restarting at once (watch), fewest available replicas of any",
         f"{watch.max_restarting}, {watch.min_available}", f"<= {budget}, >= 1"))
    add(("Deployments restarted for v2; their deployment.kubernetes.io/revision",
         f"{restarted}; {json.dumps(counts, sort_keys=True)}", f"{a.deployments}; all 2"))
    add(writes_row(a, offset, end, a.deployments, "workload", "<= 2"))


def in_place_row(a, api, pool, add):
    name = "bench-in-place"
    image1, image2 = "registry.invalid/sidecar:1", "registry.invalid/sidecar:2"
    replicas = a.in_place_replicas
    n_pods = a.in_place_deployments * replicas
    namespaces = [f"bench-in-place-{i:02d}" for i in range(a.namespaces)]
    label_namespaces(api, namespaces, IN_PLACE_LABEL)
    api.json("POST", GROUP, in_place_policy_body(a.instance, name, image1))
    deadline = time.monotonic() + 120
    v1 = wait_policy_ready(api, name, deadline)
    wait_injecting(api, namespaces, IN_PLACE_SIDECAR, deadline)
    per_ns = -(-a.in_place_deployments // a.namespaces)
    names = [(namespaces[i // per_ns], f"app-{i % per_ns:04d}")
             for i in range(a.in_place_deployments)]
    t = time.monotonic()
    list(pool.map(lambda nn: api.json(
        "POST", f"/apis/apps/v1/namespaces/{nn[0]}/deployments",
        deployment_body(nn[1], IN_PLACE_LABEL, replicas)), names, chunksize=5))
    log(f"in-place row: {a.in_place_deployments} Deployments x {replicas} created in "
        f"{time.monotonic() - t:.1f}s; waiting for the pods Ready, injected with v1 and "
        "reporting an imageID")

    def pods():
        return api.json("GET", f"/api/v1/pods?labelSelector={IN_PLACE_LABEL}%3D1")["items"]

    def sidecar_status(p):
        return next((c for c in (p.get("status") or {}).get("containerStatuses") or []
                     if c["name"] == IN_PLACE_SIDECAR), {})

    def at(p, revision, image):
        return (pod_hash(p, name) == revision
                and sidecar_status(p).get("imageID") == IMAGE_ID + image
                and sidecar_status(p).get("ready") is True)

    while True:
        ps = pods()
        if len(ps) == n_pods and all(at(p, v1, image1) for p in ps):
            break
        if time.monotonic() - t > 900:
            raise SystemExit(f"the in-place row's pods were not all Ready on v1 within 900 s "
                             f"({len(ps)} pods, {sum(at(p, v1, image1) for p in ps)} ready)")
        time.sleep(2)
    healthy = time.monotonic() - t
    add((f"**in-place row**: {a.in_place_deployments} Deployments x {replicas} replicas = "
         f"{n_pods} pods ({a.namespaces} namespaces, kwok) created, Ready with v1 and its "
         "imageID", f"{healthy:.1f} s", "-"))
    before = {p["metadata"]["uid"]: p for p in pods()}
    time.sleep(15)  # let coverage settle before the change

    offset = os.path.getsize(a.audit_log)
    rollout = {"maxConcurrent": a.max_concurrent, "maxConcurrentPerNamespace": a.per_namespace,
               "timeout": "5m", "strategy": "Auto"}
    t0 = time.monotonic()
    api.json("PATCH", f"{GROUP}/{name}",
             {"spec": in_place_policy_body(a.instance, name, image2, rollout)["spec"]},
             "application/merge-patch+json")
    v2 = wait_new_revision(api, name, v1, t0)
    complete = None
    last_log = 0.0
    most_updating = 0
    while True:
        st = api.json("GET", f"{GROUP}/{name}").get("status") or {}
        r = st.get("rollout") or {}
        if r.get("revision") == v2:
            most_updating = max(most_updating, r.get("updating", 0))
        if (complete is None and r.get("revision") == v2 and r.get("phase") == "Complete"
                and r.get("updatedInPlace") == n_pods):
            complete = time.monotonic() - t0
            log(f"in-place row: Complete after {complete:.1f}s")
        if r.get("phase") == "Halted":
            raise SystemExit(f"the in-place rollout halted: {r}")
        if complete is not None:
            ps = pods()
            if len(ps) == n_pods and all(at(p, v2, image2) for p in ps):
                break
        now = time.monotonic()
        if now - last_log > 30:
            log(f"in-place row: {now - t0:.0f}s: {json.dumps(r)}")
            last_log = now
        if now - t0 > a.timeout:
            raise SystemExit(f"in-place row: not complete after {a.timeout}s: {r}")
        time.sleep(1)
    current = time.monotonic() - t0
    time.sleep(a.quiet)
    end = os.path.getsize(a.audit_log)
    after = pods()
    kept = sum(1 for p in after if p["metadata"]["uid"] in before)
    app_restarts = 0
    for p in after:
        old = before.get(p["metadata"]["uid"])
        if not old:
            continue
        counts = {c["name"]: c.get("restartCount", 0)
                  for c in (old.get("status") or {}).get("containerStatuses") or []}
        for c in (p.get("status") or {}).get("containerStatuses") or []:
            if c["name"] != IN_PLACE_SIDECAR and c.get("restartCount", 0) != counts.get(c["name"]):
                app_restarts += 1
    on_v2 = sum(1 for p in after if sidecar_status(p).get("imageID") == IMAGE_ID + image2)
    revisions = {}
    for d in api.json("GET", f"/apis/apps/v1/deployments?labelSelector={IN_PLACE_LABEL}%3D1")[
            "items"]:
        rev = d["metadata"].get("annotations", {}).get("deployment.kubernetes.io/revision")
        revisions[rev] = revisions.get(rev, 0) + 1
    budget = min(a.max_concurrent, a.cap)
    add((f"in-place row: template change to v2 (the sidecar's image only, :1 -> :2) with rollout "
         f"strategy Auto, maxConcurrent {a.max_concurrent} (per namespace {a.per_namespace}), "
         f"--rollout-max-concurrent {a.cap}: until status.rollout Complete with updatedInPlace "
         f"{n_pods}", f"{complete:.1f} s ({n_pods / complete:.1f} pods/s)",
         f"the budget's pace: {budget} per 5 s pass = {budget / 5:.1f}/s, "
         f"{n_pods / (budget / 5):.0f} s"))
    add(("... until every pod is on v2 (record, imageID, Ready)", f"{current:.1f} s", "-"))
    add(("most pods updating at once (status.rollout.updating, polled each second)",
         f"{most_updating}", f"<= {budget}"))
    add(("pods that kept their UID; running imageID kwok-bench://...:2; app containers whose "
         "restartCount changed; the Deployments' deployment.kubernetes.io/revision",
         f"{kept}; {on_v2}; {app_restarts}; {json.dumps(revisions, sort_keys=True)}",
         f"{n_pods}; {n_pods}; 0; all 1"))
    add(writes_row(a, offset, end, n_pods, "pod", "<= 1.2"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--instance", required=True)
    ap.add_argument("--user", required=True, help="the user splice run impersonates")
    ap.add_argument("--audit-log", required=True)
    ap.add_argument("--rows", default="restart,in-place")
    ap.add_argument("--deployments", type=int, default=1000)
    ap.add_argument("--in-place-deployments", type=int, default=100)
    ap.add_argument("--in-place-replicas", type=int, default=10)
    ap.add_argument("--namespaces", type=int, default=10)
    ap.add_argument("--max-concurrent", type=int, default=10)
    ap.add_argument("--per-namespace", type=int, default=10)
    ap.add_argument("--cap", type=int, default=10, help="splice run --rollout-max-concurrent")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("--quiet", type=int, default=60,
                    help="seconds after Complete whose writes still count (trailing status, Events)")
    ap.add_argument("--splice-bin", default="")
    ap.add_argument("--out")
    a = ap.parse_args()
    api = Api(a.kubeconfig)
    pool = cf.ThreadPoolExecutor(a.threads)
    table = Table()
    rows = a.rows.split(",")
    for i in range(NODES):
        api.json("POST", "/api/v1/nodes", node_body(i), ok=(201, 409))
    if "restart" in rows:
        restart_row(a, api, pool, table.add)
    if "in-place" in rows:
        in_place_row(a, api, pool, table.add)
    bin_path = a.splice_bin
    build = ("release" if "/release/" in bin_path else "debug" if "/debug/" in bin_path
             else "given")
    table.write(a.out, preface=(f"splice run: {build} build", ""))


if __name__ == "__main__":
    main()
