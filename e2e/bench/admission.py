#!/usr/bin/env python3
"""Driver of `make bench-admission` (see admission.sh, which starts the control plane, `splice
run` and agnhost). Sets up one namespace per arm and what serves it, checks that every arm but
`none` injects the same sidecar, then times server-side dry-run pod creates (`dryRun=All`: the
whole admission chain runs, nothing is stored) into each namespace, the arms interleaved in rounds
so that all of them see the same machine. Prints one markdown table.
"""

import argparse
import base64
import concurrent.futures as cf
import json
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from controller import Api  # noqa: E402  (the same admin-certificate client)

SIDECAR = {"name": "webhook-added-sidecar", "image": "registry.invalid/sidecar:1"}
# The ten-policy arms add SIDECAR and nine more, one per policy (or MutatingAdmissionPolicy).
TEN = [SIDECAR] + [{"name": f"sidecar-{i}", "image": f"registry.invalid/sidecar-{i}:1"}
                   for i in range(1, 10)]
ARMS = ("none", "pre", "pre10", "null", "null1", "null10", "splice", "splice-intree", "splice10",
        "agnhost", "map", "map10")
# Arms served by Splice's stack answering with a constant patch of 1 or 10 containers: the floor
# of any webhook injecting that many.
NULL_CONTAINERS = {"null1": 1, "null10": 10}
LABEL = "bench-arm"
POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "bench", "labels": {"app": "bench"}},
    "spec": {"containers": [{"name": "app", "image": "registry.invalid/app:1"}]},
}


# Arms served by nothing whose pod arrives already carrying the sidecars the splice and splice10
# arms inject: what the API server costs for the bigger pod alone, with no mutation at all.
PRE = {"pre": [SIDECAR], "pre10": TEN}


def pod_for(arm):
    if arm in PRE:
        return {**POD, "spec": {"containers": POD["spec"]["containers"] + PRE[arm]}}
    return POD


def namespace(arm):
    return f"bench-{arm}"


def splice_policy(api, name, instance, arm, sidecar):
    api.json("POST", "/apis/splice.dev/v1alpha1/injectionpolicies", {
        "apiVersion": "splice.dev/v1alpha1",
        "kind": "InjectionPolicy",
        "metadata": {"name": name, "labels": {"e2e.splice.dev/instance": instance}},
        "spec": {
            "mode": "Webhook",
            "namespaceSelector": {"matchLabels": {LABEL: arm}},
            "template": {"containers": [sidecar]},
        },
    })


def sidecar_map(api, name, arm, sidecar):
    group = "/apis/admissionregistration.k8s.io/v1"
    expression = ("Object{spec: Object.spec{containers: [Object.spec.containers{"
                  f"name: \"{sidecar['name']}\", image: \"{sidecar['image']}\"}}]}}}}")
    api.json("POST", f"{group}/mutatingadmissionpolicies", {
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                "resources": ["pods"]}]},
            "mutations": [{"patchType": "ApplyConfiguration",
                           "applyConfiguration": {"expression": expression}}],
        },
    })
    api.json("POST", f"{group}/mutatingadmissionpolicybindings", {
        "metadata": {"name": name},
        "spec": {"policyName": name,
                 "matchResources": {"namespaceSelector": {"matchLabels": {LABEL: arm}}}},
    })


def plain_webhook(api, name, client_config, bundle, arm):
    """A webhook entry of our own for `arm`'s namespace; `client_config` is a URL (str) or a
    Service reference (dict), called with `bundle` as the CA."""
    target = {"url": client_config} if isinstance(client_config, str) else {"service": client_config}
    api.json("POST", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", {
        "metadata": {"name": name},
        "webhooks": [{
            "name": f"{name}.bench.splice.dev",
            "clientConfig": {**target, "caBundle": bundle},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["pods"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {LABEL: arm}},
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "timeoutSeconds": 10,
        }],
    })


