"""Autoscaling against a real API server and kube-controller-manager: `kubectl scale tsvc` through the
/scale subresource, the canary's ratio kept while the count moves, and the HPA controller itself
scaling a TritonService on a Pods metric served by a real custom metrics API server.

Pods are kwok's (no tritonserver runs in them): what is under test is the control loop, the
scale subresource, the HPA controller and the metrics API. tests/e2e/test_real_pods.py scales
real tritonserver pods.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any, cast

import pytest
from lightkube import ApiError, Client
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.autoscaling_v2 import HorizontalPodAutoscaler
from lightkube.resources.core_v1 import Pod

import e2e_helpers
from e2e_helpers import REVISION_LABEL, SERVICE_LABEL, apply, get_ts, kubectl_scale
from e2e_helpers import small_tritonservice as tritonservice
from testkit import Repeating, wait_for
from triton_operator.core.decision.scaling import scale_selector
from triton_operator.models import QUEUE_TIME_METRIC

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


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
    """The TritonService once each revision of ``want`` runs that many Ready pods (others at 0) and its
    status says so."""
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
        # The status counts the stable's Ready pods at a reconcile after the Deployment's.
        or status.get("readyReplicas") != want.get(status.get("stableRevision") or "", 0)
    ):
        return None
    return ts


def find_hpa(kube: Client, namespace: str, name: str) -> HorizontalPodAutoscaler | None:
    """The HPA, or None while it does not exist."""
    try:
        return kube.get(HorizontalPodAutoscaler, name, namespace=namespace)
    except ApiError as exc:
        if exc.status.code == 404:
            return None
        raise


def stable_revision(kube: Client, namespace: str, name: str) -> str:
    """The TritonService's stable revision, once it has one."""
    return str(
        wait_for(
            lambda: get_ts(kube, namespace, name).get("status", {}).get("stableRevision"),
            what=f"a stable revision of {name}",
        )
    )


def canary_at_pause(kube: Client, namespace: str, body: dict[str, Any]) -> str:
    """Apply ``body`` with other server args (a new revision) and wait for its canary at the pause
    step (index 1, after setWeight); the canary revision."""
    revised = copy.deepcopy(body)
    revised["spec"]["serverArgs"] = ["--log-verbose=1"]
    apply(kube, revised)
    name = body["metadata"]["name"]

    def at_step() -> dict[str, Any] | None:
        status = get_ts(kube, namespace, name).get("status") or {}
        return status if status.get("currentStepIndex") == 1 and status.get("canaryRevision") else None

    return str(wait_for(at_step, what=f"the canary of {name} at its pause step")["canaryRevision"])


def test_kubectl_scale_resizes_a_tritonservice_through_the_scale_subresource(
    kube: Client, namespace: str, operator: Any, cluster: Path, kubectl: str | None
) -> None:
    if kubectl is None:
        pytest.skip("no kubectl binary")
    apply(kube, tritonservice("scaled", namespace, replicas=2))
    a = stable_revision(kube, namespace, "scaled")
    wait_for(lambda: settled(kube, namespace, "scaled", {a: 2}), what="2 Ready pods")

    assert (
        kubectl_scale(kubectl, cluster, namespace, "scaled", 3)
        == "tritonservice.triton-operator.io/scaled scaled"
    )
    done = wait_for(
        lambda: settled(kube, namespace, "scaled", {a: 3}), what="3 Ready pods after kubectl scale"
    )
    assert done["spec"]["replicas"] == 3 and done["status"]["readyReplicas"] == 3
    # The scale subresource, as an HPA or KEDA reads it.
    sub = e2e_helpers.get_raw(
        kubectl,
        cluster,
        f"/apis/triton-operator.io/v1alpha1/namespaces/{namespace}/tritonservices/scaled/scale",
    )
    assert sub["kind"] == "Scale"
    assert sub["spec"] == {"replicas": 3}
    assert sub["status"] == {"replicas": 3, "selector": scale_selector("scaled", [a])}

    kubectl_scale(kubectl, cluster, namespace, "scaled", 1)
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
    a = stable_revision(kube, namespace, "ratio")
    wait_for(lambda: settled(kube, namespace, "ratio", {a: 2}), what="2 Ready pods")
    b = canary_at_pause(kube, namespace, body)
    ts = wait_for(lambda: settled(kube, namespace, "ratio", {a: 2, b: 1}), what="stable 2 + canary 1")
    assert ts["status"]["selector"] == scale_selector("ratio", [a, b])  # both take traffic

    # An autoscaler (here kubectl) doubles the service: the canary follows, ceil(4 * 50%) = 2.
    kubectl_scale(kubectl, cluster, namespace, "ratio", 4)
    ts = wait_for(lambda: settled(kube, namespace, "ratio", {a: 4, b: 2}), what="stable 4 + canary 2")
    status = ts["status"]
    assert (status["currentStepIndex"], status["canaryWeight"], status["canaryRevision"]) == (1, 50, b)
    assert status["replicas"] == 6 and "abortedRevision" not in status
    kubectl_scale(kubectl, cluster, namespace, "ratio", 3)
    wait_for(lambda: settled(kube, namespace, "ratio", {a: 3, b: 2}), what="stable 3 + canary ceil(1.5) = 2")

    e2e_helpers.kubectl_triton(cluster, "promote", "ratio", "-n", namespace)
    ts = wait_for(
        lambda: (
            (t := settled(kube, namespace, "ratio", {b: 3})) and t["status"].get("stableRevision") == b and t
        ),
        what="the canary promoted at the scaled count",
    )
    assert ts["status"]["selector"] == scale_selector("ratio", [b])


