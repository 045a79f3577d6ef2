"""Autoscaling against a real API server and kube-controller-manager: `kubectl scale tsvc` through the
/scale subresource, the canary's ratio kept while the count moves, and the HPA controller itself
scaling a TritonService on a Pods metric served by a real custom metrics API server.

Pods are kwok's (no tritonserver runs in them): what is under test is the control loop, the
scale subresource, the HPA controller and the metrics API. tests/e2e/test_real_pods.py scales
real tritonserver pods.
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.apps_v1 import Deployment

import e2e_helpers
from e2e_helpers import REVISION_LABEL, SERVICE_LABEL, apply, get_ts
from testkit import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

SMALL = {"cpu": "100m", "memory": "256Mi"}


def tritonservice(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    return e2e_helpers.tritonservice(name, namespace, **{"resources": SMALL, **spec})


def get_raw(kubectl: str, cluster: Path, path: str) -> dict[str, Any]:
    """`kubectl get --raw PATH`, parsed."""
    out = subprocess.run(
        [kubectl, f"--kubeconfig={cluster}", "get", "--raw", path],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def scale(kubectl: str, cluster: Path, namespace: str, name: str, replicas: int) -> str:
    out = subprocess.run(
        [
            kubectl,
            f"--kubeconfig={cluster}",
            "-n",
            namespace,
            "scale",
            f"tsvc/{name}",
            f"--replicas={replicas}",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out.stdout.strip()


def deployments(kube: Client, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    """The service's Deployments by revision: spec.replicas and readyReplicas."""
    out = {}
    for dep in kube.list(Deployment, namespace=namespace, labels={SERVICE_LABEL: name}):
        body = e2e_helpers.as_dict(dep)
        out[body["metadata"]["labels"][REVISION_LABEL]] = {
            "replicas": int(body["spec"]["replicas"]),
            "ready": int((body.get("status") or {}).get("readyReplicas") or 0),
        }
    return out


def settled(kube: Client, namespace: str, name: str, want: dict[str, int]) -> dict[str, Any] | None:
    """The TritonService once each revision of ``want`` runs that many Ready pods (others at 0)."""
    deps = deployments(kube, namespace, name)
    for revision, dep in deps.items():
        goal = want.get(revision, 0)
        if dep["replicas"] != goal or dep["ready"] != goal:
            return None
    if not set(want) <= set(deps):
        return None
    ts = get_ts(kube, namespace, name)
    status = ts.get("status") or {}
    if (
        status.get("replicas") != sum(want.values())
        or status.get("observedGeneration") != ts["metadata"]["generation"]
    ):
        return None
    return ts


def selector_of(revisions: list[str], name: str) -> str:
    chosen = sorted(revisions)
    part = (
        f"{REVISION_LABEL}={chosen[0]}" if len(chosen) == 1 else f"{REVISION_LABEL} in ({','.join(chosen)})"
    )
    return f"{part},{SERVICE_LABEL}={name}"


def test_kubectl_scale_resizes_a_tritonservice_through_the_scale_subresource(
    kube: Client, namespace: str, operator: Any, cluster: Path, kubectl: str | None
) -> None:
    if kubectl is None:
        pytest.skip("no kubectl binary")
    apply(kube, tritonservice("scaled", namespace, replicas=2))
    ts = wait_for(
        lambda: get_ts(kube, namespace, "scaled").get("status", {}).get("stableRevision"),
        what="a stable revision",
    )
    a = str(ts)
    wait_for(lambda: settled(kube, namespace, "scaled", {a: 2}), what="2 Ready pods")

    assert scale(kubectl, cluster, namespace, "scaled", 3) == "tritonservice.triton-operator.io/scaled scaled"
    done = wait_for(
        lambda: settled(kube, namespace, "scaled", {a: 3}), what="3 Ready pods after kubectl scale"
    )
    assert done["spec"]["replicas"] == 3 and done["status"]["readyReplicas"] == 3
    # The scale subresource, as an HPA or KEDA reads it.
    sub = get_raw(
        kubectl,
        cluster,
        f"/apis/triton-operator.io/v1alpha1/namespaces/{namespace}/tritonservices/scaled/scale",
    )
    assert sub["kind"] == "Scale"
    assert sub["spec"] == {"replicas": 3}
    assert sub["status"] == {"replicas": 3, "selector": selector_of([a], "scaled")}

    scale(kubectl, cluster, namespace, "scaled", 1)
    wait_for(lambda: settled(kube, namespace, "scaled", {a: 1}), what="1 Ready pod after scaling down")


def test_scaling_mid_canary_keeps_the_ratio_and_the_step(
    kube: Client, namespace: str, operator: Any, cluster: Path, kubectl: str | None
) -> None:
    if kubectl is None:
        pytest.skip("no kubectl binary")
    body = tritonservice(
        "ratio", namespace, replicas=2, rollout={"steps": [{"setWeight": 50}, {"pause": {}}]}
    )
    apply(kube, body)
    a = str(
        wait_for(
            lambda: get_ts(kube, namespace, "ratio").get("status", {}).get("stableRevision"), what="stable"
        )
    )
    wait_for(lambda: settled(kube, namespace, "ratio", {a: 2}), what="2 Ready pods")
    revised = copy.deepcopy(body)
    revised["spec"]["serverArgs"] = ["--log-verbose=1"]
    apply(kube, revised)

    def at_step(kube: Client = kube) -> dict[str, Any] | None:
        status = get_ts(kube, namespace, "ratio").get("status") or {}
        return status if status.get("currentStepIndex") == 1 and status.get("canaryRevision") else None

    b = str(wait_for(at_step, what="the canary at its pause step")["canaryRevision"])
    ts = wait_for(lambda: settled(kube, namespace, "ratio", {a: 2, b: 1}), what="stable 2 + canary 1")
    assert ts["status"]["selector"] == selector_of([a, b], "ratio")  # both take traffic

    # An autoscaler (here kubectl) doubles the service: the canary follows, ceil(4 * 50%) = 2.
    scale(kubectl, cluster, namespace, "ratio", 4)
    ts = wait_for(lambda: settled(kube, namespace, "ratio", {a: 4, b: 2}), what="stable 4 + canary 2")
    status = ts["status"]
    assert (status["currentStepIndex"], status["canaryWeight"], status["canaryRevision"]) == (1, 50, b)
    assert status["replicas"] == 6 and "abortedRevision" not in status
    scale(kubectl, cluster, namespace, "ratio", 3)
    wait_for(lambda: settled(kube, namespace, "ratio", {a: 3, b: 2}), what="stable 3 + canary ceil(1.5) = 2")

    e2e_helpers.kubectl_triton(cluster, "promote", "ratio", "-n", namespace)
    ts = wait_for(
        lambda: (
            (t := settled(kube, namespace, "ratio", {b: 3})) and t["status"].get("stableRevision") == b and t
        ),
        what="the canary promoted at the scaled count",
    )
    assert ts["status"]["selector"] == selector_of([b], "ratio")
