"""A terminating pool pod (core.decision.pool_plan.decide_pool): never placed on, and its READY copies stay
on their routes until their models answer elsewhere (make-before-break, as for any move)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from pod_bodies import applied
from triton_operator.core.decision.pool_plan import PoolPlan, decide_pool, model_version
from triton_operator.core.objects.names import LABEL_REVISION
from triton_operator.core.pool.assignment import (
    ASSIGNMENT_ANNOTATION,
    Copy,
    PodAssignment,
    Wanted,
    build_assignment,
    parse_assignment,
)
from triton_operator.core.pool.labels import READY, model_label_key
from triton_operator.models import TritonService
from tritonservice_bodies import CONFIG

MODELS = ("a", "b")


def service() -> TritonService:
    """Two models of 400Mi, one least copy each, on three pods of 1000Mi."""
    spec: dict[str, Any] = {
        "replicas": 3,
        "repository": {"uri": "s3://models/prod", "endpoint": "http://minio:9000"},
        "pool": {"memoryPerPod": "1000Mi"},
        "models": [{"name": m, "config": copy.deepcopy(CONFIG), "memory": "400Mi"} for m in MODELS],
    }
    return TritonService.model_validate(
        {"metadata": {"name": "pool", "namespace": "ml", "uid": "u"}, "spec": spec}
    )


def pod(
    name: str, holding: Sequence[str], versions: Mapping[str, str], *, leaving: bool = False
) -> dict[str, Any]:
    """A Ready pod holding ``holding`` READY and labelled (terminating when ``leaving``)."""
    assignment = PodAssignment(models={m: Wanted(versions[m]) for m in holding})
    metadata: dict[str, Any] = {
        "name": name,
        "labels": {LABEL_REVISION: "r1", **{model_label_key(m): READY for m in holding}},
        "annotations": {ASSIGNMENT_ANNOTATION: build_assignment(assignment)},
        "resourceVersion": "1",
    }
    if leaving:
        metadata["deletionTimestamp"] = "2026-11-29T15:00:00Z"
    return {
        "metadata": metadata,
        "spec": {"nodeName": f"node-{name}"},
        "status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def run(ts: TritonService, pods: list[dict[str, Any]], reports: Mapping[str, Mapping[str, Copy]]) -> PoolPlan:
    plan = decide_pool(ts, pods, reports, revisions=["r1"], configs={}, previous={}, now=1000.0)
    assert plan is not None and plan.status is not None
    return plan


def held(p: Mapping[str, Any]) -> set[str]:
    return set(parse_assignment(p["metadata"]["annotations"].get(ASSIGNMENT_ANNOTATION)).models)


def routed(p: Mapping[str, Any]) -> set[str]:
    return {m for m in MODELS if p["metadata"]["labels"].get(model_label_key(m)) == READY}


def ready_copies(plan: PoolPlan) -> dict[str, int]:
    assert plan.status is not None
    return {m["name"]: m.get("readyCopies", 0) for m in plan.status["models"]}


def test_a_terminating_pods_only_copy_stays_routed_until_a_copy_elsewhere_answers_then_comes_off() -> None:
    ts = service()
    versions = {m: model_version(ts, m, {}) for m in MODELS}
    # p0 is being deleted and holds the only copy of each model; p1 and p2 are new and empty.
    pods = [pod("p0", MODELS, versions, leaving=True), pod("p1", (), versions), pod("p2", (), versions)]
    reports: dict[str, dict[str, Copy]] = {
        "p0": {m: Copy("READY", versions[m]) for m in MODELS},
        "p1": {},
        "p2": {},
    }

    first = run(ts, pods, reports)
    applied(pods, first)
    leaving, others = pods[0], pods[1:]
    assert routed(leaving) == set(MODELS)  # still the models' only answering copies: on their routes
    assert ready_copies(first) == dict.fromkeys(MODELS, 1)  # and counted READY (clients keep sending)
    assert held(leaving) == set(MODELS)  # nothing new is given to it, nothing taken yet
    placed = [m for p in others for m in held(p)]
    assert sorted(placed) == sorted(MODELS)  # each model loads on a live pod
    assert first.status is not None
    assert all("p0" not in m.get("pods", []) for m in first.status["models"])  # placed on live pods only

    # The new copies load but are not READY yet: the terminating pod's copies stay routed.
    for p in others:
        reports[p["metadata"]["name"]] = {m: Copy("LOADING", versions[m]) for m in held(p)}
    second = run(ts, pods, reports)
    applied(pods, second)
    assert routed(leaving) == set(MODELS)

    # READY elsewhere: labelled there this pass; the terminating copies keep their labels meanwhile.
    for p in others:
        reports[p["metadata"]["name"]] = {m: Copy("READY", versions[m]) for m in held(p)}
    third = run(ts, pods, reports)
    applied(pods, third)
    assert set().union(*(routed(p) for p in others)) == set(MODELS)
    assert routed(leaving) == set(MODELS)

    # Every wanted copy answers (READY, labelled, on a Ready pod): the terminating pod's labels come off.
    fourth = run(ts, pods, reports)
    applied(pods, fourth)
    assert routed(leaving) == set()
    assert set().union(*(routed(p) for p in others)) == set(MODELS)
    assert ready_copies(fourth) == dict.fromkeys(MODELS, 1)


def test_a_terminating_pod_gets_no_new_copy() -> None:
    ts = service()
    versions = {m: model_version(ts, m, {}) for m in MODELS}
    # p0 (terminating) and p1 are empty: placement puts both models on p1, none on p0.
    pods = [pod("p0", (), versions, leaving=True), pod("p1", (), versions)]
    plan = run(ts, pods, {"p0": {}, "p1": {}})
    applied(pods, plan)
    assert held(pods[0]) == set()
    assert held(pods[1]) == set(MODELS)
    assert plan.status is not None
    assert all("p0" not in m.get("pods", []) for m in plan.status["models"])