class LoadWriter(Repeating):
    """Writes each serving pod's queue time so that they add up to one load: the service's total
    ``load`` shared evenly by the pods of status.selector's revisions (what a metric that adds up
    over pods reads when the Service spreads requests evenly). The HPA controller reads them."""

    def __init__(self, kube: Client, metrics: e2e_helpers.CustomMetrics, namespace: str, name: str) -> None:
        super().__init__()
        self.kube, self.metrics, self.namespace, self.name = kube, metrics, namespace, name
        self.load = 0

    def pods(self) -> list[str]:
        status = get_ts(self.kube, self.namespace, self.name).get("status") or {}
        revisions = {status.get("stableRevision"), status.get("canaryRevision")} - {None}
        out = []
        for pod in self.kube.list(Pod, namespace=self.namespace, labels={SERVICE_LABEL: self.name}):
            meta = pod.metadata
            if (
                meta is not None
                and meta.deletionTimestamp is None
                and (meta.labels or {}).get(REVISION_LABEL) in revisions
            ):
                out.append(str(meta.name))
        return out

    def step(self) -> None:
        pods = self.pods()
        share = str(self.load // max(len(pods), 1))
        for pod in pods:
            self.metrics.write(self.namespace, "pods", pod, QUEUE_TIME_METRIC, share)


def test_the_hpa_controller_scales_a_canarying_tritonservice_without_inflating_it(
    kube: Client, namespace: str, operator: Any, metrics: e2e_helpers.CustomMetrics
) -> None:
    """kube-controller-manager's HPA controller, on spec.autoscaling's owned HPA, reads a Pods metric
    from the real custom metrics API server and scales the TritonService through /scale.

    During a 50 % canary, a load of 12000 (queue-time microseconds summed over the pods) against a
    target of 4000 per pod needs 3 pods: from 1 stable + 1 canary the HPA goes to spec.replicas 3
    (stable 3, canary ceil(1.5) = 2), and stays there though 5 pods now serve (the canary is not
    counted into spec.replicas, so each look of the HPA finds the same ceil(12000 / 4000)). A load
    of 4000 brings it back to 1 (stable 1, canary 1).
    """
    autoscaling = {
        "minReplicas": 1,
        "maxReplicas": 6,
        "metrics": [{"queueTime": {"averageMicroseconds": 4000}}],
        "behavior": {
            "scaleUp": {
                "stabilizationWindowSeconds": 0,
                "policies": [{"type": "Pods", "value": 4, "periodSeconds": 15}],
            },
            "scaleDown": {
                "stabilizationWindowSeconds": 0,
                "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}],
            },
        },
    }
    body = tritonservice(
        "elastic", namespace, autoscaling=autoscaling, rollout={"steps": [{"setWeight": 50}, {"pause": {}}]}
    )
    body["spec"].pop("replicas")  # the HPA owns it (README: GitOps)
    apply(kube, body)
    a = stable_revision(kube, namespace, "elastic")
    hpa = wait_for(lambda: find_hpa(kube, namespace, "elastic"), what="the owned HPA")
    assert hpa.metadata is not None and hpa.metadata.ownerReferences
    assert hpa.metadata.ownerReferences[0].kind == "TritonService"

    with LoadWriter(kube, metrics, namespace, "elastic") as load:
        load.load = 2000  # half the target for the one pod: 1 replica (minReplicas)
        wait_for(lambda: settled(kube, namespace, "elastic", {a: 1}), what="1 Ready pod")
        active = wait_for(
            lambda: (
                (c := e2e_helpers.condition(get_ts(kube, namespace, "elastic"), "Autoscaling"))
                and c.get("reason") == "AutoscalerActive"
                and c
            ),
            timeout=120,
            what="Autoscaling=True/AutoscalerActive (the HPA read its metric)",
        )
        assert (
            active["status"] == "True"
            and "1 to 6 replicas on triton_queue_time_per_request_microseconds 4000" in active["message"]
        )

        b = canary_at_pause(kube, namespace, body)
        wait_for(lambda: settled(kube, namespace, "elastic", {a: 1, b: 1}), what="stable 1 + canary 1")

        load.load = 12000
        wait_for(
            lambda: settled(kube, namespace, "elastic", {a: 3, b: 2}), timeout=120, what="stable 3 + canary 2"
        )
        seen = set()
        for _ in range(16):  # three HPA syncs and more (kube-controller-manager syncs every 5 s here)
            seen.add(int(get_ts(kube, namespace, "elastic")["spec"]["replicas"]))
            time.sleep(1)
        assert seen == {3}, f"spec.replicas moved while the load stayed: {seen}"
        status = get_ts(kube, namespace, "elastic")["status"]
        assert (status["currentStepIndex"], status["canaryWeight"]) == (1, 50)

        load.load = 4000
        wait_for(
            lambda: settled(kube, namespace, "elastic", {a: 1, b: 1}),
            timeout=120,
            what="back to stable 1 + canary 1",
        )
    assert not [e for e in load.errors if "NotFound" not in e], load.errors[:5]
    # The HPA writes its own status just after the scale.
    wait_for(
        lambda: (
            e2e_helpers.as_dict(kube.get(HorizontalPodAutoscaler, "elastic", namespace=namespace))[
                "status"
            ].get("currentReplicas")
            == 1
        ),
        what="the HPA's status at 1 replica",
    )


def test_a_users_hpa_on_the_service_is_left_alone_and_the_owned_one_removed(
    kube: Client, namespace: str, operator: Any
) -> None:
    body = tritonservice(
        "shared", namespace, autoscaling={"maxReplicas": 3, "metrics": [{"cpu": {"averageUtilization": 80}}]}
    )
    apply(kube, body)
    wait_for(lambda: find_hpa(kube, namespace, "shared"), what="the owned HPA")
    users = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "keda-hpa-shared", "namespace": namespace},
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "triton-operator.io/v1alpha1",
                "kind": "TritonService",
                "name": "shared",
            },
            "minReplicas": 2,
            "maxReplicas": 4,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": "x"},
                        "target": {"type": "AverageValue", "averageValue": "1"},
                    },
                }
            ],
        },
    }
    kube.create(cast(HorizontalPodAutoscaler, HorizontalPodAutoscaler.from_dict(users)))
    # The operator finds it at its next pass (a spec change here; else within 60 s).
    apply(kube, {**body, "spec": {**body["spec"], "replicas": 3}})
    verdict = wait_for(
        lambda: (
            (c := e2e_helpers.condition(get_ts(kube, namespace, "shared"), "Autoscaling")).get("reason")
            == "ForeignAutoscaler"
            and c
        ),
        what="Autoscaling=False/ForeignAutoscaler",
    )
    assert "keda-hpa-shared" in verdict["message"] and verdict["status"] == "False"
    wait_for(
        lambda: (
            not list(
                kube.list(HorizontalPodAutoscaler, namespace=namespace, labels={SERVICE_LABEL: "shared"})
            )
        ),
        what="the owned HPA gone",
    )
    assert kube.get(HorizontalPodAutoscaler, "keda-hpa-shared", namespace=namespace).spec.maxReplicas == 4