def setup(api, agnhost_port, agnhost_ca, null_port, cluster_agnhost=None):
    for arm in ARMS:
        api.json("POST", "/api/v1/namespaces",
                 {"metadata": {"name": namespace(arm), "labels": {LABEL: arm}}})
    # Ten overlapping policies, one shared webhook entry.
    for i, sidecar in enumerate(TEN):
        splice_policy(api, f"bench-ten-{i}", "bench", "splice10", sidecar)
        sidecar_map(api, f"bench-ten-{i}", "map10", sidecar)
    # One policy per Splice instance: `splice` (instance label `bench`) and, when a baseline
    # binary is given, `splice-before` (instance `bench-before`).
    # `splice-intree` is the same policy in mode InTree: a MutatingAdmissionPolicy Splice writes.
    for arm, instance in (("splice", "bench"), ("splice-intree", "bench"),
                          ("splice-before", "bench-before"), ("splice-cluster", "bench-cluster")):
        if arm not in ARMS:
            continue
        mode = {"splice-intree": "InTree"}.get(arm, "Webhook")
        api.json("POST", "/apis/splice.dev/v1alpha1/injectionpolicies", {
            "apiVersion": "splice.dev/v1alpha1",
            "kind": "InjectionPolicy",
            "metadata": {"name": f"bench-{arm}", "labels": {"e2e.splice.dev/instance": instance}},
            "spec": {
                "namespaceSelector": {"matchLabels": {LABEL: arm}},
                "template": {"containers": [SIDECAR]},
                **({"mode": mode} if mode else {}),
            },
        })
    with open(agnhost_ca, "rb") as f:
        bundle = base64.b64encode(f.read()).decode()
    plain_webhook(api, "bench-agnhost",
                  f"https://127.0.0.1:{agnhost_port}/mutating-pods-sidecar", bundle, "agnhost")
    # The floor: Splice's stack answering "allowed" with no patch (the same certificate).
    plain_webhook(api, "bench-null", f"https://127.0.0.1:{null_port}/null", bundle, "null")
    for arm, n in NULL_CONTAINERS.items():
        plain_webhook(api, f"bench-{arm}", f"https://127.0.0.1:{null_port}/null/containers/{n}",
                      bundle, arm)
    sidecar_map(api, "bench-sidecar", "map", SIDECAR)
    if cluster_agnhost:
        namespace_, ca = cluster_agnhost
        with open(ca, "rb") as f:
            plain_webhook(api, "bench-agnhost-cluster",
                          {"namespace": namespace_, "name": "agnhost",
                           "path": "/mutating-pods-sidecar", "port": 443},
                          base64.b64encode(f.read()).decode(), "agnhost-cluster")


def create(api, arm):
    """One dry-run create: (seconds, the pod as the API server would store it)."""
    path = f"/api/v1/namespaces/{namespace(arm)}/pods?dryRun=All"
    body = json.dumps(pod_for(arm))
    start = time.perf_counter()
    status, text = api.call("POST", path, body)
    elapsed = time.perf_counter() - start
    if status != 201:
        raise RuntimeError(f"{arm}: dry-run create answered {status}: {text[:300]!r}")
    return elapsed, text


def expected(arm):
    """The containers an arm adds."""
    if arm in ("none", "null"):
        return set()
    if arm in NULL_CONTAINERS:
        return {f"null-sidecar-{i}" for i in range(1, NULL_CONTAINERS[arm] + 1)}
    if arm.endswith("10"):
        return {c["name"] for c in TEN}
    return {SIDECAR["name"]}


def added(text):
    pod = json.loads(text)
    return {c.get("name") for c in pod["spec"].get("containers", [])} - {"app"}


def wait_live(api, timeout=60):
    """Every arm answers as it should (webhook configurations and policies load asynchronously)."""
    deadline = time.time() + timeout
    pending = set(ARMS)
    while pending:
        for arm in sorted(pending):
            try:
                _, text = create(api, arm)
            except RuntimeError:
                continue
            if added(text) == expected(arm):
                pending.discard(arm)
        if pending and time.time() > deadline:
            raise RuntimeError(f"arms not live after {timeout}s: {sorted(pending)}")
        time.sleep(0.2)


