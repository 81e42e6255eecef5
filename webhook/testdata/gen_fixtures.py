#!/usr/bin/env python3
"""Writes the engine's fixture pods (deterministic): pod-3k.json, pod-8k.json, pod-45k.json and
pod-2000-env.json, shaped like what the API server sends a webhook (managedFields, status-less
CREATE objects, service account token volume, probes, resources). Re-run after changing it."""
import json, os

HERE = os.path.dirname(os.path.abspath(__file__))

def container(i, env_count, extra_mounts=0):
    return {
        "name": f"app-{i}" if i else "app",
        "image": f"registry.example/team/service-{i}:2.3.{i}",
        "imagePullPolicy": "IfNotPresent",
        "args": ["--port=8080", f"--shard={i}", "--log-format=json"],
        "ports": [{"name": "http", "containerPort": 8080 + i, "protocol": "TCP"}],
        "env": [{"name": f"SETTING_{j:04d}", "value": f"value-{i}-{j}"} for j in range(env_count)],
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"},
                      "limits": {"cpu": "1", "memory": "512Mi"}},
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080 + i, "scheme": "HTTP"},
                           "periodSeconds": 10, "timeoutSeconds": 1, "successThreshold": 1,
                           "failureThreshold": 3},
        "volumeMounts": [{"name": "kube-api-access-x7k2p",
                          "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                          "readOnly": True}]
                        + [{"name": f"data-{k}", "mountPath": f"/data/{k}"} for k in range(extra_mounts)],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True,
                            "capabilities": {"drop": ["ALL"]}},
        "x-unknown-container-field": {"kept": True},
    }

def pod(name, containers, env_count, managed_fields, extra_volumes=0, annotations=0):
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "generateName": "web-7d9c6b5f4-",
            "namespace": "shop",
            "uid": "0b3c8f5e-4a57-4d7e-9c55-1f3d2b4c6a70",
            "creationTimestamp": None,
            "labels": {"app": "web", "pod-template-hash": "7d9c6b5f4", "tier": "frontend"},
            "annotations": {f"example.com/note-{k}": f"annotation value {k} " * 3 for k in range(annotations)},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                 "name": "web-7d9c6b5f4", "uid": "6f1e2d3c-0000-4a4a-8b8b-123456789abc",
                                 "controller": True, "blockOwnerDeletion": True}],
            "managedFields": [{"manager": f"kube-controller-manager-{m}", "operation": "Update",
                               "apiVersion": "v1", "time": "2025-01-01T00:00:00Z",
                               "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {}}},
                                            "f:spec": {"f:containers": {"k:{\"name\":\"app\"}": {".": {}, "f:image": {}}}}}}
                              for m in range(managed_fields)],
        },
        "spec": {
            "containers": [container(i, env_count, extra_volumes) for i in range(containers)],
            "volumes": [{"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}]
                       + [{"name": f"data-{k}", "emptyDir": {}} for k in range(extra_volumes)],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "securityContext": {"fsGroup": 2000},
            "schedulerName": "default-scheduler",
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
            "x-unknown-spec-field": [1, 2, {"three": 3}],
        },
        "status": {},
    }

def write(name, doc, target=None):
    text = json.dumps(doc, indent=None, separators=(",", ":"))
    with open(os.path.join(HERE, name), "w") as f:
        f.write(text)
    print(f"{name}: {len(text)} bytes" + (f" (target {target})" if target else ""))

write("pod-3k.json", pod("web-3k", 1, 9, 1), "3 KB")
write("pod-8k.json", pod("web-8k", 2, 34, 5, extra_volumes=3, annotations=8), "8.5 KB")
write("pod-45k.json", pod("web-45k", 8, 76, 20, extra_volumes=8, annotations=28), "45 KB")
write("pod-2000-env.json", pod("web-env", 1, 2000, 1))
