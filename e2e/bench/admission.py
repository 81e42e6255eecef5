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
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from controller import Api  # noqa: E402  (the same admin-certificate client)

SIDECAR = {"name": "webhook-added-sidecar", "image": "registry.invalid/sidecar:1"}
ARMS = ("none", "splice", "splice-intree", "agnhost", "map")
LABEL = "bench-arm"
POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "bench", "labels": {"app": "bench"}},
    "spec": {"containers": [{"name": "app", "image": "registry.invalid/app:1"}]},
}


def namespace(arm):
    return f"bench-{arm}"


def setup(api, agnhost_port, agnhost_ca):
    for arm in ARMS:
        api.json("POST", "/api/v1/namespaces",
                 {"metadata": {"name": namespace(arm), "labels": {LABEL: arm}}})
    # One policy per Splice instance: `splice` (instance label `bench`) and, when a baseline
    # binary is given, `splice-before` (instance `bench-before`).
    # `splice-intree` is the same policy in mode InTree: a MutatingAdmissionPolicy Splice writes.
    for arm, instance in (("splice", "bench"), ("splice-intree", "bench"),
                          ("splice-before", "bench-before")):
        if arm not in ARMS:
            continue
        mode = {"splice-intree": "InTree", "splice": "Webhook"}.get(arm)
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
    api.json("POST", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", {
        "metadata": {"name": "bench-agnhost"},
        "webhooks": [{
            "name": "sidecar.bench.splice.dev",
            "clientConfig": {"url": f"https://127.0.0.1:{agnhost_port}/mutating-pods-sidecar",
                             "caBundle": bundle},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["pods"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {LABEL: "agnhost"}},
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "timeoutSeconds": 10,
        }],
    })
    group = "/apis/admissionregistration.k8s.io/v1"
    expression = ("Object{spec: Object.spec{containers: [Object.spec.containers{"
                  f"name: \"{SIDECAR['name']}\", image: \"{SIDECAR['image']}\"}}]}}}}")
    api.json("POST", f"{group}/mutatingadmissionpolicies", {
        "metadata": {"name": "bench-sidecar"},
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
        "metadata": {"name": "bench-sidecar"},
        "spec": {"policyName": "bench-sidecar",
                 "matchResources": {"namespaceSelector": {"matchLabels": {LABEL: "map"}}}},
    })


def create(api, arm):
    """One dry-run create: (seconds, the pod as the API server would store it)."""
    path = f"/api/v1/namespaces/{namespace(arm)}/pods?dryRun=All"
    body = json.dumps(POD)
    start = time.perf_counter()
    status, text = api.call("POST", path, body)
    elapsed = time.perf_counter() - start
    if status != 201:
        raise RuntimeError(f"{arm}: dry-run create answered {status}: {text[:300]!r}")
    return elapsed, text


def injected(text):
    pod = json.loads(text)
    return any(c.get("name") == SIDECAR["name"] for c in pod["spec"].get("containers", []))


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
            if injected(text) == (arm != "none"):
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--agnhost-port", type=int, required=True)
    ap.add_argument("--agnhost-ca", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sequential", type=int, default=100)
    ap.add_argument("--concurrent", type=int, default=8)
    ap.add_argument("--per-client", type=int, default=25)
    ap.add_argument("--out")
    ap.add_argument("--baseline", action="store_true",
                    help="measure a second Splice instance (labelled bench-before) as arm splice-before")
    args = ap.parse_args()
    global ARMS
    if args.baseline:
        ARMS = ("none", "splice", "splice-intree", "splice-before", "agnhost", "map")

    api = Api(args.kubeconfig)
    setup(api, args.agnhost_port, args.agnhost_ca)
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