def sequential(api, arm, n):
    return [create(api, arm)[0] for _ in range(n)]


def concurrent(api, arm, clients, per_client):
    with cf.ThreadPoolExecutor(clients) as pool:
        runs = pool.map(lambda _: sequential(api, arm, per_client), range(clients))
        return [t for run in runs for t in run]


def pct(samples, p):
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def ms(seconds):
    return f"{seconds * 1000:.2f}"


WEBHOOK_OF_ARM = {
    "null": lambda n: n == "bench-null.bench.splice.dev",
    "null1": lambda n: n == "bench-null1.bench.splice.dev",
    "null10": lambda n: n == "bench-null10.bench.splice.dev",
    "splice": lambda n: n == "bench-splice.splice.dev",
    "splice-before": lambda n: n == "bench-splice-before.splice.dev",
    "splice10": lambda n: n.startswith("group-") and n.endswith(".splice.dev"),
    "agnhost": lambda n: n == "bench-agnhost.bench.splice.dev",
    "splice-cluster": lambda n: n == "bench-splice-cluster.splice.dev",
    "agnhost-cluster": lambda n: n == "bench-agnhost-cluster.bench.splice.dev",
}


def splice_arms(api):
    """Webhook name -> arm for the webhooks Splice wrote: the arms' policies differ only in their
    namespace selector, so Splice may serve them from one partitioned configuration whose
    webhooks (cells) are told apart by the arm their namespaceSelector requires."""
    cfgs = api.json("GET", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
                    "?labelSelector=app.kubernetes.io/managed-by=splice")["items"]
    out = {}
    for w in (w for c in cfgs for w in c.get("webhooks", [])):
        sel = w.get("namespaceSelector") or {}
        arm = (sel.get("matchLabels") or {}).get(LABEL)
        for e in sel.get("matchExpressions") or []:
            if e["key"] == LABEL and e["operator"] == "In" and len(e["values"]) == 1:
                arm = e["values"][0]
        if arm:
            out[w["name"]] = arm
    return out


def histograms(api, metric, label, where=""):
    """{value of `label`: [count, sum]} of the API server's histogram `metric` since it started,
    over the lines that contain `where`."""
    _, text = api.call("GET", "/metrics")
    out = {}
    for line in text.decode().splitlines():
        for suffix, i in (("_count{", 0), ("_sum{", 1)):
            if line.startswith(metric + suffix) and where in line:
                name = re.search(r'[{,]' + label + r'="([^"]*)"', line).group(1)
                out.setdefault(name, [0.0, 0.0])[i] += float(line.rsplit(" ", 1)[1])
    return out


def by_arm(found, arm_of):
    """`found` ({name: [count, sum]}) summed per arm; `arm_of(name)` is the arm or None."""
    out = {}
    for name, (count, total) in found.items():
        arm = arm_of(name)
        if arm:
            got = out.setdefault(arm, [0.0, 0.0])
            got[0] += count
            got[1] += total
    return out


def webhook_calls(api):
    """Per arm with a webhook: [calls, seconds] the API server measured calling it, from its own
    apiserver_admission_webhook_admission_duration_seconds (CREATE), since it started."""
    cells = splice_arms(api)

    def arm_of(name):
        if name in cells:
            return cells[name]
        return next((arm for arm, matches in WEBHOOK_OF_ARM.items() if matches(name)), None)

    found = histograms(api, "apiserver_admission_webhook_admission_duration_seconds", "name",
                       'operation="CREATE"')
    return by_arm(found, arm_of)


POLICY_OF_ARM = {
    "splice-intree": lambda n: n == "splice-bench-splice-intree",
    "map": lambda n: n == "bench-sidecar",
    "map10": lambda n: n.startswith("bench-ten-"),
}


