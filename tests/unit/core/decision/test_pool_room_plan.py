"""A pool pass gives a pod a new copy only once what the pod still holds leaves it the room
(core.decision.pool_plan.decide_pool): a copy placement drops (copies shrinking on idle) holds its
memory until its agent reports it unloaded, so the copy placed in that room waits for it."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from pod_bodies import applied
from triton_operator.core.decision.pool_plan import (
    POOL_LOADING_SECONDS,
    PoolCopies,
    PoolPlan,
    decide_pool,
    model_version,
    pool_requeue,
)
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

MODELS = ("a", "b", "c")
MI = 1024 * 1024
BUDGET = 1000 * MI
MEMORY = 400 * MI  # two copies a pod


def service() -> TritonService:
    """Three models of 400Mi on two pods of 1000Mi, one least copy each."""
    spec: dict[str, Any] = {
        "replicas": 2,
        "repository": {"uri": "s3://models/prod", "endpoint": "http://minio:9000"},
        "pool": {"memoryPerPod": "1000Mi"},
        "models": [{"name": m, "config": copy.deepcopy(CONFIG), "memory": "400Mi"} for m in MODELS],
    }
    return TritonService.model_validate(
        {"metadata": {"name": "pool", "namespace": "ml", "uid": "u"}, "spec": spec}
    )


def pod(name: str, holding: Sequence[str], versions: Mapping[str, str]) -> dict[str, Any]:
    """A Ready pod holding ``holding`` READY and labelled."""
    assignment = PodAssignment(models={m: Wanted(versions[m]) for m in holding})
    return {
        "metadata": {
            "name": name,
            "labels": {LABEL_REVISION: "r1", **{model_label_key(m): READY for m in holding}},
            "annotations": {ASSIGNMENT_ANNOTATION: build_assignment(assignment)},
            "resourceVersion": "1",
        },
        "spec": {"nodeName": f"node-{name}"},
        "status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def assigned(p: Mapping[str, Any]) -> dict[str, Wanted]:
    return dict(parse_assignment(p["metadata"]["annotations"].get(ASSIGNMENT_ANNOTATION)).models)


def holding(p: Mapping[str, Any], report: Mapping[str, Copy]) -> set[str]:
    """What a pod holds or is asked to load: its assignment's entries and the copies its agent reports
    loaded or loading (a copy whose entry went stays in memory until the agent unloads it)."""
    return set(assigned(p)) | {m for m, c in report.items() if c.state in ("READY", "LOADING")}


def test_a_copy_placed_where_a_shrinking_copy_drains_waits_for_its_unload() -> None:
    ts = service()
    versions = {m: model_version(ts, m, {}) for m in MODELS}
    pods = [pod("p0", ["a", "b"], versions), pod("p1", ["a", "c"], versions)]
    reports: dict[str, dict[str, Copy]] = {
        p["metadata"]["name"]: {m: Copy("READY", versions[m]) for m in assigned(p)} for p in pods
    }
    # a's load fell (one copy now), c's rose (two): placement drops a's copy on p0 and gives c that room.
    copies = PoolCopies({"a": 1, "b": 1, "c": 2}, replicas=2, pods_needed=2, shown={}, last_used={})
    now, waited, unloads, told = 1000.0, list[str](), list[float](), list[str]()
    plan: PoolPlan | None = None
    for _ in range(40):
        plan = decide_pool(
            ts, pods, reports, revisions=["r1"], configs={}, previous={}, now=now, copies=copies
        )
        assert plan is not None
        applied(pods, plan)
        for p in pods:  # written: what the pod holds or loads now fits its budget
            held = holding(p, reports[p["metadata"]["name"]])
            assert len(held) * MEMORY <= BUDGET, f"{p['metadata']['name']} holds {sorted(held)}"
        if not plan.patches and not plan.waiting:
            break
        waited += [w for w in plan.waiting if "to make room for" in w]
        if any("to make room for" in w for w in plan.waiting):  # status.pool says it for the model
            told += [m.get("message", "") for m in (plan.status or {}).get("models", []) if m["name"] == "c"]
        if plan.unloading:
            # The pass that takes a's entry off: c waits for the agent's unload, read within a second.
            assert plan.unloading == (("p0", "a"),) and waited
            assert pool_requeue(plan, now) == POOL_LOADING_SECONDS
            unloads.append(now)
        for p in pods:  # each agent follows its assignment: unloads, then loads to READY
            name, want = p["metadata"]["name"], assigned(p)
            reports[name] = {m: Copy("READY", w.version) for m, w in want.items()}
            assert len(holding(p, reports[name])) * MEMORY <= BUDGET
        now += 2.0
    else:
        raise AssertionError(f"no end: {plan.waiting if plan else None}")
    assert {p["metadata"]["name"]: sorted(assigned(p)) for p in pods} == {"p0": ["b", "c"], "p1": ["a", "c"]}
    assert waited and set(waited) == {"p0: waiting for p0 to unload a to make room for c"}
    assert len(unloads) == 1
    assert told and all("pod p0 waits for room to unload a first" in m for m in told), told
    assert plan is not None and not any(
        "waits for room" in m.get("message", "") for m in (plan.status or {}).get("models", [])
    )