def policy_checks(api):
    """Per arm with MutatingAdmissionPolicies: [checks, seconds] from the API server's own
    apiserver_mutating_admission_policy_check_duration_seconds, since it started. A policy
    checked more than once per create was run again in the reinvocation pass."""
    found = histograms(api, "apiserver_mutating_admission_policy_check_duration_seconds",
                       "policy")
    return by_arm(found, lambda name: next(
        (arm for arm, matches in POLICY_OF_ARM.items() if matches(name)), None))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--agnhost-port", type=int, required=True)
    ap.add_argument("--agnhost-ca", required=True)
    ap.add_argument("--null-port", type=int, required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sequential", type=int, default=100)
    ap.add_argument("--concurrent", type=int, default=8)
    ap.add_argument("--per-client", type=int, default=25)
    ap.add_argument("--out")
    ap.add_argument("--baseline", action="store_true",
                    help="measure a second Splice instance (labelled bench-before) as arm splice-before")
    ap.add_argument("--cluster-agnhost-namespace",
                    help="with --cluster-agnhost-ca: measure Splice installed in the cluster "
                         "(arm splice-cluster, instance bench-cluster) and agnhost as a pod behind "
                         "the Service agnhost in this namespace (arm agnhost-cluster), both "
                         "called through their Services")
    ap.add_argument("--cluster-agnhost-ca")
    args = ap.parse_args()
    global ARMS
    if args.baseline:
        ARMS = ("none", "pre", "pre10", "null", "null1", "null10", "splice", "splice-intree",
                "splice-before", "splice10", "agnhost", "map", "map10")
    cluster = None
    if args.cluster_agnhost_namespace:
        ARMS = ARMS + ("splice-cluster", "agnhost-cluster")
        cluster = (args.cluster_agnhost_namespace, args.cluster_agnhost_ca)

    api = Api(args.kubeconfig)
    setup(api, args.agnhost_port, args.agnhost_ca, args.null_port, cluster)
    wait_live(api)
    for arm in ARMS:  # warm every connection and cache once before measuring
        sequential(api, arm, 20)

    modes = ("sequential", "concurrent")
    samples = {(m, a): [] for m in modes for a in ARMS}
    round_p50 = {(m, a): [] for m in modes for a in ARMS}
    load_start = os.getloadavg()[0]
    for r in range(args.rounds):
        order = ARMS[r % len(ARMS):] + ARMS[:r % len(ARMS)]
        for arm in order:
            seq = sequential(api, arm, args.sequential)
            con = concurrent(api, arm, args.concurrent, args.per_client)
            for mode, got in (("sequential", seq), ("concurrent", con)):
                samples[(mode, arm)] += got
                round_p50[(mode, arm)].append(statistics.median(got))
        print(f"bench: round {r + 1}/{args.rounds} done", file=sys.stderr)

    lines = [
        "| mode | arm | creates | p50 ms | p90 ms | p99 ms | added p50 ms (median of rounds) |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode in modes:
        for arm in ARMS:
            s = samples[(mode, arm)]
            added = statistics.median(
                a - b for a, b in zip(round_p50[(mode, arm)], round_p50[(mode, "none")]))
            lines.append(f"| {mode} | {arm} | {len(s)} | {ms(pct(s, 50))} | {ms(pct(s, 90))} | "
                         f"{ms(pct(s, 99))} | {'–' if arm == 'none' else ms(added)} |")
    creates = {arm: sum(len(samples[(m, arm)]) for m in modes) + 20 for arm in ARMS}
    for what, per_arm in (("webhook calls", webhook_calls(api)),
                          ("policy checks", policy_checks(api))):
        lines.append("")
        lines.append(f"| arm | {what} | per create | mean ms (API server's measure) |")
        lines.append("|---|---|---|---|")
        for arm in ARMS:
            if per_arm.get(arm, [0])[0] > 0:
                n, secs = per_arm[arm]
                lines.append(f"| {arm} | {int(n)} | {n / creates[arm]:.2f} | {ms(secs / n)} |")
    lines.append("")
    lines.append(
        f"{args.rounds} rounds, arms interleaved; per round and arm {args.sequential} sequential "
        f"creates, then {args.concurrent} clients x {args.per_client}; server-side dry runs "
        f"through the API server; {os.cpu_count()} CPUs, load average "
        f"{load_start:.2f} -> {os.getloadavg()[0]:.2f}.")
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
